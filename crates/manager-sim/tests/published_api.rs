//! manager-sim's published Manager service (`norsk.api.manager.Manager`) driven by the package's
//! own generated client (`ManagerClient` of `@norskvideo/norsk-api` 1.0.384 over `@grpc/grpc-js`,
//! `crates/manager-proto/reference/drive-manager.cjs`): snapshot and `InitialDataComplete`, a node
//! under the caller's id, a job under two roles, JobSearch by tag, stop, refusals, update,
//! complete, delete, terminate, a second snapshot.
//!
//! Node runs the package (`oracle.rs` says what happens without it).

use std::process::Stdio;

use manager_sim::Sim;
use manager_sim::config::SimConfig;

#[path = "../../manager-proto/reference/oracle.rs"]
mod oracle;

use oracle::{reference_dir, unavailable};

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
