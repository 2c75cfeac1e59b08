//! The `manager-sim` binary: prints its address, serves, and the chaos CLI
//! reaches it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_manager-sim")
}

fn chaos(addr: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(bin())
        .args(["chaos", "--addr", addr])
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Runs `manager-sim serve ARGS` and reads the address it prints.
fn serve(args: &[&str]) -> (Killed, std::net::SocketAddr) {
    let mut child = Command::new(bin())
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let child = Killed(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("manager-sim listening on ")
        .expect(&line);
    (child, addr.parse().unwrap())
}

#[test]
fn serve_prints_a_parseable_address_and_chaos_commands_reach_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = package_dir().join("examples/demo.yaml");
    let config = &*config.to_string_lossy();
    let state_dir = dir.path().to_str().unwrap();
    let (child, addr) = serve(&["--config", config, "--state-dir", state_dir]);
    assert!(addr.ip().is_loopback());
    let url = format!("http://{addr}");

    let (ok, out) = chaos(&url, &["kill-node", "onprem-a1"]);
    assert!(ok, "{out}");
    assert!(out.contains("killed node onprem-a1"), "{out}");
    let (ok, out) = chaos(&url, &["partition-zone", "rack-b"]);
    assert!(ok && out.contains("2 nodes"), "{out}");
    let (ok, out) = chaos(&url, &["partition-zone", "rack-b", "--heal"]);
    assert!(ok && out.contains("healed"), "{out}");
    let (ok, out) = chaos(&url, &["kill-zone", "rack-b"]);
    assert!(ok && out.contains("zone rack-b died (2 nodes"), "{out}");
    let (ok, out) = chaos(&url, &["kill-zone", "rack-b", "--revive"]);
    assert!(ok && out.contains("revived"), "{out}");
    for args in [
        &["reject-next", "2"][..],
        &["cut-streams"],
        &["slow-provision", "5000"],
    ] {
        let (ok, out) = chaos(&url, args);
        assert!(ok, "{args:?}: {out}");
    }
    // Faults are not Manager calls: nothing asked Manager to change anything.
    let calls = Command::new(bin())
        .args(["calls", "--addr", &url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&calls.stdout);
    assert!(calls.status.success(), "{text}");
    assert_eq!(text.lines().last(), Some("mutating 0"), "{text}");
    // errors come back as gRPC codes with a message, and exit non-zero
    let (ok, out) = chaos(&url, &["kill-node", "no-such-node"]);
    assert!(!ok && out.contains("NotFound"), "{out}");
    let (ok, out) = chaos(&url, &["slow-provision", "99999999999"]);
    assert!(!ok && out.contains("InvalidArgument"), "{out}");
    // job-history reads; the e2e migration tests read real histories with it
    let (ok, out) = chaos(&url, &["job-history", "b/0/j"]);
    assert!(
        !ok && out.contains("NotFound") && out.contains("never started"),
        "{out}"
    );
    // serve runs the job socket by default: migration behaviours are accepted
    for (args, says) in [
        (
            &["migration-behaviour", "b/0/j", "refuse-state"][..],
            "refuses state",
        ),
        (
            &["migration-behaviour", "b/0/j", "slow-cutover", "250"],
            "after 250 ms",
        ),
        (
            &["migration-behaviour", "b/0/j", "fail-participant", "output"],
            "fails output",
        ),
        (
            &["migration-behaviour", "b/0/j", "abort-at", "target-ready"],
            "aborts at target-ready",
        ),
        (
            &["migration-behaviour", "b/0/j", "cooperative"],
            "cooperative",
        ),
    ] {
        let (ok, out) = chaos(&url, args);
        assert!(ok && out.contains(says), "{args:?}: {out}");
    }
    let (ok, out) = chaos(
        &url,
        &["migration-behaviour", "b/0/j", "abort-at", "cutover-apply"],
    );
    assert!(!ok && out.contains("unknown abort point"), "{out}");
    let (ok, out) = chaos(
        &url,
        &["migration-behaviour", "b/0/j", "slow-cutover", "600001"],
    );
    assert!(!ok && out.contains("cutoverDelayMs"), "{out}");
    let (ok, out) = chaos(&url, &["migration-behaviour", "", "refuse-state"]);
    assert!(!ok && out.contains("InvalidArgument"), "{out}");
    drop(child);
    assert!(dir.path().join("manager-sim-state.json").exists());
}

#[test]
fn without_the_job_socket_migration_behaviours_are_refused() {
    let (_child, addr) = serve(&["--no-job-socket"]);
    let (ok, out) = chaos(
        &format!("http://{addr}"),
        &["migration-behaviour", "b/0/j", "refuse-state"],
    );
    assert!(
        !ok && out.contains("FailedPrecondition") && out.contains("job socket"),
        "{out}"
    );
}

#[test]
fn check_config_lists_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "pools:\n  - {name: p, kind: aws, region: r, zones: [], scaleOut: fixed}\n",
    )
    .unwrap();
    let out = Command::new(bin())
        .arg("check-config")
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("at least one zone"), "{err}");
    assert!(err.contains("must be scaleOut: elastic"), "{err}");
    let ok = Command::new(bin())
        .arg("check-config")
        .arg(package_dir().join("examples/demo.yaml"))
        .output()
        .unwrap();
    assert!(ok.status.success());
}

#[test]
fn chaos_against_nothing_fails_cleanly() {
    let (ok, out) = chaos("http://127.0.0.1:1", &["cut-streams"]);
    assert!(!ok && out.contains("cannot reach"), "{out}");
    let (ok, out) = chaos("not a url", &["cut-streams"]);
    assert!(!ok && out.contains("bad --addr"), "{out}");
}

/// This package's directory, as cargo tells the running test: a test executable cargo finds
/// fresh may have been built in another checkout that shares the target dir, and the path
/// compiled into it would read that checkout's files.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}

/// A job of the published world: `fail-job --role` fails only that role's instance,
/// `job-history` reads it, and its migration behaviour is taken even without the job socket
/// (the sim answers the published world's handshake itself).
#[tokio::test]
async fn the_chaos_cli_reaches_a_job_of_the_published_world() {
    use manager_proto::api::common::{JobId, NodeId};
    use manager_proto::api::manager::manager_client::ManagerClient;
    use manager_proto::api::manager::{Job, StartJobRequest};

    const JOB: &str = "ns.b/0/enc";
    let (_child, addr) = serve(&["--no-job-socket"]);
    let url = format!("http://{addr}");
    let mut manager = ManagerClient::connect(url.clone()).await.unwrap();
    manager
        .create_job(Job {
            job_id: Some(JobId {
                job_id: JOB.to_owned(),
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    for (role, node) in [("primary", "onprem-a1"), ("backup", "onprem-b1")] {
        manager
            .start_job(StartJobRequest {
                job_id: Some(JobId {
                    job_id: JOB.to_owned(),
                }),
                role: role.to_owned(),
                node_id: Some(NodeId {
                    node_id: node.to_owned(),
                }),
            })
            .await
            .unwrap();
    }
    // Both run once the sim's job start delay has passed.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (ok, out) = chaos(&url, &["job-history", JOB]);
        let h: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_default();
        if ok && h["running"] == 2 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never both running: {out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }

    let (ok, out) = chaos(
        &url,
        &["fail-job", JOB, "--role", "backup", "--message", "gone"],
    );
    assert!(ok && out.contains("(backup)"), "{out}");
    let (ok, out) = chaos(&url, &["job-history", JOB]);
    assert!(ok, "{out}");
    let h: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(h["starts"].as_array().map(Vec::len), Some(2), "{h}");
    assert_eq!(h["running"], 1, "{h}");
    assert_eq!(h["starts"][0]["role"], "normal", "{h}");
    let (ok, out) = chaos(&url, &["fail-job", JOB, "--role", "backup"]);
    assert!(!ok && out.contains("FailedPrecondition"), "{out}");
    let (ok, out) = chaos(&url, &["migration-behaviour", JOB, "refuse-state"]);
    assert!(ok && out.contains("refuses state"), "{out}");
}
