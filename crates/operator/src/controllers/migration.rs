//! The Migration controller: moves one running job to another node with the strategy in effect.
//!
//! Observe the Migration, its Bundle and the mirror (the job, its instances, Manager's migration
//! record); decide with the pure machine (`automanager_policy::migration`); act (Manager's migration
//! calls, StartJob/StopJob); record (status by server-side apply only when it changed, Events).
//!
//! Choices made where the issue left room:
//!
//! - **Admission** happens in Pending: the bundle, replica and job must exist, the strategy
//!   requested may only be as safe as or safer than the declared one, no other Migration may hold
//!   the job (`one_at_a_time`), the source must be running, and a `spec.targetNode` must exist,
//!   differ from the source and (for handover) advertise `norsk.io/job-socket`. A failed check
//!   ends in `Rejected` with a `Rejected` condition and a Warning Event; nothing was touched.
//! - **handover** is Manager's three-step protocol. Manager reports coarser phases than the
//!   machine, so the controller synthesizes the machine's events: `STATE_RECEIVED` is `state`;
//!   `ABORTED` by the source while proposed is `state-refused`; `TARGET_READY` is `target-ready`
//!   (then `Proceed` → MigrationCutover with the target's payload); `COMPLETED` is
//!   `source-stopped-output` + `Proceed` + `target-applied` with Manager's applied/failed/skew.
//!   Manager relays `cutover-apply` and stops the source itself, so the machine's
//!   `SendCutoverApply` and the final `StopSource` are already done by Manager.
//! - **overlap** uses the same Manager calls, because only Manager's cutover promotes a
//!   `migrationTarget` instance to the job's normal one (a StartJob + StopJob pair would leave the
//!   job without a normal instance and the Bundle controller would restart it). MigrationGetState
//!   is sent once the target is placed; `TARGET_READY` is "target running"; the overlap window is
//!   closed at once (`Proceed`); MigrationCutover is "stop source"; `COMPLETED` is "source
//!   stopped". It therefore needs a job that answers on the job socket.
//! - **stopThenStart** reserves nothing in Manager (the target node must be started), stops the
//!   source, waits (bounded) for the stop and starts the target at once as the job's **normal**
//!   instance: with the source gone there is nothing to promote it from.
//! - **Placement** (no `spec.targetNode`): the engine places the one job with the source node as
//!   another replica's position and inter-replica `differentNode: hard`, so the source is never
//!   chosen; handover adds `norsk.io/job-socket` to the job's required capabilities. Only
//!   existing nodes are used: a decision to provision a node aborts the migration (`by:
//!   operator`), as does an unplaceable job.
//! - **Band recovery** after a failure past the point of no return is the Bundle controller's:
//!   every instance the migration involved is stopped and the Bundle controller sees the job
//!   down and places or recovers it by its band.
//! - Deleting a Migration past its point of no return does not interrupt it: the finalizer stays
//!   until the migration ends.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{
    self as api, Bundle, Migration, MigrationPhase, MigrationStatus, MigrationStrategy,
};
use automanager_placement as pl;
use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use manager_client::ClientError;
use manager_proto as proto;

use super::{Context, Error, condition, is_final_answer, now_ms, ns_name};
use crate::mapping;
use automanager_policy::migration::{
    self as plan, AbortBy, Action, MigrationEvent, MigrationMachine, MigrationRecord,
    PhaseTimeouts, SourceJob,
};

/// How often an in-progress migration is looked at when nothing wakes it.
const POLL: Duration = Duration::from_millis(500);
/// The longest a reconcile waits inline for a stopThenStart source to stop.
const STOP_WAIT: Duration = Duration::from_secs(15);
/// Events fed to the machine in one reconcile, at most (a guard against a loop).
const MAX_STEPS: usize = 32;
/// Status `phases` holds at most this many entries (the schema's bound).
const MAX_PHASES: usize = 32;

/// Reconciles one Migration; wraps the work in the abort-on-delete finalizer.
pub async fn reconcile(mig: Arc<Migration>, ctx: Arc<Context>) -> Result<Requeue, Error> {
    let started = std::time::Instant::now();
    let (ns, _) = ns_name(mig.as_ref())?;
    let api: Api<Migration> = Api::namespaced(ctx.client.clone(), &ns);
    // Status is this controller's state store, and the cache can lag behind the last write
    // (every Manager change wakes every Migration, often before our own write is watched back):
    // act on the live object, or a running migration would be admitted again from `Pending`.
    let Some(mig) = api.get_opt(&mig.name_any()).await?.map(Arc::new) else {
        return Ok(Requeue::await_change());
    };
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
    result
}

pub fn error_policy(mig: Arc<Migration>, error: &Error, _ctx: Arc<Context>) -> Requeue {
    tracing::warn!(migration = %mig.name_any(), error = %error, "migration reconcile failed");
    Requeue::requeue(super::backoff_for(error))
}

/// Deletion: abort while abortable; past the point of no return, finish first.
async fn cleanup(mig: &Migration, ctx: &Arc<Context>) -> Result<Requeue, Error> {
    let phase = mig.status.as_ref().map(|s| s.phase).unwrap_or_default();
    if plan::is_terminal(phase) || phase == MigrationPhase::Pending {
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
        Ok(Requeue::await_change())
    } else {
        Err(Error::Finalizer(format!(
            "Migration {} is past its point of no return (phase {now:?}); it is finished before it is removed",
            mig.name_any()
        )))
    }
}

/// Where the target goes, as far as placement can say now.
enum TargetChoice {
    Node(String),
    /// The chosen node is starting (or was just asked for).
    Wait,
    Fail(String),
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
    let (ns, name) = ns_name(mig)?;
    let generation = mig.metadata.generation;
    let now = Utc::now();
    let prev = mig.status.clone().unwrap_or_default();
    let mut status = MigrationStatus {
        observed_generation: generation,
        ..prev.clone()
    };
    if plan::is_terminal(prev.phase) {
        api::kstatus::observe_generation(&mut status.conditions, generation);
        write_status(ctx, mig, &prev, status).await?;
        return Ok(Requeue::await_change());
    }
    if !ctx.manager_ready() {
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
            api::Standing::Stalled,
            "ManagerUnavailable",
            message,
            generation,
            now,
        );
        write_status(ctx, mig, &prev, status).await?;
        return Ok(Requeue::requeue(Duration::from_secs(3)));
    }

    let job = &mig.spec.job;
    let bundle_id = mapping::bundle_id(&ns, &job.bundle);
    let job_id = format!("{bundle_id}/{}/{}", job.replica, job.job_name);
    let migration_id = prev
        .migration_id
        .clone()
        .unwrap_or_else(|| manager_migration_id(mig));

    let machine = if prev.phase == MigrationPhase::Pending {
        if deleting {
            return Ok(Requeue::await_change());
        }
        match admit(mig, ctx, &ns, &name, &job_id).await? {
            Ok((strategy, source)) => {
                status.strategy = Some(strategy);
                status.job_id = Some(job_id.clone());
                status.migration_id = Some(migration_id.clone());
                status.source_node = Some(source.clone());
                MigrationMachine::new(strategy, Some(source), now)
            }
            Err((reason, message)) => {
                reject(ctx, mig, &prev, status, reason, message, now).await?;
                return Ok(Requeue::await_change());
            }
        }
    } else {
        let entered = prev
            .phases
            .last()
            .map_or(now, |p: &api::PhaseTransition| p.entered_at);
        resume(ctx, &prev, &migration_id, entered)
    };

    let mut run = Run {
        ctx,
        mig,
        ns,
        job_id,
        migration_id,
        status,
        machine,
        failure: None,
    };
    let result = run.drive(deleting).await;
    run.record_conditions(Utc::now());
    let ended = run.machine.is_ended();
    let deadline = run.machine.deadline(&timeouts(ctx));
    write_status(ctx, mig, &prev, run.status).await?;
    result?;
    if ended {
        return Ok(Requeue::await_change());
    }
    let until_deadline = deadline
        .map(|d| (d - Utc::now()).to_std().unwrap_or(Duration::ZERO))
        .unwrap_or(POLL);
    Ok(Requeue::requeue(
        until_deadline.clamp(Duration::from_millis(50), POLL),
    ))
}

/// The machine rebuilt from status. A handover waiting in TargetReady or SourceStoppedOutput
/// needs the payload it relays next; Manager's record still holds it, so the machine is rebuilt
/// one phase earlier and given that payload again (keeping the phase's entry time).
fn resume(
    ctx: &Context,
    prev: &MigrationStatus,
    migration_id: &str,
    entered: DateTime<Utc>,
) -> MigrationMachine {
    let strategy = prev.strategy.unwrap_or_default();
    let plain = |phase| {
        MigrationMachine::resume(
            strategy,
            phase,
            entered,
            prev.source_node.clone(),
            prev.target_node.clone(),
        )
    };
    let record = ctx
        .manager
        .mirror()
        .read(|m| m.migrations.get(migration_id).cloned());
    let replay = match (strategy, prev.phase, record) {
        (MigrationStrategy::Handover, MigrationPhase::TargetReady, Some(m)) => Some((
            MigrationPhase::StartingTarget,
            MigrationEvent::TargetReady {
                payload: m.target_ready_payload,
            },
        )),
        (MigrationStrategy::Handover, MigrationPhase::SourceStoppedOutput, Some(m)) => Some((
            MigrationPhase::CutoverReady,
            MigrationEvent::SourceStoppedOutput {
                payload: m.source_stopped_payload,
            },
        )),
        _ => None,
    };
    match replay {
        Some((before, event)) => match plain(before).next(event, entered) {
            Ok(t) if t.phase == prev.phase => t.machine,
            _ => plain(prev.phase),
        },
        None => plain(prev.phase),
    }
}

fn timeouts(ctx: &Context) -> PhaseTimeouts {
    PhaseTimeouts::uniform(ctx.settings.migration_phase_timeout)
}

/// Manager's migration id: unique per Migration object, and only `[A-Za-z0-9._-]`.
fn manager_migration_id(mig: &Migration) -> String {
    let uid = mig.metadata.uid.clone().unwrap_or_else(|| mig.name_any());
    let clean: String = uid
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        .take(200)
        .collect();
    format!("automanager-{clean}")
}

/// The admission checks of a Pending Migration: the strategy in effect and the source node, or
/// why it is rejected (condition reason, message).
async fn admit(
    mig: &Migration,
    ctx: &Context,
    ns: &str,
    name: &str,
    job_id: &str,
) -> Result<Result<(MigrationStrategy, String), (&'static str, String)>, Error> {
    let job = &mig.spec.job;
    let bundles: Api<Bundle> = Api::namespaced(ctx.client.clone(), ns);
    let Some(bundle) = bundles.get_opt(&job.bundle).await? else {
        return Ok(Err((
            "UnknownJob",
            format!("Bundle {ns}/{} does not exist", job.bundle),
        )));
    };
    if job.replica < 0 || job.replica >= bundle.spec.replicas {
        return Ok(Err((
            "UnknownJob",
            format!(
                "Bundle {ns}/{} has {} replica(s); replica {} does not exist",
                job.bundle, bundle.spec.replicas, job.replica
            ),
        )));
    }
    let Some(declared) = bundle.spec.jobs.iter().find(|j| j.job_name == job.job_name) else {
        return Ok(Err((
            "UnknownJob",
            format!("Bundle {ns}/{} has no job {}", job.bundle, job.job_name),
        )));
    };
    let strategy =
        match plan::strategy_in_effect(declared.migration.map(|m| m.strategy), mig.spec.strategy) {
            Ok(s) => s,
            Err(e) => return Ok(Err(("StrategyRefused", e.to_string()))),
        };

    let all: Api<Migration> = Api::namespaced(ctx.client.clone(), ns);
    let records: Vec<MigrationRecord> = all
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(record)
        .collect();
    let me = record(mig);
    if let Err(e) = plan::one_at_a_time(&records, &me) {
        return Ok(Err(("ConcurrentMigration", e.to_string())));
    }
    // Manager may hold a migration of the job that no Migration object records (another client).
    let (source, in_manager) = ctx.manager.mirror().read(|m| {
        let source = m.jobs.get(job_id).and_then(|j| {
            j.instances
                .iter()
                .find(|i| is_normal(i) && i.state == proto::JobState::Running as i32)
                .map(|i| i.node_id.clone())
        });
        // This Migration's own record (its admission was written to Manager but not to status)
        // is not another migration.
        let own = manager_migration_id(mig);
        let other = m
            .migrations
            .values()
            .find(|x| x.job_id == job_id && !manager_final(x.phase) && x.migration_id != own)
            .map(|x| x.migration_id.clone());
        (source, other)
    });
    if let Some(other) = in_manager {
        return Ok(Err((
            "ConcurrentMigration",
            format!(
                "{} is already being migrated in Manager (migration {other}); one migration at a time per job: this one is refused, not queued",
                me.job
            ),
        )));
    }
    let Some(source) = source else {
        return Ok(Err((
            "SourceNotRunning",
            format!(
                "job {job_id} has no running instance to migrate; create the Migration again once it runs"
            ),
        )));
    };
    if let Some(target) = &mig.spec.target_node {
        let node = ctx.manager.mirror().read(|m| m.nodes.get(target).cloned());
        let Some(node) = node else {
            return Ok(Err((
                "TargetRefused",
                format!("target node {target} does not exist in Manager"),
            )));
        };
        let caps = node
            .inventory
            .as_ref()
            .map(|i| i.capabilities.clone())
            .unwrap_or_default();
        if let Err(e) = plan::check_target(strategy, target, &caps, Some(&source)) {
            return Ok(Err(("TargetRefused", e.to_string())));
        }
    }
    tracing::debug!(migration = %name, job = %job_id, strategy = strategy.as_str(), source = %source, "migration admitted");
    Ok(Ok((strategy, source)))
}

fn record(m: &Migration) -> MigrationRecord {
    MigrationRecord {
        name: m.name_any(),
        job: SourceJob {
            namespace: m.namespace().unwrap_or_default(),
            bundle: m.spec.job.bundle.clone(),
            replica: m.spec.job.replica,
            job_name: m.spec.job.job_name.clone(),
        },
        phase: m.status.as_ref().map(|s| s.phase).unwrap_or_default(),
        created_at: m
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| DateTime::from_timestamp_millis(t.0.as_millisecond()))
            .unwrap_or_else(Utc::now),
    }
}

async fn reject(
    ctx: &Context,
    mig: &Migration,
    prev: &MigrationStatus,
    mut status: MigrationStatus,
    reason: &str,
    message: String,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let generation = mig.metadata.generation;
    status.phase = MigrationPhase::Rejected;
    push_phase(&mut status, MigrationPhase::Rejected, now);
    for (type_, value) in [("Rejected", true), ("Progressing", false)] {
        api::set_condition(
            &mut status.conditions,
            condition(type_, value, reason, message.clone(), generation, now),
        );
    }
    api::set_standing(
        &mut status.conditions,
        api::Standing::Stalled,
        reason,
        message.clone(),
        generation,
        now,
    );
    ctx.event(
        mig,
        EventType::Warning,
        "MigrationRejected",
        "Admit",
        message,
    )
    .await;
    write_status(ctx, mig, prev, status).await
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

fn is_normal(i: &proto::JobInstance) -> bool {
    i.role == proto::JobRole::Normal as i32 || i.role == proto::JobRole::Unspecified as i32
}

fn holds(state: i32) -> bool {
    state == proto::JobState::Starting as i32
        || state == proto::JobState::Running as i32
        || state == proto::JobState::Stopping as i32
}

fn manager_final(phase: i32) -> bool {
    phase == proto::MigrationPhase::Completed as i32
        || phase == proto::MigrationPhase::Aborted as i32
}

impl Run<'_> {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn manager_migration(&self) -> Option<proto::Migration> {
        self.ctx
            .manager
            .mirror()
            .read(|m| m.migrations.get(&self.migration_id).cloned())
    }

    fn job(&self) -> Option<proto::Job> {
        self.ctx
            .manager
            .mirror()
            .read(|m| m.jobs.get(&self.job_id).cloned())
    }

    /// Feeds the machine every event that is due now, carrying out its actions.
    async fn drive(&mut self, deleting: bool) -> Result<(), Error> {
        let mut queue: VecDeque<MigrationEvent> = VecDeque::new();
        // An abort asked for before the start ends the migration without touching anything.
        if self.machine.phase() == MigrationPhase::Pending && self.mig.spec.abort.is_none() {
            queue.push_back(MigrationEvent::Start);
        }
        let mut abort_offered = false;
        for _ in 0..MAX_STEPS {
            if self.machine.is_ended() {
                break;
            }
            let event = match queue.pop_front() {
                Some(e) => e,
                None => match self.next_event(deleting, &mut abort_offered).await? {
                    Some(e) => e,
                    None => break,
                },
            };
            let name = event.name();
            let t = match self.machine.next(event, self.now()) {
                Ok(t) => t,
                Err(plan::MigrationError::NotAbortable { phase }) => {
                    let msg = format!(
                        "abort refused: the migration is past its point of no return (phase {phase:?}) and continues"
                    );
                    let now = self.now();
                    api::set_condition(
                        &mut self.status.conditions,
                        condition(
                            "Aborted",
                            false,
                            "AbortRefused",
                            msg,
                            self.mig.metadata.generation,
                            now,
                        ),
                    );
                    continue;
                }
                Err(e) => {
                    tracing::debug!(migration = %self.mig.name_any(), event = name, error = %e, "event ignored");
                    continue;
                }
            };
            // Act first: a failed call leaves the machine (and status) where it was, to retry.
            for action in &t.actions {
                if let Some(follow) = self.act(action).await? {
                    queue.push_back(follow);
                }
            }
            self.commit(t).await;
        }
        Ok(())
    }

    /// The event the world shows now, if any.
    async fn next_event(
        &mut self,
        deleting: bool,
        abort_offered: &mut bool,
    ) -> Result<Option<MigrationEvent>, Error> {
        use MigrationPhase as P;
        use MigrationStrategy as S;
        if !*abort_offered {
            *abort_offered = true;
            let wanted = match (&self.mig.spec.abort, deleting) {
                (Some(a), _) => Some(a.reason.clone()),
                (None, true) => Some("the Migration was deleted".to_owned()),
                (None, false) => None,
            };
            if let Some(reason) = wanted {
                return Ok(Some(MigrationEvent::AbortRequested {
                    by: AbortBy::User,
                    reason,
                }));
            }
        }
        if self.machine.is_timed_out(self.now(), &timeouts(self.ctx)) {
            return Ok(Some(MigrationEvent::PhaseTimedOut));
        }
        if self.machine.is_waypoint() {
            return Ok(Some(MigrationEvent::Proceed));
        }
        let strategy = self.machine.strategy();
        let phase = self.machine.phase();
        if phase == P::PlacingTarget {
            return self.place_target().await;
        }
        if strategy == S::StopThenStart {
            return Ok(self.stop_then_start_event(phase));
        }
        // handover and overlap follow Manager's migration record.
        let Some(m) = self.manager_migration() else {
            return Ok(None);
        };
        let mphase = proto::MigrationPhase::try_from(m.phase).unwrap_or_default();
        if mphase == proto::MigrationPhase::Aborted {
            return Ok(Some(self.aborted_event(&m)));
        }
        let event = match (strategy, phase, mphase) {
            (S::Handover, P::Proposing, proto::MigrationPhase::StateReceived) => {
                Some(MigrationEvent::StateReceived {
                    payload: m.source_state.clone(),
                })
            }
            (S::Handover, P::StartingTarget, proto::MigrationPhase::TargetReady) => {
                Some(MigrationEvent::TargetReady {
                    payload: m.target_ready_payload.clone(),
                })
            }
            // A cutover call that failed earlier: Manager is still waiting for it.
            (S::Handover, P::CutoverReady, proto::MigrationPhase::TargetReady) => {
                self.retry_cutover(m.target_ready_payload.clone()).await?;
                None
            }
            (S::Handover, P::CutoverReady, proto::MigrationPhase::Completed) => {
                Some(MigrationEvent::SourceStoppedOutput {
                    payload: m.source_stopped_payload.clone(),
                })
            }
            (S::Handover, P::CutoverApply, proto::MigrationPhase::Completed) => {
                Some(MigrationEvent::TargetApplied {
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
                })
            }
            (S::Overlap, P::StartingTarget, proto::MigrationPhase::TargetReady) => {
                Some(MigrationEvent::TargetRunning)
            }
            (S::Overlap, P::StoppingSource, proto::MigrationPhase::TargetReady) => {
                self.retry_cutover(m.target_ready_payload.clone()).await?;
                None
            }
            (S::Overlap, P::StoppingSource, proto::MigrationPhase::Completed) => {
                Some(MigrationEvent::SourceStopped)
            }
            _ => None,
        };
        Ok(event)
    }

    /// Re-sends a cutover Manager may still wait for (an earlier call failed, or the mirror lags
    /// behind one that succeeded: then Manager refuses it and nothing changes).
    async fn retry_cutover(&self, payload: Vec<u8>) -> Result<(), Error> {
        match self
            .ctx
            .manager
            .migration_cutover(&self.migration_id, payload)
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_final_answer(&e) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Manager's ABORTED as the machine's event.
    fn aborted_event(&self, m: &proto::Migration) -> MigrationEvent {
        let reason = if m.abort_reason.is_empty() {
            "aborted in Manager".to_owned()
        } else {
            m.abort_reason.clone()
        };
        let by = proto::MigrationParty::try_from(m.aborted_by).unwrap_or_default();
        match by {
            // A source that gave its state and then aborted did not refuse it.
            proto::MigrationParty::Source
                if self.machine.phase() == MigrationPhase::Proposing
                    && m.source_state.is_empty() =>
            {
                MigrationEvent::StateRefused { reason }
            }
            proto::MigrationParty::Source => MigrationEvent::AbortRequested {
                by: AbortBy::Source,
                reason,
            },
            proto::MigrationParty::Target => MigrationEvent::AbortRequested {
                by: AbortBy::Target,
                reason,
            },
            _ => {
                let source_running = self.job().is_some_and(|j| {
                    j.instances
                        .iter()
                        .any(|i| is_normal(i) && i.state == proto::JobState::Running as i32)
                });
                if !source_running {
                    MigrationEvent::SourceFailed { reason }
                } else if self.machine.target_node().is_some() {
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

    fn stop_then_start_event(&self, phase: MigrationPhase) -> Option<MigrationEvent> {
        use MigrationPhase as P;
        let target = self.machine.target_node()?.to_owned();
        match phase {
            P::PreparingTarget => {
                let node = self
                    .ctx
                    .manager
                    .mirror()
                    .read(|m| m.nodes.get(&target).map(|n| n.state));
                match node.and_then(|s| proto::NodeState::try_from(s).ok()) {
                    Some(proto::NodeState::Started) => Some(MigrationEvent::TargetPrepared),
                    Some(proto::NodeState::Starting) => None,
                    _ => Some(MigrationEvent::TargetFailed {
                        reason: format!("target node {target} is not available"),
                    }),
                }
            }
            P::StoppingSource => {
                let job = self.job()?;
                let source_holds = job.instances.iter().any(|i| {
                    is_normal(i)
                        && holds(i.state)
                        && Some(i.node_id.as_str()) != Some(target.as_str())
                });
                (!source_holds).then_some(MigrationEvent::SourceStopped)
            }
            P::StartingTarget => {
                let job = self.job()?;
                let inst = job
                    .instances
                    .iter()
                    .filter(|i| is_normal(i) && i.node_id == target)
                    .max_by_key(|i| i.started_at_ms)?;
                match proto::JobState::try_from(inst.state).ok()? {
                    proto::JobState::Running => Some(MigrationEvent::TargetRunning),
                    proto::JobState::Failed | proto::JobState::Stopped => {
                        Some(MigrationEvent::TargetFailed {
                            reason: if inst.message.is_empty() {
                                "the target instance stopped".to_owned()
                            } else {
                                inst.message.clone()
                            },
                        })
                    }
                    _ => None,
                }
            }
            _ => None,
        }
    }

    /// Chooses the target: `spec.targetNode` (checked at admission) or the placement engine.
    async fn place_target(&mut self) -> Result<Option<MigrationEvent>, Error> {
        let strategy = self.machine.strategy();
        let node = match &self.mig.spec.target_node {
            Some(n) => n.clone(),
            None => match self.choose_target().await? {
                TargetChoice::Node(n) => n,
                // A node is being provisioned for the target: the phase's timeout bounds the wait.
                TargetChoice::Wait => return Ok(None),
                TargetChoice::Fail(reason) => {
                    return Ok(Some(MigrationEvent::PlacementFailed { reason }));
                }
            },
        };
        if strategy == MigrationStrategy::Overlap {
            // Manager starts a target only for a migration whose source state it holds.
            match self.manager_migration() {
                None => {
                    match self
                        .ctx
                        .manager
                        .migration_get_state(
                            &self.migration_id,
                            &self.job_id,
                            proto::MigrationStrategy::Overlap,
                        )
                        .await
                    {
                        Ok(_) | Err(ClientError::AlreadyExists(_)) => {}
                        Err(e) if is_final_answer(&e) => {
                            return Ok(Some(MigrationEvent::PlacementFailed {
                                reason: format!("Manager refused to start the migration: {e}"),
                            }));
                        }
                        Err(e) => return Err(e.into()),
                    }
                    return Ok(None);
                }
                Some(m) if m.phase == proto::MigrationPhase::Aborted as i32 => {
                    return Ok(Some(self.aborted_event(&m)));
                }
                Some(m) if m.phase != proto::MigrationPhase::StateReceived as i32 => {
                    return Ok(None);
                }
                Some(_) => {}
            }
        }
        Ok(Some(MigrationEvent::TargetPlaced { node }))
    }

    /// The placement engine's choice of a node other than the source: an existing node, a node
    /// to wait for (starting, or provisioned now in an elastic pool), or why there is none.
    async fn choose_target(&self) -> Result<TargetChoice, Error> {
        let job = &self.mig.spec.job;
        let bundles: Api<Bundle> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let Some(bundle) = bundles.get_opt(&job.bundle).await? else {
            return Ok(TargetChoice::Fail(format!(
                "Bundle {} no longer exists",
                job.bundle
            )));
        };
        let Some(spec_job) = bundle.spec.jobs.iter().find(|j| j.job_name == job.job_name) else {
            return Ok(TargetChoice::Fail(format!(
                "the bundle no longer has job {}",
                job.job_name
            )));
        };
        let bundle_id = mapping::bundle_id(&self.ns, &job.bundle);
        let engine_bundle = mapping::bundle(&bundle_id, &bundle.spec);
        let replica = u32::try_from(job.replica).unwrap_or(0);
        let mut spec = mapping::job(spec_job);
        if let Some(cap) = plan::target_capability_required(self.machine.strategy())
            && !spec
                .requirements
                .required_capabilities
                .iter()
                .any(|c| c == cap)
        {
            spec.requirements.required_capabilities.push(cap.to_owned());
        }
        let source = self.machine.source_node().unwrap_or_default().to_owned();
        let (other_replicas, placed_siblings) = self.ctx.manager.mirror().read(|m| {
            let zone_of = |node: &str| {
                m.nodes.get(node).map(|n| {
                    n.inventory
                        .as_ref()
                        .map(|i| i.zone.clone())
                        .filter(|z| !z.is_empty())
                        .unwrap_or_else(|| n.zone.clone())
                })
            };
            let mut others = vec![pl::Position {
                node: source.clone(),
                zone: zone_of(&source),
            }];
            let mut siblings = Vec::new();
            for j in m.jobs.values().filter(|j| j.bundle_id == bundle_id) {
                if j.job_id == self.job_id || j.node_id.is_empty() || !holds(j.state) {
                    continue;
                }
                if j.replica == replica {
                    siblings.push(pl::SiblingPosition {
                        job_name: j.job_name.clone(),
                        node: j.node_id.clone(),
                        zone: zone_of(&j.node_id),
                    });
                } else {
                    others.push(pl::Position {
                        node: j.node_id.clone(),
                        zone: zone_of(&j.node_id),
                    });
                }
            }
            (others, siblings)
        });
        let mut inter = engine_bundle.inter_replica_placement;
        inter.different_node = Some(pl::Strength::Hard);
        let request = pl::PlacementRequest {
            bundle_id: bundle_id.clone(),
            replica_index: replica,
            jobs: vec![spec],
            pools: engine_bundle.pools_for_replica(replica).to_vec(),
            kind: pl::PlacementKind::First,
            intra_replica: engine_bundle.intra_replica_placement,
            inter_replica: inter,
            other_replicas,
            placed_siblings,
        };
        let decision = self.ctx.model().place(&request, now_ms(Utc::now()));
        let summary = decision.summary();
        Ok(match decision.outcome {
            pl::Outcome::Placed { assignments, .. } => {
                match assignments.into_iter().find(|a| a.node != source) {
                    Some(a) if !a.node_pending => TargetChoice::Node(a.node),
                    Some(_) => TargetChoice::Wait,
                    None => {
                        TargetChoice::Fail("placement chose no node other than the source".into())
                    }
                }
            }
            pl::Outcome::Provision {
                pool,
                instance_type,
                zone,
            } => {
                self.provision_target(&pool, &instance_type, zone.as_deref())
                    .await?;
                TargetChoice::Wait
            }
            pl::Outcome::Unplaceable { .. } => TargetChoice::Fail(format!(
                "no node can take the job: {}",
                serde_json::to_string(&summary).unwrap_or_default()
            )),
        })
    }

    /// Asks Manager for a node for the target (once per migration: a node tagged for it that is
    /// on its way is not asked for again).
    async fn provision_target(
        &self,
        pool: &str,
        instance_type: &str,
        zone: Option<&str>,
    ) -> Result<(), Error> {
        let tag = format!("migration.{}", self.migration_id);
        let Some(node) = super::request_node(self.ctx, pool, instance_type, zone, tag).await?
        else {
            return Ok(());
        };
        self.ctx
            .event(
                self.mig,
                EventType::Normal,
                "ProvisioningTarget",
                "Provision",
                format!(
                    "no existing node can take {}: asked for a {instance_type} node in pool {pool} ({})",
                    self.job_id, node.node_id
                ),
            )
            .await;
        Ok(())
    }

    /// Carries out one action; answers a follow-up event when the outcome is one.
    async fn act(&mut self, action: &Action) -> Result<Option<MigrationEvent>, Error> {
        let strategy = self.machine.strategy();
        let manager = &self.ctx.manager;
        match action {
            Action::SendGetState => {
                match manager
                    .migration_get_state(
                        &self.migration_id,
                        &self.job_id,
                        proto::MigrationStrategy::Handover,
                    )
                    .await
                {
                    Ok(_) | Err(ClientError::AlreadyExists(_)) => Ok(None),
                    Err(e) if is_final_answer(&e) => Ok(Some(MigrationEvent::AbortRequested {
                        by: AbortBy::Operator,
                        reason: format!("Manager refused get-state: {e}"),
                    })),
                    Err(e) => Err(e.into()),
                }
            }
            // Placement happens when the machine is in PlacingTarget (see `place_target`);
            // stopThenStart's target is ready once its node is started (checked per reconcile).
            Action::PlaceTarget | Action::PrepareTarget { .. } => Ok(None),
            Action::StartTarget {
                node,
                initial_state,
                ..
            } => {
                if strategy == MigrationStrategy::StopThenStart {
                    // The source is gone: the target is the job's normal instance from the start.
                    return match manager
                        .start_job(&self.job_id, node, proto::JobRole::Normal)
                        .await
                    {
                        Ok(_) => Ok(None),
                        Err(e) if is_final_answer(&e) => Ok(Some(MigrationEvent::TargetFailed {
                            reason: e.to_string(),
                        })),
                        Err(e) => Err(e.into()),
                    };
                }
                let state = match initial_state {
                    Some(s) => s.clone(),
                    None => self
                        .manager_migration()
                        .map(|m| m.source_state)
                        .unwrap_or_default(),
                };
                match manager
                    .migration_prepare_target(&self.migration_id, node, state)
                    .await
                {
                    Ok(_) => Ok(None),
                    Err(e) if is_final_answer(&e) => Ok(Some(MigrationEvent::TargetFailed {
                        reason: e.to_string(),
                    })),
                    Err(e) => Err(e.into()),
                }
            }
            Action::SendCutoverReady { payload } => {
                match manager
                    .migration_cutover(&self.migration_id, payload.clone())
                    .await
                {
                    Ok(_) => Ok(None),
                    // ABORTED meanwhile: the mirror tells who and why on the next look.
                    Err(e) if is_final_answer(&e) => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
            // Manager relays cutover-apply to the target on its own.
            Action::SendCutoverApply { .. } => Ok(None),
            Action::StopSource => match strategy {
                // Manager stopped the source when the handover completed; a StopJob now would
                // stop the promoted target.
                MigrationStrategy::Handover => Ok(None),
                MigrationStrategy::Overlap => {
                    let payload = self
                        .manager_migration()
                        .map(|m| m.target_ready_payload)
                        .unwrap_or_default();
                    match manager.migration_cutover(&self.migration_id, payload).await {
                        Ok(_) => Ok(None),
                        Err(e) if is_final_answer(&e) => Ok(None),
                        Err(e) => Err(e.into()),
                    }
                }
                MigrationStrategy::StopThenStart => {
                    manager
                        .stop_job(&self.job_id, proto::JobRole::Normal)
                        .await?;
                    // Start the target the moment the source is down, before anything else
                    // re-places the job.
                    self.wait_source_stopped().await;
                    Ok(None)
                }
            },
            Action::StopTarget { node } => {
                self.stop_target(node).await?;
                Ok(None)
            }
            Action::SendAbort { reason, .. } => {
                match manager.migration_abort(&self.migration_id, reason).await {
                    Ok(_) => Ok(None),
                    Err(e) if is_final_answer(&e) => Ok(None),
                    Err(e) => Err(e.into()),
                }
            }
            Action::AdoptTarget { node } => {
                // The Bundle controller reads the job's node from the mirror; nothing to write.
                tracing::info!(migration = %self.mig.name_any(), job = %self.job_id, node = %node, "job adopted on its new node");
                Ok(None)
            }
            Action::RecoverByBand { reason } => {
                // The job's stop now counts as a failure: its band decides (bronze is dropped).
                self.ctx
                    .handed_to_recovery()
                    .insert(self.job_id.clone(), self.now());
                let _ = self.ctx.bundle_trigger.send(());
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
                Ok(None)
            }
        }
    }

    /// Removes whatever exists of the target: Manager's migration and its target instance, or
    /// (stopThenStart) a normal instance this migration started on the target node.
    async fn stop_target(&self, node: &str) -> Result<(), Error> {
        let manager = &self.ctx.manager;
        match self.machine.strategy() {
            MigrationStrategy::StopThenStart => {
                let ours = self.job().is_some_and(|j| {
                    j.instances
                        .iter()
                        .any(|i| is_normal(i) && i.node_id == node && holds(i.state))
                }) && self.machine.phase() == MigrationPhase::StartingTarget;
                if ours {
                    match manager.stop_job(&self.job_id, proto::JobRole::Normal).await {
                        Ok(_) => {}
                        Err(e) if is_final_answer(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            _ => {
                match manager
                    .migration_abort(&self.migration_id, "the migration's target is cleaned up")
                    .await
                {
                    Ok(_) => {}
                    Err(e) if is_final_answer(&e) => {}
                    Err(e) => return Err(e.into()),
                }
                let target_holds = self.job().is_some_and(|j| {
                    j.instances.iter().any(|i| {
                        i.role == proto::JobRole::MigrationTarget as i32
                            && i.migration_id == self.migration_id
                            && holds(i.state)
                    })
                });
                if target_holds {
                    match manager
                        .stop_job(&self.job_id, proto::JobRole::MigrationTarget)
                        .await
                    {
                        Ok(_) => {}
                        Err(e) if is_final_answer(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
        }
        Ok(())
    }

    /// Waits (bounded) until the mirror shows no normal instance of the job on the source node.
    async fn wait_source_stopped(&self) {
        let source = self.machine.source_node().unwrap_or_default().to_owned();
        let job_id = self.job_id.clone();
        let stopped = move |m: &manager_client::MirrorState| {
            m.jobs.get(&job_id).is_none_or(|j| {
                !j.instances
                    .iter()
                    .any(|i| is_normal(i) && i.node_id == source && holds(i.state))
            })
        };
        let mut rx = self.ctx.manager.subscribe();
        let deadline = tokio::time::Instant::now() + STOP_WAIT;
        while !self.ctx.manager.mirror().read(&stopped) {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Ok(_)) | Ok(Err(tokio::sync::broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(_)) | Err(_) => return,
            }
        }
    }

    /// Records a transition in status and tells the user about the notable ones.
    async fn commit(&mut self, t: plan::Transition) {
        let now = self.now();
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
                // An abort the user asked for is the outcome they wanted; any other abort
                // (the job, the target, a timeout, no room) is a failure to migrate.
                let by_user = self
                    .status
                    .abort
                    .as_ref()
                    .is_some_and(|a| a.by == AbortBy::User.as_str());
                let standing = if by_user {
                    api::Standing::Settled
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
    super::apply_status(&api, &name, &status).await
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
        let t0 = Utc::now();
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
        let r = record(&m);
        assert_eq!(r.phase, MigrationPhase::CutoverReady);
        assert_eq!(r.job.namespace, "live");
        assert_eq!(r.job.job_name, "encode");
    }
}
