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
use automanager_policy::pass::Verdict;
use automanager_policy::pool as policy;
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
        if !ctx.settings.scope.owns_cluster_scope() {
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
    match ctx.manager.mirror().read(|m| ctx.state.load_pool(m, spec)) {
        Ok(true) => ctx.wake_pool(&name),
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

/// One pass over a pool: observe it (load it into the placement model, ask Manager about it,
/// read its figures), decide where it stands ([`policy::verdict`]), run its consolidation, and
/// record the status. `users` non-empty means it is being deleted and they hold it.
async fn apply(
    pool: &PlacementPool,
    ctx: &Arc<Context>,
    users: &[String],
) -> Result<Action, Error> {
    let seen = look(pool, ctx).await;
    let name = pool.name_any();
    let verdict = policy::verdict(&policy::PoolFacts {
        name: &name,
        invalid: seen.loaded.as_ref().err().cloned(),
        manager: seen.manager,
        users,
        held_back: seen.provisioning.stall(),
    });
    // Consolidation (off unless the spec asks): its plan, progress and condition.
    let consolidation = if pool.metadata.deletion_timestamp.is_none() {
        Some(super::consolidation::step(pool, ctx).await?)
    } else {
        None
    };
    record(pool, ctx, users, &seen, verdict, consolidation).await
}

/// What a pool's pass observed.
struct Seen {
    /// Whether the placement model took the pool (and whether it changed), or why not.
    loaded: Result<bool, String>,
    manager: policy::ManagerView,
    provisioning: ProvisioningStanding,
    usage: Option<automanager_placement::PoolUsage>,
    /// The HotSpareTargets' total target in the pool (`None`: they could not be listed).
    spare_target: Option<i64>,
    /// What the zone brake says of each zone that gets no new node now.
    degraded: Vec<String>,
}

/// Loads the pool into the placement model and reads what its status says: Manager's view of
/// it, what holds back new nodes, its figures and its degraded zones.
async fn look(pool: &PlacementPool, ctx: &Context) -> Seen {
    let name = pool.name_any();
    // A value the engine does not take (the start latency) is checked here, alike.
    let loaded = match pool.spec.validate() {
        Ok(()) => (ctx.manager.mirror())
            .read(|m| ctx.state.load_pool(m, engine_pool(pool)))
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    let manager = match &loaded {
        Ok(_) if ctx.manager_ready() => managers_view(pool, ctx).await,
        _ => policy::ManagerView::NotAsked,
    };
    let provisioning = provisioning_standing(ctx, pool);
    if let Ok(true) = loaded {
        // Bundles waiting for this pool may now place. Only on a change: the pool itself is
        // woken too, and an unconditional wake would loop.
        ctx.wake_pool(&name);
    }
    let usage = ctx.state.pool_usage(&name);
    let window = ctx.settings.zone_brake.map(|b| b.window);
    let degraded = (ctx.state.degraded_zones(&name).iter())
        .map(|d| super::zones::degraded_message(d, window))
        .collect();
    Seen {
        loaded,
        manager,
        provisioning,
        usage,
        spare_target: spare_target(pool, ctx).await,
        degraded,
    }
}

/// What Manager says of the pool; a change in what it offers wakes the pool's users.
async fn managers_view(pool: &PlacementPool, ctx: &Context) -> policy::ManagerView {
    let name = pool.name_any();
    let pools = match ctx.manager.list_pools().await {
        Ok(pools) => pools,
        Err(e) => {
            tracing::debug!(pool = %name, error = %e, "could not list Manager's pools");
            return policy::ManagerView::NotAsked;
        }
    };
    match pools.iter().find(|p| p.name == name) {
        None => policy::ManagerView::Unknown,
        Some(p) if mapping::api_provider(p.kind).is_some_and(|k| k != pool.spec.kind) => {
            policy::ManagerView::KindMismatch
        }
        Some(p) => {
            if manager_offer_changed(ctx, p) {
                ctx.wake_pool(&name);
            }
            policy::ManagerView::Known
        }
    }
}

/// The pool's HotSpareTargets' total target. The list is complete: the spare-underflow series
/// of targets gone are dropped on the way.
async fn spare_target(pool: &PlacementPool, ctx: &Context) -> Option<i64> {
    let targets: Api<HotSpareTarget> = Api::all(ctx.client.clone());
    let list = match targets.list(&ListParams::default()).await {
        Ok(list) => list,
        Err(e) => {
            tracing::debug!(error = %e, "could not list HotSpareTargets");
            return None;
        }
    };
    let existing: Vec<(String, String)> = list
        .items
        .iter()
        .map(|t| (t.name_any(), t.spec.pool.clone()))
        .collect();
    ctx.metrics.retain_spare_targets(&existing);
    let name = pool.name_any();
    Some(
        list.items
            .iter()
            .filter(|t| t.spec.pool == name)
            .map(|t| i64::from(t.spec.target_count))
            .sum(),
    )
}

/// Writes the pool's status from what it observed, its verdict and its consolidation, with the
/// metrics and the Warning Events of troubles new since the last status.
async fn record(
    pool: &PlacementPool,
    ctx: &Context,
    users: &[String],
    seen: &Seen,
    verdict: Verdict,
    consolidation: Option<super::consolidation::Pass>,
) -> Result<Action, Error> {
    let name = pool.name_any();
    let prev = pool.status.clone().unwrap_or_default();
    let mut status = status(pool, ctx, &prev, seen, verdict);
    let mut requeue = REFRESH;
    if let Some(pass) = consolidation {
        status.consolidation = pass.status;
        api::set_condition(&mut status.conditions, pass.condition);
        requeue = pass.requeue.map_or(requeue, |r| requeue.min(r));
    }
    // The most nodes the pool may hold: a fixed pool adds none to what it has.
    let max_nodes = match pool.spec.scale_out {
        api::ScaleOut::Fixed => Some(status.node_count),
        api::ScaleOut::Elastic => pool.spec.max_nodes.map(i64::from),
    };
    ctx.metrics.set_pool(
        &name,
        status.node_count,
        max_nodes,
        status.used_capacity_fraction,
    );
    if status != prev {
        let api = Api::<PlacementPool>::all(ctx.client.clone());
        super::apply_status(&api, &name, &status).await?;
    }
    seen.provisioning
        .announce(pool, ctx, &prev.conditions)
        .await;
    let in_use = |conditions: &[api::condition::Condition]| {
        conditions
            .iter()
            .find(|c| c.type_ == "Stalled" && c.reason == "InUse")
            .map(|c| c.message.clone())
    };
    if !users.is_empty() && in_use(&prev.conditions) != in_use(&status.conditions) {
        let note = bounded::clip(&policy::in_use_message(users), 1024).into_owned();
        ctx.event(pool, EventType::Warning, "DeletionBlocked", "Delete", note)
            .await;
    }
    Ok(Action::requeue(requeue))
}

/// The pool's status: its figures, its standing, `ZoneDegraded`, and what holds back new
/// nodes (`ProvisioningRefused`, `AtMaxNodes`); consolidation's part carries over.
fn status(
    pool: &PlacementPool,
    ctx: &Context,
    prev: &PlacementPoolStatus,
    seen: &Seen,
    verdict: Verdict,
) -> PlacementPoolStatus {
    let (generation, now) = (pool.metadata.generation, ctx.clock.now());
    let usage = seen.usage.as_ref();
    let mut status = PlacementPoolStatus {
        observed_generation: generation,
        node_count: usage.map_or(0, |u| i64::from(u.node_count)),
        live_spares: usage.map_or(0, |u| i64::from(u.live_spares)),
        spare_target: seen.spare_target.unwrap_or(prev.spare_target),
        used_capacity_fraction: usage.map_or(0.0, |u| {
            (u.used_capacity_fraction * 1000.0).round() / 1000.0
        }),
        consolidation: prev.consolidation.clone(),
        conditions: prev.conditions.clone(),
    };
    let Verdict {
        standing,
        reason,
        message,
    } = verdict;
    api::set_standing(
        &mut status.conditions,
        standing,
        reason,
        message,
        generation,
        now,
    );
    let (on, reason, message) = policy::zone_degraded(&seen.degraded);
    let c = super::condition("ZoneDegraded", on, reason, message, generation, now);
    api::set_condition(&mut status.conditions, c);
    for c in seen.provisioning.conditions(generation, now) {
        api::set_condition(&mut status.conditions, c);
    }
    status
}

/// Tells the refusals what Manager offers for the pool now; `true` when refusals were dropped
/// because that changed (the bundles waiting on the pool may ask again).
fn manager_offer_changed(ctx: &Context, pool: &manager_client::proto::Pool) -> bool {
    let offered = pool
        .instance_types
        .iter()
        .map(|t| t.instance_type.clone())
        .collect();
    ctx.state.manager_offers(&pool.name, offered)
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
    let nodes = ctx.state.pool_usage(&name).map_or(0, |u| u.node_count);
    let max_nodes = pool.spec.max_nodes.map(|m| u32::try_from(m).unwrap_or(0));
    ProvisioningStanding {
        refusals: ctx.state.refusals_of(&name, &epoch),
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
    for p in ctx.state.prune_pools(existing) {
        ctx.metrics.remove_pool(&p);
    }
}
