//! Consolidation on the real stack (kube-apiserver + etcd, manager-sim, the operator binary,
//! kubectl), with the reliability suite's invariant checker running alongside: a fragmented
//! elastic binpack pool is first planned in `dryRun` (the plan is in status, nothing moves),
//! then consolidated (`enabled`): the planned node is emptied through handover and overlap
//! Migrations and terminated, and no job is ever without a running instance (the sim's history
//! of every job) nor loses a handover participant; a node whose move fails is kept, with its
//! job running where it was; and a move waits for its Bundle's disruption budget.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use automanager_api::MigrationStrategy::{self, Handover, Overlap};
use automanager_api::PriorityBand::Silver;
use automanager_api::{
    Bundle, ConsolidationMode, ConsolidationSpec, ConsolidationStatus, Migration, MigrationPhase,
    PURPOSE_LABEL, PackingStrategy, PlacementPool, PoolKind,
};
use automanager_e2e::bench::SeenMigrations;
use automanager_e2e::reliability::{Monitor, manager_state, settle};
use automanager_e2e::scenario::{
    BundleView, Conditions, JobHistory, JobManifest, MigrationView, bundle, elastic_pool,
    instance_type, job, job_id, show,
};
use automanager_e2e::stack::Stack;
use kube::api::Api;
use manager_client::proto::NodeState;

const WAIT: Duration = Duration::from_secs(120);
const POOL: &str = "packed";

/// An elastic pool of one zone, nodes of 100 capacity that advertise the job socket.
fn sim_config(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("manager-sim.yaml");
    std::fs::write(
        &path,
        format!(
            "listen: 127.0.0.1:0
timing: {{provisionDelayMs: 100, jobStartDelayMs: 20, jobStopDelayMs: 20}}
pools:
  - name: {POOL}
    kind: aws
    region: eu-west-1
    zones: [zn-a]
    scaleOut: elastic
    instanceTypes:
      - {{instanceType: m5.xlarge, capacity: 100, cores: 16}}
"
        ),
    )
    .unwrap();
    path
}

/// The pool, consolidated as `consolidation` says (absent: off).
fn packed_pool(consolidation: Option<ConsolidationSpec>) -> PlacementPool {
    let mut pool = elastic_pool(
        POOL,
        PoolKind::Aws,
        "eu-west-1",
        &["zn-a"],
        PackingStrategy::Binpack,
        instance_type("m5.xlarge", 100, 16),
    );
    pool.spec.consolidation = consolidation;
    pool
}

/// Consolidation in `mode` with no minimum node age, and `cooldown_seconds` between nodes.
fn consolidation(mode: ConsolidationMode, cooldown_seconds: i32) -> Option<ConsolidationSpec> {
    Some(ConsolidationSpec {
        mode,
        min_nodes: None,
        cooldown_seconds: Some(cooldown_seconds),
        min_node_age_seconds: Some(0),
    })
}

/// A one-replica silver bundle of one job taking 40 of a node's 100 (two per node).
fn channel(name: &str, strategy: MigrationStrategy) -> Bundle {
    bundle(
        name,
        1,
        &[POOL],
        [job("enc", 40, Silver).cores(2).moves_by(strategy)],
    )
}

/// The node each bundle's job runs on, from Bundle status.
async fn placement(stack: &Stack, names: &[String]) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for n in names {
        let b = stack.bundle(n).await;
        out.insert(
            n.clone(),
            b.node_of(0, "enc").unwrap_or_default().to_owned(),
        );
    }
    out
}

/// Nodes of the pool Manager runs (starting or started).
async fn live_nodes(stack: &Stack) -> Vec<String> {
    let m = manager_state(&stack.sim_endpoint).await.unwrap();
    let mut v: Vec<String> = m
        .nodes
        .values()
        .filter(|n| {
            n.pool == POOL
                && matches!(
                    NodeState::try_from(n.state),
                    Ok(NodeState::Starting | NodeState::Started)
                )
        })
        .map(|n| n.node_id.clone())
        .collect();
    v.sort();
    v
}

async fn job_history(stack: &Stack, bundle: &str) -> JobHistory {
    stack.job_history(&job_id(bundle, 0, "enc")).await
}

/// The Migrations consolidation created (and not yet deleted).
async fn consolidation_migrations(stack: &Stack) -> Vec<Migration> {
    stack
        .list_labelled(&format!("{PURPOSE_LABEL}=consolidation"))
        .await
}

/// The pool's consolidation status.
fn consolidation_of(p: &PlacementPool) -> ConsolidationStatus {
    p.status
        .as_ref()
        .and_then(|s| s.consolidation.clone())
        .unwrap_or_default()
}

/// What [`fragmented`] left: where each bundle of the wave ran, the bundles kept, and the
/// pool's nodes.
struct Fragmented {
    wave: BTreeMap<String, String>,
    kept: Vec<String>,
    nodes: Vec<String>,
}

/// A stack with a fragmented pool: a wave of six bundles of 40 (two per node, on three nodes;
/// `strategy(i)` for bundle `i`), then one bundle deleted per node, so each node is 40 % used:
/// three nodes where two would do.
async fn fragmented(strategy: impl Fn(usize) -> MigrationStrategy) -> (Stack, Fragmented) {
    let dir = tempfile::tempdir().unwrap();
    let stack = Stack::start_custom(&sim_config(dir.path()), &[], |_| {})
        .await
        .expect("stack");
    stack.create(&packed_pool(None)).await;
    let names: Vec<String> = (0..6).map(|i| format!("ch-{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        stack.create(&channel(n, strategy(i))).await;
        stack.expect_ready(n).await;
    }
    let wave = placement(&stack, &names).await;
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (b, n) in &wave {
        by_node.entry(n.clone()).or_default().push(b.clone());
    }
    assert_eq!(by_node.len(), 3, "binpack puts two per node: {wave:?}");
    let mut kept: Vec<String> = Vec::new();
    for jobs in by_node.values() {
        stack.delete::<Bundle>(&jobs[0]).await;
        kept.push(jobs[1].clone());
    }
    stack
        .wait_for("three jobs left", WAIT, || async {
            let m = manager_state(&stack.sim_endpoint).await?;
            Ok((m.jobs.len() == 3).then_some(()))
        })
        .await
        .unwrap();
    let nodes = live_nodes(&stack).await;
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    (stack, Fragmented { wave, kept, nodes })
}

#[tokio::test]
async fn dry_run_shows_the_plan_then_enabled_empties_and_terminates_the_node_without_a_gap() {
    // Handover and overlap alike.
    let (stack, f) = fragmented(|i| {
        if i.is_multiple_of(2) {
            Handover
        } else {
            Overlap
        }
    })
    .await;
    let Fragmented {
        wave,
        kept,
        nodes: before,
    } = f;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();

    // dryRun: the plan is in status, nothing moves.
    stack
        .create(&packed_pool(consolidation(ConsolidationMode::DryRun, 0)))
        .await;
    let pool = stack
        .wait_until(POOL, "to show a dry-run plan", |p: &PlacementPool| {
            p.condition_reason("Consolidating") == Some("DryRun")
                && consolidation_of(p).planned_nodes == 1
        })
        .await;
    let plan = consolidation_of(&pool).plan;
    let planned_node = plan[0].node.clone();
    assert_eq!(plan[0].moves.len(), 1, "{}", show(&pool));
    let planned_move = &plan[0].moves[0];
    let moved_bundle = planned_move
        .bundle
        .trim_start_matches("default/")
        .to_owned();
    let planned_target = planned_move.target_node.clone();
    assert_eq!(wave[&moved_bundle], planned_node, "{}", show(&pool));
    assert_ne!(planned_target, planned_node);
    let message = pool.condition_message("Consolidating").unwrap();
    assert!(
        message.contains(&format!("would empty 1 node(s): {planned_node} (1 moves)")),
        "{message}"
    );
    // Long enough for several passes: still nothing moved.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(live_nodes(&stack).await, before);
    assert!(consolidation_migrations(&stack).await.is_empty());
    assert_eq!(placement(&stack, &kept).await[&moved_bundle], planned_node);

    // enabled: the planned node is emptied into the planned target and terminated. (Its
    // Migrations go with its ManagerNode afterwards: a watch keeps what they said.)
    let seen = SeenMigrations::start(
        Api::namespaced(stack.env.client().clone(), "default"),
        &format!("{PURPOSE_LABEL}=consolidation"),
    );
    stack
        .create(&packed_pool(consolidation(ConsolidationMode::Enabled, 0)))
        .await;
    let pool = stack
        .wait_until(
            POOL,
            "to have consolidated one node, with nothing more to do",
            |p: &PlacementPool| {
                consolidation_of(p).nodes_terminated == 1
                    && p.condition_reason("Consolidating") == Some("NothingToConsolidate")
            },
        )
        .await;
    let after = live_nodes(&stack).await;
    assert_eq!(after.len(), 2, "{after:?} {}", show(&pool));
    assert!(!after.contains(&planned_node), "{after:?}");
    let now = placement(&stack, &kept).await;
    assert_eq!(now[&moved_bundle], planned_target, "{now:?}");
    // The others stayed where they were.
    for b in kept.iter().filter(|b| **b != moved_bundle) {
        assert_eq!(now[b], wave[b], "{b}");
    }
    // The move went through the queue as a consolidation Migration and completed.
    let migs: Vec<Migration> = seen.snapshot().into_values().collect();
    assert_eq!(migs.len(), 1, "{}", show(&migs));
    let m = &migs[0];
    assert_eq!(m.phase(), Some(MigrationPhase::Completed), "{}", show(m));
    let purpose = m
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(PURPOSE_LABEL))
        .map(String::as_str);
    assert_eq!(purpose, Some("consolidation"), "{}", show(m));
    assert_eq!(m.spec.target_node.as_deref(), Some(planned_target.as_str()));
    let mut dropped = 0u64;
    if m.strategy() == Some(Handover) {
        dropped += m
            .status
            .as_ref()
            .and_then(|s| s.handover.as_ref())
            .map_or(0, |h| h.failed.len() as u64);
    }
    // No job was ever without a running instance (the sim's accounting of every job).
    for b in &kept {
        let h = job_history(&stack, b).await;
        dropped += u64::from(h.gaps);
        assert_eq!(h.uncovered_ms, 0, "{b}: {}", show(&h));
    }
    assert_eq!(dropped, 0, "dropped output");
    stack.expect_event(POOL, "NodeConsolidated", &[]).await;
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains(&format!(
            "automanager_consolidation_nodes_terminated_total{{pool=\"{POOL}\"}} 1"
        )),
        "{metrics}"
    );
    // The pool's last node pair is a lower bound (two of 40 do not fit with a third): it stays.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(live_nodes(&stack).await, after);

    let (mut v, took) = settle(&stack, WAIT).await.unwrap();
    v.merge(&monitor.stop().await.0);
    eprintln!("{}", v.line("fleet-consolidation", took));
    assert!(v.is_clean(), "{}", v.details());
}

/// Asserts the job of each of `bundles` always had a running instance.
async fn assert_no_gap(stack: &Stack, bundles: &[String]) {
    for b in bundles {
        let h = job_history(stack, b).await;
        assert_eq!((h.gaps, h.uncovered_ms), (0, 0), "{b}: {}", show(&h));
    }
}

#[tokio::test]
async fn a_node_whose_move_fails_is_kept_and_its_job_keeps_running() {
    let (stack, f) = fragmented(|_| Handover).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    // Every job refuses to hand over its state: any consolidation move ends Refused, before the
    // source stops.
    for b in &f.kept {
        stack
            .chaos(&["migration-behaviour", &job_id(b, 0, "enc"), "refuse-state"])
            .unwrap();
    }
    let seen = SeenMigrations::start(
        Api::namespaced(stack.env.client().clone(), "default"),
        &format!("{PURPOSE_LABEL}=consolidation"),
    );
    stack
        .create(&packed_pool(consolidation(
            ConsolidationMode::Enabled,
            3600,
        )))
        .await;
    let pool = stack
        .wait_until(POOL, "to give the node up", |p: &PlacementPool| {
            matches!(
                p.condition_reason("Consolidating"),
                Some("CoolingDown" | "Abandoned")
            )
        })
        .await;
    let status = consolidation_of(&pool);
    assert_eq!(status.nodes_terminated, 0, "{}", show(&pool));
    assert_eq!(status.current_node, None, "{}", show(&pool));
    stack
        .expect_event(POOL, "ConsolidationAbandoned", &[])
        .await;
    let (_, metrics) = stack.http_get("/metrics").await.unwrap();
    assert!(
        metrics.contains(&format!(
            "automanager_consolidation_nodes_abandoned_total{{pool=\"{POOL}\"}} 1"
        )),
        "{metrics}"
    );
    // Nothing was terminated, nothing moved, and the ended Migration is gone.
    assert_eq!(live_nodes(&stack).await, f.nodes);
    let now = placement(&stack, &f.kept).await;
    for b in &f.kept {
        assert_eq!(now[b], f.wave[b], "{b}");
    }
    assert_no_gap(&stack, &f.kept).await;
    let migs = seen.snapshot();
    assert_eq!(migs.len(), 1, "{migs:#?}");
    let phase = migs.values().next().and_then(MigrationView::phase);
    assert_eq!(phase, Some(MigrationPhase::Refused));
    stack
        .wait_until_list(
            &format!("{PURPOSE_LABEL}=consolidation"),
            "the ended Migration deleted",
            |ms: &[Migration]| ms.is_empty().then_some(()),
        )
        .await;

    let (mut v, took) = settle(&stack, WAIT).await.unwrap();
    v.merge(&monitor.stop().await.0);
    eprintln!("{}", v.line("fleet-consolidation-abandoned", took));
    assert!(v.is_clean(), "{}", v.details());
}

#[tokio::test]
async fn a_consolidation_move_waits_for_the_disruption_budget() {
    let (stack, f) = fragmented(|_| Handover).await;
    let monitor = Monitor::start(&stack.sim_endpoint).await.unwrap();
    let budget =
        |n: i32| serde_json::json!({"spec": {"disruption": {"maxUnavailableReplicas": n}}});
    for b in &f.kept {
        stack.merge_patch::<Bundle>(b, &budget(0)).await;
    }
    stack
        .create(&packed_pool(consolidation(ConsolidationMode::Enabled, 0)))
        .await;
    // The move is queued behind the budget; the node is being emptied and stays.
    let m = stack
        .wait_until_list(
            &format!("{PURPOSE_LABEL}=consolidation"),
            "the consolidation Migration held by the budget",
            |ms: &[Migration]| {
                ms.iter()
                    .find(|m| m.condition_reason("Queued") == Some("DisruptionBudget"))
                    .cloned()
            },
        )
        .await;
    assert_eq!(m.phase(), Some(MigrationPhase::Pending), "{}", show(&m));
    let pool = stack.pool(POOL).await;
    assert_eq!(
        pool.condition_reason("Consolidating"),
        Some("EmptyingNode"),
        "{}",
        show(&pool)
    );
    assert!(
        pool.condition_message("Consolidating")
            .is_some_and(|msg| msg.contains("0 of 1 moves done")),
        "{}",
        show(&pool)
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(live_nodes(&stack).await, f.nodes);

    // Raising the budget lets it go: the node is emptied and terminated.
    for b in &f.kept {
        stack.merge_patch::<Bundle>(b, &budget(1)).await;
    }
    stack
        .wait_until(
            POOL,
            "to have consolidated the node once the budget allows",
            |p: &PlacementPool| consolidation_of(p).nodes_terminated == 1,
        )
        .await;
    assert_eq!(live_nodes(&stack).await.len(), 2);
    assert_no_gap(&stack, &f.kept).await;

    let (mut v, took) = settle(&stack, WAIT).await.unwrap();
    v.merge(&monitor.stop().await.0);
    eprintln!("{}", v.line("fleet-consolidation-budget", took));
    assert!(v.is_clean(), "{}", v.details());
}
