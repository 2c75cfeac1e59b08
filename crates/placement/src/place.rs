//! The placement driver: request → groups → pools in order → decision and trace.
//!
//! Generic over the [`Searcher`], so the naive reference placer runs exactly these semantics
//! with a full scan instead of the indexes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::decision::{
    Assignment, Decision, JobPoolTrace, JobUnplaceable, NodeScore, Outcome, OutcomeKind,
    PoolAttempt, PoolLeftReason, PoolOutcome, RejectReason, RejectionCount, SoftRule, Tier, Trace,
    UnplaceableReason, strongest,
};
use crate::engine::{
    Class, Engine, NodeIdx, PoolIdx, VIRTUAL, ZoneId, check_cores, from_milli, set_bit, to_milli,
};
use crate::model::{PlacementKind, PlacementRequest, Strength};
use crate::search::{
    Cand, Cons, Need, Overlay, Query, Readiness, Rule, Searcher, VirtualNode, name_of, tiers,
};
use crate::validate::rule_conflict;

/// Most jobs one replica may have; placement of a bigger replica is refused, not attempted.
pub const MAX_JOBS_PER_REPLICA: usize = 256;

/// Jobs that share a node (`coLocateWith`, or a hard intra-replica `sameNode`).
#[derive(Debug, Clone)]
struct Group {
    /// Indexes into the request's jobs, in request order.
    jobs: Vec<usize>,
    need: Need,
    /// Nodes of running siblings this group must join.
    pinned: Option<Vec<NodeIdx>>,
    /// Nodes of running siblings this group must avoid.
    avoid: Vec<NodeIdx>,
    /// Other groups this group must not share a node with.
    separate: BTreeSet<usize>,
}

/// Positions of jobs outside the groups being placed (other replicas, or running siblings).
#[derive(Debug, Clone, Default)]
struct Positions {
    nodes: Vec<NodeIdx>,
    any_node: bool,
    zones: Vec<ZoneId>,
    any_zone: bool,
}

impl Positions {
    fn add(&mut self, e: &Engine, node: &str, zone: Option<&str>) {
        self.any_node = true;
        let idx = e.node_by_id.get(node).copied();
        if let Some(i) = idx
            && !self.nodes.contains(&i)
        {
            self.nodes.push(i);
        }
        let z = match zone {
            Some(z) => {
                self.any_zone = true;
                e.zones.get(z)
            }
            None => {
                let z = idx.and_then(|i| e.node(i)).and_then(|n| n.zone);
                self.any_zone |= z.is_some();
                z
            }
        };
        if let Some(z) = z
            && !self.zones.contains(&z)
        {
            self.zones.push(z);
        }
    }
}

struct Prepared {
    groups: Vec<Group>,
    inter: Positions,
    siblings: Positions,
}

/// Where one group landed during an attempt.
#[derive(Debug, Clone, Copy)]
struct Landing {
    cand: Cand,
    zone: Option<ZoneId>,
    tier: Tier,
    pending: bool,
}

struct Attempt {
    landings: Vec<Option<Landing>>,
    broken: BTreeSet<SoftRule>,
}

struct Failure {
    group: usize,
    rules: Vec<Rule>,
    overlay: Overlay,
}

pub(crate) fn place<S: Searcher>(e: &Engine, s: &S, req: &PlacementRequest, now: u64) -> Decision {
    let decision = place_inner(e, s, req, now);
    tracing::debug!(
        bundle = %req.bundle_id,
        replica = req.replica_index,
        outcome = ?decision.kind(),
        pools_tried = decision.trace.pools.len(),
        "placement decision"
    );
    decision
}

fn decision(req: &PlacementRequest, outcome: Outcome, trace: Trace) -> Decision {
    Decision {
        bundle_id: req.bundle_id.clone(),
        replica_index: req.replica_index,
        outcome,
        trace,
    }
}

fn unplaceable(
    req: &PlacementRequest,
    jobs: Vec<JobUnplaceable>,
    pools: Vec<PoolAttempt>,
    message: String,
) -> Decision {
    decision(
        req,
        Outcome::Unplaceable { jobs },
        Trace {
            pools,
            jobs: Vec::new(),
            broken_soft_rules: Vec::new(),
            message,
        },
    )
}

fn place_inner<S: Searcher>(e: &Engine, s: &S, req: &PlacementRequest, now: u64) -> Decision {
    let prepared = match prepare(e, req) {
        Ok(p) => p,
        Err((jobs, message)) => return unplaceable(req, jobs, Vec::new(), message),
    };
    place_whole(e, s, req, &prepared, now, prepared.groups.len() > 1)
}

/// The placement the engine made before replicas could be split: the whole replica in the
/// first pool that takes it (kept callable so tests compare against it).
#[cfg(test)]
pub(crate) fn place_whole_replica(e: &Engine, req: &PlacementRequest, now: u64) -> Decision {
    match prepare(e, req) {
        Ok(p) => place_whole(e, &crate::search::Fast, req, &p, now, false),
        Err((jobs, message)) => unplaceable(req, jobs, Vec::new(), message),
    }
}

/// The whole replica in one pool: the first pool of the list whose nodes (or one new node)
/// take every group. With `split`, a replica no pool takes whole is then placed unit by unit
/// across pools ([`place_split`]): the whole replica in one pool comes first, so a replica some
/// pool can take lands exactly as it always did. Nodes of degraded zones come after both.
fn place_whole<S: Searcher>(
    e: &Engine,
    s: &S,
    req: &PlacementRequest,
    prepared: &Prepared,
    now: u64,
    split: bool,
) -> Decision {
    let degraded = degraded_zones(e, req);
    // A degraded zone is losing its nodes: its survivors are the last place to put a replica,
    // after every other zone and pool (a new node elsewhere, or a split, included).
    let first = place_in_pools(e, s, req, prepared, &degraded, now);
    if first.kind() != OutcomeKind::Unplaceable {
        return first;
    }
    if split && let Some(d) = place_split(e, s, req, prepared, &degraded, &first, now) {
        return d;
    }
    if degraded.is_empty() {
        return first;
    }
    let mut last = place_in_pools(e, s, req, prepared, &HashMap::new(), now);
    if last.kind() == OutcomeKind::Unplaceable {
        if split && let Some(mut d) = place_split(e, s, req, prepared, &HashMap::new(), &last, now)
        {
            let attempts = d.trace.pools.iter_mut().chain(
                d.trace
                    .jobs
                    .iter_mut()
                    .flat_map(|j| j.pools_tried.iter_mut()),
            );
            for p in attempts {
                p.last_resort = true;
            }
            d.trace.message.push_str(&format!(
                "; last resort: on nodes of degraded zone {}, as nothing outside degraded zones could take the replica",
                degraded_names(e, &degraded).join(", ")
            ));
            return d;
        }
        return last;
    }
    let used: BTreeSet<String> = match &last.outcome {
        Outcome::Placed { pool, assignments } => assignments
            .iter()
            .filter_map(|a| a.zone.as_deref())
            .filter(|z| e.provisioning_paused(pool, z))
            .map(str::to_owned)
            .collect(),
        _ => BTreeSet::new(),
    };
    for p in &mut last.trace.pools {
        p.last_resort = true;
    }
    let mut pools = first.trace.pools;
    pools.append(&mut last.trace.pools);
    last.trace.pools = pools;
    let zones: Vec<&str> = if used.is_empty() {
        degraded_names(e, &degraded)
    } else {
        used.iter().map(String::as_str).collect()
    };
    last.trace.message.push_str(&format!(
        "; last resort: on nodes of degraded zone {}, as nothing outside degraded zones could take the replica",
        zones.join(", ")
    ));
    last
}

/// The zones of the request's pools that the zone brake holds as degraded, by pool; only zones
/// some node has (a zone no node is in has nothing to avoid).
fn degraded_zones(e: &Engine, req: &PlacementRequest) -> HashMap<PoolIdx, Vec<ZoneId>> {
    let mut out = HashMap::new();
    for name in &req.pools {
        let (Some(&pidx), Some(zones)) = (e.pool_by_name.get(name), e.paused_zones.get(name))
        else {
            continue;
        };
        let ids: Vec<ZoneId> = zones.iter().filter_map(|z| e.zones.get(z)).collect();
        if !ids.is_empty() {
            out.insert(pidx, ids);
        }
    }
    out
}

fn degraded_names<'a>(e: &'a Engine, degraded: &HashMap<PoolIdx, Vec<ZoneId>>) -> Vec<&'a str> {
    let mut names: Vec<&str> = degraded
        .values()
        .flatten()
        .filter_map(|&z| e.zones.name(z))
        .collect();
    names.sort_unstable();
    names.dedup();
    names
}

/// The pools of the request in order; nodes in the `avoid` zones of a pool are rejected
/// (`zoneDegraded`).
fn place_in_pools<S: Searcher>(
    e: &Engine,
    s: &S,
    req: &PlacementRequest,
    prepared: &Prepared,
    avoid: &HashMap<PoolIdx, Vec<ZoneId>>,
    now: u64,
) -> Decision {
    let mut pools_tried: Vec<PoolAttempt> = Vec::new();
    // Per group: the first pool's rejection counts where it did not fit.
    let mut group_fail: BTreeMap<usize, Option<RejectReason>> = BTreeMap::new();
    let mut first_blocking: Option<usize> = None;
    let mut seen: Vec<&str> = Vec::new();
    for name in &req.pools {
        let left = |reason| PoolAttempt {
            pool: name.clone(),
            outcome: PoolOutcome::Left,
            reason: Some(reason),
            failed_job: None,
            rejections: Vec::new(),
            last_resort: false,
        };
        if seen.contains(&name.as_str()) {
            pools_tried.push(left(PoolLeftReason::Duplicate));
            continue;
        }
        seen.push(name);
        let Some(&pidx) = e.pool_by_name.get(name) else {
            pools_tried.push(left(PoolLeftReason::UnknownPool));
            continue;
        };
        let Some(pool) = e.pool(pidx) else {
            pools_tried.push(left(PoolLeftReason::UnknownPool));
            continue;
        };
        // A pool being deleted waits on its users; their recoveries may use its existing nodes
        // (or the deletion would wait on them forever), nothing else lands there.
        if pool.spec.terminating && req.kind != PlacementKind::Recovery {
            pools_tried.push(left(PoolLeftReason::Terminating));
            continue;
        }
        let avoid = avoid.get(&pidx).map_or(&[][..], Vec::as_slice);
        let failure = match attempt(e, s, req, prepared, pidx, None, avoid, now) {
            Ok(a) => {
                pools_tried.push(PoolAttempt {
                    pool: name.clone(),
                    outcome: PoolOutcome::Placed,
                    reason: None,
                    failed_job: None,
                    rejections: Vec::new(),
                    last_resort: false,
                });
                return placed(e, req, prepared, name, a, pools_tried);
            }
            Err(f) => f,
        };
        let reason = if pool.spec.terminating {
            // Nothing is provisioned in a pool being deleted.
            PoolLeftReason::Terminating
        } else if !pool.elastic {
            PoolLeftReason::NoNodeFits
        } else if pool
            .spec
            .max_nodes
            .is_some_and(|m| pool.members.len() >= m as usize)
        {
            PoolLeftReason::MaxNodesReached
        } else {
            match provision(e, s, req, prepared, pidx, avoid, now) {
                Some((type_name, zone, broken)) => {
                    pools_tried.push(PoolAttempt {
                        pool: name.clone(),
                        outcome: PoolOutcome::Provision,
                        reason: None,
                        failed_job: None,
                        rejections: Vec::new(),
                        last_resort: false,
                    });
                    let message = format!(
                        "no node of pool {name} can take the replica; provision a {type_name} node{}",
                        zone.as_deref()
                            .map(|z| format!(" in zone {z}"))
                            .unwrap_or_default()
                    );
                    return decision(
                        req,
                        Outcome::Provision {
                            pool: name.clone(),
                            instance_type: type_name,
                            zone,
                        },
                        Trace {
                            pools: pools_tried,
                            jobs: Vec::new(),
                            broken_soft_rules: broken.into_iter().collect(),
                            message,
                        },
                    );
                }
                None => PoolLeftReason::NoInstanceTypeFits,
            }
        };
        let rejections = diagnose(e, s, req, prepared, pidx, &failure, now);
        let dominant = rejections
            .iter()
            .max_by(|a, b| a.count.cmp(&b.count).then(b.reason.cmp(&a.reason)));
        group_fail
            .entry(failure.group)
            .or_insert(dominant.map(|r| r.reason));
        first_blocking.get_or_insert(failure.group);
        let failed_job = prepared
            .groups
            .get(failure.group)
            .and_then(|g| g.jobs.first())
            .and_then(|&j| req.jobs.get(j))
            .map(|j| j.job_name.clone());
        pools_tried.push(PoolAttempt {
            pool: name.clone(),
            outcome: PoolOutcome::Left,
            reason: Some(reason),
            failed_job,
            rejections,
            last_resort: false,
        });
    }
    let jobs = unplaceable_jobs(req, prepared, &group_fail, first_blocking);
    let message = if first_blocking.is_none() {
        "no usable pool in the preference list".to_owned()
    } else {
        let parts: Vec<String> = pools_tried
            .iter()
            .map(|p| {
                let why = p.reason.map(|r| r.as_str()).unwrap_or("");
                match (&p.failed_job, p.rejections.iter().max_by_key(|r| r.count)) {
                    (Some(j), Some(r)) => format!(
                        "{}: {why} for job {j}, mostly {}",
                        p.pool,
                        r.reason.as_str()
                    ),
                    (Some(j), None) => format!("{}: {why} for job {j}", p.pool),
                    _ => format!("{}: {why}", p.pool),
                }
            })
            .collect();
        format!("replica not placed; {}", parts.join("; "))
    };
    unplaceable(req, jobs, pools_tried, message)
}

fn unplaceable_jobs(
    req: &PlacementRequest,
    prepared: &Prepared,
    group_fail: &BTreeMap<usize, Option<RejectReason>>,
    first_blocking: Option<usize>,
) -> Vec<JobUnplaceable> {
    let Some(blocking) = first_blocking else {
        return req
            .jobs
            .iter()
            .map(|j| JobUnplaceable {
                job_name: j.job_name.clone(),
                reason: UnplaceableReason::NoUsablePool,
            })
            .collect();
    };
    let blocking_job = prepared
        .groups
        .get(blocking)
        .and_then(|g| g.jobs.first())
        .and_then(|&j| req.jobs.get(j))
        .map(|j| j.job_name.clone())
        .unwrap_or_default();
    let mut reasons: Vec<Option<UnplaceableReason>> = vec![None; req.jobs.len()];
    for (gi, g) in prepared.groups.iter().enumerate() {
        let r = match group_fail.get(&gi) {
            Some(dominant) => UnplaceableReason::NoNodeFits { reason: *dominant },
            None => UnplaceableReason::ReplicaIncomplete {
                blocking_job: blocking_job.clone(),
            },
        };
        for &j in &g.jobs {
            if let Some(slot) = reasons.get_mut(j) {
                *slot = Some(r.clone());
            }
        }
    }
    req.jobs
        .iter()
        .zip(reasons)
        .map(|(j, r)| JobUnplaceable {
            job_name: j.job_name.clone(),
            reason: r.unwrap_or(UnplaceableReason::ReplicaIncomplete {
                blocking_job: blocking_job.clone(),
            }),
        })
        .collect()
}

fn placed(
    e: &Engine,
    req: &PlacementRequest,
    prepared: &Prepared,
    pool: &str,
    a: Attempt,
    pools: Vec<PoolAttempt>,
) -> Decision {
    let assignments = assignments_of(e, req, prepared, &a.landings);
    let mut nodes: Vec<&str> = Vec::new();
    for a in &assignments {
        if !nodes.contains(&a.node.as_str()) {
            nodes.push(&a.node);
        }
    }
    let mut message = format!(
        "placed {} job(s) in pool {pool} on {}",
        assignments.len(),
        list_nodes(&nodes)
    );
    if !a.broken.is_empty() {
        let rules: Vec<&str> = a.broken.iter().map(|r| r.as_str()).collect();
        message.push_str(&format!("; soft rules not honoured: {}", rules.join(", ")));
    }
    decision(
        req,
        Outcome::Placed {
            pool: pool.to_owned(),
            assignments,
        },
        Trace {
            pools,
            jobs: Vec::new(),
            broken_soft_rules: a.broken.into_iter().collect(),
            message,
        },
    )
}

/// At most four node names, then how many more.
fn list_nodes(nodes: &[&str]) -> String {
    format!(
        "{}{}",
        nodes.iter().take(4).copied().collect::<Vec<_>>().join(", "),
        if nodes.len() > 4 {
            format!(" and {} more", nodes.len() - 4)
        } else {
            String::new()
        }
    )
}

/// One assignment per job of the landed groups, in request order.
fn assignments_of(
    e: &Engine,
    req: &PlacementRequest,
    prepared: &Prepared,
    landings: &[Option<Landing>],
) -> Vec<Assignment> {
    let mut per_job: Vec<Option<Assignment>> = vec![None; req.jobs.len()];
    for (g, landing) in prepared.groups.iter().zip(landings) {
        let Some(l) = landing else { continue };
        let after_cap = l.cand.free.saturating_sub(g.need.cap);
        let after_cores = l.cand.cores.saturating_sub(g.need.cores);
        for &j in &g.jobs {
            let Some(job) = req.jobs.get(j) else { continue };
            if let Some(slot) = per_job.get_mut(j) {
                *slot = Some(Assignment {
                    job_name: job.job_name.clone(),
                    node: name_of(e, l.cand.node).to_owned(),
                    zone: e.zone_name(l.zone),
                    node_pending: l.pending,
                    capacity: job.requirements.required_capacity,
                    cores: job.requirements.required_cores,
                    score: NodeScore {
                        tier: l.tier,
                        free_capacity_after: from_milli(after_cap),
                        free_cores_after: after_cores,
                    },
                });
            }
        }
    }
    per_job.into_iter().flatten().collect()
}

/// Validates the request and turns its jobs into groups. On error: one reason per job.
#[allow(clippy::type_complexity)]
fn prepare(e: &Engine, req: &PlacementRequest) -> Result<Prepared, (Vec<JobUnplaceable>, String)> {
    let n = req.jobs.len();
    if n == 0 {
        return Err((Vec::new(), "replica has no jobs to place".into()));
    }
    if n > MAX_JOBS_PER_REPLICA {
        let jobs = req
            .jobs
            .iter()
            .map(|j| JobUnplaceable {
                job_name: j.job_name.clone(),
                reason: UnplaceableReason::TooManyJobs {
                    count: n,
                    limit: MAX_JOBS_PER_REPLICA,
                },
            })
            .collect();
        return Err((
            jobs,
            format!("replica has {n} jobs; at most {MAX_JOBS_PER_REPLICA} are placed as a unit"),
        ));
    }
    let mut problems: Vec<Option<UnplaceableReason>> = vec![None; n];
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    let sibling_node: HashMap<&str, &str> = req
        .placed_siblings
        .iter()
        .map(|s| (s.job_name.as_str(), s.node.as_str()))
        .collect();
    let invalid = |d: String| Some(UnplaceableReason::InvalidJob { detail: d });
    for (i, j) in req.jobs.iter().enumerate() {
        if j.job_name.is_empty() {
            problems[i] = invalid("empty jobName".into());
        } else if by_name.insert(&j.job_name, i).is_some() {
            problems[i] = invalid(format!("jobName {:?} is listed twice", j.job_name));
        } else if sibling_node.contains_key(j.job_name.as_str()) {
            problems[i] = invalid(format!(
                "job {:?} is also listed as already placed",
                j.job_name
            ));
        }
    }
    let mut caps_cache: Vec<(u64, u32)> = vec![(0, 0); n];
    for (i, j) in req.jobs.iter().enumerate() {
        if problems[i].is_some() {
            continue;
        }
        match (
            to_milli(j.requirements.required_capacity, true),
            check_cores(j.requirements.required_cores),
        ) {
            (Ok(c), Ok(k)) => caps_cache[i] = (c, k),
            (Err(p), _) => problems[i] = invalid(format!("requiredCapacity is {p}")),
            (_, Err(p)) => problems[i] = invalid(format!("requiredCores is {p}")),
        }
        for t in j.co_locate_with.iter().chain(&j.separate_from) {
            if !by_name.contains_key(t.as_str()) && !sibling_node.contains_key(t.as_str()) {
                problems[i] = invalid(format!("references unknown job {t:?}"));
            }
        }
        if j.separate_from.contains(&j.job_name) {
            problems[i] = Some(UnplaceableReason::Contradictory {
                detail: "job is separated from itself".into(),
            });
        }
    }
    if let Some(d) = rule_conflict(&req.intra_replica).or(rule_conflict(&req.inter_replica)) {
        let detail = format!("hard placement rules contradict each other: {d}");
        let jobs = req
            .jobs
            .iter()
            .map(|j| JobUnplaceable {
                job_name: j.job_name.clone(),
                reason: UnplaceableReason::Contradictory {
                    detail: detail.clone(),
                },
            })
            .collect();
        return Err((jobs, detail));
    }
    // Union-find over coLocateWith (cycles are harmless: they just join the same set).
    let mut parent: Vec<usize> = (0..n).collect();
    fn find(p: &mut [usize], mut x: usize) -> usize {
        while let Some(&px) = p.get(x) {
            if px == x {
                break;
            }
            let gp = p.get(px).copied().unwrap_or(px);
            if let Some(slot) = p.get_mut(x) {
                *slot = gp;
            }
            x = gp;
        }
        x
    }
    let mut union = |a: usize, b: usize| {
        let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
        if ra != rb {
            let (lo, hi) = if ra < rb { (ra, rb) } else { (rb, ra) };
            if let Some(slot) = parent.get_mut(hi) {
                *slot = lo;
            }
        }
    };
    if req.intra_replica.same_node == Some(Strength::Hard) {
        for i in 1..n {
            union(0, i);
        }
    }
    for (i, j) in req.jobs.iter().enumerate() {
        for t in &j.co_locate_with {
            if let Some(&k) = by_name.get(t.as_str()) {
                union(i, k);
            }
        }
    }
    let roots: Vec<usize> = (0..n).map(|i| find(&mut parent, i)).collect();
    // Separation inside one co-located group is a contradiction.
    for (i, j) in req.jobs.iter().enumerate() {
        for t in &j.separate_from {
            if let Some(&k) = by_name.get(t.as_str())
                && k != i
                && roots.get(i) == roots.get(k)
            {
                let detail = format!(
                    "{:?} must share a node with {t:?} and also avoid it",
                    j.job_name
                );
                for x in [i, k] {
                    if problems[x].is_none() {
                        problems[x] = Some(UnplaceableReason::Contradictory {
                            detail: detail.clone(),
                        });
                    }
                }
            }
        }
    }
    let mut group_of_root: BTreeMap<usize, usize> = BTreeMap::new();
    let mut groups: Vec<Group> = Vec::new();
    for (i, &(cap, cores)) in caps_cache.iter().enumerate() {
        let root = roots.get(i).copied().unwrap_or(i);
        let gi = *group_of_root.entry(root).or_insert_with(|| {
            groups.push(Group {
                jobs: Vec::new(),
                need: Need {
                    cap: 0,
                    cores: 0,
                    caps: Vec::new(),
                    caps_unknown: false,
                    band: req.jobs[i].requirements.priority_band,
                },
                pinned: None,
                avoid: Vec::new(),
                separate: BTreeSet::new(),
            });
            groups.len() - 1
        });
        let job = &req.jobs[i];
        if let Some(g) = groups.get_mut(gi) {
            g.jobs.push(i);
            g.need.cap = g.need.cap.saturating_add(cap);
            g.need.cores = g.need.cores.saturating_add(cores);
            g.need.band = strongest(g.need.band, job.requirements.priority_band);
            for c in &job.requirements.required_capabilities {
                match e.caps.get(c) {
                    Some(id) => set_bit(&mut g.need.caps, id),
                    None => g.need.caps_unknown = true,
                }
            }
        }
    }
    let group_of = |i: usize| roots.get(i).and_then(|r| group_of_root.get(r)).copied();
    for (i, j) in req.jobs.iter().enumerate() {
        let Some(gi) = group_of(i) else { continue };
        for t in &j.co_locate_with {
            if let Some(node) = sibling_node.get(t.as_str()) {
                let idx = e.node_by_id.get(*node).copied();
                if let Some(g) = groups.get_mut(gi) {
                    let pins = g.pinned.get_or_insert_with(Vec::new);
                    // An unknown node pins to nothing: the group cannot be placed.
                    if let Some(idx) = idx
                        && !pins.contains(&idx)
                    {
                        pins.push(idx);
                    }
                }
            }
        }
        for t in &j.separate_from {
            if let Some(&k) = by_name.get(t.as_str()) {
                if let Some(gk) = group_of(k)
                    && gk != gi
                {
                    if let Some(g) = groups.get_mut(gi) {
                        g.separate.insert(gk);
                    }
                    if let Some(g) = groups.get_mut(gk) {
                        g.separate.insert(gi);
                    }
                }
            } else if let Some(node) = sibling_node.get(t.as_str())
                && let Some(&idx) = e.node_by_id.get(*node)
                && let Some(g) = groups.get_mut(gi)
            {
                g.avoid.push(idx);
            }
        }
    }
    // Pinned to two different nodes, or pinned to a node it must avoid.
    for g in &groups {
        if let Some(p) = &g.pinned
            && (p.len() > 1 || p.iter().any(|x| g.avoid.contains(x)))
        {
            for &j in &g.jobs {
                if problems[j].is_none() {
                    problems[j] = Some(UnplaceableReason::Contradictory {
                        detail: "coLocateWith names running jobs on different nodes, or a node it must avoid".into(),
                    });
                }
            }
        }
    }
    if let Some(first_bad) = problems.iter().position(Option::is_some) {
        let blocking_job = req.jobs[first_bad].job_name.clone();
        let jobs: Vec<JobUnplaceable> = req
            .jobs
            .iter()
            .zip(problems)
            .map(|(j, p)| JobUnplaceable {
                job_name: j.job_name.clone(),
                reason: p.unwrap_or(UnplaceableReason::ReplicaIncomplete {
                    blocking_job: blocking_job.clone(),
                }),
            })
            .collect();
        let message = format!(
            "replica not placed: job {blocking_job:?}: {}",
            jobs[first_bad].reason
        );
        return Err((jobs, message));
    }
    // Most constrained first: pinned groups, then the biggest; ties by first job name.
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by(|&a, &b| {
        let (ga, gb) = (&groups[a], &groups[b]);
        gb.pinned
            .is_some()
            .cmp(&ga.pinned.is_some())
            .then(gb.need.cap.cmp(&ga.need.cap))
            .then(gb.need.cores.cmp(&ga.need.cores))
            .then_with(|| first_name(req, ga).cmp(first_name(req, gb)))
    });
    let mut remap = vec![0usize; groups.len()];
    for (new, &old) in order.iter().enumerate() {
        remap[old] = new;
    }
    let mut sorted: Vec<Group> = order.iter().map(|&o| groups[o].clone()).collect();
    for g in &mut sorted {
        g.separate = g.separate.iter().map(|&x| remap[x]).collect();
    }
    let mut inter = Positions::default();
    for p in &req.other_replicas {
        inter.add(e, &p.node, p.zone.as_deref());
    }
    let mut siblings = Positions::default();
    for p in &req.placed_siblings {
        siblings.add(e, &p.node, p.zone.as_deref());
    }
    Ok(Prepared {
        groups: sorted,
        inter,
        siblings,
    })
}

fn first_name<'a>(req: &'a PlacementRequest, g: &Group) -> &'a str {
    g.jobs
        .iter()
        .filter_map(|&j| req.jobs.get(j))
        .map(|j| j.job_name.as_str())
        .min()
        .unwrap_or("")
}

/// Hard rules and soft rules (in the order they are given up) for one group, given where the
/// replica's earlier groups landed.
fn rules_for(
    req: &PlacementRequest,
    p: &Prepared,
    gi: usize,
    landings: &[Option<Landing>],
) -> (Vec<Rule>, Vec<(SoftRule, Rule)>) {
    let mut hard = Vec::new();
    let mut soft = Vec::new();
    let Some(g) = p.groups.get(gi) else {
        return (hard, soft);
    };
    if let Some(pins) = &g.pinned {
        hard.push(Rule {
            reason: RejectReason::CoLocateWith,
            cons: Cons::NodeIn(pins.clone()),
        });
    }
    let mut avoid = g.avoid.clone();
    for &o in &g.separate {
        if let Some(Some(l)) = landings.get(o)
            && !avoid.contains(&l.cand.node)
        {
            avoid.push(l.cand.node);
        }
    }
    if !avoid.is_empty() {
        hard.push(Rule {
            reason: RejectReason::SeparateFrom,
            cons: Cons::NodeNotIn(avoid),
        });
    }
    let mut intra = p.siblings.clone();
    for l in landings.iter().flatten() {
        intra.any_node = true;
        if !intra.nodes.contains(&l.cand.node) {
            intra.nodes.push(l.cand.node);
        }
        if let Some(z) = l.zone {
            intra.any_zone = true;
            if !intra.zones.contains(&z) {
                intra.zones.push(z);
            }
        }
    }
    let scopes = [
        (
            &req.inter_replica,
            &p.inter,
            [
                SoftRule::InterSameNode,
                SoftRule::InterDifferentNode,
                SoftRule::InterSameZone,
                SoftRule::InterDifferentZone,
            ],
        ),
        (
            &req.intra_replica,
            &intra,
            [
                SoftRule::IntraSameNode,
                SoftRule::IntraDifferentNode,
                SoftRule::IntraSameZone,
                SoftRule::IntraDifferentZone,
            ],
        ),
    ];
    for (rules, pos, names) in scopes {
        let [same_node, diff_node, same_zone, diff_zone] = names;
        let entries = [
            (
                rules.same_node,
                same_node,
                pos.any_node,
                Cons::NodeIn(pos.nodes.clone()),
            ),
            (
                rules.different_node,
                diff_node,
                pos.any_node,
                Cons::NodeNotIn(pos.nodes.clone()),
            ),
            (
                rules.same_zone,
                same_zone,
                pos.any_zone,
                Cons::ZoneIn(pos.zones.clone()),
            ),
            (
                rules.different_zone,
                diff_zone,
                pos.any_zone,
                Cons::ZoneNotIn(pos.zones.clone()),
            ),
        ];
        for (strength, name, applies, cons) in entries {
            let Some(strength) = strength else { continue };
            if !applies {
                continue;
            }
            let rule = Rule {
                reason: name.reject_reason(),
                cons,
            };
            match strength {
                Strength::Hard => hard.push(rule),
                Strength::Soft => soft.push((name, rule)),
            }
        }
    }
    soft.sort_by_key(|(name, _)| *name);
    (hard, soft)
}

/// Places every group in one pool (plus, when simulating a provision, one new node).
#[allow(clippy::too_many_arguments)]
fn attempt<S: Searcher>(
    e: &Engine,
    s: &S,
    req: &PlacementRequest,
    p: &Prepared,
    pool: PoolIdx,
    virt: Option<&VirtualNode>,
    avoid: &[ZoneId],
    now: u64,
) -> Result<Attempt, Failure> {
    if e.pool(pool).is_none() {
        return Err(Failure {
            group: 0,
            rules: Vec::new(),
            overlay: Overlay::default(),
        });
    }
    let mut overlay = Overlay::default();
    let mut landings: Vec<Option<Landing>> = vec![None; p.groups.len()];
    let mut broken = BTreeSet::new();
    for gi in 0..p.groups.len() {
        let at = GroupAt {
            pool,
            virt,
            avoid,
            now,
        };
        let l = match place_group(e, s, req, p, gi, &at, &landings, &overlay, &mut broken) {
            Ok(l) => l,
            Err(hard) => {
                return Err(Failure {
                    group: gi,
                    rules: hard,
                    overlay,
                });
            }
        };
        if let Some(g) = p.groups.get(gi) {
            overlay.add(l.cand.node, g.need.cap, g.need.cores);
        }
        if let Some(slot) = landings.get_mut(gi) {
            *slot = Some(l);
        }
    }
    Ok(Attempt { landings, broken })
}

/// Where one group is being tried: a pool, maybe with one simulated new node, and the zones
/// of that pool to avoid.
struct GroupAt<'a> {
    pool: PoolIdx,
    virt: Option<&'a VirtualNode>,
    avoid: &'a [ZoneId],
    now: u64,
}

/// The best node of one pool for one group, given where the replica's other groups landed
/// (in this pool or, for a split replica, in others). Soft rules given up go to `broken`. On
/// failure: the hard rules the group was checked against.
#[allow(clippy::too_many_arguments)]
fn place_group<S: Searcher>(
    e: &Engine,
    s: &S,
    req: &PlacementRequest,
    p: &Prepared,
    gi: usize,
    at: &GroupAt<'_>,
    landings: &[Option<Landing>],
    overlay: &Overlay,
    broken: &mut BTreeSet<SoftRule>,
) -> Result<Landing, Vec<Rule>> {
    let (Some(state), Some(g)) = (e.pool(at.pool), p.groups.get(gi)) else {
        return Err(Vec::new());
    };
    let strategy = state.strategy;
    let (mut hard, soft) = rules_for(req, p, gi, landings);
    if !at.avoid.is_empty() {
        hard.insert(
            0,
            Rule {
                reason: RejectReason::ZoneDegraded,
                cons: Cons::ZoneNotIn(at.avoid.to_vec()),
            },
        );
    }
    let tier_list = tiers(req.kind, g.need.band);
    let find = |rules: &[Rule]| -> Option<Landing> {
        for readiness in [Readiness::Ready, Readiness::Pending] {
            for tier in tier_list {
                let q = Query {
                    pool: at.pool,
                    strategy,
                    need: &g.need,
                    rules,
                    tier: Some(tier),
                    readiness,
                    overlay,
                    virt: at.virt,
                    now: at.now,
                    kind: req.kind,
                };
                if let Some(c) = s.best(e, &q) {
                    return Some(landing_of(e, c, at.virt, readiness));
                }
            }
        }
        None
    };
    let mut all = hard.clone();
    all.extend(soft.iter().map(|(_, r)| r.clone()));
    let found = match find(&all) {
        Some(l) => Some(l),
        None if soft.is_empty() => None,
        None => {
            // Keep each soft rule, most important first, while some node still honours it.
            let mut kept = hard.clone();
            let mut last = None;
            for (name, rule) in &soft {
                kept.push(rule.clone());
                match find(&kept) {
                    Some(l) => last = Some(l),
                    None => {
                        kept.pop();
                        broken.insert(*name);
                    }
                }
            }
            last.or_else(|| find(&kept))
        }
    };
    found.ok_or(hard)
}

fn landing_of(e: &Engine, c: Cand, virt: Option<&VirtualNode>, readiness: Readiness) -> Landing {
    if c.node == VIRTUAL {
        return Landing {
            cand: c,
            zone: virt.and_then(|v| v.zone),
            tier: Tier::NewNode,
            pending: false,
        };
    }
    let n = e.node(c.node);
    let tier = match n.map(|n| n.class()) {
        Some(Class::Spare(Some(_))) => Tier::BandSpare,
        Some(Class::Spare(None)) => Tier::Spare,
        _ => Tier::Node,
    };
    Landing {
        cand: c,
        zone: n.and_then(|n| n.zone),
        tier,
        pending: readiness == Readiness::Pending,
    }
}

/// The smallest candidate type whose one new node lets the whole replica place; per type the
/// zone breaking the fewest soft rules (ties: the pool's zone order).
fn provision<S: Searcher>(
    e: &Engine,
    s: &S,
    req: &PlacementRequest,
    p: &Prepared,
    pool: PoolIdx,
    avoid: &[ZoneId],
    now: u64,
) -> Option<(String, Option<String>, BTreeSet<SoftRule>)> {
    let state = e.pool(pool)?;
    for t in &state.types {
        let mut best: Option<(Option<ZoneId>, BTreeSet<SoftRule>)> = None;
        for &zone in &state.provision_zones {
            if let Some(name) = zone.and_then(|z| e.zones.name(z))
                && e.provisioning_paused(&state.spec.name, name)
            {
                continue;
            }
            let v = VirtualNode {
                cap: t.cap,
                cores: t.cores,
                capset: t.capset,
                zone,
            };
            if let Ok(a) = attempt(e, s, req, p, pool, Some(&v), avoid, now)
                && best.as_ref().is_none_or(|(_, b)| a.broken.len() < b.len())
            {
                best = Some((zone, a.broken));
            }
        }
        if let Some((zone, broken)) = best {
            return Some((t.name.clone(), e.zone_name(zone), broken));
        }
    }
    None
}

/// Why a pool is skipped before any node is looked at, as in [`place_in_pools`].
fn pool_skipped(
    e: &Engine,
    req: &PlacementRequest,
    name: &str,
    seen: &[&str],
) -> Result<PoolIdx, PoolLeftReason> {
    if seen.contains(&name) {
        return Err(PoolLeftReason::Duplicate);
    }
    let Some(&pidx) = e.pool_by_name.get(name) else {
        return Err(PoolLeftReason::UnknownPool);
    };
    let Some(pool) = e.pool(pidx) else {
        return Err(PoolLeftReason::UnknownPool);
    };
    if pool.spec.terminating && req.kind != PlacementKind::Recovery {
        return Err(PoolLeftReason::Terminating);
    }
    Ok(pidx)
}

/// A replica no single pool can take, placed unit by unit (a unit is a group: jobs that share
/// a node), each unit falling through the pool list on its own, the replica's rules holding
/// across pools (every unit is checked against where the others landed, whatever their pool).
/// A unit no existing node of a pool takes may ask that pool for a new node (elastic, below
/// `maxNodes`, not being deleted): the decision is then `Provision`, and the next placement
/// counts the starting node. `None` when some unit fits in no pool: the replica stays all or
/// nothing.
#[allow(clippy::too_many_arguments)]
fn place_split<S: Searcher>(
    e: &Engine,
    s: &S,
    req: &PlacementRequest,
    prepared: &Prepared,
    avoid: &HashMap<PoolIdx, Vec<ZoneId>>,
    whole: &Decision,
    now: u64,
) -> Option<Decision> {
    let mut landings: Vec<Option<Landing>> = vec![None; prepared.groups.len()];
    let mut pool_of: Vec<Option<(usize, &str)>> = vec![None; prepared.groups.len()];
    let mut trails: Vec<Vec<PoolAttempt>> = vec![Vec::new(); prepared.groups.len()];
    let mut to_count: Vec<(usize, usize, PoolIdx, Failure)> = Vec::new();
    let count = |trails: &mut Vec<Vec<PoolAttempt>>,
                 to_count: &[(usize, usize, PoolIdx, Failure)]| {
        for (gi, at, pidx, failure) in to_count {
            if let Some(a) = trails.get_mut(*gi).and_then(|t| t.get_mut(*at)) {
                a.rejections = diagnose(e, s, req, prepared, *pidx, failure, now);
            }
        }
    };
    let mut overlay = Overlay::default();
    let mut broken = BTreeSet::new();
    for (gi, g) in prepared.groups.iter().enumerate() {
        let unit_job = g
            .jobs
            .first()
            .and_then(|&j| req.jobs.get(j))
            .map(|j| j.job_name.clone());
        let mut trail: Vec<PoolAttempt> = Vec::new();
        let left = |pool: &str, reason, rejections| PoolAttempt {
            pool: pool.to_owned(),
            outcome: PoolOutcome::Left,
            reason: Some(reason),
            failed_job: unit_job.clone(),
            rejections,
            last_resort: false,
        };
        let used = |pool: &str, outcome| PoolAttempt {
            pool: pool.to_owned(),
            outcome,
            reason: None,
            failed_job: None,
            rejections: Vec::new(),
            last_resort: false,
        };
        let mut seen: Vec<&str> = Vec::new();
        for (rank, name) in req.pools.iter().enumerate() {
            let pidx = match pool_skipped(e, req, name, &seen) {
                Ok(p) => p,
                Err(reason) => {
                    seen.push(name);
                    trail.push(left(name, reason, Vec::new()));
                    continue;
                }
            };
            seen.push(name);
            let Some(pool) = e.pool(pidx) else { continue };
            let zones = avoid.get(&pidx).map_or(&[][..], Vec::as_slice);
            let at = GroupAt {
                pool: pidx,
                virt: None,
                avoid: zones,
                now,
            };
            let mut kept = broken.clone();
            let hard =
                match place_group(e, s, req, prepared, gi, &at, &landings, &overlay, &mut kept) {
                    Ok(l) => {
                        broken = kept;
                        overlay.add(l.cand.node, g.need.cap, g.need.cores);
                        landings[gi] = Some(l);
                        pool_of[gi] = Some((rank, name.as_str()));
                        trail.push(used(name, PoolOutcome::Placed));
                        break;
                    }
                    Err(hard) => hard,
                };
            let reason = if pool.spec.terminating {
                PoolLeftReason::Terminating
            } else if !pool.elastic {
                PoolLeftReason::NoNodeFits
            } else if pool
                .spec
                .max_nodes
                .is_some_and(|m| pool.members.len() >= m as usize)
            {
                PoolLeftReason::MaxNodesReached
            } else {
                match provision_unit(
                    e, s, req, prepared, gi, pidx, zones, &landings, &overlay, &broken, now,
                ) {
                    Some((type_name, zone, now_broken)) => {
                        trail.push(used(name, PoolOutcome::Provision));
                        pool_of[gi] = Some((rank, name.as_str()));
                        trails[gi] = trail;
                        count(&mut trails, &to_count);
                        let message = format!(
                            "no single pool can take the replica; placing it job by job, no node of pool {name} can take job {}; provision a {type_name} node{}",
                            unit_job.as_deref().unwrap_or(""),
                            zone.as_deref()
                                .map(|z| format!(" in zone {z}"))
                                .unwrap_or_default()
                        );
                        return Some(decision(
                            req,
                            Outcome::Provision {
                                pool: name.clone(),
                                instance_type: type_name,
                                zone,
                            },
                            Trace {
                                pools: whole.trace.pools.clone(),
                                jobs: job_traces(req, prepared, &pool_of, &trails),
                                broken_soft_rules: now_broken.into_iter().collect(),
                                message,
                            },
                        ));
                    }
                    None => PoolLeftReason::NoInstanceTypeFits,
                }
            };
            let failure = Failure {
                group: gi,
                rules: hard,
                overlay: overlay.clone(),
            };
            // Counted only once the split succeeds: a failed split's trail is dropped.
            to_count.push((gi, trail.len(), pidx, failure));
            trail.push(left(name, reason, Vec::new()));
        }
        pool_of[gi]?;
        trails[gi] = trail;
    }
    let assignments = assignments_of(e, req, prepared, &landings);
    // The outcome's pool is the most preferred pool any job landed in.
    let first = pool_of.iter().flatten().min_by_key(|(rank, _)| *rank)?.1;
    count(&mut trails, &to_count);
    let jobs = job_traces(req, prepared, &pool_of, &trails);
    let mut per_pool: Vec<(usize, &str, Vec<&str>)> = Vec::new();
    for (gi, g) in prepared.groups.iter().enumerate() {
        let Some((rank, pool)) = pool_of[gi] else {
            continue;
        };
        let names = g
            .jobs
            .iter()
            .filter_map(|&j| req.jobs.get(j))
            .map(|j| j.job_name.as_str());
        match per_pool.iter_mut().find(|(_, p, _)| *p == pool) {
            Some((_, _, v)) => v.extend(names),
            None => per_pool.push((rank, pool, names.collect())),
        }
    }
    per_pool.sort_by_key(|(rank, _, _)| *rank);
    let parts: Vec<String> = per_pool
        .iter()
        .map(|(_, pool, jobs)| format!("{} in pool {pool}", list_nodes(jobs)))
        .collect();
    let mut message = format!(
        "no single pool can take the replica; placed {} job(s) split across pools: {}",
        assignments.len(),
        parts.join("; ")
    );
    if !broken.is_empty() {
        let rules: Vec<&str> = broken.iter().map(|r| r.as_str()).collect();
        message.push_str(&format!("; soft rules not honoured: {}", rules.join(", ")));
    }
    Some(decision(
        req,
        Outcome::Placed {
            pool: first.to_owned(),
            assignments,
        },
        Trace {
            pools: whole.trace.pools.clone(),
            jobs,
            broken_soft_rules: broken.into_iter().collect(),
            message,
        },
    ))
}

/// One entry per job of the units that have a pool, in request order.
fn job_traces(
    req: &PlacementRequest,
    prepared: &Prepared,
    pool_of: &[Option<(usize, &str)>],
    trails: &[Vec<PoolAttempt>],
) -> Vec<JobPoolTrace> {
    let mut per_job: Vec<Option<JobPoolTrace>> = vec![None; req.jobs.len()];
    for (gi, g) in prepared.groups.iter().enumerate() {
        let (Some(Some((_, pool))), Some(trail)) = (pool_of.get(gi), trails.get(gi)) else {
            continue;
        };
        for &j in &g.jobs {
            if let (Some(job), Some(slot)) = (req.jobs.get(j), per_job.get_mut(j)) {
                *slot = Some(JobPoolTrace {
                    job_name: job.job_name.clone(),
                    pool: (*pool).to_owned(),
                    pools_tried: trail.clone(),
                });
            }
        }
    }
    per_job.into_iter().flatten().collect()
}

/// The smallest candidate type whose one new node takes this unit, given where the units
/// before it landed; per type the zone breaking the fewest soft rules (ties: the pool's zone
/// order).
#[allow(clippy::too_many_arguments)]
fn provision_unit<S: Searcher>(
    e: &Engine,
    s: &S,
    req: &PlacementRequest,
    p: &Prepared,
    gi: usize,
    pool: PoolIdx,
    avoid: &[ZoneId],
    landings: &[Option<Landing>],
    overlay: &Overlay,
    broken: &BTreeSet<SoftRule>,
    now: u64,
) -> Option<(String, Option<String>, BTreeSet<SoftRule>)> {
    let state = e.pool(pool)?;
    for t in &state.types {
        let mut best: Option<(Option<ZoneId>, BTreeSet<SoftRule>)> = None;
        for &zone in &state.provision_zones {
            if let Some(name) = zone.and_then(|z| e.zones.name(z))
                && e.provisioning_paused(&state.spec.name, name)
            {
                continue;
            }
            let v = VirtualNode {
                cap: t.cap,
                cores: t.cores,
                capset: t.capset,
                zone,
            };
            let at = GroupAt {
                pool,
                virt: Some(&v),
                avoid,
                now,
            };
            let mut b = broken.clone();
            // The new node must be what takes the unit: an existing node would have already.
            if let Ok(l) = place_group(e, s, req, p, gi, &at, landings, overlay, &mut b)
                && l.cand.node == VIRTUAL
                && best.as_ref().is_none_or(|(_, x)| b.len() < x.len())
            {
                best = Some((zone, b));
            }
        }
        if let Some((zone, broken)) = best {
            return Some((t.name.clone(), e.zone_name(zone), broken));
        }
    }
    None
}

/// Counts, for the group that did not fit, every node of the pool under its first rejection
/// reason.
fn diagnose<S: Searcher>(
    e: &Engine,
    s: &S,
    req: &PlacementRequest,
    p: &Prepared,
    pool: PoolIdx,
    f: &Failure,
    now: u64,
) -> Vec<RejectionCount> {
    let (Some(state), Some(g)) = (e.pool(pool), p.groups.get(f.group)) else {
        return Vec::new();
    };
    let q = Query {
        pool,
        strategy: state.strategy,
        need: &g.need,
        rules: &f.rules,
        tier: None,
        readiness: Readiness::Any,
        overlay: &f.overlay,
        virt: None,
        now,
        kind: req.kind,
    };
    let counts = s.diagnose(e, &q);
    RejectReason::ALL
        .iter()
        .zip(counts)
        .filter(|(_, c)| *c > 0)
        .map(|(r, c)| RejectionCount {
            reason: *r,
            count: c,
        })
        .collect()
}
