//! Hot spares end to end: real apiserver, manager-sim and the operator binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use automanager_e2e::examples_dir;
use automanager_e2e::stack::Stack;
use automanager_e2e::{apply, condition};

const WAIT: Duration = Duration::from_secs(90);

fn spare_target(
    name: &str,
    pool: &str,
    count: u32,
    band: Option<&str>,
    instance_type: &str,
    region: &str,
) -> String {
    let band = band
        .map(|b| format!("  forBand: {b}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: HotSpareTarget\nmetadata: {{name: {name}}}\nspec:\n  pool: {pool}\n  targetCount: {count}\n{band}  spec: {{instanceType: {instance_type}, region: {region}}}\n"
    )
}

async fn start() -> Stack {
    let stack = Stack::start().await.expect("stack");
    let out = stack
        .env
        .apply_file(examples_dir().join("pools.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    stack
}

/// Spare ManagerNodes of `pool` that are started and hold no job.
async fn live_spare_nodes(stack: &Stack, pool: &str) -> Vec<String> {
    let nodes = stack.get_json(&["managernodes"]).await.unwrap();
    nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| {
            n["status"]["pool"] == pool
                && n["status"]["spare"] == true
                && n["status"]["state"] == "started"
        })
        .filter_map(|n| n["status"]["nodeId"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test]
async fn spares_are_provisioned_to_target_and_the_oldest_excess_is_terminated() {
    let stack = start().await;
    apply(
        &stack,
        &spare_target("east", "aws-east", 2, None, "m5.xlarge", "eu-west-1"),
    )
    .await;
    let t = stack
        .wait_for("two live spares", WAIT, || async {
            let t = stack.get_json(&["hotsparetarget", "east"]).await?;
            Ok((t["status"]["liveSpares"] == 2).then_some(t))
        })
        .await
        .unwrap();
    assert_eq!(condition(&t, "SpareUnderflow")["status"], "False", "{t:#}");
    stack
        .wait_for(
            "two spare ManagerNodes and the pool's figures",
            WAIT,
            || async {
                let pool = stack.get_json(&["placementpool", "aws-east"]).await?;
                let ok = live_spare_nodes(&stack, "aws-east").await.len() == 2
                    && pool["status"]["liveSpares"] == 2
                    && pool["status"]["spareTarget"] == 2;
                Ok(ok.then_some(()))
            },
        )
        .await
        .unwrap();
    let mut before = live_spare_nodes(&stack, "aws-east").await;
    before.sort();

    let out = stack
        .env
        .run_kubectl([
            "patch",
            "hotsparetarget",
            "east",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"targetCount":1}}"#,
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    stack
        .wait_for("one live spare", WAIT, || async {
            let live = live_spare_nodes(&stack, "aws-east").await;
            Ok((live.len() == 1).then_some(live))
        })
        .await
        .unwrap();
    // The sim numbers nodes in creation order: the older (first) spare went.
    let after = live_spare_nodes(&stack, "aws-east").await;
    assert_eq!(
        after,
        vec![before[1].clone()],
        "the oldest excess spare is the one terminated"
    );
}

#[tokio::test]
async fn a_gold_recovery_takes_a_spare_which_is_then_replaced() {
    let stack = start().await;
    apply(
        &stack,
        &spare_target(
            "gold-east",
            "aws-east",
            1,
            Some("gold"),
            "m5.xlarge",
            "eu-west-1",
        ),
    )
    .await;
    // The target's count and the ManagerNode mirror are written by different controllers:
    // wait for both before reading which node is the spare.
    let spare = stack
        .wait_for("one live gold spare", WAIT, || async {
            let t = stack.get_json(&["hotsparetarget", "gold-east"]).await?;
            let live = live_spare_nodes(&stack, "aws-east").await;
            Ok((t["status"]["liveSpares"] == 1 && live.len() == 1).then(|| live[0].clone()))
        })
        .await
        .unwrap();

    // A first placement never lands on a spare: the gold job gets an ordinary node.
    apply(
        &stack,
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {name: news, namespace: default}\nspec:\n  replicas: 1\n  pools: [aws-east]\n  jobs:\n    - jobName: enc\n      requirements: {requiredCapacity: 20, requiredCores: 2, priorityBand: gold}\n",
    )
    .await;
    let b = stack
        .wait_bundle_phase("default", "news", "Ready", WAIT)
        .await
        .unwrap();
    let first = b["status"]["replicas"][0]["jobs"][0]["nodeId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(first, spare, "first placements must not use spares");

    // Its node dies: gold recovery prefers the hot spare.
    stack.chaos(&["kill-node", &first]).unwrap();
    let b = stack
        .wait_for("gold job restarted on the spare", WAIT, || async {
            let b = stack.get_json(&["bundle", "news", "-n", "default"]).await?;
            let j = &b["status"]["replicas"][0]["jobs"][0];
            Ok((j["state"] == "running" && j["nodeId"] != first.as_str()).then_some(b))
        })
        .await
        .unwrap();
    assert_eq!(
        b["status"]["replicas"][0]["jobs"][0]["nodeId"],
        spare.as_str(),
        "{b:#}"
    );
    assert_eq!(
        b["status"]["replicas"][0]["jobs"][0]["lastPlacement"]["recovery"],
        true
    );

    // The spare that took the job is no longer a spare: a replacement comes up.
    stack
        .wait_for("a replacement spare", WAIT, || async {
            let live = live_spare_nodes(&stack, "aws-east").await;
            Ok((live.len() == 1 && live[0] != spare).then_some(()))
        })
        .await
        .unwrap();
    let events = stack
        .env
        .run_kubectl(["get", "events", "-A", "-o", "custom-columns=REASON:.reason"])
        .await
        .unwrap();
    assert!(
        events.stdout.contains("SpareUnderflow") || events.stdout.contains("ProvisioningSpare"),
        "{}",
        events.stdout
    );
}

#[tokio::test]
async fn a_fixed_pool_only_reports_underflow() {
    let stack = start().await;
    apply(
        &stack,
        &spare_target("onprem-spares", "onprem", 1, None, "r740", "oslo-dc1"),
    )
    .await;
    let t = stack
        .wait_for("underflow reported", WAIT, || async {
            let t = stack.get_json(&["hotsparetarget", "onprem-spares"]).await?;
            Ok((condition(&t, "SpareUnderflow")["status"] == "True").then_some(t))
        })
        .await
        .unwrap();
    assert_eq!(
        t["status"]["pendingSpares"], 0,
        "a fixed pool never provisions: {t:#}"
    );
    assert!(t["status"]["underflowSince"].is_string());
    let msg = condition(&t, "SpareUnderflow")["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        msg.contains("onprem") && msg.contains('0') && msg.contains('1'),
        "pool, current and target in: {msg}"
    );
    // The ManagerNode mirror writes statuses at its own pace: wait until it shows the fixed
    // pool's three nodes, then check there is no fourth.
    let onprem = stack
        .wait_for("the on-prem ManagerNodes", WAIT, || async {
            let nodes = stack.get_json(&["managernodes"]).await?;
            let n = nodes["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| n["status"]["pool"] == "onprem")
                .count();
            Ok((n >= 3).then_some(n))
        })
        .await
        .unwrap();
    assert_eq!(onprem, 3, "no node was created in the fixed pool");
}

#[tokio::test]
async fn a_spare_target_beyond_max_nodes_stops_at_the_bound_and_says_so() {
    let stack = start().await;
    // aws-west has maxNodes 20 (examples/pools.yaml).
    apply(
        &stack,
        &spare_target("lots", "aws-west", 1000, None, "m5.xlarge", "us-west-2"),
    )
    .await;
    let t = stack
        .wait_for("the target to say it cannot be met", WAIT, || async {
            let t = stack.get_json(&["hotsparetarget", "lots"]).await?;
            Ok((condition(&t, "Stalled")["reason"] == "PoolAtMaxNodes").then_some(t))
        })
        .await
        .unwrap();
    assert_eq!(condition(&t, "Stalled")["status"], "True", "{t:#}");
    assert_eq!(condition(&t, "Ready")["status"], "False", "{t:#}");
    assert_eq!(condition(&t, "SpareUnderflow")["status"], "True", "{t:#}");
    let west_nodes = |nodes: &serde_json::Value| {
        nodes["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|n| n["status"]["pool"] == "aws-west")
                    .count()
            })
            .unwrap_or(0)
    };
    stack
        .wait_for("the pool to fill to its bound", WAIT, || async {
            let nodes = stack.get_json(&["managernodes"]).await?;
            Ok((west_nodes(&nodes) == 20).then_some(()))
        })
        .await
        .unwrap();
    // Nothing beyond the bound arrives later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let nodes = stack.get_json(&["managernodes"]).await.unwrap();
    assert_eq!(west_nodes(&nodes), 20);
    let events = stack
        .env
        .run_kubectl([
            "get",
            "events.events.k8s.io",
            "-A",
            "-o",
            "custom-columns=REASON:.reason",
        ])
        .await
        .unwrap();
    assert!(
        events.stdout.contains("SpareTargetUnreachable"),
        "{}",
        events.stdout
    );
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics.lines().any(|l| l
            .starts_with("automanager_pool_spare_shortfall{pool=\"aws-west\"}")
            && !l.ends_with(" 0")),
        "{metrics}"
    );
}
