//! `Migration`: a request to move one running job to another node.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::MigrationStrategy;
use crate::condition::Condition;

pub use automanager_policy::vocab::{
    AbortInfo, FailedParticipant, HandoverSummary, MigrationPhase, PhaseTransition,
};

/// The job instance to move: a job of a replica of a bundle in the Migration's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationJobRef {
    /// The Bundle's name (same namespace as the Migration).
    #[schemars(length(min = 1, max = 253))]
    pub bundle: String,
    /// The replica index.
    #[schemars(range(min = 0, max = 15))]
    pub replica: i32,
    /// The job's name in the bundle.
    #[schemars(length(min = 1, max = 63))]
    pub job_name: String,
}

/// An operator's request to stop a migration.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigrationAbort {
    /// Why: recorded in status and Events.
    #[schemars(length(min = 1, max = 1024))]
    pub reason: String,
}

/// Move one job (the TypeScript library's `migrateJob(jobId, targetNodeId)`).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "automanager.norsk.io",
    version = "v1alpha1",
    kind = "Migration",
    plural = "migrations",
    namespaced,
    shortname = "amig",
    category = "automanager",
    status = "MigrationStatus",
    doc = "A request to move one running job to another node with the overlap, stopThenStart or handover strategy.",
    printcolumn(name = "Bundle", type_ = "string", json_path = ".spec.job.bundle"),
    printcolumn(name = "Replica", type_ = "integer", json_path = ".spec.job.replica"),
    printcolumn(name = "Job", type_ = "string", json_path = ".spec.job.jobName"),
    printcolumn(name = "Strategy", type_ = "string", json_path = ".status.strategy"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Target", type_ = "string", json_path = ".status.targetNode"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.job == oldSelf.job").message("job is immutable: create a new Migration"))]
#[x_kube(validation = Rule::new("has(self.targetNode) == has(oldSelf.targetNode) && (!has(self.targetNode) || self.targetNode == oldSelf.targetNode)").message("targetNode is immutable: create a new Migration"))]
#[x_kube(validation = Rule::new("has(self.strategy) == has(oldSelf.strategy) && (!has(self.strategy) || self.strategy == oldSelf.strategy)").message("strategy is immutable: create a new Migration"))]
#[x_kube(validation = Rule::new("!has(oldSelf.abort) || (has(self.abort) && self.abort == oldSelf.abort)").message("an abort cannot be withdrawn or changed once requested"))]
pub struct MigrationSpec {
    /// The job to move.
    pub job: MigrationJobRef,
    /// The node to move it to (Manager's node id). Absent: the placement engine picks one,
    /// excluding the source node and honouring the bundle's rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub target_node: Option<String>,
    /// The strategy to use. It may only be as safe as or safer than the job's declared strategy
    /// (safest first: `stopThenStart`, `overlap`, `handover`); a stronger one is refused.
    /// Absent: the job's declared strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<MigrationStrategy>,
    /// Set to abort the migration while it is abortable (until the source has stopped output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort: Option<MigrationAbort>,
}

/// What the migration controller observes and did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct MigrationStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The current phase.
    #[serde(default)]
    pub phase: MigrationPhase,
    /// The strategy in effect (the request, or the job's declaration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<MigrationStrategy>,
    /// Manager's migration id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub migration_id: Option<String>,
    /// The job's id in Manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub job_id: Option<String>,
    /// The node the job ran on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub source_node: Option<String>,
    /// The node it is moving to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub target_node: Option<String>,
    /// While the migration waits in `Pending` for the migration queue (parallelism limits or
    /// a disruption budget): its place among the waiting migrations, from 1. The `Queued`
    /// condition says why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<i32>,
    /// While the migration is held in `Pending` by a Broken bundle, a disruption budget or a
    /// closed disruption window: who holds it and since when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<crate::node::Hold>,
    /// Every phase entered, with its time.
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub phases: Vec<PhaseTransition>,
    /// The handover's outcome, for `handover` migrations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover: Option<HandoverSummary>,
    /// Set when the migration was aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort: Option<AbortInfo>,
    /// kstatus `Ready` (completed), `Reconciling` and `Stalled` (see docs/kstatus.md), and
    /// `Progressing`, `Aborted`, `Rejected`, `Queued`, each with `observedGeneration`.
    #[serde(default)]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
