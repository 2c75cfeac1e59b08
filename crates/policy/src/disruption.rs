//! The bundle disruption budget: may a voluntary action take replica R of bundle B down now?
//!
//! Pure: the caller passes each replica's standing and the voluntary actions in flight as plain
//! data. No I/O, no clock.
//!
//! The rules (the operator goes further than the `@norskvideo/norsk-auto-manager` TypeScript
//! library here, which has no budget; see docs/fleet-safety.md):
//!
//! - A bundle may have at most `maxUnavailableReplicas` replicas down at once through voluntary
//!   actions (drains in both modes, Migrations, spare rotation). The default is 1, so a
//!   voluntary action never takes primary and backup down together; `0` forbids every
//!   voluntary action on the bundle; a value above `replicas` is refused.
//! - A replica is **down** when one of its jobs has no running instance (failed, lost,
//!   recovering, not yet placed), or a voluntary action on it is in flight. A migration counts
//!   as a disruption while it runs, whatever its strategy: past its point of no return a
//!   failure sends the job to recovery, so even an `overlap` or `handover` move may leave the
//!   replica down.
//! - Taking down a replica that is already down costs nothing (a second job of a replica being
//!   moved, a job whose replica already failed), so it is always allowed.
//! - Involuntary failures are never blocked; they are what the budget protects against, and
//!   they count as down replicas for the next voluntary action.

use std::collections::{BTreeMap, BTreeSet};

/// The budget when a bundle declares none.
pub const DEFAULT_MAX_UNAVAILABLE: u32 = 1;

/// A declared budget that cannot be honoured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("disruption.maxUnavailableReplicas must not be negative (got {0})")]
    Negative(i64),
    #[error("disruption.maxUnavailableReplicas ({declared}) must not exceed replicas ({replicas})")]
    AboveReplicas { declared: i64, replicas: i64 },
}

/// The budget in effect for a bundle of `replicas` replicas that declares `declared`.
pub fn max_unavailable(replicas: i64, declared: Option<i64>) -> Result<u32, BudgetError> {
    match declared {
        None => Ok(DEFAULT_MAX_UNAVAILABLE),
        Some(d) if d < 0 => Err(BudgetError::Negative(d)),
        Some(d) if d > replicas.max(0) => Err(BudgetError::AboveReplicas {
            declared: d,
            replicas,
        }),
        Some(d) => Ok(u32::try_from(d).unwrap_or(u32::MAX)),
    }
}

/// One replica as the budget sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaStanding {
    pub replica: u32,
    /// Every job of the replica has a running instance.
    pub running: bool,
    /// A voluntary action on the replica is in flight.
    pub disrupted: bool,
}

impl ReplicaStanding {
    fn down(&self) -> bool {
        !self.running || self.disrupted
    }
}

/// The answer for one voluntary action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// Taking the replica down would put more than `max_unavailable` replicas down; `down`
    /// lists the other replicas that are down now.
    Blocked {
        down: Vec<u32>,
        max_unavailable: u32,
    },
}

impl Verdict {
    pub fn is_allowed(&self) -> bool {
        matches!(self, Verdict::Allowed)
    }
}

/// May a voluntary action take `replica` down now?
pub fn check(max_unavailable: u32, replicas: &[ReplicaStanding], replica: u32) -> Verdict {
    if replicas.iter().any(|r| r.replica == replica && r.down()) {
        return Verdict::Allowed;
    }
    let down: Vec<u32> = replicas
        .iter()
        .filter(|r| r.replica != replica && r.down())
        .map(|r| r.replica)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if down.len() < usize::try_from(max_unavailable).unwrap_or(usize::MAX) {
        Verdict::Allowed
    } else {
        Verdict::Blocked {
            down,
            max_unavailable,
        }
    }
}

/// Every bundle's budget and replicas, for deciding several actions in a row: an action that
/// is allowed is taken, so the next one sees its replica down.
#[derive(Debug, Clone, Default)]
pub struct Ledger<K: Ord> {
    bundles: BTreeMap<K, (u32, Vec<ReplicaStanding>)>,
}

impl<K: Ord + Clone> Ledger<K> {
    pub fn new() -> Self {
        Ledger {
            bundles: BTreeMap::new(),
        }
    }

    /// Records a bundle's budget and replicas (replacing what was there).
    pub fn insert(&mut self, bundle: K, max_unavailable: u32, replicas: Vec<ReplicaStanding>) {
        self.bundles.insert(bundle, (max_unavailable, replicas));
    }

    pub fn contains(&self, bundle: &K) -> bool {
        self.bundles.contains_key(bundle)
    }

    /// Marks `replica` of `bundle` disrupted (an action in flight), whatever the budget says.
    pub fn mark(&mut self, bundle: &K, replica: u32) {
        if let Some((_, replicas)) = self.bundles.get_mut(bundle) {
            match replicas.iter_mut().find(|r| r.replica == replica) {
                Some(r) => r.disrupted = true,
                None => replicas.push(ReplicaStanding {
                    replica,
                    running: true,
                    disrupted: true,
                }),
            }
        }
    }

    /// The verdict for taking `replica` of `bundle` down; unknown bundles are allowed (an
    /// action on a job of no Bundle has no budget).
    pub fn check(&self, bundle: &K, replica: u32) -> Verdict {
        match self.bundles.get(bundle) {
            Some((max, replicas)) => check(*max, replicas, replica),
            None => Verdict::Allowed,
        }
    }

    /// Checks and, when allowed, takes the replica down.
    pub fn take(&mut self, bundle: &K, replica: u32) -> Verdict {
        let v = self.check(bundle, replica);
        if v.is_allowed() {
            self.mark(bundle, replica);
        }
        v
    }

    /// Checks every `(bundle, replica)` together (the jobs on one node, say) and, when all are
    /// allowed, takes them all down; the first blocked one is answered otherwise.
    pub fn take_all(&mut self, wanted: &[(K, u32)]) -> Result<(), (K, Verdict)> {
        let mut trial = self.clone();
        for (bundle, replica) in wanted {
            let v = trial.take(bundle, *replica);
            if !v.is_allowed() {
                return Err((bundle.clone(), v));
            }
        }
        *self = trial;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(replica: u32, running: bool, disrupted: bool) -> ReplicaStanding {
        ReplicaStanding {
            replica,
            running,
            disrupted,
        }
    }

    #[test]
    fn the_budget_defaults_to_one_and_refuses_negative_or_more_than_replicas() {
        assert_eq!(max_unavailable(2, None), Ok(1));
        assert_eq!(max_unavailable(1, None), Ok(1));
        assert_eq!(max_unavailable(3, Some(0)), Ok(0));
        assert_eq!(max_unavailable(3, Some(3)), Ok(3));
        assert_eq!(max_unavailable(3, Some(-1)), Err(BudgetError::Negative(-1)));
        let e = max_unavailable(2, Some(3)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "disruption.maxUnavailableReplicas (3) must not exceed replicas (2)"
        );
    }

    #[test]
    fn table() {
        // (budget, replicas, target, allowed)
        let cases: &[(u32, &[ReplicaStanding], u32, bool)] = &[
            // Both up: one may go.
            (1, &[r(0, true, false), r(1, true, false)], 0, true),
            // The other failed: the healthy one stays.
            (1, &[r(0, true, false), r(1, false, false)], 0, false),
            // The other is being migrated: wait.
            (1, &[r(0, true, false), r(1, true, true)], 0, false),
            // The target is already down: nothing more is lost.
            (1, &[r(0, false, false), r(1, false, false)], 0, true),
            (1, &[r(0, true, true), r(1, true, true)], 0, true),
            // A budget of two lets a second replica of three go.
            (
                2,
                &[r(0, true, false), r(1, true, true), r(2, true, false)],
                0,
                true,
            ),
            (
                2,
                &[r(0, true, false), r(1, true, true), r(2, false, false)],
                0,
                false,
            ),
            // Zero forbids every voluntary disruption of a running replica.
            (0, &[r(0, true, false), r(1, true, false)], 0, false),
            // A one-replica bundle may be moved with the default budget.
            (1, &[r(0, true, false)], 0, true),
            // A replica the caller did not list counts as up.
            (1, &[r(1, true, false)], 0, true),
        ];
        for (budget, replicas, target, allowed) in cases {
            let v = check(*budget, replicas, *target);
            assert_eq!(
                v.is_allowed(),
                *allowed,
                "{budget} {replicas:?} {target}: {v:?}"
            );
        }
    }

    #[test]
    fn a_blocked_verdict_names_the_replicas_that_are_down() {
        let v = check(
            1,
            &[r(0, true, false), r(2, false, false), r(1, true, true)],
            0,
        );
        assert_eq!(
            v,
            Verdict::Blocked {
                down: vec![1, 2],
                max_unavailable: 1
            }
        );
    }

    #[test]
    fn the_ledger_takes_one_replica_and_blocks_the_next() {
        let mut l = Ledger::new();
        l.insert("b", 1, vec![r(0, true, false), r(1, true, false)]);
        assert!(l.take(&"b", 0).is_allowed());
        assert!(!l.take(&"b", 1).is_allowed());
        // The same replica again (its second job) is free.
        assert!(l.take(&"b", 0).is_allowed());
        assert!(l.take(&"unknown", 5).is_allowed());
    }

    #[test]
    fn take_all_takes_everything_or_nothing() {
        let mut l = Ledger::new();
        l.insert("a", 1, vec![r(0, true, false), r(1, true, false)]);
        l.insert("b", 1, vec![r(0, true, false), r(1, false, false)]);
        let blocked = l.take_all(&[("a", 0), ("b", 0)]).unwrap_err();
        assert_eq!(blocked.0, "b");
        // Nothing was taken: a's other replica may still go.
        assert!(l.check(&"a", 1).is_allowed());
        assert!(l.take_all(&[("a", 0), ("a", 0)]).is_ok());
        assert!(!l.check(&"a", 1).is_allowed());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// However many actions are asked for in whatever order, the ledger never lets more
        /// than the budget of replicas be down through voluntary actions (replicas already down
        /// stay down, and are never added to).
        #[test]
        fn the_ledger_never_exceeds_the_budget(
            replicas in 1u32..8,
            budget in 0u32..8,
            failed in proptest::collection::vec(any::<bool>(), 8),
            asks in proptest::collection::vec(0u32..8, 0..32),
        ) {
            let budget = budget.min(replicas);
            let standing: Vec<ReplicaStanding> =
                (0..replicas).map(|i| r(i, !failed[i as usize], false)).collect();
            let already_down = standing.iter().filter(|s| !s.running).count();
            let mut l = Ledger::new();
            l.insert(0u8, budget, standing);
            let mut taken = BTreeSet::new();
            for a in asks {
                let a = a % replicas;
                if l.take(&0, a).is_allowed() && !failed[a as usize] {
                    taken.insert(a);
                }
            }
            let down = already_down + taken.len();
            // Voluntary actions only add to the down replicas while fewer than the budget are down.
            prop_assert!(taken.is_empty() || down <= (budget as usize).max(already_down));
            prop_assert!(taken.len() <= budget as usize);
        }
    }
}
