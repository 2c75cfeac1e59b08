//! The bounded summary of one placement decision, as kept in a Bundle's status.
//!
//! It has a fixed maximum size whatever the cluster's size: at most [`MAX_POOLS_TRIED`] pools,
//! one count per rejection reason, at most [`MAX_BROKEN_SOFT_RULES`] broken soft rules. The full
//! trace (every candidate) is served by the operator at `/debug/trace/<namespace>/<bundle>`.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most pools listed in [`PlacementTraceSummary::pools_tried`].
pub const MAX_POOLS_TRIED: usize = 16;
/// Most rejection counts in [`PlacementTraceSummary::rejections`].
pub const MAX_REJECTION_REASONS: usize = 16;
/// Most entries in [`PlacementTraceSummary::broken_soft_rules`].
pub const MAX_BROKEN_SOFT_RULES: usize = 8;
/// Most job ids in [`Preemption::victims`].
pub const MAX_PREEMPTION_VICTIMS: usize = 16;

/// Bronze jobs stopped to make room for a recovery (preemption, `bands.<band>.preempt` in the
/// operator's settings).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Preemption {
    /// When the victims were stopped.
    pub at: DateTime<Utc>,
    /// The node they ran on, where the recovering replica goes.
    #[schemars(length(max = 253))]
    pub node: String,
    /// Manager's ids of the stopped jobs, newest first (at most 16).
    #[schemars(length(max = 16), inner(length(max = 512)))]
    pub victims: Vec<String>,
}

/// The outcome of one placement decision.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PlacementOutcome {
    /// Every job of the replica got a node.
    Placed,
    /// No node fits yet; a node is being provisioned in an elastic pool.
    Provisioning,
    /// No pool could take the replica.
    Unplaceable,
}

/// What happened in one pool during a decision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolAttempt {
    /// The pool's name.
    #[schemars(length(max = 63))]
    pub pool: String,
    /// `placed`, `provisioning` or `unplaceable` (the replica left this pool).
    pub outcome: PlacementOutcome,
    /// Why the replica left this pool, or what was chosen in it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub reason: String,
}

/// How many candidate nodes were rejected for one reason.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RejectionCount {
    /// The reason, as a stable camelCase word (`insufficientCapacity`, `insufficientCores`,
    /// `missingCapability`, `cordoned`, `unhealthy`, `spareReserved`, `separateFrom`,
    /// `interReplicaDifferentNode`, …).
    #[schemars(length(max = 63))]
    pub reason: String,
    /// Candidates rejected for it.
    pub count: i64,
}

/// A bounded summary of one placement decision for one job.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementTraceSummary {
    /// When the decision was made.
    pub decided_at: DateTime<Utc>,
    /// `placed`, `provisioning` or `unplaceable`.
    pub outcome: PlacementOutcome,
    /// Whether this was a recovery placement (after a failure), which may use hot spares.
    #[serde(default)]
    pub recovery: bool,
    /// The node chosen, when placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub node: Option<String>,
    /// The pool chosen (or being grown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub pool: Option<String>,
    /// The chosen node's score (higher is better); how it is computed depends on the pool's packing strategy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub score: Option<f64>,
    /// Pools tried, in order, and why each was left.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub pools_tried: Vec<PoolAttempt>,
    /// Candidate nodes rejected, counted per reason.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub rejections: Vec<RejectionCount>,
    /// Soft rules the chosen placement could not honour (a later rebalance may fix them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8), inner(length(max = 256)))]
    pub broken_soft_rules: Vec<String>,
    /// One sentence for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 1024))]
    pub message: String,
    /// Bronze jobs this recovery stopped to make room, when it had to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted: Option<Preemption>,
}
