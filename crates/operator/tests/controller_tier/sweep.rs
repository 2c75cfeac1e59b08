//! The orphan sweep, one pass at a time on the operator's clock: Manager's work whose custom
//! resource is gone is removed once it has stayed orphaned for the grace period.

use std::time::Duration;

use automanager_api::{Bundle, HotSpareTarget, Migration};
use automanager_operator::controllers::sweep::{self, Owners};
use automanager_operator::mapping;
use automanager_policy::orphans::OrphanTracker;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher;

use super::Tier;

/// A cache holding `objects`, as the controller's reflector would.
fn cache<K>(objects: Vec<K>) -> Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&watcher::Event::Init);
    for o in objects {
        writer.apply_watcher_event(&watcher::Event::InitApply(o));
    }
    writer.apply_watcher_event(&watcher::Event::InitDone);
    store
}

fn owners(bundles: Vec<Bundle>) -> Owners {
    Owners {
        bundles: cache(bundles),
        spare_targets: cache(Vec::<HotSpareTarget>::new()),
        migrations: cache(Vec::<Migration>::new()),
    }
}

/// Bundle `live/name` gone from the apiserver without its cleanup (its finalizer taken off by
/// hand): its work stays in Manager.
fn forget(name: &str, t: &Tier) {
    t.api
        .edit::<Bundle>(Some("live"), name, |b| b.metadata.finalizers = None);
    t.api.delete_path(&format!(
        "/apis/automanager.norsk.io/v1alpha1/namespaces/live/bundles/{name}"
    ));
}

#[tokio::test]
async fn a_bundle_whose_object_is_gone_is_removed_from_manager_after_the_grace_and_a_live_one_stays()
 {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    for name in ["kept", "gone"] {
        t.bundle(name, 1, &["onprem"]);
        t.bundle_pass(name).await.expect("the finalizer pass");
        t.bundle_pass(name).await.expect("the placing pass");
    }
    let kept = t.stored_bundle("kept");
    forget("gone", &t);
    let grace = Duration::from_secs(60);
    let owners = owners(vec![kept]);
    let mut tracker = OrphanTracker::default();
    t.manager.clear_calls();

    let removed = sweep::sweep_once(&t.ctx, &owners, &mut tracker, grace)
        .await
        .expect("the first sweep");

    assert_eq!(removed, 0, "orphaned, but not for the grace yet");
    assert!(t.manager.changes().is_empty());
    t.clock.advance(grace + Duration::from_secs(1));

    let removed = sweep::sweep_once(&t.ctx, &owners, &mut tracker, grace)
        .await
        .expect("the sweep past the grace");

    assert_eq!(removed, 1);
    assert_eq!(
        t.manager.changes(),
        [format!(
            "DeleteBundle {}",
            mapping::bundle_id("live", "gone")
        )]
    );
    assert_eq!(t.events_with("OrphanRemoved").await, 1);
}

#[tokio::test]
async fn while_manager_is_unreachable_the_sweep_removes_nothing() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    t.bundle("gone", 1, &["onprem"]);
    t.bundle_pass("gone").await.expect("the finalizer pass");
    t.bundle_pass("gone").await.expect("the placing pass");
    forget("gone", &t);
    let owners = owners(Vec::new());
    let mut tracker = OrphanTracker::default();
    let grace = Duration::from_secs(60);
    sweep::sweep_once(&t.ctx, &owners, &mut tracker, grace)
        .await
        .expect("the first sweep");
    t.clock.advance(grace + Duration::from_secs(1));
    t.manager.set_cut(true);
    t.until_manager_ready(false).await;
    t.manager.clear_calls();

    let removed = sweep::sweep_once(&t.ctx, &owners, &mut tracker, grace)
        .await
        .expect("the sweep");

    assert_eq!(removed, 0, "a stale mirror is no evidence");
    assert!(t.manager.calls().is_empty());
}
