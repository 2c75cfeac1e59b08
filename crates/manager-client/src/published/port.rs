//! [`PublishedPort`]: the operator's [`ManagerPort`] over Manager's published API
//! (`norsk.api.manager` 1.0.384), so everything above the port — the client, its mirror, the
//! controllers — runs unchanged against a Manager that speaks only that API.
//!
//! How each port operation is carried:
//! - **Nodes.** CreateNode becomes CreateAwsNode or CreateOciNode with the fields of the pool's
//!   [`CatalogPool`] (region and instance type, or shape and availability domain; the zone's
//!   launch template or subnet) under a node id the port chooses — the request's idempotency
//!   key, so an ask repeated after a lost answer finds the node it made — and our tags (owner,
//!   pool, zone, instance type). TerminateNode is TerminateNode. The inventory of a running
//!   node comes from its pool's instance type: 1.0.384 reports no capacity.
//! - **Bundles** are stored jobs: RegisterBundle writes one CreateJob (or UpdateJob) per replica
//!   and job, tagged with bundle, replica, job name and requirements, and deletes the jobs of
//!   replicas or names that went; DeleteBundle stops and deletes them all. The bundle the model
//!   shows is rebuilt from its jobs' tags.
//! - **Jobs.** StartJob and StopJob carry the role as free text (`primary`,
//!   `migration-target`); UpdateJobConfig is UpdateJob with the new `manager_configuration`.
//!   Manager answers these with `Empty` and reports the outcome on the event stream, so a start
//!   is answered "accepted" and its result arrives as the job's next change.
//! - **Watch** is the published EventStream, translated: a snapshot of everything that is ours
//!   (never a resume: the published stream has none), then each change as the port event that
//!   says it. When the published stream drops, the watch ends, so the client above reconnects
//!   and the next snapshot replaces its mirror with only the differences.
//! - **What 1.0.384 lacks** (warm nodes, the migration handshake, reclaim notices) goes through
//!   our extension (`automanager.manager.extension.v1`) when the Manager serves it: the client
//!   probes it with `Describe` on every connect, [`ManagerPort::features`] says what it named,
//!   StopNode, StartNode and the four migration calls are carried by the extension's calls
//!   (the normal instance is the role `primary`, a migration's target `migration-target`), and
//!   the extension's Watch is merged into this port's Watch: a warm node is `POWERING_OFF` or
//!   `POWERED_OFF` (not terminated, though the published stream reports it stopped), a node
//!   under notice carries `reclaim_at_ms`, and migrations report their phases. Without the
//!   extension these answer `UNIMPLEMENTED` with the reason, which the controllers treat as
//!   "this Manager cannot".

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use manager_proto::api::common::JobId;
use manager_proto::api::common::NodeId;
use manager_proto::api::manager::{AwsLaunchTemplate, CreateAwsNodeRequest, CreateOciNodeRequest};
use manager_proto::extension::{self as ext, feature};
use manager_proto::{
    Bundle, BundleDeleted, BundleUpdated, CreateNodeRequest, CreateNodeResponse,
    DeleteBundleRequest, DeleteBundleResponse, Event, EventBatch, Heartbeat, Job, JobRemoved,
    JobUpdated, ListNodesRequest, ListNodesResponse, ListPoolsRequest, ListPoolsResponse,
    MigrationPhaseChanged, MigrationResponse, Node, NodeControllerMigrationAbort,
    NodeControllerMigrationCutover, NodeControllerMigrationGetState,
    NodeControllerMigrationPrepareTarget, NodePoweredOff, NodePoweringOff, NodeStarted,
    NodeStarting, NodeState as PortNodeState, NodeStopped, NodeTerminated, ProviderKind,
    RegisterBundleRequest, RegisterBundleResponse, RejectionReason, Snapshot, SnapshotReason,
    StartJobRequest, StartJobResponse, StartNodeRequest, StartNodeResponse, StopJobRequest,
    StopJobResponse, StopNodeRequest, StopNodeResponse, StopReason, Synced, TerminateNodeRequest,
    TerminateNodeResponse, UpdateJobConfigRequest, UpdateJobConfigResponse, WatchRequest,
    WatchResponse, event, watch_response,
};
use tokio::sync::{broadcast, mpsc};
use tonic::{Request, Response, Status};

use super::catalog::{PoolCatalog, ZoneLaunch};
use super::connection::PublishedClient;
use super::extension::ExtensionMirror;
use super::mirror::{NodeView, PublishedChange, PublishedMirror};
use super::tags;
use super::translate::{
    self, PROVIDER_STOP, StopOverlay, bundle_from_jobs, gone_node, node_is_ours, port_job,
    port_migration, port_node, published_role, stored_job, warm_state, warm_view,
};
use crate::ConnectionState;
use crate::port::{ManagerPort, PortFuture, WatchStream};

/// What an operation that needs one of our extensions answers on a standard Manager.
fn needs_extension(what: &str) -> Status {
    Status::unimplemented(format!(
        "{what} needs AutoManager's extension service, which this Manager does not serve \
         (Manager's published API 1.0.384 has no such call)"
    ))
}

fn status_of(e: crate::ClientError) -> Status {
    use crate::ClientError as E;
    match e {
        E::Config(m) | E::InvalidArgument(m) => Status::invalid_argument(m),
        E::NotFound(m) => Status::not_found(m),
        E::AlreadyExists(m) => Status::already_exists(m),
        E::FailedPrecondition(m) | E::Fenced(m) => Status::failed_precondition(m),
        E::Unauthenticated(m) => Status::unauthenticated(m),
        E::Unavailable(m) => Status::unavailable(m),
        E::Timeout(d) => Status::deadline_exceeded(format!("no answer within {d:?}")),
        E::Closed => Status::unavailable("the published client is closed"),
        E::Rejected { message, .. } => Status::failed_precondition(message),
        E::Rpc { code, message } => Status::new(code, message),
    }
}

/// The port model of everything ours the mirror holds, and the tags of each job (the bundle
/// records are rebuilt from them).
#[derive(Debug, Default, Clone, PartialEq)]
struct Model {
    nodes: BTreeMap<String, Node>,
    jobs: BTreeMap<String, Job>,
    job_tags: BTreeMap<String, BTreeMap<String, String>>,
    /// Each job's definition as a bundle job's template carries it ([`translate::template_of`]).
    job_templates: BTreeMap<String, Vec<u8>>,
    bundles: BTreeMap<String, Bundle>,
    migrations: BTreeMap<String, manager_proto::Migration>,
}

/// Manager's published API as the operator's port (see the module docs).
pub struct PublishedPort {
    client: Arc<PublishedClient>,
    catalog: PoolCatalog,
    owner: String,
    epoch: String,
    revision: Arc<AtomicU64>,
    overlay: Arc<Mutex<StopOverlay>>,
    gone: GoneNodes,
    /// How long a call waits for its outcome to show on the stream before answering with the
    /// model as it is.
    echo_wait: Duration,
}

impl PublishedPort {
    /// A port over `client`, provisioning from `catalog`, marking and recognising what it
    /// creates by `owner` (unique to the installation).
    pub fn new(
        client: Arc<PublishedClient>,
        catalog: PoolCatalog,
        owner: impl Into<String>,
    ) -> Self {
        PublishedPort {
            client,
            catalog,
            owner: owner.into(),
            epoch: format!("published-{:016x}", rand::random::<u64>()),
            revision: Arc::new(AtomicU64::new(1)),
            overlay: Arc::new(Mutex::new(StopOverlay::new())),
            gone: GoneNodes::default(),
            echo_wait: Duration::from_secs(2),
        }
    }

    /// The published client below this port.
    pub fn client(&self) -> &Arc<PublishedClient> {
        &self.client
    }

    fn model(&self) -> Model {
        let mut model = read_model(&self.client, &self.catalog, &self.owner, &self.overlay);
        self.gone.add_to(&mut model);
        model
    }

    /// Waits (up to the echo wait) until `ready` holds of the model; answers the model then.
    async fn settle(&self, ready: impl Fn(&Model) -> bool) -> Model {
        let mut changes = self.client.subscribe();
        let deadline = tokio::time::Instant::now() + self.echo_wait;
        loop {
            let model = self.model();
            if ready(&model) {
                return model;
            }
            match tokio::time::timeout_at(deadline, changes.recv()).await {
                Ok(Ok(_) | Err(broadcast::error::RecvError::Lagged(_))) => {}
                Ok(Err(broadcast::error::RecvError::Closed)) | Err(_) => return model,
            }
        }
    }

    async fn create_node(&self, req: CreateNodeRequest) -> Result<CreateNodeResponse, Status> {
        let pool = self.catalog.get(&req.pool).ok_or_else(|| {
            Status::not_found(format!(
                "no PlacementPool {} is known to the port",
                req.pool
            ))
        })?;
        let kind = pool.kind();
        if req.provider != 0 && req.provider != kind as i32 {
            return Err(Status::invalid_argument(format!(
                "pool {} is {}, not the provider asked for",
                req.pool,
                kind.as_str_name()
            )));
        }
        let itype = pool
            .instance_type(&req.instance_type)
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "pool {} has no instance type {:?}",
                    req.pool, req.instance_type
                ))
            })?
            .instance_type
            .clone();
        let model = self.model();
        let zone = if req.zone.is_empty() {
            least_used_zone(&model, &req.pool, &pool.pool.zones)
        } else if pool.pool.zones.contains(&req.zone) {
            req.zone.clone()
        } else {
            return Err(Status::invalid_argument(format!(
                "pool {} has no zone {:?}",
                req.pool, req.zone
            )));
        };
        let node_id = if req.request_id.is_empty() {
            format!("automanager-{:032x}", rand::random::<u128>())
        } else {
            req.request_id.clone()
        };
        if let Some(existing) = model.nodes.get(&node_id) {
            // The key names a node already made: the ask is a repeat.
            return Ok(CreateNodeResponse {
                node: Some(existing.clone()),
            });
        }
        let mut node_tags: BTreeMap<String, String> = req.tags.clone().into_iter().collect();
        node_tags.insert(tags::OWNER.to_owned(), self.owner.clone());
        node_tags.insert(tags::POOL.to_owned(), req.pool.clone());
        node_tags.insert(tags::INSTANCE_TYPE.to_owned(), itype.clone());
        if !zone.is_empty() {
            node_tags.insert(tags::ZONE.to_owned(), zone.clone());
        }
        let id = Some(NodeId {
            node_id: node_id.clone(),
        });
        let sent = match kind {
            ProviderKind::Aws => {
                let template = match pool.launch_in(&zone) {
                    Some(ZoneLaunch::AwsTemplate(t)) => Some(t.clone()),
                    _ => None::<AwsLaunchTemplate>,
                };
                self.client
                    .create_aws_node(CreateAwsNodeRequest {
                        node_id: id,
                        tags: node_tags,
                        region: pool.pool.region.clone(),
                        instance_type: itype,
                        template,
                        ..Default::default()
                    })
                    .await
            }
            ProviderKind::Oci => {
                let subnet = match pool.launch_in(&zone) {
                    Some(ZoneLaunch::OciSubnet(s)) => s.clone(),
                    _ => String::new(),
                };
                self.client
                    .create_oci_node(CreateOciNodeRequest {
                        node_id: id,
                        tags: node_tags,
                        availability_domain: zone.clone(),
                        shape: itype,
                        subnet,
                        ..Default::default()
                    })
                    .await
            }
            ProviderKind::Cluster | ProviderKind::Unspecified => {
                return Err(Status::failed_precondition(format!(
                    "pool {} is a fixed pool of physical nodes: Manager creates no node in it",
                    req.pool
                )));
            }
        };
        match sent {
            Ok(()) => {}
            // A repeat whose first answer was lost: the node exists under its key.
            Err(crate::ClientError::AlreadyExists(_)) => {}
            Err(e) => return Err(status_of(e)),
        }
        let model = self.settle(|m| m.nodes.contains_key(&node_id)).await;
        let node = model.nodes.get(&node_id).cloned().unwrap_or_else(|| Node {
            node_id: node_id.clone(),
            pool: req.pool.clone(),
            provider: kind as i32,
            region: pool.pool.region.clone(),
            zone,
            instance_type: req.instance_type.clone(),
            state: PortNodeState::Starting as i32,
            request_id: node_id.clone(),
            ..Default::default()
        });
        Ok(CreateNodeResponse { node: Some(node) })
    }

    async fn terminate_node(
        &self,
        req: TerminateNodeRequest,
    ) -> Result<TerminateNodeResponse, Status> {
        let Some(node) = self.model().nodes.get(&req.node_id).cloned() else {
            return Err(Status::not_found(format!(
                "node {} is not one of this installation's",
                req.node_id
            )));
        };
        if node.provider == ProviderKind::Cluster as i32 {
            // A physical node is not Manager's to terminate. What a terminate asks of it is that
            // its work goes: our instances on it are stopped and handed to recovery, as a
            // terminated node's are; the node stays, for its owner.
            self.stop_ours_on(&req.node_id).await?;
            return Ok(TerminateNodeResponse { node: Some(node) });
        }
        // Another client's instance on a node we made is not ours to end: the published
        // model leaves other clients' jobs out, so the refusal is the operator's only sight of it.
        let others = self.others_on(&req.node_id);
        if !others.is_empty() {
            return Err(Status::failed_precondition(format!(
                "{}: node {} runs {}",
                crate::OTHER_CLIENTS_JOBS,
                req.node_id,
                others.join(", ")
            )));
        }
        match self.client.terminate_node(&req.node_id).await {
            Ok(()) | Err(crate::ClientError::NotFound(_)) => {}
            Err(e) => return Err(status_of(e)),
        }
        Ok(TerminateNodeResponse {
            node: Some(gone_node(node)),
        })
    }

    /// The jobs not this installation's with a live instance on `node_id`, in id order.
    fn others_on(&self, node_id: &str) -> Vec<String> {
        let mut others: Vec<String> = self.client.with_mirror(|m| {
            m.jobs
                .values()
                .filter(|v| !tags::owned_by(v.tags(), &self.owner))
                .filter(|v| v.live_instances().any(|i| i.node_id == node_id))
                .map(|v| v.job_id().to_owned())
                .collect()
        });
        others.sort();
        others.dedup();
        others
    }

    /// Stops every live instance of our jobs on `node_id`, each handed to recovery.
    async fn stop_ours_on(&self, node_id: &str) -> Result<(), Status> {
        let ours: Vec<(String, String)> = self.client.with_mirror(|m| {
            m.jobs
                .values()
                .filter(|v| tags::owned_by(v.tags(), &self.owner))
                .flat_map(|v| {
                    v.live_instances()
                        .filter(|i| i.node_id == node_id)
                        .map(|i| (v.job_id().to_owned(), i.role.clone()))
                })
                .collect()
        });
        for (job_id, role) in ours {
            self.overlay
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert((job_id.clone(), role.clone()), StopReason::HandedToRecovery);
            match self.client.stop_job(&job_id, &role, node_id).await {
                Ok(()) | Err(crate::ClientError::NotFound(_)) => {}
                Err(e) => return Err(status_of(e)),
            }
        }
        Ok(())
    }

    async fn register_bundle(
        &self,
        req: RegisterBundleRequest,
        must_exist: bool,
    ) -> Result<RegisterBundleResponse, Status> {
        let bundle = req
            .bundle
            .ok_or_else(|| Status::invalid_argument("a bundle is required"))?;
        if bundle.bundle_id.is_empty() || bundle.bundle_id.contains('/') {
            return Err(Status::invalid_argument(
                "a bundle id is required and has no '/'",
            ));
        }
        let model = self.model();
        let existing: BTreeSet<String> = model
            .jobs
            .values()
            .filter(|j| j.bundle_id == bundle.bundle_id)
            .map(|j| j.job_id.clone())
            .collect();
        if must_exist && existing.is_empty() {
            return Err(Status::not_found(format!("bundle {}", bundle.bundle_id)));
        }
        let mut wanted = BTreeSet::new();
        for replica in 0..bundle.replicas {
            for job in &bundle.jobs {
                let stored = stored_job(&bundle, replica, job, &self.owner)
                    .map_err(Status::invalid_argument)?;
                let id = translate::port_job_id(&bundle.bundle_id, replica, &job.job_name);
                wanted.insert(id.clone());
                let current = self
                    .client
                    .with_mirror(|m| m.jobs.get(&id).map(|v| v.job.clone()));
                match current {
                    Some(cur) if !tags::owned_by(&cur.tags, &self.owner) => {
                        return Err(Status::already_exists(format!(
                            "job {id} exists in Manager and is not this installation's"
                        )));
                    }
                    Some(cur)
                        if cur.tags == stored.tags
                            && cur.manager_configuration == stored.manager_configuration
                            && cur.description == stored.description
                            && translate::template_of(&cur) == translate::template_of(&stored) => {}
                    Some(_) => {
                        self.client.update_job(stored).await.map_err(status_of)?;
                    }
                    None => match self.client.create_job(stored.clone()).await {
                        Ok(_) => {}
                        Err(crate::ClientError::AlreadyExists(_)) => {
                            self.client.update_job(stored).await.map_err(status_of)?;
                        }
                        Err(e) => return Err(status_of(e)),
                    },
                }
            }
        }
        for gone in existing.difference(&wanted) {
            self.remove_job(gone).await?;
        }
        let ids: Vec<String> = wanted.into_iter().collect();
        let model = self
            .settle(|m| ids.iter().all(|id| m.jobs.contains_key(id)))
            .await;
        let stored = model.bundles.get(&bundle.bundle_id).cloned();
        Ok(RegisterBundleResponse {
            bundle: Some(stored.unwrap_or(bundle)),
            job_ids: ids,
        })
    }

    /// Stops every live instance of one of our jobs, then deletes it.
    async fn remove_job(&self, job_id: &str) -> Result<(), Status> {
        let live: Vec<(String, String)> = self.client.with_mirror(|m| {
            m.jobs
                .get(job_id)
                .map(|v| {
                    v.live_instances()
                        .map(|i| (i.role.clone(), i.node_id.clone()))
                        .collect()
                })
                .unwrap_or_default()
        });
        for (role, node) in &live {
            match self.client.stop_job(job_id, role, node).await {
                Ok(()) | Err(crate::ClientError::NotFound(_)) => {}
                Err(e) => return Err(status_of(e)),
            }
        }
        if !live.is_empty() {
            let id = job_id.to_owned();
            self.settle(|m| {
                m.jobs.get(&id).is_none_or(|j| {
                    j.instances.iter().all(|i| {
                        i.state != manager_proto::JobState::Running as i32
                            && i.state != manager_proto::JobState::Starting as i32
                    })
                })
            })
            .await;
        }
        match self.client.delete_job(job_id).await {
            Ok(()) | Err(crate::ClientError::NotFound(_)) => Ok(()),
            Err(e) => Err(status_of(e)),
        }
    }

    async fn delete_bundle(
        &self,
        req: DeleteBundleRequest,
    ) -> Result<DeleteBundleResponse, Status> {
        let ids: Vec<String> = self
            .model()
            .jobs
            .values()
            .filter(|j| j.bundle_id == req.bundle_id)
            .map(|j| j.job_id.clone())
            .collect();
        for id in &ids {
            self.remove_job(id).await?;
        }
        Ok(DeleteBundleResponse {
            removed_job_ids: ids,
        })
    }

    fn our_job(model: &Model, job_id: &str) -> Result<Job, Status> {
        model.jobs.get(job_id).cloned().ok_or_else(|| {
            Status::not_found(format!("job {job_id} is not one of this installation's"))
        })
    }

    async fn start_job(&self, req: StartJobRequest) -> Result<StartJobResponse, Status> {
        let model = self.model();
        Self::our_job(&model, &req.job_id)?;
        if !model.nodes.contains_key(&req.node_id) {
            return Err(Status::not_found(format!(
                "node {} is not one this installation places on",
                req.node_id
            )));
        }
        let role = manager_proto::JobRole::try_from(req.role).unwrap_or_default();
        let role_name = published_role(role);
        let asked_ms = now_ms();
        self.client
            .start_job(&req.job_id, role_name, &req.node_id)
            .await
            .map_err(status_of)?;
        let (job_id, node_id) = (req.job_id.clone(), req.node_id.clone());
        let refused = || {
            self.client.with_mirror(|m| {
                m.jobs
                    .get(&job_id)
                    .is_some_and(|v| refused_since(v, role_name, &node_id, asked_ms))
            })
        };
        let model = self
            .settle(|m| {
                refused()
                    || m.jobs.get(&job_id).is_some_and(|j| {
                        j.instances.iter().any(|i| {
                            i.node_id == node_id
                                && i.role == role as i32
                                && (i.state == manager_proto::JobState::Starting as i32
                                    || i.state == manager_proto::JobState::Running as i32)
                        })
                    })
            })
            .await;
        // The published API answers every StartJob with Empty: a node that cannot run the job
        // says so only in its history, as a stop for failure before it ever ran. That is the
        // refusal our first API answers, and the operator counts it against the node.
        if refused() {
            return Ok(StartJobResponse {
                accepted: false,
                rejection_reason: RejectionReason::Unspecified as i32,
                message: format!(
                    "the job failed on node {} before it ever ran (a start Manager refused)",
                    req.node_id
                ),
                job: model.jobs.get(&req.job_id).cloned(),
            });
        }
        Ok(StartJobResponse {
            accepted: true,
            rejection_reason: 0,
            message: String::new(),
            job: model.jobs.get(&req.job_id).cloned(),
        })
    }

    async fn stop_job(&self, req: StopJobRequest) -> Result<StopJobResponse, Status> {
        let job = Self::our_job(&self.model(), &req.job_id)?;
        let role = match manager_proto::JobRole::try_from(req.role).unwrap_or_default() {
            manager_proto::JobRole::Unspecified => manager_proto::JobRole::Normal,
            r => r,
        };
        let reason = StopReason::try_from(req.reason).unwrap_or_default();
        if !matches!(
            reason,
            StopReason::Unspecified | StopReason::Requested | StopReason::HandedToRecovery
        ) {
            return Err(Status::invalid_argument(format!(
                "a stop's reason is REQUESTED or HANDED_TO_RECOVERY, not {}",
                reason.as_str_name()
            )));
        }
        let role_name = published_role(role);
        let live = self.client.with_mirror(|m| {
            m.jobs.get(&req.job_id).and_then(|v| {
                v.live_instances()
                    .find(|i| i.role == role_name)
                    .map(|i| i.node_id.clone())
            })
        });
        let Some(node_id) = live else {
            // Nothing runs under that role: a stop is idempotent.
            return Ok(StopJobResponse { job: Some(job) });
        };
        if reason == StopReason::HandedToRecovery {
            self.overlay
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert((req.job_id.clone(), role_name.to_owned()), reason);
        }
        match self.client.stop_job(&req.job_id, role_name, &node_id).await {
            Ok(()) | Err(crate::ClientError::NotFound(_)) => {}
            Err(e) => return Err(status_of(e)),
        }
        let id = req.job_id.clone();
        let model = self
            .settle(|m| {
                m.jobs.get(&id).is_none_or(|j| {
                    j.instances.iter().all(|i| {
                        i.role != role as i32
                            || (i.state != manager_proto::JobState::Running as i32
                                && i.state != manager_proto::JobState::Starting as i32)
                    })
                })
            })
            .await;
        Ok(StopJobResponse {
            job: model.jobs.get(&req.job_id).cloned().or(Some(job)),
        })
    }

    async fn update_job_config(
        &self,
        req: UpdateJobConfigRequest,
    ) -> Result<UpdateJobConfigResponse, Status> {
        Self::our_job(&self.model(), &req.job_id)?;
        let text = String::from_utf8(req.config)
            .map_err(|_| Status::invalid_argument("a job's configuration is UTF-8 JSON"))?;
        let stored = self
            .client
            .with_mirror(|m| m.jobs.get(&req.job_id).map(|v| v.job.clone()))
            .ok_or_else(|| Status::not_found(format!("job {}", req.job_id)))?;
        let mut next = stored;
        next.manager_configuration = text.clone();
        self.client.update_job(next).await.map_err(status_of)?;
        let id = req.job_id.clone();
        let model = self
            .settle(|m| m.jobs.get(&id).is_some_and(|j| j.config == text.as_bytes()))
            .await;
        Ok(UpdateJobConfigResponse {
            job: model.jobs.get(&req.job_id).cloned(),
        })
    }

    /// StopNode (`start` false) or StartNode of one of our nodes, through our extension; answers
    /// the node once the model shows the change (or as it is after the echo wait).
    async fn power(&self, node_id: String, start: bool) -> Result<StopNodeResponse, Status> {
        use crate::ManagerPort as _;
        let what = if start { "StartNode" } else { "StopNode" };
        if !self.features().warm_nodes {
            return Err(needs_extension(&format!("{what} (a warm spare)")));
        }
        let Some(node) = self.model().nodes.get(&node_id).cloned() else {
            return Err(Status::not_found(format!(
                "node {node_id} is not one of this installation's"
            )));
        };
        if node.provider == ProviderKind::Cluster as i32 {
            return Err(Status::failed_precondition(format!(
                "node {node_id} is a physical node: its power is not Manager's"
            )));
        }
        let sent = if start {
            self.client.ext_start_node(&node_id).await
        } else {
            self.client.ext_stop_node(&node_id).await
        };
        sent.map_err(status_of)?;
        let wanted: &[PortNodeState] = if start {
            &[PortNodeState::Starting, PortNodeState::Started]
        } else {
            &[PortNodeState::PoweringOff, PortNodeState::PoweredOff]
        };
        let model = self
            .settle(|m| {
                m.nodes
                    .get(&node_id)
                    .is_some_and(|n| wanted.iter().any(|s| *s as i32 == n.state))
            })
            .await;
        Ok(StopNodeResponse {
            node: model.nodes.get(&node_id).cloned().or(Some(node)),
        })
    }

    /// Whether the Manager serves the migration handshake (our extension).
    fn handshake(&self) -> Result<(), Status> {
        use crate::ManagerPort as _;
        if self.features().migration_handshake {
            Ok(())
        } else {
            Err(needs_extension("the migration handshake"))
        }
    }

    async fn migration_get_state(
        &self,
        req: NodeControllerMigrationGetState,
    ) -> Result<MigrationResponse, Status> {
        self.handshake()?;
        Self::our_job(&self.model(), &req.job_id)?;
        let sent = ext::MigrationGetStateRequest {
            migration_id: req.migration_id,
            job_id: Some(JobId { job_id: req.job_id }),
            source_role: tags::ROLE_NORMAL.to_owned(),
            // Our extension numbers strategies as our first API does.
            strategy: req.strategy,
        };
        migration_answer(self.client.ext_migration_get_state(sent).await)
    }

    async fn migration_prepare_target(
        &self,
        req: NodeControllerMigrationPrepareTarget,
    ) -> Result<MigrationResponse, Status> {
        self.handshake()?;
        if !self.model().nodes.contains_key(&req.target_node_id) {
            return Err(Status::not_found(format!(
                "node {} is not one this installation places on",
                req.target_node_id
            )));
        }
        let sent = ext::MigrationPrepareTargetRequest {
            migration_id: req.migration_id,
            target_node_id: Some(NodeId {
                node_id: req.target_node_id,
            }),
            target_role: tags::ROLE_MIGRATION_TARGET.to_owned(),
            initial_state: req.initial_state,
        };
        migration_answer(self.client.ext_migration_prepare_target(sent).await)
    }

    fn watch_stream(&self, req: WatchRequest) -> WatchStream {
        let (tx, rx) = mpsc::channel(64);
        let feed = Feed {
            client: Arc::clone(&self.client),
            catalog: self.catalog.clone(),
            owner: self.owner.clone(),
            epoch: self.epoch.clone(),
            revision: Arc::clone(&self.revision),
            overlay: Arc::clone(&self.overlay),
            gone: self.gone.clone(),
        };
        tokio::spawn(async move { feed.run(req, tx).await });
        tokio_stream::wrappers::ReceiverStream::new(rx).boxed()
    }
}

/// Everything ours the client's mirror holds now, as the port models it.
fn read_model(
    client: &PublishedClient,
    catalog: &PoolCatalog,
    owner: &str,
    overlay: &Mutex<StopOverlay>,
) -> Model {
    let overlay = overlay
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    catalog.read(|catalog| {
        client.with_extension(|e| client.with_mirror(|m| model_of(m, e, owner, catalog, &overlay)))
    })
}

/// The port record of node `id`: the published stream's view of it, with what our extension
/// adds (a warm node's power state, a reclaim notice); `None` when it is not ours or not there.
fn node_of(
    m: &PublishedMirror,
    e: &ExtensionMirror,
    owner: &str,
    catalog: &BTreeMap<String, super::catalog::CatalogPool>,
    id: &str,
) -> Option<Node> {
    let warm = e.warm.get(id);
    let published = m.nodes.get(id);
    let view = match (published, warm) {
        (Some(v), _) => v.clone(),
        (None, Some(p)) => warm_view(id, p),
        (None, None) => return None,
    };
    if !node_is_ours(&view, owner, catalog) {
        return None;
    }
    let mut node = port_node(&view, catalog);
    let state = warm.and_then(warm_state).or_else(|| {
        // The published stream reports a warm stop as the provider stopping the node; with our
        // extension that is a node powering off, before its Watch says so.
        (e.serves(feature::WARM_NODES)
            && published.is_some_and(|v| v.stopping_reason == Some(PROVIDER_STOP)))
        .then_some(PortNodeState::PoweringOff)
    });
    if let Some(state) = state
        && (published.is_none() || state != PortNodeState::Starting)
    {
        node.state = state as i32;
        node.inventory = None;
    }
    if let Some(n) = e.notices.get(id) {
        node.reclaim_at_ms = n.deadline.as_ref().map_or(0, super::mirror::timestamp_ms);
        node.reclaim_reason = n.reason.clone();
    }
    // With our extension's handshake Manager itself relays a handover to the job: a node we
    // created is a handover participant, as a worker with its job-socket listener up is over
    // our first API. A physical node says in its capabilities tag whether it is one.
    if e.serves(feature::MIGRATION_HANDSHAKE)
        && !view.physical
        && let Some(inv) = node.inventory.as_mut()
        && !inv.capabilities.iter().any(|c| c == JOB_SOCKET)
    {
        inv.capabilities.push(JOB_SOCKET.to_owned());
    }
    Some(node)
}

/// The capability of a node that can take part in a handover.
const JOB_SOCKET: &str = "norsk.io/job-socket";

/// How many nodes the published stream dropped the port keeps showing as terminated.
const GONE_KEPT: usize = 1024;

/// Nodes of ours the published stream dropped (a terminated node, a physical node that left),
/// as the port last reported them. The published API forgets such a node, but every later
/// snapshot of the port still shows it terminated, as our first API's Manager does: otherwise
/// the next snapshot (any reconnect, any pool change) would make a just-terminated node vanish
/// and the operator would remove its ManagerNode at once, not after `removeStoppedNodesAfter`.
/// Bounded: past [`GONE_KEPT`] the node gone longest is forgotten.
#[derive(Clone, Default)]
struct GoneNodes(Arc<Mutex<BTreeMap<String, Node>>>);

impl GoneNodes {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Node>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remember(&self, node: Node) {
        let mut gone = self.lock();
        gone.insert(node.node_id.clone(), node);
        while gone.len() > GONE_KEPT {
            let oldest = gone
                .values()
                .min_by_key(|n| n.state_changed_at_ms)
                .map(|n| n.node_id.clone());
            match oldest {
                Some(id) => gone.remove(&id),
                None => break,
            };
        }
    }

    fn forget(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Adds to `model` each gone node it does not show live.
    fn add_to(&self, model: &mut Model) {
        for (id, node) in self.lock().iter() {
            model
                .nodes
                .entry(id.clone())
                .or_insert_with(|| node.clone());
        }
    }
}

/// Everything ours in `m`, as the port models it.
fn model_of(
    m: &PublishedMirror,
    e: &ExtensionMirror,
    owner: &str,
    catalog: &BTreeMap<String, super::catalog::CatalogPool>,
    overlay: &StopOverlay,
) -> Model {
    let mut model = Model::default();
    let ids: BTreeSet<&String> = m.nodes.keys().chain(e.warm.keys()).collect();
    for id in ids {
        if let Some(node) = node_of(m, e, owner, catalog, id) {
            model.nodes.insert(id.clone(), node);
        }
    }
    for view in m.jobs.values() {
        if let Some(job) = port_job(view, owner, overlay) {
            model
                .job_tags
                .insert(job.job_id.clone(), view.tags().clone());
            model
                .job_templates
                .insert(job.job_id.clone(), translate::template_of(&view.job));
            model.jobs.insert(job.job_id.clone(), job);
        }
    }
    for m in e.migrations.values() {
        let m = port_migration(m);
        if let Some(job) = model.jobs.get_mut(&m.job_id) {
            mark_target(job, &m);
            model.migrations.insert(m.migration_id.clone(), m);
        }
    }
    let bundle_ids: BTreeSet<String> = model.jobs.values().map(|j| j.bundle_id.clone()).collect();
    for id in bundle_ids {
        if let Some(b) = rebuild_bundle(&model, &id) {
            model.bundles.insert(id, b);
        }
    }
    model
}

/// A live migration's target instance carries its migration's id, as our first API's do.
fn mark_target(job: &mut Job, m: &manager_proto::Migration) {
    if m.is_final() {
        return;
    }
    for i in &mut job.instances {
        if i.role == manager_proto::JobRole::MigrationTarget as i32 && i.node_id == m.target_node_id
        {
            i.migration_id.clone_from(&m.migration_id);
        }
    }
}

/// The pool's zone with the fewest of our nodes (ties: the first listed).
fn least_used_zone(model: &Model, pool: &str, zones: &[String]) -> String {
    zones
        .iter()
        .min_by_key(|z| {
            model
                .nodes
                .values()
                .filter(|n| n.pool == pool && &n.zone == *z)
                .count()
        })
        .cloned()
        .unwrap_or_default()
}

fn rebuild_bundle(model: &Model, bundle_id: &str) -> Option<Bundle> {
    let empty = BTreeMap::new();
    let stored: BTreeSet<(u32, String)> = model
        .jobs
        .values()
        .filter(|j| j.bundle_id == bundle_id)
        .map(|j| (j.replica, j.job_name.clone()))
        .collect();
    let mut bundle = bundle_from_jobs(
        bundle_id,
        model
            .jobs
            .values()
            .filter(|j| j.bundle_id == bundle_id)
            .map(|j| {
                (
                    j,
                    model.job_tags.get(&j.job_id).unwrap_or(&empty),
                    model
                        .job_templates
                        .get(&j.job_id)
                        .map_or(&[][..], Vec::as_slice),
                )
            }),
    )?;
    // Only the replicas Manager holds whole: a half-done registration reads as not done, so it
    // is asked again.
    bundle.replicas = translate::whole_replicas(&bundle, &stored);
    Some(bundle)
}

/// One Watch stream's task: the snapshot, then the changes, until the published stream drops
/// or the receiver goes.
struct Feed {
    client: Arc<PublishedClient>,
    catalog: PoolCatalog,
    owner: String,
    epoch: String,
    revision: Arc<AtomicU64>,
    overlay: Arc<Mutex<StopOverlay>>,
    gone: GoneNodes,
}

type Sink = mpsc::Sender<Result<WatchResponse, Status>>;

impl Feed {
    fn model(&self) -> Model {
        let mut model = read_model(&self.client, &self.catalog, &self.owner, &self.overlay);
        self.gone.add_to(&mut model);
        model
    }

    async fn run(self, req: WatchRequest, tx: Sink) {
        let mut state = self.client.state();
        let mut pools = self.catalog.changes();
        // Subscribe before reading, so no change falls between the snapshot and the feed.
        let mut changes = self.client.subscribe();
        let closed = state
            .wait_for(|s| *s == ConnectionState::Ready)
            .await
            .map(drop)
            .is_err();
        if closed {
            let _ = tx
                .send(Err(Status::unavailable("the published client is closed")))
                .await;
            return;
        }
        // What was sent before now is in the mirror already; the snapshot below holds it.
        while !matches!(
            changes.try_recv(),
            Err(broadcast::error::TryRecvError::Empty | broadcast::error::TryRecvError::Closed)
        ) {}
        pools.mark_unchanged();
        let mut held = self.model();
        // Every snapshot has a revision of its own, newer than any event before it.
        let revision = self.revision.fetch_add(1, Ordering::SeqCst) + 1;
        let reason = if req.resume_revision == 0 {
            SnapshotReason::Initial
        } else {
            // The published stream cannot resume: every reconnect is a whole snapshot.
            SnapshotReason::EpochChanged
        };
        let snapshot = Snapshot {
            epoch: self.epoch.clone(),
            revision,
            reason: reason as i32,
            nodes: held.nodes.values().cloned().collect(),
            jobs: held.jobs.values().cloned().collect(),
            bundles: held.bundles.values().cloned().collect(),
            migrations: held.migrations.values().cloned().collect(),
            last: true,
        };
        let synced = Synced {
            epoch: self.epoch.clone(),
            revision,
        };
        for kind in [
            watch_response::Kind::Snapshot(snapshot),
            watch_response::Kind::Synced(synced),
        ] {
            if tx
                .send(Ok(WatchResponse { kind: Some(kind) }))
                .await
                .is_err()
            {
                return;
            }
        }
        let beat = Duration::from_millis(req.heartbeat_interval_ms.max(100));
        loop {
            let next = tokio::select! {
                c = changes.recv() => Some(c),
                _ = async { state.wait_for(|s| *s != ConnectionState::Ready).await.map(drop) } => None,
                // Which nodes are ours, and their capacity, follow the pools: a new snapshot
                // carries what a pool change changed.
                _ = pools.changed() => None,
                () = tokio::time::sleep(beat), if req.heartbeat_interval_ms > 0 => {
                    let hb = Heartbeat { epoch: self.epoch.clone(), revision: self.revision.load(Ordering::SeqCst) };
                    if tx.send(Ok(WatchResponse { kind: Some(watch_response::Kind::Heartbeat(hb)) })).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            match next {
                // A new published snapshot: end this watch so the client above takes one too
                // (its differences are what changed; an unchanged Manager yields none).
                Some(Ok(PublishedChange::Resynced)) => {
                    let _ = tx
                        .send(Err(Status::unavailable(
                            "Manager's published event stream reconnected",
                        )))
                        .await;
                    return;
                }
                Some(Ok(change)) => {
                    let events = self.translate(&mut held, &change);
                    if events.is_empty() {
                        continue;
                    }
                    let batch = EventBatch { events };
                    let msg = WatchResponse {
                        kind: Some(watch_response::Kind::Events(batch)),
                    };
                    if tx.send(Ok(msg)).await.is_err() {
                        return;
                    }
                }
                // Lagged, closed, or the published stream dropped: end this watch; the client
                // above reconnects and the next snapshot carries what was missed.
                _ => {
                    let _ = tx
                        .send(Err(Status::unavailable(
                            "Manager's published event stream was interrupted",
                        )))
                        .await;
                    return;
                }
            }
        }
    }

    /// Brings node `id` in `held` up to date with the mirrors, with the event that says so. A
    /// node the published stream dropped after a provider stop is a warm node powering off when
    /// our extension serves warm nodes, even before the extension's Watch says so.
    fn sync_node(
        &self,
        held: &mut Model,
        id: &str,
        removed: Option<&NodeView>,
        kinds: &mut Vec<event::Kind>,
    ) {
        let node = self.catalog.read(|catalog| {
            self.client.with_extension(|e| {
                let now = self
                    .client
                    .with_mirror(|m| node_of(m, e, &self.owner, catalog, id));
                now.or_else(|| {
                    let view = removed.filter(|v| {
                        e.serves(feature::WARM_NODES)
                            && v.stopping_reason == Some(PROVIDER_STOP)
                            && node_is_ours(v, &self.owner, catalog)
                    })?;
                    let mut node = port_node(view, catalog);
                    node.state = PortNodeState::PoweringOff as i32;
                    node.inventory = None;
                    Some(node)
                })
            })
        });
        match node {
            Some(node) if held.nodes.get(id) != Some(&node) => {
                self.gone.forget(id);
                held.nodes.insert(id.to_owned(), node.clone());
                kinds.push(node_event(node));
            }
            Some(_) => {}
            None => {
                let last = held
                    .nodes
                    .get(id)
                    .filter(|n| n.state != PortNodeState::Terminated as i32)
                    .cloned();
                if let Some(last) = last {
                    let mut node = gone_node(last);
                    node.state_changed_at_ms = now_ms();
                    held.nodes.insert(id.to_owned(), node.clone());
                    self.gone.remember(node.clone());
                    kinds.push(event::Kind::NodeTerminated(NodeTerminated {
                        node: Some(node),
                    }));
                }
            }
        }
    }

    /// The port events that say what `change` changed in `held` (updated to match).
    fn translate(&self, held: &mut Model, change: &PublishedChange) -> Vec<Event> {
        let mut kinds = Vec::new();
        match change {
            PublishedChange::NodeUpserted(view) => {
                self.sync_node(held, &view.node_id, None, &mut kinds)
            }
            PublishedChange::NodeRemoved(view) => {
                self.sync_node(held, &view.node_id, Some(view), &mut kinds);
            }
            PublishedChange::NodePower(p) => {
                let id = p
                    .node_id
                    .as_ref()
                    .map(|n| n.node_id.clone())
                    .unwrap_or_default();
                self.sync_node(held, &id, None, &mut kinds);
            }
            PublishedChange::ReclaimNotice(n) => {
                let id = n
                    .node_id
                    .as_ref()
                    .map(|n| n.node_id.clone())
                    .unwrap_or_default();
                self.sync_node(held, &id, None, &mut kinds);
            }
            PublishedChange::Migration(m) => {
                let m = port_migration(m);
                if let Some(job) = held.jobs.get_mut(&m.job_id)
                    && held.migrations.get(&m.migration_id) != Some(&m)
                {
                    let before = job.clone();
                    mark_target(job, &m);
                    if *job != before {
                        kinds.push(event::Kind::JobUpdated(JobUpdated {
                            job: Some(job.clone()),
                        }));
                    }
                    held.migrations.insert(m.migration_id.clone(), m.clone());
                    kinds.push(event::Kind::MigrationPhase(MigrationPhaseChanged {
                        migration: Some(m),
                    }));
                }
            }
            PublishedChange::JobUpserted(view) => {
                let overlay = self
                    .overlay
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                let job = port_job(view, &self.owner, &overlay).map(|mut job| {
                    let id = job.job_id.clone();
                    for m in held.migrations.values().filter(|m| m.job_id == id) {
                        mark_target(&mut job, m);
                    }
                    job
                });
                let template = translate::template_of(&view.job);
                if let Some(job) = job
                    && (held.jobs.get(&job.job_id) != Some(&job)
                        || held.job_templates.get(&job.job_id) != Some(&template))
                {
                    let bundle_id = job.bundle_id.clone();
                    held.job_tags
                        .insert(job.job_id.clone(), view.tags().clone());
                    held.job_templates.insert(job.job_id.clone(), template);
                    held.jobs.insert(job.job_id.clone(), job.clone());
                    kinds.push(event::Kind::JobUpdated(JobUpdated { job: Some(job) }));
                    bundle_change(held, &bundle_id, &mut kinds);
                }
            }
            PublishedChange::JobRemoved(view) => {
                if let Some(job) = held.jobs.remove(view.job_id()) {
                    held.job_tags.remove(&job.job_id);
                    held.job_templates.remove(&job.job_id);
                    kinds.push(event::Kind::JobRemoved(JobRemoved {
                        job_id: job.job_id.clone(),
                    }));
                    bundle_change(held, &job.bundle_id, &mut kinds);
                }
            }
            PublishedChange::ProviderHealth(_)
            | PublishedChange::JobInfo(_)
            | PublishedChange::Resynced => {}
        }
        let now = now_ms();
        kinds
            .into_iter()
            .map(|kind| Event {
                revision: self.revision.fetch_add(1, Ordering::SeqCst) + 1,
                at_ms: now,
                kind: Some(kind),
            })
            .collect()
    }
}

/// Whether `view`'s instance under `role` on `node` is a start refused at or after
/// `since_ms` ([`translate::refused`]).
fn refused_since(view: &super::JobView, role: &str, node: &str, since_ms: i64) -> bool {
    view.instances
        .get(role)
        .is_some_and(|i| i.node_id == node && i.at_ms >= since_ms && translate::refused(i))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn node_event(node: Node) -> event::Kind {
    match PortNodeState::try_from(node.state).unwrap_or_default() {
        PortNodeState::Started => event::Kind::NodeStarted(NodeStarted { node: Some(node) }),
        PortNodeState::Stopped => event::Kind::NodeStopped(NodeStopped { node: Some(node) }),
        PortNodeState::Terminated => {
            event::Kind::NodeTerminated(NodeTerminated { node: Some(node) })
        }
        PortNodeState::PoweringOff => {
            event::Kind::NodePoweringOff(NodePoweringOff { node: Some(node) })
        }
        PortNodeState::PoweredOff => {
            event::Kind::NodePoweredOff(NodePoweredOff { node: Some(node) })
        }
        _ => event::Kind::NodeStarting(NodeStarting { node: Some(node) }),
    }
}

fn bundle_change(held: &mut Model, bundle_id: &str, kinds: &mut Vec<event::Kind>) {
    match rebuild_bundle(held, bundle_id) {
        Some(b) if held.bundles.get(bundle_id) != Some(&b) => {
            held.bundles.insert(bundle_id.to_owned(), b.clone());
            kinds.push(event::Kind::BundleUpdated(BundleUpdated {
                bundle: Some(b),
            }));
        }
        Some(_) => {}
        None => {
            if held.bundles.remove(bundle_id).is_some() {
                kinds.push(event::Kind::BundleDeleted(BundleDeleted {
                    bundle_id: bundle_id.to_owned(),
                }));
            }
        }
    }
}

/// Our extension's answer to a migration call, as the port's.
fn migration_answer(
    r: Result<ext::MigrationResponse, crate::ClientError>,
) -> Result<MigrationResponse, Status> {
    let r = r.map_err(status_of)?;
    let rejection_reason = match ext::TargetRejection::try_from(r.rejection) {
        Ok(ext::TargetRejection::NodeNotReady) => RejectionReason::NodeNotReady,
        _ => RejectionReason::Unspecified,
    };
    Ok(MigrationResponse {
        migration: r.migration.as_ref().map(port_migration),
        target_rejected: r.target_rejected,
        rejection_reason: rejection_reason as i32,
        message: r.message,
    })
}

fn answer<T>(r: Result<T, Status>) -> Result<Response<T>, Status> {
    r.map(Response::new)
}

impl ManagerPort for PublishedPort {
    fn create_node(&self, req: Request<CreateNodeRequest>) -> PortFuture<'_, CreateNodeResponse> {
        Box::pin(async move { answer(self.create_node(req.into_inner()).await) })
    }
    fn terminate_node(
        &self,
        req: Request<TerminateNodeRequest>,
    ) -> PortFuture<'_, TerminateNodeResponse> {
        Box::pin(async move { answer(self.terminate_node(req.into_inner()).await) })
    }
    fn stop_node(&self, req: Request<StopNodeRequest>) -> PortFuture<'_, StopNodeResponse> {
        Box::pin(async move { answer(self.power(req.into_inner().node_id, false).await) })
    }
    fn start_node(&self, req: Request<StartNodeRequest>) -> PortFuture<'_, StartNodeResponse> {
        Box::pin(async move {
            answer(
                self.power(req.into_inner().node_id, true)
                    .await
                    .map(|r| StartNodeResponse { node: r.node }),
            )
        })
    }
    fn list_nodes(&self, req: Request<ListNodesRequest>) -> PortFuture<'_, ListNodesResponse> {
        let pool = req.into_inner().pool;
        Box::pin(async move {
            let nodes = self
                .model()
                .nodes
                .into_values()
                .filter(|n| pool.is_empty() || n.pool == pool)
                .collect();
            Ok(Response::new(ListNodesResponse { nodes }))
        })
    }
    fn list_pools(&self, _req: Request<ListPoolsRequest>) -> PortFuture<'_, ListPoolsResponse> {
        Box::pin(async move {
            Ok(Response::new(ListPoolsResponse {
                pools: self.catalog.pools(),
            }))
        })
    }
    fn register_bundle(
        &self,
        req: Request<RegisterBundleRequest>,
    ) -> PortFuture<'_, RegisterBundleResponse> {
        Box::pin(async move { answer(self.register_bundle(req.into_inner(), false).await) })
    }
    fn update_bundle(
        &self,
        req: Request<RegisterBundleRequest>,
    ) -> PortFuture<'_, RegisterBundleResponse> {
        Box::pin(async move { answer(self.register_bundle(req.into_inner(), true).await) })
    }
    fn delete_bundle(
        &self,
        req: Request<DeleteBundleRequest>,
    ) -> PortFuture<'_, DeleteBundleResponse> {
        Box::pin(async move { answer(self.delete_bundle(req.into_inner()).await) })
    }
    fn start_job(&self, req: Request<StartJobRequest>) -> PortFuture<'_, StartJobResponse> {
        Box::pin(async move { answer(self.start_job(req.into_inner()).await) })
    }
    fn stop_job(&self, req: Request<StopJobRequest>) -> PortFuture<'_, StopJobResponse> {
        Box::pin(async move { answer(self.stop_job(req.into_inner()).await) })
    }
    fn update_job_config(
        &self,
        req: Request<UpdateJobConfigRequest>,
    ) -> PortFuture<'_, UpdateJobConfigResponse> {
        Box::pin(async move { answer(self.update_job_config(req.into_inner()).await) })
    }
    fn migration_get_state(
        &self,
        req: Request<NodeControllerMigrationGetState>,
    ) -> PortFuture<'_, MigrationResponse> {
        Box::pin(async move { answer(self.migration_get_state(req.into_inner()).await) })
    }
    fn migration_prepare_target(
        &self,
        req: Request<NodeControllerMigrationPrepareTarget>,
    ) -> PortFuture<'_, MigrationResponse> {
        Box::pin(async move { answer(self.migration_prepare_target(req.into_inner()).await) })
    }
    fn migration_cutover(
        &self,
        req: Request<NodeControllerMigrationCutover>,
    ) -> PortFuture<'_, MigrationResponse> {
        let r = req.into_inner();
        Box::pin(async move {
            self.handshake()?;
            let sent = ext::MigrationCutoverRequest {
                migration_id: r.migration_id,
                payload: r.payload,
            };
            answer(migration_answer(
                self.client.ext_migration_cutover(sent).await,
            ))
        })
    }
    fn migration_abort(
        &self,
        req: Request<NodeControllerMigrationAbort>,
    ) -> PortFuture<'_, MigrationResponse> {
        let r = req.into_inner();
        Box::pin(async move {
            self.handshake()?;
            let sent = ext::MigrationAbortRequest {
                migration_id: r.migration_id,
                reason: r.reason,
            };
            answer(migration_answer(
                self.client.ext_migration_abort(sent).await,
            ))
        })
    }
    fn features(&self) -> crate::ManagerFeatures {
        let served = self.client.extension_features();
        crate::ManagerFeatures {
            warm_nodes: served.contains(feature::WARM_NODES),
            migration_handshake: served.contains(feature::MIGRATION_HANDSHAKE),
        }
    }
    fn watch(&self, req: Request<WatchRequest>) -> PortFuture<'_, WatchStream> {
        let stream = self.watch_stream(req.into_inner());
        Box::pin(async move { Ok(Response::new(stream)) })
    }
}
