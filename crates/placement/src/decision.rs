//! What the engine answers: a [`Decision`] with its [`Trace`], and the bounded
//! [`TraceSummary`] the operator copies into status.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::PriorityBand;

/// Pools listed in a [`TraceSummary`]; more are counted in `poolsOmitted`.
pub const SUMMARY_MAX_POOLS: usize = 8;
/// Nodes listed in a [`TraceSummary`]; more are counted in `nodesOmitted`.
pub const SUMMARY_MAX_NODES: usize = 4;
/// Characters kept of the summary's `message`.
pub const SUMMARY_MAX_MESSAGE: usize = 240;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    pub bundle_id: String,
    pub replica_index: u32,
    pub outcome: Outcome,
    pub trace: Trace,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Outcome {
    /// Every job of the replica has a node.
    Placed {
        /// The pool of every job; for a replica split across pools, the most preferred pool
        /// any job landed in ([`Decision::pool_of`] gives each job's).
        pool: String,
        assignments: Vec<Assignment>,
    },
    /// No existing node can take the replica, but a new node of `instanceType` in this elastic
    /// pool (in `zone`, when the rules pick one) would (for a replica split across pools: would
    /// take the next of its units). Place again once it is starting.
    Provision {
        pool: String,
        instance_type: String,
        zone: Option<String>,
    },
    /// Nothing was placed; one entry per job of the request.
    Unplaceable { jobs: Vec<JobUnplaceable> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Assignment {
    pub job_name: String,
    pub node: String,
    pub zone: Option<String>,
    /// The node is still starting: start the job once it is up.
    pub node_pending: bool,
    /// What the job reserves on the node (copied from its requirements).
    pub capacity: f64,
    pub cores: u32,
    pub score: NodeScore,
}

/// Why the chosen node won: its preference tier and what it has left after this placement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeScore {
    pub tier: Tier,
    pub free_capacity_after: f64,
    pub free_cores_after: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Tier {
    /// A hot spare dedicated to the job's band.
    BandSpare,
    /// A hot spare serving any band.
    Spare,
    /// An ordinary node.
    Node,
    /// The node a `Provision` decision asks for.
    NewNode,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobUnplaceable {
    pub job_name: String,
    pub reason: UnplaceableReason,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum UnplaceableReason {
    /// The request names no pool the engine knows.
    NoUsablePool,
    /// The job's own input is malformed (NaN capacity, duplicate name, ...).
    InvalidJob { detail: String },
    /// Co-location and separation rules contradict each other.
    Contradictory { detail: String },
    /// The replica has more jobs than the engine places as a unit.
    TooManyJobs { count: usize, limit: usize },
    /// No node in any pool can host this job (with the jobs it must share a node with);
    /// `reason` is the most common rejection in the first pool that was tried.
    NoNodeFits { reason: Option<RejectReason> },
    /// This job would fit, but `blockingJob` cannot, and a replica is placed whole or not at all
    /// (in one pool, or split across pools when no single pool can take it).
    ReplicaIncomplete { blocking_job: String },
}

impl fmt::Display for UnplaceableReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UnplaceableReason::NoUsablePool => write!(f, "no usable pool in the preference list"),
            UnplaceableReason::InvalidJob { detail } => write!(f, "invalid job: {detail}"),
            UnplaceableReason::Contradictory { detail } => {
                write!(f, "contradictory rules: {detail}")
            }
            UnplaceableReason::TooManyJobs { count, limit } => {
                write!(
                    f,
                    "replica has {count} jobs, more than the limit of {limit}"
                )
            }
            UnplaceableReason::NoNodeFits { reason: Some(r) } => {
                write!(f, "no node fits (mostly: {})", r.as_str())
            }
            UnplaceableReason::NoNodeFits { reason: None } => {
                write!(f, "no node fits (pools have no nodes)")
            }
            UnplaceableReason::ReplicaIncomplete { blocking_job } => {
                write!(
                    f,
                    "fits, but job {blocking_job} of the same replica does not"
                )
            }
        }
    }
}

/// Why one candidate node was rejected. A node is counted once, under the first reason that
/// applies in this declaration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum RejectReason {
    Cordoned,
    Unhealthy,
    /// Still starting after the pending window.
    PendingExpired,
    /// A hot spare, and this is a first placement.
    SpareReserved,
    /// A hot spare dedicated to another band.
    SpareForOtherBand,
    MissingCapability,
    /// The node is in a zone the zone brake holds as degraded: used only when no other node
    /// fits (a placement that does so says `lastResort` on its pool).
    ZoneDegraded,
    /// `separateFrom` names a job on this node.
    SeparateFrom,
    /// `coLocateWith` names a running job on another node.
    CoLocateWith,
    IntraSameNode,
    IntraDifferentNode,
    IntraSameZone,
    IntraDifferentZone,
    InterSameNode,
    InterDifferentNode,
    InterSameZone,
    InterDifferentZone,
    InsufficientCapacity,
    InsufficientCores,
}

impl RejectReason {
    pub const ALL: [RejectReason; 19] = [
        RejectReason::Cordoned,
        RejectReason::Unhealthy,
        RejectReason::PendingExpired,
        RejectReason::SpareReserved,
        RejectReason::SpareForOtherBand,
        RejectReason::MissingCapability,
        RejectReason::ZoneDegraded,
        RejectReason::SeparateFrom,
        RejectReason::CoLocateWith,
        RejectReason::IntraSameNode,
        RejectReason::IntraDifferentNode,
        RejectReason::IntraSameZone,
        RejectReason::IntraDifferentZone,
        RejectReason::InterSameNode,
        RejectReason::InterDifferentNode,
        RejectReason::InterSameZone,
        RejectReason::InterDifferentZone,
        RejectReason::InsufficientCapacity,
        RejectReason::InsufficientCores,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::Cordoned => "cordoned",
            RejectReason::Unhealthy => "unhealthy",
            RejectReason::PendingExpired => "pendingExpired",
            RejectReason::SpareReserved => "spareReserved",
            RejectReason::SpareForOtherBand => "spareForOtherBand",
            RejectReason::MissingCapability => "missingCapability",
            RejectReason::ZoneDegraded => "zoneDegraded",
            RejectReason::SeparateFrom => "separateFrom",
            RejectReason::CoLocateWith => "coLocateWith",
            RejectReason::IntraSameNode => "intraSameNode",
            RejectReason::IntraDifferentNode => "intraDifferentNode",
            RejectReason::IntraSameZone => "intraSameZone",
            RejectReason::IntraDifferentZone => "intraDifferentZone",
            RejectReason::InterSameNode => "interSameNode",
            RejectReason::InterDifferentNode => "interDifferentNode",
            RejectReason::InterSameZone => "interSameZone",
            RejectReason::InterDifferentZone => "interDifferentZone",
            RejectReason::InsufficientCapacity => "insufficientCapacity",
            RejectReason::InsufficientCores => "insufficientCores",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// A placement rule that can be soft; listed in the order the engine gives them up
/// (the first is kept longest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum SoftRule {
    InterDifferentNode,
    InterDifferentZone,
    InterSameZone,
    InterSameNode,
    IntraSameNode,
    IntraDifferentNode,
    IntraSameZone,
    IntraDifferentZone,
}

impl SoftRule {
    pub fn as_str(self) -> &'static str {
        match self {
            SoftRule::InterDifferentNode => "interDifferentNode",
            SoftRule::InterDifferentZone => "interDifferentZone",
            SoftRule::InterSameZone => "interSameZone",
            SoftRule::InterSameNode => "interSameNode",
            SoftRule::IntraSameNode => "intraSameNode",
            SoftRule::IntraDifferentNode => "intraDifferentNode",
            SoftRule::IntraSameZone => "intraSameZone",
            SoftRule::IntraDifferentZone => "intraDifferentZone",
        }
    }

    /// The rejection reason a hard version of this rule reports.
    pub(crate) fn reject_reason(self) -> RejectReason {
        match self {
            SoftRule::InterDifferentNode => RejectReason::InterDifferentNode,
            SoftRule::InterDifferentZone => RejectReason::InterDifferentZone,
            SoftRule::InterSameZone => RejectReason::InterSameZone,
            SoftRule::InterSameNode => RejectReason::InterSameNode,
            SoftRule::IntraSameNode => RejectReason::IntraSameNode,
            SoftRule::IntraDifferentNode => RejectReason::IntraDifferentNode,
            SoftRule::IntraSameZone => RejectReason::IntraSameZone,
            SoftRule::IntraDifferentZone => RejectReason::IntraDifferentZone,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RejectionCount {
    pub reason: RejectReason,
    pub count: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PoolOutcome {
    Placed,
    Provision,
    Left,
}

/// Why placement left a pool for the next one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PoolLeftReason {
    /// The engine knows no pool of that name.
    UnknownPool,
    /// The pool is listed twice; the second mention is skipped.
    Duplicate,
    /// A fixed pool whose nodes cannot take the replica.
    NoNodeFits,
    /// An elastic pool whose nodes cannot take the replica and which is at `maxNodes`.
    MaxNodesReached,
    /// An elastic pool whose nodes cannot take the replica, and no single new node of any
    /// candidate instance type would make it fit.
    NoInstanceTypeFits,
    /// The pool is being deleted and takes no new work.
    Terminating,
}

impl PoolLeftReason {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolLeftReason::UnknownPool => "unknownPool",
            PoolLeftReason::Duplicate => "duplicate",
            PoolLeftReason::NoNodeFits => "noNodeFits",
            PoolLeftReason::MaxNodesReached => "maxNodesReached",
            PoolLeftReason::NoInstanceTypeFits => "noInstanceTypeFits",
            PoolLeftReason::Terminating => "terminating",
        }
    }
}

/// One pool of the preference list, as tried.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolAttempt {
    pub pool: String,
    pub outcome: PoolOutcome,
    pub reason: Option<PoolLeftReason>,
    /// The job (first of its co-located group) that did not fit, when the pool was left.
    pub failed_job: Option<String>,
    /// When the pool was left: every node of the pool, counted under the first reason it could
    /// not host `failedJob`. When the pool was used: empty.
    pub rejections: Vec<RejectionCount>,
    /// Tried again with the nodes of degraded zones allowed, because no pool could take the
    /// replica without them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last_resort: bool,
}

/// Where one job of a replica split across pools went, and why it left the pools before.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobPoolTrace {
    pub job_name: String,
    /// The pool the job was placed in (or, for a `Provision`, the pool asked for a node).
    pub pool: String,
    /// The pools tried for the job's unit (the job and the jobs it shares a node with), in
    /// order: each one left with its reason and rejections (`failedJob` names the unit's first
    /// job), then the one that took it.
    pub pools_tried: Vec<PoolAttempt>,
}

/// The full trace, for tools (`what-if`, the operator's trace endpoint).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Trace {
    /// The pools tried for the whole replica. When the replica was split across pools these
    /// are all left (no single pool could take it) and `jobs` says where each job went.
    pub pools: Vec<PoolAttempt>,
    /// Set only when no single pool could take the replica and its jobs were placed pool by
    /// pool: one entry per job placed (or, for a `Provision`, per job placed so far and the
    /// jobs the new node is for). Empty: every job is in the outcome's pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub jobs: Vec<JobPoolTrace>,
    /// Soft rules the decision could not honour (a rebalance may fix them later).
    pub broken_soft_rules: Vec<SoftRule>,
    /// One sentence for people.
    pub message: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum OutcomeKind {
    Placed,
    Provision,
    Unplaceable,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolTry {
    pub pool: String,
    pub outcome: PoolOutcome,
    pub reason: Option<PoolLeftReason>,
    /// See [`PoolAttempt::last_resort`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub last_resort: bool,
}

/// The bounded trace for status: the same size whatever the cluster or replica size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceSummary {
    pub outcome: OutcomeKind,
    pub pool: Option<String>,
    /// The first assignment's node.
    pub chosen_node: Option<String>,
    pub chosen_tier: Option<Tier>,
    /// Distinct nodes of the assignments, first [`SUMMARY_MAX_NODES`].
    pub nodes: Vec<String>,
    pub nodes_omitted: u32,
    pub instance_type: Option<String>,
    pub pools_tried: Vec<PoolTry>,
    pub pools_omitted: u32,
    /// Rejections summed over the pools tried; at most one entry per [`RejectReason`],
    /// largest first.
    pub rejections: Vec<RejectionCount>,
    pub broken_soft_rules: Vec<SoftRule>,
    pub message: String,
}

impl Decision {
    /// The pool `job` was placed in (or is waiting on a new node in): its own pool when the
    /// replica was split across pools, else the outcome's pool.
    pub fn pool_of(&self, job: &str) -> Option<&str> {
        if let Some(j) = self.trace.jobs.iter().find(|j| j.job_name == job) {
            return Some(&j.pool);
        }
        match &self.outcome {
            Outcome::Placed { pool, assignments } => assignments
                .iter()
                .any(|a| a.job_name == job)
                .then_some(pool.as_str()),
            Outcome::Provision { pool, .. } => Some(pool),
            Outcome::Unplaceable { .. } => None,
        }
    }

    /// Whether the replica's jobs were placed in more than one pool.
    pub fn is_split(&self) -> bool {
        let mut pools = self.trace.jobs.iter().map(|j| &j.pool);
        pools.next().is_some_and(|first| pools.any(|p| p != first))
    }

    /// The bounded trace for one job: as [`Decision::summary`], but when the replica was split
    /// across pools, the pool, node and pools tried are the job's own.
    pub fn summary_for_job(&self, job: &str) -> TraceSummary {
        let mut s = self.summary();
        let Some(j) = self.trace.jobs.iter().find(|j| j.job_name == job) else {
            return s;
        };
        s.pool = Some(j.pool.clone());
        if let Outcome::Placed { assignments, .. } = &self.outcome
            && let Some(a) = assignments.iter().find(|a| a.job_name == job)
        {
            s.chosen_node = Some(a.node.clone());
            s.chosen_tier = Some(a.score.tier);
        }
        s.pools_tried = j
            .pools_tried
            .iter()
            .take(SUMMARY_MAX_POOLS)
            .map(|p| PoolTry {
                pool: p.pool.clone(),
                outcome: p.outcome,
                reason: p.reason,
                last_resort: p.last_resort,
            })
            .collect();
        s.pools_omitted = u32::try_from(j.pools_tried.len().saturating_sub(SUMMARY_MAX_POOLS))
            .unwrap_or(u32::MAX);
        s.rejections = rejection_totals(&j.pools_tried);
        s
    }

    pub fn is_placed(&self) -> bool {
        matches!(self.outcome, Outcome::Placed { .. })
    }

    pub fn kind(&self) -> OutcomeKind {
        match self.outcome {
            Outcome::Placed { .. } => OutcomeKind::Placed,
            Outcome::Provision { .. } => OutcomeKind::Provision,
            Outcome::Unplaceable { .. } => OutcomeKind::Unplaceable,
        }
    }

    /// The bounded form of the trace.
    pub fn summary(&self) -> TraceSummary {
        let (pool, chosen_node, chosen_tier, nodes, nodes_omitted, instance_type) =
            match &self.outcome {
                Outcome::Placed { pool, assignments } => {
                    let mut distinct: Vec<&str> = Vec::new();
                    let mut omitted = 0u32;
                    for a in assignments {
                        if distinct.contains(&a.node.as_str()) {
                            continue;
                        }
                        if distinct.len() < SUMMARY_MAX_NODES {
                            distinct.push(&a.node);
                        } else {
                            omitted = omitted.saturating_add(1);
                        }
                    }
                    (
                        Some(pool.clone()),
                        assignments.first().map(|a| a.node.clone()),
                        assignments.first().map(|a| a.score.tier),
                        distinct.into_iter().map(str::to_owned).collect(),
                        omitted,
                        None,
                    )
                }
                Outcome::Provision {
                    pool,
                    instance_type,
                    ..
                } => (
                    Some(pool.clone()),
                    None,
                    None,
                    Vec::new(),
                    0,
                    Some(instance_type.clone()),
                ),
                Outcome::Unplaceable { .. } => (None, None, None, Vec::new(), 0, None),
            };
        let rejections = rejection_totals(&self.trace.pools);
        let pools_tried = self
            .trace
            .pools
            .iter()
            .take(SUMMARY_MAX_POOLS)
            .map(|p| PoolTry {
                pool: p.pool.clone(),
                outcome: p.outcome,
                reason: p.reason,
                last_resort: p.last_resort,
            })
            .collect();
        let pools_omitted = u32::try_from(self.trace.pools.len().saturating_sub(SUMMARY_MAX_POOLS))
            .unwrap_or(u32::MAX);
        TraceSummary {
            outcome: self.kind(),
            pool,
            chosen_node,
            chosen_tier,
            nodes,
            nodes_omitted,
            instance_type,
            pools_tried,
            pools_omitted,
            rejections,
            broken_soft_rules: self.trace.broken_soft_rules.clone(),
            message: truncate_chars(&self.trace.message, SUMMARY_MAX_MESSAGE),
        }
    }
}

/// Rejections summed over pool attempts, at most one entry per reason, largest first.
fn rejection_totals(attempts: &[PoolAttempt]) -> Vec<RejectionCount> {
    let mut totals = [0u64; RejectReason::ALL.len()];
    for attempt in attempts {
        for r in &attempt.rejections {
            if let Some(t) = totals.get_mut(r.reason.index()) {
                *t = t.saturating_add(r.count);
            }
        }
    }
    let mut rejections: Vec<RejectionCount> = RejectReason::ALL
        .iter()
        .zip(totals)
        .filter(|(_, c)| *c > 0)
        .map(|(r, c)| RejectionCount {
            reason: *r,
            count: c,
        })
        .collect();
    rejections.sort_by(|a, b| b.count.cmp(&a.count).then(a.reason.cmp(&b.reason)));
    rejections
}

pub(crate) fn truncate_chars(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", s.get(..i).unwrap_or_default()),
        None => s.to_owned(),
    }
}

/// Band of a group of jobs sharing a node: the most important one.
pub(crate) fn strongest(a: PriorityBand, b: PriorityBand) -> PriorityBand {
    if b.rank() < a.rank() { b } else { a }
}
