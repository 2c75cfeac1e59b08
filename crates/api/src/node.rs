//! `ManagerNode`: a node Manager runs, mirrored into Kubernetes by the operator.
//!
//! The operator creates, updates and deletes these objects from its mirror of Manager; status is
//! the operator's. `spec.cordoned` and `spec.drain` are the user's: they are how a person takes a
//! node out of service with `kubectl`.

use chrono::{DateTime, Utc};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::PriorityBand;
use crate::condition::Condition;
use crate::pool::PoolKind;

/// How a drain empties a node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum DrainMode {
    /// Cordon, then terminate the node; its jobs recover per their band (gold prefers a spare,
    /// bronze is dropped).
    Terminate,
    /// Cordon, then move every job off the node with a Migration (the drop-free drain), at most
    /// `migration.drainParallelism` at a time; only jobs whose migration fails fall back to band
    /// recovery. Once no job is left, the node is terminated.
    Migrate,
}

/// What a `terminate` drain does once a hold (a Broken bundle, a disruption budget or a
/// closed disruption window) has kept it waiting past the operator's
/// `disruption.holdWarnAfter`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum WhenHeld {
    /// Keep waiting for the holder to let the drain through (a Warning Event and the
    /// `automanager_held_moves` metric say it waits too long).
    #[default]
    Wait,
    /// Terminate the node anyway, as the TypeScript library's `drainNode` does (it never waits
    /// for a budget): its jobs recover by band, gold preferring a spare, bronze dropped.
    Proceed,
}

/// A request to empty the node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.whenHeld) || self.mode == 'terminate'").message("whenHeld applies to mode: terminate; a migrate drain always waits for its holds"))]
pub struct Drain {
    /// `terminate` or `migrate`.
    pub mode: DrainMode,
    /// For `mode: terminate`: what to do once a hold has kept the drain waiting past the
    /// operator's `disruption.holdWarnAfter`: `Wait` (the default) or `Proceed` (terminate the
    /// node as the TypeScript library would; its jobs recover by band).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_held: Option<WhenHeld>,
}

impl Drain {
    /// What the drain does once held past the bound (`Wait` when not said).
    pub fn when_held(&self) -> WhenHeld {
        self.when_held.unwrap_or_default()
    }
}

/// What holds a voluntary move back.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
pub enum HoldKind {
    /// A Bundle that is Broken: its replicas that are down are not restarted until someone
    /// retries it, so its disruption budget stays spent.
    BrokenBundle,
    /// A Bundle's disruption budget (`spec.disruption.maxUnavailableReplicas`): replicas are down
    /// or being moved already.
    DisruptionBudget,
    /// A closed disruption window, the Bundle's (`spec.disruption.windows`) or its job's band's
    /// (`bands.<band>.disruptionWindows` in the operator's settings).
    DisruptionWindow,
}

impl HoldKind {
    /// The name used in conditions, Events and the metric's `reason` label.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldKind::BrokenBundle => "BrokenBundle",
            HoldKind::DisruptionBudget => "DisruptionBudget",
            HoldKind::DisruptionWindow => "DisruptionWindow",
        }
    }
}

/// Who holds a drain or a Migration back, and since when.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hold {
    /// `BrokenBundle`, `DisruptionBudget` or `DisruptionWindow`.
    pub kind: HoldKind,
    /// The holder: `Bundle <namespace>/<name>` for a Broken bundle or a budget; for a window,
    /// whose windows hold (`Bundle <namespace>/<name>'s disruption windows`, or a band's in the
    /// operator's settings).
    #[schemars(length(max = 512))]
    pub holder: String,
    /// For a window: when it next opens (absent when the windows cannot be read or do not
    /// open together soon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opens_at: Option<DateTime<Utc>>,
    /// For a window: the one that opens then, as `<schedule> for <duration> (<time zone>)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 512))]
    pub window: Option<String>,
    /// When the move was first held (kept while the holder changes).
    pub since: DateTime<Utc>,
    /// When the hold passed the operator's `disruption.holdWarnAfter` (a Warning Event and the
    /// `automanager_held_moves` metric).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub past_bound_at: Option<DateTime<Utc>>,
    /// When a `terminate` drain with `whenHeld: Proceed` stopped waiting and terminated the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proceeded_at: Option<DateTime<Utc>>,
    /// Why, in words.
    #[serde(default)]
    #[schemars(length(max = 2048))]
    pub message: String,
}

/// The user's wishes for a node.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "automanager.norsk.io",
    version = "v1alpha1",
    kind = "ManagerNode",
    plural = "managernodes",
    shortname = "mnode",
    category = "automanager",
    status = "ManagerNodeStatus",
    doc = "A node Manager runs, mirrored by the operator. Set spec.cordoned to stop new placements, spec.drain to empty it.",
    printcolumn(name = "Pool", type_ = "string", json_path = ".status.pool"),
    printcolumn(name = "Zone", type_ = "string", json_path = ".status.zone"),
    printcolumn(name = "Used", type_ = "integer", json_path = ".status.usedCapacity"),
    printcolumn(
        name = "Capacity",
        type_ = "integer",
        json_path = ".status.totalCapacity"
    ),
    printcolumn(name = "Cordoned", type_ = "boolean", json_path = ".spec.cordoned"),
    printcolumn(name = "Spare", type_ = "boolean", json_path = ".status.spare"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    // Shown by `kubectl get -o wide`; `kubectl automanager top` reads every column as a Table,
    // which is a fraction of the size of the objects (their job lists) on a big fleet.
    printcolumn(
        name = "Instance Type",
        type_ = "string",
        json_path = ".status.instanceType",
        priority = "1"
    ),
    printcolumn(
        name = "Cores Used",
        type_ = "integer",
        json_path = ".status.usedCores",
        priority = "1"
    ),
    printcolumn(
        name = "Cores",
        type_ = "integer",
        json_path = ".status.totalCores",
        priority = "1"
    ),
    printcolumn(
        name = "Jobs",
        type_ = "integer",
        json_path = ".status.jobCount",
        priority = "1"
    ),
    printcolumn(
        name = "Healthy",
        type_ = "boolean",
        json_path = ".status.healthy",
        priority = "1"
    ),
    printcolumn(
        name = "Drain",
        type_ = "string",
        json_path = ".spec.drain.mode",
        priority = "1"
    ),
    printcolumn(
        name = "Capabilities",
        type_ = "string",
        json_path = ".status.capabilities",
        priority = "1"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(oldSelf.drain) || (has(self.drain) && self.drain == oldSelf.drain)").message("a drain cannot be withdrawn or changed once requested"))]
pub struct ManagerNodeSpec {
    /// When true no new placement lands on this node; running jobs stay.
    #[serde(default)]
    pub cordoned: bool,
    /// Set to empty the node: cordon, then `terminate` it or `migrate` its jobs away.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<Drain>,
}

/// A node's life as Manager reports it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NodeState {
    /// Being provisioned or booting.
    #[default]
    Starting,
    /// Up and accepting jobs.
    Started,
    /// Being stopped on request: shutting down, keeping its disk and id.
    Stopping,
    /// Stopped on request: powered off, keeping its disk and id, costing no compute (a warm
    /// spare); started again in its pool's start latency.
    Stopped,
    /// Not reachable (a partition, say); it may come back. Removed after
    /// `removeStoppedNodesAfter` if it does not.
    Unreachable,
    /// Terminated; the object is removed after `removeStoppedNodesAfter`.
    Terminated,
}

/// One job instance on the node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeJob {
    /// Manager's job id.
    #[schemars(length(max = 256))]
    pub job_id: String,
    /// The owning bundle, `<namespace>/<name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 317))]
    pub bundle: Option<String>,
    /// The replica index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<i32>,
    /// The job's name in its bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub job_name: Option<String>,
    /// The instance's role: empty for a normal instance, `migrationTarget` for a migration's target.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 63))]
    pub role: String,
    /// Capacity the job uses.
    #[serde(default)]
    pub capacity: i64,
}

/// Progress of a drain.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainStatus {
    /// Jobs still on the node.
    #[serde(default)]
    pub jobs_remaining: i32,
    /// Jobs moved by a completed migration.
    #[serde(default)]
    pub jobs_migrated: i32,
    /// Jobs recovered by band rules (restarted elsewhere).
    #[serde(default)]
    pub jobs_recovered: i32,
    /// Bronze jobs dropped.
    #[serde(default)]
    pub jobs_dropped: i32,
    /// When the drain started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// When the drain finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<DateTime<Utc>>,
}

/// What Manager reports of the node, and what the operator concluded.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManagerNodeStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Manager's node id (the object name is derived from it).
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub node_id: String,
    /// `aws`, `oci` or `cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<PoolKind>,
    /// The pool the node belongs to.
    #[serde(default)]
    #[schemars(length(max = 63))]
    pub pool: String,
    /// The provider region.
    #[serde(default)]
    #[schemars(length(max = 63))]
    pub region: String,
    /// The availability zone.
    #[serde(default)]
    #[schemars(length(max = 63))]
    pub zone: String,
    /// The instance type.
    #[serde(default)]
    #[schemars(length(max = 63))]
    pub instance_type: String,
    /// `starting`, `started`, `stopping`, `stopped` (on request: a warm spare), `unreachable` or
    /// `terminated`.
    #[serde(default)]
    pub state: NodeState,
    /// Capacity the node advertises.
    #[serde(default)]
    pub total_capacity: i64,
    /// Capacity its jobs use.
    #[serde(default)]
    pub used_capacity: i64,
    /// Cores the node advertises.
    #[serde(default)]
    pub total_cores: i32,
    /// Cores its jobs pin.
    #[serde(default)]
    pub used_cores: i32,
    /// Capabilities the node advertises (`norsk.io/job-socket` while its worker's listener is up).
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(max = 253)))]
    pub capabilities: Vec<String>,
    /// Whether the node is a hot spare (provisioned with `spare=true`, holding no job).
    #[serde(default)]
    pub spare: bool,
    /// The band a spare is dedicated to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spare_band: Option<PriorityBand>,
    /// False when the node's start-rejection rate tripped the threshold: placement avoids it.
    #[serde(default = "default_true")]
    pub healthy: bool,
    /// Start rejections counted in the current window.
    #[serde(default)]
    pub recent_rejections: i32,
    /// Unhealthy episodes in a row, each beginning within the operator's
    /// `nodeHealth.flapMemory` of the one before: a flapping node is kept out longer each time
    /// (the rejection window, doubled per episode, up to `nodeHealth.flapMaxHold`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unhealthy_episodes: i32,
    /// While the node is held out: placement avoids it until then, whatever its rejections.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out_until: Option<DateTime<Utc>>,
    /// Job instances on the node.
    #[serde(default)]
    #[schemars(length(max = 512))]
    pub jobs: Vec<NodeJob>,
    /// How many job instances run on the node (all of them, where `jobs` keeps at most 512).
    #[serde(default)]
    pub job_count: i32,
    /// Drain progress, when a drain was requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainStatus>,
    /// While a drain is held back (by a Broken bundle, a disruption budget or a closed
    /// window): who holds it and since when; kept with `proceededAt` once a `whenHeld: Proceed`
    /// drain went ahead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Hold>,
    /// When Manager reported the node unreachable or terminated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped_at: Option<DateTime<Utc>>,
    /// When the provider will take the node (a reclaim notice such as a Spot interruption):
    /// the operator moves its jobs before then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_at: Option<DateTime<Utc>>,
    /// Why the node will be taken, e.g. `spot-interruption` or `maintenance`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub reclaim_reason: Option<String>,
    /// kstatus `Ready`, `Reconciling` and `Stalled` (see docs/kstatus.md), `Cordoned`,
    /// `Unhealthy` and, once a drain has waited for a disruption budget, `DisruptionBlocked`, each
    /// with `observedGeneration`.
    #[serde(default)]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn default_true() -> bool {
    true
}
