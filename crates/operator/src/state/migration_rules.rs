//! The rules of a Migration's target at the state's surface: the engine's choice of a target
//! and its hold in the model are made under one hold of the lock, so two Migrations (or a
//! Bundle pass) deciding at once never count the same room free; the hold goes once the mirror
//! shows the job on the target, or when the migration ends.

use automanager_placement as pl;
use manager_client::MirrorState;

use super::State;

/// The migration a target is chosen for: Manager's ids of the migration and of its job, the
/// job's name in its Bundle, and the node it moves from.
#[derive(Debug, Clone, Copy)]
pub struct Moving<'a> {
    pub migration_id: &'a str,
    pub job_id: &'a str,
    pub job_name: &'a str,
    pub source: &'a str,
}

impl State {
    /// The engine's answer to `request` for the target of `moving`; a node it chose that is up
    /// (other than the source) holds the job's capacity before the lock is released.
    pub fn place_migration_target(
        &self,
        mirror: &MirrorState,
        request: &pl::PlacementRequest,
        now_ms: u64,
        moving: Moving<'_>,
    ) -> pl::Decision {
        let mut s = self.lock();
        let decision = s.model().place(request, now_ms);
        if let pl::Outcome::Placed { assignments, .. } = &decision.outcome
            && let Some(a) = assignments
                .iter()
                .find(|a| a.job_name == moving.job_name && a.node != moving.source)
                .filter(|a| !a.node_pending)
        {
            s.model_mut().hold_target(
                moving.migration_id,
                (moving.job_id, &a.node),
                (a.capacity, a.cores),
                mirror,
            );
        }
        decision
    }

    /// `node` was named as the target of migration `migration_id` of job `job_id`: it holds
    /// what the job requires, as the mirror shows its requirements (nothing when the mirror
    /// does not know the job).
    pub fn hold_migration_target(
        &self,
        mirror: &MirrorState,
        migration_id: &str,
        job_id: &str,
        node: &str,
    ) {
        let Some(r) = mirror
            .jobs
            .get(job_id)
            .and_then(|j| j.requirements.as_ref())
        else {
            return;
        };
        let cores = u32::try_from(r.required_cores).unwrap_or(0);
        (self.lock().model_mut()).hold_target(
            migration_id,
            (job_id, node),
            (r.required_capacity, cores),
            mirror,
        );
    }

    /// Migration `migration_id` ended: aborted or failed, its target holds nothing more;
    /// `completed`, until the mirror shows the job there.
    pub fn end_migration_target(&self, mirror: &MirrorState, migration_id: &str, completed: bool) {
        (self.lock().model_mut()).end_target(migration_id, completed, mirror);
    }

    /// The node the target of migration `migration_id` holds capacity on.
    pub fn migration_target_held(&self, migration_id: &str) -> Option<String> {
        (self.lock().model().held_target(migration_id)).map(str::to_owned)
    }
}

#[cfg(test)]
mod tests {
    use manager_client::proto;

    use super::*;
    use crate::settings::Settings;

    use crate::test_fixtures::pool;

    fn node(id: &str) -> proto::Node {
        crate::test_fixtures::node_in(id, "", proto::NodeState::Started)
    }

    /// Job `name` of bundle `ns.b` (6 capacity, 1 core), its normal instance in `state` on
    /// `node`.
    fn job(name: &str, node: &str, state: proto::JobState) -> proto::Job {
        proto::Job {
            job_id: format!("ns.b/0/{name}"),
            bundle_id: "ns.b".into(),
            job_name: name.into(),
            requirements: Some(proto::JobRequirements {
                required_capacity: 6.0,
                required_cores: 1,
                ..Default::default()
            }),
            state: state as i32,
            node_id: node.into(),
            instances: vec![proto::JobInstance {
                node_id: node.into(),
                role: proto::JobRole::Normal as i32,
                state: state as i32,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// n1 up and empty; `enc` and `pkg` running on `src`, a node the model does not hold (a
    /// drained node's jobs, as the engine sees them: somewhere else).
    fn mirror() -> MirrorState {
        let mut m = MirrorState::default();
        m.nodes.insert("n1".into(), node("n1"));
        m.insert_job(job("enc", "src", proto::JobState::Running));
        m.insert_job(job("pkg", "src", proto::JobState::Running));
        m
    }

    fn request(job: &str) -> pl::PlacementRequest {
        serde_json::from_value(serde_json::json!({
            "bundleId": "ns.b", "replicaIndex": 0, "pools": ["a"],
            "jobs": [{"jobName": job, "requirements": {
                "requiredCapacity": 6.0, "requiredCores": 1, "priorityBand": "gold"
            }}],
        }))
        .expect("a placement request")
    }

    fn moving<'a>(migration_id: &'a str, job_id: &'a str, job_name: &'a str) -> Moving<'a> {
        Moving {
            migration_id,
            job_id,
            job_name,
            source: "src",
        }
    }

    fn placed_on(d: &pl::Decision) -> Vec<&str> {
        match &d.outcome {
            pl::Outcome::Placed { assignments, .. } => {
                assignments.iter().map(|a| a.node.as_str()).collect()
            }
            _ => Vec::new(),
        }
    }

    fn used(state: &State, node: &str) -> f64 {
        let s = state.lock();
        (s.model().engine().node_view(node)).map_or(-1.0, |v| v.used_capacity)
    }

    #[test]
    fn a_target_holds_its_room_until_the_mirror_shows_the_job_there() {
        let state = State::new(&Settings::default());
        let mut m = mirror();
        state.load_pool(&m, pool()).expect("valid");
        state.sync_all(&m);

        let first =
            state.place_migration_target(&m, &request("enc"), 0, moving("m1", "ns.b/0/enc", "enc"));
        assert_eq!(placed_on(&first), ["n1"]);

        // A stop-then-start target starts only at the cutover: until then a second move (or a
        // Bundle's placement) must not count n1's room free, or both land there (12 of 10).
        let second =
            state.place_migration_target(&m, &request("pkg"), 0, moving("m2", "ns.b/0/pkg", "pkg"));
        assert!(placed_on(&second).is_empty(), "{:?}", second.outcome);
        assert_eq!(state.migration_target_held("m1").as_deref(), Some("n1"));
        assert_eq!(state.migration_target_held("m2"), None);
        assert_eq!(used(&state, "n1"), 6.0);

        // A change that does not show the job on n1 keeps the hold.
        m.insert_job(job("pkg", "src", proto::JobState::Stopping));
        state.sync_nodes(&m, ["n1".to_owned()]);
        assert_eq!(used(&state, "n1"), 6.0);

        // The cutover: the job runs on n1 under its own role; the mirror counts it, once.
        m.insert_job(job("enc", "n1", proto::JobState::Running));
        state.sync_nodes(&m, ["n1".to_owned()]);
        assert_eq!(state.migration_target_held("m1"), None);
        assert_eq!(used(&state, "n1"), 6.0);
    }

    #[test]
    fn a_target_chosen_again_or_ended_gives_its_room_back() {
        let state = State::new(&Settings::default());
        let mut m = mirror();
        m.nodes.insert("n2".into(), node("n2"));
        state.load_pool(&m, pool()).expect("valid");
        state.sync_all(&m);

        state.hold_migration_target(&m, "m1", "ns.b/0/enc", "n1");
        assert_eq!((used(&state, "n1"), used(&state, "n2")), (6.0, 0.0));
        // The target refused it and another node was named: only the new one holds.
        state.hold_migration_target(&m, "m1", "ns.b/0/enc", "n2");
        assert_eq!((used(&state, "n1"), used(&state, "n2")), (0.0, 6.0));
        // Aborted before the job ever started there.
        state.end_migration_target(&m, "m1", false);
        assert_eq!((used(&state, "n1"), used(&state, "n2")), (0.0, 0.0));

        // Completed before the mirror shows the job there (the migration's record came
        // first): held until it does, in whatever state the job is by then.
        state.hold_migration_target(&m, "m1", "ns.b/0/enc", "n2");
        state.end_migration_target(&m, "m1", true);
        assert_eq!(used(&state, "n2"), 6.0);
        m.insert_job(job("enc", "n2", proto::JobState::Failed));
        state.sync_nodes(&m, ["n2".to_owned()]);
        assert_eq!(state.migration_target_held("m1"), None);
        assert_eq!(used(&state, "n2"), 0.0);

        // A job the mirror does not know holds nothing; nor does a job already shown there.
        state.hold_migration_target(&m, "m2", "ns.b/0/gone", "n1");
        assert_eq!(state.migration_target_held("m2"), None);
        m.insert_job(job("pkg", "n1", proto::JobState::Starting));
        state.sync_all(&m);
        state.hold_migration_target(&m, "m3", "ns.b/0/pkg", "n1");
        assert_eq!(state.migration_target_held("m3"), None);
        assert_eq!(used(&state, "n1"), 6.0);
    }
}
