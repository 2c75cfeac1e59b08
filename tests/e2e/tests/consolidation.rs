//! Consolidation on the real stack (kube-apiserver + etcd, manager-sim, the operator binary,
//! kubectl), with the reliability suite's invariant checker running alongside: a fragmented
//! elastic binpack pool is first planned in `dryRun` (the plan is in status, nothing moves),
//! then consolidated (`enabled`): the planned node is emptied through handover and overlap
//! Migrations and terminated, and no job is ever without a running instance (the sim's history
//! of every job) nor loses a handover participant; a node whose move fails is kept, with its
//! job running where it was; and a move waits for its Bundle's disruption budget.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use automanager_e2e::bench::SeenMigrations;
use automanager_e2e::reliability::{Monitor, manager_state, settle};
use automanager_e2e::stack::Stack;
use automanager_e2e::{apply, condition, wait_events};
use kube::api::Api;
use manager_client::proto::NodeState;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);
const POOL: &str = "packed";

/// An elastic pool of one zone, nodes of 100 capacity that advertise the job socket.
fn sim_config(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("manager-sim.yaml");
    std::fs::write(
        &path,
        format!(
            "listen: 127.0.0.1:0
timing: {{provisionDelayMs: 100, jobStartDelayMs: 20, jobStopDelayMs: 20}}
pools:
  - name: {POOL}
    kind: aws
    region: eu-west-1
    zones: [zn-a]
    scaleOut: elastic
    instanceTypes:
      - {{instanceType: m5.xlarge, capacity: 100, cores: 16}}
"
        ),
    )
    .unwrap();
    path
}

fn pool_yaml(consolidation: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {{name: {POOL}}}
spec:
  kind: aws
  region: eu-west-1
  zones: [zn-a]
  packingStrategy: binpack
  scaleOut: elastic
  candidateInstanceTypes:
    - {{instanceType: m5.xlarge, totalCapacity: 100, totalCores: 16, capabilities: []}}
{consolidation}"
    )
}

/// A one-replica silver bundle of one job taking 40 of a node's 100 (two per node).
fn bundle(name: &str, strategy: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: 1
  pools: [{POOL}]
  jobs:
    - jobName: enc
      requirements: {{requiredCapacity: 40, requiredCores: 2, priorityBand: silver}}
      migration: {{strategy: {strategy}}}
"
    )
}

/// The node each bundle's job runs on, from Bundle status.
async fn placement(stack: &Stack, names: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for n in names {
        let b = stack
            .get_json(&["bundle", n, "-n", "default"])
            .await
            .unwrap();
        let node = b["status"]["replicas"][0]["jobs"][0]["nodeId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        out.insert(n.clone(), node);
    }
    out
}

/// Nodes of the pool Manager runs (starting or started).
async fn live_nodes(stack: &Stack) -> Vec<String> {
    let m = manager_state(&stack.sim_endpoint).await.unwrap();
    let mut v: Vec<String> = m
        .nodes
        .values()
        .filter(|n| {
            n.pool == POOL
                && matches!(
                    NodeState::try_from(n.state),
                    Ok(NodeState::Starting | NodeState::Started)
                )
        })
        .map(|n| n.node_id.clone())
        .collect();
    v.sort();
    v
}

fn job_history(stack: &Stack, bundle: &str) -> Value {
    let out = stack
        .chaos(&["job-history", &format!("default.{bundle}/0/enc")])
        .unwrap();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

async fn consolidation_migrations(stack: &Stack) -> Vec<Value> {
    let l = stack
        .get_json(&[
            "migrations",
            "-n",
            "default",
            "-l",
            "automanager.norsk.io/purpose=consolidation",
        ])
        .await
        .unwrap();
    l["items"].as_array().cloned().unwrap_or_default()
}

/// What [`fragmented`] left: where each bundle of the wave ran, the bundles kept, and the
/// pool's nodes.
struct Fragmented {
    wave: BTreeMap<String, String>,
    kept: Vec<String>,
    nodes: Vec<String>,
}

/// A stack with a fragmented pool: a wave of six bundles of 40 (two per node, on three nodes;
/// `strategy(i)` for bundle `i`), then one bundle deleted per node, so each node is 40 % used:
/// three nodes where two would do.
async fn fragmented(strategy: impl Fn(usize) -> &'static str) -> (Stack, Fragmented) {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_custom(&sim_config(dir.path()), &[], |_| {})
        .await
        .expect("stack");
    apply(&stack, &pool_yaml("")).await;
    let names: Vec<String> = (0..6).map(|i| format!("ch-{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        apply(&stack, &bundle(n, strategy(i))).await;
        stack
            .wait_bundle_phase("default", n, "Ready", WAIT)
            .await
            .unwrap();
    }
    let wave = placement(&stack, &names).await;
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (b, n) in &wave {
        by_node.entry(n.clone()).or_default().push(b.clone());
    }
    assert_eq!(by_node.len(), 3, "binpack puts two per node: {wave:?}");
    let mut kept: Vec<String> = Vec::new();
    for jobs in by_node.values() {
        stack
            .env
            .run_kubectl(["delete", "bundle", "-n", "default", &jobs[0]])
            .await
            .unwrap();
        kept.push(jobs[1].clone());
    }
    stack
        .wait_for("three jobs left", WAIT, || async {
            let m = manager_state(&stack.sim_endpoint).await?;
            Ok((m.jobs.len() == 3).then_some(()))
        })
        .await
        .unwrap();
    let nodes = live_nodes(&stack).await;
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    (stack, Fragmented { wave, kept, nodes })
}

#[tokio::test]
async fn dry_run_shows_the_plan_then_enabled_empties_and_terminates_the_node_without_a_gap() {
    // Handover and overlap alike.
    let (stack, f) = fragmented(|i| {
        if i.is_multiple_of(2) {
            "handover"
        } else {
            "overlap"
        }
    })
    .await;
    let Fragmented {
        wave,
        kept,
        nodes: before,
    } = f;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();

    // dryRun: the plan is in status, nothing moves.
    apply(
        &stack,
        &pool_yaml("  consolidation: {mode: dryRun, minNodeAgeSeconds: 0, cooldownSeconds: 0}\n"),
    )
    .await;
    let pool = stack
        .wait_for("a dry-run plan in status", WAIT, || async {
            let p = stack.get_json(&["placementpool", POOL]).await?;
            Ok((condition(&p, "Consolidating")["reason"] == "DryRun"
                && p["status"]["consolidation"]["plannedNodes"] == 1)
                .then_some(p))
        })
        .await
        .unwrap();
    let plan = &pool["status"]["consolidation"]["plan"];
    let planned_node = plan[0]["node"].as_str().unwrap().to_owned();
    let planned_move = &plan[0]["moves"][0];
    let moved_bundle = planned_move["bundle"]
        .as_str()
        .unwrap()
        .trim_start_matches("default/")
        .to_owned();
    let planned_target = planned_move["targetNode"].as_str().unwrap().to_owned();
    assert_eq!(plan[0]["moves"].as_array().unwrap().len(), 1, "{pool:#}");
    assert_eq!(wave[&moved_bundle], planned_node, "{pool:#}");
    assert_ne!(planned_target, planned_node);
    let message = condition(&pool, "Consolidating")["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains(&format!("would empty 1 node(s): {planned_node} (1 moves)")),
        "{message}"
    );
    // Long enough for several passes: still nothing moved.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(live_nodes(&stack).await, before);
    assert!(consolidation_migrations(&stack).await.is_empty());
    assert_eq!(placement(&stack, &kept).await[&moved_bundle], planned_node);

    // enabled: the planned node is emptied into the planned target and terminated. (Its
    // Migrations go with its ManagerNode afterwards: a watch keeps what they said.)
    let seen = SeenMigrations::start(
        Api::namespaced(stack.env.client().clone(), "default"),
        "automanager.norsk.io/purpose=consolidation",
    );
    apply(
        &stack,
        &pool_yaml("  consolidation: {mode: enabled, minNodeAgeSeconds: 0, cooldownSeconds: 0}\n"),
    )
    .await;
    let pool = stack
        .wait_for(
            "one node consolidated, nothing more to do",
            WAIT,
            || async {
                let p = stack.get_json(&["placementpool", POOL]).await?;
                Ok((p["status"]["consolidation"]["nodesTerminated"] == 1
                    && condition(&p, "Consolidating")["reason"] == "NothingToConsolidate")
                    .then_some(p))
            },
        )
        .await
        .unwrap();
    let after = live_nodes(&stack).await;
    assert_eq!(after.len(), 2, "{after:?} {pool:#}");
    assert!(!after.contains(&planned_node), "{after:?}");
    let now = placement(&stack, &kept).await;
    assert_eq!(now[&moved_bundle], planned_target, "{now:?}");
    // The others stayed where they were.
    for b in kept.iter().filter(|b| **b != moved_bundle) {
        assert_eq!(now[b], wave[b], "{b}");
    }
    // The move went through the queue as a consolidation Migration and completed.
    let migs: Vec<Value> = seen
        .snapshot()
        .into_values()
        .map(|m| serde_json::to_value(m).unwrap())
        .collect();
    assert_eq!(migs.len(), 1, "{migs:#?}");
    let m = &migs[0];
    assert_eq!(m["status"]["phase"], "Completed", "{m:#}");
    assert_eq!(
        m["metadata"]["labels"]["automanager.norsk.io/purpose"],
        "consolidation"
    );
    assert_eq!(m["spec"]["targetNode"], planned_target.as_str());
    let mut dropped = 0u64;
    if m["status"]["strategy"] == "handover" {
        dropped += m["status"]["handover"]["failed"]
            .as_array()
            .map_or(0, |a| a.len() as u64);
    }
    // No job was ever without a running instance (the sim's accounting of every job).
    for b in &kept {
        let h = job_history(&stack, b);
        dropped += h["gaps"].as_u64().unwrap();
        assert_eq!(h["uncoveredMs"], 0, "{b}: {h:#}");
    }
    assert_eq!(dropped, 0, "dropped output");
    wait_events(
        &stack,
        &[&|l: &str| l.starts_with(POOL) && l.contains("NodeConsolidated")],
    )
    .await;
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains(&format!(
            "automanager_consolidation_nodes_terminated_total{{pool=\"{POOL}\"}} 1"
        )),
        "{metrics}"
    );
    // The pool's last node pair is a lower bound (two of 40 do not fit with a third): it stays.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(live_nodes(&stack).await, after);

    let (mut v, took) = settle(&stack, WAIT).await.unwrap();
    v.merge(&monitor.stop().await.0);
    eprintln!("{}", v.line("fleet-consolidation", took));
    assert!(v.is_clean(), "{}", v.details());
}

#[tokio::test]
async fn a_node_whose_move_fails_is_kept_and_its_job_keeps_running() {
    let (stack, f) = fragmented(|_| "handover").await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    // Every job refuses to hand over its state: any consolidation move ends Refused, before the
    // source stops.
    for b in &f.kept {
        stack
            .chaos(&[
                "migration-behaviour",
                &format!("default.{b}/0/enc"),
                "refuse-state",
            ])
            .unwrap();
    }
    let seen = SeenMigrations::start(
        Api::namespaced(stack.env.client().clone(), "default"),
        "automanager.norsk.io/purpose=consolidation",
    );
    apply(
        &stack,
        &pool_yaml(
            "  consolidation: {mode: enabled, minNodeAgeSeconds: 0, cooldownSeconds: 3600}\n",
        ),
    )
    .await;
    let pool = stack
        .wait_for("the node given up on", WAIT, || async {
            let p = stack.get_json(&["placementpool", POOL]).await?;
            let c = condition(&p, "Consolidating");
            Ok((c["reason"] == "CoolingDown" || c["reason"] == "Abandoned").then_some(p))
        })
        .await
        .unwrap();
    assert_eq!(
        pool["status"]["consolidation"]["nodesTerminated"], 0,
        "{pool:#}"
    );
    assert!(
        pool["status"]["consolidation"]["currentNode"].is_null(),
        "{pool:#}"
    );
    wait_events(
        &stack,
        &[&|l: &str| l.starts_with(POOL) && l.contains("ConsolidationAbandoned")],
    )
    .await;
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains(&format!(
            "automanager_consolidation_nodes_abandoned_total{{pool=\"{POOL}\"}} 1"
        )),
        "{metrics}"
    );
    // Nothing was terminated, nothing moved, and the ended Migration is gone.
    assert_eq!(live_nodes(&stack).await, f.nodes);
    let now = placement(&stack, &f.kept).await;
    for b in &f.kept {
        assert_eq!(now[b], f.wave[b], "{b}");
        let h = job_history(&stack, b);
        assert_eq!(
            (&h["gaps"], &h["uncoveredMs"]),
            (&Value::from(0), &Value::from(0)),
            "{b}: {h:#}"
        );
    }
    let migs = seen.snapshot();
    assert_eq!(migs.len(), 1, "{migs:#?}");
    let phase = migs
        .values()
        .next()
        .and_then(|m| m.status.as_ref())
        .map(|s| s.phase);
    assert_eq!(phase, Some(automanager_api::MigrationPhase::Refused));
    stack
        .wait_for("the ended Migration deleted", WAIT, || async {
            Ok(consolidation_migrations(&stack)
                .await
                .is_empty()
                .then_some(()))
        })
        .await
        .unwrap();

    let (mut v, took) = settle(&stack, WAIT).await.unwrap();
    v.merge(&monitor.stop().await.0);
    eprintln!("{}", v.line("fleet-consolidation-abandoned", took));
    assert!(v.is_clean(), "{}", v.details());
}

#[tokio::test]
async fn a_consolidation_move_waits_for_the_disruption_budget() {
    let (stack, f) = fragmented(|_| "handover").await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let budget =
        |n: i32| format!(r#"{{"spec":{{"disruption":{{"maxUnavailableReplicas":{n}}}}}}}"#);
    for b in &f.kept {
        let out = stack
            .env
            .run_kubectl([
                "patch",
                "bundle",
                b,
                "-n",
                "default",
                "--type",
                "merge",
                "-p",
                &budget(0),
            ])
            .await
            .unwrap();
        assert!(out.success(), "{}", out.stderr);
    }
    apply(
        &stack,
        &pool_yaml("  consolidation: {mode: enabled, minNodeAgeSeconds: 0, cooldownSeconds: 0}\n"),
    )
    .await;
    // The move is queued behind the budget; the node is being emptied and stays.
    let m = stack
        .wait_for(
            "the consolidation Migration held by the budget",
            WAIT,
            || async {
                let migs = consolidation_migrations(&stack).await;
                Ok(migs
                    .into_iter()
                    .find(|m| condition(m, "Queued")["reason"] == "DisruptionBudget"))
            },
        )
        .await
        .unwrap();
    assert_eq!(m["status"]["phase"], "Pending", "{m:#}");
    let pool = stack.get_json(&["placementpool", POOL]).await.unwrap();
    let c = condition(&pool, "Consolidating");
    assert_eq!(c["reason"], "EmptyingNode", "{pool:#}");
    assert!(
        c["message"].as_str().unwrap().contains("0 of 1 moves done"),
        "{c:#}"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(live_nodes(&stack).await, f.nodes);

    // Raising the budget lets it go: the node is emptied and terminated.
    for b in &f.kept {
        stack
            .env
            .run_kubectl([
                "patch",
                "bundle",
                b,
                "-n",
                "default",
                "--type",
                "merge",
                "-p",
                &budget(1),
            ])
            .await
            .unwrap();
    }
    stack
        .wait_for(
            "the node consolidated once the budget allows",
            WAIT,
            || async {
                let p = stack.get_json(&["placementpool", POOL]).await?;
                Ok((p["status"]["consolidation"]["nodesTerminated"] == 1).then_some(()))
            },
        )
        .await
        .unwrap();
    assert_eq!(live_nodes(&stack).await.len(), 2);
    for b in &f.kept {
        let h = job_history(&stack, b);
        assert_eq!(
            (&h["gaps"], &h["uncoveredMs"]),
            (&Value::from(0), &Value::from(0)),
            "{b}: {h:#}"
        );
    }

    let (mut v, took) = settle(&stack, WAIT).await.unwrap();
    v.merge(&monitor.stop().await.0);
    eprintln!("{}", v.line("fleet-consolidation-budget", took));
    assert!(v.is_clean(), "{}", v.details());
}
