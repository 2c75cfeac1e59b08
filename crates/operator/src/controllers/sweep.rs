//! The orphan sweep (leader only): removes from Manager the bundles and idle nodes whose custom
//! resource is gone, once they have stayed orphaned for `orphanSweep.grace`
//! ([`automanager_policy::orphans`] decides; this module observes and acts).
//!
//! Checked by ids, names and tags, not by who made a thing (which Manager does not record):
//! only bundles whose id has the form the operator gives (`<namespace>.<name>`) in the
//! namespaces it watches, and nodes whose tags name an owner the operator creates nodes for,
//! are considered; and before anything is removed its owner is read once more from the
//! apiserver (not the cache), so a slow cache never removes a live object's work. Each removal gets a
//! Warning Event `OrphanRemoved` on the owner's reference (the object itself is gone) and counts
//! in `automanager_orphans_removed_total{kind}`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{Bundle, HotSpareTarget, ManagerNode, Migration};
use automanager_policy::ids::BundleId;
use automanager_policy::orphans::{NodeOwner, Orphan, OrphanTracker, node_owner};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use manager_client::MirrorState;
use manager_proto as proto;

use super::{Context, Error, is_final_answer};
use crate::mapping;
use crate::scope::Scope;

/// The caches the sweep compares Manager's state with.
pub struct Owners {
    pub bundles: Store<Bundle>,
    pub spare_targets: Store<HotSpareTarget>,
    pub migrations: Store<Migration>,
}

/// Runs the sweep every `interval` until the task is aborted.
pub async fn run_orphan_sweep(
    ctx: Arc<Context>,
    owners: Owners,
    interval: Duration,
    grace: Duration,
) {
    let mut tracker = OrphanTracker::default();
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // A missed wake-up must not stop the sweep for good: wait in short steps.
    for ready in [
        ready(&owners.bundles).await,
        ready(&owners.spare_targets).await,
        ready(&owners.migrations).await,
    ] {
        if !ready {
            tracing::warn!("orphan sweep: a cache's writer went away; the sweep does not run");
            return;
        }
    }
    loop {
        tick.tick().await;
        if let Err(e) = sweep_once(&ctx, &owners, &mut tracker, grace).await {
            tracing::warn!(error = %e, "orphan sweep failed; trying again next period");
        }
    }
}

/// Whether `store` became ready (`false` once its writer is gone).
async fn ready<K>(store: &Store<K>) -> bool
where
    K: kube::runtime::reflector::Lookup + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(Duration::from_secs(1), store.wait_until_ready()).await {
            Ok(Ok(())) => return true,
            Ok(Err(_)) => return false,
            Err(_) => {}
        }
    }
}

/// One pass: candidates from the mirror and the caches, then removal of those past their grace.
pub async fn sweep_once(
    ctx: &Context,
    owners: &Owners,
    tracker: &mut OrphanTracker,
    grace: Duration,
) -> Result<usize, Error> {
    // Disconnected, the mirror may be stale: a bundle Manager already removed would be swept
    // again, and one registered meanwhile missed. Wait for the next pass.
    if !ctx.manager_ready() {
        return Ok(0);
    }
    let known = Known::from(owners);
    let candidates = ctx
        .manager
        .mirror()
        .read(|m| candidates(m, &known, &ctx.settings.scope));
    let now_ms = ctx.clock.now().timestamp_millis();
    let grace_ms = i64::try_from(grace.as_millis()).unwrap_or(i64::MAX);
    let mut removed = 0;
    for orphan in tracker.observe(candidates, now_ms, grace_ms) {
        if remove(ctx, &orphan).await? {
            removed += 1;
        }
        tracker.forget(&orphan);
    }
    Ok(removed)
}

/// The owners the caches hold, by the ids Manager's objects carry.
struct Known {
    bundles: BTreeSet<String>,
    spare_targets: BTreeSet<String>,
    migrations: BTreeSet<String>,
}

impl From<&Owners> for Known {
    fn from(o: &Owners) -> Self {
        Known {
            bundles: o
                .bundles
                .state()
                .iter()
                .filter_map(|b| {
                    Some(mapping::bundle_id(
                        b.metadata.namespace.as_deref()?,
                        &b.name_any(),
                    ))
                })
                .collect(),
            spare_targets: o
                .spare_targets
                .state()
                .iter()
                .map(|t| t.name_any())
                .collect(),
            migrations: o
                .migrations
                .state()
                .iter()
                .map(|m| super::migration::manager_migration_id(m))
                .collect(),
        }
    }
}

/// Everything orphaned now, by the caches.
fn candidates(m: &MirrorState, known: &Known, scope: &Scope) -> Vec<Orphan> {
    let ours = |id: &BundleId| scope.owns_bundle(id);
    let mut out: Vec<Orphan> = m
        .bundles
        .keys()
        .filter_map(|id| BundleId::parse(id))
        .filter(|id| ours(id) && !known.bundles.contains(id.as_str()))
        .map(Orphan::Bundle)
        .collect();
    for node in m.nodes.values() {
        if matches!(
            node.state(),
            proto::NodeState::Terminated | proto::NodeState::Unspecified
        ) {
            continue;
        }
        let Some(owner) = node_owner(|k| node.tags.get(k).map(String::as_str)) else {
            continue;
        };
        let gone = match &owner {
            // Spares are the cluster scope owner's to keep or remove.
            NodeOwner::SpareTarget(name) => {
                scope.owns_cluster_scope() && !known.spare_targets.contains(name)
            }
            NodeOwner::BundleReplica(id) => ours(id) && !known.bundles.contains(id.as_str()),
            // Migrations are namespaced: with a narrowed watch another namespace's may exist.
            NodeOwner::Migration(id) => {
                scope.owns_every_namespace() && !known.migrations.contains(id)
            }
        };
        let idle = !m
            .jobs_on(&node.node_id)
            .flat_map(|j| j.instances.iter())
            .any(|i| i.node_id == node.node_id && i.holds_capacity());
        if gone && idle {
            out.push(Orphan::Node(node.node_id.clone()));
        }
    }
    out
}

/// Removes one orphan after reading its owner from the apiserver; `false` when the owner
/// turned out to exist (or Manager had already let the orphan go).
async fn remove(ctx: &Context, orphan: &Orphan) -> Result<bool, Error> {
    let owner = match orphan {
        Orphan::Bundle(id) => NodeOwner::BundleReplica(id.clone()),
        Orphan::Node(node_id) => match ctx.manager.mirror().read(|m| {
            m.nodes
                .get(node_id)
                .and_then(|n| node_owner(|k| n.tags.get(k).map(String::as_str)))
        }) {
            Some(owner) => owner,
            None => return Ok(false),
        },
    };
    if owner_exists(ctx, &owner).await? {
        return Ok(false);
    }
    let (removed, reference, note) = match orphan {
        Orphan::Bundle(id) => {
            let (ns, name) = id.object();
            (
                ctx.manager.delete_bundle(id.as_str()).await.map(drop),
                object_reference::<Bundle>(Some(ns), name),
                format!(
                    "Manager bundle {id} had no Bundle object for the whole grace period; removed it and stopped its jobs"
                ),
            )
        }
        Orphan::Node(node_id) => (
            ctx.manager.terminate_node(node_id).await.map(drop),
            object_reference::<ManagerNode>(None, &mapping::node_object_name(node_id)),
            format!(
                "node {node_id} was created for {owner:?}, which is gone, and ran nothing for the whole grace period; terminated it"
            ),
        ),
    };
    match removed {
        Ok(()) => {}
        Err(e) if is_final_answer(&e) => return Ok(false),
        Err(e) => return Err(e.into()),
    }
    tracing::warn!(kind = orphan.kind(), note = %note, "orphan sweep removed Manager work whose owner is gone");
    ctx.event_on(
        &reference,
        EventType::Warning,
        "OrphanRemoved",
        "Sweep",
        note,
    )
    .await;
    ctx.metrics.orphan_removed(orphan.kind());
    Ok(true)
}

/// The owner, read from the apiserver.
async fn owner_exists(ctx: &Context, owner: &NodeOwner) -> Result<bool, Error> {
    Ok(match owner {
        NodeOwner::SpareTarget(name) => {
            let api: Api<HotSpareTarget> = Api::all(ctx.client.clone());
            api.get_opt(name).await?.is_some()
        }
        NodeOwner::BundleReplica(id) => {
            let (ns, name) = id.object();
            let api: Api<Bundle> = Api::namespaced(ctx.client.clone(), ns);
            api.get_opt(name).await?.is_some()
        }
        NodeOwner::Migration(id) => super::list_watched::<Migration>(ctx, &Default::default())
            .await?
            .iter()
            .any(|m| super::migration::manager_migration_id(m) == *id),
    })
}

fn object_reference<K: Resource<DynamicType = ()>>(
    namespace: Option<&str>,
    name: &str,
) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        namespace: namespace.map(str::to_owned),
        name: Some(name.to_owned()),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn node(id: &str, tags: &[(&str, &str)]) -> proto::Node {
        proto::Node {
            node_id: id.into(),
            pool: "aws".into(),
            state: proto::NodeState::Started as i32,
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<HashMap<_, _>>(),
            ..Default::default()
        }
    }

    fn known(bundles: &[&str], targets: &[&str]) -> Known {
        Known {
            bundles: bundles.iter().map(|s| (*s).to_owned()).collect(),
            spare_targets: targets.iter().map(|s| (*s).to_owned()).collect(),
            migrations: BTreeSet::new(),
        }
    }

    #[test]
    fn only_the_operators_own_work_without_an_owner_is_a_candidate() {
        let mut m = MirrorState::default();
        for id in ["video.news", "video.gone", "other.gone", "not-ours"] {
            m.bundles.insert(
                id.into(),
                proto::Bundle {
                    bundle_id: id.into(),
                    ..Default::default()
                },
            );
        }
        m.nodes.insert(
            "spare-1".into(),
            node("spare-1", &[(mapping::SPARE_TARGET_TAG, "gone-target")]),
        );
        m.nodes.insert(
            "spare-2".into(),
            node("spare-2", &[(mapping::SPARE_TARGET_TAG, "live-target")]),
        );
        m.nodes.insert(
            "for-gone".into(),
            node(
                "for-gone",
                &[(mapping::PROVISIONED_FOR_TAG, "video.gone.r0")],
            ),
        );
        m.nodes.insert("hand-made".into(), node("hand-made", &[]));
        let mut dead = node("dead", &[(mapping::SPARE_TARGET_TAG, "gone-target")]);
        dead.state = proto::NodeState::Terminated as i32;
        m.nodes.insert("dead".into(), dead);

        let k = known(&["video.news"], &["live-target"]);
        let mut all = candidates(&m, &k, &Scope::default());
        all.sort();
        let want = vec![
            Orphan::Bundle(BundleId::parse("other.gone").unwrap_or_else(|| panic!())),
            Orphan::Bundle(BundleId::parse("video.gone").unwrap_or_else(|| panic!())),
            Orphan::Node("for-gone".into()),
            Orphan::Node("spare-1".into()),
        ];
        assert_eq!(all, want);
        // Watching only `video`, another namespace's bundle is not the operator's to judge.
        let scoped = candidates(&m, &k, &Scope::new(vec!["video".to_owned()], false));
        assert!(
            !scoped
                .iter()
                .any(|o| matches!(o, Orphan::Bundle(b) if b.as_str() == "other.gone"))
        );
        // Nor, without the cluster scope, a spare whose target is gone.
        assert!(
            !scoped.contains(&Orphan::Node("spare-1".into())),
            "{scoped:?}"
        );
        assert!(
            scoped.contains(&Orphan::Node("for-gone".into())),
            "{scoped:?}"
        );
    }

    #[test]
    fn a_node_that_still_runs_something_is_not_swept() {
        let mut m = MirrorState::default();
        m.nodes.insert(
            "spare-1".into(),
            node("spare-1", &[(mapping::SPARE_TARGET_TAG, "gone-target")]),
        );
        m.insert_job(proto::Job {
            job_id: "video.x/0/enc".into(),
            bundle_id: "video.x".into(),
            node_id: "spare-1".into(),
            state: proto::JobState::Running as i32,
            instances: vec![proto::JobInstance {
                node_id: "spare-1".into(),
                state: proto::JobState::Running as i32,
                ..Default::default()
            }],
            ..Default::default()
        });
        let k = known(&["video.x"], &[]);
        assert!(candidates(&m, &k, &Scope::default()).is_empty());
    }
}
