//! The job-socket examples for job authors, migrated with `handover` through the operator: the
//! TypeScript job (`examples/job-socket/typescript`, the published contract's parsers over `ws`,
//! run under Node) and the Rust one (`crates/job-socket/examples/handover_job.rs`), each run by
//! manager-sim as an external process the way a worker starts a job's container
//! (`jobSocket.exec`), each checked to have handed its state to its successor.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use automanager_e2e::stack::{Stack, cargo_build};
use automanager_e2e::{apply, apply_example_pools, demo_sim_config_with_job_socket, examples_dir};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);

/// `examples/job-socket/typescript/dist/job.js`, installed (`npm ci`) and built (`tsc`) here
/// when `make job-socket-examples` has not done it yet.
fn typescript_job() -> PathBuf {
    let dir = examples_dir().join("job-socket/typescript");
    let js = dir.join("dist/job.js");
    let src = dir.join("src/job.ts");
    let stale = match (js.metadata(), src.metadata()) {
        (Ok(j), Ok(s)) => j.modified().ok() < s.modified().ok(),
        _ => true,
    };
    if stale {
        for args in [
            &["ci", "--no-audit", "--no-fund", "--loglevel=error"][..],
            &["run", "-s", "build"],
        ] {
            let ok = Command::new("npm")
                .args(args)
                .current_dir(&dir)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            assert!(
                ok,
                "`npm {}` in {} failed: the TypeScript example needs Node.js >= 20 and npm (make job-socket-examples)",
                args.join(" "),
                dir.display()
            );
        }
    }
    js
}

/// The Rust example's binary, built with the cargo that runs the tests.
fn rust_job() -> PathBuf {
    cargo_build(&["-p", "job-socket", "--example", "handover_job"])
        .unwrap()
        .join("examples/handover_job")
}

fn events(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn find<'a>(events: &'a [Value], event: &str) -> Option<&'a Value> {
    events.iter().find(|e| e["event"] == event)
}

fn logs(dir: &Path, job: &str) -> Vec<PathBuf> {
    let prefix = job.replace('/', "_");
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect();
    v.sort();
    v
}

async fn hand_over(stack: &Stack, logs_dir: &Path, bundle: &str) {
    let job = format!("default.{bundle}/0/enc");
    apply(
        stack,
        &format!(
            "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: {bundle}, namespace: default}}\nspec:\n  replicas: 1\n  pools: [onprem]\n  jobs:\n    - jobName: enc\n      requirements: {{requiredCapacity: 20, requiredCores: 2, priorityBand: gold}}\n      migration: {{strategy: handover}}\n"
        ),
    )
    .await;
    stack
        .wait_bundle_phase("default", bundle, "Ready", WAIT)
        .await
        .unwrap();
    // The worker started the job's process; wait until it is producing on its socket.
    let source_log = stack
        .wait_for(&format!("{job} producing"), WAIT, || async {
            Ok(logs(logs_dir, &job)
                .into_iter()
                .find(|l| l.to_string_lossy().ends_with(".normal.log"))
                .filter(|l| find(&events(l), "producing").is_some()))
        })
        .await
        .unwrap();
    let session = find(&events(&source_log), "producing").unwrap()["session"]
        .as_str()
        .unwrap()
        .to_owned();
    // Let some output be produced, so the handed-over position is not zero.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let migration = format!("move-{bundle}");
    apply(
        stack,
        &format!(
            "apiVersion: automanager.norsk.io/v1alpha1\nkind: Migration\nmetadata: {{name: {migration}, namespace: default}}\nspec:\n  job: {{bundle: {bundle}, replica: 0, jobName: enc}}\n"
        ),
    )
    .await;
    let m = stack
        .wait_for(&format!("{migration} to finish"), WAIT, || async {
            let m = stack.get_json(&["migration", &migration]).await?;
            let phase = m["status"]["phase"].as_str().unwrap_or("").to_owned();
            Ok(matches!(
                phase.as_str(),
                "Completed" | "Aborted" | "Refused" | "Rejected" | "Failed"
            )
            .then_some(m))
        })
        .await
        .unwrap();
    assert_eq!(m["status"]["phase"], "Completed", "{m:#}");
    assert_eq!(m["status"]["strategy"], "handover");
    // `applied: [output]` is what the example job reports (simulated jobs report input and output).
    assert_eq!(
        m["status"]["handover"]["applied"],
        serde_json::json!(["output"]),
        "{m:#}"
    );

    // The state arrived: the target started from the source's position, in the same session.
    let source = events(&source_log);
    let given = find(&source, "state-given").unwrap_or_else(|| panic!("source log: {source:#?}"));
    let stopped = find(&source, "source-stopped-output").expect("the source stopped its output");
    let target_log = logs(logs_dir, &job)
        .into_iter()
        .find(|l| l.to_string_lossy().contains("migrationTarget"))
        .expect("a target process log");
    let target = events(&target_log);
    let received = find(&target, "initial-state-received")
        .unwrap_or_else(|| panic!("target log: {target:#?}"));
    assert_eq!(received["state"]["session"], session.as_str());
    assert_eq!(received["state"]["position"], given["position"]);
    assert!(given["position"].as_f64().unwrap() > 0.0, "{given}");
    let producing = find(&target, "producing").expect("the target took over");
    assert_eq!(producing["session"], session.as_str());
    assert_eq!(
        producing["position"], stopped["position"],
        "source: {source:#?}\ntarget: {target:#?}"
    );
    assert_eq!(producing["handovers"], 1.0);
    // The job now runs on the target node, and the bundle is whole. The Bundle was Ready on the
    // source too, and its status follows Manager's events: wait until it has left the source.
    let source_node = m["status"]["sourceNode"].as_str().expect("a source node");
    let b = stack
        .wait_bundle_ready_off("default", bundle, source_node, WAIT)
        .await
        .unwrap();
    assert_eq!(
        b["status"]["replicas"][0]["jobs"][0]["nodeId"],
        m["status"]["targetNode"]
    );
}

#[tokio::test]
async fn the_typescript_and_rust_example_jobs_hand_over_through_the_operator() {
    let ts = typescript_job();
    let rust = rust_job();
    let dir = tempfile::tempdir().unwrap();
    let logs_dir = dir.path().join("jobs");
    std::fs::create_dir_all(&logs_dir).unwrap();
    let exec = serde_json::json!({
        "answerTimeoutMs": 60000,
        "exec": [
            {"job": "default.node-job/*", "command": ["node", ts], "logDir": logs_dir},
            {"job": "default.rust-job/*", "command": [rust], "logDir": logs_dir},
        ]
    });
    let config = demo_sim_config_with_job_socket(dir.path(), &exec).unwrap();
    let stack = Stack::start_custom(&config, &[], |_| {})
        .await
        .expect("stack");
    apply_example_pools(&stack).await.unwrap();
    hand_over(&stack, &logs_dir, "node-job").await;
    hand_over(&stack, &logs_dir, "rust-job").await;
}
