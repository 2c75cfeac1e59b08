//! The Bundle controller: registers each bundle with Manager, places every replica's jobs,
//! recovers failed jobs by band, and writes what happened to the bundle's status.
//!
//! One pass: **observe** the bundle, its previous status and its jobs in the mirror; **decide**
//! per replica with the pure planner ([`automanager_policy::bundle`]); **act** (register, start,
//! provision); **record** (status by server-side apply, Events, metrics, the decisions in the
//! bundle's PlacementHistory ([`history`]) and the full trace for `/debug/trace`, and which
//! pools the bundle now waits on, so capacity there wakes it).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{self as api, Bundle, BundlePhase, BundleStatus};
use automanager_placement as pl;
use automanager_policy::bundle::{
    self as plan, BandRule, JobPhase, ObservedJob, PlacementResult, ReplicaIntent, ReplicaPlan,
    StopCause,
};
use automanager_policy::bundle_pass;
use automanager_policy::ledger::ReplicaKey;
use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use manager_client::MirrorState;
use manager_proto as proto;

pub mod history;
pub mod history_writer;
mod place;
mod record;

use record::write_status;

use super::{Context, Error, is_final_answer, ns_name};
use crate::mapping;
use crate::model::StartMark;
use crate::state::Held;

/// How long a pass that registered a bundle waits for Manager's jobs to reach the mirror.
const REGISTER_SETTLE: Duration = Duration::from_secs(2);

/// A Bundle is reconciled inside its cleanup finalizer
/// ([`super::reconcile_finalized`]`::<Bundle>`): `apply` places and records it, `cleanup`
/// stops its jobs on Manager.
impl super::Finalized for Bundle {
    const CONTROLLER: &'static str = "bundle";
    const FINALIZER: &'static str = api::BUNDLE_FINALIZER;

    fn api(&self, ctx: &Context) -> Result<Api<Bundle>, Error> {
        let (ns, _) = ns_name(self)?;
        Ok(Api::namespaced(ctx.client.clone(), &ns))
    }

    async fn apply(self: Arc<Self>, ctx: Arc<Context>) -> Result<Action, Error> {
        apply(&self, &ctx).await
    }

    async fn cleanup(self: Arc<Self>, ctx: Arc<Context>) -> Result<Action, Error> {
        cleanup(&self, &ctx).await
    }
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
    /// Manager's ids of the jobs this pass started, each with its node and Manager's answer.
    started_jobs: Vec<(String, (String, StartMark))>,
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

impl Outcome {
    /// Where the replica's jobs were placed in this pass.
    fn positions(&self) -> Vec<pl::Position> {
        match &self.decision {
            Some((
                pl::Decision {
                    outcome: pl::Outcome::Placed { assignments, .. },
                    ..
                },
                _,
            )) => assignments
                .iter()
                .map(|a| pl::Position {
                    node: a.node.clone(),
                    zone: a.zone.clone(),
                })
                .collect(),
            _ => Vec::new(),
        }
    }
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
    let mut seen = pass.observe(ctx, Some(&mut mark));
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
        ctx.state.begin_bundle_pass(&pass.bundle_ref);
        PassMark {
            ctx,
            bundle: pass.bundle_ref.clone(),
            bundle_id: pass.bundle_id.clone(),
            observed: None,
            started: HashMap::new(),
        }
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
        let again = (self.ctx.manager.mirror())
            .read(|m| (self.ctx.state).end_bundle_pass(&self.bundle, || self.moved_past(m)));
        if let Some(held) = again {
            self.ctx
                .wake
                .bundle(self.bundle.clone(), held == Held::Loss);
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
            self.wait_for_manager(ctx, err.to_string()).await?;
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
        let errors = ctx.state.validate_bundle(&self.engine_bundle);
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
            return Ok(Some(Action::requeue(bundle_pass::STALLED)));
        }
        if self.retried {
            // A retry clears the ceiling (and, below, un-drops dropped jobs).
            ctx.state
                .clear_restarts(&self.bundle_id, 0..self.replicas(), self.now);
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
        status.phase = BundlePhase::Pending;
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

    /// Manager is unreachable: Reconciling (`ManagerUnavailable`), its phase and jobs as last
    /// recorded. Nothing in the bundle needs fixing, and the pass is tried again.
    async fn wait_for_manager(&self, ctx: &Context, message: String) -> Result<(), Error> {
        let mut status = self.prev.clone();
        status.observed_generation = self.generation;
        api::set_standing(
            &mut status.conditions,
            api::Standing::Reconciling,
            "ManagerUnavailable",
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
    /// restart history of status merged into the ledger. `mark` (the look the pass plans on)
    /// keeps the bundle's jobs as this same read of the mirror shows them, so a change after
    /// it wakes the bundle again.
    fn observe(&self, ctx: &Context, mark: Option<&mut PassMark<'_>>) -> BTreeMap<u32, Vec<Seen>> {
        ctx.state
            .merge_restarts(&self.bundle_id, &self.prev.replicas, self.now);
        ctx.manager.mirror().read(|m| {
            if let Some(mark) = mark {
                mark.observed = Some(bundle_jobs(m, &self.bundle_id));
            }
            let mut seen: BTreeMap<u32, Vec<Seen>> = (0..self.replicas())
                .map(|r| (r, self.observe_replica(ctx, m, r)))
                .collect();
            // Starts Manager accepted that the mirror does not show yet, asked while this read
            // of the mirror is held so the two agree.
            let keys: Vec<pl::JobKey> = (seen.iter())
                .flat_map(|(r, jobs)| jobs.iter().map(move |s| (*r, s)))
                .map(|(r, s)| pl::JobKey {
                    bundle_id: self.bundle_id.clone(),
                    replica_index: r,
                    job_name: s.job.job_name.clone(),
                })
                .collect();
            let in_flight = ctx.state.starts_not_mirrored(&keys);
            for (s, node) in seen.values_mut().flatten().zip(in_flight) {
                if let Some(node) = node {
                    s.job.start_in_flight = true;
                    s.node_id = node;
                }
            }
            seen
        })
    }

    /// Replica `r`'s jobs as the mirror shows them.
    fn observe_replica(&self, ctx: &Context, m: &MirrorState, r: u32) -> Vec<Seen> {
        let spec = &self.bundle.spec;
        let dropped_before = |job: &str| {
            self.prev
                .replicas
                .iter()
                .find(|x| u32::try_from(x.replica).ok() == Some(r))
                .and_then(|x| x.jobs.iter().find(|j| j.job_name == job))
                .is_some_and(|j| j.state == api::JobState::Dropped)
        };
        spec.jobs
            .iter()
            .map(|j| {
                let band = band_rule(ctx, spec, j);
                let mut seen = observe_job(m, &self.bundle_id, r, &j.job_name, band);
                seen.job.dropped_before = dropped_before(&j.job_name);
                seen
            })
            .collect()
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
                let (restarts, _) =
                    (ctx.state).restarts(&ReplicaKey::new(&self.bundle_id, *r), self.now);
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
            let replica_seen = seen.get(r).map(Vec::as_slice).unwrap_or_default();
            self.report_drops(ctx, *r, p, replica_seen).await;
            let outcome = match &p.intent {
                ReplicaIntent::Settled {
                    clear_restarts: true,
                    ..
                } => {
                    ctx.state.clear_restarts(&self.bundle_id, [*r], self.now);
                    Outcome::default()
                }
                ReplicaIntent::Place {
                    jobs,
                    recovery,
                    max_restarts,
                } => {
                    let rep = place::Replica {
                        r: *r,
                        seen: replica_seen,
                        plan: p,
                        jobs,
                        recovery: *recovery,
                    };
                    let outcome = self.place_replica(ctx, &rep, seen, &decided).await?;
                    self.count_restart(ctx, &rep, &outcome, *max_restarts);
                    decided.extend(outcome.positions());
                    outcome
                }
                _ => Outcome::default(),
            };
            outcomes.insert(*r, outcome);
        }
        Ok(outcomes)
    }

    /// The jobs the plan drops now: an Event and the metrics each.
    async fn report_drops(&self, ctx: &Context, r: u32, p: &ReplicaPlan, replica: &[Seen]) {
        for job in &p.newly_dropped {
            if let Some(cause) = involuntary_cause(replica, std::slice::from_ref(job)) {
                ctx.metrics.involuntary_disruption(cause);
            }
            let handed_over = replica
                .iter()
                .any(|s| &s.job.job_name == job && s.job.stop_cause == StopCause::HandedToRecovery);
            self.report_drop(ctx, r, job, handed_over).await;
        }
    }

    /// A recovery that started counts against the replica's restart ceiling, and its cause
    /// (a failed job, a lost node) in the involuntary disruptions.
    fn count_restart(
        &self,
        ctx: &Context,
        rep: &place::Replica<'_>,
        outcome: &Outcome,
        max_restarts: u32,
    ) {
        if !(outcome.started && rep.recovery) {
            return;
        }
        if let Some(cause) = involuntary_cause(rep.seen, rep.jobs) {
            ctx.metrics.involuntary_disruption(cause);
        }
        let key = ReplicaKey::new(&self.bundle_id, rep.r);
        ctx.state.record_restart(&key, self.now, max_restarts);
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
        clear_restarts_on: b.clear_restarts_on,
    }
}

fn is_condition(status: &BundleStatus, type_: &str, reason: &str) -> bool {
    api::find_condition(&status.conditions, type_)
        .is_some_and(|c| c.is_true() && c.reason == reason)
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
            api::Standing::Reconciling,
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
    (ctx.history).delete(ctx, &(ns.clone(), name.clone())).await;
    let bundle_ref = ObjectRef::new(&name).within(&ns);
    (ctx.manager.mirror()).read(|m| ctx.state.forget_bundle(m, &bundle_ref, &bundle_id));
    ctx.set_broken(&bundle_id, false);
    Ok(Action::await_change())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn band() -> BandRule {
        BandRule {
            on_failure: automanager_api::OnFailure::Restart,
            max_restarts_per_hour: 6,
            restart_clear_after_ms: 600_000,
            clear_restarts_on: Default::default(),
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
