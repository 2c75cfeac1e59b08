//! The reliability suite: faults against the real stack (apiserver + etcd, manager-sim, the
//! operator binary), with the invariant checker of `automanager_e2e::reliability` reading Manager
//! and the Bundles throughout and once settled. Each scenario has a fixed seed, a time bound,
//! runs on loopback only, prints one `reliability scenario=...` line and asserts no violation.
//!
//! Run with `make test-reliability` (not part of `make test`); `RELIABILITY_BUNDLES` sets the
//! size of the waves (default 200).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use automanager_e2e::reliability::{
    self, Monitor, Violations, check, explain_lost, manager_facts, manager_state, node_cordon,
    print_log_lines, settle, sim_admin, suite_settings,
};
use automanager_e2e::rng::Rng;
use automanager_e2e::stack::{Stack, free_port};
use automanager_e2e::{apply, apply_example_pools, condition, patch_node};
use manager_client::proto::{
    CallCountsRequest, CutStreamsRequest, FailJobRequest, JobHistoryRequest, KillNodeRequest,
    KillZoneRequest,
};
use serde_json::Value;

/// How long any scenario may take to settle after its last fault.
const SETTLE: Duration = Duration::from_secs(300);
/// Upper bound of any other wait (the machine may be shared and loaded).
const WAIT: Duration = Duration::from_secs(180);

/// The size of a wave: `RELIABILITY_BUNDLES`, default 200.
fn wave_size() -> usize {
    env_or("RELIABILITY_BUNDLES", 200)
}

/// One generated Bundle: 1-2 replicas of 1-2 jobs, 5-20 capacity each, a band, elastic pools.
fn wave_bundle(name: &str, rng: &mut Rng, bands: &[&str]) -> String {
    let replicas = rng.range(1, 2);
    let pools = rng.pick(&["[aws-east]", "[aws-east, oci-fra]", "[oci-fra, aws-east]"]);
    let mut jobs = String::new();
    for job in ["enc", "pkg"].iter().take(rng.range(1, 2) as usize) {
        let band = rng.pick(bands);
        jobs.push_str(&format!(
            "    - jobName: {job}\n      requirements: {{requiredCapacity: {}, requiredCores: 1, priorityBand: {band}}}\n",
            rng.range(5, 20)
        ));
    }
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  replicas: {replicas}\n  pools: {pools}\n  jobs:\n{jobs}---\n"
    )
}

/// `count` bundles `<prefix>-<i>` from `start`, as one multi-document YAML.
fn wave(prefix: &str, start: usize, count: usize, rng: &mut Rng, bands: &[&str]) -> String {
    (start..start + count)
        .map(|i| wave_bundle(&format!("{prefix}-{i:04}"), rng, bands))
        .collect()
}

async fn suite_stack() -> Stack {
    Stack::start_with(suite_settings).await.expect("stack")
}

async fn kubectl(stack: &Stack, args: &[&str]) {
    let out = stack.env.run_kubectl(args).await.unwrap();
    assert!(out.success(), "kubectl {args:?}: {}", out.stderr);
}

async fn restart_operator(stack: &mut Stack) {
    stack.start_operator().unwrap();
    stack.wait_operator_ready(WAIT).await.unwrap();
}

/// Prints the scenario's line and fails on any violation.
fn report(scenario: &str, v: &Violations, settle: Duration) {
    report_with(scenario, v, settle, None);
}

/// [`report`], with a failure the invariants do not cover (`ok=false` when there is one).
fn report_with(scenario: &str, v: &Violations, settle: Duration, failure: Option<String>) {
    let line = v.line(scenario, settle);
    let line = match &failure {
        Some(_) => line.replacen(" ok=true ", " ok=false ", 1),
        None => line,
    };
    println!("{line}");
    assert!(v.is_clean(), "{scenario}:\n{}", v.details());
    if let Some(f) = failure {
        panic!("{scenario}: {f}");
    }
}

/// Settles, adds what the monitor saw while the faults ran, reports; `settle_s` counts from
/// `since` (the last fault).
async fn finish(stack: &Stack, monitor: Monitor, scenario: &str, since: Instant) -> Violations {
    let (mut v, _) = settle(stack, SETTLE).await.unwrap();
    let took = since.elapsed();
    let (seen, samples) = monitor.stop().await;
    eprintln!("{scenario}: the monitor took {samples} samples of Manager's state");
    v.merge(&seen);
    report(scenario, &v, took);
    v
}

/// A wave of N bundles, with the operator `kill -9`ed three times during it and a tenth of the
/// bundles deleted between two kills.
#[tokio::test]
async fn operator_kill() {
    let mut rng = Rng(0x0A11_0001);
    let mut stack = suite_stack().await;
    apply_example_pools(&stack).await.unwrap();
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let n = wave_size();
    let chunk = n.div_ceil(4);
    let mut deleted = Vec::new();
    let mut last_restart = Instant::now();
    for c in 0..4 {
        let start = c * chunk;
        let count = chunk.min(n.saturating_sub(start));
        if count > 0 {
            apply(
                &stack,
                &wave(
                    "kill",
                    start,
                    count,
                    &mut rng,
                    &["gold", "silver", "bronze"],
                ),
            )
            .await;
        }
        if c == 3 {
            break;
        }
        // Mid-reconcile: the kill lands while the chunk is being placed.
        tokio::time::sleep(Duration::from_millis(rng.range(200, 1500))).await;
        stack.operator.kill9();
        if c == 1 {
            // Deleted while no operator runs: the finalizer waits for the next one.
            deleted = (0..2 * chunk)
                .step_by(10)
                .map(|i| format!("kill-{i:04}"))
                .collect();
            let mut args = vec!["delete", "bundle", "-n", "default", "--wait=false"];
            args.extend(deleted.iter().map(String::as_str));
            kubectl(&stack, &args).await;
        }
        restart_operator(&mut stack).await;
        last_restart = Instant::now();
    }
    let v = finish(&stack, monitor, "operator-kill", last_restart).await;
    assert!(v.orphans.is_empty());
    // The deleted ones are gone from the apiserver too (their finalizer ran), the rest stay.
    let left = stack
        .wait_for("the deleted bundles to be gone", WAIT, || async {
            let left = stack.get_json(&["bundles", "-n", "default"]).await?;
            let names: BTreeSet<String> = left["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|b| b["metadata"]["name"].as_str().map(str::to_owned))
                .collect();
            Ok((!deleted.iter().any(|d| names.contains(d))).then_some(names))
        })
        .await
        .unwrap();
    assert_eq!(
        left.len() + deleted.len(),
        n,
        "every other bundle is still there"
    );
}

/// Every node of one zone killed at once; gold comes back elsewhere.
#[tokio::test]
async fn zone_outage() {
    let mut rng = Rng(0x0A11_0002);
    let stack = suite_stack().await;
    apply_example_pools(&stack).await.unwrap();
    let n = wave_size().min(80);
    apply(&stack, &wave("zone", 0, n, &mut rng, &["gold", "silver"])).await;
    let (v, took) = settle(&stack, SETTLE).await.unwrap();
    assert!(
        v.is_clean(),
        "before the outage ({took:?}):\n{}",
        v.details()
    );

    // The zone with the most jobs.
    let state = manager_state(&stack.sim_endpoint).await.unwrap();
    let (nodes, jobs, _) = manager_facts(&state);
    let busy = |zone: &str| {
        jobs.iter()
            .filter(|j| {
                j.instances
                    .iter()
                    .any(|i| nodes.iter().any(|n| n.id == i.node_id && n.zone == zone))
            })
            .count()
    };
    let zones: BTreeSet<&str> = nodes.iter().map(|n| n.zone.as_str()).collect();
    let zone = zones
        .iter()
        .copied()
        .max_by_key(|z| busy(z))
        .unwrap()
        .to_owned();
    let hit = busy(&zone);

    // The zone dies as a zone does: the sim kills every node in it in one step, those still
    // starting too (a list of victims read a moment earlier would miss a node created since),
    // and nothing comes up there for the rest of the test.
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let mut admin = sim_admin(&stack.sim_endpoint).await.unwrap();
    let killed_at = Instant::now();
    let victims = admin
        .kill_zone(KillZoneRequest {
            zone: zone.clone(),
            revive: false,
        })
        .await
        .unwrap()
        .into_inner()
        .node_ids;
    eprintln!(
        "zone-outage: killed {} nodes of {zone} ({hit} jobs)",
        victims.len()
    );

    // Gold back: every gold job of the wave runs again on a started node.
    let gold: Vec<String> = state
        .jobs
        .values()
        .filter(|j| is_gold(j))
        .map(|j| format!("{}:", j.job_id))
        .collect();
    let gold_back = stack
        .wait_for("gold jobs back", SETTLE, || async {
            let lost = check(&reliability::observe(&stack).await?).lost;
            let gold_lost = lost
                .iter()
                .filter(|l| gold.iter().any(|g| l.starts_with(g.as_str())))
                .count();
            Ok((gold_lost == 0).then_some(killed_at.elapsed()))
        })
        .await
        .unwrap();
    eprintln!(
        "zone-outage: gold back after {:.1}s",
        gold_back.as_secs_f64()
    );
    let v = finish(&stack, monitor, "zone-outage", killed_at).await;
    assert!(v.lost.is_empty());
}

fn is_gold(j: &manager_client::proto::Job) -> bool {
    j.requirements
        .as_ref()
        .is_some_and(|r| r.priority_band == "gold")
}

/// Manager's Watch streams cut every half second while a wave is placed, and for ten seconds
/// after it.
#[tokio::test]
async fn stream_cuts() {
    let mut rng = Rng(0x0A11_0003);
    let stack = suite_stack().await;
    apply_example_pools(&stack).await.unwrap();
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let mut admin = sim_admin(&stack.sim_endpoint).await.unwrap();
    let cutter = tokio::spawn(async move {
        let mut cuts = 0u32;
        while !*stop_rx.borrow() {
            if admin.cut_streams(CutStreamsRequest {}).await.is_ok() {
                cuts += 1;
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), stop_rx.changed()).await;
        }
        cuts
    });
    let n = wave_size();
    let chunk = n.div_ceil(4);
    for c in 0..4 {
        let start = c * chunk;
        let count = chunk.min(n.saturating_sub(start));
        if count > 0 {
            apply(
                &stack,
                &wave("cut", start, count, &mut rng, &["gold", "silver", "bronze"]),
            )
            .await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop_tx.send_replace(true);
    let cuts = cutter.await.unwrap();
    let last_cut = Instant::now();
    eprintln!("stream-cuts: {cuts} cuts");
    assert!(cuts >= 10, "the streams were cut {cuts} times");
    finish(&stack, monitor, "stream-cuts", last_cut).await;
}

/// Every instance start of a job the sim saw.
async fn job_starts(stack: &Stack, job_id: &str) -> Vec<manager_client::proto::InstanceStart> {
    let mut admin = sim_admin(&stack.sim_endpoint).await.unwrap();
    admin
        .job_history(JobHistoryRequest {
            job_id: job_id.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
        .starts
}

/// The number of instance starts of a job the sim saw.
async fn starts(stack: &Stack, job_id: &str) -> usize {
    job_starts(stack, job_id).await.len()
}

/// A crash-looping gold job across operator `kill -9`s: Broken after exactly
/// `maxRestartsPerHour` restarts, not one more; the retry annotation starts it again.
#[tokio::test]
async fn restart_storm() {
    const MAX: u64 = 3;
    let mut rng = Rng(0x0A11_0004);
    let mut stack = suite_stack().await;
    apply_example_pools(&stack).await.unwrap();
    apply(&stack, &wave("calm", 0, 20, &mut rng, &["gold", "silver"])).await;
    apply(
        &stack,
        &format!(
            "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: crashy, namespace: default}}\nspec:\n  replicas: 1\n  pools: [onprem]\n  jobs:\n    - jobName: enc\n      requirements: {{requiredCapacity: 10, requiredCores: 1, priorityBand: gold}}\n  bands:\n    gold: {{maxRestartsPerHour: {MAX}}}\n"
        ),
    )
    .await;
    stack
        .wait_bundle_phase("default", "crashy", "Ready", WAIT)
        .await
        .unwrap();
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let job_id = "default.crashy/0/enc";
    let mut admin = sim_admin(&stack.sim_endpoint).await.unwrap();
    for i in 1..=MAX + 1 {
        admin
            .fail_job(FailJobRequest {
                job_id: job_id.into(),
                message: format!("crash {i}"),
            })
            .await
            .unwrap();
        if i > MAX {
            break;
        }
        stack
            .wait_for(&format!("restart {i}"), WAIT, || async {
                let b = stack
                    .get_json(&["bundle", "crashy", "-n", "default"])
                    .await?;
                let job = &b["status"]["replicas"][0]["jobs"][0];
                Ok((b["status"]["replicas"][0]["restartsLastHour"] == i
                    && job["state"] == "running")
                    .then_some(()))
            })
            .await
            .unwrap();
        // Each restart is followed by an operator crash: the count must survive it.
        stack.operator.kill9();
        restart_operator(&mut stack).await;
    }
    let b = stack
        .wait_bundle_phase("default", "crashy", "Broken", WAIT)
        .await
        .unwrap();
    assert_eq!(b["status"]["replicas"][0]["restartsLastHour"], MAX, "{b:#}");
    // Give a wrong extra restart time to happen, then count the starts the sim saw.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        starts(&stack, job_id).await as u64,
        1 + MAX,
        "one start and exactly {MAX} restarts"
    );
    let (mut v, _) = settle(&stack, SETTLE).await.unwrap();
    assert!(
        v.is_clean(),
        "a Broken bundle is not lost:\n{}",
        v.details()
    );

    kubectl(
        &stack,
        &[
            "annotate",
            "--overwrite",
            "bundle",
            "crashy",
            "-n",
            "default",
            "automanager.norsk.io/retry=storm-1",
        ],
    )
    .await;
    let retried = Instant::now();
    let b = stack
        .wait_bundle_phase("default", "crashy", "Ready", WAIT)
        .await
        .unwrap();
    assert_eq!(b["status"]["lastRetry"], "storm-1");
    assert_eq!(condition(&b, "Broken")["status"], "False", "{b:#}");
    assert_eq!(starts(&stack, job_id).await as u64, 2 + MAX);
    // Settled after the retry: everything runs again.
    v = settle(&stack, SETTLE).await.unwrap().0;
    let took = retried.elapsed();
    let (seen, _) = monitor.stop().await;
    v.merge(&seen);
    report("restart-storm", &v, took);
}

/// One write the apiserver's audit log recorded.
struct Write {
    at: String,
    user: String,
    what: String,
    ok: bool,
}

/// The writes (create, update, patch, delete) in an audit log, oldest first.
fn audited_writes(log: &str) -> Vec<Write> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e["stage"] == "ResponseComplete")
        .map(|e| {
            let r = &e["objectRef"];
            Write {
                // RFC 3339 with microseconds, always the same width: compares as text.
                at: e["requestReceivedTimestamp"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                user: e["user"]["username"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                what: format!(
                    "{} {}/{}/{}{}",
                    e["verb"].as_str().unwrap_or_default(),
                    r["resource"].as_str().unwrap_or_default(),
                    r["namespace"].as_str().unwrap_or_default(),
                    r["name"].as_str().unwrap_or_default(),
                    r["subresource"]
                        .as_str()
                        .map(|s| format!("/{s}"))
                        .unwrap_or_default(),
                ),
                ok: e["responseStatus"]["code"]
                    .as_i64()
                    .is_some_and(|c| c < 400),
            }
        })
        .collect()
}

async fn lease_holder(stack: &Stack) -> Option<String> {
    let lease = stack
        .get_json(&["lease", "automanager-operator", "-n", "default"])
        .await
        .ok()?;
    lease["spec"]["holderIdentity"].as_str().map(str::to_owned)
}

/// Two operator replicas, each with its own ServiceAccount so the apiserver's audit log tells
/// their writes apart. The leader is paused (SIGSTOP) past its lease while work arrives, the
/// standby takes over, the old leader is resumed (SIGCONT): it must write nothing after the
/// takeover, and the invariants hold.
#[tokio::test]
async fn leader_pause() {
    const LEASE_S: u64 = 6;
    let mut rng = Rng(0x0A11_0005);
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("audit-policy.yaml");
    std::fs::write(
        &policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived, ResponseStarted]\nrules:\n  - level: Metadata\n    verbs: [create, update, patch, delete, deletecollection]\n  - level: None\n",
    )
    .unwrap();
    let audit = dir.path().join("audit.log");
    let env = automanager_e2e::TestEnv::builder()
        .apiserver_arg(format!("--audit-policy-file={}", policy.display()))
        .apiserver_arg(format!("--audit-log-path={}", audit.display()))
        .start()
        .await
        .unwrap();
    let env = automanager_e2e::install_crds(env).await.unwrap();
    let mut kubeconfigs = Vec::new();
    for sa in ["op-a", "op-b"] {
        for args in [
            vec!["create", "serviceaccount", sa, "-n", "default"],
            vec![
                "create",
                "clusterrolebinding",
                sa,
                "--clusterrole=cluster-admin",
                &format!("--serviceaccount=default:{sa}"),
            ],
        ] {
            let out = env.run_kubectl(&args).await.unwrap();
            assert!(out.success(), "{}", out.stderr);
        }
        kubeconfigs.push(
            automanager_e2e::install::service_account_kubeconfig(&env, "default", sa, dir.path())
                .await
                .unwrap(),
        );
    }
    let stack = Stack::start_on(
        env,
        &automanager_e2e::repo_root().join("deploy/demo/manager-sim.yaml"),
        &[],
        Some(kubeconfigs[0].clone()),
        |c| {
            suite_settings(c);
            c.insert(
                "leaderElection".into(),
                serde_json::json!({"enabled": true, "leaseNamespace": "default",
                    "leaseDuration": format!("{LEASE_S}s"), "renewEvery": "2s"}),
            );
        },
    )
    .await
    .expect("stack");
    let (replica_b, b_http) = stack.start_replica("b", &kubeconfigs[1]).unwrap();
    stack
        .wait_for("replica b ready", WAIT, || async {
            let (code, _) = automanager_e2e::stack::http_get_at(&b_http, "/readyz").await?;
            Ok((code == 200).then_some(()))
        })
        .await
        .unwrap();
    apply_example_pools(&stack).await.unwrap();
    apply(&stack, &wave("lead", 0, 30, &mut rng, &["gold", "silver"])).await;
    let holder = stack
        .wait_for("a leader", WAIT, || async {
            Ok(lease_holder(&stack).await)
        })
        .await
        .unwrap();
    let a_pid = stack.operator.pid().unwrap();
    let a_leads = holder.ends_with(&format!("-{a_pid}"));
    let (leader, standby, old_user, new_user) = if a_leads {
        (&stack.operator, &replica_b, "op-a", "op-b")
    } else {
        (&replica_b, &stack.operator, "op-b", "op-a")
    };
    let standby_pid = standby.pid().unwrap();
    eprintln!("leader-pause: {holder} leads ({old_user}); pausing it");
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();

    leader.pause_signal("STOP").unwrap();
    let paused = Instant::now();
    // Work the paused leader's caches will see when it resumes.
    apply(&stack, &wave("lead", 30, 20, &mut rng, &["gold", "silver"])).await;
    kubectl(
        &stack,
        &[
            "delete",
            "bundle",
            "-n",
            "default",
            "--wait=false",
            "lead-0000",
            "lead-0001",
        ],
    )
    .await;
    let takeover = stack
        .wait_for("the standby to take the lease", WAIT, || async {
            let h = lease_holder(&stack).await;
            Ok(h.filter(|h| h.ends_with(&format!("-{standby_pid}")))
                .map(|_| paused.elapsed()))
        })
        .await;
    // Keep the old leader paused a little past the takeover, so its caches are stale.
    tokio::time::sleep(Duration::from_secs(2)).await;
    leader.pause_signal("CONT").unwrap();
    let takeover = takeover.unwrap();
    eprintln!(
        "leader-pause: the standby took over {:.1}s after the pause (lease {LEASE_S}s)",
        takeover.as_secs_f64()
    );
    // Time for the resumed leader to notice (and for anything it would still write).
    tokio::time::sleep(Duration::from_secs(15)).await;

    let (v, settled) = finish_quiet(&stack, monitor).await;
    let writes = audited_writes(&std::fs::read_to_string(&audit).unwrap_or_default());
    let old = format!("system:serviceaccount:default:{old_user}");
    let new = format!("system:serviceaccount:default:{new_user}");
    let took_at = writes
        .iter()
        .find(|w| w.user == new && w.ok && w.what.contains(" leases/"))
        .map(|w| w.at.clone())
        .expect("the standby's lease write is in the audit log");
    let after: Vec<&Write> = writes
        .iter()
        .filter(|w| w.user == old && w.at > took_at)
        .collect();
    let succeeded = after.iter().filter(|w| w.ok).count();
    eprintln!(
        "leader-pause: the old leader sent {} writes after the takeover at {took_at}, {succeeded} succeeded",
        after.len()
    );
    for w in after.iter().take(15) {
        eprintln!("  {} {} ok={}", w.at, w.what, w.ok);
    }
    println!(
        "reliability leader-pause takeover_s={:.1} old_leader_writes_after_takeover={succeeded}",
        takeover.as_secs_f64()
    );
    let slow = (takeover > Duration::from_secs(LEASE_S + 5))
        .then(|| format!("the takeover took {takeover:?}, over the lease + 5 s"));
    let fenced = (succeeded > 0)
        .then(|| format!("the old leader wrote {succeeded} times after the takeover"));
    report_with("leader-pause", &v, settled, fenced.or(slow));
}

/// [`finish`] without the report: settle and merge the monitor's samples.
async fn finish_quiet(stack: &Stack, monitor: Monitor) -> (Violations, Duration) {
    let (mut v, took) = settle(stack, SETTLE).await.unwrap();
    v.merge(&monitor.stop().await.0);
    (v, took)
}

/// The hostile values every field of the corpus is given, each with a label.
fn hostile_values() -> Vec<(&'static str, Value)> {
    let deep = nested(100);
    vec![
        ("null", Value::Null),
        ("true", Value::Bool(true)),
        ("minus-one", serde_json::json!(-1)),
        ("zero", serde_json::json!(0)),
        ("half", serde_json::json!(0.5)),
        ("i32-max", serde_json::json!(i32::MAX)),
        (
            "i32-max-plus-one",
            serde_json::json!(i64::from(i32::MAX) + 1),
        ),
        ("i64-min", serde_json::json!(i64::MIN)),
        ("i64-max", serde_json::json!(i64::MAX)),
        ("u64-max", serde_json::json!(u64::MAX)),
        ("1e308", serde_json::json!(1e308)),
        ("empty-string", serde_json::json!("")),
        ("word", serde_json::json!("x")),
        (
            "control-chars",
            serde_json::json!("a\u{0}b\u{7}c\u{1b}[31m\r\n"),
        ),
        (
            "bidi-and-emoji",
            serde_json::json!("\u{202e}gold\u{1F4A9}\u{200b}"),
        ),
        ("one-mib", Value::String("m".repeat(1024 * 1024))),
        ("empty-list", serde_json::json!([])),
        ("list-of-numbers", serde_json::json!([1, 2, 3])),
        (
            "huge-list",
            Value::Array(vec![serde_json::json!("aws-east"); 10_000]),
        ),
        ("empty-object", serde_json::json!({})),
        ("deep-object", deep),
        (
            "duplicate-pools",
            serde_json::json!(["aws-east", "aws-east"]),
        ),
    ]
}

/// An object nested `depth` levels deep.
fn nested(depth: usize) -> Value {
    let mut deep = serde_json::json!("bottom");
    for _ in 0..depth {
        deep = serde_json::json!({ "d": deep });
    }
    deep
}

/// The fields the corpus breaks, as JSON pointers into a valid Bundle.
const HOSTILE_FIELDS: [&str; 15] = [
    "/spec/replicas",
    "/spec/pools",
    "/spec/jobs",
    "/spec/jobs/0/jobName",
    "/spec/jobs/0/requirements/requiredCapacity",
    "/spec/jobs/0/requirements/requiredCores",
    "/spec/jobs/0/requirements/priorityBand",
    "/spec/jobs/0/requirements/requiredCapabilities",
    "/spec/jobs/0/coLocateWith",
    "/spec/jobs/0/separateFrom",
    "/spec/jobs/0/config",
    "/spec/replicaOverrides",
    "/spec/bands",
    "/spec/interReplicaPlacement",
    "/metadata/annotations",
];

fn valid_bundle(name: &str) -> Value {
    serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Bundle",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": 1, "pools": ["aws-east"], "jobs": [
            {"jobName": "enc", "requirements": {"requiredCapacity": 5, "requiredCores": 1, "priorityBand": "silver"}},
            {"jobName": "pkg", "requirements": {"requiredCapacity": 5, "requiredCores": 1, "priorityBand": "silver"}}
        ]}
    })
}

/// Sets `pointer` in `doc` (creating the last key of an object), leaving `doc` alone when the
/// parent does not exist.
fn set(doc: &mut Value, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').unwrap_or(("", pointer));
    match doc.pointer_mut(parent) {
        Some(Value::Object(m)) => {
            m.insert(key.to_owned(), value);
        }
        Some(Value::Array(a)) => {
            if let Some(slot) = key.parse::<usize>().ok().and_then(|i| a.get_mut(i)) {
                *slot = value;
            }
        }
        _ => {}
    }
}

/// The corpus: every hostile value in every field, names at and past the length limits, and
/// contradictions; `(label, object)`.
fn hostile_corpus() -> Vec<(String, Value)> {
    let mut corpus = Vec::new();
    let values = hostile_values();
    for (f, field) in HOSTILE_FIELDS.iter().enumerate() {
        for (v, (label, value)) in values.iter().enumerate() {
            let mut b = valid_bundle(&format!("hostile-{f:02}-{v:02}"));
            set(&mut b, field, value.clone());
            corpus.push((format!("{field}={label}"), b));
        }
    }
    for len in [63, 64, 200, 240, 250, 253, 254, 300] {
        let name = format!("n{}", "a".repeat(len - 1));
        corpus.push((format!("name of {len} bytes"), valid_bundle(&name)));
    }
    let contradictions: [(&str, &str, Value); 8] = [
        (
            "colocate-and-separate",
            "/spec/jobs/0/coLocateWith",
            serde_json::json!(["pkg"]),
        ),
        (
            "colocate-self",
            "/spec/jobs/0/coLocateWith",
            serde_json::json!(["enc"]),
        ),
        (
            "colocate-unknown",
            "/spec/jobs/0/coLocateWith",
            serde_json::json!(["nope"]),
        ),
        (
            "duplicate-job-names",
            "/spec/jobs/1/jobName",
            serde_json::json!("enc"),
        ),
        (
            "override-of-a-missing-replica",
            "/spec/replicaOverrides",
            serde_json::json!([{"replica": 5, "pools": ["aws-east"]}]),
        ),
        (
            "pool-that-does-not-exist",
            "/spec/pools",
            serde_json::json!(["atlantis"]),
        ),
        (
            "capability-nobody-has",
            "/spec/jobs/0/requirements/requiredCapabilities",
            serde_json::json!(["quantum"]),
        ),
        ("unknown-field", "/spec/surprise", serde_json::json!(true)),
    ];
    for (i, (label, field, value)) in contradictions.into_iter().enumerate() {
        let mut b = valid_bundle(&format!("contra-{i:02}"));
        set(&mut b, field, value);
        if label == "colocate-and-separate" {
            set(
                &mut b,
                "/spec/jobs/0/separateFrom",
                serde_json::json!(["pkg"]),
            );
        }
        corpus.push((label.to_owned(), b));
    }
    corpus
}

/// How the stack answered one hostile object.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
enum Answer {
    /// Accepted, then Stalled=True with a reason and a message.
    Stalled,
    /// Accepted and valid after all: placed.
    Placed,
}

/// Creates each object of `corpus` with `kubectl create`; returns the accepted ones, how many
/// were refused, and the refusals that were not clear (empty, or an internal error).
async fn create_each(
    stack: &Stack,
    corpus: &[(String, Value)],
) -> (Vec<(String, Value)>, usize, Vec<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut accepted = Vec::new();
    let mut unclear = Vec::new();
    let mut refused = 0;
    for (i, (label, object)) in corpus.iter().enumerate() {
        let path = dir.path().join(format!("{i}.json"));
        std::fs::write(&path, object.to_string()).unwrap();
        let out = stack
            .env
            .run_kubectl(["create", "-f", path.to_str().unwrap()])
            .await
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        if out.success() {
            accepted.push((label.clone(), object.clone()));
            continue;
        }
        refused += 1;
        if unclear_refusal(&out.stderr) {
            let err = out.stderr.trim();
            unclear.push(format!("{label}: {}", &err[..err.len().min(300)]));
        }
    }
    (accepted, refused, unclear)
}

/// A generated corpus of hostile Bundles, each created with kubectl: each must be refused with
/// a clear error or answered in its status (Stalled with a message, or placed when it is valid
/// after all); the operator keeps running and a valid Bundle created first is untouched.
#[tokio::test]
async fn hostile_input() {
    let mut stack = suite_stack().await;
    apply_example_pools(&stack).await.unwrap();
    let anchor = valid_bundle("anchor");
    apply(&stack, &anchor.to_string()).await;
    stack
        .wait_bundle_phase("default", "anchor", "Ready", WAIT)
        .await
        .unwrap();
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let corpus = hostile_corpus();
    assert!(corpus.len() >= 300, "{} objects", corpus.len());
    let (accepted, refused, unclear) = create_each(&stack, &corpus).await;
    let accepted: Vec<(String, String)> = accepted
        .into_iter()
        .map(|(label, o)| (label, o["metadata"]["name"].as_str().unwrap().to_owned()))
        .collect();
    assert!(
        unclear.is_empty(),
        "unclear refusals:\n{}",
        unclear.join("\n")
    );
    assert!(
        stack.operator.running(),
        "the operator exited:\n{}",
        stack.operator.log_text()
    );
    eprintln!(
        "hostile-input: {} objects, {refused} refused, {} accepted",
        corpus.len(),
        accepted.len()
    );

    // Every accepted one gets an answer in its status. Read with a JSONPath, field by field:
    // an accepted config may nest deeper than a JSON parser's recursion limit.
    let answers = stack
        .wait_for("every accepted hostile object answered", WAIT, || async {
            let mut answers = Vec::new();
            let mut waiting = Vec::new();
            for (label, name) in &accepted {
                let out = stack
                    .env
                    .run_kubectl([
                        "get",
                        "bundle",
                        name,
                        "-n",
                        "default",
                        "-o",
                        r#"jsonpath={.status.phase}|{.status.conditions[?(@.type=="Stalled")].status}|{.status.conditions[?(@.type=="Stalled")].reason}|{.status.conditions[?(@.type=="Stalled")].message}"#,
                    ])
                    .await?;
                let fields: Vec<&str> = out.stdout.splitn(4, '|').collect();
                match fields.as_slice() {
                    [_, "True", reason, message] if !reason.is_empty() && !message.is_empty() => {
                        answers.push((label.clone(), Answer::Stalled, (*reason).to_owned()));
                    }
                    ["Ready", ..] => answers.push((label.clone(), Answer::Placed, String::new())),
                    _ => waiting.push(format!("{label}: {}", out.stdout.trim())),
                }
            }
            if waiting.is_empty() {
                Ok(Some(answers))
            } else {
                Err(automanager_e2e::SetupError(format!(
                    "{} unanswered, e.g. {:?}",
                    waiting.len(),
                    &waiting[..waiting.len().min(10)]
                )))
            }
        })
        .await
        .unwrap();
    let count = |a: Answer| answers.iter().filter(|(_, x, _)| *x == a).count();
    eprintln!(
        "hostile-input: answers refused={refused} stalled={} placed={}",
        count(Answer::Stalled),
        count(Answer::Placed)
    );
    for (label, a, reason) in &answers {
        eprintln!("  accepted {label}: {a:?} {reason}");
    }

    // The operator kept running and the valid Bundle was not touched: same node, one start.
    stack.wait_operator_ready(WAIT).await.unwrap();
    let b = stack
        .get_json(&["bundle", "anchor", "-n", "default"])
        .await
        .unwrap();
    assert_eq!(b["status"]["phase"], "Ready", "{b:#}");
    let mut admin = sim_admin(&stack.sim_endpoint).await.unwrap();
    for job in ["enc", "pkg"] {
        let h = admin
            .job_history(JobHistoryRequest {
                job_id: format!("default.anchor/0/{job}"),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(h.starts.len(), 1, "the anchor's {job} was restarted");
        assert_eq!(h.gaps, 0, "the anchor's {job} stopped running");
    }
    // Deleting them leaves nothing behind in Manager (the checker counts orphans).
    let mut args = vec![
        "delete",
        "bundle",
        "-n",
        "default",
        "--wait=true",
        "--timeout=120s",
    ];
    args.extend(accepted.iter().map(|(_, n)| n.as_str()));
    kubectl(&stack, &args).await;
    let since = Instant::now();
    finish(&stack, monitor, "hostile-input", since).await;
}

/// A Bundle whose job config nests 200 levels deep: the apiserver accepts it, and it must get
/// an answer in its status like any other.
#[tokio::test]
async fn hostile_deep_config() {
    let stack = suite_stack().await;
    apply_example_pools(&stack).await.unwrap();
    let mut b = valid_bundle("deep");
    set(&mut b, "/spec/jobs/0/config", nested(200));
    apply(&stack, &b.to_string()).await;
    stack
        .wait_for("the deep Bundle answered", WAIT, || async {
            let out = stack
                .env
                .run_kubectl([
                    "get",
                    "bundle",
                    "deep",
                    "-n",
                    "default",
                    "-o",
                    r#"jsonpath={.status.conditions[?(@.type=="Stalled")].status}"#,
                ])
                .await?;
            Ok((out.stdout.trim() == "True").then_some(()))
        })
        .await
        .unwrap();
    let reason = stack
        .env
        .run_kubectl([
            "get",
            "bundle",
            "deep",
            "-n",
            "default",
            "-o",
            r#"jsonpath={.status.conditions[?(@.type=="Stalled")].reason}|{.metadata.managedFields[*].fieldsV1}"#,
        ])
        .await
        .unwrap();
    assert!(
        reason.stdout.starts_with("InvalidConfig|"),
        "{}",
        reason.stdout
    );
    // The apiserver's field sets do not mirror the config's nesting (it is tracked as one value).
    assert!(!reason.stdout.contains(r#""f:d""#), "{}", reason.stdout);
    // The Bundle watch still decodes: a Bundle created afterwards is placed.
    apply(&stack, &valid_bundle("after-deep").to_string()).await;
    stack
        .wait_bundle_phase("default", "after-deep", "Ready", WAIT)
        .await
        .unwrap();
}

/// A stack whose sim keeps its state in `state_dir` and listens on a fixed loopback port, so it
/// can be killed and started again where the operator expects it.
async fn stack_with_restartable_sim(state_dir: &Path) -> Stack {
    let listen = format!("127.0.0.1:{}", free_port().unwrap());
    Stack::start_custom(
        &automanager_e2e::repo_root().join("deploy/demo/manager-sim.yaml"),
        &[
            "--state-dir",
            state_dir.to_str().unwrap(),
            "--listen",
            &listen,
        ],
        suite_settings,
    )
    .await
    .expect("stack")
}

/// The job ids (`<bundle>/<replica>/<job>`) with a running normal instance in Manager now.
async fn running_jobs(stack: &Stack) -> BTreeSet<String> {
    let state = manager_state(&stack.sim_endpoint).await.unwrap();
    let (_, jobs, _) = manager_facts(&state);
    jobs.iter()
        .filter(|j| {
            j.instances
                .iter()
                .any(|i| i.normal && i.state == reliability::InstanceState::Running)
        })
        .map(|j| format!("{}/{}/{}", j.bundle_id, j.replica, j.job_name))
        .collect()
}

/// How many instances of `job_id` the (restarted) sim has started.
async fn starts_or_none(stack: &Stack, job_id: &str) -> usize {
    let mut admin = sim_admin(&stack.sim_endpoint).await.unwrap();
    match admin
        .job_history(JobHistoryRequest {
            job_id: job_id.to_owned(),
        })
        .await
    {
        Ok(h) => h.into_inner().starts.len(),
        Err(s) if s.code() == tonic::Code::NotFound => 0,
        Err(s) => panic!("job history of {job_id}: {s}"),
    }
}

/// A wave of N bundles in four chunks; after the first has settled the second is applied and
/// the sim is `kill -9`ed mid-reconcile; the third is applied while it is down; it comes back
/// on the same address, with its state directory as it was (`wipe: false`) or emptied (`wipe:
/// true`: a Manager that lost everything but its fixed nodes); the fourth follows.
///
/// With the state kept, the jobs that ran before the kill keep running where they were: the
/// restarted sim never starts them again. With it wiped, the operator places every Bundle's
/// jobs again (it owns the desired state; Manager's is rebuilt from the Bundles). Both: the
/// invariants hold throughout and once settled.
async fn sim_restart(scenario: &str, seed: u64, wipe: bool) {
    let mut rng = Rng(seed);
    let state = tempfile::tempdir().unwrap();
    let state_dir = state.path().join("sim-state");
    let mut stack = stack_with_restartable_sim(&state_dir).await;
    apply_example_pools(&stack).await.unwrap();
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let n = wave_size();
    let chunk = n.div_ceil(4);
    let bands = ["gold", "silver", "bronze"];
    let prefix = if wipe { "wiped" } else { "kept" };
    apply(&stack, &wave(prefix, 0, chunk, &mut rng, &bands)).await;
    let (v, took) = settle(&stack, SETTLE).await.unwrap();
    assert!(v.is_clean(), "before the kill ({took:?}):\n{}", v.details());
    let before = running_jobs(&stack).await;
    // Past the sim's periodic state write (every 250 ms): what ran before is on disk.
    tokio::time::sleep(Duration::from_millis(600)).await;

    apply(&stack, &wave(prefix, chunk, chunk, &mut rng, &bands)).await;
    tokio::time::sleep(Duration::from_millis(rng.range(200, 1500))).await;
    stack.sim.kill9();
    let killed = Instant::now();
    // Work that arrives while Manager is gone.
    apply(&stack, &wave(prefix, 2 * chunk, chunk, &mut rng, &bands)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    stack
        .restart_sim(wipe.then_some(state_dir.as_path()))
        .unwrap();
    let restarted = Instant::now();
    eprintln!(
        "{scenario}: the sim was down {:.1}s; {} jobs ran before the kill",
        restarted.duration_since(killed).as_secs_f64(),
        before.len()
    );
    let rest = n.saturating_sub(3 * chunk);
    if rest > 0 {
        apply(&stack, &wave(prefix, 3 * chunk, rest, &mut rng, &bands)).await;
    }
    let (mut v, _) = settle(&stack, SETTLE).await.unwrap();
    let took = restarted.elapsed();
    // The monitor's Watch lived through the restart: how it resumed, and whether its mirror
    // still agrees with Manager (what it judged while the faults ran came from that mirror).
    for l in monitor.stream_log() {
        eprintln!("{scenario}: monitor watch {l}");
    }
    match monitor.drift().await {
        Ok(d) if d.is_empty() => eprintln!("{scenario}: the monitor's mirror agrees with Manager"),
        Ok(d) => d.iter().for_each(|l| eprintln!("{scenario}: {l}")),
        Err(e) => eprintln!("{scenario}: the monitor's mirror not compared: {e}"),
    }
    v.merge(&monitor.stop().await.0);
    if let Some(job) = v.lost.iter().next() {
        print_log_lines(&stack, job.split(':').next().unwrap_or_default());
    }
    report(scenario, &v, took);

    // What became of the jobs that ran before the kill.
    let mut started_again = 0;
    for job in &before {
        if starts_or_none(&stack, job).await > 0 {
            started_again += 1;
        }
    }
    let nodes = stack.get_json(&["managernodes"]).await.unwrap();
    let state = manager_state(&stack.sim_endpoint).await.unwrap();
    let live_nodes = state
        .nodes
        .values()
        .filter(|n| n.state() != manager_client::proto::NodeState::Terminated)
        .count();
    eprintln!(
        "{scenario}: {started_again} of {} jobs that ran before the kill were started again; {} ManagerNode objects, {live_nodes} live nodes in Manager",
        before.len(),
        nodes["items"].as_array().map_or(0, Vec::len),
    );
    if wipe {
        assert_eq!(
            started_again,
            before.len(),
            "every job Manager forgot is placed again"
        );
    } else {
        assert_eq!(
            started_again, 0,
            "with its state kept, Manager still runs them: none is placed again"
        );
    }
}

/// The sim killed mid-wave and restarted with its state directory as it was.
#[tokio::test]
async fn sim_restart_kept() {
    sim_restart("sim-restart-kept", 0x0A11_0006, false).await;
}

/// The sim killed mid-wave and restarted with its state directory emptied.
#[tokio::test]
async fn sim_restart_wiped() {
    sim_restart("sim-restart-wiped", 0x0A11_0007, true).await;
}

/// Does what a Deployment's kubelet does when the operator has exited: records how, and starts
/// it again. Returns the exit status, if it had exited.
async fn revive_operator(stack: &mut Stack) -> Option<std::process::ExitStatus> {
    let status = stack.operator.exit_status()?;
    restart_operator(stack).await;
    Some(status)
}

/// Applies chunk `c` of a wave of `n` (four chunks) named `<prefix>-NNNN`.
async fn apply_chunk(stack: &Stack, prefix: &str, c: usize, n: usize, rng: &mut Rng) {
    let chunk = n.div_ceil(4);
    let start = c * chunk;
    let count = chunk.min(n.saturating_sub(start));
    if count > 0 {
        apply(
            stack,
            &wave(prefix, start, count, rng, &["gold", "silver", "bronze"]),
        )
        .await;
    }
}

/// The end of an apiserver scenario: settles, adds the monitor's samples and reports, failing
/// also on `failure`, when the operator exited again or not all `n` Bundles of the wave exist.
async fn finish_wave(
    stack: &mut Stack,
    monitor: Monitor,
    scenario: &str,
    n: usize,
    since: Instant,
    failure: Option<String>,
) {
    let (mut v, _) = settle(stack, SETTLE).await.unwrap();
    let took = since.elapsed();
    v.merge(&monitor.stop().await.0);
    let left = stack.get_json(&["bundles", "-n", "default"]).await.unwrap();
    let count = left["items"].as_array().map_or(0, Vec::len);
    let died_again = stack
        .operator
        .exit_status()
        .map(|s| format!("the operator exited again ({s})"));
    let missing = (count != n).then(|| format!("{count} of {n} Bundles exist"));
    report_with(scenario, &v, took, failure.or(died_again).or(missing));
}

/// The sim's count of Manager calls served, per RPC, since it started.
async fn manager_calls(stack: &Stack) -> BTreeMap<String, u64> {
    let mut admin = sim_admin(&stack.sim_endpoint).await.unwrap();
    admin
        .call_counts(CallCountsRequest {})
        .await
        .unwrap()
        .into_inner()
        .calls
        .into_iter()
        .collect()
}

/// The calls that asked Manager to change something between two counts, per RPC: every RPC but
/// the reads of either API (`ListNodes`, `ListPools`, `Watch`; the published `JobSearch`,
/// `EventStream` and `CreateStatusChannel`; our extension's `Describe` and `Watch`; and
/// `MigrationGetState` of both, which the sim's own `mutating` sum counts but which changes
/// nothing).
fn mutating_between(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    const READS: [&str; 10] = [
        "ListNodes",
        "ListPools",
        "Watch",
        "MigrationGetState",
        "norsk.api.manager/JobSearch",
        "norsk.api.manager/EventStream",
        "norsk.api.manager/CreateStatusChannel",
        "automanager.manager.extension.v1/Describe",
        "automanager.manager.extension.v1/Watch",
        "automanager.manager.extension.v1/MigrationGetState",
    ];
    after
        .iter()
        .filter(|(rpc, _)| !READS.contains(&rpc.as_str()))
        .map(|(rpc, n)| {
            (
                rpc.clone(),
                n.saturating_sub(*before.get(rpc).unwrap_or(&0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// kube-apiserver paused (SIGSTOP) mid-wave for more than twice the operator's lease, then
/// resumed (SIGCONT); etcd keeps running. The operator cannot renew its lease meanwhile: its
/// write fence closes when the lease runs out, and once it sees it lost leadership it exits
/// (status 1) for a fresh process to take over; the test restarts it as a Deployment would.
/// Once its lease has run out it asks Manager to change nothing (the sim's call counts, read
/// twice in the pause), the invariants hold throughout (Manager is never written twice for one
/// job) and every Bundle settles.
#[tokio::test]
async fn apiserver_pause() {
    const LEASE_S: u64 = 6;
    const PAUSE: Duration = Duration::from_secs(15);
    let mut rng = Rng(0x0A11_0008);
    let mut stack = Stack::start_with(|c| {
        suite_settings(c);
        c.insert(
            "leaderElection".into(),
            serde_json::json!({"enabled": true, "leaseNamespace": "default",
                "leaseDuration": format!("{LEASE_S}s"), "renewEvery": "2s"}),
        );
    })
    .await
    .expect("stack");
    apply_example_pools(&stack).await.unwrap();
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let n = wave_size();
    apply_chunk(&stack, "pause", 0, n, &mut rng).await;
    apply_chunk(&stack, "pause", 1, n, &mut rng).await;
    // Mid-reconcile: the second chunk is being placed when the apiserver freezes.
    tokio::time::sleep(Duration::from_millis(rng.range(200, 1500))).await;
    stack.env.pause_apiserver().unwrap();
    let paused = Instant::now();
    let at_pause = manager_calls(&stack).await;
    // A fenced operator makes no Manager call that changes anything. Its fence closes at its
    // last renewal (before the pause) plus the lease minus 1 s; 2 s more let a call it had
    // already sent be served. From then until the resume it cannot be leader.
    tokio::time::sleep(Duration::from_secs(LEASE_S + 2)).await;
    let fence_closed = paused.elapsed();
    let fenced_from = manager_calls(&stack).await;
    tokio::time::sleep(PAUSE.saturating_sub(paused.elapsed())).await;
    let fenced_until = manager_calls(&stack).await;
    let fence_checked = paused.elapsed();
    stack.env.resume_apiserver().unwrap();
    let resumed = Instant::now();
    eprintln!(
        "apiserver-pause: the apiserver was paused {:.1}s (lease {LEASE_S}s)",
        resumed.duration_since(paused).as_secs_f64()
    );
    let before_fence = mutating_between(&at_pause, &fenced_from);
    let fenced = mutating_between(&fenced_from, &fenced_until);
    let fenced_calls: u64 = fenced.values().sum();
    eprintln!(
        "apiserver-pause: mutating Manager calls in the pause before the lease ran out (0 to {:.1}s): {before_fence:?}; while it had run out ({:.1}s to {:.1}s): {fenced_calls} {fenced:?}",
        fence_closed.as_secs_f64(),
        fence_closed.as_secs_f64(),
        fence_checked.as_secs_f64(),
    );
    println!("reliability apiserver-pause fenced_manager_calls={fenced_calls}");
    let fence_broken = (fenced_calls > 0).then(|| {
        format!(
            "the operator made {fenced_calls} mutating Manager calls between {:.1}s and {:.1}s of the pause, after its {LEASE_S}s lease had run out: {fenced:?}",
            fence_closed.as_secs_f64(),
            fence_checked.as_secs_f64(),
        )
    });
    // The operator notices the lost lease at its next renewal after the resume.
    let mut exits = Vec::new();
    while resumed.elapsed() < Duration::from_secs(LEASE_S + 10) {
        if let Some(s) = revive_operator(&mut stack).await {
            exits.push(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stack.wait_operator_ready(WAIT).await.unwrap();
    let back = Instant::now();
    eprintln!(
        "apiserver-pause: the operator {} ({:.1}s after the resume it is ready)",
        match exits.first() {
            Some(s) => format!("exited ({s}) and was started again"),
            None => "kept running".to_owned(),
        },
        back.duration_since(resumed).as_secs_f64()
    );
    apply_chunk(&stack, "pause", 2, n, &mut rng).await;
    apply_chunk(&stack, "pause", 3, n, &mut rng).await;
    finish_wave(
        &mut stack,
        monitor,
        "apiserver-pause",
        n,
        resumed,
        fence_broken,
    )
    .await;
}

/// kube-apiserver killed (SIGKILL) mid-wave and started again on the same port and etcd: every
/// watch of the operator breaks and its lease cannot be renewed until the apiserver is back.
/// The invariants hold throughout and every Bundle settles; if the restart outlasts the lease
/// the operator exits and is started again, as a Deployment would.
#[tokio::test]
async fn apiserver_restart() {
    let mut rng = Rng(0x0A11_0009);
    let mut stack = suite_stack().await;
    apply_example_pools(&stack).await.unwrap();
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let n = wave_size();
    apply_chunk(&stack, "apirestart", 0, n, &mut rng).await;
    apply_chunk(&stack, "apirestart", 1, n, &mut rng).await;
    tokio::time::sleep(Duration::from_millis(rng.range(200, 1500))).await;
    let killed = Instant::now();
    stack.env.restart_apiserver(WAIT).await.unwrap();
    let restarted = Instant::now();
    eprintln!(
        "apiserver-restart: the apiserver was back {:.1}s after the kill",
        restarted.duration_since(killed).as_secs_f64()
    );
    apply_chunk(&stack, "apirestart", 2, n, &mut rng).await;
    // Long enough for a lost lease (15 s by default) to show as an exit.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let exited = revive_operator(&mut stack).await;
    eprintln!(
        "apiserver-restart: the operator {}",
        match exited {
            Some(s) => format!("exited ({s}) and was started again"),
            None => "kept running".to_owned(),
        }
    );
    apply_chunk(&stack, "apirestart", 3, n, &mut rng).await;
    finish_wave(&mut stack, monitor, "apiserver-restart", n, restarted, None).await;
}

/// A wave placed while a third of the nodes in use are cordoned (the first of them drained:
/// its jobs are moved away by Migrations) and another busy node is killed, so its jobs recover
/// elsewhere while the cordons hold. No instance may start on a cordoned node after its cordon
/// (beyond the slack for a start already in flight), and the invariants hold.
#[tokio::test]
async fn cordon() {
    let mut rng = Rng(0x0A11_0011);
    let stack = suite_stack().await;
    apply_example_pools(&stack).await.unwrap();
    let monitor = Monitor::start_on(&stack).await.unwrap();
    let cordons = monitor.cordons();
    let n = wave_size();
    apply_chunk(&stack, "cordon", 0, n, &mut rng).await;
    let (v, took) = settle(&stack, SETTLE).await.unwrap();
    assert!(
        v.is_clean(),
        "before the cordons ({took:?}):\n{}",
        v.details()
    );
    apply_chunk(&stack, "cordon", 1, n, &mut rng).await;
    // Mid-reconcile: the second chunk is being placed when the cordons land.
    tokio::time::sleep(Duration::from_millis(rng.range(200, 1500))).await;

    // The nodes that run jobs or are coming up for them, and have their ManagerNode object.
    let state = manager_state(&stack.sim_endpoint).await.unwrap();
    let (nodes, jobs, _) = manager_facts(&state);
    let objects = stack.get_json(&["managernodes"]).await.unwrap();
    let object_of: BTreeMap<String, String> = objects["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            let name = o["metadata"]["name"].as_str().unwrap_or_default();
            (node_cordon(name, o).0, name.to_owned())
        })
        .collect();
    let load = |id: &str| {
        jobs.iter()
            .filter(|j| {
                j.instances
                    .iter()
                    .any(|i| i.node_id == id && i.state != reliability::InstanceState::Ended)
            })
            .count()
    };
    let mut candidates: Vec<&str> = nodes
        .iter()
        .filter(|n| !n.terminated && object_of.contains_key(&n.id))
        .filter(|n| load(&n.id) > 0 || !n.started)
        .map(|n| n.id.as_str())
        .collect();
    candidates.sort_unstable();
    for i in (1..candidates.len()).rev() {
        candidates.swap(i, rng.range(0, i as u64) as usize);
    }
    assert!(
        candidates.len() >= 4,
        "too few nodes in use to cordon some and kill another: {candidates:?}"
    );
    let (cordoned, rest) = candidates.split_at(candidates.len() / 3);
    let victim = rest
        .iter()
        .copied()
        .filter(|id| nodes.iter().any(|n| n.id == *id && n.started))
        .max_by_key(|id| (load(id), *id))
        .expect("a started node to kill")
        .to_owned();
    let drained = cordoned[0];
    eprintln!(
        "cordon: cordoning {cordoned:?} ({drained} drained with Migrations) of {} nodes in use; killing {victim} ({} jobs)",
        candidates.len(),
        load(&victim)
    );
    let patches = cordoned.iter().map(|id| {
        let name = &object_of[*id];
        let patch = if *id == drained {
            r#"{"spec":{"drain":{"mode":"migrate"}}}"#
        } else {
            r#"{"spec":{"cordoned":true}}"#
        };
        let cordons = cordons.clone();
        let stack = &stack;
        async move {
            patch_node(stack, name, patch).await;
            // The cordon is surely in place once the apiserver answered.
            cordons.note(id, true, reliability::now_ms());
        }
    });
    futures::future::join_all(patches).await;

    let mut admin = sim_admin(&stack.sim_endpoint).await.unwrap();
    admin
        .kill_node(KillNodeRequest {
            node_id: victim.clone(),
        })
        .await
        .unwrap();
    let killed = Instant::now();
    let killed_ms = reliability::now_ms();
    // More work arrives while the cordons hold.
    apply_chunk(&stack, "cordon", 2, n, &mut rng).await;
    apply_chunk(&stack, "cordon", 3, n, &mut rng).await;
    // The drain ends with the node emptied and terminated (its object may be gone by then).
    stack
        .wait_for(&format!("the drain of {drained}"), SETTLE, || async {
            let done = match stack.get_json(&["managernode", &object_of[drained]]).await {
                Ok(n) => {
                    n["status"]["drain"]["completedAt"].is_string()
                        && n["status"]["state"] != "started"
                }
                Err(_) => {
                    let state = manager_state(&stack.sim_endpoint).await?;
                    state
                        .nodes
                        .get(drained)
                        .is_none_or(|n| n.state() == manager_client::proto::NodeState::Terminated)
                }
            };
            Ok(done.then_some(()))
        })
        .await
        .unwrap();

    let v = finish(&stack, monitor, "cordon", killed).await;
    assert!(v.placed_after_cordon.is_empty());
    // Every job that had an instance on the killed node is accounted for: its normal instance
    // started again on another node, or its band dropped it (its Bundle's status says
    // `dropped`), or what died there was only a migration target (the drain's; its job runs on
    // at its source or moves again).
    let mut fates: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for j in jobs.iter().filter(|j| {
        j.instances
            .iter()
            .any(|i| i.node_id == victim && i.state != reliability::InstanceState::Ended)
    }) {
        let id = format!("{}/{}/{}", j.bundle_id, j.replica, j.job_name);
        let normal_there = j.instances.iter().any(|i| {
            i.node_id == victim && i.normal && i.state != reliability::InstanceState::Ended
        });
        let started_elsewhere = job_starts(&stack, &id).await.iter().any(|s| {
            s.at_ms >= killed_ms
                && s.node_id != victim
                && s.role() != manager_client::proto::JobRole::MigrationTarget
        });
        let name = j.bundle_id.strip_prefix("default.").unwrap_or(&j.bundle_id);
        let b = stack
            .get_json(&["bundle", name, "-n", "default"])
            .await
            .unwrap();
        let state = b["status"]["replicas"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["replica"] == j.replica)
            .flat_map(|r| r["jobs"].as_array().into_iter().flatten())
            .find(|x| x["jobName"] == j.job_name.as_str())
            .and_then(|x| x["state"].as_str())
            .unwrap_or("none")
            .to_owned();
        let fate = if !normal_there {
            "migrationTargetOnly"
        } else if state == "dropped" {
            "dropped"
        } else if started_elsewhere {
            "restarted"
        } else {
            "unaccounted"
        };
        fates
            .entry(fate)
            .or_default()
            .push(format!("{id} ({state})"));
    }
    let count = |f: &str| fates.get(f).map_or(0, Vec::len);
    eprintln!(
        "cordon: {} jobs had an instance on the killed node: {} started again elsewhere, {} dropped by their band, {} only a migration target there, {} unaccounted {:?}",
        fates.values().map(Vec::len).sum::<usize>(),
        count("restarted"),
        count("dropped"),
        count("migrationTargetOnly"),
        count("unaccounted"),
        fates.get("unaccounted"),
    );
    assert_eq!(
        count("unaccounted"),
        0,
        "jobs of the killed node neither restarted, dropped nor only moving there: {fates:?}"
    );
    // The scenario placed something while the cordons held.
    assert!(
        count("restarted") > 0,
        "no job of the killed node was placed again during the cordons"
    );
}

/// How many migration targets Manager ever started for `job_id` (the sim's history).
async fn migration_targets(stack: &Stack, job_id: &str) -> usize {
    job_starts(stack, job_id)
        .await
        .iter()
        .filter(|s| s.role() == manager_client::proto::JobRole::MigrationTarget)
        .count()
}

/// A stack on the patient sim with 40 calm Bundles and `n` handover Bundles `<prefix>-<i>` on
/// the fixed pool, each Ready, whose source answers `cutover-ready` only after 3 s, and every job
/// of the calm ones running. The temporary directory holds the sim's config and must live as
/// long as the stack.
async fn slow_handover_stack(mut rng: Rng, prefix: &str, n: usize) -> (Stack, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let sim_config = automanager_e2e::stack::patient_sim_config(dir.path()).unwrap();
    let stack = Stack::start_custom(&sim_config, &[], suite_settings)
        .await
        .expect("stack");
    apply_example_pools(&stack).await.unwrap();
    // A calm wave beside them, so the migrations are not the only work.
    apply(
        &stack,
        &wave("beside", 0, 40, &mut rng, &["gold", "silver"]),
    )
    .await;
    let mut bundles = String::new();
    for i in 0..n {
        bundles.push_str(&format!(
            "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: {prefix}-{i}, namespace: default}}\nspec:\n  replicas: 1\n  pools: [onprem]\n  jobs:\n    - jobName: enc\n      requirements: {{requiredCapacity: 10, requiredCores: 1, priorityBand: silver}}\n      migration: {{strategy: handover}}\n---\n"
        ));
    }
    apply(&stack, &bundles).await;
    for i in 0..n {
        stack
            .wait_bundle_phase("default", &format!("{prefix}-{i}"), "Ready", WAIT)
            .await
            .unwrap();
        stack
            .chaos(&[
                "migration-behaviour",
                &format!("default.{prefix}-{i}/0/enc"),
                "slow-cutover",
                "3000",
            ])
            .unwrap();
    }
    // The calm wave is on elastic pools: its jobs start once their nodes are up, after the
    // handover Bundles on the fixed pool are Ready. A scenario that counts every job's starts
    // must not begin before they have all started (a job never started has no history yet).
    let (v, took) = settle(&stack, SETTLE).await.unwrap();
    assert!(
        v.is_clean(),
        "the calm wave did not settle in {took:?}:\n{}",
        v.details()
    );
    (stack, dir)
}

/// Pairs of Migrations of one job, each pair created together in one request, while the jobs'
/// handovers are slow (the source answers `cutover-ready` only after 3 s): exactly one of each
/// pair proceeds and completes, the older one (ties go to the name that sorts first), and the
/// other is `Rejected` with reason `ConcurrentMigration` naming the first; Manager starts exactly
/// one migration target per job; the invariants hold throughout.
#[tokio::test]
async fn migration_race() {
    const PAIRS: usize = 6;
    let (stack, _dir) = slow_handover_stack(Rng(0x0A11_000A), "race", PAIRS).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    // Both of a pair in one request: the apiserver gives them the same creation second.
    let mut migrations = String::new();
    for i in 0..PAIRS {
        // Alternate which name sorts first, so the winner is not always the first document.
        let (a, b) = if i % 2 == 0 { ("a", "b") } else { ("b", "a") };
        for side in [a, b] {
            migrations.push_str(&format!(
                "apiVersion: automanager.norsk.io/v1alpha1\nkind: Migration\nmetadata: {{name: race-{i}-{side}, namespace: default}}\nspec:\n  job: {{bundle: race-{i}, replica: 0, jobName: enc}}\n---\n"
            ));
        }
    }
    apply(&stack, &migrations).await;
    let created = Instant::now();
    let mut failures = Vec::new();
    for i in 0..PAIRS {
        let pair: Vec<Value> = stack
            .wait_for(&format!("pair race-{i} decided"), WAIT, || async {
                let mut pair = Vec::new();
                for side in ["a", "b"] {
                    let m = stack
                        .get_json(&["migration", &format!("race-{i}-{side}"), "-n", "default"])
                        .await?;
                    pair.push(m);
                }
                let ended = |m: &Value| {
                    m["status"]["phase"] == "Completed"
                        || m["status"]["phase"] == "Rejected"
                        || m["status"]["phase"] == "Aborted"
                        || m["status"]["phase"] == "Failed"
                };
                Ok(pair.iter().all(ended).then_some(pair))
            })
            .await
            .unwrap();
        let key = |m: &Value| {
            (
                m["metadata"]["creationTimestamp"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                m["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        };
        let (first, second) = if key(&pair[0]) <= key(&pair[1]) {
            (&pair[0], &pair[1])
        } else {
            (&pair[1], &pair[0])
        };
        let first_name = first["metadata"]["name"].as_str().unwrap_or_default();
        let rejected = condition(second, "Rejected");
        let phases = format!(
            "{}={} {}={}",
            first_name,
            first["status"]["phase"],
            second["metadata"]["name"],
            second["status"]["phase"]
        );
        eprintln!(
            "migration-race: {phases}; {}: {}",
            rejected["reason"], rejected["message"]
        );
        if first["status"]["phase"] != "Completed"
            || second["status"]["phase"] != "Rejected"
            || rejected["reason"] != "ConcurrentMigration"
            || !rejected["message"]
                .as_str()
                .is_some_and(|m| m.contains(first_name))
        {
            failures.push(format!("race-{i}: {phases}, rejected condition {rejected}"));
        }
        // Manager started one target for the job: the one migration that proceeded.
        let targets = migration_targets(&stack, &format!("default.race-{i}/0/enc")).await;
        if targets != 1 {
            failures.push(format!(
                "race-{i}: Manager started {targets} migration targets"
            ));
        }
    }
    let decided = created.elapsed();
    eprintln!(
        "migration-race: {PAIRS} pairs decided {:.1}s after they were created",
        decided.as_secs_f64()
    );
    let (mut v, took) = settle(&stack, SETTLE).await.unwrap();
    v.merge(&monitor.stop().await.0);
    report_with(
        "migration-race",
        &v,
        took,
        (!failures.is_empty()).then(|| failures.join("\n")),
    );
}

/// The phase of each Migration `<prefix><i>` in namespace default, in order of name.
async fn migration_phases(
    stack: &Stack,
    prefix: &str,
) -> Result<Vec<String>, automanager_e2e::SetupError> {
    let list = stack.get_json(&["migrations", "-n", "default"]).await?;
    let mut phases: Vec<(String, String)> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let name = m["metadata"]["name"].as_str()?;
            name.starts_with(prefix).then(|| {
                let phase = m["status"]["phase"].as_str().unwrap_or_default();
                (name.to_owned(), phase.to_owned())
            })
        })
        .collect();
    phases.sort();
    Ok(phases.into_iter().map(|(_, p)| p).collect())
}

/// Handover migrations in flight when the operator is `kill -9`ed: the sources answer
/// `cutover-ready` only after 3 s, the kill lands while at least two migrations are past their
/// target's start and before their cutover, and a new operator takes them over.
#[tokio::test]
async fn handover_kill() {
    const JOBS: usize = 6;
    let (mut stack, _dir) = slow_handover_stack(Rng(0x0A11_000D), "moving", JOBS).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let mut migrations = String::new();
    for i in 0..JOBS {
        migrations.push_str(&format!(
            "apiVersion: automanager.norsk.io/v1alpha1\nkind: Migration\nmetadata: {{name: moving-{i}, namespace: default}}\nspec:\n  job: {{bundle: moving-{i}, replica: 0, jobName: enc}}\n---\n"
        ));
    }
    apply(&stack, &migrations).await;
    // Migrations of one source node wait for each other, so they do not all run at once: the
    // kill lands when at least two are mid-handover (past the target's start, before the
    // source stopped its output), whatever the others are doing.
    let mid = ["StartingTarget", "TargetReady", "CutoverReady"];
    let phases = stack
        .wait_for("two migrations mid-handover", WAIT, || async {
            let phases = migration_phases(&stack, "moving-").await?;
            let n = phases.iter().filter(|p| mid.contains(&p.as_str())).count();
            Ok((n >= 2).then_some(phases))
        })
        .await
        .unwrap();
    eprintln!("handover-kill: killing the operator at phases {phases:?}");
    stack.operator.kill9();
    restart_operator(&mut stack).await;
    let restarted = Instant::now();
    let mut failures = Vec::new();
    let ended = ["Completed", "Aborted", "Failed"];
    let finals = stack
        .wait_for("every migration ended after the restart", WAIT, || async {
            let finals = migration_phases(&stack, "moving-").await?;
            Ok(finals
                .iter()
                .all(|p| ended.contains(&p.as_str()))
                .then_some(finals))
        })
        .await
        .unwrap();
    eprintln!(
        "handover-kill: phases {finals:?} {:.1}s after the restart",
        restarted.elapsed().as_secs_f64()
    );
    // What Manager recorded: a handover it completed moved the job, whatever the operator saw of
    // it, so its Migration must say `Completed` (not `Aborted`, not `Failed`).
    let manager = manager_state(&stack.sim_endpoint).await.unwrap();
    let mut manager_completed = 0;
    for (i, phase) in finals.iter().enumerate() {
        let m = stack
            .get_json(&["migration", &format!("moving-{i}"), "-n", "default"])
            .await
            .unwrap();
        eprintln!(
            "handover-kill: moving-{i} {phase}: {}",
            serde_json::to_string(&m["status"]["conditions"]).unwrap_or_default()
        );
        let job_id = format!("default.moving-{i}/0/enc");
        let completed_by_manager = manager.migrations.values().any(|mg| {
            mg.job_id == job_id && mg.phase() == manager_client::proto::MigrationPhase::Completed
        });
        if completed_by_manager {
            manager_completed += 1;
            if phase != "Completed" {
                failures.push(format!(
                    "moving-{i} {phase}, though Manager completed its handover"
                ));
            }
        }
        if phase == "Failed" {
            failures.push(format!(
                "moving-{i} Failed: a handover resumed by a new operator must complete or abort"
            ));
        }
        // The new operator took the migration over: Manager started no second target.
        let targets = migration_targets(&stack, &format!("default.moving-{i}/0/enc")).await;
        if targets != 1 {
            failures.push(format!(
                "moving-{i}: Manager started {targets} migration targets"
            ));
        }
    }
    eprintln!(
        "handover-kill: Manager completed {manager_completed} of {JOBS} handovers; the operator says Completed for {}",
        finals.iter().filter(|p| *p == "Completed").count()
    );
    let (mut v, _) = settle(&stack, SETTLE).await.unwrap();
    let took = restarted.elapsed();
    v.merge(&monitor.stop().await.0);
    report_with(
        "handover-kill",
        &v,
        took,
        (!failures.is_empty()).then(|| failures.join("\n")),
    );
}

/// One generated object per (field, hostile value): `base` with `field` set to the value,
/// named `<prefix>-<field index>-<value index>`; `(label, object)`.
fn corpus_of(prefix: &str, base: &Value, fields: &[&str]) -> Vec<(String, Value)> {
    let values = hostile_values();
    let mut corpus = Vec::new();
    for (f, field) in fields.iter().enumerate() {
        for (v, (label, value)) in values.iter().enumerate() {
            let mut o = base.clone();
            o["metadata"]["name"] = Value::String(format!("{prefix}-{f:02}-{v:02}"));
            set(&mut o, field, value.clone());
            corpus.push((format!("{prefix} {field}={label}"), o));
        }
    }
    corpus
}

/// Whether a refusal is clear: it says something, and not that something broke inside.
fn unclear_refusal(err: &str) -> bool {
    let err = err.trim();
    err.is_empty() || err.contains("Internal error") || err.contains("panic")
}

/// A hostile-input corpus for the other kinds: Migrations (of a Bundle that is not the anchor),
/// PlacementPools, HotSpareTargets (on a pool the anchor does not use), merge patches of a
/// ManagerNode's spec and annotations, and operator config files checked with
/// `automanager-operator config check`. Each is refused with a clear error or answered in its
/// status (the operator observed its generation and set a phase or a condition with a reason);
/// config files get exit 0 or 2 with a message, never a crash. The operator keeps running and a
/// valid Bundle created first keeps its one start.
#[tokio::test]
async fn hostile_objects() {
    let mut stack = suite_stack().await;
    apply_example_pools(&stack).await.unwrap();
    apply(&stack, &valid_bundle("anchor").to_string()).await;
    let mut victim = valid_bundle("victim");
    set(&mut victim, "/spec/pools", serde_json::json!(["onprem"]));
    apply(&stack, &victim.to_string()).await;
    for b in ["anchor", "victim"] {
        stack
            .wait_bundle_phase("default", b, "Ready", WAIT)
            .await
            .unwrap();
    }
    // It watches the ManagerNode objects: the node patches below cordon and uncordon one.
    let monitor = Monitor::start_on(&stack).await.unwrap();

    let migration = serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Migration",
        "metadata": {"name": "m", "namespace": "default"},
        "spec": {"job": {"bundle": "victim", "replica": 0, "jobName": "enc"}, "strategy": "overlap",
            "targetNode": "onprem-b1", "abort": false}
    });
    let pool = serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "PlacementPool",
        "metadata": {"name": "p"},
        "spec": {"kind": "aws", "region": "eu-west-1", "zones": ["eu-west-1a"], "packingStrategy": "binpack",
            "scaleOut": "elastic", "maxNodes": 2,
            "candidateInstanceTypes": [{"instanceType": "m5.xlarge", "totalCapacity": 100, "totalCores": 16, "capabilities": []}]}
    });
    let spares = serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "HotSpareTarget",
        "metadata": {"name": "s"},
        "spec": {"pool": "aws-west", "targetCount": 1, "forBand": "gold",
            "spec": {"instanceType": "m5.xlarge", "region": "us-west-2"}, "maxAge": "24h"}
    });
    let mut corpus = corpus_of(
        "hm",
        &migration,
        &[
            "/spec/job",
            "/spec/job/bundle",
            "/spec/job/replica",
            "/spec/job/jobName",
            "/spec/strategy",
            "/spec/targetNode",
            "/spec/abort",
        ],
    );
    corpus.extend(corpus_of(
        "hp",
        &pool,
        &[
            "/spec/kind",
            "/spec/region",
            "/spec/zones",
            "/spec/packingStrategy",
            "/spec/scaleOut",
            "/spec/maxNodes",
            "/spec/candidateInstanceTypes",
            "/spec/candidateInstanceTypes/0/totalCapacity",
        ],
    ));
    corpus.extend(corpus_of(
        "hs",
        &spares,
        &[
            "/spec/pool",
            "/spec/targetCount",
            "/spec/forBand",
            "/spec/spec",
            "/spec/spec/instanceType",
            "/spec/maxAge",
        ],
    ));
    let dir = tempfile::tempdir().unwrap();
    let (accepted, mut refused, mut unclear) = create_each(&stack, &corpus).await;
    let accepted: Vec<(String, String, String)> = accepted
        .into_iter()
        .map(|(label, o)| {
            let kind = o["kind"].as_str().unwrap().to_lowercase();
            (
                label,
                kind,
                o["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();

    // ManagerNode patches, on an on-prem node the anchor does not use.
    let node = "onprem-a2";
    let mut patched = 0;
    for field in [
        "/spec/cordoned",
        "/spec/drain",
        "/spec/drain/mode",
        "/spec",
        "/metadata/annotations",
    ] {
        for (label, value) in hostile_values() {
            let mut patch = if field == "/spec/drain/mode" {
                serde_json::json!({"spec": {"drain": {}}})
            } else {
                serde_json::json!({"spec": {}, "metadata": {}})
            };
            set(&mut patch, field, value);
            let path = dir.path().join("patch.json");
            std::fs::write(&path, patch.to_string()).unwrap();
            let out = stack
                .env
                .run_kubectl([
                    "patch",
                    "managernode",
                    node,
                    "--type",
                    "merge",
                    "--patch-file",
                    path.to_str().unwrap(),
                ])
                .await
                .unwrap();
            if out.success() {
                patched += 1;
            } else {
                refused += 1;
                if unclear_refusal(&out.stderr) {
                    unclear.push(format!(
                        "managernode {field}={label}: {}",
                        &out.stderr[..out.stderr.len().min(300)]
                    ));
                }
            }
        }
    }
    assert!(
        unclear.is_empty(),
        "unclear refusals:\n{}",
        unclear.join("\n")
    );
    assert!(
        stack.operator.running(),
        "the operator exited:\n{}",
        stack.operator.log_text()
    );
    eprintln!(
        "hostile-objects: {} objects and {} node patches; {refused} refused, {} objects and {patched} patches accepted",
        corpus.len(),
        5 * hostile_values().len(),
        accepted.len()
    );

    // Every accepted object is answered in its status; what is not by the deadline is a failure,
    // reported once the rest has run.
    let deadline = Instant::now() + WAIT;
    let (answers, unanswered) = loop {
        let mut answers = Vec::new();
        let mut waiting = Vec::new();
        for (label, kind, name) in &accepted {
            let mut args = vec!["get", kind.as_str(), name.as_str()];
            if kind == "migration" {
                args.extend(["-n", "default"]);
            }
            args.extend([
                "-o",
                "jsonpath={.metadata.generation}|{.status.observedGeneration}|{.status.phase}|{range .status.conditions[*]}{.type}={.status}:{.reason};{end}",
            ]);
            let out = stack.env.run_kubectl(&args).await.unwrap();
            let fields: Vec<&str> = out.stdout.splitn(4, '|').collect();
            match fields.as_slice() {
                [generation, observed, phase, conditions]
                    if generation == observed
                        && (!phase.is_empty() || conditions.contains(':')) =>
                {
                    answers.push(format!("{label}: {phase} {conditions}"));
                }
                _ => waiting.push(format!("{label} ({name}): {}", out.stdout.trim())),
            }
        }
        if waiting.is_empty() || Instant::now() > deadline {
            break (answers, waiting);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    for a in &answers {
        eprintln!("  accepted {a}");
    }
    let n = stack.get_json(&["managernode", node]).await.unwrap();
    eprintln!(
        "hostile-objects: {node} after the patches: generation {} observed {} spec {}",
        n["metadata"]["generation"], n["status"]["observedGeneration"], n["spec"]
    );

    // Operator config files.
    let operator = automanager_e2e::stack::binaries().unwrap().operator.clone();
    let config = serde_json::json!({
        "manager": {"url": "http://127.0.0.1:6789", "connectTimeout": "5s", "idleTimeout": "15s"},
        "leaderElection": {"enabled": true, "leaseNamespace": "default", "leaseDuration": "15s", "renewEvery": "5s"},
        "http": {"bindAddress": "127.0.0.1:8080"},
        "bands": {"gold": {"onFailure": "restart", "maxRestartsPerHour": 6}},
        "concurrency": {"bundles": 8},
        "migration": {"drainParallelism": 2, "phaseTimeout": "60s"},
        "nodeHealth": {"rejectionThreshold": 5, "rejectionWindow": "60s"},
        "orphanSweep": {"enabled": true, "grace": "5m"},
        "statusWriteInterval": "100ms",
        "watchNamespaces": ["default"]
    });
    let configs = corpus_of(
        "config",
        &config,
        &[
            "/manager",
            "/manager/url",
            "/manager/connectTimeout",
            "/leaderElection/leaseDuration",
            "/leaderElection/renewEvery",
            "/leaderElection/leaseNamespace",
            "/http/bindAddress",
            "/bands/gold",
            "/bands/gold/maxRestartsPerHour",
            "/concurrency/bundles",
            "/migration/phaseTimeout",
            "/nodeHealth/rejectionThreshold",
            "/statusWriteInterval",
            "/watchNamespaces",
        ],
    );
    let (mut config_ok, mut config_refused, mut config_bad) = (0, 0, Vec::new());
    for (label, mut c) in configs {
        if let Some(m) = c.as_object_mut() {
            m.remove("metadata");
        }
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, c.to_string()).unwrap();
        let out = std::process::Command::new(&operator)
            .args(["config", "check", "--no-file-checks"])
            .arg(&path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        match out.status.code() {
            Some(0) => config_ok += 1,
            Some(2) if !unclear_refusal(&err) && err.contains("invalid") => config_refused += 1,
            _ => config_bad.push(format!(
                "{label}: {:?} {}",
                out.status.code(),
                &err[..err.len().min(300)]
            )),
        }
    }
    eprintln!(
        "hostile-objects: config files: {config_ok} valid, {config_refused} refused with exit 2"
    );
    assert!(
        config_bad.is_empty(),
        "config check answered unclearly:\n{}",
        config_bad.join("\n")
    );

    // The operator kept running and the anchor was not touched: one start, never stopped.
    stack.wait_operator_ready(WAIT).await.unwrap();
    let mut admin = sim_admin(&stack.sim_endpoint).await.unwrap();
    for job in ["enc", "pkg"] {
        let h = admin
            .job_history(JobHistoryRequest {
                job_id: format!("default.anchor/0/{job}"),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(h.starts.len(), 1, "the anchor's {job} was restarted");
        assert_eq!(h.gaps, 0, "the anchor's {job} stopped running");
    }
    let since = Instant::now();
    let (mut v, _) = settle(&stack, SETTLE).await.unwrap();
    v.merge(&monitor.stop().await.0);
    let failure = (!unanswered.is_empty()).then(|| {
        format!(
            "{} accepted objects never got a status within {WAIT:?}:\n{}",
            unanswered.len(),
            unanswered.join("\n")
        )
    });
    report_with("hostile-objects", &v, since.elapsed(), failure);
}

/// The operator's resident memory in KiB, from `/proc/<pid>/status`; the mean of three samples
/// a second apart.
async fn operator_rss_kib(stack: &Stack) -> u64 {
    let pid = stack.operator.pid().unwrap();
    let mut sum = 0;
    for _ in 0..3 {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        sum += status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap();
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    sum / 3
}

/// The soak's length after warm-up: `RELIABILITY_SOAK_S`, default 600 s.
fn soak_time() -> Duration {
    Duration::from_secs(env_or("RELIABILITY_SOAK_S", 600) as u64)
}

/// The soak's warm-up: `RELIABILITY_SOAK_WARM_UP_S`, default 420 s. It outlasts every cache
/// whose size follows time rather than the fleet: the Event recorder (kube-runtime's, as
/// client-go's) keeps each published Event for 6 minutes to count repeats into a series, so the
/// operator's memory rises with the Event rate for the first 6 minutes of any steady churn and
/// then holds. Memory measured from an earlier point shows that fill, not a leak.
fn soak_warm_up() -> Duration {
    Duration::from_secs(env_or("RELIABILITY_SOAK_WARM_UP_S", 420) as u64)
}

/// Events in the cluster now (the operator's are nearly all of them in the soak).
async fn events_now(stack: &Stack) -> usize {
    let out = stack
        .env
        .run_kubectl(&["get", "events.events.k8s.io", "-A", "-o", "name"])
        .await
        .unwrap();
    assert!(out.success(), "kubectl get events: {}", out.stderr);
    out.stdout.lines().count()
}

/// One round of the soak: `soak-race` created and deleted at once (a create/delete race on one
/// name), and a tenth of the base wave (rotating) deleted and created again.
async fn soak_round(stack: &Stack, round: usize, base: usize, rng: &mut Rng) {
    apply(stack, &wave_bundle("soak-race", rng, &["gold", "silver"])).await;
    kubectl(
        stack,
        &[
            "delete",
            "bundle",
            "soak-race",
            "-n",
            "default",
            "--wait=false",
        ],
    )
    .await;
    let tenth = base / 10;
    let churn: Vec<String> = (0..tenth)
        .map(|i| format!("soak-{:04}", (round * tenth + i) % base))
        .collect();
    let mut args = vec!["delete", "bundle", "-n", "default", "--wait=true"];
    args.extend(churn.iter().map(String::as_str));
    kubectl(stack, &args).await;
    let again: String = churn
        .iter()
        .map(|name| wave_bundle(name, rng, &["gold", "silver", "bronze"]))
        .collect();
    apply(stack, &again).await;
}

/// A create/delete loop on one name plus 10 % churn of 100 Bundles per round, for
/// [`soak_warm_up`] and then [`soak_time`]: the operator's RSS at the end is within ±10 % of
/// its RSS after the warm-up, and the invariants hold throughout and once settled.
#[tokio::test]
#[ignore = "takes about 18 minutes (7 of warm-up, 10 of soak); make test-soak"]
async fn soak() {
    const BASE: usize = 100;
    let warm_up = soak_warm_up();
    let mut rng = Rng(0x0A11_000B);
    let stack = suite_stack().await;
    apply_example_pools(&stack).await.unwrap();
    apply(
        &stack,
        &wave("soak", 0, BASE, &mut rng, &["gold", "silver", "bronze"]),
    )
    .await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let started = Instant::now();
    let mut round = 0;
    let mut samples = Vec::new();
    let mut next_sample = Instant::now();
    while started.elapsed() < warm_up {
        soak_round(&stack, round, BASE, &mut rng).await;
        round += 1;
        if Instant::now() > next_sample {
            samples.push(operator_rss_kib(&stack).await);
            next_sample = Instant::now() + Duration::from_secs(30);
        }
    }
    eprintln!("soak: RSS samples during the warm-up (KiB): {samples:?}");
    let events_start = events_now(&stack).await;
    let rss_start = operator_rss_kib(&stack).await;
    let warm_rounds = round;
    let soaking = Instant::now();
    let mut samples = vec![rss_start];
    next_sample = Instant::now() + Duration::from_secs(30);
    while soaking.elapsed() < soak_time() {
        soak_round(&stack, round, BASE, &mut rng).await;
        round += 1;
        if Instant::now() > next_sample {
            samples.push(operator_rss_kib(&stack).await);
            next_sample = Instant::now() + Duration::from_secs(30);
        }
    }
    let rss_end = operator_rss_kib(&stack).await;
    samples.push(rss_end);
    let last = Instant::now();
    let events = events_now(&stack).await.saturating_sub(events_start);
    let change = (rss_end as f64 - rss_start as f64) / rss_start as f64;
    println!(
        "reliability soak rss_start_kib={rss_start} rss_end_kib={rss_end} change_pct={:.1} rounds={} warm_up_rounds={warm_rounds} warm_up_s={} soak_s={:.0} events_per_s={:.1}",
        change * 100.0,
        round - warm_rounds,
        warm_up.as_secs(),
        soaking.elapsed().as_secs_f64(),
        events as f64 / soaking.elapsed().as_secs_f64()
    );
    eprintln!("soak: RSS samples (KiB): {samples:?}");
    let (mut v, _) = settle(&stack, SETTLE).await.unwrap();
    let took = last.elapsed();
    v.merge(&monitor.stop().await.0);
    let grew = (change.abs() > 0.10).then(|| {
        format!(
            "the operator's RSS went from {rss_start} KiB to {rss_end} KiB ({:.1} %)",
            change * 100.0
        )
    });
    report_with("soak", &v, took, grew);
}

/// Where the sim's job socket listener is, from its log.
async fn job_socket_addr(stack: &Stack) -> std::net::SocketAddr {
    stack
        .wait_for("the sim's job socket address", WAIT, || async {
            Ok(stack.sim.log_text().lines().find_map(|l| {
                l.split_once("job socket listener bound on ")
                    .and_then(|(_, addr)| addr.trim().parse().ok())
            }))
        })
        .await
        .unwrap()
}

/// How many times Manager started a normal instance of each of the operator's jobs.
async fn normal_starts(stack: &Stack) -> std::collections::BTreeMap<String, usize> {
    let state = manager_state(&stack.sim_endpoint).await.unwrap();
    let mut out = std::collections::BTreeMap::new();
    for j in state.jobs.values() {
        let id = format!("{}/{}/{}", j.bundle_id, j.replica, j.job_name);
        let n = job_starts(stack, &id)
            .await
            .iter()
            .filter(|s| s.role() != manager_client::proto::JobRole::MigrationTarget)
            .count();
        out.insert(id, n);
    }
    out
}

/// Rounds of `per_round` silent TCP connections from 127.0.0.9 to the job socket, each round
/// held for 2 s and then dropped, until `stop`; the last round is kept and returned.
fn flood_until(
    addr: std::net::SocketAddr,
    per_round: usize,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<(usize, Vec<tokio::net::TcpStream>)> {
    tokio::spawn(async move {
        let mut rounds = 0;
        loop {
            let held = automanager_e2e::hostile_peers::flood([127, 0, 0, 9], addr, per_round).await;
            rounds += 1;
            tokio::time::sleep(Duration::from_secs(2)).await;
            if *stop.borrow() {
                return (rounds, held);
            }
        }
    })
}

/// What a held flood connection got: `Some(answer)` once the listener refused or closed it.
async fn flood_answer(stream: &mut tokio::net::TcpStream) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    match tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await {
        Ok(_) => Some(String::from_utf8_lossy(&answer).into_owned()),
        Err(_) => None,
    }
}

/// Hostile peers beside the operator: a rogue gRPC client sends a corpus of malformed,
/// oversized and out-of-range requests to Manager (on ids the operator does not use), and
/// hostile WebSocket clients and rounds of 1,500 silent connections from one address hit the job
/// socket listener while three handover Migrations run over it. Every request and connection
/// gets a clear answer; an unknown instance and a wrong token get the same one; the operator
/// keeps running; the handovers complete; no valid Bundle's job is started again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_peers() {
    use automanager_e2e::hostile_peers::{SocketAnswer, hostile_client, rogue_grpc, socket_corpus};
    const JOBS: usize = 3;
    let (mut stack, _dir) = slow_handover_stack(Rng(0x0A11_000E), "peer", JOBS).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let addr = job_socket_addr(&stack).await;
    let starts_before = normal_starts(&stack).await;
    let mut failures = Vec::new();

    // The rogue gRPC client.
    let tally = rogue_grpc(&stack.sim_endpoint).await.unwrap();
    eprintln!(
        "hostile-peers: gRPC: {} refused with a clear status, {} accepted ({:?}), {} unclear",
        tally.refused,
        tally.accepted.len(),
        tally.accepted,
        tally.unclear.len()
    );
    failures.extend(
        tally
            .unclear
            .iter()
            .map(|u| format!("unclear gRPC answer: {u}")),
    );

    // The flood starts, the handovers start under it, the hostile clients come in between.
    let (stop_flood, stop) = tokio::sync::watch::channel(false);
    let flood = flood_until(addr, 1_500, stop);
    let mut migrations = String::new();
    for i in 0..JOBS {
        migrations.push_str(&format!(
            "apiVersion: automanager.norsk.io/v1alpha1\nkind: Migration\nmetadata: {{name: peer-{i}, namespace: default}}\nspec:\n  job: {{bundle: peer-{i}, replica: 0, jobName: enc}}\n---\n"
        ));
    }
    apply(&stack, &migrations).await;
    let mut answers = Vec::new();
    for (what, path, frames) in socket_corpus("default.peer-0/0/enc") {
        let answer = hostile_client(addr, &path, frames).await;
        eprintln!("hostile-peers: {what}: {answer:?}");
        let clear = match &answer {
            SocketAnswer::Closed(code, reason) => (4000..5000).contains(code) && !reason.is_empty(),
            SocketAnswer::Refused(status) => !status.is_empty(),
            SocketAnswer::Nothing => false,
        };
        if !clear {
            failures.push(format!("job socket, {what}: no clear answer ({answer:?})"));
        }
        answers.push((what, answer));
    }
    let answer_of = |what: &str| {
        answers
            .iter()
            .find(|(w, _)| w == what)
            .map(|(_, a)| a.clone())
    };
    if answer_of("an unknown instance") != answer_of("a live instance, wrong token") {
        failures.push(format!(
            "an unknown instance and a wrong token are answered differently: {:?} / {:?}",
            answer_of("an unknown instance"),
            answer_of("a live instance, wrong token")
        ));
    }
    let phases = stack
        .wait_for("every handover ended under the flood", WAIT, || async {
            let phases = migration_phases(&stack, "peer-").await?;
            let ended = ["Completed", "Aborted", "Failed", "Rejected"];
            Ok(
                (phases.len() == JOBS && phases.iter().all(|p| ended.contains(&p.as_str())))
                    .then_some(phases),
            )
        })
        .await
        .unwrap();
    stop_flood.send(true).unwrap();
    let (rounds, mut last) = flood.await.unwrap();
    let answers = futures::future::join_all(last.iter_mut().map(flood_answer)).await;
    let (mut refused, mut closed, mut hanging) = (0, 0, 0);
    for a in answers {
        match a {
            Some(a) if a.starts_with("HTTP/1.1 503") => refused += 1,
            Some(_) => closed += 1,
            None => hanging += 1,
        }
    }
    eprintln!(
        "hostile-peers: flood: {rounds} rounds of 1500; the last ({} connected): {refused} refused with 503, {closed} closed by the listener, {hanging} left open; migrations {phases:?}",
        last.len()
    );
    // One peer gets at most its cap (1,024) at once: the rest of a round is refused.
    if refused == 0 {
        failures.push("no flood connection was refused: the per-peer cap did not hold".to_owned());
    }
    if hanging > 0 {
        failures.push(format!(
            "{hanging} flood connections were neither refused nor closed"
        ));
    }
    if phases.iter().any(|p| p != "Completed") {
        failures.push(format!("the handovers under the flood ended {phases:?}"));
    }
    if !stack.operator.running() {
        failures.push("the operator exited".to_owned());
    }
    let started_again: Vec<String> = normal_starts(&stack)
        .await
        .into_iter()
        .filter(|(id, n)| starts_before.get(id).is_some_and(|b| b != n))
        .map(|(id, n)| format!("{id}: {n} starts"))
        .collect();
    if !started_again.is_empty() {
        failures.push(format!("jobs started again: {started_again:?}"));
    }
    let since = Instant::now();
    let (mut v, _) = settle(&stack, SETTLE).await.unwrap();
    v.merge(&monitor.stop().await.0);
    report_with(
        "hostile-peers",
        &v,
        since.elapsed(),
        (!failures.is_empty()).then(|| failures.join("\n")),
    );
}

/// One Bundle of the `load` scenario: 2 replicas of `enc` and `pkg` (3-12 capacity, 1 core),
/// gold or silver, on one or two of the three fleet pools. The first pools are picked in
/// proportion to the pools' sizes (5 : 3 : 2), so every pool is about as full as the fleet (60 %
/// of its capacity at full size) and a Bundle limited to one pool finds room there.
fn load_bundle(name: &str, rng: &mut Rng) -> String {
    let pools = rng.pick(&[
        "[la]", "[la]", "[la, lb]", "[la, lc]", "[la, lb]", "[lb]", "[lb, la]", "[lb, lc]", "[lc]",
        "[lc, la]",
    ]);
    let mut jobs = String::new();
    for job in ["enc", "pkg"] {
        jobs.push_str(&format!(
            "    - jobName: {job}\n      requirements: {{requiredCapacity: {}, requiredCores: 1, priorityBand: {}}}\n",
            rng.range(3, 12),
            rng.pick(&["gold", "silver"])
        ));
    }
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  replicas: 2\n  pools: {pools}\n  jobs:\n{jobs}---\n"
    )
}

/// A positive whole number from the environment, or `default`.
fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(default)
}

/// A fleet-sized load: 2,000 Bundles of 2 replicas × 2 jobs (8,000 jobs) over 1,000 sim nodes
/// in three fixed pools, applied in chunks of 250; once settled, a tenth of them deleted (their
/// finalizers waited for) and created again with new requirements while one name is created and
/// deleted in a loop. `RELIABILITY_LOAD_BUNDLES` and `RELIABILITY_LOAD_NODES` change the size.
#[tokio::test]
async fn load() {
    use automanager_e2e::bench::{FleetPool, fleet_sim_config};
    let bundles = env_or("RELIABILITY_LOAD_BUNDLES", 2_000);
    let nodes = env_or("RELIABILITY_LOAD_NODES", 1_000).max(10);
    let mut rng = Rng(0x0A11_000F);
    let pools = [
        FleetPool::new("la", nodes / 2, 100, 16),
        FleetPool::new("lb", nodes * 3 / 10, 100, 16),
        FleetPool::new("lc", nodes - nodes / 2 - nodes * 3 / 10, 100, 16),
    ];
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("manager-sim.yaml");
    std::fs::write(&config, fleet_sim_config(&pools)).unwrap();
    let stack = Stack::start_custom(&config, &["--no-job-socket"], suite_settings)
        .await
        .expect("stack");
    for p in &pools {
        apply(&stack, &p.placement_pool("spread")).await;
    }
    for p in &pools {
        stack
            .wait_for(&format!("pool {} with its nodes", p.name), WAIT, || async {
                let obj = stack.get_json(&["placementpool", &p.name]).await?;
                Ok((obj["status"]["nodeCount"].as_u64() == Some(p.nodes as u64)).then_some(()))
            })
            .await
            .unwrap();
    }
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let name = |i: usize| format!("load-{i:05}");
    let started = Instant::now();
    for start in (0..bundles).step_by(250) {
        let chunk: String = (start..(start + 250).min(bundles))
            .map(|i| load_bundle(&name(i), &mut rng))
            .collect();
        apply(&stack, &chunk).await;
    }
    let (v, _) = settle(&stack, SETTLE).await.unwrap();
    eprintln!(
        "load: {bundles} Bundles over {nodes} nodes settled {:.1} s after the first create ({})",
        started.elapsed().as_secs_f64(),
        if v.is_clean() { "clean" } else { "NOT clean" }
    );
    explain_lost(&stack, &v).await;

    // Churn: a create/delete race on one name beside a tenth deleted and created again.
    let race_yaml = load_bundle("load-race", &mut Rng(0x0A11_0010));
    let race = async {
        for _ in 0..20 {
            // Either may be refused (created while the last one is still being deleted): the
            // race is the point, not each step.
            let _ = stack.env.apply_yaml(&race_yaml).await;
            let _ = stack
                .env
                .run_kubectl([
                    "delete",
                    "bundle",
                    "load-race",
                    "-n",
                    "default",
                    "--wait=false",
                ])
                .await;
        }
    };
    let churned: Vec<String> = (0..bundles).step_by(10).map(name).collect();
    let churn = async {
        let mut delete = vec!["delete", "bundle", "-n", "default"];
        delete.extend(churned.iter().map(String::as_str));
        kubectl(&stack, &delete).await;
        let again: String = churned.iter().map(|n| load_bundle(n, &mut rng)).collect();
        apply(&stack, &again).await;
    };
    tokio::join!(race, churn);
    // The race's last word was a delete: wait for it to be gone before judging orphans.
    stack
        .wait_for("load-race deleted", WAIT, || async {
            let out = stack
                .env
                .run_kubectl([
                    "get",
                    "bundle",
                    "load-race",
                    "-n",
                    "default",
                    "--ignore-not-found",
                    "-o",
                    "name",
                ])
                .await
                .map_err(|e| automanager_e2e::SetupError(e.to_string()))?;
            Ok(out.stdout.trim().is_empty().then_some(()))
        })
        .await
        .unwrap();
    eprintln!(
        "load: {} deleted and created again, 20 create/delete races",
        churned.len()
    );
    let since = Instant::now();
    let (mut v, _) = settle(&stack, SETTLE).await.unwrap();
    let took = since.elapsed();
    v.merge(&monitor.stop().await.0);
    explain_lost(&stack, &v).await;
    report("load", &v, took);
}
