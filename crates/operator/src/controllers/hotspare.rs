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
use chrono::{DateTime, TimeZone, Utc};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use manager_proto as proto;

use super::{Context, Error, condition};
use crate::mapping;
use automanager_policy::calendar::Recurrence;
use automanager_policy::pass::Verdict;
use automanager_policy::spares::{
    self, Retrying, RotationStep, SpareNode, SpareSpecError, SpareState, Stall,
};
use automanager_policy::tiers::{self, TierPlan};

/// A node asked for counts as pending this long even before the mirror shows it.
const CREATED_GRACE: Duration = Duration::from_secs(30);
/// A warm spare a recovery started is the recovery's this long (a start takes tens of seconds
/// on a cloud, then the recovery places onto it).
const CLAIM_GRACE: Duration = Duration::from_secs(180);

/// A HotSpareTarget is reconciled inside its cleanup finalizer
/// ([`super::reconcile_finalized`]`::<HotSpareTarget>`): a deleted target terminates the spares
/// it provisioned that hold no job (a spare that took a job is a working node now).
impl super::Finalized for HotSpareTarget {
    const CONTROLLER: &'static str = "hotsparetarget";
    const FINALIZER: &'static str = api::SPARE_TARGET_FINALIZER;

    /// Spares are provisioned and reported by the operator that owns the cluster scope.
    fn reconciled_here(ctx: &Context) -> bool {
        ctx.settings.scope.owns_cluster_scope()
    }

    fn api(&self, ctx: &Context) -> Result<Api<HotSpareTarget>, Error> {
        Ok(Api::all(ctx.client.clone()))
    }

    async fn apply(self: Arc<Self>, ctx: Arc<Context>) -> Result<Action, Error> {
        apply(&self, &ctx).await
    }

    async fn cleanup(self: Arc<Self>, ctx: Arc<Context>) -> Result<Action, Error> {
        cleanup(&self, &ctx).await
    }
}

/// Deletion: terminate this target's spares that hold no job, then let the object go.
async fn cleanup(target: &HotSpareTarget, ctx: &Arc<Context>) -> Result<Action, Error> {
    let name = target.name_any();
    // A pool waiting to be deleted no longer counts this target as a user.
    ctx.wake_pool_controller(&target.spec.pool);
    (ctx.state).set_spare_target(&kube::runtime::reflector::ObjectRef::from(target), None);
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
                    && holds_a_place(n)
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

/// A node that counts as the pool's: starting, started, or stopped on request (it keeps its
/// disk and identity, and counts under `maxNodes`, until it is terminated).
fn holds_a_place(n: &proto::Node) -> bool {
    matches!(
        proto::NodeState::try_from(n.state),
        Ok(proto::NodeState::Starting
            | proto::NodeState::Started
            | proto::NodeState::PoweringOff
            | proto::NodeState::PoweredOff)
    )
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

/// One pass: observe the pool and its spares, plan with the pure planner (braked by the pool's
/// `maxNodes` and request rate), act on Manager, record status, conditions and Events.
async fn apply(target: &HotSpareTarget, ctx: &Arc<Context>) -> Result<Action, Error> {
    ctx.state.set_spare_target(
        &kube::runtime::reflector::ObjectRef::from(target),
        Some(&target.spec.pool),
    );
    let pass = match observe(target, ctx).await? {
        Observed::Stalled(stall) => Pass::Stalled(stall),
        Observed::Pool(seen) => match plan(target, &seen, ctx.clock.now()) {
            Ok(plan) => act(target, ctx, &seen, plan).await?,
            Err(stall) => Pass::Stalled(stall),
        },
    };
    record(target, ctx, pass).await
}

/// What a pass observed of the target's pool.
enum Observed {
    /// The pass can go no further (a bad spec, no such pool, Manager unreachable).
    Stalled(Stall),
    Pool(Box<Seen>),
}

/// The pool, its spares and what the provisioning brake allows.
struct Seen {
    pool: PlacementPool,
    /// The pool's spare-tagged nodes, and nodes just asked for the mirror does not show yet.
    nodes: Vec<SpareNode>,
    /// The pool's `maxNodes` and the nodes that still fit under it, the requests its rate
    /// allows now, and the zones the zone brake holds.
    bounds: tiers::TierBounds,
    /// The tiers' sizes in effect now (schedules applied).
    sizes: tiers::TiersInEffect,
    /// Whether Manager keeps stopped nodes (StopNode/StartNode): Manager's published API alone
    /// does not.
    manager_stops_nodes: bool,
}

/// What a pass did, for [`record`].
enum Pass {
    Stalled(Stall),
    Planned {
        plan: Box<TierPlan>,
        /// The sizes it was planned for (which schedules, and when they next change).
        sizes: tiers::TiersInEffect,
        /// Why a spare that took a job meanwhile was kept (the disruption budget).
        blocked: Option<String>,
        /// An aged spare was retired.
        rotated: bool,
        /// A failed ask waits its back-off.
        retrying: Option<Retrying>,
    },
}

/// The target's pool and its spares, unless the pass stalls first: a pool name no object can
/// have, no such pool, an instance type it lacks, Manager unreachable.
async fn observe(target: &HotSpareTarget, ctx: &Context) -> Result<Observed, Error> {
    let spec = &target.spec;
    // A name no object can have goes into no request: the apiserver would never be asked.
    if crate::config::checks::dns_subdomain(&spec.pool).is_err() {
        return Ok(Observed::Stalled(Stall::InvalidPoolName(spec.pool.clone())));
    }
    let pools: Api<PlacementPool> = Api::all(ctx.client.clone());
    let Some(pool) = pools.get_opt(&spec.pool).await? else {
        return Ok(Observed::Stalled(Stall::UnknownPool(spec.pool.clone())));
    };
    let known: Vec<String> = pool
        .spec
        .candidate_instance_types
        .iter()
        .map(|t| t.instance_type.clone())
        .collect();
    if let Err(stall) = spares::check_instance_type(&spec.pool, &known, &spec.spec.instance_type) {
        return Ok(Observed::Stalled(stall));
    }
    if !ctx.manager_ready() {
        let why = ctx.manager_unavailable().to_string();
        return Ok(Observed::Stalled(Stall::ManagerUnavailable(why)));
    }
    let nodes = spare_nodes(target, ctx);
    let sizes = match tier_sizes(ctx, target, &pool, &nodes).await {
        Ok(sizes) => sizes,
        Err(message) => {
            let e = SpareSpecError::InvalidTier(message);
            return Ok(Observed::Stalled(Stall::InvalidSpec(e)));
        }
    };
    let bounds = bounds(ctx, &pool, &nodes);
    Ok(Observed::Pool(Box::new(Seen {
        pool,
        nodes,
        bounds,
        sizes,
        manager_stops_nodes: ctx.manager.features().warm_nodes,
    })))
}

/// What bounds every tier: spares count against the pool's `maxNodes` like any node, the
/// pool's request rate bounds how many are asked for at once, and nothing is created in a
/// zone the zone brake holds.
fn bounds(ctx: &Context, pool: &PlacementPool, nodes: &[SpareNode]) -> tiers::TierBounds {
    let name = pool.name_any();
    let max_nodes = pool.spec.max_nodes.map(|m| u32::try_from(m).unwrap_or(0));
    let room = automanager_policy::provision_budget::room_under_max_nodes(
        max_nodes,
        pool_node_count(ctx, &name, nodes),
    );
    let now = ctx.clock.now();
    let allowance = ctx.state.provision_allowance(&name, now);
    let degraded_zones: std::collections::BTreeSet<String> = (ctx.state.degraded_zones(&name))
        .into_iter()
        .map(|d| d.zone)
        .collect();
    let zones = &pool.spec.zones;
    tiers::TierBounds {
        max_nodes,
        room,
        allowance,
        all_zones_degraded: !zones.is_empty() && zones.iter().all(|z| degraded_zones.contains(z)),
        degraded_zones,
    }
}

/// The pool's spare-tagged nodes, plus nodes just asked for that the mirror does not show yet.
fn spare_nodes(target: &HotSpareTarget, ctx: &Context) -> Vec<SpareNode> {
    let pool = &target.spec.pool;
    let now = ctx.clock.instant();
    ctx.manager.mirror().read(|m| {
        let claimed = ctx.state.claimed_warm_spares(now, CLAIM_GRACE);
        let mut nodes: Vec<SpareNode> = (m.nodes.values())
            .filter(|n| n.pool == *pool && mapping::spare_of(n).0)
            .map(|n| {
                // A warm spare a recovery started counts as taken until the recovery had time
                // to use it.
                let (capacity, cores) = m.node_usage(&n.node_id);
                let claimed = claimed.contains(&n.node_id);
                spare_node(n, capacity > 0.0 || cores > 0 || claimed)
            })
            .collect();
        let asked = (ctx.state).spares_not_shown(&target.name_any(), now, CREATED_GRACE, |id| {
            nodes.iter().any(|s| s.node_id == id)
        });
        nodes.extend(asked.iter().map(|n| spare_node(n, false)));
        nodes
    })
}

/// The pool's nodes that count against `maxNodes`: those starting or started, and spares
/// asked for that the mirror does not show yet.
fn pool_node_count(ctx: &Context, pool: &str, spares: &[SpareNode]) -> u32 {
    let count = ctx.manager.mirror().read(|m| {
        let live = m
            .nodes
            .values()
            .filter(|n| n.pool == pool && holds_a_place(n))
            .count();
        let asked = spares
            .iter()
            .filter(|n| n.state == SpareState::Starting && !m.nodes.contains_key(&n.node_id))
            .count();
        live + asked
    });
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// The tiers planner's answer for what was observed, within the bounds.
fn plan(target: &HotSpareTarget, seen: &Seen, now: DateTime<Utc>) -> Result<TierPlan, Stall> {
    let pool = &seen.pool.spec;
    tiers::plan_tiers(tiers::TierInput {
        target_name: &target.name_any(),
        spec: &mapping::spare_target(&target.spec),
        hot: seen.sizes.hot,
        warm: seen.sizes.warm,
        pool: tiers::PoolTraits {
            scale_out: pool.scale_out,
            can_stop: pool.kind != api::PoolKind::Cluster && seen.manager_stops_nodes,
        },
        nodes: &seen.nodes,
        now,
        // No window governs the rotation of a pool's spares yet: a spare holds no bundle's job.
        rotation_allowed: true,
        bounds: &seen.bounds,
    })
    .map_err(Stall::InvalidSpec)
}

/// Acts on the plan: provision first, so a rotation or a taken spare never leaves the pool
/// short for longer; start warm spares for the hot tier and stop surplus hot ones for the warm
/// tier; then terminate the excess and retire an aged spare.
async fn act(
    target: &HotSpareTarget,
    ctx: &Arc<Context>,
    seen: &Seen,
    plan: TierPlan,
) -> Result<Pass, Error> {
    let retrying = match provision(target, ctx, &seen.pool, plan.creates()).await? {
        Asked::All => None,
        Asked::Refused(stall) => return Ok(Pass::Stalled(stall)),
        Asked::Retrying(r) => Some(r),
    };
    start_and_stop(target, ctx, &plan).await?;
    // A rotation's aged spare is among the excess to terminate: it goes once, as the rotation.
    let aged = match &plan.rotate {
        Some(RotationStep::RetireAged { aged }) => Some(aged.as_str()),
        _ => None,
    };
    let mut blocked: Option<String> = None;
    let mut rotated = false;
    for node in &plan.terminate {
        if !may_terminate(ctx, target, node, &mut blocked).await? {
            continue;
        }
        ctx.manager.terminate_node(node).await?;
        let (reason, action, note) = if aged == Some(node.as_str()) {
            rotated = true;
            let note =
                format!("spare {node} is older than maxAge and its replacement is up: terminated");
            ("RotatedSpare", "Rotate", note)
        } else {
            let note = format!(
                "spare {node} terminated: pool {} is over target {}",
                target.spec.pool, plan.hot.target
            );
            ("TerminatedExcessSpare", "Terminate", note)
        };
        ctx.event(target, EventType::Normal, reason, action, note)
            .await;
    }
    Ok(Pass::Planned {
        plan: Box::new(plan),
        sizes: seen.sizes.clone(),
        blocked,
        rotated,
        retrying,
    })
}

/// Starts the warm spares the hot tier takes and stops the surplus hot spares the warm tier
/// takes. A node whose state changed since the plan looked (a recovery placed a job there) is
/// left as it is: Manager's answer says so, and the next pass plans again.
async fn start_and_stop(
    target: &HotSpareTarget,
    ctx: &Context,
    plan: &TierPlan,
) -> Result<(), Error> {
    let name = target.name_any();
    for node in &plan.start {
        match ctx.manager.start_node(node).await {
            Ok(_) => {
                ctx.metrics.warm_spare_start(&target.spec.pool, true);
                let note = format!("warm spare {node} started to refill the hot tier");
                ctx.event(
                    target,
                    EventType::Normal,
                    "StartingWarmSpare",
                    "Start",
                    note,
                )
                .await;
            }
            Err(e) if super::is_final_answer(&e) => {
                ctx.metrics.warm_spare_start(&target.spec.pool, false);
                tracing::info!(target = %name, node = %node, error = %e, "warm spare not started");
            }
            Err(e) => return Err(e.into()),
        }
    }
    for node in &plan.stop {
        match ctx.manager.stop_node(node).await {
            Ok(_) => {
                let note = format!("spare {node} stopped to refill the warm tier");
                ctx.event(target, EventType::Normal, "StoppingSpare", "Stop", note)
                    .await;
            }
            Err(e) if super::is_final_answer(&e) => {
                tracing::info!(target = %name, node = %node, error = %e, "spare not stopped");
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// How asking for spares went.
enum Asked {
    /// Every spare asked for (as the pool's rate allows) was asked for.
    All,
    /// Manager refused: final for this spec, the pass stalls on it.
    Refused(Stall),
    /// An ask failed and waits its back-off.
    Retrying(Retrying),
}

/// Asks Manager for `count` spares, as the pool's rate allows.
async fn provision(
    target: &HotSpareTarget,
    ctx: &Arc<Context>,
    pool: &PlacementPool,
    count: u32,
) -> Result<Asked, Error> {
    let name = target.name_any();
    let req = spares::spare_provision_request(&name, &mapping::spare_target(&target.spec));
    for _ in 0..count {
        if !ctx.state.take_provision_request(&req.pool, ctx.clock.now()) {
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
            Err(Error::ProvisioningRefused(refusal)) => {
                return Ok(Asked::Refused(Stall::ProvisioningRefused(
                    refusal.describe(),
                )));
            }
            // A failed ask (not a refusal) waits its back-off.
            Err(Error::ProvisioningRetry { message, retry_in }) => {
                return Ok(Asked::Retrying(Retrying {
                    why: message,
                    after: retry_in,
                }));
            }
            Err(e) => return Err(e),
        };
        (ctx.state).spare_asked(&name, node.clone(), ctx.clock.instant());
        let note = format!(
            "asked for spare {} ({}) in pool {}",
            node.node_id, req.instance_type, req.pool
        );
        ctx.event(
            target,
            EventType::Normal,
            "ProvisioningSpare",
            "Provision",
            note,
        )
        .await;
    }
    Ok(Asked::All)
}

/// Records the pass: status figures, `SpareUnderflow`, `DisruptionBlocked` and the standing,
/// with a Warning Event for each trouble that is new since the last status.
async fn record(target: &HotSpareTarget, ctx: &Context, pass: Pass) -> Result<Action, Error> {
    let prev = target.status.clone().unwrap_or_default();
    let generation = target.metadata.generation;
    let now = ctx.clock.now();
    let mut status = HotSpareTargetStatus {
        observed_generation: generation,
        target_count: target.spec.target_count,
        conditions: prev.conditions.clone(),
        ..prev.clone()
    };
    let was_stalled = |reason: &str| {
        api::find_condition(&prev.conditions, api::kstatus::STALLED)
            .is_some_and(|c| c.is_true() && c.reason == reason)
    };
    let (verdict, next) = match pass {
        Pass::Stalled(stall) => {
            if matches!(stall, Stall::ProvisioningRefused(_)) && !was_stalled(stall.reason()) {
                let note = stall.message();
                ctx.event(
                    target,
                    EventType::Warning,
                    stall.reason(),
                    "Provision",
                    note,
                )
                .await;
            }
            (stall.verdict(), stall.next_look())
        }
        Pass::Planned {
            plan,
            sizes,
            blocked,
            rotated,
            retrying,
        } => {
            let verdict = plan.verdict(&target.spec.pool, retrying.as_ref());
            record_plan(target, ctx, &prev, &mut status, &plan, blocked).await;
            record_tiers(target, ctx, &mut status, &plan, &sizes);
            warn_warm_unavailable(target, ctx, &prev, &status).await;
            if rotated {
                status.last_rotation = Some(now);
            }
            if let Some(brake) = plan.unreachable()
                && !was_stalled(brake.reason())
            {
                let note = verdict.message.clone();
                let reason = "SpareTargetUnreachable";
                ctx.event(target, EventType::Warning, reason, "Provision", note)
                    .await;
            }
            let until_change = (sizes.next_change).and_then(|at| (at - now).to_std().ok());
            (verdict, plan.next_look(retrying.as_ref(), until_change))
        }
    };
    let Verdict {
        standing,
        reason,
        message,
    } = verdict;
    api::set_standing(
        &mut status.conditions,
        standing,
        reason,
        message,
        generation,
        now,
    );
    write_status(ctx, target, &prev, status).await?;
    Ok(super::next_action(next))
}

/// The plan's figures and its `SpareUnderflow` and `DisruptionBlocked` conditions.
async fn record_plan(
    target: &HotSpareTarget,
    ctx: &Context,
    prev: &HotSpareTargetStatus,
    status: &mut HotSpareTargetStatus,
    plan: &TierPlan,
    blocked: Option<String>,
) {
    let generation = target.metadata.generation;
    let now = ctx.clock.now();
    super::disruption::set_blocked_condition(&mut status.conditions, blocked, generation, now);
    status.live_spares = i32::try_from(plan.hot.ready).unwrap_or(i32::MAX);
    status.pending_spares = i32::try_from(plan.hot.pending).unwrap_or(i32::MAX);
    status.spare_nodes = plan.spare_nodes.iter().take(1000).cloned().collect();
    status.underflow_since = plan.underflow_since(prev.underflow_since, now);
    let (under, reason, message) = plan.underflow_condition();
    let was = api::find_condition(&prev.conditions, "SpareUnderflow").is_some_and(|c| c.is_true());
    if under && !was {
        let note = message.clone();
        ctx.event(
            target,
            EventType::Warning,
            "SpareUnderflow",
            "Reconcile",
            note,
        )
        .await;
    }
    let c = condition("SpareUnderflow", under, reason, message, generation, now);
    api::set_condition(&mut status.conditions, c);
}

/// The tiers' figures in status and metrics, the schedules in effect and the `WarmTier`
/// condition.
fn record_tiers(
    target: &HotSpareTarget,
    ctx: &Context,
    status: &mut HotSpareTargetStatus,
    plan: &TierPlan,
    sizes: &tiers::TiersInEffect,
) {
    let spec = &target.spec;
    let now = ctx.clock.now();
    status.target_count = i32::try_from(plan.hot.target).unwrap_or(i32::MAX);
    status.warm_target = i32::try_from(plan.warm.target).unwrap_or(i32::MAX);
    status.warm_spares = i32::try_from(plan.warm.ready).unwrap_or(i32::MAX);
    status.pending_warm_spares = i32::try_from(plan.warm.pending).unwrap_or(i32::MAX);
    status.active_schedules = (sizes.active.iter())
        .filter_map(|i| spec.schedules.get(*i).map(|s| s.schedule.clone()))
        .collect();
    status.next_schedule_change = sizes.next_change;
    let generation = target.metadata.generation;
    let why = if ctx.manager.features().warm_nodes {
        WarmUnsupported::ClusterPool
    } else {
        WarmUnsupported::Manager
    };
    set_warm_condition(
        &mut status.conditions,
        plan,
        &spec.pool,
        why,
        generation,
        now,
    );
    let name = target.name_any();
    for (tier, counts) in [("hot", plan.hot), ("warm", plan.warm)] {
        let figures = crate::metrics::TierFigures {
            ready: counts.ready,
            pending: counts.pending,
            target: counts.target,
        };
        ctx.metrics.set_spare_tier(&name, &spec.pool, tier, figures);
    }
}

/// The `WarmTier` condition: at target, below it, or not possible in this pool.
/// One Warning Event when the warm tier asked for cannot be had from this Manager at all.
async fn warn_warm_unavailable(
    target: &HotSpareTarget,
    ctx: &Context,
    prev: &HotSpareTargetStatus,
    status: &HotSpareTargetStatus,
) {
    let reason_of = |conditions: &[api::Condition]| {
        api::find_condition(conditions, "WarmTier").map(|c| c.reason.clone())
    };
    let now = reason_of(&status.conditions);
    if now.as_deref() == Some("ManagerCannotStop") && reason_of(&prev.conditions) != now {
        let message = api::find_condition(&status.conditions, "WarmTier")
            .map(|c| c.message.clone())
            .unwrap_or_default();
        ctx.event(
            target,
            EventType::Warning,
            "WarmSparesUnavailable",
            "Reconcile",
            message,
        )
        .await;
    }
}

/// Why a pool keeps no warm spares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WarmUnsupported {
    /// Its nodes are physical machines: nothing stops them.
    ClusterPool,
    /// Manager's API here has no StopNode/StartNode (its published API without our extension).
    Manager,
}

fn set_warm_condition(
    conditions: &mut Vec<api::Condition>,
    plan: &tiers::TierPlan,
    pool: &str,
    why: WarmUnsupported,
    generation: Option<i64>,
    now: chrono::DateTime<Utc>,
) {
    let (ok, reason, message) = if plan.warm_unsupported && why == WarmUnsupported::Manager {
        (
            false,
            "ManagerCannotStop",
            format!(
                "this Manager keeps no stopped nodes (its published API has no StopNode or \
                 StartNode, and AutoManager's extension is not served): pool {pool} keeps no \
                 warm spares"
            ),
        )
    } else if plan.warm_unsupported {
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

/// Starts a warm spare of `pool` for a recovery that found no room: the youngest stopped spare
/// that is unbanded or dedicated to one of `bands`, outside the zones the zone brake holds.
/// `None` when there is none (or Manager refused): the caller provisions instead. The started
/// node is a hot spare once up; the recovery takes it, and its target refills both tiers.
pub async fn start_warm_spare(
    ctx: &Context,
    pool: &str,
    bands: &[api::PriorityBand],
) -> Result<Option<String>, Error> {
    let degraded: std::collections::BTreeSet<String> = (ctx.state.degraded_zones(pool))
        .into_iter()
        .map(|d| d.zone)
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
    ctx.state.claim_warm(&node, ctx.clock.instant());
    match ctx.manager.start_node(&node).await {
        Ok(_) => {
            ctx.metrics.warm_spare_start(pool, true);
            tracing::info!(pool, node = %node, "recovery: starting a warm spare");
            Ok(Some(node))
        }
        Err(e) if super::is_final_answer(&e) => {
            ctx.metrics.warm_spare_start(pool, false);
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

/// The tier counts in effect now: the schedules applied ahead by the pool's start latency
/// ([`start_latency`]) and a margin ([`tiers::schedule_lead`]), else `hot` (or `targetCount`)
/// and `warm`. An error is a message for the `Stalled` condition.
async fn tier_sizes(
    ctx: &Context,
    target: &HotSpareTarget,
    pool: &PlacementPool,
    nodes: &[SpareNode],
) -> Result<tiers::TiersInEffect, String> {
    let spec = &target.spec;
    let now = ctx.clock.now();
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
        tiers::schedule_lead(start_latency(ctx, pool).await)
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
/// provisioning a new one as Manager reports them, or the pool's declared start latency when
/// that is longer (a schedule starts that much early).
async fn start_latency(ctx: &Context, pool: &PlacementPool) -> chrono::TimeDelta {
    let name = pool.name_any();
    let reported_ms = match ctx.manager.list_pools().await {
        Ok(pools) => pools
            .iter()
            .find(|p| p.name == name)
            .map_or(0, |p| p.start_delay_ms.max(p.provision_delay_ms)),
        Err(e) => {
            tracing::info!(pool = %name, error = %e, "Manager's pool start latency unknown: the declared one alone counts");
            0
        }
    };
    let latency = pool
        .spec
        .start_latency(std::time::Duration::from_millis(reported_ms));
    chrono::TimeDelta::from_std(latency).unwrap_or(chrono::TimeDelta::MAX)
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
    let reason = automanager_policy::vocab::VoluntaryReason::SpareRotation;
    match super::disruption::allow_node_terminate(ctx, node, reason).await? {
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
