//! The kstatus vocabulary every kind follows, so tools that read Kubernetes' standard status
//! conventions (kstatus in `sigs.k8s.io/cli-utils`, Flux, `kubectl wait --for=condition=Ready`,
//! the Argo CD health checks in `deploy/gitops/argocd/`) judge AutoManager objects with no
//! custom code.
//!
//! Each object carries `status.observedGeneration` and three conditions, always all three, each
//! with `observedGeneration`:
//!
//! | standing | `Ready` | `Reconciling` | `Stalled` | kstatus |
//! |---|---|---|---|---|
//! | [`Standing::Ready`] | True | False | False | Current |
//! | [`Standing::Reconciling`] | False | True | False | InProgress |
//! | [`Standing::Stalled`] | False | False | True | Failed |
//!
//! There is no fourth standing: kstatus reads `Ready=False` with neither of the others True as
//! `InProgress`, so an end state that is what the spec asked for without being the usual
//! success (a Migration aborted at the user's request, a node Manager stopped) is `Ready`, and
//! its reason says which. kstatus reads `InProgress` while `observedGeneration` lags
//! `metadata.generation`, so a spec change reads as in progress until the operator has looked at
//! it. The per-kind mapping from an object's state to its standing is in docs/kstatus.md.

use chrono::{DateTime, Utc};

use crate::condition::{Condition, ConditionStatus, set_condition};

pub use automanager_policy::vocab::Standing;

/// The condition that is True when the object is what its spec asks.
pub const READY: &str = "Ready";
/// The condition that is True while the operator is still working towards the spec.
pub const RECONCILING: &str = "Reconciling";
/// The condition that is True when the operator cannot get there without a change.
pub const STALLED: &str = "Stalled";

/// Sets `Ready`, `Reconciling` and `Stalled` for `standing`, all stamped with `generation`.
/// The True condition (and `Ready`, which people read first) carries `message`; every one
/// carries `reason`. `lastTransitionTime` moves only for a condition whose status changed.
/// Returns whether anything changed.
pub fn set_standing(
    conditions: &mut Vec<Condition>,
    standing: Standing,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: DateTime<Utc>,
) -> bool {
    let message = message.into();
    let mut changed = false;
    for (type_, holds) in [
        (READY, standing == Standing::Ready),
        (RECONCILING, standing == Standing::Reconciling),
        (STALLED, standing == Standing::Stalled),
    ] {
        let status = if holds {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        let text = if holds || type_ == READY {
            message.clone()
        } else {
            String::new()
        };
        changed |= set_condition(
            conditions,
            Condition::new(type_, status, reason, text, generation, now),
        );
    }
    changed
}

/// The standing the conditions record, if all three are present and consistent.
pub fn standing(conditions: &[Condition]) -> Option<Standing> {
    let get = |t: &str| {
        conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(Condition::is_true)
    };
    match (get(READY)?, get(RECONCILING)?, get(STALLED)?) {
        (true, false, false) => Some(Standing::Ready),
        (false, true, false) => Some(Standing::Reconciling),
        (false, false, true) => Some(Standing::Stalled),
        _ => None,
    }
}

/// Stamps every condition with `generation`: for a reconcile that looked at a new spec and
/// found nothing to change (a finished Migration, say), so no condition claims an older one.
pub fn observe_generation(conditions: &mut [Condition], generation: Option<i64>) {
    for c in conditions {
        c.observed_generation = generation;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, 0).single().unwrap_or_default()
    }

    fn status_of(cs: &[Condition], t: &str) -> ConditionStatus {
        cs.iter()
            .find(|c| c.type_ == t)
            .map_or(ConditionStatus::Unknown, |c| c.status)
    }

    #[test]
    fn each_standing_sets_exactly_its_condition_true() {
        use ConditionStatus::{False, True};
        for (standing, want) in [
            (Standing::Ready, [True, False, False]),
            (Standing::Reconciling, [False, True, False]),
            (Standing::Stalled, [False, False, True]),
        ] {
            let mut cs = Vec::new();
            set_standing(&mut cs, standing, "Why", "what", Some(3), at(1));
            let got = [READY, RECONCILING, STALLED].map(|t| status_of(&cs, t));
            assert_eq!(got, want, "{standing:?}");
            assert!(cs.iter().all(|c| c.observed_generation == Some(3)));
            assert!(cs.iter().all(|c| c.reason == "Why"));
            assert_eq!(super::standing(&cs), Some(standing));
        }
    }

    #[test]
    fn the_message_is_on_the_true_condition_and_on_ready() {
        let mut cs = Vec::new();
        set_standing(
            &mut cs,
            Standing::Stalled,
            "NoCapacity",
            "no node fits",
            None,
            at(1),
        );
        let msg = |t: &str| cs.iter().find(|c| c.type_ == t).map(|c| c.message.clone());
        assert_eq!(msg(STALLED).as_deref(), Some("no node fits"));
        assert_eq!(msg(READY).as_deref(), Some("no node fits"));
        assert_eq!(msg(RECONCILING).as_deref(), Some(""));
    }

    #[test]
    fn other_conditions_are_left_alone_and_transition_times_move_only_on_change() {
        let mut cs = vec![Condition::new(
            "Broken",
            ConditionStatus::True,
            "RestartCeilingExceeded",
            "",
            Some(1),
            at(1),
        )];
        set_standing(
            &mut cs,
            Standing::Reconciling,
            "Placing",
            "",
            Some(1),
            at(5),
        );
        set_standing(&mut cs, Standing::Ready, "Placed", "", Some(1), at(9));
        assert_eq!(cs.len(), 4);
        let t = |ty: &str| {
            cs.iter()
                .find(|c| c.type_ == ty)
                .map(|c| c.last_transition_time)
        };
        assert_eq!(t("Broken"), Some(at(1)));
        assert_eq!(t(READY), Some(at(9)));
        assert_eq!(t(RECONCILING), Some(at(9)));
        assert_eq!(t(STALLED), Some(at(5)), "Stalled stayed False");
        assert!(!set_standing(
            &mut cs,
            Standing::Ready,
            "Placed",
            "",
            Some(1),
            at(20)
        ));
    }

    #[test]
    fn an_inconsistent_or_incomplete_set_has_no_standing() {
        let mut cs = Vec::new();
        assert_eq!(standing(&cs), None);
        set_standing(&mut cs, Standing::Ready, "R", "", None, at(1));
        for c in cs.iter_mut().filter(|c| c.type_ == STALLED) {
            c.status = ConditionStatus::True;
        }
        assert_eq!(standing(&cs), None);
        // All three False is what kstatus reads as InProgress with no reason: never written.
        for c in cs.iter_mut() {
            c.status = ConditionStatus::False;
        }
        assert_eq!(standing(&cs), None);
    }

    #[test]
    fn observing_a_generation_stamps_every_condition() {
        let mut cs = Vec::new();
        set_standing(&mut cs, Standing::Ready, "Aborted", "", Some(1), at(1));
        observe_generation(&mut cs, Some(4));
        assert!(cs.iter().all(|c| c.observed_generation == Some(4)));
    }

    fn any_standing() -> impl Strategy<Value = Standing> {
        prop_oneof![
            Just(Standing::Ready),
            Just(Standing::Reconciling),
            Just(Standing::Stalled),
        ]
    }

    proptest! {
        /// Whatever came before, the last standing set is the one the conditions read as, with
        /// at most one of the three True and no duplicate types.
        #[test]
        fn the_last_standing_wins(seq in proptest::collection::vec((any_standing(), 0i64..5), 1..20)) {
            let mut cs = Vec::new();
            for (i, (s, g)) in seq.iter().enumerate() {
                set_standing(&mut cs, *s, "R", "m", Some(*g), at(i as i64));
            }
            let (last, g) = seq[seq.len() - 1];
            prop_assert_eq!(standing(&cs), Some(last));
            prop_assert_eq!(cs.len(), 3);
            prop_assert!(cs.iter().all(|c| c.observed_generation == Some(g)));
            prop_assert!(cs.iter().filter(|c| c.is_true()).count() <= 1);
        }
    }
}
