//! `make bench-e2e`: end-to-end Bundle throughput against the real apiserver, manager-sim and the
//! operator binary (release builds), with the same work done by a tight client measured in the
//! same run as the baseline.
//!
//! **Baseline.** What a Ready bundle costs the apiserver is four writes: the user's create, the
//! operator's finalizer patch, its status apply (server-side apply of a Ready bundle's status)
//! and one `Placed` Event. The baseline client does exactly those four writes per bundle, one
//! bundle after the other in each of `CONCURRENCY` workers (the operator's
//! `concurrency.bundles`), for as many bundles as the wave, in a namespace the operator does not
//! watch; with the status of a bundle the operator placed in this run. It runs before and after
//! the wave; the baseline rate is their mean.
//!
//! Prints one line: `e2e bundles=<n> seconds=<s> bundles_per_s=<x> baseline_bundles_per_s=<x>
//! ratio=<x> operator_cpu_ms_per_bundle=<x> baseline_client_cpu_ms_per_bundle=<x> rss_mib=<x>`. `BENCH_BUNDLES` (default 1000) sets the
//! wave size. Goals: ratio ≥ 0.9, operator CPU ≤ 1 ms per bundle.

use std::time::{Duration, Instant};

use automanager_api::Bundle;
use automanager_e2e::SetupError;
use automanager_e2e::bench::{
    FleetPool, ReadyWatch, apiserver_writes, cpu_seconds, create_bundles, env_usize,
    fleet_sim_config, load_average, rss_mib, show_counts, writes_between,
};
use automanager_e2e::stack::Stack;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// The operator's Bundle concurrency in this run (`concurrency.bundles`); the baseline uses
/// the same number of concurrent workers.
const CONCURRENCY: usize = 32;

fn fleet() -> FleetPool {
    FleetPool::new("bench", 100, 1000, 1000)
}

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

fn err(e: impl std::fmt::Display) -> SetupError {
    SetupError(e.to_string())
}

/// The four writes of one Ready bundle, as the user and the operator make them.
async fn ready_bundle_writes(
    api: &Api<Bundle>,
    recorder: &Recorder,
    name: &str,
    ready: &serde_json::Value,
    note: &str,
) -> Result<(), SetupError> {
    let created = api
        .create(&PostParams::default(), &bundle("raw", name)?)
        .await
        .map_err(err)?;
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({"metadata": {"finalizers": [automanager_api::BUNDLE_FINALIZER]}}),
        ),
    )
    .await
    .map_err(err)?;
    let status = serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Bundle", "status": ready,
    });
    api.patch_status(
        name,
        &PatchParams::apply(automanager_api::FIELD_MANAGER).force(),
        &Patch::Apply(&status),
    )
    .await
    .map_err(err)?;
    recorder
        .publish(
            &Event {
                type_: EventType::Normal,
                reason: "Placed".into(),
                note: Some(note.to_owned()),
                action: "Place".into(),
                secondary: None,
            },
            &created.object_ref(&()),
        )
        .await
        .map_err(err)
}

/// Bundles per second of [`ready_bundle_writes`] from `CONCURRENCY` workers, `n` bundles in all.
async fn baseline_rate(
    client: &kube::Client,
    prefix: &str,
    n: usize,
    ready: &serde_json::Value,
    note: &str,
) -> Result<f64, SetupError> {
    let api: Api<Bundle> = Api::namespaced(client.clone(), "raw");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "automanager-operator".into(),
            instance: Some("bench-baseline".into()),
        },
    );
    let started = Instant::now();
    let workers = (0..CONCURRENCY).map(|w| {
        let (api, recorder) = (api.clone(), recorder.clone());
        async move {
            for i in (w..n).step_by(CONCURRENCY) {
                ready_bundle_writes(&api, &recorder, &format!("{prefix}-{i:05}"), ready, note)
                    .await?;
            }
            Ok::<(), SetupError>(())
        }
    });
    futures::future::try_join_all(workers).await?;
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

async fn run() -> Result<(), SetupError> {
    let n = env_usize("BENCH_BUNDLES", 1000)?;
    let dir = tempfile::tempdir().map_err(err)?;
    let sim_path = dir.path().join("sim.yaml");
    std::fs::write(&sim_path, fleet_sim_config(&[fleet()])).map_err(err)?;
    eprintln!(
        "bench-e2e: starting control plane, manager-sim ({} nodes) and the operator (release)",
        fleet().nodes
    );
    // The operator's throughput is measured, not the simulated jobs' sockets: one WebSocket per
    // running job would add 4,000 connections to the sim.
    let stack = Stack::start_custom(&sim_path, &["--no-job-socket"], |c| {
        c.insert("watchNamespaces".into(), serde_json::json!(["default"]));
        c.insert(
            "concurrency".into(),
            serde_json::json!({"bundles": CONCURRENCY}),
        );
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
    let out = stack
        .env
        .apply_yaml(&fleet().placement_pool("binpack"))
        .await?;
    if !out.success() {
        return Err(SetupError(out.stderr));
    }
    stack
        .wait_for("pool bench Ready", Duration::from_secs(60), || async {
            let p = stack.get_json(&["placementpool", "bench"]).await?;
            Ok(p["status"]["nodeCount"]
                .as_i64()
                .is_some_and(|c| c as usize == fleet().nodes)
                .then_some(()))
        })
        .await?;

    // One bundle placed by the operator, for the status and the Event a Ready bundle of this
    // shape carries: the baseline writes those.
    let api: Api<Bundle> = Api::namespaced(client.clone(), "default");
    api.create(&PostParams::default(), &bundle("default", "warm-up")?)
        .await
        .map_err(err)?;
    let warm = stack
        .wait_bundle_phase("default", "warm-up", "Ready", Duration::from_secs(60))
        .await?;
    let ready_status = warm["status"].clone();
    let note = "replica 0 on bench-00001 in pool bench; replica 1 on bench-00002 in pool bench";

    eprintln!(
        "bench-e2e: baseline: {n} bundles' writes (create, finalizer, status apply of {} bytes, Event), {CONCURRENCY} workers",
        ready_status.to_string().len()
    );
    let load_before = load_average();
    let bench_cpu = cpu_seconds(std::process::id());
    let base1 = baseline_rate(&client, "before", n, &ready_status, note).await?;
    // The tight client's own CPU for the same writes: what a bundle's four writes cost a
    // client that does nothing else (TLS, JSON, HTTP), next to the operator's figure.
    let baseline_cpu_ms = (cpu_seconds(std::process::id()) - bench_cpu) * 1000.0 / n as f64;
    eprintln!(
        "bench-e2e: baseline before the wave: {base1:.1} bundles/s, {baseline_cpu_ms:.2} ms of the client's CPU per bundle"
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
    let mut ready = ReadyWatch::new(api.clone());
    // The warm-up bundle is in the watch's first list: wait for it, so the wave starts with
    // the watch established.
    ready
        .wait_all(&["warm-up".to_owned()], Duration::from_secs(60), |_| {})
        .await?;
    let cpu_before: Vec<f64> = procs.iter().map(|(_, p)| cpu_seconds(*p)).collect();
    let writes_before = apiserver_writes(&client).await;
    let names: Vec<String> = (0..n).map(|i| format!("b-{i:05}")).collect();
    let wave: Vec<Bundle> = names
        .iter()
        .map(|name| bundle("default", name))
        .collect::<Result<_, _>>()?;
    let started = Instant::now();
    let creating = tokio::spawn({
        let api = api.clone();
        async move { create_bundles(&api, wave, CONCURRENCY).await }
    });
    let mut peak_rss = 0f64;
    ready
        .wait_all(&names, Duration::from_secs(900), |_| {
            peak_rss = peak_rss.max(rss_mib(pid));
        })
        .await?;
    let seconds = started.elapsed().as_secs_f64();
    let create_time = creating.await.map_err(err)??;
    let cpu: Vec<f64> = procs
        .iter()
        .zip(&cpu_before)
        .map(|((_, p), before)| cpu_seconds(*p) - before)
        .collect();
    let writes = writes_between(&writes_before, &apiserver_writes(&client).await);
    peak_rss = peak_rss.max(rss_mib(pid));
    eprintln!(
        "bench-e2e: the {n} creates alone took {:.1} s ({:.0}/s); all Ready after {seconds:.1} s",
        create_time.as_secs_f64(),
        n as f64 / create_time.as_secs_f64()
    );
    eprintln!(
        "bench-e2e: CPU seconds during the wave ({seconds:.1} s wall, {} cores): {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        procs
            .iter()
            .zip(&cpu)
            .map(|((name, _), c)| format!("{name}={c:.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    eprintln!(
        "bench-e2e: apiserver writes during the wave: {}",
        show_counts(&writes)
    );

    let base2 = baseline_rate(&client, "after", n, &ready_status, note).await?;
    let load_after = load_average();
    let baseline = (base1 + base2) / 2.0;
    eprintln!(
        "bench-e2e: baseline after the wave: {base2:.1} bundles/s (mean {baseline:.1}); load average {load_before:.1} before, {load_after:.1} after"
    );
    let rate = n as f64 / seconds;
    let operator_cpu_ms = cpu[2] * 1000.0 / n as f64;
    println!(
        "e2e bundles={n} seconds={seconds:.1} bundles_per_s={rate:.1} baseline_bundles_per_s={baseline:.1} ratio={:.2} operator_cpu_ms_per_bundle={operator_cpu_ms:.2} baseline_client_cpu_ms_per_bundle={baseline_cpu_ms:.2} rss_mib={peak_rss:.0}",
        rate / baseline
    );
    Ok(())
}

fn main() {
    automanager_e2e::bench_main("bench-e2e", run);
}
