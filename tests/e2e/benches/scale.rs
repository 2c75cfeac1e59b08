//! `make bench-scale`: the operator at fleet size, in one run against the real apiserver,
//! manager-sim and the operator binary (release builds): 10,000 Bundles of 2 replicas × 2 jobs
//! over 2,000 simulated nodes in three fixed pools.
//!
//! Prints one line: `scale bundles=<n> nodes=<n> ready_s=<x> rss_mib=<x> reconciles_per_node_event=<x>
//! restart_settle_s=<x> noop_restart_writes=<n> whatif_p99_ms=<x> wave_slowdown=<x>`, then
//! extra `key=value` fields (below). Goals: all Ready, RSS ≤ 300 MiB, reconciles for one node
//! event ≤ the bundles with a job on the node + 10, steady again ≤ 30 s after a restart with
//! zero status writes and zero Manager calls, what-if p99 ≤ 10 ms during a wave, the wave's
//! throughput within 10 % of the same wave without what-if load (`wave_slowdown` ≤ 1.10).
//!
//! **Fleet.** Pools `a`, `b`, `c` of 1,000, 600 and 400 nodes (capacity 100, 64 cores, spread
//! packing, two zones each). Bundle `i` prefers pool `a` for `i % 10` in 0..5, `b` in 5..8 and `c`
//! otherwise (each pool gets bundles in proportion to its nodes, about 20 jobs per node), and
//! may spill to the next pool. Jobs `encode` (capacity 3) and `package` (capacity 1, co-located
//! with `encode`), silver band (a failed job restarts). manager-sim runs `--no-job-socket` (one
//! WebSocket per job would add 40,000 connections to the sim); the operator runs with
//! `concurrency.bundles: 32` and `statusWriteInterval: 1s`.
//!
//! **Phases**, in this order (the restart lines every Bundle's next periodic look up at the
//! same moment five minutes later, so the node event and the waves that follow it run
//! without that background):
//!
//! 1. *Ready.* Every Bundle is created (32 at a time) and a watch follows them to `Ready`:
//!    `ready_s` is first create → last Ready; `create_s` the creates alone (the floor).
//! 2. *Restart.* Once writes have stopped, the operator is stopped (SIGTERM, it releases its
//!    lease) and started again. `restart_settle_s`: from the new process's start until it has
//!    reconciled every Bundle once. Counted from just before the start until 15 s after
//!    that: the apiserver's writes to `automanager.norsk.io` (`noop_restart_writes`, its own
//!    `apiserver_request_total`, verbs POST, PUT, PATCH, APPLY, DELETE), Events written
//!    (`noop_restart_events`) and the Manager calls that change something
//!    (`noop_restart_manager_calls`, manager-sim's own count, `manager-sim calls`).
//! 3. *Node event.* The node of pool `a` whose job count is nearest 20 is killed (`manager-sim
//!    chaos kill-node`); its jobs' bundles recover elsewhere. Reconciles are the operator's own
//!    count (`automanager_reconcile_duration_seconds_count`, every controller) from just before
//!    the kill until every bundle that had a job there is Ready again elsewhere and 5 s passed:
//!    `reconciles_per_node_event`. `node_event_bundles` / `node_event_jobs` are what the node
//!    held; `idle_reconciles` is the count over a window of the same length with nothing
//!    happening, measured right after (the pools' periodic refresh).
//! 4. *What-if during a wave.* Waves of `SCALE_WAVE` (500) new Bundles, alternately without and
//!    with what-if load (`SCALE_WAVE_PAIRS` (2) of each, A B A B): while a wave runs with load,
//!    one client POSTs a Bundle to `/v1/what-if` on the debug port every 50 ms
//!    (`SCALE_WHATIF_EVERY_MS`), one request at a time, each on a fresh connection. `whatif_p99_ms`
//!    is the client's latency p99; `wave_slowdown` = seconds of the waves with load ÷ seconds
//!    of the waves without (throughput without ÷ with).
//!
//! **The placement history's cost.** From the first create until the writes stop after phase
//! 1 (so a history written after its Bundle went Ready still counts), the apiserver's own
//! `apiserver_request_total` and `apiserver_request_duration_seconds_sum` for
//! `placementhistories`: `history_calls_per_bundle` (every verb) and
//! `history_apiserver_ms_per_bundle` (the apiserver's request latencies for them, summed), beside
//! `bundle_calls_per_bundle` for the Bundles themselves. At the end, the sizes of 50 of the
//! histories as the apiserver serves them (managedFields included): `history_bytes_p50`,
//! `history_bytes_max`.
//!
//! `rss_mib` is the operator's peak `VmRSS` over the whole run (both processes), sampled every
//! 250 ms. `SCALE_BUNDLES` and `SCALE_NODES` shrink the run for a quick check (the pools keep
//! their 5:3:2 split).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use automanager_api::{Bundle, BundlePhase, ManagerNode};
use automanager_e2e::bench::{
    FleetPool, GROUP, ReadyWatch, apiserver_writes, cpu_seconds, create_bundles, env_usize,
    fleet_sim_config, has_label, load_average, metric_sum, of_group, operator_reconciles,
    percentile, rss_mib, show_counts, sorted, total, writes_between,
};
use automanager_e2e::stack::Stack;
use automanager_e2e::{SetupError, bench_main};
use kube::api::{Api, ListParams};

/// Bundles the operator reconciles at once, and the creators' concurrency.
const CONCURRENCY: usize = 32;
/// Jobs per node the killed node should hold (the fleet's average).
const NODE_JOBS: usize = 20;

fn err(e: impl std::fmt::Display) -> SetupError {
    SetupError(e.to_string())
}

/// Pools a, b, c with 5:3:2 of `nodes`.
fn fleet(nodes: usize) -> Vec<FleetPool> {
    let a = nodes / 2;
    let b = nodes * 3 / 10;
    vec![
        FleetPool::new("a", a, 100, 64),
        FleetPool::new("b", b, 100, 64),
        FleetPool::new("c", nodes - a - b, 100, 64),
    ]
}

/// Bundle `i`'s pools: its preferred pool (in proportion to the pools' sizes), then the next.
fn pools_of(i: usize) -> [&'static str; 2] {
    match i % 10 {
        0..5 => ["a", "b"],
        5..8 => ["b", "c"],
        _ => ["c", "a"],
    }
}

fn bundle(name: &str, i: usize) -> Result<Bundle, SetupError> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Bundle",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": 2, "pools": pools_of(i), "jobs": [
            {"jobName": "encode", "requirements": {"requiredCapacity": 3, "requiredCores": 1, "priorityBand": "silver"}},
            {"jobName": "package", "requirements": {"requiredCapacity": 1, "requiredCores": 1, "priorityBand": "silver"}, "coLocateWith": ["encode"]}
        ]}
    }))
    .map_err(err)
}

/// Samples the operator's RSS every 250 ms (whichever process `pid` names) and keeps the peak.
struct RssSampler {
    pid: Arc<AtomicU32>,
    peak_kib: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let s = RssSampler {
            pid: Arc::new(AtomicU32::new(pid)),
            peak_kib: Arc::new(AtomicU64::new(0)),
            stop: Arc::new(AtomicBool::new(false)),
        };
        let (pid, peak, stop) = (s.pid.clone(), s.peak_kib.clone(), s.stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let kib = (rss_mib(pid.load(Ordering::Relaxed)) * 1024.0) as u64;
                peak.fetch_max(kib, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        s
    }

    fn peak_mib(&self) -> f64 {
        self.peak_kib.load(Ordering::Relaxed) as f64 / 1024.0
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Waits until the apiserver has taken no write to our group for `quiet`.
async fn writes_stop(client: &kube::Client, quiet: Duration) -> Result<(), SetupError> {
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut last = of_group(&apiserver_writes(client).await, GROUP);
    loop {
        tokio::time::sleep(quiet).await;
        let now = of_group(&apiserver_writes(client).await, GROUP);
        if writes_between(&last, &now).is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(err(format!(
                "writes did not stop within 10 minutes: {}",
                show_counts(&writes_between(&last, &now))
            )));
        }
        last = now;
    }
}

/// The apiserver's own accounting of the requests for one resource of our group, from its
/// `/metrics`: calls per verb and the seconds it spent serving them.
#[derive(Default)]
struct ResourceCost {
    calls: BTreeMap<String, f64>,
    seconds: f64,
}

impl ResourceCost {
    async fn read(client: &kube::Client, resource: &str) -> ResourceCost {
        let Ok(req) = http::Request::get("/metrics").body(Vec::new()) else {
            return ResourceCost::default();
        };
        let Ok(text) = client.request_text(req).await else {
            return ResourceCost::default();
        };
        let ours = |l: &str| has_label(l, "group", GROUP) && has_label(l, "resource", resource);
        let mut calls = BTreeMap::new();
        for verb in [
            "GET", "LIST", "WATCH", "POST", "PUT", "PATCH", "APPLY", "DELETE",
        ] {
            let n = metric_sum(&text, "apiserver_request_total", |l| {
                ours(l) && has_label(l, "verb", verb)
            });
            if n > 0.0 {
                calls.insert(verb.to_owned(), n);
            }
        }
        let seconds = metric_sum(&text, "apiserver_request_duration_seconds_sum", |l| {
            ours(l) && !has_label(l, "verb", "WATCH")
        });
        ResourceCost { calls, seconds }
    }

    /// What `self` (read later) adds to `before`.
    fn since(&self, before: &ResourceCost) -> ResourceCost {
        ResourceCost {
            calls: writes_between(&before.calls, &self.calls),
            seconds: self.seconds - before.seconds,
        }
    }

    fn total(&self) -> f64 {
        total(&self.calls)
    }
}

/// The sizes in bytes (as the apiserver serves them, managedFields included) of the
/// PlacementHistories of up to `samples` bundles spread over `names`: (median, largest).
async fn history_bytes(client: &kube::Client, names: &[String], samples: usize) -> (f64, f64) {
    let step = (names.len() / samples.max(1)).max(1);
    let mut sizes = Vec::new();
    for n in names.iter().step_by(step) {
        let path = format!("/apis/{GROUP}/v1alpha1/namespaces/default/placementhistories/{n}");
        let Ok(req) = http::Request::get(path).body(Vec::new()) else {
            continue;
        };
        if let Ok(text) = client.request_text(req).await {
            sizes.push(text.len() as f64);
        }
    }
    let sizes = sorted(sizes);
    (percentile(&sizes, 0.5), percentile(&sizes, 1.0))
}

/// What the restart phase measured.
struct Restart {
    settle_s: f64,
    writes: BTreeMap<String, f64>,
    events: f64,
    manager_calls: u64,
}

async fn restart(
    stack: &mut Stack,
    bundles: usize,
    rss: &RssSampler,
) -> Result<Restart, SetupError> {
    let client = stack.env.client();
    stack.operator.stop(Duration::from_secs(30));
    let writes_before = apiserver_writes(&client).await;
    let calls_before = stack.sim_calls()?;
    let started = Instant::now();
    stack.start_operator()?;
    rss.pid
        .store(stack.operator.pid().unwrap_or(0), Ordering::Relaxed);
    let deadline = started + Duration::from_secs(600);
    let settle_s = loop {
        let done = match operator_reconciles(stack).await {
            Ok(r) => r.get("bundle").copied().unwrap_or(0.0),
            Err(_) => 0.0, // not listening yet
        };
        if done >= bundles as f64 {
            break started.elapsed().as_secs_f64();
        }
        if !stack.operator.running() {
            return Err(err(format!(
                "the restarted operator exited:\n{}",
                stack.operator.log_text()
            )));
        }
        if Instant::now() > deadline {
            return Err(err(format!(
                "the restarted operator reconciled {done} of {bundles} bundles in 10 minutes"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "bench-scale: every bundle reconciled {settle_s:.1} s after the start; counting writes for 15 s more"
    );
    tokio::time::sleep(Duration::from_secs(15)).await;
    let all = writes_between(&writes_before, &apiserver_writes(&client).await);
    let calls_after = stack.sim_calls()?;
    let calls_changed: BTreeMap<&String, u64> = calls_after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - calls_before.get(k).copied().unwrap_or(0);
            (d > 0).then_some((k, d))
        })
        .collect();
    eprintln!(
        "bench-scale: after the restart: apiserver writes {}; Manager calls {calls_changed:?}",
        show_counts(&all)
    );
    Ok(Restart {
        settle_s,
        writes: of_group(&all, GROUP),
        events: all
            .iter()
            .filter(|(k, _)| k.ends_with("events POST") || k.ends_with("events PATCH"))
            .map(|(_, v)| v)
            // Starting from +0: an empty f64 sum is -0, printed "-0".
            .fold(0.0, |a, b| a + b),
        manager_calls: calls_after.get("mutating").copied().unwrap_or(0)
            - calls_before.get("mutating").copied().unwrap_or(0),
    })
}

/// What the node event measured.
struct NodeEvent {
    node: String,
    jobs: usize,
    bundles: usize,
    reconciles: BTreeMap<String, f64>,
    idle: BTreeMap<String, f64>,
    seconds: f64,
}

/// The bundles with a job on each node of pool `a`, from the ManagerNodes' job lists.
async fn bundles_by_node(
    client: &kube::Client,
) -> Result<BTreeMap<String, (usize, BTreeSet<String>)>, SetupError> {
    let nodes: Api<ManagerNode> = Api::all(client.clone());
    let mut out = BTreeMap::new();
    for n in nodes.list(&ListParams::default()).await.map_err(err)?.items {
        let Some(s) = n.status else { continue };
        if s.pool != "a" || s.state != automanager_api::NodeState::Started {
            continue;
        }
        let bundles: BTreeSet<String> = s
            .jobs
            .iter()
            .filter_map(|j| j.bundle.as_deref())
            .filter_map(|b| b.strip_prefix("default/"))
            .map(str::to_owned)
            .collect();
        out.insert(s.node_id, (s.jobs.len(), bundles));
    }
    Ok(out)
}

async fn node_event(stack: &Stack) -> Result<NodeEvent, SetupError> {
    let client = stack.env.client();
    let by_node = bundles_by_node(&client).await?;
    let (node, (jobs, bundles)) = by_node
        .into_iter()
        .min_by_key(|(_, (jobs, _))| jobs.abs_diff(NODE_JOBS))
        .ok_or_else(|| err("no started node in pool a"))?;
    eprintln!(
        "bench-scale: killing node {node} ({jobs} jobs of {} bundles)",
        bundles.len()
    );
    let api: Api<Bundle> = Api::namespaced(client.clone(), "default");
    let before = operator_reconciles(stack).await?;
    let started = Instant::now();
    stack.chaos(&["kill-node", &node])?;
    let deadline = started + Duration::from_secs(300);
    loop {
        let mut pending = Vec::new();
        for b in &bundles {
            let obj = api.get(b).await.map_err(err)?;
            let moved = obj.status.as_ref().is_some_and(|s| {
                s.phase == BundlePhase::Ready
                    && s.replicas
                        .iter()
                        .flat_map(|r| &r.jobs)
                        .all(|j| j.node_id.as_deref().is_some_and(|n| n != node))
            });
            if !moved {
                pending.push(b.clone());
            }
        }
        if pending.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            return Err(err(format!(
                "bundles not Ready elsewhere 5 minutes after the kill: {pending:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!(
        "bench-scale: every bundle of {node} Ready elsewhere {:.1} s after the kill; 5 s more",
        started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = operator_reconciles(stack).await?;
    let seconds = started.elapsed().as_secs_f64();
    let idle_before = operator_reconciles(stack).await?;
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    let idle_after = operator_reconciles(stack).await?;
    let diff = |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>| {
        b.iter()
            .map(|(k, v)| (k.clone(), v - a.get(k).copied().unwrap_or(0.0)))
            .filter(|(_, d)| *d > 0.0)
            .collect::<BTreeMap<_, _>>()
    };
    Ok(NodeEvent {
        node,
        jobs,
        bundles: bundles.len(),
        reconciles: diff(&before, &after),
        idle: diff(&idle_before, &idle_after),
        seconds,
    })
}

/// Creates a wave of bundles named `<prefix>-<k>` and waits until all are Ready; seconds.
async fn wave(
    api: &Api<Bundle>,
    ready: &mut ReadyWatch,
    prefix: &str,
    first: usize,
    count: usize,
) -> Result<f64, SetupError> {
    let names: Vec<String> = (0..count).map(|k| format!("{prefix}-{k:05}")).collect();
    let bundles = names
        .iter()
        .enumerate()
        .map(|(k, n)| bundle(n, first + k))
        .collect::<Result<Vec<_>, _>>()?;
    let started = Instant::now();
    let creating = tokio::spawn({
        let api = api.clone();
        async move { create_bundles(&api, bundles, CONCURRENCY).await }
    });
    ready
        .wait_all(&names, Duration::from_secs(600), |_| {})
        .await?;
    creating.await.map_err(err)??;
    Ok(started.elapsed().as_secs_f64())
}

/// POSTs a what-if every `every` until `stop`; the latencies in ms.
fn what_if_load(
    debug: String,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Result<Vec<f64>, SetupError>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut k = 0usize;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            let body = serde_json::to_string(&bundle(&format!("what-if-{k}"), k)?).map_err(err)?;
            let started = Instant::now();
            let (code, answer) =
                automanager_e2e::stack::http_request(&debug, "POST", "/v1/what-if", Some(&body))
                    .await?;
            out.push(started.elapsed().as_secs_f64() * 1000.0);
            if code != 200 || !answer.contains("\"kind\":\"ok\"") {
                return Err(err(format!("what-if answered {code}: {answer:.300}")));
            }
            k += 1;
        }
        Ok(out)
    })
}

async fn run() -> Result<(), SetupError> {
    let bundles = env_usize("SCALE_BUNDLES", 10_000)?;
    let nodes = env_usize("SCALE_NODES", 2_000)?;
    let wave_size = env_usize("SCALE_WAVE", 500)?;
    let pairs = env_usize("SCALE_WAVE_PAIRS", 2)?;
    let what_if_every = Duration::from_millis(env_usize("SCALE_WHATIF_EVERY_MS", 50)? as u64);
    let pools = fleet(nodes);
    let dir = tempfile::tempdir().map_err(err)?;
    let config = dir.path().join("manager-sim.yaml");
    std::fs::write(&config, fleet_sim_config(&pools)).map_err(err)?;
    eprintln!(
        "bench-scale: starting the stack: {nodes} nodes in pools {} (load average {:.1})",
        pools
            .iter()
            .map(|p| format!("{}={}", p.name, p.nodes))
            .collect::<Vec<_>>()
            .join(" "),
        load_average()
    );
    let mut stack = Stack::start_custom(&config, &["--no-job-socket"], |c| {
        c.insert("watchNamespaces".into(), serde_json::json!(["default"]));
        c.insert(
            "concurrency".into(),
            serde_json::json!({"bundles": CONCURRENCY}),
        );
        c.insert("statusWriteInterval".into(), "1s".into());
    })
    .await?;
    let rss = RssSampler::start(stack.operator.pid().unwrap_or(0));
    for p in &pools {
        let out = stack.env.apply_yaml(&p.placement_pool("spread")).await?;
        if !out.success() {
            return Err(SetupError(out.stderr));
        }
    }
    for p in &pools {
        stack
            .wait_for(
                &format!("pool {} with its nodes", p.name),
                Duration::from_secs(120),
                || async {
                    let obj = stack.get_json(&["placementpool", &p.name]).await?;
                    Ok((obj["status"]["nodeCount"].as_u64() == Some(p.nodes as u64)).then_some(()))
                },
            )
            .await?;
    }
    let client = stack.env.client();
    let api: Api<Bundle> = Api::namespaced(client.clone(), "default");

    // 1. Every bundle to Ready.
    eprintln!("bench-scale: creating {bundles} bundles (2 replicas x 2 jobs)");
    let mut ready = ReadyWatch::new(api.clone());
    let names: Vec<String> = (0..bundles).map(|i| format!("s-{i:05}")).collect();
    let all = names
        .iter()
        .enumerate()
        .map(|(i, n)| bundle(n, i))
        .collect::<Result<Vec<_>, _>>()?;
    let load_start = load_average();
    let history_before = ResourceCost::read(&client, "placementhistories").await;
    let bundles_before = ResourceCost::read(&client, "bundles").await;
    let operator_cpu = cpu_seconds(stack.operator.pid().unwrap_or(0));
    let started = Instant::now();
    let creating = tokio::spawn({
        let api = api.clone();
        async move { create_bundles(&api, all, CONCURRENCY).await }
    });
    let mut last_print = Instant::now();
    ready
        .wait_all(&names, Duration::from_secs(3600), |n| {
            if last_print.elapsed() > Duration::from_secs(15) {
                last_print = Instant::now();
                eprintln!(
                    "bench-scale: {n} of {bundles} Ready after {:.0} s (operator RSS {:.0} MiB)",
                    started.elapsed().as_secs_f64(),
                    rss.peak_mib()
                );
            }
        })
        .await?;
    let ready_s = started.elapsed().as_secs_f64();
    let create_s = creating.await.map_err(err)??.as_secs_f64();
    let cpu_ms_per_bundle =
        (cpu_seconds(stack.operator.pid().unwrap_or(0)) - operator_cpu) * 1000.0 / bundles as f64;
    eprintln!(
        "bench-scale: all {bundles} Ready after {ready_s:.1} s (creates alone {create_s:.1} s; operator CPU {cpu_ms_per_bundle:.2} ms per bundle; load average {load_start:.1} at the start, {:.1} now)",
        load_average()
    );

    // 2. The operator restarted with nothing changed.
    eprintln!("bench-scale: waiting until status writes stop");
    writes_stop(&client, Duration::from_secs(5)).await?;
    // Counted until the writes stopped: a history written after its Bundle is Ready still
    // cost the ramp.
    let history = ResourceCost::read(&client, "placementhistories")
        .await
        .since(&history_before);
    let bundle_calls = ResourceCost::read(&client, "bundles")
        .await
        .since(&bundles_before);
    let per_bundle = |x: f64| x / bundles as f64;
    eprintln!(
        "bench-scale: apiserver calls from the first create until writes stopped: placementhistories {} ({:.1} s served); bundles {} ({:.1} s served)",
        show_counts(&history.calls),
        history.seconds,
        show_counts(&bundle_calls.calls),
        bundle_calls.seconds
    );
    eprintln!("bench-scale: restarting the operator");
    let r = restart(&mut stack, bundles, &rss).await?;
    let noop_writes: f64 = r.writes.values().fold(0.0, |a, b| a + b);
    eprintln!(
        "bench-scale: restart: steady after {:.1} s; writes to {GROUP}: {}; Events {}; Manager calls that change something {}",
        r.settle_s,
        show_counts(&r.writes),
        r.events,
        r.manager_calls
    );
    let restarted = Instant::now();

    // 3. One node event.
    let n = node_event(&stack).await?;
    let reconciles = total(&n.reconciles);
    eprintln!(
        "bench-scale: node {} ({} jobs, {} bundles): {reconciles} reconciles in {:.1} s ({}); idle over the same time: {} ({})",
        n.node,
        n.jobs,
        n.bundles,
        n.seconds,
        show_counts(&n.reconciles),
        total(&n.idle),
        show_counts(&n.idle)
    );

    // 4. Waves without and with what-if load.
    let mut without = 0.0;
    let mut with = 0.0;
    let mut latencies = Vec::new();
    let mut next = bundles;
    for pair in 0..pairs {
        for loaded in [false, true] {
            let prefix = format!("w{pair}{}", if loaded { "b" } else { "a" });
            let stop = Arc::new(AtomicBool::new(false));
            let load = loaded.then(|| {
                what_if_load(
                    stack.operator_debug_http.clone(),
                    what_if_every,
                    stop.clone(),
                )
            });
            let before = operator_reconciles(&stack).await?;
            let seconds = wave(&api, &mut ready, &prefix, next, wave_size).await?;
            stop.store(true, Ordering::Relaxed);
            let other = total(&operator_reconciles(&stack).await?) - total(&before);
            next += wave_size;
            if let Some(load) = load {
                let l = load.await.map_err(err)??;
                eprintln!(
                    "bench-scale: wave {prefix}: {wave_size} bundles in {seconds:.1} s with {} what-ifs ({} reconciles, {:.0} s after the restart)",
                    l.len(),
                    other,
                    restarted.elapsed().as_secs_f64()
                );
                latencies.extend(l);
                with += seconds;
            } else {
                eprintln!(
                    "bench-scale: wave {prefix}: {wave_size} bundles in {seconds:.1} s without what-if load ({} reconciles, {:.0} s after the restart)",
                    other,
                    restarted.elapsed().as_secs_f64()
                );
                without += seconds;
            }
        }
    }
    let latencies = sorted(latencies);
    let (history_p50_bytes, history_max_bytes) = history_bytes(&client, &names, 50).await;
    let load_end = load_average();
    println!(
        "scale bundles={bundles} nodes={nodes} ready_s={ready_s:.1} rss_mib={:.0} reconciles_per_node_event={reconciles:.0} restart_settle_s={:.1} noop_restart_writes={noop_writes:.0} whatif_p99_ms={:.1} wave_slowdown={:.2} create_s={create_s:.1} operator_cpu_ms_per_bundle={cpu_ms_per_bundle:.2} node_event_bundles={} node_event_jobs={} idle_reconciles={:.0} noop_restart_manager_calls={} noop_restart_events={:.0} whatif_p50_ms={:.1} whatif_max_ms={:.1} whatifs={} wave_bundles={wave_size} wave_s_without={without:.1} wave_s_with={with:.1} history_calls_per_bundle={:.2} history_apiserver_ms_per_bundle={:.2} bundle_calls_per_bundle={:.2} history_bytes_p50={history_p50_bytes:.0} history_bytes_max={history_max_bytes:.0} load_avg_start={load_start:.1} load_avg_end={load_end:.1}",
        rss.peak_mib(),
        r.settle_s,
        percentile(&latencies, 0.99),
        with / without,
        n.bundles,
        n.jobs,
        total(&n.idle),
        r.manager_calls,
        r.events,
        percentile(&latencies, 0.5),
        percentile(&latencies, 1.0),
        latencies.len(),
        per_bundle(history.total()),
        per_bundle(history.seconds * 1000.0),
        per_bundle(bundle_calls.total()),
    );
    Ok(())
}

fn main() {
    bench_main("bench-scale", run);
}
