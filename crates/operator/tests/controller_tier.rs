//! The controller tier without an apiserver: each controller's pass called directly, on a context
//! whose Kubernetes client is an in-memory apiserver ([`tier::apiserver`]) that records every call
//! and refuses the ones a test scripts, with the in-process manager-sim as Manager and a fake
//! clock. Each test reads as: given these objects, one pass observed this, wrote these calls,
//! and left this status. The apiserver-backed suite (`controllers.rs`) stays for what only the
//! real apiserver shows (watches, admission, field ownership).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod tier;

#[path = "controller_tier/bundles.rs"]
mod bundles;
#[path = "controller_tier/common.rs"]
mod common;
#[path = "controller_tier/consolidation.rs"]
mod consolidation;
#[path = "controller_tier/deadlines.rs"]
mod deadlines;
#[path = "controller_tier/finalizers.rs"]
mod finalizers;
#[path = "controller_tier/foreign.rs"]
mod foreign;
#[path = "controller_tier/holds.rs"]
mod holds;
#[path = "controller_tier/migrations.rs"]
mod migrations;
#[path = "controller_tier/nodes.rs"]
mod nodes;
#[path = "controller_tier/notices.rs"]
mod notices;
#[path = "controller_tier/pool_deletion.rs"]
mod pool_deletion;
#[path = "controller_tier/pools.rs"]
mod pools;
#[path = "controller_tier/rebalance.rs"]
mod rebalance;
#[path = "controller_tier/recovery.rs"]
mod recovery;
#[path = "controller_tier/spare_tiers.rs"]
mod spare_tiers;
#[path = "controller_tier/spares.rs"]
mod spares;
#[path = "controller_tier/sweep.rs"]
mod sweep;
#[path = "controller_tier/windows.rs"]
mod windows;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use automanager_api::condition::find_condition;
use automanager_api::{self as api, Bundle, PlacementPool};
use automanager_operator::clock::FakeClock;
use automanager_operator::config::OperatorConfig;
use automanager_operator::controllers::{self, Context};
use automanager_operator::metrics::Metrics;
use automanager_operator::settings::Settings;
use http::Method;
use kube::ResourceExt;
use manager_client::{ClientConfig, InProcess, ManagerClient};
use manager_sim::config::SimConfig;
use manager_sim::server::{Sim, SimHandle};
use tier::apiserver::MemoryApiserver;
use tier::manager::ScriptedManager;

const BOUND: Duration = Duration::from_secs(60);
const POOLS: &str = "/apis/automanager.norsk.io/v1alpha1/placementpools";

fn repo() -> PathBuf {
    package_dir().join("../..")
}

/// The in-memory apiserver, Manager (the demo's simulator behind a scripted port) and a context
/// on both.
struct Tier {
    api: MemoryApiserver,
    manager: ScriptedManager,
    ctx: Arc<Context>,
    clock: FakeClock,
    _sim: SimHandle,
}

impl Tier {
    async fn start(config: impl FnOnce(&mut OperatorConfig)) -> Tier {
        Tier::start_with_sim(|_| {}, config).await
    }

    async fn start_with_sim(
        sim_config: impl FnOnce(&mut SimConfig),
        config: impl FnOnce(&mut OperatorConfig),
    ) -> Tier {
        let sim_yaml =
            std::fs::read_to_string(repo().join("deploy/demo/manager-sim.yaml")).unwrap();
        let mut sim_cfg = SimConfig::from_yaml(&sim_yaml).unwrap();
        sim_config(&mut sim_cfg);
        let sim = Sim::start_in_process(sim_cfg).await.expect("manager-sim");
        let mut cfg = OperatorConfig::default();
        config(&mut cfg);
        // Manager through its port, in this process: no socket anywhere in this tier.
        let port = ScriptedManager::new(InProcess::shared(sim.service()));
        let manager =
            ManagerClient::over(Arc::new(port.clone()), &ClientConfig::new(sim.endpoint()))
                .expect("Manager client");
        manager.wait_ready(BOUND).await.expect("mirror synced");
        let api = MemoryApiserver::default();
        let clock = FakeClock::at(
            chrono::DateTime::parse_from_rfc3339("2026-03-01T12:00:00Z")
                .unwrap()
                .to_utc(),
        );
        let ctx = Context::new(
            api.client(),
            manager,
            Settings::from_config(&cfg),
            Metrics::new(),
            clock.shared(),
            "tier",
        );
        Tier {
            api,
            manager: port,
            ctx,
            clock,
            _sim: sim,
        }
    }

    /// The example pool `name`, stored as a user's `kubectl apply` would.
    fn pool(&self, name: &str) -> PlacementPool {
        let pools: Vec<PlacementPool> = serde_saphyr::from_multiple(
            &std::fs::read_to_string(repo().join("examples/pools.yaml")).unwrap(),
        )
        .unwrap();
        let pool = pools.into_iter().find(|p| p.name_any() == name).unwrap();
        self.api.insert(&pool)
    }

    fn stored_pool(&self, name: &str) -> Option<PlacementPool> {
        self.api.get::<PlacementPool>(None, name)
    }

    /// One PlacementPool pass over the pool as stored now.
    async fn pool_pass(
        &self,
        name: &str,
    ) -> Result<kube::runtime::controller::Action, controllers::Error> {
        let pool = self.stored_pool(name).expect("the pool is stored");
        controllers::pool::reconcile(Arc::new(pool), self.ctx.clone()).await
    }

    /// The pool `name` marked for deletion (its finalizer holds it).
    fn delete_pool(&self, name: &str) {
        self.api.delete_path(&format!("{POOLS}/{name}"));
    }

    fn bundle_naming(&self, pool: &str) {
        let mut b = Bundle::new(
            "encode",
            serde_json::from_value(serde_json::json!({
                "replicas": 1,
                "pools": [pool],
                "jobs": [{"jobName": "enc", "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": "silver"}}],
            }))
            .unwrap(),
        );
        b.metadata.namespace = Some("live".into());
        self.api.insert(&b);
    }
}

fn condition(p: &PlacementPool, type_: &str) -> (String, String, String) {
    let c = find_condition(&p.status.as_ref().unwrap().conditions, type_)
        .unwrap_or_else(|| panic!("no {type_} condition on {p:?}"));
    (
        format!("{:?}", c.status),
        c.reason.clone(),
        c.message.clone(),
    )
}

#[tokio::test]
async fn a_new_pool_gains_its_finalizer_and_a_ready_status_with_managers_node_count() {
    let t = Tier::start(|_| {}).await;
    t.pool("aws-east");
    let nodes = t
        .ctx
        .manager
        .mirror()
        .read(|m| m.nodes.values().filter(|n| n.pool == "aws-east").count());

    t.pool_pass("aws-east").await.expect("the pass");

    assert_eq!(
        t.api.writes(),
        [
            format!("PATCH {POOLS}/aws-east"),
            format!("PATCH {POOLS}/aws-east/status"),
        ],
        "the finalizer, then the status"
    );
    let pool = t.stored_pool("aws-east").unwrap();
    assert!(pool.finalizers().iter().any(|f| f == api::POOL_FINALIZER));
    let status = pool.status.clone().unwrap();
    assert_eq!(status.node_count, i64::try_from(nodes).unwrap());
    assert_eq!(status.observed_generation, pool.metadata.generation);
    assert_eq!(condition(&pool, "Ready").0, "True");
    let ready = find_condition(&status.conditions, "Ready").unwrap();
    assert_eq!(
        ready.last_transition_time.to_rfc3339(),
        "2026-03-01T12:00:00+00:00",
        "the fake clock's time"
    );
}

#[tokio::test]
async fn a_second_pass_with_nothing_changed_writes_nothing() {
    let t = Tier::start(|_| {}).await;
    t.pool("aws-east");
    t.pool_pass("aws-east").await.expect("the first pass");
    t.api.clear_calls();
    t.clock.advance(Duration::from_secs(30));

    t.pool_pass("aws-east").await.expect("the second pass");

    assert_eq!(t.api.writes(), Vec::<String>::new());
}

#[tokio::test]
async fn a_pool_manager_does_not_know_is_stalled_and_says_so() {
    let t = Tier::start(|_| {}).await;
    let mut pool = t.pool("aws-east");
    pool.metadata.name = Some("aws-nowhere".into());
    pool.metadata.resource_version = None;
    t.api.insert(&pool);

    t.pool_pass("aws-nowhere").await.expect("the pass");

    let (status, reason, message) = condition(&t.stored_pool("aws-nowhere").unwrap(), "Stalled");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "UnknownToManager")
    );
    assert!(message.contains("aws-nowhere"), "{message}");
}

#[tokio::test]
async fn a_deleted_pool_a_bundle_names_stays_and_names_the_bundle_then_goes_when_it_is_free() {
    let t = Tier::start(|_| {}).await;
    t.pool("aws-east");
    t.pool_pass("aws-east").await.expect("the first pass");
    t.bundle_naming("aws-east");
    t.delete_pool("aws-east");
    t.api.clear_calls();

    t.pool_pass("aws-east")
        .await
        .expect("the pass while in use");

    let pool = t.stored_pool("aws-east").expect("held by its finalizer");
    let (status, reason, message) = condition(&pool, "Stalled");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "InUse"));
    assert!(message.contains("Bundle live/encode"), "{message}");
    assert_eq!(t.api.writes(), [format!("PATCH {POOLS}/aws-east/status")]);
    assert!(
        t.ctx.events.flush(BOUND).await,
        "the DeletionBlocked Event is published"
    );
    assert!(
        t.api
            .calls()
            .iter()
            .any(|c| c.method == Method::POST && c.path.ends_with("/events")),
        "{:?}",
        t.api.calls()
    );

    t.api
        .delete_path("/apis/automanager.norsk.io/v1alpha1/namespaces/live/bundles/encode");
    t.api.clear_calls();
    t.pool_pass("aws-east").await.expect("the pass once free");

    assert_eq!(
        t.api.writes(),
        [format!("PATCH {POOLS}/aws-east")],
        "only the finalizer goes"
    );
    assert!(t.stored_pool("aws-east").is_none(), "the pool is gone");
}

#[tokio::test]
async fn a_refused_finalizer_write_fails_the_pass_before_any_status_is_written() {
    let t = Tier::start(|_| {}).await;
    t.pool("aws-east");
    t.api
        .refuse_next(Method::PATCH, "/placementpools/aws-east", 409);

    let err = t
        .pool_pass("aws-east")
        .await
        .expect_err("a 409 is the pass's error");

    assert!(controllers::is_conflict(&err), "{err}");
    assert_eq!(t.api.writes(), [format!("PATCH {POOLS}/aws-east")]);
    assert_eq!(t.api.refused(), [format!("PATCH {POOLS}/aws-east 409")]);
    assert!(t.stored_pool("aws-east").unwrap().status.is_none());
}

#[tokio::test]
async fn a_status_write_refused_as_invalid_is_the_passs_error_and_the_next_pass_writes_it() {
    let t = Tier::start(|_| {}).await;
    t.pool("aws-east");
    t.api
        .refuse_next(Method::PATCH, "/placementpools/aws-east/status", 422);

    let err = t
        .pool_pass("aws-east")
        .await
        .expect_err("a 422 is the pass's error");

    assert!(
        matches!(&err, controllers::Error::Kube(kube::Error::Api(s)) if s.code == 422),
        "{err}"
    );
    assert!(t.stored_pool("aws-east").unwrap().status.is_none());
    t.pool_pass("aws-east").await.expect("the retry");
    assert!(t.stored_pool("aws-east").unwrap().status.is_some());
}

#[tokio::test]
async fn without_the_cluster_scope_a_pool_is_placed_into_and_never_written() {
    let t = Tier::start(|c| c.cluster_scope = false).await;
    t.pool("aws-east");

    t.pool_pass("aws-east").await.expect("the pass");

    assert_eq!(t.api.writes(), Vec::<String>::new());
    assert!(
        t.ctx.state.pool_spec("aws-east").is_some(),
        "loaded for placement"
    );
}

const BUNDLES: &str = "/apis/automanager.norsk.io/v1alpha1/namespaces/live/bundles";
const HISTORIES: &str = "/apis/automanager.norsk.io/v1alpha1/namespaces/live/placementhistories";

impl Tier {
    /// Every example pool stored and passed once, so the placement model knows them.
    async fn with_example_pools(self) -> Tier {
        for name in ["aws-east", "aws-west", "oci-fra", "onprem"] {
            self.pool(name);
            self.pool_pass(name).await.expect("the pool pass");
        }
        self.api.clear_calls();
        self.manager.clear_calls();
        self
    }

    fn bundle(&self, name: &str, replicas: i32, pools: &[&str]) -> Bundle {
        let mut b = Bundle::new(
            name,
            serde_json::from_value(serde_json::json!({
                "replicas": replicas,
                "pools": pools,
                "jobs": [{"jobName": "enc", "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": "gold"}}],
            }))
            .unwrap(),
        );
        b.metadata.namespace = Some("live".into());
        self.api.insert(&b)
    }

    fn stored_bundle(&self, name: &str) -> Bundle {
        self.api
            .get::<Bundle>(Some("live"), name)
            .expect("the bundle is stored")
    }

    /// One Bundle pass over the bundle as stored now.
    async fn bundle_pass(
        &self,
        name: &str,
    ) -> Result<kube::runtime::controller::Action, controllers::Error> {
        let b = self.stored_bundle(name);
        let result = controllers::reconcile_finalized(Arc::new(b), self.ctx.clone()).await;
        // The pass queued its decisions for the history's writer, which writes them on its own
        // task; a pass here ends when that write has, so a test sees what the pass caused.
        assert!(
            self.ctx.history.idle(BOUND).await,
            "the history's writer is idle"
        );
        result
    }

    /// Manager's jobs of the bundle `live/<name>`.
    /// Manager's jobs of bundle `live/name` that sit on a node (a registered job waiting for
    /// a placement has none).
    fn manager_jobs(&self, name: &str) -> Vec<String> {
        let id = automanager_operator::mapping::bundle_id("live", name);
        self._sim
            .snapshot()
            .jobs
            .into_iter()
            .filter(|j| j.bundle_id == id && !j.node_id.is_empty())
            .map(|j| j.job_id)
            .collect()
    }
}

#[tokio::test]
async fn a_bundle_gains_its_finalizer_then_starts_on_manager_and_records_managers_job_ids() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.bundle("news", 2, &["onprem"]);

    t.bundle_pass("news").await.expect("the finalizer pass");
    assert_eq!(t.api.writes(), [format!("PATCH {BUNDLES}/news")]);
    assert!(
        t.manager_jobs("news").is_empty(),
        "nothing started before the finalizer"
    );
    t.api.clear_calls();

    t.bundle_pass("news").await.expect("the placing pass");

    assert_eq!(
        t.api.writes(),
        [
            format!("PATCH {BUNDLES}/news/status"),
            format!("POST {HISTORIES}")
        ]
    );
    let status = t.stored_bundle("news").status.expect("a status");
    assert_eq!(status.placed_replicas, 2);
    let mut recorded: Vec<String> = status
        .replicas
        .iter()
        .flat_map(|r| r.jobs.iter().filter_map(|j| j.job_id.clone()))
        .collect();
    let mut started = t.manager_jobs("news");
    recorded.sort();
    started.sort();
    assert_eq!(
        recorded, started,
        "the status names the jobs Manager started"
    );
    let nodes: std::collections::BTreeSet<_> = status
        .replicas
        .iter()
        .filter_map(|r| r.jobs.first().and_then(|j| j.node_id.clone()))
        .collect();
    assert_eq!(nodes.len(), 2, "replicas on different nodes (hard rule)");
}

#[tokio::test]
async fn a_bundle_whose_pools_are_unknown_starts_nothing_and_says_it_cannot_be_placed() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.bundle("lost", 1, &["nowhere"]);

    t.bundle_pass("lost").await.expect("the finalizer pass");
    t.bundle_pass("lost").await.expect("the pass");

    assert!(t.manager_jobs("lost").is_empty());
    let status = t.stored_bundle("lost").status.expect("a status");
    assert_eq!(status.placed_replicas, 0);
    assert_ne!(status.phase, api::BundlePhase::Ready);
}

#[tokio::test]
async fn a_bundle_status_write_refused_as_stale_fails_the_pass_as_a_conflict() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.bundle("news", 1, &["onprem"]);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.api
        .refuse_next(Method::PATCH, "/bundles/news/status", 409);

    let err = t.bundle_pass("news").await.expect_err("the conflict");

    assert!(controllers::is_conflict(&err), "{err}");
    assert!(t.stored_bundle("news").status.is_none(), "nothing recorded");
    t.bundle_pass("news").await.expect("the next pass");
    assert_eq!(t.stored_bundle("news").status.unwrap().placed_replicas, 1);
    assert_eq!(
        t.manager_jobs("news").len(),
        1,
        "the retry started no second job"
    );
}

#[tokio::test]
async fn a_pool_being_deleted_keeps_what_runs_there_and_takes_no_new_bundle() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.bundle("news", 1, &["onprem"]);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    assert_eq!(t.manager_jobs("news").len(), 1);
    t.delete_pool("onprem");
    t.pool_pass("onprem").await.expect("the pool pass");
    assert_eq!(
        condition(&t.stored_pool("onprem").unwrap(), "Stalled").1,
        "InUse"
    );

    t.bundle("late", 1, &["onprem"]);
    t.bundle_pass("late").await.expect("the finalizer pass");
    t.bundle_pass("late").await.expect("the pass");

    assert!(
        t.manager_jobs("late").is_empty(),
        "nothing new in a terminating pool: {:?}",
        t.stored_bundle("late").status
    );
    let late = t.stored_bundle("late").status.expect("a status");
    assert_eq!(late.placed_replicas, 0);
    let reasons: Vec<String> = late
        .replicas
        .iter()
        .flat_map(|r| &r.jobs)
        .filter_map(|j| j.last_placement.as_ref())
        .flat_map(|p| {
            p.pools_tried
                .iter()
                .map(|a| format!("{}:{}", a.pool, a.reason))
        })
        .collect();
    assert_eq!(reasons, ["onprem:terminating"], "{late:?}");
    // What ran there stays.
    t.bundle_pass("news")
        .await
        .expect("a pass of the running bundle");
    assert_eq!(t.manager_jobs("news").len(), 1);
    assert_eq!(t.stored_bundle("news").status.unwrap().placed_replicas, 1);
}

impl Tier {
    /// CreateNode calls Manager served so far.
    fn creates(&self) -> u64 {
        self._sim
            .call_counts()
            .calls
            .get("CreateNode")
            .copied()
            .unwrap_or(0)
    }

    /// The stored pool `name` with `spec` merged in, as a user's edit (a new generation).
    async fn edit_pool(&self, name: &str, spec: serde_json::Value) {
        kube::Api::<PlacementPool>::all(self.api.client())
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(serde_json::json!({ "spec": spec })),
            )
            .await
            .expect("the edit");
    }

    /// A one-replica bundle of one silver job of `capacity` on `pools`.
    fn bundle_of(&self, name: &str, capacity: u32, pools: &[&str]) -> Bundle {
        let mut b = Bundle::new(
            name,
            serde_json::from_value(serde_json::json!({
                "replicas": 1,
                "pools": pools,
                "jobs": [{"jobName": "enc", "requirements": {"requiredCapacity": capacity, "requiredCores": 1, "priorityBand": "silver"}}],
            }))
            .unwrap(),
        );
        b.metadata.namespace = Some("live".into());
        self.api.insert(&b)
    }

    pub(crate) fn events_for(&self, name: &str, reason: &str) -> Vec<String> {
        self.api
            .events()
            .into_iter()
            .filter(|(n, r, _)| n == name && r == reason)
            .map(|(_, _, note)| note)
            .collect()
    }
}

fn bundle_condition(b: &Bundle, type_: &str) -> (String, String, String) {
    let c = find_condition(&b.status.as_ref().unwrap().conditions, type_)
        .unwrap_or_else(|| panic!("no {type_} condition on {b:?}"));
    (
        format!("{:?}", c.status),
        c.reason.clone(),
        c.message.clone(),
    )
}

/// aws-east with one candidate type Manager does not offer.
async fn aws_east_offering_a_type_manager_lacks(t: &Tier) {
    t.pool("aws-east");
    t.edit_pool(
        "aws-east",
        serde_json::json!({"candidateInstanceTypes": [
            {"instanceType": "m5.nonexistent", "totalCapacity": 100, "totalCores": 16}
        ]}),
    )
    .await;
    t.pool_pass("aws-east").await.expect("the pool pass");
    t.api.clear_calls();
}

#[tokio::test]
async fn a_node_manager_refuses_is_asked_for_once_and_the_bundle_and_the_pool_say_so_in_managers_words()
 {
    let t = Tier::start(|_| {}).await;
    aws_east_offering_a_type_manager_lacks(&t).await;
    t.bundle_of("news", 10, &["aws-east"]);
    t.bundle_pass("news").await.expect("the finalizer pass");

    t.bundle_pass("news")
        .await
        .expect("a refusal is the bundle's state, not the pass's error");

    assert_eq!(t.creates(), 1);
    let b = t.stored_bundle("news");
    assert_eq!(b.status.as_ref().unwrap().phase, api::BundlePhase::Pending);
    let (status, reason, message) = bundle_condition(&b, "Stalled");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ProvisioningRefused")
    );
    assert!(
        message.contains("has no instance type \"m5.nonexistent\""),
        "Manager's own words: {message}"
    );
    assert_eq!(
        b.status.as_ref().unwrap().replicas[0].jobs[0].state,
        api::JobState::Unplaceable
    );

    // Passes long after: the refusal stands, nothing is asked, the Event is not repeated.
    for _ in 0..3 {
        t.clock.advance(Duration::from_secs(600));
        t.bundle_pass("news").await.expect("a later pass");
    }
    assert_eq!(t.creates(), 1, "a refusal is not asked again");
    assert!(t.ctx.events.flush(BOUND).await);
    let events = t.events_for("news", "ProvisioningRefused");
    assert_eq!(events.len(), 1, "{:?}", t.api.events());
    assert!(events[0].contains("m5.nonexistent"), "{events:?}");

    // The pool says so too.
    t.pool_pass("aws-east").await.expect("the pool pass");
    let pool = t.stored_pool("aws-east").unwrap();
    let (status, reason, message) = condition(&pool, "ProvisioningRefused");
    assert_eq!(status, "True");
    assert_eq!(reason, "ProvisioningRefused");
    assert!(message.contains("has no instance type"), "{message}");
    assert_eq!(condition(&pool, "Stalled").1, "ProvisioningRefused");
    assert!(t.ctx.events.flush(BOUND).await);
    assert_eq!(t.events_for("aws-east", "ProvisioningRefused").len(), 1);

    // The spec changes: the refusal no longer stands and the node is asked for again.
    t.edit_pool(
        "aws-east",
        serde_json::json!({"candidateInstanceTypes": [
            {"instanceType": "m5.xlarge", "totalCapacity": 100, "totalCores": 16}
        ]}),
    )
    .await;
    t.pool_pass("aws-east").await.expect("the pool pass");
    let pool = t.stored_pool("aws-east").unwrap();
    assert_eq!(condition(&pool, "ProvisioningRefused").0, "False");
    assert_eq!(condition(&pool, "Ready").0, "True");
    t.bundle_pass("news")
        .await
        .expect("the pass after the edit");
    assert_eq!(t.creates(), 2);
    let (_, reason, _) = bundle_condition(&t.stored_bundle("news"), "Reconciling");
    assert_eq!(reason, "Provisioning");
}

#[tokio::test]
async fn a_node_ask_that_fails_is_repeated_only_after_a_back_off_that_grows_and_says_why() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t._sim.with_world(|w, _| w.unavailable_creates(3));
    t.bundle_of("news", 10, &["aws-east"]);
    t.bundle_pass("news").await.expect("the finalizer pass");

    t.bundle_pass("news")
        .await
        .expect("a failed ask is the bundle's state, not the pass's error");
    assert_eq!(t.creates(), 1);
    let (status, reason, message) = bundle_condition(&t.stored_bundle("news"), "Reconciling");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "ProvisioningRetrying")
    );
    assert!(
        message.contains("did not answer") && message.contains("asked again in"),
        "{message}"
    );

    // The first wait is 2-4 s (jitter), the second 4-8 s, the third 8-16 s.
    t.bundle_pass("news").await.expect("a pass at once");
    assert_eq!(t.creates(), 1, "not before the back-off ends");
    t.clock.advance(Duration::from_secs(4));
    t.bundle_pass("news").await.expect("after the first wait");
    assert_eq!(t.creates(), 2);
    t.clock.advance(Duration::from_secs(3));
    t.bundle_pass("news").await.expect("within the second wait");
    assert_eq!(t.creates(), 2, "the second wait is longer than the first");
    t.clock.advance(Duration::from_secs(5));
    t.bundle_pass("news").await.expect("after the second wait");
    assert_eq!(t.creates(), 3);
    t.clock.advance(Duration::from_secs(16));
    t.bundle_pass("news").await.expect("after the third wait");
    assert_eq!(t.creates(), 4, "Manager answers the fourth");
    let (_, reason, _) = bundle_condition(&t.stored_bundle("news"), "Reconciling");
    assert_eq!(reason, "Provisioning");
}

#[tokio::test]
async fn a_pool_whose_max_nodes_is_lowered_below_its_nodes_says_so_and_a_bundle_it_holds_back_names_max_nodes()
 {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    // Two bundles that cannot share an m5.xlarge (100): a node each.
    for name in ["a", "b"] {
        t.bundle_of(name, 60, &["aws-east"]);
        t.bundle_pass(name).await.expect("the finalizer pass");
        t.bundle_pass(name).await.expect("the provisioning pass");
        t.bundle_pass(name).await.expect("the pass onto its node");
    }
    assert_eq!(t.creates(), 2);

    t.edit_pool("aws-east", serde_json::json!({"maxNodes": 1}))
        .await;
    t.pool_pass("aws-east").await.expect("the pool pass");

    let pool = t.stored_pool("aws-east").unwrap();
    let (status, reason, message) = condition(&pool, "AtMaxNodes");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "AboveMaxNodes")
    );
    assert!(
        message.contains("2 nodes") && message.contains("maxNodes (1)"),
        "{message}"
    );
    assert_eq!(condition(&pool, "Stalled").1, "AboveMaxNodes");
    assert!(t.ctx.events.flush(BOUND).await);
    assert_eq!(t.events_for("aws-east", "AboveMaxNodes").len(), 1);

    t.bundle_of("c", 60, &["aws-east"]);
    t.bundle_pass("c").await.expect("the finalizer pass");
    t.bundle_pass("c").await.expect("the pass");

    assert_eq!(t.creates(), 2, "no node beyond maxNodes");
    let (status, reason, message) = bundle_condition(&t.stored_bundle("c"), "Stalled");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "MaxNodesReached")
    );
    assert!(
        message.contains("pool aws-east is above its maxNodes (1; it has 2 nodes)"),
        "{message}"
    );
    assert!(!message.contains("insufficientCapacity"), "{message}");
    assert!(t.ctx.events.flush(BOUND).await);
    let failed = t.events_for("c", "PlacementFailed");
    assert!(
        failed.len() == 1 && failed[0].contains("maxNodes"),
        "{failed:?}"
    );

    // A second pool pass says nothing new.
    t.pool_pass("aws-east").await.expect("the pool pass");
    assert!(t.ctx.events.flush(BOUND).await);
    assert_eq!(t.events_for("aws-east", "AboveMaxNodes").len(), 1);
}

#[tokio::test]
async fn a_pass_that_fails_says_why_in_the_bundles_conditions_and_waits_longer_each_time() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.bundle("news", 1, &["onprem"]);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.api
        .refuse_next(Method::PATCH, "/bundles/news/status", 500);

    let err = t
        .bundle_pass("news")
        .await
        .expect_err("the status write failed");

    let b = t.stored_bundle("news");
    let (status, reason, message) = bundle_condition(&b, "Reconciling");
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "RetryingAfterError")
    );
    assert!(message.contains("refused by the test"), "{message}");

    let waits: Vec<Duration> = (0..4)
        .map(|_| controllers::retry_delay(&t.ctx, &b, &err))
        .collect();
    assert!(waits.windows(2).all(|w| w[1] > w[0]), "{waits:?}");
    controllers::pass_succeeded(&t.ctx, &b);
    assert!(
        controllers::retry_delay(&t.ctx, &b, &err) < waits[1],
        "a success starts the back-off afresh"
    );

    t.bundle_pass("news").await.expect("the next pass");
    assert_eq!(
        t.stored_bundle("news").status.unwrap().phase,
        api::BundlePhase::Ready
    );
}

#[tokio::test]
async fn while_bundles_that_lost_jobs_queue_a_pass_starts_its_jobs_and_writes_its_status_after() {
    use automanager_policy::recovery_first::MAX_DEFER;
    use kube::runtime::reflector::ObjectRef;
    // One slot: one bundle waiting for a pass is a queue.
    let t = Tier::start(|c| c.concurrency.bundles = 1)
        .await
        .with_example_pools()
        .await;
    t.bundle("news", 1, &["onprem"]);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.api.clear_calls();
    // The mirror pump woke another bundle whose job failed; its pass has not begun.
    let waiting = ObjectRef::<Bundle>::new("recovering").within("live");
    let _ = (t.ctx.state).bundle_jobs_changed([(waiting.clone(), true)], t.ctx.clock.instant());

    t.bundle_pass("news").await.expect("the pass");

    assert_eq!(t.manager_jobs("news").len(), 1, "the start is made at once");
    assert_eq!(
        t.api.writes(),
        Vec::<String>::new(),
        "the status waits for the recovering bundle's pass"
    );
    t.bundle_pass("news")
        .await
        .expect("a pass while it still waits");
    assert_eq!(t.api.writes(), Vec::<String>::new());

    // Its pass begins: the status is written.
    t.ctx.state.begin_bundle_pass(&waiting);
    let _ = t.ctx.state.end_bundle_pass(&waiting, || false);
    let id = automanager_operator::mapping::bundle_id("live", "news");
    t.ctx
        .manager
        .wait_until(BOUND, |m| {
            m.jobs_of_bundle(&id)
                .all(|j| j.state() == manager_client::proto::JobState::Running)
        })
        .await
        .expect("the job runs");
    t.bundle_pass("news").await.expect("the pass after");
    assert_eq!(
        t.api.writes(),
        [
            format!("PATCH {BUNDLES}/news/status"),
            format!("POST {HISTORIES}")
        ],
        "the status, then the decision in the bundle's history"
    );
    assert_eq!(t.stored_bundle("news").status.unwrap().placed_replicas, 1);

    // A backlog that does not drain puts a status off for MAX_DEFER at most.
    t.bundle("late", 1, &["onprem"]);
    t.bundle_pass("late").await.expect("the finalizer pass");
    t.api.clear_calls();
    let _ = (t.ctx.state).bundle_jobs_changed([(waiting.clone(), true)], t.ctx.clock.instant());
    t.bundle_pass("late").await.expect("the pass");
    let id = automanager_operator::mapping::bundle_id("live", "late");
    t.ctx
        .manager
        .wait_until(BOUND, |m| {
            m.jobs_of_bundle(&id)
                .all(|j| j.state() == manager_client::proto::JobState::Running)
        })
        .await
        .expect("the job runs");
    t.bundle_pass("late")
        .await
        .expect("the pass with Ready to write");
    assert_eq!(t.api.writes(), Vec::<String>::new());
    t.clock.advance(MAX_DEFER);
    let _ = t.ctx.state.bundle_jobs_changed(
        [(ObjectRef::new("another").within("live"), true)],
        t.ctx.clock.instant(),
    );
    t.bundle_pass("late")
        .await
        .expect("the pass past the bound");
    assert_eq!(
        t.api.writes(),
        [
            format!("PATCH {BUNDLES}/late/status"),
            format!("POST {HISTORIES}")
        ],
        "the decision waited with the status"
    );
}

/// This package's directory, as cargo tells the running test: a test executable cargo finds
/// fresh may have been built in another checkout that shares the target dir, and the path
/// compiled into it would read that checkout's files.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
