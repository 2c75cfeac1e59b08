//! The rules of a replica's placement at the state's surface: policy's decision is reserved
//! in the model and remembered as the replica's last decision under one hold of the lock (a
//! second pass never decides on capacity the first took but has not recorded); a start
//! Manager answered keeps its reservation until the mirror shows it, one it refused (or one
//! rolled back) gives its capacity back; and why a replica cannot be placed is told against
//! the pools' bounds as the model counts them at that moment.

use std::collections::HashMap;

use automanager_placement as pl;
use automanager_policy::bundle::{self as plan, Blocked};
use automanager_policy::bundle_pass::Decided;
use chrono::{DateTime, Utc};
use manager_client::MirrorState;

use super::{LastDecision, State};
use crate::model::{Reserving, StartMark};

impl State {
    /// What is wrong with `bundle` against the pools the model holds (their nodes aside).
    pub fn validate_bundle(&self, bundle: &pl::BundleSpec) -> Vec<pl::ValidationError> {
        let pools = self.lock().model().pools();
        pl::validate_bundle(bundle, &pools, &[])
    }

    /// Of `pools`, those being deleted.
    pub fn terminating_pools(&self, pools: &[String]) -> Vec<String> {
        let s = self.lock();
        (pools.iter())
            .filter(|p| s.model().pool(p).is_some_and(|p| p.terminating))
            .cloned()
            .collect()
    }

    /// The node of each of `jobs` whose start Manager accepted and the mirror does not show
    /// yet (in `jobs`' order); to be asked while the mirror read that observed them is held.
    pub fn starts_not_mirrored(&self, jobs: &[pl::JobKey]) -> Vec<Option<String>> {
        let s = self.lock();
        (jobs.iter())
            .map(|k| s.model().started_not_mirrored(k).map(str::to_owned))
            .collect()
    }

    /// Policy's decision for one replica of `bundle` (`decide`, over the model as its book of
    /// reservations: it must not block), reserved and remembered at `at` as the replica's last
    /// decision (`recovery` or not) before the lock is released. `job_ids` maps the replica's
    /// job names to Manager's ids.
    pub fn decide_placement(
        &self,
        mirror: &MirrorState,
        job_ids: &HashMap<String, String>,
        bundle: (String, String),
        recovery: bool,
        at: DateTime<Utc>,
        decide: impl FnOnce(&mut Reserving<'_>) -> Decided,
    ) -> Decided {
        let mut s = self.lock();
        let made = decide(&mut s.model_mut().reserving(mirror, job_ids));
        let last = LastDecision {
            decision: made.decision.clone(),
            recovery,
            at,
            preempted: None,
        };
        let replica = made.decision.replica_index;
        s.bundles_mut().record_decision(bundle, replica, last);
        made
    }

    /// Manager accepted the start of `job` (`mark`): its reservation holds until the mirror
    /// reflects it.
    pub fn start_answered(&self, mirror: &MirrorState, job: &pl::JobKey, mark: StartMark) {
        self.lock().model_mut().start_answered(job, mark, mirror);
    }

    /// The start of `job` failed, was refused or was rolled back: its capacity is given back.
    pub fn abandon_start(&self, mirror: &MirrorState, job: &pl::JobKey) {
        self.lock().model_mut().abandon(job, mirror);
    }

    /// Why replica `r` cannot be placed (`jobs` unplaceable after trying `pools`), each pool at
    /// its bound told with the bound and the nodes the model counts against it now.
    pub fn unplaceable(
        &self,
        r: u32,
        jobs: &[pl::JobUnplaceable],
        pools: &[pl::PoolAttempt],
    ) -> Blocked {
        let s = self.lock();
        let model = s.model();
        plan::unplaceable(r, jobs, pools, |pool| {
            let bound = model.pool(pool).and_then(|p| p.max_nodes)?;
            let nodes = (model.engine().pool_usage(pool)).map_or(0, |u| u.node_count);
            Some(plan::MaxNodes { bound, nodes })
        })
    }
}

#[cfg(test)]
mod tests {
    use automanager_policy::bundle_pass::Reservations;

    use super::*;
    use crate::settings::Settings;

    fn pool(terminating: bool, max_nodes: u32) -> pl::PoolSpec {
        serde_json::from_value(serde_json::json!({
            "name": "a", "kind": "aws", "region": "r", "scaleOut": "elastic",
            "terminating": terminating, "maxNodes": max_nodes,
            "candidateInstanceTypes": [
                {"instanceType": "small", "totalCapacity": 10.0, "totalCores": 4}
            ],
        }))
        .expect("a pool spec")
    }

    fn request() -> pl::PlacementRequest {
        serde_json::from_value(serde_json::json!({
            "bundleId": "ns.b", "replicaIndex": 1, "pools": ["a"],
            "jobs": [{"jobName": "enc", "requirements": {
                "requiredCapacity": 1.0, "requiredCores": 1, "priorityBand": "gold"
            }}],
        }))
        .expect("a placement request")
    }

    /// The engine's answer to [`request`] over the model, reserved when it placed.
    fn decide(book: &mut Reserving<'_>) -> Decided {
        let request = request();
        let decision = book.engine().place(&request, 0);
        let unreserved = book.reserve(&decision).err();
        Decided {
            request,
            decision,
            unreserved,
        }
    }

    #[test]
    fn a_decision_is_remembered_for_its_replica_as_it_is_made() {
        let state = State::new(&Settings::default());
        let mirror = MirrorState::default();
        state.load_pool(&mirror, pool(false, 0)).expect("valid");
        let name = ("ns".to_owned(), "b".to_owned());
        let at = DateTime::UNIX_EPOCH;
        let made = state.decide_placement(&mirror, &HashMap::new(), name.clone(), true, at, decide);
        let last = state.last_decisions(&name);
        let remembered = last.get(&1).expect("replica 1's decision");
        assert_eq!(remembered.decision, made.decision);
        assert!(remembered.recovery);
        assert_eq!(remembered.at, at);
        assert_eq!(
            state.history_unwritten(&name).0.len(),
            1,
            "and waits for the history"
        );
    }

    #[test]
    fn a_pool_at_its_bound_is_named_with_the_nodes_counted_against_it() {
        let state = State::new(&Settings::default());
        let mirror = MirrorState::default();
        state.load_pool(&mirror, pool(false, 0)).expect("valid");
        let made = state.decide_placement(
            &mirror,
            &HashMap::new(),
            ("ns".to_owned(), "b".to_owned()),
            false,
            DateTime::UNIX_EPOCH,
            decide,
        );
        let pl::Outcome::Unplaceable { jobs } = &made.decision.outcome else {
            panic!(
                "a pool at maxNodes 0 places nothing: {:?}",
                made.decision.outcome
            );
        };
        let blocked = state.unplaceable(1, jobs, &made.decision.trace.pools);
        assert_eq!(blocked.cause, plan::BlockedCause::MaxNodes);
        assert!(
            blocked.message.contains("pool a is at its maxNodes (0)"),
            "{}",
            blocked.message
        );
    }

    #[test]
    fn a_bundle_is_checked_against_the_pools_loaded() {
        let state = State::new(&Settings::default());
        let mirror = MirrorState::default();
        let bundle: pl::BundleSpec = serde_json::from_value(serde_json::json!({
            "bundleId": "ns.b", "replicas": 1, "pools": ["a"],
            "jobs": [{"jobName": "enc", "requirements": {
                "requiredCapacity": 1.0, "requiredCores": 1, "priorityBand": "gold"
            }}],
        }))
        .expect("a bundle spec");
        assert!(matches!(
            state.validate_bundle(&bundle).as_slice(),
            [pl::ValidationError::UnknownPool { .. }]
        ));
        state.load_pool(&mirror, pool(false, 1)).expect("valid");
        assert_eq!(state.validate_bundle(&bundle), Vec::new());
    }

    #[test]
    fn only_the_pools_being_deleted_are_terminating() {
        let state = State::new(&Settings::default());
        let mirror = MirrorState::default();
        let asked = ["a".to_owned(), "gone".to_owned()];
        state.load_pool(&mirror, pool(false, 0)).expect("valid");
        assert!(state.terminating_pools(&asked).is_empty());
        state.load_pool(&mirror, pool(true, 0)).expect("valid");
        assert_eq!(state.terminating_pools(&asked), ["a"]);
    }
}
