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

/// How many spares a tier keeps: a `count`, or a `percent` of the pool's working nodes (rounded
/// up) kept within `min` and `max` (the shape of the Kubernetes cluster autoscaler's
/// CapacityBuffer proposal).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, KubeSchema, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.count) != has(self.percent)").message("a tier sets count or percent, exactly one"))]
#[x_kube(validation = Rule::new("!has(self.count) || (!has(self.min) && !has(self.max))").message("min and max bound a percent; a count stands alone"))]
#[x_kube(validation = Rule::new("!has(self.min) || !has(self.max) || self.min <= self.max").message("min must not exceed max"))]
pub struct TierSize {
    /// Exactly this many spares. 0 to 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub count: Option<i32>,
    /// This share of the pool's working nodes (those running jobs), rounded up. 0 to 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100))]
    pub percent: Option<i32>,
    /// At least this many when `percent` is set (default 0). 0 to 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub min: Option<i32>,
    /// At most this many when `percent` is set (default 1000). 0 to 1000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub max: Option<i32>,
}

impl TierSize {
    /// The size as the tiers planner reads it.
    pub fn to_policy(&self) -> automanager_policy::tiers::TierSize {
        use automanager_policy::tiers::TierSize as P;
        let n = |v: Option<i32>, d: u32| v.map_or(d, |v| u32::try_from(v).unwrap_or(0));
        match (self.count, self.percent) {
            (_, Some(percent)) => P::Share {
                percent: n(Some(percent), 0),
                min: n(self.min, 0),
                max: n(self.max, automanager_policy::spares::MAX_TARGET_COUNT),
            },
            (count, None) => P::Count(n(count, 0)),
        }
    }
}

/// Tier sizes that apply while a recurrence is open, e.g. 12 hot spares from Friday 18:00 for
/// 5h30m in Europe/Oslo. The operator applies a schedule ahead of its window by the pool's start
/// latency, so the spares run when the window opens; it ends on time. Where schedules overlap
/// the larger size wins; outside every schedule `hot` (or `targetCount`) and `warm` apply.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.hot) || has(self.warm)").message("a schedule sets hot, warm or both"))]
pub struct SpareSchedule {
    /// A five-field cron pattern (e.g. `0 18 * * FRI`) or `@daily`, `@weekly`, ...
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new(crate::window::SCHEDULE_RULE).message("schedule must be a five-field cron pattern such as '0 18 * * FRI', or @daily, @weekly, @monthly"))]
    #[x_kube(validation = Rule::new(crate::window::NEVER_OPENS_RULE).message(crate::window::NEVER_OPENS_MESSAGE))]
    pub schedule: String,
    /// How long it lasts from each start (elapsed time, e.g. `5h30m`), 1m to 744h.
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = Rule::new(crate::window::WINDOW_DURATION_RULE).message(crate::window::WINDOW_DURATION_MESSAGE))]
    pub duration: String,
    /// The IANA time zone, e.g. `Europe/Oslo`. Default `UTC`.
    #[serde(default = "utc", skip_serializing_if = "is_utc")]
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = Rule::new(crate::window::TIME_ZONE_RULE).message(crate::window::TIME_ZONE_MESSAGE))]
    pub time_zone: String,
    /// Hot spares while the schedule applies (default: as outside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot: Option<TierSize>,
    /// Warm spares while the schedule applies (default: as outside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<TierSize>,
}

fn utc() -> String {
    "UTC".to_owned()
}

fn is_utc(s: &str) -> bool {
    s == "UTC"
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
    printcolumn(name = "Target", type_ = "integer", json_path = ".status.targetCount"),
    printcolumn(name = "Live", type_ = "integer", json_path = ".status.liveSpares"),
    printcolumn(name = "Warm", type_ = "integer", json_path = ".status.warmSpares"),
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
#[x_kube(validation = Rule::new("!has(self.hot) || self.targetCount == 0").message("set targetCount or hot, not both"))]
pub struct HotSpareTargetSpec {
    /// The PlacementPool the spares belong to.
    #[schemars(length(min = 1, max = 63))]
    pub pool: String,
    /// How many live (hot) spares to keep. 0 to 1000; `hot` says the same as a count or a share.
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub target_count: i32,
    /// Hot spares (running, empty: a gold job restarts on one within a second): a count or a
    /// share of the pool. Replaces `targetCount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hot: Option<TierSize>,
    /// Warm spares (stopped: they keep their disk, cost no compute, and start in the pool's
    /// start latency, tens of seconds on a cloud). A hot spare taken by a recovery is refilled
    /// by starting a warm one first; the warm tier refills by creating and stopping nodes.
    /// `cluster` pools cannot stop nodes and have no warm tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<TierSize>,
    /// Time-scoped sizes (e.g. more spares on Friday evenings). At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub schedules: Vec<SpareSchedule>,
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
    /// The target the reconciler is working to (hot spares; a schedule's while it applies).
    #[serde(default)]
    pub target_count: i32,
    /// Warm spares that are stopped and empty.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warm_spares: i32,
    /// Warm spares on their way (stopping, or created to be stopped).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pending_warm_spares: i32,
    /// The warm target in effect.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warm_target: i32,
    /// The schedules (by their `schedule` pattern) whose sizes apply now.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 128)))]
    pub active_schedules: Vec<String>,
    /// When the sizes in effect may next change (a schedule's lead begins or its window ends).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_change: Option<DateTime<Utc>>,
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

fn is_zero(n: &i32) -> bool {
    *n == 0
}
