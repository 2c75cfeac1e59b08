//! `make bench-zone-outage`: one zone of three lost at once, against the real apiserver,
//! manager-sim and the operator binary (release builds, as `cargo bench` builds them).
//!
//! Prints one line:
//! `zone-outage gold_jobs=<n> gold_p99_ms=<x> provisioned_in_dead_zone=<n> baseline_one_node_p99_ms=<x> ...`.
//! Goals: gold jobs running again p99 ≤ 2,000 ms; nothing provisioned into the dead zone while it
//! is degraded.
//!
//! **Set-up.** manager-sim with one elastic pool `zoned` of three zones (`z-a`, `z-b`, `z-c`;
//! nodes of 100 capacity, provisioning delay 0, jobs start and stop in 20 ms). The bench asks
//! Manager itself for `ZONE_NODES` (default 1,000) nodes, round robin over the zones, before the
//! operator places anything; a HotSpareTarget keeps `ZONE_SPARES` (default 30) gold spares in
//! the pool. `ZONE_GOLD` (default 1,000) gold Bundles of one job taking 20 of a node's 100 are
//! placed with `spread` packing (about one per node, so the dead zone holds a third of them and
//! the other zones have room for all of them). The operator runs with `concurrency.bundles: 32`,
//! `statusWriteInterval: 1s` and the zone brake's defaults.
//!
//! **Baseline (same run).** First one node of `z-b` holding gold jobs is killed
//! (`SimAdmin.KillNode`); `baseline_one_node_p99_ms` is its gold jobs' p99, measured like the
//! outage's.
//!
//! **Outage.** Every live node of `z-a` is killed at once (concurrent `SimAdmin.KillNode`
//! calls). A job's figure is on **Manager's clock**: from the moment the bench asks for the kills
//! (the host's clock, which the sim stamps with; the published API's node events carry no time)
//! to the `updated_at_ms` of the first state of the job the bench's own view of Manager (as the
//! operator's port sees it over the stack's API, polled every 10 ms) shows running on another
//! node.
//! `provisioned_in_dead_zone` counts the nodes Manager created in `z-a` from the kill until every
//! gold job ran again and 10 s more passed (spares replaced meanwhile included); `degraded_after_ms`
//! is when the PlacementPool's `ZoneDegraded` condition was first seen True.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use automanager_api::Bundle;
use automanager_e2e::SetupError;
use automanager_e2e::bench::{ReadyWatch, create_bundles, env_usize, err, percentile, sorted};
use automanager_e2e::reliability::sim_admin;
use automanager_e2e::stack::{Stack, manager_view};
use futures::StreamExt;
use kube::api::Api;
use manager_client::proto::{CreateNodeRequest, JobState, KillNodeRequest, NodeState};
use manager_client::{ManagerClient, MirrorState};

/// Now, in Unix milliseconds.
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

const POOL: &str = "zoned";
const ZONES: [&str; 3] = ["z-a", "z-b", "z-c"];
const WAIT: Duration = Duration::from_secs(600);

fn sim_config() -> String {
    format!(
        "listen: 127.0.0.1:0
timing: {{provisionDelayMs: 0, jobStartDelayMs: 20, jobStopDelayMs: 20}}
pools:
  - name: {POOL}
    kind: aws
    region: eu-west-1
    zones: [{}]
    scaleOut: elastic
    instanceTypes:
      - {{instanceType: m5.xlarge, capacity: 100, cores: 64}}
",
        ZONES.join(", ")
    )
}

fn objects(spares: usize) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {{name: {POOL}}}
spec:
  kind: aws
  region: eu-west-1
  zones: [{}]
  packingStrategy: spread
  scaleOut: elastic
  candidateInstanceTypes: [{{instanceType: m5.xlarge, totalCapacity: 100, totalCores: 64}}]
---
apiVersion: automanager.norsk.io/v1alpha1
kind: HotSpareTarget
metadata: {{name: zoned-spares}}
spec:
  pool: {POOL}
  targetCount: {spares}
  forBand: gold
  spec: {{instanceType: m5.xlarge, region: eu-west-1}}
",
        ZONES.join(", ")
    )
}

fn gold_bundle(i: usize) -> Result<Bundle, SetupError> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1",
        "kind": "Bundle",
        "metadata": {"name": format!("gold-{i:04}"), "namespace": "default"},
        "spec": {
            "replicas": 1,
            "pools": [POOL],
            "jobs": [{"jobName": "enc", "requirements": {
                "requiredCapacity": 20, "requiredCores": 1, "priorityBand": "gold"}}],
        },
    }))
    .map_err(err)
}

fn live_node(m: &MirrorState, id: &str) -> bool {
    m.nodes
        .get(id)
        .is_some_and(|n| n.state == NodeState::Started as i32)
}

/// Gold jobs (ids) running on `nodes`.
fn jobs_on(m: &MirrorState, nodes: &BTreeSet<String>) -> Vec<String> {
    m.jobs
        .values()
        .filter(|j| j.state == JobState::Running as i32 && nodes.contains(&j.node_id))
        .map(|j| j.job_id.clone())
        .collect()
}

/// Kills `victims` at once and waits until every job in `jobs` runs on a started node that is
/// not a victim; returns each job's Manager-clock time from the earliest kill, and the kill time.
async fn kill_and_measure(
    stack: &Stack,
    client: &ManagerClient,
    victims: &BTreeSet<String>,
    jobs: &[String],
) -> Result<(Vec<f64>, i64), SetupError> {
    let admin = sim_admin(&stack.sim_endpoint).await?;
    // The host's clock, which the sim's timestamps use too: the published API's node events
    // carry no time of their own.
    let killed_ms = unix_ms();
    let kills = victims.iter().map(|id| {
        let mut admin = admin.clone();
        let node_id = id.clone();
        async move { admin.kill_node(KillNodeRequest { node_id }).await }
    });
    for r in futures::future::join_all(kills).await {
        r.map_err(err)?;
    }
    let mut back: BTreeMap<String, i64> = BTreeMap::new();
    let deadline = Instant::now() + WAIT;
    let mut last_report = Instant::now();
    loop {
        client.mirror().read(|m| {
            for id in jobs {
                if back.contains_key(id) {
                    continue;
                }
                if let Some(j) = m.jobs.get(id)
                    && j.state == JobState::Running as i32
                    && !victims.contains(&j.node_id)
                    && live_node(m, &j.node_id)
                {
                    back.insert(id.clone(), j.updated_at_ms);
                }
            }
        });
        if back.len() == jobs.len() {
            break;
        }
        if Instant::now() > deadline {
            return Err(err(format!(
                "only {} of {} gold jobs ran again within {WAIT:?}",
                back.len(),
                jobs.len()
            )));
        }
        if last_report.elapsed() > Duration::from_secs(5) {
            eprintln!(
                "bench-zone-outage: {} of {} gold jobs back",
                back.len(),
                jobs.len()
            );
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ms = back.values().map(|t| (t - killed_ms) as f64).collect();
    Ok((ms, killed_ms))
}

async fn run() -> Result<String, SetupError> {
    let nodes = env_usize("ZONE_NODES", 1_000)?;
    let gold = env_usize("ZONE_GOLD", 1_000)?;
    let spares = env_usize("ZONE_SPARES", 30)?;
    let dir = tempfile::tempdir().map_err(err)?;
    let sim = dir.path().join("manager-sim.yaml");
    std::fs::write(&sim, sim_config()).map_err(err)?;
    eprintln!("bench-zone-outage: {nodes} nodes, {gold} gold bundles, {spares} spares");
    let stack = Stack::start_custom(&sim, &["--no-job-socket"], |c| {
        c.insert("concurrency".into(), serde_json::json!({"bundles": 32}));
        c.insert("statusWriteInterval".into(), "1s".into());
    })
    .await?;
    let client = manager_view(&stack.sim_endpoint, stack.api).await?;
    client.wait_ready(WAIT).await.map_err(err)?;

    // The fleet, asked of Manager directly: round robin over the zones.
    futures::stream::iter(0..nodes)
        .map(|i| {
            let client = client.clone();
            async move {
                client
                    .create_node(CreateNodeRequest {
                        pool: POOL.into(),
                        provider: manager_client::proto::ProviderKind::Aws as i32,
                        region: "eu-west-1".into(),
                        instance_type: "m5.xlarge".into(),
                        zone: ZONES[i % ZONES.len()].into(),
                        tags: Default::default(),
                        // Over the published API the caller names the node.
                        request_id: format!("bench-{i:05}"),
                    })
                    .await
                    .map(drop)
                    .map_err(err)
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>, _>>()?;
    client
        .wait_until(WAIT, |m| {
            m.nodes
                .values()
                .filter(|n| n.state == NodeState::Started as i32)
                .count()
                >= nodes
        })
        .await
        .map_err(err)?;
    let out = stack.env.apply_yaml(&objects(spares)).await?;
    if !out.success() {
        return Err(err(out.stderr));
    }
    client
        .wait_until(WAIT, |m| {
            m.nodes
                .values()
                .filter(|n| {
                    n.state == NodeState::Started as i32
                        && n.tags.get("spare").is_some_and(|v| v == "true")
                })
                .count()
                >= spares
        })
        .await
        .map_err(err)?;

    let api: Api<Bundle> = Api::namespaced(stack.env.client().clone(), "default");
    let mut ready = ReadyWatch::new(api.clone());
    let bundles: Vec<Bundle> = (0..gold).map(gold_bundle).collect::<Result<_, _>>()?;
    let names: Vec<String> = (0..gold).map(|i| format!("gold-{i:04}")).collect();
    let started = Instant::now();
    create_bundles(&api, bundles, 32).await?;
    let mut last = Instant::now();
    ready
        .wait_all(&names, WAIT, |n| {
            if last.elapsed() > Duration::from_secs(10) {
                eprintln!("bench-zone-outage: {n} of {gold} Ready");
                last = Instant::now();
            }
        })
        .await?;
    eprintln!(
        "bench-zone-outage: {gold} gold bundles Ready in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    // Let status writes and spares settle.
    tokio::time::sleep(Duration::from_secs(5)).await;

    // Baseline: one node of z-b.
    let (one, one_jobs) = client.mirror().read(|m| {
        let node = m
            .nodes
            .values()
            .filter(|n| n.zone == ZONES[1] && n.state == NodeState::Started as i32)
            .map(|n| n.node_id.clone())
            .find(|id| !jobs_on(m, &BTreeSet::from([id.clone()])).is_empty())
            .unwrap_or_default();
        let set = BTreeSet::from([node]);
        let jobs = jobs_on(m, &set);
        (set, jobs)
    });
    let (base_ms, _) = kill_and_measure(&stack, &client, &one, &one_jobs).await?;
    let base = sorted(base_ms);
    eprintln!(
        "bench-zone-outage: baseline: {} gold jobs of one node back, p99 {:.0} ms",
        base.len(),
        percentile(&base, 0.99)
    );
    tokio::time::sleep(Duration::from_secs(5)).await;

    // The outage: every live node of z-a.
    let (victims, dead_jobs) = client.mirror().read(|m| {
        let victims: BTreeSet<String> = m
            .nodes
            .values()
            .filter(|n| {
                n.zone == ZONES[0]
                    && matches!(
                        NodeState::try_from(n.state),
                        Ok(NodeState::Starting | NodeState::Started)
                    )
            })
            .map(|n| n.node_id.clone())
            .collect();
        let jobs = jobs_on(m, &victims);
        (victims, jobs)
    });
    eprintln!(
        "bench-zone-outage: killing {} nodes of {} ({} gold jobs)",
        victims.len(),
        ZONES[0],
        dead_jobs.len()
    );
    let pools: Api<automanager_api::PlacementPool> = Api::all(stack.env.client().clone());
    let degraded_seen = tokio::spawn(async move {
        let t = Instant::now();
        loop {
            if let Ok(p) = pools.get(POOL).await
                && p.status.as_ref().is_some_and(|s| {
                    s.conditions.iter().any(|c| {
                        c.type_ == "ZoneDegraded"
                            && c.status == automanager_api::ConditionStatus::True
                    })
                })
            {
                return Some(t.elapsed());
            }
            if t.elapsed() > WAIT {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let (ms, killed_ms) = kill_and_measure(&stack, &client, &victims, &dead_jobs).await?;
    let outage = sorted(ms);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let in_dead_zone = client.mirror().read(|m| {
        m.nodes
            .values()
            .filter(|n| n.zone == ZONES[0] && n.created_at_ms >= killed_ms)
            .count()
    });
    let degraded_after = degraded_seen.await.ok().flatten();
    Ok(format!(
        "zone-outage gold_jobs={} gold_p99_ms={:.0} provisioned_in_dead_zone={in_dead_zone} baseline_one_node_p99_ms={:.0} gold_p50_ms={:.0} gold_max_ms={:.0} killed_nodes={} nodes={nodes} gold_bundles={gold} spares={spares} degraded_after_ms={}",
        outage.len(),
        percentile(&outage, 0.99),
        percentile(&base, 0.99),
        percentile(&outage, 0.5),
        outage.last().copied().unwrap_or(0.0),
        victims.len(),
        degraded_after.map_or("never".to_owned(), |d| format!(
            "{:.0}",
            d.as_secs_f64() * 1000.0
        )),
    ))
}

#[tokio::main]
async fn main() {
    match run().await {
        Ok(line) => println!("{line}"),
        Err(e) => {
            eprintln!("bench-zone-outage failed: {e}");
            std::process::exit(1);
        }
    }
}
