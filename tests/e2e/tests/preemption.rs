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

use automanager_api::PriorityBand::{Bronze, Gold};
use automanager_api::{Bundle, JobState, JobStatus};
use automanager_e2e::events_table;
use automanager_e2e::reliability::{Monitor, manager_state, settle, sim_admin};
use automanager_e2e::scenario::{BundleView, EventView, bundle, fixed_pool, job, show};
use automanager_e2e::stack::Stack;
use automanager_policy::PriorityBand;
use automanager_policy::preempt::{self, NodeCandidate, RunningJob};
use manager_client::proto::KillNodeRequest;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);
const POOL: &str = "rack";

/// A one-job bundle of `capacity` in `band`, in the pool.
fn one_job(name: &str, band: PriorityBand, capacity: i64) -> Bundle {
    bundle(name, 1, &[POOL], [job("enc", capacity, band)])
}

/// The bronze bundles, in the order they are created (binpack fills rack-1, then rack-2, then
/// rack-3), with their capacity.
const BRONZE: [(&str, i64); 9] = [
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

/// The status of Bundle `name`'s one job.
async fn job_of(stack: &Stack, name: &str) -> JobStatus {
    let b = stack.bundle(name).await;
    b.job(0, "enc")
        .cloned()
        .unwrap_or_else(|| panic!("{name} has no job status: {}", show(&b)))
}

/// The state of Bundle `name`'s one job.
async fn state_of(stack: &Stack, name: &str) -> JobState {
    job_of(stack, name).await.state
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
    stack.create(&pool).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    stack.create(&one_job("gold", Gold, 60)).await;
    stack.expect_ready("gold").await;
    // One at a time, so each lands where binpack puts it given the ones before.
    for (name, capacity) in BRONZE {
        stack.create(&one_job(name, Bronze, capacity)).await;
        stack.expect_ready(name).await;
    }
    let mut layout: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for name in std::iter::once("gold").chain(BRONZE.iter().map(|(n, _)| *n)) {
        let j = job_of(&stack, name).await;
        layout
            .entry(j.node_id.unwrap_or_default())
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
    let mid = job_of(&stack, "mid").await.job_id.unwrap();
    let new = job_of(&stack, "new").await.job_id.unwrap();
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
        .wait_until("gold", "to run again off rack-1", |b: &Bundle| {
            b.state_of(0, "enc") == Some(JobState::Running) && b.node_of(0, "enc") != Some("rack-1")
        })
        .await;
    assert_eq!(gold.node_of(0, "enc"), Some("rack-2"), "{}", show(&gold));
    let trace = gold
        .job(0, "enc")
        .and_then(|j| j.last_placement.as_ref())
        .unwrap_or_else(|| panic!("no placement trace: {}", show(&gold)));
    assert!(trace.recovery, "{}", show(trace));
    let preempted = trace
        .preempted
        .as_ref()
        .unwrap_or_else(|| panic!("no preemption in the trace: {}", show(trace)));
    assert_eq!(preempted.node, "rack-2", "{}", show(trace));
    assert_eq!(preempted.victims, expected.victims, "{}", show(trace));

    // The full trace (what `kubectl automanager trace` renders) carries it too.
    let full = stack.debug_trace("gold").await;
    let victims = full
        .replicas
        .first()
        .and_then(|r| r.preempted.as_ref())
        .map(|p| p.victims.clone());
    assert_eq!(victims, Some(expected.victims.clone()), "{}", show(&full));

    // The victims are dropped, as a bronze job whose node failed; nothing else was touched.
    for name in ["mid", "new", "fill"] {
        stack
            .wait_until(name, "to drop its job", |b: &Bundle| {
                b.state_of(0, "enc") == Some(JobState::Dropped)
            })
            .await;
    }
    for name in ["old", "s1", "s2", "s3", "s4", "s5"] {
        assert_eq!(state_of(&stack, name).await, JobState::Running, "{name}");
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

    for (name, job) in [("mid", &mid), ("new", &new)] {
        stack
            .expect_event(name, "Preempted", &[job.as_str(), "default/gold"])
            .await;
    }
    stack
        .expect_event("new", "JobDropped", &["handed to its band"])
        .await;
    stack
        .expect_event("gold", "PreemptedBronze", &[&new, &mid])
        .await;
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
        assert_eq!(state_of(&stack, name).await, JobState::Dropped, "{name}");
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
    let b: Bundle = stack.wait_for_reason("gold", "Stalled", "NoCapacity").await;
    assert_ne!(
        b.state_of(0, "enc"),
        Some(JobState::Running),
        "{}",
        show(&b)
    );
    // Give a preemption every chance to happen, then check none did.
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (name, _) in BRONZE.iter().skip(1) {
        assert_eq!(state_of(&stack, name).await, JobState::Running, "{name}");
    }
    let preempting: Vec<_> = stack
        .try_events()
        .await
        .unwrap()
        .into_iter()
        .filter(|e| e.reason_str().contains("Preempted") || e.note_str().contains("Preempted"))
        .collect();
    assert!(
        preempting.is_empty(),
        "{preempting:#?}\n{}",
        events_table(&stack).await.unwrap_or_default()
    );
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
