//! Running `kubectl-automanager` against a [`Stack`], and making the operator (which runs as a
//! process, not in a Pod: there is no kubelet here, so the plugin's default route, a
//! port-forward to the leader Pod, has nothing to reach) reachable through the apiserver all
//! the same: by the plugin's `--operator-service` route, the apiserver's service proxy.
//!
//! What the apiserver needs for that, found by trying it against kube-apiserver v1.35:
//! - the proxy resolves a Service through its legacy `v1` Endpoints (EndpointSlices alone are
//!   not read), so the selector-less Service gets an Endpoints object written by hand;
//! - it proxies only to an endpoint address whose `targetRef` is a Pod with that `podIP`, so a
//!   Pod object stands in for the operator (Pending forever, its status patched with the IP);
//! - loopback is refused twice over (Endpoints validation: "may not be in the loopback range";
//!   the pod proxy: "address not allowed"), so the operator listens on `0.0.0.0` and the
//!   endpoint is this machine's own non-loopback address. Traffic stays on the machine.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::stack::Stack;
use crate::{SetupError, repo_root};

/// The namespace, Service and port name the plugin uses by default.
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

/// Runs the plugin with the stack's kubeconfig, reaching the operator through the Service
/// [`expose_operator`] makes; `AUTOMANAGER_*` variables of the test's own environment are not
/// passed on.
pub fn run(stack: &Stack, args: &[&str]) -> PluginOutput {
    run_with(args, |cmd| {
        cmd.env("KUBECONFIG", stack.env.kubeconfig_path())
            .env("AUTOMANAGER_OPERATOR_SERVICE", OPERATOR_SERVICE);
    })
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

/// This machine's first non-loopback IPv4 address (from `ip -4 -o addr show scope global`).
pub fn host_ip() -> Result<String, SetupError> {
    let out = Command::new("ip")
        .args(["-4", "-o", "addr", "show", "scope", "global"])
        .output()
        .map_err(|e| SetupError(format!("running `ip` (iproute2): {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            words.find(|w| *w == "inet")?;
            words.next()?.split('/').next().map(str::to_owned)
        })
        .find(|ip| !ip.starts_with("127."))
        .ok_or_else(|| {
            SetupError(
                "this machine has no non-loopback IPv4 address; the apiserver's service proxy refuses loopback endpoints".into(),
            )
        })
}

/// The port the stack's operator serves its debugging API (`/debug/trace`, `/v1/what-if`) on.
pub fn operator_port(stack: &Stack) -> u16 {
    stack
        .operator_debug_http
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {}", stack.operator_debug_http))
}

/// Makes the stack's operator reachable as Service `automanager-system/automanager-operator`,
/// port `debug`, through the apiserver (see the module docs for why it takes these objects).
/// The operator must listen on `0.0.0.0` (see [`listen_on_all_addresses`]).
pub async fn expose_operator(stack: &Stack) -> Result<(), SetupError> {
    let ip = host_ip()?;
    let port = operator_port(stack);
    let pod = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {OPERATOR_NAMESPACE}}}\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: automanager-operator-0, namespace: {OPERATOR_NAMESPACE}, labels: {{app: automanager-operator}}}}\nspec:\n  automountServiceAccountToken: false\n  containers: [{{name: operator, image: automanager-operator:e2e}}]\n"
    );
    apply_ok(stack, &pod).await?;
    let patch =
        format!(r#"{{"status":{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}]}}}}"#);
    let out = stack
        .env
        .run_kubectl([
            "patch",
            "pod",
            "automanager-operator-0",
            "-n",
            OPERATOR_NAMESPACE,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ])
        .await?;
    if !out.success() {
        return Err(SetupError(format!("patching the pod's IP: {}", out.stderr)));
    }
    let pod = stack
        .get_json(&["pod", "automanager-operator-0", "-n", OPERATOR_NAMESPACE])
        .await?;
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let service = format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: {OPERATOR_SERVICE}, namespace: {OPERATOR_NAMESPACE}}}\nspec:\n  ports: [{{name: {OPERATOR_PORT_NAME}, port: 8080, targetPort: {port}}}]\n---\napiVersion: v1\nkind: Endpoints\nmetadata: {{name: {OPERATOR_SERVICE}, namespace: {OPERATOR_NAMESPACE}}}\nsubsets:\n  - addresses: [{{ip: {ip}, targetRef: {{kind: Pod, namespace: {OPERATOR_NAMESPACE}, name: automanager-operator-0, uid: {uid}}}}}]\n    ports: [{{name: {OPERATOR_PORT_NAME}, port: {port}}}]\n"
    );
    apply_ok(stack, &service).await
}

async fn apply_ok(stack: &Stack, yaml: &str) -> Result<(), SetupError> {
    let out = stack.env.apply_yaml(yaml).await?;
    if out.success() {
        Ok(())
    } else {
        Err(SetupError(format!("kubectl apply failed: {}", out.stderr)))
    }
}

/// A [`Stack::start_with`] adjustment: the operator listens on every address (same port), so
/// the apiserver can reach it at this machine's address.
pub fn listen_on_all_addresses(config: &mut serde_json::Map<String, serde_json::Value>) {
    let Some(serde_json::Value::Object(http)) = config.get_mut("http") else {
        return;
    };
    for key in ["bindAddress", "debugBindAddress"] {
        if let Some(serde_json::Value::String(addr)) = http.get_mut(key) {
            *addr = addr.replace("127.0.0.1", "0.0.0.0");
        }
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
