//! The PlacementPool controller: loads each pool into the placement model, checks it against
//! Manager, and keeps its status (node count, live spares, spare target, used capacity), and
//! runs the pool's consolidation ([`super::consolidation`]) when its spec asks for it.
//!
//! Every pool carries the [`api::POOL_FINALIZER`]: deleting a pool that a Bundle (in its `pools`
//! or a replica override) or a HotSpareTarget names waits, with the pool kept in the placement
//! model so those jobs keep recovering, and `Stalled=True` reason `InUse` naming the users,
//! until none is left (users being deleted themselves do not count); then the pool goes.

use std::sync::Arc;
use std::time::Duration;

use automanager_api::{self as api, HotSpareTarget, PlacementPool, PlacementPoolStatus};
use automanager_policy::bounded;
use automanager_policy::provision_budget::MaxNodesStanding;
use automanager_policy::provision_refusals::Refusal;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;

use super::{Context, Error};
use crate::mapping;

/// Pool figures are refreshed at least this often.
const REFRESH: Duration = Duration::from_secs(10);

pub async fn reconcile(pool: Arc<PlacementPool>, ctx: Arc<Context>) -> Result<Action, Error> {
    let result = pass(&pool, &ctx).await;
    if result.is_ok() {
        super::pass_succeeded(&ctx, pool.as_ref());
    }
    result
}

async fn pass(pool: &Arc<PlacementPool>, ctx: &Arc<Context>) -> Result<Action, Error> {
    let (pool, ctx) = (pool.clone(), ctx.clone());
    super::timed("placementpool", &ctx, async {
        if !ctx.settings.owns_cluster_scope {
            // Another operator owns the pool's status and finalizer; this one only places into it.
            observe(&pool, &ctx);
            return Ok(Action::await_change());
        }
        if pool.metadata.deletion_timestamp.is_some() {
            return deleting(&pool, &ctx).await;
        }
        if !pool.finalizers().iter().any(|f| f == api::POOL_FINALIZER) {
            let mut finalizers = pool.finalizers().to_vec();
            finalizers.push(api::POOL_FINALIZER.to_owned());
            set_finalizers(&pool, &ctx, finalizers).await?;
        }
        apply(&pool, &ctx, &[]).await
    })
    .await
}

/// Loads the pool into the placement model, and wakes the bundles waiting for it when it changed.
fn observe(pool: &PlacementPool, ctx: &Context) {
    let name = pool.name_any();
    let spec = engine_pool(pool);
    match ctx.with_mirror(|m, s| s.model_mut().upsert_pool(spec, m)) {
        Ok(true) => {
            // A changed spec may make what Manager refused acceptable: ask again.
            ctx.state().provisioning_mut().pool_changed(&name);
            ctx.wake_pool(&name);
        }
        Ok(false) => {}
        Err(e) => tracing::debug!(pool = %name, error = %e, "pool not loaded"),
    }
}

/// The pool as the placement model holds it: a pool being deleted keeps what runs there
/// until it moves and takes no new placement or provisioning.
fn engine_pool(pool: &PlacementPool) -> automanager_placement::PoolSpec {
    let mut spec = mapping::pool(&pool.name_any(), &pool.spec);
    spec.terminating = pool.metadata.deletion_timestamp.is_some();
    spec
}

/// Writes the pool's finalizers, failing (409) if the object changed since it was read.
async fn set_finalizers(
    pool: &PlacementPool,
    ctx: &Context,
    finalizers: Vec<String>,
) -> Result<(), Error> {
    let patch = serde_json::json!({
        "metadata": {
            "finalizers": finalizers,
            "resourceVersion": pool.resource_version(),
        }
    });
    Api::<PlacementPool>::all(ctx.client.clone())
        .patch(
            &pool.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// A pool being deleted: it goes once nothing uses it; until then it stays loaded and says who
/// holds it.
async fn deleting(pool: &PlacementPool, ctx: &Arc<Context>) -> Result<Action, Error> {
    if !pool.finalizers().iter().any(|f| f == api::POOL_FINALIZER) {
        return Ok(Action::await_change());
    }
    let name = pool.name_any();
    let users = users_of(&name, ctx).await?;
    if users.is_empty() {
        let rest: Vec<String> = pool
            .finalizers()
            .iter()
            .filter(|f| *f != api::POOL_FINALIZER)
            .cloned()
            .collect();
        set_finalizers(pool, ctx, rest).await?;
        tracing::info!(pool = %name, "PlacementPool deleted: nothing uses it");
        return Ok(Action::await_change());
    }
    apply(pool, ctx, &users).await
}

/// The objects that name `pool`, as `Bundle <namespace>/<name>` and `HotSpareTarget <name>`,
/// sorted; objects being deleted themselves are not counted. Read from the API server, not a
/// cache: a user created a moment ago must count.
async fn users_of(pool: &str, ctx: &Context) -> Result<Vec<String>, Error> {
    let live = |meta: &kube::api::ObjectMeta| meta.deletion_timestamp.is_none();
    let mut users = Vec::new();
    for bundles in super::bundle_apis(ctx) {
        for b in bundles.list(&ListParams::default()).await? {
            let spec = &b.spec;
            let names = spec
                .pools
                .iter()
                .chain(spec.replica_overrides.iter().flat_map(|o| &o.pools));
            if live(&b.metadata) && names.into_iter().any(|p| p == pool) {
                users.push(format!(
                    "Bundle {}/{}",
                    b.namespace().unwrap_or_default(),
                    b.name_any()
                ));
            }
        }
    }
    let targets: Api<HotSpareTarget> = Api::all(ctx.client.clone());
    for t in targets.list(&ListParams::default()).await? {
        if live(&t.metadata) && t.spec.pool == pool {
            users.push(format!("HotSpareTarget {}", t.name_any()));
        }
    }
    users.sort();
    Ok(users)
}

/// The `InUse` message: who holds the pool, bounded like every condition message.
pub fn in_use_message(users: &[String]) -> String {
    let head = "deletion waits until nothing names this pool; used by ";
    let list = bounded::join_bounded(
        users,
        ", ",
        bounded::MAX_CONDITION_MESSAGE.saturating_sub(head.len()),
    );
    format!("{head}{list}")
}

/// Loads the pool and writes its status; `users` non-empty means it is being deleted and they
/// hold it.
async fn apply(
    pool: &PlacementPool,
    ctx: &Arc<Context>,
    users: &[String],
) -> Result<Action, Error> {
    let name = pool.name_any();
    let generation = pool.metadata.generation;
    let now = ctx.clock.now();
    let prev = pool.status.clone().unwrap_or_default();
    let spec = engine_pool(pool);

    let loaded = ctx.with_mirror(|m, s| s.model_mut().upsert_pool(spec, m));
    if let Ok(true) = loaded {
        // A changed spec may make what Manager refused acceptable: ask again.
        ctx.state().provisioning_mut().pool_changed(&name);
    }
    let mut ready = match &loaded {
        Ok(_) => (true, "Valid", String::new()),
        Err(e) => (false, "InvalidPool", e.to_string()),
    };
    if loaded.is_ok() && ctx.manager_ready() {
        // Manager must know the pool, or nothing can ever be provisioned or found in it.
        match ctx.manager.list_pools().await {
            Ok(pools) => match pools.iter().find(|p| p.name == name) {
                Some(p) if manager_offer_changed(ctx, p) => ctx.wake_pool(&name),
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
    if !users.is_empty() {
        ready = (false, "InUse", in_use_message(users));
    }
    let provisioning = provisioning_standing(ctx, pool);
    if let Ok(true) = loaded {
        // Bundles waiting for this pool may now place. Only on a change: the pool itself is
        // woken too, and an unconditional wake would loop.
        ctx.wake_pool(&name);
    }

    let usage = ctx.state().model().engine().pool_usage(&name);
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
        consolidation: prev.consolidation.clone(),
        conditions: prev.conditions.clone(),
    };
    // What holds back new nodes: a refusal from Manager, or the pool above its maxNodes (a
    // stall, after the pool's own faults and its deletion).
    let blocked = provisioning.stall();
    if ready.0
        && let Some((reason, message)) = blocked.clone()
    {
        ready = (false, reason, message);
    }
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
    // The zone brake: which zones of the pool get no new node now.
    let degraded: Vec<String> = {
        let s = ctx.state();
        let window = ctx.settings.zone_brake.map(|b| b.window);
        s.provisioning()
            .zone_brake()
            .degraded_in(&name)
            .into_iter()
            .map(|d| super::zones::degraded_message(d, window))
            .collect()
    };
    api::set_condition(
        &mut status.conditions,
        super::condition(
            "ZoneDegraded",
            !degraded.is_empty(),
            if degraded.is_empty() {
                "NoZoneDegraded"
            } else {
                "ZoneOutage"
            },
            bounded::clip(&degraded.join("; "), 1024).into_owned(),
            generation,
            now,
        ),
    );
    for c in provisioning.conditions(generation, now) {
        api::set_condition(&mut status.conditions, c);
    }
    // Consolidation (off unless the spec asks): its plan, progress and condition.
    let mut requeue = REFRESH;
    if pool.metadata.deletion_timestamp.is_none() {
        let pass = super::consolidation::step(pool, ctx).await?;
        status.consolidation = pass.status;
        api::set_condition(&mut status.conditions, pass.condition);
        if let Some(r) = pass.requeue {
            requeue = requeue.min(r);
        }
    }
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
    let was = |c: &api::condition::Condition| c.type_ == "Stalled" && c.reason == "InUse";
    let message = |conditions: &[api::condition::Condition]| {
        conditions
            .iter()
            .find(|c| was(c))
            .map(|c| c.message.clone())
    };
    provisioning.announce(pool, ctx, &prev.conditions).await;
    if !users.is_empty() && message(&prev.conditions) != message(&status.conditions) {
        ctx.event(
            pool,
            EventType::Warning,
            "DeletionBlocked",
            "Delete",
            bounded::clip(&in_use_message(users), 1024).into_owned(),
        )
        .await;
    }
    Ok(Action::requeue(requeue))
}

/// Tells the refusals what Manager offers for the pool now; `true` when refusals were dropped
/// because that changed (the bundles waiting on the pool may ask again).
fn manager_offer_changed(ctx: &Context, pool: &manager_client::proto::Pool) -> bool {
    let offered = pool
        .instance_types
        .iter()
        .map(|t| t.instance_type.clone())
        .collect();
    ctx.state()
        .provisioning_mut()
        .manager_offers(&pool.name, offered)
}

/// What the pool says about making new nodes: Manager's refusals that stand, and where it is
/// against its `maxNodes`.
struct ProvisioningStanding {
    refusals: Vec<Refusal>,
    max_nodes: MaxNodesStanding,
}

const REFUSED: &str = "ProvisioningRefused";
const AT_MAX_NODES: &str = "AtMaxNodes";

fn provisioning_standing(ctx: &Context, pool: &PlacementPool) -> ProvisioningStanding {
    let name = pool.name_any();
    let epoch = ctx.manager.mirror().read(|m| m.epoch.clone());
    let state = ctx.state();
    let nodes = state
        .model()
        .engine()
        .pool_usage(&name)
        .map_or(0, |u| u.node_count);
    let max_nodes = pool.spec.max_nodes.map(|m| u32::try_from(m).unwrap_or(0));
    ProvisioningStanding {
        refusals: state.provisioning().refusals_of(&name, &epoch),
        max_nodes: MaxNodesStanding::of(max_nodes, nodes),
    }
}

impl ProvisioningStanding {
    fn refusal_message(&self) -> Option<String> {
        (!self.refusals.is_empty()).then(|| {
            let each: Vec<String> = self.refusals.iter().map(Refusal::describe).collect();
            bounded::join_bounded(&each, "; ", bounded::MAX_CONDITION_MESSAGE)
        })
    }

    /// The stall's reason and message, when new nodes are held back.
    fn stall(&self) -> Option<(&'static str, String)> {
        if let Some(message) = self.refusal_message() {
            return Some((REFUSED, message));
        }
        matches!(self.max_nodes, MaxNodesStanding::Above { .. })
            .then(|| (self.max_nodes.reason(), self.max_nodes.message()))
    }

    /// The `ProvisioningRefused` and `AtMaxNodes` conditions.
    fn conditions(
        &self,
        generation: Option<i64>,
        now: chrono::DateTime<chrono::Utc>,
    ) -> [api::condition::Condition; 2] {
        let refused = match self.refusal_message() {
            Some(message) => super::condition(REFUSED, true, REFUSED, message, generation, now),
            None => super::condition(REFUSED, false, "NoRefusal", "", generation, now),
        };
        let at_max = super::condition(
            AT_MAX_NODES,
            self.max_nodes.at_max(),
            self.max_nodes.reason(),
            self.max_nodes.message(),
            generation,
            now,
        );
        [refused, at_max]
    }

    /// A Warning Event when a refusal or the pool's excess over `maxNodes` is new (or says
    /// something new) since the status before.
    async fn announce(
        &self,
        pool: &PlacementPool,
        ctx: &Context,
        before: &[api::condition::Condition],
    ) {
        let was = |type_: &str| {
            api::find_condition(before, type_)
                .filter(|c| c.is_true())
                .map(|c| (c.reason.clone(), c.message.clone()))
        };
        if let Some(message) = self.refusal_message()
            && was(REFUSED).is_none_or(|(_, m)| m != message)
        {
            ctx.event(
                pool,
                EventType::Warning,
                REFUSED,
                "Provision",
                bounded::clip(&message, 1024).into_owned(),
            )
            .await;
        }
        if let MaxNodesStanding::Above { .. } = self.max_nodes
            && was(AT_MAX_NODES).is_none_or(|(r, _)| r != self.max_nodes.reason())
        {
            ctx.event(
                pool,
                EventType::Warning,
                self.max_nodes.reason(),
                "Provision",
                self.max_nodes.message(),
            )
            .await;
        }
    }
}

/// Forgets pools whose objects are gone (the store is the controller's cache).
pub fn prune(ctx: &Context, existing: &[String]) {
    let gone: Vec<String> = {
        let mut state = ctx.state();
        let gone: Vec<String> = state
            .model()
            .pools()
            .into_iter()
            .map(|p| p.name)
            .filter(|p| !existing.contains(p))
            .collect();
        for p in &gone {
            state.model_mut().remove_pool(p);
            state.disruptions_mut().forget_consolidation(p);
            state.provisioning_mut().pool_changed(p);
        }
        gone
    };
    for p in gone {
        ctx.metrics.remove_pool(&p);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_in_use_message_names_every_user_that_fits_and_counts_the_rest() {
        let few = vec![
            "Bundle default/news".to_owned(),
            "HotSpareTarget t".to_owned(),
        ];
        assert_eq!(
            in_use_message(&few),
            "deletion waits until nothing names this pool; used by Bundle default/news, HotSpareTarget t"
        );
        let many: Vec<String> = (0..5000)
            .map(|i| format!("Bundle ns-{i}/{}", "x".repeat(200)))
            .collect();
        let m = in_use_message(&many);
        assert!(m.len() <= bounded::MAX_CONDITION_MESSAGE, "{}", m.len());
        assert!(m.contains("Bundle ns-0/") && m.ends_with("more"), "{m}");
    }
}
