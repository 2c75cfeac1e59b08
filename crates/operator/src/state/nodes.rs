//! What the operator remembers per Manager node: its health verdicts, its drain, the
//! ManagerNode generation acted on, and why a drain waits.

use std::collections::{HashMap, HashSet};

use automanager_api::DrainStatus;
use automanager_policy::node_health::{Episodes, HealthChange, NodeHealth};
use chrono::{DateTime, Utc};

/// The per-node records, by Manager node id. Every change goes through a named operation.
#[derive(Debug)]
pub struct NodeBook {
    /// Nodes whose workers refuse too many starts.
    health: NodeHealth,
    /// Drains in progress.
    drains: HashMap<String, DrainStatus>,
    /// The ManagerNode generation the node controller last acted on.
    generations: HashMap<String, i64>,
    /// Drained nodes Manager answered a terminate of by leaving them up: a physical node is
    /// its owner's, so its drain is complete once none of our jobs is on it.
    left_to_owner: HashSet<String>,
}

/// What a drain did so far, as its status counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainProgress {
    pub migrated: usize,
    pub dropped: usize,
    pub recovered: usize,
}

fn count(n: usize) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

impl NodeBook {
    pub(super) fn new(health: NodeHealth) -> Self {
        NodeBook {
            health,
            drains: HashMap::new(),
            generations: HashMap::new(),
            left_to_owner: HashSet::new(),
        }
    }

    /// A worker on `node` refused a start at `now`.
    pub fn record_rejection(&mut self, node: &str, now: DateTime<Utc>) -> HealthChange {
        self.health.record_rejection(node, now)
    }

    /// The nodes unhealthy at `now` (verdicts that expired are dropped).
    pub fn unhealthy_nodes(&mut self, now: DateTime<Utc>) -> Vec<String> {
        self.health.unhealthy_nodes(now)
    }

    /// Recent refused starts on `node`.
    pub fn rejections(&self, node: &str) -> u32 {
        self.health.count(node)
    }

    /// The node's unhealthy episodes, if it had any.
    pub fn episodes(&self, node: &str) -> Option<Episodes> {
        self.health.episodes(node)
    }

    /// Records the ManagerNode generation acted on (`None`: the object has none).
    pub fn set_generation(&mut self, node: &str, generation: Option<i64>) {
        match generation {
            Some(g) => self.generations.insert(node.to_owned(), g),
            None => self.generations.remove(node),
        };
    }

    /// The ManagerNode generation last acted on.
    pub fn generation(&self, node: &str) -> Option<i64> {
        self.generations.get(node).copied()
    }

    /// Whether a drain of `node` is under way.
    pub fn is_draining(&self, node: &str) -> bool {
        self.drains.contains_key(node)
    }

    /// A drain of `node` begins now with `jobs` on it (a drain already begun keeps its record).
    pub fn begin_drain(&mut self, node: &str, jobs: usize, started_at: DateTime<Utc>) {
        self.drains
            .entry(node.to_owned())
            .or_insert_with(|| DrainStatus {
                jobs_remaining: count(jobs),
                started_at: Some(started_at),
                ..Default::default()
            });
    }

    /// What the drain of `node` has done so far.
    pub fn record_drain_progress(&mut self, node: &str, progress: DrainProgress) {
        if let Some(d) = self.drains.get_mut(node) {
            d.jobs_migrated = count(progress.migrated);
            d.jobs_dropped = count(progress.dropped);
            d.jobs_recovered = count(progress.recovered);
        }
    }

    /// Manager answered the drain's terminate of `node` by stopping our jobs on it and leaving
    /// the node up, its owner's.
    pub fn leave_to_owner(&mut self, node: &str) {
        if self.drains.contains_key(node) {
            self.left_to_owner.insert(node.to_owned());
        }
    }

    /// Whether a drain of `node` ended with the node left to its owner.
    pub fn left_to_owner(&self, node: &str) -> bool {
        self.left_to_owner.contains(node)
    }

    /// The user took the drain off `node`: a node left to its owner is back in service, and a
    /// later drain of it starts afresh. (A node Manager ended keeps its drain's record.)
    pub fn drain_withdrawn(&mut self, node: &str) {
        if self.left_to_owner.remove(node) {
            self.drains.remove(node);
        }
    }

    /// The drain of `node` as its status shows it: `jobs_remaining` on it now, and complete
    /// from `now` once the node has `ended`, or holds no job any more after Manager left it to
    /// its owner.
    pub fn drain_status(
        &mut self,
        node: &str,
        jobs_remaining: usize,
        ended: bool,
        now: DateTime<Utc>,
    ) -> Option<DrainStatus> {
        let left = self.left_to_owner.contains(node) && jobs_remaining == 0;
        let d = self.drains.get_mut(node)?;
        d.jobs_remaining = count(jobs_remaining);
        if (ended || left) && d.completed_at.is_none() {
            d.completed_at = Some(now);
        }
        Some(d.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn book() -> NodeBook {
        NodeBook::new(NodeHealth::new(3, Duration::from_secs(60)))
    }

    #[test]
    fn a_drain_keeps_when_it_began_and_completes_once() {
        let mut b = book();
        let t0 = DateTime::UNIX_EPOCH;
        let t1 = t0 + chrono::Duration::seconds(5);
        b.begin_drain("n", 2, t0);
        b.begin_drain("n", 9, t1);
        let d = b.drain_status("n", 1, false, t1).expect("draining");
        assert_eq!(
            (d.started_at, d.jobs_remaining, d.completed_at),
            (Some(t0), 1, None)
        );
        let d = b.drain_status("n", 0, true, t1).expect("draining");
        assert_eq!(d.completed_at, Some(t1));
        let later = t1 + chrono::Duration::seconds(5);
        assert_eq!(
            b.drain_status("n", 0, true, later)
                .expect("draining")
                .completed_at,
            Some(t1)
        );
        assert!(b.drain_status("m", 0, true, later).is_none());
    }

    #[test]
    fn a_drain_left_to_the_owner_completes_once_empty_and_starts_afresh_after_withdrawal() {
        let mut b = book();
        let t0 = DateTime::UNIX_EPOCH;
        let t1 = t0 + chrono::Duration::seconds(5);
        b.leave_to_owner("n");
        assert!(!b.left_to_owner("n"), "no drain, nothing left");
        b.begin_drain("n", 2, t0);
        b.leave_to_owner("n");
        let d = b.drain_status("n", 1, false, t0).expect("draining");
        assert_eq!(d.completed_at, None, "a job of ours is still on it");
        let d = b.drain_status("n", 0, false, t1).expect("draining");
        assert_eq!(d.completed_at, Some(t1));
        b.drain_withdrawn("n");
        assert!(!b.is_draining("n") && !b.left_to_owner("n"));
        b.begin_drain("n", 1, t1);
        let d = b.drain_status("n", 0, false, t1).expect("draining");
        assert_eq!(d.completed_at, None, "a new drain, not yet answered");
        // A node Manager ended keeps its drain's record when the drain is taken off.
        b.drain_status("n", 0, true, t1);
        b.drain_withdrawn("n");
        assert!(b.is_draining("n"));
    }
}
