//! [`State`]: the one owner of [`OperatorState`] and its lock, in the manner of Karpenter's
//! `state.Cluster`. Every question and every change is a method that takes the lock inside and
//! returns plain values, so no caller holds the lock across its own logic, and a rule that spans
//! books (a zone lost pauses provisioning into it in the placement model, ...) is one method
//! here rather than stitched together by each caller.
//!
//! Lock order: a method here never takes the mirror's lock, so a caller may call one while it
//! holds the mirror's read lock (`mirror().read(|m| ctx.state.sync_all(m))`), never the other
//! way round.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use automanager_api::{Bundle, HotSpareTarget};
use automanager_placement as pl;
use automanager_policy::pass_failure::FailureKind;
use automanager_policy::provision_refusals::Refusal;
use automanager_policy::zone_brake::{DegradedZone, ZoneChange};
use chrono::{DateTime, Utc};
use kube::runtime::reflector::ObjectRef;
use manager_client::MirrorState;

use super::{EngineSnapshot, OperatorState};
use crate::settings::Settings;

/// The operator's in-memory state behind its own lock (see the module docs).
pub struct State {
    inner: Mutex<OperatorState>,
}

impl State {
    pub fn new(settings: &Settings) -> Self {
        State {
            inner: Mutex::new(OperatorState::new(settings)),
        }
    }

    /// Poison-tolerant: a panic elsewhere must not wedge the operator.
    pub(super) fn lock(&self) -> MutexGuard<'_, OperatorState> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Publishes a new engine copy to `snapshot` when the model changed since the last one;
    /// returns the copy retired a refresh ago, for the caller to drop (outside this lock).
    #[must_use = "drop the retired copy outside the state's lock"]
    pub fn refresh_snapshot(&self, snapshot: &EngineSnapshot) -> Option<Arc<pl::Engine>> {
        snapshot.refresh(&mut self.lock())
    }

    // -- the placement model --

    /// The engine's decision for `request` at `now_ms`, changing nothing.
    pub fn place(&self, request: &pl::PlacementRequest, now_ms: u64) -> pl::Decision {
        self.lock().model().place(request, now_ms)
    }

    /// Pools of `names` the model does not hold (their objects not loaded yet, or gone).
    pub fn pools_unknown(&self, names: &[String]) -> Vec<String> {
        let s = self.lock();
        let engine = s.model().engine();
        names
            .iter()
            .filter(|p| engine.pool_spec(p).is_none())
            .cloned()
            .collect()
    }

    /// What `pool` holds and uses, as the model counts it (`None` when it is not loaded).
    pub fn pool_usage(&self, pool: &str) -> Option<pl::PoolUsage> {
        self.lock().model().engine().pool_usage(pool)
    }

    /// The spec of `pool` the model holds (`None` when it is not loaded).
    pub fn pool_spec(&self, pool: &str) -> Option<pl::PoolSpec> {
        self.lock().model().pool(pool).cloned()
    }

    /// Loads `spec` into the model as `mirror` shows its nodes; whether it changed (a change
    /// forgets Manager's refusals for the pool).
    pub fn load_pool(
        &self,
        mirror: &MirrorState,
        spec: pl::PoolSpec,
    ) -> Result<bool, pl::InputError> {
        self.lock().load_pool(spec, mirror)
    }

    /// Forgets every pool not in `existing`; returns those forgotten.
    pub fn prune_pools(&self, existing: &[String]) -> Vec<String> {
        self.lock().prune_pools(existing)
    }

    /// A copy of the engine in which `jobs` (Manager's ids) hold nothing, for a dry run.
    pub fn engine_without_jobs(
        &self,
        mirror: &MirrorState,
        jobs: &std::collections::HashSet<String>,
    ) -> pl::Engine {
        self.lock().model().without_jobs(mirror, jobs)
    }

    /// Node `id` as the placement model holds it now.
    pub fn node_view(&self, id: &str) -> Option<pl::NodeView> {
        self.lock().model().engine().node_view(id)
    }

    /// Each node of `pool` that `mirror` shows, as the model would take it in (with the
    /// operator's overlay on it and the pool's spec), with the engine's view of it now (which
    /// counts the starts in flight the mirror does not show yet).
    pub fn pool_nodes<'m>(
        &self,
        mirror: &'m MirrorState,
        pool: &str,
    ) -> Vec<(
        &'m manager_client::proto::Node,
        Option<pl::NodeSpec>,
        Option<pl::NodeView>,
    )> {
        let s = self.lock();
        let model = s.model();
        (mirror.nodes.values())
            .filter(|n| n.pool == pool)
            .map(|n| {
                let used = mirror.node_usage(&n.node_id);
                let spec =
                    crate::mapping::node(n, used, model.overlay(&n.node_id), model.pool(pool));
                (n, spec, model.engine().node_view(&n.node_id))
            })
            .collect()
    }

    /// Marks `node` as being emptied by consolidation (placement stops using it) or not;
    /// whether that changed.
    pub fn set_consolidating(&self, mirror: &MirrorState, node: &str, consolidating: bool) -> bool {
        let mut s = self.lock();
        let was = s.model().overlay(node);
        if was.consolidating == consolidating {
            return false;
        }
        let overlay = crate::mapping::NodeOverlay {
            consolidating,
            ..was
        };
        s.model_mut().set_overlay(node, overlay, mirror);
        true
    }

    /// A node we asked Manager for is on its way: it counts as capacity from now on.
    pub fn add_provisioned(&self, node: &manager_client::proto::Node) {
        self.lock().model_mut().add_provisioned(node);
    }

    // -- who to wake --

    /// The Bundles waiting on capacity in `pool`, and the HotSpareTargets of `pool`.
    pub fn waiters_of_pool(
        &self,
        pool: &str,
    ) -> (Vec<ObjectRef<Bundle>>, Vec<ObjectRef<HotSpareTarget>>) {
        let s = self.lock();
        (
            s.wake().waiting_on(pool).cloned().collect(),
            s.wake().spare_targets_of(pool).cloned().collect(),
        )
    }

    /// Whether a Migration of ours is known to move job `job_id`.
    pub fn migration_moves_job(&self, job_id: &str) -> bool {
        self.lock().wake().migration_of_job(job_id).is_some()
    }

    /// HotSpareTarget `target` keeps the spares of `pool` (`None`: it is gone, and the spares
    /// it asked for are forgotten with it).
    pub fn set_spare_target(&self, target: &ObjectRef<HotSpareTarget>, pool: Option<&str>) {
        let mut s = self.lock();
        s.wake_mut().set_spare_target(target, pool);
        if pool.is_none() {
            s.provisioning_mut().forget_spares(&target.name);
        }
    }

    /// Manager's changes to migration `ids` (Manager's migration id, the job's id) wake
    /// `migration`; `None`: nothing does any more.
    pub fn track_migration(
        &self,
        migration: &ObjectRef<automanager_api::Migration>,
        ids: Option<(String, String)>,
    ) {
        self.lock().wake_mut().set_migration(migration, ids);
    }

    // -- bundles --

    /// Records whether a bundle is Broken; the count of Broken bundles when it changed.
    pub fn set_broken(&self, bundle_id: &str, broken: bool) -> Option<usize> {
        self.lock().bundles_mut().set_broken(bundle_id, broken)
    }

    /// The preemption made for this replica if it is still on its way (younger than `hold` at
    /// `now`); an older one is forgotten.
    pub fn pending_preemption(
        &self,
        bundle_id: &str,
        replica: u32,
        now: Instant,
        hold: Duration,
    ) -> Option<automanager_api::Preemption> {
        (self.lock().bundles_mut()).pending_preemption(bundle_id, replica, now, hold)
    }

    /// A preemption was made for this replica at `now`.
    pub fn record_preemption(
        &self,
        bundle_id: &str,
        replica: u32,
        record: automanager_api::Preemption,
        now: Instant,
    ) {
        (self.lock().bundles_mut()).record_preemption(bundle_id, replica, record, now);
    }

    /// The replica's preemption after its placement, noted on its last decision for the trace:
    /// done when the replica `started` (returned once, for the trace), else the one `made` by
    /// this placement, else one made before and still under way (younger than `hold`).
    #[allow(clippy::too_many_arguments)]
    pub fn settle_preemption(
        &self,
        bundle: &(String, String),
        bundle_id: &str,
        replica: u32,
        started: bool,
        made: Option<automanager_api::Preemption>,
        now: Instant,
        hold: Duration,
    ) -> Option<automanager_api::Preemption> {
        let mut s = self.lock();
        let book = s.bundles_mut();
        let preempted = if started {
            book.preemption_placed(bundle_id, replica)
        } else if made.is_some() {
            made
        } else {
            book.pending_preemption(bundle_id, replica, now, hold)
        };
        if preempted.is_some() {
            book.note_preempted(bundle, replica, preempted.clone());
        }
        preempted
    }

    // -- nodes --

    /// A drain of `node` began at `started_at` with `jobs` jobs to move.
    pub fn begin_drain(&self, node: &str, jobs: usize, started_at: DateTime<Utc>) {
        self.lock().nodes_mut().begin_drain(node, jobs, started_at);
    }

    /// How far the drain of `node` has come.
    pub fn record_drain_progress(&self, node: &str, progress: super::DrainProgress) {
        self.lock()
            .nodes_mut()
            .record_drain_progress(node, progress);
    }

    // -- disruptions --

    /// A terminate of `node` may go ahead (its hold was waived, or it holds nothing).
    pub fn allow_terminate(&self, node: &str) {
        self.lock().disruptions_mut().allow_terminate(node);
    }

    /// When `pool`'s consolidation last planned, and for which generation of the pool.
    pub fn consolidation_planned(&self, pool: &str) -> Option<(Instant, Option<i64>)> {
        self.lock().disruptions().consolidation_planned(pool)
    }

    /// `pool`'s consolidation planned at `at` for `generation` of the pool.
    pub fn record_consolidation_plan(&self, pool: &str, at: Instant, generation: Option<i64>) {
        (self.lock().disruptions_mut()).record_consolidation_plan(pool, at, generation);
    }

    /// `pool` no longer consolidates: its last plan is forgotten.
    pub fn forget_consolidation(&self, pool: &str) {
        self.lock().disruptions_mut().forget_consolidation(pool);
    }

    /// Takes `moves` rebalancing moves from the budget at `now`; false when it has not enough.
    pub fn take_rebalance_moves(&self, moves: u32, now: DateTime<Utc>) -> bool {
        self.lock()
            .disruptions_mut()
            .take_rebalance_moves(moves, now)
    }

    // -- provisioning --

    /// How many nodes `pool` may still be asked for at `now`.
    pub fn provision_allowance(&self, pool: &str, now: DateTime<Utc>) -> u32 {
        self.lock().provisioning_mut().allowance(pool, now)
    }

    /// Manager refused a node ask for good (for its `epoch`): no ask of that pool and instance
    /// type is made again until the pool or Manager changes.
    pub fn refused(&self, refusal: Refusal, epoch: &str) {
        self.lock().provisioning_mut().refused(refusal, epoch);
    }

    /// Manager's refusals for `pool` that stand for its `epoch`.
    pub fn refusals_of(&self, pool: &str, epoch: &str) -> Vec<Refusal> {
        self.lock().provisioning().refusals_of(pool, epoch)
    }

    /// Tells the refusals what Manager offers for `pool` now; true when refusals were dropped
    /// because that changed.
    pub fn manager_offers(&self, pool: &str, instance_types: Vec<String>) -> bool {
        self.lock()
            .provisioning_mut()
            .manager_offers(pool, instance_types)
    }

    /// A spare for HotSpareTarget `target` was asked for: it counts as capacity in the model,
    /// and as the target's until the mirror shows it (or `grace` passes, see
    /// [`Self::spares_not_shown`]).
    pub fn spare_asked(&self, target: &str, node: manager_client::proto::Node, now: Instant) {
        let mut s = self.lock();
        s.model_mut().add_provisioned(&node);
        s.provisioning_mut().spare_asked(target, node, now);
    }

    /// The spares asked for `target` within `grace` of `now` that `shown` does not show yet.
    pub fn spares_not_shown(
        &self,
        target: &str,
        now: Instant,
        grace: Duration,
        shown: impl Fn(&str) -> bool,
    ) -> Vec<manager_client::proto::Node> {
        (self.lock().provisioning_mut()).spares_not_shown(target, now, grace, shown)
    }

    /// A recovery claims warm spare `node` at `now` (before starting it, so its target never
    /// sees it running unclaimed).
    pub fn claim_warm(&self, node: &str, now: Instant) {
        self.lock().provisioning_mut().claim_warm(node, now);
    }

    /// The warm spares a recovery claimed within `grace` of `now`.
    pub fn claimed_warm_spares(
        &self,
        now: Instant,
        grace: Duration,
    ) -> std::collections::HashSet<String> {
        self.lock().provisioning_mut().claimed(now, grace)
    }

    /// Takes one node request for `pool` from the budget at `now`; false when it is spent.
    pub fn take_provision_request(&self, pool: &str, now: DateTime<Utc>) -> bool {
        self.lock().provisioning_mut().take_request(pool, now)
    }

    // -- zones: the brake and the model's paused zones together --

    /// Whether node losses are counted at all.
    pub fn zone_brake_enabled(&self) -> bool {
        self.lock().provisioning().zone_brake_enabled()
    }

    /// Zones whose brake window passed quietly are released, and provisioning into each is
    /// resumed in the placement model.
    pub fn tick_zone_brake(&self, now: DateTime<Utc>) -> Vec<ZoneChange> {
        self.lock().tick_zone_brake(now)
    }

    /// A node of `pool` in `zone` was lost with `up` nodes left there; a zone this degrades is
    /// paused for provisioning in the placement model.
    pub fn record_zone_loss(
        &self,
        pool: &str,
        zone: &str,
        up: u32,
        now: DateTime<Utc>,
    ) -> Option<ZoneChange> {
        self.lock().record_zone_loss(pool, zone, up, now)
    }

    /// Whether provisioning into `zone` of `pool` is paused in the placement model.
    pub fn provisioning_paused(&self, pool: &str, zone: &str) -> bool {
        self.lock().model().engine().provisioning_paused(pool, zone)
    }

    /// The zones of `pool` the brake holds as degraded.
    pub fn degraded_zones(&self, pool: &str) -> Vec<DegradedZone> {
        (self
            .lock()
            .provisioning()
            .zone_brake()
            .degraded_in(pool)
            .into_iter())
        .cloned()
        .collect()
    }

    /// Whether the zone brake holds `zone` of `pool` as degraded.
    pub fn zone_degraded(&self, pool: &str, zone: &str) -> bool {
        self.lock()
            .provisioning()
            .zone_brake()
            .is_degraded(pool, zone)
    }

    // -- failed passes --

    /// A pass over the object `key` failed with `kind` at `now`: how long until the next try.
    pub fn pass_failed(&self, key: &str, kind: FailureKind, now: Instant) -> Duration {
        self.lock().retries_mut().failed(key, kind, now)
    }

    /// A pass over the object `key` succeeded: a later failure starts its back-off afresh.
    pub fn pass_succeeded(&self, key: &str) {
        self.lock().retries_mut().succeeded(key);
    }
}

#[cfg(test)]
mod tests {
    use automanager_policy::zone_brake::ZoneBrakeSettings;
    use chrono::TimeDelta;
    use proptest::prelude::*;

    use super::*;

    const POOLS: [&str; 2] = ["a", "b"];
    const ZONES: [&str; 2] = ["z1", "z2"];

    /// One thing that happens to the zones: a node lost (pool, zone, nodes left up), or time
    /// passing by some seconds and the brake's clock ticking.
    #[derive(Debug, Clone)]
    enum Step {
        Lost(usize, usize, u32),
        Tick(i64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..POOLS.len(), 0..ZONES.len(), 0u32..4).prop_map(|(p, z, up)| Step::Lost(p, z, up)),
            (1i64..400).prop_map(Step::Tick),
        ]
    }

    fn pool(name: &str, region: &str) -> pl::PoolSpec {
        serde_json::from_value(
            serde_json::json!({"name": name, "kind": "cluster", "region": region}),
        )
        .expect("a pool spec")
    }

    fn refusal(pool: &str) -> Refusal {
        Refusal {
            pool: pool.into(),
            instance_type: "big".into(),
            code: "InvalidArgument".into(),
            message: "no such type".into(),
        }
    }

    /// One thing that happens to the pools: one loaded (which pool, which region), Manager
    /// refusing an ask in one, or the pools not in a set pruned.
    #[derive(Debug, Clone)]
    enum PoolStep {
        Load(usize, usize),
        Refused(usize),
        Prune(Vec<bool>),
    }

    fn pool_step() -> impl Strategy<Value = PoolStep> {
        prop_oneof![
            (0..POOLS.len(), 0usize..2).prop_map(|(p, r)| PoolStep::Load(p, r)),
            (0..POOLS.len()).prop_map(PoolStep::Refused),
            proptest::collection::vec(any::<bool>(), POOLS.len()).prop_map(PoolStep::Prune),
        ]
    }

    fn braked() -> State {
        State::new(&Settings {
            zone_brake: Some(ZoneBrakeSettings {
                lost_fraction: 0.5,
                window: TimeDelta::seconds(300),
                min_lost: 2,
            }),
            ..Settings::default()
        })
    }

    proptest! {
        /// The brake and the placement model never disagree: a zone is paused for provisioning
        /// exactly while the brake holds it degraded, whatever losses and quiet times come.
        #[test]
        fn a_zone_is_paused_in_the_model_exactly_while_the_brake_holds_it(
            steps in proptest::collection::vec(step(), 1..60)
        ) {
            let state = braked();
            let mut now = DateTime::UNIX_EPOCH;
            for s in steps {
                match s {
                    Step::Lost(p, z, up) => {
                        let _ = state.record_zone_loss(POOLS[p], ZONES[z], up, now);
                    }
                    Step::Tick(secs) => {
                        now += TimeDelta::seconds(secs);
                        let _ = state.tick_zone_brake(now);
                    }
                }
                for pool in POOLS {
                    for zone in ZONES {
                        prop_assert_eq!(
                            state.provisioning_paused(pool, zone),
                            state.zone_degraded(pool, zone),
                            "pool {} zone {}", pool, zone
                        );
                    }
                }
            }
        }
    }

    proptest! {
        /// The model holds exactly the pools loaded and not pruned since; a refusal stands
        /// until its pool is loaded changed or pruned, never longer.
        #[test]
        fn pools_and_their_refusals_come_and_go_together(
            steps in proptest::collection::vec(pool_step(), 1..40)
        ) {
            let state = State::new(&Settings::default());
            let mirror = MirrorState::default();
            let mut loaded: [Option<usize>; 2] = [None; 2];
            let mut refused = [false; 2];
            for s in steps {
                match s {
                    PoolStep::Load(p, r) => {
                        let changed = state.load_pool(&mirror, pool(POOLS[p], ZONES[r])).expect("valid");
                        prop_assert_eq!(changed, loaded[p] != Some(r));
                        if changed {
                            refused[p] = false;
                        }
                        loaded[p] = Some(r);
                    }
                    PoolStep::Refused(p) => {
                        state.refused(refusal(POOLS[p]), "e");
                        refused[p] = true;
                    }
                    PoolStep::Prune(keep) => {
                        let existing: Vec<String> = (POOLS.iter().zip(&keep))
                            .filter(|(_, k)| **k)
                            .map(|(p, _)| (*p).to_owned())
                            .collect();
                        let gone = state.prune_pools(&existing);
                        for (i, p) in POOLS.iter().enumerate() {
                            let was = loaded[i].is_some();
                            prop_assert_eq!(gone.iter().any(|g| g == p), was && !keep[i]);
                            if !keep[i] {
                                loaded[i] = None;
                                if was {
                                    refused[i] = false;
                                }
                            }
                        }
                    }
                }
                for (i, p) in POOLS.iter().enumerate() {
                    prop_assert_eq!(state.pool_usage(p).is_some(), loaded[i].is_some(), "pool {}", p);
                    prop_assert_eq!(!state.refusals_of(p, "e").is_empty(), refused[i], "pool {}", p);
                }
            }
        }
    }

    #[test]
    fn a_spare_asked_counts_in_its_pool_and_for_its_target_until_the_target_is_gone() {
        let state = State::new(&Settings::default());
        let mirror = MirrorState::default();
        let mut spec = pool("a", "r");
        spec.candidate_instance_types = vec![
            serde_json::from_value(serde_json::json!({
                "instanceType": "small", "totalCapacity": 10.0, "totalCores": 4
            }))
            .expect("an instance type"),
        ];
        state.load_pool(&mirror, spec).expect("valid");
        let node = manager_client::proto::Node {
            node_id: "s1".into(),
            pool: "a".into(),
            instance_type: "small".into(),
            state: manager_client::proto::NodeState::Starting as i32,
            ..Default::default()
        };
        let t0 = Instant::now();
        let grace = Duration::from_secs(60);
        state.spare_asked("t", node, t0);
        assert_eq!(state.pool_usage("a").map(|u| u.node_count), Some(1));
        let ids = |v: Vec<manager_client::proto::Node>| {
            v.into_iter().map(|n| n.node_id).collect::<Vec<_>>()
        };
        assert_eq!(
            ids(state.spares_not_shown("t", t0, grace, |_| false)),
            ["s1"]
        );
        let target = ObjectRef::<HotSpareTarget>::new("t");
        state.set_spare_target(&target, Some("a"));
        assert_eq!(state.waiters_of_pool("a").1, vec![target.clone()]);
        state.set_spare_target(&target, None);
        assert!(state.waiters_of_pool("a").1.is_empty());
        assert!(state.spares_not_shown("t", t0, grace, |_| false).is_empty());
    }

    #[test]
    fn enough_losses_pause_a_zone_and_a_quiet_window_resumes_it() {
        let state = braked();
        let t0 = DateTime::UNIX_EPOCH;
        assert!(state.record_zone_loss("a", "z1", 1, t0).is_none());
        assert!(matches!(
            state.record_zone_loss("a", "z1", 0, t0),
            Some(ZoneChange::Degraded(_))
        ));
        assert!(state.provisioning_paused("a", "z1"));
        assert!(!state.provisioning_paused("a", "z2"));
        let cleared = state.tick_zone_brake(t0 + TimeDelta::seconds(301));
        assert_eq!(
            cleared,
            vec![ZoneChange::Cleared {
                pool: "a".into(),
                zone: "z1".into()
            }]
        );
        assert!(!state.provisioning_paused("a", "z1"));
    }
}
