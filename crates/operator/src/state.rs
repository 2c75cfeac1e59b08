//! The operator's in-memory state, with one owner.
//!
//! Everything the controllers share that is not in Kubernetes or in Manager's mirror lives in
//! one [`OperatorState`] behind one lock on the [`crate::controllers::Context`]:
//!
//! - **Lock order.** A caller may hold the mirror's read lock and then take this one
//!   (`Context::with_mirror` does both), never the other way round, and never holds this lock
//!   across an `.await`: take it, read or change, drop it. Nothing else locks in between, so
//!   no order can deadlock.
//! - **Durable policy state is not here alone.** Restart history is written to each Bundle's
//!   status and merged back in at every reconcile, a drop is a job state in status, and a job
//!   handed to its band's recovery is recorded by Manager as the instance's stop reason; so an
//!   operator restart, a `kill -9` or a leader change loses none of them (see
//!   docs/architecture.md).
//! - **Readers that must not wait** (`/v1/what-if`, `/debug/trace`) read a snapshot of the
//!   placement engine published at most every [`SNAPSHOT_EVERY`] while it changes
//!   ([`EngineSnapshot`]), so a dry run never holds this lock.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use automanager_api::{Bundle, DrainStatus, HotSpareTarget, Migration};
use automanager_placement as pl;
use automanager_policy::ledger::RestartLedger;
use automanager_policy::node_health::NodeHealth;
use automanager_policy::provision_budget::ProvisionBudget;
use automanager_policy::provision_keys::ProvisionKeys;
use automanager_policy::start_settle::StartSettle;
use automanager_policy::zone_brake::ZoneBrake;
use kube::runtime::reflector::ObjectRef;
use manager_proto as proto;

use crate::model::ClusterModel;

/// How often at most the engine snapshot for what-if is refreshed while the engine changes.
pub const SNAPSHOT_EVERY: Duration = Duration::from_millis(200);

/// The longest a bundle's pass waits for the jobs it started to run (see
/// [`automanager_policy::start_settle`]).
pub const START_SETTLE: Duration = Duration::from_millis(300);

/// The last placement decision for one replica of a bundle: the full trace for
/// `/debug/trace`, and what status summarises (also when the status write was coalesced).
#[derive(Debug, Clone)]
pub struct LastDecision {
    pub decision: pl::Decision,
    pub recovery: bool,
    pub at: chrono::DateTime<chrono::Utc>,
    /// Bronze jobs stopped to make room for this recovery.
    pub preempted: Option<automanager_api::Preemption>,
}

/// A preemption made for one replica whose recovery has not been placed yet: while it is
/// pending, no second one is made for the replica (its victims' capacity is on its way).
#[derive(Debug, Clone)]
pub struct PendingPreemption {
    pub record: automanager_api::Preemption,
    pub since: Instant,
}

/// Who to wake when something changes in Manager, so that one node event costs only the
/// reconciles it concerns (not every object of every kind).
#[derive(Debug, Default)]
pub struct WakeIndex {
    /// Bundles with a replica waiting for capacity (unplaceable or provisioning), by the pools
    /// they would take: a node or capacity change in the pool wakes them.
    waiting_on_pool: HashMap<String, HashSet<ObjectRef<Bundle>>>,
    /// The pools each waiting bundle is registered under (to unregister).
    pools_of_waiting: HashMap<ObjectRef<Bundle>, Vec<String>>,
    /// Migrations by Manager's migration id.
    migrations_by_manager_id: HashMap<String, ObjectRef<Migration>>,
    /// Migrations in progress by the job they move.
    migrations_by_job: HashMap<String, ObjectRef<Migration>>,
    /// HotSpareTargets by pool.
    spare_targets_by_pool: HashMap<String, HashSet<ObjectRef<HotSpareTarget>>>,
    /// Bundles in a pass now, and whether a change of their jobs came during it. Such a change
    /// is held back: it may be the pass's own starts coming up, which its status already
    /// shows; the pass's end wakes the bundle again if anything else changed.
    in_pass: HashMap<ObjectRef<Bundle>, bool>,
}

impl WakeIndex {
    /// Records the pools `bundle` waits on (none: it waits on nothing).
    pub fn set_waiting(&mut self, bundle: &ObjectRef<Bundle>, pools: Vec<String>) {
        if let Some(old) = self.pools_of_waiting.remove(bundle) {
            for p in old {
                if let Some(set) = self.waiting_on_pool.get_mut(&p) {
                    set.remove(bundle);
                    if set.is_empty() {
                        self.waiting_on_pool.remove(&p);
                    }
                }
            }
        }
        if pools.is_empty() {
            return;
        }
        for p in &pools {
            self.waiting_on_pool
                .entry(p.clone())
                .or_default()
                .insert(bundle.clone());
        }
        self.pools_of_waiting.insert(bundle.clone(), pools);
    }

    /// Bundles waiting on capacity in `pool`.
    pub fn waiting_on(&self, pool: &str) -> impl Iterator<Item = &ObjectRef<Bundle>> {
        self.waiting_on_pool.get(pool).into_iter().flatten()
    }

    /// Records a Migration's Manager id and job while it is in progress; `None` forgets it.
    pub fn set_migration(
        &mut self,
        migration: &ObjectRef<Migration>,
        ids: Option<(String, String)>,
    ) {
        self.migrations_by_manager_id.retain(|_, m| m != migration);
        self.migrations_by_job.retain(|_, m| m != migration);
        if let Some((manager_id, job_id)) = ids {
            self.migrations_by_manager_id
                .insert(manager_id, migration.clone());
            self.migrations_by_job.insert(job_id, migration.clone());
        }
    }

    /// The Migration driving Manager's migration `manager_id`.
    pub fn migration_by_manager_id(&self, manager_id: &str) -> Option<&ObjectRef<Migration>> {
        self.migrations_by_manager_id.get(manager_id)
    }

    /// The Migration in progress for `job_id`.
    pub fn migration_of_job(&self, job_id: &str) -> Option<&ObjectRef<Migration>> {
        self.migrations_by_job.get(job_id)
    }

    /// Records the pool of a HotSpareTarget (`None`: it is gone).
    pub fn set_spare_target(&mut self, target: &ObjectRef<HotSpareTarget>, pool: Option<&str>) {
        for set in self.spare_targets_by_pool.values_mut() {
            set.remove(target);
        }
        self.spare_targets_by_pool.retain(|_, s| !s.is_empty());
        if let Some(pool) = pool {
            self.spare_targets_by_pool
                .entry(pool.to_owned())
                .or_default()
                .insert(target.clone());
        }
    }

    /// HotSpareTargets of `pool`.
    pub fn spare_targets_of(&self, pool: &str) -> impl Iterator<Item = &ObjectRef<HotSpareTarget>> {
        self.spare_targets_by_pool.get(pool).into_iter().flatten()
    }

    /// A pass of `bundle` begins.
    pub fn begin_pass(&mut self, bundle: &ObjectRef<Bundle>) {
        self.in_pass.insert(bundle.clone(), false);
    }

    /// A change of `bundle`'s jobs: true when a pass of it runs now (the change is held for
    /// [`Self::end_pass`]), false when the caller should wake it.
    pub fn hold_for_pass(&mut self, bundle: &ObjectRef<Bundle>) -> bool {
        match self.in_pass.get_mut(bundle) {
            Some(held) => {
                *held = true;
                true
            }
            None => false,
        }
    }

    /// The pass of `bundle` ends: whether a change of its jobs was held during it.
    pub fn end_pass(&mut self, bundle: &ObjectRef<Bundle>) -> bool {
        self.in_pass.remove(bundle).unwrap_or(false)
    }
}

/// A Migration the queue let begin: the replica it takes down and the nodes it holds a slot on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmittedMigration {
    pub bundle_id: String,
    pub replica: u32,
    pub source_node: String,
    pub target_node: Option<String>,
}

/// Voluntary disruptions allowed by this process. Each is decided and recorded under the state
/// lock, so two reconciles never both take the last unit of a budget or the last queue slot;
/// after a restart the same facts are read back from Migration status and ManagerNode specs.
#[derive(Debug, Default)]
pub struct Disruptions {
    /// Admitted Migrations by `namespace/name`, until they end.
    pub migrations: HashMap<String, AdmittedMigration>,
    /// Nodes whose terminate (a `terminate` drain) the budget allowed: the replicas of the
    /// jobs still on them are down.
    pub terminating: HashSet<String>,
}

/// Everything the controllers share in memory. See the module docs for the rules.
pub struct OperatorState {
    /// The placement engine kept in step with the mirror, pools and cordons.
    pub model: ClusterModel,
    /// Restarts per replica in the last hour (merged with each Bundle's status).
    pub ledger: RestartLedger,
    /// Nodes whose workers refuse too many starts.
    pub health: NodeHealth,
    /// Node requests per pool in the last minute.
    pub provision_budget: ProvisionBudget,
    /// Rebalancing Migrations created in the last minute (one fleet-wide key; the same sliding
    /// window as the provisioning rate).
    pub rebalance_budget: ProvisionBudget,
    /// CreateNode idempotency keys sent without an answer, repeated by the next ask.
    pub provision_keys: ProvisionKeys,
    /// The full trace of each bundle's last decision per replica, by (namespace, name).
    pub traces: HashMap<(String, String), BTreeMap<u32, LastDecision>>,
    /// Bundle ids currently Broken.
    pub broken: HashSet<String>,
    /// Drains in progress, by Manager node id.
    pub drains: HashMap<String, DrainStatus>,
    /// The ManagerNode generation the node controller last acted on, by Manager node id.
    pub drain_generations: HashMap<String, i64>,
    /// Spares asked for per HotSpareTarget that the mirror does not show yet.
    pub spares_created: HashMap<String, Vec<(proto::Node, Instant)>>,
    /// Nodes lost per pool and zone, and the zones whose provisioning is paused.
    pub zone_brake: ZoneBrake,
    /// Whether losses are counted at all (`zoneBrake.enabled`).
    pub zone_brake_enabled: bool,
    /// Who to wake for what.
    pub wake: WakeIndex,
    /// Voluntary disruptions this process allowed that a listing may not show yet.
    pub disruptions: Disruptions,
    /// Why a node's drain waits for a disruption budget, by Manager node id (the ManagerNode's
    /// `DisruptionBlocked` condition).
    pub drain_blocked: HashMap<String, String>,
    /// Preemptions made for a replica's recovery, by (Manager bundle id, replica), until the
    /// replica is placed.
    pub preemptions: HashMap<(String, u32), PendingPreemption>,
    /// When each pool's consolidation was last planned, and for which generation of its spec.
    pub consolidation_planned: HashMap<String, (Instant, Option<i64>)>,
    /// How long recent passes waited for the jobs they started to run.
    pub start_settle: StartSettle,
    /// Whether the engine changed since the last snapshot.
    engine_changed: bool,
}

impl OperatorState {
    pub fn new(
        pending_window: Duration,
        rejection_threshold: u32,
        rejection_window: Duration,
    ) -> Self {
        OperatorState {
            model: ClusterModel::new(u64::try_from(pending_window.as_millis()).unwrap_or(u64::MAX)),
            ledger: RestartLedger::default(),
            health: NodeHealth::new(rejection_threshold, rejection_window),
            provision_budget: ProvisionBudget::default(),
            rebalance_budget: ProvisionBudget::default(),
            provision_keys: ProvisionKeys::default(),
            traces: HashMap::new(),
            broken: HashSet::new(),
            drains: HashMap::new(),
            drain_generations: HashMap::new(),
            spares_created: HashMap::new(),
            zone_brake: ZoneBrake::default(),
            zone_brake_enabled: false,
            wake: WakeIndex::default(),
            disruptions: Disruptions::default(),
            drain_blocked: HashMap::new(),
            preemptions: HashMap::new(),
            consolidation_planned: HashMap::new(),
            start_settle: StartSettle::new(START_SETTLE),
            engine_changed: true,
        }
    }

    /// The placement model, marked as changed for the next snapshot.
    pub fn model_mut(&mut self) -> &mut ClusterModel {
        self.engine_changed = true;
        &mut self.model
    }
}

/// The engine as readers that must not wait see it: replaced whole, read without a lock held
/// for longer than an `Arc` clone.
///
/// A replaced copy is not dropped at once: it is kept until the next refresh and handed back
/// to the refresher to drop outside every lock. Dropping an engine of a large fleet takes
/// milliseconds; done under the write lock it would hold up every reader, and done by a reader
/// that happened to hold the last reference (a what-if that began just before the swap) it
/// would land on that reader's answer.
#[derive(Default)]
pub struct EngineSnapshot {
    current: RwLock<Option<Arc<pl::Engine>>>,
    retired: std::sync::Mutex<Option<Arc<pl::Engine>>>,
}

impl EngineSnapshot {
    /// The latest snapshot (`None` before the first).
    pub fn get(&self) -> Option<Arc<pl::Engine>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Publishes a new copy of the engine when `state` changed since the last one. Returns the
    /// copy retired a refresh ago, for the caller to drop once it has released its locks.
    #[must_use = "drop the retired copy after releasing the state lock"]
    pub fn refresh(&self, state: &mut OperatorState) -> Option<Arc<pl::Engine>> {
        if !state.engine_changed {
            return None;
        }
        state.engine_changed = false;
        let copy = Arc::new(state.model.engine().clone());
        let replaced = self
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .replace(copy);
        std::mem::replace(
            &mut *self.retired.lock().unwrap_or_else(|e| e.into_inner()),
            replaced,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_waits_on_the_pools_it_was_last_registered_under_only() {
        let mut w = WakeIndex::default();
        let b = ObjectRef::<Bundle>::new("b").within("ns");
        w.set_waiting(&b, vec!["p".into(), "q".into()]);
        assert_eq!(w.waiting_on("p").count(), 1);
        w.set_waiting(&b, vec!["q".into()]);
        assert_eq!(w.waiting_on("p").count(), 0);
        assert_eq!(w.waiting_on("q").count(), 1);
        w.set_waiting(&b, Vec::new());
        assert_eq!(w.waiting_on("q").count(), 0);
    }

    #[test]
    fn a_job_change_during_a_pass_is_held_for_its_end_and_only_then() {
        let mut w = WakeIndex::default();
        let b = ObjectRef::<Bundle>::new("b").within("ns");
        let other = ObjectRef::<Bundle>::new("c").within("ns");
        assert!(!w.hold_for_pass(&b), "no pass: wake it now");
        w.begin_pass(&b);
        assert!(!w.end_pass(&b), "nothing came during the pass");
        w.begin_pass(&b);
        assert!(w.hold_for_pass(&b));
        assert!(!w.hold_for_pass(&other), "another bundle is woken as usual");
        assert!(
            w.end_pass(&b),
            "the held change is handed to the pass's end"
        );
        assert!(
            !w.hold_for_pass(&b),
            "after the pass, changes wake it again"
        );
    }

    #[test]
    fn a_replaced_snapshot_is_handed_back_one_refresh_later() {
        let snapshot = EngineSnapshot::default();
        let mut state = OperatorState::new(Duration::from_secs(1), 3, Duration::from_secs(60));
        assert!(snapshot.refresh(&mut state).is_none());
        let first = snapshot.get().expect("published");
        assert!(
            snapshot.refresh(&mut state).is_none(),
            "unchanged: nothing new"
        );
        state.model_mut();
        assert!(
            snapshot.refresh(&mut state).is_none(),
            "the first copy is kept, retired"
        );
        state.model_mut();
        let retired = snapshot.refresh(&mut state).expect("handed back to drop");
        assert!(Arc::ptr_eq(&retired, &first));
    }

    #[test]
    fn migrations_are_found_by_manager_id_and_job_until_forgotten() {
        let mut w = WakeIndex::default();
        let m = ObjectRef::<Migration>::new("m").within("ns");
        w.set_migration(&m, Some(("automanager-1".into(), "ns.b/0/j".into())));
        assert_eq!(w.migration_by_manager_id("automanager-1"), Some(&m));
        assert_eq!(w.migration_of_job("ns.b/0/j"), Some(&m));
        w.set_migration(&m, None);
        assert_eq!(w.migration_by_manager_id("automanager-1"), None);
    }

    #[test]
    fn spare_targets_move_with_their_pool() {
        let mut w = WakeIndex::default();
        let t = ObjectRef::<HotSpareTarget>::new("t");
        w.set_spare_target(&t, Some("p"));
        assert_eq!(w.spare_targets_of("p").count(), 1);
        w.set_spare_target(&t, None);
        assert_eq!(w.spare_targets_of("p").count(), 0);
    }
}
