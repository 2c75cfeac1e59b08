//! The operator end to end: real apiserver + etcd, the manager-sim binary, the operator binary,
//! driven with kubectl as a user would.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use automanager_e2e::stack::Stack;
use automanager_e2e::{SetupError, examples_dir};
use automanager_e2e::{apply, condition};
use serde_json::Value;

const READY: Duration = Duration::from_secs(90);

async fn apply_examples(stack: &Stack) {
    let out = stack
        .env
        .apply_file(examples_dir().join("pools.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
}

fn jobs(bundle: &Value) -> Vec<Value> {
    bundle["status"]["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|r| r["jobs"].as_array().cloned().unwrap_or_default())
        .collect()
}

fn job<'a>(bundle: &'a Value, replica: usize, name: &str) -> &'a Value {
    bundle["status"]["replicas"][replica]["jobs"]
        .as_array()
        .and_then(|js| js.iter().find(|j| j["jobName"] == name))
        .unwrap_or(&Value::Null)
}

async fn events_for(stack: &Stack, name: &str) -> String {
    let out = stack
        .env
        .run_kubectl([
            "get",
            "events",
            "-A",
            "--field-selector",
            &format!("regarding.name={name}"),
            "-o",
            "custom-columns=REASON:.reason,NOTE:.note",
        ])
        .await
        .unwrap();
    let all = automanager_e2e::events_table(stack).await.unwrap();
    format!("{}\n{all}", out.stdout)
}

/// [`events_for`] once it shows a `reason` Event: Events are published off the reconcile
/// path, a moment after the status that follows them.
async fn events_for_with(stack: &Stack, name: &str, reason: &str) -> String {
    stack
        .wait_for(&format!("a {reason} Event on {name}"), READY, || async {
            let events = events_for(stack, name).await;
            Ok(events.contains(reason).then_some(events))
        })
        .await
        .unwrap()
}

fn bundle_yaml(name: &str, replicas: u32, pools: &str, jobs: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  replicas: {replicas}\n  pools: {pools}\n  jobs:\n{jobs}"
    )
}

/// `kubectl patch managernode NODE --type merge -p PATCH`, as a user cordons or drains.
async fn patch_node(stack: &Stack, node: &str, patch: &str) {
    let out = stack
        .env
        .run_kubectl(["patch", "managernode", node, "--type", "merge", "-p", patch])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
}

fn job_yaml(name: &str, capacity: u32, band: &str, extra: &str) -> String {
    format!(
        "    - jobName: {name}\n      requirements: {{requiredCapacity: {capacity}, requiredCores: 1, priorityBand: {band}{extra}}}\n"
    )
}

#[tokio::test]
async fn examples_become_ready_with_placements_and_traces() {
    let stack = Stack::start().await.expect("stack");
    let out = stack.env.apply_file(examples_dir()).await.unwrap();
    assert!(out.success(), "{}", out.stderr);

    for name in [
        "my-channel-1",
        "news-gold",
        "sports-silver",
        "preview-bronze",
    ] {
        stack
            .wait_bundle_phase("default", name, "Ready", READY)
            .await
            .expect("bundle Ready");
    }
    let b = stack
        .get_json(&["bundle", "my-channel-1", "-n", "default"])
        .await
        .unwrap();
    assert_eq!(b["status"]["placedReplicas"], 2);
    assert_eq!(condition(&b, "Ready")["status"], "True");
    assert_eq!(
        condition(&b, "Ready")["observedGeneration"],
        b["metadata"]["generation"]
    );
    // Replica 0 prefers aws-east; replica 1's override puts it in oci-fra.
    assert_eq!(job(&b, 0, "encode")["pool"], "aws-east", "{b:#}");
    assert_eq!(job(&b, 1, "encode")["pool"], "oci-fra", "{b:#}");
    // coLocateWith: package shares encode's node; replicas never share a node (hard rule).
    for r in 0..2 {
        assert_eq!(
            job(&b, r, "package")["nodeId"],
            job(&b, r, "encode")["nodeId"]
        );
        assert_eq!(job(&b, r, "encode")["state"], "running");
        let trace = &job(&b, r, "encode")["lastPlacement"];
        assert!(
            trace["outcome"] == "placed" || trace["outcome"] == "provisioning",
            "{trace:#}"
        );
        assert!(
            trace["poolsTried"]
                .as_array()
                .is_some_and(|p| !p.is_empty()),
            "{trace:#}"
        );
    }
    assert_ne!(
        job(&b, 0, "encode")["nodeId"],
        job(&b, 1, "encode")["nodeId"]
    );

    // The sports bundle needs sdi-capture: only the on-prem cluster has it; separateFrom keeps its jobs apart.
    let s = stack
        .get_json(&["bundle", "sports-silver", "-n", "default"])
        .await
        .unwrap();
    assert_eq!(job(&s, 0, "ingest")["pool"], "onprem");
    assert_ne!(
        job(&s, 0, "ingest")["nodeId"],
        job(&s, 0, "encode")["nodeId"]
    );

    // Every Manager node is mirrored as a ManagerNode, with its jobs (usage is written at most
    // every couple of seconds per node, so wait for it).
    let encode_node = job(&b, 0, "encode")["nodeId"].as_str().unwrap().to_owned();
    stack
        .wait_for("ManagerNodes with their jobs", READY, || async {
            let nodes = stack.get_json(&["managernodes"]).await?;
            let items = nodes["items"].as_array().cloned().unwrap_or_default();
            let mirrored = items
                .iter()
                .find(|n| n["status"]["nodeId"] == encode_node.as_str());
            let ok = items.len() >= 4
                && mirrored.is_some_and(|m| {
                    m["status"]["jobs"]
                        .as_array()
                        .is_some_and(|js| js.iter().any(|j| j["jobName"] == "encode"))
                        && m["status"]["usedCapacity"].as_i64().unwrap_or(0) >= 10
                });
            Ok(ok.then_some(()))
        })
        .await
        .unwrap();

    // The full trace is served by the operator's debugging API, and only there.
    let (code, _) = stack
        .http_get("/debug/trace/default/my-channel-1")
        .await
        .unwrap();
    assert_eq!(code, 404, "the probe port must not serve the debugging API");
    let (code, body) = stack
        .debug_get("/debug/trace/default/my-channel-1")
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    let trace: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        trace["replicas"].as_array().map(Vec::len),
        Some(2),
        "{trace:#}"
    );
    let (code, _) = stack.http_get("/debug/trace/default/nope").await.unwrap();
    assert_eq!(code, 404);

    // Pools report their figures; metrics are exposed.
    stack
        .wait_for("aws-east status", Duration::from_secs(30), || async {
            let p = stack.get_json(&["placementpool", "aws-east"]).await?;
            Ok((p["status"]["nodeCount"].as_i64().unwrap_or(0) >= 1
                && condition(&p, "Ready")["status"] == "True")
                .then_some(()))
        })
        .await
        .unwrap();
    let (code, metrics) = stack.http_get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("automanager_placements_succeeded_total"),
        "{metrics}"
    );
    assert!(metrics.contains("automanager_pool_nodes"), "{metrics}");
}

#[tokio::test]
async fn a_replica_spills_to_the_next_pool_when_the_first_cannot_take_it() {
    let stack = Stack::start().await.expect("stack");
    apply_examples(&stack).await;
    // Only aws-west has nvidia-gpu: onprem (first choice) is left, the replica spills.
    apply(
        &stack,
        &bundle_yaml(
            "gpu",
            1,
            "[onprem, aws-west]",
            &job_yaml(
                "infer",
                50,
                "silver",
                ", requiredCapabilities: [nvidia-gpu]",
            ),
        ),
    )
    .await;
    let b = stack
        .wait_bundle_phase("default", "gpu", "Ready", READY)
        .await
        .unwrap();
    let j = job(&b, 0, "infer");
    assert_eq!(j["pool"], "aws-west", "{b:#}");
    let tried = j["lastPlacement"]["poolsTried"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(
        tried.first().map(|p| p["pool"].clone()),
        Some(Value::from("onprem")),
        "{j:#}"
    );
    events_for_with(&stack, "gpu", "SpilledToPool").await;
}

#[tokio::test]
async fn refused_starts_make_a_node_unhealthy_and_placement_avoids_it() {
    let stack = Stack::start().await.expect("stack");
    apply_examples(&stack).await;
    // The operator's default: five refusals within ten minutes make a node unhealthy. Binpack
    // keeps choosing the fullest on-prem node, so all five refusals land on the same one.
    stack.chaos(&["reject-next", "5"]).unwrap();
    apply(
        &stack,
        &bundle_yaml("picky", 1, "[onprem]", &job_yaml("enc", 10, "silver", "")),
    )
    .await;
    let b = stack
        .wait_bundle_phase("default", "picky", "Ready", READY)
        .await
        .unwrap();
    let placed = job(&b, 0, "enc")["nodeId"].as_str().unwrap().to_owned();
    let unhealthy: Vec<String> = stack
        .wait_for("a ManagerNode with healthy: false", READY, || async {
            let nodes = stack.get_json(&["managernodes"]).await?;
            let names: Vec<String> = nodes["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|n| n["status"]["healthy"] == Value::Bool(false))
                .filter_map(|n| n["metadata"]["name"].as_str().map(str::to_owned))
                .collect();
            Ok((!names.is_empty()).then_some(names))
        })
        .await
        .unwrap();
    assert_eq!(unhealthy.len(), 1, "{unhealthy:?}");
    assert_ne!(unhealthy[0], placed, "placement avoided the unhealthy node");
    events_for_with(&stack, &unhealthy[0], "NodeUnhealthy").await;
}

#[tokio::test]
async fn a_full_fixed_pool_stalls_the_bundle_with_a_clear_reason() {
    let stack = Stack::start().await.expect("stack");
    apply_examples(&stack).await;
    // Three on-prem nodes of 200: three replicas of 150 fill them (different node, hard).
    apply(
        &stack,
        &bundle_yaml("fill", 3, "[onprem]", &job_yaml("big", 150, "silver", "")),
    )
    .await;
    stack
        .wait_bundle_phase("default", "fill", "Ready", READY)
        .await
        .unwrap();
    apply(
        &stack,
        &bundle_yaml("late", 1, "[onprem]", &job_yaml("big", 150, "silver", "")),
    )
    .await;
    let b = stack
        .wait_for("late to stall", READY, || async {
            let b = stack.get_json(&["bundle", "late", "-n", "default"]).await?;
            Ok((condition(&b, "Stalled")["status"] == "True").then_some(b))
        })
        .await
        .unwrap();
    let stalled = condition(&b, "Stalled");
    assert_eq!(stalled["reason"], "NoCapacity", "{b:#}");
    assert!(
        stalled["message"]
            .as_str()
            .unwrap()
            .contains("cannot be placed"),
        "{stalled:#}"
    );
    assert_eq!(job(&b, 0, "big")["state"], "unplaceable");
    assert!(
        job(&b, 0, "big")["lastPlacement"]["rejections"]
            .as_array()
            .is_some_and(|r| !r.is_empty()),
        "{b:#}"
    );

    // Freeing capacity lets it place.
    let out = stack
        .env
        .run_kubectl([
            "delete",
            "bundle",
            "fill",
            "-n",
            "default",
            "--wait=true",
            "--timeout=60s",
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    stack
        .wait_bundle_phase("default", "late", "Ready", READY)
        .await
        .unwrap();
}

#[tokio::test]
async fn a_killed_node_restarts_gold_and_silver_and_drops_bronze() {
    let stack = Stack::start().await.expect("stack");
    apply_examples(&stack).await;
    // Each band's job starts on-prem; killing their nodes sends gold and silver to aws-east.
    for (name, band) in [("g", "gold"), ("s", "silver"), ("b", "bronze")] {
        let jobs = job_yaml("enc", 20, band, "");
        apply(&stack, &bundle_yaml(name, 1, "[onprem, aws-east]", &jobs)).await;
    }
    let mut nodes = std::collections::HashMap::new();
    for n in ["g", "s", "b"] {
        let b = stack
            .wait_bundle_phase("default", n, "Ready", READY)
            .await
            .unwrap();
        nodes.insert(n, job(&b, 0, "enc")["nodeId"].as_str().unwrap().to_owned());
    }
    // Kill every node any of them uses. The kills land one at a time, so cordon them all first:
    // otherwise a job recovered from the first kill may land on a node the next kill takes, and
    // restart twice.
    let mut killed: Vec<String> = nodes.values().cloned().collect();
    killed.sort();
    killed.dedup();
    for node in &killed {
        stack
            .wait_for(&format!("{node} mirrored"), READY, || async {
                stack.get_json(&["managernode", node]).await.map(Some)
            })
            .await
            .unwrap();
        patch_node(&stack, node, r#"{"spec":{"cordoned":true}}"#).await;
    }
    for node in &killed {
        stack
            .wait_for(&format!("{node} cordoned"), READY, || async {
                let n = stack.get_json(&["managernode", node]).await?;
                Ok((condition(&n, "Cordoned")["status"] == "True").then_some(()))
            })
            .await
            .unwrap();
    }
    for node in &killed {
        stack.chaos(&["kill-node", node]).unwrap();
    }
    for n in ["g", "s"] {
        let b = stack
            .wait_for(
                &format!("{n} restarted off the killed nodes"),
                READY,
                || async {
                    let b = stack.get_json(&["bundle", n, "-n", "default"]).await?;
                    let j = job(&b, 0, "enc");
                    let moved = j["state"] == "running"
                        && !killed.iter().any(|k| j["nodeId"] == k.as_str());
                    Ok(moved.then_some(b))
                },
            )
            .await;
        let b = b.unwrap();
        assert_eq!(b["status"]["replicas"][0]["restartsLastHour"], 1, "{b:#}");
    }
    let b = stack
        .wait_for("bronze dropped", READY, || async {
            let b = stack.get_json(&["bundle", "b", "-n", "default"]).await?;
            Ok((job(&b, 0, "enc")["state"] == "dropped").then_some(b))
        })
        .await
        .unwrap();
    assert_eq!(b["status"]["phase"], "Degraded");
    events_for_with(&stack, "b", "JobDropped").await;
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("automanager_jobs_dropped_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
}

#[tokio::test]
async fn too_many_restarts_break_the_bundle_until_the_retry_annotation() {
    let stack = Stack::start().await.expect("stack");
    apply_examples(&stack).await;
    apply(
        &stack,
        &format!(
            "{}  bands:\n    gold: {{maxRestartsPerHour: 3}}\n",
            bundle_yaml("flaky", 1, "[onprem]", &job_yaml("enc", 10, "gold", ""))
        ),
    )
    .await;
    let job_id = "default.flaky/0/enc";
    stack
        .wait_bundle_phase("default", "flaky", "Ready", READY)
        .await
        .unwrap();
    // Three failures are restarted; the fourth breaks the bundle (more than maxRestartsPerHour = 3).
    for i in 1..=3 {
        stack.chaos(&["fail-job", job_id]).unwrap();
        stack
            .wait_for(&format!("restart {i}"), READY, || async {
                let b = stack
                    .get_json(&["bundle", "flaky", "-n", "default"])
                    .await?;
                Ok((b["status"]["replicas"][0]["restartsLastHour"] == i
                    && job(&b, 0, "enc")["state"] == "running")
                    .then_some(()))
            })
            .await
            .unwrap();
    }
    stack.chaos(&["fail-job", job_id]).unwrap();
    let b = stack
        .wait_bundle_phase("default", "flaky", "Broken", READY)
        .await
        .unwrap();
    assert_eq!(condition(&b, "Broken")["status"], "True");
    assert!(
        condition(&b, "Broken")["message"]
            .as_str()
            .unwrap()
            .contains("automanager.norsk.io/retry"),
        "{b:#}"
    );
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("automanager_broken_bundles ") && l.ends_with(" 1")),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("automanager_broken_bundle_info{")
                && l.contains("bundle=\"flaky\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );

    let out = stack
        .env
        .run_kubectl([
            "annotate",
            "--overwrite",
            "bundle",
            "flaky",
            "-n",
            "default",
            "automanager.norsk.io/retry=1",
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let b = stack
        .wait_bundle_phase("default", "flaky", "Ready", READY)
        .await
        .unwrap();
    assert_eq!(b["status"]["lastRetry"], "1");
    assert_eq!(condition(&b, "Broken")["status"], "False");
}

#[tokio::test]
async fn a_crash_loop_breaks_the_bundle_after_exactly_max_restarts_across_operator_kills() {
    let mut stack = Stack::start().await.expect("stack");
    apply_examples(&stack).await;
    apply(
        &stack,
        &format!(
            "{}  bands:\n    gold: {{maxRestartsPerHour: 3}}\n",
            bundle_yaml("crashy", 1, "[onprem]", &job_yaml("enc", 10, "gold", ""))
        ),
    )
    .await;
    let job_id = "default.crashy/0/enc";
    stack
        .wait_bundle_phase("default", "crashy", "Ready", READY)
        .await
        .unwrap();
    for i in 1..=3 {
        stack.chaos(&["fail-job", job_id]).unwrap();
        stack
            .wait_for(&format!("restart {i}"), READY, || async {
                let b = stack
                    .get_json(&["bundle", "crashy", "-n", "default"])
                    .await?;
                Ok((b["status"]["replicas"][0]["restartsLastHour"] == i
                    && job(&b, 0, "enc")["state"] == "running")
                    .then_some(()))
            })
            .await
            .unwrap();
        if i < 3 {
            // The count lives in the bundle's status, not only in the operator's memory.
            stack.operator.kill9();
            stack.start_operator().unwrap();
            stack
                .wait_operator_ready(Duration::from_secs(60))
                .await
                .unwrap();
        }
    }
    // The fourth failure is one more than maxRestartsPerHour = 3: Broken, not restarted.
    stack.chaos(&["fail-job", job_id]).unwrap();
    let b = stack
        .wait_bundle_phase("default", "crashy", "Broken", READY)
        .await
        .unwrap();
    assert_eq!(b["status"]["replicas"][0]["restartsLastHour"], 3, "{b:#}");
    assert_eq!(
        b["status"]["replicas"][0]["restartTimes"]
            .as_array()
            .map(Vec::len),
        Some(3),
        "{b:#}"
    );
    assert_eq!(job(&b, 0, "enc")["state"], "failed", "{b:#}");
}

#[tokio::test]
async fn a_cordoned_node_takes_no_new_placements_and_a_terminate_drain_recovers_its_jobs() {
    let stack = Stack::start().await.expect("stack");
    apply_examples(&stack).await;
    // Wait for the on-prem nodes to be mirrored, then cordon two of three.
    stack
        .wait_for("on-prem ManagerNodes", READY, || async {
            let n = stack.get_json(&["managernode", "onprem-a1"]).await;
            Ok(n.ok()
                .filter(|n| n["status"]["state"] == "started")
                .map(|_| ()))
        })
        .await
        .unwrap();
    for n in ["onprem-a1", "onprem-a2"] {
        patch_node(&stack, n, r#"{"spec":{"cordoned":true}}"#).await;
    }
    // A replica-2 bundle needs two nodes (different node, hard): only one is schedulable.
    apply(
        &stack,
        &bundle_yaml("two", 2, "[onprem]", &job_yaml("enc", 10, "gold", "")),
    )
    .await;
    let b =
        stack
            .wait_for("two to stall on cordoned nodes", READY, || async {
                let b = stack.get_json(&["bundle", "two", "-n", "default"]).await?;
                Ok((condition(&b, "Stalled")["status"] == "True"
                    && b["status"]["placedReplicas"] == 1)
                    .then_some(b))
            })
            .await
            .unwrap();
    for j in jobs(&b).iter().filter(|j| j["state"] == "running") {
        assert_eq!(
            j["nodeId"], "onprem-b1",
            "cordoned nodes must take nothing: {b:#}"
        );
    }
    let cordoned = stack.get_json(&["managernode", "onprem-a1"]).await.unwrap();
    assert_eq!(condition(&cordoned, "Cordoned")["status"], "True");

    // Uncordon one: the second replica places there.
    patch_node(&stack, "onprem-a1", r#"{"spec":{"cordoned":false}}"#).await;
    let b = stack
        .wait_bundle_phase("default", "two", "Ready", READY)
        .await
        .unwrap();
    let on_a1 = jobs(&b).iter().any(|j| j["nodeId"] == "onprem-a1");
    assert!(on_a1, "{b:#}");

    // Drain onprem-a1 with terminate: its gold job recovers elsewhere (onprem-a2 is still cordoned, b1 has the other replica).
    patch_node(&stack, "onprem-a2", r#"{"spec":{"cordoned":false}}"#).await;
    patch_node(
        &stack,
        "onprem-a1",
        r#"{"spec":{"drain":{"mode":"terminate"}}}"#,
    )
    .await;
    let b = stack
        .wait_for("gold job recovered off the drained node", READY, || async {
            let b = stack.get_json(&["bundle", "two", "-n", "default"]).await?;
            let moved = b["status"]["phase"] == "Ready"
                && !jobs(&b).iter().any(|j| j["nodeId"] == "onprem-a1");
            Ok(moved.then_some(b))
        })
        .await
        .unwrap();
    assert!(jobs(&b).iter().any(|j| j["nodeId"] == "onprem-a2"), "{b:#}");
}

#[tokio::test]
async fn deleting_a_bundle_stops_its_jobs_in_manager() {
    let stack = Stack::start().await.expect("stack");
    apply_examples(&stack).await;
    apply(
        &stack,
        &bundle_yaml("short", 2, "[onprem]", &job_yaml("enc", 10, "silver", "")),
    )
    .await;
    let b = stack
        .wait_bundle_phase("default", "short", "Ready", READY)
        .await
        .unwrap();
    let node = job(&b, 0, "enc")["nodeId"].as_str().unwrap().to_owned();
    let out = stack
        .env
        .run_kubectl([
            "delete",
            "bundle",
            "short",
            "-n",
            "default",
            "--wait=true",
            "--timeout=60s",
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    stack
        .wait_for("the node to hold no job of the bundle", READY, || async {
            let n = stack.get_json(&["managernode", &node]).await?;
            let holds = n["status"]["jobs"]
                .as_array()
                .is_some_and(|js| js.iter().any(|j| j["bundle"] == "default/short"));
            Ok((!holds).then_some(()))
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_restarted_operator_duplicates_nothing_and_loses_no_bundle() {
    let mut stack = Stack::start().await.expect("stack");
    apply_examples(&stack).await;
    let mut yaml = String::new();
    for i in 0..12 {
        yaml.push_str(&bundle_yaml(
            &format!("wave-{i}"),
            2,
            "[onprem, aws-east]",
            &job_yaml("enc", 10, "silver", ""),
        ));
        yaml.push_str("---\n");
    }
    apply(&stack, &yaml).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    stack.operator.stop(Duration::from_secs(5));
    stack.start_operator().unwrap();
    stack
        .wait_operator_ready(Duration::from_secs(60))
        .await
        .unwrap();
    for i in 0..12 {
        stack
            .wait_bundle_phase("default", &format!("wave-{i}"), "Ready", READY)
            .await
            .unwrap();
    }
    // Each job runs exactly once across every node (node statuses catch up within seconds).
    let ids = stack
        .wait_for("24 wave jobs on the ManagerNodes", READY, || async {
            let nodes = stack.get_json(&["managernodes"]).await?;
            let mut ids: Vec<String> = nodes["items"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .flat_map(|n| n["status"]["jobs"].as_array().cloned().unwrap_or_default())
                .filter_map(|j| j["jobId"].as_str().map(str::to_owned))
                .filter(|id| id.starts_with("default.wave-"))
                .collect();
            ids.sort();
            Ok((ids.len() >= 24).then_some(ids))
        })
        .await
        .unwrap();
    let mut distinct = ids.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "a job runs twice: {ids:?}");
    assert_eq!(ids.len(), 24);
}

#[tokio::test]
async fn what_if_answers_admission_against_the_live_snapshot() {
    let stack = Stack::start().await.expect("stack");
    apply_examples(&stack).await;
    let bundle = |pools: &str, cap: u32| {
        serde_json::json!({
            "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "probe", "namespace": "default"},
            "spec": {"replicas": 1, "pools": [pools], "jobs": [{"jobName": "j", "requirements": {"requiredCapacity": cap, "priorityBand": "gold"}}]}
        })
        .to_string()
    };
    stack
        .wait_for("the on-prem pool to be loaded", READY, || async {
            let (code, body) = stack
                .debug_post("/v1/what-if", &bundle("onprem", 10))
                .await?;
            Ok((code == 200 && body.contains("\"ok\"")).then_some(()))
        })
        .await
        .unwrap();
    let (code, body) = stack
        .debug_post("/v1/what-if", &bundle("nowhere", 10))
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("validationErrors"), "{body}");
    let (code, body) = stack.debug_post("/v1/what-if", "{not json").await.unwrap();
    assert_eq!(code, 400, "{body}");
}

#[tokio::test]
async fn an_invalid_config_exits_non_zero_listing_every_problem() -> Result<(), SetupError> {
    let bins = automanager_e2e::stack::binaries()?;
    let dir = tempfile::tempdir().map_err(|e| SetupError(e.to_string()))?;
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "manager: {url: \"not a url\"}\npendingWindw: 60\nbands: {gold: {maxRestartsPerHour: 0}}\n",
    )
    .map_err(|e| SetupError(e.to_string()))?;
    let out = std::process::Command::new(&bins.operator)
        .arg("--config")
        .arg(&path)
        .output()
        .map_err(|e| SetupError(e.to_string()))?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "manager.url",
        "pendingWindw",
        "did you mean",
        "pendingWindow",
        "bands.gold.maxRestartsPerHour",
    ] {
        assert!(stderr.contains(needle), "missing {needle:?} in:\n{stderr}");
    }
    Ok(())
}

#[tokio::test]
async fn the_worst_case_status_and_retry_values_are_written_bounded() {
    let stack = Stack::start().await.expect("stack");
    apply_examples(&stack).await;
    // 16 replicas of 16 jobs with long names, 150 each: a replica needs 16 on-prem nodes of 200
    // and there are three, so every replica is unplaceable and the reasons together are far
    // over a condition's 4,096 bytes.
    let jobs: String = (0..16)
        .map(|i| {
            job_yaml(
                &format!("a-job-with-a-deliberately-long-name-so-reasons-are-long-{i:02}"),
                150,
                "silver",
                "",
            )
        })
        .collect();
    apply(&stack, &bundle_yaml("huge", 16, "[onprem]", &jobs)).await;
    let b = stack
        .wait_for("huge to stall with a status", READY, || async {
            let b = stack.get_json(&["bundle", "huge", "-n", "default"]).await?;
            Ok((condition(&b, "Stalled")["status"] == "True").then_some(b))
        })
        .await
        .unwrap();
    let message = condition(&b, "Stalled")["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(condition(&b, "Stalled")["reason"], "NoCapacity", "{b:#}");
    assert!(message.len() <= 4096, "{}", message.len());
    assert!(message.contains("more"), "the cut is marked: {message}");

    // A retry value far over status.lastRetry's 256 bytes is acted on exactly once.
    let long = "r".repeat(10_000);
    let out = stack
        .env
        .run_kubectl([
            "annotate",
            "--overwrite",
            "bundle",
            "huge",
            "-n",
            "default",
            &format!("automanager.norsk.io/retry={long}"),
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let b = stack
        .wait_for("lastRetry to be recorded", READY, || async {
            let b = stack.get_json(&["bundle", "huge", "-n", "default"]).await?;
            Ok(b["status"]["lastRetry"]
                .as_str()
                .is_some_and(|r| r.starts_with("rrr"))
                .then_some(b))
        })
        .await
        .unwrap();
    assert!(b["status"]["lastRetry"].as_str().unwrap().len() <= 256);
    // Give a looping operator time to show itself, then count the Retry Events.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let events = events_for(&stack, "huge").await;
    let retries = events
        .lines()
        .filter(|l| l.split_whitespace().any(|w| w == "Retry"))
        .count();
    // `events_for` lists each Event twice (core and events.k8s.io views).
    assert!(retries <= 2, "one Retry Event expected:\n{events}");

    // Validation errors past 4,096 bytes: every job fits no instance type of the pool.
    let jobs: String = (0..16)
        .map(|i| {
            job_yaml(
                &format!("a-job-with-a-deliberately-long-name-so-errors-are-long-{i:02}"),
                300,
                "silver",
                ", requiredCapabilities: [a-capability-no-node-in-any-pool-advertises-at-all, another-capability-no-node-in-any-pool-advertises-at-all, a-third-capability-no-node-in-any-pool-advertises-at-all]",
            )
        })
        .collect();
    apply(&stack, &bundle_yaml("invalid", 16, "[onprem]", &jobs)).await;
    let b = stack
        .wait_for("invalid to stall with a status", READY, || async {
            let b = stack
                .get_json(&["bundle", "invalid", "-n", "default"])
                .await?;
            Ok((condition(&b, "Stalled")["reason"] == "InvalidSpec").then_some(b))
        })
        .await
        .unwrap();
    let message = condition(&b, "Stalled")["message"].as_str().unwrap();
    assert!(
        message.len() <= 4096 && message.contains("more"),
        "{} bytes, ends {:?}",
        message.len(),
        &message[message.len().saturating_sub(200)..]
    );
}

#[tokio::test]
async fn check_config_validates_and_exits_without_connecting() -> Result<(), SetupError> {
    let bins = automanager_e2e::stack::binaries()?;
    let dir = tempfile::tempdir().map_err(|e| SetupError(e.to_string()))?;
    let run = |yaml: &str| -> Result<std::process::Output, SetupError> {
        let path = dir.path().join("operator.yaml");
        std::fs::write(&path, yaml).map_err(|e| SetupError(e.to_string()))?;
        // No cluster and no Manager: a check must not need either.
        std::process::Command::new(&bins.operator)
            .arg("--config")
            .arg(&path)
            .arg("--check-config")
            .env("KUBECONFIG", dir.path().join("none"))
            .output()
            .map_err(|e| SetupError(e.to_string()))
    };
    let out = run(
        "manager: {url: \"http://manager:6789\"}\nhttp: {bindAddress: \"0.0.0.0:8080\", debugBindAddress: \"0.0.0.0:8082\"}\n",
    )?;
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration is valid"));
    let out = run(
        "manager: {url: \"http://manager:6789\"}\nhttp: {bindAddress: \"0.0.0.0:8080\", debugBindAddress: \"127.0.0.1:8080\"}\n",
    )?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("http.debugBindAddress"));
    Ok(())
}
