//! The rules of a bundle's records at the state's surface: its replicas' restarts (taken in
//! from its status, counted, cleared), its last decisions and which of them its
//! PlacementHistory holds (what the history's writer knows of the object changes together
//! with the decisions it wrote), and a bundle gone leaving nothing behind in any book.

use std::collections::BTreeMap;

use automanager_api::{self as api, Bundle};
use automanager_policy::ledger::ReplicaKey;
use chrono::{DateTime, Utc};
use kube::runtime::reflector::ObjectRef;
use manager_client::MirrorState;

use super::{HistoryKnown, LastDecision, State};

/// A bundle's `(namespace, name)`.
type BundleName = (String, String);

impl State {
    /// Takes in the restart times `bundle_id`'s status records per replica (an operator
    /// restart, or a leader change, loses none of them).
    pub fn merge_restarts(
        &self,
        bundle_id: &str,
        recorded: &[api::ReplicaStatus],
        now: DateTime<Utc>,
    ) {
        let mut s = self.lock();
        for rs in recorded {
            let Ok(r) = u32::try_from(rs.replica) else {
                continue;
            };
            (s.bundles_mut()).merge_restarts(
                &ReplicaKey::new(bundle_id, r),
                rs.restart_times.iter().copied(),
                now,
            );
        }
    }

    /// A recovery of the replica started at `now`: it counts against its ceiling.
    pub fn record_restart(&self, key: &ReplicaKey, now: DateTime<Utc>, max_restarts: u32) {
        self.lock()
            .bundles_mut()
            .record_restart(key, now, max_restarts);
    }

    /// The restart counts of `bundle_id`'s `replicas` are cleared at `now` (a retry, or they
    /// ran long enough).
    pub fn clear_restarts(
        &self,
        bundle_id: &str,
        replicas: impl IntoIterator<Item = u32>,
        now: DateTime<Utc>,
    ) {
        let mut s = self.lock();
        for r in replicas {
            (s.bundles_mut()).clear_restarts(&ReplicaKey::new(bundle_id, r), now);
        }
    }

    /// The replica's restarts within the window at `now`, and when each was.
    pub fn restarts(&self, key: &ReplicaKey, now: DateTime<Utc>) -> (u32, Vec<DateTime<Utc>>) {
        let s = self.lock();
        let book = s.bundles();
        (book.restarts(key, now), book.restart_times(key, now))
    }

    /// The last decision per replica of `bundle` (empty when none is remembered).
    pub fn last_decisions(&self, bundle: &BundleName) -> BTreeMap<u32, LastDecision> {
        self.lock().bundles().trace(bundle).unwrap_or_default()
    }

    /// The last decision per replica of `bundle` for `/debug/trace` (`None`: it made none this
    /// operator remembers).
    pub fn trace(&self, bundle: &BundleName) -> Option<BTreeMap<u32, LastDecision>> {
        self.lock().bundles().trace(bundle)
    }

    /// The last decisions of `bundle`'s replicas that its PlacementHistory does not hold yet,
    /// with what the history's writer knows the object holds.
    pub fn history_unwritten(
        &self,
        bundle: &BundleName,
    ) -> (Vec<(u32, LastDecision)>, Option<HistoryKnown>) {
        self.lock().bundles().history_unwritten(bundle)
    }

    /// A write of `bundle`'s history ended: the object holds `known` after it when the writer
    /// wrote it (`None`: nothing was written, what it holds is as known before), and each of
    /// `decisions` (a replica, when its decision was made) is in it or needs no write, unless
    /// the replica decided anew meanwhile.
    pub fn history_written(
        &self,
        bundle: &BundleName,
        known: Option<HistoryKnown>,
        decisions: &[(u32, DateTime<Utc>)],
    ) {
        let mut s = self.lock();
        let book = s.bundles_mut();
        if let Some(k) = known {
            book.history_known(bundle, Some(k));
        }
        for (r, at) in decisions {
            book.history_written(bundle, *r, *at);
        }
    }

    /// A write of `bundle`'s history failed (refused, or not answered): what the object holds
    /// is not known any more (the next write reads it first), and its decisions wait for that
    /// write.
    pub fn history_write_failed(&self, bundle: &BundleName) {
        self.lock().bundles_mut().history_known(bundle, None);
    }

    /// Bundle `bundle` (`bundle_id` to Manager) is gone: the starts reserved for it give their
    /// capacity back, its records go, and it waits on no pool.
    pub fn forget_bundle(&self, mirror: &MirrorState, bundle: &ObjectRef<Bundle>, bundle_id: &str) {
        let name = (
            bundle.namespace.clone().unwrap_or_default(),
            bundle.name.clone(),
        );
        let mut s = self.lock();
        s.model_mut().forget_bundle(bundle_id, mirror);
        s.bundles_mut().forget(&name, bundle_id);
        s.wake_mut().set_waiting(bundle, Vec::new());
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use automanager_placement as pl;
    use chrono::TimeDelta;
    use proptest::prelude::*;

    use super::*;
    use crate::settings::Settings;

    fn name() -> BundleName {
        ("ns".to_owned(), "b".to_owned())
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::UNIX_EPOCH + TimeDelta::seconds(secs)
    }

    fn decision(replica: u32, secs: i64) -> LastDecision {
        LastDecision {
            decision: pl::Decision {
                bundle_id: "ns.b".into(),
                replica_index: replica,
                outcome: pl::Outcome::Unplaceable { jobs: Vec::new() },
                trace: pl::Trace::default(),
            },
            recovery: false,
            at: at(secs),
            preempted: None,
        }
    }

    fn decide(state: &State, replica: u32, secs: i64) {
        state
            .lock()
            .bundles_mut()
            .record_decision(name(), replica, decision(replica, secs));
    }

    /// One thing that happens to a bundle's history: a replica decides, the writer takes what
    /// is unwritten, the write it took ends (written, or refused), or the bundle goes.
    #[derive(Debug, Clone)]
    enum Step {
        Decide(u32),
        Take,
        End(bool),
        Forget,
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u32..3).prop_map(Step::Decide),
            Just(Step::Take),
            any::<bool>().prop_map(Step::End),
            Just(Step::Forget),
        ]
    }

    proptest! {
        /// A decision stays unwritten until a write that took it ends written, and a replica
        /// that decided anew meanwhile stays unwritten; the writer knows what the object holds
        /// exactly while its last write went through and the bundle is still known.
        #[test]
        fn a_decision_is_written_once_a_write_that_took_it_went_through(
            steps in proptest::collection::vec(step(), 1..60)
        ) {
            let state = State::new(&Settings::default());
            let mirror = MirrorState::default();
            let bundle = ObjectRef::<Bundle>::new("b").within("ns");
            let mut clock = 0;
            let mut last: HashMap<u32, i64> = HashMap::new();
            let mut unwritten: BTreeSet<u32> = BTreeSet::new();
            let mut known = false;
            let mut taken: Option<Vec<(u32, DateTime<Utc>)>> = None;
            for s in steps {
                clock += 1;
                match s {
                    Step::Decide(r) => {
                        decide(&state, r, clock);
                        last.insert(r, clock);
                        unwritten.insert(r);
                    }
                    Step::Take => {
                        let (pending, _) = state.history_unwritten(&name());
                        taken = Some(pending.iter().map(|(r, d)| (*r, d.at)).collect());
                    }
                    Step::End(ok) => {
                        let Some(decisions) = taken.take() else { continue };
                        if ok {
                            // As the writer does: nothing new to add is no write, and what the
                            // object holds is as known before.
                            let k = (!decisions.is_empty()).then(|| HistoryKnown {
                                version: Some(clock.to_string()),
                                replicas: Vec::new(),
                            });
                            if k.is_some() {
                                known = !last.is_empty();
                            }
                            state.history_written(&name(), k, &decisions);
                            for (r, when) in decisions {
                                if last.get(&r).is_none_or(|l| at(*l) <= when) {
                                    unwritten.remove(&r);
                                }
                            }
                        } else {
                            state.history_write_failed(&name());
                            known = false;
                        }
                    }
                    Step::Forget => {
                        state.forget_bundle(&mirror, &bundle, "ns.b");
                        last.clear();
                        unwritten.clear();
                        known = false;
                    }
                }
                let (pending, k) = state.history_unwritten(&name());
                let replicas: BTreeSet<u32> = pending.iter().map(|(r, _)| *r).collect();
                prop_assert_eq!(&replicas, &unwritten);
                prop_assert_eq!(k.is_some(), known && !unwritten.is_empty());
            }
        }
    }

    #[test]
    fn restarts_recorded_in_status_count_until_cleared() {
        let state = State::new(&Settings::default());
        let recorded = vec![
            api::ReplicaStatus {
                replica: 0,
                restart_times: vec![at(10), at(20)],
                ..Default::default()
            },
            api::ReplicaStatus {
                replica: -1,
                restart_times: vec![at(10)],
                ..Default::default()
            },
        ];
        let now = at(60);
        state.merge_restarts("ns.b", &recorded, now);
        let key = ReplicaKey::new("ns.b", 0);
        assert_eq!(state.restarts(&key, now), (2, vec![at(10), at(20)]));
        assert_eq!(state.restarts(&ReplicaKey::new("ns.b", 1), now).0, 0);
        state.record_restart(&key, now, 6);
        assert_eq!(state.restarts(&key, now).0, 3);
        state.clear_restarts("ns.b", 0..2, now);
        assert_eq!(state.restarts(&key, now).0, 0);
    }

    #[test]
    fn a_bundle_gone_leaves_nothing_in_any_book() {
        let state = State::new(&Settings::default());
        let mirror = MirrorState::default();
        let bundle = ObjectRef::<Bundle>::new("b").within("ns");
        let now = at(60);
        decide(&state, 0, 1);
        state.record_restart(&ReplicaKey::new("ns.b", 0), now, 6);
        state.set_bundle_waiting(&bundle, vec!["p".into()]);
        state.forget_bundle(&mirror, &bundle, "ns.b");
        assert!(state.last_decisions(&name()).is_empty());
        assert!(state.history_unwritten(&name()).0.is_empty());
        assert_eq!(state.restarts(&ReplicaKey::new("ns.b", 0), now).0, 0);
        assert!(state.waiters_of_pool("p").0.is_empty());
    }
}
