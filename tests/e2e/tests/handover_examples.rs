//! The job-socket examples for job authors, migrated with `handover` through the operator: the
//! TypeScript job (`examples/job-socket/typescript`, the published contract's parsers over `ws`,
//! run under Node) and the Rust one (`crates/job-socket/examples/handover_job.rs`), each run by
//! manager-sim as an external process the way a worker starts a job's container
//! (`jobSocket.exec`), each checked to have handed its state to its successor.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use automanager_api::Migration;
use automanager_api::MigrationPhase::Completed;
use automanager_api::MigrationStrategy::Handover;
use automanager_api::PriorityBand::Gold;
use automanager_e2e::scenario::{
    BundleView, JobManifest, MigrationView, bundle, job, job_id, migration, show,
};
use automanager_e2e::stack::{Stack, cargo_build};
use automanager_e2e::{apply_example_pools, demo_sim_config_with_job_socket, examples_dir};
use serde::Deserialize;

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

/// One line of an example job's log (both examples write the same JSON lines), as far as this
/// test reads it.
#[derive(Debug, Clone, Deserialize)]
struct LogLine {
    event: String,
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    position: Option<f64>,
    #[serde(default)]
    handovers: Option<f64>,
    /// The state a target received (`initial-state-received`).
    #[serde(default)]
    state: Option<HandedState>,
}

/// The state handed from source to target.
#[derive(Debug, Clone, Deserialize)]
struct HandedState {
    #[serde(default)]
    session: Option<String>,
    #[serde(default)]
    position: Option<f64>,
}

fn events(log: &Path) -> Vec<LogLine> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn find<'a>(events: &'a [LogLine], event: &str) -> Option<&'a LogLine> {
    events.iter().find(|e| e.event == event)
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

async fn hand_over(stack: &Stack, logs_dir: &Path, bundle_name: &str) {
    let id = job_id(bundle_name, 0, "enc");
    stack
        .create(&bundle(
            bundle_name,
            1,
            &["onprem"],
            [job("enc", 20, Gold).cores(2).moves_by(Handover)],
        ))
        .await;
    stack.expect_ready(bundle_name).await;
    // The worker started the job's process; wait until it is producing on its socket.
    let source_log = stack
        .wait_for(&format!("{id} producing"), WAIT, || async {
            Ok(logs(logs_dir, &id)
                .into_iter()
                .find(|l| l.to_string_lossy().ends_with(".normal.log"))
                .filter(|l| find(&events(l), "producing").is_some()))
        })
        .await
        .unwrap();
    let session = find(&events(&source_log), "producing")
        .and_then(|e| e.session.clone())
        .expect("the source's session");
    // Let some output be produced, so the handed-over position is not zero.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let name = format!("move-{bundle_name}");
    stack.create(&migration(&name, bundle_name, 0, "enc")).await;
    let m = stack
        .wait_until(&name, "to finish", |m: &Migration| m.finished())
        .await;
    assert_eq!(m.phase(), Some(Completed), "{}", show(&m));
    assert_eq!(m.strategy(), Some(Handover));
    // `applied: [output]` is what the example job reports (simulated jobs report input and output).
    let applied = m
        .status
        .as_ref()
        .and_then(|s| s.handover.as_ref())
        .map(|h| h.applied.clone());
    assert_eq!(applied, Some(vec!["output".to_owned()]), "{}", show(&m));

    // The state arrived: the target started from the source's position, in the same session.
    let source = events(&source_log);
    let given = find(&source, "state-given").unwrap_or_else(|| panic!("source log: {source:#?}"));
    let stopped = find(&source, "source-stopped-output").expect("the source stopped its output");
    let target_log = logs(logs_dir, &id)
        .into_iter()
        .find(|l| l.to_string_lossy().contains("migrationTarget"))
        .expect("a target process log");
    let target = events(&target_log);
    let received = find(&target, "initial-state-received")
        .and_then(|e| e.state.as_ref())
        .unwrap_or_else(|| panic!("target log: {target:#?}"));
    assert_eq!(received.session.as_deref(), Some(session.as_str()));
    assert_eq!(received.position, given.position);
    assert!(given.position.is_some_and(|p| p > 0.0), "{given:?}");
    let producing = find(&target, "producing").expect("the target took over");
    assert_eq!(producing.session.as_deref(), Some(session.as_str()));
    assert_eq!(
        producing.position, stopped.position,
        "source: {source:#?}\ntarget: {target:#?}"
    );
    assert_eq!(producing.handovers, Some(1.0));
    // The job now runs on the target node, and the bundle is whole. The Bundle was Ready on the
    // source too, and its status follows Manager's events: wait until it has left the source.
    let source_node = m.source_node().expect("a source node");
    let b = stack.expect_ready_off(bundle_name, source_node).await;
    assert_eq!(b.node_of(0, "enc"), m.target_node(), "{}", show(&b));
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
