//! `make bench-cli`: how fast `kubectl automanager trace` and `top nodes` answer on a big
//! cluster: the real apiserver, manager-sim with `CLI_BENCH_NODES` nodes (default 2,000) in one
//! fixed pool, the operator with `CLI_BENCH_BUNDLES` placed one-replica bundles (default
//! 10,000), the plugin reaching the operator's debugging API on loopback (`--operator-url`;
//! the port-forward to a leader Pod is measured on a real node by `make test-oncall-cluster`).
//! Release builds.
//!
//! Prints one line: `cli nodes=<n> bundles=<n> trace_ms=<median> top_ms=<median>
//! trace_max_ms=<x> top_max_ms=<x> baseline_kubectl_get_managernodes_ms=<median>
//! baseline_curl_trace_ms=<median>`. The baselines are other clients fetching the same data in
//! the same run (`kubectl get managernodes -o json`; `curl` of the trace from the same URL), so
//! the figures separate the plugin's own cost from the apiserver's and the operator's.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use automanager_api::Bundle;
use automanager_e2e::bench::{FleetPool, create_bundles, env_usize, fleet_sim_config};
use automanager_e2e::plugin;
use automanager_e2e::stack::Stack;
use automanager_e2e::{SetupError, bench_main};
use kube::api::{Api, ListParams};

/// The one fixed pool every bundle of this bench goes to.
fn fleet(nodes: usize) -> FleetPool {
    FleetPool::new("bench", nodes, 100, 64)
}

fn bundle(name: &str) -> Result<Bundle, SetupError> {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Bundle",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": 1, "pools": ["bench"], "jobs": [
            {"jobName": "encode", "requirements": {"requiredCapacity": 2, "requiredCores": 1, "priorityBand": "silver"}}
        ]}
    }))
    .map_err(|e| SetupError(e.to_string()))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Runs `cmd` `times` times with output discarded; milliseconds per run.
fn time_runs(times: usize, mut cmd: impl FnMut() -> Command) -> Result<Vec<f64>, SetupError> {
    let mut out = Vec::with_capacity(times);
    for _ in 0..times {
        let mut c = cmd();
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        let t = Instant::now();
        let o = c.output().map_err(|e| SetupError(e.to_string()))?;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        if !o.status.success() {
            return Err(SetupError(format!(
                "{c:?} failed: {}",
                String::from_utf8_lossy(&o.stderr)
            )));
        }
        out.push(ms);
    }
    Ok(out)
}

async fn run() -> Result<(), SetupError> {
    let nodes = env_usize("CLI_BENCH_NODES", 2000)?;
    let bundles = env_usize("CLI_BENCH_BUNDLES", 10_000)?;
    if bundles * 2 > nodes * 100 {
        return Err(SetupError(format!(
            "{bundles} bundles need more than {nodes} nodes of capacity 100 hold"
        )));
    }
    let dir = tempfile::tempdir().map_err(|e| SetupError(e.to_string()))?;
    let config = dir.path().join("manager-sim.yaml");
    std::fs::write(&config, fleet_sim_config(&[fleet(nodes)]))
        .map_err(|e| SetupError(e.to_string()))?;
    eprintln!("bench-cli: starting the stack with {nodes} nodes");
    let stack = Stack::start_custom(&config, &["--no-job-socket"], |c| {
        c.insert("concurrency".into(), serde_json::json!({"bundles": 32}));
        c.insert("statusWriteInterval".into(), "1s".into());
    })
    .await?;
    let out = stack
        .env
        .apply_yaml(&fleet(nodes).placement_pool("binpack"))
        .await?;
    if !out.success() {
        return Err(SetupError(out.stderr));
    }

    eprintln!("bench-cli: creating {bundles} bundles");
    let client = stack.env.client();
    let api: Api<Bundle> = Api::namespaced(client.clone(), "default");
    let started = Instant::now();
    let all = (0..bundles)
        .map(|i| bundle(&format!("bench-{i:05}")))
        .collect::<Result<Vec<_>, _>>()?;
    create_bundles(&api, all, 32).await?;
    eprintln!(
        "bench-cli: created in {:.0}s; waiting for every placement",
        started.elapsed().as_secs_f64()
    );
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        let (_, metrics) = stack.http_get("/metrics").await?;
        let placed = metrics
            .lines()
            .find_map(|l| l.strip_prefix("automanager_placements_succeeded_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        if placed >= bundles as f64 {
            break;
        }
        if Instant::now() > deadline {
            return Err(SetupError(format!(
                "only {placed} of {bundles} placed after 30 minutes"
            )));
        }
        eprintln!("bench-cli: {placed} of {bundles} placed");
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    let mnodes: Api<automanager_api::ManagerNode> = Api::all(client.clone());
    loop {
        let n = mnodes
            .list_metadata(&ListParams::default().match_any())
            .await
            .map_err(|e| SetupError(e.to_string()))?
            .items
            .len();
        if n >= nodes {
            break;
        }
        if Instant::now() > deadline {
            return Err(SetupError(format!("only {n} of {nodes} ManagerNodes")));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    // Let the last status writes land before measuring reads.
    tokio::time::sleep(Duration::from_secs(5)).await;
    eprintln!(
        "bench-cli: {bundles} bundles placed on {nodes} nodes after {:.0}s; measuring",
        started.elapsed().as_secs_f64()
    );

    let bin = plugin::plugin_binary()?;
    let kubeconfig = stack.env.kubeconfig_path().to_owned();
    let kubectl = stack.env.bin_dir().join("kubectl");
    let plugin_cmd = |args: Vec<String>| {
        let mut c = Command::new(bin);
        c.args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("AUTOMANAGER_OPERATOR_URL", &stack.operator_debug_http);
        c
    };
    let picks: Vec<String> = (0..20)
        .map(|k| format!("bench-{:05}", (k * 7919) % bundles))
        .collect();
    // Warm-up: one of each, so the first exec's page cache does not count.
    time_runs(1, || plugin_cmd(vec!["trace".into(), picks[0].clone()]))?;
    time_runs(1, || plugin_cmd(vec!["top".into(), "nodes".into()]))?;
    let mut trace = Vec::new();
    for p in &picks {
        trace.extend(time_runs(1, || {
            plugin_cmd(vec!["trace".into(), p.clone()])
        })?);
    }
    let mut top = time_runs(10, || plugin_cmd(vec!["top".into(), "nodes".into()]))?;
    let mut base_nodes = time_runs(5, || {
        let mut c = Command::new(&kubectl);
        c.args(["get", "managernodes", "-o", "json"])
            .env("KUBECONFIG", &kubeconfig);
        c
    })?;
    let mut base_trace = Vec::new();
    for p in picks.iter().take(5) {
        base_trace.extend(time_runs(1, || {
            let mut c = Command::new("curl");
            c.args([
                "-fsS",
                &format!("{}/debug/trace/default/{p}", stack.operator_debug_http),
            ]);
            c
        })?);
    }
    let trace_max = trace.iter().copied().fold(0.0, f64::max);
    let top_max = top.iter().copied().fold(0.0, f64::max);
    println!(
        "cli nodes={nodes} bundles={bundles} trace_ms={:.0} top_ms={:.0} trace_max_ms={trace_max:.0} top_max_ms={top_max:.0} baseline_kubectl_get_managernodes_ms={:.0} baseline_curl_trace_ms={:.0}",
        median(&mut trace),
        median(&mut top),
        median(&mut base_nodes),
        median(&mut base_trace)
    );
    Ok(())
}

fn main() {
    bench_main("bench-cli", run);
}
