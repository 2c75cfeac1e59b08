//! The rules for a Manager node that span books: a worker's rejected start counts toward the
//! node's health and, when it trips the threshold, marks the node unhealthy in the placement
//! model; a ManagerNode's cordon goes into the model with the generation it was applied at;
//! and what the books say of a node for its status.

use automanager_api::{DrainStatus, Hold};
use automanager_policy::node_health::{Episodes, HealthChange};
use chrono::{DateTime, Utc};
use manager_client::MirrorState;

use super::{HeldMove, State};
use crate::mapping::NodeOverlay;

/// What the books say of one node, read at once.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    /// Rejected starts in the health window.
    pub rejections: u32,
    pub episodes: Option<Episodes>,
    /// What holds a drain of the node back, if anything does.
    pub drain_held: Option<Hold>,
}

impl State {
    /// A worker refused a start on `node` at `now`: counted toward its health; true when this
    /// made it unhealthy, and then it is marked so in the placement model (placement avoids
    /// it).
    pub fn record_rejection(&self, mirror: &MirrorState, node: &str, now: DateTime<Utc>) -> bool {
        let mut s = self.lock();
        if s.nodes_mut().record_rejection(node, now) != HealthChange::BecameUnhealthy {
            return false;
        }
        let overlay = NodeOverlay {
            unhealthy: true,
            ..s.model().overlay(node)
        };
        s.model_mut().set_overlay(node, overlay, mirror);
        true
    }

    /// The nodes whose health verdict is unhealthy at `now` (verdicts expire).
    pub fn unhealthy_nodes(&self, now: DateTime<Utc>) -> Vec<String> {
        self.lock().nodes_mut().unhealthy_nodes(now)
    }

    /// Keeps `node`'s health overlay in the model at `unhealthy`; answers the overlay.
    pub fn set_health(&self, mirror: &MirrorState, node: &str, unhealthy: bool) -> NodeOverlay {
        let mut s = self.lock();
        let mut overlay = s.model().overlay(node);
        if overlay.unhealthy != unhealthy {
            overlay.unhealthy = unhealthy;
            s.model_mut().set_overlay(node, overlay, mirror);
        }
        overlay
    }

    /// The operator's overlay on `node` (cordoned, unhealthy, consolidating).
    pub fn overlay(&self, node: &str) -> NodeOverlay {
        self.lock().model().overlay(node)
    }

    /// A ManagerNode's spec of `generation` was applied: its cordon goes into the model.
    /// Answers the overlay it had before.
    pub fn apply_cordon(
        &self,
        mirror: &MirrorState,
        node: &str,
        cordoned: bool,
        generation: Option<i64>,
    ) -> NodeOverlay {
        let mut s = self.lock();
        let was = s.model().overlay(node);
        s.model_mut()
            .set_overlay(node, NodeOverlay { cordoned, ..was }, mirror);
        s.nodes_mut().set_generation(node, generation);
        was
    }

    /// What the books say of `node` for its status.
    pub fn node_record(&self, node: &str) -> NodeRecord {
        let s = self.lock();
        NodeRecord {
            rejections: s.nodes().rejections(node),
            episodes: s.nodes().episodes(node),
            drain_held: s.disruptions().held(&HeldMove::Drain(node.to_owned())),
        }
    }

    /// The drain of `node` as its status shows it, with `jobs_remaining` on it; `ended` when the
    /// node is gone.
    pub fn drain_status(
        &self,
        node: &str,
        jobs_remaining: usize,
        ended: bool,
        now: DateTime<Utc>,
    ) -> Option<DrainStatus> {
        (self.lock().nodes_mut()).drain_status(node, jobs_remaining, ended, now)
    }

    /// The ManagerNode generation acted on for `node`.
    pub fn node_generation(&self, node: &str) -> Option<i64> {
        self.lock().nodes().generation(node)
    }

    /// Whether a drain of `node` is under way.
    pub fn is_draining(&self, node: &str) -> bool {
        self.lock().nodes().is_draining(node)
    }

    /// `node` was emptied and Manager left it up (its owner's to power off): its drain ends
    /// there.
    pub fn leave_to_owner(&self, node: &str) {
        self.lock().nodes_mut().leave_to_owner(node);
    }

    /// Whether `node`'s drain ended with the node left to its owner.
    pub fn left_to_owner(&self, node: &str) -> bool {
        self.lock().nodes().left_to_owner(node)
    }

    /// The ManagerNode's drain was withdrawn.
    pub fn drain_withdrawn(&self, node: &str) {
        self.lock().nodes_mut().drain_withdrawn(node);
    }
}

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;
    use proptest::prelude::*;

    use super::*;
    use crate::settings::Settings;

    const NODES: [&str; 2] = ["n1", "n2"];

    proptest! {
        /// The health book and the placement model agree: a node is marked unhealthy in the
        /// model once one of its rejections made it unhealthy and not before, and a rejection
        /// never touches another node.
        #[test]
        fn a_node_is_avoided_exactly_when_its_rejections_made_it_unhealthy(
            rejections in proptest::collection::vec((0..NODES.len(), 0i64..30), 1..40)
        ) {
            let state = State::new(&Settings::default());
            let mirror = MirrorState::default();
            let mut now = DateTime::UNIX_EPOCH;
            let mut marked = [false; 2];
            for (n, secs) in rejections {
                now += TimeDelta::seconds(secs);
                // Verdicts expire, so a node can become unhealthy again; only the node
                // status sync clears the mark (`set_health`), never a rejection.
                if state.record_rejection(&mirror, NODES[n], now) {
                    marked[n] = true;
                }
                for (i, node) in NODES.iter().enumerate() {
                    prop_assert_eq!(state.overlay(node).unhealthy, marked[i], "node {}", node);
                }
            }
        }
    }

    #[test]
    fn a_cordon_goes_into_the_model_with_its_generation() {
        let state = State::new(&Settings::default());
        let mirror = MirrorState::default();
        let was = state.apply_cordon(&mirror, "n1", true, Some(3));
        assert!(!was.cordoned);
        assert!(state.overlay("n1").cordoned);
        assert_eq!(state.node_generation("n1"), Some(3));
        assert!(state.apply_cordon(&mirror, "n1", false, None).cordoned);
        assert!(!state.overlay("n1").cordoned);
        assert_eq!(state.node_generation("n1"), None);
    }
}
