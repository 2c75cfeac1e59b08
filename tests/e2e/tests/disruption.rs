//! The disruption budget and the migration queue end to end: real apiserver + etcd, the
//! manager-sim binary and the operator binary, driven with kubectl; the reliability suite's
//! invariant checker samples Manager's state throughout, and a second sampler counts the
//! replicas of the bundle under test that have no running instance.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use automanager_e2e::reliability::{Monitor, settle};
use automanager_e2e::sampler::MaxSampler;
use automanager_e2e::stack::Stack;
use automanager_e2e::{apply, apply_example_pools, condition, patch_node, wait_drained};
use chrono::{DateTime, Utc};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);
/// How long a provisioned node takes to start in these tests: long enough that a second
/// voluntary action arrives while the first is still under way, however loaded the machine.
const SLOW_PROVISION_MS: &str = "3000";

/// A two-replica gold bundle on the on-prem pool that spills into aws-east; the job declares
/// nothing, so it moves with `stopThenStart` (the replica is down while it moves).
fn pair_bundle(name: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  replicas: 2\n  pools: [onprem, aws-east]\n  jobs:\n    - jobName: enc\n      requirements: {{requiredCapacity: 20, requiredCores: 2, priorityBand: gold}}\n"
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

/// Cordons onprem-a2, runs the pair bundle (its replicas land on onprem-a1 and onprem-b1,
/// different nodes being a hard rule), then makes new nodes slow to start.
async fn pair_on_a1_and_b1(stack: &Stack, name: &str) {
    patch_node(stack, "onprem-a2", r#"{"spec":{"cordoned":true}}"#).await;
    stack
        .wait_for("onprem-a2 cordoned", WAIT, || async {
            let n = stack.get_json(&["managernode", "onprem-a2"]).await?;
            Ok((condition(&n, "Cordoned")["status"] == "True").then_some(()))
        })
        .await
        .unwrap();
    apply(stack, &pair_bundle(name)).await;
    let b = stack
        .wait_bundle_phase("default", name, "Ready", WAIT)
        .await
        .unwrap();
    let mut placed: Vec<&str> = (0..2)
        .map(|r| {
            b["status"]["replicas"][r]["jobs"][0]["nodeId"]
                .as_str()
                .unwrap()
        })
        .collect();
    placed.sort_unstable();
    assert_eq!(placed, ["onprem-a1", "onprem-b1"], "{b:#}");
    stack.chaos(&["slow-provision", SLOW_PROVISION_MS]).unwrap();
}

/// The Migrations in `default`, by name.
async fn migrations(stack: &Stack) -> BTreeMap<String, Value> {
    let list = stack
        .get_json(&["migrations", "-n", "default"])
        .await
        .unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["metadata"]["name"].as_str().unwrap().to_owned(),
                m.clone(),
            )
        })
        .collect()
}

/// When a Migration first entered a phase that `which` picks.
fn first_phase(m: &Value, which: impl Fn(&Value) -> bool) -> Option<DateTime<Utc>> {
    m["status"]["phases"]
        .as_array()?
        .iter()
        .find(|p| which(&p["phase"]))
        .and_then(|p| p["enteredAt"].as_str())
        .and_then(|t| t.parse().ok())
}

/// When a Migration entered `phase`.
fn entered(m: &Value, phase: &str) -> Option<DateTime<Utc>> {
    first_phase(m, |p| p == phase)
}

/// When a Migration left `Pending` (admitted by the queue): the first other phase it entered.
fn admitted_at(m: &Value) -> Option<DateTime<Utc>> {
    first_phase(m, |p| p != "Pending")
}

/// The Events with `reason`, as `(regarding name, note)`.
async fn events(stack: &Stack, reason: &str) -> Vec<(String, String)> {
    let list = stack
        .get_json(&[
            "events.events.k8s.io",
            "-A",
            "--field-selector",
            &format!("reason={reason}"),
        ])
        .await
        .unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["regarding"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                e["note"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
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
        patch_node(&stack, node, r#"{"spec":{"drain":{"mode":"migrate"}}}"#).await;
    }
    let mut queued_by_budget = None;
    let mut node_blocked = None;
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        for m in migrations(&stack).await.values() {
            let q = condition(m, "Queued");
            if q["status"] == "True" && q["reason"] == "DisruptionBudget" {
                queued_by_budget.get_or_insert_with(|| (m.clone(), q["message"].clone()));
            }
        }
        let mut done = true;
        for node in ["onprem-a1", "onprem-b1"] {
            let n = stack.get_json(&["managernode", node]).await.unwrap();
            let c = condition(&n, "DisruptionBlocked");
            if c["status"] == "True" {
                node_blocked.get_or_insert_with(|| c["message"].clone());
            }
            done &= n["status"]["drain"]["completedAt"].is_string()
                && n["status"]["state"] != "started";
        }
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the drains did not complete within {WAIT:?}:\n{:#?}",
            migrations(&stack).await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    let (waiting, message) = queued_by_budget.expect("a drain Migration waited for the budget");
    let message = message.as_str().unwrap();
    assert!(
        message.contains("Bundle default/pair allows 1 replica(s) down at once"),
        "{message}"
    );
    assert!(
        waiting["status"]["queuePosition"].as_i64() >= Some(1),
        "{waiting:#}"
    );
    let node_message = node_blocked.expect("a drained node said it waits for the budget");
    assert!(
        node_message
            .as_str()
            .unwrap()
            .contains("Bundle default/pair"),
        "{node_message}"
    );
    // Events are published off the reconcile path, a moment after the status.
    stack
        .wait_for(
            "a DisruptionBlocked Event naming default/pair",
            WAIT,
            || async {
                let blocked_events = events(&stack, "DisruptionBlocked").await;
                Ok(blocked_events
                    .iter()
                    .any(|(_, note)| note.contains("default/pair"))
                    .then_some(()))
            },
        )
        .await
        .unwrap();

    // The two moves did not overlap: the second was admitted only once the first completed.
    let all = migrations(&stack).await;
    let mut moves: Vec<(DateTime<Utc>, DateTime<Utc>)> = all
        .values()
        .map(|m| {
            assert_eq!(m["status"]["phase"], "Completed", "{m:#}");
            (admitted_at(m).unwrap(), entered(m, "Completed").unwrap())
        })
        .collect();
    moves.sort();
    assert_eq!(moves.len(), 2, "{all:#?}");
    assert!(
        moves[1].0 >= moves[0].1,
        "the second move began at {} before the first completed at {}",
        moves[1].0,
        moves[0].1
    );
    let b = stack
        .wait_bundle_phase("default", "pair", "Ready", WAIT)
        .await
        .unwrap();
    for r in 0..2 {
        let node = b["status"]["replicas"][r]["jobs"][0]["nodeId"]
            .as_str()
            .unwrap();
        assert!(
            !node.starts_with("onprem-a1") && !node.starts_with("onprem-b1"),
            "{b:#}"
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
    patch_node(
        &stack,
        "onprem-a1",
        r#"{"spec":{"drain":{"mode":"migrate"}}}"#,
    )
    .await;
    stack
        .wait_for("the first move under way", WAIT, || async {
            Ok(migrations(&stack)
                .await
                .values()
                .any(|m| admitted_at(m).is_some())
                .then_some(()))
        })
        .await
        .unwrap();
    // ... so terminating the other's node waits, and says why.
    patch_node(
        &stack,
        "onprem-b1",
        r#"{"spec":{"drain":{"mode":"terminate"}}}"#,
    )
    .await;
    let blocked = stack
        .wait_for("onprem-b1 to wait for the budget", WAIT, || async {
            let n = stack.get_json(&["managernode", "onprem-b1"]).await?;
            let c = condition(&n, "DisruptionBlocked");
            Ok((c["status"] == "True").then(|| (n.clone(), c["message"].clone())))
        })
        .await
        .unwrap();
    let (node, message) = blocked;
    assert_eq!(node["status"]["state"], "started", "{node:#}");
    assert!(
        message.as_str().unwrap().contains("Bundle default/twin"),
        "{message}"
    );
    assert_eq!(
        condition(&node, "DisruptionBlocked")["reason"],
        "DisruptionBudget"
    );

    // Once the first replica runs again, the terminate goes ahead; the second recovers by band.
    wait_drained(&stack, "onprem-a1", WAIT).await;
    let b1 = wait_drained(&stack, "onprem-b1", WAIT).await;
    let moved = migrations(&stack).await;
    let completed = moved
        .values()
        .find_map(|m| entered(m, "Completed"))
        .expect("the first move completed");
    let stopped: DateTime<Utc> = b1["status"]["stoppedAt"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .expect("stoppedAt");
    // stoppedAt is Manager's clock in whole seconds at worst.
    assert!(
        stopped + chrono::TimeDelta::seconds(1) >= completed,
        "onprem-b1 stopped at {stopped}, before the other replica's move completed at {completed}"
    );
    assert_eq!(
        condition(&b1, "DisruptionBlocked")["status"],
        "False",
        "{b1:#}"
    );
    stack
        .wait_bundle_phase("default", "twin", "Ready", WAIT)
        .await
        .unwrap();
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
    let b = stack
        .get_json(&["bundle", "twin", "-n", "default"])
        .await
        .unwrap();
    let victim = b["status"]["replicas"][0]["jobs"][0]["nodeId"]
        .as_str()
        .unwrap()
        .to_owned();
    stack.chaos(&["kill-node", &victim]).unwrap();
    stack
        .wait_for("the killed replica to be back", WAIT, || async {
            let b = stack.get_json(&["bundle", "twin", "-n", "default"]).await?;
            let back = b["status"]["phase"] == "Ready"
                && b["status"]["replicas"][0]["jobs"][0]["nodeId"] != victim.as_str();
            Ok(back.then_some(()))
        })
        .await
        .unwrap();
    let after = metric(
        &stack,
        "automanager_involuntary_disruptions_total{cause=\"nodeLost\"}",
    )
    .await;
    assert!(after > before, "{before} -> {after}");
    assert_budget_and_invariants(&stack, monitor, sampler).await;
}

/// A one-replica silver bundle on the on-prem pool whose job hands over (the job socket).
fn handover_bundle(name: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  replicas: 1\n  pools: [onprem]\n  jobs:\n    - jobName: enc\n      requirements: {{requiredCapacity: 20, requiredCores: 2, priorityBand: silver}}\n      migration: {{strategy: handover}}\n"
    )
}

fn migration_yaml(name: &str, bundle: &str, purpose: Option<&str>) -> String {
    let labels = purpose
        .map(|p| format!(", labels: {{automanager.norsk.io/purpose: {p}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Migration\nmetadata: {{name: {name}, namespace: default{labels}}}\nspec:\n  job: {{bundle: {bundle}, replica: 0, jobName: enc}}\n"
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
        apply(&stack, &handover_bundle(n)).await;
    }
    for n in &names {
        stack
            .wait_bundle_phase("default", n, "Ready", WAIT)
            .await
            .unwrap();
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
    let all: String = names
        .iter()
        .zip(purposes)
        .map(|(n, p)| migration_yaml(&format!("m{n}"), n, p))
        .collect::<Vec<_>>()
        .join("---\n");
    apply(&stack, &all).await;

    // While they run: never more than two past Pending, and the waiting ones say why.
    let mut most_running = 0;
    let mut queued_seen = None;
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let ms = migrations(&stack).await;
        let running = ms
            .values()
            .filter(|m| {
                let p = m["status"]["phase"].as_str().unwrap_or("Pending");
                ![
                    "Pending",
                    "Completed",
                    "Aborted",
                    "Refused",
                    "Rejected",
                    "Failed",
                ]
                .contains(&p)
            })
            .count();
        most_running = most_running.max(running);
        for m in ms.values() {
            let q = condition(m, "Queued");
            if q["status"] == "True" && q["reason"] == "QueueFull" {
                queued_seen.get_or_insert_with(|| m.clone());
            }
        }
        let done = ms.len() == 6 && ms.values().all(|m| m["status"]["phase"] == "Completed");
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the migrations did not all complete within {WAIT:?}:\n{ms:#?}"
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
    assert!(q["status"]["queuePosition"].as_i64() >= Some(1), "{q:#}");
    assert!(
        condition(&q, "Queued")["message"]
            .as_str()
            .unwrap()
            .contains("migration.maxParallel (2)"),
        "{q:#}"
    );

    // From the status: at most two at once over the whole run, and the consolidation ones
    // began only after every plain one had.
    let ms = migrations(&stack).await;
    let spans: BTreeMap<&str, (DateTime<Utc>, DateTime<Utc>)> = ms
        .iter()
        .map(|(k, m)| {
            (
                k.as_str(),
                (admitted_at(m).unwrap(), entered(m, "Completed").unwrap()),
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
