//! The Prometheus alert rules (deploy/prometheus/rules.yaml) pass `promtool check rules` and
//! their unit tests (rules.test.yaml) pass `promtool test rules`, with promtool built from the
//! Prometheus Go module pinned in tools/promtool. Part of `make test`, which starts a cold
//! promtool build in the background before the tests run, so that it is ready by the time the
//! operator's tests come after the end-to-end ones; `make test-alerts` runs the same by hand.
//! That every alert has a test, a runbook section and per-release grouping is checked by
//! crates/operator/tests/alert_names.rs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn repo_root() -> PathBuf {
    package_dir().join("../..")
}

fn promtool() -> PathBuf {
    let out = Command::new(repo_root().join("tools/promtool/build.sh"))
        .stderr(Stdio::inherit())
        .output()
        .expect("running tools/promtool/build.sh");
    assert!(out.status.success(), "tools/promtool/build.sh failed");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn run_ok(args: &[&str]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .current_dir(repo_root().join("deploy/prometheus"))
        .output()
        .expect("running promtool");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{said}");
    said
}

#[test]
fn the_alert_rules_are_valid_and_their_unit_tests_pass() {
    let said = run_ok(&["check", "rules", "rules.yaml"]);
    assert!(said.contains("SUCCESS"), "{said}");
    let said = run_ok(&["test", "rules", "rules.test.yaml"]);
    assert!(said.contains("SUCCESS"), "{said}");
}

/// This package's directory, as cargo tells the running test: a test executable cargo finds
/// fresh may have been built in another checkout that shares the target dir, and the path
/// compiled into it would read that checkout's files.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
