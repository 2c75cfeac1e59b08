//! The controller tier: the operator's controllers, in process, against a real kube-apiserver
//! (testenv) and an in-process manager-sim, without the operator binary or the whole stack.
//! Objects are built from `automanager-api` types and their status is read typed.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{
    Bundle, BundlePhase, BundleSpec, JobState, ManagerNode, PlacementPool, PriorityBand,
};
use automanager_operator::config::OperatorConfig;
use automanager_operator::controllers::Context;
use automanager_operator::metrics::Metrics;
use automanager_operator::runtime::run_controllers;
use automanager_operator::settings::Settings;
use futures::FutureExt;
use kube::CustomResourceExt;
use kube::api::{Api, PostParams};
use manager_client::{ClientConfig, ManagerClient};
use manager_sim::config::SimConfig;
use manager_sim::server::{Sim, SimHandle};
use tokio::sync::oneshot;

/// Upper bound of any wait here; generous because the machine is shared.
const BOUND: Duration = Duration::from_secs(90);

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The control plane, Manager and the controllers, running until dropped.
struct Harness {
    env: testenv::TestEnv,
    sim: SimHandle,
    settings: Settings,
    ctx: Arc<Context>,
    stop: Option<oneshot::Sender<()>>,
    controllers: tokio::task::JoinHandle<()>,
}

/// A fresh operator process's in-memory start: a new Manager client (its own mirror) and a new
/// context (empty state, metrics from zero), with the controllers running until `stop` fires.
async fn start_operator(
    client: kube::Client,
    endpoint: String,
    settings: Settings,
    identity: &str,
) -> (
    Arc<Context>,
    oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let manager = ManagerClient::connect(ClientConfig::new(endpoint))
        .await
        .expect("Manager client");
    manager.wait_ready(BOUND).await.expect("mirror synced");
    let ctx = Context::new(client, manager, settings, Metrics::new(), identity);
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    }
    .shared();
    let controllers = tokio::spawn(run_controllers(ctx.clone(), shutdown));
    (ctx, stop, controllers)
}

impl Harness {
    /// `None` when the control plane binaries are missing and the run asked to skip.
    async fn start(config: impl FnOnce(&mut OperatorConfig)) -> Option<Harness> {
        match testenv::control_plane_available() {
            Ok(true) => {}
            Ok(false) => return None,
            Err(e) => panic!("{e}"),
        }
        let env = testenv::TestEnv::start().await.expect("control plane");
        let client = env.client();
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(client.clone());
        for crd in automanager_api::crd::all() {
            crds.create(&PostParams::default(), &crd)
                .await
                .expect("CRD");
        }
        env.wait_for_crds_established(
            [
                Bundle::crd_name(),
                PlacementPool::crd_name(),
                ManagerNode::crd_name(),
                automanager_api::HotSpareTarget::crd_name(),
                automanager_api::Migration::crd_name(),
            ],
            BOUND,
        )
        .await
        .expect("CRDs established");

        let sim_yaml =
            std::fs::read_to_string(repo().join("deploy/demo/manager-sim.yaml")).unwrap();
        let sim = Sim::start(SimConfig::from_yaml(&sim_yaml).unwrap())
            .await
            .expect("manager-sim");
        let mut cfg = OperatorConfig::default();
        cfg.manager.url = sim.endpoint();
        cfg.status_write_interval = Duration::from_millis(100);
        config(&mut cfg);
        let settings = Settings::from_config(&cfg);
        let pools: Vec<PlacementPool> = serde_saphyr::from_multiple(
            &std::fs::read_to_string(repo().join("examples/pools.yaml")).unwrap(),
        )
        .unwrap();
        let api: Api<PlacementPool> = Api::all(client.clone());
        for p in pools {
            api.create(&PostParams::default(), &p).await.expect("pool");
        }
        let (ctx, stop, controllers) =
            start_operator(client, sim.endpoint(), settings.clone(), "controller-tests").await;
        Some(Harness {
            env,
            sim,
            settings,
            ctx,
            stop: Some(stop),
            controllers,
        })
    }

    /// Stops the controllers and starts them again with nothing kept in memory, as an operator
    /// restart (or a new leader) does.
    async fn restart_operator(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), &mut self.controllers).await;
        let (ctx, stop, controllers) = start_operator(
            self.env.client(),
            self.sim.endpoint(),
            self.settings.clone(),
            "controller-tests-restarted",
        )
        .await;
        self.ctx = ctx;
        self.stop = Some(stop);
        self.controllers = controllers;
    }

    fn bundles(&self) -> Api<Bundle> {
        Api::namespaced(self.env.client(), "default")
    }

    async fn create(&self, name: &str, spec: BundleSpec) {
        self.bundles()
            .create(&PostParams::default(), &Bundle::new(name, spec))
            .await
            .expect("bundle");
    }

    /// Waits until bundle `name` satisfies `ok`, and returns it.
    async fn wait_bundle(&self, name: &str, what: &str, ok: impl Fn(&Bundle) -> bool) -> Bundle {
        let deadline = tokio::time::Instant::now() + BOUND;
        loop {
            if let Some(b) = self.bundles().get_opt(name).await.unwrap()
                && ok(&b)
            {
                return b;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {name}: {what}\n{:#?}",
                self.bundles()
                    .get_opt(name)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|b| b.status)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), &mut self.controllers).await;
        self.sim.shutdown().await;
        let _ = self.env.stop();
    }
}

fn spec(replicas: i32, pools: &[&str], band: PriorityBand, extra: serde_json::Value) -> BundleSpec {
    let mut v = serde_json::json!({
        "replicas": replicas,
        "pools": pools,
        "jobs": [{"jobName": "enc", "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": band}}],
    });
    if let (Some(v), Some(extra)) = (v.as_object_mut(), extra.as_object()) {
        v.extend(extra.clone());
    }
    serde_json::from_value(v).unwrap()
}

fn phase(b: &Bundle) -> BundlePhase {
    b.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

fn restarts(b: &Bundle) -> i32 {
    b.status
        .as_ref()
        .and_then(|s| s.replicas.first())
        .map_or(-1, |r| r.restarts_last_hour)
}

fn job_running(b: &Bundle) -> bool {
    b.status
        .as_ref()
        .and_then(|s| s.replicas.first())
        .and_then(|r| r.jobs.first())
        .is_some_and(|j| j.state == JobState::Running)
}

#[tokio::test]
async fn a_bundle_is_placed_with_the_job_ids_manager_gave_it() {
    let Some(h) = Harness::start(|_| {}).await else {
        return;
    };
    h.create(
        "news",
        spec(2, &["onprem"], PriorityBand::Gold, serde_json::json!({})),
    )
    .await;
    let b = h
        .wait_bundle("news", "Ready", |b| phase(b) == BundlePhase::Ready)
        .await;
    let status = b.status.unwrap();
    assert_eq!(status.placed_replicas, 2);
    let ids: Vec<String> = status
        .replicas
        .iter()
        .flat_map(|r| r.jobs.iter().filter_map(|j| j.job_id.clone()))
        .collect();
    // The ids are Manager's: the sim's world knows every one of them.
    for id in &ids {
        assert!(
            h.sim.with_world(|w, _| w.job(id).is_some()),
            "{id} is not a job Manager knows"
        );
    }
    let nodes: Vec<String> = status
        .replicas
        .iter()
        .filter_map(|r| r.jobs.first().and_then(|j| j.node_id.clone()))
        .collect();
    assert_eq!(nodes.len(), 2);
    assert_ne!(
        nodes[0], nodes[1],
        "replicas on different nodes (hard rule)"
    );
    h.shutdown().await;
}

#[tokio::test]
async fn a_restart_count_clears_after_restart_clear_after_and_the_ceiling_starts_over() {
    let Some(h) = Harness::start(|c| {
        c.bands.gold.restart_clear_after = Duration::from_secs(2);
    })
    .await
    else {
        return;
    };
    h.create(
        "flaky",
        spec(
            1,
            &["onprem"],
            PriorityBand::Gold,
            serde_json::json!({"bands": {"gold": {"maxRestartsPerHour": 2}}}),
        ),
    )
    .await;
    h.wait_bundle("flaky", "Ready", |b| phase(b) == BundlePhase::Ready)
        .await;
    let job = "default.flaky/0/enc";
    let fail = || {
        h.sim
            .with_world(|w, now| w.fail_job(job, "test", now).map(drop))
            .unwrap();
    };
    fail();
    h.wait_bundle("flaky", "restarted once", |b| {
        restarts(b) == 1 && job_running(b)
    })
    .await;
    // Running for restartClearAfter (2 s) clears the count: the restart succeeded.
    h.wait_bundle("flaky", "its count cleared", |b| restarts(b) == 0)
        .await;
    // So the ceiling of 2 starts over: two more restarts, then Broken on the third.
    fail();
    h.wait_bundle("flaky", "restart 1 of 2", |b| {
        restarts(b) == 1 && job_running(b)
    })
    .await;
    fail();
    h.wait_bundle("flaky", "restart 2 of 2", |b| {
        restarts(b) == 2 && job_running(b)
    })
    .await;
    fail();
    let b = h
        .wait_bundle("flaky", "Broken", |b| phase(b) == BundlePhase::Broken)
        .await;
    assert_eq!(restarts(&b), 2);
    h.shutdown().await;
}

#[tokio::test]
async fn refused_starts_mark_the_node_unhealthy_and_placement_goes_elsewhere() {
    let Some(h) = Harness::start(|c| {
        c.node_health.rejection_threshold = 3;
        c.node_health.rejection_window = Duration::from_secs(300);
    })
    .await
    else {
        return;
    };
    // The next three starts are refused: binpack keeps choosing the same on-prem node until
    // the third refusal marks it unhealthy; the fourth start lands on another node.
    h.sim.with_world(|w, _| w.reject_next(3));
    h.create(
        "picky",
        spec(1, &["onprem"], PriorityBand::Silver, serde_json::json!({})),
    )
    .await;
    let b = h
        .wait_bundle("picky", "Ready", |b| phase(b) == BundlePhase::Ready)
        .await;
    let node = b.status.unwrap().replicas[0].jobs[0]
        .node_id
        .clone()
        .unwrap();
    let unhealthy: Vec<String> = h.ctx.state().health.unhealthy_nodes(chrono::Utc::now());
    assert_eq!(unhealthy.len(), 1, "{unhealthy:?}");
    assert_ne!(unhealthy[0], node, "placement avoided the unhealthy node");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.env.client());
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let list = events.list(&Default::default()).await.unwrap();
        if list.items.iter().any(|e| {
            e.reason.as_deref() == Some("NodeUnhealthy")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                    == Some(unhealthy[0].as_str())
        }) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no NodeUnhealthy Event"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let node_obj: Api<ManagerNode> = Api::all(h.env.client());
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let n = node_obj.get_opt(&unhealthy[0]).await.unwrap();
        if n.as_ref()
            .and_then(|n| n.status.as_ref())
            .is_some_and(|s| !s.healthy)
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "ManagerNode {} never showed healthy: false",
            unhealthy[0]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    h.shutdown().await;
}

/// Every Bundle, ManagerNode and PlacementPool and every Event, by kind and name, with its
/// resourceVersion: any write changes it.
async fn versions(h: &Harness) -> std::collections::BTreeMap<String, String> {
    async fn of<K>(api: Api<K>, kind: &str, out: &mut std::collections::BTreeMap<String, String>)
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        for o in api.list_metadata(&Default::default()).await.unwrap().items {
            out.insert(
                format!("{kind}/{}", o.metadata.name.unwrap_or_default()),
                o.metadata.resource_version.unwrap_or_default(),
            );
        }
    }
    let c = h.env.client();
    let mut out = std::collections::BTreeMap::new();
    of(Api::<Bundle>::all(c.clone()), "Bundle", &mut out).await;
    of(Api::<ManagerNode>::all(c.clone()), "ManagerNode", &mut out).await;
    of(
        Api::<PlacementPool>::all(c.clone()),
        "PlacementPool",
        &mut out,
    )
    .await;
    of(
        Api::<k8s_openapi::api::events::v1::Event>::all(c),
        "Event",
        &mut out,
    )
    .await;
    out
}

/// Waits until nothing has been written for `quiet`; returns the versions then.
async fn settled(h: &Harness, quiet: Duration) -> std::collections::BTreeMap<String, String> {
    let deadline = tokio::time::Instant::now() + BOUND;
    let mut last = versions(h).await;
    loop {
        tokio::time::sleep(quiet).await;
        let now = versions(h).await;
        if now == last {
            return now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "writes never stopped"
        );
        last = now;
    }
}

fn bundle_reconciles(ctx: &Context) -> f64 {
    ctx.metrics
        .encode()
        .lines()
        .filter(|l| {
            l.starts_with("automanager_reconcile_duration_seconds_count{")
                && l.contains("controller=\"bundle\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn a_restarted_operator_with_nothing_changed_writes_nothing_and_asks_manager_for_nothing() {
    let Some(mut h) = Harness::start(|_| {}).await else {
        return;
    };
    h.create(
        "steady",
        spec(2, &["onprem"], PriorityBand::Gold, serde_json::json!({})),
    )
    .await;
    h.create(
        "calm",
        spec(1, &["onprem"], PriorityBand::Silver, serde_json::json!({})),
    )
    .await;
    for name in ["steady", "calm"] {
        h.wait_bundle(name, "Ready", |b| phase(b) == BundlePhase::Ready)
            .await;
    }
    // Node usage is written at most every 2 s per node: let the last of it land.
    let before = settled(&h, Duration::from_secs(3)).await;
    assert!(
        before.keys().any(|k| k.starts_with("ManagerNode/")),
        "the nodes were mirrored"
    );
    let calls = h.sim.call_counts().mutating;

    h.restart_operator().await;
    // Every bundle looked at again, and time for many node-sync passes (100 ms apart).
    let deadline = tokio::time::Instant::now() + BOUND;
    while bundle_reconciles(&h.ctx) < 2.0 {
        assert!(tokio::time::Instant::now() < deadline, "no reconcile");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    let after = versions(&h).await;
    let changed: Vec<&String> = after
        .iter()
        .filter(|(k, v)| before.get(*k) != Some(*v))
        .map(|(k, _)| k)
        .collect();
    assert!(
        changed.is_empty(),
        "written or created after the restart: {changed:?}"
    );
    assert_eq!(
        h.sim.call_counts().mutating,
        calls,
        "Manager was asked to change something: {:?}",
        h.sim.call_counts().calls
    );
    h.shutdown().await;
}
