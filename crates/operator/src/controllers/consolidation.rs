//! Consolidation of a PlacementPool (`spec.consolidation`), run as part of the pool's
//! reconcile: observe the pool's nodes and jobs, ask the pure planner
//! ([`automanager_policy::consolidation`]) which nodes can be emptied and where each job goes,
//! then (mode `enabled`) empty the first planned node through Migrations labelled
//! `automanager.norsk.io/purpose: consolidation` (so the fleet-wide queue, its priority and the
//! disruption budget apply) and terminate it once nothing runs there. One node at a time per
//! pool, with a cool-down between nodes. Mode `dryRun` writes the plan to status and moves
//! nothing.
//!
//! What survives a restart: the node being emptied (`status.consolidation.currentNode`) and its
//! Migrations (labelled with the node). The node's placement cordon is the operator's memory
//! and is set again from status at the next pass.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{
    self as api, Bundle, ConsolidationMode, ConsolidationMove, ConsolidationNode,
    ConsolidationStatus, ManagerNode, Migration, MigrationJobRef, PlacementPool,
};
use automanager_placement as pl;
use automanager_policy::consolidation::{self as policy, BundleRules, PlacedJob};
use automanager_policy::drain::MigrationOutcome;
use chrono::{DateTime, Utc};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use manager_client::{ClientError, MirrorState};
use manager_proto as proto;

use super::move_request::{MoveName, MoveRequest, Requested, request_move};
use super::{Context, Error, condition};
use crate::mapping;
use crate::state::State;

/// How soon a pool with a node being emptied is looked at again.
const STEP: Duration = Duration::from_secs(2);
/// The least time between two plans of one pool (same spec, no node being emptied).
const PLAN_EVERY: Duration = Duration::from_secs(5);

/// What one pass decided: the status to keep, the `Consolidating` condition, and when to look
/// again (sooner than the pool's refresh while a node is being emptied).
pub struct Pass {
    pub status: Option<ConsolidationStatus>,
    pub condition: api::Condition,
    pub requeue: Option<Duration>,
}

/// The name of the Migration that moves `job_id` off `node_id`: stable, so a restarted operator
/// finds (or re-creates) the same object.
pub fn migration_name(node_id: &str, job_id: &str) -> String {
    super::drain::named_migration("consolidate", &mapping::node_object_name(node_id), job_id)
}

/// One consolidation pass over `pool`: follow the node being emptied to its end, then plan
/// (at most every [`PLAN_EVERY`]) and, in mode `enabled`, begin emptying the plan's first node
/// once the cool-down has passed.
pub async fn step(pool: &PlacementPool, ctx: &Arc<Context>) -> Result<Pass, Error> {
    let spec = pool.spec.consolidation.unwrap_or_default();
    let prev = pool
        .status
        .as_ref()
        .and_then(|s| s.consolidation.clone())
        .unwrap_or_default();
    let cond =
        |on: bool, reason: &str, message: String| consolidating(pool, ctx, on, reason, message);
    if spec.mode == ConsolidationMode::Off {
        switch_off(pool, ctx, &prev);
        return Ok(Pass::new(None, cond(false, "Off", String::new()), None));
    }
    if !ctx.manager_ready() {
        let why = "Manager is unreachable; consolidation waits".to_owned();
        return Ok(Pass::new(
            Some(prev),
            cond(false, "ManagerUnavailable", why),
            None,
        ));
    }
    let mut status = prev.clone();
    // A node being emptied: follow it to its end first.
    if let Some(node) = prev.current_node.clone() {
        if spec.mode != ConsolidationMode::Enabled {
            // Switched to dryRun: the moves under way finish as ordinary Migrations; the node
            // stays.
            release(ctx, &node);
            status.current_node = None;
        } else if let Some(pass) = follow(pool, ctx, &node, &mut status).await? {
            return Ok(pass);
        }
    }
    // Planning lists every Bundle: not more often than PLAN_EVERY for the same spec, however
    // often node changes wake the pool.
    if let Some(pass) = recent_plan(pool, ctx, &status) {
        return Ok(pass);
    }
    let planned = observe_and_plan(pool, ctx, &spec, &mut status).await?;
    let summary = planned.summary();
    if spec.mode == ConsolidationMode::DryRun {
        let message = format!("dry run: {summary}");
        return Ok(Pass::new(
            Some(status),
            cond(false, "DryRun", message),
            None,
        ));
    }
    let now = ctx.clock.now();
    match policy::next(&planned, status.last_action_at, spec.cooldown(), now) {
        policy::Next::Nothing => Ok(Pass::new(
            Some(status),
            cond(false, "NothingToConsolidate", summary),
            None,
        )),
        policy::Next::CoolDown { until } => {
            let wait = (until - now).to_std().unwrap_or(STEP);
            let message = format!(
                "{summary}; the next node is emptied after {}",
                until.to_rfc3339()
            );
            let c = cond(false, "CoolingDown", message);
            Ok(Pass::new(
                Some(status),
                c,
                Some(wait.max(Duration::from_secs(1))),
            ))
        }
        policy::Next::Empty(first) => begin(pool, ctx, first, status).await,
    }
}

/// Consolidation is off: a node being emptied is given back to placement, and the plan and
/// its metric are forgotten.
fn switch_off(pool: &PlacementPool, ctx: &Context, prev: &ConsolidationStatus) {
    if let Some(node) = &prev.current_node {
        release(ctx, node);
    }
    let name = pool.name_any();
    ctx.metrics.set_consolidation_planned(&name, None);
    ctx.state.forget_consolidation(&name);
}

/// The pool's `Consolidating` condition, now.
fn consolidating(
    pool: &PlacementPool,
    ctx: &Context,
    on: bool,
    reason: &str,
    message: String,
) -> api::Condition {
    let generation = pool.metadata.generation;
    condition(
        "Consolidating",
        on,
        reason,
        message,
        generation,
        ctx.clock.now(),
    )
}

impl Pass {
    fn new(
        status: Option<ConsolidationStatus>,
        condition: api::Condition,
        requeue: Option<Duration>,
    ) -> Self {
        Pass {
            status,
            condition,
            requeue,
        }
    }
}

/// Observes the pool and its bundles, plans, and records the plan in `status` and the metric.
async fn observe_and_plan(
    pool: &PlacementPool,
    ctx: &Context,
    spec: &api::ConsolidationSpec,
    status: &mut ConsolidationStatus,
) -> Result<policy::Plan, Error> {
    let name = pool.name_any();
    let now = ctx.clock.now();
    let bundles = list_bundles(ctx).await?;
    let planned = plan(pool, ctx, spec, &bundles, now);
    ctx.state
        .record_consolidation_plan(&name, ctx.clock.instant(), pool.metadata.generation);
    let nodes = bounded_plan(&planned);
    if nodes != status.plan || status.planned_at.is_none() {
        status.planned_at = Some(now);
    }
    status.plan = nodes;
    status.planned_nodes = i32::try_from(planned.nodes.len()).unwrap_or(i32::MAX);
    ctx.metrics
        .set_consolidation_planned(&name, Some(i64::from(status.planned_nodes)));
    Ok(planned)
}

/// Begins emptying `first`: cordon it for placement, then one Migration per move.
async fn begin(
    pool: &PlacementPool,
    ctx: &Arc<Context>,
    first: &policy::PlannedNode,
    mut status: ConsolidationStatus,
) -> Result<Pass, Error> {
    let node = first.node.clone();
    hold(ctx, &node);
    if let Err(e) = create_migrations(pool, ctx, first).await {
        // Not recorded as the node being emptied: placement may use it again. A Migration
        // created before the error still moves its job (to a planned target), which is harmless.
        release(ctx, &node);
        return Err(e);
    }
    status.current_node = Some(node.clone());
    let moves: Vec<String> = first
        .moves
        .iter()
        .map(|m| format!("{} → {}", m.job_id, m.target))
        .collect();
    let what = if moves.is_empty() {
        "it holds no job".to_owned()
    } else {
        moves.join(", ")
    };
    let note = api::bounded::clip(&format!("emptying node {node}: {what}"), 1024).into_owned();
    ctx.event(
        pool,
        EventType::Normal,
        "Consolidating",
        "Consolidate",
        note,
    )
    .await;
    tracing::info!(pool = %pool.name_any(), node = %node, moves = first.moves.len(), "consolidation: emptying node");
    if first.moves.is_empty()
        && let Some(pass) = follow(pool, ctx, &node, &mut status).await?
    {
        return Ok(pass);
    }
    let message = format!(
        "emptying node {node}: 0 of {} moves done",
        first.moves.len()
    );
    let c = consolidating(pool, ctx, true, "EmptyingNode", message);
    Ok(Pass::new(Some(status), c, Some(STEP)))
}

/// The Migrations of `first`'s moves. They belong to the node's ManagerNode (as a drain's do),
/// so they go when it does; the pool owns them when the ManagerNode is not there.
async fn create_migrations(
    pool: &PlacementPool,
    ctx: &Context,
    first: &policy::PlannedNode,
) -> Result<(), Error> {
    let owner = Api::<ManagerNode>::all(ctx.client.clone())
        .get_opt(&mapping::node_object_name(&first.node))
        .await?
        .and_then(|n| n.controller_owner_ref(&()))
        .or_else(|| pool.controller_owner_ref(&()));
    for m in &first.moves {
        create_migration(ctx, owner.clone(), &first.node, m).await?;
    }
    Ok(())
}

/// The last pass again, when it planned less than [`PLAN_EVERY`] ago for the same spec and no
/// node is being emptied.
fn recent_plan(pool: &PlacementPool, ctx: &Context, status: &ConsolidationStatus) -> Option<Pass> {
    if status.current_node.is_some() {
        return None;
    }
    let (at, generation) = ctx.state.consolidation_planned(&pool.name_any())?;
    let age = ctx.clock.instant().saturating_duration_since(at);
    if generation != pool.metadata.generation || age >= PLAN_EVERY {
        return None;
    }
    let prev = pool.status.as_ref()?;
    let condition = api::find_condition(&prev.conditions, "Consolidating")?.clone();
    if condition.observed_generation != pool.metadata.generation
        || !matches!(
            condition.reason.as_str(),
            "DryRun" | "NothingToConsolidate" | "CoolingDown"
        )
    {
        return None;
    }
    Some(Pass {
        status: Some(status.clone()),
        condition,
        requeue: Some(PLAN_EVERY - age),
    })
}

/// The node being emptied: `Some(pass)` while it is (or has just been terminated or given up
/// on, with the status updated), `None` when it is over and a new plan may be made.
async fn follow(
    pool: &PlacementPool,
    ctx: &Arc<Context>,
    node: &str,
    status: &mut ConsolidationStatus,
) -> Result<Option<Pass>, Error> {
    let state = ctx.manager.mirror().read(|m| {
        m.nodes
            .get(node)
            .and_then(|n| proto::NodeState::try_from(n.state).ok())
    });
    if !matches!(
        state,
        Some(proto::NodeState::Started | proto::NodeState::Starting)
    ) {
        // Gone (terminated by this pass earlier, or lost): nothing more to do for it.
        release(ctx, node);
        status.current_node = None;
        return Ok(None);
    }
    hold(ctx, node);
    let listed = node_migrations(ctx, node).await?;
    let outcomes: Vec<(String, MigrationOutcome, String)> = listed
        .iter()
        .map(|m| {
            let phase = m
                .status
                .as_ref()
                .map(|s| format!("{:?}", s.phase))
                .unwrap_or_else(|| "Pending".into());
            (m.name_any(), super::drain::outcome(m), phase)
        })
        .collect();
    match policy::progress(&outcomes) {
        policy::Progress::Failed { migration, phase } => {
            let why = format!("Migration {migration} ended {phase}");
            Ok(Some(abandon(pool, ctx, node, &listed, status, &why).await))
        }
        policy::Progress::Moving { done, total } => {
            let message = format!("emptying node {node}: {done} of {total} moves done");
            let c = consolidating(pool, ctx, true, "EmptyingNode", message);
            Ok(Some(Pass::new(Some(status.clone()), c, Some(STEP))))
        }
        policy::Progress::Done { total } => finish(pool, ctx, node, &listed, status, total).await,
    }
}

/// The Migrations of the node being emptied.
async fn node_migrations(ctx: &Context, node: &str) -> Result<Vec<Migration>, Error> {
    let selector = format!(
        "{}={},{}=consolidation",
        api::CONSOLIDATION_NODE_LABEL,
        super::drain::node_label(node),
        api::PURPOSE_LABEL
    );
    Ok(super::list_watched(ctx, &ListParams::default().labels(&selector)).await?)
}

/// Every move off `node` is done: terminate it, unless it still holds something (then it is
/// given up on).
async fn finish(
    pool: &PlacementPool,
    ctx: &Arc<Context>,
    node: &str,
    migrations: &[Migration],
    status: &mut ConsolidationStatus,
    total: usize,
) -> Result<Option<Pass>, Error> {
    let left = left_on(ctx, node);
    if !left.is_empty() {
        let why = format!(
            "it still holds {} that the plan did not move",
            api::bounded::join_bounded(&left, ", ", 512)
        );
        return Ok(Some(
            abandon(pool, ctx, node, migrations, status, &why).await,
        ));
    }
    match ctx.manager.terminate_node(node).await {
        Ok(_) => {}
        // Already on its way out: counted when it was asked for.
        Err(ClientError::NotFound(_) | ClientError::FailedPrecondition(_)) => {
            release(ctx, node);
            status.current_node = None;
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    }
    let now = ctx.clock.now();
    status.current_node = None;
    status.nodes_terminated = status.nodes_terminated.saturating_add(1);
    status.last_action_at = Some(now);
    let name = pool.name_any();
    ctx.metrics.consolidation_terminated(&name);
    let note = format!("node {node} is empty ({total} jobs moved) and was terminated");
    ctx.event(
        pool,
        EventType::Normal,
        "NodeConsolidated",
        "Terminate",
        note,
    )
    .await;
    tracing::info!(pool = %name, node = %node, moved = total, "consolidation: node terminated");
    // The Migrations stay (with their handover summaries) until the node's ManagerNode, their
    // owner, is removed.
    release(ctx, node);
    let message = format!("node {node} was emptied and terminated");
    let c = consolidating(pool, ctx, false, "NodeTerminated", message);
    Ok(Some(Pass::new(Some(status.clone()), c, Some(STEP))))
}

/// What `node` still holds: jobs holding capacity there, or a start in flight the engine
/// knows of.
fn left_on(ctx: &Context, node: &str) -> Vec<String> {
    ctx.manager.mirror().read(|m| {
        let mut left: Vec<String> = m
            .jobs
            .values()
            .filter(|j| {
                j.instances
                    .iter()
                    .any(|i| i.node_id == node && i.holds_capacity())
            })
            .map(|j| j.job_id.clone())
            .collect();
        if left.is_empty()
            && (ctx.state.node_view(node))
                .is_some_and(|v| v.used_capacity > 0.0 || v.used_cores > 0)
        {
            left.push("a start in flight".into());
        }
        left
    })
}

/// Gives up emptying `node`: it is uncordoned and stays; the cool-down starts.
async fn abandon(
    pool: &PlacementPool,
    ctx: &Arc<Context>,
    node: &str,
    migrations: &[Migration],
    status: &mut ConsolidationStatus,
    why: &str,
) -> Pass {
    let now = ctx.clock.now();
    release(ctx, node);
    // The node's Migrations that ended go (their Events stay): their names are the node's and
    // the job's, so a later attempt on this node must not find them. Those still running finish.
    for m in migrations
        .iter()
        .filter(|m| super::drain::outcome(m) != MigrationOutcome::InFlight)
    {
        if let Some(ns) = m.namespace() {
            match Api::<Migration>::namespaced(ctx.client.clone(), &ns)
                .delete(&m.name_any(), &DeleteParams::background())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    tracing::warn!(migration = %m.name_any(), error = %e, "consolidation: could not delete an ended Migration");
                }
            }
        }
    }
    status.current_node = None;
    status.last_action_at = Some(now);
    ctx.metrics.consolidation_abandoned(&pool.name_any());
    ctx.event(
        pool,
        EventType::Warning,
        "ConsolidationAbandoned",
        "Consolidate",
        api::bounded::clip(&format!("node {node} is kept: {why}"), 1024).into_owned(),
    )
    .await;
    tracing::warn!(pool = %pool.name_any(), node = %node, why = %why, "consolidation: node kept");
    Pass {
        status: Some(status.clone()),
        condition: consolidating(
            pool,
            ctx,
            false,
            "Abandoned",
            format!("gave up emptying node {node}: {why}"),
        ),
        requeue: Some(STEP),
    }
}

/// Placement stops using `node` (consolidation empties it).
fn hold(ctx: &Context, node: &str) {
    set_consolidating(ctx, node, true);
}

/// Placement may use `node` again.
fn release(ctx: &Context, node: &str) {
    set_consolidating(ctx, node, false);
}

fn set_consolidating(ctx: &Context, node: &str, consolidating: bool) {
    let changed =
        (ctx.manager.mirror()).read(|m| ctx.state.set_consolidating(m, node, consolidating));
    if changed && let Some(pool) = ctx.manager.mirror().node(node).map(|n| n.pool) {
        ctx.wake_pool(&pool);
    }
}

/// Every Bundle the operator watches, by Manager's bundle id.
async fn list_bundles(ctx: &Context) -> Result<HashMap<String, Bundle>, Error> {
    let mut out = HashMap::new();
    for a in super::bundle_apis(ctx) {
        for b in a.list(&ListParams::default()).await? {
            if b.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let id = mapping::bundle_id(&b.namespace().unwrap_or_default(), &b.name_any());
            out.insert(id, b);
        }
    }
    Ok(out)
}

/// The planner's input from the mirror, the placement model and the Bundles, and its plan.
fn plan(
    pool: &PlacementPool,
    ctx: &Context,
    spec: &api::ConsolidationSpec,
    bundles: &HashMap<String, Bundle>,
    now: DateTime<Utc>,
) -> policy::Plan {
    let name = pool.name_any();
    let pool_spec = mapping::pool(&name, &pool.spec);
    ctx.manager.mirror().read(|m| {
        let ids: HashSet<&str> = m
            .nodes
            .values()
            .filter(|n| n.pool == name)
            .map(|n| n.node_id.as_str())
            .collect();
        let (nodes, mut held) = pool_nodes(m, &ctx.state, &name, spec, now);
        let bundle_ids: BTreeSet<&str> = ids
            .iter()
            .flat_map(|id| m.jobs_on(id))
            .map(|j| j.bundle_id.as_str())
            .collect();
        let jobs = placed_jobs(m, &ids, &bundle_ids, bundles, &mut held);
        let rules = bundle_rules(&bundle_ids, bundles);
        policy::plan(&policy::Input {
            pool: &pool_spec,
            nodes: &nodes,
            held: &held,
            jobs: &jobs,
            bundles: &rules,
            min_nodes: spec.min_nodes(),
            max_nodes: ConsolidationStatus::MAX_PLANNED_NODES,
        })
    })
}

/// The pool's nodes as the engine sees them, and those held back with why: too young, or a
/// start in flight there (the engine holds what the mirror shows plus starts in flight).
fn pool_nodes(
    m: &MirrorState,
    s: &State,
    pool: &str,
    spec: &api::ConsolidationSpec,
    now: DateTime<Utc>,
) -> (Vec<pl::NodeSpec>, BTreeMap<String, String>) {
    let min_age_ms = i64::try_from(spec.min_node_age().as_millis()).unwrap_or(i64::MAX);
    let now_ms = now.timestamp_millis();
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    let mut nodes = Vec::new();
    for (n, spec, view) in s.pool_nodes(m, pool) {
        let Some(spec) = spec else {
            continue;
        };
        if now_ms.saturating_sub(n.created_at_ms) < min_age_ms {
            held.insert(
                n.node_id.clone(),
                "up for less than minNodeAgeSeconds".into(),
            );
        }
        if let Some(v) = view
            && (v.used_capacity > spec.used_capacity + 1e-6 || v.used_cores > spec.used_cores)
        {
            held.insert(n.node_id.clone(), "a start is in flight there".into());
        }
        nodes.push(spec);
    }
    (nodes, held)
}

/// Every running job of the bundles with a job in the pool (the candidates for moves, and the
/// positions their rules are checked against). A job starting, stopping or moving holds its
/// nodes in the pool still (`held`).
fn placed_jobs(
    m: &MirrorState,
    ids: &HashSet<&str>,
    bundle_ids: &BTreeSet<&str>,
    bundles: &HashMap<String, Bundle>,
    held: &mut BTreeMap<String, String>,
) -> Vec<PlacedJob> {
    let mut jobs = Vec::new();
    for j in m.jobs.values() {
        let busy = j.instances.iter().any(|i| {
            i.holds_capacity()
                && (i.state != proto::JobState::Running as i32
                    || i.role == proto::JobRole::MigrationTarget as i32)
        });
        for i in j
            .instances
            .iter()
            .filter(|i| busy && ids.contains(i.node_id.as_str()))
        {
            let why = format!("job {} is starting, stopping or moving", j.job_id);
            held.insert(i.node_id.clone(), why);
        }
        if !bundle_ids.contains(j.bundle_id.as_str()) || j.node_id.is_empty() {
            continue;
        }
        let running = j.instances.iter().any(|i| {
            i.node_id == j.node_id && i.is_normal() && i.state == proto::JobState::Running as i32
        });
        if !running {
            continue;
        }
        let declared = bundles
            .get(&j.bundle_id)
            .and_then(|b| b.spec.jobs.iter().find(|x| x.job_name == j.job_name));
        jobs.push(PlacedJob {
            job_id: j.job_id.clone(),
            bundle_id: j.bundle_id.clone(),
            replica: j.replica,
            spec: declared.map_or_else(|| undeclared_job(j), mapping::job),
            node: j.node_id.clone(),
            zone: m.zone_of(&j.node_id).map(str::to_owned),
            strategy: declared
                .and_then(|d| d.migration.map(|x| x.strategy))
                .unwrap_or_default(),
        });
    }
    jobs
}

/// A job its Bundle no longer declares, by Manager's record of its requirements.
fn undeclared_job(j: &proto::Job) -> pl::JobSpec {
    let (cap, cores) = j.requirements.as_ref().map_or((0.0, 0), |r| {
        (
            r.required_capacity,
            u32::try_from(r.required_cores).unwrap_or(0),
        )
    });
    pl::JobSpec::new(&j.job_name, cap, cores, pl::PriorityBand::Gold)
}

/// The placement rules of each bundle with a job in the pool.
fn bundle_rules(
    bundle_ids: &BTreeSet<&str>,
    bundles: &HashMap<String, Bundle>,
) -> BTreeMap<String, BundleRules> {
    bundle_ids
        .iter()
        .filter_map(|id| {
            let b = bundles.get(*id)?;
            let rules = BundleRules {
                intra_replica: mapping::rules(&b.spec.intra_replica_rules()),
                inter_replica: mapping::rules(&b.spec.inter_replica_placement),
                allow_stop_then_start: b
                    .spec
                    .disruption
                    .as_ref()
                    .is_some_and(|d| d.allow_stop_then_start_consolidation),
            };
            Some(((*id).to_owned(), rules))
        })
        .collect()
}

/// The plan as status keeps it (bounded).
fn bounded_plan(plan: &policy::Plan) -> Vec<ConsolidationNode> {
    plan.nodes
        .iter()
        .take(ConsolidationStatus::MAX_PLANNED_NODES)
        .map(|n| ConsolidationNode {
            node: n.node.clone(),
            moves: n
                .moves
                .iter()
                .take(ConsolidationStatus::MAX_MOVES_PER_NODE)
                .map(|m| ConsolidationMove {
                    job_id: m.job_id.clone(),
                    bundle: mapping::bundle_object(&m.bundle_id)
                        .map(|(ns, b)| format!("{ns}/{b}"))
                        .unwrap_or_else(|| m.bundle_id.clone()),
                    replica: i32::try_from(m.replica).unwrap_or(i32::MAX),
                    job_name: m.job_name.clone(),
                    target_node: m.target.clone(),
                })
                .collect(),
            moves_omitted: i32::try_from(
                n.moves
                    .len()
                    .saturating_sub(ConsolidationStatus::MAX_MOVES_PER_NODE),
            )
            .unwrap_or(i32::MAX),
        })
        .collect()
}

/// Creates the Migration of one planned move (it exists already after a restart: fine).
async fn create_migration(
    ctx: &Context,
    owner: Option<OwnerReference>,
    node: &str,
    m: &policy::Move,
) -> Result<(), Error> {
    let Some((ns, bundle)) = mapping::bundle_object(&m.bundle_id) else {
        return Ok(());
    };
    let job = MigrationJobRef {
        bundle,
        replica: i32::try_from(m.replica).unwrap_or(i32::MAX),
        job_name: m.job_name.clone(),
    };
    let req = MoveRequest::new(&ns, MoveName::Stable(migration_name(node, &m.job_id)), job)
        .to(Some(m.target.clone()))
        .label(
            api::CONSOLIDATION_NODE_LABEL,
            super::drain::node_label(node),
        )
        .label(api::PURPOSE_LABEL, "consolidation")
        .annotate(api::CONSOLIDATION_NODE_ANNOTATION, node)
        .owned_by(owner);
    if let Requested::Created(name) = request_move(ctx, &req).await? {
        tracing::info!(node = %node, job = %m.job_id, target = %m.target, migration = %name, "consolidation: migrating job");
    }
    Ok(())
}
