//! The PlacementPool controller: loads each pool into the placement model, checks it against
//! Manager, and keeps its status (node count, live spares, spare target, used capacity).

use std::sync::Arc;
use std::time::Duration;

use automanager_api::{self as api, HotSpareTarget, PlacementPool, PlacementPoolStatus};
use chrono::Utc;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;

use super::{Context, Error};
use crate::mapping;

/// Pool figures are refreshed at least this often.
const REFRESH: Duration = Duration::from_secs(10);

pub async fn reconcile(pool: Arc<PlacementPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    super::timed("placementpool", &ctx, apply(&pool, &ctx)).await
}

async fn apply(pool: &PlacementPool, ctx: &Arc<Context>) -> Result<Action, Error> {
    let name = pool.name_any();
    let generation = pool.metadata.generation;
    let now = Utc::now();
    let prev = pool.status.clone().unwrap_or_default();
    let spec = mapping::pool(&name, &pool.spec);

    let loaded = ctx.with_mirror(|m, s| s.model_mut().upsert_pool(spec, m));
    let mut ready = match &loaded {
        Ok(_) => (true, "Valid", String::new()),
        Err(e) => (false, "InvalidPool", e.to_string()),
    };
    if loaded.is_ok() && ctx.manager_ready() {
        // Manager must know the pool, or nothing can ever be provisioned or found in it.
        match ctx.manager.list_pools().await {
            Ok(pools) => match pools.iter().find(|p| p.name == name) {
                None => {
                    ready = (
                        false,
                        "UnknownToManager",
                        format!("Manager has no pool named {name}"),
                    )
                }
                Some(p) if mapping::api_provider(p.kind).is_some_and(|k| k != pool.spec.kind) => {
                    ready = (
                        false,
                        "KindMismatch",
                        format!("Manager's pool {name} is of another provider kind"),
                    );
                }
                Some(_) => {}
            },
            Err(e) => tracing::debug!(pool = %name, error = %e, "could not list Manager's pools"),
        }
    }
    if let Ok(true) = loaded {
        // Bundles waiting for this pool may now place. Only on a change: the pool itself is
        // woken too, and an unconditional wake would loop.
        ctx.wake_pool(&name);
    }

    let usage = ctx.state().model.engine().pool_usage(&name);
    let targets: Api<HotSpareTarget> = Api::all(ctx.client.clone());
    let spare_target: i64 = match targets.list(&ListParams::default()).await {
        Ok(list) => {
            // The list is complete: spare-underflow series of deleted targets go now.
            let existing: Vec<(String, String)> = list
                .items
                .iter()
                .map(|t| (t.name_any(), t.spec.pool.clone()))
                .collect();
            ctx.metrics.retain_spare_targets(&existing);
            list.items
                .iter()
                .filter(|t| t.spec.pool == name)
                .map(|t| i64::from(t.spec.target_count))
                .sum()
        }
        Err(e) => {
            tracing::debug!(error = %e, "could not list HotSpareTargets");
            prev.spare_target
        }
    };
    let mut status = PlacementPoolStatus {
        observed_generation: generation,
        node_count: usage.as_ref().map_or(0, |u| i64::from(u.node_count)),
        live_spares: usage.as_ref().map_or(0, |u| i64::from(u.live_spares)),
        spare_target,
        used_capacity_fraction: usage.as_ref().map_or(0.0, |u| {
            (u.used_capacity_fraction * 1000.0).round() / 1000.0
        }),
        conditions: prev.conditions.clone(),
    };
    // A pool that is invalid or unknown to Manager stays so until its spec or Manager changes.
    let standing = if ready.0 {
        api::Standing::Ready
    } else {
        api::Standing::Stalled
    };
    api::set_standing(
        &mut status.conditions,
        standing,
        ready.1,
        ready.2,
        generation,
        now,
    );
    ctx.metrics.set_pool(
        &name,
        status.node_count,
        status.live_spares,
        status.spare_target,
        status.used_capacity_fraction,
    );

    if status != prev {
        super::apply_status(
            &Api::<PlacementPool>::all(ctx.client.clone()),
            &name,
            &status,
        )
        .await?;
    }
    Ok(Action::requeue(REFRESH))
}

/// Forgets pools whose objects are gone (the store is the controller's cache).
pub fn prune(ctx: &Context, existing: &[String]) {
    let gone: Vec<String> = {
        let mut state = ctx.state();
        let gone: Vec<String> = state
            .model
            .pools()
            .into_iter()
            .map(|p| p.name)
            .filter(|p| !existing.contains(p))
            .collect();
        for p in &gone {
            state.model_mut().remove_pool(p);
        }
        gone
    };
    for p in gone {
        ctx.metrics.remove_pool(&p);
    }
}
