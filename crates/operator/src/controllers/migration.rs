//! The Migration controller: moves one running job to another node with the strategy in effect.
//!
//! One reconcile is observe → decide → act → record:
//!
//! - **observe**: the Migration, and the mirror of Manager (its migration record, the job's
//!   instances, the target node) as plain data, [`observe::Observed`];
//! - **decide**: the pure machine in `automanager_policy::migration` ([`observe::next`] says what
//!   is due; the machine answers an event with a transition and its actions);
//! - **act**: each action's Manager call ([`Action::call`]: MigrationGetState with the strategy,
//!   MigrationPrepareTarget, MigrationCutover, MigrationAbort, a StopJob of a leftover instance),
//!   placement of the target ([`place`]), band recovery after a failure;
//! - **record**: status by server-side apply only when it changed, and Events.
//!
//! Every strategy goes through Manager's migration calls, and Manager owns the moves
//! (`docs/manager-api.md`): it starts the target with role `migrationTarget` (the source keeps
//! its own), and at cutover stops the source and promotes the target (overlap: start-then-stop;
//! stopThenStart: stop-then-start; handover: over the job socket). The controller never starts
//! an instance itself, so a target can only wear the migration target role. Only a handover asks
//! anything of the job, so only a handover target must advertise `norsk.io/job-socket`.
//!
//! Admission ([`admit`]) happens in Pending; a failed check ends in `Rejected` and touches
//! nothing. Band recovery after a failure past the point of no return is the Bundle
//! controller's: the job is handed over and re-placed by its band. Deleting a Migration past its
//! point of no return does not interrupt it: the finalizer stays until the migration ends.

mod admit;
pub(crate) use admit::has_deadline;
pub mod follow;
mod place;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{self as api, Migration, MigrationPhase, MigrationStatus};
use automanager_policy::migration::observe::{
    self, CallOutcome, Instance, InstanceState, ManagerParty, ManagerPhase, ManagerRecord, Next,
    NodeReadiness, Observed,
};
use automanager_policy::migration::{
    self as plan, AbortBy, Action, InstanceRole, ManagerCall, MigrationEvent, MigrationMachine,
    PhaseTimeouts,
};
use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use manager_client::ClientError;
use manager_proto as proto;

use super::{Context, Error, condition, is_final_answer, ns_name};
use crate::mapping;

/// How often an in-progress migration is looked at when nothing wakes it.
const POLL: Duration = Duration::from_millis(500);
/// Events fed to the machine in one reconcile, at most (a guard against a loop).
const MAX_STEPS: usize = 32;
/// Status `phases` holds at most this many entries (the schema's bound).
const MAX_PHASES: usize = 32;

pub async fn reconcile(mig: Arc<Migration>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let started = ctx.clock.instant();
    let (ns, _) = ns_name(mig.as_ref())?;
    let api: Api<Migration> = Api::namespaced(ctx.client.clone(), &ns);
    // Status is this controller's state store, and the cache can lag behind the last write
    // (every Manager change wakes every Migration, often before our own write is watched back):
    // act on the live object, or a running migration would be admitted again from `Pending`.
    let Some(mig) = api.get_opt(&mig.name_any()).await?.map(Arc::new) else {
        ctx.metrics.forget_migration(&ns, &mig.name_any());
        super::disruption::forget_migration(&ctx, &ns, &mig.name_any());
        end_target(&ctx, &mig);
        return Ok(Requeue::await_change());
    };
    observe(&ctx, &mig, &mig.status.clone().unwrap_or_default());
    let looked_at = mig.clone();
    let result = finalizer(&api, api::MIGRATION_FINALIZER, mig, |event| async {
        match event {
            Finalizer::Apply(m) => apply(&m, &ctx, false).await,
            Finalizer::Cleanup(m) => cleanup(&m, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    });
    ctx.metrics
        .observe_reconcile("migration", result.is_ok(), started.elapsed().as_secs_f64());
    if result.is_ok() {
        super::pass_succeeded(&ctx, looked_at.as_ref());
    }
    result
}

pub fn error_policy(mig: Arc<Migration>, error: &Error, ctx: Arc<Context>) -> Requeue {
    if super::is_conflict(error) {
        // Another pass wrote first (status is written at the version read): look again.
        tracing::debug!(migration = %mig.name_any(), error = %error, "migration changed during reconcile; retrying");
    } else {
        tracing::warn!(migration = %mig.name_any(), error = %error, "migration reconcile failed");
    }
    Requeue::requeue(super::retry_delay(&ctx, mig.as_ref(), error))
}

/// Deletion: abort while abortable; past the point of no return, finish first.
async fn cleanup(mig: &Migration, ctx: &Arc<Context>) -> Result<Requeue, Error> {
    let phase = mig.status.as_ref().map(|s| s.phase).unwrap_or_default();
    if plan::is_terminal(phase) || phase == MigrationPhase::Pending {
        // A queue slot it was given but never wrote down goes with it.
        super::disruption::forget_migration(ctx, &ns_name(mig)?.0, &mig.name_any());
        end_target(ctx, mig);
        return Ok(Requeue::await_change());
    }
    apply(mig, ctx, true).await?;
    let api: Api<Migration> = Api::namespaced(ctx.client.clone(), &ns_name(mig)?.0);
    let now = api
        .get_opt(&mig.name_any())
        .await?
        .and_then(|m| m.status)
        .map(|s| s.phase)
        .unwrap_or_default();
    if plan::is_terminal(now) {
        ctx.metrics
            .forget_migration(&ns_name(mig)?.0, &mig.name_any());
        Ok(Requeue::await_change())
    } else {
        Err(Error::Finalizer(format!(
            "Migration {} is past its point of no return (phase {now:?}); it is finished before it is removed",
            mig.name_any()
        )))
    }
}

/// How often a Migration waiting in the queue asks again (a slot or a budget may free up
/// through a change that does not wake it: another bundle's replica coming back).
const QUEUED_POLL: Duration = Duration::from_secs(1);

/// How a reconcile begins: with a migration to drive, with nothing more to do (rejected, or
/// deleted before it began), or waiting in the queue (status already written).
enum Begin<'a> {
    Run(Box<Run<'a>>),
    Ended,
    Queued,
}

/// What one reconcile knows and has done so far.
struct Run<'a> {
    ctx: &'a Arc<Context>,
    mig: &'a Migration,
    ns: String,
    job_id: String,
    migration_id: String,
    status: MigrationStatus,
    machine: MigrationMachine,
    /// Why the migration was refused or failed, for the condition.
    failure: Option<String>,
}

async fn apply(mig: &Migration, ctx: &Arc<Context>, deleting: bool) -> Result<Requeue, Error> {
    let prev = mig.status.clone().unwrap_or_default();
    let mut status = MigrationStatus {
        observed_generation: mig.metadata.generation,
        ..prev.clone()
    };
    if plan::is_terminal(prev.phase) {
        (ctx.state).track_migration(&kube::runtime::reflector::ObjectRef::from(mig), None);
        super::disruption::forget_migration(ctx, &ns_name(mig)?.0, &mig.name_any());
        end_target(ctx, mig);
        api::kstatus::observe_generation(&mut status.conditions, mig.metadata.generation);
        write_status(ctx, mig, &prev, status).await?;
        return Ok(Requeue::await_change());
    }
    if !ctx.manager_ready() {
        waiting_for_manager(ctx, mig, &mut status);
        write_status(ctx, mig, &prev, status).await?;
        return Ok(Requeue::requeue(Duration::from_secs(3)));
    }
    let mut run = match Run::begin(mig, ctx, status, deleting).await? {
        Begin::Run(run) => run,
        Begin::Ended => return Ok(Requeue::await_change()),
        Begin::Queued => return Ok(Requeue::requeue(QUEUED_POLL)),
    };
    run.keep_target_held();
    let result = run.drive(deleting).await;
    run.record_conditions(ctx.clock.now());
    let requeue = run.requeue();
    let moved = (run.status.phase == MigrationPhase::Completed
        && prev.phase != MigrationPhase::Completed)
        .then(|| {
            (
                run.status.source_node.clone(),
                run.status.target_node.clone(),
            )
        });
    write_status(ctx, mig, &prev, run.status).await?;
    result?;
    if let Some((Some(source), Some(target))) = moved {
        follow::create_followers(ctx, mig, &source, &target).await?;
    }
    Ok(requeue)
}

/// Status while Manager is unreachable: nothing can move, and the migration waits (Reconciling:
/// nothing in it needs fixing).
fn waiting_for_manager(ctx: &Context, mig: &Migration, status: &mut MigrationStatus) {
    let (generation, now) = (mig.metadata.generation, ctx.clock.now());
    let message = ctx.manager_unavailable().to_string();
    api::set_condition(
        &mut status.conditions,
        condition(
            "Progressing",
            false,
            "ManagerUnavailable",
            message.clone(),
            generation,
            now,
        ),
    );
    api::set_standing(
        &mut status.conditions,
        api::Standing::Reconciling,
        "ManagerUnavailable",
        message,
        generation,
        now,
    );
}

fn timeouts(ctx: &Context) -> PhaseTimeouts {
    PhaseTimeouts::uniform(ctx.settings.migration_phase_timeout)
}

/// The target of a migration that ended (or whose object is gone) holds no more than the
/// mirror shows, once the mirror shows a completed move.
fn end_target(ctx: &Context, mig: &Migration) {
    let status = mig.status.as_ref();
    let id =
        (status.and_then(|s| s.migration_id.clone())).unwrap_or_else(|| manager_migration_id(mig));
    let completed = status.is_some_and(|s| s.phase == MigrationPhase::Completed);
    (ctx.manager.mirror()).read(|m| ctx.state.end_migration_target(m, &id, completed));
}

/// Manager's migration id: unique per Migration object, and only `[A-Za-z0-9._-]`.
pub(crate) fn manager_migration_id(mig: &Migration) -> String {
    let uid = mig.metadata.uid.clone().unwrap_or_else(|| mig.name_any());
    let clean: String = uid
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(200)
        .collect();
    format!("automanager-{clean}")
}

fn push_phase(status: &mut MigrationStatus, phase: MigrationPhase, at: DateTime<Utc>) {
    status.phases.push(api::PhaseTransition {
        phase,
        entered_at: at,
    });
    if status.phases.len() > MAX_PHASES {
        let excess = status.phases.len() - MAX_PHASES;
        status.phases.drain(..excess);
    }
}

/// Manager's record of a migration as the policy reads it.
fn manager_record(m: &proto::Migration) -> ManagerRecord {
    use proto::MigrationPhase as P;
    ManagerRecord {
        phase: match m.phase() {
            P::Unspecified | P::Proposed => ManagerPhase::Proposed,
            P::StateReceived => ManagerPhase::StateReceived,
            P::PreparingTarget => ManagerPhase::PreparingTarget,
            P::TargetReady => ManagerPhase::TargetReady,
            P::CuttingOver => ManagerPhase::CuttingOver,
            P::Completed => ManagerPhase::Completed,
            P::Aborted => ManagerPhase::Aborted,
        },
        source_state: m.source_state.clone(),
        target_ready_payload: m.target_ready_payload.clone(),
        summary: api::HandoverSummary {
            applied: m.applied.clone(),
            failed: m
                .failed
                .iter()
                .map(|f| api::FailedParticipant {
                    id: f.id.clone(),
                    reason: f.reason.clone(),
                })
                .collect(),
            skew_ms: Some(m.skew_ms),
        },
        aborted_by: match m.aborted_by() {
            proto::MigrationParty::Controller => ManagerParty::Controller,
            proto::MigrationParty::Source => ManagerParty::Source,
            proto::MigrationParty::Target => ManagerParty::Target,
            proto::MigrationParty::Manager => ManagerParty::Manager,
            proto::MigrationParty::Unspecified => ManagerParty::Unknown,
        },
        abort_reason: m.abort_reason.clone(),
    }
}

/// A job instance as the policy reads it; `None` for one that never started.
fn instance(i: &proto::JobInstance) -> Option<Instance> {
    use proto::JobState as S;
    let state = match i.state() {
        S::Starting => InstanceState::Starting,
        S::Running => InstanceState::Running,
        S::Stopping => InstanceState::Stopping,
        S::Stopped => InstanceState::Stopped,
        S::Failed => InstanceState::Failed,
        S::Pending | S::Unspecified => return None,
    };
    Some(Instance {
        node: i.node_id.clone(),
        role: if i.is_normal() {
            InstanceRole::Normal
        } else {
            InstanceRole::MigrationTarget
        },
        state,
    })
}

fn proto_strategy(s: api::MigrationStrategy) -> proto::MigrationStrategy {
    match s {
        api::MigrationStrategy::Handover => proto::MigrationStrategy::Handover,
        api::MigrationStrategy::Overlap => proto::MigrationStrategy::Overlap,
        api::MigrationStrategy::StopThenStart => proto::MigrationStrategy::StopThenStart,
    }
}

/// A Manager answer as the policy reads it; errors worth retrying stay errors.
fn outcome(answer: Result<(), ClientError>) -> Result<CallOutcome, Error> {
    match answer {
        // A propose whose first answer was lost.
        Ok(()) | Err(ClientError::AlreadyExists(_)) => Ok(CallOutcome::Done),
        Err(ClientError::Rejected {
            reason, message, ..
        }) => Ok(CallOutcome::WorkerRefused {
            node_not_ready: reason == proto::RejectionReason::NodeNotReady,
            message,
        }),
        Err(e) if is_final_answer(&e) => Ok(CallOutcome::Refused(e.to_string())),
        Err(e) => Err(e.into()),
    }
}

/// Manager's id for the job, as Manager gave it (the status keeps it once admitted; empty when
/// Manager does not know the job, which admission rejects as UnknownJob), and the migration's.
fn ids(ctx: &Context, mig: &Migration, ns: &str, status: &MigrationStatus) -> (String, String) {
    let job = &mig.spec.job;
    let bundle_id = mapping::bundle_id(ns, &job.bundle);
    let job_id = status.job_id.clone().or_else(|| {
        let replica = u32::try_from(job.replica).ok()?;
        ctx.manager.mirror().read(|m| {
            m.job_of(&bundle_id, replica, &job.job_name)
                .map(|j| j.job_id.clone())
        })
    });
    let migration_id = status
        .migration_id
        .clone()
        .unwrap_or_else(|| manager_migration_id(mig));
    (job_id.unwrap_or_default(), migration_id)
}

impl<'a> Run<'a> {
    /// Admits a Pending Migration (checks, then the queue: parallelism and the disruption
    /// budget) or resumes one from its status.
    async fn begin(
        mig: &'a Migration,
        ctx: &'a Arc<Context>,
        mut status: MigrationStatus,
        deleting: bool,
    ) -> Result<Begin<'a>, Error> {
        let (ns, name) = ns_name(mig)?;
        let (job_id, migration_id) = ids(ctx, mig, &ns, &status);
        // Manager's changes to this migration and its job wake this object (and only it).
        ctx.state.track_migration(
            &kube::runtime::reflector::ObjectRef::from(mig),
            Some((migration_id.clone(), job_id.clone())),
        );
        let machine = if status.phase == MigrationPhase::Pending {
            if deleting {
                super::disruption::forget_migration(ctx, &ns, &name);
                return Ok(Begin::Ended);
            }
            let ids = (job_id.as_str(), migration_id.as_str());
            match Self::admit(mig, ctx, &mut status, ids).await? {
                Ok(machine) => machine,
                Err(ended) => return Ok(ended),
            }
        } else {
            Self::resume(ctx, &status, &migration_id)
        };
        Ok(Begin::Run(Box::new(Run {
            ctx,
            mig,
            ns,
            job_id,
            migration_id,
            status,
            machine,
            failure: None,
        })))
    }

    /// Admission of a Pending Migration: its checks, then the queue. `Err` is where the pass
    /// ends (queued, or rejected with its status written).
    async fn admit(
        mig: &'a Migration,
        ctx: &'a Arc<Context>,
        status: &mut MigrationStatus,
        (job_id, migration_id): (&str, &str),
    ) -> Result<Result<MigrationMachine, Begin<'a>>, Error> {
        let (ns, name) = ns_name(mig)?;
        match admit::admit(mig, ctx, &ns, &name, job_id).await? {
            admit::Verdict::Admitted(_, source)
                if mig.spec.abort.is_none() && !admit::queue(ctx, mig, status, &source).await? =>
            {
                Ok(Err(Begin::Queued))
            }
            admit::Verdict::Admitted(strategy, source) => {
                status.strategy = Some(strategy);
                status.job_id = Some(job_id.to_owned());
                status.migration_id = Some(migration_id.to_owned());
                status.source_node = Some(source.clone());
                let now = ctx.clock.now();
                Ok(Ok(MigrationMachine::new(strategy, Some(source), now)))
            }
            admit::Verdict::Refused((reason, message)) => {
                let prev = mig.status.clone().unwrap_or_default();
                let now = ctx.clock.now();
                admit::reject(ctx, mig, &prev, status.clone(), reason, message, now).await?;
                Ok(Err(Begin::Ended))
            }
            admit::Verdict::Ends(why) => {
                let prev = mig.status.clone().unwrap_or_default();
                admit::end(ctx, mig, &prev, status.clone(), why).await?;
                Ok(Err(Begin::Ended))
            }
        }
    }

    /// The machine of a migration under way, from its status and Manager's record of it.
    fn resume(ctx: &Context, status: &MigrationStatus, migration_id: &str) -> MigrationMachine {
        let entered = status
            .phases
            .last()
            .map_or_else(|| ctx.clock.now(), |p| p.entered_at);
        let record = ctx
            .manager
            .mirror()
            .read(|m| m.migrations.get(migration_id).map(manager_record));
        let from_status = MigrationMachine::resume(
            status.strategy.unwrap_or_default(),
            status.phase,
            entered,
            status.source_node.clone(),
            status.target_node.clone(),
        );
        observe::resume(from_status, record.as_ref())
    }

    /// Feeds the machine every event that is due now, carrying out its actions.
    async fn drive(&mut self, deleting: bool) -> Result<(), Error> {
        let mut queue: VecDeque<MigrationEvent> = VecDeque::new();
        // An abort asked for before the start ends the migration without touching anything.
        if self.machine.phase() == MigrationPhase::Pending && self.mig.spec.abort.is_none() {
            queue.push_back(MigrationEvent::Start);
        }
        let mut user_abort = match (&self.mig.spec.abort, deleting) {
            (Some(a), _) => Some(a.reason.clone()),
            (None, true) => Some("the Migration was deleted".to_owned()),
            (None, false) => None,
        };
        // Calls made in this reconcile: one the mirror does not show yet is not sent again.
        let mut sent: Vec<ManagerCall> = Vec::new();
        for _ in 0..MAX_STEPS {
            if self.machine.is_ended() {
                break;
            }
            let event = match queue.pop_front() {
                Some(e) => e,
                None => {
                    let seen = self.observe(user_abort.take());
                    match observe::next(
                        &self.machine,
                        &seen,
                        self.ctx.clock.now(),
                        &timeouts(self.ctx),
                    ) {
                        Next::Event(e) => e,
                        Next::PlaceTarget => match self.place_target().await? {
                            Some(e) => e,
                            None => break,
                        },
                        Next::Resend(call) if !sent.contains(&call) => {
                            let answer = self.call(&call).await?;
                            let event = observe::answer(&call, &answer, true);
                            sent.push(call);
                            match event {
                                Some(e) => e,
                                None => break,
                            }
                        }
                        Next::Resend(_) | Next::Wait => break,
                    }
                }
            };
            let Some(t) = self.decide(event) else {
                continue;
            };
            // Act first: a failed call leaves the machine (and status) where it was, to retry.
            for action in &t.actions {
                if let Some(follow) = self.act(action, &mut sent).await? {
                    queue.push_back(follow);
                }
            }
            self.commit(t).await;
        }
        Ok(())
    }

    /// What the mirror shows of this migration, for the policy.
    fn observe(&self, user_abort: Option<String>) -> Observed {
        let target = self.machine.target_node().unwrap_or_default();
        self.ctx.manager.mirror().read(|m| Observed {
            user_abort,
            record: m.migrations.get(&self.migration_id).map(manager_record),
            instances: m
                .jobs
                .get(&self.job_id)
                .map(|j| j.instances.iter().filter_map(instance).collect())
                .unwrap_or_default(),
            target_node: match m.nodes.get(target).map(proto::Node::state) {
                Some(proto::NodeState::Started) => NodeReadiness::Started,
                Some(proto::NodeState::Starting) => NodeReadiness::Starting,
                _ => NodeReadiness::Unavailable,
            },
        })
    }

    /// The machine's answer to `event`; a refused abort past the point of no return is recorded.
    fn decide(&mut self, event: MigrationEvent) -> Option<plan::Transition> {
        let name = event.name();
        match self.machine.next(event, self.ctx.clock.now()) {
            Ok(t) => Some(t),
            Err(plan::MigrationError::NotAbortable { phase }) => {
                let msg = format!(
                    "abort refused: the migration is past its point of no return (phase {phase:?}) and continues"
                );
                api::set_condition(
                    &mut self.status.conditions,
                    condition(
                        "Aborted",
                        false,
                        "AbortRefused",
                        msg,
                        self.mig.metadata.generation,
                        self.ctx.clock.now(),
                    ),
                );
                None
            }
            Err(e) => {
                tracing::debug!(migration = %self.mig.name_any(), event = name, error = %e, "event ignored");
                None
            }
        }
    }

    /// Carries out one action; answers a follow-up event when Manager's answer is one.
    async fn act(
        &mut self,
        action: &Action,
        sent: &mut Vec<ManagerCall>,
    ) -> Result<Option<MigrationEvent>, Error> {
        if let Some(call) = action.call() {
            let answer = self.call(&call).await?;
            let event = observe::answer(&call, &answer, false);
            sent.push(call);
            return Ok(event);
        }
        match action {
            Action::RecoverByBand { reason } => self.hand_to_recovery(reason).await?,
            Action::AdoptTarget { node } => {
                // The Bundle controller reads the job's node from the mirror; nothing to write.
                tracing::info!(migration = %self.mig.name_any(), job = %self.job_id, node = %node, "job adopted on its new node");
            }
            // Placement happens when the machine is in PlacingTarget (`place_target`).
            _ => {}
        }
        Ok(None)
    }

    /// Sends one call to Manager.
    async fn call(&self, call: &ManagerCall) -> Result<CallOutcome, Error> {
        let manager = &self.ctx.manager;
        let id = self.migration_id.as_str();
        outcome(match call {
            ManagerCall::Propose { strategy } => manager
                .migration_get_state(id, &self.job_id, proto_strategy(*strategy))
                .await
                .map(drop),
            ManagerCall::PrepareTarget {
                node,
                initial_state,
            } => manager
                .migration_prepare_target(id, node, initial_state.clone())
                .await
                .map(drop),
            ManagerCall::Cutover { payload } => manager
                .migration_cutover(id, payload.clone())
                .await
                .map(drop),
            ManagerCall::Abort { reason } => manager.migration_abort(id, reason).await.map(drop),
            ManagerCall::StopInstance { role, node } => {
                let (role, ours) = match role {
                    InstanceRole::Normal => (proto::JobRole::Normal, ""),
                    InstanceRole::MigrationTarget => (proto::JobRole::MigrationTarget, id),
                };
                // Only an instance this migration is about: never a job's instance elsewhere.
                let present = self.ctx.manager.mirror().read(|m| {
                    m.jobs.get(&self.job_id).is_some_and(|j| {
                        j.instances.iter().any(|i| {
                            i.role() == role
                                && i.node_id == *node
                                && i.holds_capacity()
                                && (ours.is_empty() || i.migration_id == ours)
                        })
                    })
                });
                if !present {
                    return Ok(CallOutcome::Done);
                }
                manager.stop_job(&self.job_id, role).await.map(drop)
            }
        })
    }

    /// The job's stop now counts as a failure: its band decides (bronze is dropped).
    async fn hand_to_recovery(&self, reason: &str) -> Result<(), Error> {
        // Manager records that as the stop's reason, so it outlives this operator.
        match self.ctx.manager.hand_to_recovery(&self.job_id).await {
            Ok(_) => {}
            Err(e) if is_final_answer(&e) => {}
            Err(e) => return Err(e.into()),
        }
        if let Some(bundle) = super::drain::job_bundle(self.ctx, &self.job_id) {
            let _ = self.ctx.wake.bundles.send(bundle);
        }
        self.ctx
            .event(
                self.mig,
                EventType::Warning,
                "MigrationFailed",
                "Recover",
                format!(
                    "{reason}; job {} is handed to its band's recovery",
                    self.job_id
                ),
            )
            .await;
        Ok(())
    }

    /// When to look again: never once ended, else at the phase's deadline, at most `POLL` away.
    fn requeue(&self) -> Requeue {
        if self.machine.is_ended() {
            return Requeue::await_change();
        }
        let until_deadline = self
            .machine
            .deadline(&timeouts(self.ctx))
            .map(|d| {
                (d - self.ctx.clock.now())
                    .to_std()
                    .unwrap_or(Duration::ZERO)
            })
            .unwrap_or(POLL);
        Requeue::requeue(until_deadline.clamp(Duration::from_millis(50), POLL))
    }

    /// Records a transition in status and tells the user about the notable ones.
    async fn commit(&mut self, t: plan::Transition) {
        let now = self.ctx.clock.now();
        if let Some(entered) = &t.entered {
            push_phase(&mut self.status, entered.phase, entered.entered_at);
        }
        self.status.phase = t.phase;
        self.status.target_node = t.machine.target_node().map(str::to_owned);
        if let Some(abort) = &t.abort {
            self.status.abort = Some(abort.clone());
        }
        if let Some(h) = &t.handover {
            self.status.handover = Some(h.clone());
        }
        if t.failure.is_some() {
            self.failure.clone_from(&t.failure);
        }
        self.machine = t.machine;
        if self.machine.is_ended() {
            super::disruption::forget_migration(self.ctx, &self.ns, &self.mig.name_any());
            let completed = self.machine.phase() == MigrationPhase::Completed;
            (self.ctx.manager.mirror()).read(|m| {
                (self.ctx.state).end_migration_target(m, &self.migration_id, completed);
            });
        }
        if t.entered.is_none() {
            return;
        }
        let name = self.mig.name_any();
        let (type_, reason, note) = match t.phase {
            MigrationPhase::Completed => (
                EventType::Normal,
                "MigrationCompleted",
                format!(
                    "job {} moved from {} to {}",
                    self.job_id,
                    self.status.source_node.clone().unwrap_or_default(),
                    self.status.target_node.clone().unwrap_or_default()
                ),
            ),
            MigrationPhase::Aborted => (
                EventType::Warning,
                "MigrationAborted",
                t.abort.as_ref().map_or_else(String::new, |a| {
                    format!("aborted by {} in phase {:?}: {}", a.by, a.phase, a.reason)
                }),
            ),
            MigrationPhase::Refused => (
                EventType::Warning,
                "MigrationRefused",
                format!(
                    "the job refused to hand over its state: {}",
                    self.failure.clone().unwrap_or_default()
                ),
            ),
            MigrationPhase::Failed => (
                EventType::Warning,
                "MigrationFailedPastPointOfNoReturn",
                self.failure.clone().unwrap_or_default(),
            ),
            phase => {
                tracing::info!(migration = %name, job = %self.job_id, phase = ?phase, at = %now, "migration phase");
                return;
            }
        };
        self.ctx
            .event(self.mig, type_, reason, "Migrate", note)
            .await;
    }

    /// The conditions for the current phase.
    fn record_conditions(&mut self, now: DateTime<Utc>) {
        use MigrationPhase as P;
        let generation = self.mig.metadata.generation;
        let phase = self.status.phase;
        let conds = &mut self.status.conditions;
        let mut set = |type_: &str, value: bool, reason: &str, message: String| {
            api::set_condition(
                conds,
                condition(type_, value, reason, message, generation, now),
            );
        };
        let strategy = self.status.strategy.unwrap_or_default().as_str();
        let (standing, reason, msg) = match phase {
            P::Completed => {
                let msg = format!(
                    "job {} runs on {} ({strategy})",
                    self.job_id,
                    self.status.target_node.clone().unwrap_or_default()
                );
                set("Progressing", false, "Completed", msg.clone());
                (api::Standing::Ready, "Completed", msg)
            }
            P::Aborted => {
                let msg = self.status.abort.as_ref().map_or_else(
                    || "aborted".to_owned(),
                    |a| format!("aborted by {} in phase {:?}: {}", a.by, a.phase, a.reason),
                );
                set("Aborted", true, "Aborted", msg.clone());
                set("Progressing", false, "Aborted", msg.clone());
                // An abort the user asked for is what the spec asks (kstatus Current, reason
                // Aborted); any other abort (the job, the target, a timeout, no room) is a
                // failure to migrate.
                let by_user = self
                    .status
                    .abort
                    .as_ref()
                    .is_some_and(|a| a.by == AbortBy::User.as_str());
                let standing = if by_user {
                    api::Standing::Ready
                } else {
                    api::Standing::Stalled
                };
                (standing, "Aborted", msg)
            }
            P::Refused => {
                let msg = format!(
                    "the job refused to hand over its state: {}; no target was placed",
                    self.failure.clone().unwrap_or_default()
                );
                set("Progressing", false, "StateRefused", msg.clone());
                (api::Standing::Stalled, "StateRefused", msg)
            }
            P::Failed => {
                let msg = format!(
                    "{}; the job was handed to its band's recovery",
                    self.failure.clone().unwrap_or_default()
                );
                set("Progressing", false, "Failed", msg.clone());
                (api::Standing::Stalled, "Failed", msg)
            }
            // `reject` sets the conditions of a rejected migration.
            P::Rejected => return,
            phase => {
                let msg = format!("{strategy} migration in phase {phase:?}");
                set("Progressing", true, "InProgress", msg.clone());
                (api::Standing::Reconciling, "InProgress", msg)
            }
        };
        api::set_standing(
            &mut self.status.conditions,
            standing,
            reason,
            msg,
            generation,
            now,
        );
    }
}

async fn write_status(
    ctx: &Context,
    mig: &Migration,
    prev: &MigrationStatus,
    status: MigrationStatus,
) -> Result<(), Error> {
    if &status == prev {
        return Ok(());
    }
    let (ns, name) = ns_name(mig)?;
    let api: Api<Migration> = Api::namespaced(ctx.client.clone(), &ns);
    // Conditional: the phase is the migration's progress, which a stale writer must not roll back.
    super::apply_status_if(
        &api,
        &name,
        mig.metadata.resource_version.as_deref(),
        &status,
    )
    .await?;
    observe(ctx, mig, &status);
    Ok(())
}

/// Feeds the migration gauges: the phase, and when it began while it is not final (the
/// object's creation for one still `Pending`).
fn observe(ctx: &Context, mig: &Migration, status: &MigrationStatus) {
    let Ok((ns, name)) = ns_name(mig) else {
        return;
    };
    let since = (!plan::is_terminal(status.phase))
        .then(|| {
            status.phases.last().map(|p| p.entered_at).or_else(|| {
                mig.metadata
                    .creation_timestamp
                    .as_ref()
                    .and_then(|t| DateTime::from_timestamp_millis(t.0.as_millisecond()))
            })
        })
        .flatten()
        .map(|t| t.timestamp_millis() as f64 / 1000.0);
    ctx.metrics
        .observe_migration(&ns, &name, &format!("{:?}", status.phase), since);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migration(uid: Option<&str>) -> Migration {
        let mut m = Migration::new(
            "move-encode",
            api::MigrationSpec {
                job: api::MigrationJobRef {
                    bundle: "channel-1".into(),
                    replica: 0,
                    job_name: "encode".into(),
                },
                target_node: None,
                strategy: None,
                abort: None,
            },
        );
        m.metadata.namespace = Some("live".into());
        m.metadata.uid = uid.map(str::to_owned);
        m
    }

    #[test]
    fn manager_migration_ids_use_only_the_characters_manager_accepts() {
        let id = manager_migration_id(&migration(Some("1b2c-3d4e/../ x")));
        assert_eq!(id, "automanager-1b2c-3d4e..x");
        let long = "a".repeat(1000);
        assert!(manager_migration_id(&migration(Some(&long))).len() <= 253);
        assert_eq!(
            manager_migration_id(&migration(None)),
            "automanager-move-encode"
        );
    }

    #[test]
    fn status_phases_keep_the_newest_entries_within_the_schema_bound() {
        let mut s = MigrationStatus::default();
        let t0 = DateTime::from_timestamp(1_772_366_400, 0).unwrap_or_default();
        for i in 0..40 {
            push_phase(
                &mut s,
                MigrationPhase::Pending,
                t0 + chrono::TimeDelta::seconds(i),
            );
        }
        assert_eq!(s.phases.len(), MAX_PHASES);
        assert_eq!(
            s.phases.last().map(|p| p.entered_at),
            Some(t0 + chrono::TimeDelta::seconds(39))
        );
    }

    #[test]
    fn only_answers_no_retry_changes_end_a_step() {
        assert!(is_final_answer(&ClientError::FailedPrecondition(
            "x".into()
        )));
        assert!(is_final_answer(&ClientError::NotFound("x".into())));
        assert!(!is_final_answer(&ClientError::Unavailable("x".into())));
        assert!(!is_final_answer(&ClientError::Timeout(
            Duration::from_secs(1)
        )));
    }

    #[test]
    fn the_one_at_a_time_record_reads_phase_and_job_from_the_object() {
        let mut m = migration(Some("u"));
        m.status = Some(MigrationStatus {
            phase: MigrationPhase::CutoverReady,
            ..Default::default()
        });
        let r = admit::record(
            &m,
            DateTime::from_timestamp(1_772_366_400, 0).unwrap_or_default(),
        );
        assert_eq!(r.phase, MigrationPhase::CutoverReady);
        assert_eq!(r.job.namespace, "live");
        assert_eq!(r.job.job_name, "encode");
    }
}
