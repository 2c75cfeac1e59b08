//! The connection: a lazily connected tonic channel, the Watch loop that
//! keeps the [`Mirror`] current (reconnect with backoff, resume, resync),
//! and the command methods.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use manager_proto::Pool;
use manager_proto::manager_client::ManagerClient as GrpcClient;
use manager_proto::{
    Bundle, CreateNodeRequest, DeleteBundleRequest, Job, JobRole, ListNodesRequest,
    ListPoolsRequest, Migration, MigrationStrategy, Node, NodeControllerMigrationAbort,
    NodeControllerMigrationCutover, NodeControllerMigrationGetState,
    NodeControllerMigrationPrepareTarget, RegisterBundleRequest, RegisterBundleResponse,
    RejectionReason, SnapshotReason, StartJobRequest, StartNodeRequest, StopJobRequest,
    StopNodeRequest, StopReason, TerminateNodeRequest, UpdateJobConfigRequest, WatchRequest,
    watch_response,
};
use rand::Rng;
use tokio::sync::{broadcast, watch};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::mirror::{Mirror, MirrorChange, SnapshotData};
use crate::port::{GrpcPort, ManagerPort};
use futures::StreamExt;

/// Errors of the client. Command errors keep the gRPC meaning so callers
/// can tell "fix the request" from "try again".
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClientError {
    /// The [`ClientConfig`] is unusable.
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// Manager refused the request as malformed.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The named object does not exist.
    #[error("not found: {0}")]
    NotFound(String),
    /// The id is already taken.
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// The request conflicts with Manager's current state.
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// Wrong or missing token.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// This process may not change anything now (it is not, or no longer surely, the leader).
    #[error("writes are fenced: {0}")]
    Fenced(String),
    /// Manager cannot be reached (retry later).
    #[error("manager unavailable: {0}")]
    Unavailable(String),
    /// No answer in time.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// A worker refused to start a job instance.
    #[error("job {job_id} rejected by node {node_id}: {}: {message}", reason.as_str_name())]
    Rejected {
        /// The job.
        job_id: String,
        /// The node that refused.
        node_id: String,
        /// Why.
        reason: RejectionReason,
        /// Detail.
        message: String,
    },
    /// [`ManagerClient::close`] was called.
    #[error("the client is closed")]
    Closed,
    /// Any other gRPC status.
    #[error("{code:?}: {message}")]
    Rpc {
        /// gRPC code.
        code: tonic::Code,
        /// Message.
        message: String,
    },
}

impl ClientError {
    /// True when repeating the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClientError::Unavailable(_) | ClientError::Timeout(_))
            || matches!(self, ClientError::Rpc { code, .. } if matches!(code, tonic::Code::ResourceExhausted | tonic::Code::Aborted | tonic::Code::Internal | tonic::Code::Unknown))
    }
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        let m = s.message().to_owned();
        match s.code() {
            tonic::Code::InvalidArgument | tonic::Code::OutOfRange => {
                ClientError::InvalidArgument(m)
            }
            tonic::Code::NotFound => ClientError::NotFound(m),
            tonic::Code::AlreadyExists => ClientError::AlreadyExists(m),
            tonic::Code::FailedPrecondition => ClientError::FailedPrecondition(m),
            tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                ClientError::Unauthenticated(m)
            }
            tonic::Code::Unavailable => ClientError::Unavailable(m),
            tonic::Code::DeadlineExceeded => ClientError::Timeout(Duration::ZERO),
            code => ClientError::Rpc { code, message: m },
        }
    }
}

/// TLS settings (PEM). Its `Debug` shows sizes, not the PEM bytes, so no key reaches a log.
#[derive(Clone, Default)]
pub struct TlsOptions {
    /// CA certificate(s) that sign Manager's certificate. Required: the
    /// workspace builds tonic without system or webpki roots.
    pub ca_pem: Vec<u8>,
    /// Name to verify in Manager's certificate (default: the endpoint host).
    pub domain: Option<String>,
    /// Client certificate and key for mutual TLS.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("ca_pem", &format_args!("<{} bytes>", self.ca_pem.len()))
            .field("domain", &self.domain)
            .field(
                "identity",
                &self
                    .identity
                    .as_ref()
                    .map(|_| format_args!("<certificate and key>")),
            )
            .finish()
    }
}

/// How to reach Manager. Its `Debug` never shows the token (nor, through [`TlsOptions`], a key).
#[derive(Clone)]
pub struct ClientConfig {
    /// `http://host:port` or `https://host:port`.
    pub endpoint: String,
    /// Bearer token sent on every call.
    pub token: Option<String>,
    /// TLS; required for `https://` endpoints.
    pub tls: Option<TlsOptions>,
    /// TCP + HTTP/2 connect timeout (default 5 s).
    pub connect_timeout: Duration,
    /// Deadline of each unary call (default 10 s).
    pub request_timeout: Duration,
    /// First reconnect delay cap (default 200 ms).
    pub backoff_initial: Duration,
    /// Largest reconnect delay cap (default 30 s).
    pub backoff_max: Duration,
    /// Change events buffered per subscriber before it lags (default 65536).
    pub change_buffer: usize,
    /// Largest message accepted from Manager (default 64 MiB).
    pub max_message_bytes: usize,
    /// How long a Watch may take from the call to its `Synced` (the snapshot or the resumed
    /// catch-up) before it counts as failed and is retried with backoff (default 30 s).
    pub sync_timeout: Duration,
    /// How often Manager is asked to send a heartbeat on a quiet stream (default 5 s; zero
    /// asks for none). 100 ms to 1 h.
    pub heartbeat_interval: Duration,
    /// The longest silence accepted on an open Watch stream before it counts as stalled and is
    /// retried with backoff (default 15 s). Longer than `heartbeat_interval`. A Manager that
    /// sends no heartbeats has its quiet streams reopened (resumed) this often.
    pub idle_timeout: Duration,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("endpoint", &self.endpoint)
            .field(
                "token",
                &self.token.as_ref().map(|_| format_args!("<redacted>")),
            )
            .field("tls", &self.tls)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("backoff_initial", &self.backoff_initial)
            .field("backoff_max", &self.backoff_max)
            .field("change_buffer", &self.change_buffer)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("sync_timeout", &self.sync_timeout)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

impl ClientConfig {
    /// Defaults for `endpoint`.
    pub fn new(endpoint: impl Into<String>) -> Self {
        ClientConfig {
            endpoint: endpoint.into(),
            token: None,
            tls: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(30),
            change_buffer: 65_536,
            max_message_bytes: 64 * 1024 * 1024,
            sync_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(15),
        }
    }

    /// Why the Watch deadlines cannot work together, if they cannot.
    fn deadline_problem(&self) -> Option<String> {
        let hb = self.heartbeat_interval;
        if self.sync_timeout.is_zero() {
            return Some("sync_timeout must be > 0".to_owned());
        }
        if !hb.is_zero() && !(HEARTBEAT_MIN..=HEARTBEAT_MAX).contains(&hb) {
            return Some(format!(
                "heartbeat_interval is {hb:?}: zero (none) or {HEARTBEAT_MIN:?} to {HEARTBEAT_MAX:?}"
            ));
        }
        if self.idle_timeout <= hb {
            return Some(format!(
                "idle_timeout ({:?}) must be longer than heartbeat_interval ({hb:?}), or every quiet stream is cut",
                self.idle_timeout
            ));
        }
        None
    }

    /// With a bearer token.
    #[must_use]
    pub fn with_token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// With TLS.
    #[must_use]
    pub fn with_tls(mut self, tls: TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }
}

/// The heartbeat intervals Manager accepts (`WatchRequest.heartbeat_interval_ms`).
const HEARTBEAT_MIN: Duration = Duration::from_millis(100);
const HEARTBEAT_MAX: Duration = Duration::from_secs(3600);

/// The connection state, as `@norskvideo/norsk-auto-manager` names it (`onConnectionStateChange`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionState {
    /// Created, not yet trying.
    Idle,
    /// Opening the Watch stream (or receiving its snapshot).
    Connecting,
    /// Synced and receiving events.
    Ready,
    /// The stream failed; waiting to reconnect.
    TransientFailure,
    /// Closed for good.
    Shutdown,
}

impl ConnectionState {
    /// The TypeScript library's spelling: `idle`, `connecting`, `ready`, `transientFailure`, `shutdown`.
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionState::Idle => "idle",
            ConnectionState::Connecting => "connecting",
            ConnectionState::Ready => "ready",
            ConnectionState::TransientFailure => "transientFailure",
            ConnectionState::Shutdown => "shutdown",
        }
    }
}

/// Adds the bearer token to every call.
#[derive(Debug, Clone)]
pub struct AuthInterceptor {
    header: Option<MetadataValue<Ascii>>,
}

impl AuthInterceptor {
    /// Sends `Bearer <token>` on every call, or nothing without a token.
    pub(crate) fn new(token: Option<&str>) -> Result<Self, ClientError> {
        let header = match token {
            Some(t) => Some(
                format!("Bearer {t}")
                    .parse::<MetadataValue<Ascii>>()
                    .map_err(|_| {
                        ClientError::Config(
                            "the token has characters not allowed in a header".to_owned(),
                        )
                    })?,
            ),
            None => None,
        };
        Ok(AuthInterceptor { header })
    }
}

impl Interceptor for AuthInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(h) = &self.header {
            req.metadata_mut().insert("authorization", h.clone());
        }
        Ok(req)
    }
}

type Rpc = Arc<dyn ManagerPort>;

/// Full-jitter exponential backoff: attempt n sleeps a uniform random time
/// in `[0, min(max, initial * 2^n)]`.
pub fn backoff_delay(
    initial: Duration,
    max: Duration,
    attempt: u32,
    rng: &mut impl Rng,
) -> Duration {
    let cap = initial
        .checked_mul(1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX))
        .unwrap_or(max)
        .min(max);
    let ms = u64::try_from(cap.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rng.random_range(0..=ms))
}

struct Shared {
    rpc: Rpc,
    mirror: Mirror,
    state: watch::Sender<ConnectionState>,
    changes: broadcast::Sender<MirrorChange>,
    stop: watch::Sender<bool>,
    last_error: Mutex<Option<String>>,
    /// Whether commands that change Manager's state may be sent now ([`ManagerClient::fence_writes`]).
    write_fence: Mutex<Option<WriteFence>>,
    /// Nodes this client asked Manager to terminate, newest last (bounded): a node that goes
    /// away without being among them was lost.
    terminations_asked: Mutex<std::collections::VecDeque<String>>,
    request_timeout: Duration,
    deadlines: StreamDeadlines,
}

/// How many TerminateNode requests [`ManagerClient::asked_to_terminate`] remembers.
const TERMINATIONS_REMEMBERED: usize = 8192;

/// The Watch stream's deadlines, from [`ClientConfig`].
#[derive(Clone, Copy)]
struct StreamDeadlines {
    sync: Duration,
    heartbeat: Duration,
    idle: Duration,
}

/// Answers whether state-changing commands may be sent now.
pub type WriteFence = Arc<dyn Fn() -> bool + Send + Sync>;

struct Inner {
    shared: Arc<Shared>,
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shared.stop.send_replace(true);
    }
}

/// A connection to Manager and the mirror it keeps. Cheap to clone; all
/// clones share one connection. Dropping the last clone stops the loop.
#[derive(Clone)]
pub struct ManagerClient {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ManagerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagerClient")
            .field("state", &*self.inner.shared.state.borrow())
            .field("revision", &self.inner.shared.mirror.revision())
            .finish()
    }
}

/// The settings every port shares: buffers, back-off and deadlines.
fn validate(config: &ClientConfig) -> Result<(), ClientError> {
    if config.change_buffer == 0 {
        return Err(ClientError::Config(
            "change_buffer must be at least 1".to_owned(),
        ));
    }
    if config.backoff_initial.is_zero() || config.backoff_max < config.backoff_initial {
        return Err(ClientError::Config(
            "backoff_initial must be > 0 and <= backoff_max".to_owned(),
        ));
    }
    match config.deadline_problem() {
        Some(problem) => Err(ClientError::Config(problem)),
        None => Ok(()),
    }
}

pub(crate) fn build_channel(cfg: &ClientConfig) -> Result<Channel, ClientError> {
    let bad = |e: &dyn std::fmt::Display| {
        ClientError::Config(format!("endpoint {:?}: {e}", cfg.endpoint))
    };
    let mut ep = Endpoint::from_shared(cfg.endpoint.clone())
        .map_err(|e| bad(&e))?
        .connect_timeout(cfg.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(20))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true);
    let https = cfg.endpoint.starts_with("https://");
    match (&cfg.tls, https) {
        (Some(tls), _) => {
            if tls.ca_pem.is_empty() {
                return Err(ClientError::Config("tls.ca_pem is required".to_owned()));
            }
            let mut t = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&tls.ca_pem));
            if let Some(d) = &tls.domain {
                t = t.domain_name(d.clone());
            }
            if let Some((cert, key)) = &tls.identity {
                t = t.identity(Identity::from_pem(cert, key));
            }
            ep = ep.tls_config(t).map_err(|e| bad(&e))?;
        }
        (None, true) => {
            return Err(ClientError::Config(
                "an https:// endpoint needs tls options".to_owned(),
            ));
        }
        (None, false) => {}
    }
    Ok(ep.connect_lazy())
}

impl ManagerClient {
    /// Validates the config, and starts the Watch loop in the background.
    /// Returns at once (state `connecting`); use [`ManagerClient::wait_ready`]
    /// to wait for the first sync. Must be called inside a tokio runtime.
    pub async fn connect(config: ClientConfig) -> Result<ManagerClient, ClientError> {
        validate(&config)?;
        let channel = build_channel(&config)?;
        let rpc =
            GrpcClient::with_interceptor(channel, AuthInterceptor::new(config.token.as_deref())?)
                .max_decoding_message_size(config.max_message_bytes)
                .max_encoding_message_size(config.max_message_bytes);
        Ok(ManagerClient::start(Arc::new(GrpcPort::new(rpc)), &config))
    }

    /// As [`ManagerClient::connect`], over any [`ManagerPort`] (an in-process Manager, another
    /// transport). `config`'s endpoint, token, TLS and message size belong to the gRPC port
    /// and are not read here; its timeouts, back-off and buffers are.
    pub fn over(
        port: Arc<dyn ManagerPort>,
        config: &ClientConfig,
    ) -> Result<ManagerClient, ClientError> {
        validate(config)?;
        Ok(ManagerClient::start(port, config))
    }

    fn start(rpc: Arc<dyn ManagerPort>, config: &ClientConfig) -> ManagerClient {
        let (changes, _) = broadcast::channel(config.change_buffer);
        let shared = Arc::new(Shared {
            rpc,
            mirror: Mirror::default(),
            state: watch::Sender::new(ConnectionState::Idle),
            changes,
            stop: watch::Sender::new(false),
            last_error: Mutex::new(None),
            write_fence: Mutex::new(None),
            terminations_asked: Mutex::new(std::collections::VecDeque::new()),
            request_timeout: config.request_timeout,
            deadlines: StreamDeadlines {
                sync: config.sync_timeout,
                heartbeat: config.heartbeat_interval,
                idle: config.idle_timeout,
            },
        });
        let task = tokio::spawn(watch_loop(
            shared.clone(),
            config.backoff_initial,
            config.backoff_max,
        ));
        ManagerClient {
            inner: Arc::new(Inner {
                shared,
                task: tokio::sync::Mutex::new(Some(task)),
            }),
        }
    }

    /// What the Manager behind this client can do beyond the common operations.
    pub fn features(&self) -> crate::ManagerFeatures {
        self.inner.shared.rpc.features()
    }

    /// The mirror (read handle).
    pub fn mirror(&self) -> &Mirror {
        &self.inner.shared.mirror
    }

    /// The connection state as a watch channel.
    pub fn state(&self) -> watch::Receiver<ConnectionState> {
        self.inner.shared.state.subscribe()
    }

    /// The connection state now.
    pub fn connection_state(&self) -> ConnectionState {
        *self.inner.shared.state.borrow()
    }

    /// Why the stream last failed, if it has.
    pub fn last_error(&self) -> Option<String> {
        self.inner
            .shared
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Every change applied to the mirror from now on. A receiver that
    /// falls more than `change_buffer` behind gets `RecvError::Lagged` and
    /// should re-read the mirror as a whole.
    pub fn subscribe(&self) -> broadcast::Receiver<MirrorChange> {
        self.inner.shared.changes.subscribe()
    }

    /// Waits until the state is `ready` (the mirror is synced).
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), ClientError> {
        let mut rx = self.state();
        match tokio::time::timeout(
            timeout,
            rx.wait_for(|s| matches!(s, ConnectionState::Ready | ConnectionState::Shutdown)),
        )
        .await
        {
            Ok(Ok(s)) if *s == ConnectionState::Ready => Ok(()),
            Ok(_) => Err(ClientError::Closed),
            Err(_) => Err(ClientError::Timeout(timeout)),
        }
    }

    /// Waits until the mirror has applied `pred` (checked on every revision).
    pub async fn wait_until(
        &self,
        timeout: Duration,
        pred: impl Fn(&crate::MirrorState) -> bool,
    ) -> Result<(), ClientError> {
        let mut rx = self.mirror().revisions();
        let fut = async {
            loop {
                if self.mirror().read(&pred) {
                    return Ok(());
                }
                if rx.changed().await.is_err() {
                    return Err(ClientError::Closed);
                }
            }
        };
        tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    /// Stops the Watch loop and refuses further commands. Idempotent.
    pub async fn close(&self) {
        self.inner.shared.stop.send_replace(true);
        let task = self.inner.task.lock().await.take();
        if let Some(task) = task {
            let _ = task.await;
        }
        self.inner
            .shared
            .state
            .send_replace(ConnectionState::Shutdown);
    }

    fn rpc(&self) -> Result<Rpc, ClientError> {
        if *self.inner.shared.stop.borrow() {
            return Err(ClientError::Closed);
        }
        Ok(self.inner.shared.rpc.clone())
    }

    /// From now on, every command that changes Manager's state (nodes, bundles, jobs,
    /// migrations) is sent only while `fence` answers `true`, and fails with
    /// [`ClientError::Fenced`] otherwise. Reads and the Watch stream are not fenced. An operator
    /// replica fences on its leadership, so a deposed leader cannot act on Manager.
    pub fn fence_writes(&self, fence: WriteFence) {
        let mut guard = self
            .inner
            .shared
            .write_fence
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *guard = Some(fence);
    }

    /// [`call`](Self::call) for a command that changes Manager's state: refused when fenced.
    async fn mutate<T, F, Fut>(&self, f: F) -> Result<T, ClientError>
    where
        F: FnOnce(Rpc, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let fence = self
            .inner
            .shared
            .write_fence
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        if fence.is_some_and(|allowed| !allowed()) {
            return Err(ClientError::Fenced(
                "this process does not hold leadership".into(),
            ));
        }
        self.call(f).await
    }

    async fn call<T, F, Fut>(&self, f: F) -> Result<T, ClientError>
    where
        F: FnOnce(Rpc, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let rpc = self.rpc()?;
        let d = self.inner.shared.request_timeout;
        match tokio::time::timeout(d, f(rpc, d)).await {
            Ok(Ok(r)) => Ok(r.into_inner()),
            Ok(Err(s)) if s.code() == tonic::Code::DeadlineExceeded => Err(ClientError::Timeout(d)),
            Ok(Err(s)) => Err(s.into()),
            Err(_) => Err(ClientError::Timeout(d)),
        }
    }

    /// CreateNode: returns the node in state STARTING.
    pub async fn create_node(&self, req: CreateNodeRequest) -> Result<Node, ClientError> {
        let r = self
            .mutate(|c, d| async move { c.create_node(req_with(req, d)).await })
            .await?;
        r.node.ok_or_else(|| ClientError::Rpc {
            code: tonic::Code::Internal,
            message: "response without node".into(),
        })
    }

    /// TerminateNode. The node is remembered as asked for ([`Self::asked_to_terminate`]) before
    /// the request is sent, so its Watch event can never come first.
    pub async fn terminate_node(&self, node_id: &str) -> Result<Node, ClientError> {
        {
            let mut asked = self
                .inner
                .shared
                .terminations_asked
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if asked.len() >= TERMINATIONS_REMEMBERED {
                asked.pop_front();
            }
            asked.push_back(node_id.to_owned());
        }
        let req = TerminateNodeRequest {
            node_id: node_id.to_owned(),
        };
        let r = self
            .mutate(|c, d| async move { c.terminate_node(req_with(req, d)).await })
            .await?;
        r.node.ok_or_else(|| ClientError::Rpc {
            code: tonic::Code::Internal,
            message: "response without node".into(),
        })
    }

    /// StopNode: a started, empty node powers off (a warm spare); returns it POWERING_OFF.
    pub async fn stop_node(&self, node_id: &str) -> Result<Node, ClientError> {
        let req = StopNodeRequest {
            node_id: node_id.to_owned(),
        };
        let r = self
            .mutate(|c, d| async move { c.stop_node(req_with(req, d)).await })
            .await?;
        r.node.ok_or_else(|| ClientError::Rpc {
            code: tonic::Code::Internal,
            message: "response without node".into(),
        })
    }

    /// StartNode: a powered-off node starts again; returns it STARTING.
    pub async fn start_node(&self, node_id: &str) -> Result<Node, ClientError> {
        let req = StartNodeRequest {
            node_id: node_id.to_owned(),
        };
        let r = self
            .mutate(|c, d| async move { c.start_node(req_with(req, d)).await })
            .await?;
        r.node.ok_or_else(|| ClientError::Rpc {
            code: tonic::Code::Internal,
            message: "response without node".into(),
        })
    }

    /// Whether this client asked Manager to terminate `node_id` (among the last
    /// 8192 nodes it asked for): a node that stops or terminates otherwise was lost.
    pub fn asked_to_terminate(&self, node_id: &str) -> bool {
        self.inner
            .shared
            .terminations_asked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|n| n == node_id)
    }

    /// ListNodes (straight from Manager, not the mirror).
    pub async fn list_nodes(&self, pool: Option<&str>) -> Result<Vec<Node>, ClientError> {
        let req = ListNodesRequest {
            pool: pool.unwrap_or_default().to_owned(),
        };
        Ok(self
            .call(|c, d| async move { c.list_nodes(req_with(req, d)).await })
            .await?
            .nodes)
    }

    /// ListPools.
    pub async fn list_pools(&self) -> Result<Vec<Pool>, ClientError> {
        Ok(self
            .call(|c, d| async move { c.list_pools(req_with(ListPoolsRequest {}, d)).await })
            .await?
            .pools)
    }

    /// RegisterBundle (create or update): the stored bundle and its job ids.
    pub async fn register_bundle(
        &self,
        bundle: Bundle,
    ) -> Result<RegisterBundleResponse, ClientError> {
        let req = RegisterBundleRequest {
            bundle: Some(bundle),
        };
        self.mutate(|c, d| async move { c.register_bundle(req_with(req, d)).await })
            .await
    }

    /// UpdateBundle: like [`ManagerClient::register_bundle`], but
    /// [`ClientError::NotFound`] when the bundle does not exist.
    pub async fn update_bundle(
        &self,
        bundle: Bundle,
    ) -> Result<RegisterBundleResponse, ClientError> {
        let req = RegisterBundleRequest {
            bundle: Some(bundle),
        };
        self.mutate(|c, d| async move { c.update_bundle(req_with(req, d)).await })
            .await
    }

    /// DeleteBundle: the ids of the removed jobs.
    pub async fn delete_bundle(&self, bundle_id: &str) -> Result<Vec<String>, ClientError> {
        let req = DeleteBundleRequest {
            bundle_id: bundle_id.to_owned(),
        };
        Ok(self
            .mutate(|c, d| async move { c.delete_bundle(req_with(req, d)).await })
            .await?
            .removed_job_ids)
    }

    /// StartJob. A worker refusal is [`ClientError::Rejected`].
    pub async fn start_job(
        &self,
        job_id: &str,
        node_id: &str,
        role: JobRole,
    ) -> Result<Job, ClientError> {
        let req = StartJobRequest {
            job_id: job_id.to_owned(),
            node_id: node_id.to_owned(),
            role: role as i32,
        };
        let r = self
            .mutate(|c, d| async move { c.start_job(req_with(req, d)).await })
            .await?;
        if !r.accepted {
            return Err(ClientError::Rejected {
                job_id: job_id.to_owned(),
                node_id: node_id.to_owned(),
                reason: RejectionReason::try_from(r.rejection_reason)
                    .unwrap_or(RejectionReason::Unspecified),
                message: r.message,
            });
        }
        r.job.ok_or_else(|| ClientError::Rpc {
            code: tonic::Code::Internal,
            message: "response without job".into(),
        })
    }

    /// StopJob (idempotent).
    pub async fn stop_job(&self, job_id: &str, role: JobRole) -> Result<Job, ClientError> {
        self.stop_job_because(job_id, role, StopReason::Requested)
            .await
    }

    /// StopJob of the normal instance with `STOP_REASON_HANDED_TO_RECOVERY`: Manager stops it
    /// if it still runs and records either way that the job's band recovery takes over, so the
    /// verdict survives an operator restart.
    pub async fn hand_to_recovery(&self, job_id: &str) -> Result<Job, ClientError> {
        self.stop_job_because(job_id, JobRole::Normal, StopReason::HandedToRecovery)
            .await
    }

    async fn stop_job_because(
        &self,
        job_id: &str,
        role: JobRole,
        reason: StopReason,
    ) -> Result<Job, ClientError> {
        let req = StopJobRequest {
            job_id: job_id.to_owned(),
            role: role as i32,
            reason: reason as i32,
        };
        let r = self
            .mutate(|c, d| async move { c.stop_job(req_with(req, d)).await })
            .await?;
        r.job.ok_or_else(|| ClientError::Rpc {
            code: tonic::Code::Internal,
            message: "response without job".into(),
        })
    }

    /// UpdateJobConfig (`config` is UTF-8 JSON).
    pub async fn update_job_config(
        &self,
        job_id: &str,
        config: Vec<u8>,
    ) -> Result<Job, ClientError> {
        let req = UpdateJobConfigRequest {
            job_id: job_id.to_owned(),
            config,
        };
        let r = self
            .mutate(|c, d| async move { c.update_job_config(req_with(req, d)).await })
            .await?;
        r.job.ok_or_else(|| ClientError::Rpc {
            code: tonic::Code::Internal,
            message: "response without job".into(),
        })
    }

    /// NodeControllerMigrationGetState (propose) with the strategy Manager
    /// moves the job with. Progress arrives as
    /// [`MirrorChange::MigrationUpdated`].
    pub async fn migration_get_state(
        &self,
        migration_id: &str,
        job_id: &str,
        strategy: MigrationStrategy,
    ) -> Result<Migration, ClientError> {
        let req = NodeControllerMigrationGetState {
            migration_id: migration_id.to_owned(),
            job_id: job_id.to_owned(),
            strategy: strategy as i32,
        };
        migration_of(
            self.mutate(|c, d| async move { c.migration_get_state(req_with(req, d)).await })
                .await?,
        )
    }

    /// NodeControllerMigrationPrepareTarget. A refused target start is
    /// [`ClientError::Rejected`] (the migration stays STATE_RECEIVED).
    pub async fn migration_prepare_target(
        &self,
        migration_id: &str,
        target_node_id: &str,
        initial_state: Vec<u8>,
    ) -> Result<Migration, ClientError> {
        let req = NodeControllerMigrationPrepareTarget {
            migration_id: migration_id.to_owned(),
            target_node_id: target_node_id.to_owned(),
            initial_state,
        };
        let r = self
            .mutate(|c, d| async move { c.migration_prepare_target(req_with(req, d)).await })
            .await?;
        if r.target_rejected {
            let job_id = r
                .migration
                .as_ref()
                .map(|m| m.job_id.clone())
                .unwrap_or_default();
            return Err(ClientError::Rejected {
                job_id,
                node_id: target_node_id.to_owned(),
                reason: RejectionReason::try_from(r.rejection_reason)
                    .unwrap_or(RejectionReason::Unspecified),
                message: r.message,
            });
        }
        migration_of(r)
    }

    /// NodeControllerMigrationCutover.
    pub async fn migration_cutover(
        &self,
        migration_id: &str,
        payload: Vec<u8>,
    ) -> Result<Migration, ClientError> {
        let req = NodeControllerMigrationCutover {
            migration_id: migration_id.to_owned(),
            payload,
        };
        migration_of(
            self.mutate(|c, d| async move { c.migration_cutover(req_with(req, d)).await })
                .await?,
        )
    }

    /// NodeControllerMigrationAbort.
    pub async fn migration_abort(
        &self,
        migration_id: &str,
        reason: &str,
    ) -> Result<Migration, ClientError> {
        let req = NodeControllerMigrationAbort {
            migration_id: migration_id.to_owned(),
            reason: reason.to_owned(),
        };
        migration_of(
            self.mutate(|c, d| async move { c.migration_abort(req_with(req, d)).await })
                .await?,
        )
    }
}

fn req_with<T>(msg: T, timeout: Duration) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(timeout);
    r
}

fn migration_of(r: manager_proto::MigrationResponse) -> Result<Migration, ClientError> {
    r.migration.ok_or_else(|| ClientError::Rpc {
        code: tonic::Code::Internal,
        message: "response without migration".into(),
    })
}

/// How one Watch stream ended.
struct StreamEnd {
    reached_ready: bool,
    error: String,
}

async fn watch_loop(shared: Arc<Shared>, initial: Duration, max: Duration) {
    let mut stop = shared.stop.subscribe();
    let mut attempt: u32 = 0;
    loop {
        if *stop.borrow() {
            break;
        }
        shared.state.send_replace(ConnectionState::Connecting);
        let end = tokio::select! {
            end = one_stream(&shared) => end,
            _ = stop.wait_for(|s| *s) => break,
        };
        if end.reached_ready {
            attempt = 0;
        }
        tracing::warn!(error = %end.error, "manager watch stream ended");
        *shared
            .last_error
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(end.error);
        shared.state.send_replace(ConnectionState::TransientFailure);
        let delay = backoff_delay(initial, max, attempt, &mut rand::rng());
        attempt = attempt.saturating_add(1);
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|s| *s) => break,
        }
    }
    shared.state.send_replace(ConnectionState::Shutdown);
}

fn publish(shared: &Shared, changes: Vec<MirrorChange>) {
    for c in changes {
        // No receivers is fine: nobody is listening yet.
        let _ = shared.changes.send(c);
    }
}

impl StreamDeadlines {
    /// When the next message must have arrived: within the idle timeout, and before `Synced`
    /// also within the sync deadline.
    fn next(&self, synced: bool, sync_by: tokio::time::Instant) -> tokio::time::Instant {
        let idle = tokio::time::Instant::now() + self.idle;
        if synced { idle } else { idle.min(sync_by) }
    }

    /// Why a stream that went silent is counted as failed.
    fn silence(&self, synced: bool, sync_by: tokio::time::Instant) -> String {
        if synced {
            format!(
                "Manager sent nothing for {:?}, not even a heartbeat (asked for every {:?}): the stream is stalled",
                self.idle, self.heartbeat
            )
        } else if tokio::time::Instant::now() >= sync_by {
            format!(
                "no Synced from Manager within {:?} of opening the Watch (sync deadline)",
                self.sync
            )
        } else {
            format!(
                "Manager sent nothing for {:?} while syncing: the stream is stalled",
                self.idle
            )
        }
    }
}

async fn one_stream(shared: &Shared) -> StreamEnd {
    let (resume_revision, epoch) = shared.mirror.read(|s| (s.revision, s.epoch.clone()));
    let rpc = shared.rpc.clone();
    let mut reached_ready = false;
    let deadlines = shared.deadlines;
    let sync_by = tokio::time::Instant::now() + deadlines.sync;
    let req = WatchRequest {
        resume_revision,
        epoch,
        heartbeat_interval_ms: u64::try_from(deadlines.heartbeat.as_millis()).unwrap_or(u64::MAX),
    };
    // A Manager that accepts the call and never answers is caught here and below: TCP and
    // HTTP/2 keepalives only prove the peer's kernel and transport are alive.
    let opened = tokio::time::timeout_at(
        deadlines.next(false, sync_by),
        rpc.watch(tonic::Request::new(req)),
    )
    .await;
    let mut stream = match opened {
        Ok(Ok(r)) => r.into_inner(),
        Ok(Err(s)) => {
            return StreamEnd {
                reached_ready,
                error: format!("{:?}: {}", s.code(), s.message()),
            };
        }
        Err(_) => {
            return StreamEnd {
                reached_ready,
                error: deadlines.silence(false, sync_by),
            };
        }
    };
    let mut pending: Option<SnapshotData> = None;
    loop {
        let next = deadlines.next(reached_ready, sync_by);
        let Ok(received) = tokio::time::timeout_at(next, stream.next()).await else {
            return StreamEnd {
                reached_ready,
                error: deadlines.silence(reached_ready, sync_by),
            };
        };
        let msg = match received {
            Some(Ok(m)) => m,
            None => {
                return StreamEnd {
                    reached_ready,
                    error: "stream closed by manager".into(),
                };
            }
            Some(Err(s)) => {
                return StreamEnd {
                    reached_ready,
                    error: format!("{:?}: {}", s.code(), s.message()),
                };
            }
        };
        match msg.kind {
            Some(watch_response::Kind::Snapshot(chunk)) => {
                let p = pending.get_or_insert_with(|| SnapshotData {
                    epoch: chunk.epoch.clone(),
                    revision: chunk.revision,
                    reason: SnapshotReason::try_from(chunk.reason)
                        .unwrap_or(SnapshotReason::Unspecified),
                    ..Default::default()
                });
                p.nodes.extend(chunk.nodes);
                p.jobs.extend(chunk.jobs);
                p.bundles.extend(chunk.bundles);
                p.migrations.extend(chunk.migrations);
                if chunk.last
                    && let Some(snap) = pending.take()
                {
                    tracing::info!(
                        revision = snap.revision,
                        reason = snap.reason.as_str_name(),
                        "mirror resynced"
                    );
                    let mut changes = Vec::new();
                    shared.mirror.write(|m| m.replace(snap, &mut changes));
                    publish(shared, changes);
                }
            }
            Some(watch_response::Kind::Synced(s)) => {
                let have = shared.mirror.revision();
                if have != s.revision {
                    return StreamEnd {
                        reached_ready,
                        error: format!(
                            "manager says synced at {} but the mirror is at {have}",
                            s.revision
                        ),
                    };
                }
                reached_ready = true;
                shared.state.send_replace(ConnectionState::Ready);
            }
            Some(watch_response::Kind::Heartbeat(h)) => {
                let have = shared.mirror.revision();
                if reached_ready && h.revision != have {
                    return StreamEnd {
                        reached_ready,
                        error: format!(
                            "manager's heartbeat says {} was sent but the mirror is at {have}",
                            h.revision
                        ),
                    };
                }
            }
            Some(watch_response::Kind::Events(batch)) => {
                let mut changes = Vec::with_capacity(batch.events.len());
                let gap = shared.mirror.write(|m| {
                    for ev in batch.events {
                        if ev.revision > m.revision + 1 {
                            return Some((m.revision, ev.revision));
                        }
                        m.apply_event(ev, &mut changes);
                    }
                    None
                });
                publish(shared, changes);
                if let Some((have, got)) = gap {
                    // Resume from what we have; Manager fills the gap or resyncs.
                    return StreamEnd {
                        reached_ready,
                        error: format!("event gap: mirror at {have}, got {got}"),
                    };
                }
            }
            None => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn debug_output_never_shows_the_token_or_a_key() {
        let mut c = ClientConfig::new("https://manager:6789");
        c.token = Some("s3cret-token".to_owned());
        c.tls = Some(TlsOptions {
            ca_pem: b"-----BEGIN CERTIFICATE-----".to_vec(),
            domain: Some("manager".to_owned()),
            identity: Some((b"CERT-BYTES".to_vec(), b"PRIVATE-KEY-BYTES".to_vec())),
        });
        let shown = format!("{c:?} {c:#?}");
        for secret in [
            "s3cret-token",
            "PRIVATE-KEY-BYTES",
            "CERT-BYTES",
            "BEGIN CERTIFICATE",
        ] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
        assert!(
            shown.contains("<redacted>") && shown.contains("https://manager:6789"),
            "{shown}"
        );
    }
    use rand::SeedableRng;

    #[test]
    fn backoff_never_exceeds_its_cap_and_the_cap_grows_to_the_maximum() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let initial = Duration::from_millis(200);
        let max = Duration::from_secs(30);
        for attempt in 0..100 {
            let cap = (initial * 2u32.saturating_pow(attempt.min(20))).min(max);
            let d = backoff_delay(initial, max, attempt, &mut rng);
            assert!(d <= cap, "attempt {attempt}: {d:?} > {cap:?}");
        }
        // full jitter: late attempts spread over the whole [0, max] range
        let late: Vec<_> = (0..200)
            .map(|_| backoff_delay(initial, max, 60, &mut rng))
            .collect();
        assert!(late.iter().any(|d| *d > Duration::from_secs(20)));
        assert!(late.iter().any(|d| *d < Duration::from_secs(10)));
    }

    #[test]
    fn status_codes_map_to_typed_errors() {
        assert!(matches!(
            ClientError::from(tonic::Status::invalid_argument("x")),
            ClientError::InvalidArgument(_)
        ));
        assert!(matches!(
            ClientError::from(tonic::Status::unauthenticated("x")),
            ClientError::Unauthenticated(_)
        ));
        assert!(ClientError::from(tonic::Status::unavailable("x")).is_retryable());
        assert!(!ClientError::from(tonic::Status::not_found("x")).is_retryable());
    }

    #[tokio::test]
    async fn https_without_tls_options_is_a_config_error() {
        let err = ManagerClient::connect(ClientConfig::new("https://127.0.0.1:1"))
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Config(_)), "{err}");
    }

    #[tokio::test]
    async fn a_malformed_endpoint_is_a_config_error() {
        let err = ManagerClient::connect(ClientConfig::new("not a url"))
            .await
            .unwrap_err();
        assert!(matches!(err, ClientError::Config(_)), "{err}");
    }

    #[tokio::test]
    async fn close_is_idempotent_and_commands_after_close_fail_closed() {
        let c = ManagerClient::connect(ClientConfig::new("http://127.0.0.1:1"))
            .await
            .expect("connect");
        c.close().await;
        c.close().await;
        assert_eq!(c.connection_state(), ConnectionState::Shutdown);
        assert_eq!(
            c.terminate_node("n").await.unwrap_err(),
            ClientError::Closed
        );
    }
}
