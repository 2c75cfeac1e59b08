//! HotSpareTarget tiers: warm spares made by create-then-stop and started for a recovery, schedules
//! raising a tier ahead of its window, and reclaim notices moving a node's jobs before the deadline.

use std::sync::Arc;

use automanager_api as api;
use automanager_operator::controllers;

use super::*;

const SPARES: &str = "/apis/automanager.norsk.io/v1alpha1/hotsparetargets";

impl Tier {
    fn tiered_target(&self, name: &str, spec: serde_json::Value) -> api::HotSpareTarget {
        self.api.insert(&api::HotSpareTarget::new(
            name,
            serde_json::from_value(spec).unwrap(),
        ))
    }

    async fn tiered_pass(&self, name: &str) -> kube::runtime::controller::Action {
        let t = self
            .api
            .get::<api::HotSpareTarget>(None, name)
            .expect("the target is stored");
        controllers::reconcile_finalized(Arc::new(t), self.ctx.clone())
            .await
            .expect("the spare pass")
    }

    fn tiered_status(&self, name: &str) -> api::HotSpareTargetStatus {
        self.api
            .get::<api::HotSpareTarget>(None, name)
            .and_then(|t| t.status)
            .expect("a status")
    }

    /// The target's spares in Manager, by state.
    fn tiered_spares_in(&self, state: manager_proto::NodeState) -> Vec<String> {
        self._sim
            .snapshot()
            .nodes
            .into_iter()
            .filter(|n| {
                n.tags
                    .get("automanager.hot-spare-target")
                    .map(String::as_str)
                    == Some("tiers")
                    && n.state() == state
            })
            .map(|n| n.node_id)
            .collect()
    }

    /// Waits until the mirror shows `count` of the target's spares in `state`.
    async fn wait_tiered_spares(&self, state: manager_proto::NodeState, count: usize) {
        self.ctx
            .manager
            .wait_until(BOUND, |m| {
                m.nodes
                    .values()
                    .filter(|n| {
                        n.tags
                            .get("automanager.hot-spare-target")
                            .map(String::as_str)
                            == Some("tiers")
                            && n.state() == state
                    })
                    .count()
                    == count
            })
            .await
            .unwrap_or_else(|e| panic!("{count} spare(s) {state:?}: {e}"));
    }
}

#[tokio::test]
async fn warm_spares_are_made_by_create_then_stop_and_a_taken_hot_spare_is_refilled_by_starting_one()
 {
    use manager_proto::NodeState as N;
    let t = Tier::start_with_sim(
        |sim| {
            sim.timing.start_delay_ms = Some(100);
            sim.timing.stop_delay_ms = Some(50);
        },
        |_| {},
    )
    .await
    .with_example_pools()
    .await;
    t.tiered_target(
        "tiers",
        serde_json::json!({
            "pool": "aws-east",
            "hot": {"count": 1},
            "warm": {"count": 1},
            "spec": {"instanceType": "m5.xlarge", "region": "eu-west-1"},
        }),
    );
    t.tiered_pass("tiers").await; // the finalizer
    t.tiered_pass("tiers").await;
    // One node per tier is asked for; both come up running.
    t.wait_tiered_spares(N::Started, 2).await;
    t.tiered_pass("tiers").await;
    // The hot tier has one too many: it is stopped into the warm tier.
    t.wait_tiered_spares(N::PoweredOff, 1).await;
    t.tiered_pass("tiers").await;
    let status = t.tiered_status("tiers");
    assert_eq!(
        (
            status.live_spares,
            status.warm_spares,
            status.target_count,
            status.warm_target
        ),
        (1, 1, 1, 1)
    );
    let warm = find_condition(&status.conditions, "WarmTier").expect("a WarmTier condition");
    assert_eq!(warm.reason, "AtTarget");
    let stopped = t.tiered_spares_in(N::PoweredOff);
    let hot = t.tiered_spares_in(N::Started);

    // A recovery takes the hot spare.
    let taken = hot[0].clone();
    t._sim.with_world(|w, now| {
        w.register_bundle(
            &manager_proto::Bundle {
                bundle_id: "rescue".into(),
                replicas: 1,
                jobs: vec![manager_proto::BundleJob {
                    job_name: "enc".into(),
                    requirements: Some(manager_proto::JobRequirements {
                        required_capacity: 10.0,
                        required_cores: 1,
                        priority_band: "gold".into(),
                        ..Default::default()
                    }),
                    config: Vec::new(),
                    template: Vec::new(),
                }],
                ..Default::default()
            },
            now,
        )
        .unwrap();
        w.start_job("rescue/0/enc", &taken, 0, now).unwrap();
    });
    t.ctx
        .manager
        .wait_until(BOUND, |m| m.node_usage(&taken) != (0.0, 0))
        .await
        .expect("the mirror sees the job on the spare");
    t.tiered_pass("tiers").await;
    // The warm spare is started (no node created for the hot tier) and a new warm one is made.
    t.ctx
        .manager
        .wait_until(BOUND, |m| {
            m.nodes
                .get(&stopped[0])
                .is_some_and(|n| matches!(n.state(), N::Starting | N::Started))
        })
        .await
        .expect("the warm spare starts");
    let status = t.tiered_status("tiers");
    assert_eq!((status.warm_spares, status.pending_warm_spares), (0, 1));
    // The metrics say the same: one start asked and made, the warm tier short by the one
    // on its way.
    let metrics = t.ctx.metrics.encode();
    for line in [
        "automanager_warm_spare_starts_total{pool=\"aws-east\",result=\"started\"} 1",
        "automanager_spares{hotsparetarget=\"tiers\",pool=\"aws-east\",tier=\"warm\",state=\"ready\"} 0",
        "automanager_spares{hotsparetarget=\"tiers\",pool=\"aws-east\",tier=\"warm\",state=\"pending\"} 1",
        "automanager_spares{hotsparetarget=\"tiers\",pool=\"aws-east\",tier=\"warm\",state=\"target\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} not in\n{metrics}");
    }
    assert!(
        t.api
            .writes()
            .iter()
            .all(|w| w.starts_with(&format!("PATCH {SPARES}/tiers"))),
        "{:?}",
        t.api.writes()
    );
    // Both tiers settle again: the started spare is hot, the new node is stopped (the taken
    // node, still tagged, is the third one running).
    t.wait_tiered_spares(N::Started, 3).await;
    t.tiered_pass("tiers").await;
    t.wait_tiered_spares(N::PoweredOff, 1).await;
    t.tiered_pass("tiers").await;
    let status = t.tiered_status("tiers");
    assert_eq!((status.live_spares, status.warm_spares), (1, 1));
}

#[tokio::test]
async fn a_schedule_raises_the_hot_tier_ahead_of_its_window() {
    let t = Tier::start_with_sim(|sim| sim.timing.start_delay_ms = Some(100), |_| {})
        .await
        .with_example_pools()
        .await;
    // The clock stands at 2026-03-01 12:00 UTC, a Sunday; the schedule opens at 12:00 on
    // Sundays in UTC+1 (11:00 UTC), so it is open now for another half hour.
    t.tiered_target(
        "tiers",
        serde_json::json!({
            "pool": "aws-east",
            "targetCount": 1,
            "schedules": [{"schedule": "0 12 * * SUN", "duration": "90m", "timeZone": "Europe/Oslo", "hot": {"count": 3}}],
            "spec": {"instanceType": "m5.xlarge", "region": "eu-west-1"},
        }),
    );
    t.tiered_pass("tiers").await;
    t.tiered_pass("tiers").await;
    let status = t.tiered_status("tiers");
    assert_eq!(status.target_count, 3);
    assert_eq!(status.active_schedules, vec!["0 12 * * SUN".to_owned()]);
    assert_eq!(
        status.next_schedule_change.map(|t| t.to_rfc3339()),
        Some("2026-03-01T12:30:00+00:00".to_owned())
    );
    // After the window the base size applies again.
    t.clock.advance(Duration::from_secs(31 * 60));
    t.tiered_pass("tiers").await;
    let status = t.tiered_status("tiers");
    assert_eq!(status.target_count, 1);
    assert!(status.active_schedules.is_empty());
}

// ---- reclaim notices ----

#[tokio::test]
async fn a_reclaim_notice_moves_the_nodes_jobs_by_their_strategy_before_the_deadline() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    let mut b = Bundle::new(
        "news",
        serde_json::from_value(serde_json::json!({
            "replicas": 2,
            "pools": ["onprem"],
            "jobs": [{"jobName": "enc", "migration": {"strategy": "overlap"},
                      "requirements": {"requiredCapacity": 10, "requiredCores": 1, "priorityBand": "gold"}}],
        }))
        .unwrap(),
    );
    b.metadata.namespace = Some("live".into());
    t.api.insert(&b);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    let status = t.stored_bundle("news").status.expect("a status");
    let noticed = status.replicas[0].jobs[0]
        .node_id
        .clone()
        .expect("replica 0 is placed");
    t._sim.with_world(|w, now| {
        w.notice_node(&noticed, 120_000, "maintenance", now)
            .unwrap();
    });
    t.ctx
        .manager
        .wait_until(BOUND, |m| m.noticed_nodes().any(|n| n.node_id == noticed))
        .await
        .expect("the mirror shows the notice");
    t.api.clear_calls();

    let mut told = std::collections::HashMap::new();
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("the reclaim pass");

    let created = kube::Api::<api::Migration>::namespaced(t.api.client(), "live")
        .list(&Default::default())
        .await
        .expect("the Migrations")
        .items;
    assert_eq!(created.len(), 1, "{:?}", t.api.writes());
    let m = &created[0];
    assert_eq!(m.spec.job.replica, 0);
    assert_eq!(m.spec.strategy, Some(api::MigrationStrategy::Overlap));
    assert_eq!(
        m.labels().get(api::PURPOSE_LABEL).map(String::as_str),
        Some("reclaim")
    );
    assert!(
        told.get(&noticed)
            .is_some_and(|s| s.contains("1 job(s) moving now"))
    );
    // A second pass finds its Migration and asks for nothing more.
    t.api.clear_calls();
    controllers::reclaim::pass(&t.ctx, &mut told)
        .await
        .expect("the second pass");
    assert!(
        !t.api
            .calls()
            .iter()
            .any(|c| c.method == Method::POST && c.path.ends_with("/migrations")),
        "{:?}",
        t.api.writes()
    );
}

#[tokio::test]
async fn a_gold_recovery_with_no_room_starts_a_warm_spare_instead_of_provisioning() {
    use manager_proto::NodeState as N;
    let t = Tier::start_with_sim(
        |sim| {
            sim.timing.start_delay_ms = Some(100);
            sim.timing.stop_delay_ms = Some(50);
        },
        |_| {},
    )
    .await
    .with_example_pools()
    .await;
    // Node changes reach the placement model through the mirror pump, as in the operator.
    let pump = tokio::spawn(automanager_operator::runtime::run_mirror_pump(
        t.ctx.clone(),
    ));
    t.tiered_target(
        "tiers",
        serde_json::json!({
            "pool": "aws-east",
            "hot": {"count": 0},
            "warm": {"count": 1},
            "spec": {"instanceType": "m5.xlarge", "region": "eu-west-1"},
        }),
    );
    t.tiered_pass("tiers").await;
    t.tiered_pass("tiers").await;
    t.wait_tiered_spares(N::Started, 1).await;
    t.tiered_pass("tiers").await;
    t.wait_tiered_spares(N::PoweredOff, 1).await;
    let warm = t.tiered_spares_in(N::PoweredOff)[0].clone();

    // A gold bundle on aws-east: its first placement provisions a node of its own.
    t.bundle("match", 1, &["aws-east"]);
    t.bundle_pass("match").await.expect("the finalizer pass");
    t.bundle_pass("match").await.expect("the provisioning pass");
    t.ctx
        .manager
        .wait_until(BOUND, |m| {
            m.nodes
                .values()
                .any(|n| n.pool == "aws-east" && n.state() == N::Started && !mapping_spare(n))
        })
        .await
        .expect("the bundle's node is up");
    t.bundle_pass("match").await.expect("the placing pass");
    let jobs = t.manager_jobs("match");
    assert_eq!(jobs.len(), 1, "the job is placed");
    let node = t
        ._sim
        .snapshot()
        .jobs
        .into_iter()
        .find(|j| j.job_id == jobs[0])
        .unwrap()
        .node_id;

    // Its node dies: the recovery finds no room and no hot spare.
    let before = t._sim.snapshot().nodes.len();
    t._sim.with_world(|w, now| w.kill_node(&node, now).unwrap());
    t.ctx
        .manager
        .wait_until(BOUND, |m| {
            m.nodes
                .get(&node)
                .is_some_and(|n| n.state() == N::Terminated)
        })
        .await
        .expect("the mirror sees the loss");
    t.bundle_pass("match").await.expect("the recovery pass");
    t.ctx
        .manager
        .wait_until(BOUND, |m| {
            m.nodes
                .get(&warm)
                .is_some_and(|n| matches!(n.state(), N::Starting | N::Started))
        })
        .await
        .expect("the warm spare is started");
    assert_eq!(
        t._sim.snapshot().nodes.len(),
        before,
        "no node was created for the recovery"
    );
    let metrics = t.ctx.metrics.encode();
    assert!(
        metrics.contains(
            "automanager_warm_spare_starts_total{pool=\"aws-east\",result=\"started\"} 1"
        ),
        "the recovery's start is counted:\n{metrics}"
    );
    t.wait_tiered_spares(N::Started, 1).await;
    // Its target passes first: the started spare is the recovery's, not a surplus hot spare to
    // stop again (the target makes a new warm spare instead).
    t.tiered_pass("tiers").await;
    assert!(
        t.tiered_spares_in(N::Started).contains(&warm),
        "the claimed spare keeps running"
    );
    t.bundle_pass("match")
        .await
        .expect("the pass after the spare is up");
    let placed_on = t
        ._sim
        .snapshot()
        .jobs
        .into_iter()
        .find(|j| j.job_id == jobs[0])
        .map(|j| j.node_id);
    assert_eq!(
        placed_on,
        Some(warm),
        "the gold job restarted on the warm spare"
    );
    pump.abort();
}

fn mapping_spare(n: &manager_proto::Node) -> bool {
    n.tags.get("spare").is_some_and(|v| v == "true")
}
