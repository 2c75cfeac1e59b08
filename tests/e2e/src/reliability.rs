//! The reliability suite's invariant checker: what must hold, whatever failed.
//!
//! It reads Manager's state (the sim, through the same Watch mirror the operator uses, plus the
//! sim's per-job history) and the Bundle objects, and counts these kinds of violation:
//!
//! - **duplicates**: more than one live normal instance of one (bundle, replica, job), now or,
//!   from the sim's history, at any moment since the sim started;
//! - **lost**: a job of a Bundle that is not running on a started node once settled, unless the
//!   Bundle is Broken (the restart ceiling, waiting for the retry annotation), its spec is
//!   invalid (Stalled, reason `InvalidSpec`: it never could run) or the job is `dropped` (a
//!   bronze job, recorded in its status);
//! - **overcapacity**: a running node whose capacity-holding instances exceed its capacity or
//!   cores;
//! - **orphans**: a bundle registered in Manager under one of the operator's ids whose Bundle
//!   object is gone; a job with a live instance that no Bundle's spec asks for; a node the
//!   operator created (its tags name the owner) for a Bundle or HotSpareTarget that is gone,
//!   running nothing;
//! - **rules**: a hard placement rule of a Bundle broken by where its jobs run (inter-replica
//!   and intra-replica `different` node or zone, intra-replica `same` node or zone,
//!   `coLocateWith`, `separateFrom`);
//! - **disagreements**: a Bundle's status that says something else than Manager about where a
//!   job runs (it says `running` on a node Manager does not run it on, or Manager runs it and
//!   the status says another state or node);
//! - **cordon** (`placed_after_cordon`): an instance started on a node more than
//!   [`CORDON_SLACK`] after the node was cordoned or drained, before it was uncordoned.
//!
//! [`check`] and [`check_cordons`] are pure (hand-made facts in the unit tests); [`observe`]
//! builds a `World` from the running stack, [`Monitor`] samples Manager continuously while
//! faults are injected (and, started with [`Monitor::start_on`], watches the ManagerNode
//! objects for cordons), and [`settle`] polls until nothing is lost or orphaned.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::{WatchStreamExt, watcher};
use manager_client::proto::sim_admin_client::SimAdminClient;
use manager_client::proto::{self as pb, JobHistoryRequest};
use manager_client::{ManagerClient, MirrorState};

use automanager_policy::orphans::{NodeOwner, node_owner};

use crate::SetupError;
use crate::stack::Stack;

/// Capacity is a floating-point score; sums of it are compared with this slack.
const CAPACITY_EPSILON: f64 = 1e-6;

/// An instance's lifecycle, as far as the invariants care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstanceState {
    /// Coming up: holds capacity, counts as live.
    Starting,
    /// Producing output.
    Running,
    /// Going down: still holds capacity, no longer counts as a live copy.
    Stopping,
    /// Stopped or failed: holds nothing.
    Ended,
}

impl InstanceState {
    fn holds_capacity(self) -> bool {
        !matches!(self, InstanceState::Ended)
    }

    fn live(self) -> bool {
        matches!(self, InstanceState::Starting | InstanceState::Running)
    }
}

/// A Manager node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeFact {
    pub id: String,
    pub zone: String,
    /// STARTED: can run jobs.
    pub started: bool,
    /// Terminated: gone for good (its instances are ignored).
    pub terminated: bool,
    pub capacity: f64,
    pub cores: i32,
    /// Who the operator created it for, as its tags say (`None`: not created by the operator).
    pub owner: Option<NodeOwner>,
}

/// One instance of a Manager job.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceFact {
    pub node_id: String,
    /// The job's ordinary instance (not a migration target).
    pub normal: bool,
    pub state: InstanceState,
    /// When it started (with the job and the node, what tells one instance from another).
    pub started_at_ms: i64,
    /// The (capacity, cores) it holds, when known: what the job required when the instance was
    /// first seen. A job registered again with new requirements (a Bundle deleted and created
    /// again under its name) keeps its older instances at what they took when they started.
    pub reserved: Option<(f64, i32)>,
}

/// A Manager job: one replica of one job name of a bundle.
#[derive(Clone, Debug, PartialEq)]
pub struct JobFact {
    pub bundle_id: String,
    pub replica: u32,
    pub job_name: String,
    pub required_capacity: f64,
    pub required_cores: i32,
    pub instances: Vec<InstanceFact>,
    /// From the sim's history: the most instances running at once, when it was read and the job
    /// never had a migration target (a handover runs two on purpose).
    pub max_running_ever: Option<u32>,
}

/// A Bundle object, as the apiserver has it.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct BundleFact {
    /// Manager's id of it: `<namespace>.<name>`.
    pub id: String,
    /// It has a deletionTimestamp.
    pub deleting: bool,
    /// `status.phase` is Broken.
    pub broken: bool,
    /// Stalled with reason `InvalidSpec`: the spec can never run, and the condition says why.
    pub invalid: bool,
    pub replicas: u32,
    pub job_names: Vec<String>,
    /// (replica, job name) whose status says `dropped`.
    pub dropped: BTreeSet<(u32, String)>,
    /// The hard placement rules of its spec.
    pub rules: HardRules,
    /// What its status says of each (replica, job name): the state and the node.
    pub status: BTreeMap<(u32, String), StatusJob>,
}

/// One job as a Bundle's status reports it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct StatusJob {
    /// `status.replicas[].jobs[].state` (`running`, `failed`, `dropped`, ...).
    pub state: String,
    pub node_id: Option<String>,
}

/// The rules of a Bundle's spec that must hold wherever its jobs run (the `hard` ones; `same`
/// between replicas is not checked: it binds a replica to wherever the others happened to be).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HardRules {
    pub inter_different_node: bool,
    pub inter_different_zone: bool,
    pub intra_same_node: bool,
    pub intra_different_node: bool,
    pub intra_same_zone: bool,
    pub intra_different_zone: bool,
    /// (job, job) pairs of `coLocateWith`.
    pub co_locate: Vec<(String, String)>,
    /// (job, job) pairs of `separateFrom`.
    pub separate: Vec<(String, String)>,
}

/// Everything the invariants read at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct World {
    pub nodes: Vec<NodeFact>,
    pub jobs: Vec<JobFact>,
    /// Bundle ids registered in Manager.
    pub manager_bundles: Vec<String>,
    pub bundles: Vec<BundleFact>,
    /// The HotSpareTarget names, when they were read (`None`: spare nodes are not checked).
    pub spare_targets: Option<BTreeSet<String>>,
}

/// What is broken, one entry per violation, each saying which object and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Violations {
    pub duplicates: BTreeSet<String>,
    pub lost: BTreeSet<String>,
    pub overcapacity: BTreeSet<String>,
    pub orphans: BTreeSet<String>,
    pub rules: BTreeSet<String>,
    pub disagreements: BTreeSet<String>,
    /// Instances started on a node after its cordon (see [`check_cordons`]).
    pub placed_after_cordon: BTreeSet<String>,
}

impl Violations {
    fn kinds(&self) -> [(&'static str, &BTreeSet<String>); 7] {
        [
            ("duplicate", &self.duplicates),
            ("lost", &self.lost),
            ("overcapacity", &self.overcapacity),
            ("orphan", &self.orphans),
            ("rule", &self.rules),
            ("disagreement", &self.disagreements),
            ("cordon", &self.placed_after_cordon),
        ]
    }

    /// Nothing broken.
    pub fn is_clean(&self) -> bool {
        self.kinds().iter().all(|(_, set)| set.is_empty())
    }

    /// Nothing broken but jobs not running (and statuses still catching up): for a check while
    /// some jobs are down on purpose (the caller says which), so nothing has settled.
    pub fn nothing_but_lost(&self) -> bool {
        self.duplicates.is_empty()
            && self.overcapacity.is_empty()
            && self.orphans.is_empty()
            && self.rules.is_empty()
            && self.placed_after_cordon.is_empty()
    }

    /// Adds what `other` found (a monitor's samples to the final check).
    pub fn merge(&mut self, other: &Violations) {
        self.duplicates.extend(other.duplicates.iter().cloned());
        self.lost.extend(other.lost.iter().cloned());
        self.overcapacity.extend(other.overcapacity.iter().cloned());
        self.orphans.extend(other.orphans.iter().cloned());
        self.rules.extend(other.rules.iter().cloned());
        self.disagreements
            .extend(other.disagreements.iter().cloned());
        self.placed_after_cordon
            .extend(other.placed_after_cordon.iter().cloned());
    }

    /// The scenario's one line: `reliability scenario=... ok=... duplicates=... ... settle_s=...`,
    /// then the broken rules, status disagreements and placements after a cordon (appended
    /// last, so parsers of the older line keep working).
    pub fn line(&self, scenario: &str, settle: Duration) -> String {
        format!(
            "reliability scenario={scenario} ok={} duplicates={} lost={} overcapacity={} orphans={} settle_s={:.1} rules={} disagreements={} cordon={}",
            self.is_clean(),
            self.duplicates.len(),
            self.lost.len(),
            self.overcapacity.len(),
            self.orphans.len(),
            settle.as_secs_f64(),
            self.rules.len(),
            self.disagreements.len(),
            self.placed_after_cordon.len(),
        )
    }

    /// Every violation, for a failure message (at most 20 of each kind).
    pub fn details(&self) -> String {
        let mut out = String::new();
        for (kind, set) in self.kinds() {
            for v in set.iter().take(20) {
                out.push_str(&format!("{kind}: {v}\n"));
            }
            if set.len() > 20 {
                out.push_str(&format!("{kind}: ... {} more\n", set.len() - 20));
            }
        }
        out
    }
}

/// The invariants Manager alone must keep at every moment: no duplicate, no node over capacity.
pub fn check_manager(world: &World) -> Violations {
    let mut v = Violations::default();
    let terminated: BTreeSet<&str> = world
        .nodes
        .iter()
        .filter(|n| n.terminated)
        .map(|n| n.id.as_str())
        .collect();

    let mut live: BTreeMap<(&str, u32, &str), usize> = BTreeMap::new();
    for j in &world.jobs {
        let n = j
            .instances
            .iter()
            .filter(|i| i.normal && i.state.live() && !terminated.contains(i.node_id.as_str()))
            .count();
        *live
            .entry((&j.bundle_id, j.replica, &j.job_name))
            .or_default() += n;
        if let Some(most) = j.max_running_ever.filter(|m| *m > 1) {
            v.duplicates.insert(format!(
                "{}/{}/{}: {most} instances ran at once",
                j.bundle_id, j.replica, j.job_name
            ));
        }
    }
    for ((bundle, replica, job), n) in live {
        if n > 1 {
            v.duplicates.insert(format!(
                "{bundle}/{replica}/{job}: {n} live normal instances"
            ));
        }
    }

    let mut used: BTreeMap<&str, (f64, i64)> = BTreeMap::new();
    for j in &world.jobs {
        for i in j.instances.iter().filter(|i| i.state.holds_capacity()) {
            let (capacity, cores) = i
                .reserved
                .unwrap_or((j.required_capacity, j.required_cores));
            let u = used.entry(&i.node_id).or_default();
            u.0 += capacity;
            u.1 += i64::from(cores);
        }
    }
    // Only a running node has capacity to exceed. A node Manager stopped hearing from reports
    // none while its instances' own stops are still on their way (the published API sends
    // the node's stop first), and no placement lands on a node that does not run.
    for n in world.nodes.iter().filter(|n| n.started && !n.terminated) {
        let (capacity, cores) = used.get(n.id.as_str()).copied().unwrap_or_default();
        if capacity > n.capacity + CAPACITY_EPSILON || cores > i64::from(n.cores) {
            v.overcapacity.insert(format!(
                "{}: capacity {capacity}/{}, cores {cores}/{}; holding: {}",
                n.id,
                n.capacity,
                n.cores,
                holding_on(world, &n.id)
            ));
        }
    }
    v
}

/// The instances holding capacity on `node`, for an overcapacity's message: each job, whether
/// it is the job's normal instance or a migration target, its state and what it holds.
fn holding_on(world: &World, node: &str) -> String {
    let mut out = Vec::new();
    for j in &world.jobs {
        for i in (j.instances.iter()).filter(|i| i.node_id == node && i.state.holds_capacity()) {
            let (capacity, cores) = i
                .reserved
                .unwrap_or((j.required_capacity, j.required_cores));
            out.push(format!(
                "{}/{}/{} {} {:?} {capacity}/{cores}",
                j.bundle_id,
                j.replica,
                j.job_name,
                if i.normal { "normal" } else { "target" },
                i.state
            ));
        }
    }
    out.join(", ")
}

/// Every invariant: [`check_manager`], plus nothing lost and nothing orphaned (meaningful once
/// the system has settled).
pub fn check(world: &World) -> Violations {
    let mut v = check_manager(world);
    let started: BTreeSet<&str> = world
        .nodes
        .iter()
        .filter(|n| n.started)
        .map(|n| n.id.as_str())
        .collect();
    let jobs: BTreeMap<(&str, u32, &str), &JobFact> = world
        .jobs
        .iter()
        .map(|j| ((j.bundle_id.as_str(), j.replica, j.job_name.as_str()), j))
        .collect();
    for b in world
        .bundles
        .iter()
        .filter(|b| !b.deleting && !b.broken && !b.invalid)
    {
        for replica in 0..b.replicas {
            for name in &b.job_names {
                if b.dropped.contains(&(replica, name.clone())) {
                    continue;
                }
                let why = match jobs.get(&(b.id.as_str(), replica, name.as_str())) {
                    None => Some("no job in Manager".to_owned()),
                    Some(j) => {
                        let running = j.instances.iter().any(|i| {
                            i.normal
                                && i.state == InstanceState::Running
                                && started.contains(i.node_id.as_str())
                        });
                        (!running).then(|| {
                            // Where it is instead, to tell a stuck start from a dead node.
                            let instances: Vec<String> = j
                                .instances
                                .iter()
                                .map(|i| {
                                    let node = if started.contains(i.node_id.as_str()) {
                                        "started"
                                    } else {
                                        "not started"
                                    };
                                    format!(
                                        "{}{:?} on {} ({node})",
                                        if i.normal { "" } else { "target " },
                                        i.state,
                                        i.node_id
                                    )
                                })
                                .collect();
                            format!(
                                "not running on a started node (instances: [{}])",
                                instances.join(", ")
                            )
                        })
                    }
                };
                if let Some(why) = why {
                    v.lost.insert(format!("{}/{replica}/{name}: {why}", b.id));
                }
            }
        }
    }
    let objects: BTreeSet<&str> = world.bundles.iter().map(|b| b.id.as_str()).collect();
    for id in &world.manager_bundles {
        // Only ids of the operator's form can be its orphans.
        if operator_id(id) && !objects.contains(id.as_str()) {
            v.orphans
                .insert(format!("{id}: registered, no Bundle object"));
        }
    }
    check_orphaned_jobs_and_nodes(world, &mut v);
    let running = running_positions(world);
    for b in world.bundles.iter().filter(|b| !b.deleting && !b.invalid) {
        check_rules(b, &running, &mut v);
        if !b.broken {
            check_status(b, &running, &mut v);
        }
    }
    v
}

/// Whether a Manager bundle id is of the operator's form, `<namespace>.<name>`.
pub fn operator_id(id: &str) -> bool {
    id.split_once('.')
        .is_some_and(|(ns, name)| !ns.is_empty() && !name.is_empty())
}

/// Where each job runs: (bundle, replica, job) → (node, zone) of its running normal instance on
/// a started node.
type Positions<'a> = BTreeMap<(&'a str, u32, &'a str), (&'a str, &'a str)>;

fn running_positions(world: &World) -> Positions<'_> {
    let zones: BTreeMap<&str, &str> = world
        .nodes
        .iter()
        .filter(|n| n.started)
        .map(|n| (n.id.as_str(), n.zone.as_str()))
        .collect();
    let mut out = Positions::new();
    for j in &world.jobs {
        let running = j.instances.iter().find_map(|i| {
            (i.normal && i.state == InstanceState::Running)
                .then(|| zones.get_key_value(i.node_id.as_str()))
                .flatten()
        });
        if let Some((node, zone)) = running {
            out.insert(
                (j.bundle_id.as_str(), j.replica, j.job_name.as_str()),
                (*node, *zone),
            );
        }
    }
    out
}

/// Manager jobs with a live instance that no Bundle's spec asks for, and nodes the operator
/// created for an owner that is gone which run nothing.
fn check_orphaned_jobs_and_nodes(world: &World, v: &mut Violations) {
    let objects: BTreeMap<&str, &BundleFact> =
        world.bundles.iter().map(|b| (b.id.as_str(), b)).collect();
    for j in &world.jobs {
        if !operator_id(&j.bundle_id) || !j.instances.iter().any(|i| i.state.holds_capacity()) {
            continue;
        }
        let asked = objects.get(j.bundle_id.as_str()).is_some_and(|b| {
            b.deleting || (j.replica < b.replicas && b.job_names.contains(&j.job_name))
        });
        if !asked {
            v.orphans.insert(format!(
                "{}/{}/{}: runs, no Bundle spec asks for it",
                j.bundle_id, j.replica, j.job_name
            ));
        }
    }
    let mut busy: BTreeSet<&str> = BTreeSet::new();
    for j in &world.jobs {
        for i in j.instances.iter().filter(|i| i.state.holds_capacity()) {
            busy.insert(i.node_id.as_str());
        }
    }
    for n in world
        .nodes
        .iter()
        .filter(|n| !n.terminated && !busy.contains(n.id.as_str()))
    {
        let gone = match &n.owner {
            Some(NodeOwner::BundleReplica(id)) => !objects.contains_key(id.as_str()),
            Some(NodeOwner::SpareTarget(t)) => world
                .spare_targets
                .as_ref()
                .is_some_and(|targets| !targets.contains(t)),
            // A migration's target node is its Migration's to remove; not checked here.
            Some(NodeOwner::Migration(_)) | None => false,
        };
        if gone {
            v.orphans.insert(format!(
                "node {}: created for {:?}, which is gone, and runs nothing",
                n.id, n.owner
            ));
        }
    }
}

/// The bundle's hard rules against where its jobs run.
fn check_rules(b: &BundleFact, running: &Positions<'_>, v: &mut Violations) {
    let at = |replica: u32, job: &str| running.get(&(b.id.as_str(), replica, job)).copied();
    let r = &b.rules;
    let mut broken = |what: String| {
        v.rules.insert(format!("{}: {what}", b.id));
    };
    // Between replicas: every job of one against every job of another.
    for r1 in 0..b.replicas {
        for r2 in r1 + 1..b.replicas {
            for j1 in &b.job_names {
                for j2 in &b.job_names {
                    let (Some((n1, z1)), Some((n2, z2))) = (at(r1, j1), at(r2, j2)) else {
                        continue;
                    };
                    if r.inter_different_node && n1 == n2 {
                        broken(format!(
                            "replicas {r1} and {r2} must use different nodes; {j1} and {j2} share {n1}"
                        ));
                    }
                    if r.inter_different_zone && z1 == z2 {
                        broken(format!(
                            "replicas {r1} and {r2} must use different zones; {j1} and {j2} share {z1}"
                        ));
                    }
                }
            }
        }
    }
    // Within a replica: jobs of one co-located group share a node by design, so `different`
    // applies between groups (as the placement engine reads it).
    let group = co_located_groups(b);
    for replica in 0..b.replicas {
        for (i, j1) in b.job_names.iter().enumerate() {
            for j2 in b.job_names.iter().skip(i + 1) {
                let (Some((n1, z1)), Some((n2, z2))) = (at(replica, j1), at(replica, j2)) else {
                    continue;
                };
                let same_group = group.get(j1.as_str()) == group.get(j2.as_str());
                let mut rule = |holds: bool, what: &str| {
                    if !holds {
                        broken(format!(
                            "replica {replica}: {j1} on {n1} ({z1}) and {j2} on {n2} ({z2}) break {what}"
                        ));
                    }
                };
                if r.intra_same_node {
                    rule(n1 == n2, "intra-replica same node");
                }
                if r.intra_same_zone {
                    rule(z1 == z2, "intra-replica same zone");
                }
                if r.intra_different_node && !same_group {
                    rule(n1 != n2, "intra-replica different node");
                }
                if r.intra_different_zone && !same_group {
                    rule(z1 != z2, "intra-replica different zone");
                }
            }
        }
        for (j1, j2) in &r.co_locate {
            if let (Some((n1, _)), Some((n2, _))) = (at(replica, j1), at(replica, j2))
                && n1 != n2
            {
                broken(format!(
                    "replica {replica}: {j1} on {n1} must be co-located with {j2} on {n2}"
                ));
            }
        }
        for (j1, j2) in &r.separate {
            if let (Some((n1, _)), Some((n2, _))) = (at(replica, j1), at(replica, j2))
                && n1 == n2
            {
                broken(format!(
                    "replica {replica}: {j1} must be separate from {j2}; both on {n1}"
                ));
            }
        }
    }
}

/// Each job's co-located group (`coLocateWith`, transitively), as the index of its first job.
fn co_located_groups(b: &BundleFact) -> BTreeMap<&str, usize> {
    let mut group: BTreeMap<&str, usize> = b
        .job_names
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    // Few jobs per bundle: relabel until nothing changes.
    loop {
        let mut changed = false;
        for (a, c) in &b.rules.co_locate {
            if let (Some(&ga), Some(&gc)) = (group.get(a.as_str()), group.get(c.as_str()))
                && ga != gc
            {
                let (lo, hi) = (ga.min(gc), ga.max(gc));
                for g in group.values_mut() {
                    if *g == hi {
                        *g = lo;
                    }
                }
                changed = true;
            }
        }
        if !changed {
            return group;
        }
    }
}

/// The bundle's status against where Manager runs its jobs.
fn check_status(b: &BundleFact, running: &Positions<'_>, v: &mut Violations) {
    for replica in 0..b.replicas {
        for name in &b.job_names {
            let manager = running.get(&(b.id.as_str(), replica, name.as_str()));
            let status = b.status.get(&(replica, name.clone()));
            let says = status.map_or_else(
                || "nothing".to_owned(),
                |s| {
                    format!(
                        "{} on {}",
                        s.state,
                        s.node_id.as_deref().unwrap_or("no node")
                    )
                },
            );
            let agrees = match (manager, status) {
                (Some((node, _)), Some(s)) => {
                    s.state == "running" && s.node_id.as_deref() == Some(*node)
                }
                (Some(_), None) => false,
                (None, Some(s)) => s.state != "running",
                (None, None) => true,
            };
            if !agrees {
                let runs = manager.map_or_else(
                    || "runs no instance".to_owned(),
                    |(node, _)| format!("runs it on {node}"),
                );
                v.disagreements.insert(format!(
                    "{}/{replica}/{name}: Manager {runs}, the status says {says}",
                    b.id
                ));
            }
        }
    }
}

// ───────────────────────────── cordons ─────────────────────────────

/// How long after a node's cordon was seen an instance may still start on it. A bundle
/// reconcile that chose the node before the cordon reached the operator's placement model (one
/// ManagerNode watch event and reconcile) may still send its StartJob; on the shared 2-core test
/// machine that takes well under a second, so 2 s is ample. Later than that, the start was
/// decided with the cordon in place: a violation.
pub const CORDON_SLACK: Duration = Duration::from_secs(2);

/// One span of a node's cordon (`spec.cordoned` or `spec.drain`), in wall-clock milliseconds
/// since the epoch: the sim stamps its starts with the same host's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CordonSpan {
    /// The earliest moment the cordon was known to be in place (set by the test, or first seen
    /// on the ManagerNode object).
    pub from_ms: i64,
    /// When it was seen lifted, if it was.
    pub until_ms: Option<i64>,
}

/// Every node's cordon spans, oldest first, by Manager node id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CordonFacts(pub BTreeMap<String, Vec<CordonSpan>>);

impl CordonFacts {
    /// Records that `node_id` was seen cordoned (or not) at `at_ms`. A cordon already open keeps
    /// the earlier of its two times (the test and the watch both report it); an uncordon closes
    /// the open span.
    pub fn note(&mut self, node_id: &str, cordoned: bool, at_ms: i64) {
        let spans = self.0.entry(node_id.to_owned()).or_default();
        match (spans.last_mut(), cordoned) {
            (Some(open), true) if open.until_ms.is_none() => {
                open.from_ms = open.from_ms.min(at_ms);
            }
            (_, true) => spans.push(CordonSpan {
                from_ms: at_ms,
                until_ms: None,
            }),
            (Some(open), false) if open.until_ms.is_none() => {
                open.until_ms = Some(at_ms.max(open.from_ms));
            }
            (_, false) => {}
        }
        if spans.is_empty() {
            self.0.remove(node_id);
        }
    }

    /// No node was ever seen cordoned.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// One instance start the sim recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartFact {
    /// `<bundle>/<replica>/<job>`.
    pub job_id: String,
    pub node_id: String,
    pub at_ms: i64,
    /// Started as a migration's target (a handover or a migrate drain placed it).
    pub migration_target: bool,
}

/// What [`check_cordons`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CordonCheck {
    /// Starts later than the slack after their node's cordon, one line each.
    pub violations: BTreeSet<String>,
    /// How long after its node's cordon each start within the slack came (in flight when the
    /// cordon landed), in milliseconds.
    pub in_flight_ms: Vec<i64>,
}

/// Starts on a cordoned node: a start more than `slack` after the cordon and before the node was
/// uncordoned is a violation; one within the slack was in flight. Any start counts, a
/// migration's target included (a drain's targets must go elsewhere too).
pub fn check_cordons(cordons: &CordonFacts, starts: &[StartFact], slack: Duration) -> CordonCheck {
    let slack_ms = i64::try_from(slack.as_millis()).unwrap_or(i64::MAX);
    let mut out = CordonCheck::default();
    for s in starts {
        let Some(spans) = cordons.0.get(&s.node_id) else {
            continue;
        };
        let Some(span) = spans
            .iter()
            .find(|c| c.from_ms <= s.at_ms && c.until_ms.is_none_or(|u| s.at_ms < u))
        else {
            continue;
        };
        let after = s.at_ms - span.from_ms;
        if after > slack_ms {
            out.violations.insert(format!(
                "{}: {}started on {} {:.1}s after its cordon",
                s.job_id,
                if s.migration_target {
                    "migration target "
                } else {
                    ""
                },
                s.node_id,
                after as f64 / 1000.0
            ));
        } else {
            out.in_flight_ms.push(after);
        }
    }
    out
}

/// A ManagerNode object's Manager node id (`status.nodeId`, else its name, as the operator
/// reads it) and whether it is cordoned (`spec.cordoned`, or any `spec.drain`).
pub fn node_cordon(name: &str, object: &serde_json::Value) -> (String, bool) {
    let id = object["status"]["nodeId"]
        .as_str()
        .filter(|id| !id.is_empty())
        .unwrap_or(name)
        .to_owned();
    let cordoned = object["spec"]["cordoned"] == true || object["spec"]["drain"].is_object();
    (id, cordoned)
}

/// Wall-clock milliseconds since the epoch, the clock of the sim's start times.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The cordons a [`Monitor`] knows of, shared by its ManagerNode watch and the test (which
/// records the moment its own `kubectl patch` returned).
#[derive(Clone, Default)]
pub struct CordonLog(Arc<Mutex<CordonFacts>>);

impl CordonLog {
    /// See [`CordonFacts::note`].
    pub fn note(&self, node_id: &str, cordoned: bool, at_ms: i64) {
        if let Ok(mut f) = self.0.lock() {
            f.note(node_id, cordoned, at_ms);
        }
    }

    /// What is known now.
    pub fn facts(&self) -> CordonFacts {
        self.0.lock().map(|f| f.clone()).unwrap_or_default()
    }
}

/// Watches every ManagerNode object and notes each change of its cordon at the moment the
/// change arrives (the first sight of a cordoned object counts as a change). Objects are read
/// untyped, so one the typed API could not decode does not stop the watch.
fn watch_cordons(client: kube::Client, log: CordonLog) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let resource = ApiResource::erase::<automanager_api::node::ManagerNode>(&());
        let api: Api<DynamicObject> = Api::all_with(client, &resource);
        let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        // The last state seen of each node: only changes are noted, so a stale event that
        // arrives after the test recorded its own cordon does not lift it.
        let mut seen: BTreeMap<String, bool> = BTreeMap::new();
        while let Some(event) = events.next().await {
            let at = now_ms();
            let (object, gone) = match event {
                Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => (o, false),
                Ok(watcher::Event::Delete(o)) => (o, true),
                // A broken watch is retried with backoff; the re-list reports every object again.
                Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => continue,
            };
            let name = object.metadata.name.clone().unwrap_or_default();
            let (id, cordoned) = node_cordon(&name, &object.data);
            // A deleted object takes its cordon with it.
            let cordoned = cordoned && !gone;
            if seen.insert(id.clone(), cordoned) != Some(cordoned) {
                log.note(&id, cordoned, at);
            }
        }
    })
}

/// Every start the sim recorded of `job_ids` (a job never started has none).
async fn starts_of(
    endpoint: &str,
    job_ids: &BTreeSet<String>,
) -> Result<Vec<StartFact>, SetupError> {
    let mut admin = sim_admin(endpoint).await?;
    let mut out = Vec::new();
    for job_id in job_ids {
        let h = match admin
            .job_history(JobHistoryRequest {
                job_id: job_id.clone(),
            })
            .await
        {
            Ok(h) => h.into_inner(),
            Err(s) if s.code() == tonic::Code::NotFound => continue,
            Err(s) => {
                return Err(SetupError(format!(
                    "job history of {job_id}: {}",
                    s.message()
                )));
            }
        };
        out.extend(h.starts.iter().map(|s| StartFact {
            job_id: job_id.clone(),
            node_id: s.node_id.clone(),
            at_ms: s.at_ms,
            migration_target: s.role() == pb::JobRole::MigrationTarget,
        }));
    }
    Ok(out)
}

// ───────────────────────────── suite helpers ─────────────────────────────

/// The suite's operator settings: the orphan sweep looks every 2 s with a 10 s grace (the
/// default is 1 min and 5 min), so what a deletion or a fault left behind is removed within a
/// scenario's settle and the checker can hold it to "no orphans once settled".
pub fn suite_settings(c: &mut serde_json::Map<String, serde_json::Value>) {
    c.insert(
        "orphanSweep".into(),
        serde_json::json!({"enabled": true, "grace": "10s", "interval": "2s"}),
    );
}

/// Prints the lines of every log of the stack (operator, sim runs) that mention `needle`, at
/// most 40 per log: what a failure message needs to say what happened to one job. With
/// `AUTOMANAGER_E2E_KEEP_LOGS=DIR` the logs are also copied there whole (a suite's shared stack
/// outlives the failing scenario, so its logs are not kept when the scenario panics).
pub fn print_log_lines(stack: &Stack, needle: &str) {
    let Ok(entries) = std::fs::read_dir(stack.dir.path()) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        crate::stack::keep_log(&path);
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| l.contains(needle)).collect();
        eprintln!(
            "--- {} ({} lines mention {needle})",
            path.display(),
            lines.len()
        );
        for l in lines.iter().rev().take(40).rev() {
            let cut = (0..=l.len().min(400))
                .rev()
                .find(|i| l.is_char_boundary(*i))
                .unwrap_or(0);
            eprintln!("{}", &l[..cut]);
        }
    }
}

/// For the first lost job's Bundle: its status, and what the logs say of it.
pub async fn explain_lost(stack: &Stack, v: &Violations) {
    let Some((ns, name)) = v
        .lost
        .iter()
        .next()
        .and_then(|l| l.split('/').next())
        .and_then(|id| id.split_once('.'))
    else {
        return;
    };
    let b = stack
        .get_json(&["bundle", name, "-n", ns])
        .await
        .unwrap_or_default();
    eprintln!(
        "lost {ns}/{name}: generation {}, uid {}, status {}",
        b["metadata"]["generation"],
        b["metadata"]["uid"],
        serde_json::to_string(&b["status"]).unwrap_or_default()
    );
    print_log_lines(stack, name);
}

// ───────────────────────────── reading the stack ─────────────────────────────

/// What a Manager instance state means to the invariants.
pub fn instance_state(s: pb::JobState) -> InstanceState {
    match s {
        pb::JobState::Starting => InstanceState::Starting,
        pb::JobState::Running => InstanceState::Running,
        pb::JobState::Stopping => InstanceState::Stopping,
        _ => InstanceState::Ended,
    }
}

/// Manager's half of a [`World`] from a mirror.
pub fn manager_facts(state: &MirrorState) -> (Vec<NodeFact>, Vec<JobFact>, Vec<String>) {
    let nodes = state
        .nodes
        .values()
        .map(|n| NodeFact {
            id: n.node_id.clone(),
            zone: n.zone().to_owned(),
            started: n.state() == pb::NodeState::Started,
            terminated: n.state() == pb::NodeState::Terminated,
            capacity: n.inventory.as_ref().map_or(0.0, |i| i.capacity),
            cores: n.inventory.as_ref().map_or(0, |i| i.cores),
            owner: node_owner(|k| n.tags.get(k).map(String::as_str)),
        })
        .collect();
    let jobs = state
        .jobs
        .values()
        .map(|j| {
            let req = j.requirements.clone().unwrap_or_default();
            JobFact {
                bundle_id: j.bundle_id.clone(),
                replica: j.replica,
                job_name: j.job_name.clone(),
                required_capacity: req.required_capacity,
                required_cores: req.required_cores,
                instances: j
                    .instances
                    .iter()
                    .map(|i| InstanceFact {
                        node_id: i.node_id.clone(),
                        normal: i.is_normal(),
                        state: instance_state(i.state()),
                        started_at_ms: i.started_at_ms,
                        reserved: None,
                    })
                    .collect(),
                max_running_ever: None,
            }
        })
        .collect();
    (nodes, jobs, state.bundles.keys().cloned().collect())
}

/// The Kubernetes half of a [`World`] from `kubectl get bundles -A -o json`.
pub fn bundle_facts(list: &serde_json::Value) -> Vec<BundleFact> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| {
            let ns = b["metadata"]["namespace"].as_str().unwrap_or_default();
            let name = b["metadata"]["name"].as_str().unwrap_or_default();
            let dropped = b["status"]["replicas"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|r| {
                    let replica = r["replica"]
                        .as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .unwrap_or(u32::MAX);
                    r["jobs"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter(|j| j["state"] == "dropped")
                        .filter_map(move |j| j["jobName"].as_str().map(|n| (replica, n.to_owned())))
                })
                .collect();
            BundleFact {
                id: format!("{ns}.{name}"),
                deleting: !b["metadata"]["deletionTimestamp"].is_null(),
                broken: b["status"]["phase"] == "Broken",
                invalid: crate::condition(b, "Stalled")["status"] == "True"
                    && crate::condition(b, "Stalled")["reason"] == "InvalidSpec",
                replicas: b["spec"]["replicas"]
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
                job_names: b["spec"]["jobs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|j| j["jobName"].as_str().map(str::to_owned))
                    .collect(),
                dropped,
                rules: hard_rules(&b["spec"]),
                status: status_jobs(&b["status"]),
            }
        })
        .collect()
}

/// The hard rules of a Bundle's spec (JSON), with the API's defaults where a field is absent:
/// different nodes between replicas (hard), nothing within one.
fn hard_rules(spec: &serde_json::Value) -> HardRules {
    let hard = |rules: &serde_json::Value, scope: &str, relation: &str| {
        rules[scope]["relation"] == relation && rules[scope]["enforcement"] == "hard"
    };
    let inter = &spec["interReplicaPlacement"];
    let intra = &spec["intraReplicaPlacement"];
    let pairs = |key: &str| -> Vec<(String, String)> {
        spec["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|j| {
                let name = j["jobName"].as_str().unwrap_or_default().to_owned();
                j[key]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|t| t.as_str())
                    .map(move |t| (name.clone(), t.to_owned()))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    HardRules {
        inter_different_node: inter.is_null() || hard(inter, "node", "different"),
        inter_different_zone: hard(inter, "zone", "different"),
        intra_same_node: hard(intra, "node", "same"),
        intra_different_node: hard(intra, "node", "different"),
        intra_same_zone: hard(intra, "zone", "same"),
        intra_different_zone: hard(intra, "zone", "different"),
        co_locate: pairs("coLocateWith"),
        separate: pairs("separateFrom"),
    }
}

/// What a Bundle's status (JSON) says of each (replica, job name).
fn status_jobs(status: &serde_json::Value) -> BTreeMap<(u32, String), StatusJob> {
    let mut out = BTreeMap::new();
    for r in status["replicas"].as_array().into_iter().flatten() {
        let Some(replica) = r["replica"].as_u64().and_then(|n| u32::try_from(n).ok()) else {
            continue;
        };
        for j in r["jobs"].as_array().into_iter().flatten() {
            if let Some(name) = j["jobName"].as_str() {
                out.insert(
                    (replica, name.to_owned()),
                    StatusJob {
                        state: j["state"].as_str().unwrap_or_default().to_owned(),
                        node_id: j["nodeId"].as_str().map(str::to_owned),
                    },
                );
            }
        }
    }
    out
}

async fn mirror_of(endpoint: &str) -> Result<MirrorState, SetupError> {
    let client = crate::stack::manager_view(endpoint, crate::stack::ManagerApi::from_env()).await?;
    let ready = client.wait_ready(Duration::from_secs(30)).await;
    let state = client.mirror().state();
    client.close().await;
    ready.map_err(|e| SetupError(format!("the sim's Watch did not sync: {e}")))?;
    Ok(state)
}

/// A gRPC channel to the sim at `endpoint` (5 s to connect), each call bounded by `timeout`;
/// `what` names the API in the error.
pub async fn sim_channel(
    endpoint: &str,
    timeout: Duration,
    what: &str,
) -> Result<tonic::transport::Channel, SetupError> {
    tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| SetupError(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(timeout)
        .connect()
        .await
        .map_err(|e| SetupError(format!("connecting to {what}: {e}")))
}

/// A client of the sim's fault-injection API (`SimAdmin`) at `endpoint`.
pub async fn sim_admin(
    endpoint: &str,
) -> Result<SimAdminClient<tonic::transport::Channel>, SetupError> {
    let channel = sim_channel(endpoint, Duration::from_secs(10), "the sim's admin API").await?;
    Ok(SimAdminClient::new(channel))
}

/// Manager's state as a fresh Watch sees it (connect, sync, copy, close).
pub async fn manager_state(endpoint: &str) -> Result<MirrorState, SetupError> {
    mirror_of(endpoint).await
}

/// Reads the sim's history of every job in `jobs` and records the most instances that ran at
/// once, for jobs that never had a migration target.
async fn add_history(endpoint: &str, jobs: &mut [JobFact]) -> Result<(), SetupError> {
    let mut admin = sim_admin(endpoint).await?;
    for j in jobs.iter_mut() {
        let job_id = format!("{}/{}/{}", j.bundle_id, j.replica, j.job_name);
        let h = match admin.job_history(JobHistoryRequest { job_id }).await {
            Ok(h) => h.into_inner(),
            // Never started: no history, and nothing that could have run twice.
            Err(s) if s.code() == tonic::Code::NotFound => {
                j.max_running_ever = Some(0);
                continue;
            }
            Err(s) => return Err(SetupError(format!("job history: {}", s.message()))),
        };
        let handover = h
            .starts
            .iter()
            .any(|s| s.role() == pb::JobRole::MigrationTarget);
        j.max_running_ever = (!handover).then_some(h.max_running);
    }
    Ok(())
}

/// The stack's state now: the sim's (with each job's history) and the Bundle objects.
pub async fn observe(stack: &Stack) -> Result<World, SetupError> {
    let state = mirror_of(&stack.sim_endpoint).await?;
    let (nodes, mut jobs, manager_bundles) = manager_facts(&state);
    add_history(&stack.sim_endpoint, &mut jobs).await?;
    let list = stack.get_json(&["bundles", "-A"]).await?;
    let targets = stack.get_json(&["hotsparetargets"]).await?;
    let spare_targets = targets["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["metadata"]["name"].as_str().map(str::to_owned))
        .collect();
    Ok(World {
        nodes,
        jobs,
        manager_bundles,
        bundles: bundle_facts(&list),
        spare_targets: Some(spare_targets),
    })
}

/// Polls [`observe`] + [`check`] until nothing is broken or `timeout` passes; returns the last
/// violations and how long it took.
pub async fn settle(
    stack: &Stack,
    timeout: Duration,
) -> Result<(Violations, Duration), SetupError> {
    let start = Instant::now();
    loop {
        let v = check(&observe(stack).await?);
        if v.is_clean() || start.elapsed() > timeout {
            return Ok((v, start.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What each instance the monitor has seen holds: the job's requirement when the instance was
/// first seen, by (bundle, replica, job, node, start time).
#[derive(Default)]
struct Reservations(BTreeMap<InstanceKey, (f64, i32)>);

/// (bundle, replica, job name, node, start time): one instance.
type InstanceKey = (String, u32, String, String, i64);

impl Reservations {
    /// Records the instances seen for the first time and sets every instance's reservation.
    fn apply(&mut self, jobs: &mut [JobFact]) {
        let mut live = BTreeSet::new();
        for j in jobs.iter_mut() {
            let now = (j.required_capacity, j.required_cores);
            for i in &mut j.instances {
                let key = (
                    j.bundle_id.clone(),
                    j.replica,
                    j.job_name.clone(),
                    i.node_id.clone(),
                    i.started_at_ms,
                );
                i.reserved = Some(*self.0.entry(key.clone()).or_insert(now));
                live.insert(key);
            }
        }
        // Instances Manager no longer reports are forgotten, so the memo stays bounded.
        self.0.retain(|k, _| live.contains(k));
    }
}

/// Samples Manager's state in the background ([`check_manager`] on every revision, at most
/// every 100 ms) and keeps every violation it saw; it also keeps the id of every job it saw, and
/// when it stops, checks their starts against the cordons it knows of ([`check_cordons`]).
pub struct Monitor {
    seen: Arc<Mutex<Violations>>,
    samples: Arc<Mutex<u64>>,
    job_ids: Arc<Mutex<BTreeSet<String>>>,
    task: tokio::task::JoinHandle<()>,
    cordon_watch: Option<tokio::task::JoinHandle<()>>,
    cordons: CordonLog,
    client: ManagerClient,
    endpoint: String,
    /// How the monitor's own Watch went: each connection state and snapshot, with the revision.
    stream_log: Arc<Mutex<Vec<String>>>,
    stream_watch: tokio::task::JoinHandle<()>,
}

impl Monitor {
    /// Starts watching the sim at `endpoint`. Cordons are checked only as far as the test
    /// records them in [`Monitor::cordons`]; [`Monitor::start_on`] also watches for them.
    pub async fn start(endpoint: &str) -> Result<Monitor, SetupError> {
        // In the API the stacks of this process speak.
        let client =
            crate::stack::manager_view(endpoint, crate::stack::ManagerApi::from_env()).await?;
        client
            .wait_ready(Duration::from_secs(30))
            .await
            .map_err(|e| SetupError(format!("the sim's Watch did not sync: {e}")))?;
        let seen = Arc::new(Mutex::new(Violations::default()));
        let samples = Arc::new(Mutex::new(0));
        let job_ids = Arc::new(Mutex::new(BTreeSet::new()));
        let task = {
            let (seen, samples, job_ids) = (seen.clone(), samples.clone(), job_ids.clone());
            let mirror = client.mirror().clone();
            let mut revisions = mirror.revisions();
            tokio::spawn(async move {
                let mut reservations = Reservations::default();
                loop {
                    let (nodes, mut jobs, manager_bundles) = mirror.read(manager_facts);
                    reservations.apply(&mut jobs);
                    if let Ok(mut ids) = job_ids.lock() {
                        for j in &jobs {
                            ids.insert(format!("{}/{}/{}", j.bundle_id, j.replica, j.job_name));
                        }
                    }
                    let v = check_manager(&World {
                        nodes,
                        jobs,
                        manager_bundles,
                        bundles: Vec::new(),
                        spare_targets: None,
                    });
                    if let Ok(mut s) = seen.lock() {
                        s.merge(&v);
                    }
                    if let Ok(mut n) = samples.lock() {
                        *n += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if revisions.changed().await.is_err() {
                        return;
                    }
                }
            })
        };
        let stream_log = Arc::new(Mutex::new(Vec::new()));
        let stream_watch = watch_stream(&client, stream_log.clone());
        Ok(Monitor {
            seen,
            samples,
            job_ids,
            task,
            cordon_watch: None,
            cordons: CordonLog::default(),
            client,
            endpoint: endpoint.to_owned(),
            stream_log,
            stream_watch,
        })
    }

    /// How the monitor's Watch went so far: each state change of its connection and each
    /// snapshot it was sent, with its mirror's revision and epoch then.
    pub fn stream_log(&self) -> Vec<String> {
        self.stream_log
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// Where the monitor's mirror (kept by resuming its Watch) differs from Manager's state as a
    /// fresh Watch sees it: the instances holding capacity that only one of them has (by job,
    /// node, start time and state), at most 20 each way. Empty when they agree; meaningful once
    /// nothing moves (a settled system), when both should be at the same revision.
    pub async fn drift(&self) -> Result<Vec<String>, SetupError> {
        let fresh = mirror_of(&self.endpoint).await?;
        let mine = self.client.mirror().state();
        let holding = |s: &MirrorState| -> BTreeSet<String> {
            let (_, jobs, _) = manager_facts(s);
            jobs.iter()
                .flat_map(|j| {
                    j.instances
                        .iter()
                        .filter(|i| i.state.holds_capacity())
                        .map(move |i| {
                            format!(
                                "{}/{}/{} on {} started_at_ms={} {:?}{}",
                                j.bundle_id,
                                j.replica,
                                j.job_name,
                                i.node_id,
                                i.started_at_ms,
                                i.state,
                                if i.normal { "" } else { " (migration target)" }
                            )
                        })
                })
                .collect()
        };
        let (a, b) = (holding(&mine), holding(&fresh));
        let mut out = Vec::new();
        let only_mine: Vec<_> = a.difference(&b).collect();
        let only_fresh: Vec<_> = b.difference(&a).collect();
        if only_mine.is_empty() && only_fresh.is_empty() {
            return Ok(out);
        }
        out.push(format!(
            "the monitor's mirror is at revision {} (epoch {}), a fresh Watch at {} (epoch {}): {} instances only in the mirror, {} only in Manager",
            mine.revision,
            mine.epoch,
            fresh.revision,
            fresh.epoch,
            only_mine.len(),
            only_fresh.len()
        ));
        out.extend(
            only_mine
                .iter()
                .take(20)
                .map(|i| format!("only in the mirror: {i}")),
        );
        out.extend(
            only_fresh
                .iter()
                .take(20)
                .map(|i| format!("only in Manager: {i}")),
        );
        Ok(out)
    }

    /// [`Monitor::start`] on the stack's sim, also watching the ManagerNode objects: a node
    /// cordoned or drained by anyone is noted when the watch first shows it.
    pub async fn start_on(stack: &Stack) -> Result<Monitor, SetupError> {
        let mut monitor = Monitor::start(&stack.sim_endpoint).await?;
        monitor.cordon_watch = Some(watch_cordons(stack.env.client(), monitor.cordons.clone()));
        Ok(monitor)
    }

    /// The cordons this monitor checks against; a test that cordons a node notes when.
    pub fn cordons(&self) -> CordonLog {
        self.cordons.clone()
    }

    /// Stops sampling; returns what was seen and how many samples were taken. With cordons
    /// known, the sim's start history of every job seen is read and checked against them; a
    /// history that cannot be read is reported as a cordon violation (the check did not run).
    pub async fn stop(self) -> (Violations, u64) {
        self.task.abort();
        self.stream_watch.abort();
        if let Some(w) = &self.cordon_watch {
            w.abort();
        }
        self.client.close().await;
        let mut seen = self.seen.lock().map(|s| s.clone()).unwrap_or_default();
        let samples = self.samples.lock().map(|n| *n).unwrap_or_default();
        let cordons = self.cordons.facts();
        if !cordons.is_empty() {
            let ids = self.job_ids.lock().map(|i| i.clone()).unwrap_or_default();
            match starts_of(&self.endpoint, &ids).await {
                Ok(starts) => {
                    let c = check_cordons(&cordons, &starts, CORDON_SLACK);
                    eprintln!(
                        "monitor: {} nodes cordoned; {} starts on them within {:?} of the cordon (the latest {} ms after it), {} later",
                        cordons.0.len(),
                        c.in_flight_ms.len(),
                        CORDON_SLACK,
                        c.in_flight_ms.iter().max().copied().unwrap_or(0),
                        c.violations.len()
                    );
                    seen.placed_after_cordon.extend(c.violations);
                }
                Err(e) => {
                    seen.placed_after_cordon.insert(format!("not checked: {e}"));
                }
            }
        }
        (seen, samples)
    }
}

/// Notes in `log` every state change of `client`'s connection and every snapshot its Watch is
/// sent, each with the time and the mirror's revision and epoch then.
fn watch_stream(
    client: &ManagerClient,
    log: Arc<Mutex<Vec<String>>>,
) -> tokio::task::JoinHandle<()> {
    let mut states = client.state();
    let mut changes = client.subscribe();
    let mirror = client.mirror().clone();
    let started = Instant::now();
    tokio::spawn(async move {
        let note = |what: String| {
            let (revision, epoch) = mirror.read(|s| (s.revision, s.epoch.clone()));
            if let Ok(mut l) = log.lock() {
                l.push(format!(
                    "+{:.1}s {what}; mirror at revision {revision} (epoch {epoch})",
                    started.elapsed().as_secs_f64()
                ));
            }
        };
        loop {
            tokio::select! {
                r = states.changed() => {
                    if r.is_err() {
                        return;
                    }
                    let s = *states.borrow_and_update();
                    note(format!("connection {}", s.as_str()));
                }
                c = changes.recv() => match c {
                    Ok(manager_client::MirrorChange::Resynced { revision, reason }) => {
                        note(format!("snapshot at revision {revision} ({reason:?})"));
                    }
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                },
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use automanager_policy::ids::BundleId;

    fn node(id: &str, capacity: f64, cores: i32) -> NodeFact {
        NodeFact {
            id: id.into(),
            zone: "z".into(),
            started: true,
            terminated: false,
            capacity,
            cores,
            owner: None,
        }
    }

    fn inst(node: &str, state: InstanceState) -> InstanceFact {
        InstanceFact {
            node_id: node.into(),
            normal: true,
            state,
            started_at_ms: 0,
            reserved: None,
        }
    }

    fn job(bundle: &str, replica: u32, name: &str, instances: Vec<InstanceFact>) -> JobFact {
        JobFact {
            bundle_id: bundle.into(),
            replica,
            job_name: name.into(),
            required_capacity: 10.0,
            required_cores: 1,
            instances,
            max_running_ever: Some(1),
        }
    }

    /// A Bundle with the API's default rules (replicas on different nodes) whose status says
    /// nothing yet.
    fn bundle(id: &str, replicas: u32, jobs: &[&str]) -> BundleFact {
        BundleFact {
            id: id.into(),
            replicas,
            job_names: jobs.iter().map(|j| (*j).to_owned()).collect(),
            rules: hard_rules(&serde_json::json!({})),
            ..BundleFact::default()
        }
    }

    fn says(state: &str, node: &str) -> StatusJob {
        StatusJob {
            state: state.into(),
            node_id: Some(node.into()),
        }
    }

    /// One bundle of two replicas of `enc`, each running on its own node, as its status says.
    fn healthy() -> World {
        let mut b = bundle("ns.b", 2, &["enc"]);
        b.status.insert((0, "enc".into()), says("running", "n1"));
        b.status.insert((1, "enc".into()), says("running", "n2"));
        World {
            nodes: vec![node("n1", 100.0, 16), node("n2", 100.0, 16)],
            jobs: vec![
                job("ns.b", 0, "enc", vec![inst("n1", InstanceState::Running)]),
                job("ns.b", 1, "enc", vec![inst("n2", InstanceState::Running)]),
            ],
            manager_bundles: vec!["ns.b".into()],
            bundles: vec![b],
            spare_targets: Some(BTreeSet::new()),
        }
    }

    #[test]
    fn a_healthy_world_is_clean() {
        let v = check(&healthy());
        assert!(v.is_clean(), "{}", v.details());
        assert_eq!(
            v.line("x", Duration::from_millis(1500)),
            "reliability scenario=x ok=true duplicates=0 lost=0 overcapacity=0 orphans=0 settle_s=1.5 rules=0 disagreements=0 cordon=0"
        );
    }

    #[test]
    fn two_live_normal_instances_of_one_job_are_a_duplicate() {
        let mut w = healthy();
        // The same (bundle, replica, job) reported twice, live on both nodes.
        w.jobs.push(job(
            "ns.b",
            0,
            "enc",
            vec![inst("n2", InstanceState::Starting)],
        ));
        let v = check(&w);
        assert_eq!(v.duplicates.len(), 1, "{}", v.details());
        assert!(v.duplicates.iter().all(|d| d.starts_with("ns.b/0/enc")));
    }

    #[test]
    fn history_shows_a_past_duplicate_but_a_handover_target_or_stopping_copy_does_not() {
        let mut w = healthy();
        w.jobs[0].max_running_ever = Some(2);
        assert_eq!(check(&w).duplicates.len(), 1);

        let mut w = healthy();
        w.jobs[0].instances.push(InstanceFact {
            normal: false,
            ..inst("n2", InstanceState::Running)
        });
        w.jobs[1]
            .instances
            .push(inst("n1", InstanceState::Stopping));
        w.jobs[0].max_running_ever = None;
        assert!(check(&w).duplicates.is_empty());
    }

    #[test]
    fn a_node_over_capacity_or_cores_is_reported_and_ended_instances_hold_nothing() {
        let mut w = healthy();
        w.nodes[0].capacity = 15.0;
        w.jobs.push(job(
            "ns.c",
            0,
            "enc",
            vec![inst("n1", InstanceState::Stopping)],
        ));
        w.manager_bundles.push("ns.c".into());
        w.bundles.push(bundle("ns.c", 1, &["enc"]));
        let v = check(&w);
        assert_eq!(v.overcapacity.len(), 1, "{}", v.details());
        assert!(
            v.overcapacity
                .iter()
                .next()
                .is_some_and(|o| o.starts_with("n1:"))
        );

        let mut w = healthy();
        w.nodes[1].cores = 0;
        assert_eq!(check(&w).overcapacity.len(), 1);
        // The same node once Manager stopped hearing from it: no capacity left, its instance's
        // stop still on its way; nothing is over a capacity a dead node does not have.
        w.nodes[1].started = false;
        w.nodes[1].capacity = 0.0;
        assert!(check(&w).overcapacity.is_empty());

        let mut w = healthy();
        w.nodes[0].capacity = 10.0;
        w.jobs[0].instances.push(inst("n1", InstanceState::Ended));
        assert!(check(&w).overcapacity.is_empty());
    }

    #[test]
    fn an_instance_holds_what_its_job_required_when_it_was_first_seen() {
        // A stopping instance of the old Bundle (10 capacity) and a new one after the Bundle
        // was created again asking 60, on a node of 75: not over, each holds its own.
        let mut w = healthy();
        w.nodes[0].capacity = 75.0;
        w.jobs[0].instances[0].state = InstanceState::Stopping;
        let mut memo = Reservations::default();
        memo.apply(&mut w.jobs);
        w.jobs[0].required_capacity = 60.0;
        w.jobs[0].instances.push(InstanceFact {
            started_at_ms: 5,
            ..inst("n1", InstanceState::Starting)
        });
        memo.apply(&mut w.jobs);
        assert_eq!(w.jobs[0].instances[0].reserved, Some((10.0, 1)));
        assert_eq!(w.jobs[0].instances[1].reserved, Some((60.0, 1)));
        assert!(check_manager(&w).overcapacity.is_empty());
        // Without the memo both would be charged 60.
        for i in &mut w.jobs[0].instances {
            i.reserved = None;
        }
        assert_eq!(check_manager(&w).overcapacity.len(), 1);
        // A gone instance is forgotten.
        w.jobs[0].instances.truncate(1);
        memo.apply(&mut w.jobs);
        assert_eq!(memo.0.len(), 2);
    }

    #[test]
    fn a_job_not_running_on_a_started_node_is_lost_unless_broken_or_dropped() {
        let mut w = healthy();
        w.nodes[1].started = false;
        w.jobs[0].instances[0].state = InstanceState::Ended;
        let v = check(&w);
        assert_eq!(v.lost.len(), 2, "{}", v.details());

        let mut broken = w.clone();
        broken.bundles[0].broken = true;
        assert!(check(&broken).lost.is_empty());

        let mut dropped = w.clone();
        dropped.bundles[0].dropped.insert((0, "enc".into()));
        dropped.bundles[0].dropped.insert((1, "enc".into()));
        assert!(check(&dropped).lost.is_empty());

        let mut invalid = w.clone();
        invalid.bundles[0].invalid = true;
        assert!(check(&invalid).lost.is_empty());

        let mut deleting = w;
        deleting.bundles[0].deleting = true;
        assert!(check(&deleting).lost.is_empty());
    }

    #[test]
    fn a_bundle_with_no_job_in_manager_is_lost() {
        let mut w = healthy();
        w.bundles.push(bundle("ns.new", 1, &["enc", "pkg"]));
        let v = check(&w);
        assert_eq!(v.lost.len(), 2, "{}", v.details());
        assert!(v.lost.iter().all(|l| l.contains("no job in Manager")));
    }

    #[test]
    fn a_registered_bundle_without_its_object_is_an_orphan_but_foreign_ids_are_not() {
        let mut w = healthy();
        w.manager_bundles.push("ns.gone".into());
        w.manager_bundles.push("someone-elses".into());
        let v = check(&w);
        assert_eq!(
            v.orphans.iter().collect::<Vec<_>>(),
            ["ns.gone: registered, no Bundle object"]
        );
        // Only the Manager invariants are checked while faults run.
        assert!(check_manager(&w).orphans.is_empty());
    }

    #[test]
    fn bundle_facts_read_phase_deletion_and_dropped_jobs() {
        let list = serde_json::json!({"items": [{
            "metadata": {"namespace": "ns", "name": "b", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"replicas": 2, "jobs": [{"jobName": "enc"}, {"jobName": "pkg"}]},
            "status": {"phase": "Broken",
                "conditions": [{"type": "Stalled", "status": "True", "reason": "InvalidSpec"}],
                "replicas": [{"replica": 1, "jobs": [
                {"jobName": "enc", "state": "dropped"}, {"jobName": "pkg", "state": "running"}]}]}
        }]});
        let facts = bundle_facts(&list);
        assert_eq!(
            facts,
            vec![BundleFact {
                id: "ns.b".into(),
                deleting: true,
                broken: true,
                invalid: true,
                replicas: 2,
                job_names: vec!["enc".into(), "pkg".into()],
                dropped: [(1, "enc".to_owned())].into_iter().collect(),
                rules: HardRules {
                    inter_different_node: true,
                    ..HardRules::default()
                },
                status: [
                    (
                        (1, "enc".to_owned()),
                        StatusJob {
                            state: "dropped".into(),
                            node_id: None
                        }
                    ),
                    (
                        (1, "pkg".to_owned()),
                        StatusJob {
                            state: "running".into(),
                            node_id: None
                        }
                    ),
                ]
                .into_iter()
                .collect(),
            }]
        );
    }

    #[test]
    fn hard_rules_read_the_spec_with_the_api_defaults() {
        let spec = serde_json::json!({
            "interReplicaPlacement": {"node": {"relation": "same", "enforcement": "soft"},
                                      "zone": {"relation": "different", "enforcement": "hard"}},
            "intraReplicaPlacement": {"node": {"relation": "different", "enforcement": "hard"},
                                      "zone": {"relation": "same", "enforcement": "soft"}},
            "jobs": [{"jobName": "a", "coLocateWith": ["b"]}, {"jobName": "c", "separateFrom": ["a"]}]
        });
        assert_eq!(
            hard_rules(&spec),
            HardRules {
                inter_different_zone: true,
                intra_different_node: true,
                co_locate: vec![("a".into(), "b".into())],
                separate: vec![("c".into(), "a".into())],
                ..HardRules::default()
            }
        );
        // Absent: different nodes between replicas, hard (the TypeScript library's default).
        assert!(hard_rules(&serde_json::json!({})).inter_different_node);
    }

    #[test]
    fn replicas_sharing_a_node_break_the_default_rule_and_zone_rules_are_checked_too() {
        let mut w = healthy();
        w.jobs[1].instances[0].node_id = "n1".into();
        w.bundles[0]
            .status
            .insert((1, "enc".into()), says("running", "n1"));
        let v = check(&w);
        assert_eq!(v.rules.len(), 1, "{}", v.details());
        assert!(v.rules.iter().all(|r| r.contains("different nodes")));
        assert!(v.disagreements.is_empty(), "{}", v.details());

        // Different nodes in one zone: fine by default, broken by a hard different-zone rule.
        let mut w = healthy();
        assert!(check(&w).rules.is_empty());
        w.bundles[0].rules.inter_different_zone = true;
        assert_eq!(check(&w).rules.len(), 1);
    }

    #[test]
    fn intra_replica_rules_treat_a_co_located_group_as_one() {
        let mut b = bundle("ns.g", 1, &["a", "b", "c"]);
        b.rules.intra_different_node = true;
        b.rules.co_locate = vec![("a".into(), "b".into())];
        b.rules.separate = vec![("c".into(), "a".into())];
        for (j, n) in [("a", "n1"), ("b", "n1"), ("c", "n2")] {
            b.status.insert((0, j.into()), says("running", n));
        }
        let mut w = World {
            nodes: vec![node("n1", 100.0, 16), node("n2", 100.0, 16)],
            jobs: vec![
                job("ns.g", 0, "a", vec![inst("n1", InstanceState::Running)]),
                job("ns.g", 0, "b", vec![inst("n1", InstanceState::Running)]),
                job("ns.g", 0, "c", vec![inst("n2", InstanceState::Running)]),
            ],
            manager_bundles: vec!["ns.g".into()],
            bundles: vec![b],
            spare_targets: None,
        };
        let v = check(&w);
        assert!(v.is_clean(), "{}", v.details());

        // c joins a on n1: separateFrom and intra different-node both break.
        w.jobs[2].instances[0].node_id = "n1".into();
        w.bundles[0]
            .status
            .insert((0, "c".into()), says("running", "n1"));
        let v = check(&w);
        assert_eq!(v.rules.len(), 3, "{}", v.details());
        // b leaves a: coLocateWith breaks.
        w.jobs[1].instances[0].node_id = "n2".into();
        w.bundles[0]
            .status
            .insert((0, "b".into()), says("running", "n2"));
        assert!(check(&w).rules.iter().any(|r| r.contains("co-located")));
    }

    #[test]
    fn a_status_that_says_otherwise_than_manager_is_a_disagreement() {
        let mut w = healthy();
        w.bundles[0]
            .status
            .insert((0, "enc".into()), says("starting", "n1"));
        w.bundles[0]
            .status
            .insert((1, "enc".into()), says("running", "n9"));
        let v = check(&w);
        assert_eq!(v.disagreements.len(), 2, "{}", v.details());
        assert!(
            v.disagreements
                .iter()
                .any(|d| d == "ns.b/1/enc: Manager runs it on n2, the status says running on n9")
        );

        // Running by the status, nowhere in Manager: lost, and the status disagrees.
        let mut w = healthy();
        w.jobs[0].instances[0].state = InstanceState::Ended;
        let v = check(&w);
        assert_eq!(
            (v.lost.len(), v.disagreements.len()),
            (1, 1),
            "{}",
            v.details()
        );
        // A status catching up is not a violation of the invariants a fault may not break.
        assert!(v.nothing_but_lost() || !v.lost.is_empty());
        w.bundles[0]
            .status
            .insert((0, "enc".into()), says("failed", "n1"));
        assert!(check(&w).disagreements.is_empty());
        // A Broken bundle's status is its own: not compared.
        w.bundles[0].broken = true;
        w.bundles[0].status.clear();
        assert!(check(&w).disagreements.is_empty());
    }

    #[test]
    fn unasked_jobs_and_nodes_whose_owner_is_gone_are_orphans() {
        let mut w = healthy();
        // A third replica the spec no longer asks for, still running.
        w.nodes.push(node("n3", 100.0, 16));
        w.jobs.push(job(
            "ns.b",
            2,
            "enc",
            vec![inst("n3", InstanceState::Running)],
        ));
        // An idle node provisioned for a deleted bundle, one for a deleted spare target, one for
        // a live target, and one nobody tagged.
        let tagged = |id: &str, owner: Option<NodeOwner>| NodeFact {
            owner,
            ..node(id, 100.0, 16)
        };
        let gone = BundleId::parse("ns.gone").expect("an id");
        w.nodes
            .push(tagged("e1", Some(NodeOwner::BundleReplica(gone))));
        w.nodes
            .push(tagged("s1", Some(NodeOwner::SpareTarget("old".into()))));
        w.nodes
            .push(tagged("s2", Some(NodeOwner::SpareTarget("kept".into()))));
        w.nodes.push(tagged("x1", None));
        w.spare_targets = Some(["kept".to_owned()].into_iter().collect());
        let v = check(&w);
        assert_eq!(
            v.orphans.iter().map(String::as_str).collect::<Vec<_>>(),
            [
                "node e1: created for Some(BundleReplica(BundleId(\"ns.gone\"))), which is gone, and runs nothing",
                "node s1: created for Some(SpareTarget(\"old\")), which is gone, and runs nothing",
                "ns.b/2/enc: runs, no Bundle spec asks for it",
            ],
            "{}",
            v.details()
        );
        // Without the spare targets read, spare nodes are not judged.
        w.spare_targets = None;
        assert_eq!(check(&w).orphans.len(), 2);
        // A node that runs something is never an orphan.
        w.jobs.push(job(
            "ns.b",
            1,
            "enc",
            vec![inst("e1", InstanceState::Stopping)],
        ));
        assert_eq!(check(&w).orphans.len(), 1);
    }

    #[test]
    fn violations_merge_and_print_their_counts() {
        let mut a = Violations::default();
        a.lost.insert("x".into());
        let mut b = Violations::default();
        b.lost.insert("x".into());
        b.orphans.insert("y".into());
        b.placed_after_cordon.insert("z".into());
        a.merge(&b);
        assert!(!a.is_clean());
        assert_eq!(
            a.line("s", Duration::ZERO),
            "reliability scenario=s ok=false duplicates=0 lost=1 overcapacity=0 orphans=1 settle_s=0.0 rules=0 disagreements=0 cordon=1"
        );
        assert!(a.details().contains("lost: x"));
        assert!(a.details().contains("cordon: z"));
        assert!(!a.nothing_but_lost());
    }

    fn start(job: &str, node: &str, at_ms: i64) -> StartFact {
        StartFact {
            job_id: job.into(),
            node_id: node.into(),
            at_ms,
            migration_target: false,
        }
    }

    const SLACK: Duration = Duration::from_secs(2);

    #[test]
    fn a_start_before_the_cordon_or_within_the_slack_is_fine_and_one_after_is_a_violation() {
        let mut c = CordonFacts::default();
        c.note("n1", true, 10_000);
        let starts = [
            start("ns.b/0/enc", "n1", 9_000),
            start("ns.b/0/pkg", "n1", 11_500),
            start("ns.b/1/enc", "n1", 12_001),
            // Another node is not cordoned.
            start("ns.c/0/enc", "n2", 50_000),
        ];
        let r = check_cordons(&c, &starts, SLACK);
        assert_eq!(
            r.violations.iter().collect::<Vec<_>>(),
            ["ns.b/1/enc: started on n1 2.0s after its cordon"]
        );
        assert_eq!(r.in_flight_ms, [1_500]);
        // At exactly the slack: still in flight.
        let r = check_cordons(&c, &[start("ns.b/0/enc", "n1", 12_000)], SLACK);
        assert!(r.violations.is_empty());
    }

    #[test]
    fn a_start_after_the_uncordon_is_fine_and_a_second_cordon_counts_again() {
        let mut c = CordonFacts::default();
        c.note("n1", true, 10_000);
        c.note("n1", false, 20_000);
        c.note("n1", true, 30_000);
        let starts = [
            start("a", "n1", 15_000),
            start("b", "n1", 20_000),
            start("c", "n1", 25_000),
            start("d", "n1", 40_000),
        ];
        let r = check_cordons(&c, &starts, SLACK);
        assert_eq!(r.violations.len(), 2, "{:?}", r.violations);
        assert!(r.violations.iter().any(|v| v.starts_with("a:")));
        assert!(r.violations.iter().any(|v| v.starts_with("d:")));
    }

    #[test]
    fn cordon_notes_keep_the_earliest_time_and_ignore_an_uncordon_of_an_uncordoned_node() {
        let mut c = CordonFacts::default();
        c.note("n1", false, 1_000);
        assert!(c.is_empty());
        // The watch saw it at 5 s, the test's kubectl returned at 5.2 s.
        c.note("n1", true, 5_000);
        c.note("n1", true, 5_200);
        assert_eq!(
            c.0["n1"],
            [CordonSpan {
                from_ms: 5_000,
                until_ms: None
            }]
        );
        c.note("n1", false, 9_000);
        c.note("n1", false, 9_500);
        assert_eq!(c.0["n1"][0].until_ms, Some(9_000));
    }

    #[test]
    fn a_drain_counts_as_a_cordon_and_a_migration_target_is_a_start() {
        let object = serde_json::json!({
            "spec": {"drain": {"mode": "migrate"}},
            "status": {"nodeId": "aws-east-7"}
        });
        assert_eq!(
            node_cordon("aws-east-7", &object),
            ("aws-east-7".into(), true)
        );
        let plain = serde_json::json!({"spec": {"cordoned": false}, "status": {"nodeId": ""}});
        assert_eq!(node_cordon("x", &plain), ("x".into(), false));
        let cordoned = serde_json::json!({"spec": {"cordoned": true}});
        assert!(node_cordon("x", &cordoned).1);

        let mut c = CordonFacts::default();
        c.note("aws-east-7", true, 0);
        let target = StartFact {
            migration_target: true,
            ..start("ns.b/0/enc", "aws-east-7", 3_000)
        };
        assert_eq!(
            check_cordons(&c, &[target], SLACK)
                .violations
                .iter()
                .collect::<Vec<_>>(),
            ["ns.b/0/enc: migration target started on aws-east-7 3.0s after its cordon"]
        );
    }
}
