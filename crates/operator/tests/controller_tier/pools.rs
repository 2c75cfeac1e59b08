//! The PlacementPool pass while Manager is unreachable: the pool is loaded for placement and
//! keeps its standing (an unreachable Manager says nothing about the pool), and nothing is
//! asked of Manager.

use automanager_api::PlacementPool;

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
        t.ctx
            .state()
            .model()
            .pool("aws-east")
            .and_then(|p| p.max_nodes),
        Some(7),
        "the new spec is in the placement model"
    );
}
