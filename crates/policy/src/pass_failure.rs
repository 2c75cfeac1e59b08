//! A reconcile pass that failed: what its object's conditions say, and when it is tried again.
//!
//! The controllers retry a failed pass; how soon depends on why it failed, and each failure in a
//! row of one object waits longer than the last (an exponential back-off with jitter from
//! `backon`), so an error that does not go away is not retried at a fixed rate forever. A pass
//! that succeeds starts its object's back-off afresh.
//!
//! Pure: the caller classifies the error and passes the clock.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use crate::Standing;

/// Why a pass failed, as far as the retry and the status care.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The object changed under the pass (409): optimistic concurrency at work.
    Conflict,
    /// Manager (or the apiserver) did not answer: it may on the next try.
    Unavailable,
    /// Manager refused a request as wrong; it will until the object or Manager changes.
    Refused,
    /// Anything else.
    Other,
}

impl FailureKind {
    /// The back-off of failures of this kind: conflicts are tried again at once (the next read
    /// sees the change), an unanswered call within seconds, anything else more slowly; each
    /// grows by half again as much, or doubles, per failure in a row.
    pub fn backoff(self) -> ExponentialBuilder {
        let (first, max, factor) = match self {
            FailureKind::Conflict => (Duration::from_millis(200), Duration::from_secs(5), 1.5),
            FailureKind::Unavailable => (Duration::from_secs(1), Duration::from_secs(30), 2.0),
            FailureKind::Refused | FailureKind::Other => {
                (Duration::from_secs(2), Duration::from_secs(300), 2.0)
            }
        };
        ExponentialBuilder::new()
            .with_min_delay(first)
            .with_max_delay(max)
            .with_factor(factor)
            .with_jitter()
            .without_max_times()
    }

    /// The standing and reason the object's conditions take after a pass failed this way;
    /// `None` for a conflict, which says nothing about the object (the pass looks again). An
    /// unanswered call is Reconciling: the pass is tried again and nothing in the object needs
    /// fixing; only a refusal, which stands until someone changes something, is Stalled.
    pub fn standing(self) -> Option<(Standing, &'static str)> {
        match self {
            FailureKind::Conflict => None,
            FailureKind::Unavailable => Some((Standing::Reconciling, "ManagerUnavailable")),
            FailureKind::Refused => Some((Standing::Stalled, "ManagerRefused")),
            FailureKind::Other => Some((Standing::Reconciling, "RetryingAfterError")),
        }
    }
}

#[derive(Debug)]
struct Failing {
    kind: FailureKind,
    delays: ExponentialBackoff,
    last: Instant,
}

/// Objects whose last passes failed, by key (kind, namespace, name: the caller's choice).
#[derive(Debug, Default)]
pub struct Retries {
    failing: HashMap<String, Failing>,
}

/// Failures of an object older than this no longer count toward its back-off (the object was
/// not retried: it was deleted, or the operator stopped leading).
pub const FORGET_AFTER: Duration = Duration::from_secs(900);

impl Retries {
    /// The pass over `key` failed with `kind`: how long until it is tried again. A failure of
    /// another kind than the last starts that kind's back-off afresh.
    pub fn failed(&mut self, key: &str, kind: FailureKind, now: Instant) -> Duration {
        self.failing
            .retain(|_, f| now.saturating_duration_since(f.last) < FORGET_AFTER);
        let f = self
            .failing
            .entry(key.to_owned())
            .or_insert_with(|| Failing {
                kind,
                delays: kind.backoff().build(),
                last: now,
            });
        if f.kind != kind {
            *f = Failing {
                kind,
                delays: kind.backoff().build(),
                last: now,
            };
        }
        f.last = now;
        f.delays.next().unwrap_or(Duration::from_secs(300))
    }

    /// The pass over `key` succeeded.
    pub fn succeeded(&mut self, key: &str) {
        self.failing.remove(key);
    }

    /// How many objects are failing now.
    pub fn len(&self) -> usize {
        self.failing.len()
    }

    /// Whether no object is failing.
    pub fn is_empty(&self) -> bool {
        self.failing.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn repeated_failures_wait_longer_and_a_success_starts_afresh() {
        let mut r = Retries::default();
        let t = Instant::now();
        let waits: Vec<Duration> = (0..6)
            .map(|_| r.failed("b", FailureKind::Other, t))
            .collect();
        // With jitter each wait is in [base, 2 × base), base doubling from 2 s.
        for (i, w) in waits.iter().enumerate() {
            let base = Duration::from_secs(2) * 2u32.pow(i as u32);
            assert!(*w >= base && *w < base * 2, "wait {i}: {w:?}");
        }
        r.succeeded("b");
        assert!(r.is_empty());
        assert!(r.failed("b", FailureKind::Other, t) < Duration::from_secs(4));
    }

    #[test]
    fn a_conflict_is_retried_at_once_and_another_kind_starts_its_own_back_off() {
        let mut r = Retries::default();
        let t = Instant::now();
        for _ in 0..5 {
            r.failed("b", FailureKind::Other, t);
        }
        let conflict = r.failed("b", FailureKind::Conflict, t);
        assert!(conflict < Duration::from_millis(400), "{conflict:?}");
        assert!(r.failed("other", FailureKind::Unavailable, t) < Duration::from_secs(2));
    }

    #[test]
    fn old_failures_are_forgotten() {
        let mut r = Retries::default();
        let t = Instant::now();
        r.failed("gone", FailureKind::Other, t);
        r.failed("b", FailureKind::Other, t + FORGET_AFTER);
        assert_eq!(r.len(), 1);
    }

    #[test]
    fn only_a_conflict_leaves_the_conditions_alone() {
        assert_eq!(FailureKind::Conflict.standing(), None);
        assert_eq!(
            FailureKind::Refused.standing(),
            Some((Standing::Stalled, "ManagerRefused"))
        );
        assert_eq!(
            FailureKind::Unavailable.standing(),
            Some((Standing::Reconciling, "ManagerUnavailable")),
            "an outage is waited out, never Failed to kstatus"
        );
        assert_eq!(
            FailureKind::Other.standing().map(|s| s.0),
            Some(Standing::Reconciling)
        );
    }

    proptest! {
        /// Whatever the failures, no wait exceeds twice its kind's cap, and within one kind the
        /// back-off's base never shrinks.
        #[test]
        fn waits_are_bounded(kinds in proptest::collection::vec(0u8..4, 1..80)) {
            let mut r = Retries::default();
            let t = Instant::now();
            for k in kinds {
                let kind = match k {
                    0 => FailureKind::Conflict,
                    1 => FailureKind::Unavailable,
                    2 => FailureKind::Refused,
                    _ => FailureKind::Other,
                };
                let w = r.failed("o", kind, t);
                prop_assert!(w <= Duration::from_secs(600), "{:?}", w);
                prop_assert!(!w.is_zero());
            }
        }
    }
}
