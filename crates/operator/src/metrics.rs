//! The operator's Prometheus metrics, served as OpenMetrics text on `/metrics`.
//!
//! One [`Metrics`] value is created at start-up and cloned into every controller (clones share
//! the same counters). The metric names are the ones docs/operator.md lists; prometheus-client appends
//! `_total` to counters when encoding, so counters are registered without it.
//!
//! Names follow Prometheus's conventions: base units in the name (`_seconds`), `_ratio` for a
//! fraction from 0 to 1, `_total` for counters, one name per idea. Labels that name a Bundle's
//! or a Migration's namespace are `bundle_namespace` and `migration_namespace`, because
//! `namespace` is the label Prometheus gives every series of a target (the operator's own
//! namespace, one per Helm release), which the alerts group by.
//!
//! Choices made here:
//! - `automanager_manager_connection_state{state}` is one-hot: one series per state of the
//!   TypeScript library's vocabulary (`idle`, `connecting`, `ready`, `transientFailure`, `shutdown`), the
//!   current one at 1 and the others at 0. Alerting is then `..{state="ready"} == 0`. A state
//!   name outside the vocabulary is shown as `unknown` so the label set stays bounded.
//! - `automanager_reconcile_duration_seconds{controller, result}` has `result` `ok` or `error`
//!   and buckets from 1 ms doubling to about 32 s.
//! - Per-pool gauges carry the label `pool`; [`Metrics::remove_pool`] drops a deleted pool's
//!   series so they do not linger. `automanager_pool_max_nodes{pool}` is the most nodes the pool
//!   may hold: an elastic pool's `maxNodes`, a fixed pool's node count (it adds none); an
//!   elastic pool without `maxNodes` has no series. With `automanager_pool_nodes` and
//!   `automanager_pool_used_capacity_ratio` it says when a pool is full and cannot grow.
//! - `automanager_migrations{phase}` counts Migration objects per phase (final phases stay
//!   counted while their objects exist); `automanager_migration_phase_start_time_seconds
//!   {migration_namespace, migration, phase}` exists only for migrations not yet in a final phase and
//!   holds when their current phase began, so an alert can say which one is stuck. Both come
//!   from [`Metrics::observe_migration`] / [`Metrics::forget_migration`].
//! - Spares have one name: `automanager_spares{hotsparetarget, pool, tier, state}`, per tier
//!   (`hot`, `warm`) the spares `ready` (hot: running and empty; warm: stopped), `pending` (on
//!   their way) and the `target` in effect (a schedule's while it applies). Everything else
//!   about spares is arithmetic on it, so it is not exported again under other names: a pool's
//!   figures are `sum by (pool)`, the shortfall is `target` minus `ready`, and a target is in
//!   underflow (its `SpareUnderflow` condition) exactly when hot `ready` < hot `target`. Five
//!   names used to overlap here (per pool live spares, spare target and shortfall, and a
//!   per-target underflow flag, beside this one), and the per-pool target was the targets'
//!   base counts, not the schedules in effect.
//! - `automanager_warm_spare_starts{pool, result}` counts the operator's asks to start a warm
//!   (stopped) spare, `result` `started` or `refused` (Manager's final no).
//! - `automanager_leader` is 1 while this replica holds the leader lease.
//! - `automanager_build_info{version, revision, rustc}` is 1: the running version, the source
//!   revision it was built from and the compiler as labels, and the series whose absence says a
//!   release's operator is gone.
//! - The `process_*` metrics (CPU, memory, file descriptors, threads) are read from `/proc` at
//!   each scrape ([`crate::process_metrics`]), unprefixed as every client library names them.
//! - Broken bundles, three ideas under three names: `automanager_broken_bundles` is how many
//!   are Broken now, `automanager_broken_bundle_info{bundle_namespace, bundle}` is 1 for each of
//!   them (the TypeScript library's `brokenBundleIds`), and `automanager_bundle_breaks_total`
//!   counts how often a bundle was marked Broken.
//! - `automanager_held_moves{kind, reason}` is how many voluntary moves (`kind` `drain` or
//!   `migration`) are held now past the operator's `disruption.holdWarnAfter`, by what holds
//!   them (`reason` `BrokenBundle`, `DisruptionBudget`, `DisruptionWindow`); every combination
//!   is exported from start-up, at 0 when none, and a `whenHeld: Proceed` drain that went ahead
//!   no longer counts. Holds shorter than the bound are in the objects' `status.held`.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The connection states the one-hot gauge knows (the TypeScript library's spelling), plus `unknown`.
pub const CONNECTION_STATES: [&str; 6] = [
    "idle",
    "connecting",
    "ready",
    "transientFailure",
    "shutdown",
    "unknown",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabels {
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ZoneLabels {
    pool: String,
    zone: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ActionLabels {
    action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HeldLabels {
    kind: String,
    reason: String,
}

/// The `kind` and `reason` label values of `automanager_held_moves`.
pub const HELD_KINDS: [&str; 2] = ["drain", "migration"];
pub const HELD_REASONS: [&str; 3] = ["BrokenBundle", "DisruptionBudget", "DisruptionWindow"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BandLabels {
    band: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CauseLabels {
    cause: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MigrationLabels {
    migration_namespace: String,
    migration: String,
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BundleLabels {
    bundle_namespace: String,
    bundle: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpareLabels {
    hotsparetarget: String,
    pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StartLabels {
    pool: String,
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpareTierLabels {
    hotsparetarget: String,
    pool: String,
    tier: &'static str,
    state: &'static str,
}

/// One tier's figures for [`Metrics::set_spare_tier`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierFigures {
    pub ready: u32,
    pub pending: u32,
    pub target: u32,
}

/// What the migration gauges were last told about one Migration.
#[derive(Clone, Debug, PartialEq)]
struct MigrationSeen {
    phase: String,
    /// When the current phase began, while the migration is not in a final phase.
    active_since: Option<f64>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    revision: String,
    rustc: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: String,
    result: String,
}

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

struct Inner {
    registry: Registry,
    placements_attempted: Counter,
    placements_succeeded: Counter,
    placements_failed: Counter,
    jobs_rejected: Counter,
    bundles_broken: Counter,
    jobs_dropped: Counter,
    pool_nodes: Family<PoolLabels, Gauge>,
    pool_max_nodes: Family<PoolLabels, Gauge>,
    pool_used_capacity_ratio: Family<PoolLabels, Gauge<f64, AtomicU64>>,
    broken_bundles: Gauge,
    connection_state: Family<StateLabels, Gauge>,
    reconcile_duration: Family<ReconcileLabels, Histogram, fn() -> Histogram>,
    migrations: Family<PhaseLabels, Gauge>,
    migration_phase_start: Family<MigrationLabels, Gauge<f64, AtomicU64>>,
    migrations_seen: Mutex<HashMap<(String, String), MigrationSeen>>,
    spare_seen: Mutex<HashSet<SpareLabels>>,
    spares: Family<SpareTierLabels, Gauge>,
    warm_spare_starts: Family<StartLabels, Counter>,
    leader: Gauge,
    bundle_broken: Family<BundleLabels, Gauge>,
    orphans_removed: Family<KindLabels, Counter>,
    disruptions_blocked: Family<ActionLabels, Counter>,
    involuntary_disruptions: Family<CauseLabels, Counter>,
    preemptions: Family<BandLabels, Counter>,
    jobs_preempted: Counter,
    rebalances: Counter,
    migrations_queued: Gauge,
    held_moves: Family<HeldLabels, Gauge>,
    zone_degraded: Family<ZoneLabels, Gauge>,
    consolidation_terminated: Family<PoolLabels, Counter>,
    consolidation_abandoned: Family<PoolLabels, Counter>,
    consolidation_planned: Family<PoolLabels, Gauge>,
    history_queued: Gauge,
    history_write_failures: Counter,
    // The start time and build info live only in the registry: they are set once, at registration.
}

impl Inner {
    /// Every metric, none registered yet. The held-moves series exist at 0 from the start, so
    /// an alert on them reads 0 rather than no data.
    fn unregistered() -> Self {
        let held_moves = Family::<HeldLabels, Gauge>::default();
        for kind in HELD_KINDS {
            for reason in HELD_REASONS {
                held_moves
                    .get_or_create(&HeldLabels {
                        kind: kind.into(),
                        reason: reason.into(),
                    })
                    .set(0);
            }
        }
        Inner {
            registry: Registry::default(),
            placements_attempted: Default::default(),
            placements_succeeded: Default::default(),
            placements_failed: Default::default(),
            jobs_rejected: Default::default(),
            bundles_broken: Default::default(),
            jobs_dropped: Default::default(),
            pool_nodes: Default::default(),
            pool_max_nodes: Default::default(),
            pool_used_capacity_ratio: Default::default(),
            broken_bundles: Default::default(),
            connection_state: Default::default(),
            reconcile_duration: Family::new_with_constructor(reconcile_histogram),
            migrations: Default::default(),
            migration_phase_start: Default::default(),
            migrations_seen: Mutex::new(HashMap::new()),
            spare_seen: Mutex::new(HashSet::new()),
            spares: Default::default(),
            warm_spare_starts: Default::default(),
            leader: Default::default(),
            bundle_broken: Default::default(),
            orphans_removed: Default::default(),
            disruptions_blocked: Default::default(),
            involuntary_disruptions: Default::default(),
            preemptions: Default::default(),
            jobs_preempted: Default::default(),
            rebalances: Default::default(),
            migrations_queued: Default::default(),
            held_moves,
            zone_degraded: Default::default(),
            consolidation_terminated: Default::default(),
            consolidation_abandoned: Default::default(),
            consolidation_planned: Default::default(),
            history_queued: Default::default(),
            history_write_failures: Default::default(),
        }
    }
}

/// Registers the metrics of bundles, placements, restarts and drops, and the reconcilers' own timing.
fn register_bundles(r: &mut Registry, m: &Inner) {
    r.register(
        "automanager_placement_history_queued",
        "Bundles whose PlacementHistory write waits or is in flight (written off the Bundle's path, after the Bundles' own writes)",
        m.history_queued.clone(),
    );
    r.register(
        "automanager_placement_history_write_failures",
        "PlacementHistory writes that failed (each is tried again after a back-off, a few times; a write the lease fence refused is not counted)",
        m.history_write_failures.clone(),
    );
    r.register(
        "automanager_placements_attempted",
        "Placement decisions attempted for a replica",
        m.placements_attempted.clone(),
    );
    r.register(
        "automanager_placements_succeeded",
        "Placement decisions whose jobs were all started",
        m.placements_succeeded.clone(),
    );
    r.register(
        "automanager_placements_failed",
        "Placement decisions that found no node or whose start failed",
        m.placements_failed.clone(),
    );
    r.register(
        "automanager_jobs_rejected",
        "Job starts a node refused",
        m.jobs_rejected.clone(),
    );
    r.register(
        "automanager_bundle_breaks",
        "Times a bundle was marked Broken after exceeding maxRestartsPerHour",
        m.bundles_broken.clone(),
    );
    r.register(
        "automanager_jobs_dropped",
        "Jobs dropped after a failure because their band drops (bronze)",
        m.jobs_dropped.clone(),
    );
    r.register(
        "automanager_broken_bundles",
        "Bundles Broken now (automanager_broken_bundle_info names them)",
        m.broken_bundles.clone(),
    );
    r.register(
        "automanager_broken_bundle_info",
        "1 for each Bundle that is Broken, by bundle_namespace and bundle (the TypeScript library's brokenBundleIds); the series goes when it is retried or deleted",
        m.bundle_broken.clone(),
    );
    r.register(
        "automanager_preemptions",
        "Recoveries that stopped bronze jobs on one node to make room (bands.<band>.preempt), by the recovering band",
        m.preemptions.clone(),
    );
    r.register(
        "automanager_jobs_preempted",
        "Bronze jobs stopped (and dropped) to make room for a gold or silver recovery",
        m.jobs_preempted.clone(),
    );
    r.register(
        "automanager_involuntary_disruptions",
        "Replicas taken down by failures the budget does not block, by cause (jobFailed, nodeLost)",
        m.involuntary_disruptions.clone(),
    );
    r.register(
        "automanager_reconcile_duration_seconds",
        "Duration of one reconcile, by controller and result (ok or error)",
        m.reconcile_duration.clone(),
    );
}

/// Registers the metrics of pools, spares, zones, consolidation and the orphan sweep.
fn register_fleet(r: &mut Registry, m: &Inner) {
    r.register(
        "automanager_pool_nodes",
        "Nodes in the placement pool",
        m.pool_nodes.clone(),
    );
    r.register(
        "automanager_pool_max_nodes",
        "The most nodes the placement pool may hold: an elastic pool's maxNodes, a fixed pool's node count; no series for an elastic pool without maxNodes",
        m.pool_max_nodes.clone(),
    );
    r.register(
        "automanager_pool_used_capacity_ratio",
        "The placement pool's capacity in use, from 0 to 1",
        m.pool_used_capacity_ratio.clone(),
    );
    r.register(
        "automanager_spares",
        "A HotSpareTarget's spares per tier (hot, warm) and state: ready (hot: running and empty; warm: stopped), pending (on their way) and the target in effect",
        m.spares.clone(),
    );
    r.register(
        "automanager_warm_spare_starts",
        "Asks to start a warm (stopped) spare, by pool and result (started, or refused by Manager)",
        m.warm_spare_starts.clone(),
    );
    r.register(
        "automanager_zone_degraded",
        "1 for each zone of a pool the zone brake holds (it lost more than the configured fraction of its nodes within the window): no node is provisioned into it; the series goes when it recovers",
        m.zone_degraded.clone(),
    );
    r.register(
        "automanager_consolidation_nodes_terminated",
        "Nodes consolidation emptied and terminated, by pool",
        m.consolidation_terminated.clone(),
    );
    r.register(
        "automanager_consolidation_nodes_abandoned",
        "Nodes consolidation began to empty and gave up on (a move failed, or a job landed there), by pool",
        m.consolidation_abandoned.clone(),
    );
    r.register(
        "automanager_consolidation_planned_nodes",
        "Nodes the pool's last consolidation plan would empty (dryRun and enabled), by pool",
        m.consolidation_planned.clone(),
    );
    r.register(
        "automanager_orphans_removed",
        "Manager bundles and nodes the orphan sweep removed because their custom resource was gone, by kind (bundle, node)",
        m.orphans_removed.clone(),
    );
}

/// Registers the metrics of Migrations and drains, and what holds them.
fn register_moves(r: &mut Registry, m: &Inner) {
    r.register(
        "automanager_migrations",
        "Migration objects by phase (final phases stay counted while the objects exist)",
        m.migrations.clone(),
    );
    r.register(
        "automanager_migration_phase_start_time_seconds",
        "When a migration not yet in a final phase entered its current phase (Unix seconds)",
        m.migration_phase_start.clone(),
    );
    r.register(
        "automanager_migrations_queued",
        "Migrations waiting in Pending for the migration queue (parallelism limits or a disruption budget)",
        m.migrations_queued.clone(),
    );
    r.register(
        "automanager_held_moves",
        "Drains and Migrations (kind) held past disruption.holdWarnAfter now, by what holds them (reason: BrokenBundle, DisruptionBudget, DisruptionWindow)",
        m.held_moves.clone(),
    );
    r.register(
        "automanager_disruptions_blocked",
        "Voluntary actions that waited for a bundle's disruption budget or its closed disruption windows, by action (migration, drain, spareRotation); counted once per action and blocking bundle",
        m.disruptions_blocked.clone(),
    );
    r.register(
        "automanager_rebalances",
        "Migrations the rebalancer created to move a bundle back to where its soft rules hold",
        m.rebalances.clone(),
    );
}

/// Registers the connection, leadership, start time, build and process metrics.
fn register_process(r: &mut Registry, m: &Inner) {
    r.register(
        "automanager_manager_connection_state",
        "Connection to Manager, one-hot by state (1 = current state)",
        m.connection_state.clone(),
    );
    r.register(
        "automanager_leader",
        "1 while this operator replica holds the leader lease, else 0",
        m.leader.clone(),
    );
    let start_time_seconds = Gauge::<f64, AtomicU64>::default();
    start_time_seconds.set(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
    );
    r.register(
        "automanager_start_time_seconds",
        "When this operator process started, in seconds since the Unix epoch (the TypeScript library's startedAt)",
        start_time_seconds,
    );
    let build_info = Family::<BuildLabels, Gauge>::default();
    build_info
        .get_or_create(&BuildLabels {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            revision: env!("AUTOMANAGER_REVISION").to_owned(),
            rustc: env!("AUTOMANAGER_RUSTC").to_owned(),
        })
        .set(1);
    r.register(
        "automanager_build_info",
        "1, with the operator's version, source revision and compiler as labels",
        build_info,
    );
    r.register_collector(Box::new(crate::process_metrics::ProcessCollector));
}

/// The operator's metrics. Cheap to clone; clones share one registry.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered (connection state starts at `idle`).
    pub fn new() -> Self {
        let mut inner = Inner::unregistered();
        let mut registry = Registry::default();
        register_bundles(&mut registry, &inner);
        register_fleet(&mut registry, &inner);
        register_moves(&mut registry, &inner);
        register_process(&mut registry, &inner);
        inner.registry = registry;
        let metrics = Metrics {
            inner: Arc::new(inner),
        };
        metrics.set_connection_state("idle");
        metrics
    }

    /// A placement decision was attempted.
    pub fn placement_attempted(&self) {
        self.inner.placements_attempted.inc();
    }

    /// A placement decision succeeded (its jobs were started).
    pub fn placement_succeeded(&self) {
        self.inner.placements_succeeded.inc();
    }

    /// A placement decision failed.
    pub fn placement_failed(&self) {
        self.inner.placements_failed.inc();
    }

    /// A node refused a job start.
    pub fn job_rejected(&self) {
        self.inner.jobs_rejected.inc();
    }

    /// A bundle was marked Broken.
    pub fn bundle_broken(&self) {
        self.inner.bundles_broken.inc();
    }

    /// The orphan sweep removed one `kind` (`bundle` or `node`) from Manager.
    pub fn orphan_removed(&self, kind: &str) {
        self.inner
            .orphans_removed
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    /// A voluntary `action` waited for a disruption budget.
    pub fn disruption_blocked(&self, action: &str) {
        self.inner
            .disruptions_blocked
            .get_or_create(&ActionLabels {
                action: action.into(),
            })
            .inc();
    }

    /// A failure (not a voluntary action) took a replica down: `cause` is `jobFailed` or
    /// `nodeLost`.
    pub fn involuntary_disruption(&self, cause: &str) {
        self.inner
            .involuntary_disruptions
            .get_or_create(&CauseLabels {
                cause: cause.into(),
            })
            .inc();
    }

    /// Bundles whose PlacementHistory write waits or is in flight.
    pub fn set_history_queued(&self, count: usize) {
        self.inner
            .history_queued
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// A PlacementHistory write failed.
    pub fn history_write_failed(&self) {
        self.inner.history_write_failures.inc();
    }

    /// Migrations waiting in the queue after its last pass.
    pub fn set_migrations_queued(&self, count: usize) {
        self.inner
            .migrations_queued
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// How many moves of each kind are held past the bound now, by reason: `(kind, reason,
    /// count)` for every combination.
    pub fn set_held_moves<'a>(&self, counts: impl IntoIterator<Item = (&'a str, &'a str, usize)>) {
        for (kind, reason, count) in counts {
            self.inner
                .held_moves
                .get_or_create(&HeldLabels {
                    kind: kind.into(),
                    reason: reason.into(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// A job was dropped by its band.
    /// A recovery of `band` stopped `victims` bronze jobs to make room.
    pub fn preempted(&self, band: &str, victims: usize) {
        self.inner
            .preemptions
            .get_or_create(&BandLabels { band: band.into() })
            .inc();
        self.inner
            .jobs_preempted
            .inc_by(u64::try_from(victims).unwrap_or(u64::MAX));
    }

    /// The rebalancer created a Migration.
    pub fn rebalance_started(&self) {
        self.inner.rebalances.inc();
    }

    pub fn job_dropped(&self) {
        self.inner.jobs_dropped.inc();
    }

    /// How many bundles are Broken right now.
    pub fn set_broken_bundles(&self, count: i64) {
        self.inner.broken_bundles.set(count);
    }

    /// Whether the Bundle `namespace/bundle` is Broken (its labelled series exists only while it is).
    pub fn set_bundle_broken(&self, namespace: &str, bundle: &str, broken: bool) {
        let labels = BundleLabels {
            bundle_namespace: namespace.to_owned(),
            bundle: bundle.to_owned(),
        };
        if broken {
            self.inner.bundle_broken.get_or_create(&labels).set(1);
        } else {
            self.inner.bundle_broken.remove(&labels);
        }
    }

    /// Whether the zone brake holds `zone` of `pool`.
    pub fn zone_degraded(&self, pool: &str, zone: &str, degraded: bool) {
        let labels = ZoneLabels {
            pool: pool.to_owned(),
            zone: zone.to_owned(),
        };
        if degraded {
            self.inner.zone_degraded.get_or_create(&labels).set(1);
        } else {
            self.inner.zone_degraded.remove(&labels);
        }
    }

    /// Consolidation terminated a node of `pool`.
    pub fn consolidation_terminated(&self, pool: &str) {
        self.inner
            .consolidation_terminated
            .get_or_create(&PoolLabels {
                pool: pool.to_owned(),
            })
            .inc();
    }

    /// Consolidation gave up emptying a node of `pool`.
    pub fn consolidation_abandoned(&self, pool: &str) {
        self.inner
            .consolidation_abandoned
            .get_or_create(&PoolLabels {
                pool: pool.to_owned(),
            })
            .inc();
    }

    /// How many nodes the last consolidation plan of `pool` would empty; `None` (mode off)
    /// drops the series.
    pub fn set_consolidation_planned(&self, pool: &str, planned: Option<i64>) {
        let labels = PoolLabels {
            pool: pool.to_owned(),
        };
        match planned {
            Some(n) => {
                self.inner
                    .consolidation_planned
                    .get_or_create(&labels)
                    .set(n);
            }
            None => {
                self.inner.consolidation_planned.remove(&labels);
            }
        }
    }

    /// One pool's gauges: its node count, the most nodes it may hold (`None`: no bound, no
    /// series) and the fraction of its capacity in use. A non-finite fraction is recorded as 0.
    pub fn set_pool(&self, pool: &str, nodes: i64, max_nodes: Option<i64>, used_fraction: f64) {
        let labels = PoolLabels {
            pool: pool.to_owned(),
        };
        self.inner.pool_nodes.get_or_create(&labels).set(nodes);
        match max_nodes {
            Some(m) => {
                self.inner.pool_max_nodes.get_or_create(&labels).set(m);
            }
            None => {
                self.inner.pool_max_nodes.remove(&labels);
            }
        }
        let fraction = if used_fraction.is_finite() {
            used_fraction
        } else {
            0.0
        };
        self.inner
            .pool_used_capacity_ratio
            .get_or_create(&labels)
            .set(fraction);
    }

    /// Drops a pool's series (the pool was deleted).
    pub fn remove_pool(&self, pool: &str) {
        let labels = PoolLabels {
            pool: pool.to_owned(),
        };
        self.inner.pool_nodes.remove(&labels);
        self.inner.pool_max_nodes.remove(&labels);
        self.inner.pool_used_capacity_ratio.remove(&labels);
        self.inner.consolidation_planned.remove(&labels);
    }

    /// Records one reconcile of `controller` (e.g. `bundle`) that took `seconds`.
    pub fn observe_reconcile(&self, controller: &str, ok: bool, seconds: f64) {
        let labels = ReconcileLabels {
            controller: controller.to_owned(),
            result: if ok { "ok" } else { "error" }.to_owned(),
        };
        let seconds = if seconds.is_finite() && seconds >= 0.0 {
            seconds
        } else {
            0.0
        };
        self.inner
            .reconcile_duration
            .get_or_create(&labels)
            .observe(seconds);
    }

    /// Sets the one-hot connection state (`ManagerClient`'s `ConnectionState::as_str`).
    pub fn set_connection_state(&self, state: &str) {
        let current = if CONNECTION_STATES.contains(&state) {
            state
        } else {
            "unknown"
        };
        for s in CONNECTION_STATES {
            let value = i64::from(s == current);
            self.inner
                .connection_state
                .get_or_create(&StateLabels {
                    state: s.to_owned(),
                })
                .set(value);
        }
    }

    /// Whether this replica holds the leader lease.
    pub fn set_leader(&self, leader: bool) {
        self.inner.leader.set(i64::from(leader));
    }

    /// A Migration was seen in `phase`; `active_since` is when that phase began (Unix seconds)
    /// when the phase is not final, `None` when it is.
    pub fn observe_migration(
        &self,
        namespace: &str,
        name: &str,
        phase: &str,
        active_since: Option<f64>,
    ) {
        let seen = MigrationSeen {
            phase: phase.to_owned(),
            active_since: active_since.filter(|t| t.is_finite()),
        };
        let key = (namespace.to_owned(), name.to_owned());
        let mut all = self
            .inner
            .migrations_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let before = all.insert(key.clone(), seen.clone());
        self.migration_changed(&all, &key, before.as_ref(), Some(&seen));
    }

    /// A Migration is gone: its series go with it.
    pub fn forget_migration(&self, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        let mut all = self
            .inner
            .migrations_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let before = all.remove(&key);
        self.migration_changed(&all, &key, before.as_ref(), None);
    }

    fn migration_changed(
        &self,
        all: &HashMap<(String, String), MigrationSeen>,
        key: &(String, String),
        before: Option<&MigrationSeen>,
        after: Option<&MigrationSeen>,
    ) {
        if before == after {
            return;
        }
        let labels = |seen: &MigrationSeen| MigrationLabels {
            migration_namespace: key.0.clone(),
            migration: key.1.clone(),
            phase: seen.phase.clone(),
        };
        if let Some(b) = before {
            self.inner.migration_phase_start.remove(&labels(b));
        }
        if let Some(a) = after
            && let Some(t) = a.active_since
        {
            self.inner
                .migration_phase_start
                .get_or_create(&labels(a))
                .set(t);
        }
        let phases: HashSet<&str> = before
            .into_iter()
            .chain(after)
            .map(|s| s.phase.as_str())
            .collect();
        for phase in phases {
            let count = all.values().filter(|s| s.phase == phase).count();
            self.inner
                .migrations
                .get_or_create(&PhaseLabels {
                    phase: phase.to_owned(),
                })
                .set(i64::try_from(count).unwrap_or(i64::MAX));
        }
    }

    /// The operator asked Manager to start a warm spare of `pool`; `started` is false when
    /// Manager refused for good.
    pub fn warm_spare_start(&self, pool: &str, started: bool) {
        self.inner
            .warm_spare_starts
            .get_or_create(&StartLabels {
                pool: pool.to_owned(),
                result: if started { "started" } else { "refused" },
            })
            .inc();
    }

    /// Sets a HotSpareTarget's figures for one tier (`hot` or `warm`).
    pub fn set_spare_tier(&self, target: &str, pool: &str, tier: &'static str, f: TierFigures) {
        for (state, value) in [
            ("ready", f.ready),
            ("pending", f.pending),
            ("target", f.target),
        ] {
            self.inner
                .spares
                .get_or_create(&SpareTierLabels {
                    hotsparetarget: target.to_owned(),
                    pool: pool.to_owned(),
                    tier,
                    state,
                })
                .set(i64::from(value));
        }
        self.inner
            .spare_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(SpareLabels {
                hotsparetarget: target.to_owned(),
                pool: pool.to_owned(),
            });
    }

    /// Drops the spare series of every HotSpareTarget not in `existing` (deleted ones).
    pub fn retain_spare_targets(&self, existing: &[(String, String)]) {
        let keep: HashSet<SpareLabels> = existing
            .iter()
            .map(|(t, p)| SpareLabels {
                hotsparetarget: t.clone(),
                pool: p.clone(),
            })
            .collect();
        let mut seen = self
            .inner
            .spare_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        seen.retain(|l| {
            let kept = keep.contains(l);
            if !kept {
                for tier in ["hot", "warm"] {
                    for state in ["ready", "pending", "target"] {
                        self.inner.spares.remove(&SpareTierLabels {
                            hotsparetarget: l.hotsparetarget.clone(),
                            pool: l.pool.clone(),
                            tier,
                            state,
                        });
                    }
                }
            }
            kept
        });
    }

    /// Everything in OpenMetrics text format (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an error would only come from a label encoder,
        // and ours are plain strings.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.inner.registry) {
            tracing::error!(error = %e, "encoding metrics failed");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NAMES: [&str; 31] = [
        "automanager_placement_history_queued",
        "automanager_placement_history_write_failures_total",
        "automanager_held_moves",
        "automanager_preemptions_total",
        "automanager_jobs_preempted_total",
        "automanager_rebalances_total",
        "automanager_orphans_removed_total",
        "automanager_disruptions_blocked_total",
        "automanager_involuntary_disruptions_total",
        "automanager_migrations_queued",
        "automanager_placements_attempted_total",
        "automanager_placements_succeeded_total",
        "automanager_placements_failed_total",
        "automanager_jobs_rejected_total",
        "automanager_bundle_breaks_total",
        "automanager_jobs_dropped_total",
        "automanager_pool_nodes",
        "automanager_pool_max_nodes",
        "automanager_pool_used_capacity_ratio",
        "automanager_broken_bundles",
        "automanager_manager_connection_state",
        "automanager_reconcile_duration_seconds_bucket",
        "automanager_reconcile_duration_seconds_count",
        "automanager_migrations",
        "automanager_migration_phase_start_time_seconds",
        "automanager_spares",
        "automanager_warm_spare_starts_total",
        "automanager_leader",
        "automanager_broken_bundle_info",
        "automanager_start_time_seconds",
        "automanager_build_info",
    ];

    #[test]
    fn encoding_contains_every_metric_name() {
        let m = Metrics::new();
        m.set_pool("aws", 3, Some(4), 0.5);
        m.observe_reconcile("bundle", true, 0.01);
        m.observe_migration("ns", "m", "Pending", Some(1.0));
        m.set_spare_tier("t", "aws", "hot", TierFigures::default());
        m.warm_spare_start("aws", false);
        m.set_bundle_broken("ns", "b", true);
        m.orphan_removed("node");
        m.disruption_blocked("migration");
        m.involuntary_disruption("nodeLost");
        m.set_migrations_queued(2);
        m.set_history_queued(3);
        m.history_write_failed();
        m.preempted("gold", 2);
        m.rebalance_started();
        let text = m.encode();
        for name in NAMES {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        assert!(text.trim_end().ends_with("# EOF"));
        assert!(text.contains("automanager_disruptions_blocked_total{action=\"migration\"} 1"));
        assert!(text.contains("automanager_involuntary_disruptions_total{cause=\"nodeLost\"} 1"));
        assert!(text.contains("automanager_migrations_queued 2"));
        assert!(text.contains("automanager_placement_history_queued 3"));
        assert!(text.contains("automanager_placement_history_write_failures_total 1"));
        assert!(text.contains("automanager_held_moves{kind=\"drain\",reason=\"BrokenBundle\"} 0"));
        m.set_held_moves([("migration", "DisruptionWindow", 3)]);
        assert!(
            m.encode().contains(
                "automanager_held_moves{kind=\"migration\",reason=\"DisruptionWindow\"} 3"
            )
        );
        assert!(text.contains("automanager_preemptions_total{band=\"gold\"} 1"));
        assert!(text.contains("automanager_jobs_preempted_total 2"));
        assert!(text.contains("automanager_rebalances_total 1"));
    }

    #[test]
    fn broken_bundles_are_listed_by_id_until_they_recover() {
        let m = Metrics::new();
        m.set_bundle_broken("media", "news", true);
        assert!(m.encode().contains(
            "automanager_broken_bundle_info{bundle_namespace=\"media\",bundle=\"news\"} 1"
        ));
        m.set_bundle_broken("media", "news", false);
        assert!(!m.encode().contains("bundle=\"news\""));
    }

    #[test]
    fn the_start_time_and_the_build_are_exported() {
        let text = Metrics::new().encode();
        let start: f64 = text
            .lines()
            .find(|l| l.starts_with("automanager_start_time_seconds "))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0);
        assert!(start > 1.7e9, "{text}");
        assert!(text.contains(&format!(
            "automanager_build_info{{version=\"{}\",revision=\"{}\",rustc=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            env!("AUTOMANAGER_REVISION"),
            env!("AUTOMANAGER_RUSTC")
        )));
        assert!(env!("AUTOMANAGER_RUSTC").starts_with("rustc "), "{text}");
    }

    #[test]
    fn every_name_follows_the_conventions() {
        let m = Metrics::new();
        m.set_pool("p", 1, None, 0.5);
        let text = m.encode();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut words = line.split_whitespace().skip(2);
            let (name, kind) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
            // The process_* metrics keep the names every client library gives them.
            assert!(
                name.starts_with("automanager_") || name.starts_with("process_"),
                "{line}"
            );
            assert!(
                !name.contains("fraction") && !name.contains("percent"),
                "{line}: a fraction is _ratio"
            );
            assert!(
                !name.ends_with("_ms") && !name.contains("milliseconds"),
                "{line}: seconds"
            );
            if kind == "counter" {
                assert!(
                    !name.ends_with("_total"),
                    "{line}: prometheus-client appends _total"
                );
            }
        }
    }

    #[test]
    fn counters_count_and_clones_share_them() {
        let m = Metrics::new();
        let c = m.clone();
        m.placement_attempted();
        c.placement_attempted();
        m.placement_succeeded();
        m.placement_failed();
        m.job_rejected();
        m.bundle_broken();
        m.job_dropped();
        m.set_broken_bundles(4);
        let text = c.encode();
        assert!(text.contains("automanager_placements_attempted_total 2"));
        assert!(text.contains("automanager_placements_succeeded_total 1"));
        assert!(text.contains("automanager_placements_failed_total 1"));
        assert!(text.contains("automanager_jobs_rejected_total 1"));
        assert!(text.contains("automanager_bundle_breaks_total 1"));
        assert!(text.contains("automanager_jobs_dropped_total 1"));
        assert!(text.contains("automanager_broken_bundles 4"));
    }

    #[test]
    fn pool_gauges_carry_the_pool_label_and_are_removed_with_the_pool() {
        let m = Metrics::new();
        m.set_pool("aws-east", 5, Some(8), 0.25);
        let text = m.encode();
        assert!(text.contains("automanager_pool_nodes{pool=\"aws-east\"} 5"));
        assert!(text.contains("automanager_pool_max_nodes{pool=\"aws-east\"} 8"));
        assert!(text.contains("automanager_pool_used_capacity_ratio{pool=\"aws-east\"} 0.25"));
        // maxNodes removed from the spec: the bound's series goes, the others stay.
        m.set_pool("aws-east", 5, None, 0.25);
        let text = m.encode();
        assert!(!text.contains("automanager_pool_max_nodes{"), "{text}");
        assert!(text.contains("automanager_pool_nodes{pool=\"aws-east\"} 5"));
        m.set_pool("aws-east", 5, Some(8), 0.25);
        m.remove_pool("aws-east");
        assert!(!m.encode().contains("aws-east"));
    }

    #[test]
    fn a_non_finite_fraction_is_recorded_as_zero() {
        let m = Metrics::new();
        m.set_pool("p", 0, None, f64::NAN);
        assert!(
            m.encode()
                .contains("automanager_pool_used_capacity_ratio{pool=\"p\"} 0.0")
        );
    }

    #[test]
    fn connection_state_is_one_hot() {
        let m = Metrics::new();
        m.set_connection_state("ready");
        let text = m.encode();
        assert!(text.contains("automanager_manager_connection_state{state=\"ready\"} 1"));
        assert!(text.contains("automanager_manager_connection_state{state=\"idle\"} 0"));
        m.set_connection_state("no-such-state");
        let text = m.encode();
        assert!(text.contains("automanager_manager_connection_state{state=\"unknown\"} 1"));
        assert!(text.contains("automanager_manager_connection_state{state=\"ready\"} 0"));
        assert!(!text.contains("no-such-state"));
    }

    #[test]
    fn reconcile_durations_are_labelled_by_controller_and_result() {
        let m = Metrics::new();
        m.observe_reconcile("bundle", true, 0.002);
        m.observe_reconcile("bundle", false, -1.0);
        let text = m.encode();
        assert!(text.contains(
            "automanager_reconcile_duration_seconds_count{controller=\"bundle\",result=\"ok\"} 1"
        ));
        assert!(text.contains(
            "automanager_reconcile_duration_seconds_count{controller=\"bundle\",result=\"error\"} 1"
        ));
    }

    #[test]
    fn migrations_are_counted_by_phase_and_only_active_ones_have_a_start_time() {
        let m = Metrics::new();
        m.observe_migration("video", "a", "StartingTarget", Some(100.0));
        m.observe_migration("video", "b", "StartingTarget", Some(105.5));
        let text = m.encode();
        assert!(
            text.contains("automanager_migrations{phase=\"StartingTarget\"} 2"),
            "{text}"
        );
        assert!(text.contains(
            "automanager_migration_phase_start_time_seconds{migration_namespace=\"video\",migration=\"a\",phase=\"StartingTarget\"} 100.0"
        ));
        m.observe_migration("video", "a", "Completed", None);
        let text = m.encode();
        assert!(text.contains("automanager_migrations{phase=\"StartingTarget\"} 1"));
        assert!(text.contains("automanager_migrations{phase=\"Completed\"} 1"));
        assert!(!text.contains("migration=\"a\""), "{text}");
        m.forget_migration("video", "a");
        m.forget_migration("video", "b");
        m.forget_migration("video", "never-seen");
        let text = m.encode();
        assert!(text.contains("automanager_migrations{phase=\"Completed\"} 0"));
        assert!(text.contains("automanager_migrations{phase=\"StartingTarget\"} 0"));
        assert!(!text.contains("automanager_migration_phase_start_time_seconds{"));
    }

    #[test]
    fn warm_spare_starts_are_counted_by_pool_and_result() {
        let m = Metrics::new();
        m.warm_spare_start("aws-east", true);
        m.warm_spare_start("aws-east", false);
        m.warm_spare_start("aws-east", false);
        let text = m.encode();
        assert!(text.contains(
            "automanager_warm_spare_starts_total{pool=\"aws-east\",result=\"started\"} 1"
        ));
        assert!(text.contains(
            "automanager_warm_spare_starts_total{pool=\"aws-east\",result=\"refused\"} 2"
        ));
    }

    #[test]
    fn spares_have_one_name() {
        let m = Metrics::new();
        m.set_pool("p", 1, Some(2), 0.5);
        m.set_spare_tier("t", "p", "hot", TierFigures::default());
        m.warm_spare_start("p", true);
        let text = m.encode();
        let spare_families: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|name| name.contains("spare"))
            .collect();
        assert_eq!(
            spare_families,
            ["automanager_spares", "automanager_warm_spare_starts"],
            "{text}"
        );
    }

    #[test]
    fn spare_tiers_are_reported_per_tier_and_go_with_their_target() {
        let m = Metrics::new();
        let f = |ready, pending, target| TierFigures {
            ready,
            pending,
            target,
        };
        m.set_spare_tier("gold", "aws-east", "hot", f(1, 1, 2));
        m.set_spare_tier("gold", "aws-east", "warm", f(3, 0, 4));
        m.set_spare_tier("other", "oci", "hot", f(0, 0, 1));
        let text = m.encode();
        for line in [
            "automanager_spares{hotsparetarget=\"gold\",pool=\"aws-east\",tier=\"hot\",state=\"pending\"} 1",
            "automanager_spares{hotsparetarget=\"gold\",pool=\"aws-east\",tier=\"warm\",state=\"ready\"} 3",
            "automanager_spares{hotsparetarget=\"gold\",pool=\"aws-east\",tier=\"warm\",state=\"target\"} 4",
        ] {
            assert!(text.contains(line), "{line} not in {text}");
        }
        m.retain_spare_targets(&[("other".into(), "oci".into())]);
        let text = m.encode();
        assert!(!text.contains("hotsparetarget=\"gold\""), "{text}");
        assert!(text.contains(
            "automanager_spares{hotsparetarget=\"other\",pool=\"oci\",tier=\"hot\",state=\"target\"} 1"
        ));
    }

    #[test]
    fn the_leader_gauge_follows_the_lease() {
        let m = Metrics::new();
        assert!(m.encode().contains("automanager_leader 0"));
        m.set_leader(true);
        assert!(m.encode().contains("automanager_leader 1"));
    }
}
