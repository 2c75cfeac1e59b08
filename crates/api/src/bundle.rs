//! `Bundle`: a replicated group of jobs, the unit of work a user submits.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{BandOverrides, MigrationStrategy, PlacementRules, PriorityBand};
use crate::condition::Condition;
pub use crate::job_config::{JobConfig, MAX_JOB_CONFIG_DEPTH};
use crate::trace::PlacementTraceSummary;

pub use automanager_policy::vocab::{BundlePhase, JobState};

/// Most replicas a bundle may declare.
pub const MAX_REPLICAS: i32 = 16;
/// Most jobs in one replica.
pub const MAX_JOBS: usize = 16;
/// Most pools in a preference list.
pub const MAX_POOLS: usize = 16;
/// Longest Bundle name. Manager accepts ids of at most 253 bytes, and a job's id is
/// `<namespace>.<name>/<replica>/<jobName>`: 253 − 63 (namespace) − 1 − 1 − 2 (replica
/// index, at most 15) − 1 − 63 (jobName) leaves 122 for the name.
pub const MAX_NAME: usize = 122;
/// Largest job runtime configuration, serialized as JSON: what Manager accepts.
pub const MAX_JOB_CONFIG_BYTES: usize = 64 * 1024;

/// The schema of a job configuration: an opaque JSON object whose every field the apiserver keeps
/// as written, tracked by server-side apply as one value (see [`JobConfig`]).
fn job_config_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
        "x-kubernetes-map-type": "atomic"
    })
}

/// What one job needs from the node it runs on (the TypeScript library's `requirements`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobRequirements {
    /// Capacity the job uses, in benchmarked reference-workload units (whole units). 0 to 1,000,000.
    #[schemars(range(min = 0, max = 1_000_000))]
    pub required_capacity: i64,
    /// CPU cores the job pins (explicit cpuset). 0 to 4096.
    #[serde(default)]
    #[schemars(range(min = 0, max = 4096))]
    pub required_cores: i32,
    /// Capabilities the node must advertise, e.g. `nvidia-gpu` or `norsk.io/job-socket`.
    #[serde(default)]
    #[schemars(length(max = 16), inner(length(min = 1, max = 253)))]
    #[x_kube(validation = Rule::new("self.all(c, self.filter(d, d == c).size() == 1)").message("requiredCapabilities must not repeat a capability"))]
    pub required_capabilities: Vec<String>,
    /// `gold`, `silver` or `bronze`: what happens when the job fails (see the band table in the docs).
    pub priority_band: PriorityBand,
}

/// How a job may be moved between nodes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct JobMigration {
    /// The strongest promise the job keeps: `overlap`, `stopThenStart` (the default, safe for
    /// any job) or `handover` (the job speaks the job socket). A Migration may ask for a safer
    /// strategy than this, never a stronger one.
    #[serde(default)]
    pub strategy: MigrationStrategy,
}

/// One job of a replica (the TypeScript library's `BundleJobSpec`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.coLocateWith) || !(self.jobName in self.coLocateWith)").message("a job cannot list itself in coLocateWith").field_path(".coLocateWith"))]
#[x_kube(validation = Rule::new("!has(self.separateFrom) || !(self.jobName in self.separateFrom)").message("a job cannot list itself in separateFrom").field_path(".separateFrom"))]
#[x_kube(validation = Rule::new("!has(self.coLocateWith) || !has(self.separateFrom) || !self.coLocateWith.exists(n, n in self.separateFrom)").message("a job cannot be both co-located with and separated from the same job"))]
pub struct BundleJob {
    /// The job's name, unique within the bundle: a DNS label (lower-case letters, digits, `-`).
    /// It is the job's identity: Manager names each runtime instance after the bundle, the replica index and it.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub job_name: String,
    /// What the job needs from its node.
    pub requirements: JobRequirements,
    /// Jobs of the same replica that must run on the same node as this one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 63)))]
    pub co_locate_with: Vec<String>,
    /// Jobs of the same replica that must not run on the same node as this one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(min = 1, max = 63)))]
    pub separate_from: Vec<String>,
    /// How the job may be moved between nodes; absent means `stopThenStart`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<JobMigration>,
    /// The job's runtime configuration: any JSON object, opaque to AutoManager, at most 64 KiB
    /// as JSON and 64 levels deep. Manager starts the job with it; a change is pushed to the running job without a
    /// restart (the TypeScript library's `onJobConfigUpdated`). `status` shows the digest the
    /// job runs with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "job_config_schema")]
    pub config: Option<JobConfig>,
    /// What Manager runs for the job (its services, Norsk Media version, volumes, ...), as
    /// Manager's published API defines a job; the operator stamps in the job's id, tags and
    /// configuration. Stored in Manager over its published API (`manager.api: published`);
    /// our first API keeps no job definitions and ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<crate::job_template::JobTemplate>,
}

impl BundleJob {
    /// The configuration as Manager takes it: compact JSON, empty when there is none.
    pub fn config_bytes(&self) -> Vec<u8> {
        self.config
            .as_ref()
            .map(|c| c.as_json().as_bytes().to_vec())
            .unwrap_or_default()
    }
}

/// A short digest of a job configuration as Manager holds it (FNV-1a, 16 hex digits; for
/// telling configurations apart in status, not for security). `None` for no configuration.
pub fn config_digest(config: &[u8]) -> Option<String> {
    (!config.is_empty()).then(|| {
        format!(
            "{:016x}",
            automanager_policy::bounded::fnv1a(&String::from_utf8_lossy(config))
        )
    })
}

/// How many replicas voluntary actions may take down at once.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionBudget {
    /// The most replicas that may be down at once through voluntary actions (drains in both
    /// modes, Migrations, spare rotation); a replica that failed counts as down. Default 1, so a
    /// drain never takes primary and backup down together. `0` forbids every voluntary action
    /// on a running replica (drains then wait until the budget is changed). 0 to `replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 16))]
    pub max_unavailable_replicas: Option<i32>,
    /// Whether consolidation (a PlacementPool's `spec.consolidation`) may move this bundle's
    /// `stopThenStart` jobs, each with the gap in output that strategy has (default false:
    /// consolidation moves only `handover` and `overlap` jobs, which drop nothing).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_stop_then_start_consolidation: bool,
    /// When voluntary moves (drains, consolidation, rebalance, spare rotation) of this
    /// bundle's jobs may happen. Empty: at any time. The windows of each job's band in the
    /// operator's settings (`bands.<band>.disruptionWindows`) apply as well: a move waits until
    /// both admit it. Outside every window naming a reason, moves for it wait and their
    /// condition (reason `DisruptionWindow`) says until when and whose windows hold them;
    /// recovery from a failure and moves ahead of a reclaim notice are never held. At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub windows: Vec<crate::window::DisruptionWindow>,
}

/// Pools for one replica, overriding the bundle's `pools` (the TypeScript library's `replicaOverrides[i]`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaOverride {
    /// The replica index this override applies to, from 0 to `replicas - 1`.
    #[schemars(range(min = 0, max = 15))]
    pub replica: i32,
    /// Pools for this replica, in preference order; the next pool is tried only when the
    /// current one cannot take the whole replica.
    #[schemars(length(min = 1, max = 16), inner(length(min = 1, max = 63)))]
    #[x_kube(validation = Rule::new("self.all(p, self.filter(q, q == p).size() == 1)").message("pool names must be unique in a replica override's pools"))]
    pub pools: Vec<String>,
}

/// A replicated group of jobs: the TypeScript library's `Bundle`. Its bundle id in Manager is `<namespace>.<name>`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "automanager.norsk.io",
    version = "v1alpha1",
    kind = "Bundle",
    plural = "bundles",
    namespaced,
    shortname = "bdl",
    category = "automanager",
    status = "BundleStatus",
    validation = Rule::new("self.metadata.name.size() <= 122").message("a Bundle's name may be at most 122 characters: Manager's job ids (<namespace>.<name>/<replica>/<jobName>) are at most 253 bytes"),
    doc = "A replicated group of live-video jobs: how many replicas, which pools they may run in (in preference order), what each job needs and how replicas and jobs are kept apart or together.",
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(
        name = "Placed",
        type_ = "integer",
        json_path = ".status.placedReplicas"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.replicaOverrides) || self.replicaOverrides.all(o, o.replica < self.replicas)").message("replicaOverrides[].replica must be less than replicas (replica indexes start at 0)").field_path(".replicaOverrides"))]
#[x_kube(validation = Rule::new("!has(self.disruption) || !has(self.disruption.maxUnavailableReplicas) || self.disruption.maxUnavailableReplicas <= self.replicas").message("disruption.maxUnavailableReplicas must not exceed replicas").field_path(".disruption.maxUnavailableReplicas"))]
#[x_kube(validation = Rule::new("self.jobs.all(j, !has(j.coLocateWith) || j.coLocateWith.all(n, self.jobs.exists(k, k.jobName == n)))").message("coLocateWith must name jobs of this bundle").field_path(".jobs"))]
#[x_kube(validation = Rule::new("self.jobs.all(j, !has(j.separateFrom) || j.separateFrom.all(n, self.jobs.exists(k, k.jobName == n)))").message("separateFrom must name jobs of this bundle").field_path(".jobs"))]
#[x_kube(validation = Rule::new("self.jobs.all(j, !has(j.coLocateWith) || j.coLocateWith.all(n, self.jobs.all(k, k.jobName != n || !has(k.separateFrom) || !(j.jobName in k.separateFrom))))").message("contradictory rules: a job is co-located with a job that is separated from it").field_path(".jobs"))]
#[x_kube(validation = Rule::new("!has(self.intraReplicaPlacement) || !(self.intraReplicaPlacement.node.relation == 'same' && self.intraReplicaPlacement.node.enforcement == 'hard') || self.jobs.all(j, !has(j.separateFrom))").message("contradictory rules: intraReplicaPlacement.node is 'same' (hard) but a job has separateFrom").field_path(".intraReplicaPlacement"))]
#[x_kube(validation = Rule::new("!has(self.intraReplicaPlacement) || !(self.intraReplicaPlacement.node.relation == 'different' && self.intraReplicaPlacement.node.enforcement == 'hard') || self.jobs.all(j, !has(j.coLocateWith))").message("contradictory rules: intraReplicaPlacement.node is 'different' (hard) but a job has coLocateWith").field_path(".intraReplicaPlacement"))]
pub struct BundleSpec {
    /// Number of replicas: 1 = no backup, 2 = primary + backup, N = N-way redundancy. 1 to 16.
    #[schemars(range(min = 1, max = 16))]
    pub replicas: i32,
    /// Pools in preference order. Placement tries the first; the next is tried only when the
    /// current one cannot take the whole replica (spill).
    #[schemars(length(min = 1, max = 16), inner(length(min = 1, max = 63)))]
    #[x_kube(validation = Rule::new("self.all(p, self.filter(q, q == p).size() == 1)").message("pool names must be unique in pools"))]
    pub pools: Vec<String>,
    /// The jobs every replica runs; 1 to 16, `jobName` unique. A job cannot be renamed in
    /// place: remove the old name in one update and add the new one in another, so the running
    /// instances of the old name are stopped rather than lost track of.
    #[schemars(length(min = 1, max = 16))]
    #[x_kube(validation = Rule::new("self.all(j, self.filter(k, k.jobName == j.jobName).size() == 1)").message("jobName must be unique within the bundle"))]
    #[x_kube(validation = Rule::new("self.all(j, oldSelf.exists(o, o.jobName == j.jobName)) || oldSelf.all(o, self.exists(j, j.jobName == o.jobName))").message("a job cannot be renamed in place (its running instances would be lost track of): remove the old jobName in one update and add the new one in another"))]
    pub jobs: Vec<BundleJob>,
    /// Per-replica pool preferences, overriding `pools` for that replica. The TypeScript library writes this as
    /// a map keyed by replica index (`{1: {pools: [...]}}`); Kubernetes API conventions have no
    /// maps keyed by number, so here it is a list keyed by `replica`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["replica"]))]
    pub replica_overrides: Vec<ReplicaOverride>,
    /// Rules between the jobs of one replica (default: none beyond each job's coLocateWith /
    /// separateFrom).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intra_replica_placement: Option<PlacementRules>,
    /// Rules between replicas. Default: node `different` (hard), zone `same` (soft).
    #[serde(default = "PlacementRules::inter_replica_default")]
    pub inter_replica_placement: PlacementRules,
    /// Per-band overrides of the operator's failure policy for this bundle's jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bands: Option<BandOverrides>,
    /// The disruption budget: how many replicas voluntary actions may take down at once
    /// (default 1). Involuntary failures are never blocked, but count as down replicas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption: Option<DisruptionBudget>,
    /// Move a replica back when a soft placement rule it breaks (for example replicas no
    /// longer in the same zone after a recovery) could hold again: once capacity allows, the
    /// operator creates a Migration (label `automanager.norsk.io/purpose: rebalance`) with each
    /// job's declared strategy, which the migration queue and the disruption budget govern.
    /// Rate-limited fleet-wide by the operator's `rebalance.maxPerMinute`. Default false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rebalance: bool,
}

impl BundleSpec {
    /// The disruption budget in effect (`maxUnavailableReplicas`, default 1), or why the
    /// declared one cannot be honoured.
    pub fn max_unavailable_replicas(
        &self,
    ) -> Result<u32, automanager_policy::disruption::BudgetError> {
        automanager_policy::disruption::max_unavailable(
            i64::from(self.replicas),
            self.disruption
                .as_ref()
                .and_then(|d| d.max_unavailable_replicas)
                .map(i64::from),
        )
    }

    /// The bundle's disruption windows as a calendar, or why one cannot be read.
    pub fn disruption_calendar(
        &self,
    ) -> Result<automanager_policy::calendar::Calendar, automanager_policy::calendar::WindowError>
    {
        crate::window::calendar(
            self.disruption
                .as_ref()
                .map_or(&[][..], |d| d.windows.as_slice()),
        )
    }

    /// Pools for `replica`: its override if there is one, else the bundle's `pools`.
    pub fn pools_for_replica(&self, replica: i32) -> &[String] {
        self.replica_overrides
            .iter()
            .find(|o| o.replica == replica)
            .map(|o| o.pools.as_slice())
            .unwrap_or(self.pools.as_slice())
    }

    /// Intra-replica rules in effect.
    pub fn intra_replica_rules(&self) -> PlacementRules {
        self.intra_replica_placement
            .unwrap_or_else(PlacementRules::intra_replica_default)
    }
}

/// One job of one replica.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct JobStatus {
    /// The job's name in the spec.
    #[schemars(length(max = 63))]
    pub job_name: String,
    /// Manager's runtime job id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub job_id: Option<String>,
    /// The node the job runs on (Manager's node id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node_id: Option<String>,
    /// The node's pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub pool: Option<String>,
    /// The node's availability zone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub zone: Option<String>,
    /// The job's state.
    #[serde(default)]
    pub state: JobState,
    /// Restarts of this job within the last hour.
    #[serde(default)]
    pub restarts_last_hour: i32,
    /// A summary of the last placement decision for this job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_placement: Option<PlacementTraceSummary>,
    /// The digest of the runtime configuration Manager holds for the job (see `spec.jobs[].config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    pub config_digest: Option<String>,
    /// Whether that configuration is the one the spec asks for (false while a change is on its way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_applied: Option<bool>,
}

/// One replica of the bundle.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaStatus {
    /// The replica index.
    pub replica: i32,
    /// Restarts of this replica within the last hour (the count `maxRestartsPerHour` bounds).
    #[serde(default)]
    pub restarts_last_hour: i32,
    /// When those restarts happened, oldest first: the history the count is taken from, kept
    /// here so an operator restart or a leader change keeps the ceiling.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1000))]
    pub restart_times: Vec<chrono::DateTime<chrono::Utc>>,
    /// The replica's jobs.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub jobs: Vec<JobStatus>,
}

/// What the operator observes of a bundle.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct BundleStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Pending`, `Placing`, `Ready`, `Degraded`, `Broken` or `Deleting`.
    #[serde(default)]
    pub phase: BundlePhase,
    /// Replicas whose every job is running.
    #[serde(default)]
    pub placed_replicas: i32,
    /// Per replica and job: where it runs and how it got there.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub replicas: Vec<ReplicaStatus>,
    /// The retry annotation value the operator last acted on (see `automanager.norsk.io/retry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub last_retry: Option<String>,
    /// kstatus `Ready`, `Reconciling` and `Stalled` (see docs/kstatus.md), and `Broken`, each with
    /// `observedGeneration`.
    #[serde(default)]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_yaml(extra: &str) -> BundleSpec {
        let yaml = format!(
            "replicas: 2\npools: [aws-east, aws-west]\njobs:\n  - jobName: encode\n    requirements: {{requiredCapacity: 8, priorityBand: gold}}\n{extra}"
        );
        serde_saphyr::from_str(&yaml).expect("valid spec")
    }

    #[test]
    fn inter_replica_rules_default_to_different_node_hard_and_same_zone_soft() {
        let spec = spec_yaml("");
        assert_eq!(
            spec.inter_replica_placement,
            PlacementRules::inter_replica_default()
        );
        assert_eq!(
            spec.intra_replica_rules(),
            PlacementRules::intra_replica_default()
        );
    }

    #[test]
    fn a_replica_override_replaces_the_bundle_pools_for_that_replica_only() {
        let spec = spec_yaml("replicaOverrides:\n  - replica: 1\n    pools: [oci-fra, aws-east]\n");
        assert_eq!(spec.pools_for_replica(0), ["aws-east", "aws-west"]);
        assert_eq!(spec.pools_for_replica(1), ["oci-fra", "aws-east"]);
    }

    #[test]
    fn the_disruption_budget_defaults_to_one_and_refuses_more_than_replicas() {
        assert_eq!(spec_yaml("").max_unavailable_replicas(), Ok(1));
        let zero = spec_yaml("disruption: {maxUnavailableReplicas: 0}\n");
        assert_eq!(zero.max_unavailable_replicas(), Ok(0));
        let over = spec_yaml("disruption: {maxUnavailableReplicas: 3}\n");
        assert!(over.max_unavailable_replicas().is_err());
        let negative = spec_yaml("disruption: {maxUnavailableReplicas: -1}\n");
        assert!(negative.max_unavailable_replicas().is_err());
    }

    #[test]
    fn an_absent_migration_strategy_means_stop_then_start() {
        let spec = spec_yaml("");
        let strategy = spec.jobs[0].migration.unwrap_or_default().strategy;
        assert_eq!(strategy, MigrationStrategy::StopThenStart);
    }
}
