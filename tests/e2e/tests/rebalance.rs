//! The rebalancer on the real stack (kube-apiserver + etcd, manager-sim, the operator binary,
//! kubectl), with the reliability suite's invariant checker and a sampler of replicas down
//! running alongside.
//!
//! A fixed pool with zone `za` (a1, a2, a3) and zone `zb` (b1), nodes of 100. A two-replica gold
//! bundle of 60 with `spec.rebalance: true` runs on a1 and a2 (same zone, the soft default); a
//! bronze bundle of 60 fills a3. a2 dies: replica 1 can only recover on b1, breaking same-zone,
//! and the rebalancer waits for room (`RebalanceNeeded`, `WaitingForCapacity`). The bronze bundle
//! is deleted: room comes back in `za`, and the rebalancer moves replica 1 to a3 with a Migration
//! (purpose `rebalance`, the job's declared strategy), never more than one replica down.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use automanager_e2e::reliability::{Monitor, manager_state, settle, sim_admin};
use automanager_e2e::sampler::MaxSampler;
use automanager_e2e::stack::Stack;
use automanager_e2e::{apply, condition, fixed_pool, wait_events};
use manager_client::proto::KillNodeRequest;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);
const POOL: &str = "rows";

fn bundle(name: &str, replicas: u32, band: &str, extra: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: {replicas}
  pools: [{POOL}]
{extra}  jobs:
    - jobName: enc
      requirements: {{requiredCapacity: 60, requiredCores: 1, priorityBand: {band}}}
"
    )
}

/// (node, state) of each replica's job, from the Bundle's status.
async fn replicas(stack: &Stack, name: &str) -> Vec<(String, String)> {
    let b = stack
        .get_json(&["bundle", name, "-n", "default"])
        .await
        .unwrap();
    b["status"]["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let j = &r["jobs"][0];
            (
                j["nodeId"].as_str().unwrap_or_default().to_owned(),
                j["state"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The pair's `RebalanceNeeded` condition.
async fn rebalance_condition(stack: &Stack) -> Result<Value, automanager_e2e::SetupError> {
    let p = stack.get_json(&["bundle", "pair", "-n", "default"]).await?;
    Ok(condition(&p, "RebalanceNeeded").clone())
}

async fn migrations(stack: &Stack) -> Vec<Value> {
    stack
        .get_json(&["migrations", "-n", "default"])
        .await
        .unwrap()["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn running(n: &str) -> (String, String) {
    (n.to_owned(), "running".to_owned())
}

/// A stack with the pair (`pair_extra` added to its spec) on a1 and a2 and the blocker on a3;
/// then a2 is killed and the pair's replica 1 recovers on b1, and the rebalancer says it waits
/// for room. The invariant checker runs from the start.
async fn split_pair(pair_extra: &str) -> (Stack, Monitor) {
    let dir = tempfile::tempdir().unwrap();
    let (config, pool) = fixed_pool(
        dir.path(),
        POOL,
        &[("a1", "za"), ("a2", "za"), ("a3", "za"), ("b1", "zb")],
    )
    .unwrap();
    let stack = Stack::start_custom(&config, &[], |_| {})
        .await
        .expect("stack");
    apply(&stack, &pool).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    apply(&stack, &bundle("pair", 2, "gold", pair_extra)).await;
    stack
        .wait_bundle_phase("default", "pair", "Ready", WAIT)
        .await
        .unwrap();
    apply(&stack, &bundle("blocker", 1, "bronze", "")).await;
    stack
        .wait_bundle_phase("default", "blocker", "Ready", WAIT)
        .await
        .unwrap();
    assert_eq!(
        replicas(&stack, "pair").await,
        vec![running("a1"), running("a2")]
    );
    assert_eq!(replicas(&stack, "blocker").await, vec![running("a3")]);
    let c = rebalance_condition(&stack).await.unwrap();
    assert_eq!(c["reason"], "SoftRulesHold", "{c}");

    // a2 dies: replica 1 recovers on the only node with room, in the other zone.
    sim_admin(&stack.sim_endpoint)
        .await
        .unwrap()
        .kill_node(KillNodeRequest {
            node_id: "a2".into(),
        })
        .await
        .unwrap();
    stack
        .wait_for("replica 1 recovered on b1", WAIT, || async {
            Ok(
                (replicas(&stack, "pair").await == vec![running("a1"), running("b1")])
                    .then_some(()),
            )
        })
        .await
        .unwrap();
    let p = stack
        .wait_for("the rebalancer waits for room", WAIT, || async {
            let p = stack.get_json(&["bundle", "pair", "-n", "default"]).await?;
            Ok((condition(&p, "RebalanceNeeded")["reason"] == "WaitingForCapacity").then_some(p))
        })
        .await
        .unwrap();
    let c = condition(&p, "RebalanceNeeded");
    assert_eq!(c["status"], "True");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("replica 1 breaks soft rule(s) interSameZone"),
        "{c}"
    );
    assert_eq!(
        p["status"]["replicas"][1]["jobs"][0]["lastPlacement"]["brokenSoftRules"],
        serde_json::json!(["interSameZone"])
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        migrations(&stack).await.is_empty(),
        "no move while there is no room"
    );
    (stack, monitor)
}

/// Room comes back in za: the blocker goes.
async fn free_a3(stack: &Stack) {
    let out = stack
        .env
        .run_kubectl([
            "delete",
            "bundle",
            "blocker",
            "-n",
            "default",
            "--wait=true",
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
}

/// Replica 1 moves back to a3 by one completed rebalancing Migration; the condition clears.
async fn assert_moved_back(stack: &Stack) {
    stack
        .wait_for("replica 1 back in za on a3", WAIT, || async {
            Ok((replicas(stack, "pair").await == vec![running("a1"), running("a3")]).then_some(()))
        })
        .await
        .unwrap();
    let migs = stack
        .wait_for("the rebalancing Migration completed", WAIT, || async {
            let m = migrations(stack).await;
            Ok((m.len() == 1 && m[0]["status"]["phase"] == "Completed").then_some(m))
        })
        .await
        .unwrap();
    let mig = &migs[0];
    assert_eq!(
        mig["metadata"]["labels"]["automanager.norsk.io/purpose"],
        "rebalance"
    );
    assert_eq!(mig["spec"]["job"]["replica"], 1);
    assert_eq!(mig["spec"]["targetNode"], "a3");
    assert_eq!(
        mig["status"]["strategy"], "stopThenStart",
        "the job declares nothing: its declared strategy is the default"
    );
    stack
        .wait_for("RebalanceNeeded cleared", WAIT, || async {
            let c = rebalance_condition(stack).await?;
            Ok((c["status"] == "False" && c["reason"] == "SoftRulesHold").then_some(()))
        })
        .await
        .unwrap();
    let m = manager_state(&stack.sim_endpoint).await.unwrap();
    let zones: Vec<String> = ["a1", "a3"]
        .iter()
        .map(|n| m.zone_of(n).unwrap_or_default().to_owned())
        .collect();
    assert_eq!(zones, vec!["za", "za"]);
    wait_events(
        stack,
        &[&|l: &str| {
            l.starts_with("pair") && l.contains("RebalanceStarted") && l.contains("from b1 to a3")
        }],
    )
    .await;
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains("automanager_rebalances_total 1"),
        "{metrics}"
    );
    // Nothing more to do: no second Migration a while later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(migrations(stack).await.len(), 1);
}

async fn finish(stack: &Stack, monitor: Monitor, scenario: &str) {
    let (mut v, took) = settle(stack, WAIT).await.unwrap();
    v.merge(&monitor.stop().await.0);
    eprintln!("{}", v.line(scenario, took));
    assert!(v.is_clean(), "{}", v.details());
}

#[tokio::test]
async fn rebalance_restores_same_zone_once_capacity_returns_within_the_budget() {
    let (stack, monitor) = split_pair("  rebalance: true\n").await;
    let sampler = MaxSampler::replicas_down(&stack.sim_endpoint, "default.pair", 2, "enc")
        .await
        .unwrap();
    free_a3(&stack).await;
    assert_moved_back(&stack).await;
    let (worst, samples) = sampler.stop().await;
    eprintln!("rebalance: at most {worst} replica(s) of 2 down over {samples} samples");
    assert!(
        worst <= 1,
        "the disruption budget (1) was broken: {worst} down"
    );
    finish(&stack, monitor, "fleet-rebalance").await;
}

#[tokio::test]
async fn a_rebalance_waits_for_the_disruption_budget() {
    let (stack, monitor) =
        split_pair("  rebalance: true\n  disruption: {maxUnavailableReplicas: 0}\n").await;
    let sampler = MaxSampler::replicas_down(&stack.sim_endpoint, "default.pair", 2, "enc")
        .await
        .unwrap();
    free_a3(&stack).await;
    // The move is asked for, and waits: a budget of 0 allows no voluntary action.
    let mig = stack
        .wait_for(
            "the rebalancing Migration waits for the budget",
            WAIT,
            || async {
                let m = migrations(&stack).await;
                Ok(m.first()
                    .filter(|m| condition(m, "Queued")["reason"] == "DisruptionBudget")
                    .cloned())
            },
        )
        .await
        .unwrap();
    assert_eq!(mig["status"]["phase"], "Pending");
    // Longer than the bundle's look-again interval while it would rebalance (10 s), so the
    // rebalancer looks again while the Migration waits.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(migrations(&stack).await.len(), 1, "one rebalance at a time");
    assert_eq!(
        replicas(&stack, "pair").await,
        vec![running("a1"), running("b1")],
        "nothing moved while the budget says no"
    );
    let c = rebalance_condition(&stack).await.unwrap();
    assert_eq!(c["reason"], "MigrationInProgress", "{c}");
    let (worst, _) = sampler.stop().await;
    assert_eq!(worst, 0, "no replica went down while the budget was 0");

    // The budget is raised: the move goes on.
    let out = stack
        .env
        .run_kubectl([
            "patch",
            "bundle",
            "pair",
            "-n",
            "default",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"disruption":{"maxUnavailableReplicas":1}}}"#,
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    assert_moved_back(&stack).await;
    finish(&stack, monitor, "fleet-rebalance-budget").await;
}
