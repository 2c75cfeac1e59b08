//! The tonic layer: serves [`World`] as the `Manager` and `SimAdmin` gRPC
//! services, drives its timers, fans events out to watchers, answers
//! migration asks through a [`JobAgent`], persists to `--state-dir`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use manager_proto::manager_server::{Manager, ManagerServer};
use manager_proto::sim_admin_server::{SimAdmin, SimAdminServer};
use manager_proto::{
    AdminResponse, CallCountsRequest, CallCountsResponse, CreateNodeRequest, CreateNodeResponse,
    CutStreamsRequest, DeleteBundleRequest, DeleteBundleResponse, Event, EventBatch,
    FailJobRequest, Heartbeat, JobHistoryRequest, JobHistoryResponse, KillNodeRequest,
    KillZoneRequest, KillZoneResponse, ListNodesRequest, ListNodesResponse, ListPoolsRequest,
    ListPoolsResponse, MigrationResponse, NodeControllerMigrationAbort,
    NodeControllerMigrationCutover, NodeControllerMigrationGetState,
    NodeControllerMigrationPrepareTarget, NoticeNodeRequest, PartitionZoneRequest,
    RegisterBundleRequest, RegisterBundleResponse, RejectNextRequest, RejectionReason,
    SetMigrationBehaviourRequest, SlowProvisionRequest, Snapshot, SnapshotReason, StartJobRequest,
    StartJobResponse, StartNodeRequest, StartNodeResponse, StopJobRequest, StopJobResponse,
    StopNodeRequest, StopNodeResponse, Synced, TerminateNodeRequest, TerminateNodeResponse,
    UpdateJobConfigRequest, UpdateJobConfigResponse, WatchRequest, WatchResponse, watch_response,
};
use subtle::ConstantTimeEq;
use tokio::sync::{Notify, mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status};

use crate::behaviour::{BehaviourError, JobBehaviour};
use crate::config::{LimitsConfig, SimConfig};
use crate::world::{
    CommandError, JobAsk, JobReply, PersistedWorld, Resume, StartOutcome, World, WorldSnapshot,
    default_reply,
};

/// Events per message while a resuming watcher catches up from the log.
const CATCH_UP_BATCH: usize = 1024;
/// How often a dirty world is written to the state dir.
pub(crate) const PERSIST_EVERY: Duration = Duration::from_millis(250);
/// The file in the state dir.
const STATE_FILE: &str = "manager-sim-state.json";
/// SimAdmin's FailJob request metadata naming the role whose instance fails (a published
/// job's; absent or empty: every live instance). Our first API's jobs fail their normal
/// instance whatever it says.
pub const FAIL_JOB_ROLE_HEADER: &str = "x-manager-sim-role";
/// The heartbeat intervals a watcher may ask for (`WatchRequest.heartbeat_interval_ms`).
const HEARTBEAT_MS: std::ops::RangeInclusive<u64> = 100..=3_600_000;

/// Why the sim could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Configuration problem.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Binding, reading TLS files or the state dir.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Cause.
        source: std::io::Error,
    },
    /// The persisted state could not be read.
    #[error("state file {path} is corrupt: {message}")]
    CorruptState {
        /// The file.
        path: PathBuf,
        /// Parser message.
        message: String,
    },
    /// TLS set-up failed.
    #[error("tls: {0}")]
    Tls(String),
}

/// Answers the questions a migration asks a job (the job side of the job
/// socket). The default, [`DefaultAgent`], answers like a cooperative job
/// with nothing to hand over; a job-socket relay can be plugged in instead.
pub trait JobAgent: Send + Sync + 'static {
    /// The job's answer to `ask`.
    fn answer(&self, ask: JobAsk) -> BoxFuture<'static, JobReply>;

    /// Every event the world emits, in order, before watchers see it
    /// (called with the world locked: must not block). An agent that runs
    /// real jobs registers and forgets instances here.
    fn observe(&self, _events: &[Event]) {}

    /// Called once at start with the way to report what a job says
    /// between asks (its own `abort`).
    fn attach(&self, _events: JobEvents) {}

    /// `SimAdmin.SetMigrationBehaviour`: script how a job answers.
    fn set_behaviour(&self, _job_id: &str, _behaviour: JobBehaviour) -> Result<(), BehaviourError> {
        Err(BehaviourError::Unsupported)
    }
}

/// Reports to the sim what a job says outside an ask. Holds the sim
/// weakly: reports after shutdown are dropped.
#[derive(Clone)]
pub struct JobEvents(std::sync::Weak<Inner>);

impl std::fmt::Debug for JobEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("JobEvents")
    }
}

impl JobEvents {
    /// The job aborted `migration_id` on its own (source or target side).
    pub fn job_aborted(&self, migration_id: &str, from_source: bool, reason: &str) {
        if let Some(inner) = self.0.upgrade() {
            inner.apply(|w, now| w.migration_job_abort(migration_id, from_source, reason, now));
        }
    }
}

/// Answers every ask at once with [`default_reply`].
#[derive(Debug, Default, Clone, Copy)]
pub struct DefaultAgent;

impl JobAgent for DefaultAgent {
    fn answer(&self, ask: JobAsk) -> BoxFuture<'static, JobReply> {
        Box::pin(async move { default_reply(&ask) })
    }
}

/// A [`JobAgent`] from a function, for tests that script how jobs answer
/// (refuse state, abort, report failed participants, or answer by default).
pub struct FnAgent<F>(pub F);

impl<F> JobAgent for FnAgent<F>
where
    F: Fn(&JobAsk) -> JobReply + Send + Sync + 'static,
{
    fn answer(&self, ask: JobAsk) -> BoxFuture<'static, JobReply> {
        let reply = (self.0)(&ask);
        Box::pin(async move { reply })
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

struct Subscriber {
    tx: mpsc::Sender<WatchResponse>,
    cut: Arc<Mutex<Option<Status>>>,
}

struct Shared {
    world: World,
    subs: Vec<Subscriber>,
    dirty: bool,
}

/// The Manager RPCs that only read: every other one asks Manager to change something.
const READ_ONLY_RPCS: [&str; 3] = ["ListNodes", "ListPools", "Watch"];

/// How many calls of each Manager RPC the sim has served (answered or refused), for
/// `SimAdmin.CallCounts`: a test can tell whether a client asked Manager to change anything.
#[derive(Default)]
struct CallCounts(Mutex<std::collections::BTreeMap<&'static str, u64>>);

impl CallCounts {
    fn count(&self, rpc: &'static str) {
        *lock(&self.0).entry(rpc).or_default() += 1;
    }

    fn report(&self) -> CallCountsResponse {
        let calls = lock(&self.0).clone();
        let mutating = calls
            .iter()
            .filter(|(rpc, _)| !READ_ONLY_RPCS.contains(rpc))
            .map(|(_, n)| n)
            .sum();
        CallCountsResponse {
            calls: calls.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            mutating,
        }
    }
}

struct Inner {
    shared: Mutex<Shared>,
    calls: CallCounts,
    timer_wake: Notify,
    /// When the timer task will wake next (ms since epoch).
    timer_armed: std::sync::atomic::AtomicI64,
    agent: Arc<dyn JobAgent>,
    limits: LimitsConfig,
    state_file: Option<PathBuf>,
    shutdown: watch::Sender<bool>,
    /// While true every Watch stream is held open and sent nothing ([`SimHandle::stall_watches`]).
    stalled: watch::Sender<bool>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves the world as it was between two
    // commands' statements at worst; keep serving rather than cascade.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    fn subscribe(
        &mut self,
        buffer: usize,
    ) -> (mpsc::Receiver<WatchResponse>, Arc<Mutex<Option<Status>>>) {
        // Forget watchers whose streams ended while nothing was broadcast.
        self.subs.retain(|s| !s.tx.is_closed());
        let (tx, rx) = mpsc::channel(buffer);
        let cut = Arc::new(Mutex::new(None));
        self.subs.push(Subscriber {
            tx,
            cut: cut.clone(),
        });
        (rx, cut)
    }

    fn broadcast(&mut self, events: Vec<manager_proto::Event>) {
        // Keep messages bounded: a command that emits many events (deleting
        // a large bundle) goes out as several batches.
        if events.len() <= CATCH_UP_BATCH {
            self.broadcast_batch(events);
            return;
        }
        let mut rest = events.into_iter();
        loop {
            let chunk: Vec<_> = rest.by_ref().take(CATCH_UP_BATCH).collect();
            if chunk.is_empty() {
                return;
            }
            self.broadcast_batch(chunk);
        }
    }

    fn broadcast_batch(&mut self, events: Vec<manager_proto::Event>) {
        let revision = events.last().map_or(0, |e| e.revision);
        let msg = WatchResponse {
            kind: Some(watch_response::Kind::Events(EventBatch { events })),
        };
        // The last subscriber gets the message itself: no clone when there
        // is one watcher (the operator).
        let mut msg = Some(msg);
        let last = self.subs.len().saturating_sub(1);
        let mut i = 0usize;
        self.subs.retain(|s| {
            let m = if i == last { msg.take() } else { msg.clone() };
            i += 1;
            let Some(m) = m else { return false };
            match s.tx.try_send(m) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!(revision, "cutting a watcher that fell behind");
                *lock(&s.cut) = Some(Status::resource_exhausted(format!(
                    "watcher too slow: its buffer of event batches is full; resume from your last revision (now {revision})"
                )));
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
        });
    }

    /// Shows new events to the agent and broadcasts them; returns new
    /// migration asks.
    fn publish(&mut self, agent: &dyn JobAgent) -> Vec<JobAsk> {
        let events = self.world.take_events();
        if !events.is_empty() {
            agent.observe(&events);
            self.dirty = true;
            self.broadcast(events);
        }
        self.world.take_asks()
    }

    fn cut_all(&mut self, status: &Status) {
        for s in self.subs.drain(..) {
            *lock(&s.cut) = Some(status.clone());
        }
    }
}

impl Inner {
    /// Runs `f` on the world at the current time, then publishes what it did.
    fn apply<R>(self: &Arc<Self>, f: impl FnOnce(&mut World, i64) -> R) -> R {
        let now = now_ms();
        let (r, asks) = {
            let mut g = lock(&self.shared);
            g.world.advance(now);
            let r = f(&mut g.world, now);
            // Zero-delay transitions fire now, in the same batch.
            g.world.advance(now);
            (r, g.publish(&*self.agent))
        };
        self.dispatch(asks);
        self.wake_timers_if_needed();
        r
    }

    /// Wakes the timer task only when a timer is due before it would wake.
    fn wake_timers_if_needed(&self) {
        let due = lock(&self.shared).world.next_due_ms();
        let armed = self.timer_armed.load(std::sync::atomic::Ordering::Relaxed);
        if due.is_some_and(|d| d < armed) {
            self.timer_wake.notify_one();
        }
    }

    /// Hands migration asks to the agent; answers come back to the world.
    fn dispatch(self: &Arc<Self>, asks: Vec<JobAsk>) {
        for ask in asks {
            let inner = self.clone();
            tokio::spawn(async move {
                let reply = inner.agent.answer(ask.clone()).await;
                inner.on_reply(&ask, reply);
            });
        }
    }

    fn on_reply(self: &Arc<Self>, ask: &JobAsk, reply: JobReply) {
        let asks = {
            let mut g = lock(&self.shared);
            let now = now_ms();
            g.world.advance(now);
            g.world.migration_reply(ask, reply, now);
            g.world.advance(now);
            g.publish(&*self.agent)
        };
        self.dispatch(asks);
        self.wake_timers_if_needed();
    }

    /// The periodic state write (only when something changed).
    fn persist(&self) -> Result<(), SimError> {
        self.persist_as(false)
    }

    /// The last state write of a stopping sim: always written, and marked clean, so a restart
    /// from it keeps the epoch.
    fn persist_final(&self) -> Result<(), SimError> {
        self.persist_as(true)
    }

    fn persist_as(&self, clean_shutdown: bool) -> Result<(), SimError> {
        let Some(path) = &self.state_file else {
            return Ok(());
        };
        let saved: PersistedWorld = {
            let mut g = lock(&self.shared);
            if !g.dirty && !clean_shutdown {
                return Ok(());
            }
            g.dirty = false;
            PersistedWorld {
                clean_shutdown,
                ..g.world.persisted()
            }
        };
        write_state(path, &saved)
    }
}

pub(crate) fn write_state(
    path: &std::path::Path,
    saved: &impl serde::Serialize,
) -> Result<(), SimError> {
    let io = |what: &str| {
        let what = format!("{what} {}", path.display());
        move |source| SimError::Io { what, source }
    };
    let bytes = serde_json::to_vec(saved).map_err(|e| SimError::Io {
        what: "serialising the world".to_owned(),
        source: std::io::Error::other(e),
    })?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes).map_err(io("writing"))?;
    // rename is atomic: a crash leaves the previous complete state.
    std::fs::rename(&tmp, path).map_err(io("replacing"))?;
    Ok(())
}

pub(crate) fn status(e: CommandError) -> Status {
    match e {
        CommandError::InvalidArgument(m) => Status::invalid_argument(m),
        CommandError::NotFound(m) => Status::not_found(m),
        CommandError::FailedPrecondition(m) => Status::failed_precondition(m),
        CommandError::AlreadyExists(m) => Status::already_exists(m),
        CommandError::Unavailable(m) => Status::unavailable(m),
    }
}

fn migration_response(m: manager_proto::Migration) -> Response<MigrationResponse> {
    Response::new(MigrationResponse {
        migration: Some(m),
        ..Default::default()
    })
}

fn behaviour_status(e: BehaviourError) -> Status {
    match e {
        BehaviourError::Invalid(m) => Status::invalid_argument(m),
        e @ BehaviourError::Unsupported => Status::failed_precondition(e.to_string()),
    }
}

fn missing(field: &str) -> Status {
    Status::invalid_argument(format!("{field} is required"))
}

/// Checks the bearer token in constant time.
fn authorize(token: Option<&Arc<str>>, req: &Request<()>) -> Result<(), Status> {
    let Some(expected) = token else {
        return Ok(());
    };
    let given = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(Status::unauthenticated("missing or wrong bearer token"))
    }
}

fn snapshot_messages(
    snap: WorldSnapshot,
    reason: SnapshotReason,
    chunk: usize,
) -> Vec<WatchResponse> {
    let chunk = chunk.max(1);
    let mut out = Vec::new();
    let mut cur = Snapshot {
        epoch: snap.epoch.clone(),
        revision: snap.revision,
        reason: reason as i32,
        ..Default::default()
    };
    let mut n = 0usize;
    let flush = |cur: &mut Snapshot, n: &mut usize, out: &mut Vec<WatchResponse>| {
        let next = Snapshot {
            epoch: cur.epoch.clone(),
            revision: cur.revision,
            reason: cur.reason,
            ..Default::default()
        };
        out.push(WatchResponse {
            kind: Some(watch_response::Kind::Snapshot(std::mem::replace(cur, next))),
        });
        *n = 0;
    };
    for node in snap.nodes {
        cur.nodes.push(node);
        n += 1;
        if n == chunk {
            flush(&mut cur, &mut n, &mut out);
        }
    }
    for job in snap.jobs {
        cur.jobs.push(job);
        n += 1;
        if n == chunk {
            flush(&mut cur, &mut n, &mut out);
        }
    }
    for b in snap.bundles {
        cur.bundles.push(b);
        n += 1;
        if n == chunk {
            flush(&mut cur, &mut n, &mut out);
        }
    }
    for m in snap.migrations {
        cur.migrations.push(m);
        n += 1;
        if n == chunk {
            flush(&mut cur, &mut n, &mut out);
        }
    }
    cur.last = true;
    out.push(WatchResponse {
        kind: Some(watch_response::Kind::Snapshot(cur)),
    });
    out.push(WatchResponse {
        kind: Some(watch_response::Kind::Synced(Synced {
            epoch: snap.epoch,
            revision: snap.revision,
        })),
    });
    out
}

type Out = mpsc::Sender<Result<WatchResponse, Status>>;

/// The revision a client holds everything up to once it has read `m`, if `m` moves it.
fn revision_after(m: &WatchResponse) -> Option<u64> {
    match &m.kind {
        Some(watch_response::Kind::Synced(s)) => Some(s.revision),
        Some(watch_response::Kind::Events(b)) => b.events.last().map(|e| e.revision),
        _ => None,
    }
}

/// Waits until the watches are not stalled; false when the stream should end instead (the client
/// went away or the sim is shutting down, which is then said on the stream).
async fn until_unstalled(
    stalled: &mut watch::Receiver<bool>,
    out: &Out,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    tokio::select! {
        // The guard `wait_for` answers with is not Send: keep it inside this future.
        ok = async { stalled.wait_for(|s| !*s).await.is_ok() } => ok,
        () = out.closed() => false,
        _ = shutdown.changed() => {
            let _ = out.send(Err(Status::unavailable("manager-sim is shutting down"))).await;
            false
        }
    }
}

async fn run_watch(
    inner: Arc<Inner>,
    req: WatchRequest,
    out: Out,
    mut shutdown: watch::Receiver<bool>,
) {
    let heartbeat =
        (req.heartbeat_interval_ms > 0).then(|| Duration::from_millis(req.heartbeat_interval_ms));
    let mut stalled = inner.stalled.subscribe();
    enum Step {
        More(Vec<WatchResponse>, u64),
        Done(
            Vec<WatchResponse>,
            mpsc::Receiver<WatchResponse>,
            Arc<Mutex<Option<Status>>>,
        ),
    }
    let mut cursor = (req.resume_revision > 0).then_some(req.resume_revision);
    let mut reason = SnapshotReason::Initial;
    let epoch = {
        let g = lock(&inner.shared);
        if cursor.is_some() && !req.epoch.is_empty() && req.epoch != g.world.epoch() {
            cursor = None;
            reason = SnapshotReason::EpochChanged;
        }
        g.world.epoch().to_owned()
    };
    // The revision the client holds everything up to, for heartbeats.
    let mut sent = 0;
    let (live, cut) = loop {
        let step = {
            let mut g = lock(&inner.shared);
            match cursor {
                Some(rev) => match g.world.events_after(rev, CATCH_UP_BATCH) {
                    Resume::Events(evs) if evs.len() < CATCH_UP_BATCH => {
                        let revision = evs.last().map_or(rev, |e| e.revision);
                        let mut msgs = Vec::new();
                        if !evs.is_empty() {
                            msgs.push(WatchResponse {
                                kind: Some(watch_response::Kind::Events(EventBatch {
                                    events: evs,
                                })),
                            });
                        }
                        msgs.push(WatchResponse {
                            kind: Some(watch_response::Kind::Synced(Synced {
                                epoch: g.world.epoch().to_owned(),
                                revision,
                            })),
                        });
                        let (rx, cut) = g.subscribe(inner.limits.watch_buffer);
                        Step::Done(msgs, rx, cut)
                    }
                    Resume::Events(evs) => {
                        let revision = evs.last().map_or(rev, |e| e.revision);
                        let msg = WatchResponse {
                            kind: Some(watch_response::Kind::Events(EventBatch { events: evs })),
                        };
                        Step::More(vec![msg], revision)
                    }
                    Resume::TooOld => {
                        reason = SnapshotReason::RevisionTooOld;
                        let snap = g.world.snapshot();
                        let (rx, cut) = g.subscribe(inner.limits.watch_buffer);
                        drop(g);
                        Step::Done(
                            snapshot_messages(snap, reason, inner.limits.snapshot_chunk),
                            rx,
                            cut,
                        )
                    }
                    Resume::Unknown => {
                        reason = SnapshotReason::EpochChanged;
                        let snap = g.world.snapshot();
                        let (rx, cut) = g.subscribe(inner.limits.watch_buffer);
                        drop(g);
                        Step::Done(
                            snapshot_messages(snap, reason, inner.limits.snapshot_chunk),
                            rx,
                            cut,
                        )
                    }
                },
                None => {
                    let snap = g.world.snapshot();
                    let (rx, cut) = g.subscribe(inner.limits.watch_buffer);
                    drop(g);
                    Step::Done(
                        snapshot_messages(snap, reason, inner.limits.snapshot_chunk),
                        rx,
                        cut,
                    )
                }
            }
        };
        let (msgs, done) = match step {
            Step::More(msgs, rev) => {
                cursor = Some(rev);
                (msgs, None)
            }
            Step::Done(msgs, rx, cut) => (msgs, Some((rx, cut))),
        };
        for m in msgs {
            if !until_unstalled(&mut stalled, &out, &mut shutdown).await {
                return;
            }
            sent = revision_after(&m).unwrap_or(sent);
            tokio::select! {
                r = out.send(Ok(m)) => if r.is_err() { return },
                _ = shutdown.changed() => {
                    let _ = out.send(Err(Status::unavailable("manager-sim is shutting down"))).await;
                    return;
                }
            }
        }
        if let Some(done) = done {
            break done;
        }
    };
    let mut live = live;
    // Heartbeats are due after this much silence; without them the timer never fires.
    let quiet = heartbeat.unwrap_or(Duration::from_secs(86_400 * 365));
    let beat = tokio::time::sleep(quiet);
    tokio::pin!(beat);
    loop {
        let running = !*stalled.borrow_and_update();
        tokio::select! {
            m = live.recv(), if running => match m {
                Some(m) => {
                    // Stalled since this loop looked: hold the message like the rest.
                    if !until_unstalled(&mut stalled, &out, &mut shutdown).await {
                        return;
                    }
                    sent = revision_after(&m).unwrap_or(sent);
                    if out.send(Ok(m)).await.is_err() { return }
                    beat.as_mut().reset(tokio::time::Instant::now() + quiet);
                }
                None => {
                    let st = lock(&cut).take().unwrap_or_else(|| Status::unavailable("watch closed by the server"));
                    let _ = out.send(Err(st)).await;
                    return;
                }
            },
            () = &mut beat, if running && heartbeat.is_some() => {
                let m = WatchResponse {
                    kind: Some(watch_response::Kind::Heartbeat(Heartbeat {
                        epoch: epoch.clone(),
                        revision: sent,
                    })),
                };
                if out.send(Ok(m)).await.is_err() { return }
                beat.as_mut().reset(tokio::time::Instant::now() + quiet);
            }
            // Stalled or resumed: look again. The sender lives in `inner`, so this never errs.
            _ = stalled.changed() => {
                beat.as_mut().reset(tokio::time::Instant::now() + quiet);
            }
            () = out.closed() => return,
            _ = shutdown.changed() => {
                let _ = out.send(Err(Status::unavailable("manager-sim is shutting down"))).await;
                return;
            }
        }
    }
}

/// The sim's Manager service: what its gRPC server serves, and what a test calls in process
/// ([`SimHandle::service`], with `manager_client::InProcess`). Calls are counted either way.
#[derive(Clone)]
pub struct SimService(Arc<Inner>);

impl std::fmt::Debug for SimService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimService").finish_non_exhaustive()
    }
}

type WatchStream = Pin<Box<dyn futures::Stream<Item = Result<WatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Manager for SimService {
    async fn create_node(
        &self,
        req: Request<CreateNodeRequest>,
    ) -> Result<Response<CreateNodeResponse>, Status> {
        self.0.calls.count("CreateNode");
        let req = req.into_inner();
        let node = self
            .0
            .apply(|w, now| w.create_node(&req, now))
            .map_err(status)?;
        Ok(Response::new(CreateNodeResponse { node: Some(node) }))
    }

    async fn terminate_node(
        &self,
        req: Request<TerminateNodeRequest>,
    ) -> Result<Response<TerminateNodeResponse>, Status> {
        self.0.calls.count("TerminateNode");
        let req = req.into_inner();
        let node = self
            .0
            .apply(|w, now| w.terminate_node(&req.node_id, now))
            .map_err(status)?;
        Ok(Response::new(TerminateNodeResponse { node: Some(node) }))
    }

    async fn stop_node(
        &self,
        req: Request<StopNodeRequest>,
    ) -> Result<Response<StopNodeResponse>, Status> {
        self.0.calls.count("StopNode");
        let req = req.into_inner();
        let node = self
            .0
            .apply(|w, now| w.stop_node(&req.node_id, now))
            .map_err(status)?;
        Ok(Response::new(StopNodeResponse { node: Some(node) }))
    }

    async fn start_node(
        &self,
        req: Request<StartNodeRequest>,
    ) -> Result<Response<StartNodeResponse>, Status> {
        self.0.calls.count("StartNode");
        let req = req.into_inner();
        let node = self
            .0
            .apply(|w, now| w.start_node(&req.node_id, now))
            .map_err(status)?;
        Ok(Response::new(StartNodeResponse { node: Some(node) }))
    }

    async fn list_nodes(
        &self,
        req: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesResponse>, Status> {
        self.0.calls.count("ListNodes");
        let req = req.into_inner();
        let pool = (!req.pool.is_empty()).then_some(req.pool.as_str());
        let nodes = self.0.apply(|w, _| w.nodes(pool));
        Ok(Response::new(ListNodesResponse { nodes }))
    }

    async fn list_pools(
        &self,
        _req: Request<ListPoolsRequest>,
    ) -> Result<Response<ListPoolsResponse>, Status> {
        self.0.calls.count("ListPools");
        let pools = self.0.apply(|w, _| w.pools());
        Ok(Response::new(ListPoolsResponse { pools }))
    }

    async fn register_bundle(
        &self,
        req: Request<RegisterBundleRequest>,
    ) -> Result<Response<RegisterBundleResponse>, Status> {
        self.0.calls.count("RegisterBundle");
        let bundle = req.into_inner().bundle.ok_or_else(|| missing("bundle"))?;
        let (bundle, job_ids) = self
            .0
            .apply(|w, now| w.register_bundle(&bundle, now))
            .map_err(status)?;
        Ok(Response::new(RegisterBundleResponse {
            bundle: Some(bundle),
            job_ids,
        }))
    }

    async fn update_bundle(
        &self,
        req: Request<RegisterBundleRequest>,
    ) -> Result<Response<RegisterBundleResponse>, Status> {
        self.0.calls.count("UpdateBundle");
        let bundle = req.into_inner().bundle.ok_or_else(|| missing("bundle"))?;
        let (bundle, job_ids) = self
            .0
            .apply(|w, now| w.update_bundle(&bundle, now))
            .map_err(status)?;
        Ok(Response::new(RegisterBundleResponse {
            bundle: Some(bundle),
            job_ids,
        }))
    }

    async fn delete_bundle(
        &self,
        req: Request<DeleteBundleRequest>,
    ) -> Result<Response<DeleteBundleResponse>, Status> {
        self.0.calls.count("DeleteBundle");
        let req = req.into_inner();
        let removed_job_ids = self
            .0
            .apply(|w, now| w.delete_bundle(&req.bundle_id, now))
            .map_err(status)?;
        Ok(Response::new(DeleteBundleResponse { removed_job_ids }))
    }

    async fn start_job(
        &self,
        req: Request<StartJobRequest>,
    ) -> Result<Response<StartJobResponse>, Status> {
        self.0.calls.count("StartJob");
        let req = req.into_inner();
        let (outcome, job) = self
            .0
            .apply(|w, now| {
                let o = w.start_job(&req.job_id, &req.node_id, req.role, now)?;
                Ok((o, w.job(&req.job_id).cloned()))
            })
            .map_err(status)?;
        let resp = match outcome {
            StartOutcome::Accepted => StartJobResponse {
                accepted: true,
                rejection_reason: RejectionReason::Unspecified as i32,
                message: String::new(),
                job,
            },
            StartOutcome::Rejected { reason, message } => StartJobResponse {
                accepted: false,
                rejection_reason: reason as i32,
                message,
                job,
            },
        };
        Ok(Response::new(resp))
    }

    async fn stop_job(
        &self,
        req: Request<StopJobRequest>,
    ) -> Result<Response<StopJobResponse>, Status> {
        self.0.calls.count("StopJob");
        let req = req.into_inner();
        let job = self
            .0
            .apply(|w, now| w.stop_job_with(&req.job_id, req.role, req.reason, now))
            .map_err(status)?;
        Ok(Response::new(StopJobResponse { job: Some(job) }))
    }

    async fn update_job_config(
        &self,
        req: Request<UpdateJobConfigRequest>,
    ) -> Result<Response<UpdateJobConfigResponse>, Status> {
        self.0.calls.count("UpdateJobConfig");
        let req = req.into_inner();
        let job = self
            .0
            .apply(|w, now| w.update_job_config(&req.job_id, &req.config, now))
            .map_err(status)?;
        Ok(Response::new(UpdateJobConfigResponse { job: Some(job) }))
    }

    async fn migration_get_state(
        &self,
        req: Request<NodeControllerMigrationGetState>,
    ) -> Result<Response<MigrationResponse>, Status> {
        self.0.calls.count("MigrationGetState");
        let req = req.into_inner();
        let m = self
            .0
            .apply(|w, now| {
                w.migration_get_state(&req.migration_id, &req.job_id, req.strategy, now)
            })
            .map_err(status)?;
        Ok(migration_response(m))
    }

    async fn migration_prepare_target(
        &self,
        req: Request<NodeControllerMigrationPrepareTarget>,
    ) -> Result<Response<MigrationResponse>, Status> {
        self.0.calls.count("MigrationPrepareTarget");
        let req = req.into_inner();
        let (m, outcome) = self
            .0
            .apply(|w, now| {
                w.migration_prepare_target(
                    &req.migration_id,
                    &req.target_node_id,
                    &req.initial_state,
                    now,
                )
            })
            .map_err(status)?;
        let mut resp = MigrationResponse {
            migration: Some(m),
            ..Default::default()
        };
        if let StartOutcome::Rejected { reason, message } = outcome {
            resp.target_rejected = true;
            resp.rejection_reason = reason as i32;
            resp.message = message;
        }
        Ok(Response::new(resp))
    }

    async fn migration_cutover(
        &self,
        req: Request<NodeControllerMigrationCutover>,
    ) -> Result<Response<MigrationResponse>, Status> {
        self.0.calls.count("MigrationCutover");
        let req = req.into_inner();
        let m = self
            .0
            .apply(|w, now| w.migration_cutover(&req.migration_id, &req.payload, now))
            .map_err(status)?;
        Ok(migration_response(m))
    }

    async fn migration_abort(
        &self,
        req: Request<NodeControllerMigrationAbort>,
    ) -> Result<Response<MigrationResponse>, Status> {
        self.0.calls.count("MigrationAbort");
        let req = req.into_inner();
        let m = self
            .0
            .apply(|w, now| w.migration_abort(&req.migration_id, &req.reason, now))
            .map_err(status)?;
        Ok(migration_response(m))
    }

    type WatchStream = WatchStream;

    async fn watch(
        &self,
        req: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        self.0.calls.count("Watch");
        let req = req.into_inner();
        if req.heartbeat_interval_ms != 0 && !HEARTBEAT_MS.contains(&req.heartbeat_interval_ms) {
            return Err(Status::invalid_argument(format!(
                "heartbeat_interval_ms is {}: 0 (no heartbeats) or {} to {}",
                req.heartbeat_interval_ms,
                HEARTBEAT_MS.start(),
                HEARTBEAT_MS.end()
            )));
        }
        let (tx, rx) = mpsc::channel(32);
        let shutdown = self.0.shutdown.subscribe();
        if *shutdown.borrow() {
            return Err(Status::unavailable("manager-sim is shutting down"));
        }
        tokio::spawn(run_watch(self.0.clone(), req, tx, shutdown));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}

#[derive(Clone)]
/// SimAdmin over the sim's world, and the published API's service (its streams are cut too).
struct AdminSvc(Arc<Inner>, Option<crate::published::PublishedService>);

/// Adds the node ids of one world to another's, once each (both worlds hold the physical nodes).
fn merge_ids(ids: &mut Vec<String>, more: Vec<String>) {
    for id in more {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
}

fn done(summary: String) -> Result<Response<AdminResponse>, Status> {
    tracing::info!(%summary, "chaos");
    Ok(Response::new(AdminResponse { summary }))
}

#[tonic::async_trait]
impl SimAdmin for AdminSvc {
    async fn kill_node(
        &self,
        req: Request<KillNodeRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let req = req.into_inner();
        // The published API's world has nodes of its own (and the physical nodes both know):
        // the node dies in each world that holds it.
        let published = self.1.as_ref().and_then(|p| p.kill_node(&req.node_id));
        let ours = self
            .0
            .apply(|w, now| w.kill_node(&req.node_id, now))
            .map_err(status);
        match (published, ours) {
            (Some(Err(e)), _) | (None, Err(e)) => return Err(e),
            (Some(Ok(())), _) | (None, Ok(_)) => {}
        }
        done(format!("killed node {}", req.node_id))
    }

    async fn notice_node(
        &self,
        req: Request<NoticeNodeRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let req = req.into_inner();
        // The notice reaches each world that holds the node, as a kill does.
        let published = self
            .1
            .as_ref()
            .and_then(|p| p.notice_node(&req.node_id, req.in_ms, &req.reason));
        let ours = self
            .0
            .apply(|w, now| w.notice_node(&req.node_id, req.in_ms, &req.reason, now))
            .map_err(status);
        let reason = match (published, ours) {
            (Some(Err(e)), _) | (None, Err(e)) => return Err(e),
            (_, Ok(node)) => node.reclaim_reason,
            (Some(Ok(())), Err(_)) if req.reason.is_empty() => "spot-interruption".to_owned(),
            (Some(Ok(())), Err(_)) => req.reason.clone(),
        };
        done(format!(
            "node {} will be reclaimed in {} ms ({reason})",
            req.node_id, req.in_ms
        ))
    }

    async fn fail_job(
        &self,
        req: Request<FailJobRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        // FailJobRequest predates roles; a published job's role travels as request metadata.
        let role = match req.metadata().get(FAIL_JOB_ROLE_HEADER) {
            Some(v) => v
                .to_str()
                .map_err(|_| {
                    Status::invalid_argument(format!("{FAIL_JOB_ROLE_HEADER} must be ASCII"))
                })?
                .to_owned(),
            None => String::new(),
        };
        let req = req.into_inner();
        // A job id only one world knows is that world's (the published world's ids are
        // `namespace.name/replica/job`); unknown to both, our first API's world says NOT_FOUND.
        let published = self
            .1
            .as_ref()
            .and_then(|p| p.fail_job(&req.job_id, &role, &req.message));
        if let Some(failed) = published {
            let roles = failed?;
            return done(format!("failed job {} ({})", req.job_id, roles.join(", ")));
        }
        self.0
            .apply(|w, now| w.fail_job(&req.job_id, &req.message, now))
            .map_err(status)?;
        done(format!("failed job {}", req.job_id))
    }

    async fn reject_next(
        &self,
        req: Request<RejectNextRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let count = req.into_inner().count;
        // Each world refuses its own next starts.
        if let Some(p) = &self.1 {
            p.reject_next(count);
        }
        self.0.apply(|w, _| w.reject_next(count));
        done(format!("the next {count} starts will be rejected"))
    }

    async fn cut_streams(
        &self,
        _req: Request<CutStreamsRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let n = {
            let mut g = lock(&self.0.shared);
            let n = g.subs.len();
            g.cut_all(&Status::unavailable("stream cut by chaos cut-streams"));
            n
        };
        let published = self
            .1
            .as_ref()
            .map_or(0, crate::published::PublishedService::cut_streams);
        done(format!(
            "cut {n} watch streams and {published} published event streams"
        ))
    }

    async fn slow_provision(
        &self,
        req: Request<SlowProvisionRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let ms = req.into_inner().delay_ms;
        if let Some(p) = &self.1 {
            p.slow_provision(ms)?;
        }
        self.0.apply(|w, _| w.slow_provision(ms)).map_err(status)?;
        done(format!("elastic provisioning now takes {ms} ms"))
    }

    async fn partition_zone(
        &self,
        req: Request<PartitionZoneRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let req = req.into_inner();
        // The zone is cut off in both worlds: each holds nodes of its own there.
        let mut ids = match &self.1 {
            Some(p) => p.partition_zone(&req.zone, req.heal)?,
            None => Vec::new(),
        };
        let ours = self
            .0
            .apply(|w, now| w.partition_zone(&req.zone, req.heal, now))
            .map_err(status)?;
        merge_ids(&mut ids, ours);
        let verb = if req.heal { "healed" } else { "partitioned" };
        done(format!(
            "{verb} zone {} ({} nodes: {})",
            req.zone,
            ids.len(),
            ids.join(", ")
        ))
    }

    async fn kill_zone(
        &self,
        req: Request<KillZoneRequest>,
    ) -> Result<Response<KillZoneResponse>, Status> {
        let req = req.into_inner();
        // The zone dies in both worlds: each holds nodes of its own there.
        let mut node_ids = match &self.1 {
            Some(p) => p.kill_zone(&req.zone, req.revive)?,
            None => Vec::new(),
        };
        let ours = self
            .0
            .apply(|w, now| w.kill_zone(&req.zone, req.revive, now))
            .map_err(status)?;
        merge_ids(&mut node_ids, ours);
        let summary = if req.revive {
            format!("zone {} revived: nodes come up there again", req.zone)
        } else {
            format!(
                "zone {} died ({} nodes: {}); nodes that come up there die until it is revived",
                req.zone,
                node_ids.len(),
                node_ids.join(", ")
            )
        };
        Ok(Response::new(KillZoneResponse { summary, node_ids }))
    }

    async fn call_counts(
        &self,
        _req: Request<CallCountsRequest>,
    ) -> Result<Response<CallCountsResponse>, Status> {
        let mut report = self.0.calls.report();
        // The published API's calls, under its package's name; all but the reads and streams
        // change Manager's state.
        for (rpc, n) in self.1.as_ref().map(|p| p.calls()).unwrap_or_default() {
            if !matches!(rpc, "JobSearch" | "EventStream" | "CreateStatusChannel") {
                report.mutating += n;
            }
            report.calls.insert(format!("norsk.api.manager/{rpc}"), n);
        }
        // Our extension's calls, under its package's name.
        for (rpc, n) in self.1.as_ref().map(|p| p.ext_calls()).unwrap_or_default() {
            if !matches!(rpc, "Describe" | "Watch") {
                report.mutating += n;
            }
            report
                .calls
                .insert(format!("automanager.manager.extension.v1/{rpc}"), n);
        }
        Ok(Response::new(report))
    }

    async fn set_migration_behaviour(
        &self,
        req: Request<SetMigrationBehaviourRequest>,
    ) -> Result<Response<AdminResponse>, Status> {
        let req = req.into_inner();
        let behaviour =
            JobBehaviour::from_proto(req.behaviour.as_ref()).map_err(behaviour_status)?;
        let text = behaviour.describe();
        // The published world's jobs answer our extension's handshake in process, whatever
        // agent answers for our first API's jobs: a job only the published world knows is
        // its alone.
        let published_job = match &self.1 {
            Some(p) => {
                p.set_migration_behaviour(&req.job_id, behaviour.clone())
                    .map_err(behaviour_status)?;
                p.has_job(&req.job_id) && lock(&self.0.shared).world.job(&req.job_id).is_none()
            }
            None => false,
        };
        match self.0.agent.set_behaviour(&req.job_id, behaviour) {
            Ok(()) => {}
            Err(BehaviourError::Unsupported) if published_job => {}
            Err(e) => return Err(behaviour_status(e)),
        }
        done(format!("job {} {text}", req.job_id))
    }

    async fn job_history(
        &self,
        req: Request<JobHistoryRequest>,
    ) -> Result<Response<JobHistoryResponse>, Status> {
        let req = req.into_inner();
        if let Some(h) = self.1.as_ref().and_then(|p| p.job_history(&req.job_id)) {
            return h.map(Response::new);
        }
        let g = lock(&self.0.shared);
        g.world
            .job_history(&req.job_id, now_ms())
            .map(Response::new)
            .map_err(status)
    }
}

/// Starts simulated Managers.
#[derive(Debug)]
pub struct Sim;

/// How a sim serves, beyond its configuration file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimOptions {
    /// Serve our extension (`automanager.manager.extension.v1.ManagerExtension`) beside the
    /// published API; without it a call of the extension answers `UNIMPLEMENTED`, as a
    /// Manager with the published API alone does (`serve --no-extension`).
    pub extension: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions { extension: true }
    }
}

/// A running sim. Dropping it shuts the server down (and writes the state
/// dir); [`SimHandle::shutdown`] does the same and waits for it.
pub struct SimHandle {
    /// `None` when started in process ([`Sim::start_in_process`]).
    addr: Option<SocketAddr>,
    tls: bool,
    inner: Arc<Inner>,
    /// The published API's service; `None` when started in process.
    published: Option<crate::published::PublishedService>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for SimHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHandle")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Sim {
    /// Binds, loads `state_dir` if any, and serves in the background.
    /// Migrations are answered in process by [`DefaultAgent`]; see
    /// [`Sim::start_with_job_socket`] for jobs on the real job socket.
    pub async fn start(config: SimConfig) -> Result<SimHandle, SimError> {
        Sim::start_with_agent(config, Arc::new(DefaultAgent)).await
    }

    /// As [`Sim::start`], serving the published API without our extension.
    pub async fn start_without_extension(config: SimConfig) -> Result<SimHandle, SimError> {
        Sim::start_with_options(
            config,
            Arc::new(DefaultAgent),
            SimOptions { extension: false },
        )
        .await
    }

    /// As [`Sim::start`], with the jobs speaking the real job socket: a
    /// [`crate::SocketAgent`] with `job_socket`'s settings.
    pub async fn start_with_job_socket(
        config: SimConfig,
        job_socket: crate::behaviour::JobSocketConfig,
    ) -> Result<SimHandle, SimError> {
        let agent = Sim::job_socket_agent(job_socket).await?;
        Sim::start_with_agent(config, agent).await
    }

    /// The agent [`Sim::start_with_job_socket`] uses: the real job socket with `job_socket`'s
    /// settings.
    pub async fn job_socket_agent(
        job_socket: crate::behaviour::JobSocketConfig,
    ) -> Result<Arc<dyn JobAgent>, SimError> {
        let agent: Arc<dyn JobAgent> = Sim::socket_agent(job_socket).await?;
        Ok(agent)
    }

    /// The real job socket with `job_socket`'s settings, for both worlds: our first API's
    /// ([`Sim::start_with_agent`]) and the published one's ([`SimHandle::run_published_job_socket`]).
    pub async fn socket_agent(
        job_socket: crate::behaviour::JobSocketConfig,
    ) -> Result<Arc<crate::SocketAgent>, SimError> {
        crate::SocketAgent::start(job_socket)
            .await
            .map_err(|e| match e {
                crate::socket_agent::SocketAgentError::Config(problems) => {
                    SimError::Config(crate::config::ConfigError::Invalid(problems))
                }
                crate::socket_agent::SocketAgentError::Listener(e) => SimError::Io {
                    what: "starting the job socket listener".to_owned(),
                    source: std::io::Error::other(e),
                },
            })
    }

    /// As [`Sim::start`], with a custom [`JobAgent`] answering migration asks.
    pub async fn start_with_agent(
        config: SimConfig,
        agent: Arc<dyn JobAgent>,
    ) -> Result<SimHandle, SimError> {
        Sim::start_with_options(config, agent, SimOptions::default()).await
    }

    /// As [`Sim::start_with_agent`], with `options`.
    pub async fn start_with_options(
        config: SimConfig,
        agent: Arc<dyn JobAgent>,
        options: SimOptions,
    ) -> Result<SimHandle, SimError> {
        let inner = Sim::build(&config, agent)?;
        let tls = match &config.tls {
            Some(files) => {
                let read = |p: &PathBuf| {
                    std::fs::read(p).map_err(|source| SimError::Io {
                        what: format!("reading {}", p.display()),
                        source,
                    })
                };
                Some(ServerTlsConfig::new().identity(Identity::from_pem(
                    read(&files.cert_file)?,
                    read(&files.key_file)?,
                )))
            }
            None => None,
        };
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .map_err(|source| SimError::Io {
                what: format!("binding {}", config.listen),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| SimError::Io {
            what: "reading the bound address".to_owned(),
            source,
        })?;
        let token: Option<Arc<str>> = config.token.as_deref().map(Arc::from);
        let t1 = token.clone();
        let manager = InterceptedService::new(
            ManagerServer::new(SimService(inner.clone()))
                .max_decoding_message_size(config.limits.max_request_bytes)
                .max_encoding_message_size(64 * 1024 * 1024),
            move |r: Request<()>| authorize(t1.as_ref(), &r).map(|()| r),
        );
        let t3 = token.clone();
        let published_service = crate::published::PublishedService::open(&config)?;
        let published = InterceptedService::new(
            published_service
                .clone()
                .into_server()
                .max_decoding_message_size(config.limits.max_request_bytes)
                .max_encoding_message_size(64 * 1024 * 1024),
            move |r: Request<()>| authorize(t3.as_ref(), &r).map(|()| r),
        );
        let t4 = token.clone();
        let extension = options.extension.then(|| {
            InterceptedService::new(
                crate::published::ExtensionService::new(published_service.clone())
                    .into_server()
                    .max_decoding_message_size(config.limits.max_request_bytes)
                    .max_encoding_message_size(64 * 1024 * 1024),
                move |r: Request<()>| authorize(t4.as_ref(), &r).map(|()| r),
            )
        });
        let t2 = token;
        let admin = InterceptedService::new(
            SimAdminServer::new(AdminSvc(inner.clone(), Some(published_service.clone())))
                .max_decoding_message_size(config.limits.max_request_bytes),
            move |r: Request<()>| authorize(t2.as_ref(), &r).map(|()| r),
        );
        let mut builder = Server::builder();
        let is_tls = tls.is_some();
        if let Some(tls) = tls {
            builder = builder
                .tls_config(tls)
                .map_err(|e| SimError::Tls(e.to_string()))?;
        }
        let router = builder
            .http2_keepalive_interval(Some(Duration::from_secs(20)))
            .add_service(manager)
            .add_service(published)
            .add_optional_service(extension)
            .add_service(admin);
        let mut stop = inner.shutdown.subscribe();
        let serve_inner = inner.clone();
        let serve_published = published_service.clone();
        let task = tokio::spawn(async move {
            let timers = tokio::spawn(run_timers(serve_inner.clone()));
            let persister = tokio::spawn(run_persist(serve_inner.clone()));
            let result = router
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = result {
                tracing::error!(error = %e, "manager-sim server failed");
            }
            timers.abort();
            persister.abort();
            if let Err(e) = serve_inner.persist_final() {
                tracing::error!(error = %e, "final state write failed");
            }
            if let Err(e) = serve_published.persist_final() {
                tracing::error!(error = %e, "final write of the published world failed");
            }
        });
        tracing::info!(%addr, "manager-sim serving");
        Ok(SimHandle {
            addr: Some(addr),
            tls: is_tls,
            inner,
            published: Some(published_service),
            task: Some(task),
        })
    }

    /// As [`Sim::start`], served in this process only: no listener, no socket. Reach it with
    /// [`SimHandle::service`]; the admin calls are the handle's methods.
    pub async fn start_in_process(config: SimConfig) -> Result<SimHandle, SimError> {
        let inner = Sim::build(&config, Arc::new(DefaultAgent))?;
        let mut stop = inner.shutdown.subscribe();
        let run = inner.clone();
        let task = tokio::spawn(async move {
            let timers = tokio::spawn(run_timers(run.clone()));
            let persister = tokio::spawn(run_persist(run.clone()));
            let _ = stop.wait_for(|s| *s).await;
            timers.abort();
            persister.abort();
            if let Err(e) = run.persist_final() {
                tracing::error!(error = %e, "final state write failed");
            }
        });
        Ok(SimHandle {
            addr: None,
            tls: false,
            inner,
            published: None,
            task: Some(task),
        })
    }

    /// The world (loaded from `state_dir` if any) and everything the service shares, with the
    /// agent told the starting world.
    fn build(config: &SimConfig, agent: Arc<dyn JobAgent>) -> Result<Arc<Inner>, SimError> {
        config.validate()?;
        let now = now_ms();
        let state_file = match &config.state_dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|source| SimError::Io {
                    what: format!("creating state dir {}", dir.display()),
                    source,
                })?;
                Some(dir.join(STATE_FILE))
            }
            None => None,
        };
        let log_cap = config.limits.event_log_capacity;
        let world = match state_file.as_ref().filter(|p| p.exists()) {
            Some(path) => {
                let text = std::fs::read(path).map_err(|source| SimError::Io {
                    what: format!("reading {}", path.display()),
                    source,
                })?;
                let mut saved: PersistedWorld =
                    serde_json::from_slice(&text).map_err(|e| SimError::CorruptState {
                        path: path.clone(),
                        message: e.to_string(),
                    })?;
                if !saved.clean_shutdown {
                    // Written periodically: watchers may have seen revisions after it, which
                    // this world would number again with other events. A new epoch makes them
                    // take a snapshot instead of resuming.
                    saved.epoch = new_epoch();
                    tracing::warn!(path = %path.display(), revision = saved.revision, "restored a periodic state write: new epoch, watchers resync");
                }
                tracing::info!(path = %path.display(), revision = saved.revision, epoch = %saved.epoch, "restored world");
                World::restore(&config.pools, config.timing, log_cap, saved, now)
            }
            None => World::new(&config.pools, config.timing, log_cap, new_epoch(), now),
        };
        let (shutdown, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            shared: Mutex::new(Shared {
                world,
                subs: Vec::new(),
                dirty: true,
            }),
            calls: CallCounts::default(),
            timer_wake: Notify::new(),
            timer_armed: std::sync::atomic::AtomicI64::new(0),
            agent,
            limits: config.limits,
            state_file,
            shutdown,
            stalled: watch::Sender::new(false),
        });
        inner.persist()?;
        // Events produced while building the world (declared nodes) go to
        // the log only; there are no watchers yet.
        {
            let mut g = lock(&inner.shared);
            g.world.take_events();
            // The agent learns the starting world (declared nodes, or a
            // restored state dir's nodes and running jobs) as events.
            let snap = g.world.snapshot();
            let initial: Vec<Event> = snap
                .nodes
                .into_iter()
                .map(|node| {
                    manager_proto::event::Kind::NodeStarted(manager_proto::NodeStarted {
                        node: Some(node),
                    })
                })
                .chain(snap.jobs.into_iter().map(|job| {
                    manager_proto::event::Kind::JobUpdated(manager_proto::JobUpdated {
                        job: Some(job),
                    })
                }))
                .map(|kind| Event {
                    revision: snap.revision,
                    at_ms: now,
                    kind: Some(kind),
                })
                .collect();
            inner.agent.observe(&initial);
        }
        inner.agent.attach(JobEvents(Arc::downgrade(&inner)));

        Ok(inner)
    }
}

fn new_epoch() -> String {
    format!("{:016x}", rand::random::<u64>())
}

async fn run_timers(inner: Arc<Inner>) {
    let mut stop = inner.shutdown.subscribe();
    loop {
        let due = lock(&inner.shared).world.next_due_ms();
        let now = now_ms();
        let wait = due.map_or(1000, |d| (d - now).clamp(0, 1000));
        inner
            .timer_armed
            .store(now + wait, std::sync::atomic::Ordering::Relaxed);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0))) => {}
            () = inner.timer_wake.notified() => continue,
            _ = stop.changed() => return,
        }
        inner.apply(|w, now| w.advance(now));
    }
}

async fn run_persist(inner: Arc<Inner>) {
    if inner.state_file.is_none() {
        return;
    }
    let mut tick = tokio::time::interval(PERSIST_EVERY);
    loop {
        tick.tick().await;
        let i = inner.clone();
        match tokio::task::spawn_blocking(move || i.persist()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "writing the state dir failed"),
            Err(e) => tracing::error!(error = %e, "state writer panicked"),
        }
    }
}

impl SimHandle {
    /// The bound address (`None` for a sim started in process).
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// `http://ADDR` (or `https://` with TLS): what a client connects to. A sim started in
    /// process has no address: `in-process:manager-sim`, which no client dials; use
    /// [`SimHandle::service`].
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        match self.addr {
            Some(addr) => format!("{scheme}://{addr}"),
            None => "in-process:manager-sim".to_owned(),
        }
    }

    /// The Manager service itself, to call in this process (`manager_client::InProcess`).
    pub fn service(&self) -> SimService {
        SimService(self.inner.clone())
    }

    /// Runs `f` on the world as a command would, publishing its events to
    /// watchers. For tests and benchmarks that set up state quickly.
    pub fn with_world<R>(&self, f: impl FnOnce(&mut World, i64) -> R) -> R {
        self.inner.apply(f)
    }

    /// A consistent copy of the world.
    pub fn snapshot(&self) -> WorldSnapshot {
        lock(&self.inner.shared).world.snapshot()
    }

    /// Calls served per Manager RPC so far, and how many of them change
    /// Manager's state (`SimAdmin.CallCounts`).
    pub fn call_counts(&self) -> CallCountsResponse {
        self.inner.calls.report()
    }

    /// Number of open watch streams.
    pub fn watchers(&self) -> usize {
        lock(&self.inner.shared).subs.len()
    }

    /// Stalls (`true`) or resumes (`false`) every Watch stream, the way a hung Manager behaves:
    /// streams, open or new, are accepted and kept open but sent nothing, not even heartbeats.
    /// Unary calls are answered as usual. A stalled stream whose buffer of event batches fills
    /// is cut like any slow watcher. In-process only (tests).
    pub fn stall_watches(&self, stalled: bool) {
        self.inner.stalled.send_replace(stalled);
    }

    /// How the published world's jobs matching `rules` answer our extension's migration
    /// handshake (the `jobSocket.behaviours` section of the sim's YAML), unless SimAdmin's
    /// `SetMigrationBehaviour` says otherwise for a job. Nothing for a sim started in process.
    pub fn set_published_behaviour_rules(&self, rules: Vec<crate::behaviour::BehaviourRule>) {
        if let Some(p) = &self.published {
            p.set_behaviour_rules(rules);
        }
    }

    /// The published world's jobs speak the real job socket through `agent` (the one our first
    /// API's jobs speak, so one listener stands for every worker of both worlds): its started
    /// jobs run there, and our extension's handshake is relayed to them rather than answered
    /// in process. Nothing for a sim started in process.
    pub fn run_published_job_socket(&self, agent: Arc<crate::SocketAgent>) {
        if let Some(p) = &self.published {
            p.run_job_socket(agent);
        }
    }

    /// Ends every open `EventStream` of the published API (its clients reconnect and read a new
    /// snapshot); how many were open. 0 for a sim started in process.
    pub fn cut_published_streams(&self) -> usize {
        self.published
            .as_ref()
            .map_or(0, crate::published::PublishedService::cut_streams)
    }

    /// Stops serving, ends every stream with UNAVAILABLE, writes the state
    /// dir, and waits until the port is released.
    pub async fn shutdown(mut self) {
        self.begin_shutdown();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
        }
    }

    fn begin_shutdown(&self) {
        {
            let mut g = lock(&self.inner.shared);
            g.cut_all(&Status::unavailable("manager-sim is shutting down"));
        }
        self.inner.shutdown.send_replace(true);
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        if self.task.is_some() {
            self.begin_shutdown();
            if let Err(e) = self.inner.persist_final() {
                tracing::error!(error = %e, "final state write failed");
            }
            if let Some(Err(e)) = self.published.as_ref().map(|p| p.persist_final()) {
                tracing::error!(error = %e, "final write of the published world failed");
            }
        }
    }
}
