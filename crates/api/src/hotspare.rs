//! `HotSpareTarget`: how many warm, empty nodes a pool keeps ready for recovery.

use chrono::{DateTime, Utc};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::PriorityBand;
use crate::condition::Condition;

/// The node a spare is provisioned as.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpareNodeSpec {
    /// The instance type to provision, e.g. `m5.xlarge`.
    #[schemars(length(min = 1, max = 63))]
    pub instance_type: String,
    /// The region to provision in.
    #[schemars(length(min = 1, max = 63))]
    pub region: String,
}

/// Spares for one pool and, optionally, one band (the TypeScript library's `hotSpares[]` entry).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "automanager.norsk.io",
    version = "v1alpha1",
    kind = "HotSpareTarget",
    plural = "hotsparetargets",
    shortname = "hst",
    category = "automanager",
    status = "HotSpareTargetStatus",
    doc = "Warm, empty nodes a pool keeps ready so a failed job can restart at once; optionally dedicated to one priority band.",
    printcolumn(name = "Pool", type_ = "string", json_path = ".spec.pool"),
    printcolumn(name = "Band", type_ = "string", json_path = ".spec.forBand"),
    printcolumn(name = "Target", type_ = "integer", json_path = ".spec.targetCount"),
    printcolumn(name = "Live", type_ = "integer", json_path = ".status.liveSpares"),
    printcolumn(
        name = "Pending",
        type_ = "integer",
        json_path = ".status.pendingSpares"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.pool == oldSelf.pool").message("pool is immutable: create a new HotSpareTarget instead"))]
pub struct HotSpareTargetSpec {
    /// The PlacementPool the spares belong to.
    #[schemars(length(min = 1, max = 63))]
    pub pool: String,
    /// How many live spares to keep. 0 to 1000.
    #[schemars(range(min = 0, max = 1000))]
    pub target_count: i32,
    /// Dedicate these spares to one band's recovery. Absent: any band may use them, gold first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_band: Option<PriorityBand>,
    /// The node to provision as a spare. The TypeScript library calls this field `spec`, so it is `spec.spec`.
    pub spec: SpareNodeSpec,
    /// Rotate spares older than this (a duration such as `24h` or `90m`, at least `1m`): a
    /// replacement is provisioned before the old spare is terminated, one at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^([0-9]+(\\\\.[0-9]+)?(ns|us|ms|s|m|h))+$') && duration(self) >= duration('1m')").message("maxAge must be a duration of at least 1m, such as 24h or 90m"))]
    pub max_age: Option<String>,
}

/// What the spare reconciler observes and did.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HotSpareTargetStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Spares that are up and hold no job.
    #[serde(default)]
    pub live_spares: i32,
    /// Spares being provisioned.
    #[serde(default)]
    pub pending_spares: i32,
    /// The target the reconciler is working to.
    #[serde(default)]
    pub target_count: i32,
    /// Since when live spares have been below target (absent when not in underflow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub underflow_since: Option<DateTime<Utc>>,
    /// When a spare was last rotated out for age.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rotation: Option<DateTime<Utc>>,
    /// The spare nodes' ids.
    #[serde(default)]
    #[schemars(length(max = 1000), inner(length(max = 253)))]
    pub spare_nodes: Vec<String>,
    /// kstatus `Ready`, `Reconciling` and `Stalled` (see docs/kstatus.md), `SpareUnderflow`
    /// (with pool, current and target in its message) and, once a spare that took a job waited
    /// for a disruption budget, `DisruptionBlocked`, each with `observedGeneration`.
    #[serde(default)]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
