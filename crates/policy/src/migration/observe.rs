//! What Manager's view of a migration means to the machine.
//!
//! The controller fills an [`Observed`] from its mirror of Manager (the migration record, the
//! job's instances, the target node's state) and asks [`next`] what is due: an event for the
//! machine, a placement, a Manager call to send again, or nothing yet. The answers Manager gives
//! to the machine's calls ([`super::Action::call`]) are read back by [`answer`]. Both are plain
//! functions over plain data: no proto types, no I/O.
//!
//! Manager reports coarser phases than the machine (`docs/manager-api.md`), so one Manager phase
//! may stand for several machine events; the controller asks again after each event until
//! [`Next::Wait`]. A handover's `COMPLETED` is, in turn, `source-stopped-output`, the go-ahead
//! and `target-applied`; a stop-then-start's `CUTTING_OVER` with the source gone is "source
//! stopped", and its `COMPLETED` "target running".

use super::{
    AbortBy, HandoverSummary, InstanceRole, ManagerCall, MigrationEvent, MigrationMachine,
    MigrationPhase, MigrationStrategy, Payload, PhaseTimeouts,
};
use chrono::{DateTime, Utc};

/// Manager's phase of a migration record (`MigrationPhase` in `docs/manager-api.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManagerPhase {
    /// handover: `get-state` was sent to the source.
    Proposed,
    /// The source's state is in (or, overlap and stop-then-start, nothing was asked).
    StateReceived,
    /// The target instance was started.
    PreparingTarget,
    /// The target is ready: handover `target-ready`, overlap running, stop-then-start reserved.
    TargetReady,
    /// Manager is cutting over.
    CuttingOver,
    /// The target is the job's normal instance; the source is stopped.
    Completed,
    /// Ended early ([`ManagerRecord::aborted_by`] says by whom).
    Aborted,
}

/// Who ended a migration in Manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManagerParty {
    /// A controller's `MigrationAbort`.
    Controller,
    /// The source job (`state-refused` or `abort`).
    Source,
    /// The target job (`abort`), or the target's worker refused it.
    Target,
    /// Manager itself (a participant's instance or node went away).
    Manager,
    /// Not said.
    Unknown,
}

/// Manager's record of this migration.
#[derive(Clone, Debug, PartialEq)]
pub struct ManagerRecord {
    /// Its phase.
    pub phase: ManagerPhase,
    /// handover: the source's state.
    pub source_state: Payload,
    /// handover: the target's `target-ready` payload.
    pub target_ready_payload: Payload,
    /// handover: what the target applied, once completed.
    pub summary: HandoverSummary,
    /// Who aborted it (phase Aborted).
    pub aborted_by: ManagerParty,
    /// Why (phase Aborted).
    pub abort_reason: String,
}

/// The state of a job instance as Manager reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    /// Starting.
    Starting,
    /// Running.
    Running,
    /// Being stopped.
    Stopping,
    /// Stopped.
    Stopped,
    /// Failed.
    Failed,
}

impl InstanceState {
    /// Whether the instance still holds its node's capacity (starting, running, stopping).
    pub fn holds(self) -> bool {
        matches!(
            self,
            InstanceState::Starting | InstanceState::Running | InstanceState::Stopping
        )
    }
}

/// One instance of the job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Instance {
    /// Its node.
    pub node: String,
    /// Its role.
    pub role: InstanceRole,
    /// Its state.
    pub state: InstanceState,
}

/// Whether the migration's target node can take the job now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeReadiness {
    /// Started.
    Started,
    /// Still starting (provisioned for the target, say).
    Starting,
    /// Stopped, terminated, unknown, or no target placed.
    Unavailable,
}

/// What the controller sees of one migration, filled from its mirror of Manager.
#[derive(Clone, Debug, PartialEq)]
pub struct Observed {
    /// A user's abort not yet offered to the machine in this reconcile (`spec.abort`'s reason,
    /// or the Migration's deletion).
    pub user_abort: Option<String>,
    /// Manager's record of the migration, once proposed.
    pub record: Option<ManagerRecord>,
    /// The job's instances (live and last known).
    pub instances: Vec<Instance>,
    /// The machine's target node, as Manager reports it.
    pub target_node: NodeReadiness,
}

/// What is due now.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Feed this event to the machine.
    Event(MigrationEvent),
    /// Choose the target node (placement I/O) and feed `TargetPlaced` or `PlacementFailed`.
    PlaceTarget,
    /// Send this call again: Manager's record shows it is still due (an earlier call failed,
    /// or the target's node was still starting). A refusal means the mirror lagged behind.
    Resend(ManagerCall),
    /// Nothing until Manager moves on.
    Wait,
}

/// How Manager answered a call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallOutcome {
    /// Accepted (or already done: a propose whose answer was lost).
    Done,
    /// Refused: a precondition, a missing object, an invalid argument.
    Refused(String),
    /// The target's worker refused to take the job (capacity, cores, capability, node state).
    WorkerRefused {
        /// The node is not started yet: try again once it is.
        node_not_ready: bool,
        /// Why.
        message: String,
    },
}

/// What is due for `machine`, given what the controller sees at `now`.
pub fn next(
    machine: &MigrationMachine,
    seen: &Observed,
    now: DateTime<Utc>,
    timeouts: &PhaseTimeouts,
) -> Next {
    use ManagerPhase as M;
    use MigrationPhase as P;
    use MigrationStrategy as S;
    if machine.is_ended() {
        return Next::Wait;
    }
    if let Some(reason) = &seen.user_abort {
        return Next::Event(MigrationEvent::AbortRequested {
            by: AbortBy::User,
            reason: reason.clone(),
        });
    }
    if machine.is_timed_out(now, timeouts) {
        return Next::Event(MigrationEvent::PhaseTimedOut);
    }
    if machine.is_waypoint() {
        return Next::Event(MigrationEvent::Proceed);
    }
    // The controller starts a Pending migration once it is admitted.
    if machine.phase() == P::Pending {
        return Next::Wait;
    }
    if let Some(r) = seen.record.as_ref().filter(|r| r.phase == M::Aborted) {
        return Next::Event(aborted_event(machine, r, seen));
    }
    if machine.phase() == P::PlacingTarget {
        return Next::PlaceTarget;
    }
    let Some(r) = &seen.record else {
        return Next::Wait;
    };
    let event = |e| Next::Event(e);
    match (machine.strategy(), machine.phase(), r.phase) {
        (S::Handover, P::Proposing, M::StateReceived) => event(MigrationEvent::StateReceived {
            payload: r.source_state.clone(),
        }),
        (_, P::StartingTarget | P::PreparingTarget, M::StateReceived) => {
            prepare_due(machine, seen, r)
        }
        // Completed: an operator killed after it sent the cutover but before it wrote the
        // phase resumes here; the record still holds the payload, and the steps that follow
        // (a cutover Manager refuses as done, then Completed) finish the machine.
        (S::Handover, P::StartingTarget, M::TargetReady | M::CuttingOver | M::Completed) => {
            event(MigrationEvent::TargetReady {
                payload: r.target_ready_payload.clone(),
            })
        }
        (S::Overlap, P::StartingTarget, M::TargetReady) => event(MigrationEvent::TargetRunning),
        (S::StopThenStart, P::PreparingTarget, M::TargetReady) => {
            event(MigrationEvent::TargetPrepared)
        }
        (S::Handover, P::CutoverReady, M::TargetReady) => Next::Resend(ManagerCall::Cutover {
            payload: r.target_ready_payload.clone(),
        }),
        (S::Overlap | S::StopThenStart, P::StoppingSource, M::TargetReady) => {
            Next::Resend(ManagerCall::Cutover {
                payload: Payload::new(),
            })
        }
        (S::Handover, P::CutoverReady, M::Completed) => event(MigrationEvent::SourceStoppedOutput),
        (S::Handover, P::CutoverApply, M::Completed) => event(MigrationEvent::TargetApplied {
            summary: r.summary.clone(),
        }),
        (S::Overlap | S::StopThenStart, P::StoppingSource, M::Completed) => {
            event(MigrationEvent::SourceStopped)
        }
        (S::StopThenStart, P::StoppingSource, M::CuttingOver)
            if !source_holds(seen, machine.source_node()) =>
        {
            event(MigrationEvent::SourceStopped)
        }
        (S::StopThenStart, P::StartingTarget, M::Completed) => event(MigrationEvent::TargetRunning),
        _ => Next::Wait,
    }
}

/// The event a call's answer stands for, if any: a refused propose aborts (by the operator), a
/// refused target fails it. Other refusals change nothing: Manager's record tells what happened.
/// `resent`: the call was a [`Next::Resend`], whose refusal only means the mirror lagged.
pub fn answer(call: &ManagerCall, outcome: &CallOutcome, resent: bool) -> Option<MigrationEvent> {
    match (call, outcome) {
        (_, CallOutcome::Done) => None,
        (ManagerCall::Propose { .. }, CallOutcome::Refused(message)) if !resent => {
            Some(MigrationEvent::AbortRequested {
                by: AbortBy::Operator,
                reason: format!("Manager refused the migration: {message}"),
            })
        }
        // The node is still starting: the prepare is sent again once it is up.
        (
            ManagerCall::PrepareTarget { .. },
            CallOutcome::WorkerRefused {
                node_not_ready: true,
                ..
            },
        ) => None,
        (ManagerCall::PrepareTarget { .. }, CallOutcome::WorkerRefused { message, .. }) => {
            Some(MigrationEvent::TargetFailed {
                reason: message.clone(),
            })
        }
        (ManagerCall::PrepareTarget { .. }, CallOutcome::Refused(message)) if !resent => {
            Some(MigrationEvent::TargetFailed {
                reason: message.clone(),
            })
        }
        _ => None,
    }
}

/// The machine rebuilt from status (`from_status`, see [`MigrationMachine::resume`]) with what
/// Manager's record adds. A handover waiting in TargetReady needs the payload it relays next;
/// the record still holds it, so the machine is rebuilt one phase earlier and given that payload
/// again (keeping the phase's entry time).
pub fn resume(from_status: MigrationMachine, record: Option<&ManagerRecord>) -> MigrationMachine {
    let waits_for_payload = from_status.strategy() == MigrationStrategy::Handover
        && from_status.phase() == MigrationPhase::TargetReady;
    let Some(r) = record.filter(|_| waits_for_payload) else {
        return from_status;
    };
    let entered_at = from_status.entered_at();
    let before = MigrationMachine::resume(
        MigrationStrategy::Handover,
        MigrationPhase::StartingTarget,
        entered_at,
        from_status.source_node().map(str::to_owned),
        from_status.target_node().map(str::to_owned),
    );
    let replay = MigrationEvent::TargetReady {
        payload: r.target_ready_payload.clone(),
    };
    match before.next(replay, entered_at) {
        Ok(t) if t.phase == MigrationPhase::TargetReady => t.machine,
        _ => from_status,
    }
}

/// Manager's record shows the target's prepare (`MigrationPrepareTarget`) still due.
fn prepare_due(machine: &MigrationMachine, seen: &Observed, r: &ManagerRecord) -> Next {
    let Some(node) = machine.target_node() else {
        return Next::Wait;
    };
    match seen.target_node {
        NodeReadiness::Started => Next::Resend(ManagerCall::PrepareTarget {
            node: node.to_owned(),
            initial_state: if machine.strategy() == MigrationStrategy::Handover {
                r.source_state.clone()
            } else {
                Payload::new()
            },
        }),
        NodeReadiness::Starting => Next::Wait,
        NodeReadiness::Unavailable => Next::Event(MigrationEvent::TargetFailed {
            reason: format!("target node {node} is not available"),
        }),
    }
}

/// Whether the job's normal instance still holds its place on the source node.
fn source_holds(seen: &Observed, source: Option<&str>) -> bool {
    seen.instances.iter().any(|i| {
        i.role == InstanceRole::Normal && i.state.holds() && Some(i.node.as_str()) == source
    })
}

/// Manager's `ABORTED` as the machine's event.
fn aborted_event(machine: &MigrationMachine, r: &ManagerRecord, seen: &Observed) -> MigrationEvent {
    let reason = if r.abort_reason.is_empty() {
        "aborted in Manager".to_owned()
    } else {
        r.abort_reason.clone()
    };
    match r.aborted_by {
        // A source that gave its state and then aborted did not refuse it.
        ManagerParty::Source
            if machine.phase() == MigrationPhase::Proposing && r.source_state.is_empty() =>
        {
            MigrationEvent::StateRefused { reason }
        }
        ManagerParty::Source => MigrationEvent::AbortRequested {
            by: AbortBy::Source,
            reason,
        },
        ManagerParty::Target => MigrationEvent::AbortRequested {
            by: AbortBy::Target,
            reason,
        },
        ManagerParty::Controller | ManagerParty::Manager | ManagerParty::Unknown => {
            // Once Manager's stop-then-start cutover began, the source is meant to be down.
            let source_stopped_by_cutover = machine.strategy() == MigrationStrategy::StopThenStart
                && matches!(
                    machine.phase(),
                    MigrationPhase::StoppingSource | MigrationPhase::StartingTarget
                );
            let source_running = seen
                .instances
                .iter()
                .any(|i| i.role == InstanceRole::Normal && i.state == InstanceState::Running);
            if !source_running && !source_stopped_by_cutover {
                MigrationEvent::SourceFailed { reason }
            } else if machine.target_node().is_some() {
                MigrationEvent::TargetFailed { reason }
            } else {
                MigrationEvent::AbortRequested {
                    by: AbortBy::Operator,
                    reason,
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "observe_tests.rs"]
mod tests;
