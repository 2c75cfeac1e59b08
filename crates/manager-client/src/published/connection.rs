//! A connection to Manager's published API: the calls, and one task that keeps the
//! [`PublishedMirror`] from `EventStream`.
//!
//! The published stream has no heartbeat and no resume, so:
//! - every (re)connect reads a whole snapshot (closed by `InitialDataComplete`) into a
//!   [`SnapshotBuilder`] and replaces the mirror with it, publishing only the differences;
//! - a dead stream is found two ways: HTTP/2 keepalive pings on the channel (a peer or path
//!   that died), and a stream that stays silent past [`PublishedConfig::echo_deadline`] after a
//!   change this client asked for was accepted (Manager reports every outcome on the stream, so
//!   an accepted change with no event after it means the stream no longer delivers). Either way
//!   the stream is reopened with backoff and the new snapshot reconciles the mirror.
//!
//! Our extension (`automanager.manager.extension.v1`) is probed on every connect: `Describe`
//! names the features the Manager serves, and `UNIMPLEMENTED` means it has none (standard
//! mode). With it, the connection also opens the extension's `Watch`, and is ready only once
//! both snapshots are whole; the two streams live and die together, so a reconnect re-reads both
//! and [`PublishedChange::Resynced`] follows the differences of both.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use manager_proto::api::common::{JobId, NodeId};
use manager_proto::api::manager::manager_client::ManagerClient as GrpcClient;
use manager_proto::api::manager::{
    CreateAwsNodeRequest, CreateOciNodeRequest, CurrentJob, EventStreamRequest, Job,
    JobSearchRequest, StartJobRequest, StopJobRequest,
};
use manager_proto::extension::manager_extension_client::ManagerExtensionClient;
use manager_proto::extension::{
    DescribeRequest, MigrationAbortRequest, MigrationCutoverRequest, MigrationGetStateRequest,
    MigrationPrepareTargetRequest, MigrationResponse, NodePower, StartNodeRequest, StopNodeRequest,
    WatchRequest,
};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::extension::ExtensionMirror;
use super::mirror::{PublishedChange, PublishedMirror, SnapshotBuilder, SnapshotStep};
use crate::client::{AuthInterceptor, backoff_delay, build_channel};
use crate::{ClientConfig, ClientError, ConnectionState};

/// How a [`PublishedClient`] connects and when it gives up on a stream.
#[derive(Debug, Clone)]
pub struct PublishedConfig {
    /// Endpoint, token, TLS, connect and call timeouts, backoff and message size, as for
    /// [`crate::ManagerClient`] (its heartbeat settings do not apply: this API has none).
    pub connection: ClientConfig,
    /// `EventStreamRequest.pending_window_s`: jobs whose start is further ahead are reported
    /// out of window (default 60).
    pub pending_window_s: i32,
    /// How long a stream may take to send its snapshot's `InitialDataComplete` (default 30 s).
    pub snapshot_timeout: Duration,
    /// How long the stream may stay silent after a change this client asked for was accepted
    /// before it counts as dead (default 10 s).
    pub echo_deadline: Duration,
}

impl PublishedConfig {
    /// Defaults for `endpoint`.
    pub fn new(endpoint: impl Into<String>) -> Self {
        PublishedConfig {
            connection: ClientConfig::new(endpoint),
            pending_window_s: 60,
            snapshot_timeout: Duration::from_secs(30),
            echo_deadline: Duration::from_secs(10),
        }
    }

    fn problem(&self) -> Option<String> {
        let c = &self.connection;
        if c.endpoint.is_empty() {
            return Some("endpoint is empty".to_owned());
        }
        if c.backoff_initial.is_zero() || c.backoff_max < c.backoff_initial {
            return Some("backoff_initial must be > 0 and <= backoff_max".to_owned());
        }
        if self.pending_window_s < 0 {
            return Some(format!(
                "pending_window_s must be >= 0, not {}",
                self.pending_window_s
            ));
        }
        if self.snapshot_timeout.is_zero() || self.echo_deadline.is_zero() {
            return Some("snapshot_timeout and echo_deadline must be > 0".to_owned());
        }
        None
    }
}

/// What the connection has seen, for metrics and tests.
#[derive(Debug, Default)]
pub struct StreamCounters {
    /// Streams opened.
    pub streams_opened: AtomicU64,
    /// Snapshots completed (the first and every reconnect's).
    pub snapshots: AtomicU64,
    /// Streams given up as silent after an accepted change.
    pub silent_streams: AtomicU64,
    /// Events refused as malformed.
    pub malformed_events: AtomicU64,
}

type Grpc = GrpcClient<InterceptedService<Channel, AuthInterceptor>>;
type ExtGrpc = ManagerExtensionClient<InterceptedService<Channel, AuthInterceptor>>;

struct Shared {
    rpc: Grpc,
    /// Our extension's calls, on the same channel.
    ext_rpc: ExtGrpc,
    /// What our extension's Watch has told (empty features: none served).
    extension: RwLock<ExtensionMirror>,
    config: PublishedConfig,
    mirror: RwLock<PublishedMirror>,
    state: watch::Sender<ConnectionState>,
    changes: broadcast::Sender<PublishedChange>,
    stop: watch::Sender<bool>,
    /// When an event must have arrived by, after an accepted change (the earliest such time).
    echo_due: Mutex<Option<Instant>>,
    /// Wakes the stream task to read a newly armed `echo_due` (a permit is kept if it is busy).
    echo_armed: tokio::sync::Notify,
    /// Events received on any stream (the echo check reads it).
    events_seen: AtomicU64,
    counters: StreamCounters,
}

/// A client of Manager's published API with its mirror (see the module docs).
pub struct PublishedClient {
    shared: Arc<Shared>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl PublishedClient {
    /// Validates `config` and starts the stream task. Returns at once; [`Self::wait_ready`]
    /// waits for the first snapshot. Must be called inside a tokio runtime.
    pub fn connect(config: PublishedConfig) -> Result<PublishedClient, ClientError> {
        if let Some(problem) = config.problem() {
            return Err(ClientError::Config(problem));
        }
        let c = &config.connection;
        let channel = build_channel(c)?;
        let auth = AuthInterceptor::new(c.token.as_deref())?;
        let rpc = GrpcClient::with_interceptor(channel.clone(), auth.clone())
            .max_decoding_message_size(c.max_message_bytes)
            .max_encoding_message_size(c.max_message_bytes);
        let ext_rpc = ManagerExtensionClient::with_interceptor(channel, auth)
            .max_decoding_message_size(c.max_message_bytes)
            .max_encoding_message_size(c.max_message_bytes);
        let (state, _) = watch::channel(ConnectionState::Idle);
        let (changes, _) = broadcast::channel(c.change_buffer.max(1));
        let (stop, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            rpc,
            ext_rpc,
            extension: RwLock::new(ExtensionMirror::default()),
            config,
            mirror: RwLock::new(PublishedMirror::default()),
            state,
            changes,
            stop,
            echo_due: Mutex::new(None),
            echo_armed: tokio::sync::Notify::new(),
            events_seen: AtomicU64::new(0),
            counters: StreamCounters::default(),
        });
        let task = tokio::spawn(run(Arc::clone(&shared)));
        Ok(PublishedClient {
            shared,
            task: Mutex::new(Some(task)),
        })
    }

    /// Waits until the mirror holds a whole snapshot and the stream is live.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), ClientError> {
        let mut rx = self.shared.state.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|s| *s == ConnectionState::Ready))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
            .map(|_| ())
            .map_err(|_| ClientError::Closed)
    }

    /// The connection state, as it changes.
    pub fn state(&self) -> watch::Receiver<ConnectionState> {
        self.shared.state.subscribe()
    }

    /// Changes to the mirror, in order; a receiver that lags should re-read the mirror.
    pub fn subscribe(&self) -> broadcast::Receiver<PublishedChange> {
        self.shared.changes.subscribe()
    }

    /// Reads the mirror.
    pub fn with_mirror<T>(&self, read: impl FnOnce(&PublishedMirror) -> T) -> T {
        let m = self
            .shared
            .mirror
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        read(&m)
    }

    /// Reads what our extension's Watch has told (and which features the Manager serves).
    pub fn with_extension<T>(&self, read: impl FnOnce(&ExtensionMirror) -> T) -> T {
        let m = self
            .shared
            .extension
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        read(&m)
    }

    /// The features of our extension the Manager said it serves at the last connect (empty:
    /// standard mode).
    pub fn extension_features(&self) -> BTreeSet<String> {
        self.with_extension(|m| m.features.clone())
    }

    /// Our extension's StopNode: a running, empty node powers off and is kept.
    pub async fn ext_stop_node(&self, node_id: &str) -> Result<NodePower, ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.ext_rpc.clone();
        let req = StopNodeRequest {
            node_id: Some(NodeId {
                node_id: node_id.to_owned(),
            }),
        };
        let r = self.call(c.stop_node(self.request(req))).await?;
        self.expect_echo(before);
        Ok(r.node.unwrap_or_default())
    }

    /// Our extension's StartNode: a powered-off node starts again.
    pub async fn ext_start_node(&self, node_id: &str) -> Result<NodePower, ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.ext_rpc.clone();
        let req = StartNodeRequest {
            node_id: Some(NodeId {
                node_id: node_id.to_owned(),
            }),
        };
        let r = self.call(c.start_node(self.request(req))).await?;
        self.expect_echo(before);
        Ok(r.node.unwrap_or_default())
    }

    /// Our extension's MigrationGetState (the propose).
    pub async fn ext_migration_get_state(
        &self,
        req: MigrationGetStateRequest,
    ) -> Result<MigrationResponse, ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.ext_rpc.clone();
        let r = self.call(c.migration_get_state(self.request(req))).await?;
        self.expect_echo(before);
        Ok(r)
    }

    /// Our extension's MigrationPrepareTarget.
    pub async fn ext_migration_prepare_target(
        &self,
        req: MigrationPrepareTargetRequest,
    ) -> Result<MigrationResponse, ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.ext_rpc.clone();
        let r = self
            .call(c.migration_prepare_target(self.request(req)))
            .await?;
        self.expect_echo(before);
        Ok(r)
    }

    /// Our extension's MigrationCutover.
    pub async fn ext_migration_cutover(
        &self,
        req: MigrationCutoverRequest,
    ) -> Result<MigrationResponse, ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.ext_rpc.clone();
        let r = self.call(c.migration_cutover(self.request(req))).await?;
        self.expect_echo(before);
        Ok(r)
    }

    /// Our extension's MigrationAbort.
    pub async fn ext_migration_abort(
        &self,
        req: MigrationAbortRequest,
    ) -> Result<MigrationResponse, ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.ext_rpc.clone();
        let r = self.call(c.migration_abort(self.request(req))).await?;
        self.expect_echo(before);
        Ok(r)
    }

    /// What the stream task has counted.
    pub fn counters(&self) -> &StreamCounters {
        &self.shared.counters
    }

    /// CreateJob: stores a job definition; answers its hash.
    pub async fn create_job(&self, job: Job) -> Result<i64, ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.rpc.clone();
        let r = self.call(c.create_job(self.request(job))).await?;
        self.expect_echo(before);
        Ok(r.hash)
    }

    /// UpdateJob: replaces a stored job definition; answers its hash.
    pub async fn update_job(&self, job: Job) -> Result<i64, ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.rpc.clone();
        let r = self.call(c.update_job(self.request(job))).await?;
        self.expect_echo(before);
        Ok(r.hash)
    }

    /// DeleteJob.
    pub async fn delete_job(&self, job_id: &str) -> Result<(), ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.rpc.clone();
        let id = JobId {
            job_id: job_id.to_owned(),
        };
        self.call(c.delete_job(self.request(id))).await?;
        self.expect_echo(before);
        Ok(())
    }

    /// StartJob: an instance of a stored job on `node_id` under `role`.
    pub async fn start_job(
        &self,
        job_id: &str,
        role: &str,
        node_id: &str,
    ) -> Result<(), ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.rpc.clone();
        let req = StartJobRequest {
            job_id: Some(JobId {
                job_id: job_id.to_owned(),
            }),
            role: role.to_owned(),
            node_id: Some(NodeId {
                node_id: node_id.to_owned(),
            }),
        };
        self.call(c.start_job(self.request(req))).await?;
        self.expect_echo(before);
        Ok(())
    }

    /// StopJob: the instance of `job_id` under `role` on `node_id`.
    pub async fn stop_job(
        &self,
        job_id: &str,
        role: &str,
        node_id: &str,
    ) -> Result<(), ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.rpc.clone();
        let req = StopJobRequest {
            job_id: Some(JobId {
                job_id: job_id.to_owned(),
            }),
            role: role.to_owned(),
            node_id: Some(NodeId {
                node_id: node_id.to_owned(),
            }),
        };
        self.call(c.stop_job(self.request(req))).await?;
        self.expect_echo(before);
        Ok(())
    }

    /// CompleteJob.
    pub async fn complete_job(&self, job_id: &str) -> Result<(), ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.rpc.clone();
        let id = JobId {
            job_id: job_id.to_owned(),
        };
        self.call(c.complete_job(self.request(id))).await?;
        self.expect_echo(before);
        Ok(())
    }

    /// CreateAwsNode under the id in the request.
    pub async fn create_aws_node(&self, req: CreateAwsNodeRequest) -> Result<(), ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.rpc.clone();
        self.call(c.create_aws_node(self.request(req))).await?;
        self.expect_echo(before);
        Ok(())
    }

    /// CreateOciNode under the id in the request.
    pub async fn create_oci_node(&self, req: CreateOciNodeRequest) -> Result<(), ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.rpc.clone();
        self.call(c.create_oci_node(self.request(req))).await?;
        self.expect_echo(before);
        Ok(())
    }

    /// TerminateNode.
    pub async fn terminate_node(&self, node_id: &str) -> Result<(), ClientError> {
        let before = self.events_seen();
        let mut c = self.shared.rpc.clone();
        let id = NodeId {
            node_id: node_id.to_owned(),
        };
        self.call(c.terminate_node(self.request(id))).await?;
        self.expect_echo(before);
        Ok(())
    }

    /// JobSearch: every job matching all of `req`'s filters, with its running instances.
    pub async fn job_search(&self, req: JobSearchRequest) -> Result<Vec<CurrentJob>, ClientError> {
        let mut c = self.shared.rpc.clone();
        let timeout = self.shared.config.connection.request_timeout;
        let collect = async {
            let mut stream = c.job_search(self.request(req)).await?.into_inner();
            let mut out = Vec::new();
            while let Some(job) = stream.message().await? {
                out.push(job);
            }
            Ok::<_, tonic::Status>(out)
        };
        tokio::time::timeout(timeout, collect)
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
            .map_err(ClientError::from)
    }

    /// Stops the stream task; idempotent.
    pub async fn close(&self) {
        let _ = self.shared.stop.send(true);
        let task = self
            .task
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(task) = task {
            let _ = task.await;
        }
        self.shared.state.send_replace(ConnectionState::Shutdown);
    }

    fn request<T>(&self, msg: T) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        r.set_timeout(self.shared.config.connection.request_timeout);
        r
    }

    async fn call<T>(
        &self,
        fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, ClientError> {
        let timeout = self.shared.config.connection.request_timeout;
        tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
            .map(tonic::Response::into_inner)
            .map_err(ClientError::from)
    }

    /// Manager accepted a change: its outcome must reach the stream by the echo deadline.
    fn events_seen(&self) -> u64 {
        self.shared.events_seen.load(Ordering::Acquire)
    }

    /// After an accepted change, expects an event within the echo deadline. An event that
    /// arrived since the call began (`before`) already shows the stream delivers — it may even
    /// be this change's own, sent before the answer — so nothing is armed then.
    fn expect_echo(&self, before: u64) {
        if self.events_seen() != before {
            return;
        }
        let due = Instant::now() + self.shared.config.echo_deadline;
        let mut echo = self
            .shared
            .echo_due
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if echo.is_none_or(|d| due < d) {
            *echo = Some(due);
            self.shared.echo_armed.notify_one();
        }
    }
}

impl Drop for PublishedClient {
    fn drop(&mut self) {
        let _ = self.shared.stop.send(true);
    }
}

/// Why one stream ended.
enum Ended {
    Stopped,
    Failed(String),
}

async fn run(shared: Arc<Shared>) {
    let mut stop = shared.stop.subscribe();
    let mut attempt = 0u32;
    loop {
        if *stop.borrow() {
            return;
        }
        shared.state.send_replace(ConnectionState::Connecting);
        match one_stream(&shared, &mut stop, &mut attempt).await {
            Ended::Stopped => return,
            Ended::Failed(why) => {
                tracing::warn!(reason = %why, attempt, "manager event stream ended; reconnecting");
            }
        }
        shared.state.send_replace(ConnectionState::TransientFailure);
        let c = &shared.config.connection;
        let delay = backoff_delay(c.backoff_initial, c.backoff_max, attempt, &mut rand::rng());
        attempt = attempt.saturating_add(1);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Probes our extension (`None`: not served), with the features it names.
async fn describe(shared: &Shared) -> Result<Option<BTreeSet<String>>, tonic::Status> {
    let mut ext = shared.ext_rpc.clone();
    match ext.describe(DescribeRequest {}).await {
        Ok(r) => Ok(Some(r.into_inner().features.into_iter().collect())),
        Err(s) if s.code() == tonic::Code::Unimplemented => Ok(None),
        Err(s) => Err(s),
    }
}

/// One message of either stream.
enum Next {
    Published(Option<Result<manager_proto::api::manager::EventStreamEvent, tonic::Status>>),
    Extension(Option<Result<manager_proto::extension::WatchEvent, tonic::Status>>),
}

/// Probes our extension, opens the published stream (and the extension's Watch when it is
/// served), reads both snapshots into fresh mirrors, replaces the shared ones, then applies
/// live events until either stream ends, goes silent after an accepted change, or `stop`.
async fn one_stream(shared: &Shared, stop: &mut watch::Receiver<bool>, attempt: &mut u32) -> Ended {
    shared
        .counters
        .streams_opened
        .fetch_add(1, Ordering::Relaxed);
    let snapshot_due = Instant::now() + shared.config.snapshot_timeout;
    let probed = tokio::select! {
        r = tokio::time::timeout_at(snapshot_due, describe(shared)) => r,
        _ = stop.changed() => return Ended::Stopped,
    };
    let features = match probed {
        Err(_) => return Ended::Failed("no answer to Describe in time".to_owned()),
        Ok(Err(status)) => return Ended::Failed(format!("Describe failed: {status}")),
        Ok(Ok(features)) => features,
    };
    let req = EventStreamRequest {
        pending_window_s: shared.config.pending_window_s,
    };
    let mut rpc = shared.rpc.clone();
    let open = tokio::select! {
        r = tokio::time::timeout_at(snapshot_due, rpc.event_stream(req)) => r,
        _ = stop.changed() => return Ended::Stopped,
    };
    let mut stream = match open {
        Err(_) => return Ended::Failed("no answer to EventStream in time".to_owned()),
        Ok(Err(status)) => return Ended::Failed(format!("EventStream refused: {status}")),
        Ok(Ok(r)) => r.into_inner(),
    };
    let mut ext_local = ExtensionMirror::serving(features.clone().unwrap_or_default());
    let mut ext_stream = if features.is_some() {
        let mut ext = shared.ext_rpc.clone();
        let open = tokio::select! {
            r = tokio::time::timeout_at(snapshot_due, ext.watch(WatchRequest {})) => r,
            _ = stop.changed() => return Ended::Stopped,
        };
        match open {
            Err(_) => {
                return Ended::Failed("no answer to our extension's Watch in time".to_owned());
            }
            Ok(Err(status)) => {
                return Ended::Failed(format!("our extension's Watch refused: {status}"));
            }
            Ok(Ok(r)) => Some(r.into_inner()),
        }
    } else {
        // No extension: nothing to wait for on its side.
        ext_local.complete = true;
        None
    };
    let mut builder = Some(SnapshotBuilder::default());
    let mut published_local: Option<PublishedMirror> = None;
    let mut ready = false;
    loop {
        let due = if ready {
            *shared
                .echo_due
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        } else {
            Some(snapshot_due)
        };
        let silence = async {
            match due {
                Some(d) => tokio::time::sleep_until(d).await,
                None => futures::future::pending().await,
            }
        };
        let ext_next = async {
            match ext_stream.as_mut() {
                Some(s) => s.next().await,
                None => futures::future::pending().await,
            }
        };
        let next = tokio::select! {
            m = stream.next() => Next::Published(m),
            m = ext_next => Next::Extension(m),
            () = shared.echo_armed.notified() => continue,
            () = silence => {
                if !ready {
                    return Ended::Failed("no whole snapshot in time".to_owned());
                }
                shared.counters.silent_streams.fetch_add(1, Ordering::Relaxed);
                clear_echo(shared);
                return Ended::Failed("silent after an accepted change".to_owned());
            }
            _ = stop.changed() => return Ended::Stopped,
        };
        match next {
            Next::Published(None) => return Ended::Failed("Manager closed the stream".to_owned()),
            Next::Published(Some(Err(status))) => {
                return Ended::Failed(format!("stream error: {status}"));
            }
            Next::Extension(None) => {
                return Ended::Failed("Manager closed our extension's Watch".to_owned());
            }
            Next::Extension(Some(Err(status))) => {
                return Ended::Failed(format!("our extension's Watch failed: {status}"));
            }
            Next::Published(Some(Ok(event))) => {
                seen(shared);
                if let Some(b) = builder.as_mut() {
                    if let SnapshotStep::Complete(next) = b.push(event) {
                        count_malformed(shared, b.malformed().len());
                        builder = None;
                        published_local = Some(next);
                    }
                } else if let Some(local) = published_local.as_mut() {
                    // The published snapshot is whole, our extension's not yet: keep it current.
                    if local.apply(event).is_err() {
                        count_malformed(shared, 1);
                    }
                } else {
                    apply_published(shared, event);
                }
            }
            Next::Extension(Some(Ok(event))) => {
                seen(shared);
                let applied = if ready {
                    shared
                        .extension
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .apply(event)
                } else {
                    ext_local.apply(event)
                };
                match applied {
                    Ok(changes) => publish(shared, changes),
                    Err(why) => {
                        count_malformed(shared, 1);
                        tracing::warn!(reason = %why, "an extension event the mirror could not use");
                    }
                }
            }
        }
        if !ready
            && ext_local.complete
            && let Some(next) = published_local.take()
        {
            let changes = shared
                .mirror
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .replace(next);
            let ext_changes = shared
                .extension
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .replace(std::mem::take(&mut ext_local));
            tracing::info!(
                changes = changes.len() + ext_changes.len(),
                extension = features.is_some(),
                "manager snapshot read"
            );
            // Counted after its changes are sent, so a reader that sees the count sees them.
            publish(shared, changes);
            publish(shared, ext_changes);
            let _ = shared.changes.send(PublishedChange::Resynced);
            shared.counters.snapshots.fetch_add(1, Ordering::Release);
            *attempt = 0;
            ready = true;
            shared.state.send_replace(ConnectionState::Ready);
        }
    }
}

fn seen(shared: &Shared) {
    shared.events_seen.fetch_add(1, Ordering::AcqRel);
    clear_echo(shared);
}

fn count_malformed(shared: &Shared, n: usize) {
    if n > 0 {
        shared
            .counters
            .malformed_events
            .fetch_add(n as u64, Ordering::Relaxed);
        tracing::warn!(
            malformed = n,
            "events Manager sent that the mirror could not use"
        );
    }
}

/// A live published event: applied to the shared mirror, its changes published.
fn apply_published(shared: &Shared, event: manager_proto::api::manager::EventStreamEvent) {
    let applied = {
        let mut m = shared
            .mirror
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        m.apply(event)
    };
    match applied {
        Ok(changes) => {
            for c in &changes {
                if let PublishedChange::NodeRemoved(n) = c {
                    shared
                        .extension
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .node_gone(&n.node_id);
                }
            }
            publish(shared, changes);
        }
        Err(why) => {
            count_malformed(shared, 1);
            tracing::warn!(reason = %why, "an event Manager sent that the mirror could not use");
        }
    }
}

fn clear_echo(shared: &Shared) {
    *shared
        .echo_due
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
}

fn publish(shared: &Shared, changes: Vec<PublishedChange>) {
    for c in changes {
        // No receiver is fine: readers may use the mirror alone.
        let _ = shared.changes.send(c);
    }
}
