//! `trace`: a bundle's placement decisions as a tree a person can read: the pools tried and why
//! each was left, candidates rejected by reason, the node chosen for each job and why, and the
//! soft rules the decision had to break.

use std::collections::BTreeMap;

use automanager_placement as pl;
use serde::{Deserialize, Serialize};

use super::{Tree, num};

/// The operator's `/debug/trace/<namespace>/<bundle>` answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleTrace {
    pub namespace: String,
    pub bundle: String,
    #[serde(default)]
    pub bundle_id: String,
    #[serde(default)]
    pub replicas: Vec<ReplicaTrace>,
}

/// One replica's last decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaTrace {
    pub replica: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    /// The operator replica that made the decision (the placement history records it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<String>,
    #[serde(default)]
    pub recovery: bool,
    pub decision: pl::Decision,
    /// Bronze jobs stopped to make room for this recovery (preemption), when it had to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted: Option<automanager_api::Preemption>,
}

/// What to show.
#[derive(Debug, Clone, Default)]
pub struct TraceView {
    /// Only this replica.
    pub replica: Option<u32>,
    /// Only this job (its assignment or its unplaceable reason; pools are per replica).
    pub job: Option<String>,
    /// Packing strategy per pool (`binpack` / `spread`), to say why a node won.
    pub packing: BTreeMap<String, String>,
    /// More detail: reserved capacity per job, pending nodes, every pool's outcome.
    pub wide: bool,
}

impl BundleTrace {
    /// The trace narrowed to `view`'s replica and job. `Err` names what matched nothing.
    pub fn filtered(&self, view: &TraceView) -> Result<BundleTrace, String> {
        let mut out = self.clone();
        if let Some(r) = view.replica {
            out.replicas.retain(|t| t.replica == r);
            if out.replicas.is_empty() {
                let known: Vec<String> = self
                    .replicas
                    .iter()
                    .map(|t| t.replica.to_string())
                    .collect();
                return Err(format!(
                    "bundle {}/{} has no decision for replica {r} (replicas with one: {})",
                    self.namespace,
                    self.bundle,
                    if known.is_empty() {
                        "none".into()
                    } else {
                        known.join(", ")
                    }
                ));
            }
        }
        if let Some(job) = &view.job {
            let mut found = false;
            for t in &mut out.replicas {
                match &mut t.decision.outcome {
                    pl::Outcome::Placed { assignments, .. } => {
                        assignments.retain(|a| &a.job_name == job);
                        found |= !assignments.is_empty();
                    }
                    pl::Outcome::Unplaceable { jobs } => {
                        jobs.retain(|j| &j.job_name == job);
                        found |= !jobs.is_empty();
                    }
                    // A provision is for the whole replica.
                    pl::Outcome::Provision { .. } => found = true,
                }
            }
            if !found {
                return Err(format!(
                    "no decision of bundle {}/{} mentions job {job:?}",
                    self.namespace, self.bundle
                ));
            }
        }
        Ok(out)
    }
}

/// The whole trace as text.
pub fn render(trace: &BundleTrace, view: &TraceView) -> String {
    let mut root = Tree::new(format!(
        "Bundle {}/{} (Manager bundle id {})",
        trace.namespace, trace.bundle, trace.bundle_id
    ));
    if trace.replicas.is_empty() {
        root = root.leaf("no placement decision yet");
    }
    for t in &trace.replicas {
        root = root.child(replica_tree(t, view));
    }
    root.render()
}

/// One replica's decision as a subtree (also used by `what-if`).
pub fn replica_tree(t: &ReplicaTrace, view: &TraceView) -> Tree {
    let d = &t.decision;
    let kind = if t.recovery {
        "recovery placement (may use hot spares)"
    } else {
        "first placement"
    };
    let outcome = match &d.outcome {
        pl::Outcome::Placed { .. } if d.is_split() => {
            let mut pools: Vec<&str> = Vec::new();
            for j in &d.trace.jobs {
                if !pools.contains(&j.pool.as_str()) {
                    pools.push(&j.pool);
                }
            }
            format!("placed split across {}", pools.join(", "))
        }
        pl::Outcome::Placed { pool, .. } => format!("placed in {pool}"),
        pl::Outcome::Provision {
            pool,
            instance_type,
            zone,
        } => format!(
            "provisioning a new {instance_type} in {pool}{}",
            zone.as_deref()
                .map(|z| format!(" (zone {z})"))
                .unwrap_or_default()
        ),
        pl::Outcome::Unplaceable { .. } => "unplaceable".to_owned(),
    };
    let when = t
        .decided_at
        .as_deref()
        .map(|w| format!(" · decided {w}"))
        .unwrap_or_default();
    let by = t
        .leader
        .as_deref()
        .map(|l| format!(" by {l}"))
        .unwrap_or_default();
    let when = format!("{when}{by}");
    let mut node = Tree::new(format!("replica {} · {outcome} · {kind}{when}", t.replica));
    if let Some(p) = &t.preempted {
        node = node.leaf(format!(
            "preempted: no capacity and no hot spare, so bronze job(s) {} on node {} were stopped (and dropped) at {} to make room",
            p.victims.join(", "),
            p.node,
            p.at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }

    // Pools tried.
    let mut pools = Tree::new("pools tried, in order");
    for (i, p) in d.trace.pools.iter().enumerate() {
        pools = pools.child(pool_tree(i + 1, p, view));
    }
    if d.trace.pools.is_empty() {
        pools = pools.leaf("none");
    }
    node = node.child(pools);

    // No pool took the replica whole: where each job went, and the pools it left.
    if !d.trace.jobs.is_empty() {
        let mut jobs = Tree::new("no pool takes the whole replica; job by job");
        for j in &d.trace.jobs {
            let mut job = Tree::new(format!("{}: {}", j.job_name, j.pool));
            for (i, p) in j.pools_tried.iter().enumerate() {
                job = job.child(unit_pool_tree(i + 1, p, view));
            }
            jobs = jobs.child(job);
        }
        node = node.child(jobs);
    }

    // Rejections by reason, summed over the pools that were left.
    let summary = d.summary();
    if !summary.rejections.is_empty() {
        node = node.leaf(format!(
            "candidates rejected, by reason: {}",
            rejections(&summary.rejections)
        ));
    }

    // What was chosen, and why.
    match &d.outcome {
        pl::Outcome::Placed { pool, assignments } => {
            let mut chosen = Tree::new("chosen");
            for a in assignments {
                // A job of a replica split across pools is packed by its own pool.
                let job_pool = d.pool_of(&a.job_name).unwrap_or(pool);
                let packing = view.packing.get(job_pool).map(String::as_str);
                chosen = chosen.child(assignment_tree(a, packing, view.wide));
            }
            node = node.child(chosen);
        }
        pl::Outcome::Provision {
            pool,
            instance_type,
            ..
        } => {
            node = node.leaf(format!(
                "why: no existing node of {pool} can take the whole replica, and one new {instance_type} (the smallest candidate type that fits) would; the replica is placed once it is starting"
            ));
        }
        pl::Outcome::Unplaceable { jobs } => {
            let mut why = Tree::new("why each job could not be placed");
            for j in jobs {
                why = why.leaf(format!("{}: {}", j.job_name, j.reason));
            }
            node = node.child(why);
        }
    }

    let broken: Vec<&str> = d
        .trace
        .broken_soft_rules
        .iter()
        .map(|r| r.as_str())
        .collect();
    node = node.leaf(format!(
        "soft rules broken: {}",
        if broken.is_empty() {
            "none".to_owned()
        } else {
            format!("{} (a later rebalance may fix them)", broken.join(", "))
        }
    ));
    if !d.trace.message.is_empty() {
        node = node.leaf(format!("engine: {}", d.trace.message));
    }
    node
}

fn pool_tree(n: usize, p: &pl::PoolAttempt, view: &TraceView) -> Tree {
    pool_tree_for(n, p, view, false)
}

/// A pool as one job of a split replica tried it: left because no node could take that job
/// (with the jobs it shares a node with), not the whole replica.
fn unit_pool_tree(n: usize, p: &pl::PoolAttempt, view: &TraceView) -> Tree {
    pool_tree_for(n, p, view, true)
}

fn pool_tree_for(n: usize, p: &pl::PoolAttempt, view: &TraceView, unit: bool) -> Tree {
    let label = match p.outcome {
        pl::PoolOutcome::Placed => format!("{n}. {}: placed here", p.pool),
        pl::PoolOutcome::Provision => format!("{n}. {}: a new node is provisioned here", p.pool),
        pl::PoolOutcome::Left if unit => {
            let why = p.reason.map(left_reason).unwrap_or("left");
            format!(
                "{n}. {}: left, {}",
                p.pool,
                why.replace("the whole replica", "it")
            )
        }
        pl::PoolOutcome::Left => {
            let why = p.reason.map(left_reason).unwrap_or("left");
            let job = p
                .failed_job
                .as_deref()
                .map(|j| format!("; job {j} did not fit"))
                .unwrap_or_default();
            format!("{n}. {}: left, {why}{job}", p.pool)
        }
    };
    let label = if p.last_resort {
        format!("{label} (last resort: nodes of degraded zones allowed, as nothing else fits)")
    } else {
        label
    };
    let mut t = Tree::new(label);
    if !p.rejections.is_empty() {
        let mut sorted = p.rejections.clone();
        sorted.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
        t = t.leaf(format!("rejected: {}", rejections(&sorted)));
    } else if view.wide && p.outcome == pl::PoolOutcome::Left {
        t = t.leaf("rejected: no node to count");
    }
    t
}

fn assignment_tree(a: &pl::Assignment, packing: Option<&str>, wide: bool) -> Tree {
    let zone = a
        .zone
        .as_deref()
        .map(|z| format!(" (zone {z})"))
        .unwrap_or_default();
    let pending = if a.node_pending {
        ", still starting"
    } else {
        ""
    };
    let mut t = Tree::new(format!("{} → {}{zone}{pending}", a.job_name, a.node));
    let tier = match a.score.tier {
        pl::Tier::BandSpare => {
            "a hot spare dedicated to the job's band (recovery takes these first)"
        }
        pl::Tier::Spare => "a shared hot spare (recovery takes spares before ordinary nodes)",
        pl::Tier::Node => "an ordinary node",
        pl::Tier::NewNode => "the node being provisioned for this replica",
    };
    let how = match packing {
        Some("binpack") => "; binpack takes the fullest node that fits",
        Some("spread") => "; spread takes the emptiest node that fits",
        _ => "",
    };
    t = t.leaf(format!(
        "why: {tier}{how}: {} capacity and {} cores left after",
        num(a.score.free_capacity_after),
        a.score.free_cores_after
    ));
    if wide {
        t = t.leaf(format!(
            "reserves {} capacity and {} cores",
            num(a.capacity),
            a.cores
        ));
    }
    t
}

fn rejections(list: &[pl::RejectionCount]) -> String {
    list.iter()
        .map(|r| format!("{} {}", r.reason.as_str(), r.count))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a pool was left, for people.
pub fn left_reason(r: pl::PoolLeftReason) -> &'static str {
    match r {
        pl::PoolLeftReason::UnknownPool => "no PlacementPool of this name is loaded",
        pl::PoolLeftReason::Duplicate => "listed twice; the second mention is skipped",
        pl::PoolLeftReason::NoNodeFits => {
            "no node can take the whole replica and a fixed pool cannot grow"
        }
        pl::PoolLeftReason::MaxNodesReached => {
            "no node can take the whole replica and the pool is at (or above) its maxNodes"
        }
        pl::PoolLeftReason::NoInstanceTypeFits => {
            "no node can take the whole replica and no candidate instance type would"
        }
        pl::PoolLeftReason::Terminating => {
            "the PlacementPool is being deleted: what runs there stays, nothing new goes there"
        }
    }
}
