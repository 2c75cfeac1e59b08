//! The migration state machine: which strategy a Migration uses, the phases it goes through,
//! what the controller must do on each event, when a phase times out, and the one-at-a-time
//! rule per source job; and (in [`observe`]) what Manager's view of a migration means to the
//! machine.
//!
//! Pure: events and the clock are passed in; the answer is a [`Transition`] naming the new phase
//! and the [`Action`]s for the controller to carry out. No I/O, no async.
//!
//! # Who does what
//!
//! Manager owns the moves (see `docs/manager-api.md`): every strategy is proposed to it with
//! `MigrationGetState` and the strategy, the target is started by `MigrationPrepareTarget`
//! (always with role `migrationTarget`; stop-then-start only reserves its capacity there), and
//! `MigrationCutover` stops the source and promotes the target to the job's normal instance
//! (stop-then-start: stops the source, then starts the target, then promotes it). The source
//! keeps its own role throughout. The machine decides *when* each call is due; [`Action::call`]
//! names the call, [`observe::next`] reads Manager's answers back as events.
//!
//! # Strategy in effect and the safety order
//!
//! A job declares the strongest promise it keeps (absent: `stopThenStart`); a Migration may ask
//! for that strategy or a *safer* one, never a stronger one ([`strategy_in_effect`]). The three
//! strategies, the `stopThenStart` default and the rule that a request may only down-grade to a
//! safer strategy come from `@norskvideo/ctl-product-template-schema` (0.1.21); the schema
//! ranks none of them against another beyond calling `stopThenStart` safe for any product. The
//! order below is this project's, and so is every refusal that follows from it. Safest first:
//!
//! 1. `stopThenStart` — the target is prepared, the source stopped, then the target started. It
//!    asks nothing of the job (one instance at a time, at the cost of a gap), so any job can take it.
//! 2. `overlap` — the target starts before the source stops, so both produce briefly. It asks the
//!    job's outputs to tolerate a second writer; a job that can do that can also take a gap.
//! 3. `handover` — the job's own code hands over at an exact position over the job socket. It
//!    asks the most (a cooperating job and a target with `norsk.io/job-socket`); a job that keeps
//!    it keeps a brief second writer too, since both instances run during the handshake.
//!
//! # Phases (happy paths, see [`happy_path`])
//!
//! - `overlap`: PlacingTarget (proposed to Manager) → StartingTarget (role `migrationTarget`) →
//!   TargetRunning → StoppingSource (Manager's cutover: target promoted, source stopped) →
//!   Completed. Nothing is asked of the job.
//! - `stopThenStart`: PlacingTarget (proposed) → PreparingTarget (capacity reserved, nothing
//!   started) → StoppingSource (Manager's cutover stops the source) → StartingTarget (Manager
//!   starts the target as `migrationTarget`) → Completed (promoted). Nothing is asked of the job.
//! - `handover`: Proposing (`get-state`) → PlacingTarget → StartingTarget (role
//!   `migrationTarget` + `initial-state`) → TargetReady (`target-ready`) → CutoverReady
//!   (`cutover-ready` sent to the source) → SourceStoppedOutput (`source-stopped-output`: the
//!   point of no return) → CutoverApply (Manager relays `cutover-apply` to the target) →
//!   Completed (`target-applied`). A `state-refused` in Proposing ends in Refused with no target
//!   placed.
//!
//! Every migration starts in Pending and leaves it on [`MigrationEvent::Start`]. Three phases
//! are *waypoints* where the machine waits for the controller's go-ahead
//! ([`MigrationEvent::Proceed`]): overlap's TargetRunning (the overlap window; proceed at once
//! or after a hold) and handover's TargetReady (the controller relays the target's payload on
//! entering CutoverReady) and SourceStoppedOutput.
//!
//! # Abort, failure and the point of no return
//!
//! Each strategy has a point of no return: the first phase in which the source may already have
//! stopped producing — StoppingSource for `overlap` and `stopThenStart`, SourceStoppedOutput for
//! `handover` ([`point_of_no_return`]). Before it an abort (the user's `spec.abort`, deleting the
//! Migration, a job's `abort` frame, a placement failure, a failed target, a timeout) ends in
//! Aborted: the migration is aborted in Manager (which stops a target it started, releases a
//! reservation and tells handover participants), and the source is the one running instance.
//! From it on, a user's or operator's abort is refused
//! ([`MigrationError::NotAbortable`]) and the migration goes on; a job's abort, a failure or a
//! timeout ends in Failed: every instance of the migration is stopped and the job is handed to
//! its band's recovery ([`Action::RecoverByBand`]), so again at most one instance runs.
//! A source that fails at any time also ends in Failed with band recovery.
//!
//! Events that make no sense in the current phase are refused with a typed
//! [`MigrationError`] and change nothing; re-deliveries of the event that led into the current
//! phase (a mirror resync) are accepted as no-ops. Nothing here panics on any input.

use crate::vocab::{
    AbortInfo, FailedParticipant, HandoverSummary, MigrationPhase, MigrationStrategy,
    PhaseTransition,
};
use chrono::{DateTime, TimeDelta, Utc};

pub mod observe;

pub use crate::JOB_SOCKET_CAPABILITY;

/// The largest payload a job socket frame can carry (a frame is at most 64 KiB).
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

/// Reasons are cut to this many characters (the status schema's bound).
pub const MAX_REASON_CHARS: usize = 1024;

/// Longest node id accepted (a Kubernetes name's bound, as in the status schema).
pub const MAX_NODE_ID_LEN: usize = 253;

/// Bounds of a handover summary in status (the schema's).
const MAX_SUMMARY_ITEMS: usize = 64;
const MAX_PARTICIPANT_ID_CHARS: usize = 256;

/// A job-socket payload as it rides the gRPC `bytes` field (UTF-8 JSON, opaque here).
pub type Payload = Vec<u8>;

// ---------------------------------------------------------------------------------------------
// Strategy in effect

/// A request for a stronger strategy than the job declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "strategy `{}` refused: the job declares `{}`, and a migration may only use the declared strategy or a safer one (safest first: stopThenStart, overlap, handover); use {} or leave strategy unset",
    .requested.as_str(), .declared.as_str(), allowed_list(*.declared)
)]
pub struct StrategyRefused {
    /// The job's declared strategy (`stopThenStart` when it declares none).
    pub declared: MigrationStrategy,
    /// The strategy the Migration asked for.
    pub requested: MigrationStrategy,
}

/// The strategies a job declaring `declared` may be migrated with, safest first.
pub fn allowed_strategies(declared: MigrationStrategy) -> Vec<MigrationStrategy> {
    [
        MigrationStrategy::StopThenStart,
        MigrationStrategy::Overlap,
        MigrationStrategy::Handover,
    ]
    .into_iter()
    .filter(|s| s.safety_rank() <= declared.safety_rank())
    .collect()
}

fn allowed_list(declared: MigrationStrategy) -> String {
    allowed_strategies(declared)
        .iter()
        .map(|s| format!("`{}`", s.as_str()))
        .collect::<Vec<_>>()
        .join(" or ")
}

/// The strategy a migration uses: the request when it is as safe as or safer than the job's
/// declaration, the declaration when nothing is requested (`stopThenStart` when the job declares
/// nothing), and a refusal when the request is stronger.
pub fn strategy_in_effect(
    declared: Option<MigrationStrategy>,
    requested: Option<MigrationStrategy>,
) -> Result<MigrationStrategy, StrategyRefused> {
    let declared = declared.unwrap_or_default();
    match requested {
        None => Ok(declared),
        Some(r) if r.safety_rank() <= declared.safety_rank() => Ok(r),
        Some(requested) => Err(StrategyRefused {
            declared,
            requested,
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// Target checks

/// A node that cannot be this migration's target.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TargetRefused {
    /// The target is the node the job already runs on.
    #[error("node {0} is the job's source node; a migration must move the job to another node")]
    IsSource(String),
    /// A handover target must run the job-socket listener.
    #[error(
        "node {0} cannot be a handover target: it does not advertise `norsk.io/job-socket` (its worker's job-socket listener is not up); pick another node or use a safer strategy"
    )]
    MissingJobSocket(String),
}

/// The capability a target needs for `strategy`, if any (`norsk.io/job-socket` for handover).
pub fn target_capability_required(strategy: MigrationStrategy) -> Option<&'static str> {
    (strategy == MigrationStrategy::Handover).then_some(JOB_SOCKET_CAPABILITY)
}

/// Adds the capability a `strategy` target must have (if any) to a job's required ones, so the
/// placement engine only offers nodes that have it.
pub fn require_target_capability(strategy: MigrationStrategy, capabilities: &mut Vec<String>) {
    if let Some(cap) = target_capability_required(strategy)
        && !capabilities.iter().any(|c| c == cap)
    {
        capabilities.push(cap.to_owned());
    }
}

/// Whether `node` (advertising `capabilities`) may be the target of a `strategy` migration of a
/// job running on `source_node`.
pub fn check_target(
    strategy: MigrationStrategy,
    node: &str,
    capabilities: &[String],
    source_node: Option<&str>,
) -> Result<(), TargetRefused> {
    if source_node == Some(node) {
        return Err(TargetRefused::IsSource(node.to_owned()));
    }
    match target_capability_required(strategy) {
        Some(cap) if !capabilities.iter().any(|c| c == cap) => {
            Err(TargetRefused::MissingJobSocket(node.to_owned()))
        }
        _ => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// Phases

/// The phases of a successful migration with `strategy`, in order, Pending to Completed.
pub fn happy_path(strategy: MigrationStrategy) -> &'static [MigrationPhase] {
    use MigrationPhase::*;
    match strategy {
        MigrationStrategy::Overlap => &[
            Pending,
            PlacingTarget,
            StartingTarget,
            TargetRunning,
            StoppingSource,
            Completed,
        ],
        MigrationStrategy::StopThenStart => &[
            Pending,
            PlacingTarget,
            PreparingTarget,
            StoppingSource,
            StartingTarget,
            Completed,
        ],
        MigrationStrategy::Handover => &[
            Pending,
            Proposing,
            PlacingTarget,
            StartingTarget,
            TargetReady,
            CutoverReady,
            SourceStoppedOutput,
            CutoverApply,
            Completed,
        ],
    }
}

/// The first phase in which the source may have stopped producing: aborts are refused from here.
pub fn point_of_no_return(strategy: MigrationStrategy) -> MigrationPhase {
    match strategy {
        MigrationStrategy::Overlap | MigrationStrategy::StopThenStart => {
            MigrationPhase::StoppingSource
        }
        MigrationStrategy::Handover => MigrationPhase::SourceStoppedOutput,
    }
}

/// Whether `phase` ends a migration (Completed, Aborted, Refused, Rejected, Failed).
pub fn is_terminal(phase: MigrationPhase) -> bool {
    use MigrationPhase::*;
    matches!(phase, Completed | Aborted | Refused | Rejected | Failed)
}

fn path_index(strategy: MigrationStrategy, phase: MigrationPhase) -> Option<usize> {
    happy_path(strategy).iter().position(|p| *p == phase)
}

/// Whether a `strategy` migration in `phase` may still be aborted (before the point of no return).
pub fn is_abortable(strategy: MigrationStrategy, phase: MigrationPhase) -> bool {
    match (
        path_index(strategy, phase),
        path_index(strategy, point_of_no_return(strategy)),
    ) {
        (Some(i), Some(ponr)) => i < ponr,
        _ => false,
    }
}

/// How long each phase may last before it times out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhaseTimeouts {
    default: TimeDelta,
    overrides: Vec<(MigrationPhase, TimeDelta)>,
}

impl Default for PhaseTimeouts {
    /// 60 s for every phase (the operator's `migration.phaseTimeout` default).
    fn default() -> Self {
        PhaseTimeouts {
            default: TimeDelta::seconds(60),
            overrides: Vec::new(),
        }
    }
}

/// The longest phase timeout honoured (a day); longer values are cut to it.
pub const MAX_PHASE_TIMEOUT: TimeDelta = TimeDelta::days(1);

fn clamp_timeout(d: std::time::Duration) -> TimeDelta {
    TimeDelta::from_std(d)
        .unwrap_or(MAX_PHASE_TIMEOUT)
        .min(MAX_PHASE_TIMEOUT)
}

impl PhaseTimeouts {
    /// The same timeout for every phase (cut to [`MAX_PHASE_TIMEOUT`]).
    pub fn uniform(timeout: std::time::Duration) -> Self {
        PhaseTimeouts {
            default: clamp_timeout(timeout),
            overrides: Vec::new(),
        }
    }

    /// A different timeout for one phase (cut to [`MAX_PHASE_TIMEOUT`]).
    #[must_use]
    pub fn with(mut self, phase: MigrationPhase, timeout: std::time::Duration) -> Self {
        self.overrides.retain(|(p, _)| *p != phase);
        self.overrides.push((phase, clamp_timeout(timeout)));
        self
    }

    /// The timeout of `phase`.
    pub fn for_phase(&self, phase: MigrationPhase) -> TimeDelta {
        self.overrides
            .iter()
            .find(|(p, _)| *p == phase)
            .map_or(self.default, |(_, d)| *d)
    }
}

/// When a phase entered at `entered_at` times out; `None` for terminal phases, which never do.
pub fn deadline(
    phase: MigrationPhase,
    entered_at: DateTime<Utc>,
    timeouts: &PhaseTimeouts,
) -> Option<DateTime<Utc>> {
    if is_terminal(phase) {
        return None;
    }
    Some(
        entered_at
            .checked_add_signed(timeouts.for_phase(phase))
            .unwrap_or(DateTime::<Utc>::MAX_UTC),
    )
}

// ---------------------------------------------------------------------------------------------
// Events and actions

/// Who asked for an abort (status `abort.by`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortBy {
    /// `spec.abort` or deleting the Migration.
    User,
    /// The source job's `abort` frame.
    Source,
    /// The target job's `abort` frame.
    Target,
    /// A phase ran past its deadline.
    Timeout,
    /// The operator itself (no target found, a payload it cannot relay, shutting down).
    Operator,
}

impl AbortBy {
    /// The name written to status.
    pub fn as_str(self) -> &'static str {
        match self {
            AbortBy::User => "user",
            AbortBy::Source => "source",
            AbortBy::Target => "target",
            AbortBy::Timeout => "timeout",
            AbortBy::Operator => "operator",
        }
    }

    /// Past the point of no return a participant's abort (or a timeout) is a failure, while a
    /// user's or the operator's is refused.
    fn is_participant(self) -> bool {
        matches!(self, AbortBy::Source | AbortBy::Target | AbortBy::Timeout)
    }
}

/// What happened.
#[derive(Clone, Debug, PartialEq)]
pub enum MigrationEvent {
    /// The controller accepted the Migration (strategy allowed, no concurrent migration).
    Start,
    /// handover: the source answered `get-state` with `state`.
    StateReceived {
        /// The source's state (handed to the target as `initial-state`).
        payload: Payload,
    },
    /// handover: the source answered `state-refused`.
    StateRefused {
        /// The source's reason.
        reason: String,
    },
    /// A target node was chosen (or given in the spec).
    TargetPlaced {
        /// Manager's node id.
        node: String,
    },
    /// No target node could be found or provisioned.
    PlacementFailed {
        /// Why (the placement trace's summary).
        reason: String,
    },
    /// stopThenStart: the target node is up and ready to take the job.
    TargetPrepared,
    /// Manager accepted the target instance's start (informational).
    TargetStarted,
    /// Manager reports the target instance running.
    TargetRunning,
    /// handover: the target sent `target-ready`.
    TargetReady {
        /// Its payload (relayed to the source in `cutover-ready`).
        payload: Payload,
    },
    /// The controller's go-ahead in a waypoint phase (overlap TargetRunning, handover
    /// TargetReady and SourceStoppedOutput).
    Proceed,
    /// handover: the source sent `source-stopped-output` (the point of no return); Manager
    /// relays its payload to the target in `cutover-apply`.
    SourceStoppedOutput,
    /// Manager reports the source instance stopped by its cutover (after [`Action::CutOver`]).
    SourceStopped,
    /// handover: the target sent `target-applied`.
    TargetApplied {
        /// What it applied.
        summary: HandoverSummary,
    },
    /// Someone asked to abort.
    AbortRequested {
        /// Who.
        by: AbortBy,
        /// Why.
        reason: String,
    },
    /// The current phase ran past its [`deadline`].
    PhaseTimedOut,
    /// The target instance failed (rejected by its worker, crashed, its node died).
    TargetFailed {
        /// Why.
        reason: String,
    },
    /// The source instance failed on its own (not because it was stopped).
    SourceFailed {
        /// Why.
        reason: String,
    },
}

impl MigrationEvent {
    /// The event's name, for errors and logs.
    pub fn name(&self) -> &'static str {
        match self {
            MigrationEvent::Start => "Start",
            MigrationEvent::StateReceived { .. } => "StateReceived",
            MigrationEvent::StateRefused { .. } => "StateRefused",
            MigrationEvent::TargetPlaced { .. } => "TargetPlaced",
            MigrationEvent::PlacementFailed { .. } => "PlacementFailed",
            MigrationEvent::TargetPrepared => "TargetPrepared",
            MigrationEvent::TargetStarted => "TargetStarted",
            MigrationEvent::TargetRunning => "TargetRunning",
            MigrationEvent::TargetReady { .. } => "TargetReady",
            MigrationEvent::Proceed => "Proceed",
            MigrationEvent::SourceStoppedOutput => "SourceStoppedOutput",
            MigrationEvent::SourceStopped => "SourceStopped",
            MigrationEvent::TargetApplied { .. } => "TargetApplied",
            MigrationEvent::AbortRequested { .. } => "AbortRequested",
            MigrationEvent::PhaseTimedOut => "PhaseTimedOut",
            MigrationEvent::TargetFailed { .. } => "TargetFailed",
            MigrationEvent::SourceFailed { .. } => "SourceFailed",
        }
    }
}

/// What the controller must do, in order. Each Manager call is named by [`Action::call`].
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Propose the migration to Manager with its strategy (handover: Manager asks the source for
    /// its state, `get-state`; the others ask the job nothing).
    Propose {
        /// The strategy Manager moves the job with.
        strategy: MigrationStrategy,
    },
    /// Choose a target node: `spec.targetNode`, or the placement engine excluding the source
    /// node (requiring [`target_capability_required`]); answer with `TargetPlaced` or
    /// `PlacementFailed`.
    PlaceTarget,
    /// stopThenStart: Manager checks the target node would take the job and reserves its
    /// capacity without starting it; answer with `TargetPrepared`.
    PrepareTarget {
        /// The target node.
        node: String,
    },
    /// handover and overlap: Manager starts the target instance on `node` with role
    /// `migrationTarget` (handover: and hands it its initial state).
    StartTarget {
        /// The target node.
        node: String,
        /// handover: the source's state, sent as `initial-state` after `hello-ack`.
        initial_state: Option<Payload>,
    },
    /// Manager's cutover. handover: `cutover-ready` with the target's payload to the source;
    /// overlap: the running target promoted, the source stopped; stopThenStart: the source
    /// stopped, then the target started on its reservation and promoted.
    CutOver {
        /// handover: the `target-ready` payload; empty otherwise.
        payload: Payload,
    },
    /// Stop the job's source instance on `node` (a failure past the point of no return).
    StopSource {
        /// The source node.
        node: String,
    },
    /// Stop whatever migration target instance is left on `node` (idempotent).
    StopTarget {
        /// The target node.
        node: String,
    },
    /// Abort the migration in Manager: it stops a target it started, releases a reservation and
    /// (handover) relays `abort` to the participants that did not ask for it.
    Abort {
        /// The reason relayed.
        reason: String,
    },
    /// The job now lives on `node` (Manager promoted the target): the bundle follows.
    AdoptTarget {
        /// The new node.
        node: String,
    },
    /// Hand the job to its band's recovery (gold/silver restart, bronze drop).
    RecoverByBand {
        /// Why the migration failed.
        reason: String,
    },
}

/// A call to Manager (`docs/manager-api.md`). There is no StartJob among them: every target is
/// started by Manager, as a `migrationTarget`, through the migration calls.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ManagerCall {
    /// `MigrationGetState` with the strategy.
    Propose {
        /// The strategy.
        strategy: MigrationStrategy,
    },
    /// `MigrationPrepareTarget`.
    PrepareTarget {
        /// The target node.
        node: String,
        /// The initial state (handover), empty otherwise.
        initial_state: Payload,
    },
    /// `MigrationCutover`.
    Cutover {
        /// The payload for `cutover-ready` (handover), empty otherwise.
        payload: Payload,
    },
    /// `MigrationAbort`.
    Abort {
        /// Why.
        reason: String,
    },
    /// `StopJob` of the job's `role` instance, when it is on `node` (and, for a migration
    /// target, belongs to this migration).
    StopInstance {
        /// Which instance.
        role: InstanceRole,
        /// Where it must be for the stop to be this migration's.
        node: String,
    },
}

/// The role a job instance wears (Manager's `JobRole`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceRole {
    /// The job's ordinary instance (the source keeps it throughout a migration).
    Normal,
    /// A migration's target, until Manager promotes it at cutover.
    MigrationTarget,
}

impl Action {
    /// The Manager call that carries this action out, if it is one (placement, adopting the
    /// target and band recovery are the operator's own).
    pub fn call(&self) -> Option<ManagerCall> {
        match self {
            Action::Propose { strategy } => Some(ManagerCall::Propose {
                strategy: *strategy,
            }),
            Action::PrepareTarget { node } => Some(ManagerCall::PrepareTarget {
                node: node.clone(),
                initial_state: Payload::new(),
            }),
            Action::StartTarget {
                node,
                initial_state,
            } => Some(ManagerCall::PrepareTarget {
                node: node.clone(),
                initial_state: initial_state.clone().unwrap_or_default(),
            }),
            Action::CutOver { payload } => Some(ManagerCall::Cutover {
                payload: payload.clone(),
            }),
            Action::StopSource { node } => Some(ManagerCall::StopInstance {
                role: InstanceRole::Normal,
                node: node.clone(),
            }),
            Action::StopTarget { node } => Some(ManagerCall::StopInstance {
                role: InstanceRole::MigrationTarget,
                node: node.clone(),
            }),
            Action::Abort { reason } => Some(ManagerCall::Abort {
                reason: reason.clone(),
            }),
            Action::PlaceTarget | Action::AdoptTarget { .. } | Action::RecoverByBand { .. } => None,
        }
    }
}

/// The answer to one event.
#[derive(Clone, Debug, PartialEq)]
pub struct Transition {
    /// The phase before the event.
    pub from: MigrationPhase,
    /// The phase after it (equal to `from` when the event changed nothing).
    pub phase: MigrationPhase,
    /// The status `phases` entry to append, when the phase changed.
    pub entered: Option<PhaseTransition>,
    /// What to do, in order.
    pub actions: Vec<Action>,
    /// Whether the migration ended (the new phase is terminal).
    pub ended: bool,
    /// Status `abort`, when this event aborted the migration.
    pub abort: Option<AbortInfo>,
    /// Status `handover`, when the target reported `target-applied`.
    pub handover: Option<HandoverSummary>,
    /// Why the migration was refused or failed.
    pub failure: Option<String>,
    /// The machine after the event.
    pub machine: MigrationMachine,
}

/// An event the machine refuses; the machine is unchanged.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MigrationError {
    /// The event has no meaning in this phase.
    #[error("{event} is not expected in phase {phase:?} of a {} migration", .strategy.as_str())]
    Unexpected {
        /// The strategy.
        strategy: MigrationStrategy,
        /// The phase.
        phase: MigrationPhase,
        /// The event's name.
        event: &'static str,
    },
    /// The migration has ended; nothing changes it any more.
    #[error("the migration already ended in phase {phase:?}; {event} changes nothing")]
    Ended {
        /// The terminal phase.
        phase: MigrationPhase,
        /// The event's name.
        event: &'static str,
    },
    /// A user's or the operator's abort past the point of no return.
    #[error(
        "abort refused: the migration is past its point of no return (phase {phase:?}: the source may already have stopped output) and continues"
    )]
    NotAbortable {
        /// The phase.
        phase: MigrationPhase,
    },
    /// A target node id that is empty or too long.
    #[error("target node id `{node}` is invalid: it must be 1 to 253 characters")]
    InvalidTargetNode {
        /// The id (cut to 253 characters).
        node: String,
    },
    /// The target is the source node.
    #[error("target node {node} is the job's source node; a migration must move the job")]
    TargetIsSource {
        /// The node.
        node: String,
    },
}

// ---------------------------------------------------------------------------------------------
// The machine

/// One migration's state: its strategy, phase and what it carries between phases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrationMachine {
    strategy: MigrationStrategy,
    phase: MigrationPhase,
    entered_at: DateTime<Utc>,
    source_node: Option<String>,
    target_node: Option<String>,
    /// handover: the payload to relay on entering the next phase.
    carried: Option<Payload>,
}

/// What an event does, before it is turned into a [`Transition`].
enum Step {
    Stay,
    Go(MigrationPhase, Vec<Action>),
    Abort(AbortBy, String),
    Fail(String),
    Refuse(String),
    Complete(Vec<Action>, Option<HandoverSummary>),
}

impl MigrationMachine {
    /// A new migration in Pending, of a job running on `source_node`.
    pub fn new(
        strategy: MigrationStrategy,
        source_node: Option<String>,
        now: DateTime<Utc>,
    ) -> Self {
        MigrationMachine {
            strategy,
            phase: MigrationPhase::Pending,
            entered_at: now,
            source_node,
            target_node: None,
            carried: None,
        }
    }

    /// A machine rebuilt from status after an operator restart. The payload a handover carries
    /// from TargetReady to CutoverReady is not in status: a handover resumed in TargetReady
    /// without it is aborted on `Proceed` (see [`observe::resume`], which takes it from
    /// Manager's record instead).
    pub fn resume(
        strategy: MigrationStrategy,
        phase: MigrationPhase,
        entered_at: DateTime<Utc>,
        source_node: Option<String>,
        target_node: Option<String>,
    ) -> Self {
        MigrationMachine {
            strategy,
            phase,
            entered_at,
            source_node,
            target_node,
            carried: None,
        }
    }

    /// The strategy in effect.
    pub fn strategy(&self) -> MigrationStrategy {
        self.strategy
    }

    /// The current phase.
    pub fn phase(&self) -> MigrationPhase {
        self.phase
    }

    /// When the current phase was entered.
    pub fn entered_at(&self) -> DateTime<Utc> {
        self.entered_at
    }

    /// The source node, if known.
    pub fn source_node(&self) -> Option<&str> {
        self.source_node.as_deref()
    }

    /// The target node, once placed.
    pub fn target_node(&self) -> Option<&str> {
        self.target_node.as_deref()
    }

    /// Whether the migration has ended.
    pub fn is_ended(&self) -> bool {
        is_terminal(self.phase)
    }

    /// Whether an abort would be honoured now.
    pub fn is_abortable(&self) -> bool {
        is_abortable(self.strategy, self.phase)
    }

    /// Whether the machine waits for [`MigrationEvent::Proceed`].
    pub fn is_waypoint(&self) -> bool {
        matches!(
            (self.strategy, self.phase),
            (MigrationStrategy::Overlap, MigrationPhase::TargetRunning)
                | (MigrationStrategy::Handover, MigrationPhase::TargetReady)
                | (
                    MigrationStrategy::Handover,
                    MigrationPhase::SourceStoppedOutput
                )
        )
    }

    /// When the current phase times out (`None` once ended).
    pub fn deadline(&self, timeouts: &PhaseTimeouts) -> Option<DateTime<Utc>> {
        deadline(self.phase, self.entered_at, timeouts)
    }

    /// Whether the current phase has run past its deadline at `now` (then feed `PhaseTimedOut`).
    pub fn is_timed_out(&self, now: DateTime<Utc>, timeouts: &PhaseTimeouts) -> bool {
        self.deadline(timeouts).is_some_and(|d| now >= d)
    }

    /// The machine's answer to `event` at `now`; `self` is unchanged.
    pub fn next(
        &self,
        event: MigrationEvent,
        now: DateTime<Utc>,
    ) -> Result<Transition, MigrationError> {
        let mut after = self.clone();
        let step = after.decide(event)?;
        Ok(after.finish(self.phase, step, now))
    }

    /// Like [`MigrationMachine::next`], and moves `self` to the new state on success.
    pub fn apply(
        &mut self,
        event: MigrationEvent,
        now: DateTime<Utc>,
    ) -> Result<Transition, MigrationError> {
        let t = self.next(event, now)?;
        *self = t.machine.clone();
        Ok(t)
    }

    fn unexpected(&self, event: &MigrationEvent) -> MigrationError {
        MigrationError::Unexpected {
            strategy: self.strategy,
            phase: self.phase,
            event: event.name(),
        }
    }

    /// Decides the step, updating the carried payload and target node of `self` (a clone).
    fn decide(&mut self, event: MigrationEvent) -> Result<Step, MigrationError> {
        use MigrationEvent as E;
        use MigrationPhase as P;
        use MigrationStrategy as S;
        if is_terminal(self.phase) {
            return Err(MigrationError::Ended {
                phase: self.phase,
                event: event.name(),
            });
        }
        let step = match (self.strategy, self.phase, event) {
            // Common to every strategy and phase.
            (_, _, E::AbortRequested { by, reason }) => {
                if self.is_abortable() {
                    Step::Abort(by, bounded(&reason))
                } else if by.is_participant() {
                    Step::Fail(format!("{} aborted: {}", by.as_str(), bounded(&reason)))
                } else {
                    return Err(MigrationError::NotAbortable { phase: self.phase });
                }
            }
            (_, phase, E::PhaseTimedOut) => {
                let reason = format!("phase {phase:?} did not finish before its timeout");
                if self.is_abortable() {
                    Step::Abort(AbortBy::Timeout, reason)
                } else {
                    Step::Fail(reason)
                }
            }
            (_, _, E::SourceFailed { reason }) => {
                Step::Fail(format!("the source failed: {}", bounded(&reason)))
            }
            (_, _, E::TargetFailed { reason }) if self.target_node.is_some() => {
                let reason = format!("the target failed: {}", bounded(&reason));
                if self.is_abortable() {
                    Step::Abort(AbortBy::Target, reason)
                } else {
                    Step::Fail(reason)
                }
            }
            (S::Handover, P::Pending, E::Start) => Step::Go(
                P::Proposing,
                vec![Action::Propose {
                    strategy: S::Handover,
                }],
            ),
            // Proposed at once: Manager holds the job from now on, and asks it nothing.
            (strategy, P::Pending, E::Start) => Step::Go(
                P::PlacingTarget,
                vec![Action::Propose { strategy }, Action::PlaceTarget],
            ),
            (_, P::PlacingTarget, E::PlacementFailed { reason }) => Step::Abort(
                AbortBy::Operator,
                format!("no target node: {}", bounded(&reason)),
            ),
            (strategy, P::PlacingTarget, E::TargetPlaced { node }) => {
                self.accept_target(&node)?;
                match strategy {
                    S::StopThenStart => {
                        Step::Go(P::PreparingTarget, vec![Action::PrepareTarget { node }])
                    }
                    S::Overlap => Step::Go(P::StartingTarget, vec![start_target(node, None)]),
                    S::Handover => {
                        let state = self.carried.take();
                        Step::Go(P::StartingTarget, vec![start_target(node, state)])
                    }
                }
            }
            // A re-delivered placement of the node already chosen.
            (_, _, E::TargetPlaced { node }) if self.target_node.as_deref() == Some(&node) => {
                Step::Stay
            }

            // handover
            (S::Handover, P::Proposing, E::StateReceived { payload }) => self.carry(
                payload,
                Step::Go(P::PlacingTarget, vec![Action::PlaceTarget]),
                Step::Abort(AbortBy::Operator, oversized("the source's state")),
            ),
            (S::Handover, P::Proposing, E::StateRefused { reason }) => {
                Step::Refuse(bounded(&reason))
            }
            (
                S::Handover,
                P::StartingTarget | P::TargetReady | P::CutoverReady,
                E::TargetStarted | E::TargetRunning,
            ) => Step::Stay,
            (S::Handover, P::StartingTarget, E::TargetReady { payload }) => self.carry(
                payload,
                Step::Go(P::TargetReady, Vec::new()),
                Step::Abort(AbortBy::Operator, oversized("the target's target-ready")),
            ),
            (S::Handover, P::TargetReady, E::TargetReady { .. }) => Step::Stay,
            (S::Handover, P::TargetReady, E::Proceed) => match self.carried.take() {
                Some(payload) => Step::Go(P::CutoverReady, vec![Action::CutOver { payload }]),
                None => Step::Abort(AbortBy::Operator, lost_payload("target-ready")),
            },
            (S::Handover, P::CutoverReady, E::SourceStoppedOutput) => {
                Step::Go(P::SourceStoppedOutput, Vec::new())
            }
            (S::Handover, P::SourceStoppedOutput, E::SourceStoppedOutput) => Step::Stay,
            // Manager relays `cutover-apply` with the source's payload itself.
            (S::Handover, P::SourceStoppedOutput, E::Proceed) => {
                Step::Go(P::CutoverApply, Vec::new())
            }
            // Manager stopped the source and promoted the target when the target applied.
            (S::Handover, P::CutoverApply, E::TargetApplied { summary }) => {
                let node = self.target_node.clone().unwrap_or_default();
                Step::Complete(
                    vec![Action::AdoptTarget { node }],
                    Some(bounded_summary(summary)),
                )
            }

            // overlap
            (S::Overlap, P::StartingTarget, E::TargetStarted) => Step::Stay,
            (S::Overlap, P::StartingTarget, E::TargetRunning) => {
                Step::Go(P::TargetRunning, Vec::new())
            }
            (
                S::Overlap,
                P::TargetRunning | P::StoppingSource,
                E::TargetStarted | E::TargetRunning,
            ) => Step::Stay,
            (S::Overlap, P::TargetRunning, E::Proceed) => Step::Go(
                P::StoppingSource,
                vec![Action::CutOver {
                    payload: Payload::new(),
                }],
            ),
            (S::Overlap, P::StoppingSource, E::SourceStopped) => {
                let node = self.target_node.clone().unwrap_or_default();
                Step::Complete(vec![Action::AdoptTarget { node }], None)
            }

            // stopThenStart
            (S::StopThenStart, P::PreparingTarget, E::TargetPrepared) => Step::Go(
                P::StoppingSource,
                vec![Action::CutOver {
                    payload: Payload::new(),
                }],
            ),
            (S::StopThenStart, P::StoppingSource, E::TargetPrepared) => Step::Stay,
            // Manager's cutover starts the target itself once the source has stopped.
            (S::StopThenStart, P::StoppingSource, E::SourceStopped) => {
                Step::Go(P::StartingTarget, Vec::new())
            }
            (S::StopThenStart, P::StartingTarget, E::SourceStopped | E::TargetStarted) => {
                Step::Stay
            }
            (S::StopThenStart, P::StartingTarget, E::TargetRunning) => {
                let node = self.target_node.clone().unwrap_or_default();
                Step::Complete(vec![Action::AdoptTarget { node }], None)
            }

            (_, _, event) => return Err(self.unexpected(&event)),
        };
        Ok(step)
    }

    /// Keeps `payload` to relay on entering the next phase and takes step `ok`, or takes
    /// `too_big` when the payload exceeds a frame.
    fn carry(&mut self, payload: Payload, ok: Step, too_big: Step) -> Step {
        if payload.len() > MAX_PAYLOAD_BYTES {
            too_big
        } else {
            self.carried = Some(payload);
            ok
        }
    }

    fn accept_target(&mut self, node: &str) -> Result<(), MigrationError> {
        if node.is_empty() || node.len() > MAX_NODE_ID_LEN {
            return Err(MigrationError::InvalidTargetNode {
                node: node.chars().take(MAX_NODE_ID_LEN).collect(),
            });
        }
        if self.source_node.as_deref() == Some(node) {
            return Err(MigrationError::TargetIsSource {
                node: node.to_owned(),
            });
        }
        self.target_node = Some(node.to_owned());
        Ok(())
    }

    /// Whether the source instance may still exist in the current phase.
    fn source_may_run(&self) -> bool {
        !(self.strategy == MigrationStrategy::StopThenStart
            && self.phase == MigrationPhase::StartingTarget)
    }

    /// Whether the migration was proposed to Manager (every strategy is, on leaving Pending).
    fn is_proposed(&self) -> bool {
        self.phase != MigrationPhase::Pending
    }

    fn finish(mut self, from: MigrationPhase, step: Step, now: DateTime<Utc>) -> Transition {
        let mut abort = None;
        let mut handover = None;
        let mut failure = None;
        let (phase, actions) = match step {
            Step::Stay => (from, Vec::new()),
            Step::Go(phase, actions) => (phase, actions),
            Step::Refuse(reason) => {
                failure = Some(reason);
                (MigrationPhase::Refused, Vec::new())
            }
            Step::Complete(actions, summary) => {
                handover = summary;
                (MigrationPhase::Completed, actions)
            }
            Step::Abort(by, reason) => {
                let mut actions = Vec::new();
                if self.is_proposed() {
                    actions.push(Action::Abort {
                        reason: reason.clone(),
                    });
                }
                if let Some(node) = self.target_node.clone() {
                    actions.push(Action::StopTarget { node });
                }
                abort = Some(AbortInfo {
                    reason,
                    phase: from,
                    by: by.as_str().to_owned(),
                    at: now,
                });
                (MigrationPhase::Aborted, actions)
            }
            Step::Fail(reason) => {
                let mut actions = Vec::new();
                if self.is_proposed() {
                    actions.push(Action::Abort {
                        reason: reason.clone(),
                    });
                }
                if let Some(node) = self.target_node.clone() {
                    actions.push(Action::StopTarget { node });
                }
                if self.source_may_run()
                    && let Some(node) = self.source_node.clone()
                {
                    actions.push(Action::StopSource { node });
                }
                actions.push(Action::RecoverByBand {
                    reason: reason.clone(),
                });
                failure = Some(reason);
                (MigrationPhase::Failed, actions)
            }
        };
        let entered = (phase != from).then_some(PhaseTransition {
            phase,
            entered_at: now,
        });
        if entered.is_some() {
            self.phase = phase;
            self.entered_at = now;
        }
        if is_terminal(phase) {
            self.carried = None;
        }
        Transition {
            from,
            phase,
            entered,
            actions,
            ended: is_terminal(phase),
            abort,
            handover,
            failure,
            machine: self,
        }
    }
}

fn start_target(node: String, initial_state: Option<Payload>) -> Action {
    Action::StartTarget {
        node,
        initial_state,
    }
}

fn oversized(what: &str) -> String {
    format!("{what} payload is larger than {MAX_PAYLOAD_BYTES} bytes and cannot be relayed")
}

fn lost_payload(what: &str) -> String {
    format!("the {what} payload was lost (the operator restarted mid-handover)")
}

/// Cuts `s` to [`MAX_REASON_CHARS`] characters.
fn bounded(s: &str) -> String {
    cut(s, MAX_REASON_CHARS)
}

fn cut(s: &str, max_chars: usize) -> String {
    s.chars().take(max_chars).collect()
}

/// A job's `target-applied` summary cut to the status schema's bounds (64 entries, 256-char
/// ids, 1024-char reasons); a skew that is not a finite number is dropped.
pub fn bounded_summary(summary: HandoverSummary) -> HandoverSummary {
    HandoverSummary {
        applied: summary
            .applied
            .iter()
            .take(MAX_SUMMARY_ITEMS)
            .map(|a| cut(a, MAX_PARTICIPANT_ID_CHARS))
            .collect(),
        failed: summary
            .failed
            .iter()
            .take(MAX_SUMMARY_ITEMS)
            .map(|f| FailedParticipant {
                id: cut(&f.id, MAX_PARTICIPANT_ID_CHARS),
                reason: bounded(&f.reason),
            })
            .collect(),
        skew_ms: summary.skew_ms.filter(|s| s.is_finite()),
    }
}

// ---------------------------------------------------------------------------------------------
// One migration at a time per source job

/// The job a migration moves.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceJob {
    /// The Migration's (and Bundle's) namespace.
    pub namespace: String,
    /// The Bundle.
    pub bundle: String,
    /// The replica index.
    pub replica: i32,
    /// The job's name.
    pub job_name: String,
}

impl std::fmt::Display for SourceJob {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{} replica {} job {}",
            self.namespace, self.bundle, self.replica, self.job_name
        )
    }
}

/// A Migration as the one-at-a-time rule sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigrationRecord {
    /// The Migration's name (unique in its namespace).
    pub name: String,
    /// The job it moves.
    pub job: SourceJob,
    /// Its phase.
    pub phase: MigrationPhase,
    /// Its creation time.
    pub created_at: DateTime<Utc>,
    /// It moves the job ahead of a deadline (a reclaim notice: the node is taken at a time
    /// Manager announced), rather than when it suits the fleet.
    pub deadline: bool,
}

/// A second migration of a job that is already being migrated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{job} is already being migrated by Migration {by} (phase {phase:?}); one migration at a time per job: this one is refused, not queued; create it again once {by} has ended"
)]
pub struct ConcurrentMigration {
    /// The job.
    pub job: SourceJob,
    /// The Migration that holds it.
    pub by: String,
    /// That Migration's phase.
    pub phase: MigrationPhase,
}

/// What the one-at-a-time rule lets a Pending Migration do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// It may go on; the held (Pending) Migrations named give way to it and end, superseded.
    Go { supersede: Vec<String> },
    /// A move with a deadline takes the job over: this one ends, superseded by `by`, and never
    /// acts.
    Superseded { by: String },
}

impl Claim {
    /// Go, superseding nothing.
    pub fn go() -> Claim {
        Claim::Go {
            supersede: Vec::new(),
        }
    }
}

/// Whether `candidate` (in Pending) may start.
///
/// - A Migration under way (past Pending, not ended) owns the job: any other is refused.
/// - Among Pending ones, a move with a deadline beats a held voluntary one (a drain's, a
///   consolidation's, a rebalance's, a person's, whatever holds it: a window, a budget, the
///   queue): the held one is superseded, since waiting for it would let the deadline pass and
///   lose the job's output at it.
/// - Otherwise the one created first wins (ties broken by name) and the others are refused, so
///   two Migrations created together never both start and never both get refused.
///
/// A candidate already past Pending has won earlier and is always allowed.
pub fn one_at_a_time(
    existing: &[MigrationRecord],
    candidate: &MigrationRecord,
) -> Result<Claim, ConcurrentMigration> {
    if candidate.phase != MigrationPhase::Pending {
        return Ok(Claim::go());
    }
    let rivals: Vec<&MigrationRecord> = existing
        .iter()
        .filter(|m| m.name != candidate.name && m.job == candidate.job && !is_terminal(m.phase))
        .collect();
    let first = |a: &&&MigrationRecord, b: &&&MigrationRecord| {
        (a.created_at, &a.name).cmp(&(b.created_at, &b.name))
    };
    let refused = |m: &MigrationRecord| ConcurrentMigration {
        job: candidate.job.clone(),
        by: m.name.clone(),
        phase: m.phase,
    };
    if let Some(m) = rivals
        .iter()
        .filter(|m| m.phase != MigrationPhase::Pending)
        .min_by(first)
    {
        return Err(refused(m));
    }
    if !candidate.deadline
        && let Some(m) = rivals.iter().filter(|m| m.deadline).min_by(first)
    {
        return Ok(Claim::Superseded { by: m.name.clone() });
    }
    // Rivals of the candidate's own kind: the one created first goes.
    let earlier = rivals
        .iter()
        .filter(|m| m.deadline == candidate.deadline)
        .filter(|m| (m.created_at, &m.name) < (candidate.created_at, &candidate.name))
        .min_by(first);
    if let Some(m) = earlier {
        return Err(refused(m));
    }
    let mut supersede: Vec<String> = if candidate.deadline {
        rivals
            .iter()
            .filter(|m| !m.deadline)
            .map(|m| m.name.clone())
            .collect()
    } else {
        Vec::new()
    };
    supersede.sort();
    Ok(Claim::Go { supersede })
}

/// Why a held (Pending) Migration has nothing left to do: the job it was made for is no longer
/// where it was made for. Letting it act later would move the job from wherever its recovery
/// put it, outside any window that held it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SourceGone {
    #[error(
        "its source node {node} is gone ({why}); the job no longer runs there, so this Migration ends instead of moving it from wherever it runs now"
    )]
    NodeGone { node: String, why: String },
    #[error(
        "the job no longer runs on its source node {node} (it runs on {now}); this Migration ends instead of moving it from there"
    )]
    JobMoved { node: String, now: String },
}

/// The node a held Migration was made for (the job's node when it was made or first held),
/// and, when that node is gone, why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldSource<'a> {
    pub node: &'a str,
    /// `Some` when Manager no longer has the node, or has terminated it.
    pub gone: Option<&'a str>,
}

/// Whether a held Migration ends because its source is gone ([`SourceGone`]). `running_on` is
/// the node the job runs on now; a job not running now is not decided here (admission refuses
/// it as not running).
pub fn source_gone(source: Option<HeldSource<'_>>, running_on: Option<&str>) -> Option<SourceGone> {
    let source = source?;
    if let Some(why) = source.gone {
        return Some(SourceGone::NodeGone {
            node: source.node.to_owned(),
            why: why.to_owned(),
        });
    }
    match running_on {
        Some(now) if now != source.node => Some(SourceGone::JobMoved {
            node: source.node.to_owned(),
            now: now.to_owned(),
        }),
        _ => None,
    }
}

/// The fixed clock of the migration tests.
#[cfg(test)]
mod test_clock {
    use chrono::{DateTime, TimeDelta, TimeZone, Utc};

    pub fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
            .single()
            .unwrap_or_default()
    }

    pub fn at(secs: i64) -> DateTime<Utc> {
        t0() + TimeDelta::seconds(secs)
    }
}

#[cfg(test)]
mod tests {
    use super::test_clock::{at, t0};
    use super::*;
    use MigrationPhase as P;
    use MigrationStrategy as S;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    const STRATEGIES: [MigrationStrategy; 3] = [S::StopThenStart, S::Overlap, S::Handover];

    fn machine(strategy: MigrationStrategy) -> MigrationMachine {
        MigrationMachine::new(strategy, Some("src".into()), t0())
    }

    fn summary() -> HandoverSummary {
        HandoverSummary {
            applied: vec!["video".into()],
            failed: vec![FailedParticipant {
                id: "captions".into(),
                reason: "no decoder".into(),
            }],
            skew_ms: Some(3.5),
        }
    }

    /// The events that take a `strategy` migration along its happy path, one phase per event.
    fn happy_events(strategy: MigrationStrategy) -> Vec<MigrationEvent> {
        use MigrationEvent as E;
        let placed = E::TargetPlaced { node: "dst".into() };
        match strategy {
            S::Overlap => vec![
                E::Start,
                placed,
                E::TargetRunning,
                E::Proceed,
                E::SourceStopped,
            ],
            S::StopThenStart => vec![
                E::Start,
                placed,
                E::TargetPrepared,
                E::SourceStopped,
                E::TargetRunning,
            ],
            S::Handover => vec![
                E::Start,
                E::StateReceived {
                    payload: b"{\"pos\":1}".to_vec(),
                },
                placed,
                E::TargetReady {
                    payload: b"\"ready\"".to_vec(),
                },
                E::Proceed,
                E::SourceStoppedOutput,
                E::Proceed,
                E::TargetApplied { summary: summary() },
            ],
        }
    }

    /// The job's instances as the controller's actions and the world's events leave them.
    #[derive(Clone, Debug, Default)]
    struct World {
        running: BTreeSet<&'static str>,
    }

    impl World {
        fn new() -> Self {
            World {
                running: BTreeSet::from(["source"]),
            }
        }

        /// What the world did to produce `event`.
        fn observe(&mut self, event: &MigrationEvent) {
            match event {
                MigrationEvent::SourceFailed { .. } => {
                    self.running.remove("source");
                }
                MigrationEvent::TargetFailed { .. } => {
                    self.running.remove("target");
                }
                _ => {}
            }
        }

        /// What Manager does for the transition's actions.
        fn act(&mut self, t: &Transition) {
            for a in &t.actions {
                match a {
                    Action::StartTarget { .. } => {
                        self.running.insert("target");
                    }
                    Action::CutOver { .. } => match t.machine.strategy() {
                        S::Overlap => {
                            self.running.remove("source");
                        }
                        S::StopThenStart => {
                            self.running.remove("source");
                            self.running.insert("target");
                        }
                        // The source stops its output when it says so; Manager stops it once
                        // the target applied.
                        S::Handover => {}
                    },
                    // Manager promoted the target: the source is gone.
                    Action::AdoptTarget { .. } | Action::StopSource { .. } => {
                        self.running.remove("source");
                    }
                    Action::StopTarget { .. } | Action::Abort { .. } => {
                        self.running.remove("target");
                    }
                    Action::RecoverByBand { .. } => {
                        self.running.insert("recovered");
                    }
                    _ => {}
                }
            }
        }
    }

    /// Applies `events` in order, asserting each is accepted.
    fn drive(
        m: &mut MigrationMachine,
        world: &mut World,
        events: &[MigrationEvent],
    ) -> Vec<Transition> {
        let mut out = Vec::new();
        for (i, e) in events.iter().enumerate() {
            world.observe(e);
            let t = m
                .apply(e.clone(), at(i64::try_from(i).unwrap_or(0) + 1))
                .unwrap_or_else(|err| panic!("{} refused: {err}", e.name()));
            world.act(&t);
            out.push(t);
        }
        out
    }

    /// A `strategy` migration after the first `k` events of its happy path.
    fn after(strategy: MigrationStrategy, k: usize) -> (MigrationMachine, World) {
        let mut m = machine(strategy);
        let mut w = World::new();
        let evs = happy_events(strategy);
        drive(&mut m, &mut w, evs.get(..k).unwrap_or(&evs));
        (m, w)
    }

    /// Every action of the `strategy` happy path, in order.
    fn happy_actions(strategy: MigrationStrategy) -> Vec<Action> {
        drive(
            &mut machine(strategy),
            &mut World::new(),
            &happy_events(strategy),
        )
        .into_iter()
        .flat_map(|t| t.actions)
        .collect()
    }

    // ---- strategy in effect ----

    #[test]
    fn a_job_declaring_nothing_migrates_with_stop_then_start() {
        assert_eq!(strategy_in_effect(None, None), Ok(S::StopThenStart));
    }

    #[test]
    fn without_a_request_the_declared_strategy_is_used() {
        for s in STRATEGIES {
            assert_eq!(strategy_in_effect(Some(s), None), Ok(s));
        }
    }

    #[test]
    fn a_request_may_down_grade_to_a_safer_strategy() {
        assert_eq!(
            strategy_in_effect(Some(S::Handover), Some(S::Overlap)),
            Ok(S::Overlap)
        );
        assert_eq!(
            strategy_in_effect(Some(S::Handover), Some(S::StopThenStart)),
            Ok(S::StopThenStart)
        );
        assert_eq!(
            strategy_in_effect(Some(S::Overlap), Some(S::StopThenStart)),
            Ok(S::StopThenStart)
        );
        for s in STRATEGIES {
            assert_eq!(strategy_in_effect(Some(s), Some(s)), Ok(s));
        }
    }

    #[test]
    fn a_request_for_a_stronger_strategy_is_refused_with_a_clear_message() {
        let refused = strategy_in_effect(Some(S::Overlap), Some(S::Handover));
        assert_eq!(
            refused,
            Err(StrategyRefused {
                declared: S::Overlap,
                requested: S::Handover
            })
        );
        assert_eq!(
            refused.map_err(|e| e.to_string()),
            Err("strategy `handover` refused: the job declares `overlap`, and a migration may only use the declared strategy or a safer one (safest first: stopThenStart, overlap, handover); use `stopThenStart` or `overlap` or leave strategy unset".to_owned())
        );
        assert!(strategy_in_effect(None, Some(S::Overlap)).is_err());
        assert!(strategy_in_effect(None, Some(S::Handover)).is_err());
        assert!(strategy_in_effect(Some(S::StopThenStart), Some(S::Handover)).is_err());
    }

    #[test]
    fn allowed_strategies_are_listed_safest_first() {
        assert_eq!(allowed_strategies(S::StopThenStart), vec![S::StopThenStart]);
        assert_eq!(allowed_strategies(S::Handover), STRATEGIES.to_vec());
    }

    // ---- targets ----

    #[test]
    fn a_handover_target_must_advertise_the_job_socket() {
        let none: Vec<String> = Vec::new();
        let socket = vec![JOB_SOCKET_CAPABILITY.to_owned()];
        assert_eq!(
            check_target(S::Handover, "n1", &none, Some("src")),
            Err(TargetRefused::MissingJobSocket("n1".into()))
        );
        assert_eq!(
            check_target(S::Handover, "n1", &socket, Some("src")),
            Ok(())
        );
        assert_eq!(check_target(S::Overlap, "n1", &none, Some("src")), Ok(()));
        assert_eq!(check_target(S::StopThenStart, "n1", &none, None), Ok(()));
    }

    #[test]
    fn the_source_node_cannot_be_the_target() {
        assert_eq!(
            check_target(S::Overlap, "src", &[], Some("src")),
            Err(TargetRefused::IsSource("src".into()))
        );
        let mut m = machine(S::Overlap);
        let mut w = World::new();
        drive(&mut m, &mut w, &[MigrationEvent::Start]);
        assert_eq!(
            m.apply(MigrationEvent::TargetPlaced { node: "src".into() }, at(2)),
            Err(MigrationError::TargetIsSource { node: "src".into() })
        );
        assert_eq!(m.phase(), P::PlacingTarget);
    }

    #[test]
    fn an_empty_or_oversized_target_node_id_is_refused() {
        let mut m = machine(S::Overlap);
        let mut w = World::new();
        drive(&mut m, &mut w, &[MigrationEvent::Start]);
        for node in [String::new(), "x".repeat(254)] {
            assert!(matches!(
                m.next(MigrationEvent::TargetPlaced { node }, at(2)),
                Err(MigrationError::InvalidTargetNode { .. })
            ));
        }
    }

    // ---- happy paths ----

    #[test]
    fn every_strategy_walks_its_happy_path_one_phase_per_event() {
        for s in STRATEGIES {
            let mut m = machine(s);
            let mut w = World::new();
            let ts = drive(&mut m, &mut w, &happy_events(s));
            let mut phases = vec![P::Pending];
            phases.extend(ts.iter().map(|t| t.phase));
            assert_eq!(phases, happy_path(s), "{s:?}");
            for (i, t) in ts.iter().enumerate() {
                assert_eq!(
                    t.entered,
                    Some(PhaseTransition {
                        phase: t.phase,
                        entered_at: at(i64::try_from(i).unwrap_or(0) + 1)
                    })
                );
                assert_eq!(t.ended, i + 1 == ts.len());
            }
            assert_eq!(w.running, BTreeSet::from(["target"]), "{s:?}");
            assert!(m.is_ended());
            let last = ts.last().map(|t| t.actions.clone()).unwrap_or_default();
            assert!(last.contains(&Action::AdoptTarget { node: "dst".into() }));
        }
    }

    fn cut_over() -> Action {
        Action::CutOver {
            payload: Payload::new(),
        }
    }

    #[test]
    fn overlap_starts_the_target_before_manager_cuts_over() {
        assert_eq!(
            happy_actions(S::Overlap),
            vec![
                Action::Propose {
                    strategy: S::Overlap
                },
                Action::PlaceTarget,
                start_target("dst".into(), None),
                cut_over(),
                Action::AdoptTarget { node: "dst".into() },
            ]
        );
    }

    #[test]
    fn stop_then_start_prepares_the_target_then_manager_cuts_over() {
        assert_eq!(
            happy_actions(S::StopThenStart),
            vec![
                Action::Propose {
                    strategy: S::StopThenStart
                },
                Action::PlaceTarget,
                Action::PrepareTarget { node: "dst".into() },
                cut_over(),
                Action::AdoptTarget { node: "dst".into() },
            ]
        );
    }

    #[test]
    fn stop_then_start_never_runs_two_instances() {
        let mut m = machine(S::StopThenStart);
        let mut w = World::new();
        for e in happy_events(S::StopThenStart) {
            drive(&mut m, &mut w, &[e]);
            assert!(w.running.len() <= 1, "{:?}: {:?}", m.phase(), w.running);
        }
    }

    #[test]
    fn handover_relays_each_payload_to_the_other_side_and_records_the_summary() {
        let ts = drive(
            &mut machine(S::Handover),
            &mut World::new(),
            &happy_events(S::Handover),
        );
        let actions: Vec<Action> = ts.iter().flat_map(|t| t.actions.clone()).collect();
        assert_eq!(
            actions,
            vec![
                Action::Propose {
                    strategy: S::Handover
                },
                Action::PlaceTarget,
                start_target("dst".into(), Some(b"{\"pos\":1}".to_vec())),
                Action::CutOver {
                    payload: b"\"ready\"".to_vec()
                },
                Action::AdoptTarget { node: "dst".into() },
            ]
        );
        assert_eq!(ts.last().and_then(|t| t.handover.clone()), Some(summary()));
    }

    #[test]
    fn every_strategy_is_driven_through_the_migration_calls_alone() {
        use ManagerCall as C;
        for s in STRATEGIES {
            let calls: Vec<ManagerCall> =
                happy_actions(s).iter().filter_map(Action::call).collect();
            let prepare = C::PrepareTarget {
                node: "dst".into(),
                initial_state: if s == S::Handover {
                    b"{\"pos\":1}".to_vec()
                } else {
                    Vec::new()
                },
            };
            let cutover = C::Cutover {
                payload: if s == S::Handover {
                    b"\"ready\"".to_vec()
                } else {
                    Vec::new()
                },
            };
            // Manager starts the target (as `migrationTarget`), stops the source and promotes the
            // target; nothing is started or stopped around it.
            assert_eq!(
                calls,
                vec![C::Propose { strategy: s }, prepare, cutover],
                "{s:?}"
            );
        }
    }

    #[test]
    fn state_refused_ends_the_handover_with_no_target_placed() {
        let mut m = machine(S::Handover);
        let mut w = World::new();
        let ts = drive(
            &mut m,
            &mut w,
            &[
                MigrationEvent::Start,
                MigrationEvent::StateRefused {
                    reason: "mid-ad-break".into(),
                },
            ],
        );
        let last = &ts[1];
        assert_eq!(last.phase, P::Refused);
        assert!(last.ended);
        assert!(last.actions.is_empty());
        assert_eq!(last.failure.as_deref(), Some("mid-ad-break"));
        assert_eq!(m.target_node(), None);
        assert_eq!(w.running, BTreeSet::from(["source"]));
    }

    #[test]
    fn a_handover_summary_is_cut_to_the_status_bounds() {
        let big = HandoverSummary {
            applied: (0..100)
                .map(|i| format!("{i}{}", "p".repeat(300)))
                .collect(),
            failed: (0..100)
                .map(|i| FailedParticipant {
                    id: i.to_string(),
                    reason: "r".repeat(5000),
                })
                .collect(),
            skew_ms: Some(f64::NAN),
        };
        let b = bounded_summary(big);
        assert_eq!((b.applied.len(), b.failed.len()), (64, 64));
        assert!(b.applied.iter().all(|a| a.chars().count() <= 256));
        assert!(b.failed.iter().all(|f| f.reason.chars().count() <= 1024));
        assert_eq!(b.skew_ms, None);
    }

    #[test]
    fn an_oversized_payload_the_operator_must_relay_aborts_the_handover() {
        let huge = vec![b'x'; MAX_PAYLOAD_BYTES + 1];
        let mut m = machine(S::Handover);
        let mut w = World::new();
        drive(&mut m, &mut w, &[MigrationEvent::Start]);
        let t = m
            .apply(
                MigrationEvent::StateReceived {
                    payload: huge.clone(),
                },
                at(2),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.phase, P::Aborted);
        assert_eq!(t.abort.as_ref().map(|a| a.by.as_str()), Some("operator"));

        let (mut m, mut w) = after(S::Handover, 3);
        assert_eq!(m.phase(), P::StartingTarget);
        let t = m
            .apply(MigrationEvent::TargetReady { payload: huge }, at(9))
            .unwrap_or_else(|e| panic!("{e}"));
        w.act(&t);
        assert_eq!(t.phase, P::Aborted);
        assert_eq!(t.abort.as_ref().map(|a| a.by.as_str()), Some("operator"));
        assert_eq!(w.running, BTreeSet::from(["source"]));
    }

    // ---- abort ----

    #[test]
    fn abortable_phases_are_exactly_those_before_the_point_of_no_return() {
        assert!(is_abortable(S::Overlap, P::TargetRunning));
        assert!(!is_abortable(S::Overlap, P::StoppingSource));
        assert!(is_abortable(S::StopThenStart, P::PreparingTarget));
        assert!(!is_abortable(S::StopThenStart, P::StoppingSource));
        assert!(!is_abortable(S::StopThenStart, P::StartingTarget));
        assert!(is_abortable(S::Handover, P::CutoverReady));
        assert!(!is_abortable(S::Handover, P::SourceStoppedOutput));
        assert!(!is_abortable(S::Handover, P::CutoverApply));
        for s in STRATEGIES {
            assert!(is_abortable(s, P::Pending));
            assert!(!is_abortable(s, P::Completed));
            assert!(!is_abortable(s, P::Aborted));
        }
    }

    #[test]
    fn a_user_abort_at_every_abortable_phase_leaves_only_the_source_running() {
        for s in STRATEGIES {
            for k in 0..happy_events(s).len() {
                let (mut m, mut w) = after(s, k);
                if !m.is_abortable() {
                    continue;
                }
                let phase = m.phase();
                let t = m
                    .apply(
                        MigrationEvent::AbortRequested {
                            by: AbortBy::User,
                            reason: "changed my mind".into(),
                        },
                        at(100),
                    )
                    .unwrap_or_else(|e| panic!("{s:?} {phase:?}: {e}"));
                w.act(&t);
                assert_eq!(t.phase, P::Aborted);
                assert!(t.ended);
                assert_eq!(
                    t.abort,
                    Some(AbortInfo {
                        reason: "changed my mind".into(),
                        phase,
                        by: "user".into(),
                        at: at(100)
                    })
                );
                assert_eq!(w.running, BTreeSet::from(["source"]), "{s:?} {phase:?}");
                assert!(!t.actions.iter().any(|a| matches!(
                    a,
                    Action::StopSource { .. } | Action::RecoverByBand { .. }
                )));
            }
        }
    }

    #[test]
    fn an_abort_aborts_the_migration_in_manager_once_proposed_and_cleans_up_the_target() {
        for s in STRATEGIES {
            for k in 0..happy_events(s).len() {
                let (m, _) = after(s, k);
                if !m.is_abortable() {
                    continue;
                }
                let actions = m
                    .next(
                        MigrationEvent::AbortRequested {
                            by: AbortBy::User,
                            reason: "r".into(),
                        },
                        at(9),
                    )
                    .map(|t| t.actions)
                    .unwrap_or_default();
                let mut expected = Vec::new();
                if m.phase() != P::Pending {
                    expected.push(Action::Abort { reason: "r".into() });
                }
                if m.target_node().is_some() {
                    expected.push(Action::StopTarget { node: "dst".into() });
                }
                assert_eq!(actions, expected, "{s:?} {:?}", m.phase());
            }
        }
    }

    #[test]
    fn past_the_point_of_no_return_a_user_abort_is_refused_and_the_migration_goes_on() {
        for s in STRATEGIES {
            let evs = happy_events(s);
            for k in 0..evs.len() {
                let mut m = machine(s);
                drive(&mut m, &mut World::new(), &evs[..k]);
                if m.is_abortable() || m.is_ended() {
                    continue;
                }
                let before = m.clone();
                for by in [AbortBy::User, AbortBy::Operator] {
                    assert_eq!(
                        m.apply(
                            MigrationEvent::AbortRequested {
                                by,
                                reason: "stop".into()
                            },
                            at(50)
                        ),
                        Err(MigrationError::NotAbortable { phase: m.phase() })
                    );
                }
                assert_eq!(m, before);
                // ...and the rest of the happy path still completes it.
                drive(&mut m, &mut World::new(), &evs[k..]);
                assert_eq!(m.phase(), P::Completed);
            }
        }
    }

    #[test]
    fn past_the_point_of_no_return_a_job_abort_fails_into_band_recovery() {
        let evs = happy_events(S::Handover);
        let mut m = machine(S::Handover);
        let mut w = World::new();
        drive(&mut m, &mut w, &evs[..6]);
        assert_eq!(m.phase(), P::SourceStoppedOutput);
        let t = m
            .apply(
                MigrationEvent::AbortRequested {
                    by: AbortBy::Target,
                    reason: "cannot apply".into(),
                },
                at(20),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        w.act(&t);
        assert_eq!(t.phase, P::Failed);
        assert!(t.abort.is_none());
        assert_eq!(t.failure.as_deref(), Some("target aborted: cannot apply"));
        assert_eq!(w.running, BTreeSet::from(["recovered"]));
    }

    #[test]
    fn a_failed_target_before_the_point_of_no_return_aborts_and_after_it_fails() {
        let (mut m, mut w) = after(S::Overlap, 3);
        assert_eq!(m.phase(), P::TargetRunning);
        let ev = MigrationEvent::TargetFailed {
            reason: "crashed".into(),
        };
        w.observe(&ev);
        let t = m.apply(ev, at(9)).unwrap_or_else(|e| panic!("{e}"));
        w.act(&t);
        assert_eq!(t.abort.as_ref().map(|a| a.by.as_str()), Some("target"));
        assert_eq!(w.running, BTreeSet::from(["source"]));

        let (mut m, mut w) = after(S::StopThenStart, 4);
        assert_eq!(m.phase(), P::StartingTarget);
        let ev = MigrationEvent::TargetFailed {
            reason: "rejected".into(),
        };
        w.observe(&ev);
        let t = m.apply(ev, at(9)).unwrap_or_else(|e| panic!("{e}"));
        w.act(&t);
        assert_eq!(t.phase, P::Failed);
        assert!(
            !t.actions
                .iter()
                .any(|a| matches!(a, Action::StopSource { .. })),
            "the source is already stopped"
        );
        assert_eq!(w.running, BTreeSet::from(["recovered"]));
    }

    #[test]
    fn a_placement_failure_aborts_by_the_operator() {
        let (mut m, _) = after(S::Handover, 2);
        let t = m
            .apply(
                MigrationEvent::PlacementFailed {
                    reason: "no node fits".into(),
                },
                at(5),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.phase, P::Aborted);
        assert_eq!(
            t.abort.as_ref().map(|a| (a.by.as_str(), a.reason.as_str())),
            Some(("operator", "no target node: no node fits"))
        );
        assert_eq!(
            t.actions,
            vec![Action::Abort {
                reason: "no target node: no node fits".into()
            }]
        );
    }

    #[test]
    fn a_failed_source_ends_in_band_recovery_at_any_phase() {
        for s in STRATEGIES {
            for k in 0..happy_events(s).len() {
                let (mut m, mut w) = after(s, k);
                let ev = MigrationEvent::SourceFailed {
                    reason: "oom".into(),
                };
                w.observe(&ev);
                let t = m.apply(ev, at(50)).unwrap_or_else(|e| panic!("{e}"));
                w.act(&t);
                assert_eq!(t.phase, P::Failed);
                assert_eq!(w.running, BTreeSet::from(["recovered"]), "{s:?} after {k}");
            }
        }
    }

    #[test]
    fn reasons_are_cut_to_1024_characters() {
        let mut m = machine(S::Overlap);
        let t = m
            .apply(
                MigrationEvent::AbortRequested {
                    by: AbortBy::User,
                    reason: "é".repeat(5000),
                },
                at(1),
            )
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(t.abort.map(|a| a.reason.chars().count()), Some(1024));
    }

    // ---- timeouts ----

    #[test]
    fn every_phase_times_out_aborting_before_the_point_of_no_return_and_failing_after() {
        for s in STRATEGIES {
            for k in 0..happy_events(s).len() {
                let (mut m, mut w) = after(s, k);
                let phase = m.phase();
                let abortable = m.is_abortable();
                let t = m
                    .apply(MigrationEvent::PhaseTimedOut, at(1000))
                    .unwrap_or_else(|e| panic!("{s:?} {phase:?}: {e}"));
                w.act(&t);
                assert!(t.ended);
                if abortable {
                    assert_eq!(t.phase, P::Aborted);
                    assert_eq!(
                        t.abort.as_ref().map(|a| (a.by.as_str(), a.phase)),
                        Some(("timeout", phase))
                    );
                    assert_eq!(w.running, BTreeSet::from(["source"]), "{s:?} {phase:?}");
                } else {
                    assert_eq!(t.phase, P::Failed);
                    assert!(
                        t.actions
                            .iter()
                            .any(|a| matches!(a, Action::RecoverByBand { .. }))
                    );
                    assert_eq!(w.running, BTreeSet::from(["recovered"]), "{s:?} {phase:?}");
                }
            }
        }
    }

    #[test]
    fn a_deadline_is_the_phase_entry_plus_its_timeout_and_terminal_phases_have_none() {
        let timeouts = PhaseTimeouts::uniform(std::time::Duration::from_secs(30))
            .with(P::PlacingTarget, std::time::Duration::from_secs(300));
        assert_eq!(deadline(P::StartingTarget, t0(), &timeouts), Some(at(30)));
        assert_eq!(deadline(P::PlacingTarget, t0(), &timeouts), Some(at(300)));
        assert_eq!(deadline(P::Completed, t0(), &timeouts), None);
        assert_eq!(deadline(P::Aborted, t0(), &timeouts), None);
        assert_eq!(
            PhaseTimeouts::default().for_phase(P::Proposing),
            TimeDelta::seconds(60)
        );
        let mut m = machine(S::Overlap);
        assert!(!m.is_timed_out(at(59), &PhaseTimeouts::default()));
        assert!(m.is_timed_out(at(60), &PhaseTimeouts::default()));
        drive(&mut m, &mut World::new(), &[MigrationEvent::Start]);
        assert_eq!(m.deadline(&PhaseTimeouts::default()), Some(at(61)));
    }

    #[test]
    fn huge_timeouts_are_cut_to_a_day_and_never_overflow() {
        let t = PhaseTimeouts::uniform(std::time::Duration::MAX);
        assert_eq!(t.for_phase(P::Pending), MAX_PHASE_TIMEOUT);
        assert_eq!(
            deadline(P::Pending, DateTime::<Utc>::MAX_UTC, &t),
            Some(DateTime::<Utc>::MAX_UTC)
        );
    }

    // ---- wrong events ----

    #[test]
    fn an_event_out_of_place_is_refused_and_changes_nothing() {
        let mut m = machine(S::Overlap);
        let before = m.clone();
        assert_eq!(
            m.apply(MigrationEvent::SourceStopped, at(1)),
            Err(MigrationError::Unexpected {
                strategy: S::Overlap,
                phase: P::Pending,
                event: "SourceStopped"
            })
        );
        assert_eq!(m, before);
        // Handover frames make no sense in the other strategies.
        drive(&mut m, &mut World::new(), &[MigrationEvent::Start]);
        assert!(matches!(
            m.next(
                MigrationEvent::StateReceived {
                    payload: Vec::new()
                },
                at(2)
            ),
            Err(MigrationError::Unexpected { .. })
        ));
        // The target cannot be ready before it was placed.
        let mut h = machine(S::Handover);
        drive(&mut h, &mut World::new(), &[MigrationEvent::Start]);
        assert!(matches!(
            h.next(
                MigrationEvent::TargetReady {
                    payload: Vec::new()
                },
                at(2)
            ),
            Err(MigrationError::Unexpected { .. })
        ));
        assert!(matches!(
            h.next(MigrationEvent::TargetFailed { reason: "x".into() }, at(2)),
            Err(MigrationError::Unexpected { .. })
        ));
    }

    #[test]
    fn once_ended_every_event_is_refused() {
        let mut m = machine(S::Overlap);
        drive(&mut m, &mut World::new(), &happy_events(S::Overlap));
        for e in [
            MigrationEvent::PhaseTimedOut,
            MigrationEvent::AbortRequested {
                by: AbortBy::User,
                reason: "late".into(),
            },
            MigrationEvent::Start,
        ] {
            assert_eq!(
                m.next(e.clone(), at(99)),
                Err(MigrationError::Ended {
                    phase: P::Completed,
                    event: e.name()
                })
            );
        }
    }

    #[test]
    fn re_delivered_events_are_accepted_as_no_ops() {
        let (m, _) = after(S::Overlap, 3);
        for e in [
            MigrationEvent::TargetRunning,
            MigrationEvent::TargetStarted,
            MigrationEvent::TargetPlaced { node: "dst".into() },
        ] {
            let t = m.next(e, at(50)).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                (t.phase, t.entered.is_none(), t.actions.is_empty()),
                (P::TargetRunning, true, true)
            );
            assert_eq!(t.machine, m);
        }
        assert!(matches!(
            m.next(
                MigrationEvent::TargetPlaced {
                    node: "elsewhere".into()
                },
                at(50)
            ),
            Err(MigrationError::Unexpected { .. })
        ));
    }

    #[test]
    fn a_handover_resumed_without_its_carried_payload_aborts_and_one_past_cutover_goes_on() {
        let proceed_after_resume_in = |phase| {
            MigrationMachine::resume(
                S::Handover,
                phase,
                t0(),
                Some("src".into()),
                Some("dst".into()),
            )
            .next(MigrationEvent::Proceed, at(1))
            .unwrap_or_else(|e| panic!("{e}"))
        };
        let t = proceed_after_resume_in(P::TargetReady);
        assert_eq!(t.phase, P::Aborted);
        assert!(
            t.actions
                .contains(&Action::StopTarget { node: "dst".into() })
        );
        // Manager relays the source's payload itself: nothing was lost.
        let t = proceed_after_resume_in(P::SourceStoppedOutput);
        assert_eq!((t.phase, t.actions), (P::CutoverApply, Vec::new()));
    }

    #[test]
    fn waypoints_wait_for_proceed() {
        for s in STRATEGIES {
            let evs = happy_events(s);
            let mut m = machine(s);
            for e in &evs {
                assert_eq!(
                    m.is_waypoint(),
                    *e == MigrationEvent::Proceed,
                    "{s:?} {:?}",
                    m.phase()
                );
                drive(&mut m, &mut World::new(), std::slice::from_ref(e));
            }
        }
    }

    // ---- one at a time ----

    fn job() -> SourceJob {
        SourceJob {
            namespace: "ns".into(),
            bundle: "channel-1".into(),
            replica: 0,
            job_name: "encode".into(),
        }
    }

    fn record(name: &str, phase: MigrationPhase, created_secs: i64) -> MigrationRecord {
        MigrationRecord {
            name: name.into(),
            job: job(),
            phase,
            created_at: at(created_secs),
            deadline: false,
        }
    }

    fn deadline_move(name: &str, phase: MigrationPhase, created_secs: i64) -> MigrationRecord {
        MigrationRecord {
            deadline: true,
            ..record(name, phase, created_secs)
        }
    }

    #[test]
    fn a_second_migration_of_a_job_in_progress_is_refused_not_queued() {
        let existing = [record("first", P::StartingTarget, 0)];
        let second = record("second", P::Pending, 10);
        let err = one_at_a_time(&existing, &second);
        assert_eq!(
            err,
            Err(ConcurrentMigration {
                job: job(),
                by: "first".into(),
                phase: P::StartingTarget
            })
        );
        assert_eq!(
            err.map_err(|e| e.to_string()),
            Err("ns/channel-1 replica 0 job encode is already being migrated by Migration first (phase StartingTarget); one migration at a time per job: this one is refused, not queued; create it again once first has ended".to_owned())
        );
    }

    #[test]
    fn ended_migrations_and_other_jobs_do_not_block() {
        let mut other = record("other-job", P::StartingTarget, 0);
        other.job.replica = 1;
        let existing = [
            record("done", P::Completed, 0),
            record("aborted", P::Aborted, 0),
            record("rejected", P::Rejected, 0),
            other,
        ];
        assert_eq!(
            one_at_a_time(&existing, &record("new", P::Pending, 10)),
            Ok(Claim::go())
        );
    }

    #[test]
    fn of_two_pending_migrations_created_together_exactly_one_starts() {
        let a = record("a", P::Pending, 5);
        let b = record("b", P::Pending, 5);
        let all = [a.clone(), b.clone()];
        assert_eq!(one_at_a_time(&all, &a), Ok(Claim::go()));
        assert!(one_at_a_time(&all, &b).is_err());
        let older = record("z", P::Pending, 1);
        let all = [older.clone(), a.clone()];
        assert_eq!(one_at_a_time(&all, &older), Ok(Claim::go()));
        assert!(one_at_a_time(&all, &a).is_err());
    }

    #[test]
    fn a_migration_already_under_way_is_never_refused_by_the_rule() {
        let existing = [record("x", P::Pending, 0)];
        assert_eq!(
            one_at_a_time(&existing, &record("y", P::PlacingTarget, 10)),
            Ok(Claim::go())
        );
    }

    #[test]
    fn a_move_with_a_deadline_supersedes_the_held_migrations_of_its_job() {
        // A drain's Migration created long before waits (a window, a budget, the queue).
        let held = record("drain-n1-abc", P::Pending, 0);
        let user = record("move-encode", P::Pending, 5);
        let notice = deadline_move("reclaim-n1-abc", P::Pending, 60);
        let all = [held.clone(), user.clone(), notice.clone()];
        assert_eq!(
            one_at_a_time(&all, &notice),
            Ok(Claim::Go {
                supersede: vec!["drain-n1-abc".into(), "move-encode".into()]
            })
        );
        // Whichever pass comes first, the held ones end the same way.
        for m in [&held, &user] {
            assert_eq!(
                one_at_a_time(&all, m),
                Ok(Claim::Superseded {
                    by: "reclaim-n1-abc".into()
                })
            );
        }
    }

    #[test]
    fn a_held_migration_whose_source_is_gone_ends_and_one_whose_source_stands_does_not() {
        let held = |gone| Some(HeldSource { node: "n1", gone });
        assert_eq!(source_gone(None, Some("n2")), None, "nothing recorded yet");
        assert_eq!(source_gone(held(None), Some("n1")), None);
        assert_eq!(
            source_gone(held(None), None),
            None,
            "not running: not decided here"
        );
        let gone = source_gone(held(Some("terminated")), Some("n2"));
        assert_eq!(
            gone.as_ref().map(ToString::to_string).as_deref(),
            Some(
                "its source node n1 is gone (terminated); the job no longer runs there, so this Migration ends instead of moving it from wherever it runs now"
            )
        );
        assert_eq!(
            source_gone(held(None), Some("n2")),
            Some(SourceGone::JobMoved {
                node: "n1".into(),
                now: "n2".into()
            })
        );
    }

    #[test]
    fn a_move_under_way_is_never_superseded_and_refuses_a_deadline_move_too() {
        let moving = record("drain-n1-abc", P::StartingTarget, 0);
        let notice = deadline_move("reclaim-n1-abc", P::Pending, 60);
        let err = one_at_a_time(&[moving, notice.clone()], &notice);
        assert!(
            matches!(&err, Err(e) if e.by == "drain-n1-abc" && e.phase == P::StartingTarget),
            "{err:?}"
        );
    }

    #[test]
    fn of_two_deadline_moves_the_older_goes_and_the_other_is_refused() {
        let a = deadline_move("a", P::Pending, 5);
        let b = deadline_move("b", P::Pending, 9);
        let all = [a.clone(), b.clone()];
        assert_eq!(one_at_a_time(&all, &a), Ok(Claim::go()));
        assert!(matches!(one_at_a_time(&all, &b), Err(e) if e.by == "a"));
    }

    // ---- properties ----

    fn arb_payload() -> impl Strategy<Value = Payload> {
        prop_oneof![
            8 => prop::collection::vec(any::<u8>(), 0..16),
            1 => Just(vec![b'x'; MAX_PAYLOAD_BYTES + 1]),
        ]
    }

    fn arb_by() -> impl Strategy<Value = AbortBy> {
        prop_oneof![
            Just(AbortBy::User),
            Just(AbortBy::Source),
            Just(AbortBy::Target),
            Just(AbortBy::Timeout),
            Just(AbortBy::Operator),
        ]
    }

    fn arb_event() -> impl Strategy<Value = MigrationEvent> {
        use MigrationEvent as E;
        prop_oneof![
            3 => Just(E::Start),
            2 => arb_payload().prop_map(|payload| E::StateReceived { payload }),
            1 => Just(E::StateRefused { reason: "no".into() }),
            3 => prop_oneof![Just("dst"), Just("src"), Just(""), Just("other")]
                .prop_map(|n| E::TargetPlaced { node: n.to_owned() }),
            1 => Just(E::PlacementFailed { reason: "full".into() }),
            2 => Just(E::TargetPrepared),
            2 => Just(E::TargetStarted),
            3 => Just(E::TargetRunning),
            2 => arb_payload().prop_map(|payload| E::TargetReady { payload }),
            4 => Just(E::Proceed),
            2 => Just(E::SourceStoppedOutput),
            3 => Just(E::SourceStopped),
            2 => Just(E::TargetApplied { summary: HandoverSummary::default() }),
            1 => arb_by().prop_map(|by| E::AbortRequested { by, reason: "r".into() }),
            1 => Just(E::PhaseTimedOut),
            1 => Just(E::TargetFailed { reason: "t".into() }),
            1 => Just(E::SourceFailed { reason: "s".into() }),
        ]
    }

    fn arb_strategy() -> impl Strategy<Value = MigrationStrategy> {
        prop_oneof![Just(S::StopThenStart), Just(S::Overlap), Just(S::Handover)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any set of Pending Migrations of one job: exactly one goes; when a move with a
        /// deadline is among them, the one that goes has a deadline and every held voluntary
        /// one is superseded, by its own pass and in the winner's list alike; the rest are
        /// refused naming a rival.
        #[test]
        fn exactly_one_pending_migration_of_a_job_goes_and_a_deadline_beats_every_held_one(
            pending in prop::collection::vec((0i64..5, any::<bool>()), 1..8),
        ) {
            let all: Vec<MigrationRecord> = pending
                .iter()
                .enumerate()
                .map(|(i, (created, d))| MigrationRecord {
                    deadline: *d,
                    ..record(&format!("m{i}"), P::Pending, *created)
                })
                .collect();
            let answers: Vec<_> = all.iter().map(|m| one_at_a_time(&all, m)).collect();
            let going: Vec<usize> = answers
                .iter()
                .enumerate()
                .filter(|(_, a)| matches!(a, Ok(Claim::Go { .. })))
                .map(|(i, _)| i)
                .collect();
            prop_assert_eq!(going.len(), 1, "{:?}", answers);
            let winner = &all[going[0]];
            let any_deadline = all.iter().any(|m| m.deadline);
            prop_assert_eq!(winner.deadline, any_deadline);
            let Ok(Claim::Go { supersede }) = &answers[going[0]] else { unreachable!() };
            for (m, a) in all.iter().zip(&answers) {
                if any_deadline && !m.deadline {
                    prop_assert!(matches!(a, Ok(Claim::Superseded { .. })), "{:?}", a);
                    prop_assert!(supersede.contains(&m.name));
                } else if m.name != winner.name {
                    prop_assert!(a.is_err(), "{:?}", a);
                    prop_assert!(!supersede.contains(&m.name));
                }
            }
        }

        /// Random event sequences: nothing panics, every accepted event keeps the phase, moves to
        /// the strategy's next phase or ends the migration, refused events change nothing, and a
        /// migration that ended leaves exactly one running instance. Timeouts alone always end
        /// whatever is left.
        #[test]
        fn random_events_never_panic_and_never_leave_two_instances(
            strategy in arb_strategy(), events in prop::collection::vec(arb_event(), 0..40),
        ) {
            let mut m = machine(strategy);
            let mut w = World::new();
            let path = happy_path(strategy);
            let mut clock = 0;
            let timeouts = events.into_iter().chain(std::iter::repeat_n(MigrationEvent::PhaseTimedOut, path.len()));
            for e in timeouts {
                if m.is_ended() { break; }
                clock += 1;
                let before = m.clone();
                let source_stopped_by_world = matches!(e, MigrationEvent::SourceFailed { .. });
                match m.apply(e.clone(), at(clock)) {
                    Ok(t) => {
                        if source_stopped_by_world || matches!(e, MigrationEvent::TargetFailed { .. }) {
                            w.observe(&e);
                        }
                        w.act(&t);
                        let i = path.iter().position(|p| *p == t.from);
                        let next = i.and_then(|i| path.get(i + 1)).copied();
                        prop_assert!(
                            t.phase == t.from || Some(t.phase) == next || is_terminal(t.phase),
                            "{:?} -> {:?} on {}", t.from, t.phase, e.name()
                        );
                        prop_assert_eq!(t.ended, is_terminal(t.phase));
                        prop_assert_eq!(&t.machine, &m);
                        if t.phase == P::Aborted {
                            prop_assert!(t.abort.is_some());
                        }
                    }
                    Err(_) => prop_assert_eq!(&m, &before),
                }
                if m.is_ended() {
                    prop_assert_eq!(w.running.len(), 1, "{:?} ended in {:?} with {:?}", strategy, m.phase(), w.running);
                }
            }
            prop_assert!(m.is_ended(), "timeouts did not end {:?} in {:?}", strategy, m.phase());
            prop_assert_eq!(w.running.len(), 1);
        }

        #[test]
        fn strategy_in_effect_never_exceeds_the_declaration(
            declared in prop::option::of(arb_strategy()), requested in prop::option::of(arb_strategy()),
        ) {
            let declared_rank = declared.unwrap_or_default().safety_rank();
            match strategy_in_effect(declared, requested) {
                Ok(s) => {
                    prop_assert!(s.safety_rank() <= declared_rank);
                    if let Some(r) = requested { prop_assert_eq!(s, r); }
                }
                Err(e) => prop_assert!(requested.is_some_and(|r| r.safety_rank() > declared_rank) && e.requested.safety_rank() > e.declared.safety_rank()),
            }
        }
    }
}
