//! Hot spares end to end: real apiserver, manager-sim and the operator binary.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use automanager_api::PriorityBand::Gold;
use automanager_api::{
    Bundle, ConditionStatus, HotSpareTarget, JobState, ManagerNode, NodeState, PlacementPool,
};
use automanager_e2e::apply_example_pools;
use automanager_e2e::scenario::{
    BundleView, Conditions, EventView, JobManifest, PATIENCE, bundle, job, show, spare_target,
};
use automanager_e2e::stack::Stack;

async fn start() -> Stack {
    let stack = Stack::start().await.expect("stack");
    apply_example_pools(&stack).await.unwrap();
    stack
}

/// The ids of the spare ManagerNodes of `pool` that are started and hold no job.
fn live_spares(nodes: &[ManagerNode], pool: &str) -> Vec<String> {
    nodes
        .iter()
        .filter_map(|n| n.status.as_ref())
        .filter(|s| s.pool == pool && s.spare && s.state == NodeState::Started)
        .map(|s| s.node_id.clone())
        .collect()
}

/// [`live_spares`] of the nodes now.
async fn live_spare_nodes(stack: &Stack, pool: &str) -> Vec<String> {
    live_spares(&stack.nodes().await, pool)
}

/// How many ManagerNodes belong to `pool`.
fn nodes_in(nodes: &[ManagerNode], pool: &str) -> usize {
    nodes
        .iter()
        .filter(|n| n.status.as_ref().is_some_and(|s| s.pool == pool))
        .count()
}

fn live_count(t: &HotSpareTarget) -> Option<i32> {
    t.status.as_ref().map(|s| s.live_spares)
}

#[tokio::test]
async fn spares_are_provisioned_to_target_and_the_oldest_excess_is_terminated() {
    let stack = start().await;
    stack
        .create(&spare_target(
            "east",
            "aws-east",
            2,
            "m5.xlarge",
            "eu-west-1",
        ))
        .await;
    let t = stack
        .wait_until("east", "to have two live spares", |t: &HotSpareTarget| {
            live_count(t) == Some(2)
        })
        .await;
    assert_eq!(
        t.condition_status("SpareUnderflow"),
        Some(ConditionStatus::False),
        "{}",
        show(&t)
    );
    stack
        .wait_for(
            "two spare ManagerNodes and the pool's figures",
            PATIENCE,
            || async {
                let pool: PlacementPool = stack.try_get("aws-east").await?;
                let nodes = stack.try_list::<ManagerNode>("").await?;
                let ok = live_spares(&nodes, "aws-east").len() == 2
                    && pool
                        .status
                        .as_ref()
                        .is_some_and(|s| s.live_spares == 2 && s.spare_target == 2);
                Ok(ok.then_some(()))
            },
        )
        .await
        .unwrap();
    let mut before = live_spare_nodes(&stack, "aws-east").await;
    // Oldest first, by when Manager created each node.
    let manager = stack.manager_nodes().await.unwrap();
    before.sort_by_key(|id| manager.get(id).map(|n| (n.created_at_ms, id.clone())));

    stack
        .merge_patch::<HotSpareTarget>("east", &serde_json::json!({"spec": {"targetCount": 1}}))
        .await;
    stack
        .wait_until_list("", "one live spare", |nodes: &[ManagerNode]| {
            (live_spares(nodes, "aws-east").len() == 1).then_some(())
        })
        .await;
    // The older spare went.
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
    let mut target = spare_target("gold-east", "aws-east", 1, "m5.xlarge", "eu-west-1");
    target.spec.for_band = Some(Gold);
    stack.create(&target).await;
    // The target's count and the ManagerNode mirror are written by different controllers:
    // wait for both before reading which node is the spare.
    let spare = stack
        .wait_for("one live gold spare", PATIENCE, || async {
            let t: HotSpareTarget = stack.try_get("gold-east").await?;
            let live = live_spares(&stack.try_list::<ManagerNode>("").await?, "aws-east");
            Ok((live_count(&t) == Some(1) && live.len() == 1).then(|| live[0].clone()))
        })
        .await
        .unwrap();

    // A first placement never lands on a spare: the gold job gets an ordinary node.
    stack
        .create(&bundle(
            "news",
            1,
            &["aws-east"],
            [job("enc", 20, Gold).cores(2)],
        ))
        .await;
    let b = stack.expect_ready("news").await;
    let first = b.node_of(0, "enc").unwrap().to_owned();
    assert_ne!(first, spare, "first placements must not use spares");

    // Its node dies: gold recovery prefers the hot spare.
    stack.chaos(&["kill-node", &first]).unwrap();
    let b = stack
        .wait_until(
            "news",
            "to restart its gold job off the dead node",
            |b: &Bundle| {
                b.state_of(0, "enc") == Some(JobState::Running)
                    && b.node_of(0, "enc") != Some(first.as_str())
            },
        )
        .await;
    assert_eq!(b.node_of(0, "enc"), Some(spare.as_str()), "{}", show(&b));
    let recovery = b
        .job(0, "enc")
        .and_then(|j| j.last_placement.as_ref())
        .map(|t| t.recovery);
    assert_eq!(recovery, Some(true), "{}", show(&b));

    // The spare that took the job is no longer a spare: a replacement comes up.
    stack
        .wait_until_list("", "a replacement spare", |nodes: &[ManagerNode]| {
            let live = live_spares(nodes, "aws-east");
            (live.len() == 1 && live[0] != spare).then_some(())
        })
        .await;
    stack
        .wait_for_event("a SpareUnderflow or ProvisioningSpare Event", |e| {
            matches!(e.reason_str(), "SpareUnderflow" | "ProvisioningSpare")
        })
        .await;
}

#[tokio::test]
async fn a_fixed_pool_only_reports_underflow() {
    let stack = start().await;
    stack
        .create(&spare_target(
            "onprem-spares",
            "onprem",
            1,
            "r740",
            "oslo-dc1",
        ))
        .await;
    let t: HotSpareTarget = stack
        .wait_for_condition("onprem-spares", "SpareUnderflow", ConditionStatus::True)
        .await;
    let status = t.status.as_ref().unwrap();
    assert_eq!(
        status.pending_spares,
        0,
        "a fixed pool never provisions: {}",
        show(&t)
    );
    assert!(status.underflow_since.is_some(), "{}", show(&t));
    let msg = t.condition_message("SpareUnderflow").unwrap();
    assert!(
        msg.contains("onprem") && msg.contains('0') && msg.contains('1'),
        "pool, current and target in: {msg}"
    );
    // The ManagerNode mirror writes statuses at its own pace: wait until it shows the fixed
    // pool's three nodes, then check there is no fourth.
    let onprem = stack
        .wait_until_list("", "the on-prem ManagerNodes", |nodes: &[ManagerNode]| {
            let n = nodes_in(nodes, "onprem");
            (n >= 3).then_some(n)
        })
        .await;
    assert_eq!(onprem, 3, "no node was created in the fixed pool");
}

#[tokio::test]
async fn a_spare_target_beyond_max_nodes_stops_at_the_bound_and_says_so() {
    let stack = start().await;
    // aws-west has maxNodes 20 (examples/pools.yaml).
    stack
        .create(&spare_target(
            "lots",
            "aws-west",
            1000,
            "m5.xlarge",
            "us-west-2",
        ))
        .await;
    let t: HotSpareTarget = stack
        .wait_for_reason("lots", "Stalled", "PoolAtMaxNodes")
        .await;
    assert!(t.has_condition("Stalled"), "{}", show(&t));
    assert_eq!(
        t.condition_status("Ready"),
        Some(ConditionStatus::False),
        "{}",
        show(&t)
    );
    assert!(t.has_condition("SpareUnderflow"), "{}", show(&t));
    stack
        .wait_until_list(
            "",
            "the pool to fill to its bound",
            |nodes: &[ManagerNode]| (nodes_in(nodes, "aws-west") == 20).then_some(()),
        )
        .await;
    // Nothing beyond the bound arrives later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(nodes_in(&stack.nodes().await, "aws-west"), 20);
    stack
        .wait_for_event("a SpareTargetUnreachable Event", |e| {
            e.reason_str() == "SpareTargetUnreachable"
        })
        .await;
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    // The shortfall is the target in effect less the hot spares ready, both under one name.
    let hot = |state: &str| -> Option<f64> {
        let prefix = format!(
            "automanager_spares{{hotsparetarget=\"lots\",pool=\"aws-west\",tier=\"hot\",state=\"{state}\"}} "
        );
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
    };
    let (ready, target) = (hot("ready"), hot("target"));
    assert_eq!(target, Some(1000.0), "{metrics}");
    assert!(ready.is_some_and(|r| r < 1000.0), "{metrics}");
}
