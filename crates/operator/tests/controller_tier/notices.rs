//! Deadlines beat holds: a reclaim notice's move takes over a job's held voluntary Migration (a
//! drain's, a consolidation's, a rebalance's, a person's, held by a window, a budget or the
//! queue), which ends superseded and never acts; and a held Migration whose source node is gone
//! ends with that reason instead of moving the job from wherever its recovery put it.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use automanager_api::{self as api, Bundle, Migration, MigrationPhase, MigrationStatus};
use automanager_operator::controllers;
use automanager_operator::mapping;
use kube::ResourceExt;
use manager_client::proto;

use super::common::condition_of;
use super::{BOUND, Tier};

/// Whose held Migration the notice meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Drain,
    Consolidation,
    Rebalance,
    User,
}

/// What holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// The Bundle's disruption window is closed (it opens at 14:00; the clock says 12:00).
    Window,
    /// The other replica is being moved and the budget allows one down.
    Budget,
    /// `migration.maxParallel` is 1 and another migration runs.
    Queue,
}

impl Hold {
    fn queued_reason(self) -> &'static str {
        match self {
            Hold::Window => "DisruptionWindow",
            Hold::Budget => "DisruptionBudget",
            Hold::Queue => "QueueFull",
        }
    }
}

impl Tier {
    /// Bundle `live/news`: `replicas` of one gold job `enc` declaring `overlap`, on onprem,
    /// placed and running, with `disruption` as its spec's.
    pub(crate) async fn gold_overlap_bundle(&self, replicas: i32, disruption: serde_json::Value) {
        self.gold_overlap_bundle_named("news", replicas, disruption)
            .await;
    }

    async fn gold_overlap_bundle_named(
        &self,
        name: &str,
        replicas: i32,
        disruption: serde_json::Value,
    ) {
        let mut spec = serde_json::json!({
            "replicas": replicas,
            "pools": ["onprem"],
            "jobs": [{
                "jobName": "enc",
                "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": "gold"},
                "migration": {"strategy": "overlap"},
            }],
        });
        if !disruption.is_null() {
            spec["disruption"] = disruption;
        }
        let mut b = Bundle::new(name, serde_json::from_value(spec).unwrap());
        b.metadata.namespace = Some("live".into());
        self.api.insert(&b);
        self.bundle_pass(name).await.expect("the finalizer pass");
        self.bundle_pass(name).await.expect("the placing pass");
        self.running(name).await;
    }

    /// The node replica `replica` of `live/news`'s job runs on, by the mirror.
    pub(crate) fn node_of_replica(&self, replica: u32) -> String {
        let id = mapping::bundle_id("live", "news");
        self.ctx.manager.mirror().read(|m| {
            let job = m.job_of(&id, replica, "enc").expect("the job");
            job.instances
                .iter()
                .find(|i| i.is_normal() && i.state() == proto::JobState::Running)
                .map(|i| i.node_id.clone())
                .expect("running")
        })
    }

    /// A Migration `name` of `bundle`'s replica `replica`, labelled and annotated as `kind`
    /// makes them (`node`: the node it was made for).
    pub(crate) fn kind_migration(
        &self,
        name: &str,
        kind: Kind,
        bundle: &str,
        replica: i32,
        node: &str,
    ) {
        let mut m = Migration::new(
            name,
            serde_json::from_value(serde_json::json!({
                "job": {"bundle": bundle, "replica": replica, "jobName": "enc"},
            }))
            .unwrap(),
        );
        m.metadata.namespace = Some("live".into());
        let (labels, annotations): (BTreeMap<String, String>, BTreeMap<String, String>) = match kind
        {
            Kind::Drain => (
                [(
                    api::DRAIN_NODE_LABEL.to_owned(),
                    controllers::drain::node_label(node),
                )]
                .into(),
                [(api::DRAIN_NODE_ANNOTATION.to_owned(), node.to_owned())].into(),
            ),
            Kind::Consolidation => (
                [(api::PURPOSE_LABEL.to_owned(), "consolidation".to_owned())].into(),
                [(
                    api::CONSOLIDATION_NODE_ANNOTATION.to_owned(),
                    node.to_owned(),
                )]
                .into(),
            ),
            Kind::Rebalance => (
                [(api::PURPOSE_LABEL.to_owned(), "rebalance".to_owned())].into(),
                BTreeMap::new(),
            ),
            Kind::User => (BTreeMap::new(), BTreeMap::new()),
        };
        m.metadata.labels = Some(labels);
        m.metadata.annotations = Some(annotations);
        self.api.insert(&m);
    }

    /// A Migration `name` of `bundle`'s replica `replica` already under way from `source`
    /// (never driven here): it holds a queue slot and takes its replica down.
    fn under_way(&self, name: &str, bundle: &str, replica: i32, source: &str) {
        self.kind_migration(name, Kind::User, bundle, replica, source);
        self.api.edit_status::<Migration>(Some("live"), name, |m| {
            let s = m.status.get_or_insert_default();
            s.phase = MigrationPhase::StartingTarget;
            s.source_node = Some(source.to_owned());
        });
    }

    /// Manager announces it takes `node` in `in_ms`; answers the deadline once the mirror shows it.
    pub(crate) async fn notice(&self, node: &str, in_ms: u64) -> chrono::DateTime<chrono::Utc> {
        self._sim.with_world(|w, now| {
            w.notice_node(node, in_ms, "spot", now).unwrap();
        });
        self.ctx
            .manager
            .wait_until(BOUND, |m| m.noticed_nodes().any(|n| n.node_id == node))
            .await
            .expect("the mirror shows the notice");
        let at = self
            .ctx
            .manager
            .mirror()
            .read(|m| m.nodes[node].reclaim_at_ms);
        chrono::DateTime::from_timestamp_millis(at).expect("a deadline")
    }

    /// The reclaim Migrations of `live`.
    pub(crate) fn reclaim_migrations(&self) -> Vec<Migration> {
        (self.api.list_all::<Migration>().into_iter())
            .filter(|m| m.labels().get(api::PURPOSE_LABEL).map(String::as_str) == Some("reclaim"))
            .collect()
    }

    fn migration_calls(&self) -> Vec<String> {
        (self.manager.calls().into_iter())
            .filter(|c| c.starts_with("Migration"))
            .collect()
    }
}

/// The held Migration `held` ended superseded by `by`, as ready, naming it.
fn assert_superseded(status: &MigrationStatus, by: &str) {
    assert_eq!(status.phase, MigrationPhase::Aborted, "{status:?}");
    let (on, reason, message) = condition_of(&status.conditions, "Aborted");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "Superseded"));
    assert!(
        message.contains(by) && message.contains("reclaim notice"),
        "{message}"
    );
    let (ready, reason, _) = condition_of(&status.conditions, "Ready");
    assert_eq!((ready.as_str(), reason.as_str()), ("True", "Superseded"));
    let abort = status.abort.as_ref().expect("status.abort");
    assert_eq!(
        (abort.by.as_str(), abort.phase),
        ("operator", MigrationPhase::Pending)
    );
}

/// A `kind` Migration of replica 0 held by `hold`; a notice for replica 0's node; the notice's
/// move takes the job over at once, the held one ends superseded and never acts.
async fn a_notice_takes_over(kind: Kind, hold: Hold) {
    let t = Tier::start(|c| {
        if hold == Hold::Queue {
            c.migration.max_parallel = 1;
        }
    })
    .await
    .with_example_pools()
    .await;
    let (replicas, disruption) = match hold {
        Hold::Window => (
            1,
            serde_json::json!({"windows": [{"schedule": "0 14 * * *", "duration": "1h"}]}),
        ),
        Hold::Budget => (2, serde_json::json!({"maxUnavailableReplicas": 1})),
        Hold::Queue => (1, serde_json::Value::Null),
    };
    t.gold_overlap_bundle(replicas, disruption).await;
    let node = t.node_of_replica(0);
    match hold {
        Hold::Budget => t.under_way("moving-r1", "news", 1, &t.node_of_replica(1)),
        Hold::Queue => t.under_way("busy", "elsewhere", 0, "onprem-b1"),
        Hold::Window => {}
    }
    t.kind_migration("held", kind, "news", 0, &node);
    t.migration_pass("held").await.expect("the finalizer pass");
    t.migration_pass("held").await.expect("the held pass");
    let status = t.migration_status("held");
    assert_eq!(status.phase, MigrationPhase::Pending, "{status:?}");
    let (_, reason, _) = condition_of(&status.conditions, "Queued");
    assert_eq!(reason, hold.queued_reason(), "{:?}", status.conditions);
    assert_eq!(status.source_node.as_deref(), Some(node.as_str()));

    let deadline = t.notice(&node, 60_000).await;
    if hold == Hold::Budget {
        // Fifteen seconds before the deadline: time for one move (10 s), not for waiting for
        // the other replica's first.
        let to = (deadline - chrono::TimeDelta::seconds(15)) - t.ctx.clock.now();
        t.clock.advance(to.to_std().expect("the deadline is ahead"));
    }
    t.manager.clear_calls();
    let mut told = HashMap::new();
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("the reclaim pass");

    let reclaim = t.reclaim_migrations();
    assert_eq!(reclaim.len(), 1, "{:?}", t.api.writes());
    let by = reclaim[0].name_any();
    assert!(
        reclaim[0]
            .annotations()
            .contains_key(api::DEADLINE_ANNOTATION)
    );
    let summary = &told[&node];
    assert!(
        summary.contains("1 job(s) moving now (taking over held Migration(s) held)")
            && summary.contains("left to band recovery: none"),
        "{summary}"
    );
    t.migration_pass(&by).await.expect("the finalizer pass");
    t.migration_pass(&by).await.expect("the admitting pass");
    assert_superseded(&t.migration_status("held"), &by);
    t.migration_until(&by, MigrationPhase::Completed).await;
    assert_ne!(t.node_of_replica(0), node, "the job left the noticed node");

    // The held one never acts, however often it is looked at, window open or not.
    t.manager.clear_calls();
    t.clock.advance(Duration::from_secs(3 * 3600));
    t.migration_pass("held").await.expect("a later pass");
    assert_eq!(t.migration_calls(), Vec::<String>::new());
    assert_superseded(&t.migration_status("held"), &by);
    assert_eq!(t.events_with("MigrationEnded").await, 1);
}

#[tokio::test]
async fn a_notice_takes_over_a_drain_held_by_a_window() {
    a_notice_takes_over(Kind::Drain, Hold::Window).await;
}

#[tokio::test]
async fn a_notice_takes_over_a_drain_held_by_a_budget() {
    a_notice_takes_over(Kind::Drain, Hold::Budget).await;
}

#[tokio::test]
async fn a_notice_takes_over_a_drain_held_by_the_queue() {
    a_notice_takes_over(Kind::Drain, Hold::Queue).await;
}

#[tokio::test]
async fn a_notice_takes_over_a_consolidation_held_by_a_window() {
    a_notice_takes_over(Kind::Consolidation, Hold::Window).await;
}

#[tokio::test]
async fn a_notice_takes_over_a_consolidation_held_by_a_budget() {
    a_notice_takes_over(Kind::Consolidation, Hold::Budget).await;
}

#[tokio::test]
async fn a_notice_takes_over_a_consolidation_held_by_the_queue() {
    a_notice_takes_over(Kind::Consolidation, Hold::Queue).await;
}

#[tokio::test]
async fn a_notice_takes_over_a_rebalance_held_by_a_window() {
    a_notice_takes_over(Kind::Rebalance, Hold::Window).await;
}

#[tokio::test]
async fn a_notice_takes_over_a_rebalance_held_by_a_budget() {
    a_notice_takes_over(Kind::Rebalance, Hold::Budget).await;
}

#[tokio::test]
async fn a_notice_takes_over_a_rebalance_held_by_the_queue() {
    a_notice_takes_over(Kind::Rebalance, Hold::Queue).await;
}

// A person's Migration is never held by a window (only drains, consolidation and rebalancing
// are), so that pairing does not exist.

#[tokio::test]
async fn a_notice_takes_over_a_users_migration_held_by_a_budget() {
    a_notice_takes_over(Kind::User, Hold::Budget).await;
}

#[tokio::test]
async fn a_notice_takes_over_a_users_migration_held_by_the_queue() {
    a_notice_takes_over(Kind::User, Hold::Queue).await;
}

#[tokio::test]
async fn a_held_migration_created_after_the_notices_move_is_superseded_by_its_own_pass() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.gold_overlap_bundle(
        1,
        serde_json::json!({"windows": [{"schedule": "0 14 * * *", "duration": "1h"}]}),
    )
    .await;
    let node = t.node_of_replica(0);
    t.notice(&node, 60_000).await;
    let mut told = HashMap::new();
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("the reclaim pass");
    let by = t.reclaim_migrations()[0].name_any();
    // A drain asked for a moment later, before the notice's move was looked at.
    t.kind_migration("late-drain", Kind::Drain, "news", 0, &node);
    t.migration_pass("late-drain")
        .await
        .expect("the finalizer pass");
    t.manager.clear_calls();

    t.migration_pass("late-drain").await.expect("its pass");

    assert_superseded(&t.migration_status("late-drain"), &by);
    assert_eq!(t.migration_calls(), Vec::<String>::new());
    t.migration_pass(&by).await.expect("the finalizer pass");
    t.migration_until(&by, MigrationPhase::Completed).await;
}

#[tokio::test]
async fn a_drain_whose_migration_a_notice_took_over_neither_hands_the_job_over_nor_moves_it_again()
{
    let (t, _sync) = Tier::start(|_| {})
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
    t.set_node_spec(
        &node,
        api::ManagerNodeSpec {
            cordoned: false,
            drain: Some(api::Drain {
                mode: api::DrainMode::Migrate,
                when_held: None,
            }),
        },
    );
    t.node_pass(&node).await.expect("the drain's first step");
    let job = t.manager_jobs("news").remove(0);
    let drain = controllers::drain::migration_name(&node, &job);
    t.migration_pass(&drain).await.expect("the finalizer pass");
    t.migration_pass(&drain).await.expect("the held pass");
    assert_eq!(
        condition_of(&t.migration_status(&drain).conditions, "Queued").1,
        "DisruptionWindow"
    );

    t.notice(&node, 60_000).await;
    let mut told = HashMap::new();
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("the reclaim pass");
    let by = t.reclaim_migrations()[0].name_any();
    t.migration_pass(&by).await.expect("the finalizer pass");
    t.migration_pass(&by).await.expect("the admitting pass");
    assert_superseded(&t.migration_status(&drain), &by);
    t.manager.clear_calls();
    t.node_pass(&node)
        .await
        .expect("a drain step while it moves");
    assert_eq!(
        t.manager.calls_named("StopJob"),
        Vec::<String>::new(),
        "never handed to recovery"
    );
    t.migration_until(&by, MigrationPhase::Completed).await;
    t.node_pass(&node).await.expect("a drain step after");

    assert_eq!(t.events_with("DrainFallback").await, 0);
    assert_eq!(
        t.manager.calls_named("StopJob"),
        Vec::<String>::new(),
        "never handed to recovery"
    );
    assert_eq!(
        (t.api.list_all::<Migration>().iter())
            .filter(|m| m.name_any().starts_with("drain-"))
            .count(),
        1,
        "no second drain Migration for the job"
    );
}

#[tokio::test]
async fn a_held_drain_migration_whose_node_is_gone_ends_and_never_moves_the_recovered_job() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.gold_overlap_bundle(
        1,
        serde_json::json!({"windows": [{"schedule": "0 14 * * *", "duration": "1h"}]}),
    )
    .await;
    let node = t.node_of_replica(0);
    t.kind_migration("drain-held", Kind::Drain, "news", 0, &node);
    t.migration_pass("drain-held")
        .await
        .expect("the finalizer pass");
    t.migration_pass("drain-held").await.expect("the held pass");
    assert_eq!(
        t.migration_status("drain-held").phase,
        MigrationPhase::Pending
    );

    // The node dies; gold recovers elsewhere.
    t._sim
        .with_world(|w, now| w.kill_node(&node, now))
        .expect("killed");
    let id = mapping::bundle_id("live", "news");
    t.until_mirror("the job failed", |m| {
        m.jobs_of_bundle(&id)
            .all(|j| j.state() == proto::JobState::Failed)
    })
    .await;
    t.sync_model();
    t.bundle_pass("news").await.expect("the recovery");
    t.running("news").await;
    let recovered = t.node_of_replica(0);
    assert_ne!(recovered, node);
    t.manager.clear_calls();

    // The window opens: the held move would have moved the job off its new node.
    t.clock.advance(Duration::from_secs(2 * 3600 + 60));
    t.migration_pass("drain-held").await.expect("the pass");

    let status = t.migration_status("drain-held");
    assert_eq!(status.phase, MigrationPhase::Aborted, "{status:?}");
    let (_, reason, message) = condition_of(&status.conditions, "Aborted");
    assert_eq!(reason, "SourceGone");
    assert!(
        message.contains(&format!("its source node {node} is gone (terminated)")),
        "{message}"
    );
    assert_eq!(t.migration_calls(), Vec::<String>::new());
    assert_eq!(t.node_of_replica(0), recovered);
}

#[tokio::test]
async fn a_reclaim_label_without_a_notice_takes_nothing_over_and_passes_no_limit() {
    let t = Tier::start(|c| c.migration.max_parallel = 1)
        .await
        .with_example_pools()
        .await;
    t.gold_overlap_bundle(
        1,
        serde_json::json!({"windows": [{"schedule": "0 14 * * *", "duration": "1h"}]}),
    )
    .await;
    let node = t.node_of_replica(0);
    t.kind_migration("held", Kind::Drain, "news", 0, &node);
    t.migration_pass("held").await.expect("the finalizer pass");
    t.migration_pass("held").await.expect("the held pass");
    // A person labels a Migration as a reclaim move; Manager announced nothing.
    let mut forged = Migration::new(
        "x-forged",
        serde_json::from_value(serde_json::json!({
            "job": {"bundle": "news", "replica": 0, "jobName": "enc"},
        }))
        .unwrap(),
    );
    forged.metadata.namespace = Some("live".into());
    forged.metadata.labels = Some([(api::PURPOSE_LABEL.to_owned(), "reclaim".to_owned())].into());
    t.api.insert(&forged);
    t.migration_pass("x-forged")
        .await
        .expect("the finalizer pass");

    t.migration_pass("x-forged").await.expect("its pass");

    let status = t.migration_status("x-forged");
    assert_eq!(status.phase, MigrationPhase::Rejected, "{status:?}");
    assert_eq!(
        condition_of(&status.conditions, "Rejected").1,
        "ConcurrentMigration"
    );
    assert_eq!(t.migration_status("held").phase, MigrationPhase::Pending);
    assert_eq!(t.migration_calls(), Vec::<String>::new());

    // Nor does the label jump the queue's limits.
    t.under_way("busy", "elsewhere", 0, "onprem-b1");
    t.gold_overlap_bundle_named("other", 1, serde_json::Value::Null)
        .await;
    t.kind_migration("forged-2", Kind::User, "other", 0, &node);
    t.api.edit::<Migration>(Some("live"), "forged-2", |m| {
        m.metadata
            .labels
            .get_or_insert_default()
            .insert(api::PURPOSE_LABEL.to_owned(), "reclaim".to_owned());
    });
    t.migration_pass("forged-2")
        .await
        .expect("the finalizer pass");
    t.migration_pass("forged-2").await.expect("its pass");
    let status = t.migration_status("forged-2");
    assert_eq!(status.phase, MigrationPhase::Pending, "{status:?}");
    assert_eq!(condition_of(&status.conditions, "Queued").1, "QueueFull");
}

#[tokio::test]
async fn a_drain_of_a_job_another_migration_is_moving_waits_for_it_and_hands_nothing_over() {
    let (t, _sync) = Tier::start(|_| {})
        .await
        .with_example_pools()
        .await
        .with_node_objects()
        .await;
    t.gold_overlap_bundle(1, serde_json::Value::Null).await;
    let node = t.node_of_replica(0);
    // A notice's move of the job is under way when the node is drained.
    t.under_way("reclaim-move", "news", 0, &node);
    t.set_node_spec(
        &node,
        api::ManagerNodeSpec {
            cordoned: false,
            drain: Some(api::Drain {
                mode: api::DrainMode::Migrate,
                when_held: None,
            }),
        },
    );
    t.api.clear_calls();
    t.manager.clear_calls();
    let created = |t: &Tier| {
        (t.api.writes().into_iter())
            .filter(|w| w.starts_with("POST") && w.ends_with("/migrations"))
            .count()
    };

    t.node_pass(&node).await.expect("a drain step");

    assert_eq!(created(&t), 0, "{:?}", t.api.writes());
    assert_eq!(t.manager.calls_named("StopJob"), Vec::<String>::new());

    // That move ends without taking the job off the node: the drain moves it then.
    t.api
        .edit_status::<Migration>(Some("live"), "reclaim-move", |m| {
            m.status.get_or_insert_default().phase = MigrationPhase::Aborted;
        });
    t.node_pass(&node).await.expect("the next step");
    assert_eq!(created(&t), 1, "{:?}", t.api.writes());
    assert_eq!(t.manager.calls_named("StopJob"), Vec::<String>::new());
}

#[tokio::test]
async fn a_new_drain_of_a_node_ignores_and_removes_a_migration_that_ended_source_gone() {
    let (t, _sync) = Tier::start(|_| {})
        .await
        .with_example_pools()
        .await
        .with_node_objects()
        .await;
    t.gold_overlap_bundle(1, serde_json::Value::Null).await;
    let node = t.node_of_replica(0);
    let job = t.manager_jobs("news").remove(0);
    // An earlier drain of a node of this name left its Migration, ended SourceGone.
    let stale = controllers::drain::migration_name(&node, &job);
    t.kind_migration(&stale, Kind::Drain, "news", 0, &node);
    t.api.edit_status::<Migration>(Some("live"), &stale, |m| {
        let s = m.status.get_or_insert_default();
        s.phase = MigrationPhase::Aborted;
        s.conditions = vec![api::Condition {
            type_: "Aborted".into(),
            status: api::ConditionStatus::True,
            reason: "SourceGone".into(),
            message: "its source node is gone".into(),
            last_transition_time: t.ctx.clock.now(),
            observed_generation: Some(1),
        }];
    });
    t.set_node_spec(
        &node,
        api::ManagerNodeSpec {
            cordoned: false,
            drain: Some(api::Drain {
                mode: api::DrainMode::Migrate,
                when_held: None,
            }),
        },
    );
    t.manager.clear_calls();

    t.node_pass(&node).await.expect("the first step");

    assert_eq!(
        t.manager.calls_named("StopJob"),
        Vec::<String>::new(),
        "not handed to recovery for an earlier drain's Migration"
    );
    assert_eq!(t.events_with("DrainFallback").await, 0);
    assert!(
        t.api
            .get::<Migration>(Some("live"), &stale)
            .is_none_or(|m| { m.status.is_none_or(|s| s.phase == MigrationPhase::Pending) }),
        "the stale Migration is gone (or replaced by this drain's)"
    );
    t.node_pass(&node).await.expect("the next step");
    let fresh = t
        .api
        .get::<Migration>(Some("live"), &stale)
        .expect("this drain's own Migration");
    assert_ne!(
        fresh.status.map(|s| s.phase),
        Some(MigrationPhase::Aborted),
        "a new one, not the stale one"
    );
}

#[tokio::test]
async fn a_notices_move_refused_by_a_move_under_way_is_made_again_once_that_one_ends_in_place() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.gold_overlap_bundle(1, serde_json::Value::Null).await;
    let node = t.node_of_replica(0);
    t.notice(&node, 60_000).await;
    let mut told = HashMap::new();
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("the reclaim pass");
    let by = t.reclaim_migrations()[0].name_any();
    // Another move of the job began in the same moment (admitted before the notice's was looked at).
    t.under_way("moving", "news", 0, &node);
    t.migration_pass(&by).await.expect("the finalizer pass");
    t.migration_pass(&by).await.expect("the refusing pass");
    assert_eq!(t.migration_status(&by).phase, MigrationPhase::Rejected);
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("a pass while the other moves");
    assert!(
        told[&node].contains("0 job(s) moving now, 1 in flight"),
        "{}",
        told[&node]
    );

    // The other move ends with the job still on the node: the notice's move is made again.
    t.api.edit_status::<Migration>(Some("live"), "moving", |m| {
        m.status.get_or_insert_default().phase = MigrationPhase::Aborted;
    });
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("the pass that removes the refused move");
    t.migration_pass(&by).await.expect("its cleanup");
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("the pass that makes it again");
    let again = t.reclaim_migrations();
    assert_eq!(again.len(), 1);
    assert_eq!(t.migration_status(&by).phase, MigrationPhase::Pending);
    t.migration_pass(&by).await.expect("the finalizer pass");
    t.migration_until(&by, MigrationPhase::Completed).await;
    assert!(
        !told[&node].contains("left to band recovery: live"),
        "{}",
        told[&node]
    );
}
