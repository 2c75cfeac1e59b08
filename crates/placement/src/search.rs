//! Candidate search: the per-node check every path shares, and the indexed searcher.
//!
//! A [`Query`] asks "the best node of pool P, in readiness R and tier T, for this need, under
//! these rules". [`check_node`] is the one definition of whether a node qualifies; the indexed
//! [`Fast`] searcher only decides which nodes to ask it about (or answers the same question
//! from a bucket's key without asking), and the naive searcher asks it about every node.

use crate::decision::RejectReason;
use crate::engine::{
    CapSetId, Class, Engine, Key, NodeIdx, PoolIdx, VIRTUAL, VIRTUAL_NAME, ZoneId, core_class,
    is_subset,
};
use crate::model::{PackingStrategy, PlacementKind, PriorityBand};

/// What one group of jobs (sharing a node) needs.
#[derive(Debug, Clone)]
pub(crate) struct Need {
    pub cap: u64,
    pub cores: u32,
    pub caps: Vec<u64>,
    /// Requires a capability no node or instance type has ever offered.
    pub caps_unknown: bool,
    pub band: PriorityBand,
}

#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)]
pub(crate) enum Cons {
    NodeIn(Vec<NodeIdx>),
    NodeNotIn(Vec<NodeIdx>),
    ZoneIn(Vec<ZoneId>),
    ZoneNotIn(Vec<ZoneId>),
}

/// One hard (or kept soft) constraint and the reason a node failing it is rejected for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Rule {
    pub reason: RejectReason,
    pub cons: Cons,
}

impl Rule {
    /// For a node not named by any rule nor used by the overlay: the rule's verdict is the
    /// same for every such node of a bucket.
    fn uniform_ok(&self, zone: Option<ZoneId>) -> bool {
        match &self.cons {
            Cons::NodeIn(_) => false,
            Cons::NodeNotIn(_) => true,
            Cons::ZoneIn(_) | Cons::ZoneNotIn(_) => self.zone_ok(zone),
        }
    }

    fn node_ok(&self, idx: NodeIdx, zone: Option<ZoneId>) -> bool {
        match &self.cons {
            Cons::NodeIn(v) => v.contains(&idx),
            Cons::NodeNotIn(v) => !v.contains(&idx),
            Cons::ZoneIn(v) => zone.is_some_and(|z| v.contains(&z)),
            Cons::ZoneNotIn(v) => zone.is_none_or(|z| !v.contains(&z)),
        }
    }

    /// Zone rules can be settled per bucket (all its nodes share a zone).
    fn zone_ok(&self, zone: Option<ZoneId>) -> bool {
        match &self.cons {
            Cons::ZoneIn(_) | Cons::ZoneNotIn(_) => self.node_ok(VIRTUAL, zone),
            _ => true,
        }
    }
}

/// Capacity this replica's earlier groups took during the current attempt.
#[derive(Debug, Clone, Default)]
pub(crate) struct Overlay {
    pub entries: Vec<(NodeIdx, u64, u32)>,
}

impl Overlay {
    pub fn used(&self, idx: NodeIdx) -> (u64, u32) {
        self.entries
            .iter()
            .find(|e| e.0 == idx)
            .map(|e| (e.1, e.2))
            .unwrap_or((0, 0))
    }

    pub fn contains(&self, idx: NodeIdx) -> bool {
        self.entries.iter().any(|e| e.0 == idx)
    }

    pub fn add(&mut self, idx: NodeIdx, cap: u64, cores: u32) {
        match self.entries.iter_mut().find(|e| e.0 == idx) {
            Some(e) => {
                e.1 = e.1.saturating_add(cap);
                e.2 = e.2.saturating_add(cores);
            }
            None => self.entries.push((idx, cap, cores)),
        }
    }
}

/// The node a provision simulation adds to a pool.
#[derive(Debug, Clone)]
pub(crate) struct VirtualNode {
    pub cap: u64,
    pub cores: u32,
    pub capset: CapSetId,
    pub zone: Option<ZoneId>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Readiness {
    Ready,
    /// Starting, within the pending window.
    Pending,
    /// Either (diagnosis).
    Any,
}

pub(crate) struct Query<'a> {
    pub pool: PoolIdx,
    pub strategy: PackingStrategy,
    pub need: &'a Need,
    pub rules: &'a [Rule],
    /// Classes of this tier; `None` (diagnosis) admits every class the placement may use.
    pub tier: Option<&'a [Class]>,
    pub readiness: Readiness,
    pub overlay: &'a Overlay,
    pub virt: Option<&'a VirtualNode>,
    pub now: u64,
    pub kind: PlacementKind,
}

/// A qualifying node and what it has free before this group lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Cand {
    pub node: NodeIdx,
    pub free: u64,
    pub cores: u32,
}

pub(crate) enum Check {
    Pass(Cand),
    Reject(RejectReason),
    /// Not part of this query at all (other pool, other tier, other readiness).
    Skip,
}

/// May a placement of this kind and band use a node of this class at all? The error is the
/// reason it may not.
pub(crate) fn class_allowed(
    kind: PlacementKind,
    band: PriorityBand,
    class: Class,
) -> Result<(), RejectReason> {
    match (kind, class) {
        (_, Class::Regular) => Ok(()),
        (PlacementKind::First, Class::Spare(_)) => Err(RejectReason::SpareReserved),
        (PlacementKind::Recovery, Class::Spare(None)) => Ok(()),
        (PlacementKind::Recovery, Class::Spare(Some(b))) if b == band => Ok(()),
        (PlacementKind::Recovery, Class::Spare(Some(_))) => Err(RejectReason::SpareForOtherBand),
    }
}

/// Tiers in preference order: gold recovery takes its band's spares, then shared spares, then
/// ordinary nodes; other recoveries take ordinary nodes before any spare; first placements
/// never take spares.
pub(crate) fn tiers(kind: PlacementKind, band: PriorityBand) -> &'static [&'static [Class]] {
    const GOLD: Class = Class::Spare(Some(PriorityBand::Gold));
    const SILVER: Class = Class::Spare(Some(PriorityBand::Silver));
    const BRONZE: Class = Class::Spare(Some(PriorityBand::Bronze));
    const SHARED: Class = Class::Spare(None);
    match (kind, band) {
        (PlacementKind::First, _) => &[&[Class::Regular]],
        (PlacementKind::Recovery, PriorityBand::Gold) => &[&[GOLD], &[SHARED], &[Class::Regular]],
        (PlacementKind::Recovery, PriorityBand::Silver) => &[&[Class::Regular], &[SILVER, SHARED]],
        (PlacementKind::Recovery, PriorityBand::Bronze) => &[&[Class::Regular], &[BRONZE, SHARED]],
    }
}

/// The one definition of "this node can host this group in this query".
/// Reasons are tested in [`RejectReason`] declaration order.
pub(crate) fn check_node(e: &Engine, q: &Query<'_>, idx: NodeIdx) -> Check {
    let (zone, capset, free, cores, class) = if idx == VIRTUAL {
        let Some(v) = q.virt else { return Check::Skip };
        if q.readiness == Readiness::Pending {
            return Check::Skip;
        }
        (v.zone, v.capset, v.cap, v.cores, Class::Regular)
    } else {
        let Some(n) = e.node(idx) else {
            return Check::Skip;
        };
        if n.pool != Some(q.pool) {
            return Check::Skip;
        }
        if n.cordoned {
            return Check::Reject(RejectReason::Cordoned);
        }
        if !n.healthy {
            return Check::Reject(RejectReason::Unhealthy);
        }
        match n.pending_since {
            Some(t) => {
                if q.now.saturating_sub(t) > e.pending_window {
                    return Check::Reject(RejectReason::PendingExpired);
                }
                if q.readiness == Readiness::Ready {
                    return Check::Skip;
                }
            }
            None => {
                if q.readiness == Readiness::Pending {
                    return Check::Skip;
                }
            }
        }
        (n.zone, n.capset, n.free_cap(), n.free_cores(), n.class())
    };
    if let Err(r) = class_allowed(q.kind, q.need.band, class) {
        return Check::Reject(r);
    }
    if q.tier.is_some_and(|t| !t.contains(&class)) {
        return Check::Skip;
    }
    if q.need.caps_unknown || !is_subset(&q.need.caps, e.capset_bits(capset)) {
        return Check::Reject(RejectReason::MissingCapability);
    }
    if let Some(r) = q.rules.iter().find(|r| !r.node_ok(idx, zone)) {
        return Check::Reject(r.reason);
    }
    let (oc, ocores) = q.overlay.used(idx);
    let free = free.saturating_sub(oc);
    let cores = cores.saturating_sub(ocores);
    if free < q.need.cap {
        return Check::Reject(RejectReason::InsufficientCapacity);
    }
    if cores < q.need.cores {
        return Check::Reject(RejectReason::InsufficientCores);
    }
    Check::Pass(Cand {
        node: idx,
        free,
        cores,
    })
}

pub(crate) fn name_of(e: &Engine, idx: NodeIdx) -> &str {
    if idx == VIRTUAL {
        VIRTUAL_NAME
    } else {
        e.node(idx).map(|n| &*n.id).unwrap_or("")
    }
}

/// Is `a` preferred over `b`? Binpack: less free capacity, then fewer free cores. Spread: more
/// free capacity, then more free cores. Then the smaller node id; then the existing node over
/// the simulated one.
pub(crate) fn better(e: &Engine, strategy: PackingStrategy, a: &Cand, b: &Cand) -> bool {
    let primary = match strategy {
        PackingStrategy::Binpack => (a.free, a.cores).cmp(&(b.free, b.cores)),
        PackingStrategy::Spread => (b.free, b.cores).cmp(&(a.free, a.cores)),
    };
    primary
        .then_with(|| name_of(e, a.node).cmp(name_of(e, b.node)))
        .then(a.node.cmp(&b.node))
        .is_lt()
}

pub(crate) fn consider(e: &Engine, strategy: PackingStrategy, best: &mut Option<Cand>, c: Cand) {
    if best.as_ref().is_none_or(|b| better(e, strategy, &c, b)) {
        *best = Some(c);
    }
}

/// Per-[`RejectReason`] counts, indexed by [`RejectReason::index`].
pub(crate) type Counts = [u64; RejectReason::ALL.len()];

pub(crate) trait Searcher {
    /// The best qualifying node for the query.
    fn best(&self, e: &Engine, q: &Query<'_>) -> Option<Cand>;
    /// Every node of the query's pool under the first reason it is rejected for (the query
    /// has `tier: None`, `readiness: Any`, and no node of the pool qualifies).
    fn diagnose(&self, e: &Engine, q: &Query<'_>) -> Counts;
}

/// The indexed searcher the engine uses.
pub(crate) struct Fast;

impl Searcher for Fast {
    fn best(&self, e: &Engine, q: &Query<'_>) -> Option<Cand> {
        let pool = e.pool(q.pool)?;
        let mut best: Option<Cand> = None;
        let check = |best: &mut Option<Cand>, idx: NodeIdx| {
            if let Check::Pass(c) = check_node(e, q, idx) {
                consider(e, q.strategy, best, c);
            }
        };
        if q.readiness != Readiness::Ready {
            for &i in &pool.pending {
                check(&mut best, i);
            }
            return best;
        }
        // `sameNode`-style rules name the only possible nodes: check just those.
        if let Some(only) = q.rules.iter().find_map(|r| match &r.cons {
            Cons::NodeIn(v) => Some(v),
            _ => None,
        }) {
            for &i in only {
                check(&mut best, i);
            }
            return best;
        }
        let tier = q.tier.unwrap_or(&[]);
        for bucket in &pool.buckets {
            if !tier.contains(&bucket.class)
                || class_allowed(q.kind, q.need.band, bucket.class).is_err()
                || q.need.caps_unknown
                || !is_subset(&q.need.caps, e.capset_bits(bucket.capset))
                || !q.rules.iter().all(|r| r.zone_ok(bucket.zone))
            {
                continue;
            }
            let usable = |k: &Key| {
                k.cores >= q.need.cores
                    && !q.overlay.contains(k.idx)
                    && q.rules.iter().all(|r| r.node_ok(k.idx, bucket.zone))
            };
            let as_cand = |k: &Key| Cand {
                node: k.idx,
                free: k.free,
                cores: k.cores,
            };
            for set in bucket.sets.iter().skip(core_class(q.need.cores)) {
                if set.is_empty() {
                    continue;
                }
                // Keys come best first; the first usable one is this set's best, and once a
                // key is no better than the best so far no later key of the set can be.
                let mut scan = |keys: &mut dyn Iterator<Item = &Key>| {
                    for k in keys {
                        let c = as_cand(k);
                        if best.as_ref().is_some_and(|b| !better(e, q.strategy, &c, b)) {
                            break;
                        }
                        if usable(k) {
                            best = Some(c);
                            break;
                        }
                    }
                };
                match q.strategy {
                    PackingStrategy::Binpack => {
                        let probe = Key {
                            free: q.need.cap,
                            cores: 0,
                            name: e.probe_name.clone(),
                            rev: false,
                            idx: 0,
                        };
                        scan(&mut set.range(probe..));
                    }
                    PackingStrategy::Spread => {
                        scan(&mut set.iter().rev().take_while(|k| k.free >= q.need.cap));
                    }
                }
            }
        }
        // Nodes this replica already uses have stale keys: check them directly.
        for &(i, _, _) in &q.overlay.entries {
            check(&mut best, i);
        }
        if q.virt.is_some() {
            check(&mut best, VIRTUAL);
        }
        best
    }

    /// Counts without visiting every node: a bucket whose class, capabilities or zone rules
    /// reject it is counted whole; in the others only nodes with enough capacity are visited
    /// (they can only lack cores, since nothing qualifies), the rest lack capacity. Nodes named
    /// by a rule or used by the overlay, and nodes outside the buckets, are checked one by one.
    fn diagnose(&self, e: &Engine, q: &Query<'_>) -> Counts {
        let mut counts: Counts = [0; RejectReason::ALL.len()];
        let Some(pool) = e.pool(q.pool) else {
            return counts;
        };
        let mut add = |r: RejectReason, n: u64| {
            if let Some(c) = counts.get_mut(r.index()) {
                *c += n;
            }
        };
        let mut special: Vec<NodeIdx> = q.overlay.entries.iter().map(|x| x.0).collect();
        for r in q.rules {
            if let Cons::NodeIn(v) | Cons::NodeNotIn(v) = &r.cons {
                special.extend(v.iter().copied());
            }
        }
        special.retain(|&i| i != VIRTUAL);
        special.sort_unstable();
        special.dedup();
        let mut special_at: Vec<(usize, usize)> = Vec::new();
        for &m in &special {
            if let Check::Reject(r) = check_node(e, q, m) {
                add(r, 1);
            }
            if let Some(n) = e.node(m)
                && n.pool == Some(q.pool)
                && n.bucketed()
                && let Some(&b) = pool.bucket_of.get(&(n.capset, n.zone, n.class().code()))
            {
                special_at.push((b, core_class(n.free_cores())));
            }
        }
        for &m in pool.unbucketed.iter().chain(&pool.pending) {
            if special.binary_search(&m).is_err()
                && let Check::Reject(r) = check_node(e, q, m)
            {
                add(r, 1);
            }
        }
        for (bi, bucket) in pool.buckets.iter().enumerate() {
            let whole = if let Err(r) = class_allowed(q.kind, q.need.band, bucket.class) {
                Some(r)
            } else if q.need.caps_unknown || !is_subset(&q.need.caps, e.capset_bits(bucket.capset))
            {
                Some(RejectReason::MissingCapability)
            } else {
                q.rules
                    .iter()
                    .find(|r| !r.uniform_ok(bucket.zone))
                    .map(|r| r.reason)
            };
            for (cc, set) in bucket.sets.iter().enumerate() {
                let here = special_at.iter().filter(|p| **p == (bi, cc)).count();
                let uniform = set.len().saturating_sub(here) as u64;
                if uniform == 0 {
                    continue;
                }
                if let Some(r) = whole {
                    add(r, uniform);
                    continue;
                }
                let (mut enough_cap, mut short_cores) = (0u64, 0u64);
                for k in set.iter().rev().take_while(|k| k.free >= q.need.cap) {
                    if special.binary_search(&k.idx).is_ok() {
                        continue;
                    }
                    enough_cap += 1;
                    if k.cores < q.need.cores {
                        short_cores += 1;
                    }
                }
                add(RejectReason::InsufficientCores, short_cores);
                add(
                    RejectReason::InsufficientCapacity,
                    uniform.saturating_sub(enough_cap),
                );
            }
        }
        counts
    }
}
