//! The reliability suite's invariant checker: what must hold, whatever failed.
//!
//! It reads Manager's state (the sim, through the same Watch mirror the operator uses, plus the
//! sim's per-job history) and the Bundle objects, and counts four kinds of violation:
//!
//! - **duplicates**: more than one live normal instance of one (bundle, replica, job), now or,
//!   from the sim's history, at any moment since the sim started;
//! - **lost**: a job of a Bundle that is not running on a started node once settled, unless the
//!   Bundle is Broken (the restart ceiling, waiting for the retry annotation), its spec is
//!   invalid (Stalled, reason `InvalidSpec`: it never could run) or the job is `dropped` (a
//!   bronze job, recorded in its status);
//! - **overcapacity**: a node whose capacity-holding instances exceed its capacity or cores;
//! - **orphans**: a bundle registered in Manager under one of the operator's ids whose Bundle
//!   object is gone.
//!
//! [`check`] is pure (hand-made [`World`]s in the unit tests); [`observe`] builds a `World` from
//! the running stack, [`Monitor`] samples Manager continuously while faults are injected, and
//! [`settle`] polls until nothing is lost or orphaned.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use manager_client::proto::sim_admin_client::SimAdminClient;
use manager_client::proto::{self as pb, JobHistoryRequest};
use manager_client::{ClientConfig, ManagerClient, MirrorState};

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
}

/// One instance of a Manager job.
#[derive(Clone, Debug, PartialEq)]
pub struct InstanceFact {
    pub node_id: String,
    /// The job's ordinary instance (not a migration target).
    pub normal: bool,
    pub state: InstanceState,
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
}

/// Everything the invariants read at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct World {
    pub nodes: Vec<NodeFact>,
    pub jobs: Vec<JobFact>,
    /// Bundle ids registered in Manager.
    pub manager_bundles: Vec<String>,
    pub bundles: Vec<BundleFact>,
}

/// What is broken, one entry per violation, each saying which object and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Violations {
    pub duplicates: BTreeSet<String>,
    pub lost: BTreeSet<String>,
    pub overcapacity: BTreeSet<String>,
    pub orphans: BTreeSet<String>,
}

impl Violations {
    /// Nothing broken.
    pub fn is_clean(&self) -> bool {
        self.duplicates.is_empty()
            && self.lost.is_empty()
            && self.overcapacity.is_empty()
            && self.orphans.is_empty()
    }

    /// Nothing broken but jobs not running: for a scenario in which some are down on purpose
    /// (the caller says which).
    pub fn nothing_but_lost(&self) -> bool {
        self.duplicates.is_empty() && self.overcapacity.is_empty() && self.orphans.is_empty()
    }

    /// Adds what `other` found (a monitor's samples to the final check).
    pub fn merge(&mut self, other: &Violations) {
        self.duplicates.extend(other.duplicates.iter().cloned());
        self.lost.extend(other.lost.iter().cloned());
        self.overcapacity.extend(other.overcapacity.iter().cloned());
        self.orphans.extend(other.orphans.iter().cloned());
    }

    /// The scenario's one line: `reliability scenario=... ok=... duplicates=... ...`.
    pub fn line(&self, scenario: &str, settle: Duration) -> String {
        format!(
            "reliability scenario={scenario} ok={} duplicates={} lost={} overcapacity={} orphans={} settle_s={:.1}",
            self.is_clean(),
            self.duplicates.len(),
            self.lost.len(),
            self.overcapacity.len(),
            self.orphans.len(),
            settle.as_secs_f64()
        )
    }

    /// Every violation, for a failure message (at most 20 of each kind).
    pub fn details(&self) -> String {
        let mut out = String::new();
        for (kind, set) in [
            ("duplicate", &self.duplicates),
            ("lost", &self.lost),
            ("overcapacity", &self.overcapacity),
            ("orphan", &self.orphans),
        ] {
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
            let u = used.entry(&i.node_id).or_default();
            u.0 += j.required_capacity;
            u.1 += i64::from(j.required_cores);
        }
    }
    for n in world.nodes.iter().filter(|n| !n.terminated) {
        let (capacity, cores) = used.get(n.id.as_str()).copied().unwrap_or_default();
        if capacity > n.capacity + CAPACITY_EPSILON || cores > i64::from(n.cores) {
            v.overcapacity.insert(format!(
                "{}: capacity {capacity}/{}, cores {cores}/{}",
                n.id, n.capacity, n.cores
            ));
        }
    }
    v
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
        // Only ids of the operator's form (`<namespace>.<name>`) can be its orphans.
        let ours = id
            .split_once('.')
            .is_some_and(|(ns, name)| !ns.is_empty() && !name.is_empty());
        if ours && !objects.contains(id.as_str()) {
            v.orphans
                .insert(format!("{id}: registered, no Bundle object"));
        }
    }
    v
}

// ───────────────────────────── reading the stack ─────────────────────────────

fn instance_state(s: pb::JobState) -> InstanceState {
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
            }
        })
        .collect()
}

async fn mirror_of(endpoint: &str) -> Result<MirrorState, SetupError> {
    let client = ManagerClient::connect(ClientConfig::new(endpoint))
        .await
        .map_err(|e| SetupError(format!("connecting to the sim: {e}")))?;
    let ready = client.wait_ready(Duration::from_secs(30)).await;
    let state = client.mirror().state();
    client.close().await;
    ready.map_err(|e| SetupError(format!("the sim's Watch did not sync: {e}")))?;
    Ok(state)
}

/// A client of the sim's fault-injection API (`SimAdmin`) at `endpoint`.
pub async fn sim_admin(
    endpoint: &str,
) -> Result<SimAdminClient<tonic::transport::Channel>, SetupError> {
    let channel = tonic::transport::Endpoint::from_shared(endpoint.to_owned())
        .map_err(|e| SetupError(e.to_string()))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(10))
        .connect()
        .await
        .map_err(|e| SetupError(format!("connecting to the sim's admin API: {e}")))?;
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
    Ok(World {
        nodes,
        jobs,
        manager_bundles,
        bundles: bundle_facts(&list),
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

/// Samples Manager's state in the background ([`check_manager`] on every revision, at most
/// every 100 ms) and keeps every violation it saw.
pub struct Monitor {
    seen: Arc<Mutex<Violations>>,
    samples: Arc<Mutex<u64>>,
    task: tokio::task::JoinHandle<()>,
    client: ManagerClient,
}

impl Monitor {
    /// Starts watching the sim at `endpoint`.
    pub async fn start(endpoint: &str) -> Result<Monitor, SetupError> {
        let client = ManagerClient::connect(ClientConfig::new(endpoint))
            .await
            .map_err(|e| SetupError(format!("connecting to the sim: {e}")))?;
        client
            .wait_ready(Duration::from_secs(30))
            .await
            .map_err(|e| SetupError(format!("the sim's Watch did not sync: {e}")))?;
        let seen = Arc::new(Mutex::new(Violations::default()));
        let samples = Arc::new(Mutex::new(0));
        let task = {
            let (seen, samples) = (seen.clone(), samples.clone());
            let mirror = client.mirror().clone();
            let mut revisions = mirror.revisions();
            tokio::spawn(async move {
                loop {
                    let (nodes, jobs, manager_bundles) = mirror.read(manager_facts);
                    let v = check_manager(&World {
                        nodes,
                        jobs,
                        manager_bundles,
                        bundles: Vec::new(),
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
        Ok(Monitor {
            seen,
            samples,
            task,
            client,
        })
    }

    /// Stops sampling; returns what was seen and how many samples were taken.
    pub async fn stop(self) -> (Violations, u64) {
        self.task.abort();
        self.client.close().await;
        let seen = self.seen.lock().map(|s| s.clone()).unwrap_or_default();
        let samples = self.samples.lock().map(|n| *n).unwrap_or_default();
        (seen, samples)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, capacity: f64, cores: i32) -> NodeFact {
        NodeFact {
            id: id.into(),
            zone: "z".into(),
            started: true,
            terminated: false,
            capacity,
            cores,
        }
    }

    fn inst(node: &str, state: InstanceState) -> InstanceFact {
        InstanceFact {
            node_id: node.into(),
            normal: true,
            state,
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

    fn bundle(id: &str, replicas: u32, jobs: &[&str]) -> BundleFact {
        BundleFact {
            id: id.into(),
            replicas,
            job_names: jobs.iter().map(|j| (*j).to_owned()).collect(),
            ..BundleFact::default()
        }
    }

    /// One bundle of two replicas of `enc`, each running on its own node.
    fn healthy() -> World {
        World {
            nodes: vec![node("n1", 100.0, 16), node("n2", 100.0, 16)],
            jobs: vec![
                job("ns.b", 0, "enc", vec![inst("n1", InstanceState::Running)]),
                job("ns.b", 1, "enc", vec![inst("n2", InstanceState::Running)]),
            ],
            manager_bundles: vec!["ns.b".into()],
            bundles: vec![bundle("ns.b", 2, &["enc"])],
        }
    }

    #[test]
    fn a_healthy_world_is_clean() {
        let v = check(&healthy());
        assert!(v.is_clean(), "{}", v.details());
        assert_eq!(
            v.line("x", Duration::from_millis(1500)),
            "reliability scenario=x ok=true duplicates=0 lost=0 overcapacity=0 orphans=0 settle_s=1.5"
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
            node_id: "n2".into(),
            normal: false,
            state: InstanceState::Running,
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

        let mut w = healthy();
        w.nodes[0].capacity = 10.0;
        w.jobs[0].instances.push(inst("n1", InstanceState::Ended));
        assert!(check(&w).overcapacity.is_empty());
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
            }]
        );
    }

    #[test]
    fn violations_merge_and_print_their_counts() {
        let mut a = Violations::default();
        a.lost.insert("x".into());
        let mut b = Violations::default();
        b.lost.insert("x".into());
        b.orphans.insert("y".into());
        a.merge(&b);
        assert!(!a.is_clean());
        assert_eq!(
            a.line("s", Duration::ZERO),
            "reliability scenario=s ok=false duplicates=0 lost=1 overcapacity=0 orphans=1 settle_s=0.0"
        );
        assert!(a.details().contains("lost: x"));
    }
}
