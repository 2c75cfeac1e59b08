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

use automanager_api::PriorityBand::{self, Bronze, Gold};
use automanager_api::{
    Bundle, ConditionStatus, JobState, Migration, MigrationPhase, MigrationStrategy, PURPOSE_LABEL,
};
use automanager_e2e::reliability::{Monitor, manager_state, settle, sim_admin};
use automanager_e2e::sampler::MaxSampler;
use automanager_e2e::scenario::{
    BundleManifest, Conditions, MigrationView, bundle, fixed_pool, job, show,
};
use automanager_e2e::stack::Stack;
use manager_client::proto::KillNodeRequest;

const WAIT: Duration = Duration::from_secs(120);
const POOL: &str = "rows";

/// A bundle of `replicas` replicas of one job of 60 in `band`, in the pool.
fn row_bundle(name: &str, replicas: i32, band: PriorityBand) -> Bundle {
    bundle(name, replicas, &[POOL], [job("enc", 60, band)])
}

/// (node, state) of each replica's job, from the Bundle's status.
fn replicas_of(b: &Bundle) -> Vec<(String, JobState)> {
    b.status
        .iter()
        .flat_map(|s| &s.replicas)
        .map(|r| {
            r.jobs
                .first()
                .map_or((String::new(), JobState::Pending), |j| {
                    (j.node_id.clone().unwrap_or_default(), j.state)
                })
        })
        .collect()
}

/// [`replicas_of`] Bundle `name` now.
async fn replicas(stack: &Stack, name: &str) -> Vec<(String, JobState)> {
    replicas_of(&stack.bundle(name).await)
}

/// The pair's `RebalanceNeeded` condition.
async fn rebalance_condition(stack: &Stack) -> Option<automanager_api::Condition> {
    stack
        .bundle("pair")
        .await
        .condition("RebalanceNeeded")
        .cloned()
}

async fn migrations(stack: &Stack) -> Vec<Migration> {
    stack.list().await
}

fn running(n: &str) -> (String, JobState) {
    (n.to_owned(), JobState::Running)
}

/// A stack with `pair` (a two-replica gold bundle) on a1 and a2 and the blocker on a3; then a2
/// is killed and the pair's replica 1 recovers on b1, and the rebalancer says it waits for
/// room. The invariant checker runs from the start.
async fn split_pair(pair: Bundle) -> (Stack, Monitor) {
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
    stack.create(&pool).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    stack.create(&pair).await;
    stack.expect_ready("pair").await;
    stack.create(&row_bundle("blocker", 1, Bronze)).await;
    stack.expect_ready("blocker").await;
    assert_eq!(
        replicas(&stack, "pair").await,
        vec![running("a1"), running("a2")]
    );
    assert_eq!(replicas(&stack, "blocker").await, vec![running("a3")]);
    let c = rebalance_condition(&stack).await;
    assert_eq!(
        c.as_ref().map(|c| c.reason.as_str()),
        Some("SoftRulesHold"),
        "{c:?}"
    );

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
        .wait_until("pair", "to recover replica 1 on b1", |b: &Bundle| {
            replicas_of(b) == vec![running("a1"), running("b1")]
        })
        .await;
    let p: Bundle = stack
        .wait_for_reason("pair", "RebalanceNeeded", "WaitingForCapacity")
        .await;
    assert!(p.has_condition("RebalanceNeeded"), "{}", show(&p));
    assert!(
        p.condition_message("RebalanceNeeded")
            .is_some_and(|m| m.contains("replica 1 breaks soft rule(s) interSameZone")),
        "{}",
        show(&p)
    );
    let broken = p
        .status
        .as_ref()
        .and_then(|s| s.replicas.iter().find(|r| r.replica == 1))
        .and_then(|r| r.jobs.first())
        .and_then(|j| j.last_placement.as_ref())
        .map(|t| t.broken_soft_rules.clone());
    assert_eq!(
        broken,
        Some(vec!["interSameZone".to_owned()]),
        "{}",
        show(&p)
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
    stack.delete::<Bundle>("blocker").await;
}

/// Replica 1 moves back to a3 by one completed rebalancing Migration; the condition clears.
async fn assert_moved_back(stack: &Stack) {
    stack
        .wait_until(
            "pair",
            "to have replica 1 back in za on a3",
            |b: &Bundle| replicas_of(b) == vec![running("a1"), running("a3")],
        )
        .await;
    let migs = stack
        .wait_until_list(
            "",
            "the rebalancing Migration completed",
            |ms: &[Migration]| {
                (ms.len() == 1 && ms[0].phase() == Some(MigrationPhase::Completed))
                    .then(|| ms.to_vec())
            },
        )
        .await;
    let mig = &migs[0];
    let purpose = mig
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(PURPOSE_LABEL))
        .map(String::as_str);
    assert_eq!(purpose, Some("rebalance"), "{}", show(mig));
    assert_eq!(mig.spec.job.replica, 1);
    assert_eq!(mig.spec.target_node.as_deref(), Some("a3"));
    assert_eq!(
        mig.strategy(),
        Some(MigrationStrategy::StopThenStart),
        "the job declares nothing: its declared strategy is the default"
    );
    stack
        .wait_until("pair", "to clear RebalanceNeeded", |b: &Bundle| {
            b.condition_status("RebalanceNeeded") == Some(ConditionStatus::False)
                && b.condition_reason("RebalanceNeeded") == Some("SoftRulesHold")
        })
        .await;
    let m = manager_state(&stack.sim_endpoint).await.unwrap();
    let zones: Vec<String> = ["a1", "a3"]
        .iter()
        .map(|n| m.zone_of(n).unwrap_or_default().to_owned())
        .collect();
    assert_eq!(zones, vec!["za", "za"]);
    stack
        .expect_event("pair", "RebalanceStarted", &["from b1 to a3"])
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
    let (stack, monitor) = split_pair(row_bundle("pair", 2, Gold).rebalancing()).await;
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
    let (stack, monitor) = split_pair(
        row_bundle("pair", 2, Gold)
            .rebalancing()
            .disruption_budget(0),
    )
    .await;
    let sampler = MaxSampler::replicas_down(&stack.sim_endpoint, "default.pair", 2, "enc")
        .await
        .unwrap();
    free_a3(&stack).await;
    // The move is asked for, and waits: a budget of 0 allows no voluntary action.
    let mig = stack
        .wait_until_list(
            "",
            "the rebalancing Migration waits for the budget",
            |ms: &[Migration]| {
                ms.first()
                    .filter(|m| m.condition_reason("Queued") == Some("DisruptionBudget"))
                    .cloned()
            },
        )
        .await;
    assert_eq!(mig.phase(), Some(MigrationPhase::Pending), "{}", show(&mig));
    // Longer than the bundle's look-again interval while it would rebalance (10 s), so the
    // rebalancer looks again while the Migration waits.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(migrations(&stack).await.len(), 1, "one rebalance at a time");
    assert_eq!(
        replicas(&stack, "pair").await,
        vec![running("a1"), running("b1")],
        "nothing moved while the budget says no"
    );
    let c = rebalance_condition(&stack).await;
    assert_eq!(
        c.as_ref().map(|c| c.reason.as_str()),
        Some("MigrationInProgress"),
        "{c:?}"
    );
    let (worst, _) = sampler.stop().await;
    assert_eq!(worst, 0, "no replica went down while the budget was 0");

    // The budget is raised: the move goes on.
    stack
        .merge_patch::<Bundle>(
            "pair",
            &serde_json::json!({"spec": {"disruption": {"maxUnavailableReplicas": 1}}}),
        )
        .await;
    assert_moved_back(&stack).await;
    finish(&stack, monitor, "fleet-rebalance-budget").await;
}
