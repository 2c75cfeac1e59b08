//! What the operator remembers per bundle between passes: restarts, the last decision per
//! replica (and which of those the bundle's PlacementHistory does not hold yet), which bundles
//! are Broken, preemptions on their way, and how long starts settle.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use automanager_api as api;
use automanager_policy::ledger::{ReplicaKey, RestartLedger};
use automanager_policy::start_settle::StartSettle;
use chrono::{DateTime, Utc};

use super::LastDecision;

/// A bundle's `(namespace, name)`.
type BundleName = (String, String);

/// A preemption made for one replica whose recovery has not been placed yet: while it is
/// pending, no second one is made for the replica (its victims' capacity is on its way).
#[derive(Debug, Clone)]
struct PendingPreemption {
    record: api::Preemption,
    since: Instant,
}

/// What this leader knows a bundle's PlacementHistory holds, from its own last write (or the
/// read that went with it): enough to add a decision with a patch of the new entries alone,
/// conditional on `version`, instead of reading the object and writing it whole.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistoryKnown {
    /// The object's resourceVersion after that write; `None` when only the replicas' newest
    /// decisions are known (the object is read before the next write).
    pub version: Option<String>,
    /// The object's replica entries in their order.
    pub replicas: Vec<KnownReplica>,
}

/// One replica entry of a [`HistoryKnown`].
#[derive(Debug, Clone, PartialEq)]
pub struct KnownReplica {
    pub replica: u32,
    /// How many decisions the entry holds.
    pub decisions: usize,
    /// Its newest decision.
    pub newest: Option<api::DecisionRecord>,
}

impl HistoryKnown {
    /// What `spec`, stored at `version`, holds.
    pub fn of(spec: &api::PlacementHistorySpec, version: Option<String>) -> HistoryKnown {
        HistoryKnown {
            version,
            replicas: spec
                .replicas
                .iter()
                .map(|r| KnownReplica {
                    replica: u32::try_from(r.replica).unwrap_or(u32::MAX),
                    decisions: r.decisions.len(),
                    newest: r.decisions.last().cloned(),
                })
                .collect(),
        }
    }

    /// The newest decision the object holds for `replica`.
    pub fn newest(&self, replica: u32) -> Option<&api::DecisionRecord> {
        self.replicas
            .iter()
            .find(|r| r.replica == replica)
            .and_then(|r| r.newest.as_ref())
    }
}

/// The per-bundle records. Every change goes through a named operation.
#[derive(Debug)]
pub struct BundleBook {
    /// Restarts per replica in the last hour (merged with each Bundle's status).
    ledger: RestartLedger,
    /// The full trace of each bundle's last decision per replica.
    traces: HashMap<BundleName, BTreeMap<u32, LastDecision>>,
    /// Replicas whose last decision is not in the bundle's PlacementHistory yet.
    unwritten: HashMap<BundleName, BTreeSet<u32>>,
    /// What this leader's last write left in each bundle's PlacementHistory: a repeat of a
    /// replica's newest decision (a replica still waiting for the same node) is neither read
    /// back nor written, and the next decision is added without reading the object first.
    written: HashMap<BundleName, HistoryKnown>,
    /// Manager bundle ids currently Broken.
    broken: HashSet<String>,
    /// Preemptions made for a replica's recovery, by (Manager bundle id, replica), until the
    /// replica is placed.
    preemptions: HashMap<(String, u32), PendingPreemption>,
    /// How long recent passes waited for the jobs they started to run.
    start_settle: StartSettle,
    /// Bundles whose status write was put off while others recover, and since when.
    status_deferred: HashMap<BundleName, Instant>,
}

impl BundleBook {
    pub(super) fn new(start_settle: Duration) -> Self {
        BundleBook {
            ledger: RestartLedger::default(),
            traces: HashMap::new(),
            unwritten: HashMap::new(),
            written: HashMap::new(),
            broken: HashSet::new(),
            preemptions: HashMap::new(),
            start_settle: StartSettle::new(start_settle),
            status_deferred: HashMap::new(),
        }
    }

    /// Since when `bundle`'s status write has been put off (`None`: it is not).
    pub fn status_deferred_since(&self, bundle: &BundleName) -> Option<Instant> {
        self.status_deferred.get(bundle).copied()
    }

    /// `bundle`'s status write is put off at `now` (the first time counts).
    pub fn defer_status(&mut self, bundle: &BundleName, now: Instant) {
        self.status_deferred.entry(bundle.clone()).or_insert(now);
    }

    /// `bundle`'s status is written (or needs no write).
    pub fn status_recorded(&mut self, bundle: &BundleName) {
        self.status_deferred.remove(bundle);
    }

    /// Takes in the restart times a replica's status recorded (an operator restart loses none).
    pub fn merge_restarts(
        &mut self,
        key: &ReplicaKey,
        times: impl IntoIterator<Item = DateTime<Utc>>,
        now: DateTime<Utc>,
    ) {
        self.ledger.merge(key, times, now);
    }

    /// A recovery of the replica started.
    pub fn record_restart(&mut self, key: &ReplicaKey, now: DateTime<Utc>, max_restarts: u32) {
        self.ledger.record_restart(key, now, max_restarts);
    }

    /// The replica's restart count is cleared (a retry, or it ran long enough).
    pub fn clear_restarts(&mut self, key: &ReplicaKey, now: DateTime<Utc>) {
        self.ledger.clear(key, now);
    }

    /// Restarts of the replica within the window.
    pub fn restarts(&self, key: &ReplicaKey, now: DateTime<Utc>) -> u32 {
        self.ledger.count(key, now)
    }

    /// When the replica restarted within the window.
    pub fn restart_times(&self, key: &ReplicaKey, now: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        self.ledger.times(key, now)
    }

    /// Records the latest decision for one replica of `bundle` (to be written to its history).
    pub fn record_decision(&mut self, bundle: BundleName, replica: u32, decision: LastDecision) {
        self.unwritten
            .entry(bundle.clone())
            .or_default()
            .insert(replica);
        self.traces
            .entry(bundle)
            .or_default()
            .insert(replica, decision);
    }

    /// The last decisions of `bundle`'s replicas that its PlacementHistory does not hold yet,
    /// copied out of the lock (empty when there are none), with what this leader knows the
    /// object holds.
    pub fn history_unwritten(
        &self,
        bundle: &BundleName,
    ) -> (Vec<(u32, LastDecision)>, Option<HistoryKnown>) {
        let (Some(replicas), Some(traces)) = (self.unwritten.get(bundle), self.traces.get(bundle))
        else {
            return (Vec::new(), None);
        };
        let pending = replicas
            .iter()
            .filter_map(|r| Some((*r, traces.get(r)?.clone())))
            .collect();
        (pending, self.written.get(bundle).cloned())
    }

    /// Replica `replica`'s decision made at `at` is in the bundle's history (or needs no
    /// write): it is written unless a newer decision was made meanwhile.
    pub fn history_written(&mut self, bundle: &BundleName, replica: u32, at: DateTime<Utc>) {
        let newer = (self.traces.get(bundle))
            .and_then(|t| t.get(&replica))
            .is_some_and(|last| last.at > at);
        if !newer && let Some(u) = self.unwritten.get_mut(bundle) {
            u.remove(&replica);
            if u.is_empty() {
                self.unwritten.remove(bundle);
            }
        }
    }

    /// What `bundle`'s PlacementHistory holds after this leader's write, or `None` when that is
    /// not known any more (a write was refused: the next one reads the object first). Kept
    /// only while the bundle is (a write that ends after it is forgotten keeps nothing).
    pub fn history_known(&mut self, bundle: &BundleName, known: Option<HistoryKnown>) {
        match known {
            Some(k) if self.traces.contains_key(bundle) => {
                self.written.insert(bundle.clone(), k);
            }
            _ => {
                self.written.remove(bundle);
            }
        }
    }

    /// Notes on a replica's last decision which bronze jobs were stopped to make room for it.
    pub fn note_preempted(
        &mut self,
        bundle: &BundleName,
        replica: u32,
        preempted: Option<api::Preemption>,
    ) {
        if let Some(last) = self
            .traces
            .get_mut(bundle)
            .and_then(|t| t.get_mut(&replica))
        {
            last.preempted = preempted;
        }
    }

    /// The last decision per replica of `bundle`, copied out of the lock.
    pub fn trace(&self, bundle: &BundleName) -> Option<BTreeMap<u32, LastDecision>> {
        self.traces.get(bundle).cloned()
    }

    /// Records whether a bundle is Broken; `Some(count of Broken bundles)` when that changed.
    pub fn set_broken(&mut self, bundle_id: &str, broken: bool) -> Option<usize> {
        let changed = if broken {
            self.broken.insert(bundle_id.to_owned())
        } else {
            self.broken.remove(bundle_id)
        };
        changed.then_some(self.broken.len())
    }

    /// The preemption made for this replica if it is still on its way (younger than `hold` at
    /// `now`); an older one is forgotten.
    pub fn pending_preemption(
        &mut self,
        bundle_id: &str,
        replica: u32,
        now: Instant,
        hold: Duration,
    ) -> Option<api::Preemption> {
        let key = (bundle_id.to_owned(), replica);
        let p = self.preemptions.get(&key)?;
        if now.saturating_duration_since(p.since) < hold {
            return Some(p.record.clone());
        }
        self.preemptions.remove(&key);
        None
    }

    /// A preemption was made for this replica at `now`.
    pub fn record_preemption(
        &mut self,
        bundle_id: &str,
        replica: u32,
        record: api::Preemption,
        now: Instant,
    ) {
        self.preemptions.insert(
            (bundle_id.to_owned(), replica),
            PendingPreemption { record, since: now },
        );
    }

    /// The replica was placed: its preemption, if any, is done and handed back.
    pub fn preemption_placed(&mut self, bundle_id: &str, replica: u32) -> Option<api::Preemption> {
        self.preemptions
            .remove(&(bundle_id.to_owned(), replica))
            .map(|p| p.record)
    }

    /// How long a pass should wait for the jobs it started, or `None` when recent passes show
    /// waiting does not pay (see [`automanager_policy::start_settle`]).
    pub fn settle_bound(&mut self) -> Option<Duration> {
        self.start_settle
            .should_wait()
            .then(|| self.start_settle.bound())
    }

    /// How long a pass's starts took to run (`None`: not within the bound).
    pub fn record_settle(&mut self, took: Option<Duration>) {
        self.start_settle.record(took);
    }

    /// A bundle is gone: its restarts and traces with it.
    pub fn forget(&mut self, bundle: &BundleName, bundle_id: &str) {
        self.ledger.forget_bundle(bundle_id);
        self.traces.remove(bundle);
        self.unwritten.remove(bundle);
        self.written.remove(bundle);
        self.status_deferred.remove(bundle);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn preemption() -> api::Preemption {
        api::Preemption {
            at: chrono::DateTime::UNIX_EPOCH,
            node: "n".into(),
            victims: vec!["ns.v/0/j".into()],
        }
    }

    #[test]
    fn a_preemption_holds_for_its_window_then_is_forgotten() {
        let mut b = BundleBook::new(Duration::from_millis(300));
        let t0 = Instant::now();
        let hold = Duration::from_secs(30);
        b.record_preemption("ns.b", 0, preemption(), t0);
        assert!(
            b.pending_preemption("ns.b", 0, t0 + hold / 2, hold)
                .is_some()
        );
        assert!(
            b.pending_preemption("ns.b", 1, t0, hold).is_none(),
            "another replica"
        );
        assert!(b.pending_preemption("ns.b", 0, t0 + hold, hold).is_none());
        assert!(
            b.preemption_placed("ns.b", 0).is_none(),
            "an expired one is gone"
        );
    }

    fn decision(at: i64) -> LastDecision {
        LastDecision {
            decision: automanager_placement::Decision {
                bundle_id: "ns.b".into(),
                replica_index: 0,
                outcome: automanager_placement::Outcome::Unplaceable { jobs: Vec::new() },
                trace: automanager_placement::Trace::default(),
            },
            recovery: false,
            at: DateTime::from_timestamp(at, 0).unwrap_or_default(),
            preempted: None,
        }
    }

    fn summary() -> api::DecisionRecord {
        api::DecisionRecord {
            decided_at: DateTime::UNIX_EPOCH,
            leader: "l".into(),
            outcome: api::PlacementOutcome::Unplaceable,
            recovery: false,
            nodes: Vec::new(),
            pools: Vec::new(),
            reason: String::new(),
        }
    }

    #[test]
    fn a_decision_waits_to_be_written_until_it_is_and_a_newer_one_keeps_waiting() {
        let mut b = BundleBook::new(Duration::from_millis(300));
        let name = ("ns".to_owned(), "b".to_owned());
        assert!(b.history_unwritten(&name).0.is_empty());
        b.record_decision(name.clone(), 0, decision(1));
        b.record_decision(name.clone(), 1, decision(1));
        let (pending, known) = b.history_unwritten(&name);
        assert_eq!(pending.len(), 2);
        assert_eq!(known, None, "nothing written yet");

        // Replica 0 decided again while its first decision was being written.
        b.record_decision(name.clone(), 0, decision(2));
        let at = DateTime::from_timestamp(1, 0).unwrap_or_default();
        b.history_written(&name, 0, at);
        b.history_written(&name, 1, at);
        let written = known_at("7");
        b.history_known(&name, Some(written.clone()));
        let (pending, known) = b.history_unwritten(&name);
        assert_eq!(
            pending.len(),
            1,
            "the newer decision of replica 0 still waits"
        );
        assert_eq!(pending[0].0, 0);
        assert_eq!(known, Some(written), "with what the object holds");

        b.history_known(&name, None);
        assert_eq!(b.history_unwritten(&name).1, None, "read first next time");

        b.forget(&name, "ns.b");
        assert!(b.history_unwritten(&name).0.is_empty());
        b.history_known(&name, Some(known_at("8")));
        assert_eq!(
            b.written.get(&name),
            None,
            "a write that ends after the bundle is gone keeps nothing"
        );
    }

    fn known_at(version: &str) -> HistoryKnown {
        HistoryKnown {
            version: Some(version.into()),
            replicas: vec![KnownReplica {
                replica: 0,
                decisions: 1,
                newest: Some(summary()),
            }],
        }
    }

    #[test]
    fn what_a_history_holds_is_read_off_its_spec() {
        let mut spec = api::PlacementHistorySpec::default();
        let trace = |at| api::FullTrace {
            decided_at: at,
            leader: "l".into(),
            recovery: false,
            decision: None,
            truncated: None,
            preempted: None,
        };
        let mut second = summary();
        second.reason = "again".into();
        spec.record(1, summary(), trace(DateTime::UNIX_EPOCH));
        spec.record(1, second.clone(), trace(DateTime::UNIX_EPOCH));
        spec.record(3, summary(), trace(DateTime::UNIX_EPOCH));
        let known = HistoryKnown::of(&spec, Some("9".into()));
        assert_eq!(known.version.as_deref(), Some("9"));
        assert_eq!(
            known
                .replicas
                .iter()
                .map(|r| (r.replica, r.decisions))
                .collect::<Vec<_>>(),
            [(1, 2), (3, 1)]
        );
        assert_eq!(known.newest(1), Some(&second));
        assert_eq!(known.newest(0), None);
    }

    #[test]
    fn broken_counts_change_only_when_a_bundle_changes() {
        let mut b = BundleBook::new(Duration::from_millis(300));
        assert_eq!(b.set_broken("a", true), Some(1));
        assert_eq!(b.set_broken("a", true), None);
        assert_eq!(b.set_broken("b", true), Some(2));
        assert_eq!(b.set_broken("a", false), Some(1));
        assert_eq!(b.set_broken("a", false), None);
    }
}
