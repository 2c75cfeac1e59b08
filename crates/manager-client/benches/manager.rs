//! `make bench-manager`: the client and sim over loopback TCP.
//!
//! Prints one line on stdout:
//! `manager ingest=<events/s> sync_10k_nodes_ms=<ms> startjob=<per s>`
//! and details (including the baseline: unary round trips per second on the
//! same connection, the floor a StartJob call cannot beat) on stderr.
//!
//! Targets: ingest >= 200,000 events/s; initial sync of 10,000
//! nodes + 40,000 jobs <= 1,000 ms; >= 5,000 StartJob calls/s.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use manager_client::{ClientConfig, ManagerClient};
use manager_proto::{Bundle, BundleJob, JobRequirements, JobRole};
use manager_sim::config::{
    DeclaredNode, LimitsConfig, PoolConfig, PoolKind, ScaleOutConfig, TimingConfig,
};
use manager_sim::{Sim, SimConfig};

fn sim_config(nodes: usize, limits: LimitsConfig) -> SimConfig {
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
        limits,
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
            nodes: (0..nodes)
                .map(|i| DeclaredNode {
                    id: format!("node-{i:05}"),
                    zone: if i % 2 == 0 { "a".into() } else { "b".into() },
                    capacity: 1e9,
                    cores: 1_000_000,
                    capabilities: vec!["gpu".into()],
                })
                .collect(),
        }],
    }
}

/// `count` bundles of 64 replicas x `jobs` job names.
fn bundles(count: usize, jobs: usize) -> Vec<Bundle> {
    (0..count)
        .map(|b| Bundle {
            bundle_id: format!("bundle-{b:04}"),
            replicas: 64,
            jobs: (0..jobs)
                .map(|j| BundleJob {
                    job_name: format!("job{j}"),
                    requirements: Some(JobRequirements {
                        required_capacity: 1.0,
                        required_cores: 1,
                        required_capabilities: vec!["gpu".into()],
                        priority_band: "gold".into(),
                    }),
                    config: br#"{"bitrate":6000}"#.to_vec(),
                    template: Vec::new(),
                })
                .collect(),
            ..Default::default()
        })
        .collect()
}

async fn connect(endpoint: String) -> ManagerClient {
    let c = ManagerClient::connect(ClientConfig::new(endpoint))
        .await
        .unwrap();
    c.wait_ready(Duration::from_secs(60)).await.unwrap();
    c
}

/// Events/s from a live stream into the real client's mirror.
async fn ingest() -> f64 {
    let limits = LimitsConfig {
        watch_buffer: 1 << 20,
        event_log_capacity: 10_000,
        ..LimitsConfig::default()
    };
    let sim = Sim::start(sim_config(16, limits)).await.unwrap();
    sim.with_world(|w, now| {
        for b in bundles(1, 16) {
            w.register_bundle(&b, now).unwrap();
        }
    });
    let jobs: Vec<String> = sim.snapshot().jobs.into_iter().map(|j| j.job_id).collect();
    let client = connect(sim.endpoint()).await;
    // Like the operator: someone consumes the change events.
    let mut changes = client.subscribe();
    let drain = tokio::spawn(async move {
        let mut n = 0u64;
        loop {
            match changes.recv().await {
                Ok(_) => n += 1,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(k)) => n += k,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return n,
            }
        }
    });
    let start_rev = client.mirror().revision();
    let rounds = 150;
    // Start, run, stop, stopped: 4 events per job per round. They are made
    // under one lock, so they queue for the stream while it is being made;
    // the clock starts when the sim is done, so this measures the stream and
    // the mirror, not the sim's own command throughput.
    let t_produce = Instant::now();
    sim.with_world(|w, now| {
        for round in 0..rounds {
            for (i, j) in jobs.iter().enumerate() {
                let node = format!("node-{:05}", (i + round) % 16);
                let _ = w.start_job(j, &node, 0, now);
            }
            w.advance(now);
            for j in &jobs {
                w.stop_job(j, 0, now).unwrap();
            }
            w.advance(now);
        }
    });
    let produced_ms = t_produce.elapsed().as_secs_f64() * 1000.0;
    let t0 = Instant::now();
    let end_rev = sim.snapshot().revision;
    client
        .wait_until(Duration::from_secs(120), |m| m.revision >= end_rev)
        .await
        .unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let n = end_rev - start_rev;
    let rate = n as f64 / secs;
    client.close().await;
    drop(client);
    let consumed = drain.await.unwrap();
    eprintln!(
        "ingest: {n} events in {:.0} ms over a live Watch stream ({consumed} changes consumed; the sim made them in {produced_ms:.0} ms before)",
        secs * 1000.0
    );
    sim.shutdown().await;
    rate
}

/// ms from connect to a synced mirror of 10,000 nodes and 40,000 jobs.
async fn sync_10k() -> f64 {
    let limits = LimitsConfig {
        event_log_capacity: 1000,
        ..LimitsConfig::default()
    };
    let sim = Sim::start(sim_config(10_000, limits)).await.unwrap();
    // 625 bundles x 64 replicas x 1 job = 40,000 jobs, 4 per node, running.
    let all = bundles(625, 1);
    sim.with_world(|w, now| {
        for b in &all {
            w.register_bundle(b, now).unwrap();
        }
        let ids: Vec<String> = w.snapshot().jobs.into_iter().map(|j| j.job_id).collect();
        for (i, id) in ids.iter().enumerate() {
            w.start_job(id, &format!("node-{:05}", i / 4), 0, now)
                .unwrap();
        }
        w.advance(now);
    });
    let t0 = Instant::now();
    let client = connect(sim.endpoint()).await;
    let ms = t0.elapsed().as_secs_f64() * 1000.0;
    let (nodes, jobs) = client.mirror().read(|m| (m.nodes.len(), m.jobs.len()));
    assert_eq!((nodes, jobs), (10_000, 40_000));
    eprintln!("sync: {nodes} nodes + {jobs} jobs mirrored in {ms:.0} ms");
    client.close().await;
    sim.shutdown().await;
    ms
}

/// StartJob calls/s from 32 concurrent callers on one client; plus the
/// baseline of ListPools round trips/s.
async fn startjob() -> f64 {
    let sim = Sim::start(sim_config(100, LimitsConfig::default()))
        .await
        .unwrap();
    sim.with_world(|w, now| {
        for b in bundles(40, 8) {
            w.register_bundle(&b, now).unwrap();
        }
    });
    let jobs: Arc<Vec<String>> =
        Arc::new(sim.snapshot().jobs.into_iter().map(|j| j.job_id).collect());
    let client = connect(sim.endpoint()).await;
    let workers = 32;
    let run =
        |f: fn(ManagerClient, Arc<Vec<String>>, usize, usize) -> tokio::task::JoinHandle<usize>| {
            let client = client.clone();
            let jobs = jobs.clone();
            async move {
                let t0 = Instant::now();
                let handles: Vec<_> = (0..workers)
                    .map(|w| f(client.clone(), jobs.clone(), w, workers))
                    .collect();
                let mut n = 0;
                for h in handles {
                    n += h.await.unwrap();
                }
                n as f64 / t0.elapsed().as_secs_f64()
            }
        };
    let baseline = run(|c, jobs, w, _| {
        tokio::spawn(async move {
            let n = jobs.len() / 32;
            for _ in 0..n {
                c.list_pools().await.unwrap();
            }
            let _ = w;
            n
        })
    })
    .await;
    let rate = run(|c, jobs, w, workers| {
        tokio::spawn(async move {
            let mut n = 0;
            for (i, j) in jobs.iter().enumerate().skip(w).step_by(workers) {
                let node = format!("node-{:05}", i % 100);
                c.start_job(j, &node, JobRole::Normal).await.unwrap();
                n += 1;
            }
            n
        })
    })
    .await;
    eprintln!(
        "startjob: {} calls, {rate:.0}/s; baseline ListPools round trips {baseline:.0}/s",
        jobs.len()
    );
    client.close().await;
    sim.shutdown().await;
    rate
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let (ingest, sync, start) =
        rt.block_on(async { (ingest().await, sync_10k().await, startjob().await) });
    println!("manager ingest={ingest:.0} sync_10k_nodes_ms={sync:.0} startjob={start:.0}");
}
