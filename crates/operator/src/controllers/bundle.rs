//! The Bundle controller: registers each bundle with Manager, places every replica's jobs,
//! recovers failed jobs by band, and writes what happened to the bundle's status.
//!
//! One reconcile: observe the bundle and its jobs in the mirror; decide per replica (nothing to
//! do, first placement, band-aware recovery, drop, broken); act (register, start, provision);
//! record (status by server-side apply, Events, metrics, the full trace for `/debug/trace`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{
    self as api, Bundle, BundlePhase, BundleStatus, JobState, JobStatus, ReplicaStatus,
};
use automanager_placement as pl;
use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use manager_proto as proto;

use super::{Context, Error, condition, now_ms, ns_name};
use crate::mapping;
use automanager_policy::ledger::ReplicaKey;

/// Requeue while something is in progress (a node starting, a job starting).
const REQUEUE_BUSY: Duration = Duration::from_secs(2);
/// Requeue while stalled (no capacity): capacity changes also wake us.
const REQUEUE_STALLED: Duration = Duration::from_secs(30);
/// A job started less than this long ago is "about to run": its status write is coalesced.
const TRANSIENT_START_MS: i64 = 2_000;
/// Periodic look at a settled bundle (clears restart counts of replicas that stayed up).
const REQUEUE_SETTLED: Duration = Duration::from_secs(300);

/// Reconciles one Bundle; wraps the work in the cleanup finalizer.
pub async fn reconcile(bundle: Arc<Bundle>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let (ns, _) = ns_name(bundle.as_ref())?;
    let api: Api<Bundle> = Api::namespaced(ctx.client.clone(), &ns);
    let result = finalizer(&api, api::BUNDLE_FINALIZER, bundle, |event| async {
        match event {
            Finalizer::Apply(b) => apply(&b, &ctx).await,
            Finalizer::Cleanup(b) => cleanup(&b, &ctx).await,
        }
    })
    .await
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        other => Error::Finalizer(other.to_string()),
    });
    ctx.metrics
        .observe_reconcile("bundle", result.is_ok(), started.elapsed().as_secs_f64());
    result
}

/// What the mirror says about one job of one replica.
#[derive(Debug, Clone)]
struct Observed {
    job_id: String,
    state: proto::JobState,
    node_id: String,
    stop_reason: proto::StopReason,
    /// When the current normal instance started (ms since the epoch).
    started_at_ms: i64,
}

/// What a job needs now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// Running or on its way: nothing to do.
    Nothing,
    /// Being stopped: the replica waits until it has stopped before anything is placed.
    Wait,
    /// Never placed (or stopped on purpose): a first placement.
    Place,
    /// Failed or lost its node: band rules decide.
    Recover,
    /// A bronze job that failed and was dropped.
    Dropped,
}

fn observe(
    mirror: &manager_client::MirrorState,
    bundle_id: &str,
    replicas: u32,
    jobs: &[api::BundleJob],
) -> BTreeMap<(u32, String), Observed> {
    let mut out = BTreeMap::new();
    for r in 0..replicas {
        for j in jobs {
            let job_id = format!("{bundle_id}/{r}/{}", j.job_name);
            let observed = match mirror.jobs.get(&job_id) {
                Some(job) => {
                    let current = job
                        .instances
                        .iter()
                        .filter(|i| {
                            i.role == proto::JobRole::Normal as i32
                                || i.role == proto::JobRole::Unspecified as i32
                        })
                        .max_by_key(|i| i.started_at_ms);
                    Observed {
                        job_id,
                        state: proto::JobState::try_from(job.state)
                            .unwrap_or(proto::JobState::Pending),
                        node_id: job.node_id.clone(),
                        stop_reason: current
                            .and_then(|i| proto::StopReason::try_from(i.stop_reason).ok())
                            .unwrap_or(proto::StopReason::Unspecified),
                        started_at_ms: current.map_or(0, |i| i.started_at_ms),
                    }
                }
                None => Observed {
                    job_id,
                    state: proto::JobState::Pending,
                    node_id: String::new(),
                    stop_reason: proto::StopReason::Unspecified,
                    started_at_ms: 0,
                },
            };
            out.insert((r, j.job_name.clone()), observed);
        }
    }
    out
}

fn need(o: &Observed, dropped: bool) -> Need {
    use proto::JobState as S;
    match o.state {
        S::Running | S::Starting => Need::Nothing,
        S::Stopping => Need::Wait,
        S::Failed if dropped => Need::Dropped,
        S::Failed => Need::Recover,
        S::Stopped => match o.stop_reason {
            proto::StopReason::NodeLost | proto::StopReason::NodeTerminated if dropped => {
                Need::Dropped
            }
            proto::StopReason::NodeLost | proto::StopReason::NodeTerminated => Need::Recover,
            _ => Need::Place,
        },
        S::Pending | S::Unspecified => Need::Place,
    }
}

fn job_state(o: &Observed, need: Need) -> JobState {
    use proto::JobState as S;
    match (need, o.state) {
        (Need::Dropped, _) => JobState::Dropped,
        (_, S::Running) => JobState::Running,
        (_, S::Starting) => JobState::Starting,
        (_, S::Stopping) => JobState::Stopping,
        (_, S::Failed) => JobState::Failed,
        (_, S::Stopped) => JobState::Stopped,
        _ => JobState::Pending,
    }
}

/// The outcome of this reconcile for one replica, for status and requeue.
#[derive(Debug, Default)]
struct ReplicaOutcome {
    /// A placement decision made now: (summary per job, recovery?).
    decision: Option<(pl::Decision, bool)>,
    provisioning: bool,
    unplaceable: Option<String>,
    waiting: bool,
    /// Every job this pass placed was accepted by its worker.
    started: bool,
    /// "replica r on … in pool …", for the pass's one `Placed` Event.
    placed_note: Option<String>,
}

async fn apply(bundle: &Bundle, ctx: &Arc<Context>) -> Result<Action, Error> {
    let (ns, name) = ns_name(bundle)?;
    let bundle_id = mapping::bundle_id(&ns, &name);
    let generation = bundle.metadata.generation;
    let now = Utc::now();
    let prev = bundle.status.clone().unwrap_or_default();
    let spec = &bundle.spec;
    let replicas = u32::try_from(spec.replicas).unwrap_or(0);

    // Manager must be reachable: everything below reads the mirror or calls Manager.
    if !ctx.manager_ready() {
        let err = ctx.manager_unavailable();
        let mut status = prev.clone();
        mark(
            &mut status,
            generation,
            now,
            Marks::stalled("ManagerUnavailable", err.to_string()),
        );
        write_status(ctx, bundle, &prev, status).await?;
        return Ok(Action::requeue(Duration::from_secs(3)));
    }

    // Ids Manager would refuse: say so once instead of failing every pass.
    if let Some(message) = mapping::ids_too_long(&bundle_id, spec) {
        let mut status = prev.clone();
        status.phase = BundlePhase::Pending;
        mark(
            &mut status,
            generation,
            now,
            Marks::stalled("InvalidName", message.clone()),
        );
        if !is_condition(&prev, "Stalled", "InvalidName") {
            ctx.event(
                bundle,
                EventType::Warning,
                "InvalidBundle",
                "Validate",
                message,
            )
            .await;
        }
        write_status(ctx, bundle, &prev, status).await?;
        return Ok(Action::await_change());
    }

    // Static validation against the pools we know (pool references, capabilities, rules).
    let engine_bundle = mapping::bundle(&bundle_id, spec);
    let errors = {
        let model = ctx.model();
        pl::validate_bundle(&engine_bundle, &model.pools(), &[])
    };
    if !errors.is_empty() {
        // A pool whose object exists but is not loaded yet (operator start-up) is not an error.
        let pools: Api<api::PlacementPool> = Api::all(ctx.client.clone());
        for e in &errors {
            if let pl::ValidationError::UnknownPool { pool, .. } = e
                && pools.get_opt(pool).await?.is_some()
            {
                return Ok(Action::requeue(Duration::from_millis(500)));
            }
        }
        let message = api::bounded::join_bounded(
            &errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "; ",
            api::bounded::MAX_CONDITION_MESSAGE,
        );
        let mut status = prev.clone();
        status.phase = BundlePhase::Pending;
        mark(
            &mut status,
            generation,
            now,
            Marks::stalled("InvalidSpec", message.clone()),
        );
        if !is_condition(&prev, "Stalled", "InvalidSpec") {
            ctx.event(
                bundle,
                EventType::Warning,
                "InvalidBundle",
                "Validate",
                message,
            )
            .await;
        }
        write_status(ctx, bundle, &prev, status).await?;
        return Ok(Action::requeue(REQUEUE_STALLED));
    }

    // A retry annotation the operator has not acted on clears the ceiling and the drops.
    // Compared and recorded as its bounded marker, so any value (even one longer than
    // `status.lastRetry` may hold) is acted on exactly once.
    let retry = bundle
        .annotations()
        .get(api::RETRY_ANNOTATION)
        .map(|v| api::bounded::retry_marker(v));
    let retried = retry.is_some() && retry != prev.last_retry;
    if retried {
        ctx.ledger().forget_bundle(&bundle_id);
        ctx.dropped()
            .retain(|id, _| !id.starts_with(&format!("{bundle_id}/")));
        ctx.handed_to_recovery()
            .retain(|id, _| !id.starts_with(&format!("{bundle_id}/")));
        ctx.event(
            bundle,
            EventType::Normal,
            "Retry",
            "Retry",
            format!("retry requested ({})", retry.as_deref().unwrap_or_default()),
        )
        .await;
    } else if is_condition(&prev, "Broken", "RestartCeilingExceeded") {
        // Broken stays broken until the user asks again.
        let mut status = prev.clone();
        status.phase = BundlePhase::Broken;
        status.observed_generation = generation;
        api::kstatus::observe_generation(&mut status.conditions, generation);
        ctx.set_broken(&bundle_id, true);
        write_status(ctx, bundle, &prev, status).await?;
        return Ok(Action::await_change());
    }

    // Register (or update) the bundle in Manager; Manager expands it into one job per replica and name.
    let wanted = mapping::proto_bundle(&bundle_id, spec);
    let registered = ctx.manager.mirror().bundle(&bundle_id);
    if !registered
        .as_ref()
        .is_some_and(|r| mapping::registered_matches(r, &wanted))
    {
        ctx.manager.register_bundle(wanted).await?;
        // The mirror shows the new jobs a moment later; their absence reads as "not placed yet".
    }

    let mut observed = ctx
        .manager
        .mirror()
        .read(|m| observe(m, &bundle_id, replicas, &spec.jobs));
    let mut needs: BTreeMap<(u32, String), Need> = BTreeMap::new();
    {
        let dropped = ctx.dropped();
        let mut handed = ctx.handed_to_recovery();
        let model = ctx.model();
        for (k, o) in observed.iter_mut() {
            let is_dropped = dropped.contains_key(&o.job_id);
            let mut n = need(o, is_dropped);
            if handed.contains_key(&o.job_id) {
                match o.state {
                    // Handed over by a failed migration or a drain: its stop is a failure.
                    proto::JobState::Stopped if n == Need::Place => {
                        n = if is_dropped {
                            Need::Dropped
                        } else {
                            Need::Recover
                        };
                    }
                    // Running again: the recovery is done.
                    proto::JobState::Running | proto::JobState::Starting => {
                        handed.remove(&o.job_id);
                    }
                    _ => {}
                }
            }
            // Manager accepted a start the mirror does not show yet: never start it twice.
            let key = pl::JobKey {
                bundle_id: bundle_id.clone(),
                replica_index: k.0,
                job_name: k.1.clone(),
            };
            if matches!(n, Need::Place | Need::Recover)
                && let Some(node) = model.started_not_mirrored(&key)
            {
                n = Need::Nothing;
                o.node_id = node.to_owned();
                o.state = proto::JobState::Starting;
            }
            needs.insert(k.clone(), n);
        }
    }

    let mut outcomes: BTreeMap<u32, ReplicaOutcome> = BTreeMap::new();
    let mut broken: Option<String> = None;
    // Where replicas placed in this pass went: later replicas must see them (inter-replica rules)
    // before the mirror does.
    let mut decided: Vec<pl::Position> = Vec::new();
    for r in 0..replicas {
        let outcome = reconcile_replica(
            ctx,
            bundle,
            &bundle_id,
            &engine_bundle,
            r,
            &observed,
            &mut needs,
            now,
            &mut broken,
            &decided,
        )
        .await?;
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
        outcomes.insert(r, outcome);
        if broken.is_some() {
            break;
        }
    }

    // Observe again: starts made above show in the mirror within milliseconds, but status
    // is written from what is known now and corrected by the next mirror-triggered reconcile.
    let observed = ctx
        .manager
        .mirror()
        .read(|m| observe(m, &bundle_id, replicas, &spec.jobs));
    let status = build_status(
        ctx,
        bundle,
        &bundle_id,
        &prev,
        &observed,
        &needs,
        &outcomes,
        broken.as_deref(),
        retry,
        now,
    );
    let phase = status.phase;
    ctx.set_broken(&bundle_id, phase == BundlePhase::Broken);
    let placed: Vec<&str> = outcomes
        .values()
        .filter_map(|o| o.placed_note.as_deref())
        .collect();
    if !placed.is_empty() {
        ctx.event(
            bundle,
            EventType::Normal,
            "Placed",
            "Place",
            placed.join("; "),
        )
        .await;
    }
    if let Some(reason) = &broken {
        ctx.metrics.bundle_broken();
        ctx.event(
            bundle,
            EventType::Warning,
            "BundleBroken",
            "Recover",
            reason.clone(),
        )
        .await;
    }
    // Coalescing: while the only thing left is jobs that were just started (they run within
    // moments, and the mirror's change wakes us again), skip the intermediate "Placing" write so
    // a wave of starts is one settled write per bundle. A start that takes longer than
    // TRANSIENT_START is shown; the requeue is the safety net should no change come.
    let just_started = |o: &Observed| {
        o.state == proto::JobState::Running
            || (o.state == proto::JobState::Starting
                && now.timestamp_millis().saturating_sub(o.started_at_ms) < TRANSIENT_START_MS)
    };
    let transient = phase == BundlePhase::Placing
        && !retried
        && outcomes
            .values()
            .all(|o| o.unplaceable.is_none() && !o.provisioning && !o.waiting)
        && (observed.values().all(just_started) || outcomes.values().any(|o| o.started));
    if transient {
        return Ok(Action::requeue(Duration::from_millis(500)));
    }
    write_status(ctx, bundle, &prev, status).await?;
    Ok(match phase {
        BundlePhase::Ready => Action::requeue(REQUEUE_SETTLED),
        BundlePhase::Broken => Action::await_change(),
        _ if outcomes.values().any(|o| o.unplaceable.is_some()) => Action::requeue(REQUEUE_STALLED),
        _ => Action::requeue(REQUEUE_BUSY),
    })
}

#[allow(clippy::too_many_arguments)]
async fn reconcile_replica(
    ctx: &Arc<Context>,
    bundle: &Bundle,
    bundle_id: &str,
    engine_bundle: &pl::BundleSpec,
    r: u32,
    observed: &BTreeMap<(u32, String), Observed>,
    needs: &mut BTreeMap<(u32, String), Need>,
    now: DateTime<Utc>,
    broken: &mut Option<String>,
    decided_elsewhere: &[pl::Position],
) -> Result<ReplicaOutcome, Error> {
    let spec = &bundle.spec;
    let mut outcome = ReplicaOutcome::default();
    let replica_key = ReplicaKey::new(bundle_id, r);

    // Bronze (or any band configured to drop) jobs that failed are dropped, not restarted.
    for j in &spec.jobs {
        let k = (r, j.job_name.clone());
        if needs.get(&k) != Some(&Need::Recover) {
            continue;
        }
        let policy = ctx
            .settings
            .band(j.requirements.priority_band, spec.bands.as_ref());
        if policy.on_failure == api::OnFailure::Drop {
            if let Some(o) = observed.get(&k) {
                ctx.dropped().insert(o.job_id.clone(), now);
                ctx.metrics.job_dropped();
                ctx.event(
                    bundle,
                    EventType::Warning,
                    "JobDropped",
                    "Recover",
                    format!(
                        "{} ({} band) failed and was dropped, as its band says",
                        o.job_id,
                        j.requirements.priority_band.as_str()
                    ),
                )
                .await;
            }
            needs.insert(k, Need::Dropped);
        }
    }

    // A job of the replica is still stopping (a rolled-back start, say): place nothing yet.
    if spec
        .jobs
        .iter()
        .any(|j| needs.get(&(r, j.job_name.clone())) == Some(&Need::Wait))
    {
        outcome.waiting = true;
        return Ok(outcome);
    }
    let to_place: Vec<&api::BundleJob> = spec
        .jobs
        .iter()
        .filter(|j| {
            matches!(
                needs.get(&(r, j.job_name.clone())),
                Some(Need::Place | Need::Recover)
            )
        })
        .collect();
    let recovery = to_place
        .iter()
        .any(|j| needs.get(&(r, j.job_name.clone())) == Some(&Need::Recover));

    if to_place.is_empty() {
        // Settled: a replica that has run for a while has its restart count cleared.
        let all_running = spec.jobs.iter().all(|j| {
            observed
                .get(&(r, j.job_name.clone()))
                .is_some_and(|o| o.state == proto::JobState::Running)
        });
        if all_running {
            let newest = spec
                .jobs
                .iter()
                .filter_map(|j| observed.get(&(r, j.job_name.clone())))
                .map(|o| o.started_at_ms)
                .max()
                .unwrap_or(0);
            // `bands.<band>.restartClearAfter`; jobs of several bands wait for the longest.
            let clear_after = spec
                .jobs
                .iter()
                .map(|j| {
                    ctx.settings
                        .band(j.requirements.priority_band, spec.bands.as_ref())
                        .restart_clear_after
                })
                .max()
                .unwrap_or_default();
            let stable_ms = i64::try_from(clear_after.as_millis()).unwrap_or(i64::MAX);
            if now.timestamp_millis().saturating_sub(newest) >= stable_ms {
                ctx.ledger().clear(&replica_key);
            }
        }
        return Ok(outcome);
    }

    // The restart ceiling: more than maxRestartsPerHour restarts of a replica breaks the bundle.
    let max = to_place
        .iter()
        .map(|j| {
            ctx.settings
                .band(j.requirements.priority_band, spec.bands.as_ref())
                .max_restarts_per_hour
        })
        .min()
        .unwrap_or(6);
    if recovery {
        let count = ctx.ledger().count(&replica_key, now);
        if count >= max {
            *broken = Some(format!(
                "replica {r} failed again after {count} restarts in the last hour (maxRestartsPerHour {max}); no more retries until `kubectl annotate --overwrite bundle {} {}=<new value>`",
                bundle.name_any(),
                api::RETRY_ANNOTATION
            ));
            return Ok(outcome);
        }
    }

    // Positions of the replica's running jobs and of the other replicas' jobs.
    let zone_of = |node: &str| {
        ctx.manager.mirror().read(|m| {
            m.nodes.get(node).map(|n| {
                n.inventory
                    .as_ref()
                    .map(|i| i.zone.clone())
                    .filter(|z| !z.is_empty())
                    .unwrap_or_else(|| n.zone.clone())
            })
        })
    };
    let mut placed_siblings = Vec::new();
    let mut other_replicas = Vec::new();
    for ((rr, job_name), o) in observed {
        let holding =
            needs.get(&(*rr, job_name.clone())) == Some(&Need::Nothing) && !o.node_id.is_empty();
        if !holding {
            continue;
        }
        if *rr == r {
            placed_siblings.push(pl::SiblingPosition {
                job_name: job_name.clone(),
                node: o.node_id.clone(),
                zone: zone_of(&o.node_id),
            });
        } else {
            other_replicas.push(pl::Position {
                node: o.node_id.clone(),
                zone: zone_of(&o.node_id),
            });
        }
    }
    other_replicas.extend(decided_elsewhere.iter().cloned());
    let request = pl::PlacementRequest {
        bundle_id: bundle_id.to_owned(),
        replica_index: r,
        jobs: to_place.iter().map(|j| mapping::job(j)).collect(),
        pools: engine_bundle.pools_for_replica(r).to_vec(),
        kind: if recovery {
            pl::PlacementKind::Recovery
        } else {
            pl::PlacementKind::First
        },
        intra_replica: engine_bundle.intra_replica_placement,
        inter_replica: engine_bundle.inter_replica_placement,
        other_replicas,
        placed_siblings,
    };
    let job_ids: HashMap<String, String> = to_place
        .iter()
        .filter_map(|j| {
            observed
                .get(&(r, j.job_name.clone()))
                .map(|o| (j.job_name.clone(), o.job_id.clone()))
        })
        .collect();
    let keys: Vec<pl::JobKey> = to_place
        .iter()
        .map(|j| pl::JobKey {
            bundle_id: bundle_id.to_owned(),
            replica_index: r,
            job_name: j.job_name.clone(),
        })
        .collect();

    // Decide (and reserve) under the model lock; act after releasing it.
    let decision = ctx.manager.mirror().read(|mirror| {
        let mut model = ctx.model();
        for k in &keys {
            model.abandon(k, mirror); // a previous, unstarted reservation of these jobs
        }
        let decision = model.place(&request, now_ms(now));
        if decision.is_placed()
            && let Err(e) = model.commit(&decision, &job_ids) {
                tracing::warn!(bundle = %bundle_id, replica = r, error = %e, "could not reserve a placement");
            }
        decision
    });
    ctx.metrics.placement_attempted();
    ctx.traces()
        .entry((bundle.namespace().unwrap_or_default(), bundle.name_any()))
        .or_default()
        .insert(
            r,
            super::LastDecision {
                decision: decision.clone(),
                recovery,
                at: now,
            },
        );

    match &decision.outcome {
        pl::Outcome::Placed { pool, assignments } => {
            if assignments.iter().any(|a| a.node_pending) {
                // The chosen node is still starting: start the jobs once it is up.
                outcome.waiting = true;
                outcome.provisioning = true;
                outcome.decision = Some((decision.clone(), recovery));
                return Ok(outcome);
            }
            ctx.metrics.placement_succeeded();
            let mut all_started = true;
            let mut first_error: Option<manager_client::ClientError> = None;
            let mut started_now: Vec<(pl::JobKey, String)> = Vec::new();
            // Start every job of the replica at once; handle the answers in order.
            let starts = assignments.iter().filter_map(|a| {
                let job_id = job_ids.get(&a.job_name)?;
                Some(async move {
                    (
                        a,
                        job_id,
                        ctx.manager
                            .start_job(job_id, &a.node, proto::JobRole::Normal)
                            .await,
                    )
                })
            });
            for (a, job_id, answer) in futures::future::join_all(starts).await {
                let key = pl::JobKey {
                    bundle_id: bundle_id.to_owned(),
                    replica_index: r,
                    job_name: a.job_name.clone(),
                };
                match answer {
                    Ok(job) => {
                        ctx.manager
                            .mirror()
                            .read(|m| ctx.model().start_answered(&key, job.updated_at_ms, m));
                        started_now.push((key, job_id.clone()));
                    }
                    Err(manager_client::ClientError::Rejected {
                        reason, message, ..
                    }) => {
                        all_started = false;
                        ctx.manager.mirror().read(|m| ctx.model().abandon(&key, m));
                        ctx.metrics.job_rejected();
                        let change = ctx.health().record_rejection(&a.node, Utc::now());
                        if change == automanager_policy::node_health::HealthChange::BecameUnhealthy
                        {
                            let overlay = mapping::NodeOverlay {
                                unhealthy: true,
                                ..ctx.model().overlay(&a.node)
                            };
                            ctx.manager
                                .mirror()
                                .read(|m| ctx.model().set_overlay(&a.node, overlay, m));
                            tracing::warn!(node = %a.node, "node marked unhealthy: too many rejected starts");
                        }
                        ctx.event(
                            bundle,
                            EventType::Warning,
                            "JobRejected",
                            "Start",
                            format!("node {} refused {job_id}: {reason:?} {message}", a.node),
                        )
                        .await;
                    }
                    Err(e) => {
                        ctx.manager.mirror().read(|m| ctx.model().abandon(&key, m));
                        first_error.get_or_insert(e);
                    }
                }
            }
            if !all_started || first_error.is_some() {
                // A replica is placed whole or not at all: stop what did start, so the next pass
                // places the replica again as a unit instead of pinning the rest to a node that
                // just refused part of it.
                for (key, job_id) in &started_now {
                    if let Err(e) = ctx.manager.stop_job(job_id, proto::JobRole::Normal).await {
                        tracing::warn!(job = %job_id, error = %e, "could not roll back a partial replica start");
                    }
                    ctx.manager.mirror().read(|m| ctx.model().abandon(key, m));
                }
            }
            if let Some(e) = first_error {
                return Err(e.into());
            }
            if all_started {
                outcome.started = true;
                if recovery {
                    ctx.ledger().record_restart(&replica_key, now, max);
                }
                let mut nodes: Vec<&str> = assignments.iter().map(|a| a.node.as_str()).collect();
                nodes.dedup();
                let note = format!("replica {r} on {} in pool {pool}", nodes.join(", "));
                if recovery {
                    ctx.event(bundle, EventType::Normal, "Restarted", "Place", note)
                        .await;
                } else {
                    // First placements of one pass are told in one Event (see `apply`).
                    outcome.placed_note = Some(note);
                }
                let first_choice = engine_bundle.pools_for_replica(r).first();
                if first_choice.is_some_and(|p| p != pool) {
                    ctx.event(
                        bundle,
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
                        bundle,
                        EventType::Warning,
                        "SoftRuleBroken",
                        "Place",
                        format!("replica {r}: soft rules not honoured: {}", rules.join(", ")),
                    )
                    .await;
                }
            } else {
                outcome.waiting = true;
            }
            outcome.decision = Some((decision, recovery));
        }
        pl::Outcome::Provision {
            pool,
            instance_type,
            zone,
        } => {
            ctx.metrics.placement_succeeded();
            outcome.provisioning = true;
            outcome.waiting = true;
            provision(
                ctx,
                bundle,
                bundle_id,
                r,
                pool,
                instance_type,
                zone.as_deref(),
            )
            .await?;
            outcome.decision = Some((decision, recovery));
        }
        pl::Outcome::Unplaceable { jobs } => {
            ctx.metrics.placement_failed();
            let reasons: Vec<String> = jobs
                .iter()
                .map(|j| format!("{}: {}", j.job_name, j.reason))
                .collect();
            let message = format!("replica {r} cannot be placed: {}", reasons.join("; "));
            outcome.unplaceable = Some(message);
            outcome.decision = Some((decision, recovery));
        }
    }
    Ok(outcome)
}

/// Asks Manager for a node in an elastic pool, unless one asked for this replica is still starting.
#[allow(clippy::too_many_arguments)]
async fn provision(
    ctx: &Arc<Context>,
    bundle: &Bundle,
    bundle_id: &str,
    r: u32,
    pool: &str,
    instance_type: &str,
    zone: Option<&str>,
) -> Result<(), Error> {
    let tag = format!("{bundle_id}.r{r}");
    let Some(node) = super::request_node(ctx, pool, instance_type, zone, tag).await? else {
        return Ok(());
    };
    ctx.event(
        bundle,
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

/// The bundle's kstatus standing, set in one go (see `automanager_api::kstatus`).
struct Marks {
    standing: api::Standing,
    reason: &'static str,
    message: String,
}

impl Marks {
    fn stalled(reason: &'static str, message: String) -> Self {
        Marks {
            standing: api::Standing::Stalled,
            reason,
            message,
        }
    }
}

fn mark(status: &mut BundleStatus, generation: Option<i64>, now: DateTime<Utc>, marks: Marks) {
    status.observed_generation = generation;
    api::set_standing(
        &mut status.conditions,
        marks.standing,
        marks.reason,
        marks.message,
        generation,
        now,
    );
}

fn is_condition(status: &BundleStatus, type_: &str, reason: &str) -> bool {
    api::find_condition(&status.conditions, type_)
        .is_some_and(|c| c.is_true() && c.reason == reason)
}

#[allow(clippy::too_many_arguments)]
fn build_status(
    ctx: &Arc<Context>,
    bundle: &Bundle,
    bundle_id: &str,
    prev: &BundleStatus,
    observed: &BTreeMap<(u32, String), Observed>,
    needs: &BTreeMap<(u32, String), Need>,
    outcomes: &BTreeMap<u32, ReplicaOutcome>,
    broken: Option<&str>,
    retry: Option<String>,
    now: DateTime<Utc>,
) -> BundleStatus {
    let spec = &bundle.spec;
    let generation = bundle.metadata.generation;
    let replicas = u32::try_from(spec.replicas).unwrap_or(0);
    let prev_job = |r: u32, name: &str| -> Option<&JobStatus> {
        prev.replicas
            .iter()
            .find(|x| x.replica == r as i32)
            .and_then(|x| x.jobs.iter().find(|j| j.job_name == name))
    };
    let remembered: BTreeMap<u32, super::LastDecision> = ctx
        .traces()
        .get(&(bundle.namespace().unwrap_or_default(), bundle.name_any()))
        .cloned()
        .unwrap_or_default();
    let mut status = BundleStatus {
        last_retry: retry.or_else(|| prev.last_retry.clone()),
        conditions: prev.conditions.clone(),
        ..Default::default()
    };
    let (mut running_replicas, mut any_unplaceable, mut any_busy, mut any_dropped, mut any_running) =
        (0, false, false, false, false);
    for r in 0..replicas {
        let outcome = outcomes.get(&r);
        let restarts = ctx.ledger().count(&ReplicaKey::new(bundle_id, r), now);
        let mut rs = ReplicaStatus {
            replica: r as i32,
            restarts_last_hour: restarts as i32,
            jobs: Vec::new(),
        };
        let mut replica_running = true;
        for j in &spec.jobs {
            let k = (r, j.job_name.clone());
            let Some(o) = observed.get(&k) else { continue };
            let n = needs.get(&k).copied().unwrap_or(Need::Place);
            let mut state = job_state(o, n);
            let decision = outcome.and_then(|x| x.decision.as_ref());
            if matches!(
                state,
                JobState::Pending | JobState::Failed | JobState::Stopped
            ) {
                if outcome.is_some_and(|x| x.unplaceable.is_some()) {
                    state = JobState::Unplaceable;
                } else if outcome.is_some_and(|x| x.provisioning) {
                    state = JobState::Provisioning;
                }
            }
            let previous = prev_job(r, &j.job_name).and_then(|p| p.last_placement.clone());
            let last_placement = match decision {
                Some((d, recovery)) if d.trace_touches(&j.job_name) => {
                    let node = d.node_for(&j.job_name);
                    Some(mapping::trace_summary(&d.summary(), *recovery, now, node))
                }
                // A decision made in a pass whose status write was coalesced.
                _ => match remembered.get(&r) {
                    Some(last)
                        if last.decision.trace_touches(&j.job_name)
                            && previous.as_ref().is_none_or(|p| p.decided_at < last.at) =>
                    {
                        let node = last.decision.node_for(&j.job_name);
                        Some(mapping::trace_summary(
                            &last.decision.summary(),
                            last.recovery,
                            last.at,
                            node,
                        ))
                    }
                    _ => previous,
                },
            };
            let (pool, zone) = ctx.manager.mirror().read(|m| {
                m.nodes
                    .get(&o.node_id)
                    .map(|n| {
                        (
                            Some(n.pool.clone()),
                            Some(
                                n.inventory
                                    .as_ref()
                                    .map(|i| i.zone.clone())
                                    .filter(|z| !z.is_empty())
                                    .unwrap_or_else(|| n.zone.clone()),
                            ),
                        )
                    })
                    .unwrap_or((None, None))
            });
            let holds = matches!(
                state,
                JobState::Running | JobState::Starting | JobState::Stopping
            );
            replica_running &= state == JobState::Running;
            any_running |= state == JobState::Running;
            any_dropped |= state == JobState::Dropped;
            any_unplaceable |= state == JobState::Unplaceable;
            any_busy |= matches!(
                state,
                JobState::Pending
                    | JobState::Provisioning
                    | JobState::Starting
                    | JobState::Stopping
                    | JobState::Failed
                    | JobState::Stopped
            );
            rs.jobs.push(JobStatus {
                job_name: j.job_name.clone(),
                job_id: Some(o.job_id.clone()),
                node_id: (!o.node_id.is_empty() && holds).then(|| o.node_id.clone()),
                pool: pool.filter(|p| !p.is_empty() && holds),
                zone: zone.filter(|z| !z.is_empty() && holds),
                state,
                restarts_last_hour: restarts as i32,
                last_placement,
            });
        }
        if replica_running && !rs.jobs.is_empty() {
            running_replicas += 1;
        }
        status.replicas.push(rs);
    }
    status.placed_replicas = running_replicas;
    let unplaceable_msgs: Vec<&str> = outcomes
        .values()
        .filter_map(|o| o.unplaceable.as_deref())
        .collect();
    status.phase = if broken.is_some() {
        BundlePhase::Broken
    } else if running_replicas == spec.replicas && !any_dropped {
        BundlePhase::Ready
    } else if any_busy && !any_unplaceable {
        BundlePhase::Placing
    } else if any_running || any_dropped {
        BundlePhase::Degraded
    } else if any_unplaceable {
        BundlePhase::Pending
    } else {
        BundlePhase::Placing
    };
    let no_capacity =
        api::bounded::join_bounded(&unplaceable_msgs, "; ", api::bounded::MAX_CONDITION_MESSAGE);
    let marks = match status.phase {
        BundlePhase::Ready => Marks {
            standing: api::Standing::Ready,
            reason: "AllReplicasRunning",
            message: format!("{running_replicas} of {} replicas running", spec.replicas),
        },
        BundlePhase::Broken => Marks::stalled(
            "RestartCeilingExceeded",
            broken.unwrap_or_default().to_owned(),
        ),
        // Some job fits nowhere: the bundle cannot get to Ready until capacity or the spec
        // changes, even if other jobs are still being placed.
        _ if !unplaceable_msgs.is_empty() => {
            Marks::stalled("NoCapacity", no_capacity)
        }
        // Dropped jobs stay down until a retry or a spec change.
        BundlePhase::Degraded => Marks::stalled(
            "JobsDropped",
            "some jobs were dropped after failing (bronze band); retry with the automanager.norsk.io/retry annotation".into(),
        ),
        _ => {
            let reason = if outcomes.values().any(|o| o.provisioning) {
                "Provisioning"
            } else {
                "Placing"
            };
            Marks {
                standing: api::Standing::Reconciling,
                reason,
                message: format!("{running_replicas} of {} replicas running", spec.replicas),
            }
        }
    };
    mark(&mut status, generation, now, marks);
    let broken_cond = match broken {
        Some(msg) => condition(
            "Broken",
            true,
            "RestartCeilingExceeded",
            msg,
            generation,
            now,
        ),
        None => condition("Broken", false, "WithinRestartCeiling", "", generation, now),
    };
    api::set_condition(&mut status.conditions, broken_cond);
    status
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
    super::apply_status(
        &Api::<Bundle>::namespaced(ctx.client.clone(), &ns),
        &name,
        &status,
    )
    .await
}

/// Deletion: stop the bundle's jobs and unregister it before the finalizer goes.
async fn cleanup(bundle: &Bundle, ctx: &Arc<Context>) -> Result<Action, Error> {
    let (ns, name) = ns_name(bundle)?;
    let bundle_id = mapping::bundle_id(&ns, &name);
    if !ctx.manager_ready() {
        let err = ctx.manager_unavailable();
        let prev = bundle.status.clone().unwrap_or_default();
        let mut status = prev.clone();
        status.phase = BundlePhase::Deleting;
        mark(
            &mut status,
            bundle.metadata.generation,
            Utc::now(),
            Marks::stalled(
                "ManagerUnavailable",
                format!("waiting for Manager to stop this bundle's jobs before deletion: {err}"),
            ),
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
    ctx.manager
        .mirror()
        .read(|m| ctx.model().forget_bundle(&bundle_id, m));
    ctx.ledger().forget_bundle(&bundle_id);
    ctx.dropped()
        .retain(|id, _| !id.starts_with(&format!("{bundle_id}/")));
    ctx.handed_to_recovery()
        .retain(|id, _| !id.starts_with(&format!("{bundle_id}/")));
    ctx.traces().remove(&(ns, name));
    ctx.set_broken(&bundle_id, false);
    Ok(Action::await_change())
}

/// Error policy: log, count, retry with a delay suited to the error.
pub fn error_policy(bundle: Arc<Bundle>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(bundle = %bundle.name_any(), namespace = ?bundle.namespace(), error = %error, kind = error.metric_label(), "bundle reconcile failed");
    Action::requeue(super::backoff_for(error))
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

    fn obs(state: proto::JobState, reason: proto::StopReason) -> Observed {
        Observed {
            job_id: "ns.b/0/j".into(),
            state,
            node_id: "n1".into(),
            stop_reason: reason,
            started_at_ms: 0,
        }
    }

    fn mirror_with(
        node_state: proto::NodeState,
        job_on_it: Option<proto::JobState>,
    ) -> manager_client::MirrorState {
        let mut m = manager_client::MirrorState::default();
        let node = proto::Node {
            node_id: "gold-7".into(),
            state: node_state as i32,
            tags: [(
                mapping::PROVISIONED_FOR_TAG.to_owned(),
                "ns.b.r0".to_owned(),
            )]
            .into_iter()
            .collect(),
            ..Default::default()
        };
        m.nodes.insert(node.node_id.clone(), node);
        if let Some(state) = job_on_it {
            let job = proto::Job {
                job_id: "ns.other/0/enc".into(),
                state: state as i32,
                node_id: "gold-7".into(),
                instances: vec![proto::JobInstance {
                    node_id: "gold-7".into(),
                    state: state as i32,
                    ..Default::default()
                }],
                ..Default::default()
            };
            m.jobs.insert(job.job_id.clone(), job);
        }
        m
    }

    #[test]
    fn a_node_asked_for_a_replica_is_awaited_until_someone_else_takes_it() {
        use proto::{JobState as J, NodeState as N};
        assert!(crate::controllers::provision_in_flight(
            &mirror_with(N::Starting, None),
            "ns.b.r0"
        ));
        assert!(crate::controllers::provision_in_flight(
            &mirror_with(N::Started, None),
            "ns.b.r0"
        ));
        assert!(!crate::controllers::provision_in_flight(
            &mirror_with(N::Started, Some(J::Running)),
            "ns.b.r0"
        ));
        assert!(!crate::controllers::provision_in_flight(
            &mirror_with(N::Started, Some(J::Starting)),
            "ns.b.r0"
        ));
        assert!(crate::controllers::provision_in_flight(
            &mirror_with(N::Started, Some(J::Failed)),
            "ns.b.r0"
        ));
        assert!(!crate::controllers::provision_in_flight(
            &mirror_with(N::Terminated, None),
            "ns.b.r0"
        ));
        assert!(!crate::controllers::provision_in_flight(
            &mirror_with(N::Starting, None),
            "ns.c.r0"
        ));
    }

    #[test]
    fn a_failed_job_needs_recovery_and_a_dropped_one_stays_down() {
        assert_eq!(
            need(
                &obs(proto::JobState::Failed, proto::StopReason::Unspecified),
                false
            ),
            Need::Recover
        );
        assert_eq!(
            need(
                &obs(proto::JobState::Failed, proto::StopReason::Unspecified),
                true
            ),
            Need::Dropped
        );
    }

    #[test]
    fn losing_the_node_is_a_failure_but_a_requested_stop_is_not() {
        assert_eq!(
            need(
                &obs(proto::JobState::Stopped, proto::StopReason::NodeLost),
                false
            ),
            Need::Recover
        );
        assert_eq!(
            need(
                &obs(proto::JobState::Stopped, proto::StopReason::NodeTerminated),
                false
            ),
            Need::Recover
        );
        assert_eq!(
            need(
                &obs(proto::JobState::Stopped, proto::StopReason::Requested),
                false
            ),
            Need::Place
        );
    }

    #[test]
    fn a_stopping_job_makes_its_replica_wait() {
        assert_eq!(
            need(
                &obs(proto::JobState::Stopping, proto::StopReason::Requested),
                false
            ),
            Need::Wait
        );
    }

    #[test]
    fn running_and_starting_jobs_need_nothing() {
        for s in [proto::JobState::Running, proto::JobState::Starting] {
            assert_eq!(
                need(&obs(s, proto::StopReason::Unspecified), false),
                Need::Nothing
            );
        }
        assert_eq!(
            need(
                &obs(proto::JobState::Pending, proto::StopReason::Unspecified),
                false
            ),
            Need::Place
        );
    }
}
