//! The operator over Manager's published API with our extension (`automanager.manager.extension.v1`)
//! served beside it, end to end: the real apiserver, the manager-sim binary, the operator binary
//! with `manager.api: published`. What 1.0.384 alone cannot do works through the extension: a
//! warm tier of stopped spares, a user's Migration, a drain that migrates, and a reclaim notice
//! that moves jobs before its deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use automanager_api::MigrationPhase::Completed;
use automanager_api::MigrationStrategy::Overlap;
use automanager_api::PriorityBand::Silver;
use automanager_api::{
    Bundle, DrainMode, HotSpareTarget, JobState, ManagerNode, Migration, NodeState,
};
use automanager_e2e::scenario::{
    BundleView, JobManifest, MigrationView, bundle, job, migration, show,
};
use automanager_e2e::stack::Stack;
use automanager_e2e::{apply_example_pools, repo_root};
use kube::ResourceExt;

const OWNER: &str = "e2e-extension";
const WAIT: Duration = Duration::from_secs(60);

/// The operator over the published API, against a sim serving our extension whose warm stops
/// and starts take a fraction of a second (a cloud's take tens).
async fn start() -> (Stack, tempfile::TempDir) {
    let demo = std::fs::read_to_string(repo_root().join("deploy/demo/manager-sim.yaml")).unwrap();
    let config = demo.replacen(
        "timing:\n",
        "timing:\n  startDelayMs: 300\n  stopDelayMs: 200\n",
        1,
    );
    assert_ne!(config, demo, "the demo config has a timing section");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manager-sim.yaml");
    std::fs::write(&path, config).unwrap();
    let stack = Stack::start_custom(&path, &[], |c| {
        c.insert(
            "manager".into(),
            serde_json::json!({"url": c["manager"]["url"], "api": "published", "owner": OWNER}),
        );
    })
    .await
    .expect("stack");
    apply_example_pools(&stack).await.unwrap();
    (stack, dir)
}

/// A one-job silver Bundle on the on-prem pool, movable with overlap.
fn movable(name: &str) -> Bundle {
    bundle(
        name,
        1,
        &["onprem"],
        [job("enc", 20, Silver).cores(2).moves_by(Overlap)],
    )
}

/// Starts `name` and answers the node its job runs on.
async fn running(stack: &Stack, name: &str) -> String {
    stack.create(&movable(name)).await;
    let b = stack.expect_ready(name).await;
    b.node_of(0, "enc").unwrap().to_owned()
}

/// Waits until `name`'s job runs somewhere other than `left`; answers where.
async fn moved_off(stack: &Stack, name: &str, left: &str) -> String {
    let b = stack
        .wait_until::<Bundle>(name, &format!("its job moved off {left}"), |b| {
            b.node_of(0, "enc").is_some_and(|n| n != left)
                && b.state_of(0, "enc") == Some(JobState::Running)
        })
        .await;
    b.node_of(0, "enc").unwrap().to_owned()
}

/// The extension's RPCs the operator called on this stack's sim, by name; printed for
/// `make test-manager-api` (`ext_rpcs`).
fn extension_rpcs_used(stack: &Stack) -> Vec<String> {
    let calls = stack.sim_calls().expect("call counts");
    let used: Vec<String> = calls
        .iter()
        .filter(|(_, n)| **n > 0)
        .filter_map(|(rpc, _)| rpc.strip_prefix("automanager.manager.extension.v1/"))
        .map(str::to_owned)
        .collect();
    println!("manager-api-ext-e2e used={}", used.join(","));
    used
}

#[tokio::test]
async fn a_warm_tier_keeps_stopped_spares_and_starts_one_when_the_hot_tier_needs_it() {
    let (stack, _dir) = start().await;
    automanager_e2e::apply(
        &stack,
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: HotSpareTarget\nmetadata: {name: aws-east-spares}\n\
         spec: {pool: aws-east, targetCount: 1, warm: {count: 1}, spec: {instanceType: m5.xlarge, region: eu-west-1}}\n",
    )
    .await;
    stack
        .wait_until::<HotSpareTarget>("aws-east-spares", "one hot and one warm spare", |t| {
            t.status.as_ref().is_some_and(|s| {
                s.live_spares == 1
                    && s.warm_spares == 1
                    && s.conditions
                        .iter()
                        .any(|c| c.type_ == "WarmTier" && c.reason != "ManagerCannotStop")
            })
        })
        .await;
    // The warm spare is a node Manager keeps powered off, under the id the operator made.
    let warm: Vec<String> = stack
        .wait_for("a stopped ManagerNode", WAIT, || async {
            let stopped: Vec<String> = (stack.try_list::<ManagerNode>("").await?.iter())
                .filter(|n| {
                    n.status
                        .as_ref()
                        .is_some_and(|s| s.state == NodeState::Stopped)
                })
                .map(ResourceExt::name_any)
                .collect();
            Ok((stopped.len() == 1).then_some(stopped))
        })
        .await
        .unwrap();
    stack
        .expect_event(
            "aws-east-spares",
            "StoppingSpare",
            &["stopped to refill the warm tier"],
        )
        .await;

    // The hot tier grows: the warm spare is started for it, and the warm tier refills.
    automanager_e2e::apply(
        &stack,
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: HotSpareTarget\nmetadata: {name: aws-east-spares}\n\
         spec: {pool: aws-east, targetCount: 2, warm: {count: 1}, spec: {instanceType: m5.xlarge, region: eu-west-1}}\n",
    )
    .await;
    stack
        .expect_event(
            "aws-east-spares",
            "StartingWarmSpare",
            &[&format!("warm spare {} started", warm[0])],
        )
        .await;
    stack
        .wait_until::<ManagerNode>(&warm[0], "the warm spare running again", |n| {
            n.status
                .as_ref()
                .is_some_and(|s| s.state == NodeState::Started)
        })
        .await;
    stack
        .wait_until::<HotSpareTarget>("aws-east-spares", "two hot spares and one warm", |t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.live_spares == 2 && s.warm_spares == 1)
        })
        .await;
    let used = extension_rpcs_used(&stack);
    for rpc in ["Describe", "Watch", "StopNode", "StartNode"] {
        assert!(used.iter().any(|u| u == rpc), "{rpc} was called: {used:?}");
    }
}

#[tokio::test]
async fn migrations_drains_and_reclaim_notices_move_jobs_over_our_extension() {
    let (stack, _dir) = start().await;

    // A user's Migration with strategy overlap completes.
    let source = running(&stack, "ov").await;
    stack.create(&migration("move-ov", "ov", 0, "enc")).await;
    let m = stack.expect_migration_phase("move-ov", Completed).await;
    assert_eq!(m.strategy(), Some(Overlap), "{}", show(&m));
    let target = m.target_node().expect("a target").to_owned();
    assert_ne!(target, source);
    assert_eq!(moved_off(&stack, "ov", &source).await, target);

    // A drain with mode migrate moves the node's job with a Migration.
    let drained = running(&stack, "dr").await;
    stack.drain(&drained, DrainMode::Migrate).await;
    moved_off(&stack, "dr", &drained).await;
    stack
        .wait_for("the drain's Migration completed", WAIT, || async {
            let done = (stack.try_list::<Migration>("").await?.iter())
                .any(|m| m.name_any().starts_with("drain-") && m.phase() == Some(Completed));
            Ok(done.then_some(()))
        })
        .await
        .unwrap();

    // A reclaim notice moves the node's job before its deadline, then the node is gone.
    let noticed = running(&stack, "rc").await;
    stack
        .chaos(&["notice-node", &noticed, "--in", "20"])
        .unwrap();
    stack
        .wait_for("a reclaim Migration completed", WAIT, || async {
            let done = (stack.try_list::<Migration>("").await?.iter()).any(|m| {
                m.name_any().starts_with("reclaim-")
                    && m.spec.job.bundle == "rc"
                    && m.phase() == Some(Completed)
            });
            Ok(done.then_some(()))
        })
        .await
        .unwrap();
    let moved_to = moved_off(&stack, "rc", &noticed).await;
    let still_there = stack
        .try_get::<ManagerNode>(&noticed)
        .await
        .ok()
        .and_then(|n| n.status)
        .is_some_and(|s| s.state != NodeState::Terminated);
    assert!(
        still_there,
        "the job moved to {moved_to} before the node was reclaimed"
    );
    // At the deadline the node is lost: terminated, or already gone from the ManagerNodes.
    stack
        .wait_for("the node reclaimed at the deadline", WAIT, || async {
            let left = (stack.try_list::<ManagerNode>("").await?.iter()).any(|n| {
                n.name_any() == noticed
                    && n.status
                        .as_ref()
                        .is_none_or(|s| s.state != NodeState::Terminated)
            });
            Ok((!left).then_some(()))
        })
        .await
        .unwrap();

    let used = extension_rpcs_used(&stack);
    for rpc in [
        "MigrationGetState",
        "MigrationPrepareTarget",
        "MigrationCutover",
    ] {
        assert!(used.iter().any(|u| u == rpc), "{rpc} was called: {used:?}");
    }
}
