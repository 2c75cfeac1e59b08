//! Seeded chaos schedules: a fault schedule drawn from a seed over a small fleet of fixed pools
//! (the `load` scenario's set-up, scaled down), run against the real stack by [`run`] with the
//! invariant checker of [`crate::reliability`] throughout and once settled.
//!
//! Everything here is pure: [`Schedule::generate`] turns a seed and a [`ChaosConfig`] into the
//! initial wave of Bundles and a list of timed faults, the same list for the same seed and
//! config on every machine. Targets are named, not chosen at run time: a node kill names the
//! node (`la-00007`), a Migration names the job, a churned Bundle carries its new spec, so a
//! schedule printed by a failing run is the whole story of what was injected and when.
//!
//! The generator keeps each schedule runnable and its verdict meaningful:
//!
//! - capacity: the faults that take nodes away (kills, a zone kill, drains, cordons) touch at
//!   most half of each pool's nodes, all distinct, and the Bundles' demand (initial wave and
//!   churn) stays under [`MAX_DEMAND_PCT`] of the fleet, so every Bundle still fits when the
//!   faults are over: a job left unplaced is the operator's failure, not the fleet's;
//! - one fault at a time per process: operator faults (kill -9, leader pause), sim restarts and
//!   apiserver outages do not overlap their own kind;
//! - no write to the apiserver (spec churn, Migrations, cordons, drains, pool edits, uncordons)
//!   is due while it is paused, and no call to the sim's admin API (node and zone kills, stream
//!   cuts, job crashes) while the sim is down;
//! - at most one zone kill, one apiserver restart and two sim restarts per schedule (the costly
//!   ones), and every fault starts within the window;
//! - a reclaim notice runs out with every process up: no outage of the operator, the apiserver or
//!   the sim overlaps the time from a notice to its deadline, so a job still on the node when it
//!   goes is the operator's miss ([`ledger::DeadlineBook`]);
//! - once a PlacementPool is being deleted, no Bundle drawn later names it (a new Bundle would be
//!   kept out, rightly, and count as lost).
//!
//! Beside the operator, a foreign client works in the same Manager ([`ForeignBundle`]): its own
//! bundles registered and started through Manager's API when the seed starts, stopped, started
//! again and deleted by the schedule. Over our first API its ids look like ours as far as that API
//! allows: it has no owner tag, and the operator's rule (ours) is that a `<namespace>.<name>`
//! bundle id is its own, so the foreign ids are `<namespace>-<name>`. Over Manager's published
//! API it is a client of that API ([`foreign`]): stored jobs without the operator's owner tag, ids
//! of the operator's own form (`<namespace>.<name>/<replica>/<job>`), the operator's role, nodes
//! it did not create. Either way nothing of it may be touched by the operator
//! ([`ledger::ForeignBook`]), as Manager's side shows it.

pub mod foreign;
pub mod ledger;
pub mod run;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::bench::FleetPool;
use crate::rng::Rng;

/// The namespace of every Bundle and Migration of a schedule.
pub const NAMESPACE: &str = "default";

/// The most the live Bundles of a schedule may ask of the fleet, in percent of its capacity:
/// with half of a pool gone they still fit in what is left.
pub const MAX_DEMAND_PCT: u64 = 32;

/// The most Bundles a schedule's churn creates beyond the initial wave.
const MAX_CREATED: usize = 4;

/// The foreign client's capacity and cores per job: small, so its work never decides whether the
/// operator's Bundles fit.
pub const FOREIGN_CAPACITY: u32 = 2;

/// How long after a notice's deadline the schedule keeps every process up (the deadline-miss
/// check reads Manager then).
const NOTICE_QUIET_SLACK_MS: u64 = 2_000;

/// How long an apiserver restart is assumed to keep it down when writes are scheduled around
/// it. The runner waits for the restart to finish before it runs the next fault, so a write due
/// meanwhile is only late, never sent to a dead apiserver; the margin keeps writes from piling
/// up behind it.
const APISERVER_RESTART_MS: u64 = 10_000;

/// The size and shape of the fleet and of every schedule.
#[derive(Clone, Debug)]
pub struct ChaosConfig {
    /// The fixed pools (the sim's nodes and the PlacementPools).
    pub pools: Vec<FleetPool>,
    /// Bundles in the initial wave.
    pub bundles: usize,
    /// Faults start within `0..=window_ms` of the wave being applied.
    pub window_ms: u64,
    /// The operators' lease: a leader pause or an apiserver pause "past the lease" outlasts it.
    pub lease_ms: u64,
    /// How many faults a schedule draws (some may not fit and are left out).
    pub faults: (usize, usize),
}

impl ChaosConfig {
    /// `nodes` split over three fixed pools `la`, `lb`, `lc` as the `load` scenario does (5 : 3 :
    /// 2; at least 4 each), capacity 100 and 16 cores per node, two zones per pool; `bundles`
    /// in the wave; faults within `window_s`; a 6 s lease.
    pub fn sized(nodes: usize, bundles: usize, window_s: u64) -> ChaosConfig {
        let nodes = nodes.max(12);
        let la = nodes / 2;
        let lb = nodes * 3 / 10;
        let lc = nodes - la - lb;
        ChaosConfig {
            pools: vec![
                FleetPool::new("la", la.max(4), 100, 16),
                FleetPool::new("lb", lb.max(4), 100, 16),
                FleetPool::new("lc", lc.max(4), 100, 16),
            ],
            bundles,
            window_ms: window_s.max(1) * 1000,
            lease_ms: 6_000,
            faults: (8, 16),
        }
    }

    /// Every node of the fleet.
    pub fn node_count(&self) -> usize {
        self.pools.iter().map(|p| p.nodes).sum()
    }

    /// The fleet's capacity.
    pub fn capacity(&self) -> u64 {
        self.pools
            .iter()
            .map(|p| p.nodes as u64 * u64::from(p.capacity))
            .sum()
    }

    /// What a replay needs besides the seed, as `key=value` pairs.
    pub fn describe(&self) -> String {
        let pools: Vec<String> = self
            .pools
            .iter()
            .map(|p| format!("{}:{}", p.name, p.nodes))
            .collect();
        format!(
            "nodes={} pools={} bundles={} window_s={} lease_s={}",
            self.node_count(),
            pools.join(","),
            self.bundles,
            self.window_ms / 1000,
            self.lease_ms / 1000
        )
    }
}

/// One job of a generated Bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSpec {
    pub name: &'static str,
    pub capacity: u32,
    pub cores: u32,
    pub band: &'static str,
    /// The declared migration strategy (`None`: the default, stopThenStart).
    pub strategy: Option<&'static str>,
    /// `coLocateWith` one other job of the replica.
    pub co_locate_with: Option<&'static str>,
}

/// A generated Bundle's spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleSpec {
    pub replicas: u32,
    pub pools: Vec<String>,
    pub jobs: Vec<JobSpec>,
    /// Replicas in different zones, soft (beside different nodes, hard, the default).
    pub spread_zones: bool,
    /// What holds its voluntary moves for the whole run, if anything.
    pub hold: Option<Hold>,
}

/// What holds a Bundle's voluntary moves for the whole run: its drains, and (a budget) its
/// Migrations too, wait; recovery and moves ahead of a reclaim notice do not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hold {
    /// A disruption window that is closed for the run (daily, opening twelve hours from now).
    Window,
    /// `maxUnavailableReplicas: 0`.
    Budget,
}

/// A daily one-hour disruption window opening twelve hours after `hour` (UTC): closed for any run
/// that starts in `hour` and lasts less than eleven hours, and open every day, so admission takes it.
pub fn closed_window(hour: u32) -> serde_json::Value {
    serde_json::json!({"schedule": format!("0 {} * * *", (hour + 12) % 24), "duration": "1h"})
}

/// The job names a generated Bundle draws from, in order.
const JOB_NAMES: [&str; 3] = ["enc", "pkg", "thumb"];

impl BundleSpec {
    /// 1-2 replicas (mostly 2) of `enc` and `pkg` (sometimes `enc` alone, sometimes a `thumb`
    /// too), 3-12 capacity and 1-2 cores each, gold, silver or (rarely) bronze, on one pool or
    /// two, the first picked in proportion to the pools' sizes.
    pub fn draw(rng: &mut Rng, pools: &[FleetPool]) -> BundleSpec {
        let replicas = if rng.range(0, 3) == 0 { 1 } else { 2 };
        let first = weighted_pool(rng, pools);
        let mut names = vec![pools[first].name.clone()];
        if pools.len() > 1 && rng.range(0, 9) < 6 {
            let second = (first + 1 + rng.range(0, pools.len() as u64 - 2) as usize) % pools.len();
            names.push(pools[second].name.clone());
        }
        let count = match rng.range(0, 9) {
            0 => 1,
            1 => 3,
            _ => 2,
        };
        let mut jobs = Vec::new();
        for (i, name) in JOB_NAMES.iter().take(count).enumerate() {
            let band = match rng.range(0, 19) {
                0 => "bronze",
                1..=9 => "gold",
                _ => "silver",
            };
            let strategy = match rng.range(0, 3) {
                0 => Some("overlap"),
                1 => Some("stopThenStart"),
                _ => None,
            };
            // A packager sometimes goes where its encoder is.
            let co_locate_with = (i == 1 && rng.range(0, 4) == 0).then_some(JOB_NAMES[0]);
            jobs.push(JobSpec {
                name,
                capacity: rng.range(3, 12) as u32,
                cores: rng.range(1, 2) as u32,
                band,
                strategy,
                co_locate_with,
            });
        }
        let spread_zones = rng.range(0, 3) == 0;
        let hold = match rng.range(0, 9) {
            0 => Some(Hold::Window),
            1 => Some(Hold::Budget),
            _ => None,
        };
        BundleSpec {
            replicas,
            pools: names,
            jobs,
            spread_zones,
            hold,
        }
    }

    /// The same Bundle with one or two things changed, as a user edits one: a job's
    /// requirements or band, the replica count, the pools, or a strategy.
    pub fn mutate(&self, rng: &mut Rng, pools: &[FleetPool]) -> BundleSpec {
        let mut next = self.clone();
        for _ in 0..rng.range(1, 2) {
            let j = rng.range(0, next.jobs.len() as u64 - 1) as usize;
            match rng.range(0, 5) {
                0 => next.jobs[j].capacity = rng.range(3, 12) as u32,
                1 => next.jobs[j].band = rng.pick(&["gold", "silver", "bronze"]),
                2 => next.replicas = if next.replicas == 1 { 2 } else { 1 },
                3 => next.pools = BundleSpec::draw(rng, pools).pools,
                4 => {
                    next.jobs[j].strategy =
                        [None, Some("overlap"), Some("stopThenStart")][rng.range(0, 2) as usize]
                }
                _ => next.spread_zones = !next.spread_zones,
            }
        }
        next
    }

    /// The capacity all its replicas ask for.
    pub fn demand(&self) -> u64 {
        u64::from(self.replicas) * self.jobs.iter().map(|j| u64::from(j.capacity)).sum::<u64>()
    }

    /// The same spec without the pools in `closed` (`None` when no pool is left).
    pub fn without_pools(mut self, closed: &BTreeSet<String>) -> Option<BundleSpec> {
        self.pools.retain(|p| !closed.contains(p));
        (!self.pools.is_empty()).then_some(self)
    }

    /// The Bundle object named `name` in [`NAMESPACE`]; a [`Hold::Window`] is a window closed
    /// now (see [`closed_window`]).
    pub fn manifest(&self, name: &str) -> serde_json::Value {
        use chrono::Timelike;
        self.manifest_at(name, chrono::Utc::now().hour())
    }

    /// [`BundleSpec::manifest`] as of `hour` (UTC).
    pub fn manifest_at(&self, name: &str, hour: u32) -> serde_json::Value {
        let jobs: Vec<serde_json::Value> = self
            .jobs
            .iter()
            .map(|j| {
                let mut job = serde_json::json!({
                    "jobName": j.name,
                    "requirements": {"requiredCapacity": j.capacity, "requiredCores": j.cores,
                                     "priorityBand": j.band},
                });
                if let Some(s) = j.strategy {
                    job["migration"] = serde_json::json!({"strategy": s});
                }
                if let Some(c) = j.co_locate_with {
                    job["coLocateWith"] = serde_json::json!([c]);
                }
                job
            })
            .collect();
        let zone = if self.spread_zones {
            serde_json::json!({"relation": "different", "enforcement": "soft"})
        } else {
            serde_json::json!({"relation": "same", "enforcement": "soft"})
        };
        let mut bundle = serde_json::json!({
            "apiVersion": "automanager.norsk.io/v1alpha1",
            "kind": "Bundle",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {
                "replicas": self.replicas,
                "pools": self.pools,
                "jobs": jobs,
                "interReplicaPlacement": {
                    "node": {"relation": "different", "enforcement": "hard"},
                    "zone": zone,
                },
            },
        });
        match self.hold {
            Some(Hold::Window) => {
                bundle["spec"]["disruption"] = serde_json::json!({"windows": [closed_window(hour)]})
            }
            Some(Hold::Budget) => {
                bundle["spec"]["disruption"] = serde_json::json!({"maxUnavailableReplicas": 0})
            }
            None => {}
        }
        bundle
    }
}

impl fmt::Display for BundleSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let jobs: Vec<String> = self
            .jobs
            .iter()
            .map(|j| {
                let mut s = format!("{} {}/{}c {}", j.name, j.capacity, j.cores, j.band);
                if let Some(st) = j.strategy {
                    s.push_str(&format!(" {st}"));
                }
                if let Some(c) = j.co_locate_with {
                    s.push_str(&format!(" with {c}"));
                }
                s
            })
            .collect();
        write!(
            f,
            "{}x[{}] on [{}]{}{}",
            self.replicas,
            jobs.join(", "),
            self.pools.join(", "),
            if self.spread_zones {
                " zones apart"
            } else {
                ""
            },
            match self.hold {
                Some(Hold::Window) => " window closed",
                Some(Hold::Budget) => " budget 0",
                None => "",
            }
        )
    }
}

/// A pool index, picked in proportion to the pools' sizes.
fn weighted_pool(rng: &mut Rng, pools: &[FleetPool]) -> usize {
    let total: u64 = pools.iter().map(|p| p.nodes as u64).sum();
    let mut at = rng.range(0, total.max(1) - 1);
    for (i, p) in pools.iter().enumerate() {
        if at < p.nodes as u64 {
            return i;
        }
        at -= p.nodes as u64;
    }
    pools.len() - 1
}

/// One job of a Bundle, as Manager names it `<namespace>.<bundle>/<replica>/<job>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobRef {
    pub bundle: String,
    pub replica: u32,
    pub job: String,
}

impl JobRef {
    /// Manager's job id.
    pub fn job_id(&self) -> String {
        format!("{NAMESPACE}.{}/{}/{}", self.bundle, self.replica, self.job)
    }
}

/// A bundle of the foreign client: one replica of one or two jobs, each started on a named node
/// when the seed starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForeignBundle {
    /// `<namespace>-<name>`: one of ours but for the dot.
    pub id: String,
    /// `(job name, node)`.
    pub jobs: Vec<(String, String)>,
}

impl ForeignBundle {
    /// Manager's id of its job `name` (replica 0).
    pub fn job_id(&self, name: &str) -> String {
        format!("{}/0/{name}", self.id)
    }
}

/// Which operator replica an operator fault hits, resolved when it runs (the lease decides).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replica {
    Leader,
    Standby,
}

/// How a drain empties its node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainMode {
    Migrate,
    Terminate,
}

impl DrainMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DrainMode::Migrate => "migrate",
            DrainMode::Terminate => "terminate",
        }
    }
}

/// One fault of a schedule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `SimAdmin.KillNode`: the node is terminated, its instances fail.
    KillNode { node: String },
    /// Every node of a zone killed at once.
    KillZone { zone: String, nodes: Vec<String> },
    /// Every Watch stream Manager has open cut.
    CutStreams,
    /// A job's running instance fails (`SimAdmin.FailJob`).
    FailJob { job: JobRef },
    /// The sim `kill -9`ed and started again `down_ms` later on the same address, with its
    /// state directory as it was or emptied.
    RestartSim { wipe: bool, down_ms: u64 },
    /// An operator replica `kill -9`ed, started again `down_ms` later.
    KillOperator { replica: Replica, down_ms: u64 },
    /// The leader `SIGSTOP`ped for `ms` (past the lease), then `SIGCONT`ed.
    PauseLeader { ms: u64 },
    /// kube-apiserver `SIGSTOP`ped for `ms`, then `SIGCONT`ed.
    PauseApiserver { ms: u64 },
    /// kube-apiserver `SIGKILL`ed and started again (etcd kept).
    RestartApiserver,
    /// A Bundle's spec changed (or the Bundle created again, if churn had deleted it).
    UpdateBundle { name: String, spec: BundleSpec },
    /// A Bundle deleted.
    DeleteBundle { name: String },
    /// A new Bundle created.
    CreateBundle { name: String, spec: BundleSpec },
    /// A Bundle deleted, and created again under its name `gap_ms` later, once the old one is
    /// gone.
    RecreateBundle {
        name: String,
        spec: BundleSpec,
        gap_ms: u64,
    },
    /// A Migration of one job, with the job's declared strategy or the one given.
    Migrate {
        name: String,
        job: JobRef,
        strategy: Option<&'static str>,
    },
    /// `spec.drain` set on a node.
    Drain { node: String, mode: DrainMode },
    /// `spec.cordoned: true` on a node, lifted `for_ms` later (`None`: kept to the end).
    Cordon { node: String, for_ms: Option<u64> },
    /// A PlacementPool's `packingStrategy` changed.
    PoolEdit { pool: String, packing: &'static str },
    /// A reclaim notice (`SimAdmin.NoticeNode`): Manager takes the node `in_ms` later.
    Notice { node: String, in_ms: u64 },
    /// `spec.drain` set on a node, and `after_ms` later a reclaim notice for it with `in_ms` to
    /// go: the drain's moves of a held Bundle wait, the deadline must not.
    DrainNotice {
        node: String,
        mode: DrainMode,
        after_ms: u64,
        in_ms: u64,
    },
    /// A Migration of one job (of a Bundle that holds its moves, when the wave has one), and
    /// `after_ms` later a reclaim notice for the node the job runs on then (looked up when the
    /// notice is due; `pools` are its Bundle's, where that node may be).
    MigrateNotice {
        name: String,
        job: JobRef,
        pools: Vec<String>,
        after_ms: u64,
        in_ms: u64,
    },
    /// A PlacementPool deleted (it waits on the Bundles that use it), and `after_ms` later one
    /// of its nodes killed: its users must heal on its other nodes.
    DeletePool {
        pool: String,
        node: String,
        after_ms: u64,
    },
    /// The foreign client stops its job.
    ForeignStop { job: String },
    /// The foreign client starts its job on a node.
    ForeignStart { job: String, node: String },
    /// The foreign client deletes its bundle.
    ForeignDelete { bundle: String },
}

/// Every kind of fault, by [`Fault::kind`].
pub const KINDS: [&str; 26] = [
    "kill-node",
    "kill-zone",
    "cut-streams",
    "fail-job",
    "restart-sim-kept",
    "restart-sim-wiped",
    "kill-leader",
    "kill-standby",
    "pause-leader",
    "pause-apiserver",
    "restart-apiserver",
    "update-bundle",
    "delete-bundle",
    "create-bundle",
    "recreate-bundle",
    "migrate",
    "drain",
    "cordon",
    "pool-edit",
    "notice-node",
    "notice-drained",
    "notice-migrated",
    "delete-pool",
    "foreign-stop",
    "foreign-start",
    "foreign-delete",
];

/// How often each kind is drawn, relative to the others (same order as [`KINDS`]).
const WEIGHTS: [u64; 26] = [
    10, 3, 7, 6, 4, 3, 6, 3, 5, 5, 2, 10, 5, 4, 4, 10, 5, 8, 5, 4, 4, 4, 2, 4, 4, 1,
];

/// The most reclaim notices (of every kind) in one schedule: each keeps every process up until
/// its deadline, which leaves less room for outages.
const MAX_NOTICES: usize = 2;

/// What a fault needs while it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Needs {
    /// It writes to the apiserver (at its start, and at its end for a window that ends with a
    /// write: an uncordon, a re-create).
    Apiserver,
    /// It calls the sim's admin API.
    SimAdmin,
    /// Nothing but its own process.
    Nothing,
}

/// A process a fault takes down or pauses for a while; two of one kind must not overlap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Outage {
    Apiserver,
    Sim,
    Operator,
}

impl Fault {
    /// The fault's kind, one of [`KINDS`].
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillNode { .. } => "kill-node",
            Fault::KillZone { .. } => "kill-zone",
            Fault::CutStreams => "cut-streams",
            Fault::FailJob { .. } => "fail-job",
            Fault::RestartSim { wipe: false, .. } => "restart-sim-kept",
            Fault::RestartSim { wipe: true, .. } => "restart-sim-wiped",
            Fault::KillOperator {
                replica: Replica::Leader,
                ..
            } => "kill-leader",
            Fault::KillOperator {
                replica: Replica::Standby,
                ..
            } => "kill-standby",
            Fault::PauseLeader { .. } => "pause-leader",
            Fault::PauseApiserver { .. } => "pause-apiserver",
            Fault::RestartApiserver => "restart-apiserver",
            Fault::UpdateBundle { .. } => "update-bundle",
            Fault::DeleteBundle { .. } => "delete-bundle",
            Fault::CreateBundle { .. } => "create-bundle",
            Fault::RecreateBundle { .. } => "recreate-bundle",
            Fault::Migrate { .. } => "migrate",
            Fault::Drain { .. } => "drain",
            Fault::Cordon { .. } => "cordon",
            Fault::PoolEdit { .. } => "pool-edit",
            Fault::Notice { .. } => "notice-node",
            Fault::DrainNotice { .. } => "notice-drained",
            Fault::MigrateNotice { .. } => "notice-migrated",
            Fault::DeletePool { .. } => "delete-pool",
            Fault::ForeignStop { .. } => "foreign-stop",
            Fault::ForeignStart { .. } => "foreign-start",
            Fault::ForeignDelete { .. } => "foreign-delete",
        }
    }

    /// Whether it is a reclaim notice (of any kind).
    pub fn is_notice(&self) -> bool {
        matches!(
            self,
            Fault::Notice { .. } | Fault::DrainNotice { .. } | Fault::MigrateNotice { .. }
        )
    }

    /// How long after its start the fault's second step runs (the resume, the restart, the
    /// uncordon, the re-create), if it has one.
    pub fn duration_ms(&self) -> Option<u64> {
        match self {
            Fault::RestartSim { down_ms, .. } | Fault::KillOperator { down_ms, .. } => {
                Some(*down_ms)
            }
            Fault::PauseLeader { ms } | Fault::PauseApiserver { ms } => Some(*ms),
            Fault::RecreateBundle { gap_ms, .. } => Some(*gap_ms),
            Fault::Cordon { for_ms, .. } => *for_ms,
            Fault::DrainNotice { after_ms, .. }
            | Fault::MigrateNotice { after_ms, .. }
            | Fault::DeletePool { after_ms, .. } => Some(*after_ms),
            _ => None,
        }
    }

    /// What its start needs, and what its end needs (the same, but for the pairs that write to
    /// the apiserver first and call the sim second).
    fn needs(&self) -> (Needs, Needs) {
        let both = |n| (n, n);
        match self {
            Fault::KillNode { .. }
            | Fault::KillZone { .. }
            | Fault::CutStreams
            | Fault::FailJob { .. }
            | Fault::Notice { .. }
            | Fault::ForeignStop { .. }
            | Fault::ForeignStart { .. }
            | Fault::ForeignDelete { .. } => both(Needs::SimAdmin),
            Fault::UpdateBundle { .. }
            | Fault::DeleteBundle { .. }
            | Fault::CreateBundle { .. }
            | Fault::RecreateBundle { .. }
            | Fault::Migrate { .. }
            | Fault::Drain { .. }
            | Fault::Cordon { .. }
            | Fault::PoolEdit { .. } => both(Needs::Apiserver),
            Fault::DrainNotice { .. } | Fault::MigrateNotice { .. } | Fault::DeletePool { .. } => {
                (Needs::Apiserver, Needs::SimAdmin)
            }
            _ => both(Needs::Nothing),
        }
    }

    /// From the notice to a little past its deadline, for a reclaim notice: every process must
    /// stay up meanwhile.
    pub fn quiet(&self, at_ms: u64) -> Option<(u64, u64)> {
        let (from, in_ms) = match self {
            Fault::Notice { in_ms, .. } => (at_ms, *in_ms),
            Fault::DrainNotice {
                after_ms, in_ms, ..
            }
            | Fault::MigrateNotice {
                after_ms, in_ms, ..
            } => (at_ms + after_ms, *in_ms),
            _ => return None,
        };
        Some((from, from + in_ms + NOTICE_QUIET_SLACK_MS))
    }

    /// The process it takes down and for how long from its start (an apiserver restart for
    /// [`APISERVER_RESTART_MS`]).
    fn outage(&self) -> Option<(Outage, u64)> {
        match self {
            Fault::RestartSim { down_ms, .. } => Some((Outage::Sim, *down_ms)),
            Fault::KillOperator { down_ms, .. } => Some((Outage::Operator, *down_ms)),
            Fault::PauseLeader { ms } => Some((Outage::Operator, *ms)),
            Fault::PauseApiserver { ms } => Some((Outage::Apiserver, *ms)),
            Fault::RestartApiserver => Some((Outage::Apiserver, APISERVER_RESTART_MS)),
            _ => None,
        }
    }

    /// The nodes it takes away for good or for a while (kills, drains, cordons).
    pub fn nodes_taken(&self) -> Vec<&str> {
        match self {
            Fault::KillNode { node }
            | Fault::Drain { node, .. }
            | Fault::Cordon { node, .. }
            | Fault::Notice { node, .. }
            | Fault::DrainNotice { node, .. }
            | Fault::DeletePool { node, .. } => {
                vec![node.as_str()]
            }
            Fault::KillZone { nodes, .. } => nodes.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        }
    }

    /// The moments (from the schedule's start) at which it writes to the apiserver or calls the
    /// sim's API, given its start, each with what it needs then.
    fn instants(&self, at_ms: u64) -> Vec<(Needs, u64)> {
        let (start, end) = self.needs();
        let mut v = Vec::new();
        if start != Needs::Nothing {
            v.push((start, at_ms));
        }
        // A sim call is made at the start only, but for the pairs that make it at their end.
        let ends = end == Needs::Apiserver || start != end;
        if let Some(d) = self.duration_ms().filter(|_| ends && end != Needs::Nothing) {
            v.push((end, at_ms + d));
        }
        v
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = |ms: &u64| format!("{:.1}s", *ms as f64 / 1000.0);
        match self {
            Fault::KillNode { node } => write!(f, "kill-node {node}"),
            Fault::KillZone { zone, nodes } => {
                write!(f, "kill-zone {zone} ({} nodes)", nodes.len())
            }
            Fault::CutStreams => write!(f, "cut-streams"),
            Fault::FailJob { job } => write!(f, "fail-job {}", job.job_id()),
            Fault::RestartSim { wipe, down_ms } => write!(
                f,
                "restart-sim-{} down {}",
                if *wipe { "wiped" } else { "kept" },
                s(down_ms)
            ),
            Fault::KillOperator { replica, down_ms } => write!(
                f,
                "kill-{} (kill -9) down {}",
                match replica {
                    Replica::Leader => "leader",
                    Replica::Standby => "standby",
                },
                s(down_ms)
            ),
            Fault::PauseLeader { ms } => write!(f, "pause-leader (SIGSTOP) for {}", s(ms)),
            Fault::PauseApiserver { ms } => write!(f, "pause-apiserver (SIGSTOP) for {}", s(ms)),
            Fault::RestartApiserver => write!(f, "restart-apiserver (SIGKILL, start again)"),
            Fault::UpdateBundle { name, spec } => write!(f, "update-bundle {name} to {spec}"),
            Fault::DeleteBundle { name } => write!(f, "delete-bundle {name}"),
            Fault::CreateBundle { name, spec } => write!(f, "create-bundle {name} {spec}"),
            Fault::RecreateBundle { name, spec, gap_ms } => {
                write!(f, "recreate-bundle {name} after {} as {spec}", s(gap_ms))
            }
            Fault::Migrate {
                name,
                job,
                strategy,
            } => write!(
                f,
                "migrate {name}: {} ({})",
                job.job_id(),
                strategy.unwrap_or("declared strategy")
            ),
            Fault::Drain { node, mode } => write!(f, "drain {node} ({})", mode.as_str()),
            Fault::Cordon { node, for_ms } => match for_ms {
                Some(ms) => write!(f, "cordon {node} for {}", s(ms)),
                None => write!(f, "cordon {node} to the end"),
            },
            Fault::PoolEdit { pool, packing } => write!(f, "pool-edit {pool} packing {packing}"),
            Fault::Notice { node, in_ms } => write!(f, "notice-node {node} in {}", s(in_ms)),
            Fault::DrainNotice {
                node,
                mode,
                after_ms,
                in_ms,
            } => write!(
                f,
                "notice-drained {node}: drain ({}), notice after {} in {}",
                mode.as_str(),
                s(after_ms),
                s(in_ms)
            ),
            Fault::MigrateNotice {
                name,
                job,
                after_ms,
                in_ms,
                ..
            } => write!(
                f,
                "notice-migrated {name}: {}, notice its node after {} in {}",
                job.job_id(),
                s(after_ms),
                s(in_ms)
            ),
            Fault::DeletePool {
                pool,
                node,
                after_ms,
            } => write!(
                f,
                "delete-pool {pool}, kill-node {node} after {}",
                s(after_ms)
            ),
            Fault::ForeignStop { job } => write!(f, "foreign-stop {job}"),
            Fault::ForeignStart { job, node } => write!(f, "foreign-start {job} on {node}"),
            Fault::ForeignDelete { bundle } => write!(f, "foreign-delete {bundle}"),
        }
    }
}

/// A fault and when it starts, in milliseconds from the moment the wave was applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub at_ms: u64,
    pub fault: Fault,
}

/// Whether a step starts its fault or ends it (the resume, the restart, the uncordon).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Phase {
    Start,
    End,
}

/// One thing the runner does: `phase` of event `event`, at `at_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub at_ms: u64,
    pub event: usize,
    pub phase: Phase,
}

/// What one seed draws: the initial wave and the faults, in order of time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    pub seed: u64,
    /// The Bundles applied before the first fault, `(name, spec)`.
    pub wave: Vec<(String, BundleSpec)>,
    /// The foreign client's bundles, registered and started before the wave.
    pub foreign: Vec<ForeignBundle>,
    pub events: Vec<Event>,
}

/// What the generator knows of the schedule so far, to keep the next fault within bounds.
struct Drafting<'a> {
    config: &'a ChaosConfig,
    /// Nodes taken away by a kill, drain, cordon or notice.
    taken: BTreeSet<String>,
    /// A node a notice will take that is known only when it is due, by the pools it may be in
    /// (each counts against every one of them).
    reserved: Vec<Vec<String>>,
    /// Pools being deleted: no Bundle drawn later names them.
    closed_pools: BTreeSet<String>,
    /// When a notice is sent, to a little past its deadline.
    quiet: Vec<(u64, u64)>,
    /// Each job of the foreign client, and whether it runs (as far as the schedule knows).
    foreign_running: BTreeMap<String, bool>,
    /// The foreign client's bundles it has not deleted, with their jobs' ids.
    foreign_live: BTreeMap<String, Vec<String>>,
    /// Each Bundle the schedule has alive at the latest fault drawn, with its spec.
    live: BTreeMap<String, BundleSpec>,
    /// Every Bundle the wave or churn ever named, so a Migration or a job crash can target one.
    created: usize,
    migrations: usize,
    /// `[from, until)` of each outage, by process.
    outages: Vec<(Outage, u64, u64)>,
    /// When apiserver writes and sim admin calls are due.
    writes: Vec<u64>,
    admin_calls: Vec<u64>,
    counts: BTreeMap<&'static str, usize>,
}

impl Drafting<'_> {
    fn demand(&self) -> u64 {
        self.live.values().map(BundleSpec::demand).sum()
    }

    fn demand_fits(&self, without: Option<&str>, with: Option<&BundleSpec>) -> bool {
        let now = self.demand()
            - without
                .and_then(|n| self.live.get(n))
                .map_or(0, BundleSpec::demand);
        now + with.map_or(0, BundleSpec::demand) <= self.config.capacity() * MAX_DEMAND_PCT / 100
    }

    fn pool_of(&self, node: &str) -> Option<&FleetPool> {
        self.config.pools.iter().find(|p| {
            node.strip_prefix(&p.name)
                .is_some_and(|r| r.starts_with('-'))
        })
    }

    /// Whether taking `nodes`, and reserving one node of `reserves` when given, keeps every pool
    /// within its budget (half its nodes).
    fn nodes_fit_with(&self, nodes: &[&str], reserves: Option<&[String]>) -> bool {
        let mut per_pool: BTreeMap<&str, usize> = BTreeMap::new();
        for n in self
            .taken
            .iter()
            .map(String::as_str)
            .chain(nodes.iter().copied())
        {
            match self.pool_of(n) {
                Some(p) => *per_pool.entry(&p.name).or_default() += 1,
                None => return false,
            }
        }
        for pools in self.reserved.iter().map(Vec::as_slice).chain(reserves) {
            for p in pools {
                *per_pool.entry(p.as_str()).or_default() += 1;
            }
        }
        nodes.iter().all(|n| !self.taken.contains(*n))
            && nodes.iter().collect::<BTreeSet<_>>().len() == nodes.len()
            && self
                .config
                .pools
                .iter()
                .all(|p| per_pool.get(p.name.as_str()).copied().unwrap_or(0) <= p.nodes / 2)
    }

    /// Whether `from..until` (with a second's margin) meets any outage, of any process.
    fn meets_outage(&self, from: u64, until: u64) -> bool {
        self.outages
            .iter()
            .any(|(_, f, u)| from < u.saturating_add(1_000) && *f < until.saturating_add(1_000))
    }

    /// Whether `from..until` (with a second's margin) meets a notice's quiet time.
    fn meets_quiet(&self, from: u64, until: u64) -> bool {
        self.quiet
            .iter()
            .any(|(f, u)| from < u.saturating_add(1_000) && *f < until.saturating_add(1_000))
    }

    fn in_outage(&self, what: Outage, at: u64) -> bool {
        self.outages
            .iter()
            .any(|(o, from, until)| *o == what && (*from..*until).contains(&at))
    }

    /// Whether `fault` at `at` keeps the schedule runnable (see the module's bounds).
    fn fits(&self, at: u64, fault: &Fault) -> bool {
        let cap = |kind: &str, most: usize| self.counts.get(kind).copied().unwrap_or(0) < most;
        let capped = match fault {
            Fault::KillZone { .. } => cap("kill-zone", 1),
            Fault::RestartApiserver => cap("restart-apiserver", 1),
            Fault::RestartSim { .. } => {
                self.counts.get("restart-sim-kept").copied().unwrap_or(0)
                    + self.counts.get("restart-sim-wiped").copied().unwrap_or(0)
                    < 2
            }
            Fault::Drain { .. } => cap("drain", 2),
            Fault::CreateBundle { .. } => self.created < MAX_CREATED,
            Fault::DeletePool { .. } => cap("delete-pool", 1),
            Fault::ForeignDelete { .. } => cap("foreign-delete", 1),
            f if f.is_notice() => {
                ["notice-node", "notice-drained", "notice-migrated"]
                    .iter()
                    .map(|k| self.counts.get(k).copied().unwrap_or(0))
                    .sum::<usize>()
                    < MAX_NOTICES
            }
            _ => true,
        };
        let reserves = match fault {
            Fault::MigrateNotice { pools, .. } => Some(pools.as_slice()),
            _ => None,
        };
        if !capped || !self.nodes_fit_with(&fault.nodes_taken(), reserves) {
            return false;
        }
        for (needs, i) in fault.instants(at) {
            let blocked = match needs {
                Needs::Apiserver => self.in_outage(Outage::Apiserver, i),
                Needs::SimAdmin => self.in_outage(Outage::Sim, i),
                Needs::Nothing => false,
            };
            if blocked {
                return false;
            }
        }
        if let Some((from, until)) = fault.quiet(at)
            && self.meets_outage(from, until)
        {
            return false;
        }
        if let Some((what, ms)) = fault.outage() {
            let (from, until) = (at, at + ms);
            if self.meets_quiet(from, until) {
                return false;
            }
            // One outage of a process at a time, a second apart.
            let overlaps = self.outages.iter().any(|(o, f, u)| {
                *o == what && from < u.saturating_add(1_000) && *f < until.saturating_add(1_000)
            });
            let due = match what {
                Outage::Apiserver => &self.writes,
                Outage::Sim => &self.admin_calls,
                Outage::Operator => return !overlaps,
            };
            if overlaps || due.iter().any(|t| (from..until).contains(t)) {
                return false;
            }
        }
        true
    }

    fn add(&mut self, at: u64, fault: &Fault) {
        *self.counts.entry(fault.kind()).or_default() += 1;
        self.taken
            .extend(fault.nodes_taken().into_iter().map(str::to_owned));
        for (needs, i) in fault.instants(at) {
            match needs {
                Needs::Apiserver => self.writes.push(i),
                Needs::SimAdmin => self.admin_calls.push(i),
                Needs::Nothing => {}
            }
        }
        if let Some((what, ms)) = fault.outage() {
            self.outages.push((what, at, at + ms));
        }
        if let Some(q) = fault.quiet(at) {
            self.quiet.push(q);
        }
        match fault {
            Fault::MigrateNotice { pools, .. } => self.reserved.push(pools.clone()),
            Fault::DeletePool { pool, .. } => {
                self.closed_pools.insert(pool.clone());
            }
            Fault::ForeignStop { job } => {
                self.foreign_running.insert(job.clone(), false);
            }
            Fault::ForeignStart { job, .. } => {
                self.foreign_running.insert(job.clone(), true);
            }
            Fault::ForeignDelete { bundle } => {
                for job in self.foreign_live.remove(bundle).unwrap_or_default() {
                    self.foreign_running.remove(&job);
                }
            }
            _ => {}
        }
        match fault {
            Fault::UpdateBundle { name, spec }
            | Fault::CreateBundle { name, spec }
            | Fault::RecreateBundle { name, spec, .. } => {
                self.live.insert(name.clone(), spec.clone());
            }
            Fault::DeleteBundle { name } => {
                self.live.remove(name);
            }
            _ => {}
        }
        if matches!(fault, Fault::CreateBundle { .. }) {
            self.created += 1;
        }
        if matches!(fault, Fault::Migrate { .. } | Fault::MigrateNotice { .. }) {
            self.migrations += 1;
        }
    }
}

impl Schedule {
    /// The schedule of `seed` under `config`: the same for the same pair, always.
    pub fn generate(seed: u64, config: &ChaosConfig) -> Schedule {
        // Seeds 1, 2, 3 ... start far apart in splitmix64's sequence.
        let mut rng = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ 0xC4A0_5EED);
        let most = config.capacity() * MAX_DEMAND_PCT / 100;
        let mut wave: Vec<(String, BundleSpec)> = Vec::new();
        let mut demand = 0;
        for i in 0..config.bundles {
            // A draw that would ask too much of the fleet is drawn again (a few times, then
            // the Bundle is left out: a fleet too small for the wave gets a smaller wave).
            let spec = (0..8)
                .map(|_| BundleSpec::draw(&mut rng, &config.pools))
                .find(|s| demand + s.demand() <= most);
            if let Some(spec) = spec {
                demand += spec.demand();
                wave.push((format!("chaos-{i:04}"), spec));
            }
        }
        let foreign = draw_foreign(&mut rng, config);
        let mut d = Drafting {
            config,
            taken: BTreeSet::new(),
            reserved: Vec::new(),
            closed_pools: BTreeSet::new(),
            quiet: Vec::new(),
            foreign_running: foreign
                .iter()
                .flat_map(|b| b.jobs.iter().map(|(name, _)| (b.job_id(name), true)))
                .collect(),
            foreign_live: foreign
                .iter()
                .map(|b| {
                    let jobs = b.jobs.iter().map(|(name, _)| b.job_id(name)).collect();
                    (b.id.clone(), jobs)
                })
                .collect(),
            live: wave.iter().cloned().collect(),
            created: 0,
            migrations: 0,
            outages: Vec::new(),
            writes: Vec::new(),
            admin_calls: Vec::new(),
            counts: BTreeMap::new(),
        };
        let (lo, hi) = config.faults;
        let n = rng.range(lo as u64, hi as u64) as usize;
        // Times first, in order, so each fault is drawn knowing what the earlier ones did
        // (which Bundles exist, which nodes are gone).
        let mut times: Vec<u64> = (0..n)
            .map(|_| rng.range(0, config.window_ms / 10) * 10)
            .collect();
        times.sort_unstable();
        let mut events = Vec::new();
        for at in times {
            for _ in 0..8 {
                let Some(fault) = draw_fault(&mut rng, &d, &wave) else {
                    continue;
                };
                if d.fits(at, &fault) {
                    d.add(at, &fault);
                    events.push(Event { at_ms: at, fault });
                    break;
                }
            }
        }
        Schedule {
            seed,
            wave,
            foreign,
            events,
        }
    }

    /// The Bundles whose last spec in the schedule holds their moves, by name.
    pub fn holding(&self) -> BTreeMap<String, Hold> {
        let mut last: BTreeMap<&str, Option<Hold>> = self
            .wave
            .iter()
            .map(|(n, s)| (n.as_str(), s.hold))
            .collect();
        for e in &self.events {
            match &e.fault {
                Fault::UpdateBundle { name, spec }
                | Fault::CreateBundle { name, spec }
                | Fault::RecreateBundle { name, spec, .. } => {
                    last.insert(name, spec.hold);
                }
                _ => {}
            }
        }
        last.into_iter()
            .filter_map(|(n, h)| h.map(|h| (n.to_owned(), h)))
            .collect()
    }

    /// Every step the runner takes, in order of time (a fault's end after its start).
    pub fn steps(&self) -> Vec<Step> {
        let mut steps: Vec<Step> = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            steps.push(Step {
                at_ms: e.at_ms,
                event: i,
                phase: Phase::Start,
            });
            if let Some(d) = e.fault.duration_ms() {
                steps.push(Step {
                    at_ms: e.at_ms + d,
                    event: i,
                    phase: Phase::End,
                });
            }
        }
        steps.sort_by_key(|s| (s.at_ms, s.event, s.phase));
        steps
    }

    /// How many faults of each kind it holds.
    pub fn kinds(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for e in &self.events {
            *out.entry(e.fault.kind()).or_default() += 1;
        }
        out
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos schedule seed={} faults={} wave={}",
            self.seed,
            self.events.len(),
            self.wave.len()
        )?;
        for (name, spec) in &self.wave {
            writeln!(f, "  wave {name}: {spec}")?;
        }
        for b in &self.foreign {
            let jobs: Vec<String> = b
                .jobs
                .iter()
                .map(|(name, node)| format!("{name} on {node}"))
                .collect();
            writeln!(f, "  foreign {}: {}", b.id, jobs.join(", "))?;
        }
        for e in &self.events {
            writeln!(f, "  +{:>6.2}s {}", e.at_ms as f64 / 1000.0, e.fault)?;
        }
        Ok(())
    }
}

/// A reclaim notice's time to go: 15-30 s. The operator's notice planner budgets 10 s for an
/// `overlap` or `stopThenStart` move once its target is up (15 s for a handover, which the
/// chaos fleet's jobs do not speak) and leaves to band recovery what it judges cannot finish in
/// time; a shorter notice would count as misses the moves the planner never tries.
fn notice_in_ms(rng: &mut Rng) -> u64 {
    rng.range(150, 300) * 100
}

/// The foreign client's bundles: two or three, each one replica of `enc` and sometimes `pkg`,
/// every job on a node of the fleet picked in proportion to the pools' sizes.
fn draw_foreign(rng: &mut Rng, config: &ChaosConfig) -> Vec<ForeignBundle> {
    (0..rng.range(2, 3))
        .map(|i| {
            let count = if rng.range(0, 1) == 0 { 1 } else { 2 };
            let jobs = JOB_NAMES
                .iter()
                .take(count)
                .map(|name| {
                    let p = &config.pools[weighted_pool(rng, &config.pools)];
                    let node = format!("{}-{:05}", p.name, rng.range(0, p.nodes as u64 - 1));
                    ((*name).to_owned(), node)
                })
                .collect();
            ForeignBundle {
                id: format!("{NAMESPACE}-chaos-{}", 9000 + i),
                jobs,
            }
        })
        .collect()
}

/// A fault of a kind drawn by weight, with its targets and times; `None` when that kind has
/// nothing to act on (no live Bundle to delete, no node left to take).
fn draw_fault(rng: &mut Rng, d: &Drafting<'_>, wave: &[(String, BundleSpec)]) -> Option<Fault> {
    let total: u64 = WEIGHTS.iter().sum();
    let mut at = rng.range(0, total - 1);
    let mut kind = KINDS[0];
    for (k, w) in KINDS.iter().zip(WEIGHTS) {
        if at < w {
            kind = k;
            break;
        }
        at -= w;
    }
    let config = d.config;
    let free_node = |rng: &mut Rng| -> Option<String> {
        let p = &config.pools[weighted_pool(rng, &config.pools)];
        let free: Vec<String> = p
            .node_ids()
            .into_iter()
            .map(|(id, _)| id)
            .filter(|id| !d.taken.contains(id))
            .collect();
        (!free.is_empty()).then(|| free[rng.range(0, free.len() as u64 - 1) as usize].clone())
    };
    let live_bundle = |rng: &mut Rng| -> Option<(String, BundleSpec)> {
        let names: Vec<&String> = d.live.keys().collect();
        (!names.is_empty()).then(|| {
            let name = names[rng.range(0, names.len() as u64 - 1) as usize].clone();
            let spec = d.live[&name].clone();
            (name, spec)
        })
    };
    // A job of the initial wave (churn may have changed or removed it since: a Migration or a
    // crash of a job that is gone is refused, which is a fault worth sending too).
    let wave_job = |rng: &mut Rng| -> Option<JobRef> {
        let (name, spec) = wave.get(rng.range(0, wave.len().max(1) as u64 - 1) as usize)?;
        let job = &spec.jobs[rng.range(0, spec.jobs.len() as u64 - 1) as usize];
        Some(JobRef {
            bundle: name.clone(),
            replica: rng.range(0, u64::from(spec.replicas) - 1) as u32,
            job: job.name.to_owned(),
        })
    };
    let lease = config.lease_ms;
    Some(match kind {
        "kill-node" => Fault::KillNode {
            node: free_node(rng)?,
        },
        "kill-zone" => {
            let p = &config.pools[weighted_pool(rng, &config.pools)];
            let zone = p.zones()[rng.range(0, 1) as usize].clone();
            let nodes = p
                .node_ids()
                .into_iter()
                .filter(|(_, z)| *z == zone)
                .map(|(id, _)| id)
                .collect();
            Fault::KillZone { zone, nodes }
        }
        "cut-streams" => Fault::CutStreams,
        "fail-job" => Fault::FailJob {
            job: wave_job(rng)?,
        },
        "restart-sim-kept" | "restart-sim-wiped" => Fault::RestartSim {
            wipe: kind == "restart-sim-wiped",
            down_ms: rng.range(3, 30) * 100,
        },
        "kill-leader" | "kill-standby" => Fault::KillOperator {
            replica: if kind == "kill-leader" {
                Replica::Leader
            } else {
                Replica::Standby
            },
            down_ms: rng.range(0, 30) * 100,
        },
        // Past the lease: the standby takes over while the leader is frozen.
        "pause-leader" => Fault::PauseLeader {
            ms: lease + rng.range(10, 60) * 100,
        },
        // Half of them shorter than the lease (the operator rides it out), half past it (it
        // loses its lease and exits; the runner starts it again as a Deployment would).
        "pause-apiserver" => Fault::PauseApiserver {
            ms: if rng.range(0, 1) == 0 {
                rng.range(10, (lease / 100).saturating_sub(10)) * 100
            } else {
                lease + rng.range(10, 60) * 100
            },
        },
        "restart-apiserver" => Fault::RestartApiserver,
        "update-bundle" => {
            let (name, spec) = live_bundle(rng)?;
            let spec = spec
                .mutate(rng, &config.pools)
                .without_pools(&d.closed_pools)?;
            d.demand_fits(Some(&name), Some(&spec))
                .then_some(Fault::UpdateBundle { name, spec })?
        }
        "delete-bundle" => Fault::DeleteBundle {
            name: live_bundle(rng)?.0,
        },
        "create-bundle" => {
            let spec = BundleSpec::draw(rng, &config.pools).without_pools(&d.closed_pools)?;
            d.demand_fits(None, Some(&spec))
                .then(|| Fault::CreateBundle {
                    name: format!("chaos-new-{}", d.created),
                    spec,
                })?
        }
        "recreate-bundle" => {
            let (name, old) = live_bundle(rng)?;
            let spec = old
                .mutate(rng, &config.pools)
                .without_pools(&d.closed_pools)?;
            d.demand_fits(Some(&name), Some(&spec))
                .then(|| Fault::RecreateBundle {
                    name,
                    spec,
                    gap_ms: rng.range(0, 30) * 100,
                })?
        }
        "migrate" => Fault::Migrate {
            name: format!("chaos-mig-{}", d.migrations),
            job: wave_job(rng)?,
            strategy: [None, None, Some("stopThenStart"), Some("overlap")]
                [rng.range(0, 3) as usize],
        },
        "drain" => Fault::Drain {
            node: free_node(rng)?,
            mode: if rng.range(0, 2) == 0 {
                DrainMode::Terminate
            } else {
                DrainMode::Migrate
            },
        },
        "cordon" => Fault::Cordon {
            node: free_node(rng)?,
            for_ms: (rng.range(0, 3) != 0).then(|| rng.range(20, 150) * 100),
        },
        "notice-node" => Fault::Notice {
            node: free_node(rng)?,
            in_ms: notice_in_ms(rng),
        },
        "notice-drained" => Fault::DrainNotice {
            node: free_node(rng)?,
            mode: if rng.range(0, 2) == 0 {
                DrainMode::Terminate
            } else {
                DrainMode::Migrate
            },
            after_ms: rng.range(10, 50) * 100,
            in_ms: notice_in_ms(rng),
        },
        "notice-migrated" => {
            // A job of a Bundle that holds its moves, when the wave has one.
            let held: Vec<&(String, BundleSpec)> =
                wave.iter().filter(|(_, s)| s.hold.is_some()).collect();
            let (bundle, spec) = if held.is_empty() {
                wave.get(rng.range(0, wave.len().max(1) as u64 - 1) as usize)?
            } else {
                held[rng.range(0, held.len() as u64 - 1) as usize]
            };
            let job = &spec.jobs[rng.range(0, spec.jobs.len() as u64 - 1) as usize];
            Fault::MigrateNotice {
                name: format!("chaos-mig-{}", d.migrations),
                job: JobRef {
                    bundle: bundle.clone(),
                    replica: rng.range(0, u64::from(spec.replicas) - 1) as u32,
                    job: job.name.to_owned(),
                },
                pools: spec.pools.clone(),
                after_ms: rng.range(10, 50) * 100,
                in_ms: notice_in_ms(rng),
            }
        }
        "delete-pool" => {
            let p = &config.pools[weighted_pool(rng, &config.pools)];
            let free: Vec<String> = p
                .node_ids()
                .into_iter()
                .map(|(id, _)| id)
                .filter(|id| !d.taken.contains(id))
                .collect();
            let node = free
                .get(rng.range(0, free.len().max(1) as u64 - 1) as usize)?
                .clone();
            Fault::DeletePool {
                pool: p.name.clone(),
                node,
                after_ms: rng.range(10, 60) * 100,
            }
        }
        "foreign-stop" | "foreign-start" => {
            let want = kind == "foreign-start";
            let jobs: Vec<&String> = d
                .foreign_running
                .iter()
                .filter(|(_, running)| **running != want)
                .map(|(job, _)| job)
                .collect();
            let job = jobs
                .get(rng.range(0, jobs.len().max(1) as u64 - 1) as usize)?
                .to_string();
            if want {
                Fault::ForeignStart {
                    job,
                    node: free_node(rng)?,
                }
            } else {
                Fault::ForeignStop { job }
            }
        }
        "foreign-delete" => {
            let ids: Vec<&String> = d.foreign_live.keys().collect();
            Fault::ForeignDelete {
                bundle: ids
                    .get(rng.range(0, ids.len().max(1) as u64 - 1) as usize)?
                    .to_string(),
            }
        }
        _ => {
            let p = &config.pools[rng.range(0, config.pools.len() as u64 - 1) as usize];
            Fault::PoolEdit {
                pool: p.name.clone(),
                packing: rng.pick(&["spread", "binpack"]),
            }
        }
    })
}

#[cfg(test)]
mod tests;
