//! Node health from start rejections: a node whose workers refuse too many starts within a
//! window is marked unhealthy and avoided by placement until the window passes quietly.
//! Pure: time is passed in.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// Rejections per node in a sliding window.
#[derive(Debug)]
pub struct NodeHealth {
    threshold: u32,
    window: Duration,
    rejections: HashMap<String, VecDeque<DateTime<Utc>>>,
}

/// What a recorded rejection did to the node's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HealthChange {
    /// Still healthy.
    Unchanged,
    /// This rejection tripped the threshold.
    BecameUnhealthy,
}

impl NodeHealth {
    pub fn new(threshold: u32, window: Duration) -> Self {
        NodeHealth {
            threshold: threshold.max(1),
            window,
            rejections: HashMap::new(),
        }
    }

    fn prune(&mut self, now: DateTime<Utc>) {
        let window = chrono::Duration::from_std(self.window).unwrap_or(chrono::Duration::MAX);
        self.rejections.retain(|_, q| {
            while q.front().is_some_and(|t| now - *t > window) {
                q.pop_front();
            }
            !q.is_empty()
        });
    }

    /// Records a refused start on `node`.
    pub fn record_rejection(&mut self, node: &str, now: DateTime<Utc>) -> HealthChange {
        self.prune(now);
        let was = self.is_unhealthy(node);
        let q = self.rejections.entry(node.to_owned()).or_default();
        q.push_back(now);
        // Bounded: only the newest `threshold` entries matter.
        while q.len() > self.threshold as usize {
            q.pop_front();
        }
        if !was && self.is_unhealthy(node) {
            HealthChange::BecameUnhealthy
        } else {
            HealthChange::Unchanged
        }
    }

    /// Rejections of `node` in the current window.
    pub fn count(&self, node: &str) -> u32 {
        self.rejections
            .get(node)
            .map_or(0, |q| u32::try_from(q.len()).unwrap_or(u32::MAX))
    }

    pub fn is_unhealthy(&self, node: &str) -> bool {
        self.count(node) >= self.threshold
    }

    /// Nodes unhealthy now, after dropping rejections older than the window.
    pub fn unhealthy_nodes(&mut self, now: DateTime<Utc>) -> Vec<String> {
        self.prune(now);
        let mut v: Vec<String> = self
            .rejections
            .keys()
            .filter(|n| self.is_unhealthy(n))
            .cloned()
            .collect();
        v.sort();
        v
    }

    pub fn forget(&mut self, node: &str) {
        self.rejections.remove(node);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(s, 0).single().unwrap_or_default()
    }

    #[test]
    fn a_node_becomes_unhealthy_when_rejections_reach_the_threshold_within_the_window() {
        let mut h = NodeHealth::new(3, Duration::from_secs(60));
        assert_eq!(h.record_rejection("n1", t(0)), HealthChange::Unchanged);
        assert_eq!(h.record_rejection("n1", t(10)), HealthChange::Unchanged);
        assert_eq!(
            h.record_rejection("n1", t(20)),
            HealthChange::BecameUnhealthy
        );
        assert!(h.is_unhealthy("n1"));
        assert!(!h.is_unhealthy("n2"));
    }

    #[test]
    fn rejections_spread_beyond_the_window_never_trip_it() {
        let mut h = NodeHealth::new(3, Duration::from_secs(60));
        for i in 0..10 {
            assert_eq!(h.record_rejection("n1", t(i * 40)), HealthChange::Unchanged);
        }
    }

    #[test]
    fn an_unhealthy_node_recovers_once_the_window_passes_quietly() {
        let mut h = NodeHealth::new(2, Duration::from_secs(60));
        h.record_rejection("n1", t(0));
        h.record_rejection("n1", t(1));
        assert_eq!(h.unhealthy_nodes(t(30)), vec!["n1".to_string()]);
        assert!(h.unhealthy_nodes(t(200)).is_empty());
    }
}
