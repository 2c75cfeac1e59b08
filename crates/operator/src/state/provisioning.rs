//! What the operator remembers about asking Manager for nodes: the per-pool request rate,
//! idempotency keys of asks without an answer, spares asked for that the mirror does not show
//! yet, the zone brake, and refused or failed asks.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use automanager_policy::provision_budget::ProvisionBudget;
use automanager_policy::provision_keys::ProvisionKeys;
use automanager_policy::provision_refusals::{Hold, ProvisionRefusals, Refusal};
use automanager_policy::zone_brake::{ZoneBrake, ZoneChange};
use chrono::{DateTime, Utc};
use manager_proto as proto;

/// The provisioning records. Every change goes through a named operation.
#[derive(Debug)]
pub struct Provisioning {
    /// Node requests per pool in the last minute.
    budget: ProvisionBudget,
    /// CreateNode idempotency keys sent without an answer, repeated by the next ask.
    keys: ProvisionKeys,
    /// Spares asked for per HotSpareTarget, and when.
    spares_asked: HashMap<String, Vec<(proto::Node, Instant)>>,
    /// Warm spares a recovery started, and when: their target must not stop them again before
    /// the recovery takes them.
    warm_claimed: HashMap<String, Instant>,
    /// Nodes lost per pool and zone, and the zones whose provisioning is paused; `None` when
    /// losses are not counted (`zoneBrake.enabled: false`).
    zone_brake: Option<ZoneBrake>,
    /// What a disabled brake answers: nothing is degraded.
    no_brake: ZoneBrake,
    /// Asks Manager refused for good, and the back-off of asks that failed.
    refusals: ProvisionRefusals,
}

impl Provisioning {
    pub(super) fn new(budget: ProvisionBudget, zone_brake: Option<ZoneBrake>) -> Self {
        Provisioning {
            budget,
            keys: ProvisionKeys::default(),
            spares_asked: HashMap::new(),
            warm_claimed: HashMap::new(),
            zone_brake,
            no_brake: ZoneBrake::default(),
            refusals: ProvisionRefusals::default(),
        }
    }

    /// Whether `intent` may ask for a node of `instance_type` in `pool` now (see
    /// [`ProvisionRefusals::hold`]).
    pub fn hold(
        &mut self,
        intent: &str,
        pool: &str,
        instance_type: &str,
        epoch: &str,
        now: Instant,
    ) -> Option<Hold> {
        self.refusals.hold(intent, pool, instance_type, epoch, now)
    }

    /// Manager refused a node for good: no ask for it until the pool or Manager changes.
    pub fn refused(&mut self, refusal: Refusal, epoch: &str) {
        self.refusals.refused(refusal, epoch);
    }

    /// `intent`'s ask failed otherwise: how long it waits before the next.
    pub fn ask_failed(&mut self, intent: &str, message: String, now: Instant) -> Duration {
        self.refusals.failed(intent, message, now)
    }

    /// `intent`'s ask got a node.
    pub fn ask_answered(&mut self, intent: &str) {
        self.refusals.succeeded(intent);
    }

    /// `pool`'s spec changed or it is gone: its refusals no longer stand.
    pub fn pool_changed(&mut self, pool: &str) -> bool {
        self.refusals.pool_changed(pool)
    }

    /// What Manager offers for `pool` now; `true` when refusals of the pool were dropped.
    pub fn manager_offers(&mut self, pool: &str, instance_types: Vec<String>) -> bool {
        self.refusals.offers(pool, instance_types)
    }

    /// The refusals that stand for `pool` under Manager's `epoch`.
    pub fn refusals_of(&self, pool: &str, epoch: &str) -> Vec<Refusal> {
        self.refusals
            .refusals_of(pool, epoch)
            .into_iter()
            .cloned()
            .collect()
    }

    /// How many nodes `pool` may still ask for this minute.
    pub fn allowance(&mut self, pool: &str, now: DateTime<Utc>) -> u32 {
        self.budget.allowance(pool, now)
    }

    /// Takes one node request of `pool`'s rate: false when this minute's are used up.
    pub fn take_request(&mut self, pool: &str, now: DateTime<Utc>) -> bool {
        self.budget.take(pool, now)
    }

    /// The idempotency key for the next CreateNode of `intent` (see
    /// [`ProvisionKeys::take`]).
    pub fn request_key(
        &mut self,
        intent: &str,
        known: impl Fn(&str) -> bool,
        now: Instant,
        fresh: impl FnOnce() -> String,
    ) -> String {
        self.keys.take(intent, known, now, fresh)
    }

    /// A CreateNode with `key` got no definite answer: the next ask of `intent` repeats it.
    pub fn unanswered(&mut self, intent: &str, key: String, now: Instant) {
        self.keys.unanswered(intent, key, now);
    }

    /// A spare was asked for `target` at `now`.
    pub fn spare_asked(&mut self, target: &str, node: proto::Node, now: Instant) {
        self.spares_asked
            .entry(target.to_owned())
            .or_default()
            .push((node, now));
    }

    /// Spares asked for `target` within `grace` of `now` that `shown` does not know yet (the
    /// others are forgotten).
    pub fn spares_not_shown(
        &mut self,
        target: &str,
        now: Instant,
        grace: Duration,
        shown: impl Fn(&str) -> bool,
    ) -> Vec<proto::Node> {
        let Some(asked) = self.spares_asked.get_mut(target) else {
            return Vec::new();
        };
        asked.retain(|(n, at)| now.saturating_duration_since(*at) < grace && !shown(&n.node_id));
        let out = asked.iter().map(|(n, _)| n.clone()).collect();
        if asked.is_empty() {
            self.spares_asked.remove(target);
        }
        out
    }

    /// `target` is gone: its asks with it.
    pub fn forget_spares(&mut self, target: &str) {
        self.spares_asked.remove(target);
    }

    /// A recovery started warm spare `node` at `now`.
    pub fn claim_warm(&mut self, node: &str, now: Instant) {
        self.warm_claimed.insert(node.to_owned(), now);
    }

    /// The nodes a recovery claimed within `grace` of `now` (older claims are forgotten).
    pub fn claimed(&mut self, now: Instant, grace: Duration) -> std::collections::HashSet<String> {
        self.warm_claimed
            .retain(|_, at| now.saturating_duration_since(*at) < grace);
        self.warm_claimed.keys().cloned().collect()
    }

    /// The zone brake, to ask which zones are degraded (a disabled brake holds none).
    pub fn zone_brake(&self) -> &ZoneBrake {
        self.zone_brake.as_ref().unwrap_or(&self.no_brake)
    }

    /// Whether node losses are counted at all.
    pub fn zone_brake_enabled(&self) -> bool {
        self.zone_brake.is_some()
    }

    /// A node of `pool` in `zone` was lost with `up` nodes left there.
    pub fn record_zone_loss(
        &mut self,
        pool: &str,
        zone: &str,
        up: u32,
        now: DateTime<Utc>,
    ) -> Option<ZoneChange> {
        self.zone_brake.as_mut()?.record_loss(pool, zone, up, now)
    }

    /// Zones whose brake window passed quietly are released.
    pub fn tick_zone_brake(&mut self, now: DateTime<Utc>) -> Vec<ZoneChange> {
        self.zone_brake
            .as_mut()
            .map(|b| b.tick(now))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str) -> proto::Node {
        proto::Node {
            node_id: id.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_spare_asked_for_is_counted_until_shown_or_its_grace_passes() {
        let mut p = Provisioning::new(ProvisionBudget::new(10), None);
        let t0 = Instant::now();
        let grace = Duration::from_secs(60);
        p.spare_asked("t", node("a"), t0);
        p.spare_asked("t", node("b"), t0);
        let ids = |v: Vec<proto::Node>| v.into_iter().map(|n| n.node_id).collect::<Vec<_>>();
        assert_eq!(
            ids(p.spares_not_shown("t", t0, grace, |_| false)),
            ["a", "b"]
        );
        assert_eq!(ids(p.spares_not_shown("t", t0, grace, |n| n == "a")), ["b"]);
        assert!(
            p.spares_not_shown("t", t0 + grace, grace, |_| false)
                .is_empty()
        );
        assert!(p.spares_not_shown("other", t0, grace, |_| false).is_empty());
    }

    #[test]
    fn a_disabled_zone_brake_counts_nothing_and_degrades_nothing() {
        let mut p = Provisioning::new(ProvisionBudget::new(10), None);
        assert!(!p.zone_brake_enabled());
        assert!(
            p.record_zone_loss("p", "z", 0, DateTime::UNIX_EPOCH)
                .is_none()
        );
        assert!(!p.zone_brake().is_degraded("p", "z"));
        assert!(p.tick_zone_brake(DateTime::UNIX_EPOCH).is_empty());
    }
}
