//! The worker's job-socket listener: a WebSocket server for the jobs on one worker, relaying
//! handover frames between them and the Manager side through a channel API.
//!
//! # Channel API (what a worker, or manager-sim's simulated worker, uses)
//!
//! ```no_run
//! # async fn demo() -> Result<(), job_socket::listener::ListenerError> {
//! use job_socket::listener::*;
//! let (listener, mut events) = JobSocketListener::bind(ListenerConfig::loopback()).await?;
//! let worker = listener.handle(); // cheap to clone; share with the gRPC side
//! // A job started on this worker: tell the listener its path and token.
//! worker.register(InstanceSpec::new("job-1", "main", "secret"))?;
//! // A handover target: started with role `migrationTarget` and the source's state.
//! worker.register(InstanceSpec::new("job-1", "migrationTarget", "t0k").target_of("mig-7", job_socket::json::Json::Null))?;
//! // Manager → job (the four NodeControllerMigration* messages map onto these):
//! worker.send(&InstanceKey::new("job-1", "main"), Command::GetState { migration_id: "mig-7".into() })?;
//! // Job → Manager:
//! while let Some(ev) = events.recv().await {
//!     match ev.kind {
//!         EventKind::Frame { migration_id, frame, phase } => { /* relay to the Manager */ }
//!         EventKind::Connected { .. } | EventKind::Disconnected { .. } => {}
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! Mapping onto the Manager's migration messages: *propose / get-state* → [`Command::GetState`]
//! on the source, answered by a `state` or `state-refused` [`EventKind::Frame`]; *prepare target
//! with initial state* → [`InstanceSpec::target_of`] when registering the target (the listener
//! sends `hello-ack{migration}` and `initial-state` itself when the target connects), answered by
//! `target-ready`; *cutover* → [`Command::CutoverReady`] on the source (answered by
//! `source-stopped-output`) then [`Command::CutoverApply`] on the target (answered by
//! `target-applied`); *abort* → [`Command::Abort`] on either, and a job's own `abort` arrives as
//! a `Frame`.
//!
//! # Behaviour
//!
//! * Paths `/instances/<jobId>/<role>` name registered instances. A path that is not of that
//!   form is accepted as a WebSocket and closed at once with 4401 (a close code needs an open
//!   socket).
//! * The first frame must be `hello` with the instance's token (compared in constant time for
//!   equal lengths), within `hello_timeout` of the TCP accept (which also bounds the HTTP
//!   upgrade); otherwise 4401. An unparseable first frame is a protocol error (4400). A
//!   well-formed path naming no instance is treated exactly like a wrong token: the hello is
//!   awaited and refused with the same 4401 and the same reason ([`REFUSED`]), so a peer cannot
//!   tell which job ids are live on this worker.
//! * Connections are capped: at most `max_connections` at once, at most
//!   `max_connections_per_peer` from one IP address. One over a cap is answered
//!   `HTTP/1.1 503` and closed before the WebSocket upgrade, costing no task. The accept queue
//!   is as long as `max_connections`, so a burst is queued and answered rather than dropped.
//! * An authenticated connection from which nothing arrives (no frame, not even the pong to the
//!   listener's ping, sent every third of `idle_timeout`) for `idle_timeout` is closed with 1001:
//!   a job whose host vanished does not hold its slot forever. WebSocket libraries answer pings
//!   on their own, so an idle but live job is never closed.
//! * A frame over `max_frame_bytes` closes with 4413; tungstenite rejects it from the frame
//!   header, before reading its payload, so nothing unbounded is buffered.
//! * An unparseable frame, a second `hello`, a binary frame, or a frame the instance's side and
//!   phase do not expect ([`crate::phase`]) closes with 4400 and the reason.
//! * A newer authenticated connection for the same instance closes the older with 4409; phase
//!   state belongs to the instance, not the connection, so the newer one carries on (a target
//!   still awaiting `target-ready` is sent `initial-state` again).
//! * Never blocks on a slow peer: each connection has its own task; [`ListenerHandle::send`]
//!   only enqueues (bounded), and a job whose queue is full is closed (1008) rather than waited
//!   for; a write that stalls past `write_timeout` drops the connection. Events go to one
//!   bounded channel; when the Manager side stops draining it, connection tasks wait
//!   (back-pressure reaches only the jobs that are sending), never the accept loop.

use crate::consts::{
    CloseCode, JOB_SOCKET_DEFAULT_PORT, JOB_SOCKET_HELLO_TIMEOUT, JOB_SOCKET_MAX_FRAME_BYTES,
};
use crate::frame::{JobToWorker, TargetOf, TargetSide, WorkerToJob, parse_job_to_worker};
use crate::json::Json;
use crate::path::parse_job_socket_path;
use crate::phase::{self, Migration, Phase, PhaseError, Side};
use futures::{SinkExt, StreamExt};
use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use subtle::ConstantTimeEq;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode as WsCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message, error::CapacityError};

/// Listener settings.
#[derive(Debug, Clone)]
pub struct ListenerConfig {
    /// Address to bind. Default `0.0.0.0:6797`: jobs in containers reach it as `host.docker.internal`.
    pub bind: SocketAddr,
    /// How long a connection has, from TCP accept, to upgrade and send `hello`. Default 5 s.
    pub hello_timeout: Duration,
    /// Largest frame (and message) accepted. Default 64 KiB.
    pub max_frame_bytes: usize,
    /// Frames queued per connection before the job counts as not reading. Default 32.
    pub outbound_queue: usize,
    /// Events buffered for the Manager side. Default 1024.
    pub event_queue: usize,
    /// How long one frame may take to be written to a job before the connection is dropped
    /// (a job that stopped reading must not pin its task). Default 5 s.
    pub write_timeout: Duration,
    /// Connections open at once, authenticated or not; more are refused. Default 4096.
    pub max_connections: usize,
    /// Connections open at once from one IP address; more are refused. Default 1024 (the jobs
    /// of one worker usually all come from its container bridge's address).
    pub max_connections_per_peer: usize,
    /// How long an authenticated connection may send nothing, not even a pong, before it is
    /// closed; it is pinged every third of this. Default 60 s.
    pub idle_timeout: Duration,
}

/// The reason of the 4401 that closes both a wrong token and a path naming no instance.
pub const REFUSED: &str = "unknown instance or wrong token";

impl Default for ListenerConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from((Ipv4Addr::UNSPECIFIED, JOB_SOCKET_DEFAULT_PORT)),
            hello_timeout: JOB_SOCKET_HELLO_TIMEOUT,
            max_frame_bytes: JOB_SOCKET_MAX_FRAME_BYTES,
            outbound_queue: 32,
            event_queue: 1024,
            write_timeout: JOB_SOCKET_HELLO_TIMEOUT,
            max_connections: 4096,
            max_connections_per_peer: 1024,
            idle_timeout: Duration::from_secs(60),
        }
    }
}

impl ListenerConfig {
    /// The defaults on `127.0.0.1:0` (tests, simulators).
    pub fn loopback() -> Self {
        Self {
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            ..Self::default()
        }
    }
}

/// An instance on this worker, by its socket path's two names.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct InstanceKey {
    /// The job id.
    pub job_id: String,
    /// The instance key (the role; unique per migration target).
    pub role: String,
}

impl InstanceKey {
    /// A key.
    pub fn new(job_id: impl Into<String>, role: impl Into<String>) -> Self {
        Self {
            job_id: job_id.into(),
            role: role.into(),
        }
    }
}

/// An instance the listener should accept a job connection for.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    /// Its path.
    pub key: InstanceKey,
    /// The token handed to the job as `NORSK_WORKER_TOKEN`.
    pub token: String,
    /// Set when the instance is a migration target: `(migration id, the source's state)`.
    pub target: Option<(String, Json)>,
}

impl InstanceSpec {
    /// A plain instance (a potential source).
    pub fn new(
        job_id: impl Into<String>,
        role: impl Into<String>,
        token: impl Into<String>,
    ) -> Self {
        Self {
            key: InstanceKey::new(job_id, role),
            token: token.into(),
            target: None,
        }
    }

    /// Marks the instance as the target of `migration_id`, to be handed `initial_state`.
    #[must_use]
    pub fn target_of(mut self, migration_id: impl Into<String>, initial_state: Json) -> Self {
        self.target = Some((migration_id.into(), initial_state));
        self
    }
}

/// What the Manager side asks the listener to send a job.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// The propose, to the source.
    GetState {
        /// Migration id.
        migration_id: String,
    },
    /// To the source: the target is ready (payload from its `target-ready`).
    CutoverReady {
        /// Migration id.
        migration_id: String,
        /// The target's payload.
        payload: Json,
    },
    /// To the target: take over (payload from the source's `source-stopped-output`).
    CutoverApply {
        /// Migration id.
        migration_id: String,
        /// The source's payload.
        payload: Json,
    },
    /// To either: the migration is aborted.
    Abort {
        /// Migration id.
        migration_id: String,
        /// Why.
        reason: String,
    },
}

impl Command {
    /// The frame this command sends.
    pub fn to_frame(&self) -> WorkerToJob {
        match self {
            Command::GetState { migration_id } => WorkerToJob::GetState {
                migration_id: migration_id.as_str().into(),
            },
            Command::CutoverReady {
                migration_id,
                payload,
            } => WorkerToJob::CutoverReady {
                migration_id: migration_id.as_str().into(),
                payload: payload.clone(),
            },
            Command::CutoverApply {
                migration_id,
                payload,
            } => WorkerToJob::CutoverApply {
                migration_id: migration_id.as_str().into(),
                payload: payload.clone(),
            },
            Command::Abort {
                migration_id,
                reason,
            } => WorkerToJob::Abort {
                migration_id: migration_id.as_str().into(),
                reason: reason.as_str().into(),
            },
        }
    }
}

/// Something the Manager side should know.
#[derive(Debug, Clone, PartialEq)]
pub struct ListenerEvent {
    /// Which instance.
    pub instance: InstanceKey,
    /// What happened.
    pub kind: EventKind,
}

/// What happened on an instance's socket.
#[derive(Debug, Clone, PartialEq)]
pub enum EventKind {
    /// A job connected and authenticated. `connection` numbers connections.
    Connected {
        /// Connection number (unique in the listener, increasing).
        connection: u64,
        /// The migration it was told it is the target of, if any.
        target_of: Option<String>,
    },
    /// A frame the job sent, accepted for its phase; relay it to the Manager.
    Frame {
        /// The migration it belongs to.
        migration_id: String,
        /// The frame (never `hello`).
        frame: JobToWorker,
        /// The instance's phase after it.
        phase: Phase,
    },
    /// An authenticated connection ended.
    Disconnected {
        /// Connection number.
        connection: u64,
        /// The close code sent or received, if any.
        code: Option<u16>,
        /// The close reason.
        reason: String,
    },
}

/// Listener failures.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    /// Binding the address failed.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Registering an instance twice.
    #[error("instance {0:?} is already registered")]
    AlreadyRegistered(InstanceKey),
    /// The instance is not registered.
    #[error("no instance {0:?} on this worker")]
    UnknownInstance(InstanceKey),
    /// No job is connected to receive the frame.
    #[error("the job of {0:?} is not connected")]
    NotConnected(InstanceKey),
    /// The frame does not fit the migration's phase.
    #[error(transparent)]
    Phase(#[from] PhaseError),
    /// The job is not reading its socket; it has been closed.
    #[error("the job of {0:?} is not reading its socket; closed it")]
    SlowPeer(InstanceKey),
    /// A frame would exceed the size cap.
    #[error("frame of {size} bytes exceeds the {max}-byte cap")]
    FrameTooLarge {
        /// Its size.
        size: usize,
        /// The cap.
        max: usize,
    },
}

/// The migration view of one instance, for status and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceStatus {
    /// Whether an authenticated job connection is up.
    pub connected: bool,
    /// Its migration, if one was ever started.
    pub migration: Option<Migration>,
}

struct Conn {
    id: u64,
    frames: mpsc::Sender<String>,
    close: watch::Sender<Option<(u16, String)>>,
}

struct Instance {
    token: String,
    migration: Option<Migration>,
    initial_state: Option<Json>,
    conn: Option<Conn>,
}

struct Shared {
    config: ListenerConfig,
    instances: Mutex<HashMap<InstanceKey, Instance>>,
    events: mpsc::Sender<ListenerEvent>,
    shutdown: watch::Receiver<bool>,
    /// The last connection number given. Listener-wide, so a key registered again (its job
    /// moved back, say) never reuses a number: the end of the removed instance's connection is
    /// then never taken for the end of the new one's.
    last_conn: std::sync::atomic::AtomicU64,
    slots: Mutex<Slots>,
}

/// Open connections, in total and per peer address, and how many were refused.
#[derive(Default)]
struct Slots {
    open: usize,
    by_peer: HashMap<IpAddr, usize>,
    refused: u64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, HashMap<InstanceKey, Instance>> {
        // A panic while holding the lock cannot leave the map half-updated (every update is a
        // single assignment), so a poisoned lock is still usable.
        self.instances
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        self.slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A slot for a connection from `peer`, or which cap it would break.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Result<Slot, &'static str> {
        let mut slots = self.slots();
        let from_peer = slots.by_peer.get(&peer).copied().unwrap_or(0);
        let full = if slots.open >= self.config.max_connections {
            Some("max_connections")
        } else if from_peer >= self.config.max_connections_per_peer {
            Some("max_connections_per_peer")
        } else {
            None
        };
        if let Some(cap) = full {
            slots.refused += 1;
            return Err(cap);
        }
        slots.open += 1;
        slots.by_peer.insert(peer, from_peer + 1);
        Ok(Slot {
            shared: self.clone(),
            peer,
        })
    }
}

/// One admitted connection; gives its slot back when dropped.
struct Slot {
    shared: Arc<Shared>,
    peer: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut slots = self.shared.slots();
        slots.open = slots.open.saturating_sub(1);
        if let Some(n) = slots.by_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                slots.by_peer.remove(&self.peer);
            }
        }
    }
}

/// A running listener. Dropping it stops accepting; [`Self::shutdown`] also closes every socket.
pub struct JobSocketListener {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

/// A cloneable handle to register instances and send commands.
#[derive(Clone)]
pub struct ListenerHandle {
    shared: Arc<Shared>,
}

impl JobSocketListener {
    /// Binds and starts accepting. Returns the listener and the receiver of its events.
    pub async fn bind(
        config: ListenerConfig,
    ) -> Result<(Self, mpsc::Receiver<ListenerEvent>), ListenerError> {
        let tcp =
            listen(config.bind, config.max_connections).map_err(|source| ListenerError::Bind {
                addr: config.bind,
                source,
            })?;
        let addr = tcp.local_addr().map_err(|source| ListenerError::Bind {
            addr: config.bind,
            source,
        })?;
        let (events, rx) = mpsc::channel(config.event_queue.max(1));
        let (stop, shutdown) = watch::channel(false);
        let shared = Arc::new(Shared {
            config,
            instances: Mutex::new(HashMap::new()),
            events,
            shutdown,
            last_conn: std::sync::atomic::AtomicU64::new(0),
            slots: Mutex::new(Slots::default()),
        });
        let accept = tokio::spawn(accept_loop(tcp, shared.clone()));
        tracing::info!(%addr, "job socket listener up");
        Ok((
            Self {
                addr,
                shared,
                stop,
                accept,
            },
            rx,
        ))
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle for registering instances and sending commands.
    pub fn handle(&self) -> ListenerHandle {
        ListenerHandle {
            shared: self.shared.clone(),
        }
    }

    /// Stops accepting and closes every connection with 1001 (going away).
    pub async fn shutdown(mut self) {
        let _ = self.stop.send(true);
        self.accept.abort();
        let _ = (&mut self.accept).await;
    }
}

impl Drop for JobSocketListener {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        self.accept.abort();
    }
}

impl ListenerHandle {
    /// Accept connections for an instance. A target's migration starts in `awaiting-target-ready`.
    pub fn register(&self, spec: InstanceSpec) -> Result<(), ListenerError> {
        let mut map = self.shared.lock();
        if map.contains_key(&spec.key) {
            return Err(ListenerError::AlreadyRegistered(spec.key));
        }
        let (migration, initial_state) = match spec.target {
            Some((id, state)) => (Some(phase::new_target(id)), Some(state)),
            None => (None, None),
        };
        tracing::debug!(job_id = %spec.key.job_id, role = %spec.key.role, target = migration.is_some(), "instance registered");
        map.insert(
            spec.key,
            Instance {
                token: spec.token,
                migration,
                initial_state,
                conn: None,
            },
        );
        Ok(())
    }

    /// Forget an instance (its job stopped); a connected job is closed with 1000. Returns whether it was known.
    pub fn unregister(&self, key: &InstanceKey) -> bool {
        let removed = self.shared.lock().remove(key);
        if let Some(conn) = removed.as_ref().and_then(|i| i.conn.as_ref()) {
            let _ = conn.close.send(Some((1000, "instance removed".to_owned())));
        }
        removed.is_some()
    }

    /// Sends a command's frame to the instance's job, after checking it against the phase.
    /// Never waits: the frame is queued for the connection's task. `Abort` is recorded even when
    /// no job is connected (the Manager's abort must stick); the others need a connection.
    pub fn send(&self, key: &InstanceKey, cmd: Command) -> Result<(), ListenerError> {
        let frame = cmd.to_frame();
        let text = frame.to_text();
        let max = self.shared.config.max_frame_bytes;
        if text.len() > max {
            return Err(ListenerError::FrameTooLarge {
                size: text.len(),
                max,
            });
        }
        let mut map = self.shared.lock();
        let inst = map
            .get_mut(key)
            .ok_or_else(|| ListenerError::UnknownInstance(key.clone()))?;
        let next = phase::on_worker_frame(inst.migration.as_ref(), &frame)?;
        match &inst.conn {
            Some(conn) => match conn.frames.try_send(text) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(_)) => {
                    let _ = conn
                        .close
                        .send(Some((1008, "not reading its socket".to_owned())));
                    return Err(ListenerError::SlowPeer(key.clone()));
                }
                Err(mpsc::error::TrySendError::Closed(_))
                    if !matches!(cmd, Command::Abort { .. }) =>
                {
                    return Err(ListenerError::NotConnected(key.clone()));
                }
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            },
            None if matches!(cmd, Command::Abort { .. }) => {}
            None => return Err(ListenerError::NotConnected(key.clone())),
        }
        tracing::debug!(job_id = %key.job_id, role = %key.role, frame = frame.kind(), phase = next.phase.name(), "relayed to job");
        inst.migration = Some(next);
        Ok(())
    }

    /// Connections open now (authenticated or not), and how many were refused over a cap since
    /// the listener started.
    pub fn connections(&self) -> (usize, u64) {
        let slots = self.shared.slots();
        (slots.open, slots.refused)
    }

    /// The instance's connection and migration state.
    pub fn status(&self, key: &InstanceKey) -> Option<InstanceStatus> {
        let map = self.shared.lock();
        map.get(key).map(|i| InstanceStatus {
            connected: i.conn.as_ref().is_some_and(|c| !c.frames.is_closed()),
            migration: i.migration.clone(),
        })
    }
}

/// Binds with an accept queue as long as the connection cap (the kernel clips it to
/// `net.core.somaxconn`): a burst of connections is then queued and each gets its slot or its
/// 503, where the default queue of 1,024 drops the rest of a burst and leaves those peers
/// waiting on the kernel's SYN-ACK retries with no answer at all.
fn listen(addr: SocketAddr, max_connections: usize) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // As `TcpListener::bind` does: a restarted worker rebinds its port at once.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(u32::try_from(max_connections.max(128)).unwrap_or(u32::MAX))
}

async fn accept_loop(tcp: TcpListener, shared: Arc<Shared>) {
    loop {
        match tcp.accept().await {
            Ok((stream, peer)) => match shared.admit(peer.ip()) {
                Ok(slot) => {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(connection(stream, peer, shared.clone(), slot));
                }
                Err(cap) => refuse(&stream, peer, cap, &shared),
            },
            Err(e) => {
                // Transient (e.g. EMFILE): log and keep accepting after a short pause.
                tracing::warn!(error = %e, "job socket accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Answers a connection over a cap with a 503, if the socket takes it at once, and drops it.
/// Never waits: a flood must not slow the accept loop.
fn refuse(stream: &TcpStream, peer: SocketAddr, cap: &str, shared: &Shared) {
    const BUSY: &[u8] =
        b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n";
    let _ = stream.try_write(BUSY);
    let refused = shared.slots().refused;
    // The first refusal and every thousandth after it: a flood must not flood the log too.
    if refused % 1000 == 1 {
        tracing::warn!(%peer, cap, refused, "job socket connection refused: over its cap");
    }
}

type Ws = WebSocketStream<TcpStream>;

/// A text frame whose bytes are not UTF-8 (a browser or Node peer cannot even send one).
const NOT_UTF8: &str = "frame is not valid UTF-8";

/// Close reasons are capped at 123 bytes by RFC 6455; cut on a character boundary.
fn clip_reason(reason: &str) -> String {
    let mut end = reason.len().min(123);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    reason.get(..end).unwrap_or_default().to_owned()
}

async fn close(ws: &mut Ws, code: u16, reason: &str) {
    let frame = CloseFrame {
        code: WsCode::from(code),
        reason: clip_reason(reason).into(),
    };
    let _ =
        tokio::time::timeout(Duration::from_secs(1), ws.send(Message::Close(Some(frame)))).await;
    let _ = tokio::time::timeout(Duration::from_secs(1), ws.close(None)).await;
}

/// `Some` when the connection authenticated.
type Hello = Option<(Ws, InstanceKey)>;

async fn connection(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>, _slot: Slot) {
    // One deadline from TCP accept covers both the HTTP upgrade and the hello.
    let deadline = tokio::time::Instant::now() + shared.config.hello_timeout;
    if let Some((ws, key)) = handshake_and_hello(stream, peer, deadline, &shared).await {
        serve(ws, key, shared).await;
    }
}

// The handshake callback's error type is tungstenite's, not ours.
#[allow(clippy::result_large_err)]
async fn handshake_and_hello(
    stream: TcpStream,
    peer: SocketAddr,
    deadline: tokio::time::Instant,
    shared: &Arc<Shared>,
) -> Hello {
    let max = shared.config.max_frame_bytes;
    let config = WebSocketConfig::default()
        .max_frame_size(Some(max))
        .max_message_size(Some(max));
    let mut path = None;
    let callback = |req: &Request, resp: Response| {
        path = Some(req.uri().to_string());
        Ok(resp)
    };
    let upgrade = tokio_tungstenite::accept_hdr_async_with_config(stream, callback, Some(config));
    let Ok(Ok(mut ws)) = tokio::time::timeout_at(deadline, upgrade).await else {
        tracing::info!(%peer, "job socket: no WebSocket upgrade in time");
        return None;
    };
    // Whether the path names a live instance is not looked at until the hello: both refusals
    // must look the same from outside.
    let key = path
        .as_deref()
        .and_then(parse_job_socket_path)
        .map(|p| InstanceKey {
            job_id: p.job_id,
            role: p.role,
        });
    let Some(key) = key else {
        close(
            &mut ws,
            CloseCode::Unauthorized.code(),
            "not a job socket path: /instances/<jobId>/<role>",
        )
        .await;
        return None;
    };
    match await_hello(&mut ws, &key, deadline, shared).await {
        Ok(()) => Some((ws, key)),
        Err((code, reason)) => {
            tracing::info!(job_id = %key.job_id, role = %key.role, code, %reason, "job socket refused");
            close(&mut ws, code, &reason).await;
            None
        }
    }
}

async fn await_hello(
    ws: &mut Ws,
    key: &InstanceKey,
    deadline: tokio::time::Instant,
    shared: &Arc<Shared>,
) -> Result<(), (u16, String)> {
    let first = match tokio::time::timeout_at(deadline, ws.next()).await {
        Err(_) => {
            let ms = shared.config.hello_timeout.as_millis();
            return Err((
                CloseCode::Unauthorized.code(),
                format!("no hello within {ms} ms"),
            ));
        }
        Ok(m) => m,
    };
    let text = match first {
        Some(Ok(Message::Text(t))) => t,
        Some(Ok(Message::Binary(_))) => {
            return Err((
                CloseCode::ProtocolError.code(),
                "frames must be JSON text".to_owned(),
            ));
        }
        Some(Err(WsError::Capacity(CapacityError::MessageTooLong { .. }))) => {
            return Err((
                CloseCode::FrameTooLarge.code(),
                "frame too large".to_owned(),
            ));
        }
        Some(Err(WsError::Utf8(_))) => {
            return Err((CloseCode::ProtocolError.code(), NOT_UTF8.to_owned()));
        }
        Some(Ok(Message::Close(_)) | Err(_)) | None => return Err((1000, String::new())),
        Some(Ok(_)) => return Err((CloseCode::Unauthorized.code(), "expected hello".to_owned())),
    };
    match parse_job_to_worker(text.as_str()).into_result() {
        Err(reason) => Err((CloseCode::ProtocolError.code(), reason)),
        Ok(JobToWorker::Hello { token }) => {
            let map = shared.lock();
            let given = token.as_str().map(str::as_bytes).unwrap_or_default();
            let ok = match map.get(key) {
                Some(i) => bool::from(i.token.as_bytes().ct_eq(given)),
                // The same comparison work for a path naming no instance, then no.
                None => {
                    std::hint::black_box(given.ct_eq(given));
                    false
                }
            };
            if ok {
                Ok(())
            } else {
                Err((CloseCode::Unauthorized.code(), REFUSED.to_owned()))
            }
        }
        Ok(other) => Err((
            CloseCode::Unauthorized.code(),
            format!("expected hello, got `{}`", other.kind()),
        )),
    }
}

/// The authenticated part of a connection.
async fn serve(mut ws: Ws, key: InstanceKey, shared: Arc<Shared>) {
    let (frames_tx, mut frames) = mpsc::channel::<String>(shared.config.outbound_queue.max(1));
    let (close_tx, mut close_rx) = watch::channel::<Option<(u16, String)>>(None);
    // Become the instance's connection, replacing any older one, and decide the greeting.
    let greeting = {
        let mut map = shared.lock();
        map.get_mut(&key).map(|inst| {
            let id = shared
                .last_conn
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                + 1;
            if let Some(old) = inst.conn.replace(Conn {
                id,
                frames: frames_tx,
                close: close_tx,
            }) {
                let _ = old.close.send(Some((
                    CloseCode::Replaced.code(),
                    "replaced by a newer connection".to_owned(),
                )));
            }
            let live_target = inst
                .migration
                .as_ref()
                .filter(|m| m.side == Side::Target && !m.phase.is_final());
            let ack = WorkerToJob::HelloAck {
                migration: live_target.map(|m| TargetOf {
                    id: m.id.as_str().into(),
                    side: TargetSide::Target,
                }),
            };
            let initial = live_target
                .filter(|m| m.phase == Phase::AwaitingTargetReady)
                .map(|m| WorkerToJob::InitialState {
                    migration_id: m.id.as_str().into(),
                    payload: inst.initial_state.clone().unwrap_or_default(),
                });
            (id, live_target.map(|m| m.id.clone()), ack, initial)
        })
    };
    let Some((conn_id, target_of, ack, initial)) = greeting else {
        // Unregistered between the hello and now.
        close(&mut ws, CloseCode::Unauthorized.code(), REFUSED).await;
        return;
    };
    tracing::info!(job_id = %key.job_id, role = %key.role, connection = conn_id, "job connected");
    let mut ended: Option<(Option<u16>, String)> = None;
    for f in std::iter::once(ack).chain(initial) {
        if ws.send(Message::text(f.to_text())).await.is_err() {
            ended = Some((None, "send failed".to_owned()));
            break;
        }
    }
    let _ = shared
        .events
        .send(ListenerEvent {
            instance: key.clone(),
            kind: EventKind::Connected {
                connection: conn_id,
                target_of,
            },
        })
        .await;
    let mut shutdown = shared.shutdown.clone();
    let idle = shared.config.idle_timeout.max(Duration::from_millis(30));
    let mut last_heard = tokio::time::Instant::now();
    let mut ping = tokio::time::interval_at(last_heard + idle / 3, idle / 3);
    ping.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while ended.is_none() {
        tokio::select! {
            inbound = ws.next() => {
                last_heard = tokio::time::Instant::now();
                ended = on_inbound(inbound, &mut ws, &key, conn_id, &shared).await;
            }
            _ = ping.tick() => {
                if last_heard.elapsed() >= idle {
                    let reason = format!("idle: nothing from the job for {} ms, not even a pong", idle.as_millis());
                    close(&mut ws, 1001, &reason).await;
                    ended = Some((Some(1001), reason));
                } else if !matches!(
                    tokio::time::timeout(shared.config.write_timeout, ws.send(Message::Ping(Default::default()))).await,
                    Ok(Ok(()))
                ) {
                    ended = Some((None, "ping failed; dropped".to_owned()));
                }
            }
            out = frames.recv() => match out {
                Some(text) => {
                    match tokio::time::timeout(shared.config.write_timeout, ws.send(Message::text(text))).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => ended = Some((None, format!("send failed: {e}"))),
                        Err(_) => ended = Some((None, "job stopped reading; dropped".to_owned())),
                    }
                }
                // The instance dropped this connection (replaced or unregistered); the close it
                // asked for is in the watch, which outlives its sender.
                None => {
                    let req = close_rx.borrow().clone();
                    let (code, reason) = req.unwrap_or((1000, "instance removed".to_owned()));
                    close(&mut ws, code, &reason).await;
                    ended = Some((Some(code), reason));
                }
            },
            _ = close_rx.changed() => {
                let req = close_rx.borrow().clone();
                let (code, reason) = req.unwrap_or((1000, "instance removed".to_owned()));
                close(&mut ws, code, &reason).await;
                ended = Some((Some(code), reason));
            }
            _ = shutdown.changed() => {
                close(&mut ws, 1001, "worker shutting down").await;
                ended = Some((Some(1001), "worker shutting down".to_owned()));
            }
        }
    }
    let (code, reason) = ended.unwrap_or((None, String::new()));
    {
        let mut map = shared.lock();
        if let Some(inst) = map.get_mut(&key)
            && inst.conn.as_ref().is_some_and(|c| c.id == conn_id)
        {
            inst.conn = None;
        }
    }
    tracing::info!(job_id = %key.job_id, role = %key.role, connection = conn_id, ?code, %reason, "job disconnected");
    let _ = shared
        .events
        .send(ListenerEvent {
            instance: key,
            kind: EventKind::Disconnected {
                connection: conn_id,
                code,
                reason,
            },
        })
        .await;
}

/// Handles one inbound message; `Some` when the connection is over.
async fn on_inbound(
    inbound: Option<Result<Message, WsError>>,
    ws: &mut Ws,
    key: &InstanceKey,
    conn_id: u64,
    shared: &Arc<Shared>,
) -> Option<(Option<u16>, String)> {
    let protocol = |reason: String| Some((CloseCode::ProtocolError.code(), reason));
    let refusal = match inbound {
        None => return Some((None, "connection closed".to_owned())),
        Some(Ok(Message::Close(frame))) => {
            return Some((
                frame.as_ref().map(|f| u16::from(f.code)),
                frame.map(|f| f.reason.to_string()).unwrap_or_default(),
            ));
        }
        Some(Err(WsError::Capacity(CapacityError::MessageTooLong { size, max_size }))) => Some((
            CloseCode::FrameTooLarge.code(),
            format!("frame of {size} bytes exceeds {max_size}"),
        )),
        Some(Err(WsError::Utf8(_))) => protocol(NOT_UTF8.to_owned()),
        Some(Err(e)) => return Some((None, format!("transport error: {e}"))),
        Some(Ok(Message::Binary(_))) => protocol("frames must be JSON text".to_owned()),
        Some(Ok(Message::Ping(_) | Message::Pong(_) | Message::Frame(_))) => return None,
        Some(Ok(Message::Text(text))) => match parse_job_to_worker(text.as_str()).into_result() {
            Err(reason) => protocol(reason),
            Ok(JobToWorker::Hello { .. }) => {
                protocol("unexpected `hello`: already authenticated".to_owned())
            }
            Ok(frame) => {
                let applied = {
                    let mut map = shared.lock();
                    match map.get_mut(key) {
                        // Frames from a connection that has been replaced are not the job's word any more.
                        Some(inst) if inst.conn.as_ref().is_some_and(|c| c.id == conn_id) => {
                            phase::on_job_frame(inst.migration.as_ref(), &frame).map(|m| {
                                inst.migration = Some(m.clone());
                                Some(m)
                            })
                        }
                        _ => Ok(None),
                    }
                };
                match applied {
                    Ok(Some(m)) => {
                        tracing::debug!(job_id = %key.job_id, role = %key.role, frame = frame.kind(), phase = m.phase.name(), "relayed from job");
                        let kind = EventKind::Frame {
                            migration_id: m.id,
                            frame,
                            phase: m.phase,
                        };
                        let _ = shared
                            .events
                            .send(ListenerEvent {
                                instance: key.clone(),
                                kind,
                            })
                            .await;
                        None
                    }
                    Ok(None) => None,
                    Err(e) => protocol(e.to_string()),
                }
            }
        },
    };
    let (code, reason) = refusal?;
    tracing::info!(job_id = %key.job_id, role = %key.role, code, %reason, "closing job socket");
    close(ws, code, &reason).await;
    Some((Some(code), reason))
}
