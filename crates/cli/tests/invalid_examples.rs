//! Every object in examples/invalid/ is refused offline by `kubectl automanager validate`
//! with the message its `# expect:` header names: the same message the apiserver gives at
//! `kubectl apply` (tests/e2e/tests/crds_and_examples.rs holds the apiserver to it), so a
//! pre-merge check in a GitOps repository refuses what the cluster would.

use std::path::PathBuf;
use std::process::Command;

fn repo_root() -> PathBuf {
    package_dir().join("../..")
}

fn expected(text: &str) -> Option<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("# expect:"))
        .map(str::trim)
}

#[test]
fn every_invalid_example_is_refused_offline_with_the_apiservers_message() {
    let dir = repo_root().join("examples/invalid");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("examples/invalid")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 40, "found only {} files", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("readable");
        let Some(expect) = expected(&text) else {
            failures.push(format!("{}: no `# expect:` header", file.display()));
            continue;
        };
        let out = Command::new(env!("CARGO_BIN_EXE_kubectl-automanager"))
            .args(["validate", "-f"])
            .arg(file)
            .env("KUBECONFIG", "/nonexistent")
            .output()
            .expect("runs");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.code() != Some(1) {
            failures.push(format!(
                "{}: exit {:?}, expected 1 ({expect:?}):\n{said}",
                file.display(),
                out.status.code()
            ));
        } else if !said.contains(expect) {
            failures.push(format!(
                "{}: expected {expect:?}, got:\n{said}",
                file.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} invalid examples misbehaved:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}

#[test]
fn every_valid_example_passes_offline() {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-automanager"))
        .args([
            "validate",
            "-f",
            "examples/",
            "--pools",
            "examples/pools.yaml",
        ])
        .current_dir(repo_root())
        .env("KUBECONFIG", "/nonexistent")
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// This package's directory, as cargo tells the running test: a test executable cargo finds
/// fresh may have been built in another checkout that shares the target dir, and the path
/// compiled into it would read that checkout's files.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
