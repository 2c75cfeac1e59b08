//! The disruption budget and the migration queue end to end: real apiserver + etcd, the
//! manager-sim binary and the operator binary, driven with kubectl; the reliability suite's
//! invariant checker samples Manager's state throughout, and a second sampler counts the
//! replicas of the bundle under test that have no running instance.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use automanager_api::MigrationPhase::{Aborted, Completed, Pending};
use automanager_api::MigrationStrategy::Handover;
use automanager_api::PriorityBand::{Gold, Silver};
use automanager_api::{
    Bundle, BundlePhase, ConditionStatus, DrainMode, ManagerNode, Migration, NodeState,
};
use automanager_e2e::apply_example_pools;
use automanager_e2e::reliability::{Monitor, settle};
use automanager_e2e::sampler::MaxSampler;
use automanager_e2e::scenario::{
    BundleView, Conditions, EventView, JobManifest, MigrationManifest, MigrationView, bundle, job,
    migration, show,
};
use automanager_e2e::stack::Stack;
use chrono::{DateTime, Utc};
use kube::ResourceExt;

const WAIT: Duration = Duration::from_secs(120);
/// How long a provisioned node takes to start in these tests: long enough that a second
/// voluntary action arrives while the first is still under way, however loaded the machine.
const SLOW_PROVISION_MS: &str = "3000";

/// A two-replica gold bundle on the on-prem pool that spills into aws-east; the job declares
/// nothing, so it moves with `stopThenStart` (the replica is down while it moves).
fn pair_bundle(name: &str) -> Bundle {
    bundle(
        name,
        2,
        &["onprem", "aws-east"],
        [job("enc", 20, Gold).cores(2)],
    )
}

/// A stack with the pair bundle `name` running on onprem-a1 and onprem-b1, new nodes slow to
/// start, and the invariant checker and a sampler of the pair's replicas down running.
async fn start_with_pair(name: &str) -> (Stack, Monitor, MaxSampler) {
    let stack = Stack::start().await.expect("stack");
    apply_example_pools(&stack).await.unwrap();
    pair_on_a1_and_b1(&stack, name).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let sampler =
        MaxSampler::replicas_down(&stack.sim_endpoint, &format!("default.{name}"), 2, "enc")
            .await
            .unwrap();
    (stack, monitor, sampler)
}

/// When a drained node's work ended: Manager's stop of the node (`stoppedAt`), or, for a node
/// Manager leaves up to its owner (a physical node over the published API), its drain's
/// completion, once our last job on it was gone.
fn work_ended_at(n: &ManagerNode) -> Option<DateTime<Utc>> {
    let s = n.status.as_ref()?;
    s.stopped_at
        .or_else(|| s.drain.as_ref().and_then(|d| d.completed_at))
}

/// Cordons onprem-a2, runs the pair bundle (its replicas land on onprem-a1 and onprem-b1,
/// different nodes being a hard rule), then makes new nodes slow to start.
async fn pair_on_a1_and_b1(stack: &Stack, name: &str) {
    stack.cordon("onprem-a2").await;
    stack.wait_cordoned("onprem-a2", true).await;
    stack.create(&pair_bundle(name)).await;
    let b = stack.expect_ready(name).await;
    let mut placed: Vec<Option<&str>> = (0..2).map(|r| b.node_of(r, "enc")).collect();
    placed.sort_unstable();
    assert_eq!(
        placed,
        [Some("onprem-a1"), Some("onprem-b1")],
        "{}",
        show(&b)
    );
    stack.chaos(&["slow-provision", SLOW_PROVISION_MS]).unwrap();
}

/// The value of one sample in the operator's /metrics, 0 when absent.
async fn metric(stack: &Stack, sample: &str) -> f64 {
    let (_, text) = stack.http_get("/metrics").await.unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Stops both samplers, asserts the invariant checker saw nothing broken (and settles), and
/// that no more than one replica of the bundle was ever down at once.
async fn assert_budget_and_invariants(stack: &Stack, monitor: Monitor, sampler: MaxSampler) {
    let (worst, down_samples) = sampler.stop().await;
    let (mut v, samples) = monitor.stop().await;
    let (settled, took) = settle(stack, WAIT).await.unwrap();
    v.merge(&settled);
    eprintln!(
        "disruption: {samples} invariant samples, {down_samples} budget samples, worst replicas down at once {worst}, settled in {took:?}"
    );
    assert!(v.is_clean(), "{}", v.details());
    assert!(down_samples > 10, "the budget sampler saw too little");
    assert!(
        worst <= 1,
        "{worst} replicas of the pair were down at once: the budget allows 1"
    );
}

#[tokio::test]
async fn draining_both_nodes_of_a_pair_moves_one_replica_at_a_time() {
    let (stack, monitor, sampler) = start_with_pair("pair").await;

    // Both nodes drained at once: the budget lets one replica move, the other waits.
    for node in ["onprem-a1", "onprem-b1"] {
        stack.drain(node, DrainMode::Migrate).await;
    }
    let mut queued_by_budget: Option<(Migration, String)> = None;
    let mut node_blocked: Option<String> = None;
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        for m in stack.migrations().await.values() {
            if m.has_condition("Queued") && m.condition_reason("Queued") == Some("DisruptionBudget")
            {
                let message = m.condition_message("Queued").unwrap_or_default().to_owned();
                queued_by_budget.get_or_insert_with(|| (m.clone(), message));
            }
        }
        let mut done = true;
        for node in ["onprem-a1", "onprem-b1"] {
            let n = stack.node(node).await;
            if n.has_condition("DisruptionBlocked") {
                let message = n.condition_message("DisruptionBlocked").unwrap_or_default();
                node_blocked.get_or_insert_with(|| message.to_owned());
            }
            done &= automanager_e2e::scenario::drained(&n);
        }
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the drains did not complete within {WAIT:?}:\n{}",
            show(&stack.migrations().await)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (waiting, message) = queued_by_budget.expect("a drain Migration waited for the budget");
    assert!(
        message.contains("Bundle default/pair allows 1 replica(s) down at once"),
        "{message}"
    );
    let position = waiting.status.as_ref().and_then(|s| s.queue_position);
    assert!(position >= Some(1), "{}", show(&waiting));
    let node_message = node_blocked.expect("a drained node said it waits for the budget");
    assert!(
        node_message.contains("Bundle default/pair"),
        "{node_message}"
    );
    // Events are published off the reconcile path, a moment after the status.
    stack
        .wait_for_event("a DisruptionBlocked Event naming default/pair", |e| {
            e.reason_str() == "DisruptionBlocked" && e.note_str().contains("default/pair")
        })
        .await;

    // The two moves did not overlap: the second was admitted only once the first completed.
    let all = stack.migrations().await;
    let mut moves: Vec<(DateTime<Utc>, DateTime<Utc>)> = all
        .values()
        .map(|m| {
            assert_eq!(m.phase(), Some(Completed), "{}", show(m));
            (m.admitted_at().unwrap(), m.entered(Completed).unwrap())
        })
        .collect();
    moves.sort();
    assert_eq!(moves.len(), 2, "{}", show(&all));
    assert!(
        moves[1].0 >= moves[0].1,
        "the second move began at {} before the first completed at {}",
        moves[1].0,
        moves[0].1
    );
    let b = stack.expect_ready("pair").await;
    for r in 0..2 {
        let node = b.node_of(r, "enc").unwrap();
        assert!(
            !node.starts_with("onprem-a1") && !node.starts_with("onprem-b1"),
            "{}",
            show(&b)
        );
    }
    assert!(
        metric(
            &stack,
            "automanager_disruptions_blocked_total{action=\"migration\"}"
        )
        .await
            >= 1.0
    );
    assert_budget_and_invariants(&stack, monitor, sampler).await;
}

#[tokio::test]
async fn a_terminate_drain_waits_until_the_other_replica_is_back() {
    let (stack, monitor, sampler) = start_with_pair("twin").await;

    // One replica is moving (its target takes seconds to start)...
    stack.drain("onprem-a1", DrainMode::Migrate).await;
    stack
        .wait_until_list("", "the first move under way", |ms: &[Migration]| {
            ms.iter().any(|m| m.admitted_at().is_some()).then_some(())
        })
        .await;
    // ... so terminating the other's node waits, and says why.
    stack.drain("onprem-b1", DrainMode::Terminate).await;
    let node: ManagerNode = stack
        .wait_for_condition("onprem-b1", "DisruptionBlocked", ConditionStatus::True)
        .await;
    assert_eq!(
        node.status.as_ref().map(|s| s.state),
        Some(NodeState::Started),
        "{}",
        show(&node)
    );
    let message = node.condition_message("DisruptionBlocked").unwrap();
    assert!(message.contains("Bundle default/twin"), "{message}");
    assert_eq!(
        node.condition_reason("DisruptionBlocked"),
        Some("DisruptionBudget")
    );

    // Once the first replica runs again, the terminate goes ahead; the second recovers by band.
    stack.wait_drained("onprem-a1").await;
    let b1 = stack.wait_drained("onprem-b1").await;
    let moved = stack.migrations().await;
    let completed = moved
        .values()
        .find_map(|m| m.entered(Completed))
        .expect("the first move completed");
    let stopped = work_ended_at(&b1).expect("stoppedAt, or the drain's completion");
    // stoppedAt is Manager's clock in whole seconds at worst.
    assert!(
        stopped + chrono::TimeDelta::seconds(1) >= completed,
        "onprem-b1's work ended at {stopped}, before the other replica's move completed at {completed}"
    );
    assert_eq!(
        b1.condition_status("DisruptionBlocked"),
        Some(ConditionStatus::False),
        "{}",
        show(&b1)
    );
    // The second replica is back by its band. The bundle also said Ready before the terminate,
    // so wait until neither drained node holds a job of it: killing the other replica's node
    // below while this one is still recovering would take both down.
    stack
        .wait_until(
            "twin",
            "to be Ready off both drained nodes",
            |b: &Bundle| {
                b.phase() == Some(BundlePhase::Ready)
                    && !b.has_job_on("onprem-a1")
                    && !b.has_job_on("onprem-b1")
            },
        )
        .await;
    assert!(
        metric(
            &stack,
            "automanager_disruptions_blocked_total{action=\"drain\"}"
        )
        .await
            >= 1.0
    );

    // An involuntary failure is never held back, only counted.
    let before = metric(
        &stack,
        "automanager_involuntary_disruptions_total{cause=\"nodeLost\"}",
    )
    .await;
    let victim = stack
        .bundle("twin")
        .await
        .node_of(0, "enc")
        .unwrap()
        .to_owned();
    stack.chaos(&["kill-node", &victim]).unwrap();
    stack
        .wait_until("twin", "to have the killed replica back", |b: &Bundle| {
            b.phase() == Some(BundlePhase::Ready) && b.node_of(0, "enc") != Some(victim.as_str())
        })
        .await;
    let after = metric(
        &stack,
        "automanager_involuntary_disruptions_total{cause=\"nodeLost\"}",
    )
    .await;
    assert!(after > before, "{before} -> {after}");
    assert_budget_and_invariants(&stack, monitor, sampler).await;
}

/// A one-replica silver bundle on the on-prem pool whose job hands over (the job socket).
fn handover_bundle(name: &str) -> Bundle {
    bundle(
        name,
        1,
        &["onprem"],
        [job("enc", 20, Silver).cores(2).moves_by(Handover)],
    )
}

#[tokio::test]
async fn more_migrations_than_the_limit_queue_by_priority_and_all_complete() {
    let stack = Stack::start_with(|c| {
        c.insert(
            "migration".into(),
            serde_json::json!({"maxParallel": 2, "maxParallelPerNode": 2}),
        );
    })
    .await
    .expect("stack");
    apply_example_pools(&stack).await.unwrap();
    // Six jobs; two plain Migrations, then two for consolidation, then two plain again, all
    // created at once. Each handover is held at cutover for a while, so the limit is what
    // keeps the others waiting.
    let names: Vec<String> = (0..6).map(|i| format!("q{i}")).collect();
    for n in &names {
        stack.create(&handover_bundle(n)).await;
    }
    for n in &names {
        stack.expect_ready(n).await;
        stack
            .chaos(&[
                "migration-behaviour",
                &format!("default.{n}/0/enc"),
                "slow-cutover",
                "1500",
            ])
            .unwrap();
    }
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let in_manager = MaxSampler::migrations_running(&stack.sim_endpoint)
        .await
        .unwrap();
    let purposes = [
        None,
        None,
        Some("consolidation"),
        Some("consolidation"),
        None,
        None,
    ];
    let all: Vec<Migration> = names
        .iter()
        .zip(purposes)
        .map(|(n, p)| {
            let m = migration(&format!("m{n}"), n, 0, "enc");
            match p {
                Some(p) => m.for_purpose(p),
                None => m,
            }
        })
        .collect();
    stack.create_all(&all).await;

    // While they run: never more than two past Pending, and the waiting ones say why.
    let mut most_running = 0;
    let mut queued_seen: Option<Migration> = None;
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let ms = stack.migrations().await;
        let running = ms
            .values()
            .filter(|m| m.phase().unwrap_or(Pending) != Pending && !m.finished())
            .count();
        most_running = most_running.max(running);
        for m in ms.values() {
            if m.has_condition("Queued") && m.condition_reason("Queued") == Some("QueueFull") {
                queued_seen.get_or_insert_with(|| m.clone());
            }
        }
        let done = ms.len() == 6 && ms.values().all(|m| m.phase() == Some(Completed));
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the migrations did not all complete within {WAIT:?}:\n{}",
            show(&ms)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (most_in_manager, samples) = in_manager.stop().await;
    eprintln!(
        "queue: at most {most_running} Migrations past Pending (polled), at most {most_in_manager} unfinished in Manager ({samples} samples)"
    );
    assert!(most_running <= 2, "{most_running} ran at once");
    assert!(
        most_in_manager <= 2,
        "Manager ran {most_in_manager} at once"
    );
    assert!(
        most_in_manager >= 2,
        "the limit was never reached: the test shows nothing"
    );
    let q = queued_seen.expect("a Migration waited with reason QueueFull");
    let position = q.status.as_ref().and_then(|s| s.queue_position);
    assert!(position >= Some(1), "{}", show(&q));
    assert!(
        q.condition_message("Queued")
            .is_some_and(|m| m.contains("migration.maxParallel (2)")),
        "{}",
        show(&q)
    );

    // From the status: at most two at once over the whole run, and the consolidation ones
    // began only after every plain one had.
    let ms = stack.migrations().await;
    let spans: BTreeMap<&str, (DateTime<Utc>, DateTime<Utc>)> = ms
        .iter()
        .map(|(k, m)| {
            (
                k.as_str(),
                (m.admitted_at().unwrap(), m.entered(Completed).unwrap()),
            )
        })
        .collect();
    for (k, (begin, _)) in &spans {
        let overlapping = spans
            .values()
            .filter(|(b, e)| b <= begin && begin < e)
            .count();
        assert!(
            overlapping <= 2,
            "{k}: {overlapping} running when it began: {spans:#?}"
        );
    }
    let last_plain = ["mq0", "mq1", "mq4", "mq5"]
        .iter()
        .map(|k| spans[k].0)
        .max()
        .unwrap();
    let first_consolidation = ["mq2", "mq3"].iter().map(|k| spans[k].0).min().unwrap();
    assert!(
        first_consolidation >= last_plain,
        "a consolidation migration began at {first_consolidation}, before a drain-rank one at {last_plain}: {spans:#?}"
    );
    let (v, samples) = monitor.stop().await;
    let (settled, took) = settle(&stack, WAIT).await.unwrap();
    eprintln!("queue: {samples} invariant samples, settled in {took:?}");
    assert!(
        v.is_clean() && settled.is_clean(),
        "{}\n{}",
        v.details(),
        settled.details()
    );
}

/// A daily window that opens twelve hours from now's hour: closed for this test's life.
fn closed_window() -> serde_json::Value {
    use chrono::Timelike;
    let hour = (Utc::now().hour() + 12) % 24;
    serde_json::json!({"windows": [{"schedule": format!("0 {hour} * * *"), "duration": "1h"}]})
}

/// A one-job gold bundle declaring `strategy`, on onprem, whose disruption window is closed.
fn windowed(name: &str, strategy: automanager_api::MigrationStrategy) -> Bundle {
    let mut b = bundle(
        name,
        1,
        &["onprem"],
        [job("enc", 20, Gold).cores(2).moves_by(strategy)],
    );
    b.spec.disruption = Some(serde_json::from_value(closed_window()).unwrap());
    b
}

#[tokio::test]
async fn a_reclaim_notice_during_a_held_drain_moves_overlap_and_handover_jobs_before_the_deadline()
{
    let stack = Stack::start().await.expect("stack");
    apply_example_pools(&stack).await.unwrap();
    // Both jobs on onprem-a1, then room elsewhere.
    for other in ["onprem-a2", "onprem-b1"] {
        stack.cordon(other).await;
        stack.wait_cordoned(other, true).await;
    }
    let strategies = [
        ("ov", automanager_api::MigrationStrategy::Overlap),
        ("ho", Handover),
    ];
    for (name, strategy) in strategies {
        stack.create(&windowed(name, strategy)).await;
        let b = stack.expect_ready(name).await;
        assert_eq!(b.node_of(0, "enc"), Some("onprem-a1"), "{}", show(&b));
    }
    for other in ["onprem-a2", "onprem-b1"] {
        stack.uncordon(other).await;
        stack.wait_cordoned(other, false).await;
    }

    // The drain's Migrations wait for the closed window.
    stack.drain("onprem-a1", DrainMode::Migrate).await;
    let held: Vec<String> = stack
        .wait_for("both drain Migrations held by the window", WAIT, || async {
            let held: Vec<String> = (stack.try_list::<Migration>("").await?.iter())
                .filter(|m| m.name_any().starts_with("drain-"))
                .filter(|m| m.condition_reason("Queued") == Some("DisruptionWindow"))
                .map(|m| m.name_any())
                .collect();
            Ok((held.len() == 2).then_some(held))
        })
        .await
        .unwrap();

    // Manager takes the node in 20 s.
    stack
        .chaos(&["notice-node", "onprem-a1", "--in", "20"])
        .unwrap();
    for name in &held {
        let m = stack.expect_migration_phase(name, Aborted).await;
        assert_eq!(
            m.condition_reason("Aborted"),
            Some("Superseded"),
            "{}",
            show(&m)
        );
    }
    let reclaim: Vec<Migration> = stack
        .wait_for("both reclaim Migrations completed", WAIT, || async {
            let done: Vec<Migration> = (stack.try_list::<Migration>("").await?.into_iter())
                .filter(|m| m.name_any().starts_with("reclaim-") && m.phase() == Some(Completed))
                .collect();
            Ok((done.len() == 2).then_some(done))
        })
        .await
        .unwrap();
    stack
        .expect_event(
            "onprem-a1",
            "ReclaimNotice",
            &[
                "2 job(s) moving now (taking over held Migration(s) ",
                "left to band recovery: none",
            ],
        )
        .await;

    // Past the deadline: the node is gone, the jobs never were without a running instance.
    stack
        .wait_until("onprem-a1", "to be terminated", |n: &ManagerNode| {
            n.status
                .as_ref()
                .is_some_and(|s| s.state == NodeState::Terminated)
        })
        .await;
    for (name, _) in strategies {
        let moved = reclaim
            .iter()
            .find(|m| m.spec.job.bundle == name)
            .expect("its reclaim Migration");
        let target = moved.target_node().expect("a target").to_owned();
        let history = stack
            .job_history(&automanager_e2e::scenario::job_id(name, 0, "enc"))
            .await;
        assert_eq!(
            history.starts,
            [
                ("onprem-a1".to_owned(), "normal".to_owned()),
                (target, "migrationTarget".to_owned())
            ],
            "{name}: moved once, never restarted: {}",
            show(&history)
        );
        assert_eq!(
            (history.gaps, history.uncovered_ms),
            (0, 0),
            "{name}: {}",
            show(&history)
        );
    }
    assert!(
        stack.events_for("DrainFallback").await.is_empty(),
        "the drain handed nothing to recovery"
    );
    println!("reliability4-figure notice_vs_held_gaps=0");
}

/// The pair bundle `name` with a budget of no replica down at once: every voluntary
/// terminate of one of its nodes is held by the budget for as long as it is asked.
fn unspareable_pair(name: &str) -> Bundle {
    let mut b = pair_bundle(name);
    b.spec.disruption =
        Some(serde_json::from_value(serde_json::json!({"maxUnavailableReplicas": 0})).unwrap());
    b
}

#[tokio::test]
async fn a_terminate_drain_held_past_the_bound_proceeds_when_asked_and_one_that_waits_is_counted() {
    let stack = Stack::start_with(|c| {
        c.insert(
            "disruption".into(),
            serde_json::json!({"holdWarnAfter": "5s"}),
        );
    })
    .await
    .expect("stack");
    apply_example_pools(&stack).await.unwrap();
    stack.cordon("onprem-a2").await;
    stack.wait_cordoned("onprem-a2", true).await;
    stack.create(&unspareable_pair("solo")).await;
    stack.expect_ready("solo").await;
    // A migrate drain always waits: the apiserver refuses whenHeld on it.
    let refused = stack
        .env
        .run_kubectl([
            "patch",
            "managernode",
            "onprem-a2",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"drain":{"mode":"migrate","whenHeld":"Proceed"}}}"#,
        ])
        .await
        .expect("kubectl runs");
    assert!(
        !refused.success()
            && refused
                .stderr
                .contains("whenHeld applies to mode: terminate"),
        "{}",
        refused.stderr
    );

    // Both nodes drained with terminate: onprem-b1 may proceed past the bound, onprem-a1 waits.
    automanager_e2e::patch_node(
        &stack,
        "onprem-b1",
        r#"{"spec":{"drain":{"mode":"terminate","whenHeld":"Proceed"}}}"#,
    )
    .await;
    stack.drain("onprem-a1", DrainMode::Terminate).await;

    // At once: held, by whom, since when.
    let held: ManagerNode = stack
        .wait_until("onprem-b1", "to say it is held", |n: &ManagerNode| {
            n.status.as_ref().is_some_and(|s| s.held.is_some())
        })
        .await;
    let hold = held.status.as_ref().and_then(|s| s.held.clone()).unwrap();
    assert_eq!(
        (hold.kind, hold.holder.as_str()),
        (
            automanager_api::HoldKind::DisruptionBudget,
            "Bundle default/solo"
        ),
        "{}",
        show(&held)
    );
    assert!(
        hold.message.contains("Bundle default/solo"),
        "{}",
        hold.message
    );
    stack
        .expect_event("onprem-b1", "DisruptionBlocked", &["Bundle default/solo"])
        .await;

    // Past the bound: onprem-b1 goes, as the library's drainNode would, and says so.
    stack
        .expect_event("onprem-b1", "DrainProceeded", &["whenHeld: Proceed"])
        .await;
    let b1 = stack.wait_drained("onprem-b1").await;
    let hold = b1
        .status
        .as_ref()
        .and_then(|s| s.held.clone())
        .expect("held");
    assert!(hold.proceeded_at.is_some(), "{}", show(&b1));
    assert!(hold.past_bound_at.is_some(), "{}", show(&b1));
    assert!(
        hold.since + chrono::TimeDelta::seconds(5) <= hold.proceeded_at.unwrap(),
        "proceeded before the bound: {hold:?}"
    );
    // onprem-a1 keeps waiting, warned about and counted.
    stack
        .expect_event("onprem-a1", "HeldTooLong", &["whenHeld: Wait"])
        .await;
    let a1: ManagerNode = stack.node("onprem-a1").await;
    assert_eq!(
        a1.status.as_ref().map(|s| s.state),
        Some(NodeState::Started),
        "{}",
        show(&a1)
    );
    assert_eq!(
        a1.condition_reason("DisruptionBlocked"),
        Some("DisruptionBudget")
    );
    let sample = "automanager_held_moves{kind=\"drain\",reason=\"DisruptionBudget\"}";
    assert_eq!(metric(&stack, sample).await, 1.0, "onprem-a1 only");
    assert_eq!(stack.events_for("DrainProceeded").await.len(), 1);

    // The terminated node's replica recovers by its band (gold), off both drained nodes.
    stack
        .wait_until("solo", "to be Ready off onprem-b1", |b: &Bundle| {
            b.phase() == Some(BundlePhase::Ready) && !b.has_job_on("onprem-b1")
        })
        .await;
}
