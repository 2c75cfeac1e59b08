//! Once a job has moved, the members of its co-location group left on the old node follow it
//! there ([`co_location::followers`]), each with a Migration of its own (the job's declared
//! strategy, `spec.targetNode` the node the job went to, the first Migration's labels so windows,
//! budgets and the queue treat it alike). A member with a Migration of its own in flight (a
//! drain's) is left to it: the group moves one job at a time and that Migration's target is
//! pinned to the group.

use std::collections::BTreeMap;

use automanager_api::{self as api, Bundle, Migration, MigrationJobRef};
use automanager_policy::co_location;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use crate::controllers::move_request::{MoveName, MoveRequest, Requested, request_move};
use crate::controllers::{Context, Error, drain};
use crate::mapping;

/// Annotation on a follower Migration: the Migration whose job it follows.
pub const FOLLOWS_ANNOTATION: &str = "automanager.norsk.io/follows";

/// Creates a Migration for each member of `mig`'s job's group left on `source` now that the
/// job runs on `target`; answers the jobs that follow.
pub(super) async fn create_followers(
    ctx: &Context,
    mig: &Migration,
    source: &str,
    target: &str,
) -> Result<Vec<String>, Error> {
    let ns = mig.namespace().unwrap_or_default();
    let job = &mig.spec.job;
    let Some(bundle) = Api::<Bundle>::namespaced(ctx.client.clone(), &ns)
        .get_opt(&job.bundle)
        .await?
    else {
        return Ok(Vec::new());
    };
    let bundle_id = mapping::bundle_id(&ns, &job.bundle);
    let spec = mapping::bundle(&bundle_id, &bundle.spec);
    let replica = u32::try_from(job.replica).unwrap_or(0);
    let running: BTreeMap<String, (String, String)> = ctx.manager.mirror().read(|m| {
        m.jobs_of_bundle(&bundle_id)
            .filter(|j| j.replica == replica && j.state().holds_capacity() && !j.node_id.is_empty())
            .map(|j| (j.job_name.clone(), (j.job_id.clone(), j.node_id.clone())))
            .collect()
    });
    let at: BTreeMap<String, String> = running
        .iter()
        .map(|(name, (_, node))| (name.clone(), node.clone()))
        .collect();
    let followers = co_location::followers(
        &spec.jobs,
        &spec.intra_replica_placement,
        &job.job_name,
        source,
        target,
        &at,
    );
    let mut created = Vec::new();
    for name in followers {
        let Some((job_id, _)) = running.get(&name) else {
            continue;
        };
        if ctx.state.migration_moves_job(job_id) {
            continue;
        }
        let follower = follower(mig, &name, job_id, target);
        let Requested::Created(follower_name) = request_move(ctx, &follower).await? else {
            continue;
        };
        tracing::info!(migration = %mig.name_any(), job = %name, to = %target, "co-located job follows");
        ctx.event(
            mig,
            EventType::Normal,
            "FollowerCreated",
            "Migrate",
            format!(
                "job {name} shares {}'s node by coLocateWith: Migration {} moves it to {target} too",
                job.job_name, follower_name
            ),
        )
        .await;
        created.push(name);
    }
    Ok(created)
}

/// The move of `job_name` (Manager id `job_id`) to `target`, following `mig`: it keeps the
/// first Migration's purpose and names it.
fn follower(mig: &Migration, job_name: &str, job_id: &str, target: &str) -> MoveRequest {
    let job = MigrationJobRef {
        bundle: mig.spec.job.bundle.clone(),
        replica: mig.spec.job.replica,
        job_name: job_name.to_owned(),
    };
    let name = MoveName::Stable(drain::named_migration("follow", &mig.name_any(), job_id));
    // The job's declared strategy.
    let mut req = MoveRequest::new(&mig.namespace().unwrap_or_default(), name, job)
        .to(Some(target.to_owned()))
        .annotate(FOLLOWS_ANNOTATION, mig.name_any());
    for (k, v) in mig.labels() {
        if [
            api::PURPOSE_LABEL,
            api::DRAIN_NODE_LABEL,
            api::CONSOLIDATION_NODE_LABEL,
        ]
        .contains(&k.as_str())
        {
            req = req.label(k, v.clone());
        }
    }
    req
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_keeps_the_first_migrations_purpose_and_names_it() {
        let mut first = Migration::new(
            "move-enc",
            serde_json::from_value(serde_json::json!({
                "job": {"bundle": "news", "replica": 1, "jobName": "enc"},
            }))
            .expect("a Migration spec"),
        );
        first.metadata.namespace = Some("live".into());
        first.metadata.labels = Some(
            [
                (api::PURPOSE_LABEL.to_owned(), "consolidation".to_owned()),
                ("team".to_owned(), "video".to_owned()),
            ]
            .into(),
        );
        let f = follower(&first, "pkg", "live.news/1/pkg", "n2").migration();
        assert_eq!(f.spec.job.job_name, "pkg");
        assert_eq!(f.spec.job.replica, 1);
        assert_eq!(f.spec.target_node.as_deref(), Some("n2"));
        assert_eq!(f.spec.strategy, None, "the job's declared one");
        assert_eq!(
            f.labels().get(api::PURPOSE_LABEL).map(String::as_str),
            Some("consolidation")
        );
        assert!(!f.labels().contains_key("team"));
        assert_eq!(
            f.annotations().get(FOLLOWS_ANNOTATION).map(String::as_str),
            Some("move-enc")
        );
        let name = f.name_any();
        assert!(
            name.starts_with("follow-move-enc-") && name.len() <= 63,
            "{name}"
        );
    }
}
