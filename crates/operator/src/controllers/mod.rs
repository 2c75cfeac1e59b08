//! The controllers, one per custom resource, and what they share.
//!
//! Each `reconcile` reads like the TypeScript library's prose: observe (the object, the mirror), decide with
//! pure code (placement, band policy, the restart ledger), act (Manager commands), record
//! (status with server-side apply, Events, metrics).

pub mod bundle;
pub mod consolidation;
pub mod disruption;
pub mod drain;
pub mod events;
pub mod hotspare;
pub mod migration;
pub mod node;
pub mod pool;
pub mod preempt;
pub mod rebalance;
pub mod reclaim;
pub mod sweep;
pub mod zones;

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use automanager_api as api;
use automanager_policy::pass::NextLook;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use manager_client::{ClientError, ManagerClient};
use manager_proto as proto;

use automanager_policy::pass_failure::FailureKind;
use automanager_policy::provision_refusals::{Hold, Refusal};

use crate::clock::SharedClock;
use crate::mapping;
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::state::{EngineSnapshot, OperatorState};
use automanager_api::{Bundle, HotSpareTarget, Migration, PlacementPool};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{broadcast, mpsc};

pub use crate::state::LastDecision;

/// One Bundle API per watched namespace, or one over all namespaces when every namespace is
/// watched.
pub(crate) fn bundle_apis(ctx: &Context) -> Vec<kube::Api<Bundle>> {
    if ctx.settings.watch_namespaces.is_empty() {
        vec![kube::Api::all(ctx.client.clone())]
    } else {
        ctx.settings
            .watch_namespaces
            .iter()
            .map(|ns| kube::Api::namespaced(ctx.client.clone(), ns))
            .collect()
    }
}

/// Why a reconcile failed. Variant names show up in logs and in the reconcile metric's label.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("Manager: {0}")]
    Manager(#[from] manager_client::ClientError),
    #[error("Manager is unreachable ({0}); will retry")]
    ManagerUnavailable(String),
    #[error("finalizer: {0}")]
    Finalizer(String),
    #[error("object has no namespace")]
    NoNamespace,
    #[error("provisioning paused: {0}")]
    ProvisioningPaused(String),
    /// Manager refused a node for good; it is not asked for again until the pool's spec or
    /// Manager changes ([`automanager_policy::provision_refusals`]).
    #[error("{}", .0.describe())]
    ProvisioningRefused(Refusal),
    /// A node ask failed, or the last one did and its back-off has not passed.
    #[error("no node yet ({message}); asked again in {}s", .retry_in.as_secs().max(1))]
    ProvisioningRetry { message: String, retry_in: Duration },
}

/// Whether one of `pools`, which the placement model does not know, has a PlacementPool
/// object: the operator is starting and its PlacementPool controller has not loaded it yet, so
/// whoever needs it waits rather than calling the pool missing.
pub(crate) async fn pool_not_loaded_yet(ctx: &Context, pools: &[String]) -> Result<bool, Error> {
    let api: kube::Api<api::PlacementPool> = kube::Api::all(ctx.client.clone());
    for pool in pools {
        if api.get_opt(pool).await?.is_some() {
            return Ok(true);
        }
    }
    Ok(false)
}

impl Error {
    /// A short stable name for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(_) => "kube",
            Error::Manager(_) => "manager",
            Error::ManagerUnavailable(_) => "managerUnavailable",
            Error::Finalizer(_) => "finalizer",
            Error::NoNamespace => "noNamespace",
            Error::ProvisioningPaused(_) => "provisioningPaused",
            Error::ProvisioningRefused(_) => "provisioningRefused",
            Error::ProvisioningRetry { .. } => "provisioningRetry",
        }
    }

    /// Why the pass failed, as the retry and the object's conditions care.
    pub fn failure_kind(&self) -> FailureKind {
        match self {
            e if is_conflict(e) => FailureKind::Conflict,
            Error::ManagerUnavailable(_) => FailureKind::Unavailable,
            Error::Manager(e) if e.is_retryable() || matches!(e, ClientError::Closed) => {
                FailureKind::Unavailable
            }
            Error::Manager(e) if is_final_answer(e) => FailureKind::Refused,
            Error::ProvisioningRefused(_) => FailureKind::Refused,
            _ => FailureKind::Other,
        }
    }
}

/// Where the mirror pump and the controllers send "look at this object again".
#[derive(Clone)]
pub struct Wakers {
    /// A Bundle to look at again once a burst of changes has settled: its jobs' echoes, a
    /// drain or a Migration that moved it. The runtime debounces these ([`crate::runtime`]).
    pub bundles: mpsc::UnboundedSender<ObjectRef<Bundle>>,
    /// A Bundle with a recovery to make, or whose awaited capacity came: passed on at once,
    /// since every millisecond here is a viewer's gap.
    pub bundles_now: mpsc::UnboundedSender<ObjectRef<Bundle>>,
    pub pools: mpsc::UnboundedSender<ObjectRef<PlacementPool>>,
    pub spare_targets: mpsc::UnboundedSender<ObjectRef<HotSpareTarget>>,
    pub migrations: mpsc::UnboundedSender<ObjectRef<Migration>>,
    /// The ManagerNode status sync.
    pub node_sync: mpsc::Sender<()>,
    /// Every object of every kind (after a resync, when the change stream lagged).
    pub everything: broadcast::Sender<()>,
}

impl Wakers {
    /// Wakes Bundle `b` on its lane: `at_once` for a recovery or the capacity it waits on
    /// ([`Self::bundles_now`]), otherwise once its burst settles ([`Self::bundles`]).
    pub fn bundle(&self, b: ObjectRef<Bundle>, at_once: bool) {
        let lane = if at_once {
            &self.bundles_now
        } else {
            &self.bundles
        };
        let _ = lane.send(b);
    }
}

/// The receiving ends of [`Wakers`], taken once by the runtime.
pub struct WakeReceivers {
    pub bundles: mpsc::UnboundedReceiver<ObjectRef<Bundle>>,
    pub bundles_now: mpsc::UnboundedReceiver<ObjectRef<Bundle>>,
    pub pools: mpsc::UnboundedReceiver<ObjectRef<PlacementPool>>,
    pub spare_targets: mpsc::UnboundedReceiver<ObjectRef<HotSpareTarget>>,
    pub migrations: mpsc::UnboundedReceiver<ObjectRef<Migration>>,
    pub node_sync: mpsc::Receiver<()>,
}

fn wake_channels() -> (Wakers, WakeReceivers) {
    let (bundles, bundles_rx) = mpsc::unbounded_channel();
    let (bundles_now, bundles_now_rx) = mpsc::unbounded_channel();
    let (pools, pools_rx) = mpsc::unbounded_channel();
    let (spare_targets, spare_targets_rx) = mpsc::unbounded_channel();
    let (migrations, migrations_rx) = mpsc::unbounded_channel();
    let (node_sync, node_sync_rx) = mpsc::channel(1);
    let (everything, _) = broadcast::channel(16);
    (
        Wakers {
            bundles,
            bundles_now,
            pools,
            spare_targets,
            migrations,
            node_sync,
            everything,
        },
        WakeReceivers {
            bundles: bundles_rx,
            bundles_now: bundles_now_rx,
            pools: pools_rx,
            spare_targets: spare_targets_rx,
            migrations: migrations_rx,
            node_sync: node_sync_rx,
        },
    )
}

/// Everything the controllers share: clients, settings, metrics, the one state owner
/// ([`crate::state`]), the engine snapshot readers use, and the wakers.
pub struct Context {
    pub client: Client,
    pub manager: ManagerClient,
    pub settings: Settings,
    pub metrics: Metrics,
    /// Where every reconcile reads the time ([`crate::clock`]).
    pub clock: SharedClock,
    /// Events go through this queue, off the reconcile path ([`events`]).
    pub events: events::EventQueue,
    state: Mutex<OperatorState>,
    pub snapshot: EngineSnapshot,
    pub wake: Wakers,
    receivers: Mutex<Option<WakeReceivers>>,
}

impl Context {
    pub fn new(
        client: Client,
        manager: ManagerClient,
        settings: Settings,
        metrics: Metrics,
        clock: SharedClock,
        identity: &str,
    ) -> Arc<Self> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "automanager-operator".into(),
                instance: Some(identity.to_owned()),
            },
        );
        let (wake, receivers) = wake_channels();
        let state = OperatorState::new(&settings);
        Arc::new(Context {
            client,
            manager,
            state: Mutex::new(state),
            snapshot: EngineSnapshot::default(),
            settings,
            metrics,
            clock,
            events: events::EventQueue::new(recorder),
            wake,
            receivers: Mutex::new(Some(receivers)),
        })
    }

    /// The one state owner's lock ([`crate::state`]: never held across an `.await`, and taken
    /// after the mirror's lock when both are needed). Poison-tolerant: a panic elsewhere must
    /// not wedge the operator.
    pub fn state(&self) -> MutexGuard<'_, OperatorState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `f` with the mirror read-locked and the state locked, in that order.
    pub fn with_mirror<R>(
        &self,
        f: impl FnOnce(&manager_client::MirrorState, &mut OperatorState) -> R,
    ) -> R {
        self.manager.mirror().read(|m| f(m, &mut self.state()))
    }

    /// The wake receivers, once (the runtime takes them when controllers start).
    pub fn take_receivers(&self) -> Option<WakeReceivers> {
        self.receivers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Capacity came or went in `pool`: wakes the bundles waiting on it, its HotSpareTargets and
    /// its PlacementPool (its figures).
    pub fn wake_pool(&self, pool: &str) {
        let state = self.state();
        for b in state.wake().waiting_on(pool) {
            self.wake.bundle(b.clone(), true);
        }
        for t in state.wake().spare_targets_of(pool) {
            let _ = self.wake.spare_targets.send(t.clone());
        }
        let _ = self.wake.pools.send(ObjectRef::new(pool));
    }

    /// Wakes the PlacementPool controller for `pool` only (a user of the pool went away, or its
    /// used capacity moved).
    pub fn wake_pool_controller(&self, pool: &str) {
        let _ = self.wake.pools.send(ObjectRef::new(pool));
    }

    /// How many Bundle passes run at a time (`concurrency.bundles`).
    pub fn bundle_slots(&self) -> usize {
        usize::from(self.settings.bundle_concurrency)
    }

    /// Records whether a bundle is Broken and updates the gauges.
    pub fn set_broken(&self, bundle_id: &str, broken: bool) {
        let count = self.state().bundles_mut().set_broken(bundle_id, broken);
        if let Some(count) = count {
            self.metrics
                .set_broken_bundles(i64::try_from(count).unwrap_or(i64::MAX));
            if let Some(id) = mapping::BundleId::parse(bundle_id) {
                let (ns, name) = id.object();
                self.metrics.set_bundle_broken(ns, name, broken);
            }
        }
    }

    /// Whether the mirror is synced with Manager.
    pub fn manager_ready(&self) -> bool {
        self.manager.connection_state() == manager_client::ConnectionState::Ready
    }

    pub fn manager_unavailable(&self) -> Error {
        let state = self.manager.connection_state().as_str();
        let detail = self
            .manager
            .last_error()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        Error::ManagerUnavailable(format!("connection {state}{detail}"))
    }

    /// Queues an Event about `obj` ([`events`]: published in order, off the reconcile path);
    /// failures are logged, never fatal.
    pub async fn event<K>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) where
        K: Resource<DynamicType = ()>,
    {
        self.event_on(&obj.object_ref(&()), type_, reason, action, note)
            .await;
    }

    /// An Event about `reference`, which may name an object that no longer exists (the orphan
    /// sweep reports on owners that are gone).
    pub async fn event_on(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        self.events.publish(ev, reference.clone()).await;
    }
}

/// A kind reconciled inside its cleanup finalizer, as kube's `finalizer()` runs it. Its
/// controller's entry is [`reconcile_finalized`], which calls the kind's [`Finalized::apply`]
/// or [`Finalized::cleanup`] once: the pass moves inward and does not come back through here.
pub trait Finalized:
    Resource<DynamicType = ()>
    + Clone
    + serde::de::DeserializeOwned
    + serde::Serialize
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
    /// The controller's name in `automanager_reconcile_duration_seconds`.
    const CONTROLLER: &'static str;
    /// The finalizer the kind's objects carry.
    const FINALIZER: &'static str;

    /// Whether this operator reconciles the kind at all (a cluster-scoped kind is reconciled
    /// only by the operator that owns the cluster scope).
    fn reconciled_here(_ctx: &Context) -> bool {
        true
    }

    /// Where the finalizer is added and removed.
    fn api(&self, ctx: &Context) -> Result<kube::Api<Self>, Error>;

    /// The pass over a live object.
    fn apply(
        self: Arc<Self>,
        ctx: Arc<Context>,
    ) -> impl std::future::Future<Output = Result<kube::runtime::controller::Action, Error>> + Send;

    /// The pass over an object being deleted; the finalizer goes once it succeeds.
    fn cleanup(
        self: Arc<Self>,
        ctx: Arc<Context>,
    ) -> impl std::future::Future<Output = Result<kube::runtime::controller::Action, Error>> + Send;
}

/// The entry of every finalized controller: the kind's cleanup finalizer, the
/// `automanager_reconcile_duration_seconds{controller, result}` metric and the error mapping,
/// in one place, around the kind's own pass.
pub async fn reconcile_finalized<K: Finalized>(
    obj: Arc<K>,
    ctx: Arc<Context>,
) -> Result<kube::runtime::controller::Action, Error> {
    use kube::runtime::finalizer::{Event as Finalizer, finalizer};
    if !K::reconciled_here(&ctx) {
        return Ok(kube::runtime::controller::Action::await_change());
    }
    let api = obj.api(&ctx)?;
    let name = (obj.namespace(), obj.name_any());
    let result = timed(K::CONTROLLER, &ctx, async {
        finalizer(&api, K::FINALIZER, obj, |event| async {
            match event {
                Finalizer::Apply(o) => o.apply(ctx.clone()).await,
                Finalizer::Cleanup(o) => o.cleanup(ctx.clone()).await,
            }
        })
        .await
        .map_err(|e| match e {
            kube::runtime::finalizer::Error::ApplyFailed(e)
            | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
            other => Error::Finalizer(other.to_string()),
        })
    })
    .await;
    if result.is_ok() {
        ctx.state().retries_mut().succeeded(&retry_key(
            name.0,
            &name.1,
            std::any::type_name::<K>(),
        ));
    }
    result
}

/// Runs one reconcile and records its duration and result under `controller`.
pub async fn timed<T>(
    controller: &'static str,
    ctx: &Context,
    work: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    let started = ctx.clock.instant();
    let result = work.await;
    ctx.metrics
        .observe_reconcile(controller, result.is_ok(), started.elapsed().as_secs_f64());
    result
}

/// The error policy every controller shares: log with the object and the error's kind, and
/// retry after a delay suited to the error that grows while the object's passes keep failing
/// ([`automanager_policy::pass_failure`]).
pub fn error_policy<K: ResourceExt>(
    obj: Arc<K>,
    error: &Error,
    ctx: Arc<Context>,
) -> kube::runtime::controller::Action {
    let kind = std::any::type_name::<K>()
        .rsplit("::")
        .next()
        .unwrap_or_default();
    let delay = retry_delay(&ctx, obj.as_ref(), error);
    if is_conflict(error) {
        // Optimistic concurrency at work: the object changed under the pass; it looks again.
        tracing::debug!(kind, name = %obj.name_any(), namespace = ?obj.namespace(), error = %error, "object changed during reconcile; retrying");
    } else {
        tracing::warn!(
            kind,
            name = %obj.name_any(),
            namespace = ?obj.namespace(),
            error = %error,
            error_kind = error.metric_label(),
            retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            "reconcile failed"
        );
    }
    kube::runtime::controller::Action::requeue(delay)
}

/// How long until a pass over `obj` that failed with `error` is tried again: its kind's
/// back-off, grown by the object's failures in a row.
pub fn retry_delay<K: ResourceExt>(ctx: &Context, obj: &K, error: &Error) -> Duration {
    ctx.state().retries_mut().failed(
        &retry_key(obj.namespace(), &obj.name_any(), std::any::type_name::<K>()),
        error.failure_kind(),
        ctx.clock.instant(),
    )
}

/// The key of an object's failed passes: its kind, namespace and name.
fn retry_key(namespace: Option<String>, name: &str, type_name: &str) -> String {
    let kind = type_name.rsplit("::").next().unwrap_or_default();
    format!("{kind}/{}/{name}", namespace.unwrap_or_default())
}

/// A pass over `obj` succeeded: a later failure starts its back-off afresh.
pub fn pass_succeeded<K: ResourceExt>(ctx: &Context, obj: &K) {
    ctx.state().retries_mut().succeeded(&retry_key(
        obj.namespace(),
        &obj.name_any(),
        std::any::type_name::<K>(),
    ));
}

/// The requeue action for a pass's [`NextLook`].
pub fn next_action(next: NextLook) -> kube::runtime::controller::Action {
    match next {
        NextLook::OnChange => kube::runtime::controller::Action::await_change(),
        NextLook::After(after) => kube::runtime::controller::Action::requeue(after),
    }
}

/// The namespace and name of a namespaced object.
pub fn ns_name<K: ResourceExt>(obj: &K) -> Result<(String, String), Error> {
    Ok((obj.namespace().ok_or(Error::NoNamespace)?, obj.name_any()))
}

/// Milliseconds since the epoch, the clock the engine and Manager share.
pub fn now_ms(now: chrono::DateTime<chrono::Utc>) -> u64 {
    u64::try_from(now.timestamp_millis()).unwrap_or(0)
}

/// A condition with the object's generation.
pub fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    generation: Option<i64>,
    now: chrono::DateTime<chrono::Utc>,
) -> api::Condition {
    let s = if status {
        api::ConditionStatus::True
    } else {
        api::ConditionStatus::False
    };
    api::Condition::new(type_, s, reason, message, generation, now)
}

/// Writes `status` of the object `name` by server-side apply under the operator's field manager.
/// For status that is derived again from what is observed each pass (nodes, pools, spare targets).
pub async fn apply_status<K>(
    api: &kube::Api<K>,
    name: &str,
    status: &impl serde::Serialize,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    apply_status_if(api, name, None, status).await
}

/// Writes `status` as [`apply_status`] does, but only while the object is still at
/// `resource_version`, the version the pass decided from. For status that carries state no other
/// place keeps (a bundle's restart history, a migration's phase): a writer whose view is stale (a
/// deposed leader, a pass that raced the operator's own previous write) gets 409 Conflict and
/// looks again, instead of overwriting newer state with older.
pub async fn apply_status_if<K>(
    api: &kube::Api<K>,
    name: &str,
    resource_version: Option<&str>,
    status: &impl serde::Serialize,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    if let Some(rv) = resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    let params = kube::api::PatchParams::apply(api::FIELD_MANAGER).force();
    api.patch_status(name, &params, &kube::api::Patch::Apply(&patch))
        .await?;
    Ok(())
}

/// Whether `error` is the apiserver's 409 Conflict: the object changed since it was read.
pub fn is_conflict(error: &Error) -> bool {
    matches!(error, Error::Kube(kube::Error::Api(s)) if s.code == 409)
}

/// Asks Manager for a node of `instance_type` in `pool` (zone optional) for whatever `tag` names,
/// unless one asked for it is still on its way ([`provision_in_flight`]), and tells the engine a
/// node is coming. `None` when nothing was asked (one is on its way, the pool is not loaded, or
/// the pool's provisioning rate is used up for this minute).
pub async fn request_node(
    ctx: &Context,
    pool: &str,
    instance_type: &str,
    zone: Option<&str>,
    tag: String,
) -> Result<Option<proto::Node>, Error> {
    // One look at the mirror and the state: nothing can change between the checks and the
    // rate this ask takes.
    let (now, wall) = (ctx.clock.instant(), ctx.clock.now());
    let spec = ctx.with_mirror(|m, state| {
        if provision_in_flight(m, &tag) {
            return Ok(None);
        }
        let Some(spec) = state.model().pool(pool).cloned() else {
            return Ok(None);
        };
        // A refused or backed-off ask takes nothing of the pool's rate.
        if let Some(held) = provision_held(state, &m.epoch, now, &tag, pool, instance_type) {
            return Err(held);
        }
        if let Some(z) = zone
            && state.provisioning().zone_brake().is_degraded(pool, z)
        {
            tracing::info!(pool, zone = z, tag = %tag, "zone degraded: not provisioning into it");
            return Ok(None);
        }
        if !state.provisioning_mut().take_request(pool, wall) {
            tracing::info!(pool, tag = %tag, "provisioning rate for the pool is used up this minute; asking later");
            return Ok(None);
        }
        Ok(Some(spec))
    })?;
    let Some(spec) = spec else {
        return Ok(None);
    };
    let req = proto::CreateNodeRequest {
        pool: pool.to_owned(),
        provider: mapping::provider_of(spec.kind) as i32,
        region: spec.region.clone(),
        instance_type: instance_type.to_owned(),
        zone: zone.unwrap_or_default().to_owned(),
        tags: [(mapping::PROVISIONED_FOR_TAG.to_owned(), tag.clone())]
            .into_iter()
            .collect(),
        request_id: String::new(),
    };
    let node = create_node(ctx, &tag, req).await?;
    ctx.state().model_mut().add_provisioned(&node);
    Ok(Some(node))
}

/// CreateNode for `intent` (a replica's tag, a spare target) with an idempotency key: an ask
/// whose answer was lost is repeated with its key, so Manager answers with the node it made
/// rather than making a second (see `automanager_policy::provision_keys`).
pub async fn create_node(
    ctx: &Context,
    intent: &str,
    mut req: proto::CreateNodeRequest,
) -> Result<proto::Node, Error> {
    let now = ctx.clock.instant();
    let key = ctx.with_mirror(|m, state| {
        // A pool being deleted gets no new node, for a replica or a spare.
        if state.model().pool(&req.pool).is_some_and(|p| p.terminating) {
            return Err(Error::ProvisioningPaused(format!(
                "PlacementPool {} is being deleted: no new node is made in it",
                req.pool
            )));
        }
        if let Some(held) =
            provision_held(state, &m.epoch, now, intent, &req.pool, &req.instance_type)
        {
            return Err(held);
        }
        req.zone = zones::provision_zone(m, state, &req.pool, &req.zone)
            .map_err(Error::ProvisioningPaused)?;
        Ok(state.provisioning_mut().request_key(
            intent,
            |key| m.nodes.values().any(|n| n.request_id == key),
            now,
            || format!("automanager-{:032x}", rand::random::<u128>()),
        ))
    })?;
    req.request_id.clone_from(&key);
    let (pool, instance_type) = (req.pool.clone(), req.instance_type.clone());
    match ctx.manager.create_node(req).await {
        Ok(node) => {
            ctx.state().provisioning_mut().ask_answered(intent);
            Ok(node)
        }
        Err(e) => {
            if let Some(code) = refused_for_good(&e) {
                let refusal = Refusal {
                    pool: pool.clone(),
                    instance_type,
                    code: code.to_owned(),
                    message: refusal_message(&e),
                };
                tracing::warn!(intent, pool = %pool, instance_type = %refusal.instance_type, error = %e, "Manager refused CreateNode; not asking again until the pool or Manager changes");
                let epoch = ctx.manager.mirror().read(|m| m.epoch.clone());
                ctx.state()
                    .provisioning_mut()
                    .refused(refusal.clone(), &epoch);
                // The pool's status says so too.
                ctx.wake_pool_controller(&pool);
                return Err(Error::ProvisioningRefused(refusal));
            }
            if outcome_unknown(&e) {
                tracing::info!(intent, request_id = %key, error = %e, "CreateNode got no answer; the next ask repeats its key");
                ctx.state().provisioning_mut().unanswered(intent, key, now);
            }
            if matches!(e, ClientError::Fenced(_) | ClientError::Closed) {
                // Not Manager's answer: this operator may not write now.
                return Err(e.into());
            }
            let message = e.to_string();
            let retry_in = ctx
                .state()
                .provisioning_mut()
                .ask_failed(intent, message.clone(), now);
            tracing::info!(intent, pool = %pool, error = %e, retry_in_ms = u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX), "CreateNode failed; asking again after a back-off");
            Err(Error::ProvisioningRetry { message, retry_in })
        }
    }
}

/// Why `intent` may not ask for a node of `instance_type` in `pool` now, as the error its
/// caller reports: a refusal that stands (for Manager's `epoch`), or the back-off of its last
/// failed ask.
fn provision_held(
    state: &mut OperatorState,
    epoch: &str,
    now: std::time::Instant,
    intent: &str,
    pool: &str,
    instance_type: &str,
) -> Option<Error> {
    let hold = state
        .provisioning_mut()
        .hold(intent, pool, instance_type, epoch, now)?;
    Some(match hold {
        Hold::Refused(r) => Error::ProvisioningRefused(r),
        Hold::BackingOff {
            remaining, message, ..
        } => Error::ProvisioningRetry {
            message,
            retry_in: remaining,
        },
    })
}

/// Manager's answers to CreateNode that no retry changes, as the code's CamelCase word: the
/// request is wrong for this pool (an instance type or zone it does not offer, a fixed pool, an
/// unknown pool).
fn refused_for_good(e: &ClientError) -> Option<&'static str> {
    match e {
        ClientError::InvalidArgument(_) => Some("InvalidArgument"),
        ClientError::FailedPrecondition(_) => Some("FailedPrecondition"),
        ClientError::NotFound(_) => Some("NotFound"),
        _ => None,
    }
}

/// Manager's own words of a refusal, without the client's prefix.
fn refusal_message(e: &ClientError) -> String {
    match e {
        ClientError::InvalidArgument(m)
        | ClientError::FailedPrecondition(m)
        | ClientError::NotFound(m) => m.clone(),
        other => other.to_string(),
    }
}

/// Whether Manager may have carried out a call that failed: it was not refused, only not
/// answered. (Keeping a key that did make nothing costs nothing: its repeat makes the node.)
fn outcome_unknown(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Timeout(_) | ClientError::Unavailable(_) | ClientError::Rpc { .. }
    )
}

/// Whether a node asked for the replica (or migration target) tagged `tag` is still on its way to it: starting, or
/// started and still empty (the engine may not have seen it yet). A started node that another
/// bundle's job took in the meantime is not: the replica must ask again, or it would wait forever.
pub fn provision_in_flight(m: &manager_client::MirrorState, tag: &str) -> bool {
    m.nodes.values().any(|n| {
        if n.tags.get(mapping::PROVISIONED_FOR_TAG).map(String::as_str) != Some(tag) {
            return false;
        }
        match proto::NodeState::try_from(n.state) {
            Ok(proto::NodeState::Starting) => true,
            Ok(proto::NodeState::Started) => !m.jobs.values().any(|j| {
                j.instances.iter().any(|i| {
                    i.node_id == n.node_id
                        && matches!(
                            proto::JobState::try_from(i.state),
                            Ok(proto::JobState::Starting
                                | proto::JobState::Running
                                | proto::JobState::Stopping)
                        )
                })
            }),
            _ => false,
        }
    })
}

/// Errors Manager answers that no retry will change: they end the step, not the reconcile.
pub fn is_final_answer(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::InvalidArgument(_)
            | ClientError::NotFound(_)
            | ClientError::FailedPrecondition(_)
            | ClientError::AlreadyExists(_)
            | ClientError::Rejected { .. }
    )
}
