//! The restart ledger: how often each replica was restarted within the last hour.
//!
//! The TypeScript library's rule: "More than `maxRestartsPerHour` restarts of a replica marks the bundle
//! Broken ... A successful restart clears the count for that replica." So with a ceiling of 6,
//! six restarts inside any sliding hour are allowed and the seventh is refused
//! ([`RestartVerdict::CeilingExceeded`]); the caller then marks the bundle Broken and stops
//! retrying until the user asks again (the retry annotation), at which point it calls
//! [`RestartLedger::clear`] for the replica.
//!
//! What "successful" means is the caller's call, made explicit here: a restart is successful
//! once the restarted replica is *running again* (every job of the replica reported running by
//! Manager) and has stayed up for a stability period, not when the start request was
//! accepted. The caller calls [`RestartLedger::clear`] at that moment. Without the stability
//! period a replica that starts, runs for a second and crashes would clear its own count each
//! time and never reach the ceiling; with it, such a crash loop is caught while a replica that
//! fails now and then but always recovers is not.
//!
//! Pure: no clock and no I/O. Time is passed in as `DateTime<Utc>`. Memory is bounded: every
//! call prunes the key it touches, a periodic sweep drops keys whose restarts all left the
//! window, and no key holds more than [`MAX_ENTRIES_PER_KEY`] timestamps.

use std::collections::{HashMap, VecDeque};

use chrono::{DateTime, TimeDelta, Utc};

/// The sliding window: one hour.
pub const WINDOW: TimeDelta = TimeDelta::hours(1);

/// Most timestamps kept per replica (the configuration's largest allowed ceiling).
pub const MAX_ENTRIES_PER_KEY: usize = 1000;

/// How many `record_restart` calls between sweeps of keys with no restart left in the window.
const SWEEP_EVERY: u64 = 1024;

/// One replica of one bundle.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaKey {
    /// The bundle's identity as the caller names it (e.g. `namespace/name`).
    pub bundle: String,
    /// The replica index, from 0.
    pub replica: u32,
}

impl ReplicaKey {
    /// The key for replica `replica` of `bundle`.
    pub fn new(bundle: impl Into<String>, replica: u32) -> Self {
        ReplicaKey {
            bundle: bundle.into(),
            replica,
        }
    }
}

/// The answer to "may this replica be restarted now?".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartVerdict {
    /// Go ahead; the restart has been recorded. `count_in_window` includes it.
    Allowed {
        /// Restarts within the last hour, this one included.
        count_in_window: u32,
    },
    /// Refused and not recorded: the replica already had `count_in_window` restarts within
    /// the last hour, and one more would exceed the ceiling. The bundle is Broken.
    CeilingExceeded {
        /// Restarts within the last hour (not counting the refused one).
        count_in_window: u32,
    },
}

impl RestartVerdict {
    /// Whether the restart may go ahead.
    pub fn is_allowed(self) -> bool {
        matches!(self, RestartVerdict::Allowed { .. })
    }
}

/// Restart times per replica within a sliding hour.
#[derive(Clone, Debug, Default)]
pub struct RestartLedger {
    entries: HashMap<ReplicaKey, VecDeque<DateTime<Utc>>>,
    /// When each replica's count was last cleared: history older than this that comes back
    /// from a status written before the clear is not merged in again.
    cleared: HashMap<ReplicaKey, DateTime<Utc>>,
    calls: u64,
}

impl RestartLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks to restart `key` at `now` under a ceiling of `max_per_hour` restarts per sliding
    /// hour. Allowed restarts are recorded; refused ones are not. A ceiling of 0 refuses all.
    pub fn record_restart(
        &mut self,
        key: &ReplicaKey,
        now: DateTime<Utc>,
        max_per_hour: u32,
    ) -> RestartVerdict {
        self.calls = self.calls.wrapping_add(1);
        if self.calls.is_multiple_of(SWEEP_EVERY) {
            self.prune(now);
        }
        let times = self.entries.entry(key.clone()).or_default();
        prune_times(times, now);
        let count = u32::try_from(times.len()).unwrap_or(u32::MAX);
        let ceiling = (max_per_hour as usize).min(MAX_ENTRIES_PER_KEY);
        if times.len() >= ceiling {
            if times.is_empty() {
                self.entries.remove(key);
            }
            return RestartVerdict::CeilingExceeded {
                count_in_window: count,
            };
        }
        times.push_back(now);
        RestartVerdict::Allowed {
            count_in_window: count.saturating_add(1),
        }
    }

    /// Restarts of `key` within the hour before `now` (what status shows as "restarts in the
    /// last hour").
    pub fn count(&self, key: &ReplicaKey, now: DateTime<Utc>) -> u32 {
        let Some(times) = self.entries.get(key) else {
            return 0;
        };
        let n = times.iter().filter(|t| in_window(**t, now)).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Forgets the restarts of `key` at `now`: call when a restart succeeded (the replica has
    /// stayed up) or when the user asked for a retry of a Broken bundle. History from before
    /// `now` is not merged back in ([`RestartLedger::merge`]).
    pub fn clear(&mut self, key: &ReplicaKey, now: DateTime<Utc>) {
        self.entries.remove(key);
        self.cleared.insert(key.clone(), now);
    }

    /// Forgets every replica of `bundle` (the bundle was deleted).
    pub fn forget_bundle(&mut self, bundle: &str) {
        self.entries.retain(|k, _| k.bundle != bundle);
        self.cleared.retain(|k, _| k.bundle != bundle);
    }

    /// Merges restart times recorded elsewhere (the Bundle's status, written by this or an
    /// earlier operator) into `key`'s history: times already held, outside the window, or from
    /// before the last [`RestartLedger::clear`] are skipped. This is what keeps the ceiling
    /// across operator restarts and leader changes.
    pub fn merge(
        &mut self,
        key: &ReplicaKey,
        times: impl IntoIterator<Item = DateTime<Utc>>,
        now: DateTime<Utc>,
    ) {
        let cleared = self.cleared.get(key).copied();
        let mut fresh: Vec<DateTime<Utc>> = times
            .into_iter()
            .filter(|t| in_window(*t, now) && cleared.is_none_or(|c| *t > c))
            .collect();
        if fresh.is_empty() {
            return;
        }
        let held = self.entries.entry(key.clone()).or_default();
        fresh.retain(|t| !held.contains(t));
        held.extend(fresh);
        held.make_contiguous().sort();
        prune_times(held, now);
    }

    /// `key`'s restart times within the hour before `now`, oldest first (what status records).
    pub fn times(&self, key: &ReplicaKey, now: DateTime<Utc>) -> Vec<DateTime<Utc>> {
        self.entries
            .get(key)
            .map(|t| t.iter().copied().filter(|t| in_window(*t, now)).collect())
            .unwrap_or_default()
    }

    /// Drops every restart that left the window, and keys left with none.
    pub fn prune(&mut self, now: DateTime<Utc>) {
        self.entries.retain(|_, times| {
            prune_times(times, now);
            !times.is_empty()
        });
        self.cleared.retain(|_, at| in_window(*at, now));
    }

    /// How many replicas have restarts on record (after the last prune).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no replica has a restart on record.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A restart at `t` counts at `now` when `now - 1h < t`. Restarts stamped after `now` (a clock
/// that stepped back) still count: refusing a restart too many beats restarting in a loop.
fn in_window(t: DateTime<Utc>, now: DateTime<Utc>) -> bool {
    now.signed_duration_since(t) < WINDOW
}

fn prune_times(times: &mut VecDeque<DateTime<Utc>>, now: DateTime<Utc>) {
    times.retain(|t| in_window(*t, now));
    while times.len() > MAX_ENTRIES_PER_KEY {
        times.pop_front();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_700_000_000 + secs, 0).unwrap_or_default()
    }

    fn key(r: u32) -> ReplicaKey {
        ReplicaKey::new("ns/b", r)
    }

    #[test]
    fn six_restarts_in_an_hour_are_allowed_and_the_seventh_is_refused() {
        let mut l = RestartLedger::new();
        for i in 1..=6u32 {
            assert_eq!(
                l.record_restart(&key(0), t(i64::from(i) * 60), 6),
                RestartVerdict::Allowed { count_in_window: i }
            );
        }
        assert_eq!(
            l.record_restart(&key(0), t(420), 6),
            RestartVerdict::CeilingExceeded { count_in_window: 6 }
        );
        // The refused restart was not recorded.
        assert_eq!(l.count(&key(0), t(420)), 6);
    }

    #[test]
    fn the_window_slides_so_old_restarts_stop_counting_after_an_hour() {
        let mut l = RestartLedger::new();
        for i in 0..6 {
            assert!(l.record_restart(&key(0), t(i), 6).is_allowed());
        }
        // Exactly one hour after the first restart it has left the window.
        assert_eq!(l.count(&key(0), t(3600)), 5);
        assert_eq!(
            l.record_restart(&key(0), t(3600), 6),
            RestartVerdict::Allowed { count_in_window: 6 }
        );
        assert!(!l.record_restart(&key(0), t(3600), 6).is_allowed());
        assert_eq!(l.count(&key(0), t(10_000)), 0);
    }

    #[test]
    fn clearing_a_replica_resets_its_count() {
        let mut l = RestartLedger::new();
        for i in 0..6 {
            l.record_restart(&key(0), t(i), 6);
        }
        l.clear(&key(0), t(6));
        assert_eq!(l.count(&key(0), t(10)), 0);
        assert_eq!(
            l.record_restart(&key(0), t(10), 6),
            RestartVerdict::Allowed { count_in_window: 1 }
        );
    }

    #[test]
    fn history_read_back_from_status_is_merged_once_and_never_before_a_clear() {
        let mut l = RestartLedger::new();
        let stored = [t(10), t(20), t(30)];
        l.merge(&key(0), stored, t(40));
        l.merge(&key(0), stored, t(40));
        assert_eq!(l.count(&key(0), t(40)), 3, "merging twice counts once");
        assert_eq!(l.times(&key(0), t(40)), stored.to_vec());
        // One more restart here, then the same old status again: four, not seven.
        l.record_restart(&key(0), t(50), 6);
        l.merge(&key(0), stored, t(60));
        assert_eq!(l.count(&key(0), t(60)), 4);
        // A clear wins over a status written before it.
        l.clear(&key(0), t(70));
        l.merge(&key(0), stored, t(80));
        assert_eq!(l.count(&key(0), t(80)), 0);
        // Restarts after the clear are merged.
        l.merge(&key(0), [t(75)], t(80));
        assert_eq!(l.count(&key(0), t(80)), 1);
        // Nothing outside the hour.
        let mut fresh = RestartLedger::new();
        fresh.merge(&key(1), [t(0)], t(4000));
        assert_eq!(fresh.count(&key(1), t(4000)), 0);
    }

    #[test]
    fn replicas_are_counted_separately() {
        let mut l = RestartLedger::new();
        l.record_restart(&key(0), t(0), 1);
        assert!(!l.record_restart(&key(0), t(1), 1).is_allowed());
        assert!(l.record_restart(&key(1), t(1), 1).is_allowed());
        assert!(
            l.record_restart(&ReplicaKey::new("ns/other", 0), t(1), 1)
                .is_allowed()
        );
    }

    #[test]
    fn forgetting_a_bundle_forgets_all_its_replicas_only() {
        let mut l = RestartLedger::new();
        l.record_restart(&key(0), t(0), 6);
        l.record_restart(&key(1), t(0), 6);
        l.record_restart(&ReplicaKey::new("ns/other", 0), t(0), 6);
        l.forget_bundle("ns/b");
        assert_eq!(l.count(&key(0), t(1)), 0);
        assert_eq!(l.count(&key(1), t(1)), 0);
        assert_eq!(l.count(&ReplicaKey::new("ns/other", 0), t(1)), 1);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn a_ceiling_of_zero_refuses_every_restart() {
        let mut l = RestartLedger::new();
        assert_eq!(
            l.record_restart(&key(0), t(0), 0),
            RestartVerdict::CeilingExceeded { count_in_window: 0 }
        );
        assert!(l.is_empty());
    }

    #[test]
    fn a_huge_ceiling_is_capped_so_memory_stays_bounded() {
        let mut l = RestartLedger::new();
        let mut allowed = 0;
        for i in 0..(MAX_ENTRIES_PER_KEY as i64 + 10) {
            if l.record_restart(&key(0), t(i / 1000), u32::MAX)
                .is_allowed()
            {
                allowed += 1;
            }
        }
        assert_eq!(allowed, MAX_ENTRIES_PER_KEY);
        assert_eq!(l.count(&key(0), t(2)) as usize, MAX_ENTRIES_PER_KEY);
    }

    #[test]
    fn prune_drops_replicas_whose_restarts_left_the_window() {
        let mut l = RestartLedger::new();
        l.record_restart(&key(0), t(0), 6);
        l.record_restart(&key(1), t(3000), 6);
        l.prune(t(3600));
        assert_eq!(l.len(), 1);
        assert_eq!(l.count(&key(1), t(3600)), 1);
    }

    #[test]
    fn restarts_stamped_in_the_future_still_count_when_the_clock_steps_back() {
        let mut l = RestartLedger::new();
        l.record_restart(&key(0), t(1000), 1);
        assert!(!l.record_restart(&key(0), t(0), 1).is_allowed());
    }

    #[derive(Clone, Debug)]
    enum Op {
        Restart { advance: i64, replica: u32 },
        Clear { replica: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (0i64..1200, 0u32..3).prop_map(|(advance, replica)| Op::Restart { advance, replica }),
            1 => (0u32..3).prop_map(|replica| Op::Clear { replica }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Between two clears, no sliding hour ever holds more than `max` allowed restarts,
        /// and the ledger agrees with a naive recount of what it allowed.
        #[test]
        fn never_more_than_max_allowed_within_any_hour(
            max in 1u32..8,
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let mut l = RestartLedger::new();
            let mut now = 0i64;
            // Allowed restart times per replica since its last clear.
            let mut allowed: HashMap<u32, Vec<i64>> = HashMap::new();
            for op in ops {
                match op {
                    Op::Restart { advance, replica } => {
                        now += advance;
                        let expected_before = allowed
                            .get(&replica)
                            .map_or(0, |v| v.iter().filter(|s| now - **s < 3600).count());
                        let verdict = l.record_restart(&key(replica), t(now), max);
                        if expected_before < max as usize {
                            prop_assert_eq!(verdict, RestartVerdict::Allowed {
                                count_in_window: expected_before as u32 + 1,
                            });
                            allowed.entry(replica).or_default().push(now);
                        } else {
                            prop_assert_eq!(verdict, RestartVerdict::CeilingExceeded {
                                count_in_window: expected_before as u32,
                            });
                        }
                        let v = allowed.get(&replica).cloned().unwrap_or_default();
                        for start in &v {
                            let in_hour = v.iter().filter(|s| **s >= *start && **s - *start < 3600).count();
                            prop_assert!(in_hour <= max as usize);
                        }
                    }
                    Op::Clear { replica } => {
                        l.clear(&key(replica), t(now));
                        allowed.remove(&replica);
                        prop_assert_eq!(l.count(&key(replica), t(now)), 0);
                    }
                }
            }
        }
    }
}
