//! The reference placer: the same driver as the engine, but every candidate search is a full
//! scan of every node the engine knows, each asked [`check_node`]; no index is consulted.
//! Obviously correct and slow; tests compare the engine against it and the benchmark measures
//! the speedup.

use crate::decision::Decision;
use crate::decision::RejectReason;
use crate::engine::{Engine, NodeIdx, VIRTUAL};
use crate::model::PlacementRequest;
use crate::search::{Cand, Check, Counts, Query, Readiness, Searcher, check_node, consider};

pub(crate) struct FullScan;

impl Searcher for FullScan {
    fn best(&self, e: &Engine, q: &Query<'_>) -> Option<Cand> {
        let mut best = None;
        for (i, slot) in e.nodes.iter().enumerate() {
            if slot.is_none() {
                continue;
            }
            if let Check::Pass(c) = check_node(e, q, i as NodeIdx) {
                consider(e, q.strategy, &mut best, c);
            }
        }
        if q.readiness == Readiness::Ready
            && let Check::Pass(c) = check_node(e, q, VIRTUAL)
        {
            consider(e, q.strategy, &mut best, c);
        }
        best
    }

    fn diagnose(&self, e: &Engine, q: &Query<'_>) -> Counts {
        let mut counts: Counts = [0; RejectReason::ALL.len()];
        for (i, slot) in e.nodes.iter().enumerate() {
            if slot.is_some()
                && let Check::Reject(r) = check_node(e, q, i as NodeIdx)
                && let Some(c) = counts.get_mut(r.index())
            {
                *c += 1;
            }
        }
        counts
    }
}

/// Places like [`Engine::place`], by full scan.
pub fn place(engine: &Engine, req: &PlacementRequest, now_ms: u64) -> Decision {
    crate::place::place(engine, &FullScan, req, now_ms)
}
