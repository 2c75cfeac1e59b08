//! The HotSpareTarget pass: observe the pool's spares, plan, ask Manager, record.

use std::sync::Arc;
use std::time::Duration;

use automanager_api::{self as api, HotSpareTarget, HotSpareTargetStatus};
use automanager_operator::controllers;
use http::Method;
use kube::runtime::controller::Action;
use manager_client::{MirrorState, proto};

use super::Tier;
use super::common::{condition_of, requeue};

const TARGETS: &str = "/apis/automanager.norsk.io/v1alpha1/hotsparetargets";

impl Tier {
    /// A HotSpareTarget `name` keeping `count` spares of `instance_type` in `pool`.
    fn spare_target(&self, name: &str, pool: &str, count: i32, instance_type: &str) {
        self.spare_target_with(name, pool, count, instance_type, None);
    }

    fn spare_target_with(
        &self,
        name: &str,
        pool: &str,
        count: i32,
        instance_type: &str,
        max_age: Option<&str>,
    ) {
        let t = HotSpareTarget::new(
            name,
            serde_json::from_value(serde_json::json!({
                "pool": pool,
                "targetCount": count,
                "spec": {"instanceType": instance_type, "region": "eu-west-1"},
                "maxAge": max_age,
            }))
            .unwrap(),
        );
        self.api.insert(&t);
    }

    fn stored_target(&self, name: &str) -> Option<HotSpareTarget> {
        self.api.get::<HotSpareTarget>(None, name)
    }

    fn target_status(&self, name: &str) -> HotSpareTargetStatus {
        self.stored_target(name)
            .and_then(|t| t.status)
            .expect("a status")
    }

    /// One HotSpareTarget pass over the target as stored now.
    async fn spare_pass(&self, name: &str) -> Result<Action, controllers::Error> {
        let t = self.stored_target(name).expect("the target is stored");
        controllers::reconcile_finalized(Arc::new(t), self.ctx.clone()).await
    }

    /// The target stored and its finalizer pass done: the next pass is its first look.
    async fn spare_target_ready_to_pass(&self, name: &str, pool: &str, count: i32, it: &str) {
        self.spare_target(name, pool, count, it);
        self.spare_pass(name).await.expect("the finalizer pass");
        self.api.clear_calls();
        self.manager.clear_calls();
    }
}

/// The spares of `pool` the mirror shows started, holding no job.
fn started_spares(m: &MirrorState, pool: &str) -> usize {
    m.nodes
        .values()
        .filter(|n| {
            n.pool == pool
                && n.tags.get("spare").map(String::as_str) == Some("true")
                && n.state == proto::NodeState::Started as i32
        })
        .count()
}

fn standing(status: &HotSpareTargetStatus) -> (String, String) {
    let (s, reason, _) = condition_of(&status.conditions, "Ready");
    let stalled = condition_of(&status.conditions, "Stalled").0;
    let reconciling = condition_of(&status.conditions, "Reconciling").0;
    let which = match (s.as_str(), reconciling.as_str(), stalled.as_str()) {
        ("True", _, _) => "Ready",
        (_, "True", _) => "Reconciling",
        (_, _, "True") => "Stalled",
        _ => "none",
    };
    (which.to_owned(), reason)
}

#[tokio::test]
async fn a_new_target_asks_manager_for_its_spares_then_stands_ready_once_they_are_up() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.spare_target("east-spares", "aws-east", 2, "m5.xlarge");

    t.spare_pass("east-spares")
        .await
        .expect("the finalizer pass");
    assert_eq!(t.api.writes(), [format!("PATCH {TARGETS}/east-spares")]);
    assert!(
        t.manager.calls().is_empty(),
        "nothing asked before the finalizer"
    );
    t.api.clear_calls();

    let next = t.spare_pass("east-spares").await.expect("the pass");

    assert_eq!(
        t.manager.calls(),
        ["CreateNode in aws-east", "CreateNode in aws-east"]
    );
    assert_eq!(
        t.api.writes(),
        [format!("PATCH {TARGETS}/east-spares/status")]
    );
    let status = t.target_status("east-spares");
    assert_eq!((status.live_spares, status.pending_spares), (0, 2));
    assert_eq!(
        standing(&status),
        ("Reconciling".to_owned(), "Provisioning".to_owned())
    );
    assert_eq!(condition_of(&status.conditions, "SpareUnderflow").0, "True");
    assert_eq!(
        next,
        requeue(Duration::from_secs(1)),
        "soon, while spares come"
    );
    assert_eq!(t.events_with("ProvisioningSpare").await, 2);
    assert_eq!(t.events_with("SpareUnderflow").await, 1);

    t.until_mirror("both spares started", |m| {
        started_spares(m, "aws-east") == 2
    })
    .await;
    t.manager.clear_calls();
    let next = t.spare_pass("east-spares").await.expect("the pass once up");

    assert!(t.manager.calls().is_empty(), "{:?}", t.manager.calls());
    let status = t.target_status("east-spares");
    assert_eq!((status.live_spares, status.pending_spares), (2, 0));
    assert_eq!(status.spare_nodes.len(), 2);
    assert_eq!(
        standing(&status),
        ("Ready".to_owned(), "AtTarget".to_owned())
    );
    assert_eq!(
        condition_of(&status.conditions, "SpareUnderflow").0,
        "False"
    );
    assert_eq!(status.underflow_since, None);
    assert_eq!(next, requeue(Duration::from_secs(30)));

    t.api.clear_calls();
    t.spare_pass("east-spares").await.expect("a quiet pass");
    assert_eq!(t.api.writes(), Vec::<String>::new(), "nothing changed");
}

#[tokio::test]
async fn a_target_of_a_pool_that_does_not_exist_is_stalled_and_looked_at_again_later() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.spare_target_ready_to_pass("lost", "nowhere", 1, "m5.xlarge")
        .await;

    let next = t.spare_pass("lost").await.expect("the pass");

    let status = t.target_status("lost");
    assert_eq!(standing(&status).1, "UnknownPool");
    assert_eq!(
        condition_of(&status.conditions, "Stalled").2,
        "PlacementPool nowhere does not exist"
    );
    assert!(t.manager.calls().is_empty());
    assert_eq!(
        next,
        requeue(Duration::from_secs(30)),
        "the pool may appear"
    );
}

#[tokio::test]
async fn a_target_whose_instance_type_the_pool_lacks_is_stalled_until_its_spec_changes() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.spare_target_ready_to_pass("odd", "aws-east", 1, "x1.32xlarge")
        .await;

    let next = t.spare_pass("odd").await.expect("the pass");

    let status = t.target_status("odd");
    assert_eq!(standing(&status).1, "UnknownInstanceType");
    assert_eq!(
        condition_of(&status.conditions, "Stalled").2,
        "pool aws-east has no instance type \"x1.32xlarge\" (known: m5.xlarge)"
    );
    assert!(t.manager.calls().is_empty(), "Manager would refuse it");
    assert_eq!(next, Action::await_change());
}

#[tokio::test]
async fn a_fixed_pool_below_its_target_is_stalled_in_underflow_and_warns_once() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.spare_target_ready_to_pass("rack", "onprem", 1, "r740")
        .await;

    t.spare_pass("rack").await.expect("the pass");
    t.spare_pass("rack").await.expect("a second pass");

    let status = t.target_status("rack");
    assert_eq!(
        standing(&status),
        ("Stalled".to_owned(), "SpareUnderflow".to_owned())
    );
    assert!(status.underflow_since.is_some());
    assert!(t.manager.calls().is_empty(), "a fixed pool is never asked");
    assert_eq!(
        t.events_with("SpareUnderflow").await,
        1,
        "once per underflow"
    );
}

#[tokio::test]
async fn managers_refusal_to_provision_stalls_the_target_asks_no_more_and_warns_once() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.spare_target_ready_to_pass("east-spares", "aws-east", 1, "m5.xlarge")
        .await;
    t.manager.refuse_next(
        "CreateNode",
        tonic::Status::failed_precondition("quota exhausted"),
    );

    let next = t.spare_pass("east-spares").await.expect("the pass");
    t.spare_pass("east-spares").await.expect("a second pass");

    let status = t.target_status("east-spares");
    assert_eq!(standing(&status).1, "ProvisioningRefused");
    let (_, _, message) = condition_of(&status.conditions, "Stalled");
    assert!(
        message.starts_with("Manager refused to provision a m5.xlarge node in pool aws-east"),
        "{message}"
    );
    assert!(message.contains("quota exhausted"), "{message}");
    assert_eq!(next, requeue(Duration::from_secs(30)));
    assert_eq!(
        t.manager.calls_named("CreateNode").len(),
        1,
        "a refusal stands: not asked again"
    );
    assert_eq!(t.events_with("ProvisioningRefused").await, 1);
}

#[tokio::test]
async fn a_create_node_that_gets_no_answer_is_asked_again_after_its_back_off() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.spare_target_ready_to_pass("east-spares", "aws-east", 1, "m5.xlarge")
        .await;
    t.manager.refuse_next(
        "CreateNode",
        tonic::Status::unavailable("Manager restarting"),
    );

    let next = t.spare_pass("east-spares").await.expect("the pass");

    let status = t.target_status("east-spares");
    assert_eq!(
        standing(&status),
        ("Reconciling".to_owned(), "ProvisioningRetrying".to_owned())
    );
    let (_, _, message) = condition_of(&status.conditions, "Reconciling");
    assert!(
        message.starts_with("no spare node from pool aws-east yet"),
        "{message}"
    );
    assert_ne!(
        next,
        Action::await_change(),
        "looked at again after the back-off"
    );
    assert_eq!(t.manager.calls_named("CreateNode").len(), 1);
}

#[tokio::test]
async fn an_unreachable_manager_leaves_the_target_reconciling_and_it_looks_again_in_seconds() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.spare_target_ready_to_pass("east-spares", "aws-east", 1, "m5.xlarge")
        .await;
    t.manager.set_cut(true);
    t.until_manager_ready(false).await;
    t.manager.clear_calls();

    let next = t.spare_pass("east-spares").await.expect("the pass");

    let status = t.target_status("east-spares");
    assert_eq!(
        standing(&status),
        ("Reconciling".to_owned(), "ManagerUnavailable".to_owned())
    );
    assert!(t.manager.calls().is_empty(), "{:?}", t.manager.calls());
    assert_eq!(next, requeue(Duration::from_secs(3)));
}

#[tokio::test]
async fn a_stale_status_write_fails_the_pass_and_the_retry_asks_for_no_second_spare() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.spare_target_ready_to_pass("east-spares", "aws-east", 1, "m5.xlarge")
        .await;
    t.api
        .refuse_next(Method::PATCH, "/hotsparetargets/east-spares/status", 409);

    let err = t.spare_pass("east-spares").await.expect_err("the conflict");

    assert!(controllers::is_conflict(&err), "{err}");
    assert_eq!(t.manager.calls(), ["CreateNode in aws-east"]);
    t.spare_pass("east-spares").await.expect("the retry");
    assert_eq!(
        t.manager.calls_named("CreateNode").len(),
        1,
        "the spare asked for counts as pending"
    );
    assert_eq!(t.target_status("east-spares").pending_spares, 1);
}

#[tokio::test]
async fn a_spare_older_than_max_age_is_replaced_first_then_retired() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.spare_target_with("east-spares", "aws-east", 1, "m5.xlarge", Some("1h"));
    t.spare_pass("east-spares")
        .await
        .expect("the finalizer pass");
    t.spare_pass("east-spares")
        .await
        .expect("the provisioning pass");
    t.until_mirror("the spare started", |m| started_spares(m, "aws-east") == 1)
        .await;
    let (aged, created_ms) = t.ctx.manager.mirror().read(|m| {
        let n = m.nodes.values().find(|n| n.pool == "aws-east").unwrap();
        (n.node_id.clone(), n.created_at_ms)
    });
    // The operator's clock, an hour and a minute past the spare's start.
    let now_ms = t.ctx.clock.now().timestamp_millis();
    let ahead = created_ms - now_ms + 61 * 60 * 1000;
    t.clock
        .advance(Duration::from_millis(u64::try_from(ahead.max(0)).unwrap()));
    t.manager.clear_calls();

    t.spare_pass("east-spares")
        .await
        .expect("the rotating pass");

    assert_eq!(
        t.manager.calls(),
        ["CreateNode in aws-east"],
        "a replacement"
    );
    assert_eq!(
        standing(&t.target_status("east-spares")),
        ("Reconciling".to_owned(), "Rotating".to_owned())
    );
    t.until_mirror("the replacement started", |m| {
        started_spares(m, "aws-east") == 2
    })
    .await;
    t.manager.clear_calls();

    t.spare_pass("east-spares")
        .await
        .expect("the retiring pass");

    assert_eq!(t.manager.calls(), [format!("TerminateNode {aged}")]);
    let status = t.target_status("east-spares");
    assert_eq!(status.last_rotation, Some(t.ctx.clock.now()));
    assert_eq!(t.events_with("RotatedSpare").await, 1);
}

#[tokio::test]
async fn a_deleted_target_terminates_its_idle_spares_and_lets_go() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.spare_target("east-spares", "aws-east", 2, "m5.xlarge");
    t.spare_pass("east-spares")
        .await
        .expect("the finalizer pass");
    t.spare_pass("east-spares")
        .await
        .expect("the provisioning pass");
    t.until_mirror("both spares started", |m| {
        started_spares(m, "aws-east") == 2
    })
    .await;
    t.api.delete_path(&format!("{TARGETS}/east-spares"));
    t.manager.clear_calls();
    t.api.clear_calls();

    t.spare_pass("east-spares").await.expect("the cleanup pass");

    assert_eq!(t.manager.calls_named("TerminateNode").len(), 2);
    assert_eq!(t.api.writes(), [format!("PATCH {TARGETS}/east-spares")]);
    assert!(
        t.stored_target("east-spares").is_none(),
        "its finalizer ({}) went, and so did the target",
        api::SPARE_TARGET_FINALIZER
    );
}
