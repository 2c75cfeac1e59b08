//! manager-sim's published Manager service (`norsk.api.manager.Manager`) driven by the package's
//! own generated client (`ManagerClient` of `@norskvideo/norsk-api` 1.0.384 over `@grpc/grpc-js`,
//! `crates/manager-proto/reference/drive-manager.cjs`): snapshot and `InitialDataComplete`, a node
//! under the caller's id, a job under two roles, JobSearch by tag, stop, refusals, update,
//! complete, delete, terminate, a second snapshot.
//!
//! Without `node`, or without registry access for `npm ci`, the test says why and passes, except
//! in CI (`CI` set), where that is a failure.

use std::path::PathBuf;
use std::process::Stdio;

use manager_sim::Sim;
use manager_sim::config::SimConfig;

fn reference_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from)
        .join("../manager-proto/reference")
}

/// Why the package cannot be run here, if it cannot; panics instead in CI.
fn unavailable() -> Option<String> {
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let why = if !node {
        Some("`node` is not on PATH".to_owned())
    } else if reference_dir().join("node_modules/@grpc/grpc-js").exists() {
        None
    } else {
        let ok = std::process::Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund", "--loglevel=error"])
            .current_dir(reference_dir())
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        (!ok).then(|| {
            "`npm ci` in crates/manager-proto/reference failed (no registry access?)".to_owned()
        })
    };
    if let Some(why) = &why {
        assert!(std::env::var_os("CI").is_none(), "in CI: {why}");
        eprintln!("skipped: {why}");
    }
    why
}

#[tokio::test]
async fn the_packages_own_client_drives_the_published_service() {
    if unavailable().is_some() {
        return;
    }
    let sim = Sim::start(SimConfig::demo()).await.expect("sim");
    let addr = sim.addr().expect("a listening sim");
    let out = tokio::process::Command::new("node")
        .arg("drive-manager.cjs")
        .arg(addr.to_string())
        .current_dir(reference_dir())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(120), out)
        .await
        .expect("the driver finishes")
        .expect("run node");
    let text = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(text.trim()).expect("one JSON line");
    assert!(out.status.success(), "{report:#}");
    let checks = report["checks"].as_object().expect("checks");
    assert!(checks.len() >= 20, "{report:#}");
    assert!(checks.values().all(|v| v == true), "{report:#}");
    let rpcs: Vec<&str> = report["rpcs"]
        .as_array()
        .expect("rpcs")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    for rpc in [
        "createAwsNode",
        "createJob",
        "updateJob",
        "deleteJob",
        "startJob",
        "stopJob",
        "completeJob",
        "terminateNode",
        "jobSearch",
        "eventStream",
    ] {
        assert!(rpcs.contains(&rpc), "{rpc} not driven: {rpcs:?}");
    }
}
