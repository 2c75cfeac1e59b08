//! The PlacementPool pass while Manager is unreachable: the pool is loaded for placement and
//! keeps its standing (an unreachable Manager says nothing about the pool), and nothing is
//! asked of Manager. A pool Manager has as another provider kind: what it says, and what
//! placement still does there.

use automanager_api::{self as api, PlacementPool, PoolKind};

use super::Tier;
use super::common::condition_of;

#[tokio::test]
async fn while_manager_is_unreachable_a_pool_is_loaded_keeps_its_standing_and_asks_nothing() {
    let t = Tier::start(|_| {}).await;
    t.pool("aws-east");
    t.pool_pass("aws-east").await.expect("the first pass");
    t.manager.set_cut(true);
    t.until_manager_ready(false).await;
    t.manager.clear_calls();
    t.api
        .edit::<PlacementPool>(None, "aws-east", |p| p.spec.max_nodes = Some(7));

    t.pool_pass("aws-east").await.expect("the pass");

    assert!(t.manager.calls().is_empty(), "{:?}", t.manager.calls());
    let pool = t.stored_pool("aws-east").unwrap();
    let status = pool.status.unwrap();
    assert_eq!(status.observed_generation, pool.metadata.generation);
    assert_eq!(condition_of(&status.conditions, "Ready").0, "True");
    assert_eq!(
        t.ctx.state.pool_spec("aws-east").and_then(|p| p.max_nodes),
        Some(7),
        "the new spec is in the placement model"
    );
}

/// A PlacementPool whose `kind` is not the kind of Manager's pool of that name is `Stalled`
/// with reason `KindMismatch`, and stays loaded for placement: the nodes Manager runs there are
/// real, so jobs are still placed on them (a Bundle recovering into the pool is not cut off
/// while the PlacementPool is replaced), while a new node is asked for with the declared kind,
/// which Manager refuses (`ProvisioningRefused`).
#[tokio::test]
async fn a_pool_of_another_kind_than_managers_is_stalled_and_places_only_on_managers_nodes() {
    let t = Tier::start(|_| {}).await;
    // Manager's onprem is a cluster pool; this PlacementPool says aws.
    t.pool("onprem");
    t.api
        .edit::<PlacementPool>(None, "onprem", |p| p.spec.kind = PoolKind::Aws);

    t.pool_pass("onprem").await.expect("the pool pass");

    let status = t.stored_pool("onprem").unwrap().status.unwrap();
    let (on, reason, message) = condition_of(&status.conditions, "Stalled");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "KindMismatch"));
    assert!(message.contains("another provider kind"), "{message}");
    assert_eq!(condition_of(&status.conditions, "Ready").0, "False");

    t.bundle_of("news", 10, &["onprem"]);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");

    let news = t.stored_bundle("news").status.unwrap();
    let node = news.replicas[0].jobs[0].node_id.clone();
    assert!(
        node.as_deref().is_some_and(|n| n.starts_with("onprem-")),
        "placed on one of Manager's onprem nodes: {news:?}"
    );

    // Manager's aws-east is aws; this PlacementPool says oci, and has no node yet.
    t.pool("aws-east");
    t.api
        .edit::<PlacementPool>(None, "aws-east", |p| p.spec.kind = PoolKind::Oci);
    t.pool_pass("aws-east").await.expect("the pool pass");
    assert_eq!(
        condition_of(
            &t.stored_pool("aws-east")
                .unwrap()
                .status
                .unwrap()
                .conditions,
            "Stalled"
        )
        .1,
        "KindMismatch"
    );
    t.bundle_of("west", 10, &["aws-east"]);
    t.bundle_pass("west").await.expect("the finalizer pass");
    t.bundle_pass("west")
        .await
        .expect("a refusal is the bundle's state");

    assert_eq!(t.creates(), 1, "asked once");
    let west = t.stored_bundle("west").status.unwrap();
    let (on, reason, message) = condition_of(&west.conditions, "Stalled");
    assert_eq!(
        (on.as_str(), reason.as_str()),
        ("True", "ProvisioningRefused")
    );
    assert!(message.contains("does not match pool"), "{message}");
    assert_eq!(west.replicas[0].jobs[0].state, api::JobState::Unplaceable);
}

#[tokio::test]
async fn a_pool_being_deleted_heals_its_users_on_its_nodes_and_keeps_new_bundles_out_by_name() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.bundle("news", 1, &["onprem"]);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    t.running("news").await;
    t.delete_pool("onprem");
    t.pool_pass("onprem").await.expect("the pass while in use");
    assert_eq!(
        condition_of(
            &t.stored_pool("onprem").unwrap().status.unwrap().conditions,
            "Stalled"
        )
        .1,
        "InUse"
    );

    // Its user's gold job fails: it recovers on another of the pool's nodes.
    let lost = t.lose_node_of("news").await;
    t.bundle_pass("news").await.expect("the recovery");

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
    t.running("news").await;
    let status = t.stored_bundle("news").status.unwrap();
    let job = &status.replicas[0].jobs[0];
    assert_eq!(job.pool.as_deref(), Some("onprem"), "{status:?}");
    assert_ne!(job.node_id.as_deref(), Some(lost.as_str()));

    // A new Bundle is kept out, and told which pool is going.
    t.bundle("fresh", 1, &["onprem"]);
    t.bundle_pass("fresh").await.expect("the finalizer pass");
    t.bundle_pass("fresh").await.expect("the placing pass");
    let status = t.stored_bundle("fresh").status.unwrap();
    let (on, reason, message) = condition_of(&status.conditions, "Stalled");
    assert_eq!((on.as_str(), reason.as_str()), ("True", "PoolTerminating"));
    assert!(
        message.contains("pool onprem is being deleted"),
        "{message}"
    );
    println!("reliability4-figure terminating_pool_healed=yes");
}
