//! The rules for asking Manager for a node that span books: whether an ask may be made now
//! (the pool loaded, no refusal or back-off standing, the zone not braked, the pool's rate not
//! spent) and, once it may, the ask's idempotency key, each decided under one hold of the lock
//! so nothing changes between the checks and the rate the ask takes.

use std::time::Instant;

use automanager_placement as pl;
use automanager_policy::provision_refusals::Hold;
use automanager_policy::zone_brake::ZoneBrake;
use chrono::{DateTime, Utc};
use manager_client::MirrorState;

use super::State;

/// What an ask for a node may do now.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeAsk {
    /// Ask: the rate is taken; here is the pool as the model holds it.
    Ask(pl::PoolSpec),
    /// The pool is not loaded.
    PoolUnknown,
    /// The zone asked for is held by the zone brake.
    ZoneDegraded,
    /// The pool's provisioning rate is used up for this minute.
    RateSpent,
    /// A refusal or a back-off stands (taking nothing of the rate).
    Held(Hold),
}

/// Why a CreateNode may not be keyed and sent.
#[derive(Debug, Clone, PartialEq)]
pub enum NotKeyed {
    /// The pool is being deleted.
    PoolTerminating,
    Held(Hold),
    /// No zone may be named (the zone rule's message).
    Zone(String),
}

/// A CreateNode ready to send: the zone to name and its idempotency key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keyed {
    pub zone: String,
    pub key: String,
}

impl State {
    /// Whether `intent` may ask for a node of `instance_type` in `pool` (in `zone`, when
    /// named) now, for Manager's `epoch`; when it may, one request of the pool's rate is taken.
    #[allow(clippy::too_many_arguments)]
    pub fn admit_node_ask(
        &self,
        epoch: &str,
        now: Instant,
        wall: DateTime<Utc>,
        intent: &str,
        pool: &str,
        instance_type: &str,
        zone: Option<&str>,
    ) -> NodeAsk {
        let mut s = self.lock();
        let Some(spec) = s.model().pool(pool).cloned() else {
            return NodeAsk::PoolUnknown;
        };
        if let Some(hold) = (s.provisioning_mut()).hold(intent, pool, instance_type, epoch, now) {
            return NodeAsk::Held(hold);
        }
        if zone.is_some_and(|z| s.provisioning().zone_brake().is_degraded(pool, z)) {
            return NodeAsk::ZoneDegraded;
        }
        if !s.provisioning_mut().take_request(pool, wall) {
            return NodeAsk::RateSpent;
        }
        NodeAsk::Ask(spec)
    }

    /// The zone and idempotency key of `intent`'s CreateNode into `pool`: refused while the
    /// pool is being deleted or a refusal or back-off stands; `zone` picks the zone to name
    /// from the brake and the pool's zones; a key whose ask got no answer is repeated unless
    /// `mirror` shows the node it made.
    #[allow(clippy::too_many_arguments)]
    pub fn key_node_ask(
        &self,
        mirror: &MirrorState,
        now: Instant,
        intent: &str,
        pool: &str,
        instance_type: &str,
        zone: impl FnOnce(&ZoneBrake, &[String]) -> Result<String, String>,
        fresh: impl FnOnce() -> String,
    ) -> Result<Keyed, NotKeyed> {
        let mut s = self.lock();
        let spec = s.model().pool(pool);
        if spec.is_some_and(|p| p.terminating) {
            return Err(NotKeyed::PoolTerminating);
        }
        let zones = spec.map(|p| p.zones.clone()).unwrap_or_default();
        let held = (s.provisioning_mut()).hold(intent, pool, instance_type, &mirror.epoch, now);
        if let Some(hold) = held {
            return Err(NotKeyed::Held(hold));
        }
        let zone = zone(s.provisioning().zone_brake(), &zones).map_err(NotKeyed::Zone)?;
        let key = s.provisioning_mut().request_key(
            intent,
            |key| mirror.nodes.values().any(|n| n.request_id == key),
            now,
            fresh,
        );
        Ok(Keyed { zone, key })
    }

    /// `intent`'s CreateNode was answered: its back-off is cleared.
    pub fn node_ask_answered(&self, intent: &str) {
        self.lock().provisioning_mut().ask_answered(intent);
    }

    /// `intent`'s CreateNode with `key` got no definite answer: the next ask repeats the key.
    pub fn node_ask_unanswered(&self, intent: &str, key: String, now: Instant) {
        self.lock().provisioning_mut().unanswered(intent, key, now);
    }

    /// `intent`'s CreateNode failed otherwise: how long it waits before the next.
    pub fn node_ask_failed(
        &self,
        intent: &str,
        message: String,
        now: Instant,
    ) -> std::time::Duration {
        self.lock()
            .provisioning_mut()
            .ask_failed(intent, message, now)
    }
}

#[cfg(test)]
mod tests {
    use automanager_policy::provision_refusals::Refusal;
    use automanager_policy::zone_brake::ZoneBrakeSettings;
    use chrono::TimeDelta;
    use proptest::prelude::*;

    use super::*;
    use crate::settings::Settings;

    const POOLS: [&str; 3] = ["a", "b", "unloaded"];
    const ZONES: [Option<&str>; 3] = [None, Some("z1"), Some("down")];
    const TYPES: [&str; 2] = ["small", "refused"];

    fn state() -> State {
        let state = State::new(&Settings {
            provision_per_minute: 5,
            zone_brake: Some(ZoneBrakeSettings {
                lost_fraction: 0.5,
                window: TimeDelta::seconds(300),
                min_lost: 1,
            }),
            ..Settings::default()
        });
        let mirror = MirrorState::default();
        for p in &POOLS[..2] {
            let spec = serde_json::from_value(serde_json::json!({"name": p, "kind": "aws"}))
                .expect("a pool spec");
            state.load_pool(&mirror, spec).expect("valid");
            let _ = state.record_zone_loss(p, "down", 0, DateTime::UNIX_EPOCH);
            state.refused(
                Refusal {
                    pool: (*p).into(),
                    instance_type: "refused".into(),
                    code: "InvalidArgument".into(),
                    message: "not offered".into(),
                },
                "e",
            );
        }
        state
    }

    proptest! {
        /// An ask takes one request of its pool's rate when it is admitted and nothing
        /// otherwise; it is admitted only for a loaded pool, an instance type not refused, a
        /// zone not braked, while the rate lasts.
        #[test]
        fn only_an_admitted_ask_takes_of_the_rate(
            asks in proptest::collection::vec((0..POOLS.len(), 0..ZONES.len(), 0..TYPES.len()), 1..30)
        ) {
            let state = state();
            let (now, wall) = (Instant::now(), DateTime::UNIX_EPOCH);
            for (p, z, t) in asks {
                let (pool, zone, ty) = (POOLS[p], ZONES[z], TYPES[t]);
                let before = state.provision_allowance(pool, wall);
                let ask = state.admit_node_ask("e", now, wall, "intent", pool, ty, zone);
                let after = state.provision_allowance(pool, wall);
                let expected = if pool == "unloaded" {
                    "unknown"
                } else if ty == "refused" {
                    "held"
                } else if zone == Some("down") {
                    "zone"
                } else if before == 0 {
                    "rate"
                } else {
                    "ask"
                };
                let got = match &ask {
                    NodeAsk::Ask(spec) => {
                        prop_assert_eq!(&spec.name, pool);
                        "ask"
                    }
                    NodeAsk::PoolUnknown => "unknown",
                    NodeAsk::Held(_) => "held",
                    NodeAsk::ZoneDegraded => "zone",
                    NodeAsk::RateSpent => "rate",
                };
                prop_assert_eq!(got, expected);
                let taken = if got == "ask" { 1 } else { 0 };
                if pool != "unloaded" {
                    prop_assert_eq!(after + taken, before);
                }
            }
        }
    }
}
