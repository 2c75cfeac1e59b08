//! `make bench-recovery`: how fast the operator brings a gold job back after its node dies, and
//! how long a handover migration takes, against the real apiserver, manager-sim and the operator
//! binary (release builds, as `cargo bench` builds them).
//!
//! Prints one line:
//! `recovery kills=<n> gold_p50_ms=<x> gold_p99_ms=<x> handover_p99_ms=<x> handovers=<n>
//! handover_p50_ms=<x> handover_manager_p99_ms=<x> on_spare=<n> job_start_delay_ms=<x>`.
//! Goals: gold p99 ≤ 1,000 ms with zero provisioning delay, handover p99 ≤ 2,000 ms.
//!
//! **Set-up.** manager-sim with an elastic `gold` pool (provisioning delay 0, jobs start and stop
//! in 20 ms, the demo's figure) and a fixed `hand` pool of three nodes with the job socket; a
//! HotSpareTarget keeps two gold-dedicated spares live in `gold`; ten gold bundles (one replica,
//! one job of 60 of a node's 100 capacity, so every node holds exactly one gold job) and four
//! silver bundles on `hand` whose job declares `migration: {strategy: handover}`. The operator's
//! gold `maxRestartsPerHour` is raised to 1,000 so 100 kills never trip the restart ceiling.
//!
//! **Gold recovery (sequential kills).** Before each kill the bench waits (in its own view of
//! Manager, seen as the operator's port sees it over the API the stack runs: our first API or
//! Manager's published one) until the target count of spares is live and the next gold job
//! (round robin) runs; then `manager-sim chaos kill-node <its node>`. The figure is measured on
//! **Manager's own clock**: from the job's failure on the killed node (its `updated_at_ms` as
//! Manager stamped the stop; the sim's kill stops the node's jobs at the kill's instant, and the
//! published API's node events carry no time) to the `updated_at_ms` of the first update that
//! shows the job `RUNNING` on another node. So it includes the operator noticing the failure,
//! deciding, `StartJob`, and the sim's 20 ms job start (`job_start_delay_ms`, the floor); not the
//! time the bench's own view takes to hear of it. The same interval as the bench's view saw it
//! (change arrival times) is printed on stderr as a cross-check. `on_spare` counts recoveries
//! that landed on a hot spare.
//!
//! **Handover (sequential).** Each round creates a `Migration` (no target node: placement picks
//! one in `hand`) for the next handover bundle and measures **from the create call to the
//! apiserver watch event showing `status.phase: Completed`** in the bench process, i.e. what a
//! user waits: admission, placement, the four Manager calls, the job-socket handshake of the
//! simulated jobs, and the operator's status write. `handover_manager_p99_ms` is the part Manager
//! itself saw (its migration record's `created_at_ms` to its `COMPLETED` `updated_at_ms`).
//!
//! `BENCH_KILLS` (default 100) and `BENCH_HANDOVERS` (default 40) set the counts;
//! `BENCH_RECOVERY_LOG=<file>` keeps the operator's log (debug level) for a timing breakdown.

use std::time::{Duration, Instant};

use automanager_api::{Migration, MigrationPhase};
use automanager_e2e::SetupError;
use automanager_e2e::bench::{
    apply, empty_spares, env_usize, err, is_spare, percentile as pct, settled_node, sorted,
};
use automanager_e2e::stack::{Stack, manager_view_with};
use futures::StreamExt;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use manager_client::proto::{JobRole, JobState, NodeState};
use manager_client::{ClientConfig, ManagerClient, MirrorChange};

/// Now, in Unix milliseconds.
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
use tokio::sync::{broadcast, mpsc};

const GOLD_BUNDLES: usize = 10;
const HANDOVER_BUNDLES: usize = 4;
const SPARES: usize = 2;
const JOB_START_DELAY_MS: u64 = 20;
const WAIT: Duration = Duration::from_secs(60);

fn sim_config() -> String {
    format!(
        "listen: 127.0.0.1:0
timing: {{provisionDelayMs: 0, jobStartDelayMs: {JOB_START_DELAY_MS}, jobStopDelayMs: 20}}
pools:
  - name: gold
    kind: aws
    region: eu-west-1
    zones: [eu-west-1a, eu-west-1b]
    scaleOut: elastic
    instanceTypes:
      - {{instanceType: m5.xlarge, capacity: 100, cores: 16}}
  - name: hand
    kind: cluster
    region: oslo-dc1
    zones: [rack-a, rack-b]
    scaleOut: fixed
    nodes:
      - {{id: hand-a1, zone: rack-a, capacity: 100, cores: 16}}
      - {{id: hand-a2, zone: rack-a, capacity: 100, cores: 16}}
      - {{id: hand-b1, zone: rack-b, capacity: 100, cores: 16}}
"
    )
}

const POOLS: &str = "apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {name: gold}
spec:
  kind: aws
  region: eu-west-1
  zones: [eu-west-1a, eu-west-1b]
  packingStrategy: binpack
  scaleOut: elastic
  candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 100, totalCores: 16}]
---
apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {name: hand}
spec:
  kind: cluster
  region: oslo-dc1
  zones: [rack-a, rack-b]
  packingStrategy: spread
  scaleOut: fixed
  candidateInstanceTypes: [{instanceType: hand, totalCapacity: 100, totalCores: 16}]
";

fn spare_target() -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1
kind: HotSpareTarget
metadata: {{name: gold-spares}}
spec:
  pool: gold
  targetCount: {SPARES}
  forBand: gold
  spec: {{instanceType: m5.xlarge, region: eu-west-1}}
"
    )
}

fn gold_bundle(i: usize) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {{name: gold-{i:02}, namespace: default}}
spec:
  replicas: 1
  pools: [gold]
  jobs:
    - jobName: enc
      requirements: {{requiredCapacity: 60, requiredCores: 2, priorityBand: gold}}
"
    )
}

fn handover_bundle(i: usize) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {{name: hand-{i:02}, namespace: default}}
spec:
  replicas: 1
  pools: [hand]
  jobs:
    - jobName: enc
      requirements: {{requiredCapacity: 20, requiredCores: 2, priorityBand: silver}}
      migration: {{strategy: handover}}
"
    )
}

fn gold_job(i: usize) -> String {
    format!("default.gold-{:02}/0/enc", i % GOLD_BUNDLES)
}

fn handover_job(i: usize) -> String {
    format!("default.hand-{:02}/0/enc", i % HANDOVER_BUNDLES)
}

/// What one kill measured.
struct Kill {
    /// Node terminated → job running again, on Manager's clock.
    total_ms: f64,
    /// The same interval as the bench's mirror saw the two changes arrive.
    seen_ms: f64,
    /// Node terminated → the new instance's start accepted (Manager's `started_at_ms`): the
    /// operator's part (hearing of it, debounce, decision, the StartJob call).
    to_start_ms: f64,
    /// The job landed on a hot spare.
    spare: bool,
}

/// One kill: the job's node dies; waits until the job runs on another node.
async fn kill_and_wait(
    stack: &Stack,
    client: &ManagerClient,
    job_id: &str,
) -> Result<Kill, SetupError> {
    client
        .wait_until(WAIT, |m| {
            empty_spares(m, "gold") >= SPARES && settled_node(m, job_id).is_some()
        })
        .await
        .map_err(|e| {
            err(format!(
                "waiting for {SPARES} live spares and {job_id}: {e}"
            ))
        })?;
    let node = client
        .mirror()
        .read(|m| settled_node(m, job_id))
        .ok_or_else(|| err(format!("{job_id} is not running")))?;
    // Subscribed before the kill, so no change of interest can be missed.
    let mut rx = client.subscribe();
    let asked_ms = unix_ms();
    stack.chaos(&["kill-node", &node])?;
    let deadline = tokio::time::Instant::now() + WAIT;
    let mut killed: Option<(i64, Instant)> = None;
    loop {
        let change = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .map_err(|_| err(format!("{job_id} did not run again within {WAIT:?}")))?;
        match change {
            // The job's failure on the dead node, stamped by Manager: both APIs report it at
            // the kill's instant (the published one has no time on node events).
            Ok(MirrorChange::JobUpserted(j))
                if killed.is_none()
                    && j.job_id == job_id
                    && j.node_id == node
                    && j.state != JobState::Running as i32 =>
            {
                killed = Some((j.updated_at_ms, Instant::now()));
            }
            Ok(MirrorChange::NodeUpserted(n))
                if killed.is_none()
                    && n.node_id == node
                    && n.state == NodeState::Terminated as i32
                    && n.state_changed_at_ms >= asked_ms =>
            {
                killed = Some((n.state_changed_at_ms, Instant::now()));
            }
            Ok(MirrorChange::JobUpserted(j))
                if j.job_id == job_id
                    && j.state == JobState::Running as i32
                    && !j.node_id.is_empty()
                    && j.node_id != node =>
            {
                let seen = Instant::now();
                // The node's event precedes the restart; read it from the mirror if it was
                // coalesced away (a resync).
                // Neither was seen (coalesced away by a resync): the moment the bench asked
                // for the kill, on the host's clock, which the sim's timestamps use too.
                let (killed_ms, killed_seen) = killed.unwrap_or((asked_ms, seen));
                let started_ms = j
                    .instances
                    .iter()
                    .filter(|i| i.node_id == j.node_id && i.role != JobRole::MigrationTarget as i32)
                    .map(|i| i.started_at_ms)
                    .max()
                    .unwrap_or(j.updated_at_ms);
                return Ok(Kill {
                    total_ms: (j.updated_at_ms - killed_ms) as f64,
                    seen_ms: seen.duration_since(killed_seen).as_secs_f64() * 1000.0,
                    to_start_ms: (started_ms - killed_ms) as f64,
                    spare: client.mirror().read(|m| is_spare(m, &j.node_id)),
                });
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(n)) => {
                return Err(err(format!("the bench's mirror lagged by {n} changes")));
            }
            Err(broadcast::error::RecvError::Closed) => {
                return Err(err("the Manager connection closed"));
            }
        }
    }
}

/// Sends (name, phase, object, when seen) for every Migration event into `tx`.
fn watch_migrations(
    api: Api<Migration>,
    tx: mpsc::UnboundedSender<(String, MigrationPhase, Migration, Instant)>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut stream = watcher(api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(ev) = stream.next().await {
            let Ok(m) = ev else { continue };
            let seen = Instant::now();
            let Some(phase) = m.status.as_ref().map(|s| s.phase) else {
                continue;
            };
            let name = m.metadata.name.clone().unwrap_or_default();
            if tx.send((name, phase, m, seen)).is_err() {
                return;
            }
        }
    })
}

/// One handover: returns (create → Completed in the bench, Manager's own duration), in ms.
async fn handover(
    client: &ManagerClient,
    api: &Api<Migration>,
    rx: &mut mpsc::UnboundedReceiver<(String, MigrationPhase, Migration, Instant)>,
    i: usize,
) -> Result<(f64, f64), SetupError> {
    let job_id = handover_job(i);
    client
        .wait_until(WAIT, |m| settled_node(m, &job_id).is_some())
        .await
        .map_err(|e| err(format!("waiting for {job_id} to settle: {e}")))?;
    let name = format!("ho-{i:03}");
    let m: Migration = serde_json::from_value(serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Migration",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"job": {"bundle": format!("hand-{:02}", i % HANDOVER_BUNDLES), "replica": 0, "jobName": "enc"}}
    }))
    .map_err(err)?;
    let started = Instant::now();
    api.create(&PostParams::default(), &m).await.map_err(err)?;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (n, phase, obj, seen) = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .map_err(|_| err(format!("migration {name} did not complete within {WAIT:?}")))?
            .ok_or_else(|| err("the Migration watch ended"))?;
        if n != name {
            continue;
        }
        match phase {
            MigrationPhase::Completed => {
                let total = seen.duration_since(started).as_secs_f64() * 1000.0;
                let id = obj
                    .status
                    .and_then(|s| s.migration_id)
                    .ok_or_else(|| err(format!("{name} has no migrationId")))?;
                let completed = manager_client::proto::MigrationPhase::Completed as i32;
                client
                    .wait_until(WAIT, |m| {
                        m.migrations
                            .get(&id)
                            .is_some_and(|mg| mg.phase == completed)
                    })
                    .await
                    .map_err(err)?;
                let mg = client
                    .mirror()
                    .migration(&id)
                    .ok_or_else(|| err(format!("Manager has no migration {id}")))?;
                return Ok((total, (mg.updated_at_ms - mg.created_at_ms) as f64));
            }
            MigrationPhase::Aborted
            | MigrationPhase::Refused
            | MigrationPhase::Rejected
            | MigrationPhase::Failed => {
                return Err(err(format!(
                    "migration {name} ended {phase:?}: {:?}",
                    obj.status
                )));
            }
            _ => {}
        }
    }
}

async fn run() -> Result<(), SetupError> {
    let kills = env_usize("BENCH_KILLS", 100)?;
    let handovers = env_usize("BENCH_HANDOVERS", 40)?;
    let dir = tempfile::tempdir().map_err(err)?;
    let sim_path = dir.path().join("sim.yaml");
    std::fs::write(&sim_path, sim_config()).map_err(err)?;
    eprintln!("bench-recovery: starting control plane, manager-sim and the operator (release)");
    let stack = Stack::start_custom(&sim_path, &[], |c| {
        c.insert("watchNamespaces".into(), serde_json::json!(["default"]));
        c.insert(
            "bands".into(),
            serde_json::json!({"gold": {"maxRestartsPerHour": 1000}}),
        );
        // Each kill measures one node's recovery; a hundred of them back to back is, to the
        // fleet brakes, a zone going down and a provisioning storm, which they rightly stop
        // (docs/fleet-safety-brakes.md). Off here, so every kill is the single failure it
        // stands for.
        c.insert("zoneBrake".into(), serde_json::json!({"enabled": false}));
        c.insert(
            "provisioning".into(),
            serde_json::json!({"perPoolPerMinute": 10000}),
        );
    })
    .await?;
    measure(&stack, kills, handovers).await.map_err(|e| {
        let log = stack.operator.log_text();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(60)..].join("\n");
        SetupError(format!("{e}\noperator log tail:\n{tail}"))
    })
}

async fn measure(stack: &Stack, kills: usize, handovers: usize) -> Result<(), SetupError> {
    let mut config = ClientConfig::new(stack.sim_endpoint.clone());
    config.change_buffer = 1 << 20;
    let client = manager_view_with(config, stack.api).await?;
    client.wait_ready(WAIT).await.map_err(err)?;

    apply(stack, POOLS).await?;
    apply(stack, &spare_target()).await?;
    client
        .wait_until(WAIT, |m| empty_spares(m, "gold") >= SPARES)
        .await
        .map_err(|e| err(format!("waiting for {SPARES} live spares: {e}")))?;
    for i in 0..GOLD_BUNDLES {
        apply(stack, &gold_bundle(i)).await?;
    }
    for i in 0..HANDOVER_BUNDLES {
        apply(stack, &handover_bundle(i)).await?;
    }
    let placed = client
        .wait_until(WAIT, |m| {
            (0..GOLD_BUNDLES).all(|i| settled_node(m, &gold_job(i)).is_some())
                && (0..HANDOVER_BUNDLES).all(|i| settled_node(m, &handover_job(i)).is_some())
        })
        .await
        .map_err(|e| {
            let state = client.mirror().read(|m| {
                m.jobs
                    .values()
                    .map(|j| {
                        format!(
                            "{} state {} node {:?} instances {:?}",
                            j.job_id, j.state, j.node_id, j.instances
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            });
            err(format!(
                "waiting for every bundle's job to run: {e}\n{state}"
            ))
        });
    if let Err(e) = placed {
        let bundles = stack
            .env
            .run_kubectl(["get", "bundles", "-n", "default", "-o", "yaml"])
            .await?;
        let nodes = client.mirror().read(|m| {
            m.nodes
                .values()
                .map(|n| format!("{} state {} tags {:?}", n.node_id, n.state, n.tags))
                .collect::<Vec<_>>()
                .join("\n")
        });
        return Err(err(format!(
            "{e}\nnodes:\n{nodes}\nbundles:\n{}",
            bundles.stdout
        )));
    }

    eprintln!(
        "bench-recovery: {kills} sequential node kills ({GOLD_BUNDLES} gold bundles, {SPARES} live gold spares before each)"
    );
    let mut gold = Vec::with_capacity(kills);
    let mut gold_seen = Vec::with_capacity(kills);
    let mut gold_to_start = Vec::with_capacity(kills);
    let mut on_spare = 0usize;
    for i in 0..kills {
        let k = kill_and_wait(stack, &client, &gold_job(i)).await?;
        gold.push(k.total_ms);
        gold_seen.push(k.seen_ms);
        gold_to_start.push(k.to_start_ms);
        on_spare += usize::from(k.spare);
    }
    let gold = sorted(gold);
    let gold_seen = sorted(gold_seen);
    let gold_to_start = sorted(gold_to_start);
    eprintln!(
        "bench-recovery: gold (Manager clock) p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms; as the bench's mirror saw it p50 {:.1} ms, p99 {:.1} ms; {on_spare} of {kills} on a hot spare",
        pct(&gold, 0.5),
        pct(&gold, 0.9),
        pct(&gold, 0.99),
        pct(&gold, 1.0),
        pct(&gold_seen, 0.5),
        pct(&gold_seen, 0.99),
    );
    eprintln!(
        "bench-recovery: of that, kill → StartJob accepted (the operator's part) p50 {:.0} ms, p99 {:.0} ms; the rest is the sim's {JOB_START_DELAY_MS} ms job start",
        pct(&gold_to_start, 0.5),
        pct(&gold_to_start, 0.99),
    );

    eprintln!(
        "bench-recovery: {handovers} sequential handover migrations over {HANDOVER_BUNDLES} bundles"
    );
    let api: Api<Migration> = Api::namespaced(stack.env.client(), "default");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let watch = watch_migrations(api.clone(), tx);
    let mut total = Vec::with_capacity(handovers);
    let mut manager = Vec::with_capacity(handovers);
    let mut failure = None;
    for i in 0..handovers {
        match handover(&client, &api, &mut rx, i).await {
            Ok((t, m)) => {
                total.push(t);
                manager.push(m);
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    watch.abort();
    let done = total.len();
    let total = sorted(total);
    let manager = sorted(manager);
    eprintln!(
        "bench-recovery: {done} handovers create→Completed p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; Manager's part p50 {:.0} ms, p99 {:.0} ms",
        pct(&total, 0.5),
        pct(&total, 0.99),
        pct(&total, 1.0),
        pct(&manager, 0.5),
        pct(&manager, 0.99),
    );
    client.close().await;
    if let Ok(path) = std::env::var("BENCH_RECOVERY_LOG") {
        // The stack's directory goes with it: keep the operator's log for a breakdown.
        if let Err(e) = std::fs::write(&path, stack.operator.log_text()) {
            eprintln!("bench-recovery: could not write {path}: {e}");
        }
    }

    // The gold figures stand even when a handover fails: the line says so (handover `NaN`,
    // `handovers` = how many completed) and the bench still exits non-zero.
    println!(
        "recovery kills={kills} gold_p50_ms={:.0} gold_p99_ms={:.0} handover_p99_ms={:.0} handovers={done} handover_p50_ms={:.0} handover_manager_p99_ms={:.0} on_spare={on_spare} job_start_delay_ms={JOB_START_DELAY_MS}",
        pct(&gold, 0.5),
        pct(&gold, 0.99),
        pct(&total, 0.99),
        pct(&total, 0.5),
        pct(&manager, 0.99),
    );
    match failure {
        Some(e) => Err(err(format!("handover {done} of {handovers} failed: {e}"))),
        None => Ok(()),
    }
}

fn main() {
    automanager_e2e::bench_main("bench-recovery", run);
}
