//! The rebalancer and preemption, as the Bundle pass runs them.

use automanager_api::{Bundle, Migration, PriorityBand};
use automanager_operator::mapping;
use kube::ResourceExt;
use manager_client::proto;

use super::Tier;
use super::common::condition_of;

impl Tier {
    /// Bundle `live/name` of `replicas` × one `band` job of `capacity` in onprem, with
    /// `extra` merged into its spec.
    fn banded_bundle(
        &self,
        name: &str,
        replicas: i32,
        band: PriorityBand,
        capacity: i64,
        extra: serde_json::Value,
    ) {
        let mut spec = serde_json::json!({
            "replicas": replicas, "pools": ["onprem"],
            "jobs": [{"jobName": "enc", "requirements": {
                "requiredCapacity": capacity, "requiredCores": 1, "priorityBand": band.as_str()},
                "migration": {"strategy": "overlap"}}],
        });
        if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
            s.extend(e.clone());
        }
        let mut b = Bundle::new(name, serde_json::from_value(spec).unwrap());
        b.metadata.namespace = Some("live".into());
        self.api.insert(&b);
    }

    /// The bundle's finalizer pass and its placing pass, then its jobs running (and the model
    /// caught up, as the mirror pump keeps it).
    async fn placed(&self, name: &str) {
        self.sync_model();
        self.bundle_pass(name).await.expect("the finalizer pass");
        self.bundle_pass(name).await.expect("the placing pass");
        let id = mapping::bundle_id("live", name);
        let replicas = self.stored_bundle(name).spec.replicas;
        self.until_mirror("its jobs run", |m| {
            m.jobs_of_bundle(&id)
                .filter(|j| j.state() == proto::JobState::Running)
                .count()
                == usize::try_from(replicas).unwrap()
        })
        .await;
        self.sync_model();
    }

    fn cordon_in_model(&self, node: &str, cordoned: bool) {
        let generation = self.ctx.state.node_generation(node);
        (self.ctx.manager.mirror()).read(|m| {
            self.ctx.state.apply_cordon(m, node, cordoned, generation);
        });
    }

    fn rebalance_condition(&self, name: &str) -> (String, String, String) {
        let status = self.stored_bundle(name).status.expect("a status");
        condition_of(&status.conditions, "RebalanceNeeded")
    }

    fn rebalance_migrations(&self) -> Vec<Migration> {
        self.api
            .list_all::<Migration>()
            .into_iter()
            .filter(|m| {
                m.labels()
                    .get(automanager_api::PURPOSE_LABEL)
                    .map(String::as_str)
                    == Some("rebalance")
            })
            .collect()
    }

    /// Bundle `news`, two replicas with `rebalance: true`, its second replica placed in the
    /// other rack because rack-a's other node was cordoned: it breaks `sameZone` (soft).
    async fn news_breaking_same_zone(&self) {
        self.cordon_in_model("onprem-a2", true);
        self.banded_bundle(
            "news",
            2,
            PriorityBand::Silver,
            10,
            serde_json::json!({"rebalance": true}),
        );
        self.placed("news").await;
        let status = self.stored_bundle("news").status.unwrap();
        let broken: Vec<String> = status
            .replicas
            .iter()
            .flat_map(|r| &r.jobs)
            .filter_map(|j| j.last_placement.as_ref())
            .flat_map(|t| t.broken_soft_rules.clone())
            .collect();
        assert!(!broken.is_empty(), "a soft rule was broken: {status:?}");
        self.manager.clear_calls();
        self.api.clear_calls();
    }
}

#[tokio::test]
async fn a_replica_breaking_a_soft_rule_waits_for_room_where_it_would_hold() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.news_breaking_same_zone().await;

    t.bundle_pass("news").await.expect("a pass");

    let (on, reason, message) = t.rebalance_condition("news");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "WaitingForCapacity")
    );
    assert!(message.contains("breaks soft rule(s)"), "{message}");
    assert!(t.rebalance_migrations().is_empty());
}

#[tokio::test]
async fn once_there_is_room_the_replica_moves_back_by_a_migration_one_at_a_time() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.news_breaking_same_zone().await;
    t.cordon_in_model("onprem-a2", false);

    t.bundle_pass("news").await.expect("the pass that moves it");

    let migrations = t.rebalance_migrations();
    assert_eq!(migrations.len(), 1, "{:?}", t.api.writes());
    let m = &migrations[0];
    assert_eq!(m.spec.target_node.as_deref(), Some("onprem-a2"));
    assert_eq!(
        (m.spec.job.bundle.as_str(), m.spec.job.job_name.as_str()),
        ("news", "enc")
    );
    let (on, reason, message) = t.rebalance_condition("news");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "MigrationStarted"));
    assert!(
        message.contains(&format!("(Migration {})", m.name_any())),
        "{message}"
    );
    assert_eq!(t.events_with("RebalanceStarted").await, 1);
    assert!(
        t.manager.changes().is_empty(),
        "the Migration moves it, not this pass"
    );

    t.bundle_pass("news").await.expect("a pass while it moves");

    assert_eq!(t.rebalance_migrations().len(), 1, "one at a time");
    assert_eq!(t.rebalance_condition("news").1, "MigrationInProgress");
}

#[tokio::test]
async fn the_fleets_rebalance_rate_holds_a_move_back() {
    let t = Tier::start(|c| c.rebalance.max_per_minute = 1)
        .await
        .with_example_pools()
        .await;
    t.news_breaking_same_zone().await;
    // The minute's one move is taken.
    let now = t.ctx.clock.now();
    assert!(t.ctx.state.take_rebalance_moves(1, now));
    t.cordon_in_model("onprem-a2", false);

    t.bundle_pass("news").await.expect("the pass");

    let (on, reason, message) = t.rebalance_condition("news");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "RateLimited"));
    assert!(message.contains("rebalance.maxPerMinute (1)"), "{message}");
    assert!(t.rebalance_migrations().is_empty());
}

#[tokio::test]
async fn a_gold_recovery_with_no_room_stops_bronze_jobs_on_one_node_and_is_placed_there() {
    let t = Tier::start(|c| c.bands.gold.preempt = true)
        .await
        .with_example_pools()
        .await;
    // Every node all but full: gold on one, bronze on the others.
    t.banded_bundle("gold", 1, PriorityBand::Gold, 150, serde_json::json!({}));
    t.placed("gold").await;
    let gold_node = t.replica_nodes("gold").remove(0);
    for (i, node) in ["onprem-a1", "onprem-a2", "onprem-b1"]
        .into_iter()
        .filter(|n| *n != gold_node)
        .enumerate()
    {
        let name = format!("bronze-{i}");
        t.banded_bundle(&name, 1, PriorityBand::Bronze, 150, serde_json::json!({}));
        t.placed(&name).await;
        assert_eq!(
            t.replica_nodes(&name),
            [node.to_owned()],
            "one bronze per node"
        );
    }
    t._sim
        .with_world(|w, now| w.kill_node(&gold_node, now))
        .expect("killed");
    t.until_mirror("gold's job failed", |m| {
        m.jobs_of_bundle(&mapping::bundle_id("live", "gold"))
            .all(|j| j.state() == proto::JobState::Failed)
    })
    .await;
    t.sync_model();
    t.manager.clear_calls();

    t.bundle_pass("gold").await.expect("the recovery pass");

    let stops = t.manager.calls_named("StopJob");
    assert_eq!(stops.len(), 1, "one bronze job stopped: {stops:?}");
    let victim = stops[0].trim_start_matches("StopJob ").to_owned();
    assert!(
        t.manager.calls_named("StartJob").is_empty(),
        "it waits for the room"
    );
    assert_eq!(t.events_with("PreemptedBronze").await, 1);
    assert_eq!(t.events_with("Preempted").await, 1);
    let freed = t
        .ctx
        .manager
        .mirror()
        .read(|m| m.jobs[&victim].node_id.clone());
    t.until_mirror("the victim stopped", |m| {
        !m.jobs[&victim].state().holds_capacity()
    })
    .await;
    t.sync_model();

    t.bundle_pass("gold")
        .await
        .expect("the pass after the stop");

    assert_eq!(
        t.replica_nodes("gold"),
        [freed],
        "placed in the room it made"
    );
    let status = t.stored_bundle("gold").status.unwrap();
    let trace = status.replicas[0].jobs[0].last_placement.clone().unwrap();
    let preempted = trace.preempted.expect("the trace names the preemption");
    assert_eq!(preempted.victims, [victim]);
}

#[tokio::test]
async fn without_preemption_a_gold_recovery_with_no_room_says_it_cannot_be_placed() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.banded_bundle("gold", 1, PriorityBand::Gold, 150, serde_json::json!({}));
    t.placed("gold").await;
    let gold_node = t.replica_nodes("gold").remove(0);
    for (i, _) in ["onprem-a1", "onprem-a2", "onprem-b1"]
        .into_iter()
        .filter(|n| *n != gold_node)
        .enumerate()
    {
        let name = format!("bronze-{i}");
        t.banded_bundle(&name, 1, PriorityBand::Bronze, 150, serde_json::json!({}));
        t.placed(&name).await;
    }
    t._sim
        .with_world(|w, now| w.kill_node(&gold_node, now))
        .expect("killed");
    t.until_mirror("gold's job failed", |m| {
        m.jobs_of_bundle(&mapping::bundle_id("live", "gold"))
            .all(|j| j.state() == proto::JobState::Failed)
    })
    .await;
    t.sync_model();
    t.manager.clear_calls();

    t.bundle_pass("gold").await.expect("the recovery pass");

    assert!(t.manager.changes().is_empty(), "{:?}", t.manager.calls());
    let status = t.stored_bundle("gold").status.unwrap();
    let (on, reason, _) = condition_of(&status.conditions, "Stalled");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "NoCapacity"));
    assert_eq!(t.events_with("PlacementFailed").await, 1);
}

/// A start answered within the millisecond of the job's registration: the mirror's record of
/// the registered job has the answer's time, and is still no sign of the start. The placement's
/// reservation holds until the mirror shows the started instance, so the next placement, made
/// before the mirror pump looks again, does not land on the node it filled.
#[tokio::test]
async fn placements_in_a_row_see_each_others_room_before_the_pump_looks() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    let mut nodes = Vec::new();
    for name in ["bronze-0", "bronze-1", "bronze-2"] {
        t.banded_bundle(name, 1, PriorityBand::Bronze, 150, serde_json::json!({}));
        t.bundle_pass(name).await.expect("the finalizer pass");
        t.bundle_pass(name).await.expect("the placing pass");
        nodes.extend(t.replica_nodes(name));
    }
    nodes.sort();
    assert_eq!(
        nodes,
        ["onprem-a1", "onprem-a2", "onprem-b1"],
        "one per node"
    );
    assert_eq!(t.events_with("JobRejected").await, 0);
}
