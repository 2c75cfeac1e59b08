//! What Manager answered when asked for a node, so a failed ask is not repeated blindly.
//!
//! A CreateNode can fail in two ways, and each is held differently:
//!
//! - **Refused** for good: Manager answered that the request is wrong (`INVALID_ARGUMENT`, such
//!   as an instance type the pool does not offer; `FAILED_PRECONDITION`; `NOT_FOUND`;
//!   `PERMISSION_DENIED`). No retry changes that answer. It is held per (pool, instance type)
//!   with Manager's message, and nothing asks for that type in that pool again until the pool's
//!   spec changes ([`ProvisionRefusals::pool_changed`]), Manager's world changes (another epoch:
//!   a Manager that lost its state) or what Manager offers for the pool changes
//!   ([`ProvisionRefusals::offers`]).
//! - **Failed** otherwise (no answer, unavailable, exhausted): the asker (a bundle replica, a
//!   spare target, a migration target) waits before asking again, each wait longer than the
//!   last (an exponential back-off with jitter from `backon`), until an ask succeeds.
//!
//! Pure: the caller passes the clock and Manager's epoch. Memory is bounded: refusals are keyed
//! by the pool's candidate types, and a back-off idle for [`IDLE_AFTER`] is forgotten.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The first wait after a failed ask.
pub const FIRST_RETRY: Duration = Duration::from_secs(2);
/// The longest wait between asks.
pub const MAX_RETRY: Duration = Duration::from_secs(300);
/// A back-off with no failure for this long is forgotten (its asker succeeded elsewhere or is
/// gone).
pub const IDLE_AFTER: Duration = Duration::from_secs(3 * 300);

/// The growing back-off of failed CreateNodes: 2 s, 4 s, 8 s … capped at 5 minutes, each with
/// up to as much again of jitter so askers that failed together do not ask together.
pub fn retry_backoff() -> ExponentialBuilder {
    ExponentialBuilder::new()
        .with_min_delay(FIRST_RETRY)
        .with_max_delay(MAX_RETRY)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
}

/// A refusal Manager gave for one (pool, instance type).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub pool: String,
    pub instance_type: String,
    /// Manager's status code, as a CamelCase word (`InvalidArgument`).
    pub code: String,
    /// Manager's message.
    pub message: String,
}

impl Refusal {
    /// One sentence for a condition or an Event.
    pub fn describe(&self) -> String {
        format!(
            "Manager refused to provision a {} node in pool {} ({}: {}); not asked again until the pool's spec or Manager changes",
            if self.instance_type.is_empty() {
                "default"
            } else {
                &self.instance_type
            },
            self.pool,
            self.code,
            self.message
        )
    }
}

/// Why an ask may not be made now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Manager refused this (pool, instance type); it stands.
    Refused(Refusal),
    /// The asker's last ask failed; the next one waits `remaining` more.
    BackingOff {
        remaining: Duration,
        /// Why the last ask failed.
        message: String,
        /// Failed asks in a row.
        failures: u32,
    },
}

#[derive(Debug)]
struct Held {
    refusal: Refusal,
    /// Manager's epoch when it refused: another epoch is another Manager.
    epoch: String,
}

#[derive(Debug)]
struct Retry {
    delays: ExponentialBackoff,
    not_before: Instant,
    last_failure: Instant,
    message: String,
    failures: u32,
}

/// The refusals and back-offs of CreateNode.
#[derive(Debug)]
pub struct ProvisionRefusals {
    builder: ExponentialBuilder,
    refused: HashMap<(String, String), Held>,
    /// The instance types Manager offers per pool, as last seen.
    offered: HashMap<String, Vec<String>>,
    retries: HashMap<String, Retry>,
}

impl Default for ProvisionRefusals {
    fn default() -> Self {
        ProvisionRefusals::new(retry_backoff())
    }
}

impl ProvisionRefusals {
    /// Refusals with failed asks backed off by `builder`.
    pub fn new(builder: ExponentialBuilder) -> Self {
        ProvisionRefusals {
            builder,
            refused: HashMap::new(),
            offered: HashMap::new(),
            retries: HashMap::new(),
        }
    }

    /// Whether `intent` may ask for a node of `instance_type` in `pool` now; `Some` says why
    /// not. A refusal given by a Manager of another `epoch` no longer stands.
    pub fn hold(
        &mut self,
        intent: &str,
        pool: &str,
        instance_type: &str,
        epoch: &str,
        now: Instant,
    ) -> Option<Hold> {
        let key = (pool.to_owned(), instance_type.to_owned());
        match self.refused.get(&key) {
            Some(h) if h.epoch == epoch => return Some(Hold::Refused(h.refusal.clone())),
            Some(_) => {
                self.refused.remove(&key);
            }
            None => {}
        }
        let r = self.retries.get(intent)?;
        let remaining = r.not_before.saturating_duration_since(now);
        (!remaining.is_zero()).then(|| Hold::BackingOff {
            remaining,
            message: r.message.clone(),
            failures: r.failures,
        })
    }

    /// Manager refused the ask for good: hold it.
    pub fn refused(&mut self, refusal: Refusal, epoch: &str) {
        self.refused.insert(
            (refusal.pool.clone(), refusal.instance_type.clone()),
            Held {
                refusal,
                epoch: epoch.to_owned(),
            },
        );
    }

    /// `intent`'s ask failed (not a refusal): how long it waits before the next. Each failure in
    /// a row waits longer, up to [`MAX_RETRY`] (plus jitter).
    pub fn failed(&mut self, intent: &str, message: String, now: Instant) -> Duration {
        self.retries
            .retain(|_, r| now.saturating_duration_since(r.last_failure) < IDLE_AFTER);
        let builder = self.builder;
        let r = self
            .retries
            .entry(intent.to_owned())
            .or_insert_with(|| Retry {
                delays: builder.build(),
                not_before: now,
                last_failure: now,
                message: String::new(),
                failures: 0,
            });
        let delay = r.delays.next().unwrap_or(MAX_RETRY);
        r.not_before = now + delay;
        r.last_failure = now;
        r.message = message;
        r.failures = r.failures.saturating_add(1);
        delay
    }

    /// `intent`'s ask was answered with a node: its back-off starts afresh.
    pub fn succeeded(&mut self, intent: &str) {
        self.retries.remove(intent);
    }

    /// The pool's spec changed (or it is gone): its refusals no longer stand.
    pub fn pool_changed(&mut self, pool: &str) -> bool {
        let before = self.refused.len();
        self.refused.retain(|(p, _), _| p != pool);
        before != self.refused.len()
    }

    /// What Manager offers for `pool` now (its instance types). When that differs from what it
    /// offered before, the pool's refusals no longer stand; `true` when some were dropped.
    pub fn offers(&mut self, pool: &str, mut offered: Vec<String>) -> bool {
        offered.sort();
        offered.dedup();
        let changed = self
            .offered
            .get(pool)
            .is_some_and(|before| *before != offered);
        self.offered.insert(pool.to_owned(), offered);
        changed && self.pool_changed(pool)
    }

    /// The refusals that stand for `pool` under Manager's `epoch`, by instance type.
    pub fn refusals_of(&self, pool: &str, epoch: &str) -> Vec<&Refusal> {
        let mut out: Vec<&Refusal> = self
            .refused
            .iter()
            .filter(|((p, _), h)| p == pool && h.epoch == epoch)
            .map(|(_, h)| &h.refusal)
            .collect();
        out.sort_by(|a, b| a.instance_type.cmp(&b.instance_type));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn refusal(pool: &str, t: &str) -> Refusal {
        Refusal {
            pool: pool.into(),
            instance_type: t.into(),
            code: "InvalidArgument".into(),
            message: format!("pool {pool:?} has no instance type {t:?}"),
        }
    }

    /// Back-offs without jitter, so delays can be compared.
    fn plain() -> ProvisionRefusals {
        ProvisionRefusals::new(
            ExponentialBuilder::new()
                .with_min_delay(FIRST_RETRY)
                .with_max_delay(MAX_RETRY)
                .without_max_times(),
        )
    }

    #[test]
    fn a_refusal_holds_every_ask_for_its_type_in_its_pool_and_no_other() {
        let mut r = ProvisionRefusals::default();
        let now = Instant::now();
        r.refused(refusal("aws", "m5.huge"), "e1");
        assert_eq!(
            r.hold("bundle-a", "aws", "m5.huge", "e1", now),
            Some(Hold::Refused(refusal("aws", "m5.huge")))
        );
        assert_eq!(
            r.hold("spare-b", "aws", "m5.huge", "e1", now + MAX_RETRY * 10),
            Some(Hold::Refused(refusal("aws", "m5.huge"))),
            "any asker, however late: the refusal does not expire"
        );
        assert_eq!(r.hold("bundle-a", "aws", "m5.large", "e1", now), None);
        assert_eq!(r.hold("bundle-a", "oci", "m5.huge", "e1", now), None);
    }

    #[test]
    fn a_refusal_goes_when_the_pool_changes_manager_restarts_or_its_offer_changes() {
        let mut r = ProvisionRefusals::default();
        let now = Instant::now();
        r.refused(refusal("aws", "x"), "e1");
        assert!(r.pool_changed("aws"));
        assert_eq!(r.hold("i", "aws", "x", "e1", now), None);

        r.refused(refusal("aws", "x"), "e1");
        assert_eq!(r.hold("i", "aws", "x", "e2", now), None, "another Manager");
        assert!(r.refusals_of("aws", "e1").is_empty());

        assert!(
            !r.offers("aws", vec!["a".into()]),
            "first sight: nothing to compare"
        );
        r.refused(refusal("aws", "x"), "e1");
        assert!(
            !r.offers("aws", vec!["a".into(), "a".into()]),
            "the same offer"
        );
        assert_eq!(r.refusals_of("aws", "e1").len(), 1);
        assert!(r.offers("aws", vec!["a".into(), "x".into()]));
        assert!(r.refusals_of("aws", "e1").is_empty());
    }

    #[test]
    fn failed_asks_wait_longer_each_time_up_to_the_cap_and_a_success_starts_afresh() {
        let mut r = plain();
        let t0 = Instant::now();
        let waits: Vec<Duration> = (0..12)
            .map(|_| r.failed("i", "unavailable".into(), t0))
            .collect();
        assert_eq!(waits[0], FIRST_RETRY);
        assert_eq!(waits[1], FIRST_RETRY * 2);
        assert!(waits.windows(2).all(|w| w[1] >= w[0]), "{waits:?}");
        assert_eq!(*waits.last().unwrap_or(&Duration::ZERO), MAX_RETRY);
        match r.hold("i", "aws", "x", "e", t0 + Duration::from_secs(1)) {
            Some(Hold::BackingOff {
                message, failures, ..
            }) => assert_eq!((message.as_str(), failures), ("unavailable", 12)),
            other => panic!("{other:?}"),
        }
        assert_eq!(r.hold("other", "aws", "x", "e", t0), None, "per asker");
        r.succeeded("i");
        assert_eq!(r.hold("i", "aws", "x", "e", t0), None);
        assert_eq!(r.failed("i", "again".into(), t0), FIRST_RETRY);
    }

    #[test]
    fn an_idle_back_off_is_forgotten() {
        let mut r = plain();
        let t0 = Instant::now();
        r.failed("gone", "x".into(), t0);
        r.failed("gone", "x".into(), t0);
        r.failed("other", "x".into(), t0 + IDLE_AFTER);
        assert_eq!(r.retries.len(), 1);
        assert_eq!(
            r.failed("gone", "x".into(), t0 + IDLE_AFTER),
            FIRST_RETRY,
            "starts afresh"
        );
    }

    proptest! {
        /// However failures and waits interleave, an asker never asks before its back-off ends,
        /// and every wait (jitter included) is at least the last one without jitter and at most
        /// twice the cap.
        #[test]
        fn no_ask_before_the_back_off_ends(steps in proptest::collection::vec(0u64..400, 1..60)) {
            let mut r = ProvisionRefusals::default();
            let t0 = Instant::now();
            let mut now = t0;
            let mut not_before = t0;
            for s in steps {
                now += Duration::from_secs(s);
                let held = r.hold("i", "p", "t", "e", now).is_some();
                prop_assert_eq!(held, now < not_before);
                if !held {
                    let wait = r.failed("i", "no".into(), now);
                    prop_assert!(wait >= FIRST_RETRY && wait <= MAX_RETRY * 2, "{:?}", wait);
                    not_before = now + wait;
                }
            }
        }
    }
}
