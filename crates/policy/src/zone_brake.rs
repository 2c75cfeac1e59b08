//! The zone brake: when more than a configured fraction of a pool's nodes in one zone are lost
//! within a window (a zone outage), provisioning into that zone pauses; recovery goes on in the
//! pool's other zones and in other pools. The zone is `ZoneDegraded` until the window passes
//! with no further loss in it.
//!
//! The TypeScript library (`@norskvideo/norsk-auto-manager`) has no such brake: without it a
//! recovery wave would ask a failing zone for hundreds of nodes that never start. A node counts
//! as lost when Manager reports it stopped or terminated without the operator having asked for
//! it; the caller decides that and passes the clock.
//!
//! Pure: no clock, no I/O. Memory is bounded by the losses inside one window per zone.

use std::collections::{BTreeMap, VecDeque};

use chrono::{DateTime, TimeDelta, Utc};

/// When a zone counts as degraded.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ZoneBrakeSettings {
    /// A zone is degraded when the nodes it lost within `window` are more than this fraction of
    /// the nodes it had (those lost in the window plus those still up). In (0, 1].
    pub lost_fraction: f64,
    /// The sliding window for losses, and the quiet time after the last loss before it clears.
    pub window: TimeDelta,
    /// Fewer losses than this in the window never degrade a zone (one node of a two-node zone
    /// failing is a node failure, not an outage).
    pub min_lost: u32,
}

impl Default for ZoneBrakeSettings {
    fn default() -> Self {
        ZoneBrakeSettings {
            lost_fraction: 0.5,
            window: TimeDelta::minutes(5),
            min_lost: 3,
        }
    }
}

/// Whether `lost` losses in the window out of `lost + live` nodes degrade a zone.
pub fn trips(lost: u32, live: u32, s: &ZoneBrakeSettings) -> bool {
    if lost == 0 || lost < s.min_lost {
        return false;
    }
    let had = f64::from(lost) + f64::from(live);
    f64::from(lost) > s.lost_fraction * had
}

/// A zone the brake holds: no node is provisioned into it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DegradedZone {
    pub pool: String,
    pub zone: String,
    /// When it tripped.
    pub since: DateTime<Utc>,
    /// Nodes lost in the window when it tripped, and how many the zone had then.
    pub lost: u32,
    pub had: u32,
    /// When it clears if nothing more is lost: the last loss plus the window.
    pub until: DateTime<Utc>,
}

/// What recording a loss or the passing of time changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZoneChange {
    /// The zone just became degraded.
    Degraded(DegradedZone),
    /// The zone's window passed quietly: provisioning into it resumes.
    Cleared { pool: String, zone: String },
}

#[derive(Debug, Default, Clone)]
struct ZoneRecord {
    losses: VecDeque<DateTime<Utc>>,
    degraded: Option<DegradedZone>,
}

/// Losses per (pool, zone) and which zones are degraded.
#[derive(Debug, Clone, Default)]
pub struct ZoneBrake {
    settings: ZoneBrakeSettings,
    zones: BTreeMap<(String, String), ZoneRecord>,
}

impl ZoneBrake {
    pub fn new(settings: ZoneBrakeSettings) -> Self {
        ZoneBrake {
            settings,
            zones: BTreeMap::new(),
        }
    }

    pub fn settings(&self) -> &ZoneBrakeSettings {
        &self.settings
    }

    /// Records that `pool` lost a node in `zone` at `now`; `live` is how many of the pool's
    /// nodes in the zone are still up (starting or started) after the loss.
    pub fn record_loss(
        &mut self,
        pool: &str,
        zone: &str,
        live: u32,
        now: DateTime<Utc>,
    ) -> Option<ZoneChange> {
        let window = self.settings.window;
        let rec = self
            .zones
            .entry((pool.to_owned(), zone.to_owned()))
            .or_default();
        while rec
            .losses
            .front()
            .is_some_and(|t| now.signed_duration_since(*t) >= window)
        {
            rec.losses.pop_front();
        }
        rec.losses.push_back(now);
        let lost = u32::try_from(rec.losses.len()).unwrap_or(u32::MAX);
        if let Some(d) = &mut rec.degraded {
            // Another loss while degraded: it stays degraded a window past this one.
            d.until = now + window;
            return None;
        }
        if !trips(lost, live, &self.settings) {
            return None;
        }
        let d = DegradedZone {
            pool: pool.to_owned(),
            zone: zone.to_owned(),
            since: now,
            lost,
            had: lost.saturating_add(live),
            until: now + window,
        };
        rec.degraded = Some(d.clone());
        Some(ZoneChange::Degraded(d))
    }

    /// Clears the zones whose window passed quietly by `now` and forgets old losses.
    pub fn tick(&mut self, now: DateTime<Utc>) -> Vec<ZoneChange> {
        let window = self.settings.window;
        let mut cleared = Vec::new();
        self.zones.retain(|(pool, zone), rec| {
            if rec.degraded.as_ref().is_some_and(|d| now >= d.until) {
                rec.degraded = None;
                cleared.push(ZoneChange::Cleared {
                    pool: pool.clone(),
                    zone: zone.clone(),
                });
            }
            while rec
                .losses
                .front()
                .is_some_and(|t| now.signed_duration_since(*t) >= window)
            {
                rec.losses.pop_front();
            }
            rec.degraded.is_some() || !rec.losses.is_empty()
        });
        cleared
    }

    /// The degraded zones of `pool`, by zone name.
    pub fn degraded_in(&self, pool: &str) -> Vec<&DegradedZone> {
        self.zones
            .iter()
            .filter(|((p, _), _)| p == pool)
            .filter_map(|(_, r)| r.degraded.as_ref())
            .collect()
    }

    /// Whether provisioning into `zone` of `pool` is paused.
    pub fn is_degraded(&self, pool: &str, zone: &str) -> bool {
        self.zones
            .get(&(pool.to_owned(), zone.to_owned()))
            .is_some_and(|r| r.degraded.is_some())
    }

    /// Losses recorded for `zone` of `pool` within the current window (as of the last record or
    /// tick).
    pub fn recent_losses(&self, pool: &str, zone: &str) -> u32 {
        self.zones
            .get(&(pool.to_owned(), zone.to_owned()))
            .map_or(0, |r| u32::try_from(r.losses.len()).unwrap_or(u32::MAX))
    }

    /// Every degraded zone.
    pub fn degraded(&self) -> impl Iterator<Item = &DegradedZone> {
        self.zones.values().filter_map(|r| r.degraded.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn t(s: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + s, 0)
            .single()
            .unwrap_or_default()
    }

    fn settings() -> ZoneBrakeSettings {
        ZoneBrakeSettings {
            lost_fraction: 0.5,
            window: TimeDelta::seconds(60),
            min_lost: 3,
        }
    }

    #[test]
    fn trips_table() {
        let s = settings();
        for (lost, live, want, why) in [
            (0, 0, false, "nothing lost"),
            (
                2,
                0,
                false,
                "fewer than min_lost, even if it is the whole zone",
            ),
            (3, 3, false, "exactly half is not more than half"),
            (3, 2, true, "more than half"),
            (10, 0, true, "the whole zone"),
            (3, 100, false, "a few nodes of a large zone"),
        ] {
            assert_eq!(trips(lost, live, &s), want, "{why}");
        }
    }

    #[test]
    fn a_zone_losing_most_of_its_nodes_at_once_is_degraded_and_clears_after_a_quiet_window() {
        let mut b = ZoneBrake::new(settings());
        // A zone of 5 nodes loses 4 within seconds.
        assert_eq!(b.record_loss("p", "z1", 4, t(0)), None);
        assert_eq!(b.record_loss("p", "z1", 3, t(1)), None);
        let Some(ZoneChange::Degraded(d)) = b.record_loss("p", "z1", 2, t(2)) else {
            panic!("three of five lost must trip");
        };
        assert_eq!((d.lost, d.had, d.until), (3, 5, t(62)));
        assert!(b.is_degraded("p", "z1"));
        assert!(!b.is_degraded("p", "z2"), "other zones are not held");
        assert!(
            !b.is_degraded("q", "z1"),
            "nor the same zone of another pool"
        );
        assert_eq!(b.record_loss("p", "z1", 1, t(30)), None, "already degraded");
        assert_eq!(b.recent_losses("p", "z1"), 4);
        assert_eq!(b.recent_losses("p", "z2"), 0);
        assert!(b.tick(t(89)).is_empty(), "the last loss was 59 s ago");
        assert_eq!(
            b.tick(t(90)),
            vec![ZoneChange::Cleared {
                pool: "p".into(),
                zone: "z1".into()
            }]
        );
        assert!(!b.is_degraded("p", "z1"));
        assert!(b.degraded().next().is_none());
    }

    #[test]
    fn losses_spread_wider_than_the_window_never_trip() {
        let mut b = ZoneBrake::new(settings());
        let mut live = 10u32;
        for i in 0..8 {
            live -= 1;
            assert_eq!(b.record_loss("p", "z", live, t(i * 61)), None);
        }
        assert!(!b.is_degraded("p", "z"));
    }

    proptest! {
        #[test]
        fn more_losses_never_untrip(lost in 0u32..50, live in 0u32..50, extra in 0u32..10,
                                    fraction in 0.05f64..1.0, min_lost in 1u32..5) {
            let s = ZoneBrakeSettings { lost_fraction: fraction, window: TimeDelta::seconds(60), min_lost };
            if trips(lost, live, &s) {
                prop_assert!(trips(lost + extra, live, &s));
                prop_assert!(lost >= min_lost);
            }
        }

        #[test]
        fn every_degraded_zone_clears_one_quiet_window_after_its_last_loss(
            losses in proptest::collection::vec((0u8..3, 0i64..20, 0u32..4), 1..60),
        ) {
            let mut b = ZoneBrake::new(settings());
            let mut now = 0i64;
            for (zone, gap, live) in losses {
                now += gap;
                b.record_loss("p", &format!("z{zone}"), live, t(now));
            }
            prop_assert!(b.degraded().all(|d| d.until <= t(now + 60)));
            b.tick(t(now + 60));
            prop_assert!(b.degraded().next().is_none());
            prop_assert!(b.zones.is_empty(), "nothing kept once quiet");
        }
    }
}
