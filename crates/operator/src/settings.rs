//! The settings controllers read, resolved from the validated config once at start-up.

use std::time::Duration;

use automanager_api as api;

use automanager_policy::calendar::Calendar;
use automanager_policy::node_health::FlapSettings;
use automanager_policy::zone_brake::ZoneBrakeSettings;

use crate::config::{BandConfig, BandsConfig, OperatorConfig};

/// What the controllers need from the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub pending_window: Duration,
    pub remove_stopped_nodes_after: Duration,
    pub bands: BandsConfig,
    /// The bands' disruption windows (`bands.<band>.disruptionWindows`), read once.
    pub band_calendars: BandCalendars,
    pub rejection_threshold: u32,
    pub rejection_window: Duration,
    pub status_write_interval: Duration,
    pub bundle_concurrency: u16,
    /// What this installation owns: its namespaces (`watchNamespaces`) and whether it does the
    /// cluster-scoped work (`clusterScope`). Every "is this ours?" asks it.
    pub scope: crate::scope::Scope,
    pub drain_parallelism: u16,
    /// The migration queue's limits (`migration.maxParallel`, `migration.maxParallelPerNode`).
    pub migration_limits: automanager_policy::migration_queue::Limits,
    pub migration_phase_timeout: Duration,
    /// The orphan sweep's period and grace; `None` when it is off.
    pub orphan_sweep: Option<(Duration, Duration)>,
    /// How a flapping node is kept out.
    pub flap: FlapSettings,
    /// The zone brake; `None` when it is off.
    pub zone_brake: Option<ZoneBrakeSettings>,
    /// CreateNode requests per pool per sliding minute.
    pub provision_per_minute: u32,
    /// Rebalancing Migrations per sliding minute, fleet-wide.
    pub rebalance_per_minute: u32,
    /// How long a drain or Migration may be held before the hold is escalated
    /// (`disruption.holdWarnAfter`).
    pub hold_warn_after: Duration,
}

/// Each band's disruption windows as a calendar.
#[derive(Debug, Clone, Default)]
pub struct BandCalendars {
    gold: Calendar,
    silver: Calendar,
    bronze: Calendar,
}

impl BandCalendars {
    /// Validation read every window already; a band whose windows could not be read (a
    /// settings value built in code) holds its voluntary moves, with a warning, rather than
    /// stopping the operator or dropping the protection.
    pub fn from_config(bands: &BandsConfig) -> Self {
        let read = |band: api::PriorityBand| {
            crate::config::band_calendar(&bands.get(band).disruption_windows).unwrap_or_else(|e| {
                tracing::warn!(band = band.as_str(), error = %e, "band disruption windows cannot be read: its voluntary moves are held");
                Calendar::unreadable(e.to_string())
            })
        };
        BandCalendars {
            gold: read(api::PriorityBand::Gold),
            silver: read(api::PriorityBand::Silver),
            bronze: read(api::PriorityBand::Bronze),
        }
    }

    /// The windows of `band`.
    pub fn get(&self, band: api::PriorityBand) -> &Calendar {
        match band {
            api::PriorityBand::Gold => &self.gold,
            api::PriorityBand::Silver => &self.silver,
            api::PriorityBand::Bronze => &self.bronze,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings::from_config(&OperatorConfig::default())
    }
}

impl Settings {
    pub fn from_config(c: &OperatorConfig) -> Self {
        Settings {
            pending_window: c.pending_window,
            remove_stopped_nodes_after: c.remove_stopped_nodes_after,
            bands: c.bands.clone(),
            band_calendars: BandCalendars::from_config(&c.bands),
            rejection_threshold: c.node_health.rejection_threshold,
            rejection_window: c.node_health.rejection_window,
            status_write_interval: c.status_write_interval,
            bundle_concurrency: c.concurrency.bundles.max(1),
            scope: crate::scope::Scope::new(c.watch_namespaces.clone(), c.cluster_scope),
            drain_parallelism: c.migration.drain_parallelism.max(1),
            migration_limits: automanager_policy::migration_queue::Limits {
                global: usize::from(c.migration.max_parallel.max(1)),
                per_node: usize::from(c.migration.max_parallel_per_node.max(1)),
            },
            migration_phase_timeout: c.migration.phase_timeout,
            orphan_sweep: c
                .orphan_sweep
                .enabled
                .then_some((c.orphan_sweep.interval, c.orphan_sweep.grace)),
            flap: FlapSettings {
                max_hold: c.node_health.flap_max_hold,
                memory: c.node_health.flap_memory,
            },
            zone_brake: c.zone_brake.enabled.then(|| ZoneBrakeSettings {
                lost_fraction: f64::from(c.zone_brake.lost_percent.clamp(1, 100)) / 100.0,
                window: chrono::TimeDelta::from_std(c.zone_brake.window)
                    .unwrap_or(chrono::TimeDelta::minutes(5)),
                min_lost: c.zone_brake.min_lost_nodes.max(1),
            }),
            provision_per_minute: c.provisioning.per_pool_per_minute.max(1),
            rebalance_per_minute: c.rebalance.max_per_minute.max(1),
            hold_warn_after: c.disruption.hold_warn_after,
        }
    }

    /// The policy for `band`, with a bundle's overrides applied. Its `restart_clear_after` is
    /// how long a restarted replica must stay Running before its restart count is cleared
    /// (`bands.<band>.restartClearAfter`; a bundle does not override it).
    pub fn band(
        &self,
        band: api::PriorityBand,
        overrides: Option<&api::BandOverrides>,
    ) -> BandConfig {
        self.bands.effective(band, overrides)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_override_replaces_only_the_fields_it_sets() {
        let s = Settings::default();
        let o = api::BandOverrides {
            gold: Some(api::BandPolicy {
                max_restarts_per_hour: Some(2),
                ..Default::default()
            }),
            ..Default::default()
        };
        let gold = s.band(api::PriorityBand::Gold, Some(&o));
        assert_eq!(gold.max_restarts_per_hour, 2);
        assert_eq!(gold.on_failure, api::OnFailure::Restart);
        assert_eq!(
            gold.restart_placement,
            api::RestartPlacement::PreferHotSpare
        );
        assert_eq!(
            s.band(api::PriorityBand::Bronze, Some(&o)).on_failure,
            api::OnFailure::Drop
        );
        assert_eq!(gold.restart_clear_after, Duration::from_secs(600));
    }
}
