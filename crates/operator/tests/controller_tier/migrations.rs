//! The Migration pass: admit (or reject, or queue), then drive the migration machine through
//! Manager's handshake, one pass at a time, recording each phase.

use std::sync::Arc;
use std::time::Duration;

use automanager_api::{self as api, Bundle, Migration, MigrationPhase, MigrationStatus};
use automanager_operator::controllers;
use automanager_operator::mapping;
use http::Method;
use kube::runtime::controller::Action;
use manager_client::proto;

use super::Tier;
use super::common::{condition_of, requeue};

const MIGRATIONS: &str = "/apis/automanager.norsk.io/v1alpha1/namespaces/live/migrations";

impl Tier {
    /// Bundle `live/name`: `replicas` of one silver job declaring `strategy`, on onprem, placed
    /// and running.
    pub(crate) async fn running_bundle_moving_by(&self, name: &str, replicas: i32, strategy: &str) {
        let mut b = Bundle::new(
            name,
            serde_json::from_value(serde_json::json!({
                "replicas": replicas,
                "pools": ["onprem"],
                "jobs": [{
                    "jobName": "enc",
                    "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": "silver"},
                    "migration": {"strategy": strategy},
                }],
            }))
            .unwrap(),
        );
        b.metadata.namespace = Some("live".into());
        self.api.insert(&b);
        self.bundle_pass(name).await.expect("the finalizer pass");
        self.bundle_pass(name).await.expect("the placing pass");
        let id = mapping::bundle_id("live", name);
        self.until_mirror("the bundle's jobs run", |m| {
            (m.jobs.values())
                .filter(|j| j.bundle_id == id && j.state() == proto::JobState::Running)
                .count()
                == usize::try_from(replicas).unwrap()
        })
        .await;
        self.api.clear_calls();
        self.manager.clear_calls();
    }

    /// A Migration `name` of replica `replica` of bundle `live/bundle`'s job `enc`.
    fn migration(&self, name: &str, bundle: &str, replica: i32, extra: serde_json::Value) {
        let mut spec = serde_json::json!({
            "job": {"bundle": bundle, "replica": replica, "jobName": "enc"},
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        let mut m = Migration::new(name, serde_json::from_value(spec).unwrap());
        m.metadata.namespace = Some("live".into());
        self.api.insert(&m);
    }

    pub(crate) fn migration_status(&self, name: &str) -> MigrationStatus {
        (self.api.get::<Migration>(Some("live"), name))
            .and_then(|m| m.status)
            .unwrap_or_default()
    }

    /// One Migration pass over the object as stored now.
    pub(crate) async fn migration_pass(&self, name: &str) -> Result<Action, controllers::Error> {
        let m = (self.api.get::<Migration>(Some("live"), name)).expect("the Migration");
        controllers::migration::reconcile(Arc::new(m), self.ctx.clone()).await
    }

    /// Passes until the Migration's phase is `phase` (Manager's side moves on its own clock).
    pub(crate) async fn migration_until(&self, name: &str, phase: MigrationPhase) {
        let deadline = tokio::time::Instant::now() + super::BOUND;
        while self.migration_status(name).phase != phase {
            assert!(
                tokio::time::Instant::now() < deadline,
                "never {phase:?}: {:?}",
                self.migration_status(name)
            );
            self.migration_pass(name).await.expect("a pass");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn a_migration_of_a_bundle_that_does_not_exist_is_rejected_and_touches_nothing() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.migration("move", "nowhere", 0, serde_json::json!({}));
    t.migration_pass("move").await.expect("the finalizer pass");

    t.migration_pass("move").await.expect("the pass");

    let status = t.migration_status("move");
    assert_eq!(status.phase, MigrationPhase::Rejected);
    let (on, reason, message) = condition_of(&status.conditions, "Rejected");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "UnknownJob"));
    assert_eq!(message, "Bundle live/nowhere does not exist");
    assert!(t.manager.calls().is_empty(), "{:?}", t.manager.calls());
}

#[tokio::test]
async fn a_migration_asking_for_a_stronger_promise_than_the_job_declares_is_refused() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.running_bundle_moving_by("news", 1, "stopThenStart").await;
    t.migration(
        "move",
        "news",
        0,
        serde_json::json!({"strategy": "overlap"}),
    );
    t.migration_pass("move").await.expect("the finalizer pass");

    t.migration_pass("move").await.expect("the pass");

    let status = t.migration_status("move");
    assert_eq!(status.phase, MigrationPhase::Rejected);
    assert_eq!(
        condition_of(&status.conditions, "Rejected").1,
        "StrategyRefused"
    );
    assert!(t.manager.calls().is_empty());
}

#[tokio::test]
async fn an_overlap_migration_moves_the_job_through_managers_handshake_phase_by_phase() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.running_bundle_moving_by("news", 1, "overlap").await;
    let job = t.manager_jobs("news").remove(0);
    let source = t
        .ctx
        .manager
        .mirror()
        .read(|m| m.jobs[&job].node_id.clone());
    t.migration("move", "news", 0, serde_json::json!({}));

    t.migration_pass("move").await.expect("the finalizer pass");
    assert_eq!(t.api.writes(), [format!("PATCH {MIGRATIONS}/move")]);
    t.migration_until("move", MigrationPhase::Completed).await;

    let status = t.migration_status("move");
    let target = status.target_node.clone().expect("a target");
    assert_ne!(target, source);
    assert_eq!(status.source_node.as_deref(), Some(source.as_str()));
    let phases: Vec<MigrationPhase> = status.phases.iter().map(|p| p.phase).collect();
    assert_eq!(
        phases.first(),
        Some(&MigrationPhase::PlacingTarget),
        "{phases:?}"
    );
    assert_eq!(
        phases.last(),
        Some(&MigrationPhase::Completed),
        "{phases:?}"
    );
    let calls = t.manager.calls();
    let named = |n: &str| calls.iter().filter(|c| c.starts_with(n)).count();
    assert_eq!(
        (
            named("MigrationGetState"),
            named("MigrationPrepareTarget"),
            named("MigrationCutover")
        ),
        (1, 1, 1),
        "{calls:?}"
    );
    assert_eq!(named("StartJob"), 0, "Manager starts the target itself");
    t.until_mirror("the job runs on the target", |m| {
        m.jobs[&job].node_id == target
    })
    .await;
    assert_eq!(
        condition_of(&status.conditions, "Ready").0,
        "True",
        "{:?}",
        status.conditions
    );
    // The library's onMigrationCompleted.
    assert_eq!(t.events_with("MigrationCompleted").await, 1);
}

#[tokio::test]
async fn a_second_migration_of_a_job_being_moved_is_refused_not_queued() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.running_bundle_moving_by("news", 1, "overlap").await;
    t.migration("first", "news", 0, serde_json::json!({}));
    t.migration_pass("first").await.expect("the finalizer pass");
    t.migration_pass("first").await.expect("the first begins");
    assert_ne!(t.migration_status("first").phase, MigrationPhase::Pending);
    t.migration("second", "news", 0, serde_json::json!({}));

    t.migration_pass("second")
        .await
        .expect("the finalizer pass");
    t.migration_pass("second").await.expect("the pass");

    let status = t.migration_status("second");
    assert_eq!(status.phase, MigrationPhase::Rejected);
    assert_eq!(
        condition_of(&status.conditions, "Rejected").1,
        "ConcurrentMigration"
    );
}

#[tokio::test]
async fn past_the_fleets_parallel_limit_a_migration_waits_in_the_queue_and_says_where() {
    let t = Tier::start(|c| c.migration.max_parallel = 1)
        .await
        .with_example_pools()
        .await;
    t.running_bundle_moving_by("news", 2, "overlap").await;
    t.migration("first", "news", 0, serde_json::json!({}));
    t.migration("second", "news", 1, serde_json::json!({}));
    for name in ["first", "second"] {
        t.migration_pass(name).await.expect("the finalizer pass");
    }
    t.migration_pass("first").await.expect("the first begins");
    t.manager.clear_calls();

    let next = t.migration_pass("second").await.expect("the second waits");

    let status = t.migration_status("second");
    assert_eq!(status.phase, MigrationPhase::Pending);
    assert_eq!(status.queue_position, Some(1));
    let (on, reason, message) = condition_of(&status.conditions, "Queued");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "QueueFull"));
    assert!(message.contains("migration.maxParallel (1)"), "{message}");
    assert!(t.manager.calls().is_empty(), "{:?}", t.manager.calls());
    assert!(matches!(next, a if a != Action::await_change()), "polled");
    assert_eq!(t.events_with("MigrationQueued").await, 1);
}

#[tokio::test]
async fn an_abort_before_the_start_ends_the_migration_without_touching_manager() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.running_bundle_moving_by("news", 1, "overlap").await;
    t.migration(
        "move",
        "news",
        0,
        serde_json::json!({"abort": {"reason": "changed my mind"}}),
    );

    t.migration_pass("move").await.expect("the finalizer pass");
    t.migration_pass("move").await.expect("the pass");

    let status = t.migration_status("move");
    assert_eq!(status.phase, MigrationPhase::Aborted);
    assert!(t.manager.calls().is_empty(), "{:?}", t.manager.calls());
    // The library's onMigrationAborted, with the reason.
    let events = t.events().await;
    let aborted: Vec<&String> = (events.iter())
        .filter(|(r, _)| r == "MigrationAborted")
        .map(|(_, note)| note)
        .collect();
    assert_eq!(aborted.len(), 1, "{events:?}");
    assert!(aborted[0].contains("changed my mind"), "{aborted:?}");
}

#[tokio::test]
async fn while_manager_is_unreachable_a_migration_is_reconciling_and_looked_at_in_seconds() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.running_bundle_moving_by("news", 1, "overlap").await;
    t.migration("move", "news", 0, serde_json::json!({}));
    t.migration_pass("move").await.expect("the finalizer pass");
    t.manager.set_cut(true);
    t.until_manager_ready(false).await;
    t.manager.clear_calls();

    let next = t.migration_pass("move").await.expect("the pass");

    let status = t.migration_status("move");
    assert_eq!(status.phase, MigrationPhase::Pending);
    let (on, reason, _) = condition_of(&status.conditions, "Reconciling");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "ManagerUnavailable")
    );
    assert_eq!(condition_of(&status.conditions, "Stalled").0, "False");
    assert_eq!(next, requeue(Duration::from_secs(3)));
    assert!(t.manager.calls().is_empty());
}

#[tokio::test]
async fn a_refused_propose_is_retried_on_the_next_pass_from_where_it_was() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.running_bundle_moving_by("news", 1, "overlap").await;
    t.migration("move", "news", 0, serde_json::json!({}));
    t.migration_pass("move").await.expect("the finalizer pass");
    t.manager.refuse_next(
        "MigrationGetState",
        tonic::Status::unavailable("Manager restarting"),
    );

    let err = t.migration_pass("move").await.expect_err("the call failed");

    assert!(matches!(err, controllers::Error::Manager(_)), "{err}");
    t.migration_until("move", MigrationPhase::Completed).await;
    assert_eq!(
        t.manager.calls_named("MigrationGetState").len(),
        2,
        "asked again once"
    );
}

#[tokio::test]
async fn a_stale_status_write_fails_the_pass_as_a_conflict() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.migration("move", "nowhere", 0, serde_json::json!({}));
    t.migration_pass("move").await.expect("the finalizer pass");
    t.api
        .refuse_next(Method::PATCH, "/migrations/move/status", 409);

    let err = t.migration_pass("move").await.expect_err("the conflict");

    assert!(controllers::is_conflict(&err), "{err}");
    assert_eq!(t.migration_status("move").phase, MigrationPhase::Pending);
    t.migration_pass("move").await.expect("the retry");
    assert_eq!(t.migration_status("move").phase, MigrationPhase::Rejected);
}

impl Tier {
    /// Where each job of replica 0 of bundle `live/name` runs, by the mirror.
    fn nodes_of(&self, name: &str) -> std::collections::BTreeMap<String, String> {
        let id = mapping::bundle_id("live", name);
        self.ctx.manager.mirror().read(|m| {
            m.jobs_of_bundle(&id)
                .filter(|j| j.replica == 0 && j.state() == proto::JobState::Running)
                .map(|j| (j.job_name.clone(), j.node_id.clone()))
                .collect()
        })
    }
}

/// Moving `enc`, which `pkg` declares `coLocateWith`: the target is chosen for both, and once
/// `enc` has moved a Migration of `pkg` follows it to the same node.
#[tokio::test]
async fn a_job_another_is_co_located_with_moves_and_the_other_follows_it() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", api::PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    t.running("news").await;
    let before = t.nodes_of("news");
    assert_eq!(before["enc"], before["pkg"]);
    t.migration("move", "news", 0, serde_json::json!({}));
    t.migration_pass("move").await.expect("the finalizer pass");

    t.migration_until("move", MigrationPhase::Completed).await;

    let target = t.migration_status("move").target_node.expect("a target");
    assert_ne!(target, before["enc"]);
    let pkg_id = mapping::bundle_id("live", "news") + "/0/pkg";
    let follower = controllers::drain::named_migration("follow", "move", &pkg_id);
    let f = t
        .api
        .get::<Migration>(Some("live"), &follower)
        .expect("a Migration of pkg follows");
    assert_eq!(f.spec.job.job_name, "pkg");
    assert_eq!(f.spec.target_node.as_deref(), Some(target.as_str()));
    assert!(t.ctx.events.flush(super::BOUND).await);
    assert_eq!(t.events_for("move", "FollowerCreated").len(), 1);

    t.migration_pass(&follower)
        .await
        .expect("the finalizer pass");
    t.migration_until(&follower, MigrationPhase::Completed)
        .await;
    t.until_mirror("the pair runs together on the target", |m| {
        let id = mapping::bundle_id("live", "news");
        m.jobs_of_bundle(&id)
            .all(|j| j.node_id == target && j.state() == proto::JobState::Running)
    })
    .await;
    // A second pass of the ended Migration asks for no second follower.
    t.migration_pass("move")
        .await
        .expect("a pass after the end");
    assert_eq!(t.events_for("move", "FollowerCreated").len(), 1);
}

/// Two Migrations of one co-location group (as a drain makes them): the second waits while the
/// first runs, then goes where the first put the group.
#[tokio::test]
async fn the_second_migration_of_a_co_located_pair_waits_for_the_first_then_joins_it() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", api::PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    t.running("news").await;
    let before = t.nodes_of("news");
    t.migration("move", "news", 0, serde_json::json!({}));
    let mut pkg = Migration::new(
        "move-pkg",
        serde_json::from_value(serde_json::json!({
            "job": {"bundle": "news", "replica": 0, "jobName": "pkg"},
        }))
        .unwrap(),
    );
    pkg.metadata.namespace = Some("live".into());
    t.api.insert(&pkg);
    t.migration_pass("move").await.expect("the finalizer pass");
    t.migration_pass("move-pkg")
        .await
        .expect("the finalizer pass");
    t.migration_pass("move")
        .await
        .expect("enc's Migration begins");

    t.migration_pass("move-pkg").await.expect("pkg's pass");

    let status = t.migration_status("move-pkg");
    assert_eq!(status.phase, MigrationPhase::Pending);
    let (on, reason, message) = condition_of(&status.conditions, "Queued");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "CoLocatedMigration")
    );
    assert!(message.contains("job enc"), "{message}");

    t.migration_until("move", MigrationPhase::Completed).await;
    let target = t.migration_status("move").target_node.expect("a target");
    assert_ne!(target, before["enc"]);
    t.migration_until("move-pkg", MigrationPhase::Completed)
        .await;
    assert_eq!(
        t.migration_status("move-pkg").target_node.as_deref(),
        Some(target.as_str()),
        "pinned to where enc went"
    );
    let follower = controllers::drain::named_migration(
        "follow",
        "move",
        &(mapping::bundle_id("live", "news") + "/0/pkg"),
    );
    assert!(
        t.api.get::<Migration>(Some("live"), &follower).is_none(),
        "pkg had a Migration of its own: no follower"
    );
}
