//! The mirror: Manager's state as an in-memory store, and the pure rules that
//! update it from `Watch` messages ([`MirrorState::apply_event`],
//! [`MirrorState::replace`]) producing [`MirrorChange`]s.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};

use manager_proto::{
    Bundle, Event, Job, JobRejected, JobStopping, Migration, Node, NodeInventory, SnapshotReason,
    event,
};
use tokio::sync::watch;

/// One thing that changed in the mirror. Controllers turn these into
/// reconcile triggers. Upserts carry the object's new version.
#[derive(Debug, Clone, PartialEq)]
pub enum MirrorChange {
    /// A node appeared or changed (state, tags, inventory).
    NodeUpserted(Node),
    /// A node vanished (only after a resync: Manager forgot it).
    NodeRemoved {
        /// The node.
        node_id: String,
    },
    /// A node advertised its inventory.
    InventoryUpdated(NodeInventory),
    /// A job appeared or changed.
    JobUpserted(Job),
    /// A job no longer exists.
    JobRemoved {
        /// The job.
        job_id: String,
    },
    /// A worker refused a start (not stored: an event, not state).
    JobRejected(JobRejected),
    /// A job instance is being stopped (not stored).
    JobStopping(JobStopping),
    /// A job's runtime configuration was replaced.
    ConfigUpdated {
        /// The job.
        job_id: String,
        /// The new configuration (UTF-8 JSON).
        config: Vec<u8>,
    },
    /// A bundle appeared or changed.
    BundleUpserted(Bundle),
    /// A bundle no longer exists.
    BundleRemoved {
        /// The bundle.
        bundle_id: String,
    },
    /// A migration changed phase.
    MigrationUpdated(Migration),
    /// A migration vanished (only after a resync).
    MigrationRemoved {
        /// The migration.
        migration_id: String,
    },
    /// The mirror was replaced from a snapshot; the changes just before this
    /// one are the differences to what it held. Transient events
    /// (rejections, stopping) that happened while disconnected are not
    /// replayed, only their effect on state.
    Resynced {
        /// The snapshot's revision.
        revision: u64,
        /// Why Manager sent a snapshot.
        reason: SnapshotReason,
    },
}

/// The mirrored objects at one revision.
#[derive(Debug, Clone, Default)]
pub struct MirrorState {
    /// Identity of the Manager world this state came from.
    pub epoch: String,
    /// Every event up to this revision has been applied.
    pub revision: u64,
    /// Nodes by id (terminated ones included; inventory in `Node.inventory`).
    pub nodes: BTreeMap<String, Node>,
    /// Runtime jobs by id (`bundle/replica/job`). Add and remove them with
    /// [`MirrorState::insert_job`] / [`MirrorState::remove_job`], which keep the indexes.
    pub jobs: BTreeMap<String, Job>,
    /// Bundles by id.
    pub bundles: BTreeMap<String, Bundle>,
    /// Migrations by id.
    pub migrations: BTreeMap<String, Migration>,
    /// Job ids by bundle id; kept by every change that goes through this type's methods.
    jobs_by_bundle: Index,
    /// Job ids by the nodes their instances (or their current node) are on.
    jobs_by_node: Index,
    /// What the holding instances use on each node, kept with `jobs_by_node`: a start's answer
    /// re-reads its node's usage, and on a packed node summing its jobs each time costs more
    /// than the rest of the answer.
    usage_by_node: HashMap<String, NodeUsage>,
    /// Counts job changes; [`MirrorState::node_jobs_version`] reads it.
    job_changes: u64,
    /// The value of `job_changes` when a job on each node last changed.
    node_jobs_version: HashMap<String, u64>,
}

/// Two mirrors are equal when they hold the same objects at the same revision; the indexes
/// follow from those, and the change counters only say how each mirror got there.
impl PartialEq for MirrorState {
    fn eq(&self, other: &Self) -> bool {
        self.epoch == other.epoch
            && self.revision == other.revision
            && self.nodes == other.nodes
            && self.jobs == other.jobs
            && self.bundles == other.bundles
            && self.migrations == other.migrations
    }
}

/// Capacity and cores held on one node. Capacity is summed in millionths of a unit, so adding
/// and later removing a job leaves exactly what was there (summed `f64`s would drift, and a
/// node with exactly enough room could read as a hair short).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct NodeUsage {
    capacity_micros: i128,
    cores: i64,
}

impl NodeUsage {
    fn as_pair(self) -> (f64, i32) {
        (
            self.capacity_micros as f64 / 1e6,
            i32::try_from(self.cores).unwrap_or(if self.cores < 0 { i32::MIN } else { i32::MAX }),
        )
    }
}

/// A job's requirements in [`NodeUsage`] units, and the nodes each of its holding instances
/// is on (an instance counts once per appearance, as Manager's worker reserves it).
fn holdings(job: &Job) -> impl Iterator<Item = (&str, i128, i64)> + '_ {
    let (capacity, cores) = job.requirements.as_ref().map_or((0, 0), |r| {
        // `as` saturates (and maps NaN to 0): a peer's absurd value cannot overflow the sum.
        ((r.required_capacity * 1e6).round() as i64, r.required_cores)
    });
    job.instances
        .iter()
        .filter(move |_| job.requirements.is_some())
        .filter(|i| i.holds_capacity() && !i.node_id.is_empty())
        .map(move |i| (i.node_id.as_str(), i128::from(capacity), i64::from(cores)))
}

fn mark_nodes(versions: &mut HashMap<String, u64>, version: u64, job: &Job) {
    for node in nodes_of(job) {
        match versions.get_mut(node) {
            Some(v) => *v = version,
            None => {
                versions.insert(node.to_owned(), version);
            }
        }
    }
}

fn add_usage(usage: &mut HashMap<String, NodeUsage>, job: &Job) {
    for (node, capacity, cores) in holdings(job) {
        let u = usage.entry(node.to_owned()).or_default();
        u.capacity_micros += capacity;
        u.cores += cores;
    }
}

fn remove_usage(usage: &mut HashMap<String, NodeUsage>, job: &Job) {
    for (node, capacity, cores) in holdings(job) {
        if let Some(u) = usage.get_mut(node) {
            u.capacity_micros -= capacity;
            u.cores -= cores;
            if *u == NodeUsage::default() {
                usage.remove(node);
            }
        }
    }
}

/// A full copy of Manager's objects, as assembled from snapshot chunks.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SnapshotData {
    /// World identity.
    pub epoch: String,
    /// Revision of the copy.
    pub revision: u64,
    /// Why it was sent.
    pub reason: SnapshotReason,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Jobs.
    pub jobs: Vec<Job>,
    /// Bundles.
    pub bundles: Vec<Bundle>,
    /// Migrations.
    pub migrations: Vec<Migration>,
}

fn diff<T: Clone + PartialEq>(
    old: &BTreeMap<String, T>,
    new: &BTreeMap<String, T>,
    upsert: impl Fn(T) -> MirrorChange,
    remove: impl Fn(String) -> MirrorChange,
    out: &mut Vec<MirrorChange>,
) {
    for id in old.keys().filter(|k| !new.contains_key(*k)) {
        out.push(remove(id.clone()));
    }
    for (id, v) in new {
        if old.get(id) != Some(v) {
            out.push(upsert(v.clone()));
        }
    }
}

type Index = HashMap<String, BTreeSet<String>>;

/// The nodes a job is on: its instances' and its current node.
fn nodes_of(job: &Job) -> BTreeSet<&str> {
    job.instances
        .iter()
        .map(|i| i.node_id.as_str())
        .chain(std::iter::once(job.node_id.as_str()))
        .filter(|n| !n.is_empty())
        .collect()
}

fn index(by_bundle: &mut Index, by_node: &mut Index, job: &Job) {
    by_bundle
        .entry(job.bundle_id.clone())
        .or_default()
        .insert(job.job_id.clone());
    for node in nodes_of(job) {
        by_node
            .entry(node.to_owned())
            .or_default()
            .insert(job.job_id.clone());
    }
}

fn unindex(by_bundle: &mut Index, by_node: &mut Index, job: &Job) {
    let drop_from = |map: &mut Index, key: &str| {
        if let Some(set) = map.get_mut(key) {
            set.remove(&job.job_id);
            if set.is_empty() {
                map.remove(key);
            }
        }
    };
    drop_from(by_bundle, &job.bundle_id);
    for node in nodes_of(job) {
        drop_from(by_node, node);
    }
}

impl MirrorState {
    /// Applies one event. Events at or below the current revision are
    /// ignored, so a replayed event can never be applied twice. Takes the
    /// event by value so each object is copied once (map + change).
    pub fn apply_event(&mut self, ev: Event, out: &mut Vec<MirrorChange>) {
        if ev.revision <= self.revision {
            return;
        }
        self.revision = ev.revision;
        let Some(kind) = ev.kind else {
            return;
        };
        match kind {
            event::Kind::NodeStarting(e) => self.upsert_node(e.node, out),
            event::Kind::NodeStarted(e) => self.upsert_node(e.node, out),
            event::Kind::NodeStopped(e) => self.upsert_node(e.node, out),
            event::Kind::NodeTerminated(e) => self.upsert_node(e.node, out),
            event::Kind::NodePoweringOff(e) => self.upsert_node(e.node, out),
            event::Kind::NodePoweredOff(e) => self.upsert_node(e.node, out),
            // The node carries the notice (reclaim_at_ms, reclaim_reason): an upsert.
            event::Kind::ReclaimNotice(e) => self.upsert_node(e.node, out),
            event::Kind::Inventory(e) => {
                if let Some(inv) = e.inventory {
                    if let Some(node) = self.nodes.get_mut(&inv.node_id) {
                        node.inventory = Some(inv.clone());
                    }
                    out.push(MirrorChange::InventoryUpdated(inv));
                }
            }
            event::Kind::JobUpdated(e) => {
                if let Some(job) = e.job {
                    self.insert_job(job.clone());
                    out.push(MirrorChange::JobUpserted(job));
                }
            }
            event::Kind::JobRejected(e) => out.push(MirrorChange::JobRejected(e)),
            event::Kind::JobStopping(e) => out.push(MirrorChange::JobStopping(e)),
            event::Kind::JobRemoved(e) => {
                self.remove_job(&e.job_id);
                out.push(MirrorChange::JobRemoved { job_id: e.job_id });
            }
            event::Kind::ConfigUpdated(e) => {
                if let Some(job) = self.jobs.get_mut(&e.job_id) {
                    job.config.clone_from(&e.config);
                }
                out.push(MirrorChange::ConfigUpdated {
                    job_id: e.job_id,
                    config: e.config,
                });
            }
            event::Kind::BundleUpdated(e) => {
                if let Some(b) = e.bundle {
                    self.bundles.insert(b.bundle_id.clone(), b.clone());
                    out.push(MirrorChange::BundleUpserted(b));
                }
            }
            event::Kind::BundleDeleted(e) => {
                self.bundles.remove(&e.bundle_id);
                out.push(MirrorChange::BundleRemoved {
                    bundle_id: e.bundle_id,
                });
            }
            event::Kind::MigrationPhase(e) => {
                if let Some(m) = e.migration {
                    self.migrations.insert(m.migration_id.clone(), m.clone());
                    out.push(MirrorChange::MigrationUpdated(m));
                }
            }
        }
    }

    /// Adds or replaces a job, keeping the indexes. (Insert jobs through this, not into
    /// `jobs` directly, or the by-bundle and by-node queries miss them.)
    pub fn insert_job(&mut self, job: Job) {
        self.job_changes += 1;
        if let Some(old) = self.jobs.get(&job.job_id) {
            unindex(&mut self.jobs_by_bundle, &mut self.jobs_by_node, old);
            remove_usage(&mut self.usage_by_node, old);
            mark_nodes(&mut self.node_jobs_version, self.job_changes, old);
        }
        index(&mut self.jobs_by_bundle, &mut self.jobs_by_node, &job);
        add_usage(&mut self.usage_by_node, &job);
        mark_nodes(&mut self.node_jobs_version, self.job_changes, &job);
        self.jobs.insert(job.job_id.clone(), job);
    }

    /// Removes a job, keeping the indexes.
    pub fn remove_job(&mut self, job_id: &str) -> Option<Job> {
        let old = self.jobs.remove(job_id)?;
        self.job_changes += 1;
        unindex(&mut self.jobs_by_bundle, &mut self.jobs_by_node, &old);
        remove_usage(&mut self.usage_by_node, &old);
        mark_nodes(&mut self.node_jobs_version, self.job_changes, &old);
        Some(old)
    }

    fn rebuild_indexes(&mut self) {
        self.jobs_by_bundle.clear();
        self.jobs_by_node.clear();
        self.usage_by_node.clear();
        self.node_jobs_version.clear();
        self.job_changes += 1;
        for job in self.jobs.values() {
            index(&mut self.jobs_by_bundle, &mut self.jobs_by_node, job);
            add_usage(&mut self.usage_by_node, job);
            mark_nodes(&mut self.node_jobs_version, self.job_changes, job);
        }
    }

    /// The jobs Manager expanded bundle `bundle_id` into, by job id.
    pub fn jobs_of_bundle<'a>(&'a self, bundle_id: &str) -> impl Iterator<Item = &'a Job> + 'a {
        self.jobs_by_bundle
            .get(bundle_id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.jobs.get(id))
    }

    /// The job of `bundle_id` for replica `replica` and job name `job_name`, with the id
    /// Manager gave it.
    pub fn job_of(&self, bundle_id: &str, replica: u32, job_name: &str) -> Option<&Job> {
        self.jobs_of_bundle(bundle_id)
            .find(|j| j.replica == replica && j.job_name == job_name)
    }

    /// Jobs with an instance (in any state) on `node_id`, or whose current node it is.
    pub fn jobs_on<'a>(&'a self, node_id: &str) -> impl Iterator<Item = &'a Job> + 'a {
        self.jobs_by_node
            .get(node_id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.jobs.get(id))
    }

    /// The zone of a node ([`Node::zone`]), if Manager knows the node.
    pub fn zone_of(&self, node_id: &str) -> Option<&str> {
        self.nodes.get(node_id).map(Node::zone)
    }

    /// Nodes Manager will reclaim (a notice with a deadline) that are not gone yet, by id.
    pub fn noticed_nodes(&self) -> impl Iterator<Item = &Node> + '_ {
        self.nodes
            .values()
            .filter(|n| n.reclaim_at_ms > 0 && n.state() != manager_proto::NodeState::Terminated)
    }

    fn upsert_node(&mut self, node: Option<Node>, out: &mut Vec<MirrorChange>) {
        if let Some(node) = node {
            self.nodes.insert(node.node_id.clone(), node.clone());
            out.push(MirrorChange::NodeUpserted(node));
        }
    }

    /// Replaces everything with a snapshot, pushing the differences (then
    /// [`MirrorChange::Resynced`]) to `out`.
    pub fn replace(&mut self, snap: SnapshotData, out: &mut Vec<MirrorChange>) {
        let mut new = MirrorState {
            epoch: snap.epoch,
            revision: snap.revision,
            nodes: snap
                .nodes
                .into_iter()
                .map(|n| (n.node_id.clone(), n))
                .collect(),
            jobs: snap
                .jobs
                .into_iter()
                .map(|j| (j.job_id.clone(), j))
                .collect(),
            bundles: snap
                .bundles
                .into_iter()
                .map(|b| (b.bundle_id.clone(), b))
                .collect(),
            migrations: snap
                .migrations
                .into_iter()
                .map(|m| (m.migration_id.clone(), m))
                .collect(),
            // Versions stay increasing across the swap, so none read before it repeats.
            job_changes: self.job_changes,
            ..MirrorState::default()
        };
        new.rebuild_indexes();
        diff(
            &self.nodes,
            &new.nodes,
            MirrorChange::NodeUpserted,
            |node_id| MirrorChange::NodeRemoved { node_id },
            out,
        );
        diff(
            &self.bundles,
            &new.bundles,
            MirrorChange::BundleUpserted,
            |bundle_id| MirrorChange::BundleRemoved { bundle_id },
            out,
        );
        diff(
            &self.jobs,
            &new.jobs,
            MirrorChange::JobUpserted,
            |job_id| MirrorChange::JobRemoved { job_id },
            out,
        );
        diff(
            &self.migrations,
            &new.migrations,
            MirrorChange::MigrationUpdated,
            |migration_id| MirrorChange::MigrationRemoved { migration_id },
            out,
        );
        *self = new;
        out.push(MirrorChange::Resynced {
            revision: snap.revision,
            reason: snap.reason,
        });
    }

    /// Capacity and cores held on a node by job instances that are
    /// STARTING, RUNNING or STOPPING, from the jobs' current requirements
    /// (the worker keeps what an instance reserved when it started, so the
    /// two differ only after a bundle changed a running job's requirements).
    /// Kept as jobs change, so reading it costs one lookup.
    pub fn node_usage(&self, node_id: &str) -> (f64, i32) {
        self.usage_by_node
            .get(node_id)
            .map_or((0.0, 0), |u| u.as_pair())
    }

    /// Changes whenever a job on `node_id` ([`MirrorState::jobs_on`]) is added, changed or
    /// removed, and only then: a reader that kept what it derived from the node's jobs can
    /// tell whether to derive it again. Never repeats a value for a node within one process,
    /// across snapshots too; 0 for a node without jobs since the last snapshot.
    pub fn node_jobs_version(&self, node_id: &str) -> u64 {
        self.node_jobs_version.get(node_id).copied().unwrap_or(0)
    }

    /// [`MirrorState::node_usage`] counting only the jobs `keep` lets through (what a node
    /// would hold were the others stopped). Reads the node's jobs (an index), not every job.
    pub fn node_usage_where(&self, node_id: &str, keep: impl Fn(&Job) -> bool) -> (f64, i32) {
        let mut usage = NodeUsage::default();
        for job in self.jobs_on(node_id).filter(|j| keep(j)) {
            for (node, capacity, cores) in holdings(job) {
                if node == node_id {
                    usage.capacity_micros += capacity;
                    usage.cores += cores;
                }
            }
        }
        usage.as_pair()
    }
}

/// A cheap, cloneable read handle on the mirror.
#[derive(Debug, Clone)]
pub struct Mirror {
    state: Arc<RwLock<MirrorState>>,
    revision: watch::Sender<u64>,
}

impl Default for Mirror {
    fn default() -> Self {
        Mirror {
            state: Arc::default(),
            revision: watch::Sender::new(0),
        }
    }
}

impl Mirror {
    /// Runs `f` with the state read-locked. Keep `f` short: the stream
    /// waits for it.
    pub fn read<R>(&self, f: impl FnOnce(&MirrorState) -> R) -> R {
        let g = self
            .state
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&g)
    }

    pub(crate) fn write<R>(&self, f: impl FnOnce(&mut MirrorState) -> R) -> R {
        let (r, rev) = {
            let mut g = self
                .state
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let r = f(&mut g);
            (r, g.revision)
        };
        // Waiters are woken after the lock is released.
        self.revision.send_if_modified(|cur| {
            let changed = *cur != rev;
            *cur = rev;
            changed
        });
        r
    }

    /// A clone of the whole state.
    pub fn state(&self) -> MirrorState {
        self.read(Clone::clone)
    }

    /// The last applied revision.
    pub fn revision(&self) -> u64 {
        self.read(|s| s.revision)
    }

    /// Watch the revision advance (e.g. to wait until a write is mirrored).
    pub fn revisions(&self) -> watch::Receiver<u64> {
        self.revision.subscribe()
    }

    /// A node by id.
    pub fn node(&self, id: &str) -> Option<Node> {
        self.read(|s| s.nodes.get(id).cloned())
    }

    /// A job by id.
    pub fn job(&self, id: &str) -> Option<Job> {
        self.read(|s| s.jobs.get(id).cloned())
    }

    /// A bundle by id.
    pub fn bundle(&self, id: &str) -> Option<Bundle> {
        self.read(|s| s.bundles.get(id).cloned())
    }

    /// A migration by id.
    pub fn migration(&self, id: &str) -> Option<Migration> {
        self.read(|s| s.migrations.get(id).cloned())
    }

    /// A node's inventory, once it has advertised one.
    pub fn inventory(&self, node_id: &str) -> Option<NodeInventory> {
        self.read(|s| s.nodes.get(node_id).and_then(|n| n.inventory.clone()))
    }

    /// All nodes, sorted by id.
    pub fn nodes(&self) -> Vec<Node> {
        self.read(|s| s.nodes.values().cloned().collect())
    }

    /// All jobs, sorted by id.
    pub fn jobs(&self) -> Vec<Job> {
        self.read(|s| s.jobs.values().cloned().collect())
    }

    /// All bundles, sorted by id.
    pub fn bundles(&self) -> Vec<Bundle> {
        self.read(|s| s.bundles.values().cloned().collect())
    }

    /// All migrations, sorted by id.
    pub fn migrations(&self) -> Vec<Migration> {
        self.read(|s| s.migrations.values().cloned().collect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use manager_proto::{JobRemoved, JobUpdated, NodeStarted};

    /// A job of bundle `ns.b` needing `capacity` and one core, with `instances` (node, state);
    /// its current node is the last instance's.
    fn job_on(id: &str, capacity: f64, instances: &[(&str, manager_proto::JobState)]) -> Job {
        Job {
            job_id: id.into(),
            bundle_id: "ns.b".into(),
            node_id: instances.last().map_or("", |i| i.0).into(),
            requirements: Some(manager_proto::JobRequirements {
                required_capacity: capacity,
                required_cores: 1,
                ..Default::default()
            }),
            instances: instances
                .iter()
                .map(|(node, state)| manager_proto::JobInstance {
                    node_id: (*node).into(),
                    state: *state as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn node_usage_counts_the_holding_instances_on_the_node_that_the_filter_keeps() {
        let job =
            |id: &str, instances: &[(&str, manager_proto::JobState)]| job_on(id, 2.5, instances);
        use manager_proto::JobState as S;
        let mut m = MirrorState::default();
        m.insert_job(job("a", &[("n1", S::Running)]));
        // Moving: its stopping source on n1 still holds capacity there, its target on n2 too.
        m.insert_job(job("b", &[("n1", S::Stopping), ("n2", S::Starting)]));
        m.insert_job(job("c", &[("n1", S::Failed)]));
        assert_eq!(m.node_usage("n1"), (5.0, 2));
        assert_eq!(m.node_usage("n2"), (2.5, 1));
        assert_eq!(m.node_usage_where("n1", |j| j.job_id != "a"), (2.5, 1));
        assert_eq!(m.node_usage("n3"), (0.0, 0));
    }

    #[test]
    fn node_usage_kept_as_jobs_change_equals_a_fresh_sum() {
        use manager_proto::JobState as S;
        let job = job_on;
        let mut m = MirrorState::default();
        // Tenths do not add up exactly as floats; the kept sum still returns to zero.
        for i in 0..10 {
            m.insert_job(job(&format!("j{i}"), 0.1, &[("n1", S::Starting)]));
        }
        assert_eq!(m.node_usage("n1"), (1.0, 10));
        for i in 0..10 {
            m.insert_job(job(&format!("j{i}"), 0.1, &[("n1", S::Running)]));
        }
        assert_eq!(m.node_usage("n1"), (1.0, 10));
        // A job moves: source stopping on n1, target starting on n2; then the source is gone.
        m.insert_job(job("j0", 0.1, &[("n1", S::Stopping), ("n2", S::Starting)]));
        assert_eq!(m.node_usage("n2"), (0.1, 1));
        m.insert_job(job("j0", 0.1, &[("n1", S::Stopped), ("n2", S::Running)]));
        assert_eq!(m.node_usage("n1"), (0.9, 9));
        for i in 0..10 {
            m.remove_job(&format!("j{i}"));
        }
        assert_eq!(m.node_usage("n1"), (0.0, 0));
        assert_eq!(m.node_usage("n2"), (0.0, 0));
        assert!(m.usage_by_node.is_empty());
        // Absurd values from a peer saturate instead of overflowing.
        m.insert_job(job("huge", f64::MAX, &[("n1", S::Running)]));
        m.insert_job(job("nan", f64::NAN, &[("n1", S::Running)]));
        assert!(m.node_usage("n1").0 > 1e12);
        m.remove_job("huge");
        assert_eq!(m.node_usage("n1"), (0.0, 1));
    }

    proptest::proptest! {
        /// Whatever order jobs are inserted, replaced and removed in, the usage kept per node
        /// is the sum over the node's jobs (the filtered read, which sums afresh).
        #[test]
        fn kept_node_usage_matches_a_fresh_sum(
            ops in proptest::collection::vec((0u8..6, 0usize..3, 0usize..3, 0i32..4, 0u32..40), 1..60)
        ) {
            let nodes = ["n1", "n2", "n3"];
            let mut m = MirrorState::default();
            for (job, node_a, node_b, state, capacity) in ops {
                let id = format!("j{job}");
                if state == 0 {
                    m.remove_job(&id);
                    continue;
                }
                let st = [manager_proto::JobState::Running, manager_proto::JobState::Stopping, manager_proto::JobState::Failed][state as usize - 1];
                m.insert_job(Job {
                    job_id: id.clone(),
                    bundle_id: "ns.b".into(),
                    node_id: nodes[node_b].into(),
                    requirements: Some(manager_proto::JobRequirements {
                        required_capacity: f64::from(capacity) / 10.0,
                        required_cores: 1,
                        ..Default::default()
                    }),
                    instances: vec![
                        manager_proto::JobInstance { node_id: nodes[node_a].into(), state: st as i32, ..Default::default() },
                        manager_proto::JobInstance { node_id: nodes[node_b].into(), state: manager_proto::JobState::Starting as i32, ..Default::default() },
                    ],
                    ..Default::default()
                });
            }
            for n in nodes {
                proptest::prop_assert_eq!(m.node_usage(n), m.node_usage_where(n, |_| true));
            }
        }
    }

    fn ev(revision: u64, kind: event::Kind) -> Event {
        Event {
            revision,
            at_ms: 0,
            kind: Some(kind),
        }
    }

    fn node(id: &str) -> Node {
        Node {
            node_id: id.into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_replayed_event_is_not_applied_twice() {
        let mut m = MirrorState::default();
        let mut out = Vec::new();
        let e = ev(
            1,
            event::Kind::NodeStarted(NodeStarted {
                node: Some(node("n1")),
            }),
        );
        m.apply_event(e.clone(), &mut out);
        m.apply_event(e, &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(m.revision, 1);
    }

    #[test]
    fn job_removed_deletes_the_job() {
        let mut m = MirrorState::default();
        let mut out = Vec::new();
        let job = Job {
            job_id: "b/0/j".into(),
            ..Default::default()
        };
        m.apply_event(
            ev(1, event::Kind::JobUpdated(JobUpdated { job: Some(job) })),
            &mut out,
        );
        m.apply_event(
            ev(
                2,
                event::Kind::JobRemoved(JobRemoved {
                    job_id: "b/0/j".into(),
                }),
            ),
            &mut out,
        );
        assert!(m.jobs.is_empty());
        assert_eq!(
            out.last(),
            Some(&MirrorChange::JobRemoved {
                job_id: "b/0/j".into()
            })
        );
    }

    #[test]
    fn replace_emits_exactly_the_differences() {
        let mut m = MirrorState::default();
        let mut out = Vec::new();
        m.replace(
            SnapshotData {
                revision: 5,
                nodes: vec![node("a"), node("b")],
                ..Default::default()
            },
            &mut out,
        );
        out.clear();
        let mut b2 = node("b");
        b2.zone = "z".into();
        m.replace(
            SnapshotData {
                revision: 9,
                nodes: vec![b2.clone(), node("c")],
                ..Default::default()
            },
            &mut out,
        );
        assert_eq!(
            out,
            vec![
                MirrorChange::NodeRemoved {
                    node_id: "a".into()
                },
                MirrorChange::NodeUpserted(b2),
                MirrorChange::NodeUpserted(node("c")),
                MirrorChange::Resynced {
                    revision: 9,
                    reason: SnapshotReason::Unspecified
                },
            ]
        );
        assert_eq!(m.revision, 9);
    }
}
