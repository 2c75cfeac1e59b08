//! The controllers, one per custom resource, and what they share.
//!
//! Each `reconcile` reads like the TypeScript library's prose: observe (the object, the mirror), decide with
//! pure code (placement, band policy, the restart ledger), act (Manager commands), record
//! (status with server-side apply, Events, metrics).

pub mod bundle;
pub mod consolidation;
mod context;
pub mod disruption;
pub mod drain;
pub mod events;
pub mod hotspare;
pub mod migration;
pub mod move_request;
pub mod node;
pub mod pool;
pub mod preempt;
mod provision;
pub mod rebalance;
pub mod reclaim;
pub mod sweep;
pub mod zones;

use std::sync::Arc;
use std::time::Duration;

use automanager_api as api;
use automanager_api::Bundle;
use automanager_policy::pass::NextLook;
use automanager_policy::pass_failure::FailureKind;
use automanager_policy::provision_refusals::Refusal;
use kube::{Resource, ResourceExt};
use manager_client::ClientError;

pub use crate::state::LastDecision;
pub use context::{Context, WakeReceivers, Wakers};
pub use provision::{create_node, provision_in_flight, request_node};

/// One API per watched namespace, or one over all namespaces when every namespace is watched:
/// with namespaces listed, the operator reads Bundles and Migrations in those only (its rights
/// are Roles there).
pub(crate) fn watched_apis<K>(ctx: &Context) -> Vec<kube::Api<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    match ctx.settings.scope.namespaces() {
        None => vec![kube::Api::all(ctx.client.clone())],
        Some(namespaces) => namespaces
            .iter()
            .map(|ns| kube::Api::namespaced(ctx.client.clone(), ns))
            .collect(),
    }
}

/// One Bundle API per watched namespace ([`watched_apis`]).
pub(crate) fn bundle_apis(ctx: &Context) -> Vec<kube::Api<Bundle>> {
    watched_apis(ctx)
}

/// The objects of the watched namespaces that `lp` selects, one list per namespace.
pub(crate) async fn list_watched<K>(
    ctx: &Context,
    lp: &kube::api::ListParams,
) -> Result<Vec<K>, kube::Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let mut out = Vec::new();
    for api in watched_apis::<K>(ctx) {
        out.extend(api.list(lp).await?.items);
    }
    Ok(out)
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
        let result = finalizer(&api, K::FINALIZER, obj, |event| async {
            match event {
                Finalizer::Apply(o) => o.apply(ctx.clone()).await,
                Finalizer::Cleanup(o) => o.cleanup(ctx.clone()).await,
            }
        })
        .await
        .map_err(|e| match e {
            kube::runtime::finalizer::Error::ApplyFailed(e)
            | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
            kube::runtime::finalizer::Error::AddFinalizer(e)
            | kube::runtime::finalizer::Error::RemoveFinalizer(e)
                if is_not_found(&e) =>
            {
                Error::Kube(e)
            }
            other => Error::Finalizer(other.to_string()),
        });
        match result {
            // A pass over an object that is gone meanwhile (its finalizer was removed, by an
            // earlier pass on a fresher copy): nothing is left to do, which is success.
            Err(Error::Kube(e)) if is_not_found(&e) && gone(&api, &name.1).await => {
                tracing::debug!(controller = K::CONTROLLER, name = %name.1, namespace = ?name.0, "object gone during its pass; nothing left to do");
                Ok(kube::runtime::controller::Action::await_change())
            }
            other => other,
        }
    })
    .await;
    if result.is_ok() {
        ctx.state
            .pass_succeeded(&retry_key(name.0, &name.1, std::any::type_name::<K>()));
    }
    result
}

fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(ae) if ae.code == 404)
}

/// Whether the object `name` no longer exists (a failed look says no).
async fn gone<K>(api: &kube::Api<K>, name: &str) -> bool
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    matches!(api.get_opt(name).await, Ok(None))
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
    ctx.state.pass_failed(
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
    ctx.state.pass_succeeded(&retry_key(
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
