//! Consolidation: which nodes of an elastic binpack pool can be emptied by moving their jobs
//! onto the pool's other nodes, and where each job goes.
//!
//! The TypeScript library (`@norskvideo/norsk-auto-manager`) never gives a node back once it has
//! provisioned one; the operator adds consolidation (as Karpenter does for pods), but only with
//! moves that do not drop output. The rules:
//!
//! 1. only jobs whose migration strategy is `handover` or `overlap` move; a `stopThenStart`
//!    job only when its bundle allows it (`allow_stop_then_start`). A node holding any job that
//!    may not move, or a job the operator does not manage, is kept;
//! 2. every target is chosen by the placement engine ([`automanager_placement`]) with the job's
//!    own rules, among ready, healthy, uncordoned, non-spare nodes of the same pool that are not
//!    themselves being emptied; the pool is treated as fixed for the plan, so a move never asks
//!    for a new node. A move the engine can only make by breaking a soft rule is not planned
//!    either (consolidation must not make a placement worse); hard rules are filters, so they
//!    always hold;
//! 3. jobs that must share a node (`coLocateWith`, intra-replica `sameNode: hard`) are never
//!    moved: Migrations move one job at a time, and moving them apart would break the rule
//!    while they move. Their node is kept;
//! 4. never fewer non-spare nodes than `min_nodes`; spares are never emptied (they belong to
//!    their HotSpareTarget) and never receive a moved job (first placements do not use them);
//! 5. the cheapest nodes go first: least used capacity, then fewest jobs, then node id. Each
//!    emptied node's moves are reserved in the engine before the next node is tried, so the
//!    plan as a whole fits; a node that takes moved jobs is not emptied in the same plan (no job
//!    moves twice). A node that is already empty is planned with no moves.
//!
//! Pure and deterministic: the same input, in any order, gives the same plan.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use automanager_placement as pl;
use chrono::{DateTime, TimeDelta, Utc};

use crate::MigrationStrategy;
use crate::bounded::join_bounded;
use crate::drain::MigrationOutcome;

/// A job running on a node, as consolidation sees it. Jobs of the pool's nodes are the
/// candidates for moves; jobs of the same bundles elsewhere (other pools) are only positions
/// the rules are checked against.
#[derive(Debug, Clone, PartialEq)]
pub struct PlacedJob {
    /// Manager's job id (unique).
    pub job_id: String,
    /// The engine's bundle id (Manager's).
    pub bundle_id: String,
    pub replica: u32,
    /// The job as the engine sees it (name, requirements, co-location).
    pub spec: pl::JobSpec,
    /// The node its running instance is on.
    pub node: String,
    /// The node's zone, for rules checked against this job's position.
    pub zone: Option<String>,
    /// The strongest migration promise the job declares.
    pub strategy: MigrationStrategy,
}

/// The placement rules of one bundle, and whether it lets consolidation stop its jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct BundleRules {
    pub intra_replica: pl::PlacementRules,
    pub inter_replica: pl::PlacementRules,
    /// `spec.disruption.allowStopThenStartConsolidation`: its `stopThenStart` jobs may be moved
    /// (with the gap that strategy has).
    pub allow_stop_then_start: bool,
}

/// What the planner is given.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    /// The pool being consolidated.
    pub pool: &'a pl::PoolSpec,
    /// The pool's nodes (others are ignored), as the engine sees them.
    pub nodes: &'a [pl::NodeSpec],
    /// Nodes the caller will not empty, with why (for example: too young, a job of another
    /// client on it, a start in flight). They still receive moves.
    pub held: &'a BTreeMap<String, String>,
    /// Every running job of the bundles with a job on the pool.
    pub jobs: &'a [PlacedJob],
    /// Rules per bundle id; a job whose bundle is missing here is not moved.
    pub bundles: &'a BTreeMap<String, BundleRules>,
    /// The fewest non-spare nodes the pool keeps.
    pub min_nodes: u32,
    /// The most nodes one plan empties (bounds status and the work of one pass).
    pub max_nodes: usize,
}

/// One planned move.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Move {
    pub job_id: String,
    pub bundle_id: String,
    pub replica: u32,
    pub job_name: String,
    pub target: String,
}

/// A node the plan empties, and the moves that empty it (none: it is empty already).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedNode {
    pub node: String,
    pub moves: Vec<Move>,
}

/// Why a node of the pool is not in the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeepReason {
    /// Emptying it would leave fewer than `min_nodes` non-spare nodes.
    Floor { min_nodes: u32 },
    /// A hot spare: its HotSpareTarget decides.
    Spare,
    /// Cordoned, unhealthy or still starting: not a node to judge now.
    NotReady,
    /// The caller's reason.
    Held(String),
    /// A job that may not move: its strategy, no allowance, co-located, or not managed.
    Immovable { job_id: String, why: String },
    /// A job the other nodes have no room for, under its rules.
    NoRoom { job_id: String },
    /// The plan already empties `max_nodes` nodes.
    PlanFull,
    /// It takes jobs the plan moves off other nodes.
    Target,
}

impl std::fmt::Display for KeepReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeepReason::Floor { min_nodes } => {
                write!(f, "the pool keeps at least {min_nodes} node(s)")
            }
            KeepReason::Spare => f.write_str("a hot spare"),
            KeepReason::NotReady => f.write_str("cordoned, unhealthy or starting"),
            KeepReason::Held(why) => f.write_str(why),
            KeepReason::Immovable { job_id, why } => write!(f, "job {job_id} {why}"),
            KeepReason::NoRoom { job_id } => write!(
                f,
                "no other node can take job {job_id} under its rules without breaking one"
            ),
            KeepReason::PlanFull => f.write_str("the plan is full for this pass"),
            KeepReason::Target => f.write_str("takes jobs moved off other nodes"),
        }
    }
}

/// The plan: nodes to empty, in order, and why each other node stays.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    pub nodes: Vec<PlannedNode>,
    pub kept: Vec<(String, KeepReason)>,
}

impl Plan {
    /// One line about the plan: the nodes it empties, and how many nodes are kept for which
    /// reason.
    pub fn summary(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("{} ({} moves)", n.node, n.moves.len()))
            .collect();
        let mut kept: BTreeMap<String, usize> = BTreeMap::new();
        for (_, why) in &self.kept {
            let key = match why {
                KeepReason::Immovable { .. } => "a job that may not move".to_owned(),
                KeepReason::NoRoom { .. } => "no room elsewhere".to_owned(),
                KeepReason::Held(_) => "busy or too young".to_owned(),
                other => other.to_string(),
            };
            *kept.entry(key).or_default() += 1;
        }
        let kept: Vec<String> = kept.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let head = if nodes.is_empty() {
            "no node can be emptied".to_owned()
        } else {
            format!(
                "would empty {} node(s): {}",
                nodes.len(),
                join_bounded(&nodes, ", ", 600)
            )
        };
        if kept.is_empty() {
            head
        } else {
            format!("{head}; kept: {}", kept.join(", "))
        }
    }
}

/// What a pass does with a fresh plan in mode `enabled`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Next<'a> {
    /// No node can be emptied.
    Nothing,
    /// The last node was emptied (or given up on) less than the cool-down ago.
    CoolDown {
        /// When the next node may be begun.
        until: DateTime<Utc>,
    },
    /// Begin emptying this node (the plan's first).
    Empty(&'a PlannedNode),
}

/// The next step for `plan`: one node at a time, with `cooldown` between the last action
/// (`last_action`) and the next.
pub fn next<'a>(
    plan: &'a Plan,
    last_action: Option<DateTime<Utc>>,
    cooldown: Duration,
    now: DateTime<Utc>,
) -> Next<'a> {
    let Some(first) = plan.nodes.first() else {
        return Next::Nothing;
    };
    let cooldown = TimeDelta::from_std(cooldown).unwrap_or(TimeDelta::zero());
    match last_action.map(|last| last + cooldown) {
        Some(until) if until > now => Next::CoolDown { until },
        _ => Next::Empty(first),
    }
}

/// How the moves off the node being emptied stand, by their Migrations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// A Migration ended without moving its job: the node is given up on.
    Failed {
        /// The Migration's name.
        migration: String,
        /// The phase it ended in.
        phase: String,
    },
    /// Moves still under way.
    Moving { done: usize, total: usize },
    /// Every move is done.
    Done { total: usize },
}

/// Where the node's moves stand: `migrations` is (name, outcome, phase) per Migration. A move a
/// deadline took over (a reclaim notice: the node is taken anyway) gives the node up too.
pub fn progress(migrations: &[(String, MigrationOutcome, String)]) -> Progress {
    if let Some((name, _, phase)) = migrations
        .iter()
        .find(|(_, o, _)| matches!(o, MigrationOutcome::Failed | MigrationOutcome::TakenOver))
    {
        return Progress::Failed {
            migration: name.clone(),
            phase: phase.clone(),
        };
    }
    let total = migrations.len();
    let done = migrations
        .iter()
        .filter(|(_, o, _)| *o == MigrationOutcome::Completed)
        .count();
    if done < total {
        Progress::Moving { done, total }
    } else {
        Progress::Done { total }
    }
}

/// Nodes needed at the least for `jobs` (capacity and cores summed) on nodes of
/// `node_capacity` and `node_cores`, rounded up: the bound a perfect packing could reach.
pub fn lower_bound(jobs: &[pl::Requirements], node_capacity: f64, node_cores: u32) -> u32 {
    let cap: f64 = jobs.iter().map(|r| r.required_capacity.max(0.0)).sum();
    let cores: u64 = jobs.iter().map(|r| u64::from(r.required_cores)).sum();
    let by_cap = if node_capacity > 0.0 {
        (cap / node_capacity - 1e-9).ceil().max(0.0)
    } else {
        0.0
    };
    let by_cores = if node_cores > 0 {
        cores.div_ceil(u64::from(node_cores))
    } else {
        0
    };
    // Float to int: by_cap is a small non-negative whole number here.
    let by_cap = by_cap.min(f64::from(u32::MAX)) as u32;
    by_cap.max(u32::try_from(by_cores).unwrap_or(u32::MAX))
}

/// Why `job` may not be moved by consolidation, if it may not.
fn immovable(job: &PlacedJob, rules: Option<&BundleRules>, co_located: bool) -> Option<String> {
    let Some(rules) = rules else {
        return Some("belongs to no Bundle the operator manages".into());
    };
    if job.strategy == MigrationStrategy::StopThenStart && !rules.allow_stop_then_start {
        return Some(
            "moves only with stopThenStart and its Bundle does not set allowStopThenStartConsolidation"
                .into(),
        );
    }
    if co_located || rules.intra_replica.same_node == Some(pl::Strength::Hard) {
        return Some("must share a node with another job of its replica".into());
    }
    None
}

/// The plan for `input`. See the module docs for the rules.
pub fn plan(input: &Input<'_>) -> Plan {
    let pool = &input.pool.name;
    let mut nodes: Vec<&pl::NodeSpec> = input.nodes.iter().filter(|n| &n.pool == pool).collect();
    nodes.sort_by(|a, b| a.id.cmp(&b.id));
    nodes.dedup_by(|a, b| a.id == b.id);

    // The engine sees the pool as fixed (no provisioning) and nodes still starting as cordoned
    // (a move must land on a node that runs now).
    let mut fixed = input.pool.clone();
    fixed.scale_out = pl::ScaleOut::Fixed;
    fixed.max_nodes = None;
    let snapshot = pl::ClusterSnapshot {
        pools: vec![fixed],
        nodes: nodes
            .iter()
            .map(|n| {
                let mut n = (*n).clone();
                if n.pending_since_ms.is_some() {
                    n.cordoned = true;
                    n.pending_since_ms = None;
                }
                n
            })
            .collect(),
        pending_window_ms: 0,
    };
    let (mut engine, _) = pl::Engine::new_lenient(snapshot);

    // Current (planned) position of every job, by job id; jobs sorted for determinism.
    let mut jobs: Vec<&PlacedJob> = input.jobs.iter().collect();
    jobs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    jobs.dedup_by(|a, b| a.job_id == b.job_id);
    let mut position: BTreeMap<&str, (String, Option<String>)> = jobs
        .iter()
        .map(|j| (j.job_id.as_str(), (j.node.clone(), j.zone.clone())))
        .collect();
    let mut on_node: BTreeMap<&str, Vec<&PlacedJob>> = BTreeMap::new();
    for j in &jobs {
        on_node.entry(j.node.as_str()).or_default().push(j);
    }
    // Jobs joined by coLocateWith, either way round.
    let co_located: BTreeSet<(&str, u32, &str)> = jobs
        .iter()
        .flat_map(|j| {
            j.spec.co_locate_with.iter().flat_map(move |other| {
                [
                    (j.bundle_id.as_str(), j.replica, j.spec.job_name.as_str()),
                    (j.bundle_id.as_str(), j.replica, other.as_str()),
                ]
            })
        })
        .collect();

    let non_spare = nodes.iter().filter(|n| !n.spare).count();
    let floor = usize::try_from(input.min_nodes).unwrap_or(usize::MAX);
    let mut removable = non_spare.saturating_sub(floor);

    let mut out = Plan::default();
    let mut candidates = Vec::new();
    for n in &nodes {
        let reason = if n.spare {
            Some(KeepReason::Spare)
        } else if n.cordoned || !n.healthy || n.pending_since_ms.is_some() {
            Some(KeepReason::NotReady)
        } else {
            input
                .held
                .get(&n.id)
                .map(|why| KeepReason::Held(why.clone()))
        };
        match reason {
            Some(r) => out.kept.push((n.id.clone(), r)),
            None => candidates.push(*n),
        }
    }
    let jobs_on = |id: &str| on_node.get(id).map_or(0, Vec::len);
    candidates.sort_by(|a, b| {
        a.used_capacity
            .total_cmp(&b.used_capacity)
            .then(a.used_cores.cmp(&b.used_cores))
            .then(jobs_on(&a.id).cmp(&jobs_on(&b.id)))
            .then(a.id.cmp(&b.id))
    });

    let mut targets: BTreeSet<String> = BTreeSet::new();
    for node in candidates {
        if removable == 0 {
            out.kept.push((
                node.id.clone(),
                KeepReason::Floor {
                    min_nodes: input.min_nodes,
                },
            ));
            continue;
        }
        if out.nodes.len() >= input.max_nodes {
            out.kept.push((node.id.clone(), KeepReason::PlanFull));
            continue;
        }
        let mut here: Vec<&PlacedJob> = on_node.get(node.id.as_str()).cloned().unwrap_or_default();
        // Largest first: the hardest to fit picks before the small ones fill the gaps.
        here.sort_by(|a, b| {
            b.spec
                .requirements
                .required_capacity
                .total_cmp(&a.spec.requirements.required_capacity)
                .then(
                    b.spec
                        .requirements
                        .required_cores
                        .cmp(&a.spec.requirements.required_cores),
                )
                .then(a.job_id.cmp(&b.job_id))
        });
        if let Some((job, why)) = here.iter().find_map(|j| {
            let key = (j.bundle_id.as_str(), j.replica, j.spec.job_name.as_str());
            immovable(
                j,
                input.bundles.get(&j.bundle_id),
                co_located.contains(&key),
            )
            .map(|why| (j.job_id.clone(), why))
        }) {
            out.kept
                .push((node.id.clone(), KeepReason::Immovable { job_id: job, why }));
            continue;
        }
        if targets.contains(&node.id) {
            out.kept.push((node.id.clone(), KeepReason::Target));
            continue;
        }
        match try_empty(&mut engine, node, &here, &jobs, &position, input.bundles) {
            Ok(moves) => {
                for m in &moves {
                    let zone = engine.node_view(&m.target).and_then(|v| v.zone);
                    position.insert(
                        here.iter()
                            .find(|j| j.job_id == m.job_id)
                            .map_or("", |j| j.job_id.as_str()),
                        (m.target.clone(), zone),
                    );
                }
                removable -= 1;
                targets.extend(moves.iter().map(|m| m.target.clone()));
                out.nodes.push(PlannedNode {
                    node: node.id.clone(),
                    moves,
                });
            }
            Err(job_id) => out
                .kept
                .push((node.id.clone(), KeepReason::NoRoom { job_id })),
        }
    }
    out.kept.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Places every job of `node` elsewhere in `engine`, reserving as it goes and cordoning
/// `node`; on success the engine keeps the reservations and the cordon. On failure everything
/// is undone and the job that did not fit is named.
fn try_empty(
    engine: &mut pl::Engine,
    node: &pl::NodeSpec,
    here: &[&PlacedJob],
    all: &[&PlacedJob],
    position: &BTreeMap<&str, (String, Option<String>)>,
    bundles: &BTreeMap<String, BundleRules>,
) -> Result<Vec<Move>, String> {
    // Cordoning cannot fail for a node the engine holds; one it lacks is never a target anyway.
    let _ = engine.set_cordoned(&node.id, true);
    let mut moved: Vec<(pl::JobKey, &PlacedJob, String)> = Vec::new();
    let mut failed = None;
    for job in here {
        let Some(rules) = bundles.get(&job.bundle_id) else {
            failed = Some(job.job_id.clone());
            break;
        };
        // Positions as planned so far: jobs moved earlier (this node's too) are at their target.
        let at = |j: &PlacedJob| {
            if let Some((_, _, t)) = moved.iter().find(|(_, m, _)| m.job_id == j.job_id) {
                return (t.clone(), engine.node_view(t).and_then(|v| v.zone));
            }
            position
                .get(j.job_id.as_str())
                .cloned()
                .unwrap_or((j.node.clone(), j.zone.clone()))
        };
        let mut other_replicas = Vec::new();
        let mut placed_siblings = Vec::new();
        for j in all
            .iter()
            .filter(|j| j.bundle_id == job.bundle_id && j.job_id != job.job_id)
        {
            let (node, zone) = at(j);
            if j.replica == job.replica {
                placed_siblings.push(pl::SiblingPosition {
                    job_name: j.spec.job_name.clone(),
                    node,
                    zone,
                });
            } else {
                other_replicas.push(pl::Position { node, zone });
            }
        }
        let mut spec = job.spec.clone();
        crate::migration::require_target_capability(
            job.strategy,
            &mut spec.requirements.required_capabilities,
        );
        let request = pl::PlacementRequest {
            bundle_id: job.bundle_id.clone(),
            replica_index: job.replica,
            jobs: vec![spec],
            pools: vec![node.pool.clone()],
            kind: pl::PlacementKind::First,
            intra_replica: rules.intra_replica,
            inter_replica: rules.inter_replica,
            other_replicas,
            placed_siblings,
        };
        let decision = engine.place(&request, 0);
        let target = match &decision.outcome {
            pl::Outcome::Placed { assignments, .. }
                if decision.trace.broken_soft_rules.is_empty() =>
            {
                assignments
                    .first()
                    .filter(|a| !a.node_pending && a.node != node.id)
                    .map(|a| a.node.clone())
            }
            _ => None,
        };
        let Some(target) = target else {
            failed = Some(job.job_id.clone());
            break;
        };
        if engine.commit(&decision).is_err() {
            failed = Some(job.job_id.clone());
            break;
        }
        let key = pl::JobKey {
            bundle_id: job.bundle_id.clone(),
            replica_index: job.replica,
            job_name: job.spec.job_name.clone(),
        };
        moved.push((key, job, target));
    }
    if let Some(job) = failed {
        for (key, _, _) in &moved {
            engine.release_job(key);
        }
        let _ = engine.set_cordoned(&node.id, false);
        return Err(job);
    }
    let mut moves: Vec<Move> = moved
        .into_iter()
        .map(|(key, job, target)| Move {
            job_id: job.job_id.clone(),
            bundle_id: key.bundle_id,
            replica: key.replica_index,
            job_name: key.job_name,
            target,
        })
        .collect();
    moves.sort();
    Ok(moves)
}

#[cfg(test)]
mod tests;
