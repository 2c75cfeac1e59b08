//! `make test-oncall-cluster`: `kubectl automanager` against the chart's Pods on a real node
//! (the cluster harness, tests/e2e/src/cluster.rs), with no URL flag: the plugin finds the
//! leader Pod by the chart's labels and the Lease and port-forwards to it through the apiserver
//! and the kubelet. Needs root and `make image`, like `make test-cluster`; not part of `make test`.
//!
//! 1. `helm install` with two replicas, the simulator and the debugging API (on the Pods'
//!    loopback: nothing exposed), then `kubectl apply -f examples/`: every Bundle Ready.
//! 2. Through the plugin: `trace` (the leader's trace of a placed bundle), `what-if`, `top
//!    nodes`, `map` (`-o json` agrees with the ManagerNode objects) and `migrate --wait` to the
//!    end; `-v` says the leader Pod answered.
//! 3. The standby's debugging port, reached by hand, answers 503 naming the leader.
//! 4. The leader's Pod is killed: once another Pod holds the Lease, the same commands go to it
//!    (a Bundle placed after the change has its trace there).
//! 5. The other route through the apiserver, `--operator-service` (its service proxy): with no
//!    such Service, a clear error; then the chart upgraded to `debug.address=0.0.0.0` (the
//!    proxy dials the Pod's address on the node's bridge) and a Service over the `debug` port
//!    of the Pod holding the Lease (picked by a label put on it here: the plugin does not follow
//!    a standby's 503 on this route): `trace` and `what-if` through it, also as `kubectl
//!    automanager`; the same Service moved onto the standby carries its 503 naming the leader.
//!
//! Prints `cli map_ms=… trace_ms=… through=leader-portforward` (medians of the plugin's whole
//! run, process start to exit, beside `kubectl get managernodes -o json` measured in the same run).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::{Duration, Instant};

use automanager_e2e::cluster::{Cluster, http_get};
use automanager_e2e::examples_dir;
use automanager_e2e::plugin::{self, PluginOutput};
use serde_json::Value;

const NS: &str = "automanager-system";
const RELEASE: &str = "am";
const FULLNAME: &str = "am-automanager";
const WAIT: Duration = Duration::from_secs(300);
/// The label that puts an operator Pod behind the Service of step 5.
const SERVICE_TARGET_LABEL: &str = "e2e.automanager.norsk.io/debug-route";
const VALUES: &[&str] = &[
    "--set",
    "replicaCount=2",
    "--set",
    "managerSim.enabled=true",
    "--set",
    "debug.enabled=true",
];

fn run(c: &Cluster, args: &[&str]) -> PluginOutput {
    plugin::run_with(args, |cmd| {
        cmd.env("KUBECONFIG", c.env.kubeconfig_path());
    })
}

/// The plugin through the Service of step 5 (`--operator-service`), with `-v`.
fn run_service(c: &Cluster, args: &[&str]) -> PluginOutput {
    let mut all = args.to_vec();
    all.extend(["--operator-service", plugin::OPERATOR_SERVICE, "-v"]);
    run(c, &all)
}

fn ok(out: &PluginOutput) {
    assert_eq!(
        out.code, 0,
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        out.code, out.stdout, out.stderr
    );
}

/// The plugin's whole run, in milliseconds.
fn timed(c: &Cluster, args: &[&str]) -> (PluginOutput, f64) {
    let t = Instant::now();
    let out = run(c, args);
    (out, t.elapsed().as_secs_f64() * 1000.0)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn name(o: &Value) -> String {
    o["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

async fn operator_pods(c: &Cluster) -> Vec<Value> {
    c.pods(
        NS,
        &format!("app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"),
    )
    .await
    .unwrap_or_default()
}

fn ready(p: &Value) -> bool {
    p["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Until the ManagerNode objects list `count` jobs of `bundle` (`namespace/name`): the operator
/// writes their status after the Bundle's, so a Ready Bundle may not be on the map yet.
async fn wait_nodes_list(c: &Cluster, bundle: &str, count: usize) {
    c.wait_for(
        &format!("the ManagerNodes to list {bundle}'s {count} job(s)"),
        WAIT,
        || async {
            let nodes = c.get_json(&["managernodes"]).await?;
            let jobs = nodes["items"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|n| n["status"]["jobs"].as_array().cloned().unwrap_or_default())
                .filter(|j| j["bundle"] == bundle)
                .count();
            Ok((jobs == count).then_some(()))
        },
    )
    .await
    .unwrap();
}

async fn wait_ready(c: &Cluster, bundle: &str) {
    c.wait_for(&format!("bundle {bundle} Ready"), WAIT, || async {
        let b = c.get_json(&["bundle", bundle, "-n", "default"]).await?;
        Ok((b["status"]["phase"] == "Ready").then_some(()))
    })
    .await
    .unwrap();
}

/// The pod `-v` says answered.
fn answered_by(out: &PluginOutput) -> String {
    out.stderr
        .lines()
        .find_map(|l| l.strip_prefix("operator: answered by pod "))
        .and_then(|l| l.split_whitespace().next())
        .filter(|_| out.stderr.contains(" through=leader-portforward"))
        .unwrap_or_else(|| panic!("no leader port-forward on stderr:\n{}", out.stderr))
        .to_owned()
}

/// Labels a Pod as (or no longer as) the one behind the Service of step 5.
async fn mark_service_target(c: &Cluster, pod: &str, on: bool) {
    let label = if on {
        format!("{SERVICE_TARGET_LABEL}=true")
    } else {
        format!("{SERVICE_TARGET_LABEL}-")
    };
    c.kubectl_ok(&["label", "pod", pod, "-n", NS, &label, "--overwrite"])
        .await
        .unwrap();
}

/// Waits until the Service's Endpoints (what the apiserver's proxy reads) name `pod` alone.
async fn wait_service_endpoint(c: &Cluster, pod: &str) {
    c.wait_for(
        &format!("the Service's endpoints to be {pod} alone"),
        WAIT,
        || async {
            let e = c
                .get_json(&["endpoints", plugin::OPERATOR_SERVICE, "-n", NS])
                .await?;
            let names: Vec<String> = e["subsets"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|s| s["addresses"].as_array().cloned().unwrap_or_default())
                .filter_map(|a| a["targetRef"]["name"].as_str().map(str::to_owned))
                .collect();
            Ok((names == [pod]).then_some(()))
        },
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn the_plugin_reaches_the_leader_pod_with_no_url_also_after_a_leader_change() {
    let c = Cluster::builder().start().await.unwrap();
    let out = c.install(RELEASE, NS, VALUES).unwrap();
    assert!(out.success(), "helm install: {}", out.stderr);
    let pods = c
        .wait_for("two operator Pods Ready", WAIT, || async {
            let pods = operator_pods(&c).await;
            Ok((pods.len() == 2 && pods.iter().all(ready)).then_some(pods))
        })
        .await
        .unwrap();
    let names: Vec<String> = pods.iter().map(name).collect();
    let leader = c
        .wait_for("a Pod to hold the Lease", WAIT, || async {
            Ok(c.lease_holder(NS, FULLNAME)
                .await
                .ok()
                .filter(|h| names.contains(h)))
        })
        .await
        .unwrap();
    let standby = names.iter().find(|n| **n != leader).unwrap().clone();

    // 1. The examples, placed.
    let out = c
        .kubectl(&["apply", "-f", examples_dir().to_str().unwrap()])
        .await
        .unwrap();
    assert!(out.success(), "kubectl apply -f examples/: {}", out.stderr);
    for b in ["news-gold", "sports-silver", "my-channel-1"] {
        wait_ready(&c, b).await;
    }

    // 2. Every command through the plugin, no URL flag (trace and what-if asked of the operator).
    let out = run(
        &c,
        &["trace", "--from-operator", "news-gold", "-o", "json", "-v"],
    );
    ok(&out);
    assert_eq!(answered_by(&out), format!("{NS}/{leader}"));
    let t = out.json();
    assert_eq!(t["bundleId"], "default.news-gold");
    assert_eq!(t["replicas"].as_array().unwrap().len(), 2, "{t:#}");
    let out = run(&c, &["trace", "--from-operator", "news-gold"]);
    ok(&out);
    assert!(
        out.stdout.contains("pools tried, in order"),
        "{}",
        out.stdout
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("probe.yaml");
    std::fs::write(
        &file,
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {name: probe, namespace: default}\nspec:\n  replicas: 1\n  pools: [onprem]\n  jobs:\n    - {jobName: enc, requirements: {requiredCapacity: 1, priorityBand: bronze}}\n",
    )
    .unwrap();
    let out = run(
        &c,
        &[
            "what-if",
            "--from-operator",
            "-f",
            file.to_str().unwrap(),
            "-o",
            "json",
            "-v",
        ],
    );
    ok(&out);
    assert_eq!(answered_by(&out), format!("{NS}/{leader}"));
    assert_eq!(out.json()["kind"], "ok", "{}", out.stdout);

    ok(&run(&c, &["top", "nodes"]));
    ok(&run(&c, &["top", "pools"]));
    // The operator writes ManagerNode status after the Bundle's: wait until it lists both
    // replicas of news-gold, then the map must show the same.
    wait_nodes_list(&c, "default/news-gold", 2).await;
    let out = run(&c, &["map", "-o", "json"]);
    ok(&out);
    let nodes = c.get_json(&["managernodes"]).await.unwrap();
    if let Err(e) = plugin::map_agrees_with_nodes(&out.json(), &nodes) {
        panic!("{e}");
    }
    let out = run(&c, &["map", "--bundle", "news-gold"]);
    ok(&out);
    assert!(
        out.stdout.contains("default/news-gold (#, [ ]):"),
        "{}",
        out.stdout
    );

    let out = run(
        &c,
        &[
            "migrate",
            "news-gold/0/encode",
            "--wait",
            "--timeout",
            "240s",
        ],
    );
    ok(&out);
    assert!(out.stdout.contains("completed"), "{}", out.stdout);

    // The figures: the plugin's whole run, beside kubectl reading the same objects.
    let mut map_ms = Vec::new();
    let mut trace_ms = Vec::new();
    for _ in 0..5 {
        let (out, ms) = timed(&c, &["map", "-o", "json"]);
        ok(&out);
        map_ms.push(ms);
        let (out, ms) = timed(
            &c,
            &[
                "trace",
                "--from-operator",
                "sports-silver",
                "-o",
                "json",
                "-v",
            ],
        );
        ok(&out);
        assert_eq!(answered_by(&out), format!("{NS}/{leader}"));
        trace_ms.push(ms);
    }
    let mut kubectl_ms = Vec::new();
    for _ in 0..5 {
        let mut cmd = Command::new(c.env.bin_dir().join("kubectl"));
        cmd.args(["get", "managernodes", "-o", "json"])
            .env("KUBECONFIG", c.env.kubeconfig_path());
        let t = Instant::now();
        let out = cmd.output().unwrap();
        kubectl_ms.push(t.elapsed().as_secs_f64() * 1000.0);
        assert!(out.status.success());
    }

    // 3. The standby's own answer names the leader.
    let pf = c
        .port_forward(NS, &format!("pod/{standby}"), 8082)
        .await
        .unwrap();
    let (status, body) = http_get(&format!("{}/debug/trace/default/news-gold", pf.url()))
        .await
        .unwrap();
    assert_eq!(status, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["role"], "standby", "{body}");
    assert_eq!(v["leader"], leader.as_str(), "{body}");
    drop(pf);

    // 4. The leader's Pod dies as with its machine (a crashed container alone would come back
    // in the same Pod, under the same name, which is the Lease's identity, and keep the
    // Lease); another Pod takes over (the standby, or the Pod replacing the dead one if it
    // wins the race once the Lease expires); the plugin follows the Lease.
    c.kill_pod(NS, &leader).await.unwrap();
    let leader = c
        .wait_for(
            "another running Pod to take the Lease over",
            WAIT,
            || async {
                let Ok(holder) = c.lease_holder(NS, FULLNAME).await else {
                    return Ok(None);
                };
                let running = operator_pods(&c)
                    .await
                    .iter()
                    .any(|p| name(p) == holder && p["status"]["phase"] == "Running");
                Ok((holder != leader && running).then_some(holder))
            },
        )
        .await
        .unwrap();
    let out = c
        .kubectl(&["apply", "-f", file.to_str().unwrap()])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    wait_ready(&c, "probe").await;
    wait_nodes_list(&c, "default/probe", 1).await;
    let out = run(
        &c,
        &["trace", "--from-operator", "probe", "-o", "json", "-v"],
    );
    ok(&out);
    assert_eq!(answered_by(&out), format!("{NS}/{leader}"));
    let out = run(
        &c,
        &[
            "what-if",
            "--from-operator",
            "-f",
            file.to_str().unwrap(),
            "-v",
        ],
    );
    ok(&out);
    assert_eq!(
        answered_by(&out),
        format!("{NS}/{leader}"),
        "{}",
        out.stderr
    );
    assert!(
        out.stdout.contains("Bundle default/probe: fits"),
        "{}",
        out.stdout
    );
    ok(&run(&c, &["top", "nodes"]));
    ok(&run(&c, &["top", "pools"]));
    let out = run(&c, &["map", "--bundle", "probe"]);
    ok(&out);
    assert!(
        out.stdout.contains("default/probe (#, [ ]):"),
        "{}",
        out.stdout
    );
    let out = run(&c, &["map", "-o", "json"]);
    ok(&out);
    let nodes = c.get_json(&["managernodes"]).await.unwrap();
    if let Err(e) = plugin::map_agrees_with_nodes(&out.json(), &nodes) {
        panic!("after the leader change: {e}");
    }
    let out = run(
        &c,
        &["migrate", "probe/0/enc", "--wait", "--timeout", "240s"],
    );
    ok(&out);
    assert!(out.stdout.contains("completed"), "{}", out.stdout);

    // 5. --operator-service, the apiserver's service proxy. No such Service yet.
    let out = run_service(&c, &["trace", "news-gold"]);
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "cannot reach the operator through the apiserver's proxy to service {NS}/{} port debug",
            plugin::OPERATOR_SERVICE
        )),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains("not found"), "{}", out.stderr);
    // The proxy dials the Pod's address: the debugging API listens on every address of the
    // Pod's own network namespace (its loopback and its veth on the node's bridge).
    let template = |p: &Value| p["metadata"]["labels"]["pod-template-hash"].clone();
    let before: Vec<Value> = operator_pods(&c).await.iter().map(template).collect();
    let out = c
        .upgrade(RELEASE, NS, &["--set", "debug.address=0.0.0.0"])
        .unwrap();
    assert!(out.success(), "helm upgrade: {}", out.stderr);
    let names: Vec<String> = c
        .wait_for("two new operator Pods Ready", WAIT, || async {
            let pods = operator_pods(&c).await;
            Ok((pods.len() == 2
                && pods.iter().all(ready)
                && pods.iter().all(|p| !before.contains(&template(p))))
            .then(|| pods.iter().map(name).collect()))
        })
        .await
        .unwrap();
    let leader = c
        .wait_for("a new Pod to hold the Lease", WAIT, || async {
            Ok(c.lease_holder(NS, FULLNAME)
                .await
                .ok()
                .filter(|h| names.contains(h)))
        })
        .await
        .unwrap();
    let standby = names.iter().find(|n| **n != leader).unwrap().clone();
    mark_service_target(&c, &leader, true).await;
    let out = c
        .env
        .apply_yaml(&format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: {}, namespace: {NS}}}\nspec:\n  selector: {{app.kubernetes.io/instance: {RELEASE}, app.kubernetes.io/component: operator, {SERVICE_TARGET_LABEL}: \"true\"}}\n  ports: [{{name: {}, port: 8082, targetPort: debug}}]\n",
            plugin::OPERATOR_SERVICE,
            plugin::OPERATOR_PORT_NAME
        ))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    wait_service_endpoint(&c, &leader).await;
    // The new leader has the traces of the decisions it made since it started: a Bundle placed
    // now.
    let routed = dir.path().join("routed.yaml");
    std::fs::write(
        &routed,
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {name: routed, namespace: default}\nspec:\n  replicas: 2\n  pools: [onprem]\n  jobs:\n    - {jobName: enc, requirements: {requiredCapacity: 1, priorityBand: bronze}}\n",
    )
    .unwrap();
    let out = c
        .kubectl(&["apply", "-f", routed.to_str().unwrap()])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    wait_ready(&c, "routed").await;

    let out = run_service(&c, &["trace", "routed", "-o", "json"]);
    ok(&out);
    assert!(
        out.stderr
            .contains("operator: answered through=service-proxy"),
        "{}",
        out.stderr
    );
    let by_service = out.json();
    assert_eq!(by_service["bundleId"], "default.routed");
    // The leader's trace, as the port-forward route has it: the same decisions.
    let out = run(
        &c,
        &["trace", "--from-operator", "routed", "-o", "json", "-v"],
    );
    ok(&out);
    assert_eq!(answered_by(&out), format!("{NS}/{leader}"));
    let by_portforward = out.json();
    let outcomes = |t: &Value| -> Vec<Value> {
        t["replicas"]
            .as_array()
            .unwrap_or_else(|| panic!("no replicas in {t:#}"))
            .iter()
            .map(|r| r["decision"]["outcome"]["kind"].clone())
            .collect()
    };
    assert_eq!(outcomes(&by_service).len(), 2, "{by_service:#}");
    assert_eq!(outcomes(&by_service), outcomes(&by_portforward));
    let out = run_service(&c, &["what-if", "-f", file.to_str().unwrap(), "-o", "json"]);
    ok(&out);
    assert!(
        out.stderr
            .contains("operator: answered through=service-proxy"),
        "{}",
        out.stderr
    );
    assert_eq!(out.json()["kind"], "ok", "{}", out.stdout);
    // As `kubectl automanager`, the plugin found on PATH.
    let plugin_dir = plugin::plugin_binary()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}:{}",
        plugin_dir.display(),
        c.env.bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(c.env.bin_dir().join("kubectl"))
        .args([
            "automanager",
            "trace",
            "routed",
            "--replica",
            "0",
            "--operator-service",
            plugin::OPERATOR_SERVICE,
        ])
        .env("PATH", &path)
        .env("KUBECONFIG", c.env.kubeconfig_path())
        .env_remove("AUTOMANAGER_OPERATOR_URL")
        .output()
        .unwrap();
    let out = PluginOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    ok(&out);
    assert!(
        out.stdout.contains("replica 0 · placed in "),
        "{}",
        out.stdout
    );
    // The Service moved onto the standby: this route does not follow it to the leader, and the
    // error carries the standby's answer naming the leader.
    mark_service_target(&c, &leader, false).await;
    mark_service_target(&c, &standby, true).await;
    wait_service_endpoint(&c, &standby).await;
    let out = run_service(&c, &["trace", "routed"]);
    assert_eq!(out.code, 1, "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr.contains(&format!(
            "the operator answered 503: this replica is standby and holds no placement state; the leader is {leader}"
        )),
        "{}",
        out.stderr
    );

    println!(
        "cli map_ms={:.0} trace_ms={:.0} through=leader-portforward baseline_kubectl_get_managernodes_ms={:.0}",
        median(&mut map_ms),
        median(&mut trace_ms),
        median(&mut kubectl_ms)
    );
}
