//! The cleanup finalizer's edges: a pass over an object that is gone by the time it writes.

use automanager_api::{Bundle, PriorityBand};
use automanager_operator::controllers;

use super::Tier;

const BUNDLES: &str = "/apis/automanager.norsk.io/v1alpha1/namespaces/live/bundles";

#[tokio::test]
async fn a_pass_over_a_bundle_whose_finalizer_is_already_removed_succeeds() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.pair_bundle("news", PriorityBand::Silver);
    t.bundle_pass("news").await.expect("the finalizer pass");
    t.bundle_pass("news").await.expect("the placing pass");
    t.api.delete_path(&format!("{BUNDLES}/news"));
    // The copy a queued pass still holds: being deleted, its finalizer still on.
    let stale = t
        .api
        .get::<Bundle>(Some("live"), "news")
        .expect("held by its finalizer");
    let stale = std::sync::Arc::new(stale);
    controllers::reconcile_finalized(stale.clone(), t.ctx.clone())
        .await
        .expect("the cleanup pass");
    assert!(t.api.get::<Bundle>(Some("live"), "news").is_none(), "gone");

    // The queued pass runs on the stale copy: removing the finalizer answers 404 Not Found.
    // The object is gone, which is what the pass was for: success, not a failure to retry.
    t.api.clear_calls();
    let again = controllers::reconcile_finalized(stale, t.ctx.clone()).await;
    assert!(again.is_ok(), "{again:?}");
    assert!(
        t.api.refused().iter().any(|r| r.ends_with("404")),
        "the finalizer's removal met the object gone: {:?}",
        t.api.refused()
    );
}
