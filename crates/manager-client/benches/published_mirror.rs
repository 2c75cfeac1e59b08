//! `make bench-published-mirror`: the published API's client against manager-sim's published
//! service over loopback, with 10,000 stored jobs running on 2,000 nodes.
//!
//! Prints one line on stdout:
//! `published-mirror resnapshot_10k_s=<median> first_snapshot_s=<median> spurious_changes=<n> runs=<n>`
//! - `resnapshot_10k_s`: a forced reconnect (the sim cuts the stream) until the new snapshot
//!   has replaced the mirror;
//! - `first_snapshot_s`, the baseline measured in the same run: a new client's first snapshot
//!   of the same world (an empty mirror, every node and job added);
//! - `spurious_changes`: changes the reconnects published (nothing changed in the sim, so any is
//!   spurious; the target is 0).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use manager_client::published::{PublishedChange, PublishedClient, PublishedConfig};
use manager_proto::api::common::JobId;
use manager_proto::api::manager::Job;
use manager_sim::config::{
    DeclaredNode, LimitsConfig, PoolConfig, PoolKind, ScaleOutConfig, TimingConfig,
};
use manager_sim::{Sim, SimConfig};

const NODES: usize = 2_000;
const JOBS: usize = 10_000;
const RUNS: usize = 5;
const WAIT: Duration = Duration::from_secs(120);

fn sim_config() -> SimConfig {
    SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        token: None,
        tls: None,
        state_dir: None,
        timing: TimingConfig {
            provision_delay_ms: 0,
            job_start_delay_ms: 0,
            job_stop_delay_ms: 0,
            start_delay_ms: None,
            stop_delay_ms: None,
        },
        limits: LimitsConfig::default(),
        pools: vec![PoolConfig {
            name: "dc".into(),
            kind: PoolKind::Cluster,
            region: "r".into(),
            zones: vec!["a".into(), "b".into()],
            scale_out: ScaleOutConfig::Fixed,
            provision_delay_ms: None,
            start_delay_ms: None,
            stop_delay_ms: None,
            job_socket: true,
            instance_types: Vec::new(),
            nodes: (0..NODES)
                .map(|i| DeclaredNode {
                    id: format!("node-{i:05}"),
                    zone: if i % 2 == 0 { "a".into() } else { "b".into() },
                    capacity: 100.0,
                    cores: 16,
                    capabilities: Vec::new(),
                })
                .collect(),
        }],
    }
}

fn config(endpoint: String) -> PublishedConfig {
    let mut c = PublishedConfig::new(endpoint);
    c.connection.backoff_initial = Duration::from_millis(1);
    c.connection.backoff_max = Duration::from_millis(1);
    c.snapshot_timeout = WAIT;
    c
}

async fn populate(client: &PublishedClient) {
    futures::stream::iter(0..JOBS)
        .map(|i| async move {
            let id = format!("bundle-{:05}/0/enc", i);
            client
                .create_job(Job {
                    job_id: Some(JobId { job_id: id.clone() }),
                    tags: BTreeMap::from([
                        ("automanager.norsk.io/owner".to_owned(), "bench".to_owned()),
                        ("bundle".to_owned(), format!("bundle-{i:05}")),
                    ]),
                    ..Default::default()
                })
                .await
                .expect("CreateJob");
            client
                .start_job(&id, "primary", &format!("node-{:05}", i % NODES))
                .await
                .expect("StartJob");
        })
        .buffer_unordered(64)
        .collect::<Vec<()>>()
        .await;
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let sim = Sim::start(sim_config()).await.expect("sim");
    let writer = PublishedClient::connect(config(sim.endpoint())).expect("connect");
    writer.wait_ready(WAIT).await.expect("ready");
    populate(&writer).await;
    let expected =
        |c: &PublishedClient| c.with_mirror(|m| m.jobs.len() == JOBS && m.nodes.len() == NODES);
    let deadline = Instant::now() + WAIT;
    while !expected(&writer) {
        assert!(
            Instant::now() < deadline,
            "the writer's mirror never held every job"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    writer.close().await;

    let mut first = Vec::new();
    let mut again = Vec::new();
    let mut spurious = 0usize;
    for _ in 0..RUNS {
        let t = Instant::now();
        let client = PublishedClient::connect(config(sim.endpoint())).expect("connect");
        client.wait_ready(WAIT).await.expect("first snapshot");
        first.push(t.elapsed().as_secs_f64());
        assert!(
            expected(&client),
            "the first snapshot holds every job and node"
        );

        let mut changes = client.subscribe();
        let before = client.counters().snapshots.load(Ordering::Acquire);
        let t = Instant::now();
        assert!(sim.cut_published_streams() >= 1, "a stream to cut");
        let deadline = Instant::now() + WAIT;
        while client.counters().snapshots.load(Ordering::Acquire) == before {
            assert!(Instant::now() < deadline, "no new snapshot");
            tokio::task::yield_now().await;
        }
        again.push(t.elapsed().as_secs_f64());
        while let Ok(change) = changes.try_recv() {
            if !matches!(change, PublishedChange::Resynced) {
                spurious += 1;
            }
        }
        client.close().await;
    }
    eprintln!("first snapshots (s): {first:?}");
    eprintln!("re-snapshots (s):    {again:?}");
    println!(
        "published-mirror resnapshot_10k_s={:.3} first_snapshot_s={:.3} spurious_changes={spurious} runs={RUNS}",
        median(again),
        median(first)
    );
    sim.shutdown().await;
}
