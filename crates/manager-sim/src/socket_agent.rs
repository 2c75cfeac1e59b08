//! [`SocketAgent`]: the sim's jobs and workers speak the real job socket.
//!
//! The sim runs ONE real [`JobSocketListener`] on `127.0.0.1:0` standing in
//! for every worker's listener (a real deployment has one per worker host,
//! on port 6797). Every running NORMAL instance on a node that advertises
//! `norsk.io/job-socket` is registered with a fresh random token, and a
//! simulated job task connects to it with the real job client SDK
//! ([`job_socket::connect_migration_to`]) and answers like a handover-capable
//! job. A migration target is registered (with its initial state, via
//! [`InstanceSpec::target_of`]) when the world asks for `initial-state`, and
//! its job task is started then.
//!
//! The agent is the relay of the four `NodeControllerMigration*` messages:
//! the world's [`JobAsk`]s become listener [`Command`]s, and the frames the
//! listener relays back become [`JobReply`]s; payloads cross as the gRPC
//! bytes with [`encode_migration_payload`] / [`decode_migration_payload`].
//! A controller abort (or a job's abort) of a handover is relayed as `abort`
//! to both ends. Overlap and stop-then-start migrations ask the job nothing,
//! so nothing of theirs crosses the socket, not even an abort.
//!
//! Socket paths: `/instances/<jobId>/normal` for a normal instance and
//! `/instances/<jobId>/migrationTarget:<migrationId>` for a target, so a
//! target's key is unique per migration as the contract asks (one listener
//! serves every simulated node).
//!
//! What the simulated job does (switches from [`crate::behaviour`]):
//! - source, `get-state` → `state {position}` (milliseconds of output so
//!   far), or `state-refused` with `refuseState`;
//! - target, `initial-state` → `target-ready {resumeFrom}`;
//! - source, `cutover-ready` → waits `cutoverDelayMs`, then
//!   `source-stopped-output {position, stoppedAtMs}` (an `abort` from the
//!   worker meanwhile cancels it);
//! - target, `cutover-apply` → `target-applied {applied, failed, skewMs}`
//!   over its participants `input` and `output`; `failParticipants` move to
//!   `failed`; `skewMs` is measured from the source's `stoppedAtMs`;
//! - `abortAt` sends the job's own `abort` at that point.
//!
//! A job that does not answer within `answerTimeoutMs` (or disconnects) is
//! answered for with an abort, so a migration never hangs. A migration
//! whose source or target node lacks the job-socket capability is aborted
//! by that side: such a job has no listener to talk to.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use job_socket::frame::FailedParticipant as WireFailed;
use job_socket::json::JsObject;
use job_socket::listener::{InstanceStatus, ListenerError};
use job_socket::phase::Side;
use job_socket::{
    Command, EventKind, InstanceKey, InstanceSpec, JobSocketListener, JobToWorker, Json,
    ListenerConfig, ListenerEvent, ListenerHandle, MigrationClient, TargetApplied, WorkerToJob,
    connect_migration_to, decode_migration_payload, encode_migration_payload, job_socket_url,
};
use manager_proto::{
    FailedParticipant, JOB_SOCKET_CAPABILITY, JobRole, JobState, MigrationPhase, MigrationStrategy,
    event,
};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::behaviour::{AbortAt, BehaviourError, Behaviours, JobBehaviour, JobSocketConfig};
use crate::exec::ExecJobs;
use crate::server::{JobAgent, JobEvents, now_ms};
use crate::world::{JobAsk, JobReply};

/// The path role of a normal instance.
pub const NORMAL_ROLE: &str = "normal";
/// The path role of a migration target is this, `:`, the migration id.
pub const TARGET_ROLE_PREFIX: &str = "migrationTarget:";
/// The participants every simulated job has.
pub const PARTICIPANTS: [&str; 2] = ["input", "output"];

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a single insert or remove, so a
    // poisoned lock still holds consistent data.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why the socket agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum SocketAgentError {
    /// The `jobSocket:` settings are invalid; every problem is listed.
    #[error("invalid job socket config:\n  - {}", .0.join("\n  - "))]
    Config(Vec<String>),
    /// The listener could not bind.
    #[error(transparent)]
    Listener(#[from] ListenerError),
}

/// Reports a job's own `abort` between asks: (migration id, whether the source sent it,
/// reason).
pub type AbortSink = Arc<dyn Fn(&str, bool, &str) + Send + Sync>;

/// A [`crate::JobAgent`] whose jobs speak the real job socket. See the
/// module docs.
pub struct SocketAgent {
    shared: Arc<Shared>,
    // Kept alive for as long as the agent: dropping it closes every socket.
    _listener: JobSocketListener,
}

impl std::fmt::Debug for SocketAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketAgent")
            .field("addr", &self.shared.addr)
            .finish_non_exhaustive()
    }
}

struct Shared {
    handle: ListenerHandle,
    addr: SocketAddr,
    answer_timeout: Duration,
    behaviours: Arc<Mutex<Behaviours>>,
    state: Mutex<State>,
    connected: Notify,
    sink: Mutex<Option<JobEvents>>,
    /// Where a job's own abort is reported besides our first API's world: the published
    /// world's migrations (a migration id is one world's).
    abort_sinks: Mutex<Vec<AbortSink>>,
    /// Jobs run as external processes instead of simulated tasks.
    exec: ExecJobs,
}

#[derive(Default)]
struct State {
    /// (job id, node id) → the instance's socket key; ordered so one
    /// job's instances are a range (every job event looks them up).
    instances: BTreeMap<(String, String), InstanceKey>,
    /// (instance, migration id) → whoever waits for the job's next frame.
    waiters: HashMap<(InstanceKey, String), oneshot::Sender<JobToWorker>>,
    /// Nodes known to lack the job-socket capability.
    no_socket: HashSet<String>,
    /// job id → migration commands sent to its jobs (`get-state`,
    /// `initial-state`, `cutover-ready`, `cutover-apply`, `abort`).
    commands_sent: HashMap<String, u64>,
}

impl SocketAgent {
    /// Validates `config`, binds the listener on `127.0.0.1:0` and starts
    /// relaying.
    pub async fn start(config: JobSocketConfig) -> Result<Arc<SocketAgent>, SocketAgentError> {
        let problems = config.problems();
        if !problems.is_empty() {
            return Err(SocketAgentError::Config(problems));
        }
        let (listener, events) = JobSocketListener::bind(ListenerConfig::loopback()).await?;
        // The address in the message itself, so a test can read it from the log whatever the
        // log's format.
        tracing::info!("job socket listener bound on {}", listener.local_addr());
        let shared = Arc::new(Shared {
            handle: listener.handle(),
            addr: listener.local_addr(),
            answer_timeout: Duration::from_millis(config.answer_timeout_ms.clamp(1, 3_600_000)),
            behaviours: Arc::new(Mutex::new(Behaviours::new(config.behaviours))),
            state: Mutex::new(State::default()),
            connected: Notify::new(),
            sink: Mutex::new(None),
            abort_sinks: Mutex::new(Vec::new()),
            exec: ExecJobs::new(config.exec),
        });
        tokio::spawn(pump(Arc::downgrade(&shared), events));
        Ok(Arc::new(SocketAgent {
            shared,
            _listener: listener,
        }))
    }

    /// The listener's address (`127.0.0.1:PORT`).
    pub fn listener_addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// The listener's view of one instance (connected, migration phase).
    pub fn instance_status(&self, job_id: &str, role: &str) -> Option<InstanceStatus> {
        self.shared.handle.status(&InstanceKey::new(job_id, role))
    }

    /// How many migration commands (`get-state`, `initial-state`,
    /// `cutover-ready`, `cutover-apply`, `abort`) the worker side sent to the
    /// job's instances so far.
    pub fn commands_sent(&self, job_id: &str) -> u64 {
        lock(&self.shared.state)
            .commands_sent
            .get(job_id)
            .copied()
            .unwrap_or(0)
    }

    /// Whether `node_id`'s worker runs a job-socket listener, for a world that does not tell
    /// the agent in our first API's events (the published one).
    pub fn note_node(&self, node_id: &str, job_socket: bool) {
        self.shared.note_node(node_id, job_socket);
    }

    /// Job `job_id`'s live instances, for a world that does not tell the agent in our first
    /// API's events (the published one): `live` are the nodes any instance of it holds,
    /// `running` those where its own instance runs (not a migration's target in progress).
    /// A new running instance is registered and its job started; one no longer live is
    /// forgotten and its job stopped.
    pub fn sync_instances(&self, job_id: &str, live: &[&str], running: &[&str]) {
        self.shared.sync_instances(job_id, live, running);
    }

    /// Reports a job's own abort between asks to `sink` too.
    pub fn report_aborts_to(&self, sink: AbortSink) {
        lock(&self.shared.abort_sinks).push(sink);
    }

    /// The socket key of the job's instance on `node_id`, if registered.
    pub fn instance_key(&self, job_id: &str, node_id: &str) -> Option<InstanceKey> {
        lock(&self.shared.state)
            .instances
            .get(&(job_id.to_owned(), node_id.to_owned()))
            .cloned()
    }
}

impl JobAgent for SocketAgent {
    fn answer(&self, ask: JobAsk) -> BoxFuture<'static, JobReply> {
        let shared = self.shared.clone();
        Box::pin(async move { shared.answer(ask).await })
    }

    fn observe(&self, events: &[manager_proto::Event]) {
        for e in events {
            if let Some(kind) = &e.kind {
                self.shared.observe(kind);
            }
        }
    }

    fn attach(&self, events: JobEvents) {
        *lock(&self.shared.sink) = Some(events);
    }

    fn set_behaviour(&self, job_id: &str, behaviour: JobBehaviour) -> Result<(), BehaviourError> {
        lock(&self.shared.behaviours).set(job_id, behaviour)
    }
}

fn token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// Whether the migration talks to its job (unset strategy reads as handover).
fn is_handover(m: &manager_proto::Migration) -> bool {
    matches!(
        MigrationStrategy::try_from(m.strategy),
        Ok(MigrationStrategy::Handover | MigrationStrategy::Unspecified) | Err(_)
    )
}

fn holds(state: i32) -> bool {
    state == JobState::Starting as i32
        || state == JobState::Running as i32
        || state == JobState::Stopping as i32
}

impl Shared {
    fn observe(&self, kind: &event::Kind) {
        match kind {
            event::Kind::NodeStarted(n) => {
                if let Some(inv) = n.node.as_ref().and_then(|n| n.inventory.as_ref()) {
                    self.note_inventory(&inv.node_id, &inv.capabilities);
                }
            }
            event::Kind::Inventory(u) => {
                if let Some(inv) = &u.inventory {
                    self.note_inventory(&inv.node_id, &inv.capabilities);
                }
            }
            event::Kind::JobUpdated(u) => {
                if let Some(job) = &u.job {
                    self.sync_job(job);
                }
            }
            event::Kind::JobRemoved(r) => self.forget_job(&r.job_id, |_| true),
            event::Kind::MigrationPhase(p) => {
                if let Some(m) = &p.migration
                    && m.phase == MigrationPhase::Aborted as i32
                    && is_handover(m)
                {
                    self.relay_abort(m);
                }
            }
            _ => {}
        }
    }

    fn note_inventory(&self, node_id: &str, capabilities: &[String]) {
        self.note_node(
            node_id,
            capabilities.iter().any(|c| c == JOB_SOCKET_CAPABILITY),
        );
    }

    fn note_node(&self, node_id: &str, job_socket: bool) {
        let mut st = lock(&self.state);
        if job_socket {
            st.no_socket.remove(node_id);
        } else if !st.no_socket.contains(node_id) {
            st.no_socket.insert(node_id.to_owned());
        }
    }

    /// Registers running normal instances that are new; forgets instances
    /// that stopped, failed or left the job.
    fn sync_job(&self, job: &manager_proto::Job) {
        let live: Vec<&str> = job
            .instances
            .iter()
            .filter(|i| holds(i.state))
            .map(|i| i.node_id.as_str())
            .collect();
        let running: Vec<&str> = job
            .instances
            .iter()
            .filter(|i| i.role == JobRole::Normal as i32 && i.state == JobState::Running as i32)
            .map(|i| i.node_id.as_str())
            .collect();
        self.sync_instances(&job.job_id, &live, &running);
    }

    fn sync_instances(&self, job_id: &str, live: &[&str], running: &[&str]) {
        self.forget_job(job_id, |node| !live.contains(&node));
        for node in running {
            self.ensure_normal(job_id, node);
        }
    }

    fn forget_job(&self, job_id: &str, gone: impl Fn(&str) -> bool) {
        let keys: Vec<InstanceKey> = {
            let mut st = lock(&self.state);
            let dead: Vec<(String, String)> = job_range(&st.instances, job_id)
                .filter(|(_, n)| gone(n))
                .cloned()
                .collect();
            let keys: Vec<InstanceKey> =
                dead.iter().filter_map(|k| st.instances.remove(k)).collect();
            // Nobody will answer for a forgotten instance: wake its waiters.
            st.waiters.retain(|(k, _), _| !keys.contains(k));
            keys
        };
        for key in keys {
            tracing::debug!(job_id = %key.job_id, role = %key.role, "job socket instance forgotten");
            self.handle.unregister(&key);
            self.exec.stop(&key);
        }
    }

    /// The normal instance's key, registering it and starting its job if
    /// it is not yet. `None` on a node without the capability.
    fn ensure_normal(&self, job_id: &str, node_id: &str) -> Option<InstanceKey> {
        let id = (job_id.to_owned(), node_id.to_owned());
        let key = {
            let mut st = lock(&self.state);
            if let Some(k) = st.instances.get(&id) {
                return Some(k.clone());
            }
            if st.no_socket.contains(node_id) {
                return None;
            }
            let key = InstanceKey::new(job_id, NORMAL_ROLE);
            // One listener stands in for every node, so an earlier normal
            // instance of the job elsewhere holds the same path: it is gone
            // (the world has one normal instance per job).
            let stale: Vec<(String, String)> = job_range(&st.instances, job_id)
                .filter(|id| st.instances.get(*id) == Some(&key))
                .cloned()
                .collect();
            for id in stale {
                st.instances.remove(&id);
            }
            st.instances.insert(id, key.clone());
            key
        };
        self.handle.unregister(&key);
        self.start_job(InstanceSpec::new(job_id, NORMAL_ROLE, token()));
        Some(key)
    }

    fn start_job(&self, spec: InstanceSpec) {
        let url = job_socket_url(
            &self.addr.ip().to_string(),
            self.addr.port(),
            &spec.key.job_id,
            &spec.key.role,
        );
        let token = spec.token.clone();
        let job_id = spec.key.job_id.clone();
        let key = spec.key.clone();
        if let Err(e) = self.handle.register(spec) {
            tracing::warn!(error = %e, "registering a simulated job failed");
            return;
        }
        // A configured job runs as its own process, as a worker starts a container.
        if let Some(rule) = self.exec.rule_for(&job_id) {
            if let Err(e) = self.exec.spawn(rule, &key, &url, &token) {
                tracing::warn!(%job_id, error = %e, "starting the job's process failed");
            }
            return;
        }
        tokio::spawn(run_job(url, token, job_id, self.behaviours.clone()));
    }

    fn relay_abort(&self, m: &manager_proto::Migration) {
        let keys: Vec<InstanceKey> = {
            let mut st = lock(&self.state);
            st.waiters.retain(|(_, mid), _| *mid != m.migration_id);
            [&m.source_node_id, &m.target_node_id]
                .into_iter()
                .filter_map(|n| st.instances.get(&(m.job_id.clone(), n.clone())).cloned())
                .collect()
        };
        for key in keys {
            // The side that aborted, or one past the point of no return,
            // refuses the frame; that is fine.
            let cmd = Command::Abort {
                migration_id: m.migration_id.clone(),
                reason: m.abort_reason.clone(),
            };
            self.count_command(&m.job_id);
            if let Err(e) = self.handle.send(&key, cmd) {
                tracing::debug!(error = %e, "abort not relayed");
            }
        }
    }

    /// The registered key of the job's `side` instance on `node_id`.
    fn live_key(&self, job_id: &str, node_id: &str, side: &str) -> Result<InstanceKey, String> {
        lock(&self.state)
            .instances
            .get(&(job_id.to_owned(), node_id.to_owned()))
            .cloned()
            .ok_or_else(|| format!("the {side} instance on {node_id} is gone"))
    }

    fn count_command(&self, job_id: &str) {
        *lock(&self.state)
            .commands_sent
            .entry(job_id.to_owned())
            .or_default() += 1;
    }

    fn has_socket(&self, node_id: &str) -> bool {
        !lock(&self.state).no_socket.contains(node_id)
    }

    async fn answer(self: &Arc<Self>, ask: JobAsk) -> JobReply {
        match self.relay(&ask).await {
            Ok(reply) => reply,
            Err(reason) => {
                tracing::info!(migration_id = ask.migration_id(), %reason, "job socket relay aborts");
                JobReply::Abort(reason)
            }
        }
    }

    async fn relay(self: &Arc<Self>, ask: &JobAsk) -> Result<JobReply, String> {
        match ask {
            JobAsk::GetState {
                migration_id,
                job_id,
                node_id,
            } => {
                let key = self
                    .ensure_normal(job_id, node_id)
                    .ok_or_else(|| no_listener(node_id))?;
                let cmd = Command::GetState {
                    migration_id: migration_id.clone(),
                };
                match self.exchange(&key, migration_id, Some(cmd)).await? {
                    JobToWorker::State { payload } => {
                        Ok(JobReply::State(encode_migration_payload(Some(&payload))))
                    }
                    JobToWorker::StateRefused { reason } => Ok(JobReply::StateRefused(
                        reason.to_string_lossy().into_owned(),
                    )),
                    other => Ok(other_reply(other)),
                }
            }
            JobAsk::InitialState {
                migration_id,
                job_id,
                node_id,
                payload,
            } => {
                if !self.has_socket(node_id) {
                    return Err(no_listener(node_id));
                }
                let role = format!("{TARGET_ROLE_PREFIX}{migration_id}");
                let key = InstanceKey::new(job_id.clone(), role.clone());
                {
                    let mut st = lock(&self.state);
                    st.instances
                        .insert((job_id.clone(), node_id.clone()), key.clone());
                }
                self.handle.unregister(&key);
                let state = decode_migration_payload(Some(payload));
                let rx = self.wait_for(&key, migration_id);
                self.count_command(job_id);
                self.start_job(
                    InstanceSpec::new(job_id.clone(), role, token())
                        .target_of(migration_id.clone(), state),
                );
                match self.await_frame(&key, migration_id, rx).await? {
                    JobToWorker::TargetReady { payload } => Ok(JobReply::TargetReady(
                        encode_migration_payload(Some(&payload)),
                    )),
                    other => Ok(other_reply(other)),
                }
            }
            JobAsk::CutoverReady {
                migration_id,
                job_id,
                node_id,
                payload,
            } => {
                let key = self.live_key(job_id, node_id, "source")?;
                let cmd = Command::CutoverReady {
                    migration_id: migration_id.clone(),
                    payload: decode_migration_payload(Some(payload)),
                };
                match self.exchange(&key, migration_id, Some(cmd)).await? {
                    JobToWorker::SourceStoppedOutput { payload } => Ok(
                        JobReply::SourceStoppedOutput(encode_migration_payload(Some(&payload))),
                    ),
                    other => Ok(other_reply(other)),
                }
            }
            JobAsk::CutoverApply {
                migration_id,
                job_id,
                node_id,
                payload,
            } => {
                let key = self.live_key(job_id, node_id, "target")?;
                let cmd = Command::CutoverApply {
                    migration_id: migration_id.clone(),
                    payload: decode_migration_payload(Some(payload)),
                };
                match self.exchange(&key, migration_id, Some(cmd)).await? {
                    JobToWorker::TargetApplied(t) => Ok(applied_reply(t)),
                    other => Ok(other_reply(other)),
                }
            }
        }
    }

    fn wait_for(&self, key: &InstanceKey, migration_id: &str) -> oneshot::Receiver<JobToWorker> {
        let (tx, rx) = oneshot::channel();
        lock(&self.state)
            .waiters
            .insert((key.clone(), migration_id.to_owned()), tx);
        rx
    }

    /// Waits for the job to be connected, sends `cmd`, waits for its answer.
    async fn exchange(
        &self,
        key: &InstanceKey,
        migration_id: &str,
        cmd: Option<Command>,
    ) -> Result<JobToWorker, String> {
        let deadline = tokio::time::Instant::now() + self.answer_timeout;
        loop {
            let notified = self.connected.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.handle.status(key) {
                Some(s) if s.connected => break,
                Some(_) => {}
                None => return Err(format!("the job of {} is not registered", key.job_id)),
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(format!(
                    "the job did not connect to its job socket within {} ms",
                    self.answer_timeout.as_millis()
                ));
            }
        }
        let rx = self.wait_for(key, migration_id);
        if cmd.is_some() {
            self.count_command(&key.job_id);
        }
        if let Some(cmd) = cmd
            && let Err(e) = self.handle.send(key, cmd)
        {
            lock(&self.state)
                .waiters
                .remove(&(key.clone(), migration_id.to_owned()));
            return Err(e.to_string());
        }
        self.await_frame(key, migration_id, rx).await
    }

    async fn await_frame(
        &self,
        key: &InstanceKey,
        migration_id: &str,
        rx: oneshot::Receiver<JobToWorker>,
    ) -> Result<JobToWorker, String> {
        match tokio::time::timeout(self.answer_timeout, rx).await {
            Ok(Ok(frame)) => Ok(frame),
            Ok(Err(_)) => Err("the job disconnected or the migration ended".to_owned()),
            Err(_) => {
                lock(&self.state)
                    .waiters
                    .remove(&(key.clone(), migration_id.to_owned()));
                Err(format!(
                    "the job did not answer within {} ms",
                    self.answer_timeout.as_millis()
                ))
            }
        }
    }

    fn on_event(&self, ev: ListenerEvent) {
        match ev.kind {
            EventKind::Connected { .. } => self.connected.notify_waiters(),
            EventKind::Frame {
                migration_id,
                frame,
                ..
            } => {
                let waiter = lock(&self.state)
                    .waiters
                    .remove(&(ev.instance.clone(), migration_id.clone()));
                match (waiter, frame) {
                    (Some(tx), frame) => {
                        let _ = tx.send(frame);
                    }
                    (None, JobToWorker::Abort { reason }) => {
                        // An abort between asks (after state / target-ready).
                        let from_source = self
                            .handle
                            .status(&ev.instance)
                            .and_then(|s| s.migration)
                            .is_some_and(|m| m.side == Side::Source);
                        let sink = lock(&self.sink).clone();
                        let reason = reason.to_string_lossy();
                        if let Some(sink) = sink {
                            sink.job_aborted(&migration_id, from_source, &reason);
                        }
                        let others = lock(&self.abort_sinks).clone();
                        for sink in others {
                            sink(&migration_id, from_source, &reason);
                        }
                    }
                    (None, frame) => {
                        tracing::debug!(%migration_id, frame = frame.kind(), "unsolicited job frame ignored");
                    }
                }
            }
            EventKind::Disconnected { code, reason, .. } => {
                tracing::debug!(job_id = %ev.instance.job_id, role = %ev.instance.role, ?code, %reason, "job disconnected");
                // Whoever waits on this job would otherwise wait for the timeout.
                lock(&self.state)
                    .waiters
                    .retain(|(k, _), _| *k != ev.instance);
            }
        }
    }
}

/// The (job id, node id) keys of one job's instances.
fn job_range<'a>(
    instances: &'a BTreeMap<(String, String), InstanceKey>,
    job_id: &'a str,
) -> impl Iterator<Item = &'a (String, String)> + 'a {
    instances
        .range((job_id.to_owned(), String::new())..)
        .map(|(id, _)| id)
        .take_while(move |(j, _)| j == job_id)
}

fn no_listener(node_id: &str) -> String {
    format!("node {node_id} has no job socket listener ({JOB_SOCKET_CAPABILITY})")
}

fn other_reply(frame: JobToWorker) -> JobReply {
    match frame {
        JobToWorker::Abort { reason } => JobReply::Abort(reason.to_string_lossy().into_owned()),
        // The listener enforces phases, so only an abort can arrive here.
        other => JobReply::Abort(format!("unexpected `{}` from the job", other.kind())),
    }
}

fn applied_reply(t: TargetApplied) -> JobReply {
    JobReply::TargetApplied {
        applied: t
            .applied
            .unwrap_or_default()
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect(),
        failed: t
            .failed
            .unwrap_or_default()
            .iter()
            .map(|f| FailedParticipant {
                id: f.id.to_string_lossy().into_owned(),
                reason: f.reason.to_string_lossy().into_owned(),
            })
            .collect(),
        skew_ms: t.skew_ms.filter(|s| s.is_finite()).unwrap_or(0.0),
    }
}

async fn pump(shared: Weak<Shared>, mut events: mpsc::Receiver<ListenerEvent>) {
    while let Some(ev) = events.recv().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.on_event(ev);
    }
}

fn object(entries: &[(&str, Json)]) -> Json {
    let mut o = JsObject::new();
    for (k, v) in entries {
        o.insert(*k, v.clone());
    }
    Json::Object(o)
}

fn number_at(payload: &Json, key: &str) -> Option<f64> {
    match payload.as_object()?.get(key)? {
        Json::Number(n) if n.is_finite() => Some(*n),
        _ => None,
    }
}

#[allow(clippy::cast_precision_loss)] // ms counts stay far below 2^53
fn ms(n: u128) -> f64 {
    n as f64
}

#[allow(clippy::cast_precision_loss)]
fn now_ms_f64() -> f64 {
    now_ms() as f64
}

/// One simulated job process: connects with the real SDK and answers.
async fn run_job(url: String, token: String, job_id: String, behaviours: Arc<Mutex<Behaviours>>) {
    let started = Instant::now();
    let mut client = match connect_migration_to(&url, &token).await {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(%job_id, error = %e, "simulated job could not connect");
            return;
        }
    };
    let mut resumed_from = 0.0;
    loop {
        let frame = match client.next_event().await {
            Ok(Some(f)) => f,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!(%job_id, error = %e, "simulated job's socket ended");
                return;
            }
        };
        let b = lock(&behaviours).get(&job_id);
        let position = resumed_from + ms(started.elapsed().as_millis());
        let sent = answer_frame(&mut client, frame, &b, position, &mut resumed_from).await;
        if let Err(e) = sent {
            tracing::debug!(%job_id, error = %e, "simulated job stopped answering");
            return;
        }
    }
}

async fn answer_frame(
    client: &mut MigrationClient,
    frame: WorkerToJob,
    b: &JobBehaviour,
    position: f64,
    resumed_from: &mut f64,
) -> Result<(), job_socket::client::ClientError> {
    let abort_here = |at: AbortAt| b.abort_at == Some(at);
    let because = |at: AbortAt| format!("simulated abort at {}", at.name());
    match frame {
        WorkerToJob::GetState { .. } => {
            if abort_here(AbortAt::GetState) {
                return client.abort(&because(AbortAt::GetState)).await;
            }
            if b.refuse_state {
                return client
                    .refuse_state("simulated refusal (refuse-state)")
                    .await;
            }
            client
                .send_state(object(&[("position", Json::Number(position))]))
                .await?;
            if abort_here(AbortAt::StateGiven) {
                client.abort(&because(AbortAt::StateGiven)).await?;
            }
            Ok(())
        }
        WorkerToJob::InitialState { payload, .. } => {
            *resumed_from = number_at(&payload, "position").unwrap_or(0.0);
            if abort_here(AbortAt::InitialState) {
                return client.abort(&because(AbortAt::InitialState)).await;
            }
            client
                .target_ready(object(&[("resumeFrom", Json::Number(*resumed_from))]))
                .await?;
            if abort_here(AbortAt::TargetReady) {
                client.abort(&because(AbortAt::TargetReady)).await?;
            }
            Ok(())
        }
        WorkerToJob::CutoverReady { .. } => {
            if abort_here(AbortAt::CutoverReady) {
                return client.abort(&because(AbortAt::CutoverReady)).await;
            }
            if b.cutover_delay_ms > 0 {
                let delay = tokio::time::sleep(Duration::from_millis(b.cutover_delay_ms));
                tokio::pin!(delay);
                loop {
                    tokio::select! {
                        () = &mut delay => break,
                        next = client.next_event() => match next? {
                            // Aborted while stopping: nothing to answer.
                            Some(WorkerToJob::Abort { .. }) => return Ok(()),
                            Some(_) => {}
                            None => return Ok(()),
                        },
                    }
                }
            }
            client
                .source_stopped_output(object(&[
                    (
                        "position",
                        Json::Number(position + ms(u128::from(b.cutover_delay_ms))),
                    ),
                    ("stoppedAtMs", Json::Number(now_ms_f64())),
                ]))
                .await
        }
        WorkerToJob::CutoverApply { payload, .. } => {
            let (applied, failed) = b.apply_outcome(&PARTICIPANTS);
            let skew = number_at(&payload, "stoppedAtMs")
                .map_or(0.0, |stopped| (now_ms_f64() - stopped).max(0.0));
            client
                .target_applied(TargetApplied {
                    applied: Some(applied.into_iter().map(Into::into).collect()),
                    failed: Some(
                        failed
                            .into_iter()
                            .map(|id| WireFailed {
                                id: id.into(),
                                reason: "simulated failure (fail-participant)".into(),
                            })
                            .collect(),
                    ),
                    skew_ms: Some(skew),
                })
                .await
        }
        WorkerToJob::Abort { .. } | WorkerToJob::HelloAck { .. } => Ok(()),
    }
}
