//! The controller tier without an apiserver: each controller's pass called directly, on a context
//! whose Kubernetes client is an in-memory apiserver ([`tier::apiserver`]) that records every call
//! and refuses the ones a test scripts, with the in-process manager-sim as Manager and a fake
//! clock. Each test reads as: given these objects, one pass observed this, wrote these calls,
//! and left this status. The apiserver-backed suite (`controllers.rs`) stays for what only the
//! real apiserver shows (watches, admission, field ownership).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod tier;

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

const BOUND: Duration = Duration::from_secs(60);
const POOLS: &str = "/apis/automanager.norsk.io/v1alpha1/placementpools";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The in-memory apiserver, Manager (the demo's simulator) and a context on both.
struct Tier {
    api: MemoryApiserver,
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
        let manager = ManagerClient::over(
            InProcess::shared(sim.service()),
            &ClientConfig::new(sim.endpoint()),
        )
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
        t.ctx.state().model().pool("aws-east").is_some(),
        "loaded for placement"
    );
}

const BUNDLES: &str = "/apis/automanager.norsk.io/v1alpha1/namespaces/live/bundles";

impl Tier {
    /// Every example pool stored and passed once, so the placement model knows them.
    async fn with_example_pools(self) -> Tier {
        for name in ["aws-east", "aws-west", "oci-fra", "onprem"] {
            self.pool(name);
            self.pool_pass(name).await.expect("the pool pass");
        }
        self.api.clear_calls();
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
        controllers::bundle::reconcile(Arc::new(b), self.ctx.clone()).await
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

    assert_eq!(t.api.writes(), [format!("PATCH {BUNDLES}/news/status")]);
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

// ---- HotSpareTarget tiers ----

const SPARES: &str = "/apis/automanager.norsk.io/v1alpha1/hotsparetargets";

impl Tier {
    fn spare_target(&self, name: &str, spec: serde_json::Value) -> api::HotSpareTarget {
        self.api.insert(&api::HotSpareTarget::new(
            name,
            serde_json::from_value(spec).unwrap(),
        ))
    }

    async fn spare_pass(&self, name: &str) -> kube::runtime::controller::Action {
        let t = self
            .api
            .get::<api::HotSpareTarget>(None, name)
            .expect("the target is stored");
        controllers::hotspare::reconcile(Arc::new(t), self.ctx.clone())
            .await
            .expect("the spare pass")
    }

    fn spare_status(&self, name: &str) -> api::HotSpareTargetStatus {
        self.api
            .get::<api::HotSpareTarget>(None, name)
            .and_then(|t| t.status)
            .expect("a status")
    }

    /// The target's spares in Manager, by state.
    fn spares_in(&self, state: manager_proto::NodeState) -> Vec<String> {
        self._sim
            .snapshot()
            .nodes
            .into_iter()
            .filter(|n| {
                n.tags
                    .get("automanager.hot-spare-target")
                    .map(String::as_str)
                    == Some("tiers")
                    && n.state() == state
            })
            .map(|n| n.node_id)
            .collect()
    }

    /// Waits until the mirror shows `count` of the target's spares in `state`.
    async fn wait_spares(&self, state: manager_proto::NodeState, count: usize) {
        self.ctx
            .manager
            .wait_until(BOUND, |m| {
                m.nodes
                    .values()
                    .filter(|n| {
                        n.tags
                            .get("automanager.hot-spare-target")
                            .map(String::as_str)
                            == Some("tiers")
                            && n.state() == state
                    })
                    .count()
                    == count
            })
            .await
            .unwrap_or_else(|e| panic!("{count} spare(s) {state:?}: {e}"));
    }
}

#[tokio::test]
async fn warm_spares_are_made_by_create_then_stop_and_a_taken_hot_spare_is_refilled_by_starting_one()
 {
    use manager_proto::NodeState as N;
    let t = Tier::start_with_sim(
        |sim| {
            sim.timing.start_delay_ms = Some(100);
            sim.timing.stop_delay_ms = Some(50);
        },
        |_| {},
    )
    .await
    .with_example_pools()
    .await;
    t.spare_target(
        "tiers",
        serde_json::json!({
            "pool": "aws-east",
            "hot": {"count": 1},
            "warm": {"count": 1},
            "spec": {"instanceType": "m5.xlarge", "region": "eu-west-1"},
        }),
    );
    t.spare_pass("tiers").await; // the finalizer
    t.spare_pass("tiers").await;
    // One node per tier is asked for; both come up running.
    t.wait_spares(N::Started, 2).await;
    t.spare_pass("tiers").await;
    // The hot tier has one too many: it is stopped into the warm tier.
    t.wait_spares(N::PoweredOff, 1).await;
    t.spare_pass("tiers").await;
    let status = t.spare_status("tiers");
    assert_eq!(
        (
            status.live_spares,
            status.warm_spares,
            status.target_count,
            status.warm_target
        ),
        (1, 1, 1, 1)
    );
    let warm = find_condition(&status.conditions, "WarmTier").expect("a WarmTier condition");
    assert_eq!(warm.reason, "AtTarget");
    let stopped = t.spares_in(N::PoweredOff);
    let hot = t.spares_in(N::Started);

    // A recovery takes the hot spare.
    let taken = hot[0].clone();
    t._sim.with_world(|w, now| {
        w.register_bundle(
            &manager_proto::Bundle {
                bundle_id: "rescue".into(),
                replicas: 1,
                jobs: vec![manager_proto::BundleJob {
                    job_name: "enc".into(),
                    requirements: Some(manager_proto::JobRequirements {
                        required_capacity: 10.0,
                        required_cores: 1,
                        priority_band: "gold".into(),
                        ..Default::default()
                    }),
                    config: Vec::new(),
                }],
                ..Default::default()
            },
            now,
        )
        .unwrap();
        w.start_job("rescue/0/enc", &taken, 0, now).unwrap();
    });
    t.ctx
        .manager
        .wait_until(BOUND, |m| m.node_usage(&taken) != (0.0, 0))
        .await
        .expect("the mirror sees the job on the spare");
    t.spare_pass("tiers").await;
    // The warm spare is started (no node created for the hot tier) and a new warm one is made.
    t.ctx
        .manager
        .wait_until(BOUND, |m| {
            m.nodes
                .get(&stopped[0])
                .is_some_and(|n| matches!(n.state(), N::Starting | N::Started))
        })
        .await
        .expect("the warm spare starts");
    let status = t.spare_status("tiers");
    assert_eq!((status.warm_spares, status.pending_warm_spares), (0, 1));
    assert!(
        t.api
            .writes()
            .iter()
            .all(|w| w.starts_with(&format!("PATCH {SPARES}/tiers"))),
        "{:?}",
        t.api.writes()
    );
    // Both tiers settle again: the started spare is hot, the new node is stopped (the taken
    // node, still tagged, is the third one running).
    t.wait_spares(N::Started, 3).await;
    t.spare_pass("tiers").await;
    t.wait_spares(N::PoweredOff, 1).await;
    t.spare_pass("tiers").await;
    let status = t.spare_status("tiers");
    assert_eq!((status.live_spares, status.warm_spares), (1, 1));
}

#[tokio::test]
async fn a_schedule_raises_the_hot_tier_ahead_of_its_window() {
    let t = Tier::start_with_sim(|sim| sim.timing.start_delay_ms = Some(100), |_| {})
        .await
        .with_example_pools()
        .await;
    // The clock stands at 2026-03-01 12:00 UTC, a Sunday; the schedule opens at 12:00 on
    // Sundays in UTC+1 (11:00 UTC), so it is open now for another half hour.
    t.spare_target(
        "tiers",
        serde_json::json!({
            "pool": "aws-east",
            "targetCount": 1,
            "schedules": [{"schedule": "0 12 * * SUN", "duration": "90m", "timeZone": "Europe/Oslo", "hot": {"count": 3}}],
            "spec": {"instanceType": "m5.xlarge", "region": "eu-west-1"},
        }),
    );
    t.spare_pass("tiers").await;
    t.spare_pass("tiers").await;
    let status = t.spare_status("tiers");
    assert_eq!(status.target_count, 3);
    assert_eq!(status.active_schedules, vec!["0 12 * * SUN".to_owned()]);
    assert_eq!(
        status.next_schedule_change.map(|t| t.to_rfc3339()),
        Some("2026-03-01T12:30:00+00:00".to_owned())
    );
    // After the window the base size applies again.
    t.clock.advance(Duration::from_secs(31 * 60));
    t.spare_pass("tiers").await;
    let status = t.spare_status("tiers");
    assert_eq!(status.target_count, 1);
    assert!(status.active_schedules.is_empty());
}

// ---- reclaim notices ----

#[tokio::test]
async fn a_reclaim_notice_moves_the_nodes_jobs_by_their_strategy_before_the_deadline() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    let mut b = Bundle::new(
        "news",
        serde_json::from_value(serde_json::json!({
            "replicas": 2,
            "pools": ["onprem"],
            "jobs": [{"jobName": "enc", "migration": {"strategy": "overlap"},
                      "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": "gold"}}],
        }))
        .unwrap(),
    );
    b.metadata.namespace = Some("live".into());
    t.api.insert(&b);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    let status = t.stored_bundle("news").status.expect("a status");
    let noticed = status.replicas[0].jobs[0]
        .node_id
        .clone()
        .expect("replica 0 is placed");
    t._sim.with_world(|w, now| {
        w.notice_node(&noticed, 120_000, "maintenance", now)
            .unwrap();
    });
    t.ctx
        .manager
        .wait_until(BOUND, |m| m.noticed_nodes().any(|n| n.node_id == noticed))
        .await
        .expect("the mirror shows the notice");
    t.api.clear_calls();

    let mut told = std::collections::HashMap::new();
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("the reclaim pass");

    let created = kube::Api::<api::Migration>::namespaced(t.api.client(), "live")
        .list(&Default::default())
        .await
        .expect("the Migrations")
        .items;
    assert_eq!(created.len(), 1, "{:?}", t.api.writes());
    let m = &created[0];
    assert_eq!(m.spec.job.replica, 0);
    assert_eq!(m.spec.strategy, Some(api::MigrationStrategy::Overlap));
    assert_eq!(
        m.labels().get(api::PURPOSE_LABEL).map(String::as_str),
        Some("reclaim")
    );
    assert!(
        told.get(&noticed)
            .is_some_and(|s| s.contains("1 job(s) moving now"))
    );
    // A second pass finds its Migration and asks for nothing more.
    t.api.clear_calls();
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("the second pass");
    assert!(
        !t.api
            .calls()
            .iter()
            .any(|c| c.method == Method::POST && c.path.ends_with("/migrations")),
        "{:?}",
        t.api.writes()
    );
}

#[tokio::test]
async fn a_gold_recovery_with_no_room_starts_a_warm_spare_instead_of_provisioning() {
    use manager_proto::NodeState as N;
    let t = Tier::start_with_sim(
        |sim| {
            sim.timing.start_delay_ms = Some(100);
            sim.timing.stop_delay_ms = Some(50);
        },
        |_| {},
    )
    .await
    .with_example_pools()
    .await;
    // Node changes reach the placement model through the mirror pump, as in the operator.
    let pump = tokio::spawn(automanager_operator::runtime::run_mirror_pump(
        t.ctx.clone(),
    ));
    t.spare_target(
        "tiers",
        serde_json::json!({
            "pool": "aws-east",
            "hot": {"count": 0},
            "warm": {"count": 1},
            "spec": {"instanceType": "m5.xlarge", "region": "eu-west-1"},
        }),
    );
    t.spare_pass("tiers").await;
    t.spare_pass("tiers").await;
    t.wait_spares(N::Started, 1).await;
    t.spare_pass("tiers").await;
    t.wait_spares(N::PoweredOff, 1).await;
    let warm = t.spares_in(N::PoweredOff)[0].clone();

    // A gold bundle on aws-east: its first placement provisions a node of its own.
    t.bundle("match", 1, &["aws-east"]);
    t.bundle_pass("match").await.expect("the finalizer pass");
    t.bundle_pass("match").await.expect("the provisioning pass");
    t.ctx
        .manager
        .wait_until(BOUND, |m| {
            m.nodes
                .values()
                .any(|n| n.pool == "aws-east" && n.state() == N::Started && !mapping_spare(n))
        })
        .await
        .expect("the bundle's node is up");
    t.bundle_pass("match").await.expect("the placing pass");
    let jobs = t.manager_jobs("match");
    assert_eq!(jobs.len(), 1, "the job is placed");
    let node = t
        ._sim
        .snapshot()
        .jobs
        .into_iter()
        .find(|j| j.job_id == jobs[0])
        .unwrap()
        .node_id;

    // Its node dies: the recovery finds no room and no hot spare.
    let before = t._sim.snapshot().nodes.len();
    t._sim.with_world(|w, now| w.kill_node(&node, now).unwrap());
    t.ctx
        .manager
        .wait_until(BOUND, |m| {
            m.nodes
                .get(&node)
                .is_some_and(|n| n.state() == N::Terminated)
        })
        .await
        .expect("the mirror sees the loss");
    t.bundle_pass("match").await.expect("the recovery pass");
    t.ctx
        .manager
        .wait_until(BOUND, |m| {
            m.nodes
                .get(&warm)
                .is_some_and(|n| matches!(n.state(), N::Starting | N::Started))
        })
        .await
        .expect("the warm spare is started");
    assert_eq!(
        t._sim.snapshot().nodes.len(),
        before,
        "no node was created for the recovery"
    );
    t.wait_spares(N::Started, 1).await;
    // Its target passes first: the started spare is the recovery's, not a surplus hot spare to
    // stop again (the target makes a new warm spare instead).
    t.spare_pass("tiers").await;
    assert!(
        t.spares_in(N::Started).contains(&warm),
        "the claimed spare keeps running"
    );
    t.bundle_pass("match")
        .await
        .expect("the pass after the spare is up");
    let placed_on = t
        ._sim
        .snapshot()
        .jobs
        .into_iter()
        .find(|j| j.job_id == jobs[0])
        .map(|j| j.node_id);
    assert_eq!(
        placed_on,
        Some(warm),
        "the gold job restarted on the warm spare"
    );
    pump.abort();
}

fn mapping_spare(n: &manager_proto::Node) -> bool {
    n.tags.get("spare").is_some_and(|v| v == "true")
}
