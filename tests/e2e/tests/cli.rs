//! `kubectl-automanager` end to end: the real apiserver, manager-sim and operator, the plugin
//! binary run as a person runs it (also as `kubectl automanager`), the operator (a process on
//! loopback) reached with `--operator-url http://127.0.0.1:<port>`. Every command's happy path
//! and its error paths; JSON output parsed; how the routes through the apiserver fail when
//! there is no Pod to reach (the same routes to real Pods: oncall_cluster.rs, on a node). Also:
//! every metric the dashboard and the alert rules name is one the running operator exports.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use automanager_e2e::plugin::{self, PluginOutput};
use automanager_e2e::stack::Stack;
use automanager_e2e::{
    apply, apply_example_pools, demo_sim_config_with_job_socket, examples_dir, repo_root,
};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(90);

async fn start() -> Stack {
    let stack = Stack::start().await.expect("stack");
    apply_example_pools(&stack).await.unwrap();
    stack
}

fn bundle(name: &str, replicas: u32, pools: &str, capacity: u32, extra: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  replicas: {replicas}\n  pools: {pools}\n  jobs:\n    - jobName: enc\n      requirements: {{requiredCapacity: {capacity}, requiredCores: 2, priorityBand: gold}}{extra}\n"
    )
}

fn ok(out: &PluginOutput) {
    assert_eq!(
        out.code, 0,
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        out.code, out.stdout, out.stderr
    );
}

fn fails(out: &PluginOutput, code: i32, stderr_has: &str) {
    assert_eq!(
        out.code, code,
        "exit {} (wanted {code})\nstdout:\n{}\nstderr:\n{}",
        out.code, out.stdout, out.stderr
    );
    assert!(
        out.stderr.contains(stderr_has),
        "stderr lacks {stderr_has:?}:\n{}",
        out.stderr
    );
}

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[tokio::test]
async fn reads_validate_what_if_trace_top_and_broken() {
    let stack = start().await;
    let run = |args: &[&str]| plugin::run(&stack, args);
    apply(&stack, &bundle("news", 2, "[onprem]", 20, "")).await;
    let b = stack
        .wait_bundle_phase("default", "news", "Ready", WAIT)
        .await
        .unwrap();
    let nodes: BTreeSet<String> = b["status"]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["jobs"][0]["nodeId"].as_str().unwrap().to_owned())
        .collect();

    // Through the apiserver's service proxy to a Service that does not exist: a clear error
    // naming the way it was tried.
    let out = plugin::run_through_apiserver(
        &stack,
        &[
            "trace",
            "news",
            "--operator-service",
            plugin::OPERATOR_SERVICE,
        ],
    );
    fails(
        &out,
        1,
        "cannot reach the operator through the apiserver's proxy to service automanager-system/automanager-operator port debug",
    );
    assert!(out.stderr.contains("not found"), "{}", out.stderr);

    // map -o json agrees with the ManagerNode objects, node by node, once they list both
    // replicas' jobs (the operator writes ManagerNode status after the Bundle's).
    stack
        .wait_for("the ManagerNodes to list news's two jobs", WAIT, || async {
            let nodes = stack.get_json(&["managernodes"]).await?;
            let jobs = nodes["items"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|n| n["status"]["jobs"].as_array().cloned().unwrap_or_default())
                .filter(|j| j["bundle"] == "default/news")
                .count();
            Ok((jobs == 2).then_some(()))
        })
        .await
        .unwrap();
    let out = run(&["map", "-o", "json"]);
    ok(&out);
    map_agrees_with_the_manager_nodes(&stack, &out.json()).await;
    let out = run(&["map", "--bundle", "news"]);
    ok(&out);
    assert!(
        out.stdout.contains("default/news (#, [ ]):"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("[A0]") && out.stdout.contains("[A1]"),
        "{}",
        out.stdout
    );
    let out = run(&["map", "-o", "name"]);
    ok(&out);
    assert!(
        out.stdout.lines().all(|l| l.starts_with("managernode/")),
        "{}",
        out.stdout
    );
    let out = run(&["map", "-o", "jsonpath={.bundles[*].bundle}"]);
    ok(&out);
    assert_eq!(out.stdout, "default/news");

    // trace, JSON: one decision per replica, each placing the job where status says it runs.
    let out = run(&["trace", "news", "-o", "json"]);
    ok(&out);
    let t = out.json();
    assert_eq!(t["bundleId"], "default.news");
    let replicas = t["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 2);
    let traced: BTreeSet<String> = replicas
        .iter()
        .map(|r| {
            assert_eq!(r["decision"]["outcome"]["kind"], "placed", "{r:#}");
            r["decision"]["outcome"]["assignments"][0]["node"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(traced, nodes);

    // trace, text, and narrowed to one replica and job; also through `kubectl automanager`.
    let out = run(&["trace", "news"]);
    ok(&out);
    assert!(
        out.stdout.contains("pools tried, in order"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout.contains("1. onprem: placed here"),
        "{}",
        out.stdout
    );
    assert!(
        out.stdout
            .contains("spread takes the emptiest node that fits")
            || out
                .stdout
                .contains("binpack takes the fullest node that fits"),
        "{}",
        out.stdout
    );
    let out = run(&[
        "trace",
        "news",
        "--replica",
        "1",
        "--job",
        "enc",
        "-o",
        "yaml",
    ]);
    ok(&out);
    let y: Value = serde_saphyr::from_str(&out.stdout).unwrap();
    assert_eq!(y["replicas"].as_array().unwrap().len(), 1);
    fails(
        &run(&["trace", "news", "--replica", "5"]),
        1,
        "has no decision for replica 5",
    );
    fails(
        &run(&["trace", "nosuch"]),
        1,
        "bundle default/nosuch not found",
    );
    let plugin_dir = plugin::plugin_binary()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}:{}",
        plugin_dir.display(),
        stack.env.bin_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = std::process::Command::new(stack.env.bin_dir().join("kubectl"))
        .args([
            "automanager",
            "trace",
            "news",
            "--replica",
            "0",
            "--operator-url",
            &stack.operator_debug_http,
        ])
        .env("PATH", &path)
        .env("KUBECONFIG", stack.env.kubeconfig_path())
        .output()
        .unwrap();
    let out = PluginOutput {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    ok(&out);
    assert!(
        out.stdout.contains("replica 0 · placed in onprem"),
        "{}",
        out.stdout
    );

    // what-if: fits (with the dry run's decisions), no capacity, invalid, malformed.
    let dir = tempfile::tempdir().unwrap();
    let fits = write(&dir, "fits.yaml", &bundle("extra", 2, "[onprem]", 20, ""));
    let out = run(&["what-if", "-f", &fits, "-o", "json"]);
    ok(&out);
    let w = out.json();
    assert_eq!(w["kind"], "ok");
    assert_eq!(w["decisions"].as_array().unwrap().len(), 2);
    let out = run(&["what-if", "-f", &fits]);
    ok(&out);
    assert!(
        out.stdout.contains("Bundle default/extra: fits"),
        "{}",
        out.stdout
    );
    // Four replicas on different nodes of a three-node fixed pool: the fourth has no room.
    let four = write(&dir, "four.yaml", &bundle("four", 4, "[onprem]", 20, ""));
    let out = run(&["what-if", "-f", &four, "-o", "json"]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let w = out.json();
    assert_eq!(w["kind"], "noCapacity");
    assert_eq!(w["unplaceable"][0]["replicaIndex"], 3);
    assert_eq!(w["unplaceable"][0]["jobName"], "enc");
    let out = run(&["what-if", "-f", &four]);
    assert!(out.stdout.contains("replica 3 job enc:"), "{}", out.stdout);
    let unknown = write(&dir, "unknown.yaml", &bundle("unk", 1, "[nowhere]", 20, ""));
    let out = run(&["what-if", "-f", &unknown]);
    assert_eq!(out.code, 1);
    assert!(
        out.stdout
            .contains("spec.pools[0]: pool \"nowhere\" does not exist"),
        "{}",
        out.stdout
    );
    let bad = write(&dir, "bad.yaml", "kind: Bundle\nspec: [1, 2\n");
    fails(&run(&["what-if", "-f", &bad]), 1, "not valid YAML");
    fails(
        &run(&[
            "what-if",
            "-f",
            &write(
                &dir,
                "two.yaml",
                &format!(
                    "{}---\n{}",
                    bundle("a", 1, "[onprem]", 1, ""),
                    bundle("b", 1, "[onprem]", 1, "")
                ),
            ),
        ]),
        1,
        "what-if takes exactly one Bundle",
    );

    // validate: offline, no kubeconfig at all.
    let offline = |args: &[&str]| {
        plugin::run_with(args, |c| {
            c.env("KUBECONFIG", "/nonexistent/kubeconfig");
        })
    };
    ok(&offline(&["validate", "-f", "examples/"]));
    let out = offline(&[
        "validate",
        "-f",
        "examples/invalid/bundle-colocate-unknown-job.yaml",
        "--pools",
        "examples/pools.yaml",
        "-o",
        "json",
    ]);
    assert_eq!(out.code, 1);
    let r = out.json();
    assert_eq!(r["valid"], false);
    // The CRD's CEL rule, worded as the apiserver words it.
    assert_eq!(r["objects"][0]["errors"][0]["path"], "spec.jobs");
    assert_eq!(
        r["objects"][0]["errors"][0]["message"],
        "Invalid value: \"object\": coLocateWith must name jobs of this bundle"
    );
    fails(
        &offline(&["validate", "-f", "/nonexistent.yaml"]),
        1,
        "cannot read /nonexistent.yaml",
    );

    // top: capacity from the objects the operator keeps.
    let out = run(&["top", "nodes", "-o", "json"]);
    ok(&out);
    let rows = out.json();
    let rows = rows.as_array().unwrap();
    for n in &nodes {
        let row = rows.iter().find(|r| &r["node"] == n).unwrap();
        assert_eq!(row["pool"], "onprem");
        assert_eq!(row["usedCapacity"], 20, "{row:#}");
        assert_eq!(row["totalCapacity"], 200);
    }
    // The rows come from the apiserver's Table of the printer columns: each says what the
    // object itself says.
    for row in rows {
        let name = row["node"].as_str().unwrap();
        let n = stack.get_json(&["managernode", name]).await.unwrap();
        let s = &n["status"];
        for (field, want) in [
            ("pool", &s["pool"]),
            ("zone", &s["zone"]),
            ("state", &s["state"]),
            ("instanceType", &s["instanceType"]),
            ("usedCapacity", &s["usedCapacity"]),
            ("totalCapacity", &s["totalCapacity"]),
            ("usedCores", &s["usedCores"]),
            ("totalCores", &s["totalCores"]),
            ("spare", &s["spare"]),
            ("healthy", &s["healthy"]),
            ("capabilities", &s["capabilities"]),
            ("cordoned", &n["spec"]["cordoned"]),
        ] {
            assert_eq!(&row[field], want, "{field} of {name}: {row:#}\n{n:#}");
        }
        assert_eq!(
            row["jobs"].as_u64(),
            s["jobs"].as_array().map(|j| j.len() as u64),
            "{name}"
        );
        assert_eq!(row["draining"], n["spec"]["drain"].is_object(), "{name}");
    }
    // A reader that stops reading (`| head`) ends the command quietly, not with a panic.
    let mut child = std::process::Command::new(plugin::plugin_binary().unwrap())
        .args(["top", "nodes"])
        .env("KUBECONFIG", stack.env.kubeconfig_path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let closed = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&closed.stderr);
    assert!(closed.status.success(), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let out = run(&["top", "nodes", "--pool", "onprem"]);
    ok(&out);
    assert!(out.stdout.starts_with("NODE"), "{}", out.stdout);
    assert_eq!(out.stdout.lines().count(), 4, "{}", out.stdout);
    let out = run(&["top", "pools", "-o", "json"]);
    ok(&out);
    let pools = out.json();
    let onprem = pools
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pool"] == "onprem")
        .unwrap();
    assert_eq!(onprem["usedCapacity"], 40);
    assert_eq!(onprem["totalCapacity"], 600);
    ok(&run(&["top", "pools", "-o", "wide"]));

    // get broken: none, then one (restart ceiling 1, two failures), then retry --wait.
    let out = run(&["get", "broken", "-A", "-o", "json"]);
    ok(&out);
    assert_eq!(out.json(), serde_json::json!([]));
    apply(
        &stack,
        &bundle(
            "flaky",
            1,
            "[onprem]",
            10,
            "\n  bands:\n    gold: {maxRestartsPerHour: 1}",
        ),
    )
    .await;
    stack
        .wait_bundle_phase("default", "flaky", "Ready", WAIT)
        .await
        .unwrap();
    stack.chaos(&["fail-job", "default.flaky/0/enc"]).unwrap();
    stack
        .wait_for("a restart of flaky", WAIT, || async {
            let b = stack.get_json(&["bundle", "flaky"]).await?;
            Ok((b["status"]["replicas"][0]["restartsLastHour"] == 1
                && b["status"]["replicas"][0]["jobs"][0]["state"] == "running")
                .then_some(()))
        })
        .await
        .unwrap();
    stack.chaos(&["fail-job", "default.flaky/0/enc"]).unwrap();
    stack
        .wait_bundle_phase("default", "flaky", "Broken", WAIT)
        .await
        .unwrap();
    let out = run(&["get", "broken", "-o", "json"]);
    ok(&out);
    let broken = out.json();
    assert_eq!(broken[0]["bundle"], "flaky");
    assert_eq!(broken[0]["reason"], "RestartCeilingExceeded");
    let out = run(&["get", "broken", "-A"]);
    assert!(
        out.stdout.contains("kubectl automanager retry"),
        "{}",
        out.stdout
    );
    let out = run(&["retry", "flaky", "--wait", "--timeout", "90s"]);
    ok(&out);
    assert!(out.stdout.contains("bundle/flaky Ready"), "{}", out.stdout);
    let b = stack.get_json(&["bundle", "flaky"]).await.unwrap();
    assert_eq!(b["status"]["phase"], "Ready");
    fails(
        &run(&["retry", "nosuch"]),
        1,
        "bundle default/nosuch not found",
    );

    // Where no operator answers: the same command fails cleanly, with the reason.
    let out = plugin::run_through_apiserver(
        &stack,
        &["trace", "news", "--operator-service", "no-such-service"],
    );
    fails(&out, 1, "services \"no-such-service\" not found");
    // A Service with no endpoint: the apiserver's 503 is the answer, told at once rather than
    // retried until the request timeout.
    let out = stack
        .env
        .apply_yaml(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\napiVersion: v1\nkind: Service\nmetadata: {{name: no-endpoints, namespace: {ns}}}\nspec:\n  ports: [{{name: debug, port: 8082}}]\n---\napiVersion: v1\nkind: Endpoints\nmetadata: {{name: no-endpoints, namespace: {ns}}}\n",
            ns = plugin::OPERATOR_NAMESPACE
        ))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let out = plugin::run_through_apiserver(
        &stack,
        &[
            "trace",
            "news",
            "--operator-service",
            "no-endpoints",
            "--request-timeout",
            "20s",
        ],
    );
    fails(
        &out,
        1,
        "no endpoints available for service \"no-endpoints\"",
    );
    let out = run(&["trace", "news", "--operator-url", "http://127.0.0.1:9"]);
    fails(&out, 1, "cannot reach the operator at http://127.0.0.1:9");
}

/// Creates the operator Pods `manifests` (one Pod each) and marks them Running, as a kubelet
/// would (there is none here).
async fn running_pods(env: &automanager_e2e::TestEnv, manifests: &[String]) {
    let out = env.apply_yaml(&manifests.concat()).await.unwrap();
    assert!(out.success(), "{}", out.stderr);
    for m in manifests {
        let name = m
            .lines()
            .find_map(|l| l.trim().strip_prefix("name: "))
            .expect("a Pod name");
        let out = env
            .run_kubectl([
                "patch",
                "pod",
                name,
                "-n",
                "automanager-system",
                "--subresource=status",
                "--type=merge",
                "-p",
                r#"{"status":{"phase":"Running"}}"#,
            ])
            .await
            .unwrap();
        assert!(out.success(), "{}", out.stderr);
    }
}

/// How `--from-operator` reaches the operator with no URL given (by default trace and what-if
/// read the apiserver and need no Pod): the chart's operator Pods, the leader Lease, a
/// port-forward to the holder's `debug` port. There is no kubelet here, so the port-forward
/// itself fails; the error says which Pod and port the plugin chose, and each way it can go
/// wrong before that is told apart.
#[tokio::test]
async fn the_plugin_finds_the_leader_pod_by_the_charts_labels_and_the_lease() {
    let env = automanager_e2e::env_with_crds()
        .await
        .expect("control plane with CRDs");
    let applied = env
        .apply_yaml(&bundle("news", 1, "[onprem]", 1, ""))
        .await
        .unwrap();
    assert!(applied.success(), "{}", applied.stderr);
    let pod = |name: &str, debug: bool| {
        let ports = if debug {
            "[{name: http, containerPort: 8080}, {name: debug, containerPort: 8082}]"
        } else {
            "[{name: http, containerPort: 8080}]"
        };
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: automanager-system\n  labels: {{app.kubernetes.io/name: automanager, app.kubernetes.io/instance: automanager, app.kubernetes.io/component: operator, pod-template-hash: 5d8c7b9f4}}\n  ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: automanager-5d8c7b9f4, uid: 00000000-0000-0000-0000-000000000001}}]\nspec:\n  automountServiceAccountToken: false\n  containers: [{{name: operator, image: automanager-operator:e2e, ports: {ports}}}]\n---\n"
        )
    };
    let run = |args: &[&str]| {
        plugin::run_with(args, |c| {
            c.env("KUBECONFIG", env.kubeconfig_path());
        })
    };
    let ns = env
        .apply_yaml("apiVersion: v1\nkind: Namespace\nmetadata: {name: automanager-system}\n")
        .await
        .unwrap();
    assert!(ns.success(), "{}", ns.stderr);

    // No operator Pod at all.
    fails(
        &run(&["trace", "--from-operator", "news"]),
        1,
        "no operator Pod in namespace automanager-system with labels app.kubernetes.io/name=automanager,app.kubernetes.io/component=operator",
    );

    // Two Pods, debugging port off.
    running_pods(
        &env,
        &[
            pod("automanager-5d8c7b9f4-aaaaa", false),
            pod("automanager-5d8c7b9f4-bbbbb", false),
        ],
    )
    .await;
    fails(
        &run(&["trace", "--from-operator", "news"]),
        1,
        "the debugging API of release automanager is off",
    );

    // The chart with debug.enabled: the ports are named; no Lease yet, two Pods.
    let out = env
        .run_kubectl([
            "delete",
            "pods",
            "--all",
            "-n",
            "automanager-system",
            "--wait=false",
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    // Deleted at once: no kubelet holds them.
    running_pods(
        &env,
        &[
            pod("automanager-5d8c7b9f4-ccccc", true),
            pod("automanager-5d8c7b9f4-ddddd", true),
        ],
    )
    .await;
    fails(
        &run(&["trace", "--from-operator", "news"]),
        1,
        "has no leader Lease yet and 2 running Pods",
    );

    // The Lease, named like the Deployment, holding the second Pod: that is where it goes.
    let out = env
        .apply_yaml("apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata: {name: automanager, namespace: automanager-system}\nspec: {holderIdentity: automanager-5d8c7b9f4-ddddd, leaseDurationSeconds: 15}\n")
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    fails(
        &run(&["trace", "--from-operator", "news"]),
        1,
        "cannot reach the operator by port-forward to the operator's leader Pod in namespace automanager-system: port-forward to pod automanager-system/automanager-5d8c7b9f4-ddddd port 8082",
    );
    // what-if goes the same way.
    let dir = tempfile::tempdir().unwrap();
    let file = write(&dir, "b.yaml", &bundle("other", 1, "[onprem]", 1, ""));
    fails(
        &run(&["what-if", "--from-operator", "-f", &file]),
        1,
        "port-forward to pod automanager-system/automanager-5d8c7b9f4-ddddd port 8082",
    );
    // A holder that is no operator Pod (a new leader being elected).
    let out = env
        .run_kubectl([
            "patch",
            "lease",
            "automanager",
            "-n",
            "automanager-system",
            "--type=merge",
            "-p",
            r#"{"spec":{"holderIdentity":"automanager-5d8c7b9f4-gone"}}"#,
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    fails(
        &run(&["trace", "--from-operator", "news"]),
        1,
        "names automanager-5d8c7b9f4-gone, which is not a running operator Pod",
    );
    // Another release's name.
    fails(
        &run(&[
            "trace",
            "--from-operator",
            "news",
            "--operator-release",
            "team-b",
        ]),
        1,
        "no operator Pod of release team-b in namespace automanager-system",
    );
}

#[tokio::test]
async fn writes_cordon_drain_migrate_abort_with_wait() {
    // Simulated jobs wait up to ten minutes for an answer, so a held cutover stays held.
    let dir = tempfile::tempdir().unwrap();
    let config = demo_sim_config_with_job_socket(
        dir.path(),
        &serde_json::json!({"answerTimeoutMs": 600000}),
    )
    .unwrap();
    let stack = Stack::start_custom(&config, &[], |_| {})
        .await
        .expect("stack");
    apply_example_pools(&stack).await.unwrap();
    let out = stack
        .env
        .apply_file(examples_dir().join("hot-spares.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let run = |args: &[&str]| plugin::run(&stack, args);
    apply(
        &stack,
        &bundle(
            "mover",
            1,
            "[onprem]",
            20,
            "\n      migration: {strategy: handover}",
        ),
    )
    .await;
    let b = stack
        .wait_bundle_phase("default", "mover", "Ready", WAIT)
        .await
        .unwrap();
    let source = b["status"]["replicas"][0]["jobs"][0]["nodeId"]
        .as_str()
        .unwrap()
        .to_owned();

    // cordon / uncordon write spec.cordoned, as `kubectl patch` would.
    let out = run(&["cordon", &source]);
    ok(&out);
    assert_eq!(out.stdout.trim(), format!("managernode/{source} cordoned"));
    let n = stack.get_json(&["managernode", &source]).await.unwrap();
    assert_eq!(n["spec"]["cordoned"], true);
    assert_eq!(
        run(&["cordon", &source]).stdout.trim(),
        format!("managernode/{source} already cordoned")
    );
    let out = run(&["uncordon", &source, "-o", "json"]);
    ok(&out);
    assert_eq!(out.json()["spec"]["cordoned"], false);
    fails(
        &run(&["cordon", "no-such-node"]),
        1,
        "managernode no-such-node not found",
    );
    // A node a bundle names before the operator has mirrored it into its ManagerNode: the
    // plugin says it is still being mirrored and waits for it, as `kubectl wait` would.
    // Deleting the object by hand opens that window on purpose (the operator writes it again).
    let out = stack
        .env
        .run_kubectl(&["delete", "managernode", &source])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let out = run(&["cordon", &source]);
    ok(&out);
    assert!(
        out.stderr.contains(&format!(
            "managernode {source}: still being mirrored (bundle default/mover runs a job there)"
        )),
        "{}",
        out.stderr
    );
    assert_eq!(out.stdout.trim(), format!("managernode/{source} cordoned"));
    ok(&run(&["uncordon", &source]));

    // migrate --wait: the phases as plain lines (not a terminal), the final object as JSON.
    let out = run(&[
        "migrate",
        "mover/0/enc",
        "--strategy",
        "stop-then-start",
        "--wait",
        "-o",
        "json",
    ]);
    ok(&out);
    let m = out.json();
    assert_eq!(m["status"]["phase"], "Completed", "{m:#}");
    assert_eq!(m["spec"]["strategy"], "stopThenStart");
    assert!(out.stderr.contains("phase Completed"), "{}", out.stderr);
    assert!(
        !out.stderr.contains('\r'),
        "plain lines when not a terminal"
    );
    let moved_to = m["status"]["targetNode"].as_str().unwrap().to_owned();
    assert_ne!(moved_to, source);
    fails(
        &run(&["migrate", "mover/3/enc"]),
        1,
        "there is no replica 3",
    );
    fails(
        &run(&["migrate", "mover/0/nope"]),
        1,
        "has no job \"nope\" (its jobs: enc)",
    );
    fails(
        &run(&["migrate", "mover-enc"]),
        1,
        "is not BUNDLE/REPLICA/JOB",
    );
    fails(
        &run(&["migrate", "gone/0/enc"]),
        1,
        "bundle default/gone not found",
    );
    let out = run(&["migrate", "mover/0/enc", "--strategy", "sideways"]);
    assert_eq!(out.code, 2, "a usage error: {}", out.stderr);

    // abort: hold a handover in its cutover, then abort it and wait for Aborted.
    stack
        .chaos(&[
            "migration-behaviour",
            "default.mover/0/enc",
            "slow-cutover",
            "600000",
        ])
        .unwrap();
    // --wait times out cleanly with its own exit code, naming what it waited for; the
    // migration itself goes on (held in its cutover by the job).
    let out = run(&["migrate", "mover/0/enc", "--wait", "--timeout", "3s"]);
    fails(&out, 3, "timed out after 3s waiting for migration default/");
    let name = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("migration/")?.strip_suffix(" created"))
        .unwrap_or_else(|| panic!("no name in {}", out.stdout))
        .to_owned();
    stack
        .wait_for("the handover to hold in CutoverReady", WAIT, || async {
            let m = stack.get_json(&["migration", &name]).await?;
            Ok((m["status"]["phase"] == "CutoverReady").then_some(()))
        })
        .await
        .unwrap();
    dashboard_and_alerts_use_only_exported_metrics(&stack).await;
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains("automanager_migrations{phase=\"CutoverReady\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!(
            "automanager_migration_phase_start_time_seconds{{migration_namespace=\"default\",migration=\"{name}\",phase=\"CutoverReady\"}}"
        )),
        "{metrics}"
    );
    let out = run(&[
        "abort",
        &name,
        "--reason",
        "maintenance window closed",
        "--wait",
        "--timeout",
        "90s",
    ]);
    ok(&out);
    assert!(
        out.stdout.contains(&format!("migration/{name} aborted")),
        "{}",
        out.stdout
    );
    let m = stack.get_json(&["migration", &name]).await.unwrap();
    assert_eq!(m["status"]["phase"], "Aborted");
    assert_eq!(m["spec"]["abort"]["reason"], "maintenance window closed");
    fails(&run(&["abort", &name]), 1, "already ended (Aborted)");
    fails(
        &run(&["abort", "no-such-migration"]),
        1,
        "migration default/no-such-migration not found",
    );
    stack
        .chaos(&["migration-behaviour", "default.mover/0/enc", "cooperative"])
        .unwrap();

    // drain --mode migrate --wait: the node's job moves and the node is terminated.
    let b = stack.get_json(&["bundle", "mover"]).await.unwrap();
    let node = b["status"]["replicas"][0]["jobs"][0]["nodeId"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = run(&["drain", &node, "--wait", "--timeout", "120s"]);
    ok(&out);
    assert!(
        out.stdout.contains(&format!("managernode/{node} drained")),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("migrated"), "{}", out.stdout);
    stack
        .wait_bundle_ready_off("default", "mover", &node, WAIT)
        .await
        .unwrap();
    let out = run(&["drain", &node, "--mode", "terminate"]);
    fails(&out, 1, "the apiserver refused");
}

async fn map_agrees_with_the_manager_nodes(stack: &Stack, map: &Value) {
    let nodes = stack.get_json(&["managernodes"]).await.unwrap();
    if let Err(e) = plugin::map_agrees_with_nodes(map, &nodes) {
        panic!("{e}");
    }
}

/// Every metric name in the dashboard's queries and the alert rules' expressions, with the
/// suffixes Prometheus adds (`_total`, `_bucket`, ...) resolved against the `# TYPE` lines of a
/// running operator's /metrics.
/// prometheus-client writes a family's `# TYPE` line only once it has a series, so this runs
/// while pools, a HotSpareTarget, reconciles and an active migration exist.
async fn dashboard_and_alerts_use_only_exported_metrics(stack: &Stack) {
    let (status, text) = stack.http_get("/metrics").await.unwrap();
    assert_eq!(status, 200);
    let mut exported = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            _ => &[""],
        };
        for s in suffixes {
            exported.insert(format!("{name}{s}"));
        }
    }
    assert!(exported.contains("automanager_leader"), "{text}");
    assert!(
        text.contains("automanager_leader 1"),
        "the leader says so:\n{text}"
    );

    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/grafana/automanager.json")).unwrap(),
    )
    .unwrap();
    let mut exprs = Vec::new();
    collect_exprs(&dashboard, &mut exprs);
    assert!(
        exprs.len() >= 20,
        "the dashboard has its queries: {exprs:?}"
    );
    let rules: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/prometheus/rules.yaml")).unwrap(),
    )
    .unwrap();
    let mut alerts = 0;
    for rule in rules["groups"][0]["rules"].as_array().unwrap() {
        exprs.push(rule["expr"].as_str().unwrap().to_owned());
        alerts += 1;
    }
    assert!(alerts >= 5);

    let mut used = BTreeSet::new();
    for e in &exprs {
        for word in e.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("automanager_") {
                used.insert(word.to_owned());
            }
        }
    }
    // Every name the rules and the dashboard use is checked against the whole registry (every
    // family with a series) by crates/operator/tests/alert_names.rs; here, the running
    // operator exports the families a live fleet has, under the names the dashboard uses.
    for family in [
        "automanager_placements_attempted_total",
        "automanager_pool_used_capacity_ratio",
        "automanager_manager_connection_state",
        "automanager_reconcile_duration_seconds_bucket",
        "automanager_migrations",
        "automanager_build_info",
        "automanager_spares",
        "automanager_pool_max_nodes",
    ] {
        assert!(
            exported.contains(family),
            "the operator does not export {family}"
        );
    }
    // And the families the issue asks for are all on the dashboard.
    for family in [
        "automanager_placements_attempted_total",
        "automanager_placements_failed_total",
        "automanager_jobs_rejected_total",
        "automanager_broken_bundle_info",
        "automanager_jobs_dropped_total",
        "automanager_pool_used_capacity_ratio",
        "automanager_zone_degraded",
        "automanager_jobs_preempted_total",
        "automanager_consolidation_nodes_terminated_total",
        "automanager_disruptions_blocked_total",
        "automanager_migrations_queued",
        "automanager_orphans_removed_total",
        "automanager_build_info",
        "automanager_spares",
        "automanager_pool_max_nodes",
        "automanager_warm_spare_starts_total",
        "automanager_manager_connection_state",
        "automanager_reconcile_duration_seconds_bucket",
        "automanager_migrations",
    ] {
        assert!(used.contains(family), "the dashboard lacks {family}");
    }
}

fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// kubectl itself completes `kubectl automanager …` through `kubectl_complete-automanager`
/// (deploy/plugin), found on PATH beside the plugin.
#[test]
fn kubectl_completes_the_plugin_through_its_helper() {
    let plugin_dir = plugin::plugin_binary()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    let kubectl = testenv::default_bin_dir().unwrap().join("kubectl");
    let path = format!(
        "{}:{}:{}",
        plugin_dir.display(),
        repo_root().join("deploy/plugin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let complete = |words: &[&str]| {
        let out = std::process::Command::new(&kubectl)
            .arg("__complete")
            .arg("automanager")
            .args(words)
            .env("PATH", &path)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let out = complete(&["tr"]);
    assert!(out.starts_with("trace\t"), "{out}");
    assert!(out.contains(":4"), "{out}");
    let out = complete(&["drain", "n1", "--mode", ""]);
    assert!(
        out.contains("migrate\n") && out.contains("terminate\n"),
        "{out}"
    );
    let out = complete(&["map", "--b"]);
    assert!(out.starts_with("--bundle\t"), "{out}");
}

/// A kubeconfig whose one context, `name`, points at `server` with `user`'s credentials (the
/// CA of the kubeconfig `ca_of`, when given, else none).
fn kubeconfig_for(
    dir: &tempfile::TempDir,
    name: &str,
    server: &str,
    user: Value,
    ca_of: Option<&std::path::Path>,
) -> String {
    let mut cluster = serde_json::json!({ "server": server });
    if let Some(p) = ca_of {
        let kc = kube::config::Kubeconfig::read_from(p).unwrap();
        cluster["certificate-authority-data"] = kc.clusters[0]
            .cluster
            .as_ref()
            .unwrap()
            .certificate_authority_data
            .clone()
            .unwrap()
            .into();
    }
    let kc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": name, "cluster": cluster }],
        "users": [{ "name": name, "user": user }],
        "contexts": [{ "name": name, "context": { "cluster": name, "user": name } }],
        "current-context": name,
    });
    // JSON is YAML: kubeconfig files may be either.
    write(dir, &format!("{name}.kubeconfig"), &kc.to_string())
}

/// A loopback port nothing listens on (bound, read, closed).
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// An apiserver that does not answer is named, with the context that pointed there, whatever
/// the command and wherever its flags are.
#[test]
fn an_unreachable_apiserver_is_named_with_its_context() {
    let dir = tempfile::tempdir().unwrap();
    let server = format!("https://127.0.0.1:{}", closed_port());
    let kubeconfig = kubeconfig_for(
        &dir,
        "kind-closed",
        &server,
        serde_json::json!({ "token": "t" }),
        None,
    );
    let want = format!("cannot reach the apiserver at {server} (context kind-closed): ");
    for args in [
        &["top", "pools"][..],
        &["-n", "team-a", "-o", "json", "get", "broken"],
        &["trace", "news", "-n", "team-a", "--request-timeout", "5s"],
        &["--request-timeout=0", "cordon", "node-a"],
    ] {
        let out = plugin::run_with(args, |c| {
            c.env("KUBECONFIG", &kubeconfig);
        });
        fails(&out, 1, &want);
        assert!(
            out.stderr.contains("Connection refused"),
            "{args:?}: {}",
            out.stderr
        );
    }
}

/// Completion of names from the real apiserver (bundles and migrations in the namespace of
/// `-n`, nodes, pools, namespaces, kubeconfig contexts), the helper kubectl runs included;
/// kubectl's flags before or after the command, in completion and in the commands; the
/// connection flags applied (`--server`, `--certificate-authority`,
/// `--insecure-skip-tls-verify`) and failures to connect or authenticate naming the server
/// and the context.
#[tokio::test]
async fn completes_names_from_the_apiserver_and_takes_kubectls_flags_anywhere() {
    let env = automanager_e2e::env_with_crds()
        .await
        .expect("control plane with CRDs");
    let in_team = |name: &str, replicas: u32| {
        bundle(name, replicas, "[onprem]", 1, "").replace("namespace: default", "namespace: team-a")
    };
    let objects = [
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a}\n".to_owned(),
        in_team("news", 2),
        in_team("sport", 1),
        bundle("other", 1, "[onprem]", 1, ""),
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: ManagerNode\nmetadata: {name: node-a}\nspec: {}\n".to_owned(),
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: ManagerNode\nmetadata: {name: node-b}\nspec: {}\n".to_owned(),
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Migration\nmetadata: {name: news-move, namespace: team-a}\nspec: {job: {bundle: news, replica: 0, jobName: enc}}\n".to_owned(),
    ];
    let out = env.apply_yaml(&objects.join("---\n")).await.unwrap();
    assert!(out.success(), "{}", out.stderr);
    let out = env
        .apply_file(examples_dir().join("pools.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let pools: BTreeSet<String> = env
        .run_kubectl(["get", "placementpools", "-o", "name"])
        .await
        .unwrap()
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("placementpool.automanager.norsk.io/"))
        .map(str::to_owned)
        .collect();
    assert!(pools.len() >= 2, "{pools:?}");

    let kubeconfig = env.kubeconfig_path().to_owned();
    let complete = |words: &[&str]| plugin::complete(&kubeconfig, words);
    let names = |words: &[&str]| -> Vec<String> {
        let c = complete(words);
        assert!(c.stderr.is_empty(), "{words:?}: {}", c.stderr);
        c.words
    };

    // Bundles: the context's namespace, or -n's wherever it is and however it is written.
    assert_eq!(names(&["trace", ""]), ["other"]);
    for words in [
        &["-n", "team-a", "trace", ""][..],
        &["-n", "team-a", "-o", "json", "trace", ""],
        &["-nteam-a", "-ojson", "trace", ""],
        &["--namespace=team-a", "retry", ""],
        &["trace", "-n", "team-a", ""],
        &["-o", "yaml", "get", "windows", "--namespace", "team-a", ""],
        &["-n", "team-a", "map", "--bundle", ""],
    ] {
        assert_eq!(names(words), ["news", "sport"], "{words:?}");
    }
    assert_eq!(
        names(&["-n", "team-a", "-o", "json", "trace", "s"]),
        ["sport"]
    );
    // Namespaces, for -n before or after the command.
    for words in [
        &["-n", ""][..],
        &["-o", "json", "-n", ""],
        &["top", "pools", "--namespace", ""],
    ] {
        let ns = names(words);
        assert!(
            ns.contains(&"team-a".to_owned()) && ns.contains(&"default".to_owned()),
            "{words:?}: {ns:?}"
        );
    }
    assert_eq!(names(&["-n", "team"]), ["team-a"]);
    assert_eq!(names(&["--namespace=team"]), ["--namespace=team-a"]);
    // Nodes, pools, migrations, kubeconfig contexts.
    for words in [
        &["cordon", ""][..],
        &["drain", ""],
        &["-n", "team-a", "migrate", "news/0/enc", "--to", ""],
    ] {
        assert_eq!(names(words), ["node-a", "node-b"], "{words:?}");
    }
    let listed: BTreeSet<String> = names(&["map", "--pool", ""]).into_iter().collect();
    assert_eq!(listed, pools);
    let listed: BTreeSet<String> = names(&["top", "nodes", "--pool", ""]).into_iter().collect();
    assert_eq!(listed, pools);
    assert_eq!(names(&["-n", "team-a", "abort", ""]), ["news-move"]);
    assert!(names(&["abort", ""]).is_empty());
    assert_eq!(names(&["--context", ""]), ["testenv"]);
    // migrate's BUNDLE/REPLICA/JOB, one segment at a time, without a space after the unfinished ones.
    let c = complete(&["-n", "team-a", "migrate", ""]);
    assert_eq!(
        (c.words.as_slice(), c.directive),
        (&["news/".to_owned(), "sport/".to_owned()][..], 6)
    );
    let c = complete(&["-n", "team-a", "migrate", "news/"]);
    assert_eq!(
        (c.words.as_slice(), c.directive),
        (&["news/0/".to_owned(), "news/1/".to_owned()][..], 6)
    );
    let c = complete(&["-n", "team-a", "migrate", "news/1/"]);
    assert_eq!(
        (c.words.as_slice(), c.directive),
        (&["news/1/enc".to_owned()][..], 4)
    );
    // Commands and flags stay as they were.
    assert!(names(&["-n", "team-a", "-o", "json", "t"]).contains(&"trace".to_owned()));
    assert!(names(&["trace", "news", "--req"]).contains(&"--request-timeout".to_owned()));

    // kubectl itself, through the helper on PATH, with the flags it passes on.
    let plugin_dir = plugin::plugin_binary()
        .unwrap()
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}:{}",
        plugin_dir.display(),
        repo_root().join("deploy/plugin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let kubectl = env.bin_dir().join("kubectl");
    let out = std::process::Command::new(&kubectl)
        .args(["__complete", "automanager", "-n", "team-a", "trace", ""])
        .env("PATH", &path)
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("news\nsport\n:4"),
        "{text}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The commands take the flags before or after them.
    let run = |args: &[&str]| {
        plugin::run_with(args, |c| {
            c.env("KUBECONFIG", &kubeconfig);
        })
    };
    for args in [
        &["-n", "team-a", "-o", "json", "get", "windows"][..],
        &["get", "windows", "-n", "team-a", "-o", "json"],
        &["-o", "json", "get", "-n", "team-a", "windows"],
        &[
            "--request-timeout",
            "5",
            "-nteam-a",
            "-ojson",
            "get",
            "windows",
        ],
    ] {
        let out = run(args);
        ok(&out);
        let bundles: BTreeSet<String> = out.json()["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{}/{}",
                    r["namespace"].as_str().unwrap(),
                    r["bundle"].as_str().unwrap()
                )
            })
            .collect();
        assert_eq!(
            bundles,
            BTreeSet::from(["team-a/news".to_owned(), "team-a/sport".to_owned()]),
            "{args:?}: {}",
            out.stdout
        );
    }

    // The connection flags: --server with the CA it needs, or without checking it.
    let server = env.server_url().to_owned();
    let ca = env.dir().join("pki/ca.crt");
    let not_a_ca = env.dir().join("pki/apiserver.crt");
    let dir = tempfile::tempdir().unwrap();
    let no_ca = kubeconfig_for(
        &dir,
        "kind-no-ca",
        "https://127.0.0.1:1",
        serde_json::to_value(
            kube::config::Kubeconfig::read_from(&kubeconfig)
                .unwrap()
                .auth_infos[0]
                .auth_info
                .clone()
                .unwrap(),
        )
        .unwrap(),
        None,
    );
    let run_no_ca = |args: &[&str]| {
        plugin::run_with(args, |c| {
            c.env("KUBECONFIG", &no_ca);
        })
    };
    let out = run_no_ca(&[
        "top",
        "pools",
        "-o",
        "name",
        "--server",
        &server,
        "--certificate-authority",
        ca.to_str().unwrap(),
    ]);
    ok(&out);
    assert_eq!(out.stdout.lines().count(), pools.len(), "{}", out.stdout);
    let out = run_no_ca(&[
        "--insecure-skip-tls-verify",
        "--server",
        &server,
        "top",
        "pools",
    ]);
    ok(&out);
    let out = run_no_ca(&[
        "--server",
        &server,
        "--certificate-authority",
        not_a_ca.to_str().unwrap(),
        "top",
        "pools",
    ]);
    fails(
        &out,
        1,
        &format!("cannot reach the apiserver at {server} (context kind-no-ca): "),
    );
    assert!(out.stderr.contains("certificate"), "{}", out.stderr);
    // The stack's own context, its server replaced by one that is closed.
    let closed = format!("https://127.0.0.1:{}", closed_port());
    fails(
        &run(&["--server", &closed, "-n", "team-a", "trace", "news"]),
        1,
        &format!("cannot reach the apiserver at {closed} (context testenv): "),
    );
    // Credentials the apiserver does not accept.
    let bad_token = kubeconfig_for(
        &dir,
        "kind-bad-token",
        &server,
        serde_json::json!({ "token": "not-a-token" }),
        Some(&kubeconfig),
    );
    let out = plugin::run_with(&["top", "pools"], |c| {
        c.env("KUBECONFIG", &bad_token);
    });
    fails(
        &out,
        1,
        &format!(
            "the apiserver at {server} (context kind-bad-token) did not accept the credentials"
        ),
    );
}
