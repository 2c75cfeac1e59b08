//! The placement model kept in step with Manager's mirror, at the state's surface: the mirror
//! pump takes the whole mirror in, or the nodes a batch of changes touched, and asks what the
//! model still holds of a node before it takes a batch in (a node the mirror dropped is still
//! in the model until then: its pool names whom its loss wakes, and a node lost counts toward
//! the zone brake only if the model held it up).

use manager_client::MirrorState;

use super::State;

impl State {
    /// The model takes in every node the mirror shows, and drops those it no longer shows.
    pub fn sync_all(&self, mirror: &MirrorState) {
        self.lock().model_mut().sync_all(mirror);
    }

    /// The model takes in `nodes` as the mirror shows them now (dropped when it shows none).
    pub fn sync_nodes(&self, mirror: &MirrorState, nodes: impl IntoIterator<Item = String>) {
        self.lock().model_mut().sync_nodes(mirror, nodes);
    }

    /// The pool of node `id` as the model holds it (`None`: the model does not hold it).
    pub fn node_pool(&self, id: &str) -> Option<String> {
        self.lock().model().engine().node_view(id).map(|v| v.pool)
    }
}

#[cfg(test)]
mod tests {
    use manager_client::proto;

    use super::*;
    use crate::settings::Settings;

    use crate::test_fixtures::{mirror_of as with, pool};

    fn node(id: &str, state: proto::NodeState) -> proto::Node {
        crate::test_fixtures::node_in(id, "", state)
    }

    #[test]
    fn a_node_the_mirror_dropped_is_held_until_a_sync_takes_it_in() {
        let state = State::new(&Settings::default());
        let up = with(&[
            node("n1", proto::NodeState::Started),
            node("n2", proto::NodeState::Started),
        ]);
        state.load_pool(&up, pool()).expect("valid");
        state.sync_all(&up);
        assert_eq!(state.node_pool("n1").as_deref(), Some("a"));

        // n1 gone from the mirror, n2 terminated: until the batch is taken in, the model
        // still answers both (the pump asks it before it syncs).
        let after = with(&[node("n2", proto::NodeState::Terminated)]);
        assert_eq!(state.node_pool("n1").as_deref(), Some("a"));
        state.sync_nodes(&after, ["n1".to_owned()]);
        assert_eq!(state.node_pool("n1"), None);
        assert_eq!(
            state.node_pool("n2").as_deref(),
            Some("a"),
            "a node the batch did not touch is left as it was"
        );
        state.sync_all(&after);
        assert_eq!(state.node_pool("n2"), None);
    }
}
