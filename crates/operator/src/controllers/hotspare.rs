//! The HotSpareTarget controller: keeps a pool's warm, empty nodes at target.
//!
//! Observe the pool's spare-tagged nodes in the mirror; decide with the pure planner
//! (`automanager_policy::spares`); act (CreateNode with `spare=true`, TerminateNode of the oldest excess or of
//! an aged spare once its replacement is up); record status, the `SpareUnderflow` condition and a
//! Warning Event (the TypeScript library's `onSpareUnderflow(pool, current, target)`). Mirror node changes wake
//! every target at once, so a spare that takes a job is replaced without waiting for a poll.

use std::sync::Arc;
use std::time::Duration;

use automanager_api::{self as api, HotSpareTarget, HotSpareTargetStatus, PlacementPool};
use chrono::{TimeZone, Utc};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use manager_proto as proto;

use super::{Context, Error, condition};
use crate::mapping;
use automanager_policy::calendar::Recurrence;
use automanager_policy::spares::{self, RotationStep, SpareNode, SpareState};
use automanager_policy::tiers;

/// Rotation and figures are looked at least this often.
const REFRESH: Duration = Duration::from_secs(30);
/// A node asked for counts as pending this long even before the mirror shows it.
const CREATED_GRACE: Duration = Duration::from_secs(30);
/// A warm spare a recovery started is the recovery's this long (a start takes tens of seconds
/// on a cloud, then the recovery places onto it).
const CLAIM_GRACE: Duration = Duration::from_secs(180);

/// Reconciles one HotSpareTarget, inside its cleanup finalizer: a deleted target terminates
/// the spares it provisioned that hold no job (a spare that took a job is a working node now).
pub async fn reconcile(target: Arc<HotSpareTarget>, ctx: Arc<Context>) -> Result<Action, Error> {
    if !ctx.settings.owns_cluster_scope {
        // Spares are provisioned and reported by the operator that owns the cluster scope.
        return Ok(Action::await_change());
    }
    let api: Api<HotSpareTarget> = Api::all(ctx.client.clone());
    super::reconcile_finalized(
        "hotsparetarget",
        &ctx,
        api,
        api::SPARE_TARGET_FINALIZER,
        target,
        |t| {
            let ctx = &ctx;
            async move { apply(&t, ctx).await }
        },
        |t| {
            let ctx = &ctx;
            async move { cleanup(&t, ctx).await }
        },
    )
    .await
}

/// Deletion: terminate this target's spares that hold no job, then let the object go.
async fn cleanup(target: &HotSpareTarget, ctx: &Arc<Context>) -> Result<Action, Error> {
    let name = target.name_any();
    // A pool waiting to be deleted no longer counts this target as a user.
    ctx.wake_pool_controller(&target.spec.pool);
    ctx.state()
        .wake_mut()
        .set_spare_target(&kube::runtime::reflector::ObjectRef::from(target), None);
    ctx.state().provisioning_mut().forget_spares(&name);
    if !ctx.manager_ready() {
        return Err(ctx.manager_unavailable());
    }
    let idle: Vec<String> = ctx.manager.mirror().read(|m| {
        m.nodes
            .values()
            .filter(|n| {
                n.pool == target.spec.pool
                    && n.tags.get(mapping::SPARE_TARGET_TAG).map(String::as_str)
                        == Some(name.as_str())
                    && matches!(
                        proto::NodeState::try_from(n.state),
                        Ok(proto::NodeState::Starting
                            | proto::NodeState::Started
                            | proto::NodeState::PoweringOff
                            | proto::NodeState::PoweredOff)
                    )
                    && m.node_usage(&n.node_id) == (0.0, 0)
            })
            .map(|n| n.node_id.clone())
            .collect()
    });
    for node in &idle {
        match ctx.manager.terminate_node(node).await {
            Ok(_) => {}
            Err(e) if super::is_final_answer(&e) => {}
            Err(e) => return Err(e.into()),
        }
    }
    if !idle.is_empty() {
        tracing::info!(target = %name, spares = idle.len(), "deleted HotSpareTarget: its idle spares terminated");
    }
    Ok(Action::await_change())
}

fn spare_node(n: &proto::Node, holds_jobs: bool) -> SpareNode {
    let state = match proto::NodeState::try_from(n.state) {
        Ok(proto::NodeState::Started) => SpareState::Started,
        Ok(proto::NodeState::Stopped) => SpareState::Stopped,
        Ok(proto::NodeState::PoweringOff) => SpareState::Stopping,
        Ok(proto::NodeState::PoweredOff) => SpareState::PoweredOff,
        Ok(proto::NodeState::Terminated) => SpareState::Terminated,
        _ => SpareState::Starting,
    };
    SpareNode {
        node_id: n.node_id.clone(),
        state,
        created_at: Utc
            .timestamp_millis_opt(n.created_at_ms)
            .single()
            .unwrap_or_default(),
        band: n
            .tags
            .get(mapping::SPARE_BAND_TAG)
            .and_then(|b| mapping::parse_band(b)),
        holds_jobs,
        target_name: n.tags.get(mapping::SPARE_TARGET_TAG).cloned(),
        zone: n.zone.clone(),
    }
}

async fn apply(target: &HotSpareTarget, ctx: &Arc<Context>) -> Result<Action, Error> {
    let name = target.name_any();
    ctx.state().wake_mut().set_spare_target(
        &kube::runtime::reflector::ObjectRef::from(target),
        Some(&target.spec.pool),
    );
    let generation = target.metadata.generation;
    let now = ctx.clock.now();
    let prev = target.status.clone().unwrap_or_default();
    let spec = &target.spec;
    let mut status = HotSpareTargetStatus {
        observed_generation: generation,
        target_count: spec.target_count,
        conditions: prev.conditions.clone(),
        ..prev.clone()
    };

    // A name no object can have goes into no request: the apiserver would never be asked.
    if crate::config::checks::dns_subdomain(&spec.pool).is_err() {
        api::set_standing(
            &mut status.conditions,
            api::Standing::Stalled,
            "UnknownPool",
            format!(
                "{:?} is not a PlacementPool name (lowercase letters, digits, '-' and '.')",
                spec.pool
            ),
            generation,
            now,
        );
        write_status(ctx, target, &prev, status).await?;
        return Ok(Action::await_change());
    }
    let pools: Api<PlacementPool> = Api::all(ctx.client.clone());
    let Some(pool) = pools.get_opt(&spec.pool).await? else {
        api::set_standing(
            &mut status.conditions,
            api::Standing::Stalled,
            "UnknownPool",
            format!("PlacementPool {} does not exist", spec.pool),
            generation,
            now,
        );
        write_status(ctx, target, &prev, status).await?;
        return Ok(Action::requeue(REFRESH));
    };
    // An instance type the pool does not list is one Manager would refuse on every ask.
    let types = &pool.spec.candidate_instance_types;
    if !types.is_empty()
        && !types
            .iter()
            .any(|t| t.instance_type == spec.spec.instance_type)
    {
        let known: Vec<&str> = types.iter().map(|t| t.instance_type.as_str()).collect();
        api::set_standing(
            &mut status.conditions,
            api::Standing::Stalled,
            "UnknownInstanceType",
            format!(
                "pool {} has no instance type {:?} (known: {})",
                spec.pool,
                spec.spec.instance_type,
                known.join(", ")
            ),
            generation,
            now,
        );
        write_status(ctx, target, &prev, status).await?;
        return Ok(Action::await_change());
    }
    if !ctx.manager_ready() {
        let err = ctx.manager_unavailable();
        api::set_standing(
            &mut status.conditions,
            api::Standing::Stalled,
            "ManagerUnavailable",
            err.to_string(),
            generation,
            now,
        );
        write_status(ctx, target, &prev, status).await?;
        return Ok(Action::requeue(Duration::from_secs(3)));
    }

    // The pool's spare-tagged nodes, plus nodes just asked for that the mirror does not show yet.
    // A warm spare a recovery started counts as taken until the recovery had time to use it.
    let mut nodes: Vec<SpareNode> = ctx.manager.mirror().read(|m| {
        m.nodes
            .values()
            .filter(|n| n.pool == spec.pool && mapping::spare_of(n).0)
            .map(|n| {
                let (capacity, cores) = m.node_usage(&n.node_id);
                let claimed = ctx.state().provisioning_mut().is_claimed(
                    &n.node_id,
                    ctx.clock.instant(),
                    CLAIM_GRACE,
                );
                spare_node(n, capacity > 0.0 || cores > 0 || claimed)
            })
            .collect()
    });
    let asked = ctx.state().provisioning_mut().spares_not_shown(
        &name,
        ctx.clock.instant(),
        CREATED_GRACE,
        |id| nodes.iter().any(|s| s.node_id == id),
    );
    nodes.extend(asked.iter().map(|n| spare_node(n, false)));

    // The brake: spares count against the pool's maxNodes like any node, and the pool's
    // request rate bounds how many are asked for at once.
    let max_nodes = pool.spec.max_nodes.map(|m| u32::try_from(m).unwrap_or(0));
    // A stopped node is still the pool's: it counts under maxNodes until it is terminated.
    let pool_nodes = ctx.manager.mirror().read(|m| {
        m.nodes
            .values()
            .filter(|n| {
                n.pool == spec.pool
                    && matches!(
                        proto::NodeState::try_from(n.state),
                        Ok(proto::NodeState::Starting
                            | proto::NodeState::Started
                            | proto::NodeState::PoweringOff
                            | proto::NodeState::PoweredOff)
                    )
            })
            .count()
    }) + nodes
        .iter()
        .filter(|n| {
            n.state == SpareState::Starting
                && !ctx
                    .manager
                    .mirror()
                    .read(|m| m.nodes.contains_key(&n.node_id))
        })
        .count();
    let room = automanager_policy::provision_budget::room_under_max_nodes(
        max_nodes,
        u32::try_from(pool_nodes).unwrap_or(u32::MAX),
    );
    let allowance = ctx.state().provisioning_mut().allowance(&spec.pool, now);
    let wanted = mapping::spare_target(spec);
    let degraded_zones: std::collections::BTreeSet<String> = ctx
        .state()
        .provisioning()
        .zone_brake()
        .degraded_in(&spec.pool)
        .into_iter()
        .map(|d| d.zone.clone())
        .collect();
    let bounds = tiers::TierBounds {
        max_nodes,
        room,
        allowance,
        all_zones_degraded: !pool.spec.zones.is_empty()
            && pool.spec.zones.iter().all(|z| degraded_zones.contains(z)),
        degraded_zones,
    };
    let sizes = match tier_sizes(ctx, target, &nodes, now).await {
        Ok(sizes) => sizes,
        Err(message) => {
            api::set_standing(
                &mut status.conditions,
                api::Standing::Stalled,
                "InvalidSpec",
                message,
                generation,
                now,
            );
            write_status(ctx, target, &prev, status).await?;
            return Ok(Action::await_change());
        }
    };
    let plan = match tiers::plan_tiers(tiers::TierInput {
        target_name: &name,
        spec: &wanted,
        hot: sizes.hot,
        warm: sizes.warm,
        pool: tiers::PoolTraits {
            scale_out: pool.spec.scale_out,
            can_stop: pool.spec.kind != api::PoolKind::Cluster,
        },
        nodes: &nodes,
        now,
        // No window governs spare rotation of a pool's spares yet: a spare holds no bundle's job.
        rotation_allowed: true,
        bounds: &bounds,
    }) {
        Ok(p) => p,
        Err(e) => {
            api::set_standing(
                &mut status.conditions,
                api::Standing::Stalled,
                "InvalidSpec",
                e.to_string(),
                generation,
                now,
            );
            write_status(ctx, target, &prev, status).await?;
            return Ok(Action::await_change());
        }
    };
    status.target_count = i32::try_from(plan.hot.target).unwrap_or(i32::MAX);
    status.warm_target = i32::try_from(plan.warm.target).unwrap_or(i32::MAX);
    status.active_schedules = sizes
        .active
        .iter()
        .filter_map(|i| spec.schedules.get(*i).map(|s| s.schedule.clone()))
        .collect();
    status.next_schedule_change = sizes.next_change;

    // Act: provision first, so a rotation or a taken spare never leaves the pool short for longer.
    let req = spares::spare_provision_request(&name, &wanted);
    for _ in 0..plan.creates() {
        if !ctx.state().provisioning_mut().take_request(&spec.pool, now) {
            break;
        }
        let create = proto::CreateNodeRequest {
            pool: req.pool.clone(),
            provider: mapping::provider(pool.spec.kind) as i32,
            region: req.region.clone(),
            instance_type: req.instance_type.clone(),
            zone: String::new(),
            tags: req.tags.iter().cloned().collect(),
            request_id: String::new(),
        };
        let node = match super::create_node(ctx, &format!("hotspare/{name}"), create).await {
            Ok(node) => node,
            // Manager's refusal is final for this spec: say so where the person looks.
            Err(Error::Manager(e)) if super::is_final_answer(&e) => {
                let message = format!("Manager refused to provision a spare: {e}");
                if !api::find_condition(&prev.conditions, "Stalled")
                    .is_some_and(|c| c.is_true() && c.reason == "ProvisioningRefused")
                {
                    ctx.event(
                        target,
                        EventType::Warning,
                        "ProvisioningRefused",
                        "Provision",
                        message.clone(),
                    )
                    .await;
                }
                api::set_standing(
                    &mut status.conditions,
                    api::Standing::Stalled,
                    "ProvisioningRefused",
                    message,
                    generation,
                    now,
                );
                write_status(ctx, target, &prev, status).await?;
                return Ok(Action::requeue(REFRESH));
            }
            Err(e) => return Err(e),
        };
        {
            let mut state = ctx.state();
            state.model_mut().add_provisioned(&node);
            state
                .provisioning_mut()
                .spare_asked(&name, node.clone(), ctx.clock.instant());
        }
        ctx.event(
            target,
            EventType::Normal,
            "ProvisioningSpare",
            "Provision",
            format!(
                "asked for spare {} ({}) in pool {}",
                node.node_id, req.instance_type, spec.pool
            ),
        )
        .await;
    }
    for node in &plan.start {
        match ctx.manager.start_node(node).await {
            Ok(_) => {
                ctx.event(
                    target,
                    EventType::Normal,
                    "StartingWarmSpare",
                    "Start",
                    format!("warm spare {node} started to refill the hot tier"),
                )
                .await
            }
            Err(e) if super::is_final_answer(&e) => {
                tracing::info!(target = %name, node = %node, error = %e, "warm spare not started")
            }
            Err(e) => return Err(e.into()),
        }
    }
    for node in &plan.stop {
        match ctx.manager.stop_node(node).await {
            Ok(_) => {
                ctx.event(
                    target,
                    EventType::Normal,
                    "StoppingSpare",
                    "Stop",
                    format!("spare {node} stopped to refill the warm tier"),
                )
                .await
            }
            // A recovery placed a job there since the plan looked: it stays a working node.
            Err(e) if super::is_final_answer(&e) => {
                tracing::info!(target = %name, node = %node, error = %e, "spare not stopped")
            }
            Err(e) => return Err(e.into()),
        }
    }
    let mut blocked: Option<String> = None;
    for node in &plan.terminate {
        if !may_terminate(ctx, target, node, &mut blocked).await? {
            continue;
        }
        ctx.manager.terminate_node(node).await?;
        ctx.event(
            target,
            EventType::Normal,
            "TerminatedExcessSpare",
            "Terminate",
            format!(
                "spare {node} terminated: pool {} is over target {}",
                spec.pool, plan.hot.target
            ),
        )
        .await;
    }
    if let Some(RotationStep::RetireAged { aged }) = &plan.rotate
        && may_terminate(ctx, target, aged, &mut blocked).await?
    {
        ctx.manager.terminate_node(aged).await?;
        status.last_rotation = Some(now);
        ctx.event(
            target,
            EventType::Normal,
            "RotatedSpare",
            "Rotate",
            format!("spare {aged} is older than maxAge and its replacement is up: terminated"),
        )
        .await;
    }

    // Record.
    super::disruption::set_blocked_condition(&mut status.conditions, blocked, generation, now);
    status.live_spares = i32::try_from(plan.hot.ready).unwrap_or(i32::MAX);
    status.pending_spares = i32::try_from(plan.hot.pending).unwrap_or(i32::MAX);
    status.warm_spares = i32::try_from(plan.warm.ready).unwrap_or(i32::MAX);
    status.pending_warm_spares = i32::try_from(plan.warm.pending).unwrap_or(i32::MAX);
    set_warm_condition(&mut status.conditions, &plan, &spec.pool, generation, now);
    for (tier, counts) in [("hot", plan.hot), ("warm", plan.warm)] {
        ctx.metrics.set_spare_tier(
            &name,
            &spec.pool,
            tier,
            crate::metrics::TierFigures {
                ready: counts.ready,
                pending: counts.pending,
                target: counts.target,
            },
        );
    }
    status.spare_nodes = plan.spare_nodes.iter().take(1000).cloned().collect();
    status.underflow_since = plan.underflow_since(prev.underflow_since, now);
    ctx.metrics
        .set_spare_underflow(&name, &spec.pool, plan.underflow.is_some());
    match &plan.underflow {
        Some(u) => {
            let message = u.message();
            let was = api::find_condition(&prev.conditions, "SpareUnderflow")
                .is_some_and(api::Condition::is_true);
            api::set_condition(
                &mut status.conditions,
                condition(
                    "SpareUnderflow",
                    true,
                    "BelowTarget",
                    message.clone(),
                    generation,
                    now,
                ),
            );
            if !was {
                ctx.event(
                    target,
                    EventType::Warning,
                    "SpareUnderflow",
                    "Reconcile",
                    message,
                )
                .await;
            }
        }
        None => {
            api::set_condition(
                &mut status.conditions,
                condition(
                    "SpareUnderflow",
                    false,
                    "AtTarget",
                    format!("{} live spares, target {}", plan.hot.ready, plan.hot.target),
                    generation,
                    now,
                ),
            );
        }
    }
    let mut counts = format!(
        "{} live, {} pending, target {}",
        plan.hot.ready, plan.hot.pending, plan.hot.target
    );
    if plan.warm.target > 0 || plan.warm.ready + plan.warm.pending > 0 {
        counts.push_str(&format!(
            "; warm: {} stopped, {} coming, target {}",
            plan.warm.ready, plan.warm.pending, plan.warm.target
        ));
    }
    // Underflow with spares on their way is progress; underflow nothing can fix (a fixed pool
    // has no nodes to spare) is stalled until nodes or the target change.
    // A target the pool's maxNodes cannot hold is stalled, and says why.
    let at_max_nodes = plan
        .braked
        .as_ref()
        .filter(|b| matches!(b, spares::Brake::MaxNodes { .. }));
    let (standing, reason) = match &plan.underflow {
        Some(_) if at_max_nodes.is_some() => (api::Standing::Stalled, "PoolAtMaxNodes"),
        Some(_) if plan.hot.pending > 0 => (api::Standing::Reconciling, "Provisioning"),
        Some(_) => (api::Standing::Stalled, "SpareUnderflow"),
        None if !plan.terminate.is_empty() => (api::Standing::Reconciling, "TerminatingExcess"),
        None if plan.rotate.is_some() => (api::Standing::Reconciling, "Rotating"),
        None => (api::Standing::Ready, "AtTarget"),
    };
    let message = match (&plan.underflow, at_max_nodes) {
        (Some(_), Some(brake)) => {
            format!("{}; {counts}", brake.message(&spec.pool, plan.hot.target))
        }
        (Some(u), None) => format!("{}; {counts}", u.message()),
        (None, _) => counts,
    };
    if let Some(brake) = at_max_nodes {
        let was = api::find_condition(&prev.conditions, api::kstatus::STALLED)
            .is_some_and(|c| c.is_true() && c.reason == brake.reason());
        if !was {
            ctx.event(
                target,
                EventType::Warning,
                "SpareTargetUnreachable",
                "Provision",
                message.clone(),
            )
            .await;
        }
    }
    api::set_standing(
        &mut status.conditions,
        standing,
        reason,
        message,
        generation,
        now,
    );
    write_status(ctx, target, &prev, status).await?;
    let busy = !plan.is_noop() || plan.rotate.is_some() || plan.warm.pending > 0;
    let mut requeue = if busy {
        Duration::from_secs(1)
    } else if matches!(plan.braked, Some(spares::Brake::Rate { .. })) {
        Duration::from_secs(5)
    } else {
        REFRESH
    };
    // Wake when a schedule's sizes begin or end.
    if let Some(at) = sizes.next_change
        && let Ok(until) = (at - now).to_std()
    {
        requeue = requeue.min(until.max(Duration::from_millis(100)));
    }
    Ok(Action::requeue(requeue))
}

/// Whether a spare may be terminated now. The planner only retires spares that hold no job,
/// but a recovery may have placed one there since it looked: then terminating the node is a
/// voluntary disruption of that job's replica and waits for its bundle's budget (`blocked`
/// says why, for the `DisruptionBlocked` condition; an Event and the metric count it).
async fn may_terminate(
    ctx: &Arc<Context>,
    target: &HotSpareTarget,
    node: &str,
    blocked: &mut Option<String>,
) -> Result<bool, Error> {
    let hosts = ctx.manager.mirror().read(|m| {
        m.jobs_on(node).any(|j| {
            j.instances
                .iter()
                .any(|i| i.node_id == node && i.holds_capacity())
        })
    });
    if !hosts {
        return Ok(true);
    }
    match super::disruption::allow_node_terminate(
        ctx,
        node,
        automanager_policy::vocab::VoluntaryReason::SpareRotation,
    )
    .await?
    {
        Ok(()) => Ok(true),
        Err(why) => {
            ctx.metrics.disruption_blocked("spareRotation");
            ctx.event(
                target,
                EventType::Warning,
                "DisruptionBlocked",
                "Rotate",
                why.clone(),
            )
            .await;
            *blocked = Some(why);
            Ok(false)
        }
    }
}

/// Starts a warm spare of `pool` for a recovery that found no room: the youngest stopped spare
/// that is unbanded or dedicated to one of `bands`, outside the zones the zone brake holds.
/// `None` when there is none (or Manager refused): the caller provisions instead. The started
/// node is a hot spare once up; the recovery takes it, and its target refills both tiers.
pub async fn start_warm_spare(
    ctx: &Context,
    pool: &str,
    bands: &[api::PriorityBand],
) -> Result<Option<String>, Error> {
    let degraded: std::collections::BTreeSet<String> = ctx
        .state()
        .provisioning()
        .zone_brake()
        .degraded_in(pool)
        .into_iter()
        .map(|d| d.zone.clone())
        .collect();
    let candidate = ctx.manager.mirror().read(|m| {
        m.nodes
            .values()
            .filter(|n| n.pool == pool && n.state() == proto::NodeState::PoweredOff)
            .filter(|n| {
                let (spare, band) = mapping::spare_of(n);
                spare && band.is_none_or(|b| bands.contains(&b)) && !degraded.contains(n.zone())
            })
            .max_by(|a, b| (a.created_at_ms, &b.node_id).cmp(&(b.created_at_ms, &a.node_id)))
            .map(|n| n.node_id.clone())
    });
    let Some(node) = candidate else {
        return Ok(None);
    };
    // Claimed before the call, so its target never sees it running unclaimed.
    ctx.state()
        .provisioning_mut()
        .claim_warm(&node, ctx.clock.instant());
    match ctx.manager.start_node(&node).await {
        Ok(_) => {
            tracing::info!(pool, node = %node, "recovery: starting a warm spare");
            Ok(Some(node))
        }
        Err(e) if super::is_final_answer(&e) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// The tier counts in effect now: the schedules applied ahead by the pool's start latency (as
/// Manager reports it), else `hot` (or `targetCount`) and `warm`. An error is a message for
/// the `Stalled` condition.
async fn tier_sizes(
    ctx: &Arc<Context>,
    target: &HotSpareTarget,
    nodes: &[SpareNode],
    now: chrono::DateTime<Utc>,
) -> Result<tiers::TiersInEffect, String> {
    let spec = &target.spec;
    let count = tiers::TierSize::Count(u32::try_from(spec.target_count).unwrap_or(0));
    let base = tiers::TierSizes {
        hot: spec.hot.as_ref().map_or(count, api::TierSize::to_policy),
        warm: spec
            .warm
            .as_ref()
            .map_or(tiers::TierSize::Count(0), api::TierSize::to_policy),
    };
    base.validate().map_err(|e| e.to_string())?;
    let mut schedules = Vec::with_capacity(spec.schedules.len());
    for s in &spec.schedules {
        let recurrence = Recurrence::parse(&s.schedule, &s.duration, &s.time_zone)
            .map_err(|e| format!("schedules: {e}"))?;
        let sizes = tiers::TierSizes {
            hot: s.hot.as_ref().map_or(base.hot, api::TierSize::to_policy),
            warm: s.warm.as_ref().map_or(base.warm, api::TierSize::to_policy),
        };
        sizes.validate().map_err(|e| format!("schedules: {e}"))?;
        schedules.push(tiers::TierSchedule { recurrence, sizes });
    }
    // Shares are of the pool's working nodes: started and running jobs, spares aside.
    let spare_ids: std::collections::BTreeSet<&str> =
        nodes.iter().map(|n| n.node_id.as_str()).collect();
    let working = ctx.manager.mirror().read(|m| {
        m.nodes
            .values()
            .filter(|n| {
                n.pool == spec.pool
                    && n.state() == proto::NodeState::Started
                    && !spare_ids.contains(n.node_id.as_str())
                    && m.node_usage(&n.node_id) != (0.0, 0)
            })
            .count()
    });
    let lead = if schedules.is_empty() {
        chrono::TimeDelta::zero()
    } else {
        start_latency(ctx, &spec.pool).await
    };
    Ok(tiers::tiers_in_effect(
        &base,
        &schedules,
        u32::try_from(working).unwrap_or(u32::MAX),
        now,
        lead,
    ))
}

/// How long the pool takes to bring a spare up: the slower of starting a stopped node and
/// provisioning a new one, as Manager reports them (a schedule starts that much early).
async fn start_latency(ctx: &Context, pool: &str) -> chrono::TimeDelta {
    match ctx.manager.list_pools().await {
        Ok(pools) => pools
            .iter()
            .find(|p| p.name == pool)
            .map(|p| p.start_delay_ms.max(p.provision_delay_ms))
            .map_or(chrono::TimeDelta::zero(), |ms| {
                chrono::TimeDelta::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX))
            }),
        Err(e) => {
            tracing::info!(pool, error = %e, "pool start latency unknown: schedules apply on time");
            chrono::TimeDelta::zero()
        }
    }
}

/// The `WarmTier` condition: at target, below it, or not possible in this pool.
fn set_warm_condition(
    conditions: &mut Vec<api::Condition>,
    plan: &tiers::TierPlan,
    pool: &str,
    generation: Option<i64>,
    now: chrono::DateTime<Utc>,
) {
    let (ok, reason, message) = if plan.warm_unsupported {
        (
            false,
            "PoolCannotStop",
            format!("pool {pool} cannot stop nodes (a cluster pool): it keeps no warm spares"),
        )
    } else if let Some(u) = &plan.warm_underflow {
        (
            false,
            "BelowTarget",
            format!(
                "pool {pool} has {} warm spare(s), {} coming, target {}",
                u.current, plan.warm.pending, u.target
            ),
        )
    } else {
        (
            true,
            "AtTarget",
            format!(
                "{} warm spare(s), target {}",
                plan.warm.ready, plan.warm.target
            ),
        )
    };
    if plan.warm.target == 0 && !plan.warm_unsupported {
        conditions.retain(|c| c.type_ != "WarmTier");
        return;
    }
    api::set_condition(
        conditions,
        condition("WarmTier", ok, reason, message, generation, now),
    );
}

async fn write_status(
    ctx: &Context,
    target: &HotSpareTarget,
    prev: &HotSpareTargetStatus,
    status: HotSpareTargetStatus,
) -> Result<(), Error> {
    if &status == prev {
        return Ok(());
    }
    super::apply_status(
        &Api::<HotSpareTarget>::all(ctx.client.clone()),
        &target.name_any(),
        &status,
    )
    .await
}
