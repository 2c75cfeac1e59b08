//! The domain's vocabulary: priority bands, failure policy, migration strategies and phases.
//!
//! Defined here, kube-free, so the pure policy speaks the same words as the API: the CRD types in
//! `automanager-api` re-export these (their schema, descriptions and serde names come from here).
//! Names follow the `@norskvideo/norsk-auto-manager` TypeScript library.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A job's priority band and whether a pool can grow: the placement engine's own types, so the
/// engine, the policy and the CRDs share one definition of each.
pub use automanager_placement::{PriorityBand, ScaleOut};

/// How a running instance may be moved between nodes (the TypeScript library's `MigrationStrategy`).
///
/// A job declares the strongest promise it keeps; a Migration may only ask for a safer one.
/// Safety order, safest first: `stopThenStart`, `overlap`, `handover`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub enum MigrationStrategy {
    /// The target is started before the source is stopped, so both instances may produce
    /// briefly: a promise only a job whose outputs tolerate a second writer can make.
    Overlap,
    /// The target is prepared but not started, the source is stopped, then the target is
    /// started: safe for any job, at the cost of a gap. The default when a job declares nothing.
    #[default]
    StopThenStart,
    /// The job speaks the worker's job socket and hands over at an exact position, so the
    /// output continues seamlessly: a promise the job's own code keeps.
    Handover,
}

impl MigrationStrategy {
    /// Rank in the safety order: 0 is the safest. A request may move to a lower or equal rank.
    pub fn safety_rank(self) -> u8 {
        match self {
            MigrationStrategy::StopThenStart => 0,
            MigrationStrategy::Overlap => 1,
            MigrationStrategy::Handover => 2,
        }
    }

    /// The strategy's name as written in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            MigrationStrategy::Overlap => "overlap",
            MigrationStrategy::StopThenStart => "stopThenStart",
            MigrationStrategy::Handover => "handover",
        }
    }
}

/// Why the operator would move a running job, or take a node away, when nothing failed: the
/// reasons a disruption window admits. Recovery from a failure is not among them: it is never
/// held.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum VoluntaryReason {
    /// A drain (`migrate` or `terminate`) of a ManagerNode.
    Drain,
    /// Emptying a lightly used node of an elastic binpack pool.
    Consolidation,
    /// Moving a replica back where its soft rules hold.
    Rebalance,
    /// Replacing a spare older than its `maxAge`.
    SpareRotation,
}

impl VoluntaryReason {
    /// The reason's name as written in the API (and in metrics).
    pub fn as_str(self) -> &'static str {
        match self {
            VoluntaryReason::Drain => "drain",
            VoluntaryReason::Consolidation => "consolidation",
            VoluntaryReason::Rebalance => "rebalance",
            VoluntaryReason::SpareRotation => "spareRotation",
        }
    }
}

/// What a band does when a job fails or loses its node (the TypeScript library's `bands` setting).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum OnFailure {
    /// Place the job again.
    Restart,
    /// Do not restart; record the drop.
    Drop,
}

/// Where a restarted job may go.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum RestartPlacement {
    /// Prefer a hot spare (one dedicated to the band first), then any node that fits.
    PreferHotSpare,
    /// Any node that fits.
    Any,
}

/// When a restarted replica's restart count is cleared (`bands.<band>.clearRestartsOn`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ClearRestartsOn {
    /// Once every job of the replica has been Running without interruption for the band's
    /// `restartClearAfter` (this project's rule): a job that crashes soon after each start
    /// still reaches `maxRestartsPerHour`.
    #[default]
    StableRunning,
    /// As soon as every job of the restarted replica is Running again (the TypeScript
    /// library's "a successful restart clears the count"): a job that crashes after each
    /// start is seen Running may never reach `maxRestartsPerHour`.
    SuccessfulRestart,
}

/// A migration's phase.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum MigrationPhase {
    /// Accepted, not started.
    #[default]
    Pending,
    /// handover: the source was asked for its state (`get-state`).
    Proposing,
    /// A target node is being chosen or provisioned.
    PlacingTarget,
    /// stopThenStart: the target is prepared but not started.
    PreparingTarget,
    /// The target instance is starting (handover: with its initial state).
    StartingTarget,
    /// overlap: the target runs beside the source.
    TargetRunning,
    /// handover: the target reported `target-ready`.
    TargetReady,
    /// handover: the source was sent `cutover-ready`.
    CutoverReady,
    /// The source is being stopped.
    StoppingSource,
    /// handover: the source reported `source-stopped-output`; past the point of no return.
    SourceStoppedOutput,
    /// handover: the target was sent `cutover-apply`.
    CutoverApply,
    /// Done: the job runs on the target and the source instance is gone.
    Completed,
    /// Stopped before completion; the source keeps running and any target was cleaned up.
    Aborted,
    /// handover: the source refused (`state-refused`); no target was placed.
    Refused,
    /// Not started: the request was invalid (for example a stronger strategy than declared,
    /// or another migration of the same job in progress).
    Rejected,
    /// Failed after the point of no return; the job was recovered by its band rules.
    Failed,
}

/// When a phase was entered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTransition {
    /// The phase.
    pub phase: MigrationPhase,
    /// When it was entered.
    pub entered_at: DateTime<Utc>,
}

/// A participant that failed to apply during a handover (from `target-applied.failed`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FailedParticipant {
    /// The participant's id.
    #[schemars(length(max = 256))]
    pub id: String,
    /// Why it failed.
    #[schemars(length(max = 1024))]
    pub reason: String,
}

/// What the target reported in `target-applied`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct HandoverSummary {
    /// Participants applied.
    #[serde(default)]
    #[schemars(length(max = 64), inner(length(max = 256)))]
    pub applied: Vec<String>,
    /// Participants that failed to apply (reported, not fatal: the source has already stopped).
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub failed: Vec<FailedParticipant>,
    /// Skew between the source's last output and the target's first, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew_ms: Option<f64>,
}

/// Why and where a migration was aborted.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AbortInfo {
    /// The reason given (by the user, the job or a timeout).
    #[schemars(length(max = 1024))]
    pub reason: String,
    /// The phase the migration was in.
    pub phase: MigrationPhase,
    /// Who aborted: `user`, `source`, `target`, `timeout` or `operator`.
    #[schemars(length(max = 32))]
    pub by: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// Where a bundle is in its life.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum BundlePhase {
    /// Accepted, nothing placed yet.
    #[default]
    Pending,
    /// Some replicas are being placed, provisioned or restarted.
    Placing,
    /// Every replica's jobs are running.
    Ready,
    /// Some replicas run, others cannot be placed or were dropped.
    Degraded,
    /// A replica exceeded its restart ceiling; no more retries until the retry annotation changes.
    Broken,
    /// Being deleted: jobs are being stopped and the bundle unregistered from Manager.
    Deleting,
}

/// A job instance's state as the operator last saw it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum JobState {
    /// Not placed yet.
    #[default]
    Pending,
    /// Waiting for a node being provisioned.
    Provisioning,
    /// Started on a node, not yet running.
    Starting,
    /// Running.
    Running,
    /// Being stopped.
    Stopping,
    /// Stopped on purpose.
    Stopped,
    /// Failed or lost its node; recovery follows the band.
    Failed,
    /// A bronze job that failed and was dropped.
    Dropped,
    /// No pool can take it now.
    Unplaceable,
}

/// What a reconcile concluded about an object, in kstatus' terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// The object is what its spec asks, and nothing more will happen until it changes (kstatus
    /// `Current`). The reason tells an end state that is not the usual success (`Aborted`,
    /// `Terminated`) from success.
    Ready,
    /// The operator is working towards the spec and expects to get there (kstatus `InProgress`).
    Reconciling,
    /// The operator cannot get there without a change of spec, of the world, or a user's retry
    /// (kstatus `Failed`).
    Stalled,
}

impl Standing {
    /// The kstatus status this standing reads as once the generation is observed.
    pub fn kstatus(self) -> &'static str {
        match self {
            Standing::Ready => "Current",
            Standing::Reconciling => "InProgress",
            Standing::Stalled => "Failed",
        }
    }
}
