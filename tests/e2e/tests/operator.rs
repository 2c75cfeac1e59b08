//! The operator end to end: real apiserver + etcd, the manager-sim binary, the operator binary,
//! driven with kubectl as a user would.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use automanager_api::PriorityBand::{Bronze, Gold, Silver};
use automanager_api::{
    Bundle, BundlePhase, ConditionStatus, DrainMode, JobState, ManagerNode, PlacementOutcome,
    PlacementPool,
};
use automanager_e2e::scenario::{
    BundleManifest, BundleView, Conditions, EventView, JobManifest, bundle, job, show,
};
use automanager_e2e::stack::Stack;
use automanager_e2e::{SetupError, apply_example_pools, examples_dir};

async fn start() -> Stack {
    let stack = Stack::start().await.expect("stack");
    apply_example_pools(&stack).await.unwrap();
    stack
}

#[tokio::test]
async fn examples_become_ready_with_placements_and_traces() {
    let stack = Stack::start().await.expect("stack");
    let out = stack.env.apply_file(examples_dir()).await.unwrap();
    assert!(out.success(), "{}", out.stderr);

    for name in [
        "my-channel-1",
        "news-gold",
        "sports-silver",
        "preview-bronze",
    ] {
        stack.expect_ready(name).await;
    }
    let b = stack.bundle("my-channel-1").await;
    assert_eq!(b.placed_replicas(), 2, "{}", show(&b));
    let ready = b.condition("Ready");
    assert_eq!(ready.map(|c| c.status), Some(ConditionStatus::True));
    assert_eq!(
        ready.and_then(|c| c.observed_generation),
        b.metadata.generation
    );
    // Replica 0 prefers aws-east; replica 1's override puts it in oci-fra.
    assert_eq!(b.pool_of(0, "encode"), Some("aws-east"), "{}", show(&b));
    assert_eq!(b.pool_of(1, "encode"), Some("oci-fra"), "{}", show(&b));
    // coLocateWith: package shares encode's node; replicas never share a node (hard rule).
    for r in 0..2 {
        assert_eq!(b.node_of(r, "package"), b.node_of(r, "encode"));
        assert_eq!(b.state_of(r, "encode"), Some(JobState::Running));
        let trace = b.job(r, "encode").and_then(|j| j.last_placement.as_ref());
        assert!(
            trace.is_some_and(|t| matches!(
                t.outcome,
                PlacementOutcome::Placed | PlacementOutcome::Provisioning
            ) && !t.pools_tried.is_empty()),
            "{trace:#?}"
        );
    }
    assert_ne!(b.node_of(0, "encode"), b.node_of(1, "encode"));

    // The sports bundle needs sdi-capture: only the on-prem cluster has it; separateFrom keeps its jobs apart.
    let s = stack.bundle("sports-silver").await;
    assert_eq!(s.pool_of(0, "ingest"), Some("onprem"));
    assert_ne!(s.node_of(0, "ingest"), s.node_of(0, "encode"));

    // Every Manager node is mirrored as a ManagerNode, with its jobs (usage is written at most
    // every couple of seconds per node, so wait for it).
    let encode_node = b.node_of(0, "encode").unwrap().to_owned();
    stack
        .wait_until_list(
            "",
            "ManagerNodes with their jobs",
            |nodes: &[ManagerNode]| {
                let mirrored = nodes
                    .iter()
                    .filter_map(|n| n.status.as_ref())
                    .find(|s| s.node_id == encode_node);
                (nodes.len() >= 4
                    && mirrored.is_some_and(|s| {
                        s.jobs
                            .iter()
                            .any(|j| j.job_name.as_deref() == Some("encode"))
                            && s.used_capacity >= 10
                    }))
                .then_some(())
            },
        )
        .await;

    // The full trace is served by the operator's debugging API, and only there.
    let (code, _) = stack
        .http_get("/debug/trace/default/my-channel-1")
        .await
        .unwrap();
    assert_eq!(code, 404, "the probe port must not serve the debugging API");
    let trace = stack.debug_trace("my-channel-1").await;
    assert_eq!(trace.replicas.len(), 2, "{}", show(&trace));
    let (code, _) = stack.http_get("/debug/trace/default/nope").await.unwrap();
    assert_eq!(code, 404);

    // Pools report their figures; metrics are exposed.
    stack
        .wait_until("aws-east", "to report its nodes", |p: &PlacementPool| {
            p.status.as_ref().is_some_and(|s| s.node_count >= 1) && p.has_condition("Ready")
        })
        .await;
    let (code, metrics) = stack.http_get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("automanager_placements_succeeded_total"),
        "{metrics}"
    );
    assert!(metrics.contains("automanager_pool_nodes"), "{metrics}");
}

#[tokio::test]
async fn a_replica_spills_to_the_next_pool_when_the_first_cannot_take_it() {
    let stack = start().await;
    // Only aws-west has nvidia-gpu: onprem (first choice) is left, the replica spills.
    stack
        .create(&bundle(
            "gpu",
            1,
            &["onprem", "aws-west"],
            [job("infer", 50, Silver).needs(&["nvidia-gpu"])],
        ))
        .await;
    let b = stack.expect_ready("gpu").await;
    assert_eq!(b.pool_of(0, "infer"), Some("aws-west"), "{}", show(&b));
    let first_tried = b
        .job(0, "infer")
        .and_then(|j| j.last_placement.as_ref())
        .and_then(|t| t.pools_tried.first())
        .map(|p| p.pool.as_str());
    assert_eq!(first_tried, Some("onprem"), "{}", show(&b));
    stack.expect_event("gpu", "SpilledToPool", &[]).await;
}

#[tokio::test]
async fn a_replica_no_single_pool_can_take_is_split_across_pools_job_by_job() {
    let stack = start().await;
    // Only onprem has sdi-capture and only aws-west's g4dn type has nvidia-gpu: neither pool
    // can take the replica whole, so each job falls through the pool list on its own.
    stack
        .create(&bundle(
            "split",
            1,
            &["onprem", "aws-west"],
            [
                job("capture", 50, Silver).needs(&["sdi-capture"]),
                job("infer", 50, Silver).needs(&["nvidia-gpu"]),
            ],
        ))
        .await;
    let b = stack.expect_ready("split").await;
    assert_eq!(b.pool_of(0, "capture"), Some("onprem"), "{}", show(&b));
    assert_eq!(b.pool_of(0, "infer"), Some("aws-west"), "{}", show(&b));
    // The gpu job's trace is its own: onprem left (no node fits), aws-west took it.
    let tried: Vec<(String, String)> = b
        .job(0, "infer")
        .and_then(|j| j.last_placement.as_ref())
        .map(|t| {
            t.pools_tried
                .iter()
                .map(|p| (p.pool.clone(), p.reason.clone()))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        tried.first(),
        Some(&("onprem".to_owned(), "noNodeFits".to_owned())),
        "{}",
        show(&b)
    );
    assert_eq!(
        tried.last().map(|(p, _)| p.as_str()),
        Some("aws-west"),
        "{}",
        show(&b)
    );
    stack.expect_event("split", "SpilledToPool", &[]).await;
}

#[tokio::test]
async fn refused_starts_make_a_node_unhealthy_and_placement_avoids_it() {
    let stack = start().await;
    // The operator's default: five refusals within ten minutes make a node unhealthy. Binpack
    // keeps choosing the fullest on-prem node, so all five refusals land on the same one.
    stack.chaos(&["reject-next", "5"]).unwrap();
    stack
        .create(&bundle("picky", 1, &["onprem"], [job("enc", 10, Silver)]))
        .await;
    let b = stack.expect_ready("picky").await;
    let placed = b.node_of(0, "enc").unwrap().to_owned();
    let unhealthy: Vec<String> = stack
        .wait_until_list(
            "",
            "a ManagerNode with healthy: false",
            |nodes: &[ManagerNode]| {
                let names: Vec<String> = nodes
                    .iter()
                    .filter(|n| n.status.as_ref().is_some_and(|s| !s.healthy))
                    .filter_map(|n| n.metadata.name.clone())
                    .collect();
                (!names.is_empty()).then_some(names)
            },
        )
        .await;
    assert_eq!(unhealthy.len(), 1, "{unhealthy:?}");
    assert_ne!(unhealthy[0], placed, "placement avoided the unhealthy node");
    stack
        .expect_event(&unhealthy[0], "NodeUnhealthy", &[])
        .await;
}

#[tokio::test]
async fn a_full_fixed_pool_stalls_the_bundle_with_a_clear_reason() {
    let stack = start().await;
    // Three on-prem nodes of 200: three replicas of 150 fill them (different node, hard).
    stack
        .create(&bundle("fill", 3, &["onprem"], [job("big", 150, Silver)]))
        .await;
    stack.expect_ready("fill").await;
    stack
        .create(&bundle("late", 1, &["onprem"], [job("big", 150, Silver)]))
        .await;
    let b: Bundle = stack
        .wait_for_condition("late", "Stalled", ConditionStatus::True)
        .await;
    assert_eq!(
        b.condition_reason("Stalled"),
        Some("NoCapacity"),
        "{}",
        show(&b)
    );
    assert!(
        b.condition_message("Stalled")
            .is_some_and(|m| m.contains("cannot be placed")),
        "{}",
        show(&b)
    );
    assert_eq!(b.state_of(0, "big"), Some(JobState::Unplaceable));
    assert!(
        b.job(0, "big")
            .and_then(|j| j.last_placement.as_ref())
            .is_some_and(|t| !t.rejections.is_empty()),
        "{}",
        show(&b)
    );

    // Freeing capacity lets it place.
    stack.delete::<Bundle>("fill").await;
    stack.expect_ready("late").await;
}

#[tokio::test]
async fn a_killed_node_restarts_gold_and_silver_and_drops_bronze() {
    let stack = start().await;
    // Each band's job starts on-prem; killing their nodes sends gold and silver to aws-east.
    for (name, band) in [("g", Gold), ("s", Silver), ("b", Bronze)] {
        stack
            .create(&bundle(
                name,
                1,
                &["onprem", "aws-east"],
                [job("enc", 20, band)],
            ))
            .await;
    }
    let mut nodes = std::collections::HashMap::new();
    for n in ["g", "s", "b"] {
        let b = stack.expect_ready(n).await;
        nodes.insert(n, b.node_of(0, "enc").unwrap().to_owned());
    }
    // Kill every node any of them uses. The kills land one at a time, so cordon them all first:
    // otherwise a job recovered from the first kill may land on a node the next kill takes, and
    // restart twice.
    let mut killed: Vec<String> = nodes.values().cloned().collect();
    killed.sort();
    killed.dedup();
    for node in &killed {
        stack.cordon(node).await;
    }
    for node in &killed {
        stack.wait_cordoned(node, true).await;
    }
    for node in &killed {
        stack.chaos(&["kill-node", node]).unwrap();
    }
    for n in ["g", "s"] {
        let b = stack
            .wait_until(n, "to restart off the killed nodes", |b: &Bundle| {
                b.state_of(0, "enc") == Some(JobState::Running)
                    && !killed.iter().any(|k| b.node_of(0, "enc") == Some(k))
            })
            .await;
        assert_eq!(b.restarts_last_hour(0), Some(1), "{}", show(&b));
    }
    let b = stack
        .wait_until("b", "to drop its bronze job", |b: &Bundle| {
            b.state_of(0, "enc") == Some(JobState::Dropped)
        })
        .await;
    assert_eq!(b.phase(), Some(BundlePhase::Degraded));
    stack.expect_event("b", "JobDropped", &[]).await;
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("automanager_jobs_dropped_total") && !l.ends_with(" 0")),
        "{metrics}"
    );
}

/// Fails the job `default.<name>/0/enc` once and waits until it runs again, its replica's
/// `restart`th restart within the hour.
async fn fail_and_restart(stack: &Stack, name: &str, restart: i32) {
    stack
        .chaos(&["fail-job", &format!("default.{name}/0/enc")])
        .unwrap();
    stack
        .wait_until(
            name,
            &format!("to have restarted {restart} time(s)"),
            |b: &Bundle| {
                b.restarts_last_hour(0) == Some(restart)
                    && b.state_of(0, "enc") == Some(JobState::Running)
            },
        )
        .await;
}

#[tokio::test]
async fn too_many_restarts_break_the_bundle_until_the_retry_annotation() {
    let stack = start().await;
    stack
        .create(
            &bundle("flaky", 1, &["onprem"], [job("enc", 10, Gold)]).max_restarts_per_hour(Gold, 3),
        )
        .await;
    stack.expect_ready("flaky").await;
    // Three failures are restarted; the fourth breaks the bundle (more than maxRestartsPerHour = 3).
    for i in 1..=3 {
        fail_and_restart(&stack, "flaky", i).await;
    }
    stack.chaos(&["fail-job", "default.flaky/0/enc"]).unwrap();
    let b = stack.expect_phase("flaky", BundlePhase::Broken).await;
    assert!(b.has_condition("Broken"), "{}", show(&b));
    assert!(
        b.condition_message("Broken")
            .is_some_and(|m| m.contains("automanager.norsk.io/retry")),
        "{}",
        show(&b)
    );
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("automanager_broken_bundles ") && l.ends_with(" 1")),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("automanager_broken_bundle_info{")
                && l.contains("bundle=\"flaky\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );

    stack
        .kubectl(&[
            "annotate",
            "--overwrite",
            "bundle",
            "flaky",
            "-n",
            "default",
            "automanager.norsk.io/retry=1",
        ])
        .await;
    let b = stack.expect_ready("flaky").await;
    let last_retry = b.status.as_ref().and_then(|s| s.last_retry.as_deref());
    assert_eq!(last_retry, Some("1"), "{}", show(&b));
    assert_eq!(b.condition_status("Broken"), Some(ConditionStatus::False));
}

#[tokio::test]
async fn a_crash_loop_breaks_the_bundle_after_exactly_max_restarts_across_operator_kills() {
    let mut stack = start().await;
    stack
        .create(
            &bundle("crashy", 1, &["onprem"], [job("enc", 10, Gold)])
                .max_restarts_per_hour(Gold, 3),
        )
        .await;
    stack.expect_ready("crashy").await;
    for i in 1..=3 {
        fail_and_restart(&stack, "crashy", i).await;
        if i < 3 {
            // The count lives in the bundle's status, not only in the operator's memory.
            stack.operator.kill9();
            stack.start_operator().unwrap();
            stack
                .wait_operator_ready(Duration::from_secs(60))
                .await
                .unwrap();
        }
    }
    // The fourth failure is one more than maxRestartsPerHour = 3: Broken, not restarted.
    stack.chaos(&["fail-job", "default.crashy/0/enc"]).unwrap();
    let b = stack.expect_phase("crashy", BundlePhase::Broken).await;
    assert_eq!(b.restarts_last_hour(0), Some(3), "{}", show(&b));
    assert_eq!(
        b.replica(0).map(|r| r.restart_times.len()),
        Some(3),
        "{}",
        show(&b)
    );
    assert_eq!(b.state_of(0, "enc"), Some(JobState::Failed), "{}", show(&b));
}

#[tokio::test]
async fn a_cordoned_node_takes_no_new_placements_and_a_terminate_drain_recovers_its_jobs() {
    let stack = start().await;
    // Wait for the on-prem nodes to be mirrored, then cordon two of three.
    stack
        .wait_until("onprem-a1", "to be started", |n: &ManagerNode| {
            n.status
                .as_ref()
                .is_some_and(|s| s.state == automanager_api::NodeState::Started)
        })
        .await;
    for n in ["onprem-a1", "onprem-a2"] {
        stack.cordon(n).await;
    }
    // A replica-2 bundle needs two nodes (different node, hard): only one is schedulable.
    stack
        .create(&bundle("two", 2, &["onprem"], [job("enc", 10, Gold)]))
        .await;
    let b = stack
        .wait_until("two", "to stall on cordoned nodes", |b: &Bundle| {
            b.has_condition("Stalled") && b.placed_replicas() == 1
        })
        .await;
    for j in b.jobs().iter().filter(|j| j.state == JobState::Running) {
        assert_eq!(
            j.node_id.as_deref(),
            Some("onprem-b1"),
            "cordoned nodes must take nothing: {}",
            show(&b)
        );
    }
    let cordoned = stack.node("onprem-a1").await;
    assert!(cordoned.has_condition("Cordoned"), "{}", show(&cordoned));

    // Uncordon one: the second replica places there.
    stack.uncordon("onprem-a1").await;
    let b = stack.expect_ready("two").await;
    assert!(b.has_job_on("onprem-a1"), "{}", show(&b));

    // Drain onprem-a1 with terminate: its gold job recovers elsewhere (onprem-a2 is still cordoned, b1 has the other replica).
    stack.uncordon("onprem-a2").await;
    stack.drain("onprem-a1", DrainMode::Terminate).await;
    let b = stack.expect_ready_off("two", "onprem-a1").await;
    assert!(b.has_job_on("onprem-a2"), "{}", show(&b));
}

#[tokio::test]
async fn deleting_a_bundle_stops_its_jobs_in_manager() {
    let stack = start().await;
    stack
        .create(&bundle("short", 2, &["onprem"], [job("enc", 10, Silver)]))
        .await;
    let b = stack.expect_ready("short").await;
    let node = b.node_of(0, "enc").unwrap().to_owned();
    stack.delete::<Bundle>("short").await;
    stack
        .wait_until(&node, "to hold no job of the bundle", |n: &ManagerNode| {
            !n.status.as_ref().is_some_and(|s| {
                s.jobs
                    .iter()
                    .any(|j| j.bundle.as_deref() == Some("default/short"))
            })
        })
        .await;
}

#[tokio::test]
async fn a_restarted_operator_duplicates_nothing_and_loses_no_bundle() {
    let mut stack = start().await;
    let waves: Vec<Bundle> = (0..12)
        .map(|i| {
            bundle(
                &format!("wave-{i}"),
                2,
                &["onprem", "aws-east"],
                [job("enc", 10, Silver)],
            )
        })
        .collect();
    stack.create_all(&waves).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    stack.operator.stop(Duration::from_secs(5));
    stack.start_operator().unwrap();
    stack
        .wait_operator_ready(Duration::from_secs(60))
        .await
        .unwrap();
    for i in 0..12 {
        stack.expect_ready(&format!("wave-{i}")).await;
    }
    // Each job runs exactly once across every node (node statuses catch up within seconds).
    let ids = stack
        .wait_until_list(
            "",
            "24 wave jobs on the ManagerNodes",
            |nodes: &[ManagerNode]| {
                let mut ids: Vec<String> = nodes
                    .iter()
                    .filter_map(|n| n.status.as_ref())
                    .flat_map(|s| &s.jobs)
                    .map(|j| j.job_id.clone())
                    .filter(|id| id.starts_with("default.wave-"))
                    .collect();
                ids.sort();
                (ids.len() >= 24).then_some(ids)
            },
        )
        .await;
    let mut distinct = ids.clone();
    distinct.dedup();
    assert_eq!(distinct.len(), ids.len(), "a job runs twice: {ids:?}");
    assert_eq!(ids.len(), 24);
}

#[tokio::test]
async fn what_if_answers_admission_against_the_live_snapshot() {
    let stack = start().await;
    let probe = |pool: &str, capacity: i64| {
        serde_json::to_string(&bundle(
            "probe",
            1,
            &[pool],
            [job("j", capacity, Gold).cores(0)],
        ))
        .unwrap()
    };
    stack
        .wait_for(
            "the on-prem pool to be loaded",
            Duration::from_secs(120),
            || async {
                let (code, body) = stack
                    .debug_post("/v1/what-if", &probe("onprem", 10))
                    .await?;
                Ok((code == 200 && body.contains("\"ok\"")).then_some(()))
            },
        )
        .await
        .unwrap();
    let (code, body) = stack
        .debug_post("/v1/what-if", &probe("nowhere", 10))
        .await
        .unwrap();
    assert_eq!(code, 200);
    assert!(body.contains("validationErrors"), "{body}");
    let (code, body) = stack.debug_post("/v1/what-if", "{not json").await.unwrap();
    assert_eq!(code, 400, "{body}");
}

#[tokio::test]
async fn an_invalid_config_exits_non_zero_listing_every_problem() -> Result<(), SetupError> {
    let bins = automanager_e2e::stack::binaries()?;
    let dir = tempfile::tempdir().map_err(|e| SetupError(e.to_string()))?;
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "manager: {url: \"not a url\"}\npendingWindw: 60\nbands: {gold: {maxRestartsPerHour: 0}}\n",
    )
    .map_err(|e| SetupError(e.to_string()))?;
    let out = std::process::Command::new(&bins.operator)
        .arg("--config")
        .arg(&path)
        .output()
        .map_err(|e| SetupError(e.to_string()))?;
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [
        "manager.url",
        "pendingWindw",
        "did you mean",
        "pendingWindow",
        "bands.gold.maxRestartsPerHour",
    ] {
        assert!(stderr.contains(needle), "missing {needle:?} in:\n{stderr}");
    }
    Ok(())
}

#[tokio::test]
async fn the_worst_case_status_and_retry_values_are_written_bounded() {
    let stack = start().await;
    // 16 replicas of 16 jobs with long names, 150 each: a replica needs 16 on-prem nodes of 200
    // and there are three, so every replica is unplaceable and the reasons together are far
    // over a condition's 4,096 bytes.
    let jobs = (0..16).map(|i| {
        job(
            &format!("a-job-with-a-deliberately-long-name-so-reasons-are-long-{i:02}"),
            150,
            Silver,
        )
    });
    stack.create(&bundle("huge", 16, &["onprem"], jobs)).await;
    let b: Bundle = stack
        .wait_for_condition("huge", "Stalled", ConditionStatus::True)
        .await;
    let message = b.condition_message("Stalled").unwrap().to_owned();
    assert_eq!(
        b.condition_reason("Stalled"),
        Some("NoCapacity"),
        "{}",
        show(&b)
    );
    assert!(message.len() <= 4096, "{}", message.len());
    assert!(message.contains("more"), "the cut is marked: {message}");

    // A retry value far over status.lastRetry's 256 bytes is acted on exactly once.
    let long = "r".repeat(10_000);
    stack
        .kubectl(&[
            "annotate",
            "--overwrite",
            "bundle",
            "huge",
            "-n",
            "default",
            &format!("automanager.norsk.io/retry={long}"),
        ])
        .await;
    let last_retry = |b: &Bundle| {
        b.status
            .as_ref()
            .and_then(|s| s.last_retry.clone())
            .unwrap_or_default()
    };
    let b = stack
        .wait_until("huge", "to record lastRetry", |b: &Bundle| {
            last_retry(b).starts_with("rrr")
        })
        .await;
    assert!(last_retry(&b).len() <= 256);
    // Give a looping operator time to show itself, then count the Retry Events.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let retries: Vec<_> = stack
        .events_for("Retry")
        .await
        .into_iter()
        .filter(|e| e.regarding_name() == "huge")
        .collect();
    assert!(retries.len() <= 1, "one Retry Event expected: {retries:#?}");

    // Validation errors past 4,096 bytes: every job fits no instance type of the pool.
    let jobs = (0..16).map(|i| {
        job(
            &format!("a-job-with-a-deliberately-long-name-so-errors-are-long-{i:02}"),
            300,
            Silver,
        )
        .needs(&[
            "a-capability-no-node-in-any-pool-advertises-at-all",
            "another-capability-no-node-in-any-pool-advertises-at-all",
            "a-third-capability-no-node-in-any-pool-advertises-at-all",
        ])
    });
    stack
        .create(&bundle("invalid", 16, &["onprem"], jobs))
        .await;
    let b: Bundle = stack
        .wait_for_reason("invalid", "Stalled", "InvalidSpec")
        .await;
    let message = b.condition_message("Stalled").unwrap();
    assert!(
        message.len() <= 4096 && message.contains("more"),
        "{} bytes, ends {:?}",
        message.len(),
        &message[message.len().saturating_sub(200)..]
    );
}

#[tokio::test]
async fn check_config_validates_and_exits_without_connecting() -> Result<(), SetupError> {
    let bins = automanager_e2e::stack::binaries()?;
    let dir = tempfile::tempdir().map_err(|e| SetupError(e.to_string()))?;
    let run = |yaml: &str| -> Result<std::process::Output, SetupError> {
        let path = dir.path().join("operator.yaml");
        std::fs::write(&path, yaml).map_err(|e| SetupError(e.to_string()))?;
        // No cluster and no Manager: a check must not need either.
        std::process::Command::new(&bins.operator)
            .arg("--config")
            .arg(&path)
            .arg("--check-config")
            .env("KUBECONFIG", dir.path().join("none"))
            .output()
            .map_err(|e| SetupError(e.to_string()))
    };
    let out = run(
        "manager: {url: \"http://manager:6789\"}\nhttp: {bindAddress: \"0.0.0.0:8080\", debugBindAddress: \"0.0.0.0:8082\"}\n",
    )?;
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("configuration is valid"));
    let out = run(
        "manager: {url: \"http://manager:6789\"}\nhttp: {bindAddress: \"0.0.0.0:8080\", debugBindAddress: \"127.0.0.1:8080\"}\n",
    )?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("http.debugBindAddress"));
    Ok(())
}
