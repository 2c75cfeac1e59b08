//! The remediation brakes on the real stack (kube-apiserver + etcd, manager-sim, the operator
//! binary, kubectl), each with the reliability suite's invariant checker running alongside:
//!
//! - a zone outage pauses provisioning into the zone (`ZoneDegraded` on the PlacementPool, an
//!   Event, the metric), gold recovers in the other zones, and the zone is used again once a
//!   window passes quietly;
//! - a crash-looping job (its node dies each time it lands) cannot make the operator ask for
//!   more nodes than the pool's provisioning rate allows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use automanager_api::PriorityBand::Gold;
use automanager_api::{
    Bundle, ConditionStatus, JobState, PackingStrategy, PlacementPool, PoolKind,
};
use automanager_e2e::reliability::{Monitor, manager_state, settle, sim_admin};
use automanager_e2e::scenario::{
    BundleManifest, BundleView, Conditions, EventView, JobManifest, bundle, elastic_pool,
    instance_type, job, show,
};
use automanager_e2e::stack::Stack;
use manager_client::proto::{KillNodeRequest, KillZoneRequest, NodeState};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);
const POOL: &str = "zoned";
const ZONES: [&str; 3] = ["zn-a", "zn-b", "zn-c"];

/// An elastic pool of three zones, nodes of 100 capacity, started after 100 ms.
fn sim_config(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("manager-sim.yaml");
    std::fs::write(
        &path,
        format!(
            "listen: 127.0.0.1:0
timing: {{provisionDelayMs: 100, jobStartDelayMs: 20, jobStopDelayMs: 20}}
pools:
  - name: {POOL}
    kind: aws
    region: eu-west-1
    zones: [{}]
    scaleOut: elastic
    instanceTypes:
      - {{instanceType: m5.xlarge, capacity: 100, cores: 16}}
",
            ZONES.join(", ")
        ),
    )
    .unwrap();
    path
}

/// The pool: elastic, spread over the three zones, growing with nodes of 100.
fn zoned_pool() -> PlacementPool {
    elastic_pool(
        POOL,
        PoolKind::Aws,
        "eu-west-1",
        &ZONES,
        PackingStrategy::Spread,
        instance_type("m5.xlarge", 100, 16),
    )
}

/// A gold bundle of one job taking 60 of a node's 100: one per node.
fn gold_bundle(name: &str) -> Bundle {
    bundle(name, 1, &[POOL], [job("enc", 60, Gold).cores(2)])
}

async fn start(adjust: impl FnOnce(&mut serde_json::Map<String, Value>)) -> Stack {
    let dir = tempfile::tempdir().unwrap();
    let config = sim_config(dir.path());
    // The sim reads its config before start_custom returns; `dir` may go after.
    Stack::start_custom(&config, &[], adjust)
        .await
        .expect("stack")
}

/// Node id → (zone, created_at_ms, live) of every node Manager has.
async fn nodes(stack: &Stack) -> Vec<(String, String, i64, bool)> {
    let m = manager_state(&stack.sim_endpoint).await.unwrap();
    m.nodes
        .values()
        .map(|n| {
            let live = matches!(
                NodeState::try_from(n.state),
                Ok(NodeState::Starting | NodeState::Started)
            );
            (n.node_id.clone(), n.zone.clone(), n.created_at_ms, live)
        })
        .collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[tokio::test]
async fn a_zone_outage_pauses_provisioning_there_and_recovers_elsewhere() {
    let stack = start(|c| {
        c.insert(
            "zoneBrake".into(),
            serde_json::json!({"lostPercent": 50, "window": "15s", "minLostNodes": 3}),
        );
    })
    .await;
    stack.create(&zoned_pool()).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let names: Vec<String> = (0..6).map(|i| format!("gold-{i}")).collect();
    for n in &names {
        stack.create(&gold_bundle(n)).await;
    }
    for n in &names {
        stack.expect_ready(n).await;
    }
    // Placement provisions into the pool's first zone while nothing is wrong with it.
    let before = nodes(&stack).await;
    let dead = ZONES[0];
    assert!(
        before
            .iter()
            .filter(|(_, z, _, live)| z == dead && *live)
            .count()
            >= 3,
        "the first wave should have provisioned into {dead}: {before:?}"
    );

    // The zone dies the way a zone does: every node in it at once, those still starting too,
    // and nothing comes up there until the outage ends. The sim picks the victims in the same
    // step that kills them, so no node created since a look at the fleet escapes.
    let mut admin = sim_admin(&stack.sim_endpoint).await.unwrap();
    let killed_ms = now_ms();
    let killed_at = Instant::now();
    let victims = admin
        .kill_zone(KillZoneRequest {
            zone: dead.into(),
            revive: false,
        })
        .await
        .unwrap()
        .into_inner()
        .node_ids;
    assert!(victims.len() >= 3, "{victims:?}");

    // The person on call is told: a condition naming the zone, an Event, the metric.
    let pool: PlacementPool = stack
        .wait_for_condition(POOL, "ZoneDegraded", ConditionStatus::True)
        .await;
    assert_eq!(
        pool.condition_reason("ZoneDegraded"),
        Some("ZoneOutage"),
        "{}",
        show(&pool)
    );
    let message = pool.condition_message("ZoneDegraded").unwrap();
    assert!(message.contains(&format!("zone {dead} lost")), "{message}");
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains(&format!(
            "automanager_zone_degraded{{pool=\"{POOL}\",zone=\"{dead}\"}} 1"
        )),
        "{metrics}"
    );

    // Gold comes back, on new nodes in the other zones.
    let back = stack
        .wait_for("every gold bundle running again", WAIT, || async {
            let m = manager_state(&stack.sim_endpoint).await?;
            let mut zones = Vec::new();
            for n in &names {
                let b: Bundle = stack.try_get(n).await?;
                let node = b.node_of(0, "enc").unwrap_or_default();
                let live = m.nodes.get(node).is_some_and(|n| {
                    matches!(NodeState::try_from(n.state), Ok(NodeState::Started))
                });
                if b.state_of(0, "enc") != Some(JobState::Running)
                    || victims.iter().any(|v| v == node)
                    || !live
                {
                    return Ok(None);
                }
                zones.push(
                    m.nodes
                        .get(node)
                        .map(|n| n.zone.clone())
                        .unwrap_or_default(),
                );
            }
            Ok(Some(zones))
        })
        .await
        .unwrap();
    eprintln!(
        "zone outage: gold back after {:.1}s in zones {back:?}",
        killed_at.elapsed().as_secs_f64()
    );
    assert!(back.iter().all(|z| z != dead), "{back:?}");
    let in_dead_zone: Vec<_> = nodes(&stack)
        .await
        .into_iter()
        .filter(|(_, z, created, _)| z == dead && *created >= killed_ms)
        .collect();
    assert_eq!(
        in_dead_zone,
        Vec::new(),
        "nothing is provisioned into the degraded zone"
    );
    stack.expect_event(POOL, "ZoneDegraded", &[]).await;
    // The placements that brought gold back say nothing of a last resort: the degraded zone
    // had nothing left, and the other zones took everything.
    for n in &names {
        let b: Bundle = stack.get(n).await;
        let trace = serde_json::to_string(&b.status).unwrap_or_default();
        assert!(!trace.contains("last resort"), "{trace}");
    }

    // The outage ends; a window with no further loss: the zone clears and is provisioned into
    // again.
    admin
        .kill_zone(KillZoneRequest {
            zone: dead.into(),
            revive: true,
        })
        .await
        .unwrap();
    stack
        .wait_for_condition::<PlacementPool>(POOL, "ZoneDegraded", ConditionStatus::False)
        .await;
    stack
        .wait_for_event("a ZoneRecovered Event", |e| {
            e.reason_str() == "ZoneRecovered"
        })
        .await;
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(!metrics.contains(&format!("zone=\"{dead}\"")), "{metrics}");
    let after_ms = now_ms();
    stack.create(&gold_bundle("gold-late")).await;
    stack.expect_ready("gold-late").await;
    let reopened = nodes(&stack)
        .await
        .into_iter()
        .any(|(_, z, created, live)| z == dead && created >= after_ms && live);
    assert!(reopened, "provisioning into {dead} resumes once it cleared");

    let (mut v, took) = settle(&stack, WAIT).await.unwrap();
    v.merge(&monitor.stop().await.0);
    eprintln!("{}", v.line("fleet-zone-outage", took));
    assert!(v.is_clean(), "{}", v.details());
    println!(
        "reliability4-figure degraded_zone_recoveries={}",
        back.iter().filter(|z| *z == dead).count()
    );
}

#[tokio::test]
async fn a_crash_looping_job_cannot_provision_more_than_the_bound() {
    const RATE: u64 = 3;
    let stack = start(|c| {
        c.insert(
            "provisioning".into(),
            serde_json::json!({"perPoolPerMinute": RATE}),
        );
        // Losing the same zone's nodes again and again would trip the zone brake first; this
        // test is about the rate.
        c.insert("zoneBrake".into(), serde_json::json!({"enabled": false}));
    })
    .await;
    stack.create(&zoned_pool()).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let creates = |stack: &Stack| stack.node_creates().unwrap();
    let before = creates(&stack);
    stack
        .create(&gold_bundle("looper").max_restarts_per_hour(Gold, 1000))
        .await;
    // Every node the job lands on dies (a bad instance type): for 40 s, kill whatever node runs it.
    let mut admin = sim_admin(&stack.sim_endpoint).await.unwrap();
    let started = Instant::now();
    let mut killed = std::collections::BTreeSet::new();
    while started.elapsed() < Duration::from_secs(40) {
        let b = stack.bundle("looper").await;
        if let Some(node) = b.node_of(0, "enc")
            && b.state_of(0, "enc") == Some(JobState::Running)
            && killed.insert(node.to_owned())
        {
            admin
                .kill_node(KillNodeRequest {
                    node_id: node.to_owned(),
                })
                .await
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let asked = creates(&stack) - before;
    eprintln!(
        "crash loop: {} nodes killed, {asked} CreateNode calls in {:.0}s",
        killed.len(),
        started.elapsed().as_secs_f64()
    );
    assert!(
        killed.len() >= 2,
        "the job must have landed and died more than once: {killed:?}"
    );
    assert!(
        asked <= RATE,
        "{asked} nodes asked for within a minute, the bound is {RATE}"
    );
    assert!(
        stack
            .operator
            .log_text()
            .contains("provisioning rate for the pool is used up"),
        "the operator says why it waits"
    );
    let (v, took) = settle(&stack, Duration::from_secs(30)).await.unwrap();
    let mut v = v;
    v.merge(&monitor.stop().await.0);
    eprintln!("{}", v.line("fleet-crash-loop", took));
    // The looping job is legitimately down (its last node was killed and the rate is used up);
    // duplicates, over-capacity and orphans must still be none.
    assert!(v.nothing_but_lost(), "{}", v.details());
}
