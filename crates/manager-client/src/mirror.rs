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
#[derive(Debug, Clone, Default, PartialEq)]
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
        if let Some(old) = self.jobs.get(&job.job_id) {
            unindex(&mut self.jobs_by_bundle, &mut self.jobs_by_node, old);
        }
        index(&mut self.jobs_by_bundle, &mut self.jobs_by_node, &job);
        self.jobs.insert(job.job_id.clone(), job);
    }

    /// Removes a job, keeping the indexes.
    pub fn remove_job(&mut self, job_id: &str) -> Option<Job> {
        let old = self.jobs.remove(job_id)?;
        unindex(&mut self.jobs_by_bundle, &mut self.jobs_by_node, &old);
        Some(old)
    }

    fn rebuild_indexes(&mut self) {
        self.jobs_by_bundle.clear();
        self.jobs_by_node.clear();
        for job in self.jobs.values() {
            index(&mut self.jobs_by_bundle, &mut self.jobs_by_node, job);
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
    /// Reads only the node's jobs (an index), not every job.
    pub fn node_usage(&self, node_id: &str) -> (f64, i32) {
        self.node_usage_where(node_id, |_| true)
    }

    /// [`MirrorState::node_usage`] counting only the jobs `keep` lets through (what a node
    /// would hold were the others stopped).
    pub fn node_usage_where(&self, node_id: &str, keep: impl Fn(&Job) -> bool) -> (f64, i32) {
        let mut capacity = 0.0;
        let mut cores = 0i32;
        for job in self.jobs_on(node_id).filter(|j| keep(j)) {
            let Some(req) = &job.requirements else {
                continue;
            };
            for inst in &job.instances {
                if inst.holds_capacity() && inst.node_id == node_id {
                    capacity += req.required_capacity;
                    cores = cores.saturating_add(req.required_cores);
                }
            }
        }
        (capacity, cores)
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

    #[test]
    fn node_usage_counts_the_holding_instances_on_the_node_that_the_filter_keeps() {
        let job = |id: &str, instances: &[(&str, manager_proto::JobState)]| Job {
            job_id: id.into(),
            bundle_id: "ns.b".into(),
            node_id: instances.last().map_or("", |i| i.0).into(),
            requirements: Some(manager_proto::JobRequirements {
                required_capacity: 2.5,
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
        };
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
