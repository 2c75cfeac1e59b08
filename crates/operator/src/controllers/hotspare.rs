//! The HotSpareTarget controller: keeps a pool's warm, empty nodes at target.
//!
//! Observe the pool's spare-tagged nodes in the mirror; decide with the pure planner
//! (`crate::spares`); act (CreateNode with `spare=true`, TerminateNode of the oldest excess or of
//! an aged spare once its replacement is up); record status, the `SpareUnderflow` condition and a
//! Warning Event (the seed's `onSpareUnderflow(pool, current, target)`). Mirror node changes wake
//! every target at once, so a spare that takes a job is replaced without waiting for a poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use automanager_api::{self as api, HotSpareTarget, HotSpareTargetStatus, PlacementPool};
use chrono::{TimeZone, Utc};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use manager_proto as proto;

use super::{Context, Error, condition};
use crate::mapping;
use crate::spares::{self, RotationStep, SpareNode, SpareState};

/// Rotation and figures are looked at least this often.
const REFRESH: Duration = Duration::from_secs(30);
/// A node asked for counts as pending this long even before the mirror shows it.
const CREATED_GRACE: Duration = Duration::from_secs(30);

/// Nodes this operator asked for, per target, until the mirror shows them.
#[derive(Default)]
pub struct Created(Mutex<HashMap<String, Vec<(proto::Node, Instant)>>>);

pub async fn reconcile(
    target: Arc<HotSpareTarget>,
    ctx: Arc<Context>,
    created: Arc<Created>,
) -> Result<Action, Error> {
    let started = Instant::now();
    let result = apply(&target, &ctx, &created).await;
    ctx.metrics.observe_reconcile(
        "hotsparetarget",
        result.is_ok(),
        started.elapsed().as_secs_f64(),
    );
    result
}

fn spare_node(n: &proto::Node, holds_jobs: bool) -> SpareNode {
    let state = match proto::NodeState::try_from(n.state) {
        Ok(proto::NodeState::Started) => SpareState::Started,
        Ok(proto::NodeState::Stopped) => SpareState::Stopped,
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
    }
}

async fn apply(
    target: &HotSpareTarget,
    ctx: &Arc<Context>,
    created: &Created,
) -> Result<Action, Error> {
    let name = target.name_any();
    let generation = target.metadata.generation;
    let now = Utc::now();
    let prev = target.status.clone().unwrap_or_default();
    let spec = &target.spec;
    let mut status = HotSpareTargetStatus {
        observed_generation: generation,
        target_count: spec.target_count,
        conditions: prev.conditions.clone(),
        ..prev.clone()
    };

    let pools: Api<PlacementPool> = Api::all(ctx.client.clone());
    let Some(pool) = pools.get_opt(&spec.pool).await? else {
        api::set_condition(
            &mut status.conditions,
            condition(
                "Ready",
                false,
                "UnknownPool",
                format!("PlacementPool {} does not exist", spec.pool),
                generation,
                now,
            ),
        );
        write_status(ctx, target, &prev, status).await?;
        return Ok(Action::requeue(REFRESH));
    };
    if !ctx.manager_ready() {
        let err = ctx.manager_unavailable();
        api::set_condition(
            &mut status.conditions,
            condition(
                "Ready",
                false,
                "ManagerUnavailable",
                err.to_string(),
                generation,
                now,
            ),
        );
        write_status(ctx, target, &prev, status).await?;
        return Ok(Action::requeue(Duration::from_secs(3)));
    }

    // The pool's spare-tagged nodes, plus nodes just asked for that the mirror does not show yet.
    let mut nodes: Vec<SpareNode> = ctx.manager.mirror().read(|m| {
        let usage = mapping::usage_by_node(m.jobs.values());
        m.nodes
            .values()
            .filter(|n| n.pool == spec.pool && mapping::spare_of(n).0)
            .map(|n| {
                spare_node(
                    n,
                    usage.get(&n.node_id).is_some_and(|u| u.0 > 0.0 || u.1 > 0),
                )
            })
            .collect()
    });
    {
        let mut created = created.0.lock().unwrap_or_else(|e| e.into_inner());
        let mine = created.entry(name.clone()).or_default();
        mine.retain(|(n, at)| {
            at.elapsed() < CREATED_GRACE && !nodes.iter().any(|s| s.node_id == n.node_id)
        });
        nodes.extend(mine.iter().map(|(n, _)| spare_node(n, false)));
    }

    let plan = match spares::plan_spares(&name, spec, pool.spec.scale_out, &nodes, now) {
        Ok(p) => p,
        Err(e) => {
            api::set_condition(
                &mut status.conditions,
                condition(
                    "Ready",
                    false,
                    "InvalidSpec",
                    e.to_string(),
                    generation,
                    now,
                ),
            );
            write_status(ctx, target, &prev, status).await?;
            return Ok(Action::await_change());
        }
    };

    // Act: provision first, so a rotation or a taken spare never leaves the pool short for longer.
    let req = spares::spare_provision_request(&name, spec);
    for _ in 0..plan.provision {
        let create = proto::CreateNodeRequest {
            pool: req.pool.clone(),
            provider: mapping::provider(pool.spec.kind) as i32,
            region: req.region.clone(),
            instance_type: req.instance_type.clone(),
            zone: String::new(),
            tags: req.tags.iter().cloned().collect(),
        };
        let node = ctx.manager.create_node(create).await?;
        ctx.model().add_provisioned(&node);
        created
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(name.clone())
            .or_default()
            .push((node.clone(), Instant::now()));
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
    for node in &plan.terminate {
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
    if let Some(RotationStep::RetireAged { aged }) = &plan.rotate {
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
    let ready_msg = format!(
        "{} live, {} pending, target {}",
        plan.live, plan.pending, plan.target
    );
    api::set_condition(
        &mut status.conditions,
        condition("Ready", true, "Reconciled", ready_msg, generation, now),
    );
    write_status(ctx, target, &prev, status).await?;
    Ok(Action::requeue(
        if plan.provision > 0 || plan.rotate.is_some() {
            Duration::from_secs(1)
        } else {
            REFRESH
        },
    ))
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

pub fn error_policy(target: Arc<HotSpareTarget>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(target = %target.name_any(), error = %error, "hot spare reconcile failed");
    Action::requeue(super::backoff_for(error))
}
