//! Migrations end to end: real apiserver, manager-sim (simulated jobs on the real job socket) and
//! the operator binary. What Manager started, with which role, and whether a job was ever without
//! a running instance is read from the sim's own accounting (its `JobHistory`, what
//! `manager-sim chaos job-history` prints).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use automanager_api::MigrationPhase::{self, *};
use automanager_api::MigrationStrategy::{self, Handover, Overlap, StopThenStart};
use automanager_api::PriorityBand::{self, Bronze, Gold, Silver};
use automanager_api::{
    Bundle, DRAIN_NODE_LABEL, DrainMode, DrainStatus, JobState, ManagerNode, Migration,
    MigrationAbort,
};
use automanager_e2e::scenario::{
    BundleView, Conditions, JobHistory, JobManifest, MigrationManifest, MigrationView, bundle, job,
    migration, show,
};
use automanager_e2e::stack::Stack;
use automanager_e2e::{apply_example_pools, repo_root};

async fn start() -> Stack {
    with_pools(Stack::start().await.expect("stack")).await
}

/// A stack whose simulated jobs wait up to ten minutes for an answer
/// ([`automanager_e2e::stack::patient_sim_config`]).
async fn start_patient() -> Stack {
    start_with_sim_config(|demo| format!("{demo}\njobSocket: {{answerTimeoutMs: 600000}}\n")).await
}

/// A stack whose manager-sim runs the demo config as `edit` changes it.
async fn start_with_sim_config(edit: impl FnOnce(&str) -> String) -> Stack {
    let demo = std::fs::read_to_string(repo_root().join("deploy/demo/manager-sim.yaml")).unwrap();
    let config = edit(&demo);
    assert_ne!(config, demo);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manager-sim.yaml");
    std::fs::write(&path, config).unwrap();
    // The sim reads its config at start; the file may go once the stack is up.
    with_pools(
        Stack::start_custom(&path, &[], |_| {})
            .await
            .expect("stack"),
    )
    .await
}

async fn with_pools(stack: Stack) -> Stack {
    apply_example_pools(&stack).await.unwrap();
    stack
}

/// A one-job silver bundle on the fixed on-prem pool; `strategy` is the job's declared
/// migration strategy (none: `stopThenStart`).
fn one_job(name: &str, strategy: Option<MigrationStrategy>) -> Bundle {
    let enc = job("enc", 20, Silver).cores(2);
    let enc = match strategy {
        Some(s) => enc.moves_by(s),
        None => enc,
    };
    bundle(name, 1, &["onprem"], [enc])
}

/// A Migration of the bundle's one job.
fn move_job(name: &str, bundle: &str) -> Migration {
    migration(name, bundle, 0, "enc")
}

fn job_id(bundle: &str) -> String {
    automanager_e2e::scenario::job_id(bundle, 0, "enc")
}

/// Starts the bundle and returns the node its job runs on.
async fn running_job(stack: &Stack, name: &str, strategy: Option<MigrationStrategy>) -> String {
    stack.create(&one_job(name, strategy)).await;
    let b = stack.expect_ready(name).await;
    b.node_of(0, "enc").unwrap().to_owned()
}

/// The nodes whose ManagerNode lists an instance of `job` (normal or migration target).
fn instance_nodes(nodes: &[ManagerNode], job: &str) -> Vec<String> {
    nodes
        .iter()
        .filter_map(|n| n.status.as_ref())
        .filter(|s| s.jobs.iter().any(|j| j.job_id == job))
        .map(|s| s.node_id.clone())
        .collect()
}

/// Waits until exactly one instance of the bundle's job runs, on `node`, and the bundle says so.
async fn wait_single_instance_on(stack: &Stack, bundle: &str, node: &str) {
    let job = job_id(bundle);
    stack
        .wait_for(
            &format!("one instance of {job} on {node}"),
            automanager_e2e::scenario::PATIENCE,
            || async {
                let b: Bundle = stack.try_get(bundle).await?;
                let nodes = stack.try_list::<ManagerNode>("").await?;
                let on_node = b.state_of(0, "enc") == Some(JobState::Running)
                    && b.node_of(0, "enc") == Some(node);
                Ok((on_node && instance_nodes(&nodes, &job) == [node]).then_some(()))
            },
        )
        .await
        .unwrap();
}

/// Starts a handover job whose source answers `cutover-ready` only after `delay_ms`, creates the
/// Migration `migration_name` and waits until it sits in CutoverReady; returns the source node.
async fn held_in_cutover(
    stack: &Stack,
    bundle: &str,
    migration_name: &str,
    delay_ms: &str,
) -> String {
    let source = running_job(stack, bundle, Some(Handover)).await;
    stack
        .chaos(&[
            "migration-behaviour",
            &job_id(bundle),
            "slow-cutover",
            delay_ms,
        ])
        .unwrap();
    stack.create(&move_job(migration_name, bundle)).await;
    stack
        .expect_migration_phase(migration_name, CutoverReady)
        .await;
    source
}

/// The job ran on `source`, then Manager started exactly one more instance, on `target`, as the
/// migration's target (the source kept its role).
fn assert_moved_by_a_migration_target(history: &JobHistory, source: &str, target: &str) {
    assert_eq!(
        history.starts,
        [
            (source.to_owned(), "normal".to_owned()),
            (target.to_owned(), "migrationTarget".to_owned())
        ],
        "{}",
        show(history)
    );
}

/// The node a completed Migration moved its job to.
fn target_of(m: &Migration) -> String {
    m.target_node().expect("a target node").to_owned()
}

#[tokio::test]
async fn a_handover_moves_the_job_and_reports_its_summary() {
    let stack = start().await;
    let source = running_job(&stack, "news", Some(Handover)).await;
    stack.create(&move_job("move-news", "news")).await;
    let m = stack.expect_migration_phase("move-news", Completed).await;
    assert_eq!(m.strategy(), Some(Handover), "{}", show(&m));
    assert_eq!(m.source_node(), Some(source.as_str()));
    let target = target_of(&m);
    assert_ne!(target, source);
    let handover = m.status.as_ref().and_then(|s| s.handover.as_ref());
    assert!(
        handover.is_some_and(|h| !h.applied.is_empty() && h.skew_ms.is_some()),
        "{}",
        show(&m)
    );
    assert_eq!(
        m.phases(),
        [
            Proposing,
            PlacingTarget,
            StartingTarget,
            TargetReady,
            CutoverReady,
            SourceStoppedOutput,
            CutoverApply,
            Completed
        ],
        "{}",
        show(&m)
    );
    assert!(m.has_condition("Ready"), "{}", show(&m));
    wait_single_instance_on(&stack, "news", &target).await;
    assert_moved_by_a_migration_target(&stack.job_history(&job_id("news")).await, &source, &target);
}

#[tokio::test]
async fn stop_then_start_moves_the_job_to_the_named_node() {
    let stack = start().await;
    let source = running_job(&stack, "sport", None).await;
    let target = ["onprem-a1", "onprem-a2", "onprem-b1"]
        .into_iter()
        .find(|n| *n != source)
        .unwrap();
    stack
        .create(&move_job("move-sport", "sport").to_node(target))
        .await;
    let m = stack.expect_migration_phase("move-sport", Completed).await;
    assert_eq!(m.strategy(), Some(StopThenStart), "{}", show(&m));
    assert_eq!(m.target_node(), Some(target));
    assert_eq!(
        m.phases(),
        [
            PlacingTarget,
            PreparingTarget,
            StoppingSource,
            StartingTarget,
            Completed
        ],
        "{}",
        show(&m)
    );
    wait_single_instance_on(&stack, "sport", target).await;
    let history = stack.job_history(&job_id("sport")).await;
    assert_moved_by_a_migration_target(&history, &source, target);
    // One instance at a time: a single gap between the source's stop and the target's start.
    assert_eq!(
        (history.gaps, history.max_running),
        (1, 1),
        "{}",
        show(&history)
    );
}

#[tokio::test]
async fn a_stronger_strategy_than_declared_is_rejected() {
    let stack = start().await;
    let source = running_job(&stack, "film", None).await;
    stack
        .create(&move_job("up-film", "film").by(Handover))
        .await;
    let m = stack.expect_migration_phase("up-film", Rejected).await;
    assert!(m.has_condition("Rejected"), "{}", show(&m));
    assert_eq!(m.condition_reason("Rejected"), Some("StrategyRefused"));
    let msg = m.condition_message("Rejected").unwrap();
    assert!(
        msg.contains("handover") && msg.contains("stopThenStart"),
        "{msg}"
    );
    stack
        .expect_event("up-film", "MigrationRejected", &[])
        .await;
    wait_single_instance_on(&stack, "film", &source).await;
}

#[tokio::test]
async fn a_second_migration_of_the_same_job_is_rejected() {
    let stack = start_patient().await;
    // The first migration holds the job in its cutover for a while.
    held_in_cutover(&stack, "talk", "first", "8000").await;
    stack.create(&move_job("second", "talk")).await;
    let m = stack.expect_migration_phase("second", Rejected).await;
    assert_eq!(
        m.condition_reason("Rejected"),
        Some("ConcurrentMigration"),
        "{}",
        show(&m)
    );
    assert!(
        m.condition_message("Rejected")
            .is_some_and(|msg| msg.contains("first")),
        "{}",
        show(&m)
    );
    let first = stack.expect_migration_phase("first", Completed).await;
    wait_single_instance_on(&stack, "talk", &target_of(&first)).await;
}

#[tokio::test]
async fn a_refused_state_ends_the_migration_with_no_target() {
    let stack = start().await;
    let source = running_job(&stack, "kids", Some(Handover)).await;
    stack
        .chaos(&["migration-behaviour", &job_id("kids"), "refuse-state"])
        .unwrap();
    stack.create(&move_job("move-kids", "kids")).await;
    let m = stack.expect_migration_phase("move-kids", Refused).await;
    assert_eq!(m.target_node(), None, "{}", show(&m));
    assert_eq!(m.phases(), [Proposing, Refused], "{}", show(&m));
    assert_eq!(
        m.condition_reason("Ready"),
        Some("StateRefused"),
        "{}",
        show(&m)
    );
    wait_single_instance_on(&stack, "kids", &source).await;
}

/// Asserts the Migration was aborted by `by` in `phase`.
fn assert_aborted(m: &Migration, by: &str, phase: MigrationPhase) {
    let abort = m.status.as_ref().and_then(|s| s.abort.as_ref());
    assert_eq!(
        abort.map(|a| (a.by.as_str(), a.phase)),
        Some((by, phase)),
        "{}",
        show(m)
    );
}

#[tokio::test]
async fn an_abort_before_cutover_leaves_the_source_running() {
    let stack = start_patient().await;
    let source = held_in_cutover(&stack, "docs", "move-docs", "300000").await;
    let abort = MigrationAbort {
        reason: "changed my mind".to_owned(),
    };
    stack
        .merge_patch::<Migration>("move-docs", &serde_json::json!({"spec": {"abort": abort}}))
        .await;
    let m = stack.expect_migration_phase("move-docs", Aborted).await;
    assert_aborted(&m, "user", CutoverReady);
    let reason = m
        .status
        .as_ref()
        .and_then(|s| s.abort.as_ref())
        .map(|a| a.reason.as_str());
    assert_eq!(reason, Some("changed my mind"), "{}", show(&m));
    assert!(m.has_condition("Aborted"), "{}", show(&m));
    wait_single_instance_on(&stack, "docs", &source).await;
}

#[tokio::test]
async fn overlap_starts_the_target_before_it_stops_the_source() {
    let stack = start().await;
    let source = running_job(&stack, "music", Some(Overlap)).await;
    stack.create(&move_job("move-music", "music")).await;
    let m = stack.expect_migration_phase("move-music", Completed).await;
    assert_eq!(m.strategy(), Some(Overlap), "{}", show(&m));
    let target = target_of(&m);
    assert_ne!(target, source);
    assert_eq!(
        m.phases(),
        [
            PlacingTarget,
            StartingTarget,
            TargetRunning,
            StoppingSource,
            Completed
        ],
        "{}",
        show(&m)
    );
    wait_single_instance_on(&stack, "music", &target).await;
    let history = stack.job_history(&job_id("music")).await;
    assert_moved_by_a_migration_target(&history, &source, &target);
    assert_never_without_a_running_instance(&history);
}

/// Overlap's promise: the job always had a running instance, and two while the target ran
/// before the source stopped.
fn assert_never_without_a_running_instance(history: &JobHistory) {
    assert_eq!(
        (history.gaps, history.uncovered_ms, history.max_running),
        (0, 0, 2),
        "{}",
        show(history)
    );
}

#[tokio::test]
async fn overlap_and_stop_then_start_move_jobs_between_workers_without_a_job_socket() {
    let stack = start_without_job_sockets().await;
    for (bundle, strategy) in [("ov-plain", Overlap), ("sts-plain", StopThenStart)] {
        let source = running_job(&stack, bundle, Some(strategy)).await;
        let name = format!("move-{bundle}");
        stack.create(&move_job(&name, bundle)).await;
        let m = stack.expect_migration_phase(&name, Completed).await;
        assert_eq!(m.strategy(), Some(strategy), "{}", show(&m));
        let target = target_of(&m);
        assert_ne!(target, source);
        wait_single_instance_on(&stack, bundle, &target).await;
        let history = stack.job_history(&job_id(bundle)).await;
        assert_moved_by_a_migration_target(&history, &source, &target);
        if strategy == Overlap {
            assert_never_without_a_running_instance(&history);
        }
    }
}

#[tokio::test]
async fn a_safer_strategy_than_declared_is_accepted() {
    let stack = start().await;
    let source = running_job(&stack, "radio", Some(Handover)).await;
    stack
        .create(&move_job("down-radio", "radio").by(StopThenStart))
        .await;
    let m = stack.expect_migration_phase("down-radio", Completed).await;
    assert_eq!(m.strategy(), Some(StopThenStart), "{}", show(&m));
    let target = target_of(&m);
    assert_ne!(target, source);
    wait_single_instance_on(&stack, "radio", &target).await;
}

#[tokio::test]
async fn a_phase_past_its_timeout_aborts_and_the_source_keeps_running() {
    let stack = with_pools(
        Stack::start_with(|c| {
            c.insert(
                "migration".into(),
                serde_json::json!({"phaseTimeout": "3s"}),
            );
        })
        .await
        .expect("stack"),
    )
    .await;
    let source = running_job(&stack, "slow", Some(Handover)).await;
    stack
        .chaos(&[
            "migration-behaviour",
            &job_id("slow"),
            "slow-cutover",
            "60000",
        ])
        .unwrap();
    stack.create(&move_job("move-slow", "slow")).await;
    let m = stack.expect_migration_phase("move-slow", Aborted).await;
    assert_aborted(&m, "timeout", CutoverReady);
    wait_single_instance_on(&stack, "slow", &source).await;
}

#[tokio::test]
async fn deleting_an_abortable_migration_aborts_it_and_removes_the_target() {
    let stack = start_patient().await;
    let source = held_in_cutover(&stack, "shop", "move-shop", "300000").await;
    stack
        .kubectl(&[
            "delete",
            "migration",
            "move-shop",
            "-n",
            "default",
            "--wait=false",
        ])
        .await;
    stack
        .wait_until_list("", "the Migration to be gone", |ms: &[Migration]| {
            (!ms.iter()
                .any(|m| m.metadata.name.as_deref() == Some("move-shop")))
            .then_some(())
        })
        .await;
    wait_single_instance_on(&stack, "shop", &source).await;
}

#[tokio::test]
// A source's abort right after `state` (`state-given`) can reach Manager before the state does;
// Manager then records what a refusal records and the migration ends in Refused, which
// `a_refused_state_ends_the_migration_with_no_target` covers.
async fn a_job_abort_at_any_abortable_point_leaves_only_the_source_running() {
    let stack = start().await;
    for (i, point) in ["initial-state", "target-ready", "cutover-ready"]
        .into_iter()
        .enumerate()
    {
        let bundle = format!("ab{i}");
        let name = format!("move-ab{i}");
        let source = running_job(&stack, &bundle, Some(Handover)).await;
        stack
            .chaos(&["migration-behaviour", &job_id(&bundle), "abort-at", point])
            .unwrap();
        stack.create(&move_job(&name, &bundle)).await;
        let m = stack.expect_migration_phase(&name, Aborted).await;
        let by = m
            .status
            .as_ref()
            .and_then(|s| s.abort.as_ref())
            .map(|a| a.by.as_str());
        let expected = match point {
            "cutover-ready" => "source",
            _ => "target",
        };
        assert_eq!(by, Some(expected), "abort at {point}: {}", show(&m));
        assert!(!m.phases().contains(&SourceStoppedOutput), "{}", show(&m));
        wait_single_instance_on(&stack, &bundle, &source).await;
    }
}

/// A stack whose on-prem pool's workers run no job-socket listener (no `norsk.io/job-socket`).
async fn start_without_job_sockets() -> Stack {
    start_with_sim_config(|demo| {
        demo.replacen(
            "  - name: onprem\n",
            "  - name: onprem\n    jobSocket: false\n",
            1,
        )
    })
    .await
}

#[tokio::test]
async fn a_handover_target_without_the_job_socket_is_rejected() {
    let stack = start_without_job_sockets().await;
    let source = running_job(&stack, "plain", Some(Handover)).await;
    let target = ["onprem-a1", "onprem-a2", "onprem-b1"]
        .into_iter()
        .find(|n| *n != source)
        .unwrap();
    stack
        .create(&move_job("move-plain", "plain").to_node(target))
        .await;
    let m = stack.expect_migration_phase("move-plain", Rejected).await;
    assert_eq!(
        m.condition_reason("Rejected"),
        Some("TargetRefused"),
        "{}",
        show(&m)
    );
    assert!(
        m.condition_message("Rejected")
            .is_some_and(|msg| msg.contains("norsk.io/job-socket")),
        "{}",
        show(&m)
    );
    wait_single_instance_on(&stack, "plain", &source).await;
}

/// A one-job bundle of the given band and declared strategy on the on-prem pool.
fn banded_bundle(name: &str, strategy: MigrationStrategy, band: PriorityBand) -> Bundle {
    bundle(
        name,
        1,
        &["onprem"],
        [job("enc", 20, band).cores(2).moves_by(strategy)],
    )
}

/// Cordons every on-prem node but `keep`, runs `bundles` (name, strategy, band) there, then
/// uncordons the others: every job starts on `keep`.
async fn jobs_on_one_node(
    stack: &Stack,
    keep: &str,
    bundles: &[(&str, MigrationStrategy, PriorityBand)],
) {
    let others: Vec<&str> = ["onprem-a1", "onprem-a2", "onprem-b1"]
        .into_iter()
        .filter(|n| *n != keep)
        .collect();
    for n in &others {
        stack.cordon(n).await;
    }
    for (name, strategy, band) in bundles {
        stack.create(&banded_bundle(name, *strategy, *band)).await;
    }
    for (name, ..) in bundles {
        let b = stack.expect_ready(name).await;
        assert_eq!(b.node_of(0, "enc"), Some(keep), "{}", show(&b));
    }
    for n in &others {
        stack.uncordon(n).await;
    }
    // The operator has taken the uncordon in (its status says so) before anything is placed on
    // those nodes again.
    for n in &others {
        stack.wait_cordoned(n, false).await;
    }
}

/// Drains `node` with `mode: migrate` and waits until its status says the drain completed;
/// returns the ManagerNode and its drain's figures.
async fn drain_migrate(stack: &Stack, node: &str) -> (ManagerNode, DrainStatus) {
    stack.drain(node, DrainMode::Migrate).await;
    let n = stack.wait_drained(node).await;
    let drain = n
        .status
        .as_ref()
        .and_then(|s| s.drain.clone())
        .expect("a drained node has drain figures");
    (n, drain)
}

/// The drain's Migrations: bundle → phase.
async fn drain_migrations(stack: &Stack) -> Vec<(String, Option<MigrationPhase>)> {
    stack
        .list_labelled::<Migration>(DRAIN_NODE_LABEL)
        .await
        .iter()
        .map(|m| (m.spec.job.bundle.clone(), m.phase()))
        .collect()
}

#[tokio::test]
async fn a_migrate_drain_moves_every_job_and_drops_no_bronze_job() {
    let stack = start().await;
    let bundles = [
        ("dm-hand", Handover, Bronze),
        ("dm-over", Overlap, Bronze),
        ("dm-stop", StopThenStart, Bronze),
        ("dm-gold", Handover, Gold),
        ("dm-silv", Overlap, Silver),
    ];
    jobs_on_one_node(&stack, "onprem-a1", &bundles).await;

    let (node, drain) = drain_migrate(&stack, "onprem-a1").await;
    let all = stack.migrations().await;
    assert_eq!(
        (
            drain.jobs_migrated,
            drain.jobs_dropped,
            drain.jobs_recovered
        ),
        (5, 0, 0),
        "{}\n{}",
        show(&node),
        show(&all)
    );

    // One Migration per bundle: sorted by bundle.
    let mut migs = drain_migrations(&stack).await;
    migs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut expected: Vec<(String, Option<MigrationPhase>)> = bundles
        .iter()
        .map(|(b, ..)| ((*b).to_owned(), Some(Completed)))
        .collect();
    expected.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(migs, expected);
    for (name, ..) in bundles {
        let b = stack.expect_ready_off(name, "onprem-a1").await;
        assert_eq!(
            b.state_of(0, "enc"),
            Some(JobState::Running),
            "{}",
            show(&b)
        );
    }
    // The node was emptied before it ended (or was left to its owner): no job stopped with it.
    let events = stack.events_for("JobDropped").await;
    assert_eq!(events.len(), 0, "{events:#?}");
}

#[tokio::test]
async fn a_job_whose_drain_migration_fails_falls_back_to_its_band() {
    let stack = with_pools(
        Stack::start_with(|c| {
            c.insert(
                "migration".into(),
                serde_json::json!({"drainParallelism": 1}),
            );
        })
        .await
        .expect("stack"),
    )
    .await;
    let bundles = [
        ("fb-bronze", Handover, Bronze),
        ("fb-silver", Handover, Silver),
        ("fb-fine", Overlap, Bronze),
    ];
    jobs_on_one_node(&stack, "onprem-b1", &bundles).await;
    for b in ["fb-bronze", "fb-silver"] {
        stack
            .chaos(&["migration-behaviour", &job_id(b), "refuse-state"])
            .unwrap();
    }

    let (node, drain) = drain_migrate(&stack, "onprem-b1").await;
    assert_eq!(
        (
            drain.jobs_migrated,
            drain.jobs_recovered,
            drain.jobs_dropped
        ),
        (1, 1, 1),
        "{}",
        show(&node)
    );

    // The refused silver job restarted elsewhere by its band; the refused bronze one was dropped.
    // (Its status may still say Ready on the drained node for a moment: wait for both.)
    stack
        .wait_until(
            "fb-silver",
            "to run its refused job elsewhere",
            |b: &Bundle| {
                b.phase() == Some(automanager_api::BundlePhase::Ready)
                    && b.node_of(0, "enc").is_some_and(|n| n != "onprem-b1")
            },
        )
        .await;
    stack
        .wait_until("fb-bronze", "to drop its refused job", |b: &Bundle| {
            b.state_of(0, "enc") == Some(JobState::Dropped)
        })
        .await;
    stack.expect_ready_off("fb-fine", "onprem-b1").await;
}

#[tokio::test]
async fn a_migration_with_no_room_elsewhere_provisions_its_target_in_an_elastic_pool() {
    let stack = start().await;
    // One job that fills most of an aws-east node: the pool provisions one node for it, and the
    // migration finds no other node with room.
    stack
        .create(&bundle(
            "big",
            1,
            &["aws-east"],
            [job("enc", 70, Silver).cores(4)],
        ))
        .await;
    let b = stack.expect_ready("big").await;
    let source = b.node_of(0, "enc").unwrap().to_owned();
    stack.create(&move_job("move-big", "big")).await;
    let m = stack.expect_migration_phase("move-big", Completed).await;
    let target = target_of(&m);
    assert_ne!(target, source, "{}", show(&m));
    let nodes = stack.nodes().await;
    let pool_of_target = nodes
        .iter()
        .filter_map(|n| n.status.as_ref())
        .find(|s| s.node_id == target)
        .map(|s| s.pool.as_str());
    assert_eq!(pool_of_target, Some("aws-east"), "{}", show(&nodes));
    // Events are published off the reconcile path, a moment after the status.
    stack
        .expect_event("move-big", "ProvisioningTarget", &[])
        .await;
    let events = stack.events_for("ProvisioningTarget").await;
    assert_eq!(events.len(), 1, "{events:#?}");
    wait_single_instance_on(&stack, "big", &target).await;
}
