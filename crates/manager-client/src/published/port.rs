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
//! - **What 1.0.384 lacks** (warm nodes, the migration handshake) answers `UNIMPLEMENTED` with
//!   the reason, which the controllers treat as "this Manager cannot".

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use manager_proto::api::common::NodeId;
use manager_proto::api::manager::{AwsLaunchTemplate, CreateAwsNodeRequest, CreateOciNodeRequest};
use manager_proto::{
    Bundle, BundleDeleted, BundleUpdated, CreateNodeRequest, CreateNodeResponse,
    DeleteBundleRequest, DeleteBundleResponse, Event, EventBatch, Heartbeat, Job, JobRemoved,
    JobUpdated, ListNodesRequest, ListNodesResponse, ListPoolsRequest, ListPoolsResponse,
    MigrationResponse, Node, NodeControllerMigrationAbort, NodeControllerMigrationCutover,
    NodeControllerMigrationGetState, NodeControllerMigrationPrepareTarget, NodeStarted,
    NodeStarting, NodeState as PortNodeState, NodeStopped, NodeTerminated, ProviderKind,
    RegisterBundleRequest, RegisterBundleResponse, Snapshot, SnapshotReason, StartJobRequest,
    StartJobResponse, StartNodeRequest, StartNodeResponse, StopJobRequest, StopJobResponse,
    StopNodeRequest, StopNodeResponse, StopReason, Synced, TerminateNodeRequest,
    TerminateNodeResponse, UpdateJobConfigRequest, UpdateJobConfigResponse, WatchRequest,
    WatchResponse, event, watch_response,
};
use tokio::sync::{broadcast, mpsc};
use tonic::{Request, Response, Status};

use super::catalog::{PoolCatalog, ZoneLaunch};
use super::connection::PublishedClient;
use super::mirror::{PublishedChange, PublishedMirror};
use super::tags;
use super::translate::{
    self, StopOverlay, bundle_from_jobs, gone_node, node_is_ours, port_job, port_node,
    published_role, stored_job,
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
    bundles: BTreeMap<String, Bundle>,
}

/// Manager's published API as the operator's port (see the module docs).
pub struct PublishedPort {
    client: Arc<PublishedClient>,
    catalog: PoolCatalog,
    owner: String,
    epoch: String,
    revision: Arc<AtomicU64>,
    overlay: Arc<Mutex<StopOverlay>>,
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
            echo_wait: Duration::from_secs(2),
        }
    }

    /// The published client below this port.
    pub fn client(&self) -> &Arc<PublishedClient> {
        &self.client
    }

    fn model(&self) -> Model {
        read_model(&self.client, &self.catalog, &self.owner, &self.overlay)
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
            return Err(Status::failed_precondition(format!(
                "node {} is a physical node: it is not Manager's to terminate",
                req.node_id
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
                let stored = stored_job(&bundle, replica, job, &self.owner);
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
                            && cur.description == stored.description => {}
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
        self.client
            .start_job(&req.job_id, role_name, &req.node_id)
            .await
            .map_err(status_of)?;
        let (job_id, node_id) = (req.job_id.clone(), req.node_id.clone());
        let model = self
            .settle(|m| {
                m.jobs.get(&job_id).is_some_and(|j| {
                    j.instances.iter().any(|i| {
                        i.node_id == node_id
                            && i.role == role as i32
                            && (i.state == manager_proto::JobState::Starting as i32
                                || i.state == manager_proto::JobState::Running as i32)
                    })
                })
            })
            .await;
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

    fn watch_stream(&self, req: WatchRequest) -> WatchStream {
        let (tx, rx) = mpsc::channel(64);
        let feed = Feed {
            client: Arc::clone(&self.client),
            catalog: self.catalog.clone(),
            owner: self.owner.clone(),
            epoch: self.epoch.clone(),
            revision: Arc::clone(&self.revision),
            overlay: Arc::clone(&self.overlay),
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
    catalog.read(|catalog| client.with_mirror(|m| model_of(m, owner, catalog, &overlay)))
}

/// Everything ours in `m`, as the port models it.
fn model_of(
    m: &PublishedMirror,
    owner: &str,
    catalog: &BTreeMap<String, super::catalog::CatalogPool>,
    overlay: &StopOverlay,
) -> Model {
    let mut model = Model::default();
    for view in m.nodes.values() {
        if node_is_ours(view, owner, catalog) {
            model
                .nodes
                .insert(view.node_id.clone(), port_node(view, catalog));
        }
    }
    for view in m.jobs.values() {
        if let Some(job) = port_job(view, owner, overlay) {
            model
                .job_tags
                .insert(job.job_id.clone(), view.tags().clone());
            model.jobs.insert(job.job_id.clone(), job);
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
    bundle_from_jobs(
        bundle_id,
        model
            .jobs
            .values()
            .filter(|j| j.bundle_id == bundle_id)
            .map(|j| (j, model.job_tags.get(&j.job_id).unwrap_or(&empty))),
    )
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
}

type Sink = mpsc::Sender<Result<WatchResponse, Status>>;

impl Feed {
    fn model(&self) -> Model {
        read_model(&self.client, &self.catalog, &self.owner, &self.overlay)
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
            migrations: Vec::new(),
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

    /// The port events that say what `change` changed in `held` (updated to match).
    fn translate(&self, held: &mut Model, change: &PublishedChange) -> Vec<Event> {
        let mut kinds = Vec::new();
        match change {
            PublishedChange::NodeUpserted(view) => {
                let node = self.catalog.read(|catalog| {
                    node_is_ours(view, &self.owner, catalog).then(|| port_node(view, catalog))
                });
                if let Some(node) = node
                    && held.nodes.get(&node.node_id) != Some(&node)
                {
                    held.nodes.insert(node.node_id.clone(), node.clone());
                    kinds.push(node_event(node));
                }
            }
            PublishedChange::NodeRemoved(view) => {
                if let Some(last) = held.nodes.remove(&view.node_id) {
                    let gone = gone_node(last);
                    kinds.push(event::Kind::NodeTerminated(NodeTerminated {
                        node: Some(gone),
                    }));
                }
            }
            PublishedChange::JobUpserted(view) => {
                let overlay = self
                    .overlay
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                if let Some(job) = port_job(view, &self.owner, &overlay)
                    && held.jobs.get(&job.job_id) != Some(&job)
                {
                    let bundle_id = job.bundle_id.clone();
                    held.job_tags
                        .insert(job.job_id.clone(), view.tags().clone());
                    held.jobs.insert(job.job_id.clone(), job.clone());
                    kinds.push(event::Kind::JobUpdated(JobUpdated { job: Some(job) }));
                    bundle_change(held, &bundle_id, &mut kinds);
                }
            }
            PublishedChange::JobRemoved(view) => {
                if let Some(job) = held.jobs.remove(view.job_id()) {
                    held.job_tags.remove(&job.job_id);
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
    fn stop_node(&self, _req: Request<StopNodeRequest>) -> PortFuture<'_, StopNodeResponse> {
        Box::pin(async { Err(needs_extension("StopNode (a warm spare)")) })
    }
    fn start_node(&self, _req: Request<StartNodeRequest>) -> PortFuture<'_, StartNodeResponse> {
        Box::pin(async { Err(needs_extension("StartNode (a warm spare)")) })
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
        _req: Request<NodeControllerMigrationGetState>,
    ) -> PortFuture<'_, MigrationResponse> {
        Box::pin(async { Err(needs_extension("the migration handshake")) })
    }
    fn migration_prepare_target(
        &self,
        _req: Request<NodeControllerMigrationPrepareTarget>,
    ) -> PortFuture<'_, MigrationResponse> {
        Box::pin(async { Err(needs_extension("the migration handshake")) })
    }
    fn migration_cutover(
        &self,
        _req: Request<NodeControllerMigrationCutover>,
    ) -> PortFuture<'_, MigrationResponse> {
        Box::pin(async { Err(needs_extension("the migration handshake")) })
    }
    fn migration_abort(
        &self,
        _req: Request<NodeControllerMigrationAbort>,
    ) -> PortFuture<'_, MigrationResponse> {
        Box::pin(async { Err(needs_extension("the migration handshake")) })
    }
    fn features(&self) -> crate::ManagerFeatures {
        crate::ManagerFeatures::STANDARD
    }
    fn watch(&self, req: Request<WatchRequest>) -> PortFuture<'_, WatchStream> {
        let stream = self.watch_stream(req.into_inner());
        Box::pin(async move { Ok(Response::new(stream)) })
    }
}
