//! The operator's placement model: the engine kept in step with the Manager mirror, the
//! PlacementPool objects and the user's cordons.
//!
//! The mirror is the truth about what runs where. Between a placement and the moment the mirror
//! shows the started job, the job's capacity is held as an *in-flight* reservation so the next
//! placement of a wave sees it. A Migration's target is held the same way from the moment it
//! is chosen until the mirror shows the job on it (a stop-then-start target starts only at the
//! cutover, a phase or more after it was chosen). The invariant kept for every node N:
//! `engine.used(N) = mirror usage(N) + Σ in-flight reservations and target holds on N not yet
//! in the mirror`.

use std::collections::{HashMap, HashSet};

use automanager_placement as pl;
use automanager_policy as policy;
use manager_client::MirrorState;

use crate::mapping::{self, NodeOverlay};

/// A job started (or about to be) whose start the mirror does not show yet.
#[derive(Debug, Clone)]
struct Inflight {
    job_id: String,
    node: String,
    /// What the job holds on the node (its requirements when placed: the mirror may not even
    /// know the job yet, right after the bundle was registered).
    capacity: f64,
    cores: u32,
    /// Set once StartJob answered: what the mirror must show for the start to be reflected.
    answered: Option<StartMark>,
}

/// A Migration's target node, chosen but not yet shown running the job by the mirror.
#[derive(Debug, Clone, PartialEq)]
struct TargetHold {
    job_id: String,
    node: String,
    capacity: f64,
    cores: u32,
    /// The migration completed: the job moved there, so any instance of it the mirror shows
    /// there (it may have stopped already) is the move.
    completed: bool,
}

impl TargetHold {
    /// Whether the mirror counts the job on the target, or no longer needs to: an instance of
    /// it (either role) starting or running there (in any state once the move completed), or
    /// the job gone.
    fn reflected_in(&self, mirror: &MirrorState) -> bool {
        mirror.jobs.get(&self.job_id).is_none_or(|j| {
            j.instances.iter().any(|i| {
                i.node_id == self.node
                    && (self.completed
                        || matches!(
                            i.state(),
                            manager_proto::JobState::Starting | manager_proto::JobState::Running
                        ))
            })
        })
    }
}

/// A start as Manager answered it: the time of Manager's record of the job and when the new
/// instance started. The mirror reflects the start once it shows that instance, or any later
/// change of the job. The record's time alone is not enough: a start answered within the
/// millisecond of the job's previous record (its registration, its failure) has the same
/// `updated_at_ms` as the record the mirror still shows from before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartMark {
    /// `updated_at_ms` of Manager's answer.
    pub updated_at_ms: i64,
    /// `started_at_ms` of the instance the answer shows on the node (the record's time when it
    /// shows none).
    pub started_at_ms: i64,
}

impl StartMark {
    /// The mark of Manager's answer `job` to a start on `node`.
    pub fn of(job: &manager_proto::Job, node: &str) -> Self {
        let started_at_ms = job
            .instances
            .iter()
            .filter(|i| i.is_normal() && i.node_id == node)
            .map(|i| i.started_at_ms)
            .max()
            .unwrap_or(job.updated_at_ms);
        StartMark {
            updated_at_ms: job.updated_at_ms,
            started_at_ms,
        }
    }

    /// Whether `job`, as the mirror shows it, reflects the start on `node`.
    pub fn reflected_in(&self, job: &manager_proto::Job, node: &str) -> bool {
        job.updated_at_ms > self.updated_at_ms
            || job.instances.iter().any(|i| {
                i.is_normal() && i.node_id == node && i.started_at_ms >= self.started_at_ms
            })
    }
}

/// The engine plus what it is built from.
pub struct ClusterModel {
    engine: pl::Engine,
    pools: HashMap<String, pl::PoolSpec>,
    overlays: HashMap<String, NodeOverlay>,
    inflight: HashMap<pl::JobKey, Inflight>,
    /// Migration targets held, by Manager's migration id.
    targets: HashMap<String, TargetHold>,
}

impl ClusterModel {
    pub fn new(pending_window_ms: u64) -> Self {
        ClusterModel {
            engine: pl::Engine::empty(pending_window_ms),
            pools: HashMap::new(),
            overlays: HashMap::new(),
            inflight: HashMap::new(),
            targets: HashMap::new(),
        }
    }

    pub fn engine(&self) -> &pl::Engine {
        &self.engine
    }

    pub fn pool(&self, name: &str) -> Option<&pl::PoolSpec> {
        self.pools.get(name)
    }

    pub fn pools(&self) -> Vec<pl::PoolSpec> {
        let mut v: Vec<_> = self.pools.values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Adds or replaces a pool, then re-reads its nodes (a starting node's size may come from
    /// the pool's instance types).
    /// Returns whether the pool changed.
    pub fn upsert_pool(
        &mut self,
        spec: pl::PoolSpec,
        mirror: &MirrorState,
    ) -> Result<bool, pl::InputError> {
        if self.pools.get(&spec.name) == Some(&spec) {
            return Ok(false);
        }
        self.engine.upsert_pool(spec.clone())?;
        let name = spec.name.clone();
        self.pools.insert(name.clone(), spec);
        let ids: Vec<String> = mirror
            .nodes
            .values()
            .filter(|n| n.pool == name)
            .map(|n| n.node_id.clone())
            .collect();
        self.sync_nodes(mirror, ids);
        Ok(true)
    }

    pub fn remove_pool(&mut self, name: &str) {
        self.pools.remove(name);
        self.engine.remove_pool(name);
    }

    /// The user's cordon (or a drain) and the operator's health verdict for a node.
    pub fn set_overlay(&mut self, node_id: &str, overlay: NodeOverlay, mirror: &MirrorState) {
        let changed = self.overlays.get(node_id).copied().unwrap_or_default() != overlay;
        if overlay == NodeOverlay::default() {
            self.overlays.remove(node_id);
        } else {
            self.overlays.insert(node_id.to_owned(), overlay);
        }
        if changed {
            self.sync_nodes(mirror, [node_id.to_owned()]);
        }
    }

    /// Pauses or resumes provisioning into `zone` of `pool` (the zone brake).
    pub fn set_provisioning_paused(&mut self, pool: &str, zone: &str, paused: bool) {
        self.engine.set_provisioning_paused(pool, zone, paused);
    }

    pub fn overlay(&self, node_id: &str) -> NodeOverlay {
        self.overlays.get(node_id).copied().unwrap_or_default()
    }

    /// Re-reads every node from the mirror (after a resync or a lagged change stream).
    pub fn sync_all(&mut self, mirror: &MirrorState) {
        let mut ids: HashSet<String> = mirror.nodes.keys().cloned().collect();
        ids.extend(self.engine.node_views().into_iter().map(|v| v.id));
        self.sync_nodes(mirror, ids);
    }

    /// Re-reads the given nodes from the mirror: in-flight starts the mirror now shows are
    /// released, then each node is upserted with the mirror's usage plus what is still in flight.
    pub fn sync_nodes(&mut self, mirror: &MirrorState, ids: impl IntoIterator<Item = String>) {
        let ids: HashSet<String> = ids.into_iter().collect();
        if ids.is_empty() {
            return;
        }
        let reflected: Vec<pl::JobKey> = self
            .inflight
            .iter()
            .filter(|(_, f)| ids.contains(&f.node))
            .filter(|(_, f)| {
                let Some(mark) = f.answered else {
                    return false;
                };
                mirror
                    .jobs
                    .get(&f.job_id)
                    .is_some_and(|j| mark.reflected_in(j, &f.node))
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in reflected {
            self.inflight.remove(&key);
            self.engine.release_job(&key);
        }
        self.targets
            .retain(|_, t| !ids.contains(&t.node) || !t.reflected_in(mirror));
        for id in ids {
            let Some(node) = mirror.nodes.get(&id) else {
                self.engine.remove_node(&id);
                continue;
            };
            // Through the mirror's node index: a start's answer re-reads one node, and must
            // not cost a pass over every job of the fleet.
            let used = mirror.node_usage(&id);
            match self.node_spec(node, used) {
                Some(spec) => {
                    if let Err(e) = self.engine.upsert_node(spec) {
                        tracing::warn!(node = %id, error = %e, "node not usable for placement");
                        self.engine.remove_node(&id);
                    }
                }
                None => {
                    self.engine.remove_node(&id);
                }
            }
        }
    }

    /// A mirrored node as the engine sees it, with `used` (the mirror's usage) plus what is
    /// still in flight on it.
    fn node_spec(&self, node: &manager_proto::Node, mut used: (f64, i32)) -> Option<pl::NodeSpec> {
        let inflight = (self.inflight.values()).map(|f| (&f.node, f.capacity, f.cores));
        let targets = (self.targets.values()).map(|t| (&t.node, t.capacity, t.cores));
        for (_, capacity, cores) in inflight.chain(targets).filter(|f| *f.0 == node.node_id) {
            used.0 += capacity;
            used.1 = used
                .1
                .saturating_add(i32::try_from(cores).unwrap_or(i32::MAX));
        }
        mapping::node(
            node,
            used,
            self.overlay(&node.node_id),
            self.pools.get(&node.pool),
        )
    }

    /// A copy of the engine in which the given jobs (Manager's ids) hold nothing: what placement
    /// would answer were they stopped. Used to find the nodes a preemption could free.
    pub fn without_jobs(&self, mirror: &MirrorState, jobs: &HashSet<String>) -> pl::Engine {
        let mut engine = self.engine.clone();
        let nodes: HashSet<String> = jobs
            .iter()
            .filter_map(|j| mirror.jobs.get(j))
            .map(|j| j.node_id.clone())
            .filter(|n| !n.is_empty())
            .collect();
        for id in nodes {
            let Some(node) = mirror.nodes.get(&id) else {
                continue;
            };
            let used = mirror.node_usage_where(&id, |j| !jobs.contains(&j.job_id));
            if let Some(spec) = self.node_spec(node, used)
                && let Err(e) = engine.upsert_node(spec)
            {
                tracing::debug!(node = %id, error = %e, "node left out of the preemption dry run");
            }
        }
        engine
    }

    /// A node just asked for: counted as pending capacity at once, before the mirror shows it,
    /// so the next placement of a wave lands on it instead of asking for another.
    pub fn add_provisioned(&mut self, node: &manager_proto::Node) {
        if self.engine.node_view(&node.node_id).is_some() {
            return;
        }
        let spec = mapping::node(
            node,
            (0.0, 0),
            self.overlay(&node.node_id),
            self.pools.get(&node.pool),
        );
        if let Some(spec) = spec
            && let Err(e) = self.engine.upsert_node(spec)
        {
            tracing::warn!(node = %node.node_id, error = %e, "provisioned node not usable for placement");
        }
    }

    /// What the engine answers `request` with, every reservation held (rebalance and Migration
    /// dry runs; a Bundle's placement decides through [`Self::reserving`]).
    pub fn place(&self, request: &pl::PlacementRequest, now_ms: u64) -> pl::Decision {
        self.engine.place(request, now_ms)
    }

    /// The model as the Bundle pass's reservation book ([`policy::bundle_pass::decide`]):
    /// `job_ids` maps the replica's job names to Manager's job ids.
    pub fn reserving<'a>(
        &'a mut self,
        mirror: &'a MirrorState,
        job_ids: &'a HashMap<String, String>,
    ) -> Reserving<'a> {
        Reserving {
            model: self,
            mirror,
            job_ids,
        }
    }

    /// Reserves a placed decision's capacity until the mirror shows the starts.
    /// `job_ids` maps job name to Manager's job id.
    pub fn commit(
        &mut self,
        decision: &pl::Decision,
        job_ids: &HashMap<String, String>,
    ) -> Result<(), pl::CommitError> {
        self.engine.commit(decision)?;
        if let pl::Outcome::Placed { assignments, .. } = &decision.outcome {
            for a in assignments {
                let key = pl::JobKey {
                    bundle_id: decision.bundle_id.clone(),
                    replica_index: decision.replica_index,
                    job_name: a.job_name.clone(),
                };
                let job_id = job_ids.get(&a.job_name).cloned().unwrap_or_default();
                self.inflight.insert(
                    key,
                    Inflight {
                        job_id,
                        node: a.node.clone(),
                        capacity: a.capacity,
                        cores: a.cores,
                        answered: None,
                    },
                );
            }
        }
        Ok(())
    }

    /// StartJob answered (`mark`): the reservation holds until the mirror reflects the start.
    pub fn start_answered(&mut self, key: &pl::JobKey, mark: StartMark, mirror: &MirrorState) {
        let node = match self.inflight.get_mut(key) {
            Some(f) => {
                f.answered = Some(mark);
                f.node.clone()
            }
            None => return,
        };
        self.sync_nodes(mirror, [node]);
    }

    /// The node of a start that Manager accepted but the mirror does not show yet.
    pub fn started_not_mirrored(&self, key: &pl::JobKey) -> Option<&str> {
        self.inflight
            .get(key)
            .filter(|f| f.answered.is_some())
            .map(|f| f.node.as_str())
    }

    /// A start failed or was abandoned: give the capacity back.
    pub fn abandon(&mut self, key: &pl::JobKey, mirror: &MirrorState) {
        if let Some(f) = self.inflight.remove(key) {
            self.engine.release_job(key);
            self.sync_nodes(mirror, [f.node]);
        }
    }

    /// Migration `migration_id` chose `node` as the target of job `job_id`, which holds
    /// `capacity` and `cores` there: held until the mirror shows the job on the node (or
    /// [`Self::end_target`]). A target chosen again replaces the one held before.
    pub fn hold_target(
        &mut self,
        migration_id: &str,
        (job_id, node): (&str, &str),
        (capacity, cores): (f64, u32),
        mirror: &MirrorState,
    ) {
        let hold = TargetHold {
            job_id: job_id.to_owned(),
            node: node.to_owned(),
            capacity,
            cores,
            completed: false,
        };
        if hold.reflected_in(mirror) {
            self.end_target(migration_id, false, mirror);
            return;
        }
        tracing::debug!(
            migration = migration_id,
            job = job_id,
            node,
            capacity,
            cores,
            "migration target held"
        );
        let before = self.targets.insert(migration_id.to_owned(), hold);
        let nodes = before.map(|b| b.node).into_iter().chain([node.to_owned()]);
        self.sync_nodes(mirror, nodes);
    }

    /// Migration `migration_id` ended. Aborted or failed, its target gives back what it held;
    /// `completed`, the job moved there, and the target holds until the mirror shows it there
    /// (the migration's record and the job's may reach the mirror in either order).
    pub fn end_target(&mut self, migration_id: &str, completed: bool, mirror: &MirrorState) {
        let node = if completed {
            let Some(t) = self.targets.get_mut(migration_id) else {
                return;
            };
            t.completed = true;
            t.node.clone()
        } else {
            let Some(t) = self.targets.remove(migration_id) else {
                return;
            };
            t.node
        };
        self.sync_nodes(mirror, [node]);
    }

    /// The node migration `migration_id`'s target holds capacity on, while the mirror does not
    /// show the job there.
    pub fn held_target(&self, migration_id: &str) -> Option<&str> {
        self.targets.get(migration_id).map(|t| t.node.as_str())
    }

    /// Drops every in-flight reservation of a bundle (it was deleted).
    pub fn forget_bundle(&mut self, bundle_id: &str, mirror: &MirrorState) {
        let keys: Vec<pl::JobKey> = self
            .inflight
            .keys()
            .filter(|k| k.bundle_id == bundle_id)
            .cloned()
            .collect();
        for k in keys {
            self.abandon(&k, mirror);
        }
    }
}

/// [`ClusterModel::reserving`]: the model, the mirror its nodes are re-read from, and the
/// Manager ids of the jobs being placed.
pub struct Reserving<'a> {
    model: &'a mut ClusterModel,
    mirror: &'a MirrorState,
    job_ids: &'a HashMap<String, String>,
}

impl policy::bundle_pass::Reservations for Reserving<'_> {
    fn engine(&self) -> &pl::Engine {
        &self.model.engine
    }

    fn release(&mut self, key: &pl::JobKey) {
        self.model.abandon(key, self.mirror);
    }

    fn reserve(&mut self, decision: &pl::Decision) -> Result<(), pl::CommitError> {
        self.model.commit(decision, self.job_ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use manager_proto as proto;

    fn job(updated_at_ms: i64, instances: &[(&str, i64)]) -> proto::Job {
        proto::Job {
            job_id: "ns.b/0/enc".into(),
            updated_at_ms,
            instances: instances
                .iter()
                .map(|(node, started)| proto::JobInstance {
                    node_id: (*node).into(),
                    role: proto::JobRole::Normal as i32,
                    state: proto::JobState::Starting as i32,
                    started_at_ms: *started,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_start_is_reflected_by_its_instance_or_a_later_record_never_by_an_equal_one() {
        let answer = job(100, &[("n2", 100)]);
        let mark = StartMark::of(&answer, "n2");
        assert_eq!(
            mark,
            StartMark {
                updated_at_ms: 100,
                started_at_ms: 100
            }
        );
        // The registration (or the failure) in the same millisecond: not the start.
        assert!(!mark.reflected_in(&job(100, &[]), "n2"));
        assert!(!mark.reflected_in(&job(100, &[("n1", 40)]), "n2"));
        assert!(mark.reflected_in(&answer, "n2"));
        assert!(!mark.reflected_in(&answer, "n1"), "another node's start");
        // Anything after the answer: the start was seen, or something superseded it.
        assert!(mark.reflected_in(&job(101, &[("n3", 101)]), "n2"));
    }
}
