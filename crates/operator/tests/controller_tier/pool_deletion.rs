//! A pool being deleted heals its users: a Bundle that used the pool before its deletion began
//! has its jobs placed on the pool's existing nodes again, whether Manager failed them or lost
//! them outright (its state emptied); nothing is provisioned there.

use automanager_operator::mapping;
use manager_client::proto;

use super::Tier;
use super::common::condition_of;

#[tokio::test]
async fn a_user_of_a_pool_being_deleted_whose_jobs_manager_lost_runs_again_on_its_nodes() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.bundle("news", 1, &["onprem"]);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    t.running("news").await;
    t.delete_pool("onprem");
    t.pool_pass("onprem").await.expect("the pass while in use");

    // Manager loses the bundle and its jobs (as a Manager restarted with its state emptied).
    let id = mapping::bundle_id("live", "news");
    t.ctx.manager.delete_bundle(&id).await.expect("gone");
    t.until_mirror("Manager has none of its jobs", |m| {
        m.jobs_of_bundle(&id).next().is_none()
    })
    .await;
    t.sync_model();
    t.manager.clear_calls();
    t.bundle_pass("news")
        .await
        .expect("the pass that registers it again");
    t.until_mirror("Manager has its jobs again", |m| {
        m.jobs_of_bundle(&id).next().is_some()
    })
    .await;
    t.sync_model();
    t.bundle_pass("news").await.expect("the placing pass");

    assert_eq!(
        t.manager.calls_named("StartJob").len(),
        1,
        "{:?}",
        t.manager.calls()
    );
    assert!(
        t.manager.calls_named("CreateNode").is_empty(),
        "nothing is provisioned in a pool being deleted"
    );
    t.until_mirror("its job runs again", |m| {
        m.jobs_of_bundle(&id)
            .any(|j| j.state() == proto::JobState::Running)
    })
    .await;
    t.bundle_pass("news")
        .await
        .expect("the pass that records it");
    let status = t.stored_bundle("news").status.unwrap();
    assert_eq!(
        status.replicas[0].jobs[0].pool.as_deref(),
        Some("onprem"),
        "{status:?}"
    );
    let (stalled, reason, _) = condition_of(&status.conditions, "Stalled");
    assert_ne!(
        (stalled.as_str(), reason.as_str()),
        ("True", "PoolTerminating")
    );
}
