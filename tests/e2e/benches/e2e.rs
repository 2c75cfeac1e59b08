//! `make bench-e2e`: end-to-end Bundle throughput against the real apiserver, manager-sim and the
//! operator binary (release builds), with the apiserver's raw status-patch rate for this CRD
//! measured in the same run as the baseline.
//!
//! Prints one line: `e2e bundles=<n> seconds=<s> bundles_per_s=<x> raw_status_writes_per_s=<x>
//! ratio=<x> rss_mib=<x>`. `BENCH_BUNDLES` (default 1000) sets the wave size.

use std::time::{Duration, Instant};

use automanager_api::{Bundle, BundleStatus};
use automanager_e2e::SetupError;
use automanager_e2e::stack::Stack;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

/// The operator's Bundle concurrency in this run (`concurrency.bundles`); the raw baseline uses
/// the same number of concurrent writers.
const CONCURRENCY: usize = 32;
const RAW_SECONDS: u64 = 5;
const NODES: usize = 100;

fn sim_config() -> String {
    let mut nodes = String::new();
    for i in 0..NODES {
        let zone = if i % 2 == 0 { "z-a" } else { "z-b" };
        nodes.push_str(&format!(
            "      - {{id: bench-{i:03}, zone: {zone}, capacity: 1000, cores: 1000}}\n"
        ));
    }
    format!(
        "listen: 127.0.0.1:0\ntiming: {{provisionDelayMs: 0, jobStartDelayMs: 5, jobStopDelayMs: 5}}\npools:\n  - name: bench\n    kind: cluster\n    region: bench-dc\n    zones: [z-a, z-b]\n    scaleOut: fixed\n    nodes:\n{nodes}"
    )
}

const POOL: &str = "apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {name: bench}
spec:
  kind: cluster
  region: bench-dc
  zones: [z-a, z-b]
  scaleOut: fixed
  candidateInstanceTypes: [{instanceType: bench, totalCapacity: 1000, totalCores: 1000}]
";

fn bundle(ns: &str, name: &str) -> Result<Bundle, SetupError> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Bundle",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": 2, "pools": ["bench"], "jobs": [
            {"jobName": "encode", "requirements": {"requiredCapacity": 5, "requiredCores": 1, "priorityBand": "silver"}},
            {"jobName": "package", "requirements": {"requiredCapacity": 2, "requiredCores": 1, "priorityBand": "silver"}, "coLocateWith": ["encode"]}
        ]}
    }))
    .map_err(|e| SetupError(e.to_string()))
}

fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat` (0 when unreadable).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // USER_HZ is 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// The apiserver's write count so far per `resource[/subresource] VERB`, from its own
/// `apiserver_request_total` metric (writes only).
async fn apiserver_writes(client: &kube::Client) -> std::collections::BTreeMap<String, f64> {
    let mut out = std::collections::BTreeMap::new();
    let Ok(req) = http::Request::get("/metrics").body(Vec::new()) else {
        return out;
    };
    let Ok(text) = client.request_text(req).await else {
        return out;
    };
    let label = |line: &str, key: &str| -> String {
        line.split(&format!("{key}=\""))
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or_default()
            .to_owned()
    };
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let verb = label(line, "verb");
        if !matches!(verb.as_str(), "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE") {
            continue;
        }
        let sub = label(line, "subresource");
        let key = format!(
            "{}{}{} {verb}",
            label(line, "resource"),
            if sub.is_empty() { "" } else { "/" },
            sub
        );
        let n: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry(key).or_default() += n;
    }
    out
}

/// Status patches per second from `CONCURRENCY` writers in a tight loop, each patch the given
/// status with `placedReplicas` changed (so every patch is a real write), to bundles in a
/// namespace the operator does not watch.
async fn raw_status_rate(
    client: kube::Client,
    prefix: &str,
    status: &serde_json::Value,
) -> Result<f64, SetupError> {
    let api: Api<Bundle> = Api::namespaced(client, "raw");
    let names: Vec<String> = (0..CONCURRENCY * 4)
        .map(|i| format!("{prefix}-{i}"))
        .collect();
    for n in &names {
        api.create(&PostParams::default(), &bundle("raw", n)?)
            .await
            .map_err(|e| SetupError(e.to_string()))?;
    }
    let deadline = Instant::now() + Duration::from_secs(RAW_SECONDS);
    let started = Instant::now();
    let workers = (0..CONCURRENCY).map(|w| {
        let api = api.clone();
        let names = names.clone();
        let mut status = status.clone();
        async move {
            let mut count = 0u64;
            let mut i = w;
            while Instant::now() < deadline {
                let name = &names[i % names.len()];
                status["placedReplicas"] = serde_json::json!(count % 3);
                let patch = serde_json::json!({"apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Bundle", "status": status});
                api.patch_status(name, &PatchParams::apply("bench-raw").force(), &Patch::Apply(&patch)).await.map_err(|e| SetupError(e.to_string()))?;
                count += 1;
                i += CONCURRENCY;
            }
            Ok::<u64, SetupError>(count)
        }
    });
    let counts: Vec<u64> = futures::future::try_join_all(workers).await?;
    Ok(counts.iter().sum::<u64>() as f64 / started.elapsed().as_secs_f64())
}

async fn run() -> Result<(), SetupError> {
    let n: usize = std::env::var("BENCH_BUNDLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let dir = tempfile::tempdir().map_err(|e| SetupError(e.to_string()))?;
    let sim_path = dir.path().join("sim.yaml");
    std::fs::write(&sim_path, sim_config()).map_err(|e| SetupError(e.to_string()))?;
    eprintln!(
        "bench-e2e: starting control plane, manager-sim ({NODES} nodes) and the operator (release)"
    );
    // The operator's throughput is measured, not the simulated jobs' sockets: one WebSocket per
    // running job would add 4,000 connections to the sim.
    let stack = Stack::start_custom(&sim_path, &["--no-job-socket"], |c| {
        c.insert("watchNamespaces".into(), serde_json::json!(["default"]));
    })
    .await?;
    let client = stack.env.client();
    let out = stack
        .env
        .run_kubectl(["create", "namespace", "raw"])
        .await?;
    if !out.success() {
        return Err(SetupError(out.stderr));
    }
    let out = stack.env.apply_yaml(POOL).await?;
    if !out.success() {
        return Err(SetupError(out.stderr));
    }
    stack
        .wait_for("pool bench Ready", Duration::from_secs(60), || async {
            let p = stack.get_json(&["placementpool", "bench"]).await?;
            Ok(p["status"]["nodeCount"]
                .as_i64()
                .is_some_and(|c| c as usize == NODES)
                .then_some(()))
        })
        .await?;

    // One bundle placed by the operator, for the status a Ready bundle of this shape carries:
    // the raw baseline writes that status, i.e. the same write the operator makes per bundle.
    let api: Api<Bundle> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &bundle("default", "warm-up")?)
        .await
        .map_err(|e| SetupError(e.to_string()))?;
    let warm = stack
        .wait_bundle_phase("default", "warm-up", "Ready", Duration::from_secs(60))
        .await?;
    let ready_status = warm["status"].clone();

    eprintln!(
        "bench-e2e: raw status-patch rate ({CONCURRENCY} concurrent, {RAW_SECONDS} s each, namespace the operator does not watch)"
    );
    let empty =
        serde_json::to_value(BundleStatus::default()).map_err(|e| SetupError(e.to_string()))?;
    let tiny = raw_status_rate(client.clone(), "tiny", &empty).await?;
    let raw = raw_status_rate(client.clone(), "ready", &ready_status).await?;
    eprintln!(
        "bench-e2e: raw = {raw:.0} status writes/s with a Ready bundle's status ({} bytes of JSON); {tiny:.0}/s with an empty status",
        ready_status.to_string().len()
    );

    eprintln!(
        "bench-e2e: creating {n} bundles (2 replicas x 2 jobs) and waiting until all are Ready"
    );
    let pid = stack.operator.pid().unwrap_or(0);
    let procs = [
        ("apiserver", stack.env.apiserver_pid()),
        ("etcd", stack.env.etcd_pid()),
        ("operator", pid),
        ("sim", stack.sim.pid().unwrap_or(0)),
        ("bench", std::process::id()),
    ];
    let cpu_before: Vec<f64> = procs.iter().map(|(_, p)| cpu_seconds(*p)).collect();
    let writes_before = apiserver_writes(&client).await;
    let started = Instant::now();
    let create_api = api.clone();
    let creates = futures::stream::iter((0..n).map(move |i| {
        let api = create_api.clone();
        async move {
            api.create(
                &PostParams::default(),
                &bundle("default", &format!("b-{i:05}"))?,
            )
            .await
            .map_err(|e| SetupError(e.to_string()))
        }
    }))
    .buffer_unordered(CONCURRENCY)
    .try_collect::<Vec<_>>();
    let creates = async move {
        let r = creates.await;
        (r, started.elapsed())
    };
    let mut peak_rss = 0f64;
    let creating = tokio::spawn(creates);
    // Readiness is followed with a watch (a LIST of 1,000 bundles every poll would itself load
    // the apiserver the operator is measured against).
    let mut ready: std::collections::HashSet<String> = std::collections::HashSet::new();
    let events = watcher::watcher(api.clone(), watcher::Config::default()).applied_objects();
    futures::pin_mut!(events);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(900);
    let mut rss_tick = tokio::time::interval(Duration::from_millis(500));
    while ready.len() < n {
        tokio::select! {
            ev = events.try_next() => {
                let b = match ev {
                    Ok(Some(b)) => b,
                    Ok(None) => return Err(SetupError("the bundle watch ended".into())),
                    Err(e) => return Err(SetupError(format!("bundle watch: {e}"))),
                };
                let is_ready = b
                    .status
                    .as_ref()
                    .is_some_and(|s| s.phase == automanager_api::BundlePhase::Ready);
                let name = b.metadata.name.clone().unwrap_or_default();
                // The warm-up bundle is not part of the wave.
                if is_ready && name.starts_with("b-") {
                    ready.insert(name);
                }
            }
            _ = rss_tick.tick() => peak_rss = peak_rss.max(rss_mib(pid)),
            () = tokio::time::sleep_until(deadline) => {
                return Err(SetupError(format!(
                    "only {} of {n} bundles Ready after 900 s",
                    ready.len()
                )));
            }
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let (created, create_time) = creating.await.map_err(|e| SetupError(e.to_string()))?;
    created?;
    eprintln!(
        "bench-e2e: the {n} creates alone took {:.1} s ({:.0}/s); all Ready after {seconds:.1} s",
        create_time.as_secs_f64(),
        n as f64 / create_time.as_secs_f64()
    );
    let cpu: Vec<String> = procs
        .iter()
        .zip(&cpu_before)
        .map(|((name, p), before)| format!("{name}={:.1}", cpu_seconds(*p) - before))
        .collect();
    eprintln!(
        "bench-e2e: CPU seconds during the wave ({seconds:.1} s wall, {} cores): {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu.join(" ")
    );
    let writes: Vec<String> = apiserver_writes(&client)
        .await
        .into_iter()
        .filter_map(|(k, v)| {
            let d = v - writes_before.get(&k).copied().unwrap_or(0.0);
            (d >= 1.0).then(|| format!("{k}={d:.0}"))
        })
        .collect();
    eprintln!(
        "bench-e2e: apiserver writes during the wave: {}",
        writes.join(" ")
    );
    peak_rss = peak_rss.max(rss_mib(pid));
    let rate = n as f64 / seconds;
    println!(
        "e2e bundles={n} seconds={seconds:.1} bundles_per_s={rate:.1} raw_status_writes_per_s={raw:.1} ratio={:.2} rss_mib={peak_rss:.0}",
        rate / raw
    );
    Ok(())
}

fn main() {
    automanager_e2e::bench_main("bench-e2e", run);
}
