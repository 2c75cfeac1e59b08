//! The PlacementPool controller: loads each pool into the placement model, checks it against
//! Manager, and keeps its status (node count, live spares, spare target, used capacity).

use std::sync::Arc;
use std::time::Duration;

use automanager_api::{self as api, HotSpareTarget, PlacementPool, PlacementPoolStatus};
use chrono::Utc;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;

use super::{Context, Error, condition};
use crate::mapping;

/// Pool figures are refreshed at least this often.
const REFRESH: Duration = Duration::from_secs(10);

pub async fn reconcile(pool: Arc<PlacementPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = apply(&pool, &ctx).await;
    ctx.metrics.observe_reconcile(
        "placementpool",
        result.is_ok(),
        started.elapsed().as_secs_f64(),
    );
    result
}

async fn apply(pool: &PlacementPool, ctx: &Arc<Context>) -> Result<Action, Error> {
    let name = pool.name_any();
    let generation = pool.metadata.generation;
    let now = Utc::now();
    let prev = pool.status.clone().unwrap_or_default();
    let spec = mapping::pool(&name, &pool.spec);

    let loaded = ctx
        .manager
        .mirror()
        .read(|m| ctx.model().upsert_pool(spec, m));
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
        // Bundles waiting for this pool may now place. Only on a change: pools are also woken
        // by this trigger, and an unconditional send would loop.
        let _ = ctx.bundle_trigger.send(());
    }

    let usage = ctx.model().engine().pool_usage(&name);
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
    api::set_condition(
        &mut status.conditions,
        condition("Ready", ready.0, ready.1, ready.2, generation, now),
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
    let mut model = ctx.model();
    for p in model.pools() {
        if !existing.contains(&p.name) {
            model.remove_pool(&p.name);
            ctx.metrics.remove_pool(&p.name);
        }
    }
}

pub fn error_policy(pool: Arc<PlacementPool>, error: &Error, _ctx: Arc<Context>) -> Action {
    tracing::warn!(pool = %pool.name_any(), error = %error, "pool reconcile failed");
    Action::requeue(super::backoff_for(error))
}
