//! The status condition shared by every kind, and helpers that keep `lastTransitionTime` honest.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The truth value of a condition.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// The operator cannot tell.
    Unknown,
}

/// One observation of the resource's state, in the shape of Kubernetes' `metav1.Condition`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition's type, in CamelCase (`Ready`, `Reconciling`, `Stalled`, `Broken`, `SpareUnderflow`, …).
    #[serde(rename = "type")]
    #[schemars(length(max = 63))]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// A CamelCase word a program can match on, explaining the status.
    #[schemars(length(max = 128))]
    pub reason: String,
    /// A sentence for people.
    #[serde(default)]
    #[schemars(length(max = 4096))]
    pub message: String,
    /// When the status last changed (not when the condition was last written).
    pub last_transition_time: DateTime<Utc>,
    /// The `metadata.generation` the operator had seen when it set this condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

impl Condition {
    /// A new condition observed at `now`. The reason and message are clipped to the schema's
    /// bounds ([`crate::bounded`]), so a condition never makes a status write fail.
    pub fn new(
        type_: impl Into<String>,
        status: ConditionStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
        observed_generation: Option<i64>,
        now: DateTime<Utc>,
    ) -> Self {
        Condition {
            type_: type_.into(),
            status,
            reason: crate::bounded::clip(&reason.into(), 128).into_owned(),
            message: crate::bounded::clip(&message.into(), crate::bounded::MAX_CONDITION_MESSAGE)
                .into_owned(),
            last_transition_time: now,
            observed_generation,
        }
    }

    /// Whether the condition's status is `True`.
    pub fn is_true(&self) -> bool {
        self.status == ConditionStatus::True
    }
}

/// Sets `new` in `conditions`, replacing the condition of the same type. The existing
/// `lastTransitionTime` is kept when the status did not change, as `meta.SetStatusCondition` does.
/// Returns whether anything changed.
pub fn set_condition(conditions: &mut Vec<Condition>, mut new: Condition) -> bool {
    match conditions.iter_mut().find(|c| c.type_ == new.type_) {
        Some(existing) => {
            if existing.status == new.status {
                new.last_transition_time = existing.last_transition_time;
            }
            let changed = *existing != new;
            *existing = new;
            changed
        }
        None => {
            conditions.push(new);
            true
        }
    }
}

/// The condition of `type_`, if present.
pub fn find_condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// Removes the condition of `type_`; returns whether one was removed.
pub fn remove_condition(conditions: &mut Vec<Condition>, type_: &str) -> bool {
    let before = conditions.len();
    conditions.retain(|c| c.type_ != type_);
    before != conditions.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(secs: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(secs, 0).single().unwrap_or_default()
    }

    #[test]
    fn setting_the_same_status_keeps_the_transition_time() {
        let mut cs = vec![Condition::new(
            "Ready",
            ConditionStatus::True,
            "Placed",
            "",
            Some(1),
            at(10),
        )];
        let changed = set_condition(
            &mut cs,
            Condition::new(
                "Ready",
                ConditionStatus::True,
                "Placed",
                "all placed",
                Some(2),
                at(20),
            ),
        );
        assert!(changed);
        assert_eq!(cs[0].last_transition_time, at(10));
        assert_eq!(cs[0].observed_generation, Some(2));
        assert_eq!(cs[0].message, "all placed");
    }

    #[test]
    fn changing_status_moves_the_transition_time() {
        let mut cs = vec![Condition::new(
            "Ready",
            ConditionStatus::True,
            "Placed",
            "",
            Some(1),
            at(10),
        )];
        set_condition(
            &mut cs,
            Condition::new(
                "Ready",
                ConditionStatus::False,
                "NodeLost",
                "",
                Some(1),
                at(30),
            ),
        );
        assert_eq!(cs[0].last_transition_time, at(30));
        assert_eq!(cs.len(), 1);
    }

    #[test]
    fn an_identical_condition_is_not_a_change() {
        let c = Condition::new(
            "Ready",
            ConditionStatus::True,
            "Placed",
            "m",
            Some(1),
            at(10),
        );
        let mut cs = vec![c.clone()];
        assert!(!set_condition(
            &mut cs,
            Condition {
                last_transition_time: at(99),
                ..c
            }
        ));
    }

    #[test]
    fn new_types_are_appended_and_can_be_removed() {
        let mut cs = Vec::new();
        set_condition(
            &mut cs,
            Condition::new("Ready", ConditionStatus::False, "Pending", "", None, at(1)),
        );
        set_condition(
            &mut cs,
            Condition::new(
                "Stalled",
                ConditionStatus::True,
                "NoCapacity",
                "",
                None,
                at(1),
            ),
        );
        assert_eq!(cs.len(), 2);
        assert!(find_condition(&cs, "Stalled").is_some_and(Condition::is_true));
        assert!(remove_condition(&mut cs, "Stalled"));
        assert!(!remove_condition(&mut cs, "Stalled"));
    }
}
