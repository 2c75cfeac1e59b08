//! The `testenv` CLI against the real binaries: up/env/down for scripts, and that a killed
//! `testenv up` takes etcd and kube-apiserver with it.
//!
//! Without the binaries these tests FAIL with the "run `make control-plane`" message, unless
//! `AUTOMANAGER_SKIP_CONTROL_PLANE=1` is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use testenv::State;
use testenv::process::{Signal, is_running, send_signal};

fn testenv(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_testenv"))
        .args(args)
        .arg("--dir")
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn detached_up_env_and_down_drive_one_control_plane() {
    if !support::control_plane_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let up = testenv(dir.path(), &["up", "--detach"]);
    let up_err = String::from_utf8_lossy(&up.stderr);
    assert!(up.status.success(), "{up_err}");
    let exports = String::from_utf8_lossy(&up.stdout).into_owned();
    let kubeconfig = dir.path().join("kubeconfig");
    assert!(
        exports.contains(&format!("export KUBECONFIG={}", kubeconfig.display())),
        "{exports}"
    );
    assert!(exports.contains("export PATH="), "{exports}");

    let state = State::read(&dir.path().join("state.json"))
        .unwrap()
        .unwrap();
    assert!(is_running(state.pid) && is_running(state.etcd_pid) && is_running(state.apiserver_pid));

    // A second `up` on the same dir refuses instead of starting a twin.
    let twice = testenv(dir.path(), &["up"]);
    assert!(!twice.status.success());
    assert!(String::from_utf8_lossy(&twice.stderr).contains("already running"));

    let env = testenv(dir.path(), &["env"]);
    assert!(env.status.success());
    assert_eq!(String::from_utf8_lossy(&env.stdout), exports);

    // The exported kubeconfig works with the built kubectl.
    let get = Command::new(state.bin_dir.join("kubectl"))
        .args(["get", "namespace", "default", "-o", "name"])
        .env("KUBECONFIG", &kubeconfig)
        .env("KUBECACHEDIR", dir.path().join("kubectl-cache"))
        .output()
        .unwrap();
    assert!(
        get.status.success(),
        "{}",
        String::from_utf8_lossy(&get.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&get.stdout).trim(),
        "namespace/default"
    );

    let down = testenv(dir.path(), &["down"]);
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    for pid in [state.pid, state.etcd_pid, state.apiserver_pid] {
        assert!(!is_running(pid), "pid {pid} survived `testenv down`");
    }
    assert!(!state.data_dir.exists());
    assert!(!dir.path().join("state.json").exists());
    assert!(!kubeconfig.exists());

    // Once down, `env` says nothing runs and `down` is a no-op.
    let env = testenv(dir.path(), &["env"]);
    assert!(!env.status.success());
    assert!(String::from_utf8_lossy(&env.stderr).contains("no control plane is running"));
    assert!(testenv(dir.path(), &["down"]).status.success());
}

#[test]
fn a_killed_testenv_up_takes_its_control_plane_with_it() {
    if !support::control_plane_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut up = Command::new(env!("CARGO_BIN_EXE_testenv"))
        .args(["up", "--dir"])
        .arg(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let state_path = dir.path().join("state.json");
    wait_until("testenv up to be ready", Duration::from_secs(90), || {
        matches!(State::read(&state_path), Ok(Some(_))) || matches!(up.try_wait(), Ok(Some(_)))
    });
    let state = State::read(&state_path)
        .unwrap()
        .expect("testenv up exited before it was ready");

    // SIGKILL: no destructor runs; the parent-death signal must still stop both children.
    send_signal(up.id(), Signal::Kill).unwrap();
    up.wait().unwrap();
    wait_until(
        "etcd and kube-apiserver to die",
        Duration::from_secs(10),
        || !is_running(state.etcd_pid) && !is_running(state.apiserver_pid),
    );

    // `down` then clears what the killed process could not.
    let down = testenv(dir.path(), &["down"]);
    assert!(down.status.success());
    assert!(String::from_utf8_lossy(&down.stderr).contains("not running"));
    assert!(!state.data_dir.exists());
    assert!(!state_path.exists());
}

#[test]
fn env_and_down_without_a_running_control_plane_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let env = testenv(dir.path(), &["env"]);
    assert!(!env.status.success());
    assert!(String::from_utf8_lossy(&env.stderr).contains("testenv up"));
    let down = testenv(dir.path(), &["down"]);
    assert!(down.status.success());
    assert!(String::from_utf8_lossy(&down.stderr).contains("nothing to stop"));

    std::fs::write(dir.path().join("state.json"), "{not json").unwrap();
    let env = testenv(dir.path(), &["env"]);
    assert!(!env.status.success());
    assert!(String::from_utf8_lossy(&env.stderr).contains("state file"));
}

#[test]
fn up_with_a_missing_bin_dir_names_the_make_target() {
    let dir = tempfile::tempdir().unwrap();
    let out = testenv(dir.path(), &["up", "--bin-dir", "/nonexistent/k8s/bin"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("run `make control-plane`"), "{stderr}");
}
