//! Node health from start rejections: a node whose workers refuse too many starts within a
//! window is marked unhealthy and avoided by placement until the window passes quietly.
//!
//! A flapping node (unhealthy, healthy, unhealthy again) is kept out longer each time: every
//! episode that begins within [`FlapSettings::memory`] of the previous one doubles the hold-out
//! (the rejection window the first time), up to [`FlapSettings::max_hold`]. The TypeScript
//! library (`@norskvideo/norsk-auto-manager`) has no such back-off; without it a node that
//! refuses work every other minute keeps drawing placements.
//! Pure: time is passed in.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};

/// How a flapping node is kept out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlapSettings {
    /// The longest hold-out.
    pub max_hold: Duration,
    /// An unhealthy episode beginning within this of the previous one counts as a flap;
    /// a node quiet for longer starts again from one.
    pub memory: Duration,
}

impl Default for FlapSettings {
    fn default() -> Self {
        FlapSettings {
            max_hold: Duration::from_secs(30 * 60),
            memory: Duration::from_secs(60 * 60),
        }
    }
}

/// A node's unhealthy episodes, for the flap back-off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Episodes {
    /// Consecutive episodes, each within `memory` of the one before (1 on the first).
    pub count: u32,
    /// When the latest began.
    pub last: DateTime<Utc>,
    /// Placement avoids the node until then, whatever its rejections.
    pub held_until: DateTime<Utc>,
}

/// The hold-out of the `count`th consecutive episode: `base` doubled per flap, capped at `max`.
pub fn hold_for(count: u32, base: Duration, max: Duration) -> Duration {
    let doublings = count.saturating_sub(1).min(31);
    base.checked_mul(1u32 << doublings).unwrap_or(max).min(max)
}

/// Rejections per node in a sliding window.
#[derive(Debug)]
pub struct NodeHealth {
    threshold: u32,
    window: Duration,
    flap: FlapSettings,
    rejections: HashMap<String, VecDeque<DateTime<Utc>>>,
    episodes: HashMap<String, Episodes>,
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
        NodeHealth::with_flap(threshold, window, FlapSettings::default())
    }

    pub fn with_flap(threshold: u32, window: Duration, flap: FlapSettings) -> Self {
        NodeHealth {
            threshold: threshold.max(1),
            window,
            flap,
            rejections: HashMap::new(),
            episodes: HashMap::new(),
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
        let was = self.is_unhealthy_at(node, now);
        let q = self.rejections.entry(node.to_owned()).or_default();
        q.push_back(now);
        // Bounded: only the newest `threshold` entries matter.
        while q.len() > self.threshold as usize {
            q.pop_front();
        }
        if !was && self.is_unhealthy(node) {
            self.begin_episode(node, now);
            HealthChange::BecameUnhealthy
        } else {
            HealthChange::Unchanged
        }
    }

    /// A new unhealthy episode: counted as a flap when the previous one began within
    /// `memory`, and held out for [`hold_for`] that count.
    fn begin_episode(&mut self, node: &str, now: DateTime<Utc>) {
        let memory = chrono::Duration::from_std(self.flap.memory).unwrap_or(chrono::Duration::MAX);
        let count = match self.episodes.get(node) {
            Some(e) if now - e.last <= memory => e.count.saturating_add(1),
            _ => 1,
        };
        let hold = hold_for(count, self.window, self.flap.max_hold.max(self.window));
        let held_until =
            now + chrono::Duration::from_std(hold).unwrap_or(chrono::Duration::MAX / 2);
        self.episodes.insert(
            node.to_owned(),
            Episodes {
                count,
                last: now,
                held_until,
            },
        );
    }

    /// The node's episodes, while it is remembered.
    pub fn episodes(&self, node: &str) -> Option<Episodes> {
        self.episodes.get(node).copied()
    }

    /// Unhealthy by its rejections or still held out at `now`.
    pub fn is_unhealthy_at(&self, node: &str, now: DateTime<Utc>) -> bool {
        self.is_unhealthy(node) || self.episodes.get(node).is_some_and(|e| now < e.held_until)
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
        let memory = chrono::Duration::from_std(self.flap.memory).unwrap_or(chrono::Duration::MAX);
        self.episodes
            .retain(|_, e| now < e.held_until || now - e.last <= memory);
        let mut v: Vec<String> = self
            .rejections
            .keys()
            .chain(self.episodes.keys())
            .filter(|n| self.is_unhealthy_at(n, now))
            .cloned()
            .collect();
        v.sort();
        v.dedup();
        v
    }

    pub fn forget(&mut self, node: &str) {
        self.rejections.remove(node);
        self.episodes.remove(node);
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
    fn hold_for_doubles_per_flap_up_to_the_cap() {
        let m = Duration::from_secs(60);
        let cap = Duration::from_secs(600);
        let got: Vec<u64> = (0..7).map(|c| hold_for(c, m, cap).as_secs()).collect();
        assert_eq!(got, vec![60, 60, 120, 240, 480, 600, 600]);
        assert_eq!(hold_for(u32::MAX, m, cap), cap, "no overflow");
    }

    #[test]
    fn a_flapping_node_is_kept_out_longer_each_time() {
        let flap = FlapSettings {
            max_hold: Duration::from_secs(300),
            memory: Duration::from_secs(3600),
        };
        let mut h = NodeHealth::with_flap(1, Duration::from_secs(60), flap);
        let mut start = 0;
        let mut holds = Vec::new();
        for _ in 0..5 {
            assert_eq!(
                h.record_rejection("n", t(start)),
                HealthChange::BecameUnhealthy
            );
            let e = h
                .episodes("n")
                .unwrap_or_else(|| panic!("episode recorded"));
            let hold = (e.held_until - t(start)).num_seconds();
            holds.push(hold);
            assert!(
                h.unhealthy_nodes(t(start + hold - 1))
                    .contains(&"n".to_string())
            );
            assert!(
                h.unhealthy_nodes(t(start + hold + 1)).is_empty(),
                "healthy once the hold ends"
            );
            start += hold + 2;
        }
        assert_eq!(holds, vec![60, 120, 240, 300, 300]);
        // Quiet for longer than the memory: the next episode starts from one again.
        start += 3700;
        assert_eq!(
            h.record_rejection("n", t(start)),
            HealthChange::BecameUnhealthy
        );
        assert_eq!(h.episodes("n").map(|e| e.count), Some(1));
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
