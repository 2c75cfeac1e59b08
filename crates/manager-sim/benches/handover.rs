//! Handover latency through manager-sim: the four migration calls over
//! gRPC with the jobs on the real job socket, against the in-process agent
//! measured in the same run as the baseline. Prints one line:
//! `sim-socket handover_p50_us=<x> handover_p99_us=<x> inproc_p50_us=<x>`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use manager_proto::manager_client::ManagerClient;
use manager_proto::{
    Bundle, BundleJob, JobRequirements, JobRole, JobState, MigrationPhase, MigrationStrategy,
    NodeControllerMigrationCutover, NodeControllerMigrationGetState,
    NodeControllerMigrationPrepareTarget, RegisterBundleRequest, StartJobRequest,
};
use manager_sim::{
    DefaultAgent, JobAgent, JobSocketConfig, Sim, SimConfig, SimHandle, SocketAgent,
};
use tonic::transport::Channel;

const ROUNDS: usize = 200;

const CONFIG: &str = r"
timing: {provisionDelayMs: 0, jobStartDelayMs: 0, jobStopDelayMs: 0}
pools:
  - name: dc
    kind: cluster
    region: r
    zones: [a]
    scaleOut: fixed
    nodes:
      - {id: n1, zone: a, capacity: 100, cores: 64}
      - {id: n2, zone: a, capacity: 100, cores: 64}
";

async fn until(sim: &SimHandle, mid: &str, want: MigrationPhase) -> manager_proto::Migration {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = sim
            .snapshot()
            .migrations
            .into_iter()
            .find(|m| m.migration_id == mid);
        if let Some(m) = m.filter(|m| m.phase == want as i32) {
            return m;
        }
        assert!(Instant::now() < deadline, "{mid} never reached {want:?}");
        tokio::task::yield_now().await;
    }
}

async fn one(sim: &SimHandle, c: &mut ManagerClient<Channel>, mid: &str, target: &str) {
    c.migration_get_state(NodeControllerMigrationGetState {
        migration_id: mid.into(),
        job_id: "b/0/j".into(),
        strategy: MigrationStrategy::Handover as i32,
    })
    .await
    .unwrap();
    let m = until(sim, mid, MigrationPhase::StateReceived).await;
    c.migration_prepare_target(NodeControllerMigrationPrepareTarget {
        migration_id: mid.into(),
        target_node_id: target.into(),
        initial_state: m.source_state,
    })
    .await
    .unwrap();
    let m = until(sim, mid, MigrationPhase::TargetReady).await;
    c.migration_cutover(NodeControllerMigrationCutover {
        migration_id: mid.into(),
        payload: m.target_ready_payload,
    })
    .await
    .unwrap();
    until(sim, mid, MigrationPhase::Completed).await;
}

/// Per-handover latencies in microseconds, sorted.
async fn run(agent: Arc<dyn JobAgent>, socket: Option<Arc<SocketAgent>>) -> Vec<u128> {
    let sim = Sim::start_with_agent(SimConfig::from_yaml(CONFIG).unwrap(), agent)
        .await
        .unwrap();
    let mut c = ManagerClient::connect(sim.endpoint()).await.unwrap();
    let bundle = Bundle {
        bundle_id: "b".into(),
        replicas: 1,
        jobs: vec![BundleJob {
            job_name: "j".into(),
            requirements: Some(JobRequirements {
                required_capacity: 1.0,
                required_cores: 1,
                required_capabilities: vec![],
                priority_band: "gold".into(),
            }),
            config: Vec::new(),
            template: Vec::new(),
        }],
        ..Default::default()
    };
    c.register_bundle(RegisterBundleRequest {
        bundle: Some(bundle),
    })
    .await
    .unwrap();
    c.start_job(StartJobRequest {
        job_id: "b/0/j".into(),
        node_id: "n1".into(),
        role: JobRole::Normal as i32,
    })
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let running = sim
            .snapshot()
            .jobs
            .iter()
            .any(|j| j.state == JobState::Running as i32);
        let connected = socket.as_ref().is_none_or(|a| {
            a.instance_status("b/0/j", "normal")
                .is_some_and(|s| s.connected)
        });
        if running && connected {
            break;
        }
        assert!(Instant::now() < deadline, "the job never came up");
        tokio::task::yield_now().await;
    }
    let mut out = Vec::with_capacity(ROUNDS);
    for i in 0..ROUNDS {
        let target = if i % 2 == 0 { "n2" } else { "n1" };
        let t = Instant::now();
        one(&sim, &mut c, &format!("m{i}"), target).await;
        out.push(t.elapsed().as_micros());
        // Let the old source finish stopping before the next round.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    sim.shutdown().await;
    out.sort_unstable();
    out
}

fn pct(v: &[u128], p: usize) -> u128 {
    v.get((v.len().saturating_sub(1)) * p / 100)
        .copied()
        .unwrap_or(0)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` runs it once too.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let baseline = run(Arc::new(DefaultAgent), None).await;
        let agent = SocketAgent::start(JobSocketConfig::default())
            .await
            .unwrap();
        let socket = run(agent.clone(), Some(agent)).await;
        println!(
            "sim-socket handover_p50_us={} handover_p99_us={} inproc_p50_us={}",
            pct(&socket, 50),
            pct(&socket, 99),
            pct(&baseline, 50)
        );
    });
}
