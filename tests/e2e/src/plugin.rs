//! Running `kubectl-automanager` against a [`Stack`]. The operator runs there as a process on
//! loopback, not in a Pod (testenv has no kubelet), so the plugin reaches its debugging API
//! with `--operator-url` (as `AUTOMANAGER_OPERATOR_URL`) at `http://127.0.0.1:<port>`; nothing
//! listens on another address. The routes through the apiserver to a real Pod, the
//! leader port-forward and the `--operator-service` proxy, are proven on a real node by
//! tests/e2e/tests/oncall_cluster.rs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::stack::Stack;
use crate::{SetupError, repo_root};

/// The namespace the plugin looks in by default; the Service the tests name with
/// `--operator-service`, and its port name (the plugin's default `--operator-port`).
pub const OPERATOR_NAMESPACE: &str = "automanager-system";
pub const OPERATOR_SERVICE: &str = "automanager-operator";
pub const OPERATOR_PORT_NAME: &str = "debug";

/// What a run of the plugin printed and how it exited.
#[derive(Debug)]
pub struct PluginOutput {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl PluginOutput {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!("not JSON ({e}):\n{}\nstderr:\n{}", self.stdout, self.stderr)
        })
    }
}

/// Builds `kubectl-automanager` (once per process) with the cargo that runs the tests.
pub fn plugin_binary() -> Result<&'static Path, SetupError> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        let bin =
            crate::stack::cargo_build(&["-p", "automanager-cli", "--bin", "kubectl-automanager"])
                .map_err(|e| e.0)?
                .join("kubectl-automanager");
        if bin.exists() {
            Ok(bin)
        } else {
            Err(format!("{} was not built", bin.display()))
        }
    })
    .as_deref()
    .map_err(|e| SetupError(e.clone()))
}

/// Runs the plugin with the stack's kubeconfig, reaching the operator directly on loopback
/// (`AUTOMANAGER_OPERATOR_URL`, the stack's debugging address); `AUTOMANAGER_*` variables of
/// the test's own environment are not passed on.
pub fn run(stack: &Stack, args: &[&str]) -> PluginOutput {
    run_with(args, |cmd| {
        cmd.env("KUBECONFIG", stack.env.kubeconfig_path())
            .env("AUTOMANAGER_OPERATOR_URL", &stack.operator_debug_http);
    })
}

/// Runs the plugin with the stack's kubeconfig and no operator URL: it takes the route through
/// the apiserver its flags choose (the leader port-forward by default, `--operator-service`).
pub fn run_through_apiserver(stack: &Stack, args: &[&str]) -> PluginOutput {
    run_with(args, |cmd| {
        cmd.env("KUBECONFIG", stack.env.kubeconfig_path());
    })
}

/// Asks the plugin for completions as kubectl does (`kubectl-automanager __complete WORDS`,
/// the last word the one being completed) with `kubeconfig` as `$KUBECONFIG`.
pub fn complete(kubeconfig: &Path, words: &[&str]) -> Completion {
    let args: Vec<&str> = std::iter::once("__complete")
        .chain(words.iter().copied())
        .collect();
    let out = run_with(&args, |cmd| {
        cmd.env("KUBECONFIG", kubeconfig);
    });
    Completion::parse(&out)
}

/// An answer in kubectl's completion protocol: one candidate a line (`word<TAB>help`), then
/// `:DIRECTIVE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The candidates' words, in the order given.
    pub words: Vec<String>,
    /// cobra's directive (4: no file names; 2: no space after the word).
    pub directive: u8,
    /// What the plugin said on standard error (why no names were offered).
    pub stderr: String,
}

impl Completion {
    /// Reads kubectl's completion protocol from what a run printed.
    pub fn parse(out: &PluginOutput) -> Completion {
        let mut words = Vec::new();
        let mut directive = None;
        for line in out.stdout.lines() {
            if let Some(d) = line.strip_prefix(':') {
                directive = d.parse().ok();
            } else if let Some(word) = line.split('\t').next() {
                words.push(word.to_owned());
            }
        }
        Completion {
            words,
            directive: directive.unwrap_or_else(|| {
                panic!(
                    "no :directive line (exit {}):\n{}\nstderr:\n{}",
                    out.code, out.stdout, out.stderr
                )
            }),
            stderr: out.stderr.clone(),
        }
    }
}

/// Runs the plugin after `setup` adjusts the command (environment, working directory).
pub fn run_with(args: &[&str], setup: impl FnOnce(&mut Command)) -> PluginOutput {
    let bin = plugin_binary().unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .current_dir(repo_root())
        .env_remove("AUTOMANAGER_OPERATOR_URL")
        .env_remove("AUTOMANAGER_OPERATOR_NAMESPACE")
        .env_remove("AUTOMANAGER_OPERATOR_SERVICE")
        .env_remove("AUTOMANAGER_OPERATOR_PORT")
        .env_remove("AUTOMANAGER_OPERATOR_RELEASE")
        .env_remove("AUTOMANAGER_OPERATOR_SELECTOR");
    setup(&mut cmd);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running kubectl-automanager: {e}"));
    PluginOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `kubectl automanager map -o json` against `kubectl get managernodes -o json`: the same nodes
/// in the same pools and zones, the same used and free capacity and flags, and every job on a
/// node under its bundle's replica mark. The error says what differs.
pub fn map_agrees_with_nodes(
    map: &serde_json::Value,
    nodes: &serde_json::Value,
) -> Result<(), String> {
    use std::collections::BTreeSet;
    let objects = nodes["items"]
        .as_array()
        .ok_or("no items in the ManagerNode list")?;
    let mut seen = 0;
    let empty = Vec::new();
    for pool in map["pools"].as_array().unwrap_or(&empty) {
        for zone in pool["zones"].as_array().unwrap_or(&empty) {
            for n in zone["nodes"].as_array().unwrap_or(&empty) {
                seen += 1;
                let o = objects
                    .iter()
                    .find(|o| o["metadata"]["name"] == n["node"])
                    .ok_or_else(|| format!("{} is no ManagerNode", n["node"]))?;
                let st = &o["status"];
                let total = st["totalCapacity"].as_i64().unwrap_or(0);
                let used = st["usedCapacity"].as_i64().unwrap_or(0);
                let checks = [
                    ("pool", pool["pool"] == st["pool"]),
                    ("zone", zone["zone"] == st["zone"]),
                    ("nodeId", n["nodeId"] == st["nodeId"]),
                    ("usedCapacity", n["usedCapacity"].as_i64() == Some(used)),
                    (
                        "freeCapacity",
                        n["freeCapacity"].as_i64() == Some((total - used).max(0)),
                    ),
                    (
                        "cordoned",
                        n["cordoned"].as_bool()
                            == Some(o["spec"]["cordoned"].as_bool().unwrap_or(false)),
                    ),
                    (
                        "spare",
                        n["spare"].as_bool() == Some(st["spare"].as_bool().unwrap_or(false)),
                    ),
                ];
                for (what, ok) in checks {
                    if !ok {
                        return Err(format!("{what} differs:\nmap: {n:#}\nobject: {o:#}"));
                    }
                }
                let jobs: BTreeSet<(String, i64, String)> = st["jobs"]
                    .as_array()
                    .unwrap_or(&empty)
                    .iter()
                    .map(|j| {
                        (
                            j["bundle"].as_str().unwrap_or("(no bundle)").to_owned(),
                            j["replica"].as_i64().unwrap_or(-1),
                            j["jobName"]
                                .as_str()
                                .or(j["jobId"].as_str())
                                .unwrap_or("")
                                .to_owned(),
                        )
                    })
                    .collect();
                let marked: BTreeSet<(String, i64, String)> = n["replicas"]
                    .as_array()
                    .unwrap_or(&empty)
                    .iter()
                    .flat_map(|r| {
                        r["jobs"].as_array().unwrap_or(&empty).iter().map(move |j| {
                            (
                                r["bundle"].as_str().unwrap_or("").to_owned(),
                                r["replica"].as_i64().unwrap_or(-1),
                                j.as_str().unwrap_or("").to_owned(),
                            )
                        })
                    })
                    .collect();
                if jobs != marked {
                    return Err(format!(
                        "the jobs of {} differ:\nManagerNode: {jobs:?}\nmap: {marked:?}",
                        n["node"]
                    ));
                }
            }
        }
    }
    if seen != objects.len() || seen == 0 {
        return Err(format!(
            "the map shows {seen} nodes, the apiserver has {}",
            objects.len()
        ));
    }
    Ok(())
}
