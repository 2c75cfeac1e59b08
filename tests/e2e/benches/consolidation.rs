//! `make bench-consolidation`: a fragmented elastic binpack pool consolidated, against the real
//! apiserver, manager-sim and the operator binary (release builds, as `cargo bench` builds them).
//!
//! Prints one line:
//! `consolidation nodes_before=<n> nodes_after=<n> lower_bound=<n> dropped=<n> ratio=<x> ...`.
//! Goal: `nodes_after` ≤ 1.15 × `lower_bound` with `dropped=0`.
//!
//! **Set-up.** manager-sim with one elastic pool `packed` (one zone; nodes of 100 capacity and
//! 16 cores advertising the job socket; provisioning delay 0; jobs start and stop in 20 ms). A
//! wave of `CONS_BUNDLES` (default 120) one-replica silver Bundles, each one job of a capacity
//! from 10 to 45 (a fixed pseudo-random sequence, seed `CONS_SEED`, default 7) and 1 core,
//! alternately `handover` and `overlap`, is created 16 at a time and placed with `binpack`.
//! Then `CONS_DELETE_PERCENT` (default 50) of them, chosen with the same generator, are deleted.
//!
//! **Baseline (same run).** `nodes_before` is the pool's node count after the deletes, before
//! consolidation; `lower_bound` is the sum of the remaining jobs' capacities over a node's
//! capacity, rounded up (cores never bind: 16 per node, one per job).
//!
//! **Consolidation.** The pool is patched to `consolidation: {mode: enabled, minNodeAgeSeconds:
//! 0, cooldownSeconds: 0}`; the bench waits until its `Consolidating` condition says
//! `NothingToConsolidate` with no node being emptied. `nodes_after` is the pool's live nodes
//! then. `dropped` sums, over every remaining job, the sim's count of gaps (moments with no
//! running instance) from its job history, plus the failed participants of every consolidation
//! Migration's handover summary. `moves` counts the consolidation Migrations (seen by a watch
//! from before the patch: they go with their node's ManagerNode once it is terminated),
//! `moves_not_completed` those whose last seen phase was not `Completed`, `seconds` the time
//! from the patch to the end.

use std::time::{Duration, Instant};

use automanager_api::{Bundle, MigrationPhase, PlacementPool};
use automanager_e2e::SetupError;
use automanager_e2e::bench::{ReadyWatch, SeenMigrations, create_bundles, env_usize};
use automanager_e2e::reliability::sim_admin;
use automanager_e2e::stack::Stack;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use manager_client::proto::{JobHistoryRequest, NodeState};
use manager_client::{ClientConfig, ManagerClient, MirrorState};

const POOL: &str = "packed";
const CAPACITY: u32 = 100;
const WAIT: Duration = Duration::from_secs(900);
const GOAL: f64 = 1.15;

fn err(e: impl std::fmt::Display) -> SetupError {
    SetupError(e.to_string())
}

fn sim_config() -> String {
    format!(
        "listen: 127.0.0.1:0
timing: {{provisionDelayMs: 0, jobStartDelayMs: 20, jobStopDelayMs: 20}}
pools:
  - name: {POOL}
    kind: aws
    region: eu-west-1
    zones: [z-a]
    scaleOut: elastic
    instanceTypes:
      - {{instanceType: m5.xlarge, capacity: {CAPACITY}, cores: 16}}
"
    )
}

fn pool_yaml() -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {{name: {POOL}}}
spec:
  kind: aws
  region: eu-west-1
  zones: [z-a]
  packingStrategy: binpack
  scaleOut: elastic
  candidateInstanceTypes: [{{instanceType: m5.xlarge, totalCapacity: {CAPACITY}, totalCores: 16}}]
"
    )
}

/// xorshift64*: a fixed sequence for a seed, so every run builds the same fleet.
struct Sequence(u64);

impl Sequence {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn bundle(i: usize, capacity: u32) -> Result<Bundle, SetupError> {
    let strategy = if i.is_multiple_of(2) {
        "handover"
    } else {
        "overlap"
    };
    serde_json::from_value(serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1",
        "kind": "Bundle",
        "metadata": {"name": format!("ch-{i:04}"), "namespace": "default"},
        "spec": {
            "replicas": 1,
            "pools": [POOL],
            "jobs": [{"jobName": "enc",
                "requirements": {"requiredCapacity": capacity, "requiredCores": 1, "priorityBand": "silver"},
                "migration": {"strategy": strategy}}],
        },
    }))
    .map_err(err)
}

fn live_nodes(m: &MirrorState) -> usize {
    m.nodes
        .values()
        .filter(|n| {
            n.pool == POOL
                && matches!(
                    NodeState::try_from(n.state),
                    Ok(NodeState::Starting | NodeState::Started)
                )
        })
        .count()
}

async fn run() -> Result<String, SetupError> {
    let count = env_usize("CONS_BUNDLES", 120)?;
    let delete_percent = env_usize("CONS_DELETE_PERCENT", 50)?.min(100);
    let seed = env_usize("CONS_SEED", 7)?;
    let dir = tempfile::tempdir().map_err(err)?;
    let sim = dir.path().join("manager-sim.yaml");
    std::fs::write(&sim, sim_config()).map_err(err)?;
    eprintln!("bench-consolidation: {count} bundles, {delete_percent}% deleted, seed {seed}");
    let stack = Stack::start_custom(&sim, &[], |c| {
        c.insert("statusWriteInterval".into(), "1s".into());
    })
    .await?;
    let client = ManagerClient::connect(ClientConfig::new(&stack.sim_endpoint))
        .await
        .map_err(err)?;
    client.wait_ready(WAIT).await.map_err(err)?;
    let out = stack.env.apply_yaml(&pool_yaml()).await?;
    if !out.success() {
        return Err(err(out.stderr));
    }

    // The wave.
    let mut seq = Sequence(0x9e37_79b9_7f4a_7c15 ^ u64::try_from(seed).unwrap_or(7));
    let caps: Vec<u32> = (0..count)
        .map(|_| 10 + 5 * u32::try_from(seq.below(8)).unwrap_or(0))
        .collect();
    let api: Api<Bundle> = Api::namespaced(stack.env.client().clone(), "default");
    let mut ready = ReadyWatch::new(api.clone());
    let bundles: Vec<Bundle> = caps
        .iter()
        .enumerate()
        .map(|(i, c)| bundle(i, *c))
        .collect::<Result<_, _>>()?;
    let names: Vec<String> = (0..count).map(|i| format!("ch-{i:04}")).collect();
    create_bundles(&api, bundles, 16).await?;
    let mut last = Instant::now();
    ready
        .wait_all(&names, WAIT, |n| {
            if last.elapsed() > Duration::from_secs(10) {
                eprintln!("bench-consolidation: {n} of {count} Ready");
                last = Instant::now();
            }
        })
        .await?;
    let wave_nodes = client.mirror().read(live_nodes);
    eprintln!("bench-consolidation: the wave runs on {wave_nodes} nodes");

    // Random deletes.
    let mut doomed: Vec<usize> = (0..count).collect();
    for i in (1..doomed.len()).rev() {
        let j = usize::try_from(seq.below(u64::try_from(i + 1).unwrap_or(1))).unwrap_or(0);
        doomed.swap(i, j);
    }
    doomed.truncate(count * delete_percent / 100);
    for i in &doomed {
        api.delete(&names[*i], &DeleteParams::default())
            .await
            .map_err(err)?;
    }
    let left: Vec<usize> = (0..count).filter(|i| !doomed.contains(i)).collect();
    client
        .wait_until(WAIT, |m| m.jobs.len() == left.len())
        .await
        .map_err(err)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let nodes_before = client.mirror().read(live_nodes);
    let sum: u32 = left.iter().map(|i| caps[*i]).sum();
    let lower_bound = sum.div_ceil(CAPACITY);
    eprintln!(
        "bench-consolidation: {} jobs left (capacity {sum}) on {nodes_before} nodes; lower bound {lower_bound}",
        left.len()
    );

    // Consolidation.
    let migrations = SeenMigrations::start(
        Api::namespaced(stack.env.client().clone(), "default"),
        "automanager.norsk.io/purpose=consolidation",
    );
    let pools: Api<PlacementPool> = Api::all(stack.env.client().clone());
    let started = Instant::now();
    pools
        .patch(
            POOL,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"consolidation": {
                "mode": "enabled", "minNodeAgeSeconds": 0, "cooldownSeconds": 0}}})),
        )
        .await
        .map_err(err)?;
    let mut last = Instant::now();
    let mut quiet = 0;
    loop {
        if started.elapsed() > WAIT {
            return Err(err(format!("consolidation did not finish within {WAIT:?}")));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let p = pools.get(POOL).await.map_err(err)?;
        let status = p.status.unwrap_or_default();
        let done = status
            .conditions
            .iter()
            .any(|c| c.type_ == "Consolidating" && c.reason == "NothingToConsolidate")
            && status
                .consolidation
                .as_ref()
                .is_some_and(|c| c.current_node.is_none());
        quiet = if done { quiet + 1 } else { 0 };
        if quiet >= 3 {
            break;
        }
        if last.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "bench-consolidation: {} nodes live, {} terminated",
                client.mirror().read(live_nodes),
                status.consolidation.map_or(0, |c| c.nodes_terminated)
            );
            last = Instant::now();
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let nodes_after = client.mirror().read(live_nodes);

    // Dropped output: the sim's gaps per job, and failed handover participants.
    let mut admin = sim_admin(&stack.sim_endpoint).await?;
    let mut dropped = 0u64;
    for i in &left {
        let job_id = format!("default.{}/0/enc", names[*i]);
        let h = admin
            .job_history(JobHistoryRequest { job_id })
            .await
            .map_err(err)?
            .into_inner();
        dropped += u64::from(h.gaps);
    }
    let moved = migrations.snapshot();
    let mut not_completed = 0usize;
    for m in moved.values() {
        let status = m.status.clone().unwrap_or_default();
        if status.phase != MigrationPhase::Completed {
            not_completed += 1;
        }
        if let Some(h) = status.handover.as_ref() {
            dropped += u64::try_from(h.failed.len()).unwrap_or(0);
        }
    }
    let ratio =
        f64::from(u32::try_from(nodes_after).unwrap_or(u32::MAX)) / f64::from(lower_bound.max(1));
    Ok(format!(
        "consolidation nodes_before={nodes_before} nodes_after={nodes_after} lower_bound={lower_bound} dropped={dropped} ratio={ratio:.2} goal_ratio={GOAL} goal_met={} wave_nodes={wave_nodes} jobs={} moves={} moves_not_completed={not_completed} seconds={seconds:.1}",
        ratio <= GOAL && dropped == 0,
        left.len(),
        moved.len()
    ))
}

fn main() {
    automanager_e2e::bench_main("bench-consolidation", || async {
        let line = run().await?;
        println!("{line}");
        Ok(())
    });
}
