//! Every wait has a bound and a voice: a drain or Migration held by a Broken bundle, a budget or
//! a closed window says who holds it and since when (`status.held`), raises one Event per
//! holder, and past `disruption.holdWarnAfter` a Warning Event and `automanager_held_moves`;
//! a `terminate` drain with `whenHeld: Proceed` then terminates its node, one with `Wait` does
//! not. A reclaim notice still takes over a move held past the bound.

use std::collections::HashMap;
use std::time::Duration;

use automanager_api::{
    self as api, DrainMode, HoldKind, ManagerNodeSpec, MigrationPhase, WhenHeld,
};
use automanager_operator::controllers::{self, node::MirrorSync};

use super::Tier;
use super::common::{condition_of, requeue};
use super::notices::Kind;

/// The bound these tests run with.
const BOUND: Duration = Duration::from_secs(600);

fn drain(mode: DrainMode, when_held: Option<WhenHeld>) -> ManagerNodeSpec {
    ManagerNodeSpec {
        cordoned: false,
        drain: Some(api::Drain { mode, when_held }),
    }
}

impl Tier {
    /// `automanager_held_moves{kind, reason}` as exported now.
    fn held_moves(&self, kind: &str, reason: &str) -> i64 {
        let series = format!("automanager_held_moves{{kind=\"{kind}\",reason=\"{reason}\"}} ");
        let text = self.ctx.metrics.encode();
        let line = (text.lines())
            .find(|l| l.starts_with(&series))
            .unwrap_or_else(|| panic!("no {series} in:\n{text}"));
        line[series.len()..].trim().parse().expect("a number")
    }

    /// The ManagerNode's status as the sync writes it now.
    async fn node_status(&self, sync: &mut MirrorSync, node: &str) -> api::ManagerNodeStatus {
        sync.pass().await;
        (self.stored_node(node).and_then(|n| n.status)).expect("a status")
    }
}

/// Bundle `live/news` with two replicas on onprem (one down at once, by default); the node of
/// replica 0 drained (`terminate`) and terminated; the other node's drain asked for with
/// `when_held`: answers the tier, the sync and that second node, whose drain the budget holds.
async fn second_drain_held(when_held: Option<WhenHeld>) -> (Tier, MirrorSync, String) {
    let (t, sync) = Tier::start(|c| c.disruption.hold_warn_after = BOUND)
        .await
        .with_example_pools()
        .await
        .with_node_objects()
        .await;
    let nodes = t.running_bundle("news", 2).await;
    t.set_node_spec(&nodes[0], drain(DrainMode::Terminate, None));
    t.node_pass(&nodes[0]).await.expect("the first drain");
    t.manager.clear_calls();
    t.set_node_spec(&nodes[1], drain(DrainMode::Terminate, when_held));
    (t, sync, nodes[1].clone())
}

#[tokio::test]
async fn a_drain_held_by_a_budget_names_it_once_and_escalates_once_past_the_bound() {
    let (t, mut sync, node) = second_drain_held(None).await;
    let held_at = t.ctx.clock.now();

    for _ in 0..3 {
        let next = t.node_pass(&node).await.expect("a held pass");
        assert_eq!(next, requeue(Duration::from_secs(1)));
    }

    let status = t.node_status(&mut sync, &node).await;
    let held = status.held.expect("status.held");
    assert_eq!(
        (held.kind, held.holder.as_str(), held.since),
        (HoldKind::DisruptionBudget, "Bundle live/news", held_at)
    );
    assert_eq!(held.past_bound_at, None);
    let (on, reason, _) = condition_of(&status.conditions, "DisruptionBlocked");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "DisruptionBudget"));
    assert_eq!(
        t.events_with("DisruptionBlocked").await,
        1,
        "one per holder, not per pass"
    );
    assert_eq!(t.held_moves("drain", "DisruptionBudget"), 0);

    t.clock.advance(BOUND);
    t.node_pass(&node).await.expect("the pass at the bound");
    t.node_pass(&node).await.expect("a pass after it");

    assert!(
        t.manager.calls_named("TerminateNode").is_empty(),
        "whenHeld defaults to Wait"
    );
    assert_eq!(t.events_with("HeldTooLong").await, 1);
    let (_, note) = (t.events().await.into_iter())
        .find(|(r, _)| r == "HeldTooLong")
        .expect("the Event");
    assert!(
        note.contains("Bundle live/news") && note.contains("whenHeld: Wait"),
        "{note}"
    );
    assert_eq!(t.held_moves("drain", "DisruptionBudget"), 1);
    let held = t.node_status(&mut sync, &node).await.held.expect("held");
    assert_eq!(held.past_bound_at, Some(held_at + BOUND));
    assert_eq!(held.since, held_at);
}

#[tokio::test]
async fn a_drain_that_may_proceed_terminates_its_node_once_past_the_bound_and_says_so() {
    let (t, mut sync, node) = second_drain_held(Some(WhenHeld::Proceed)).await;
    t.node_pass(&node).await.expect("the held pass");
    let status = t.node_status(&mut sync, &node).await;
    assert_eq!(
        condition_of(&status.conditions, "DisruptionBlocked").0,
        "True"
    );
    t.clock.advance(BOUND - Duration::from_secs(1));
    t.node_pass(&node).await.expect("a pass within the bound");
    assert!(
        t.manager.calls_named("TerminateNode").is_empty(),
        "held within the bound"
    );

    t.clock.advance(Duration::from_secs(1));
    t.node_pass(&node).await.expect("the pass at the bound");

    assert_eq!(t.manager.calls_named("TerminateNode").len(), 1);
    let (_, note) = (t.events().await.into_iter())
        .find(|(r, _)| r == "DrainProceeded")
        .expect("a DrainProceeded Event");
    assert!(
        note.contains("Bundle live/news") && note.contains("whenHeld: Proceed"),
        "{note}"
    );
    assert_eq!(t.events_with("Draining").await, 2);
    let status = t.node_status(&mut sync, &node).await;
    let held = status.held.expect("the hold stays on record");
    assert_eq!(held.proceeded_at, Some(t.ctx.clock.now()));
    assert_eq!(
        condition_of(&status.conditions, "DisruptionBlocked").0,
        "False"
    );
    assert_eq!(
        t.held_moves("drain", "DisruptionBudget"),
        0,
        "it waits no more"
    );
}

#[tokio::test]
async fn a_broken_bundle_that_holds_a_drain_is_named_as_a_new_holder() {
    let (t, mut sync, node) = second_drain_held(None).await;
    let held_at = t.ctx.clock.now();
    t.node_pass(&node).await.expect("the held pass");
    t.clock.advance(Duration::from_secs(60));
    t.api.edit_status::<api::Bundle>(Some("live"), "news", |b| {
        let s = b.status.get_or_insert_default();
        let broken = controllers::condition("Broken", true, "TooManyRestarts", "", None, held_at);
        api::set_condition(&mut s.conditions, broken);
    });

    t.node_pass(&node)
        .await
        .expect("a pass with the bundle Broken");

    assert_eq!(
        t.events_with("DisruptionBlocked").await,
        2,
        "the holder changed"
    );
    let status = t.node_status(&mut sync, &node).await;
    let held = status.held.expect("held");
    assert_eq!(
        (held.kind, held.holder.as_str(), held.since),
        (HoldKind::BrokenBundle, "Bundle live/news", held_at)
    );
    assert!(held.message.contains("Broken"), "{}", held.message);
    assert_eq!(
        condition_of(&status.conditions, "DisruptionBlocked").1,
        "BrokenBundle"
    );
}

/// Bundle `live/news`: one gold replica whose window opens at 14:00 (the clock says 12:00),
/// and a `kind` Migration of it, held: answers the node it runs on.
async fn window_held(t: &Tier, kind: Kind) -> String {
    t.gold_overlap_bundle(
        1,
        serde_json::json!({"windows": [{"schedule": "0 14 * * *", "duration": "1h"}]}),
    )
    .await;
    let node = t.node_of_replica(0);
    t.kind_migration("held", kind, "news", 0, &node);
    t.migration_pass("held").await.expect("the finalizer pass");
    t.migration_pass("held").await.expect("the held pass");
    node
}

#[tokio::test]
async fn a_migration_held_by_a_window_says_when_it_opens_and_escalates_past_the_bound() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    let held_at = t.ctx.clock.now();
    window_held(&t, Kind::Consolidation).await;
    t.migration_pass("held").await.expect("another held pass");

    let status = t.migration_status("held");
    let held = status.held.expect("status.held");
    assert_eq!(
        (held.kind, held.holder.as_str(), held.since),
        (
            HoldKind::DisruptionWindow,
            "Bundle live/news's disruption windows",
            held_at
        )
    );
    assert_eq!(held.opens_at, Some(held_at + Duration::from_secs(2 * 3600)));
    assert_eq!(held.window.as_deref(), Some("0 14 * * * for 1h (UTC)"));
    assert_eq!(
        condition_of(&status.conditions, "Queued").1,
        "DisruptionWindow"
    );
    assert_eq!(t.events_with("DisruptionBlocked").await, 1);

    // The default bound, 30 minutes.
    t.clock.advance(Duration::from_secs(30 * 60));
    t.migration_pass("held")
        .await
        .expect("the pass at the bound");

    assert_eq!(t.events_with("HeldTooLong").await, 1);
    assert_eq!(t.held_moves("migration", "DisruptionWindow"), 1);
    assert!(
        t.migration_status("held")
            .held
            .and_then(|h| h.past_bound_at)
            .is_some()
    );

    t.clock.advance(Duration::from_secs(90 * 60));
    t.migration_until("held", MigrationPhase::Completed).await;
    assert_eq!(t.migration_status("held").held, None);
    assert_eq!(t.held_moves("migration", "DisruptionWindow"), 0);
    assert_eq!(t.events_with("HeldTooLong").await, 1);
}

#[tokio::test]
async fn a_migrate_drain_says_which_migration_is_held_and_by_whom() {
    let (t, mut sync) = Tier::start(|_| {})
        .await
        .with_example_pools()
        .await
        .with_node_objects()
        .await;
    t.gold_overlap_bundle(
        1,
        serde_json::json!({"windows": [{"schedule": "0 14 * * *", "duration": "1h"}]}),
    )
    .await;
    let node = t.node_of_replica(0);
    t.set_node_spec(&node, drain(DrainMode::Migrate, None));
    t.node_pass(&node)
        .await
        .expect("the pass creating the Migration");
    let name = controllers::drain::migration_name(
        &automanager_operator::mapping::node_object_name(&node),
        &t.ctx.manager.mirror().read(|m| {
            m.jobs
                .values()
                .next()
                .map(|j| j.job_id.clone())
                .expect("the job")
        }),
    );
    t.migration_pass(&name).await.expect("the finalizer pass");
    t.migration_pass(&name).await.expect("the held pass");

    t.node_pass(&node).await.expect("the drain's step");

    let status = t.node_status(&mut sync, &node).await;
    let held = status.held.expect("status.held");
    assert_eq!(held.kind, HoldKind::DisruptionWindow);
    assert!(
        held.message.starts_with(&format!("Migration {name}: ")),
        "{}",
        held.message
    );
    assert_eq!(
        condition_of(&status.conditions, "DisruptionBlocked").1,
        "DisruptionWindow"
    );
}

#[tokio::test]
async fn a_reclaim_notice_still_takes_over_a_drain_move_held_past_the_bound() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    let node = window_held(&t, Kind::Drain).await;
    t.clock.advance(Duration::from_secs(31 * 60));
    t.migration_pass("held")
        .await
        .expect("the pass past the bound");
    assert_eq!(t.held_moves("migration", "DisruptionWindow"), 1);

    t.notice(&node, 60_000).await;
    let mut told = HashMap::new();
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("the reclaim pass");
    let reclaim = t.reclaim_migrations();
    assert_eq!(reclaim.len(), 1);
    let by = kube::ResourceExt::name_any(&reclaim[0]);
    t.migration_pass(&by).await.expect("the finalizer pass");
    t.migration_pass(&by).await.expect("the admitting pass");

    let status = t.migration_status("held");
    assert_eq!(status.phase, MigrationPhase::Aborted);
    assert_eq!(condition_of(&status.conditions, "Aborted").1, "Superseded");
    assert_eq!(status.held, None);
    assert_eq!(t.held_moves("migration", "DisruptionWindow"), 0);
    t.migration_until(&by, MigrationPhase::Completed).await;
    assert_ne!(t.node_of_replica(0), node, "the job left the noticed node");
}
