//! ManagerNodes: the status sync (one [`MirrorSync::pass`] at a time) and the pass over a
//! node's spec (cordon, `terminate` and `migrate` drains).

use std::sync::Arc;
use std::time::Duration;

use automanager_api::{
    Drain, DrainMode, ManagerNode, ManagerNodeSpec, Migration, MigrationPhase, NodeState,
};
use automanager_operator::controllers::{self, node::MirrorSync};
use automanager_operator::mapping;
use automanager_policy::pass_failure::FailureKind;
use http::Method;
use kube::runtime::controller::Action;
use manager_client::proto;

use super::Tier;
use super::common::{condition_of, requeue};

const NODES: &str = "/apis/automanager.norsk.io/v1alpha1/managernodes";
const MIGRATIONS: &str = "/apis/automanager.norsk.io/v1alpha1/namespaces/live/migrations";

impl Tier {
    pub(crate) fn stored_node(&self, node_id: &str) -> Option<ManagerNode> {
        self.api
            .get::<ManagerNode>(None, &mapping::node_object_name(node_id))
    }

    /// The ManagerNode objects of Manager's nodes, written by one sync pass.
    pub(crate) async fn with_node_objects(self) -> (Tier, MirrorSync) {
        let mut sync = MirrorSync::start(self.ctx.clone()).await;
        sync.pass().await;
        self.api.clear_calls();
        self.manager.clear_calls();
        (self, sync)
    }

    /// The user sets `spec` on the node's object.
    pub(crate) fn set_node_spec(&self, node_id: &str, spec: ManagerNodeSpec) {
        self.api
            .edit::<ManagerNode>(None, &mapping::node_object_name(node_id), |n| {
                n.spec = spec;
            });
    }

    /// One pass over the node's object as stored now.
    pub(crate) async fn node_pass(&self, node_id: &str) -> Result<Action, controllers::Error> {
        let n = self.stored_node(node_id).expect("the node's object");
        controllers::node::reconcile(Arc::new(n), self.ctx.clone()).await
    }

    /// The node each replica of bundle `live/name`'s job runs on, by replica.
    pub(crate) fn replica_nodes(&self, name: &str) -> Vec<String> {
        let status = self.stored_bundle(name).status.expect("a status");
        (status.replicas.iter())
            .map(|r| r.jobs[0].node_id.clone().expect("placed"))
            .collect()
    }

    /// Bundle `live/name` with `replicas` on the onprem pool, placed and running.
    pub(crate) async fn running_bundle(&self, name: &str, replicas: i32) -> Vec<String> {
        self.bundle(name, replicas, &["onprem"]);
        self.bundle_pass(name).await.expect("the finalizer pass");
        self.bundle_pass(name).await.expect("the placing pass");
        let id = mapping::bundle_id("live", name);
        self.until_mirror("the bundle's jobs run", |m| {
            let running = (m.jobs.values())
                .filter(|j| j.bundle_id == id && j.state() == proto::JobState::Running)
                .count();
            running == usize::try_from(replicas).unwrap()
        })
        .await;
        self.api.clear_calls();
        self.manager.clear_calls();
        self.replica_nodes(name)
    }
}

fn drain(mode: DrainMode) -> ManagerNodeSpec {
    ManagerNodeSpec {
        cordoned: false,
        drain: Some(Drain {
            mode,
            when_held: None,
        }),
    }
}

#[tokio::test]
async fn the_sync_writes_one_object_per_manager_node_and_then_nothing_while_nothing_changes() {
    let t = Tier::start(|_| {}).await;
    let mut sync = MirrorSync::start(t.ctx.clone()).await;

    sync.pass().await;

    let nodes = ["onprem-a1", "onprem-a2", "onprem-b1"];
    let mut writes = t.api.writes();
    writes.sort();
    let mut want: Vec<String> = (nodes.iter())
        .flat_map(|n| [format!("POST {NODES}"), format!("PATCH {NODES}/{n}/status")])
        .collect();
    want.sort();
    assert_eq!(writes, want);
    for n in nodes {
        let status = t.stored_node(n).and_then(|o| o.status).expect("a status");
        assert_eq!(
            (status.state, status.pool.as_str()),
            (NodeState::Started, "onprem")
        );
        assert_eq!(condition_of(&status.conditions, "Ready").1, "Started");
        assert_eq!(condition_of(&status.conditions, "Cordoned").0, "False");
    }
    assert_eq!(t.events_with("NodeStarted").await, 3);

    t.api.clear_calls();
    sync.pass().await;
    assert_eq!(t.api.writes(), Vec::<String>::new());
}

#[tokio::test]
async fn a_node_manager_loses_is_written_terminated_with_its_lifecycle_event() {
    let (t, mut sync) = Tier::start(|_| {}).await.with_node_objects().await;
    t._sim
        .with_world(|w, now| w.kill_node("onprem-b1", now))
        .expect("killed");
    t.until_mirror("onprem-b1 terminated", |m| {
        m.nodes["onprem-b1"].state == proto::NodeState::Terminated as i32
    })
    .await;

    sync.pass().await;

    assert_eq!(t.api.writes(), [format!("PATCH {NODES}/onprem-b1/status")]);
    let status = t.stored_node("onprem-b1").and_then(|o| o.status).unwrap();
    assert_eq!(status.state, NodeState::Terminated);
    assert!(status.stopped_at.is_some());
    assert_eq!(condition_of(&status.conditions, "Ready").1, "Terminated");
    assert_eq!(t.events_with("NodeTerminated").await, 1);
}

impl Tier {
    /// Moves the operator's clock to `ms` after Manager's record of the node's last state
    /// change (Manager's clock stamps it; the operator reads time through its own).
    fn clock_past_state_change(&self, node_id: &str, ms: i64) {
        let changed = self
            .ctx
            .manager
            .mirror()
            .read(|m| m.nodes[node_id].state_changed_at_ms);
        let ahead = changed + ms - self.ctx.clock.now().timestamp_millis();
        assert!(ahead >= 0, "the operator's clock is already past that");
        self.clock
            .advance(Duration::from_millis(u64::try_from(ahead).unwrap()));
    }

    fn node_deletes(&self) -> Vec<String> {
        (self.api.writes().into_iter())
            .filter(|w| w.starts_with("DELETE"))
            .collect()
    }
}

/// `removeStoppedNodesAfter`: the object of a node Manager terminated stays while the node
/// has been gone for less than the setting (20 minutes here, not the default hour), and is
/// deleted once it has been gone for longer, and not written again.
#[tokio::test]
async fn a_terminated_nodes_object_is_removed_only_after_remove_stopped_nodes_after() {
    let (t, mut sync) = Tier::start(|c| {
        c.remove_stopped_nodes_after = Duration::from_secs(20 * 60);
    })
    .await
    .with_node_objects()
    .await;
    t._sim
        .with_world(|w, now| w.kill_node("onprem-b1", now))
        .expect("killed");
    t.until_mirror("onprem-b1 terminated", |m| {
        m.nodes["onprem-b1"].state == proto::NodeState::Terminated as i32
    })
    .await;
    sync.pass().await;
    assert_eq!(
        t.stored_node("onprem-b1")
            .and_then(|o| o.status)
            .map(|s| s.state),
        Some(NodeState::Terminated)
    );
    t.api.clear_calls();

    t.clock_past_state_change("onprem-b1", 19 * 60 * 1000);
    sync.pass().await;

    assert_eq!(t.node_deletes(), Vec::<String>::new(), "19 minutes: kept");
    assert!(t.stored_node("onprem-b1").is_some());

    t.clock.advance(Duration::from_secs(2 * 60));
    sync.pass().await;

    assert_eq!(
        t.node_deletes(),
        [format!("DELETE {NODES}/onprem-b1")],
        "21 minutes: removed"
    );
    assert!(t.stored_node("onprem-b1").is_none());
    assert!(t.stored_node("onprem-a1").is_some(), "the others stay");
    t.api.clear_calls();
    t.clock.advance(Duration::from_secs(60));
    sync.pass().await;
    assert!(
        t.stored_node("onprem-b1").is_none(),
        "not recreated: {:?}",
        t.api.writes()
    );
}

/// A node Manager provisions, then powers off (a warm spare): its object carries each
/// lifecycle Event of the library's `onNodeStarting / onNodeStarted / onNodeStopped`, and
/// stays however long the node is powered off: `removeStoppedNodesAfter` removes the
/// objects of nodes gone (terminated or unreachable), not those of warm spares.
#[tokio::test]
async fn a_provisioned_node_powered_off_has_its_lifecycle_events_and_its_object_is_kept() {
    let t = Tier::start_with_sim(
        |sim| {
            // Long enough for a pass to see the node starting, whatever the machine's load.
            for p in sim.pools.iter_mut().filter(|p| p.name == "aws-east") {
                p.provision_delay_ms = Some(5_000);
                p.stop_delay_ms = Some(100);
            }
        },
        |_| {},
    )
    .await;
    let (t, mut sync) = t.with_node_objects().await;
    let node = t
        ._sim
        .with_world(|w, now| {
            w.create_node(
                &proto::CreateNodeRequest {
                    pool: "aws-east".into(),
                    instance_type: "m5.xlarge".into(),
                    ..Default::default()
                },
                now,
            )
        })
        .expect("created")
        .node_id;
    t.until_mirror("the node starting", |m| m.nodes.contains_key(&node))
        .await;

    sync.pass().await;

    let status = t.stored_node(&node).and_then(|o| o.status).unwrap();
    assert_eq!(status.state, NodeState::Starting);
    assert_eq!(t.events_with("NodeStarting").await, 1);

    t.until_mirror("the node started", |m| {
        m.nodes[&node].state == proto::NodeState::Started as i32
    })
    .await;
    sync.pass().await;
    assert_eq!(t.events_with("NodeStarted").await, 1);

    t._sim
        .with_world(|w, now| w.stop_node(&node, now))
        .expect("stopped");
    t.until_mirror("the node powered off", |m| {
        m.nodes[&node].state == proto::NodeState::PoweredOff as i32
    })
    .await;
    sync.pass().await;

    let status = t.stored_node(&node).and_then(|o| o.status).unwrap();
    assert_eq!(status.state, NodeState::Stopped);
    assert_eq!(condition_of(&status.conditions, "Ready").1, "Stopped");
    assert_eq!(t.events_with("NodeStopped").await, 1);

    t.api.clear_calls();
    t.clock_past_state_change(&node, 2 * 3_600_000);
    sync.pass().await;
    assert_eq!(t.node_deletes(), Vec::<String>::new());
    assert!(
        t.stored_node(&node).is_some(),
        "a warm spare's object stays past removeStoppedNodesAfter"
    );
}

/// Flap damping through the operator: a node whose workers refuse starts (two within a
/// minute trips it here) is held out for the rejection window the first time, twice as long
/// when it trips again within `flapMemory`, four times the third; its ManagerNode says so in
/// `unhealthyEpisodes`, `heldOutUntil`, `healthy` and the `FlappingHeldOut` reason, and placement
/// avoids it until `heldOutUntil` even once its rejections are out of the window. A node quiet
/// for longer than `flapMemory` starts again from one.
#[tokio::test]
async fn a_node_that_trips_unhealthy_again_and_again_is_held_out_longer_each_time() {
    let (t, mut sync) = Tier::start(|c| {
        c.node_health.rejection_threshold = 2;
        c.node_health.rejection_window = Duration::from_secs(60);
        c.node_health.flap_max_hold = Duration::from_secs(10 * 60);
        c.node_health.flap_memory = Duration::from_secs(60 * 60);
    })
    .await
    .with_node_objects()
    .await;
    let node = "onprem-a1";
    let status = || t.stored_node(node).and_then(|o| o.status).unwrap();
    let avoided = || t.ctx.state.overlay(node).unhealthy;
    // Two starts its workers refuse, as a Bundle pass records them.
    let trip = || async {
        controllers::node::record_rejection(&t.ctx, node).await;
        controllers::node::record_rejection(&t.ctx, node).await;
    };

    // Episode 1: held out for the rejection window.
    let t1 = t.ctx.clock.now();
    trip().await;
    sync.pass().await;
    let s = status();
    assert!(!s.healthy);
    assert_eq!(s.unhealthy_episodes, 1);
    assert_eq!(s.held_out_until, Some(t1 + chrono::Duration::seconds(60)));
    assert_eq!(
        condition_of(&s.conditions, "Stalled").1,
        "RejectionRateTripped"
    );
    assert_eq!(condition_of(&s.conditions, "Unhealthy").0, "True");
    assert!(avoided());

    t.clock.advance(Duration::from_secs(61));
    sync.pass().await;
    let s = status();
    assert!(s.healthy, "the window passed quietly: {s:?}");
    assert_eq!(s.held_out_until, None);
    assert_eq!(s.unhealthy_episodes, 1, "remembered");
    assert_eq!(condition_of(&s.conditions, "Ready").1, "Started");
    assert!(!avoided());

    // Episode 2, within flapMemory: held out twice as long.
    let t2 = t.ctx.clock.now();
    trip().await;
    sync.pass().await;
    let s = status();
    assert_eq!(s.unhealthy_episodes, 2);
    assert_eq!(s.held_out_until, Some(t2 + chrono::Duration::seconds(120)));
    let (stalled, reason, message) = condition_of(&s.conditions, "Stalled");
    assert_eq!(
        (stalled.as_str(), reason.as_str()),
        ("True", "FlappingHeldOut")
    );
    assert!(message.contains("unhealthy 2 times in a row"), "{message}");

    t.clock.advance(Duration::from_secs(61));
    sync.pass().await;
    let s = status();
    assert!(
        !s.healthy && avoided(),
        "its rejections are out of the window, but it is still held out: {s:?}"
    );
    assert_eq!(s.recent_rejections, 0);
    assert_eq!(condition_of(&s.conditions, "Stalled").1, "FlappingHeldOut");

    t.clock.advance(Duration::from_secs(60));
    sync.pass().await;
    assert!(
        status().healthy && !avoided(),
        "back after twice the window"
    );

    // Episode 3: four times the window.
    let t3 = t.ctx.clock.now();
    trip().await;
    sync.pass().await;
    let s = status();
    assert_eq!(s.unhealthy_episodes, 3);
    assert_eq!(s.held_out_until, Some(t3 + chrono::Duration::seconds(240)));
    assert_eq!(condition_of(&s.conditions, "Stalled").1, "FlappingHeldOut");
    assert_eq!(t.events_with("NodeUnhealthy").await, 3, "one per episode");

    // Quiet for longer than flapMemory: the next episode is the first again.
    t.clock.advance(Duration::from_secs(2 * 3600));
    sync.pass().await;
    assert!(status().healthy);
    let t4 = t.ctx.clock.now();
    trip().await;
    sync.pass().await;
    let s = status();
    assert_eq!(s.unhealthy_episodes, 1);
    assert_eq!(s.held_out_until, Some(t4 + chrono::Duration::seconds(60)));
    assert_eq!(
        condition_of(&s.conditions, "Stalled").1,
        "RejectionRateTripped"
    );
}

#[tokio::test]
async fn a_refused_status_write_is_written_on_the_next_pass() {
    let t = Tier::start(|_| {}).await;
    let mut sync = MirrorSync::start(t.ctx.clone()).await;
    t.api
        .refuse_next(Method::PATCH, "/managernodes/onprem-a1/status", 500);

    sync.pass().await;

    assert!(t.stored_node("onprem-a1").unwrap().status.is_none());
    assert!(t.stored_node("onprem-a2").unwrap().status.is_some());
    t.api.clear_calls();
    sync.pass().await;
    assert_eq!(
        t.api.writes(),
        [
            format!("POST {NODES}"),
            format!("PATCH {NODES}/onprem-a1/status")
        ],
        "the object is made again (it exists: 409, fine) and its status written"
    );
    assert!(t.stored_node("onprem-a1").unwrap().status.is_some());
}

#[tokio::test]
async fn an_object_of_a_node_manager_does_not_have_is_removed() {
    let t = Tier::start(|_| {}).await;
    t.api
        .insert(&ManagerNode::new("gone-1", ManagerNodeSpec::default()));
    let mut sync = MirrorSync::start(t.ctx.clone()).await;

    sync.pass().await;

    assert!(
        t.api.writes().contains(&format!("DELETE {NODES}/gone-1")),
        "{:?}",
        t.api.writes()
    );
    assert!(t.api.get::<ManagerNode>(None, "gone-1").is_none());
}

#[tokio::test]
async fn without_the_cluster_scope_the_sync_keeps_health_and_writes_nothing() {
    let t = Tier::start(|c| c.cluster_scope = false).await;
    let mut sync = MirrorSync::start(t.ctx.clone()).await;

    sync.pass().await;

    assert_eq!(t.api.writes(), Vec::<String>::new());
}

#[tokio::test]
async fn a_cordon_keeps_placement_off_the_node_and_says_so_once() {
    let (t, _sync) = Tier::start(|_| {}).await.with_node_objects().await;
    t.set_node_spec(
        "onprem-a1",
        ManagerNodeSpec {
            cordoned: true,
            drain: None,
        },
    );

    let next = t.node_pass("onprem-a1").await.expect("the pass");
    t.node_pass("onprem-a1").await.expect("a second pass");

    assert_eq!(next, Action::await_change());
    assert!(t.ctx.state.overlay("onprem-a1").cordoned);
    assert_eq!(
        t.api.writes(),
        Vec::<String>::new(),
        "the sync writes status"
    );
    assert!(t.manager.calls().is_empty());
    assert_eq!(t.events_with("Cordoned").await, 1);

    t.set_node_spec("onprem-a1", ManagerNodeSpec::default());
    t.node_pass("onprem-a1")
        .await
        .expect("the uncordoning pass");
    assert!(!t.ctx.state.overlay("onprem-a1").cordoned);
    assert_eq!(t.events_with("Uncordoned").await, 1);
}

#[tokio::test]
async fn a_terminate_drain_terminates_the_node_and_a_second_waits_for_the_budget() {
    let (t, _sync) = Tier::start(|_| {})
        .await
        .with_example_pools()
        .await
        .with_node_objects()
        .await;
    let nodes = t.running_bundle("news", 2).await;
    let (first, second) = (&nodes[0], &nodes[1]);
    t.set_node_spec(first, drain(DrainMode::Terminate));

    let next = t.node_pass(first).await.expect("the first drain");

    assert_eq!(t.manager.calls(), [format!("TerminateNode {first}")]);
    assert_eq!(next, requeue(Duration::from_secs(10)));
    assert_eq!(t.events_with("Draining").await, 1);
    t.manager.clear_calls();
    t.set_node_spec(second, drain(DrainMode::Terminate));

    let next = t.node_pass(second).await.expect("the second drain");

    assert!(
        t.manager.calls_named("TerminateNode").is_empty(),
        "replica 0 is down: the budget allows no second one"
    );
    assert_eq!(next, requeue(Duration::from_secs(1)));
    let blocked = t.events().await;
    let (_, note) = (blocked.iter())
        .find(|(r, _)| r == "DisruptionBlocked")
        .expect("a DisruptionBlocked Event");
    assert!(note.contains("Bundle live/news"), "{note}");
}

#[tokio::test]
async fn a_migrate_drain_moves_each_job_hands_a_failed_move_to_its_band_and_ends_the_node() {
    let (t, _sync) = Tier::start(|_| {})
        .await
        .with_example_pools()
        .await
        .with_node_objects()
        .await;
    let node = t.running_bundle("news", 1).await.remove(0);
    t.set_node_spec(&node, drain(DrainMode::Migrate));

    let next = t.node_pass(&node).await.expect("the first step");

    assert_eq!(t.api.writes(), [format!("POST {MIGRATIONS}")]);
    assert_eq!(next, requeue(Duration::from_secs(2)));
    let job = t.manager_jobs("news").remove(0);
    let name = controllers::drain::migration_name(&node, &job);
    let mig = t
        .api
        .get::<Migration>(Some("live"), &name)
        .expect("the drain's Migration");
    assert_eq!(
        (mig.spec.job.bundle.as_str(), mig.spec.job.replica),
        ("news", 0)
    );
    t.api.clear_calls();
    t.node_pass(&node).await.expect("a step while it moves");
    assert_eq!(
        t.api.writes(),
        Vec::<String>::new(),
        "one Migration per job"
    );
    assert!(t.manager.calls().is_empty());

    t.api.edit_status::<Migration>(Some("live"), &name, |m| {
        m.status.get_or_insert_default().phase = MigrationPhase::Failed;
    });
    t.node_pass(&node)
        .await
        .expect("the step after the failure");

    assert_eq!(
        t.manager.calls(),
        [format!("StopJob {job}")],
        "handed to its band"
    );
    assert_eq!(t.events_with("DrainFallback").await, 1);
    t.until_mirror("the job left the node", |m| {
        m.jobs_on(&node)
            .all(|j| (j.instances.iter()).all(|i| i.node_id != node || !i.holds_capacity()))
    })
    .await;
    t.manager.clear_calls();

    let next = t.node_pass(&node).await.expect("the last step");

    assert_eq!(t.manager.calls(), [format!("TerminateNode {node}")]);
    assert_eq!(next, Action::await_change());
    let drained = t.events().await;
    let (_, note) = drained
        .iter()
        .find(|(r, _)| r == "Drained")
        .expect("Drained");
    assert!(
        note.contains("0 jobs migrated, 1 handed to band recovery"),
        "{note}"
    );
}

#[tokio::test]
async fn a_migrate_drain_whose_migration_cannot_be_created_fails_the_step() {
    let (t, _sync) = Tier::start(|_| {})
        .await
        .with_example_pools()
        .await
        .with_node_objects()
        .await;
    let node = t.running_bundle("news", 1).await.remove(0);
    t.set_node_spec(&node, drain(DrainMode::Migrate));
    t.api.refuse_next(Method::POST, "/migrations", 422);

    let err = t.node_pass(&node).await.expect_err("the refusal");

    assert!(
        matches!(&err, controllers::Error::Kube(kube::Error::Api(s)) if s.code == 422),
        "{err}"
    );
    assert!(t.manager.calls().is_empty(), "nothing else was done");
}

#[tokio::test]
async fn a_migrate_drain_waits_for_manager() {
    let (t, _sync) = Tier::start(|_| {}).await.with_node_objects().await;
    t.set_node_spec("onprem-b1", drain(DrainMode::Migrate));
    t.manager.set_cut(true);
    t.until_manager_ready(false).await;

    let err = t
        .node_pass("onprem-b1")
        .await
        .expect_err("Manager is unreachable");

    assert!(
        matches!(err, controllers::Error::ManagerUnavailable(_)),
        "{err}"
    );
    assert_eq!(
        err.failure_kind(),
        FailureKind::Unavailable,
        "looked at again within seconds"
    );
}

#[tokio::test]
async fn a_migrate_drain_of_an_empty_node_terminates_it_at_once() {
    let (t, _sync) = Tier::start(|_| {}).await.with_node_objects().await;
    t.set_node_spec("onprem-b1", drain(DrainMode::Migrate));

    t.node_pass("onprem-b1").await.expect("the step");

    assert_eq!(t.manager.calls(), ["TerminateNode onprem-b1"]);
    assert_eq!(t.api.writes(), Vec::<String>::new());
    assert_eq!(t.events_with("Drained").await, 1);
}
