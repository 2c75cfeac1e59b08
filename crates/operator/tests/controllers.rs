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
use kube::api::{Api, PostParams};
use kube::{CustomResourceExt, ResourceExt};
use manager_client::{ClientConfig, ManagerClient};
use manager_sim::config::SimConfig;
use manager_sim::server::{Sim, SimHandle};
use tokio::sync::oneshot;

/// Upper bound of any wait here; generous because the machine is shared.
const BOUND: Duration = Duration::from_secs(90);

fn repo() -> PathBuf {
    package_dir().join("../..")
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
    let ctx = Context::new(
        client,
        manager,
        settings,
        Metrics::new(),
        automanager_operator::clock::SystemClock::shared(),
        identity,
    );
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
async fn a_bundle_status_write_from_a_stale_view_is_refused_and_changes_nothing() {
    let Some(h) = Harness::start(|_| {}).await else {
        return;
    };
    h.create(
        "kept",
        spec(1, &["onprem"], PriorityBand::Gold, serde_json::json!({})),
    )
    .await;
    let read = h
        .wait_bundle("kept", "Ready", |b| phase(b) == BundlePhase::Ready)
        .await;
    let rv = read.metadata.resource_version.clone();
    let mut newer = read.status.clone().unwrap();
    newer.replicas[0].restart_times = vec![chrono::Utc::now()];
    newer.replicas[0].restarts_last_hour = 1;
    // A writer at the version it read wins; a second one from the same (now stale) read loses.
    automanager_operator::controllers::apply_status_if(&h.bundles(), "kept", rv.as_deref(), &newer)
        .await
        .expect("a write at the current version");
    let stale = read.status.clone().unwrap();
    let err = automanager_operator::controllers::apply_status_if(
        &h.bundles(),
        "kept",
        rv.as_deref(),
        &stale,
    )
    .await
    .expect_err("a write from a stale view");
    assert!(
        automanager_operator::controllers::is_conflict(&err),
        "{err}"
    );
    let now = h.bundles().get("kept").await.unwrap();
    assert_eq!(
        now.status.unwrap().replicas[0].restart_times,
        newer.replicas[0].restart_times
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
    let unhealthy: Vec<String> = h.ctx.state.unhealthy_nodes(chrono::Utc::now());
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

#[tokio::test]
async fn a_job_config_reaches_manager_and_a_change_is_pushed_without_a_restart() {
    let Some(h) = Harness::start(|_| {}).await else {
        return;
    };
    let with_config = |config: serde_json::Value| -> BundleSpec {
        serde_json::from_value(serde_json::json!({
            "replicas": 1,
            "pools": ["onprem"],
            "jobs": [{"jobName": "enc", "config": config,
                      "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": "silver"}}],
        }))
        .unwrap()
    };
    let digest_of = |b: &Bundle| {
        b.status
            .as_ref()
            .and_then(|s| s.replicas.first())
            .and_then(|r| r.jobs.first())
            .map(|j| (j.config_digest.clone(), j.config_applied))
    };
    h.create("tuned", with_config(serde_json::json!({"bitrate": 5000})))
        .await;
    let b = h
        .wait_bundle("tuned", "Ready with its config applied", |b| {
            phase(b) == BundlePhase::Ready
                && digest_of(b).is_some_and(|(d, a)| d.is_some() && a == Some(true))
        })
        .await;
    let first_digest = digest_of(&b).unwrap().0.unwrap();
    let job = "default.tuned/0/enc";
    let (config, started) = h.sim.with_world(|w, _| {
        let j = w.job(job).unwrap();
        (j.config.clone(), j.instances.first().unwrap().started_at_ms)
    });
    assert_eq!(
        config,
        br#"{"bitrate":5000}"#.to_vec(),
        "registered with the bundle"
    );
    assert_eq!(
        automanager_api::config_digest(&config).as_deref(),
        Some(first_digest.as_str())
    );

    // A change reaches the running job without a restart.
    let mut changed = h.bundles().get("tuned").await.unwrap();
    changed.spec.jobs[0].config = Some(automanager_api::JobConfig::from_value(
        &serde_json::json!({"bitrate": 8000}),
    ));
    h.bundles()
        .replace("tuned", &PostParams::default(), &changed)
        .await
        .unwrap();
    let b = h
        .wait_bundle("tuned", "the new config applied", |b| {
            digest_of(b).is_some_and(|(d, a)| {
                d.as_deref().is_some_and(|d| d != first_digest) && a == Some(true)
            })
        })
        .await;
    let (config, instances, state) = h.sim.with_world(|w, _| {
        let j = w.job(job).unwrap();
        (
            j.config.clone(),
            j.instances
                .iter()
                .map(|i| i.started_at_ms)
                .collect::<Vec<_>>(),
            j.state,
        )
    });
    assert_eq!(config, br#"{"bitrate":8000}"#.to_vec());
    assert_eq!(instances, vec![started], "the same instance, not restarted");
    assert_eq!(state, manager_proto::JobState::Running as i32);
    assert!(job_running(&b));

    // A configuration larger than Manager takes stalls the bundle with the reason; nothing is
    // registered for it.
    let big = "x".repeat(automanager_api::MAX_JOB_CONFIG_BYTES);
    h.create("huge", with_config(serde_json::json!({"blob": big})))
        .await;
    let b = h
        .wait_bundle("huge", "stalled on its config", |b| {
            b.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Stalled"
                        && c.status == automanager_api::ConditionStatus::True
                        && c.reason == "InvalidConfig"
                })
            })
        })
        .await;
    let message = b
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Stalled")
        .unwrap()
        .message;
    assert!(message.contains("jobs[enc].config"), "{message}");
    assert!(
        h.sim
            .with_world(|w, _| w.job("default.huge/0/enc").is_none())
    );

    // A config nested past what serde_json decodes as a value (128 levels) is answered in its
    // own status, and the Bundle watch keeps decoding: a Bundle created after it still runs.
    let mut deep = serde_json::json!(1);
    for _ in 0..200 {
        deep = serde_json::json!({ "a": deep });
    }
    h.create("deep", with_config(deep)).await;
    let b = h
        .wait_bundle("deep", "stalled on its config's depth", |b| {
            b.status.as_ref().is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == "Stalled"
                        && c.status == automanager_api::ConditionStatus::True
                        && c.reason == "InvalidConfig"
                })
            })
        })
        .await;
    let stalled = b.status.unwrap().conditions;
    let message = &stalled
        .iter()
        .find(|c| c.type_ == "Stalled")
        .unwrap()
        .message;
    assert!(message.contains("200 levels deep"), "{message}");
    h.create("after-deep", with_config(serde_json::json!({"bitrate": 1})))
        .await;
    let b = h.wait_bundle("after-deep", "running", job_running).await;
    assert!(job_running(&b));
    h.shutdown().await;
}

#[tokio::test]
async fn the_orphan_sweep_removes_manager_work_whose_resource_is_gone_and_nothing_else() {
    let Some(h) = Harness::start(|c| {
        c.orphan_sweep.interval = Duration::from_millis(200);
        c.orphan_sweep.grace = Duration::from_secs(2);
    })
    .await
    else {
        return;
    };
    // A live Bundle (registered by its controller) and, beside it, Manager work nobody owns: a
    // bundle registered as if its object had been deleted behind the operator's back, a spare of
    // a HotSpareTarget that is gone, and a node the operator did not create.
    h.create(
        "alive",
        spec(1, &["onprem"], PriorityBand::Silver, serde_json::json!({})),
    )
    .await;
    h.wait_bundle("alive", "Ready", |b| phase(b) == BundlePhase::Ready)
        .await;
    let ghost = manager_proto::Bundle {
        bundle_id: "default.ghost".into(),
        replicas: 1,
        jobs: vec![manager_proto::BundleJob {
            job_name: "enc".into(),
            requirements: Some(manager_proto::JobRequirements {
                required_capacity: 10.0,
                required_cores: 1,
                required_capabilities: vec![],
                priority_band: "silver".into(),
            }),
            config: vec![],
            template: Vec::new(),
        }],
        ..Default::default()
    };
    h.ctx.manager.register_bundle(ghost).await.unwrap();
    let node = |tags: &[(&str, &str)]| manager_proto::CreateNodeRequest {
        request_id: String::new(),
        pool: "aws-east".into(),
        provider: manager_proto::ProviderKind::Aws as i32,
        region: "eu-west-1".into(),
        instance_type: "m5.xlarge".into(),
        zone: "eu-west-1a".into(),
        tags: tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    };
    let orphan_spare = h
        .ctx
        .manager
        .create_node(node(&[
            ("spare", "true"),
            ("automanager.hot-spare-target", "deleted-target"),
        ]))
        .await
        .unwrap()
        .node_id;
    let hand_made = h.ctx.manager.create_node(node(&[])).await.unwrap().node_id;

    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let (ghost_gone, spare_gone) = h.sim.with_world(|w, _| {
            (
                w.job("default.ghost/0/enc").is_none(),
                w.node(&orphan_spare)
                    .is_some_and(|n| n.state == manager_proto::NodeState::Terminated as i32),
            )
        });
        if ghost_gone && spare_gone {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sweep left ghost={ghost_gone} spare={spare_gone}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // What has an owner, or was never the operator's, is untouched.
    h.sim.with_world(|w, _| {
        assert!(w.job("default.alive/0/enc").is_some());
        assert_eq!(
            w.node(&hand_made).map(|n| n.state),
            Some(manager_proto::NodeState::Started as i32)
        );
    });
    let b = h.bundles().get("alive").await.unwrap();
    assert_eq!(phase(&b), BundlePhase::Ready);
    // Each removal is an Event on the owner that is gone, and a count.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.env.client());
    let deadline = tokio::time::Instant::now() + BOUND;
    loop {
        let list = events.list(&Default::default()).await.unwrap();
        let on = |name: &str| {
            list.items.iter().any(|e| {
                e.reason.as_deref() == Some("OrphanRemoved")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
        };
        if on("ghost") && on(&orphan_spare) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no OrphanRemoved Events"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let metrics = h.ctx.metrics.encode();
    assert!(
        metrics.contains("automanager_orphans_removed_total{kind=\"bundle\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("automanager_orphans_removed_total{kind=\"node\"} 1"),
        "{metrics}"
    );
    h.shutdown().await;
}

/// Waits until pool `name` (absent: `None`) satisfies `ok`, and returns it.
async fn wait_pool(
    pools: &Api<PlacementPool>,
    name: &str,
    what: &str,
    ok: impl Fn(Option<&PlacementPool>) -> bool,
) -> Option<PlacementPool> {
    let until = tokio::time::Instant::now() + BOUND;
    loop {
        let p = pools.get_opt(name).await.unwrap();
        if ok(p.as_ref()) {
            return p;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "timed out: {what}: {p:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The pool's `Stalled` condition, if it is True.
fn stalled(p: &PlacementPool) -> Option<(String, String)> {
    p.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == "Stalled" && c.status == automanager_api::ConditionStatus::True)
        .map(|c| (c.reason.clone(), c.message.clone()))
}

#[tokio::test]
async fn a_pool_in_use_is_not_deleted_until_its_bundles_and_spare_targets_are_gone() {
    let Some(h) = Harness::start(|_| {}).await else {
        return;
    };
    let pools: Api<PlacementPool> = Api::all(h.env.client());
    // Every pool carries the finalizer once the controller has seen it.
    wait_pool(&pools, "aws-east", "finalizer", |p| {
        p.is_some_and(|p| {
            p.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == automanager_api::POOL_FINALIZER)
        })
    })
    .await;
    // A gold bundle listing the pool second, one naming it in a replica override, and a spare target.
    h.create(
        "news",
        spec(
            1,
            &["onprem", "aws-east"],
            PriorityBand::Gold,
            serde_json::json!({}),
        ),
    )
    .await;
    h.create(
        "sport",
        spec(
            2,
            &["onprem"],
            PriorityBand::Silver,
            serde_json::json!({"replicaOverrides": [{"replica": 1, "pools": ["aws-east"]}]}),
        ),
    )
    .await;
    let target: automanager_api::HotSpareTarget = serde_json::from_value(serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "HotSpareTarget",
        "metadata": {"name": "east-spares"},
        "spec": {"pool": "aws-east", "targetCount": 0, "spec": {"instanceType": "m5.xlarge", "region": "eu-west-1"}},
    }))
    .unwrap();
    let targets: Api<automanager_api::HotSpareTarget> = Api::all(h.env.client());
    targets
        .create(&PostParams::default(), &target)
        .await
        .expect("spare target");

    pools
        .delete("aws-east", &Default::default())
        .await
        .expect("delete");
    let p = wait_pool(&pools, "aws-east", "InUse naming all three users", |p| {
        p.and_then(stalled).is_some_and(|(reason, m)| {
            reason == "InUse"
                && m.contains("Bundle default/news")
                && m.contains("Bundle default/sport")
                && m.contains("HotSpareTarget east-spares")
        })
    })
    .await
    .expect("still there");
    assert!(p.metadata.deletion_timestamp.is_some());
    // Still in the placement model: the bundles that name it keep recovering into it.
    assert!(h.ctx.state.pool_spec("aws-east").is_some());
    // Events are queued off the reconcile path: wait until the queue is published.
    assert!(h.ctx.events.flush(BOUND).await);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(h.env.client());
    let blocked = events.list(&Default::default()).await.unwrap();
    assert!(
        blocked
            .items
            .iter()
            .any(|e| e.reason.as_deref() == Some("DeletionBlocked")
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("Bundle default/news"))),
        "a DeletionBlocked Event naming the users"
    );

    // The users go one by one; the message follows, and the pool goes with the last.
    h.bundles()
        .delete("news", &Default::default())
        .await
        .unwrap();
    h.bundles()
        .delete("sport", &Default::default())
        .await
        .unwrap();
    wait_pool(&pools, "aws-east", "only the spare target left", |p| {
        p.and_then(stalled)
            .is_some_and(|(_, m)| !m.contains("Bundle") && m.contains("HotSpareTarget east-spares"))
    })
    .await;
    targets
        .delete("east-spares", &Default::default())
        .await
        .unwrap();
    wait_pool(&pools, "aws-east", "the pool gone", |p| p.is_none()).await;
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
async fn a_recovery_whose_jobs_run_within_moments_is_one_pass() {
    // The sim runs a started job 20 ms after the start: the pass that restarts the replica
    // waits for that and writes Ready itself, and the `Running` change it already saw wakes
    // nothing.
    let Some(h) = Harness::start(|_| {}).await else {
        return;
    };
    h.create(
        "solo",
        spec(1, &["onprem"], PriorityBand::Silver, serde_json::json!({})),
    )
    .await;
    let b = h
        .wait_bundle("solo", "Ready", |b| phase(b) == BundlePhase::Ready)
        .await;
    let node_of = |b: &Bundle| {
        b.status.as_ref().and_then(|s| {
            s.replicas
                .first()
                .and_then(|r| r.jobs.first())
                .and_then(|j| j.node_id.clone())
        })
    };
    let node = node_of(&b).expect("placed on a node");
    // Let the first placement's passes end before counting.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = bundle_reconciles(&h.ctx);
    h.sim
        .with_world(|w, now| w.kill_node(&node, now))
        .expect("node killed");
    h.wait_bundle("solo", "Ready on another node", |b| {
        phase(b) == BundlePhase::Ready && node_of(b).is_some_and(|n| n != node)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        bundle_reconciles(&h.ctx) - before,
        1.0,
        "one pass recovered the replica and recorded it Ready"
    );
    h.shutdown().await;
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
    let pools: Api<PlacementPool> = Api::all(h.env.client());
    let pools_before = pools.list(&Default::default()).await.unwrap();

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
    if !changed.is_empty() {
        let status = |l: kube::core::ObjectList<PlacementPool>| -> Vec<_> {
            l.items
                .into_iter()
                .map(|p| (p.name_any(), p.status))
                .collect()
        };
        panic!(
            "written or created after the restart: {changed:?}\npools before: {:#?}\npools after: {:#?}",
            status(pools_before),
            status(pools.list(&Default::default()).await.unwrap())
        );
    }
    assert_eq!(
        h.sim.call_counts().mutating,
        calls,
        "Manager was asked to change something: {:?}",
        h.sim.call_counts().calls
    );
    h.shutdown().await;
}

#[tokio::test]
async fn an_operator_without_the_cluster_scope_places_its_bundles_and_writes_nothing_cluster_scoped()
 {
    // One of several operators sharing a Manager: it watches one namespace and leaves the
    // cluster-scoped work to another.
    let Some(h) = Harness::start(|c| {
        c.watch_namespaces = vec!["default".to_owned()];
        c.cluster_scope = false;
    })
    .await
    else {
        return;
    };
    assert!(!h.settings.scope.owns_cluster_scope());
    let target: automanager_api::HotSpareTarget = serde_json::from_value(serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "HotSpareTarget",
        "metadata": {"name": "east-spares"},
        "spec": {"pool": "aws-east", "targetCount": 2, "spec": {"instanceType": "m5.xlarge", "region": "eu-west-1"}},
    }))
    .unwrap();
    let targets: Api<automanager_api::HotSpareTarget> = Api::all(h.env.client());
    targets
        .create(&PostParams::default(), &target)
        .await
        .expect("spare target");
    // Its Bundles are placed: it reads the pools and nodes it places onto.
    h.create(
        "scoped",
        spec(1, &["onprem"], PriorityBand::Gold, serde_json::json!({})),
    )
    .await;
    h.wait_bundle("scoped", "Ready", |b| phase(b) == BundlePhase::Ready)
        .await;
    // Give the cluster-scoped controllers time they would need to write.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pools: Api<PlacementPool> = Api::all(h.env.client());
    for p in pools.list(&Default::default()).await.unwrap() {
        assert!(p.status.is_none(), "pool {} got a status", p.name_any());
        assert!(
            p.finalizers().is_empty(),
            "pool {} got a finalizer",
            p.name_any()
        );
    }
    let t = targets.get("east-spares").await.unwrap();
    assert!(t.status.is_none() && t.finalizers().is_empty(), "{t:?}");
    let nodes: Api<ManagerNode> = Api::all(h.env.client());
    assert!(
        nodes
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    let spares = h.sim.with_world(|w, _| {
        w.nodes(None)
            .iter()
            .filter(|n| {
                n.tags
                    .contains_key(automanager_operator::mapping::SPARE_TARGET_TAG)
            })
            .count()
    });
    assert_eq!(spares, 0, "no spare provisioned");
    h.shutdown().await;
}

#[tokio::test]
async fn queued_events_are_all_published_in_order_even_past_the_queue_bound() {
    use automanager_operator::controllers::events::QUEUE;
    use k8s_openapi::api::events::v1::Event as K8sEvent;
    use kube::runtime::events::EventType;

    let Some(h) = Harness::start(|_| {}).await else {
        return;
    };
    const OBJECTS: usize = 20;
    let reference = |o: usize| k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: Some(format!("event-queue-probe-{o:02}")),
        namespace: Some("default".into()),
        ..Default::default()
    };
    // More than the queue holds: the callers past the bound wait instead of losing Events.
    // Distinct reasons, so the recorder's series does not fold them into one.
    let total = QUEUE + 76;
    for i in 0..total {
        h.ctx
            .event_on(
                &reference(i % OBJECTS),
                EventType::Normal,
                &format!("Probe{i:05}"),
                "Probe",
                format!("probe {i:05}"),
            )
            .await;
    }
    assert!(
        h.ctx.events.flush(BOUND).await,
        "{} events still pending",
        h.ctx.events.pending()
    );
    let events: Api<K8sEvent> = Api::namespaced(h.env.client(), "default");
    let mut seen: Vec<(String, String, String)> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| {
            let name = e.regarding.as_ref()?.name.clone()?;
            name.starts_with("event-queue-probe-").then(|| {
                let at = e
                    .event_time
                    .map(|t| t.0.as_nanosecond())
                    .unwrap_or_default();
                (name, format!("{at:024}"), e.note.unwrap_or_default())
            })
        })
        .collect();
    assert_eq!(seen.len(), total, "every queued Event was published");
    // Per object, in the order they were queued.
    seen.sort();
    for o in 0..OBJECTS {
        let name = format!("event-queue-probe-{o:02}");
        let notes: Vec<&str> = seen
            .iter()
            .filter(|(n, _, _)| *n == name)
            .map(|(_, _, note)| note.as_str())
            .collect();
        let mut in_order = notes.clone();
        in_order.sort_unstable();
        assert_eq!(
            notes, in_order,
            "{name}'s Events in the order they were queued"
        );
    }
    h.shutdown().await;
}

/// This package's directory, as cargo tells the running test: a test executable cargo finds
/// fresh may have been built in another checkout that shares the target dir, and the path
/// compiled into it would read that checkout's files.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
