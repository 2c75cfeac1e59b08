//! A deadline beats a budget, as it beats a window: a move ahead of a reclaim notice begins at
//! once even when its Bundle's disruption budget allows no replica down, because the node is
//! taken at the deadline and the replica goes down then whether it moved or not.

use std::collections::BTreeMap;

use automanager_api::{self as api, Migration, MigrationPhase};

use super::Tier;
use super::common::condition_of;

#[tokio::test]
async fn a_reclaim_move_of_a_bundle_whose_budget_allows_none_down_begins_at_once() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.gold_overlap_bundle(1, serde_json::json!({"maxUnavailableReplicas": 0}))
        .await;
    let node = t.node_of_replica(0);
    let deadline = t.notice(&node, 60_000).await;
    // The reclaim move as the notice planner makes it when it finds the budget kept (no
    // override): the queue must not hold it either.
    let mut m = Migration::new(
        "reclaim-news-0",
        serde_json::from_value(serde_json::json!({
            "job": {"bundle": "news", "replica": 0, "jobName": "enc"},
        }))
        .unwrap(),
    );
    m.metadata.namespace = Some("live".into());
    m.metadata.labels = Some(BTreeMap::from([(
        api::PURPOSE_LABEL.to_owned(),
        "reclaim".to_owned(),
    )]));
    m.metadata.annotations = Some(BTreeMap::from([(
        api::DEADLINE_ANNOTATION.to_owned(),
        deadline.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )]));
    t.api.insert(&m);

    t.migration_pass("reclaim-news-0")
        .await
        .expect("the finalizer pass");
    t.migration_pass("reclaim-news-0")
        .await
        .expect("the admitting pass");

    let status = t.migration_status("reclaim-news-0");
    assert_ne!(status.phase, MigrationPhase::Pending, "{status:?}");
    if let Some(c) = api::find_condition(&status.conditions, "Queued") {
        assert_ne!(
            condition_of(&status.conditions, "Queued").1,
            "DisruptionBudget",
            "{c:?}"
        );
    }
    t.migration_until("reclaim-news-0", MigrationPhase::Completed)
        .await;
    assert_ne!(t.node_of_replica(0), node, "the job left the noticed node");
}
