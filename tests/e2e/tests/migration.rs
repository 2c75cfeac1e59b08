//! Migrations end to end: real apiserver, manager-sim (simulated jobs on the real job socket) and
//! the operator binary. What Manager started, with which role, and whether a job was ever without
//! a running instance is read from the sim's own accounting (`manager-sim chaos job-history`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use automanager_e2e::stack::Stack;
use automanager_e2e::{apply, condition, patch_node, wait_drained};
use automanager_e2e::{examples_dir, repo_root};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(90);

async fn start() -> Stack {
    with_pools(Stack::start().await.expect("stack")).await
}

/// A stack whose simulated jobs wait up to ten minutes for an answer
/// ([`automanager_e2e::stack::patient_sim_config`]).
async fn start_patient() -> Stack {
    start_with_sim_config(|demo| format!("{demo}\njobSocket: {{answerTimeoutMs: 600000}}\n")).await
}

/// A stack whose manager-sim runs the demo config as `edit` changes it.
async fn start_with_sim_config(edit: impl FnOnce(&str) -> String) -> Stack {
    let demo = std::fs::read_to_string(repo_root().join("deploy/demo/manager-sim.yaml")).unwrap();
    let config = edit(&demo);
    assert_ne!(config, demo);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manager-sim.yaml");
    std::fs::write(&path, config).unwrap();
    // The sim reads its config at start; the file may go once the stack is up.
    with_pools(
        Stack::start_custom(&path, &[], |_| {})
            .await
            .expect("stack"),
    )
    .await
}

async fn with_pools(stack: Stack) -> Stack {
    let out = stack
        .env
        .apply_file(examples_dir().join("pools.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    stack
}

/// A one-job bundle on the fixed on-prem pool; `strategy` is the job's declared migration strategy.
fn bundle(name: &str, strategy: Option<&str>) -> String {
    let migration = strategy
        .map(|s| format!("\n      migration: {{strategy: {s}}}"))
        .unwrap_or_default();
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  replicas: 1\n  pools: [onprem]\n  jobs:\n    - jobName: enc\n      requirements: {{requiredCapacity: 20, requiredCores: 2, priorityBand: silver}}{migration}\n"
    )
}

fn migration(name: &str, bundle: &str, extra: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Migration\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  job: {{bundle: {bundle}, replica: 0, jobName: enc}}\n{extra}"
    )
}

fn job_id(bundle: &str) -> String {
    format!("default.{bundle}/0/enc")
}

/// Starts the bundle and returns the node its job runs on.
async fn running_job(stack: &Stack, name: &str, strategy: Option<&str>) -> String {
    apply(stack, &bundle(name, strategy)).await;
    let b = stack
        .wait_bundle_phase("default", name, "Ready", WAIT)
        .await
        .unwrap();
    b["status"]["replicas"][0]["jobs"][0]["nodeId"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn wait_phase(stack: &Stack, name: &str, phase: &str) -> Value {
    stack
        .wait_for(&format!("migration {name} phase {phase}"), WAIT, || async {
            let m = stack
                .get_json(&["migration", name, "-n", "default"])
                .await?;
            Ok((m["status"]["phase"] == phase).then_some(m))
        })
        .await
        .unwrap_or_else(|e| {
            let log = stack.sim.log_text();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            let now = std::process::Command::new("kubectl")
                .env("KUBECONFIG", stack.env.kubeconfig_path())
                .args(["get", "migration", name, "-n", "default", "-o", "yaml"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            panic!(
                "{}\nthe Migration now:\n{now}\nmanager-sim log tail (newest first):\n{}",
                e.0,
                tail.join("\n")
            )
        })
}

/// The nodes that list an instance of `job` (normal or migration target).
async fn instance_nodes(stack: &Stack, job: &str) -> Vec<String> {
    let nodes = stack.get_json(&["managernodes"]).await.unwrap();
    nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| {
            n["status"]["jobs"]
                .as_array()
                .is_some_and(|js| js.iter().any(|j| j["jobId"] == job))
        })
        .filter_map(|n| n["status"]["nodeId"].as_str().map(str::to_owned))
        .collect()
}

/// Waits until exactly one instance of the bundle's job runs, on `node`, and the bundle says so.
async fn wait_single_instance_on(stack: &Stack, bundle: &str, node: &str) {
    let job = job_id(bundle);
    stack
        .wait_for(
            &format!("one instance of {job} on {node}"),
            WAIT,
            || async {
                let b = stack.get_json(&["bundle", bundle, "-n", "default"]).await?;
                let j = &b["status"]["replicas"][0]["jobs"][0];
                let nodes = instance_nodes(stack, &job).await;
                Ok(
                    (j["state"] == "running" && j["nodeId"] == node && nodes == [node])
                        .then_some(()),
                )
            },
        )
        .await
        .unwrap();
}

/// Starts a handover job whose source answers `cutover-ready` only after `delay_ms`, creates the
/// Migration `migration_name` and waits until it sits in CutoverReady; returns the source node.
async fn held_in_cutover(
    stack: &Stack,
    bundle: &str,
    migration_name: &str,
    delay_ms: &str,
) -> String {
    let source = running_job(stack, bundle, Some("handover")).await;
    stack
        .chaos(&[
            "migration-behaviour",
            &job_id(bundle),
            "slow-cutover",
            delay_ms,
        ])
        .unwrap();
    apply(stack, &migration(migration_name, bundle, "")).await;
    wait_phase(stack, migration_name, "CutoverReady").await;
    source
}

/// What the sim saw of the bundle's job: every instance start and its time without a running
/// instance.
fn job_history(stack: &Stack, bundle: &str) -> Value {
    let out = stack.chaos(&["job-history", &job_id(bundle)]).unwrap();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The (node, role) of every instance of the bundle's job Manager started, oldest first.
fn roles_started(history: &Value) -> Vec<(String, String)> {
    history["starts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["nodeId"].as_str().unwrap().to_owned(),
                s["role"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The job ran on `source`, then Manager started exactly one more instance, on `target`, as the
/// migration's target (the source kept its role).
fn assert_moved_by_a_migration_target(history: &Value, source: &str, target: &str) {
    assert_eq!(
        roles_started(history),
        [
            (source.to_owned(), "normal".to_owned()),
            (target.to_owned(), "migrationTarget".to_owned())
        ],
        "{history:#}"
    );
}

fn phases(m: &Value) -> Vec<String> {
    m["status"]["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["phase"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_handover_moves_the_job_and_reports_its_summary() {
    let stack = start().await;
    let source = running_job(&stack, "news", Some("handover")).await;
    apply(&stack, &migration("move-news", "news", "")).await;
    let m = wait_phase(&stack, "move-news", "Completed").await;
    assert_eq!(m["status"]["strategy"], "handover", "{m:#}");
    assert_eq!(m["status"]["sourceNode"], source.as_str());
    let target = m["status"]["targetNode"].as_str().unwrap().to_owned();
    assert_ne!(target, source);
    assert!(
        !m["status"]["handover"]["applied"]
            .as_array()
            .unwrap()
            .is_empty(),
        "{m:#}"
    );
    assert!(m["status"]["handover"]["skewMs"].is_number(), "{m:#}");
    assert_eq!(
        phases(&m),
        [
            "Proposing",
            "PlacingTarget",
            "StartingTarget",
            "TargetReady",
            "CutoverReady",
            "SourceStoppedOutput",
            "CutoverApply",
            "Completed"
        ]
    );
    assert_eq!(condition(&m, "Ready")["status"], "True", "{m:#}");
    wait_single_instance_on(&stack, "news", &target).await;
    assert_moved_by_a_migration_target(&job_history(&stack, "news"), &source, &target);
}

#[tokio::test]
async fn stop_then_start_moves_the_job_to_the_named_node() {
    let stack = start().await;
    let source = running_job(&stack, "sport", None).await;
    let target = ["onprem-a1", "onprem-a2", "onprem-b1"]
        .into_iter()
        .find(|n| *n != source)
        .unwrap();
    apply(
        &stack,
        &migration("move-sport", "sport", &format!("  targetNode: {target}\n")),
    )
    .await;
    let m = wait_phase(&stack, "move-sport", "Completed").await;
    assert_eq!(m["status"]["strategy"], "stopThenStart", "{m:#}");
    assert_eq!(m["status"]["targetNode"], target);
    assert_eq!(
        phases(&m),
        [
            "PlacingTarget",
            "PreparingTarget",
            "StoppingSource",
            "StartingTarget",
            "Completed"
        ]
    );
    wait_single_instance_on(&stack, "sport", target).await;
    let history = job_history(&stack, "sport");
    assert_moved_by_a_migration_target(&history, &source, target);
    // One instance at a time: a single gap between the source's stop and the target's start.
    assert_eq!(
        (&history["gaps"], &history["maxRunning"]),
        (&Value::from(1), &Value::from(1)),
        "{history:#}"
    );
}

#[tokio::test]
async fn a_stronger_strategy_than_declared_is_rejected() {
    let stack = start().await;
    let source = running_job(&stack, "film", None).await;
    apply(
        &stack,
        &migration("up-film", "film", "  strategy: handover\n"),
    )
    .await;
    let m = wait_phase(&stack, "up-film", "Rejected").await;
    let c = condition(&m, "Rejected");
    assert_eq!(c["status"], "True", "{m:#}");
    assert_eq!(c["reason"], "StrategyRefused");
    let msg = c["message"].as_str().unwrap();
    assert!(
        msg.contains("handover") && msg.contains("stopThenStart"),
        "{msg}"
    );
    let events = stack
        .env
        .run_kubectl([
            "get",
            "events",
            "-n",
            "default",
            "-o",
            "custom-columns=REASON:.reason",
        ])
        .await
        .unwrap();
    assert!(
        events.stdout.contains("MigrationRejected"),
        "{}",
        events.stdout
    );
    wait_single_instance_on(&stack, "film", &source).await;
}

#[tokio::test]
async fn a_second_migration_of_the_same_job_is_rejected() {
    let stack = start_patient().await;
    // The first migration holds the job in its cutover for a while.
    held_in_cutover(&stack, "talk", "first", "8000").await;
    apply(&stack, &migration("second", "talk", "")).await;
    let m = wait_phase(&stack, "second", "Rejected").await;
    let c = condition(&m, "Rejected");
    assert_eq!(c["reason"], "ConcurrentMigration", "{m:#}");
    assert!(c["message"].as_str().unwrap().contains("first"), "{m:#}");
    let first = wait_phase(&stack, "first", "Completed").await;
    let target = first["status"]["targetNode"].as_str().unwrap().to_owned();
    wait_single_instance_on(&stack, "talk", &target).await;
}

#[tokio::test]
async fn a_refused_state_ends_the_migration_with_no_target() {
    let stack = start().await;
    let source = running_job(&stack, "kids", Some("handover")).await;
    stack
        .chaos(&["migration-behaviour", &job_id("kids"), "refuse-state"])
        .unwrap();
    apply(&stack, &migration("move-kids", "kids", "")).await;
    let m = wait_phase(&stack, "move-kids", "Refused").await;
    assert!(m["status"]["targetNode"].is_null(), "{m:#}");
    assert_eq!(phases(&m), ["Proposing", "Refused"]);
    assert_eq!(condition(&m, "Ready")["reason"], "StateRefused", "{m:#}");
    wait_single_instance_on(&stack, "kids", &source).await;
}

#[tokio::test]
async fn an_abort_before_cutover_leaves_the_source_running() {
    let stack = start_patient().await;
    let source = held_in_cutover(&stack, "docs", "move-docs", "300000").await;
    let out = stack
        .env
        .run_kubectl([
            "patch",
            "migration",
            "move-docs",
            "-n",
            "default",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"abort":{"reason":"changed my mind"}}}"#,
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let m = wait_phase(&stack, "move-docs", "Aborted").await;
    assert_eq!(m["status"]["abort"]["by"], "user", "{m:#}");
    assert_eq!(m["status"]["abort"]["phase"], "CutoverReady", "{m:#}");
    assert_eq!(m["status"]["abort"]["reason"], "changed my mind", "{m:#}");
    assert_eq!(condition(&m, "Aborted")["status"], "True", "{m:#}");
    wait_single_instance_on(&stack, "docs", &source).await;
}

#[tokio::test]
async fn overlap_starts_the_target_before_it_stops_the_source() {
    let stack = start().await;
    let source = running_job(&stack, "music", Some("overlap")).await;
    apply(&stack, &migration("move-music", "music", "")).await;
    let m = wait_phase(&stack, "move-music", "Completed").await;
    assert_eq!(m["status"]["strategy"], "overlap", "{m:#}");
    let target = m["status"]["targetNode"].as_str().unwrap().to_owned();
    assert_ne!(target, source);
    assert_eq!(
        phases(&m),
        [
            "PlacingTarget",
            "StartingTarget",
            "TargetRunning",
            "StoppingSource",
            "Completed"
        ]
    );
    wait_single_instance_on(&stack, "music", &target).await;
    let history = job_history(&stack, "music");
    assert_moved_by_a_migration_target(&history, &source, &target);
    assert_never_without_a_running_instance(&history);
}

/// Overlap's promise: the job always had a running instance, and two while the target ran
/// before the source stopped.
fn assert_never_without_a_running_instance(history: &Value) {
    assert_eq!(
        (
            &history["gaps"],
            &history["uncoveredMs"],
            &history["maxRunning"]
        ),
        (&Value::from(0), &Value::from(0), &Value::from(2)),
        "{history:#}"
    );
}

#[tokio::test]
async fn overlap_and_stop_then_start_move_jobs_between_workers_without_a_job_socket() {
    let stack = start_without_job_sockets().await;
    for (bundle, strategy) in [("ov-plain", "overlap"), ("sts-plain", "stopThenStart")] {
        let source = running_job(&stack, bundle, Some(strategy)).await;
        let name = format!("move-{bundle}");
        apply(&stack, &migration(&name, bundle, "")).await;
        let m = wait_phase(&stack, &name, "Completed").await;
        assert_eq!(m["status"]["strategy"], strategy, "{m:#}");
        let target = m["status"]["targetNode"].as_str().unwrap().to_owned();
        assert_ne!(target, source);
        wait_single_instance_on(&stack, bundle, &target).await;
        let history = job_history(&stack, bundle);
        assert_moved_by_a_migration_target(&history, &source, &target);
        if strategy == "overlap" {
            assert_never_without_a_running_instance(&history);
        }
    }
}

#[tokio::test]
async fn a_safer_strategy_than_declared_is_accepted() {
    let stack = start().await;
    let source = running_job(&stack, "radio", Some("handover")).await;
    apply(
        &stack,
        &migration("down-radio", "radio", "  strategy: stopThenStart\n"),
    )
    .await;
    let m = wait_phase(&stack, "down-radio", "Completed").await;
    assert_eq!(m["status"]["strategy"], "stopThenStart", "{m:#}");
    let target = m["status"]["targetNode"].as_str().unwrap().to_owned();
    assert_ne!(target, source);
    wait_single_instance_on(&stack, "radio", &target).await;
}

#[tokio::test]
async fn a_phase_past_its_timeout_aborts_and_the_source_keeps_running() {
    let stack = Stack::start_with(|c| {
        c.insert(
            "migration".into(),
            serde_json::json!({"phaseTimeout": "3s"}),
        );
    })
    .await
    .expect("stack");
    let out = stack
        .env
        .apply_file(examples_dir().join("pools.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let source = running_job(&stack, "slow", Some("handover")).await;
    stack
        .chaos(&[
            "migration-behaviour",
            &job_id("slow"),
            "slow-cutover",
            "60000",
        ])
        .unwrap();
    apply(&stack, &migration("move-slow", "slow", "")).await;
    let m = wait_phase(&stack, "move-slow", "Aborted").await;
    assert_eq!(m["status"]["abort"]["by"], "timeout", "{m:#}");
    assert_eq!(m["status"]["abort"]["phase"], "CutoverReady", "{m:#}");
    wait_single_instance_on(&stack, "slow", &source).await;
}

#[tokio::test]
async fn deleting_an_abortable_migration_aborts_it_and_removes_the_target() {
    let stack = start_patient().await;
    let source = held_in_cutover(&stack, "shop", "move-shop", "300000").await;
    let out = stack
        .env
        .run_kubectl([
            "delete",
            "migration",
            "move-shop",
            "-n",
            "default",
            "--wait=false",
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    stack
        .wait_for("the Migration to be gone", WAIT, || async {
            let out = stack
                .env
                .run_kubectl(["get", "migrations", "-n", "default", "-o", "name"])
                .await?;
            Ok((out.success() && !out.stdout.contains("move-shop")).then_some(()))
        })
        .await
        .unwrap();
    wait_single_instance_on(&stack, "shop", &source).await;
}

#[tokio::test]
// A source's abort right after `state` (`state-given`) can reach Manager before the state does;
// Manager then records what a refusal records and the migration ends in Refused, which
// `a_refused_state_ends_the_migration_with_no_target` covers.
async fn a_job_abort_at_any_abortable_point_leaves_only_the_source_running() {
    let stack = start().await;
    for (i, point) in ["initial-state", "target-ready", "cutover-ready"]
        .into_iter()
        .enumerate()
    {
        let bundle = format!("ab{i}");
        let name = format!("move-ab{i}");
        let source = running_job(&stack, &bundle, Some("handover")).await;
        stack
            .chaos(&["migration-behaviour", &job_id(&bundle), "abort-at", point])
            .unwrap();
        apply(&stack, &migration(&name, &bundle, "")).await;
        let m = wait_phase(&stack, &name, "Aborted").await;
        let by = m["status"]["abort"]["by"].as_str().unwrap();
        let expected = match point {
            "cutover-ready" => "source",
            _ => "target",
        };
        assert_eq!(by, expected, "abort at {point}: {m:#}");
        assert!(
            !m["status"]["phases"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["phase"] == "SourceStoppedOutput"),
            "{m:#}"
        );
        wait_single_instance_on(&stack, &bundle, &source).await;
    }
}

/// A stack whose on-prem pool's workers run no job-socket listener (no `norsk.io/job-socket`).
async fn start_without_job_sockets() -> Stack {
    start_with_sim_config(|demo| {
        demo.replacen(
            "  - name: onprem\n",
            "  - name: onprem\n    jobSocket: false\n",
            1,
        )
    })
    .await
}

#[tokio::test]
async fn a_handover_target_without_the_job_socket_is_rejected() {
    let stack = start_without_job_sockets().await;
    let source = running_job(&stack, "plain", Some("handover")).await;
    let target = ["onprem-a1", "onprem-a2", "onprem-b1"]
        .into_iter()
        .find(|n| *n != source)
        .unwrap();
    apply(
        &stack,
        &migration("move-plain", "plain", &format!("  targetNode: {target}\n")),
    )
    .await;
    let m = wait_phase(&stack, "move-plain", "Rejected").await;
    let c = condition(&m, "Rejected");
    assert_eq!(c["reason"], "TargetRefused", "{m:#}");
    assert!(
        c["message"]
            .as_str()
            .unwrap()
            .contains("norsk.io/job-socket"),
        "{m:#}"
    );
    wait_single_instance_on(&stack, "plain", &source).await;
}

/// The Events in `default` with the given reason.
async fn events_with_reason(stack: &Stack, reason: &str) -> Vec<Value> {
    let selector = format!("reason={reason}");
    let events = stack
        .get_json(&["events", "-n", "default", "--field-selector", &selector])
        .await
        .unwrap();
    events["items"].as_array().cloned().unwrap_or_default()
}

/// A one-job bundle of the given band and declared strategy on the on-prem pool.
fn banded_bundle(name: &str, strategy: &str, band: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  replicas: 1\n  pools: [onprem]\n  jobs:\n    - jobName: enc\n      requirements: {{requiredCapacity: 20, requiredCores: 2, priorityBand: {band}}}\n      migration: {{strategy: {strategy}}}\n"
    )
}

/// Cordons every on-prem node but `keep`, runs `bundles` (name, strategy, band) there, then
/// uncordons the others: every job starts on `keep`.
async fn jobs_on_one_node(stack: &Stack, keep: &str, bundles: &[(&str, &str, &str)]) {
    let others: Vec<&str> = ["onprem-a1", "onprem-a2", "onprem-b1"]
        .into_iter()
        .filter(|n| *n != keep)
        .collect();
    for n in &others {
        patch_node(stack, n, r#"{"spec":{"cordoned":true}}"#).await;
    }
    for (name, strategy, band) in bundles {
        apply(stack, &banded_bundle(name, strategy, band)).await;
    }
    for (name, ..) in bundles {
        let b = stack
            .wait_bundle_phase("default", name, "Ready", WAIT)
            .await
            .unwrap();
        assert_eq!(
            b["status"]["replicas"][0]["jobs"][0]["nodeId"], keep,
            "{b:#}"
        );
    }
    for n in &others {
        patch_node(stack, n, r#"{"spec":{"cordoned":false}}"#).await;
    }
    // The operator has taken the uncordon in (its status says so) before anything is placed on
    // those nodes again.
    for n in &others {
        stack
            .wait_for(&format!("{n} schedulable again"), WAIT, || async {
                let obj = stack.get_json(&["managernode", n]).await?;
                Ok((condition(&obj, "Cordoned")["status"] == "False").then_some(()))
            })
            .await
            .unwrap();
    }
}

/// Drains `node` with `mode: migrate` and waits until its status says the drain completed;
/// returns the ManagerNode.
async fn drain_migrate(stack: &Stack, node: &str) -> Value {
    patch_node(stack, node, r#"{"spec":{"drain":{"mode":"migrate"}}}"#).await;
    wait_drained(stack, node, WAIT).await
}

/// The drain's Migrations: name → phase.
async fn drain_migrations(stack: &Stack) -> Vec<(String, String)> {
    let list = stack
        .get_json(&[
            "migrations",
            "-n",
            "default",
            "-l",
            "automanager.norsk.io/drain-node",
        ])
        .await
        .unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["spec"]["job"]["bundle"].as_str().unwrap().to_owned(),
                m["status"]["phase"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_migrate_drain_moves_every_job_and_drops_no_bronze_job() {
    let stack = start().await;
    let bundles = [
        ("dm-hand", "handover", "bronze"),
        ("dm-over", "overlap", "bronze"),
        ("dm-stop", "stopThenStart", "bronze"),
        ("dm-gold", "handover", "gold"),
        ("dm-silv", "overlap", "silver"),
    ];
    jobs_on_one_node(&stack, "onprem-a1", &bundles).await;

    let node = drain_migrate(&stack, "onprem-a1").await;
    let drain = &node["status"]["drain"];
    let all = stack
        .get_json(&["migrations", "-n", "default"])
        .await
        .unwrap();
    assert_eq!(drain["jobsMigrated"], 5, "{node:#}\n{all:#}");
    assert_eq!(drain["jobsDropped"], 0, "{node:#}");
    assert_eq!(drain["jobsRecovered"], 0, "{node:#}");

    let mut migs = drain_migrations(&stack).await;
    migs.sort();
    let mut expected: Vec<(String, String)> = bundles
        .iter()
        .map(|(b, ..)| ((*b).to_owned(), "Completed".to_owned()))
        .collect();
    expected.sort();
    assert_eq!(migs, expected);
    for (name, ..) in bundles {
        let b = stack
            .wait_bundle_ready_off("default", name, "onprem-a1", WAIT)
            .await
            .unwrap();
        let j = &b["status"]["replicas"][0]["jobs"][0];
        assert_eq!(j["state"], "running", "{b:#}");
    }
    // The node was emptied before it was terminated: no job stopped with it.
    let events = events_with_reason(&stack, "JobDropped").await;
    assert_eq!(events.len(), 0, "{events:#?}");
}

#[tokio::test]
async fn a_job_whose_drain_migration_fails_falls_back_to_its_band() {
    let stack = with_pools(
        Stack::start_with(|c| {
            c.insert(
                "migration".into(),
                serde_json::json!({"drainParallelism": 1}),
            );
        })
        .await
        .expect("stack"),
    )
    .await;
    let bundles = [
        ("fb-bronze", "handover", "bronze"),
        ("fb-silver", "handover", "silver"),
        ("fb-fine", "overlap", "bronze"),
    ];
    jobs_on_one_node(&stack, "onprem-b1", &bundles).await;
    for b in ["fb-bronze", "fb-silver"] {
        stack
            .chaos(&["migration-behaviour", &job_id(b), "refuse-state"])
            .unwrap();
    }

    let node = drain_migrate(&stack, "onprem-b1").await;
    let drain = &node["status"]["drain"];
    assert_eq!(drain["jobsMigrated"], 1, "{node:#}");
    assert_eq!(drain["jobsRecovered"], 1, "{node:#}");
    assert_eq!(drain["jobsDropped"], 1, "{node:#}");

    // The refused silver job restarted elsewhere by its band; the refused bronze one was dropped.
    // (Its status may still say Ready on the drained node for a moment: wait for both.)
    stack
        .wait_for("the refused silver job to run elsewhere", WAIT, || async {
            let b = stack
                .get_json(&["bundle", "fb-silver", "-n", "default"])
                .await?;
            let node = &b["status"]["replicas"][0]["jobs"][0]["nodeId"];
            Ok(
                (b["status"]["phase"] == "Ready" && node.is_string() && node != "onprem-b1")
                    .then_some(()),
            )
        })
        .await
        .unwrap();
    stack
        .wait_for("the refused bronze job to be dropped", WAIT, || async {
            let b = stack
                .get_json(&["bundle", "fb-bronze", "-n", "default"])
                .await?;
            Ok((b["status"]["replicas"][0]["jobs"][0]["state"] == "dropped").then_some(()))
        })
        .await
        .unwrap();
    stack
        .wait_bundle_ready_off("default", "fb-fine", "onprem-b1", WAIT)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_migration_with_no_room_elsewhere_provisions_its_target_in_an_elastic_pool() {
    let stack = start().await;
    // One job that fills most of an aws-east node: the pool provisions one node for it, and the
    // migration finds no other node with room.
    apply(
        &stack,
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {name: big, namespace: default}\nspec:\n  replicas: 1\n  pools: [aws-east]\n  jobs:\n    - jobName: enc\n      requirements: {requiredCapacity: 70, requiredCores: 4, priorityBand: silver}\n",
    )
    .await;
    let b = stack
        .wait_bundle_phase("default", "big", "Ready", WAIT)
        .await
        .unwrap();
    let source = b["status"]["replicas"][0]["jobs"][0]["nodeId"]
        .as_str()
        .unwrap()
        .to_owned();
    apply(&stack, &migration("move-big", "big", "")).await;
    let m = wait_phase(&stack, "move-big", "Completed").await;
    let target = m["status"]["targetNode"].as_str().unwrap().to_owned();
    assert_ne!(target, source, "{m:#}");
    let nodes = stack.get_json(&["managernodes"]).await.unwrap();
    let pool_of_target = nodes["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["status"]["nodeId"] == target.as_str())
        .map(|n| n["status"]["pool"].clone());
    assert_eq!(pool_of_target, Some(Value::from("aws-east")), "{nodes:#}");
    // Events are published off the reconcile path, a moment after the status.
    let events = stack
        .wait_for("a ProvisioningTarget Event", WAIT, || async {
            let events = events_with_reason(&stack, "ProvisioningTarget").await;
            Ok((!events.is_empty()).then_some(events))
        })
        .await
        .unwrap();
    assert_eq!(events.len(), 1, "{events:#?}");
    wait_single_instance_on(&stack, "big", &target).await;
}
