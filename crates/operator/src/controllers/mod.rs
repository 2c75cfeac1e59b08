//! The controllers, one per custom resource, and what they share.
//!
//! Each `reconcile` reads like the seed's prose: observe (the object, the mirror), decide with
//! pure code (placement, band policy, the restart ledger), act (Manager commands), record
//! (status with server-side apply, Events, metrics).

pub mod bundle;
pub mod drain;
pub mod hotspare;
pub mod migration;
pub mod node;
pub mod pool;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use automanager_api as api;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource, ResourceExt};
use manager_client::{ClientError, ManagerClient};
use manager_proto as proto;

use crate::mapping;
use crate::metrics::Metrics;
use crate::model::ClusterModel;
use crate::settings::Settings;
use automanager_policy::ledger::RestartLedger;
use automanager_policy::node_health::NodeHealth;

/// The last placement decision for one replica of a bundle: the full trace for
/// `/debug/trace`, and what status summarises (also when the status write was coalesced).
#[derive(Debug, Clone)]
pub struct LastDecision {
    pub decision: automanager_placement::Decision,
    pub recovery: bool,
    pub at: chrono::DateTime<chrono::Utc>,
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
        }
    }
}

/// Everything the controllers share.
pub struct Context {
    pub client: Client,
    pub manager: ManagerClient,
    pub settings: Settings,
    pub metrics: Metrics,
    pub recorder: Recorder,
    pub model: Mutex<ClusterModel>,
    pub ledger: Mutex<RestartLedger>,
    pub health: Mutex<NodeHealth>,
    /// The full placement trace of each bundle's last decision per replica, for `/debug/trace`.
    pub traces: Mutex<HashMap<(String, String), BTreeMap<u32, LastDecision>>>,
    /// Job ids of bronze jobs dropped after a failure (they stay down until a retry or a spec change).
    pub dropped: Mutex<HashMap<String, chrono::DateTime<chrono::Utc>>>,
    /// Job ids handed to their band's recovery by a failed migration or a drain's fallback: a
    /// stop of such a job counts as a failure (gold and silver restart, bronze is dropped).
    pub handed_to_recovery: Mutex<HashMap<String, chrono::DateTime<chrono::Utc>>>,
    /// Node requests per pool in the last minute: the provisioning brake.
    pub provision_budget: Mutex<automanager_policy::provision_budget::ProvisionBudget>,
    /// Bundles currently Broken, for the `automanager_broken_bundles` gauge.
    pub broken: Mutex<std::collections::HashSet<String>>,
    /// Asks the Bundle controller to look at every bundle (a pool or node changed).
    pub bundle_trigger: tokio::sync::broadcast::Sender<()>,
}

impl Context {
    pub fn new(
        client: Client,
        manager: ManagerClient,
        settings: Settings,
        metrics: Metrics,
        identity: &str,
    ) -> Arc<Self> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "automanager-operator".into(),
                instance: Some(identity.to_owned()),
            },
        );
        let (bundle_trigger, _) = tokio::sync::broadcast::channel(64);
        Arc::new(Context {
            client,
            manager,
            model: Mutex::new(ClusterModel::new(settings.pending_window.as_millis() as u64)),
            ledger: Mutex::new(RestartLedger::default()),
            health: Mutex::new(NodeHealth::new(
                settings.rejection_threshold,
                settings.rejection_window,
            )),
            settings,
            metrics,
            recorder,
            traces: Mutex::new(HashMap::new()),
            dropped: Mutex::new(HashMap::new()),
            handed_to_recovery: Mutex::new(HashMap::new()),
            provision_budget: Mutex::new(Default::default()),
            broken: Mutex::new(std::collections::HashSet::new()),
            bundle_trigger,
        })
    }

    /// Poison-tolerant locks: a panic elsewhere must not wedge the operator.
    pub fn model(&self) -> MutexGuard<'_, ClusterModel> {
        self.model.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn provision_budget(
        &self,
    ) -> MutexGuard<'_, automanager_policy::provision_budget::ProvisionBudget> {
        self.provision_budget
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }
    pub fn ledger(&self) -> MutexGuard<'_, RestartLedger> {
        self.ledger.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn health(&self) -> MutexGuard<'_, NodeHealth> {
        self.health.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn traces(&self) -> MutexGuard<'_, HashMap<(String, String), BTreeMap<u32, LastDecision>>> {
        self.traces.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn dropped(&self) -> MutexGuard<'_, HashMap<String, chrono::DateTime<chrono::Utc>>> {
        self.dropped.lock().unwrap_or_else(|e| e.into_inner())
    }
    pub fn handed_to_recovery(
        &self,
    ) -> MutexGuard<'_, HashMap<String, chrono::DateTime<chrono::Utc>>> {
        self.handed_to_recovery
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Records whether a bundle is Broken and updates the gauge.
    pub fn set_broken(&self, bundle_id: &str, broken: bool) {
        let mut set = self.broken.lock().unwrap_or_else(|e| e.into_inner());
        let changed = if broken {
            set.insert(bundle_id.to_owned())
        } else {
            set.remove(bundle_id)
        };
        if changed {
            self.metrics
                .set_broken_bundles(i64::try_from(set.len()).unwrap_or(i64::MAX));
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

    /// Publishes an Event about `obj`; failures are logged, never fatal.
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
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&ev, &obj.object_ref(&())).await {
            tracing::warn!(object = %obj.meta().name.clone().unwrap_or_default(), reason, error = %e, "could not publish event");
        }
    }
}

/// How long to wait before retrying after an error.
pub fn backoff_for(error: &Error) -> Duration {
    match error {
        Error::ManagerUnavailable(_) => Duration::from_secs(3),
        Error::Kube(kube::Error::Api(s)) if s.code == 409 => Duration::from_millis(200),
        _ => Duration::from_secs(5),
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
pub async fn apply_status<K>(
    api: &kube::Api<K>,
    name: &str,
    status: &impl serde::Serialize,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": status,
    });
    let params = kube::api::PatchParams::apply(api::FIELD_MANAGER).force();
    api.patch_status(name, &params, &kube::api::Patch::Apply(&patch))
        .await?;
    Ok(())
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
    if ctx.manager.mirror().read(|m| provision_in_flight(m, &tag)) {
        return Ok(None);
    }
    let Some(spec) = ctx.model().pool(pool).cloned() else {
        return Ok(None);
    };
    if !ctx.provision_budget().take(pool, chrono::Utc::now()) {
        tracing::info!(pool, tag = %tag, "provisioning rate for the pool is used up this minute; asking later");
        return Ok(None);
    }
    let req = proto::CreateNodeRequest {
        pool: pool.to_owned(),
        provider: mapping::provider_of(spec.kind) as i32,
        region: spec.region.clone(),
        instance_type: instance_type.to_owned(),
        zone: zone.unwrap_or_default().to_owned(),
        tags: [(mapping::PROVISIONED_FOR_TAG.to_owned(), tag)]
            .into_iter()
            .collect(),
    };
    let node = ctx.manager.create_node(req).await?;
    ctx.model().add_provisioned(&node);
    Ok(Some(node))
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
