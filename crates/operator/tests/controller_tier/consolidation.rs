//! Consolidation, as the PlacementPool pass runs it: plan, empty the first planned node through
//! Migrations, terminate it once empty; or give it up when a move fails.

use automanager_api::{
    ConsolidationStatus, Migration, MigrationPhase, PlacementPool, PlacementPoolStatus,
};
use automanager_operator::mapping;
use kube::ResourceExt;
use manager_client::proto;

use super::Tier;
use super::common::condition_of;

impl Tier {
    /// The placement model caught up with the mirror, as the mirror pump keeps it.
    pub(crate) fn sync_model(&self) {
        self.ctx
            .manager
            .mirror()
            .read(|m| self.ctx.state.sync_all(m));
    }

    /// Bundle `live/name`: one job of `capacity` declaring `overlap`, in aws-east, placed on a
    /// node provisioned for it; answers the node.
    async fn bundle_on_a_new_node(&self, name: &str) -> String {
        let mut b = automanager_api::Bundle::new(
            name,
            serde_json::from_value(serde_json::json!({
                "replicas": 1, "pools": ["aws-east"],
                "jobs": [{"jobName": "enc",
                    "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": "silver"},
                    "migration": {"strategy": "overlap"}}],
            }))
            .unwrap(),
        );
        b.metadata.namespace = Some("live".into());
        self.api.insert(&b);
        self.bundle_pass(name).await.expect("the finalizer pass");
        self.bundle_pass(name).await.expect("the provisioning pass");
        let id = mapping::bundle_id("live", name);
        let tag = format!("{id}.r0");
        self.until_mirror("its node started", |m| {
            m.nodes.values().any(|n| {
                n.tags.values().any(|v| *v == tag) && n.state == proto::NodeState::Started as i32
            })
        })
        .await;
        self.sync_model();
        self.bundle_pass(name).await.expect("the placing pass");
        self.until_mirror("its job runs", |m| {
            m.jobs_of_bundle(&id)
                .any(|j| j.state() == proto::JobState::Running)
        })
        .await;
        self.sync_model();
        self.manager_node_of(name)
    }

    fn manager_node_of(&self, name: &str) -> String {
        let id = mapping::bundle_id("live", name);
        self.ctx.manager.mirror().read(|m| {
            m.jobs_of_bundle(&id)
                .next()
                .map(|j| j.node_id.clone())
                .unwrap()
        })
    }

    /// Two bundles, each alone on a node of aws-east: consolidation can empty one onto the
    /// other. Answers the two nodes.
    async fn two_half_empty_nodes(&self) -> (String, String) {
        let first = self.bundle_on_a_new_node("one").await;
        // Kept out of the second placement, so it gets a node of its own.
        self.set_cordon(&first, true);
        let second = self.bundle_on_a_new_node("two").await;
        self.set_cordon(&first, false);
        assert_ne!(first, second);
        (first, second)
    }

    fn set_cordon(&self, node: &str, cordoned: bool) {
        let generation = self.ctx.state.node_generation(node);
        (self.ctx.manager.mirror()).read(|m| {
            self.ctx.state.apply_cordon(m, node, cordoned, generation);
        });
    }

    /// The operator's clock moved past the creation of every node Manager has (the sim keeps
    /// its own clock; the fake one starts earlier), so node ages read as Manager's.
    fn clock_past_manager(&self) {
        let newest = self
            .ctx
            .manager
            .mirror()
            .read(|m| m.nodes.values().map(|n| n.created_at_ms).max())
            .unwrap_or(0);
        let behind = newest + 1000 - self.ctx.clock.now().timestamp_millis();
        if let Ok(ms) = u64::try_from(behind) {
            self.clock.advance(std::time::Duration::from_millis(ms));
        }
    }

    fn consolidate(&self, pool: &str, mode: &str) {
        self.clock_past_manager();
        self.api.edit::<PlacementPool>(None, pool, |p| {
            p.spec.consolidation = Some(
                serde_json::from_value(serde_json::json!({
                    "mode": mode, "minNodeAgeSeconds": 0, "cooldownSeconds": 0,
                }))
                .unwrap(),
            );
        });
    }

    fn pool_status(&self, pool: &str) -> PlacementPoolStatus {
        self.stored_pool(pool).and_then(|p| p.status).unwrap()
    }

    fn consolidation(&self, pool: &str) -> ConsolidationStatus {
        self.pool_status(pool).consolidation.unwrap_or_default()
    }

    fn consolidation_migrations(&self) -> Vec<Migration> {
        self.api
            .list_all::<Migration>()
            .into_iter()
            .filter(|m| {
                m.labels()
                    .get(automanager_api::PURPOSE_LABEL)
                    .map(String::as_str)
                    == Some("consolidation")
            })
            .collect()
    }
}

#[tokio::test]
async fn a_dry_run_writes_the_plan_and_moves_nothing() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    let (a, b) = t.two_half_empty_nodes().await;
    t.consolidate("aws-east", "dryRun");
    t.manager.clear_calls();
    t.api.clear_calls();

    t.pool_pass("aws-east").await.expect("the pass");

    let plan = t.consolidation("aws-east");
    assert_eq!(plan.planned_nodes, 1);
    let emptied = &plan.plan[0];
    assert!([&a, &b].contains(&&emptied.node), "{plan:?}");
    assert_eq!(emptied.moves.len(), 1);
    let (on, reason, message) =
        condition_of(&t.pool_status("aws-east").conditions, "Consolidating");
    assert_eq!((on.as_str(), reason.as_str()), ("False", "DryRun"));
    assert!(
        message.starts_with("dry run: would empty 1 node(s)"),
        "{message}"
    );
    assert!(t.consolidation_migrations().is_empty());
    assert!(t.manager.changes().is_empty(), "{:?}", t.manager.calls());
}

#[tokio::test]
async fn an_enabled_pool_empties_its_emptiest_node_through_migrations_then_terminates_it() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.two_half_empty_nodes().await;
    t.consolidate("aws-east", "enabled");

    t.pool_pass("aws-east").await.expect("the pass that begins");

    let status = t.consolidation("aws-east");
    let node = status.current_node.clone().expect("a node being emptied");
    assert!(
        t.ctx.state.overlay(&node).consolidating,
        "placement keeps off it"
    );
    let migrations = t.consolidation_migrations();
    assert_eq!(migrations.len(), 1);
    let mig = migrations[0].name_any();
    assert_eq!(
        condition_of(&t.pool_status("aws-east").conditions, "Consolidating").1,
        "EmptyingNode"
    );
    assert_eq!(t.events_with("Consolidating").await, 1);

    t.migration_pass(&mig).await.expect("the finalizer pass");
    t.migration_until(&mig, MigrationPhase::Completed).await;
    t.until_mirror("the node is empty", |m| {
        m.jobs_on(&node).all(|j| {
            j.instances
                .iter()
                .all(|i| i.node_id != node || !i.holds_capacity())
        })
    })
    .await;
    t.sync_model();
    t.manager.clear_calls();

    t.pool_pass("aws-east")
        .await
        .expect("the pass that ends it");

    assert_eq!(t.manager.changes(), [format!("TerminateNode {node}")]);
    let status = t.consolidation("aws-east");
    assert_eq!(
        (status.current_node.as_deref(), status.nodes_terminated),
        (None, 1)
    );
    assert_eq!(
        condition_of(&t.pool_status("aws-east").conditions, "Consolidating").1,
        "NodeTerminated"
    );
    assert!(!t.ctx.state.overlay(&node).consolidating);
    assert_eq!(t.events_with("NodeConsolidated").await, 1);
}

#[tokio::test]
async fn a_failed_move_gives_the_node_up_and_lets_placement_use_it_again() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.two_half_empty_nodes().await;
    t.consolidate("aws-east", "enabled");
    t.pool_pass("aws-east").await.expect("the pass that begins");
    let node = t.consolidation("aws-east").current_node.expect("a node");
    let mig = t.consolidation_migrations()[0].name_any();
    t.api.edit_status::<Migration>(Some("live"), &mig, |m| {
        m.status.get_or_insert_default().phase = MigrationPhase::Aborted;
    });
    t.api.clear_calls();

    t.pool_pass("aws-east").await.expect("the pass");

    let status = t.consolidation("aws-east");
    assert_eq!(status.current_node, None);
    assert!(status.last_action_at.is_some(), "the cool-down starts");
    let (_, reason, message) = condition_of(&t.pool_status("aws-east").conditions, "Consolidating");
    assert_eq!(reason, "Abandoned");
    assert!(
        message.contains(&format!("Migration {mig} ended Aborted")),
        "{message}"
    );
    assert!(!t.ctx.state.overlay(&node).consolidating);
    assert!(
        t.api.writes().contains(&format!(
            "DELETE /apis/automanager.norsk.io/v1alpha1/namespaces/live/migrations/{mig}"
        )),
        "the ended Migration goes: {:?}",
        t.api.writes()
    );
    assert_eq!(t.events_with("ConsolidationAbandoned").await, 1);
}

#[tokio::test]
async fn switching_consolidation_off_gives_the_node_back_to_placement() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.two_half_empty_nodes().await;
    t.consolidate("aws-east", "enabled");
    t.pool_pass("aws-east").await.expect("the pass that begins");
    let node = t.consolidation("aws-east").current_node.expect("a node");
    t.consolidate("aws-east", "off");

    t.pool_pass("aws-east").await.expect("the pass");

    assert!(!t.ctx.state.overlay(&node).consolidating);
    assert_eq!(t.pool_status("aws-east").consolidation, None);
    assert_eq!(
        condition_of(&t.pool_status("aws-east").conditions, "Consolidating").1,
        "Off"
    );
}
