//! Preemption for recovery on the real stack (kube-apiserver + etcd, manager-sim, the operator
//! binary, kubectl), with the reliability suite's invariant checker running alongside.
//!
//! A fixed pool of three nodes of 100: a gold job of 60 on the first, filled up with bronze; the
//! second holds bronze jobs of 40 (oldest), 30 and 30 (newest); the third five bronze jobs of 20.
//! The first node dies. There is no spare and the pool cannot grow, so the gold recovery finds no
//! room:
//!
//! - with `bands.gold.preempt: true` it stops exactly the victims
//!   `automanager_policy::preempt::choose_victims` picks from Manager's state (the two newest
//!   30s of the second node: the fewest victims, then the newest), which are dropped in their
//!   Bundles' status, and the gold job runs on that node; Events on both sides, the metric and
//!   the gold job's placement trace say so;
//! - with preemption off (the default) nothing is stopped and the gold bundle waits, Stalled
//!   `NoCapacity`, as before.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use automanager_e2e::reliability::{Monitor, manager_state, settle, sim_admin};
use automanager_e2e::stack::Stack;
use automanager_e2e::{apply, condition, events_table, fixed_pool, wait_events};
use automanager_policy::PriorityBand;
use automanager_policy::preempt::{self, NodeCandidate, RunningJob};
use manager_client::proto::KillNodeRequest;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);
const POOL: &str = "rack";

fn bundle(name: &str, band: &str, capacity: u32) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {{name: {name}, namespace: default}}
spec:
  replicas: 1
  pools: [{POOL}]
  jobs:
    - jobName: enc
      requirements: {{requiredCapacity: {capacity}, requiredCores: 1, priorityBand: {band}}}
"
    )
}

/// The bronze bundles, in the order they are created (binpack fills rack-1, then rack-2, then
/// rack-3), with their capacity.
const BRONZE: [(&str, u32); 9] = [
    ("fill", 40),
    ("old", 40),
    ("mid", 30),
    ("new", 30),
    ("s1", 20),
    ("s2", 20),
    ("s3", 20),
    ("s4", 20),
    ("s5", 20),
];

async fn job_of(stack: &Stack, name: &str) -> Value {
    let b = stack
        .get_json(&["bundle", name, "-n", "default"])
        .await
        .unwrap();
    b["status"]["replicas"][0]["jobs"][0].clone()
}

/// A stack whose operator config is adjusted by `adjust`, the pool, the gold bundle and the
/// bronze ones placed one by one, and the invariant checker running.
async fn fleet(adjust: impl FnOnce(&mut serde_json::Map<String, Value>)) -> (Stack, Monitor) {
    let dir = tempfile::tempdir().unwrap();
    let (config, pool) = fixed_pool(
        dir.path(),
        POOL,
        &[
            ("rack-1", "row-1"),
            ("rack-2", "row-1"),
            ("rack-3", "row-1"),
        ],
    )
    .unwrap();
    let stack = Stack::start_custom(&config, &[], adjust)
        .await
        .expect("stack");
    apply(&stack, &pool).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    apply(&stack, &bundle("gold", "gold", 60)).await;
    stack
        .wait_bundle_phase("default", "gold", "Ready", WAIT)
        .await
        .unwrap();
    // One at a time, so each lands where binpack puts it given the ones before.
    for (name, capacity) in BRONZE {
        apply(&stack, &bundle(name, "bronze", capacity)).await;
        stack
            .wait_bundle_phase("default", name, "Ready", WAIT)
            .await
            .unwrap();
    }
    let mut layout: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in std::iter::once("gold").chain(BRONZE.iter().map(|(n, _)| *n)) {
        let j = job_of(&stack, name).await;
        layout
            .entry(j["nodeId"].as_str().unwrap_or_default().to_owned())
            .or_default()
            .push(name.to_owned());
    }
    let want: BTreeMap<String, Vec<String>> = [
        ("rack-1", vec!["gold", "fill"]),
        ("rack-2", vec!["old", "mid", "new"]),
        ("rack-3", vec!["s1", "s2", "s3", "s4", "s5"]),
    ]
    .into_iter()
    .map(|(n, v)| (n.to_owned(), v.into_iter().map(String::from).collect()))
    .collect();
    assert_eq!(layout, want, "the fleet is laid out as the test expects");
    (stack, monitor)
}

/// What `choose_victims` picks for a gold job of 60 on the surviving nodes, from Manager's state.
async fn expected_victims(stack: &Stack) -> preempt::Preemption {
    let m = manager_state(&stack.sim_endpoint).await.unwrap();
    let mut nodes = Vec::new();
    for node in ["rack-2", "rack-3"] {
        let jobs: Vec<RunningJob> = m
            .jobs
            .values()
            .filter(|j| j.node_id == node && j.bundle_id != "default.gold")
            .map(|j| {
                let req = j.requirements.clone().unwrap_or_default();
                RunningJob {
                    job_id: j.job_id.clone(),
                    band: PriorityBand::Bronze,
                    capacity: req.required_capacity,
                    cores: u32::try_from(req.required_cores).unwrap(),
                    started_at_ms: j
                        .instances
                        .iter()
                        .filter(|i| i.is_normal())
                        .map(|i| i.started_at_ms)
                        .max()
                        .unwrap_or(0),
                }
            })
            .collect();
        let used: f64 = jobs.iter().map(|j| j.capacity).sum();
        let cores: u32 = jobs.iter().map(|j| j.cores).sum();
        nodes.push(NodeCandidate {
            node_id: node.into(),
            free_capacity: 100.0 - used,
            free_cores: 32 - cores,
            jobs,
        });
    }
    preempt::choose_victims(
        preempt::Need {
            capacity: 60.0,
            cores: 1,
        },
        &nodes,
    )
    .expect("some node can be freed")
}

async fn kill(stack: &Stack, node: &str) {
    sim_admin(&stack.sim_endpoint)
        .await
        .unwrap()
        .kill_node(KillNodeRequest {
            node_id: node.to_owned(),
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_gold_recovery_with_no_room_preempts_exactly_the_chosen_bronze_jobs() {
    let (stack, monitor) = fleet(|c| {
        c.insert(
            "bands".into(),
            serde_json::json!({"gold": {"preempt": true}}),
        );
    })
    .await;
    let expected = expected_victims(&stack).await;
    let mid = job_of(&stack, "mid").await["jobId"]
        .as_str()
        .unwrap()
        .to_owned();
    let new = job_of(&stack, "new").await["jobId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        expected,
        preempt::Preemption {
            node_id: "rack-2".into(),
            victims: vec![new.clone(), mid.clone()],
        },
        "the fewest victims (two 30s beat three 20s), then the newest (not the older 40)"
    );

    kill(&stack, "rack-1").await;
    let gold = stack
        .wait_for("gold running again", WAIT, || async {
            let j = job_of(&stack, "gold").await;
            Ok((j["state"] == "running" && j["nodeId"] != "rack-1").then_some(j))
        })
        .await
        .unwrap();
    assert_eq!(gold["nodeId"], "rack-2");
    let trace = &gold["lastPlacement"];
    assert_eq!(trace["recovery"], true, "{trace}");
    assert_eq!(trace["preempted"]["node"], "rack-2", "{trace}");
    assert_eq!(
        trace["preempted"]["victims"],
        serde_json::json!(expected.victims),
        "{trace}"
    );

    // The full trace (what `kubectl automanager trace` renders) carries it too.
    let (code, body) = stack.debug_get("/debug/trace/default/gold").await.unwrap();
    assert_eq!(code, 200, "{body}");
    let full: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        full["replicas"][0]["preempted"]["victims"],
        serde_json::json!(expected.victims),
        "{full}"
    );

    // The victims are dropped, as a bronze job whose node failed; nothing else was touched.
    for name in ["mid", "new", "fill"] {
        stack
            .wait_for(&format!("{name} dropped"), WAIT, || async {
                Ok((job_of(&stack, name).await["state"] == "dropped").then_some(()))
            })
            .await
            .unwrap();
    }
    for name in ["old", "s1", "s2", "s3", "s4", "s5"] {
        assert_eq!(job_of(&stack, name).await["state"], "running", "{name}");
    }
    let m = manager_state(&stack.sim_endpoint).await.unwrap();
    let stopped: Vec<&str> = m
        .jobs
        .values()
        .filter(|j| j.bundle_id != "default.gold" && j.node_id != "rack-1")
        .filter(|j| j.state() != manager_client::proto::JobState::Running)
        .map(|j| j.job_id.as_str())
        .collect();
    let mut want = expected.victims.clone();
    want.sort();
    let mut stopped: Vec<String> = stopped.into_iter().map(String::from).collect();
    stopped.sort();
    assert_eq!(stopped, want, "exactly the chosen victims were stopped");

    let ev = wait_events(
        &stack,
        &[
            &|l: &str| l.starts_with("mid") && l.contains("Preempted"),
            &|l: &str| l.starts_with("new") && l.contains("Preempted"),
            &|l: &str| l.starts_with("new") && l.contains("JobDropped"),
        ],
    )
    .await;
    for (name, job) in [("mid", &mid), ("new", &new)] {
        assert!(
            ev.lines().any(|l| l.starts_with(name)
                && l.contains("Preempted")
                && l.contains(job.as_str())
                && l.contains("default/gold")),
            "{ev}"
        );
    }
    assert!(
        ev.lines().any(|l| l.starts_with("new")
            && l.contains("JobDropped")
            && l.contains("handed to its band")),
        "{ev}"
    );
    assert!(
        ev.lines().any(|l| l.starts_with("gold")
            && l.contains("PreemptedBronze")
            && l.contains(&new)
            && l.contains(&mid)),
        "{ev}"
    );
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains("automanager_preemptions_total{band=\"gold\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("automanager_jobs_preempted_total 2"),
        "{metrics}"
    );

    // Dropped stays dropped: a while later the victims have not been placed again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for name in ["mid", "new"] {
        assert_eq!(job_of(&stack, name).await["state"], "dropped", "{name}");
    }
    let (mut v, took) = settle(&stack, WAIT).await.unwrap();
    v.merge(&monitor.stop().await.0);
    eprintln!("{}", v.line("fleet-preemption", took));
    assert!(v.is_clean(), "{}", v.details());
}

#[tokio::test]
async fn with_preemption_off_nothing_is_preempted_and_gold_waits() {
    let (stack, monitor) = fleet(|_| {}).await;
    kill(&stack, "rack-1").await;
    let b = stack
        .wait_for("gold stalled for capacity", WAIT, || async {
            let b = stack.get_json(&["bundle", "gold", "-n", "default"]).await?;
            Ok((condition(&b, "Stalled")["reason"] == "NoCapacity").then_some(b))
        })
        .await
        .unwrap();
    assert_ne!(b["status"]["replicas"][0]["jobs"][0]["state"], "running");
    // Give a preemption every chance to happen, then check none did.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (name, _) in BRONZE.iter().skip(1) {
        assert_eq!(job_of(&stack, name).await["state"], "running", "{name}");
    }
    let ev = events_table(&stack).await.unwrap();
    assert!(!ev.contains("Preempted"), "{ev}");
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        !metrics.contains("automanager_preemptions_total{"),
        "{metrics}"
    );
    let (v, took) = settle(&stack, Duration::from_secs(10)).await.unwrap();
    let mut v = v;
    v.merge(&monitor.stop().await.0);
    eprintln!("{}", v.line("fleet-no-preemption", took));
    // Gold is legitimately down (no room, preemption off); nothing else may be wrong.
    assert!(v.nothing_but_lost(), "{}", v.details());
    let lost: Vec<&String> = v.lost.iter().collect();
    assert!(
        lost.len() == 1 && lost[0].starts_with("default.gold/0/enc"),
        "{}",
        v.details()
    );
}
