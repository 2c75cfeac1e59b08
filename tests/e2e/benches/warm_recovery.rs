//! Part of `make bench-spare-tiers`: a gold recovery that has to start a warm spare, against the
//! real apiserver, manager-sim and the operator binary (release builds, as `cargo bench` builds
//! them).
//!
//! Prints one line:
//! `warm-recovery kills=<n> warm_to_running_p99_ms=<x> operator_share_p99_ms=<x>
//! start_delay_ms=<x> provision_baseline_p99_ms=<x> provision_delay_ms=<x> on_warm=<n>`,
//! then `spare-schedule gold_recovery_in_window_p99_ms=<x> flat_hot_p99_ms=<x>
//! hot_up_at_open=<n>/<n> kills=<n>`.
//! Goals: the operator's share of a warm recovery at most 200 ms; a gold recovery inside a
//! schedule's window no slower than with a flat hot target sized for the same peak.
//!
//! **Set-up.** manager-sim with an elastic `gold` pool whose stopped nodes start in
//! `START_DELAY_MS` and whose new nodes take `PROVISION_DELAY_MS` (a cloud's tens of seconds
//! and minutes, scaled down so the bench runs in minutes; jobs start in 20 ms); a
//! HotSpareTarget with no hot spare and two warm ones dedicated to gold; four gold bundles of
//! one job that takes 60 of a node's 100, so a killed job finds no room on the others.
//!
//! **Measured.** Sequential kills (`manager-sim chaos kill-node`), each once two warm spares
//! are stopped and ready: from the killed node's termination to the job `RUNNING` elsewhere, on
//! Manager's clock. The operator's share is that less the sim's start delay and job start.
//! **Baseline, same run:** the HotSpareTarget is deleted and the same kills recover by
//! provisioning a node. `BENCH_KILLS` (default 20) sets the count of each.
//!
//! **Schedules.** A HotSpareTarget with no spare outside a window and two hot ones inside it,
//! applied before the window opens: the same kills from the moment it opens, each once two hot
//! spares are up. **Baseline, same run:** a flat target of two hot spares.

use std::time::Duration;

use automanager_e2e::SetupError;
use automanager_e2e::bench::{
    apply, empty_spares, env_usize, err, is_spare, percentile as pct, settled_node, sorted,
    spread_ms,
};
use automanager_e2e::stack::Stack;
use manager_client::proto::{JobState, NodeState};
use manager_client::{ClientConfig, ManagerClient, MirrorChange, MirrorState};
use tokio::sync::broadcast;

const BUNDLES: usize = 4;
const WARM: usize = 2;
const START_DELAY_MS: u64 = 1000;
const PROVISION_DELAY_MS: u64 = 3000;
const JOB_START_DELAY_MS: u64 = 20;
const WAIT: Duration = Duration::from_secs(120);

fn sim_config() -> String {
    format!(
        "listen: 127.0.0.1:0
timing: {{provisionDelayMs: {PROVISION_DELAY_MS}, jobStartDelayMs: {JOB_START_DELAY_MS}, jobStopDelayMs: 20, startDelayMs: {START_DELAY_MS}, stopDelayMs: 200}}
pools:
  - name: gold
    kind: aws
    region: eu-west-1
    zones: [eu-west-1a, eu-west-1b]
    scaleOut: elastic
    instanceTypes:
      - {{instanceType: m5.xlarge, capacity: 100, cores: 16}}
"
    )
}

const POOL: &str = "apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {name: gold}
spec:
  kind: aws
  region: eu-west-1
  zones: [eu-west-1a, eu-west-1b]
  packingStrategy: binpack
  scaleOut: elastic
  candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 100, totalCores: 16}]
";

/// A HotSpareTarget of the gold pool for gold, with `tiers` (indented spec lines).
fn gold_target(name: &str, tiers: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1
kind: HotSpareTarget
metadata: {{name: {name}}}
spec:
  pool: gold
  forBand: gold
{tiers}  spec: {{instanceType: m5.xlarge, region: eu-west-1}}
"
    )
}

fn spare_target() -> String {
    gold_target(
        "gold-warm",
        &format!("  hot: {{count: 0}}\n  warm: {{count: {WARM}}}\n"),
    )
}

fn bundle(i: usize) -> String {
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

fn job(i: usize) -> String {
    format!("default.gold-{:02}/0/enc", i % BUNDLES)
}

fn warm_ready(m: &MirrorState) -> usize {
    m.nodes
        .values()
        .filter(|n| {
            n.pool == "gold" && n.state == NodeState::PoweredOff as i32 && is_spare(m, &n.node_id)
        })
        .count()
}

/// What must be ready before a kill: this many spares of one tier.
#[derive(Clone, Copy)]
enum Ready {
    Warm(usize),
    Hot(usize),
}

impl Ready {
    fn holds(self, m: &MirrorState) -> bool {
        match self {
            Ready::Warm(n) => warm_ready(m) >= n,
            Ready::Hot(n) => empty_spares(m, "gold") >= n,
        }
    }

    fn describe(self) -> String {
        match self {
            Ready::Warm(n) => format!("{n} warm spares"),
            Ready::Hot(n) => format!("{n} hot spares"),
        }
    }
}

/// One kill: (node terminated → job running elsewhere on Manager's clock, landed on a spare).
async fn kill_and_wait(
    stack: &Stack,
    client: &ManagerClient,
    job_id: &str,
    ready: Ready,
) -> Result<(f64, bool), SetupError> {
    client
        .wait_until(WAIT, |m| {
            ready.holds(m) && settled_node(m, job_id).is_some()
        })
        .await
        .map_err(|e| {
            err(format!(
                "waiting for {} and {job_id}: {e}",
                ready.describe()
            ))
        })?;
    let node = client
        .mirror()
        .read(|m| settled_node(m, job_id))
        .ok_or_else(|| err(format!("{job_id} is not running")))?;
    let mut rx = client.subscribe();
    stack.chaos(&["kill-node", &node])?;
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let change = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .map_err(|_| err(format!("{job_id} did not run again within {WAIT:?}")))?;
        match change {
            Ok(MirrorChange::JobUpserted(j))
                if j.job_id == job_id
                    && j.state == JobState::Running as i32
                    && !j.node_id.is_empty()
                    && j.node_id != node =>
            {
                let killed_ms = client
                    .mirror()
                    .node(&node)
                    .map(|n| n.state_changed_at_ms)
                    .ok_or_else(|| err(format!("node {node} vanished")))?;
                let spare = client.mirror().read(|m| is_spare(m, &j.node_id));
                return Ok(((j.updated_at_ms - killed_ms) as f64, spare));
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

/// `kills` sequential kills, each once `ready` holds: the recoveries' times, sorted, and how
/// many landed on a spare.
async fn kill_each(
    stack: &Stack,
    client: &ManagerClient,
    kills: usize,
    ready: Ready,
) -> Result<(Vec<f64>, usize), SetupError> {
    let mut times = Vec::with_capacity(kills);
    let mut on_spare = 0usize;
    for i in 0..kills {
        let (ms, spare) = kill_and_wait(stack, client, &job(i), ready).await?;
        times.push(ms);
        on_spare += usize::from(spare);
    }
    Ok((sorted(times), on_spare))
}

async fn run() -> Result<(), SetupError> {
    let kills = env_usize("BENCH_KILLS", 20)?;
    let dir = tempfile::tempdir().map_err(err)?;
    let sim_path = dir.path().join("sim.yaml");
    std::fs::write(&sim_path, sim_config()).map_err(err)?;
    eprintln!(
        "bench-warm-recovery: starting control plane, manager-sim and the operator (release)"
    );
    let stack = Stack::start_custom(&sim_path, &[], |c| {
        c.insert("watchNamespaces".into(), serde_json::json!(["default"]));
        c.insert(
            "bands".into(),
            serde_json::json!({"gold": {"maxRestartsPerHour": 1000}}),
        );
        // Back-to-back kills are single failures here, not a zone outage.
        c.insert("zoneBrake".into(), serde_json::json!({"enabled": false}));
        c.insert(
            "provisioning".into(),
            serde_json::json!({"perPoolPerMinute": 10000}),
        );
    })
    .await?;
    measure(&stack, kills).await.map_err(|e| {
        let log = stack.operator.log_text();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(60)..].join("\n");
        SetupError(format!("{e}\noperator log tail:\n{tail}"))
    })
}

async fn measure(stack: &Stack, kills: usize) -> Result<(), SetupError> {
    let mut config = ClientConfig::new(stack.sim_endpoint.clone());
    config.change_buffer = 1 << 20;
    let client = ManagerClient::connect(config).await.map_err(err)?;
    client.wait_ready(WAIT).await.map_err(err)?;

    apply(stack, POOL).await?;
    apply(stack, &spare_target()).await?;
    client
        .wait_until(WAIT, |m| warm_ready(m) >= WARM)
        .await
        .map_err(|e| err(format!("waiting for {WARM} warm spares: {e}")))?;
    for i in 0..BUNDLES {
        apply(stack, &bundle(i)).await?;
    }
    client
        .wait_until(WAIT, |m| {
            (0..BUNDLES).all(|i| settled_node(m, &job(i)).is_some())
        })
        .await
        .map_err(|e| err(format!("waiting for every gold job to run: {e}")))?;

    eprintln!(
        "bench-warm-recovery: {kills} sequential kills with {WARM} warm spares ready before each"
    );
    let (warm, on_warm) = kill_each(stack, &client, kills, Ready::Warm(WARM)).await?;
    let floor = (START_DELAY_MS + JOB_START_DELAY_MS) as f64;
    let share: Vec<f64> = sorted(warm.iter().map(|w| w - floor).collect());

    // Baseline: no spares at all; the same recovery provisions a node.
    stack
        .env
        .run_kubectl(["delete", "hotsparetarget", "gold-warm", "--wait=true"])
        .await?;
    client
        .wait_until(WAIT, |m| warm_ready(m) == 0)
        .await
        .map_err(|e| err(format!("waiting for the warm spares to go: {e}")))?;
    eprintln!("bench-warm-recovery: baseline, {kills} kills recovered by provisioning");
    let (provision, _) = kill_each(stack, &client, kills, Ready::Warm(0)).await?;
    let (in_window, at_open) = scheduled_window(stack, &client, kills).await?;
    let flat = flat_hot(stack, &client, kills).await?;
    eprintln!(
        "bench-warm-recovery: warm {} (operator share {} beside the sim's {START_DELAY_MS} ms start and {JOB_START_DELAY_MS} ms job start); provisioning baseline {} ({PROVISION_DELAY_MS} ms provisioning)",
        spread_ms(&warm),
        spread_ms(&share),
        spread_ms(&provision),
    );
    eprintln!(
        "bench-warm-recovery: gold recovery inside a schedule's window {} ({at_open} of {HOT} hot spares up as it opened); flat hot target {}",
        spread_ms(&in_window),
        spread_ms(&flat),
    );
    println!(
        "spare-schedule gold_recovery_in_window_p99_ms={:.0} flat_hot_p99_ms={:.0} hot_up_at_open={at_open}/{HOT} kills={kills}",
        pct(&in_window, 0.99),
        pct(&flat, 0.99),
    );
    client.close().await;
    println!(
        "warm-recovery kills={kills} warm_to_running_p99_ms={:.0} operator_share_p99_ms={:.0} start_delay_ms={START_DELAY_MS} provision_baseline_p99_ms={:.0} provision_delay_ms={PROVISION_DELAY_MS} on_warm={on_warm}",
        pct(&warm, 0.99),
        pct(&share, 0.99),
        pct(&provision, 0.99),
    );
    Ok(())
}

/// The hot spares a schedule's window asks for, and the flat target sized for the same peak.
const HOT: usize = 2;

/// A HotSpareTarget with no spare outside its window and [`HOT`] inside one that opens at the
/// next UTC minute at least `lead` away: the operator must have them up as it opens (it
/// applies a schedule ahead by the pool's start latency).
fn scheduled_target(opens: chrono::DateTime<chrono::Utc>) -> String {
    use chrono::Timelike;
    let window = format!(
        "{{schedule: '{} {} * * *', timeZone: UTC, duration: 30m, hot: {{count: {HOT}}}}}",
        opens.minute(),
        opens.hour()
    );
    gold_target(
        "gold-scheduled",
        &format!("  hot: {{count: 0}}\n  schedules:\n    - {window}\n"),
    )
}

fn flat_target() -> String {
    gold_target("gold-flat", &format!("  hot: {{count: {HOT}}}\n"))
}

/// Gold recoveries inside a schedule's window (sequential kills from the moment it opens), and
/// how many of its hot spares were up as it opened.
async fn scheduled_window(
    stack: &Stack,
    client: &ManagerClient,
    kills: usize,
) -> Result<(Vec<f64>, usize), SetupError> {
    use chrono::{DurationRound, TimeDelta, Utc};
    // Room for the spares' provisioning (3 s here) ahead of the open, and for the apply.
    let lead = TimeDelta::seconds(30);
    let opens = (Utc::now() + lead + TimeDelta::minutes(1))
        .duration_trunc(TimeDelta::minutes(1))
        .map_err(err)?;
    apply(stack, &scheduled_target(opens)).await?;
    eprintln!("bench-warm-recovery: a schedule's window opens at {opens} with {HOT} hot spares");
    let wait = (opens - Utc::now()).to_std().unwrap_or_default();
    tokio::time::sleep(wait).await;
    let at_open = client.mirror().read(|m| empty_spares(m, "gold"));
    let (times, _) = kill_each(stack, client, kills, Ready::Hot(HOT)).await?;
    stack
        .env
        .run_kubectl(["delete", "hotsparetarget", "gold-scheduled", "--wait=true"])
        .await?;
    Ok((times, at_open))
}

/// The same kills against a flat hot target sized for the window's peak.
async fn flat_hot(
    stack: &Stack,
    client: &ManagerClient,
    kills: usize,
) -> Result<Vec<f64>, SetupError> {
    apply(stack, &flat_target()).await?;
    eprintln!("bench-warm-recovery: a flat target of {HOT} hot spares, {kills} kills");
    let (times, _) = kill_each(stack, client, kills, Ready::Hot(HOT)).await?;
    Ok(times)
}

fn main() {
    automanager_e2e::bench_main("bench-warm-recovery", run);
}
