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
use automanager_policy::spares::{self, RotationStep, SpareNode, SpareState};

/// Rotation and figures are looked at least this often.
const REFRESH: Duration = Duration::from_secs(30);
/// A node asked for counts as pending this long even before the mirror shows it.
const CREATED_GRACE: Duration = Duration::from_secs(30);

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
                        Ok(proto::NodeState::Starting | proto::NodeState::Started)
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
    let mut nodes: Vec<SpareNode> = ctx.manager.mirror().read(|m| {
        m.nodes
            .values()
            .filter(|n| n.pool == spec.pool && mapping::spare_of(n).0)
            .map(|n| {
                let (capacity, cores) = m.node_usage(&n.node_id);
                spare_node(n, capacity > 0.0 || cores > 0)
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
    let pool_nodes = ctx.manager.mirror().read(|m| {
        m.nodes
            .values()
            .filter(|n| {
                n.pool == spec.pool
                    && matches!(
                        proto::NodeState::try_from(n.state),
                        Ok(proto::NodeState::Starting | proto::NodeState::Started)
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
    let plan = match spares::plan_spares(&name, &wanted, pool.spec.scale_out, &nodes, now) {
        Ok(p) => p.brake(max_nodes, room, allowance),
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

    // Act: provision first, so a rotation or a taken spare never leaves the pool short for longer.
    let req = spares::spare_provision_request(&name, &wanted);
    for _ in 0..plan.provision {
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
                spec.pool, plan.target
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
    status.live_spares = i32::try_from(plan.live).unwrap_or(i32::MAX);
    status.pending_spares =
        i32::try_from(plan.pending.saturating_add(plan.provision)).unwrap_or(i32::MAX);
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
                    format!("{} live spares, target {}", plan.live, plan.target),
                    generation,
                    now,
                ),
            );
        }
    }
    let counts = format!(
        "{} live, {} pending, target {}",
        plan.live, plan.pending, plan.target
    );
    // Underflow with spares on their way is progress; underflow nothing can fix (a fixed pool
    // has no nodes to spare) is stalled until nodes or the target change.
    // A target the pool's maxNodes cannot hold is stalled, and says why.
    let at_max_nodes = plan
        .braked
        .as_ref()
        .filter(|b| matches!(b, spares::Brake::MaxNodes { .. }));
    let (standing, reason) = match &plan.underflow {
        Some(_) if at_max_nodes.is_some() => (api::Standing::Stalled, "PoolAtMaxNodes"),
        Some(_) if plan.pending + plan.provision > 0 => {
            (api::Standing::Reconciling, "Provisioning")
        }
        Some(_) => (api::Standing::Stalled, "SpareUnderflow"),
        None if !plan.terminate.is_empty() => (api::Standing::Reconciling, "TerminatingExcess"),
        None if plan.rotate.is_some() => (api::Standing::Reconciling, "Rotating"),
        None => (api::Standing::Ready, "AtTarget"),
    };
    let message = match (&plan.underflow, at_max_nodes) {
        (Some(_), Some(brake)) => format!("{}; {counts}", brake.message(&spec.pool, plan.target)),
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
    Ok(Action::requeue(
        if plan.provision > 0 || plan.rotate.is_some() {
            Duration::from_secs(1)
        } else if matches!(plan.braked, Some(spares::Brake::Rate { .. })) {
            Duration::from_secs(5)
        } else {
            REFRESH
        },
    ))
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
    match super::disruption::allow_node_terminate(ctx, node).await? {
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
