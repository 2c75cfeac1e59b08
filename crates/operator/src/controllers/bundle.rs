//! The Bundle controller: registers each bundle with Manager, places every replica's jobs,
//! recovers failed jobs by band, and writes what happened to the bundle's status.
//!
//! One pass: **observe** the bundle, its previous status and its jobs in the mirror; **decide**
//! per replica with the pure planner ([`automanager_policy::bundle`]); **act** (register, start,
//! provision); **record** (status by server-side apply, Events, metrics, the full trace for
//! `/debug/trace`, and which pools the bundle now waits on, so capacity there wakes it).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{self as api, Bundle, BundlePhase, BundleStatus, JobStatus, ReplicaStatus};
use automanager_placement as pl;
use automanager_policy::bundle::{
    self as plan, BandRule, JobPhase, Need, ObservedJob, PlacementResult, ReplicaIntent,
    ReplicaPlan, StopCause,
};
use automanager_policy::ledger::ReplicaKey;
use automanager_policy::recovery_first;
use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use manager_client::MirrorState;
use manager_proto as proto;

use super::{Context, Error, is_final_answer, now_ms, ns_name};
use crate::mapping;

/// Requeue while something is in progress (a node starting, a job starting).
const REQUEUE_BUSY: Duration = Duration::from_secs(2);
/// Requeue while stalled (no capacity): capacity changes in the pools also wake us.
const REQUEUE_STALLED: Duration = Duration::from_secs(30);
/// A job started less than this long ago is "about to run": its status write is coalesced.
const TRANSIENT_START_MS: i64 = 2_000;
/// How long a pass that registered a bundle waits for Manager's jobs to reach the mirror.
const REGISTER_SETTLE: Duration = Duration::from_secs(2);
/// Periodic look at a settled bundle (clears restart counts of replicas that stayed up).
const REQUEUE_SETTLED: Duration = Duration::from_secs(300);
/// Look again at a settled bundle that would rebalance: a migration ends, the rate refills,
/// capacity comes back through a change that does not wake it.
const REQUEUE_REBALANCE: Duration = Duration::from_secs(10);

/// Reconciles one Bundle, inside the cleanup finalizer.
pub async fn reconcile(bundle: Arc<Bundle>, ctx: Arc<Context>) -> Result<Action, Error> {
    let (ns, _) = ns_name(bundle.as_ref())?;
    let api: Api<Bundle> = Api::namespaced(ctx.client.clone(), &ns);
    super::reconcile_finalized(
        "bundle",
        &ctx,
        api,
        api::BUNDLE_FINALIZER,
        bundle,
        |b| {
            let ctx = &ctx;
            async move { apply(&b, ctx).await }
        },
        |b| {
            let ctx = &ctx;
            async move { cleanup(&b, ctx).await }
        },
    )
    .await
}

/// One job of one replica as observed: the planner's view plus where it runs.
#[derive(Debug, Clone)]
struct Seen {
    job: ObservedJob,
    band: BandRule,
    /// Manager's id for the job; `None` until the mirror shows the job.
    job_id: Option<String>,
    node_id: String,
    /// The runtime configuration Manager holds for the job.
    config: Vec<u8>,
}

/// Why the named jobs of a replica went down, when no voluntary action of ours took them down
/// (those are counted against the disruption budget instead): `jobFailed` or `nodeLost`.
fn involuntary_cause(replica: &[Seen], jobs: &[String]) -> Option<&'static str> {
    replica
        .iter()
        .filter(|s| jobs.contains(&s.job.job_name))
        .find_map(|s| match (s.job.phase, s.job.stop_cause) {
            (_, StopCause::HandedToRecovery | StopCause::NodeTerminated) => None,
            (_, StopCause::NodeLost) => Some("nodeLost"),
            (JobPhase::Failed, _) => Some("jobFailed"),
            _ => None,
        })
}

/// Everything one pass knows about the bundle before it acts.
struct Pass<'a> {
    bundle: &'a Bundle,
    bundle_ref: ObjectRef<Bundle>,
    bundle_id: String,
    generation: Option<i64>,
    prev: BundleStatus,
    now: DateTime<Utc>,
    /// The retry annotation's marker when it is new (not yet acted on).
    retry: Option<String>,
    retried: bool,
    engine_bundle: pl::BundleSpec,
}

/// How one replica's placement went in this pass.
#[derive(Debug, Default)]
struct Outcome {
    /// A decision made now, and whether it was a recovery.
    decision: Option<(pl::Decision, bool)>,
    result: PlacementResult,
    /// Every job placed in this pass was started (Manager answered).
    started: bool,
    /// Manager's ids of the jobs this pass started.
    started_jobs: Vec<String>,
    /// "replica r on … in pool …", for the pass's one `Placed` Event.
    placed_note: Option<String>,
    /// Pools this replica waits on for capacity.
    waiting_on: Vec<String>,
    /// Bronze jobs stopped to make room for this replica's recovery (made in this pass or an
    /// earlier one), for the trace.
    preempted: Option<api::Preemption>,
    /// The node this replica waits for is asked for again after this back-off.
    retry_in: Option<Duration>,
}

async fn apply(bundle: &Bundle, ctx: &Arc<Context>) -> Result<Action, Error> {
    let result = pass(bundle, ctx).await;
    if let Err(e) = &result {
        record_failure(bundle, ctx, e).await;
    }
    result
}

/// A pass that failed says why in the bundle's conditions, so no bundle is left without a word
/// (a bundle whose object changed under the pass is looked at again instead).
async fn record_failure(bundle: &Bundle, ctx: &Context, error: &Error) {
    let Some((standing, reason)) = error.failure_kind().standing() else {
        return;
    };
    let prev = bundle.status.clone().unwrap_or_default();
    let mut status = prev.clone();
    let generation = bundle.metadata.generation;
    status.observed_generation = generation;
    api::set_standing(
        &mut status.conditions,
        standing,
        reason,
        api::bounded::clip(
            &format!("the last pass failed and is tried again: {error}"),
            api::bounded::MAX_CONDITION_MESSAGE,
        )
        .into_owned(),
        generation,
        ctx.clock.now(),
    );
    if let Err(e) = write_status(ctx, bundle, &prev, status).await {
        tracing::debug!(bundle = %bundle.name_any(), error = %e, "could not record the failed pass");
    }
}

async fn pass(bundle: &Bundle, ctx: &Arc<Context>) -> Result<Action, Error> {
    let pass = Pass::new(bundle, ctx.clock.now())?;
    let mut mark = PassMark::begin(ctx, &pass);
    if let Some(done) = pass.preflight(ctx).await? {
        return Ok(done);
    }
    pass.register(ctx).await?;
    mark.note_observed();
    let mut seen = pass.observe(ctx);
    pass.push_configs(ctx, &mut seen).await?;
    let plans = pass.plan(ctx, &seen);
    let outcomes = pass.act(ctx, &seen, &plans).await?;
    pass.record(ctx, &plans, &outcomes, &mut mark).await
}

/// Marks a bundle as in a pass, so the mirror pump holds changes of its jobs until the pass
/// ends; then wakes it again unless the only changes since the pass looked (just before it
/// planned) are its own starts, in the phase its status recorded for them. A pass that ends early (an error, a stall) looked at nothing to compare with and is
/// woken by any held change, as without the mark.
struct PassMark<'c> {
    ctx: &'c Context,
    bundle: ObjectRef<Bundle>,
    bundle_id: String,
    /// The bundle's jobs just before the pass planned.
    observed: Option<Vec<proto::Job>>,
    /// Jobs this pass started, with the phase its status recorded for each.
    started: HashMap<String, JobPhase>,
}

impl<'c> PassMark<'c> {
    fn begin(ctx: &'c Context, pass: &Pass<'_>) -> Self {
        ctx.state().wake_mut().begin_pass(&pass.bundle_ref);
        PassMark {
            ctx,
            bundle: pass.bundle_ref.clone(),
            bundle_id: pass.bundle_id.clone(),
            observed: None,
            started: HashMap::new(),
        }
    }

    /// Called just before the pass's look that it plans on, so a change between the two wakes
    /// the bundle again.
    fn note_observed(&mut self) {
        self.observed = Some(
            self.ctx
                .manager
                .mirror()
                .read(|m| bundle_jobs(m, &self.bundle_id)),
        );
    }

    /// Whether Manager moved past what the pass planned on and recorded.
    fn moved_past(&self, m: &MirrorState) -> bool {
        let Some(observed) = &self.observed else {
            return true;
        };
        let now = bundle_jobs(m, &self.bundle_id);
        now.len() != observed.len()
            || now.iter().zip(observed).any(|(job, before)| {
                if job.job_id != before.job_id {
                    true
                } else if let Some(recorded) = self.started.get(&job.job_id) {
                    *recorded != mapping::job_phase(job.state())
                } else {
                    job != before
                }
            })
    }
}

impl Drop for PassMark<'_> {
    fn drop(&mut self) {
        let again = self
            .ctx
            .with_mirror(|m, s| s.wake_mut().end_pass(&self.bundle) && self.moved_past(m));
        if again {
            let _ = self.ctx.wake.bundles.send(self.bundle.clone());
        }
    }
}

/// A bundle's jobs in the mirror, in id order.
fn bundle_jobs(m: &MirrorState, bundle_id: &str) -> Vec<proto::Job> {
    let mut jobs: Vec<proto::Job> = m.jobs_of_bundle(bundle_id).cloned().collect();
    jobs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    jobs
}

impl<'a> Pass<'a> {
    fn new(bundle: &'a Bundle, now: DateTime<Utc>) -> Result<Self, Error> {
        let (ns, name) = ns_name(bundle)?;
        let bundle_id = mapping::bundle_id(&ns, &name);
        let prev = bundle.status.clone().unwrap_or_default();
        // Compared and recorded as its bounded marker, so any value (even one longer than
        // `status.lastRetry` may hold) is acted on exactly once.
        let retry = bundle
            .annotations()
            .get(api::RETRY_ANNOTATION)
            .map(|v| api::bounded::retry_marker(v));
        let retried = retry.is_some() && retry != prev.last_retry;
        Ok(Pass {
            bundle,
            bundle_ref: ObjectRef::new(&name).within(&ns),
            engine_bundle: mapping::bundle(&bundle_id, &bundle.spec),
            bundle_id,
            generation: bundle.metadata.generation,
            prev,
            now,
            retry,
            retried,
        })
    }

    /// The bundle's `(namespace, name)`, as the operator's per-bundle records key it.
    fn name(&self) -> (String, String) {
        (
            self.bundle_ref.namespace.clone().unwrap_or_default(),
            self.bundle_ref.name.clone(),
        )
    }

    fn replicas(&self) -> u32 {
        u32::try_from(self.bundle.spec.replicas).unwrap_or(0)
    }

    /// What must hold before anything is placed; `Some` ends the pass there.
    async fn preflight(&self, ctx: &Arc<Context>) -> Result<Option<Action>, Error> {
        if !ctx.manager_ready() {
            let err = ctx.manager_unavailable();
            self.stall(ctx, "ManagerUnavailable", err.to_string(), None)
                .await?;
            return Ok(Some(Action::requeue(Duration::from_secs(3))));
        }
        // Ids Manager would refuse: say so once instead of failing every pass.
        if let Some(message) = mapping::ids_too_long(&self.bundle_id, &self.bundle.spec) {
            self.stall(ctx, "InvalidName", message, Some("InvalidBundle"))
                .await?;
            return Ok(Some(Action::await_change()));
        }
        if let Some(message) = mapping::config_refused(&self.bundle.spec) {
            self.stall(ctx, "InvalidConfig", message, Some("InvalidBundle"))
                .await?;
            return Ok(Some(Action::await_change()));
        }
        // Static validation against the pools we know (pool references, capabilities, rules).
        let errors = {
            let pools = ctx.state().model().pools();
            pl::validate_bundle(&self.engine_bundle, &pools, &[])
        };
        if !errors.is_empty() {
            // A pool whose object exists but is not loaded yet (operator start-up) is not an error.
            let unknown: Vec<String> = errors
                .iter()
                .filter_map(|e| match e {
                    pl::ValidationError::UnknownPool { pool, .. } => Some(pool.clone()),
                    _ => None,
                })
                .collect();
            if super::pool_not_loaded_yet(ctx, &unknown).await? {
                return Ok(Some(Action::requeue(Duration::from_millis(500))));
            }
            let message = api::bounded::join_bounded(
                &errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
                "; ",
                api::bounded::MAX_CONDITION_MESSAGE,
            );
            self.stall(ctx, "InvalidSpec", message, Some("InvalidBundle"))
                .await?;
            return Ok(Some(Action::requeue(REQUEUE_STALLED)));
        }
        if self.retried {
            // A retry clears the ceiling (and, below, un-drops dropped jobs).
            for r in 0..self.replicas() {
                ctx.state()
                    .bundles_mut()
                    .clear_restarts(&ReplicaKey::new(&self.bundle_id, r), self.now);
            }
            ctx.event(
                self.bundle,
                EventType::Normal,
                "Retry",
                "Retry",
                format!(
                    "retry requested ({})",
                    self.retry.as_deref().unwrap_or_default()
                ),
            )
            .await;
        } else if is_condition(&self.prev, "Broken", "RestartCeilingExceeded") {
            // Broken stays broken until the user asks again.
            let mut status = self.prev.clone();
            status.phase = BundlePhase::Broken;
            status.observed_generation = self.generation;
            api::kstatus::observe_generation(&mut status.conditions, self.generation);
            ctx.set_broken(&self.bundle_id, true);
            write_status(ctx, self.bundle, &self.prev, status).await?;
            return Ok(Some(Action::await_change()));
        }
        Ok(None)
    }

    /// Writes a Stalled status (and a Warning Event the first time, when `event` names one).
    async fn stall(
        &self,
        ctx: &Context,
        reason: &'static str,
        message: String,
        event: Option<&str>,
    ) -> Result<(), Error> {
        if let Some(event) = event
            && !is_condition(&self.prev, api::kstatus::STALLED, reason)
        {
            ctx.event(
                self.bundle,
                EventType::Warning,
                event,
                "Validate",
                message.clone(),
            )
            .await;
        }
        let mut status = self.prev.clone();
        if reason != "ManagerUnavailable" {
            status.phase = BundlePhase::Pending;
        }
        status.observed_generation = self.generation;
        api::set_standing(
            &mut status.conditions,
            api::Standing::Stalled,
            reason,
            message,
            self.generation,
            self.now,
        );
        write_status(ctx, self.bundle, &self.prev, status).await
    }

    /// Registers (or updates) the bundle in Manager, which expands it into one job per replica
    /// and job name; the mirror shows the jobs a moment later.
    async fn register(&self, ctx: &Context) -> Result<(), Error> {
        let wanted = mapping::proto_bundle(&self.bundle_id, &self.bundle.spec);
        let registered = ctx.manager.mirror().bundle(&self.bundle_id);
        if !registered
            .as_ref()
            .is_some_and(|r| mapping::registered_matches(r, &wanted))
        {
            ctx.manager.register_bundle(wanted).await?;
            // Manager expands the bundle into jobs and the Watch stream brings them a moment
            // later. Waiting for them here lets this pass place the jobs and write one settled
            // status, instead of a "Placing" status with no job ids followed by a second pass.
            // A slow stream is not an error: the pass goes on and the mirror's change wakes it.
            let names: Vec<&str> = self
                .bundle
                .spec
                .jobs
                .iter()
                .map(|j| j.job_name.as_str())
                .collect();
            let replicas = self.replicas();
            let id = self.bundle_id.as_str();
            let all_mirrored = |m: &MirrorState| {
                (0..replicas).all(|r| names.iter().all(|n| m.job_of(id, r, n).is_some()))
            };
            if let Err(e) = ctx.manager.wait_until(REGISTER_SETTLE, all_mirrored).await {
                tracing::debug!(bundle = %self.bundle_id, error = %e, "registered jobs not mirrored yet");
            }
        }
        Ok(())
    }

    /// Every job of every replica as the mirror and the previous status show it, with the
    /// restart history of status merged into the ledger.
    fn observe(&self, ctx: &Context) -> BTreeMap<u32, Vec<Seen>> {
        let spec = &self.bundle.spec;
        for rs in &self.prev.replicas {
            let Ok(r) = u32::try_from(rs.replica) else {
                continue;
            };
            ctx.state().bundles_mut().merge_restarts(
                &ReplicaKey::new(&self.bundle_id, r),
                rs.restart_times.iter().copied(),
                self.now,
            );
        }
        let dropped_before = |r: u32, job: &str| {
            self.prev
                .replicas
                .iter()
                .find(|x| x.replica == r as i32)
                .and_then(|x| x.jobs.iter().find(|j| j.job_name == job))
                .is_some_and(|j| j.state == api::JobState::Dropped)
        };
        ctx.with_mirror(|m, state| {
            (0..self.replicas())
                .map(|r| {
                    let jobs = spec
                        .jobs
                        .iter()
                        .map(|j| {
                            let key = pl::JobKey {
                                bundle_id: self.bundle_id.clone(),
                                replica_index: r,
                                job_name: j.job_name.clone(),
                            };
                            let mut seen = observe_job(
                                m,
                                &self.bundle_id,
                                r,
                                &j.job_name,
                                band_rule(ctx, spec, j),
                            );
                            seen.job.dropped_before = dropped_before(r, &j.job_name);
                            // Manager accepted a start the mirror does not show yet.
                            if let Some(node) = state.model().started_not_mirrored(&key) {
                                seen.job.start_in_flight = true;
                                seen.node_id = node.to_owned();
                            }
                            seen
                        })
                        .collect();
                    (r, jobs)
                })
                .collect()
        })
    }

    /// Pushes a changed `spec.jobs[].config` to every job Manager holds another one for, without
    /// restarting it (Manager tells a running job; the TypeScript library's `onJobConfigUpdated`).
    /// Jobs Manager does not show yet get theirs with the registration.
    async fn push_configs(
        &self,
        ctx: &Context,
        seen: &mut BTreeMap<u32, Vec<Seen>>,
    ) -> Result<(), Error> {
        let mut updated = Vec::new();
        for s in seen.values_mut().flatten() {
            let Some(job_id) = s.job_id.clone() else {
                continue;
            };
            let Some(spec) = self
                .bundle
                .spec
                .jobs
                .iter()
                .find(|j| j.job_name == s.job.job_name)
            else {
                continue;
            };
            let wanted = spec.config_bytes();
            if s.config == wanted {
                continue;
            }
            match ctx.manager.update_job_config(&job_id, wanted.clone()).await {
                Ok(_) => {
                    s.config = wanted;
                    updated.push(job_id);
                }
                // Manager's refusal is its final word on this config: say so, keep the old one.
                Err(e) if is_final_answer(&e) => {
                    ctx.event(
                        self.bundle,
                        EventType::Warning,
                        "JobConfigRejected",
                        "UpdateJobConfig",
                        format!("Manager refused the configuration of job {job_id}: {e}"),
                    )
                    .await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        if !updated.is_empty() {
            ctx.event(
                self.bundle,
                EventType::Normal,
                "JobConfigUpdated",
                "UpdateJobConfig",
                api::bounded::join_bounded(&updated, ", ", api::bounded::MAX_CONDITION_MESSAGE),
            )
            .await;
        }
        Ok(())
    }

    /// The planner's answer per replica.
    fn plan(&self, ctx: &Context, seen: &BTreeMap<u32, Vec<Seen>>) -> BTreeMap<u32, ReplicaPlan> {
        let undrop = self.retried || self.generation != self.prev.observed_generation;
        let now_ms = self.now.timestamp_millis();
        seen.iter()
            .map(|(r, jobs)| {
                let jobs: Vec<(ObservedJob, BandRule)> =
                    jobs.iter().map(|s| (s.job.clone(), s.band)).collect();
                let restarts = ctx
                    .state()
                    .bundles()
                    .restarts(&ReplicaKey::new(&self.bundle_id, *r), self.now);
                let input = plan::ReplicaInput {
                    replica: *r,
                    jobs: &jobs,
                    restarts_in_window: restarts,
                    undrop,
                    now_ms,
                };
                (*r, plan::plan_replica(&input))
            })
            .collect()
    }

    /// Carries out the plans: drops, ledger clears, placements and starts.
    async fn act(
        &self,
        ctx: &Arc<Context>,
        seen: &BTreeMap<u32, Vec<Seen>>,
        plans: &BTreeMap<u32, ReplicaPlan>,
    ) -> Result<BTreeMap<u32, Outcome>, Error> {
        let mut outcomes = BTreeMap::new();
        // Where replicas placed in this pass went: later replicas must see them (inter-replica
        // rules) before the mirror does.
        let mut decided: Vec<pl::Position> = Vec::new();
        for (r, p) in plans {
            for job in &p.newly_dropped {
                let replica_seen = seen.get(r).map(Vec::as_slice).unwrap_or_default();
                if let Some(cause) = involuntary_cause(replica_seen, std::slice::from_ref(job)) {
                    ctx.metrics.involuntary_disruption(cause);
                }
                let handed_over = replica_seen.iter().any(|s| {
                    &s.job.job_name == job && s.job.stop_cause == StopCause::HandedToRecovery
                });
                self.report_drop(ctx, *r, job, handed_over).await;
            }
            let mut outcome = Outcome::default();
            match &p.intent {
                ReplicaIntent::Settled { clear_restarts, .. } => {
                    if *clear_restarts {
                        ctx.state()
                            .bundles_mut()
                            .clear_restarts(&ReplicaKey::new(&self.bundle_id, *r), self.now);
                    }
                }
                ReplicaIntent::Wait | ReplicaIntent::Broken { .. } => {}
                ReplicaIntent::Place {
                    jobs,
                    recovery,
                    max_restarts,
                } => {
                    let replica_seen = seen.get(r).map(Vec::as_slice).unwrap_or_default();
                    outcome = self
                        .place_replica(ctx, *r, replica_seen, seen, p, jobs, *recovery, &decided)
                        .await?;
                    if outcome.started
                        && *recovery
                        && let Some(cause) = involuntary_cause(replica_seen, jobs)
                    {
                        ctx.metrics.involuntary_disruption(cause);
                    }
                    if outcome.started && *recovery {
                        ctx.state().bundles_mut().record_restart(
                            &ReplicaKey::new(&self.bundle_id, *r),
                            self.now,
                            *max_restarts,
                        );
                    }
                    if let Some((
                        pl::Decision {
                            outcome: pl::Outcome::Placed { assignments, .. },
                            ..
                        },
                        _,
                    )) = &outcome.decision
                    {
                        decided.extend(assignments.iter().map(|a| pl::Position {
                            node: a.node.clone(),
                            zone: a.zone.clone(),
                        }));
                    }
                }
            }
            outcomes.insert(*r, outcome);
        }
        Ok(outcomes)
    }

    /// `handed_over`: it was stopped and handed to its band (a failed migration, a drain's
    /// fallback, a preemption) rather than failing by itself.
    async fn report_drop(&self, ctx: &Context, r: u32, job: &str, handed_over: bool) {
        ctx.metrics.job_dropped();
        let band = self
            .bundle
            .spec
            .jobs
            .iter()
            .find(|j| j.job_name == job)
            .map(|j| j.requirements.priority_band.as_str())
            .unwrap_or_default();
        ctx.event(
            self.bundle,
            EventType::Warning,
            "JobDropped",
            "Recover",
            if handed_over {
                format!(
                    "replica {r} job {job} ({band} band) was stopped and handed to its band (a failed migration, a drain's fallback or a preemption), which drops it"
                )
            } else {
                format!("replica {r} job {job} ({band} band) failed and was dropped, as its band says")
            },
        )
        .await;
    }

    /// Places one replica's jobs as a unit and starts them.
    #[allow(clippy::too_many_arguments)]
    async fn place_replica(
        &self,
        ctx: &Arc<Context>,
        r: u32,
        replica: &[Seen],
        all: &BTreeMap<u32, Vec<Seen>>,
        p: &ReplicaPlan,
        jobs: &[String],
        recovery: bool,
        decided_elsewhere: &[pl::Position],
    ) -> Result<Outcome, Error> {
        let mut outcome = Outcome::default();
        // Every job must be known to Manager before it can be started: the mirror shows a
        // freshly registered bundle's jobs a moment later, and that change wakes us.
        let Some(job_ids) = jobs
            .iter()
            .map(|name| {
                replica
                    .iter()
                    .find(|s| &s.job.job_name == name)
                    .and_then(|s| s.job_id.clone())
                    .map(|id| (name.clone(), id))
            })
            .collect::<Option<HashMap<String, String>>>()
        else {
            return Ok(outcome);
        };
        let request = ctx
            .manager
            .mirror()
            .read(|m| self.request(m, r, all, p, jobs, recovery, decided_elsewhere));
        let keys: Vec<pl::JobKey> = jobs
            .iter()
            .map(|j| pl::JobKey {
                bundle_id: self.bundle_id.clone(),
                replica_index: r,
                job_name: j.clone(),
            })
            .collect();
        // Decide and reserve under the state lock; act after releasing it.
        let decision = ctx.with_mirror(|m, state| {
            let model = state.model_mut();
            for k in &keys {
                model.abandon(k, m); // a previous, unstarted reservation of these jobs
            }
            let decision = model.place(&request, now_ms(self.now));
            if decision.is_placed()
                && let Err(e) = model.commit(&decision, &job_ids)
            {
                tracing::warn!(bundle = %self.bundle_id, replica = r, error = %e, "could not reserve a placement");
            }
            decision
        });
        ctx.metrics.placement_attempted();
        ctx.state().bundles_mut().record_decision(
            self.name(),
            r,
            super::LastDecision {
                decision: decision.clone(),
                recovery,
                at: self.now,
                preempted: None,
            },
        );
        match &decision.outcome {
            pl::Outcome::Placed { pool, assignments } => {
                if assignments.iter().any(|a| a.node_pending) {
                    // The chosen node is still starting: start the jobs once it is up.
                    outcome.result.provisioning = true;
                    outcome.waiting_on = vec![pool.clone()];
                } else {
                    self.start(
                        ctx,
                        r,
                        pool,
                        assignments,
                        &job_ids,
                        recovery,
                        &decision,
                        &mut outcome,
                    )
                    .await?;
                }
            }
            pl::Outcome::Provision {
                pool,
                instance_type,
                zone,
            } => {
                outcome.result.provisioning = true;
                outcome.waiting_on = vec![pool.clone()];
                self.provision(ctx, r, pool, instance_type, zone.as_deref(), &mut outcome)
                    .await?;
            }
            pl::Outcome::Unplaceable { .. } if recovery => {
                if let Some(p) = self.preempt(ctx, r, jobs, &request).await? {
                    // The victims are stopping; their stop wakes this bundle, whose next pass
                    // places the replica in the room they leave.
                    outcome.preempted = Some(p);
                    outcome.waiting_on = request.pools.clone();
                } else {
                    self.unplaceable(ctx, r, &decision, &request, &mut outcome)
                        .await;
                }
            }
            pl::Outcome::Unplaceable { .. } => {
                self.unplaceable(ctx, r, &decision, &request, &mut outcome)
                    .await;
            }
        }
        if outcome.started {
            outcome.preempted = super::preempt::placed(ctx, &self.bundle_id, r);
        } else if outcome.preempted.is_none() {
            outcome.preempted = super::preempt::pending(ctx, &self.bundle_id, r);
        }
        if outcome.preempted.is_some() {
            ctx.state()
                .bundles_mut()
                .note_preempted(&self.name(), r, outcome.preempted.clone());
        }
        outcome.decision = Some((decision, recovery));
        Ok(outcome)
    }

    /// A recovery with no room: preempt bronze jobs when its band may (see
    /// [`super::preempt`]).
    async fn preempt(
        &self,
        ctx: &Context,
        r: u32,
        jobs: &[String],
        request: &pl::PlacementRequest,
    ) -> Result<Option<api::Preemption>, Error> {
        let Some(band) = super::preempt::recovering_band(&self.bundle.spec, jobs) else {
            return Ok(None);
        };
        super::preempt::preempt_for(
            ctx,
            &super::preempt::Recovering {
                bundle: self.bundle,
                bundle_id: &self.bundle_id,
                replica: r,
                band,
                request,
                now: self.now,
            },
        )
        .await
    }

    /// Nothing can take the replica: say so (once per stall) and wait on its pools.
    async fn unplaceable(
        &self,
        ctx: &Context,
        r: u32,
        decision: &pl::Decision,
        request: &pl::PlacementRequest,
        outcome: &mut Outcome,
    ) {
        if let pl::Outcome::Unplaceable { jobs } = &decision.outcome {
            ctx.metrics.placement_failed();
            let blocked = {
                let state = ctx.state();
                plan::unplaceable(r, jobs, &decision.trace.pools, |pool| {
                    state.model().pool(pool).and_then(|p| p.max_nodes)
                })
            };
            if !is_condition(&self.prev, api::kstatus::STALLED, blocked.cause.reason()) {
                ctx.event(
                    self.bundle,
                    EventType::Warning,
                    "PlacementFailed",
                    "Place",
                    blocked.message.clone(),
                )
                .await;
            }
            outcome.result.unplaceable = Some(blocked);
            outcome.waiting_on = request.pools.clone();
        }
    }

    /// The placement request for replica `r`: the jobs to place, and where the replica's other
    /// jobs and the other replicas already are.
    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        m: &MirrorState,
        r: u32,
        all: &BTreeMap<u32, Vec<Seen>>,
        p: &ReplicaPlan,
        jobs: &[String],
        recovery: bool,
        decided_elsewhere: &[pl::Position],
    ) -> pl::PlacementRequest {
        let zone = |node: &str| m.zone_of(node).filter(|z| !z.is_empty()).map(str::to_owned);
        let mut placed_siblings = Vec::new();
        let mut other_replicas: Vec<pl::Position> = decided_elsewhere.to_vec();
        for (rr, seen) in all {
            for s in seen {
                let holding = if *rr == r {
                    p.needs.get(&s.job.job_name) == Some(&Need::Nothing)
                } else {
                    s.job.start_in_flight
                        || matches!(s.job.phase, JobPhase::Running | JobPhase::Starting)
                };
                if !holding || s.node_id.is_empty() {
                    continue;
                }
                if *rr == r {
                    placed_siblings.push(pl::SiblingPosition {
                        job_name: s.job.job_name.clone(),
                        node: s.node_id.clone(),
                        zone: zone(&s.node_id),
                    });
                } else {
                    other_replicas.push(pl::Position {
                        node: s.node_id.clone(),
                        zone: zone(&s.node_id),
                    });
                }
            }
        }
        pl::PlacementRequest {
            bundle_id: self.bundle_id.clone(),
            replica_index: r,
            jobs: self
                .bundle
                .spec
                .jobs
                .iter()
                .filter(|j| jobs.contains(&j.job_name))
                .map(mapping::job)
                .collect(),
            pools: self.engine_bundle.pools_for_replica(r).to_vec(),
            kind: if recovery {
                pl::PlacementKind::Recovery
            } else {
                pl::PlacementKind::First
            },
            intra_replica: self.engine_bundle.intra_replica_placement,
            inter_replica: self.engine_bundle.inter_replica_placement,
            other_replicas,
            placed_siblings,
        }
    }

    /// Starts every job of a placed replica at once and handles the answers; a replica is
    /// placed whole or not at all.
    #[allow(clippy::too_many_arguments)]
    async fn start(
        &self,
        ctx: &Arc<Context>,
        r: u32,
        pool: &str,
        assignments: &[pl::Assignment],
        job_ids: &HashMap<String, String>,
        recovery: bool,
        decision: &pl::Decision,
        outcome: &mut Outcome,
    ) -> Result<(), Error> {
        let key = |job_name: &str| pl::JobKey {
            bundle_id: self.bundle_id.clone(),
            replica_index: r,
            job_name: job_name.to_owned(),
        };
        let starts = assignments.iter().filter_map(|a| {
            let job_id = job_ids.get(&a.job_name)?;
            Some(async move {
                let answer = ctx
                    .manager
                    .start_job(job_id, &a.node, proto::JobRole::Normal)
                    .await;
                (a, job_id, answer)
            })
        });
        let mut all_started = true;
        let mut first_error: Option<manager_client::ClientError> = None;
        let mut started_now: Vec<(pl::JobKey, String)> = Vec::new();
        for (a, job_id, answer) in futures::future::join_all(starts).await {
            let k = key(&a.job_name);
            match answer {
                Ok(job) => {
                    ctx.with_mirror(|m, s| s.model_mut().start_answered(&k, job.updated_at_ms, m));
                    started_now.push((k, job_id.clone()));
                }
                Err(manager_client::ClientError::Rejected {
                    reason, message, ..
                }) => {
                    all_started = false;
                    ctx.with_mirror(|m, s| s.model_mut().abandon(&k, m));
                    ctx.metrics.job_rejected();
                    super::node::record_rejection(ctx, &a.node).await;
                    ctx.event(
                        self.bundle,
                        EventType::Warning,
                        "JobRejected",
                        "Start",
                        format!("node {} refused {job_id}: {reason:?} {message}", a.node),
                    )
                    .await;
                }
                Err(e) => {
                    ctx.with_mirror(|m, s| s.model_mut().abandon(&k, m));
                    first_error.get_or_insert(e);
                }
            }
        }
        if !all_started || first_error.is_some() {
            // Stop what did start, so the next pass places the replica again as a unit instead
            // of pinning the rest to a node that just refused part of it.
            for (k, job_id) in &started_now {
                if let Err(e) = ctx.manager.stop_job(job_id, proto::JobRole::Normal).await {
                    tracing::warn!(job = %job_id, error = %e, "could not roll back a partial replica start");
                }
                ctx.with_mirror(|m, s| s.model_mut().abandon(k, m));
            }
        }
        if let Some(e) = first_error {
            return Err(e.into());
        }
        if !all_started {
            return Ok(());
        }
        // Counted only once every start was answered (the metric's help says so).
        ctx.metrics.placement_succeeded();
        outcome.started = true;
        outcome
            .started_jobs
            .extend(started_now.into_iter().map(|(_, id)| id));
        let mut nodes: Vec<&str> = assignments.iter().map(|a| a.node.as_str()).collect();
        nodes.dedup();
        let note = format!("replica {r} on {} in pool {pool}", nodes.join(", "));
        if recovery {
            ctx.event(self.bundle, EventType::Normal, "Restarted", "Place", note)
                .await;
        } else {
            // First placements of one pass are told in one Event (see `record`).
            outcome.placed_note = Some(note);
        }
        if self
            .engine_bundle
            .pools_for_replica(r)
            .first()
            .is_some_and(|p| p != pool)
        {
            ctx.event(
                self.bundle,
                EventType::Normal,
                "SpilledToPool",
                "Place",
                format!(
                    "replica {r} spilled to pool {pool}: {}",
                    decision.trace.message
                ),
            )
            .await;
        }
        if !decision.trace.broken_soft_rules.is_empty() {
            let rules: Vec<&str> = decision
                .trace
                .broken_soft_rules
                .iter()
                .map(|s| s.as_str())
                .collect();
            ctx.event(
                self.bundle,
                EventType::Warning,
                "SoftRuleBroken",
                "Place",
                format!("replica {r}: soft rules not honoured: {}", rules.join(", ")),
            )
            .await;
        }
        Ok(())
    }

    /// Asks Manager for a node in an elastic pool, unless one asked for this replica is still
    /// on its way. A refusal or a failed ask is the replica's outcome, not the pass's error:
    /// the status says why, and the ask is not repeated before its time.
    async fn provision(
        &self,
        ctx: &Arc<Context>,
        r: u32,
        pool: &str,
        instance_type: &str,
        zone: Option<&str>,
        outcome: &mut Outcome,
    ) -> Result<(), Error> {
        let tag = mapping::BundleId::of(
            self.bundle_ref.namespace.as_deref().unwrap_or_default(),
            &self.bundle_ref.name,
        )
        .provisioned_for(r);
        let node = match super::request_node(ctx, pool, instance_type, zone, tag).await {
            Ok(Some(node)) => node,
            Ok(None) => return Ok(()),
            Err(e) => return self.provision_failed(ctx, r, pool, e, outcome).await,
        };
        ctx.event(
            self.bundle,
            EventType::Normal,
            "Provisioning",
            "Provision",
            format!(
                "replica {r}: asked for a {instance_type} node in pool {pool} ({})",
                node.node_id
            ),
        )
        .await;
        Ok(())
    }

    /// The node replica `r` needs could not be asked for: Manager refused it for good (the
    /// replica is held, with Manager's message, and a Warning Event once), the last ask failed
    /// and waits its back-off, or provisioning in the pool is paused. Any other error is the
    /// pass's.
    async fn provision_failed(
        &self,
        ctx: &Context,
        r: u32,
        pool: &str,
        error: Error,
        outcome: &mut Outcome,
    ) -> Result<(), Error> {
        match error {
            Error::ProvisioningRefused(refusal) => {
                let message = format!("replica {r} cannot be placed: {}", refusal.describe());
                if !is_condition(&self.prev, api::kstatus::STALLED, "ProvisioningRefused") {
                    ctx.event(
                        self.bundle,
                        EventType::Warning,
                        "ProvisioningRefused",
                        "Provision",
                        message.clone(),
                    )
                    .await;
                }
                outcome.result.provisioning = false;
                outcome.result.unplaceable = Some(plan::Blocked {
                    cause: plan::BlockedCause::ProvisioningRefused,
                    message,
                });
            }
            Error::ProvisioningRetry { message, retry_in } => {
                outcome.result.provisioning_retry = Some(format!(
                    "replica {r}: no node from pool {pool} yet ({message}); asked again in {}s",
                    retry_in.as_secs().max(1)
                ));
                outcome.retry_in = Some(retry_in);
            }
            Error::ProvisioningPaused(message) => {
                outcome.result.provisioning_retry = Some(format!(
                    "replica {r}: provisioning in pool {pool} paused: {message}"
                ));
            }
            other => return Err(other),
        }
        Ok(())
    }

    /// Status, Events, metrics and wake-ups from what the pass decided and did.
    async fn record(
        &self,
        ctx: &Arc<Context>,
        plans: &BTreeMap<u32, ReplicaPlan>,
        outcomes: &BTreeMap<u32, Outcome>,
        mark: &mut PassMark<'_>,
    ) -> Result<Action, Error> {
        let broken = plans.iter().find_map(|(r, p)| match p.intent {
            ReplicaIntent::Broken { restarts, max_restarts } => Some(format!(
                "replica {r} failed again after {restarts} restarts in the last hour (maxRestartsPerHour {max_restarts}); no more retries until `kubectl annotate --overwrite bundle {} {}=<new value>`",
                self.bundle.name_any(),
                api::RETRY_ANNOTATION
            )),
            _ => None,
        });
        let started: Vec<&str> = outcomes
            .values()
            .flat_map(|o| o.started_jobs.iter().map(String::as_str))
            .collect();
        settle_starts(ctx, &started).await;
        // Observe again: starts made above show in the mirror within milliseconds.
        let seen = self.observe(ctx);
        mark.started = seen
            .values()
            .flatten()
            .filter_map(|s| {
                let id = s
                    .job_id
                    .as_ref()
                    .filter(|id| started.contains(&id.as_str()))?;
                Some((id.clone(), s.job.phase))
            })
            .collect();
        let mut status = self.status(ctx, &seen, plans, outcomes, broken.as_deref());
        let phase = status.phase;
        ctx.set_broken(&self.bundle_id, phase == BundlePhase::Broken);
        let mut waiting_on: Vec<String> = outcomes
            .values()
            .flat_map(|o| o.waiting_on.iter().cloned())
            .collect();
        let rebalance = self.rebalance(ctx, &mut status).await?;
        if rebalance.as_ref().is_some_and(|l| l.wait_for_capacity) {
            // Room in the bundle's pools may let it move back: node and capacity changes there
            // wake it.
            for r in 0..self.replicas() {
                waiting_on.extend(self.engine_bundle.pools_for_replica(r).iter().cloned());
            }
            waiting_on.sort();
            waiting_on.dedup();
        }
        ctx.state()
            .wake_mut()
            .set_waiting(&self.bundle_ref, waiting_on);
        let placed: Vec<&str> = outcomes
            .values()
            .filter_map(|o| o.placed_note.as_deref())
            .collect();
        if !placed.is_empty() {
            ctx.event(
                self.bundle,
                EventType::Normal,
                "Placed",
                "Place",
                placed.join("; "),
            )
            .await;
        }
        if let Some(reason) = &broken
            && !is_condition(&self.prev, "Broken", "RestartCeilingExceeded")
        {
            ctx.metrics.bundle_broken();
            ctx.event(
                self.bundle,
                EventType::Warning,
                "BundleBroken",
                "Recover",
                reason.clone(),
            )
            .await;
        }
        // Coalescing: while the only thing left is jobs that were just started (they run within
        // moments, and the mirror's change wakes us again), skip the intermediate "Placing"
        // write so a wave of starts is one settled write per bundle. A start that takes longer
        // than TRANSIENT_START is shown; the requeue is the safety net should no change come.
        let now_ms = self.now.timestamp_millis();
        let just_started = |s: &Seen| {
            s.job.phase == JobPhase::Running
                || (s.job.phase == JobPhase::Starting
                    && now_ms.saturating_sub(s.job.started_at_ms) < TRANSIENT_START_MS)
        };
        let busy = outcomes.values().any(|o| {
            o.result.unplaceable.is_some()
                || o.result.provisioning
                || o.result.provisioning_retry.is_some()
        }) || plans.values().any(|p| p.intent == ReplicaIntent::Wait);
        let transient = phase == BundlePhase::Placing
            && !self.retried
            && !busy
            && (seen.values().flatten().all(just_started) || outcomes.values().any(|o| o.started));
        if transient {
            return Ok(Action::requeue(Duration::from_millis(500)));
        }
        if let Some(after) = self.defer_status(ctx, &status) {
            return Ok(Action::requeue(after));
        }
        write_status(ctx, self.bundle, &self.prev, status).await?;
        // A replica whose restart count clears soon is looked at again then (not at the
        // settled interval), so status shows the cleared count when it happens.
        // A replica this pass restarted has its count to clear once the new start has run
        // for its band's `restartClearAfter`: the pass records it running, so no later pass
        // would otherwise look before the settled interval.
        let restarted = plans.iter().filter_map(|(r, p)| {
            let restarted = matches!(p.intent, ReplicaIntent::Place { recovery: true, .. })
                && outcomes.get(r).is_some_and(|o| o.started);
            restarted.then(|| {
                seen.get(r)
                    .into_iter()
                    .flatten()
                    .map(|s| s.band.restart_clear_after_ms)
                    .max()
                    .unwrap_or(0)
            })
        });
        let clear_in = plans
            .values()
            .filter_map(|p| match p.intent {
                ReplicaIntent::Settled { clear_in_ms, .. } => clear_in_ms,
                _ => None,
            })
            .chain(restarted)
            .min()
            .map(|ms| {
                Duration::from_millis(u64::try_from(ms).unwrap_or(0)) + Duration::from_millis(50)
            });
        Ok(match phase {
            BundlePhase::Ready => {
                let settled = if rebalance.is_some_and(|l| l.condition.0) {
                    REQUEUE_REBALANCE
                } else {
                    REQUEUE_SETTLED
                };
                Action::requeue(clear_in.map_or(settled, |d| d.min(settled)))
            }
            BundlePhase::Broken => Action::await_change(),
            _ if outcomes.values().any(|o| o.result.unplaceable.is_some()) => {
                Action::requeue(REQUEUE_STALLED)
            }
            // A node ask that failed is looked at again when its back-off ends, not before.
            _ => Action::requeue(
                outcomes
                    .values()
                    .filter_map(|o| o.retry_in)
                    .min()
                    .map_or(REQUEUE_BUSY, |d| d.max(REQUEUE_BUSY)),
            ),
        })
    }

    /// While bundles that lost jobs wait for their pass, this pass's status write waits
    /// ([`recovery_first`]): `Some(after)` to look again then instead of writing now.
    fn defer_status(&self, ctx: &Context, status: &BundleStatus) -> Option<Duration> {
        let name = self.name();
        let now = ctx.clock.instant();
        let mut state = ctx.state();
        let after = if *status == self.prev {
            None
        } else {
            let backlog = state.wake_mut().backlog(now);
            let since = state.bundles().status_deferred_since(&name);
            recovery_first::defer_status(backlog, since, now)
        };
        match after {
            Some(_) => state.bundles_mut().defer_status(&name, now),
            None => state.bundles_mut().status_recorded(&name),
        }
        after
    }

    /// The rebalancer's look at a Ready bundle with `spec.rebalance` (see
    /// [`super::rebalance`]), recorded as its `RebalanceNeeded` condition; the condition goes
    /// when `spec.rebalance` is off.
    async fn rebalance(
        &self,
        ctx: &Context,
        status: &mut BundleStatus,
    ) -> Result<Option<super::rebalance::Look>, Error> {
        if !self.bundle.spec.rebalance {
            status
                .conditions
                .retain(|c| c.type_ != super::rebalance::CONDITION);
            return Ok(None);
        }
        if status.phase != BundlePhase::Ready {
            return Ok(None);
        }
        let look = super::rebalance::look(
            ctx,
            self.bundle,
            status,
            &self.bundle_id,
            &self.engine_bundle,
            self.now,
        )
        .await?;
        let (on, reason, message) = &look.condition;
        api::set_condition(
            &mut status.conditions,
            super::condition(
                super::rebalance::CONDITION,
                *on,
                reason,
                message.clone(),
                self.generation,
                self.now,
            ),
        );
        Ok(Some(look))
    }

    fn status(
        &self,
        ctx: &Context,
        seen: &BTreeMap<u32, Vec<Seen>>,
        plans: &BTreeMap<u32, ReplicaPlan>,
        outcomes: &BTreeMap<u32, Outcome>,
        broken: Option<&str>,
    ) -> BundleStatus {
        let prev_job = |r: u32, name: &str| -> Option<&JobStatus> {
            self.prev
                .replicas
                .iter()
                .find(|x| x.replica == r as i32)
                .and_then(|x| x.jobs.iter().find(|j| j.job_name == name))
        };
        let remembered: BTreeMap<u32, super::LastDecision> = ctx
            .state()
            .bundles()
            .trace(&self.name())
            .unwrap_or_default();
        let mut status = BundleStatus {
            last_retry: self.retry.clone().or_else(|| self.prev.last_retry.clone()),
            conditions: self.prev.conditions.clone(),
            ..Default::default()
        };
        let none = Outcome::default();
        let mut states: Vec<Vec<api::JobState>> = Vec::new();
        for (r, jobs) in seen {
            let outcome = outcomes.get(r).unwrap_or(&none);
            let key = ReplicaKey::new(&self.bundle_id, *r);
            let (restarts, restart_times) = {
                let state = ctx.state();
                (
                    state.bundles().restarts(&key, self.now),
                    state.bundles().restart_times(&key, self.now),
                )
            };
            let mut rs = ReplicaStatus {
                replica: *r as i32,
                restarts_last_hour: i32::try_from(restarts).unwrap_or(i32::MAX),
                restart_times,
                jobs: Vec::new(),
            };
            let mut replica_states = Vec::new();
            for s in jobs {
                let name = &s.job.job_name;
                let need = plans
                    .get(r)
                    .and_then(|p| p.needs.get(name))
                    .copied()
                    .unwrap_or(Need::Place);
                let state = plan::job_state(s.job.phase, need, &outcome.result);
                replica_states.push(state);
                let previous = prev_job(*r, name).and_then(|p| p.last_placement.clone());
                let last_placement = match &outcome.decision {
                    Some((d, recovery)) if d.trace_touches(name) => {
                        let mut t = mapping::trace_summary(
                            &d.summary(),
                            *recovery,
                            self.now,
                            d.node_for(name),
                        );
                        t.preempted = outcome.preempted.clone();
                        Some(t)
                    }
                    // A decision made in a pass whose status write was coalesced.
                    _ => match remembered.get(r) {
                        Some(last)
                            if last.decision.trace_touches(name)
                                && previous.as_ref().is_none_or(|p| p.decided_at < last.at) =>
                        {
                            let mut t = mapping::trace_summary(
                                &last.decision.summary(),
                                last.recovery,
                                last.at,
                                last.decision.node_for(name),
                            );
                            t.preempted = last.preempted.clone();
                            Some(t)
                        }
                        _ => previous,
                    },
                };
                let holds = matches!(
                    state,
                    api::JobState::Running | api::JobState::Starting | api::JobState::Stopping
                );
                let (pool, zone) = ctx.manager.mirror().read(|m| {
                    m.nodes
                        .get(&s.node_id)
                        .map(|n| (n.pool.clone(), n.zone().to_owned()))
                        .unwrap_or_default()
                });
                let wanted_config = self
                    .bundle
                    .spec
                    .jobs
                    .iter()
                    .find(|j| &j.job_name == name)
                    .map(api::BundleJob::config_bytes)
                    .unwrap_or_default();
                rs.jobs.push(JobStatus {
                    config_digest: api::config_digest(&s.config),
                    config_applied: s.job_id.as_ref().map(|_| s.config == wanted_config),
                    job_name: name.clone(),
                    job_id: s.job_id.clone(),
                    node_id: (!s.node_id.is_empty() && holds).then(|| s.node_id.clone()),
                    pool: (!pool.is_empty() && holds).then_some(pool),
                    zone: (!zone.is_empty() && holds).then_some(zone),
                    state,
                    restarts_last_hour: rs.restarts_last_hour,
                    last_placement,
                });
            }
            states.push(replica_states);
            status.replicas.push(rs);
        }
        let results: Vec<&PlacementResult> = outcomes.values().map(|o| &o.result).collect();
        let v = plan::verdict(&states, &results, broken);
        status.phase = v.phase;
        status.placed_replicas = i32::try_from(v.placed_replicas).unwrap_or(i32::MAX);
        status.observed_generation = self.generation;
        api::set_standing(
            &mut status.conditions,
            v.standing,
            v.reason,
            v.message,
            self.generation,
            self.now,
        );
        let broken_cond = match broken {
            Some(msg) => super::condition(
                "Broken",
                true,
                "RestartCeilingExceeded",
                msg,
                self.generation,
                self.now,
            ),
            None => super::condition(
                "Broken",
                false,
                "WithinRestartCeiling",
                "",
                self.generation,
                self.now,
            ),
        };
        api::set_condition(&mut status.conditions, broken_cond);
        status
    }
}

/// One job as the mirror shows it, by the ids Manager gave it.
fn observe_job(m: &MirrorState, bundle_id: &str, r: u32, job_name: &str, band: BandRule) -> Seen {
    let Some(job) = m.job_of(bundle_id, r, job_name) else {
        return Seen {
            job: ObservedJob {
                job_name: job_name.to_owned(),
                phase: JobPhase::Pending,
                stop_cause: StopCause::Unknown,
                started_at_ms: 0,
                start_in_flight: false,
                moving: false,
                dropped_before: false,
            },
            band,
            job_id: None,
            node_id: String::new(),
            config: Vec::new(),
        };
    };
    let current = job
        .instances
        .iter()
        .filter(|i| i.is_normal())
        .max_by_key(|i| i.started_at_ms);
    Seen {
        job: ObservedJob {
            job_name: job_name.to_owned(),
            phase: mapping::job_phase(job.state()),
            stop_cause: current
                .map_or(StopCause::Unknown, |i| mapping::stop_cause(i.stop_reason())),
            started_at_ms: current.map_or(0, |i| i.started_at_ms),
            start_in_flight: false,
            moving: m
                .migrations
                .values()
                .any(|mig| mig.job_id == job.job_id && !mig.is_final()),
            dropped_before: false,
        },
        band,
        job_id: Some(job.job_id.clone()),
        node_id: job.node_id.clone(),
        config: job.config.clone(),
    }
}

/// Waits (see [`automanager_policy::start_settle`]) until the jobs this pass started run, so
/// the pass records them running instead of leaving that to a second pass.
async fn settle_starts(ctx: &Context, started: &[&str]) {
    if started.is_empty() {
        return;
    }
    // Not while bundles that lost jobs wait for a pass: this one's slot is theirs sooner.
    let backlog = ctx.state().wake_mut().backlog(ctx.clock.instant());
    if !recovery_first::settle_starts(backlog) {
        return;
    }
    let Some(bound) = ctx.state().bundles_mut().settle_bound() else {
        return;
    };
    let began = ctx.clock.instant();
    let running = |m: &MirrorState| {
        started.iter().all(|id| {
            m.jobs.get(*id).is_some_and(|j| {
                !matches!(
                    j.state(),
                    proto::JobState::Pending | proto::JobState::Starting
                )
            })
        })
    };
    let took = ctx
        .manager
        .wait_until(bound, running)
        .await
        .ok()
        .map(|()| ctx.clock.instant().saturating_duration_since(began));
    ctx.state().bundles_mut().record_settle(took);
}

/// A job's band as it applies to this bundle.
fn band_rule(ctx: &Context, spec: &api::BundleSpec, job: &api::BundleJob) -> BandRule {
    let b = ctx
        .settings
        .band(job.requirements.priority_band, spec.bands.as_ref());
    BandRule {
        on_failure: b.on_failure,
        max_restarts_per_hour: b.max_restarts_per_hour,
        restart_clear_after_ms: i64::try_from(b.restart_clear_after.as_millis())
            .unwrap_or(i64::MAX),
    }
}

fn is_condition(status: &BundleStatus, type_: &str, reason: &str) -> bool {
    api::find_condition(&status.conditions, type_)
        .is_some_and(|c| c.is_true() && c.reason == reason)
}

/// Writes status by server-side apply, only when it changed.
async fn write_status(
    ctx: &Context,
    bundle: &Bundle,
    prev: &BundleStatus,
    status: BundleStatus,
) -> Result<(), Error> {
    if &status == prev {
        return Ok(());
    }
    let (ns, name) = ns_name(bundle)?;
    // Conditional: status holds the restart history, which a stale writer must not roll back.
    super::apply_status_if(
        &Api::<Bundle>::namespaced(ctx.client.clone(), &ns),
        &name,
        bundle.metadata.resource_version.as_deref(),
        &status,
    )
    .await
}

/// Deletion: stop the bundle's jobs and unregister it before the finalizer goes.
async fn cleanup(bundle: &Bundle, ctx: &Arc<Context>) -> Result<Action, Error> {
    let (ns, name) = ns_name(bundle)?;
    // A pool waiting to be deleted no longer counts this bundle as a user.
    let spec = &bundle.spec;
    for pool in spec
        .pools
        .iter()
        .chain(spec.replica_overrides.iter().flat_map(|o| &o.pools))
    {
        ctx.wake_pool_controller(pool);
    }
    let bundle_id = mapping::bundle_id(&ns, &name);
    if !ctx.manager_ready() {
        let err = ctx.manager_unavailable();
        let prev = bundle.status.clone().unwrap_or_default();
        let mut status = prev.clone();
        status.phase = BundlePhase::Deleting;
        api::set_standing(
            &mut status.conditions,
            api::Standing::Stalled,
            "ManagerUnavailable",
            format!("waiting for Manager to stop this bundle's jobs before deletion: {err}"),
            bundle.metadata.generation,
            ctx.clock.now(),
        );
        write_status(ctx, bundle, &prev, status).await?;
        return Err(err);
    }
    if ctx.manager.mirror().bundle(&bundle_id).is_some() {
        let removed = ctx.manager.delete_bundle(&bundle_id).await?;
        ctx.event(
            bundle,
            EventType::Normal,
            "Deleted",
            "Delete",
            format!("stopped and unregistered {} jobs", removed.len()),
        )
        .await;
    }
    ctx.with_mirror(|m, state| {
        state.model_mut().forget_bundle(&bundle_id, m);
        state
            .bundles_mut()
            .forget(&(ns.clone(), name.clone()), &bundle_id);
        state
            .wake_mut()
            .set_waiting(&ObjectRef::new(&name).within(&ns), Vec::new());
    });
    ctx.set_broken(&bundle_id, false);
    Ok(Action::await_change())
}

/// Small helpers on decisions for status.
trait DecisionExt {
    fn trace_touches(&self, job: &str) -> bool;
    fn node_for(&self, job: &str) -> Option<&str>;
}

impl DecisionExt for pl::Decision {
    fn trace_touches(&self, job: &str) -> bool {
        match &self.outcome {
            pl::Outcome::Placed { assignments, .. } => {
                assignments.iter().any(|a| a.job_name == job)
            }
            pl::Outcome::Unplaceable { jobs } => jobs.iter().any(|j| j.job_name == job),
            pl::Outcome::Provision { .. } => true,
        }
    }
    fn node_for(&self, job: &str) -> Option<&str> {
        match &self.outcome {
            pl::Outcome::Placed { assignments, .. } => assignments
                .iter()
                .find(|a| a.job_name == job)
                .map(|a| a.node.as_str()),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn band() -> BandRule {
        BandRule {
            on_failure: automanager_api::OnFailure::Restart,
            max_restarts_per_hour: 6,
            restart_clear_after_ms: 600_000,
        }
    }

    #[test]
    fn jobs_are_observed_by_the_ids_manager_gave_them() {
        let mut m = MirrorState::default();
        m.insert_job(proto::Job {
            job_id: "manager-chose-this".into(),
            bundle_id: "ns.b".into(),
            replica: 1,
            job_name: "enc".into(),
            state: proto::JobState::Stopped as i32,
            node_id: "n1".into(),
            instances: vec![proto::JobInstance {
                node_id: "n1".into(),
                role: proto::JobRole::Normal as i32,
                state: proto::JobState::Stopped as i32,
                stop_reason: proto::StopReason::HandedToRecovery as i32,
                started_at_ms: 42,
                ..Default::default()
            }],
            ..Default::default()
        });
        let s = observe_job(&m, "ns.b", 1, "enc", band());
        assert_eq!(s.job_id.as_deref(), Some("manager-chose-this"));
        assert_eq!(s.job.phase, JobPhase::Stopped);
        assert_eq!(s.job.stop_cause, StopCause::HandedToRecovery);
        assert_eq!(s.job.started_at_ms, 42);
        // Another replica of the same bundle is not this job.
        let other = observe_job(&m, "ns.b", 0, "enc", band());
        assert_eq!((other.job_id, other.job.phase), (None, JobPhase::Pending));
    }
}
