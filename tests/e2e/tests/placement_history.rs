//! The placement history on the real stack: decisions kept by the apiserver survive a leader
//! failover, a leader adds to the history it wrote without reading it back, and `kubectl
//! automanager trace` and `what-if` answer on a default install (no debugging port anywhere),
//! through the apiserver only.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use std::collections::BTreeMap;

use automanager_e2e::bench::{GROUP, has_label, metric_sum};
use automanager_e2e::plugin::{PluginOutput, run_through_apiserver};
use automanager_e2e::stack::Stack;
use automanager_e2e::{apply, apply_example_pools};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(90);

/// The stack's operator as a default install runs it: no debugging port.
async fn start_without_debug() -> Stack {
    let stack = Stack::start_with(|c| {
        if let Some(http) = c.get_mut("http").and_then(Value::as_object_mut) {
            http.remove("debugBindAddress");
        }
    })
    .await
    .expect("stack");
    apply_example_pools(&stack).await.unwrap();
    stack
}

fn ok(out: &PluginOutput) {
    assert_eq!(
        out.code, 0,
        "exit {}\nstdout:\n{}\nstderr:\n{}",
        out.code, out.stdout, out.stderr
    );
}

const BUNDLE: &str = "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {name: history, namespace: default}\nspec:\n  replicas: 1\n  pools: [onprem]\n  jobs:\n    - jobName: enc\n      requirements: {requiredCapacity: 8, requiredCores: 1, priorityBand: silver}\n";

async fn lease_holder(stack: &Stack) -> Option<String> {
    let lease = stack
        .get_json(&["lease", "automanager-operator", "-n", "default"])
        .await
        .ok()?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_owned)
}

/// The node the bundle's job runs on while it is Ready.
async fn ready_on(stack: &Stack) -> Option<String> {
    let b = stack
        .get_json(&["bundle", "history", "-n", "default"])
        .await
        .ok()?;
    (b["status"]["phase"] == "Ready")
        .then(|| {
            b["status"]["replicas"][0]["jobs"][0]["nodeId"]
                .as_str()
                .map(str::to_owned)
        })
        .flatten()
}

#[tokio::test]
async fn trace_survives_leader_failover() {
    let mut stack = start_without_debug().await;
    let kubeconfig = stack.env.kubeconfig_path().to_path_buf();
    let (mut replica_b, b_http) = stack.start_replica("b", &kubeconfig).unwrap();
    stack
        .wait_for("replica b ready", WAIT, || async {
            let (code, _) = automanager_e2e::stack::http_get_at(&b_http, "/readyz").await?;
            Ok((code == 200).then_some(()))
        })
        .await
        .unwrap();
    apply(&stack, BUNDLE).await;
    let first_node = stack
        .wait_for("the bundle placed", WAIT, || async {
            Ok(ready_on(&stack).await)
        })
        .await
        .unwrap();
    let first_leader = lease_holder(&stack).await.expect("a leader");

    // Kill the leader: the other replica takes the lease over.
    let a_pid = stack.operator.pid().unwrap();
    if first_leader.ends_with(&format!("-{a_pid}")) {
        stack.operator.kill9();
    } else {
        replica_b.kill9();
    }
    let second_leader = stack
        .wait_for("a new leader", WAIT, || async {
            Ok(lease_holder(&stack).await.filter(|h| *h != first_leader))
        })
        .await
        .unwrap();

    // A node kill: the recovery is the new leader's decision.
    stack.chaos(&["kill-node", &first_node]).unwrap();
    let second_node = stack
        .wait_for("the bundle recovered elsewhere", WAIT, || async {
            Ok(ready_on(&stack).await.filter(|n| *n != first_node))
        })
        .await
        .unwrap();

    // The real plugin, through the apiserver only (no operator URL, no port-forward).
    let data = stack
        .wait_for("the recovery in the history", WAIT, || async {
            let out = run_through_apiserver(&stack, &["trace", "history", "-o", "json"]);
            if out.code != 0 {
                return Ok(None);
            }
            let v = out.json();
            let n = v["spec"]["replicas"][0]["decisions"]
                .as_array()
                .map_or(0, Vec::len);
            Ok((n >= 2).then_some(v))
        })
        .await
        .unwrap();
    let decisions = data["spec"]["replicas"][0]["decisions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let before = decisions
        .iter()
        .find(|d| d["recovery"] == false && d["outcome"] == "placed")
        .expect("the first placement, from before the failover");
    assert_eq!(before["leader"], first_leader.as_str(), "{decisions:#?}");
    assert_eq!(before["nodes"][0], first_node.as_str());
    let after = decisions
        .iter()
        .rev()
        .find(|d| d["recovery"] == true && d["outcome"] == "placed")
        .expect("the recovery, after the failover");
    assert_eq!(after["leader"], second_leader.as_str(), "{decisions:#?}");
    assert_eq!(after["nodes"][0], second_node.as_str());
    assert!(
        before["decidedAt"].as_str() < after["decidedAt"].as_str(),
        "{decisions:#?}"
    );

    let text = run_through_apiserver(&stack, &["trace", "history"]);
    ok(&text);
    for shown in [&first_leader, &second_leader, &first_node, &second_node] {
        assert!(
            text.stdout.contains(shown.as_str()),
            "{shown}:\n{}",
            text.stdout
        );
    }
    assert!(
        text.stdout.contains("recovery placement"),
        "the newest in full:\n{}",
        text.stdout
    );
    println!("fidelity-figure trace_after_failover=yes");
}

/// The apiserver's own count of requests for PlacementHistories, per verb.
async fn history_requests(stack: &Stack) -> BTreeMap<&'static str, f64> {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = stack.env.client().request_text(req).await.unwrap();
    ["GET", "POST", "PATCH", "APPLY", "PUT"]
        .into_iter()
        .map(|verb| {
            let n = metric_sum(&text, "apiserver_request_total", |l| {
                has_label(l, "group", GROUP)
                    && has_label(l, "resource", "placementhistories")
                    && has_label(l, "verb", verb)
            });
            (verb, n)
        })
        .collect()
}

#[tokio::test]
async fn a_leader_adds_to_the_history_it_wrote_without_reading_it() {
    let stack = start_without_debug().await;
    apply(&stack, BUNDLE).await;
    let first_node = stack
        .wait_for("the bundle placed", WAIT, || async {
            Ok(ready_on(&stack).await)
        })
        .await
        .unwrap();
    let created = stack
        .wait_for("the placement in a new history", WAIT, || async {
            let calls = history_requests(&stack).await;
            Ok((calls["POST"] >= 1.0).then_some(calls))
        })
        .await
        .unwrap();
    assert_eq!(
        (created["GET"], created["APPLY"], created["PATCH"]),
        (0.0, 0.0, 0.0),
        "a new bundle's history is created, not read first: {created:?}"
    );

    stack.chaos(&["kill-node", &first_node]).unwrap();
    let added = stack
        .wait_for("the recovery added to the history", WAIT, || async {
            let calls = history_requests(&stack).await;
            Ok((calls["PATCH"] > created["PATCH"]).then_some(calls))
        })
        .await
        .unwrap();
    assert_eq!(
        (added["GET"], added["APPLY"], added["POST"]),
        (created["GET"], created["APPLY"], created["POST"]),
        "the leader patched the history it wrote, without reading it or writing it whole"
    );

    let second_node = stack
        .wait_for("the bundle recovered elsewhere", WAIT, || async {
            Ok(ready_on(&stack).await.filter(|n| *n != first_node))
        })
        .await
        .unwrap();
    let history = stack
        .get_json(&["placementhistory", "history", "-n", "default"])
        .await
        .unwrap();
    let r0 = &history["spec"]["replicas"][0];
    let decisions = r0["decisions"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        decisions.first().map(|d| &d["nodes"][0]),
        Some(&Value::from(first_node.as_str())),
        "{history:#}"
    );
    let newest = decisions.last().unwrap();
    assert_eq!(newest["recovery"], true, "{history:#}");
    assert_eq!(newest["nodes"][0], second_node.as_str(), "{history:#}");
    assert_eq!(
        r0["lastTrace"]["decidedAt"], newest["decidedAt"],
        "the newest in full: {history:#}"
    );
}

#[tokio::test]
async fn what_if_answers_with_debug_disabled() {
    let stack = start_without_debug().await;
    let dir = tempfile::tempdir().unwrap();
    let fits = dir.path().join("fits.yaml");
    std::fs::write(&fits, BUNDLE).unwrap();
    let too_big = dir.path().join("too-big.yaml");
    std::fs::write(
        &too_big,
        BUNDLE
            .replace("name: history", "name: huge")
            .replace("requiredCapacity: 8", "requiredCapacity: 900000"),
    )
    .unwrap();
    // Nodes first: what-if reads the ManagerNodes the operator mirrors.
    stack
        .wait_for("the operator's ManagerNodes", WAIT, || async {
            let nodes = stack.get_json(&["managernodes"]).await?;
            Ok((nodes["items"].as_array().is_some_and(|i| !i.is_empty())).then_some(()))
        })
        .await
        .unwrap();

    let out = run_through_apiserver(&stack, &["what-if", "-f", &fits.display().to_string()]);
    ok(&out);
    assert!(out.stdout.contains("fits"), "{}", out.stdout);
    assert!(out.stdout.contains("placed in onprem"), "{}", out.stdout);

    let out = run_through_apiserver(&stack, &["what-if", "-f", &too_big.display().to_string()]);
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(
        out.stdout.contains("unplaceable")
            || out.stdout.contains("no capacity")
            || out.stdout.contains("invalid"),
        "{}",
        out.stdout
    );
}

/// Where no garbage collector ran after a Bundle was deleted, its history is still there when a
/// Bundle of the same name is created: the new Bundle's decisions replace it, under the new
/// owner alone (an apply would add a second controller, which the apiserver refuses).
#[tokio::test]
async fn a_bundle_replaces_the_history_an_earlier_bundle_of_its_name_left() {
    let stack = start_without_debug().await;
    apply(
        &stack,
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: PlacementHistory\nmetadata:\n  name: history\n  namespace: default\n  ownerReferences:\n    - {apiVersion: automanager.norsk.io/v1alpha1, kind: Bundle, name: history, uid: 00000000-0000-0000-0000-00000000dead, controller: true, blockOwnerDeletion: true}\nspec: {bundle: history, replicas: []}\n",
    )
    .await;
    apply(&stack, BUNDLE).await;
    let node = stack
        .wait_for("the bundle placed", WAIT, || async {
            Ok(ready_on(&stack).await)
        })
        .await
        .unwrap();
    let uid = stack
        .get_json(&["bundle", "history", "-n", "default"])
        .await
        .unwrap()["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_owned();
    let history = stack
        .wait_for("the history under the new bundle", WAIT, || async {
            let h = stack
                .get_json(&["placementhistory", "history", "-n", "default"])
                .await?;
            Ok((h["metadata"]["ownerReferences"][0]["uid"] == uid.as_str()).then_some(h))
        })
        .await
        .unwrap();
    let owners = history["metadata"]["ownerReferences"].as_array().unwrap();
    assert_eq!(owners.len(), 1, "the new bundle alone: {history:#}");
    let decisions = history["spec"]["replicas"][0]["decisions"]
        .as_array()
        .unwrap();
    assert_eq!(decisions.len(), 1, "{history:#}");
    assert_eq!(decisions[0]["nodes"][0], node.as_str(), "{history:#}");
}
