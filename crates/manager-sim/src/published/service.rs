//! `norsk.api.manager.Manager` over a [`PublishedWorld`]: the calls answer as the published API
//! does (`Empty` or a job hash; outcomes on the event stream), every `EventStream` gets the
//! world's snapshot closed by `InitialDataComplete` and then the live events, and a timer task
//! starts nodes when their provisioning delay has passed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::{Stream, StreamExt};
use manager_proto::api::common::{JobId, NodeId};
use manager_proto::api::manager::manager_server::Manager;
use manager_proto::api::manager::{
    CreateAwsNodeRequest, CreateOciNodeRequest, CurrentJob, EventStreamEvent, EventStreamRequest,
    Hello, Job, JobHash, JobSearchRequest, NorskStatusEvent, StartJobRequest, StopJobRequest,
    UpdatePhysicalNodeRequest, norsk_status_event,
};
use tokio::sync::{Notify, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use super::world::{PersistedPublished, PublishedWorld, SocketJob};
use crate::SocketAgent;
use crate::behaviour::{BehaviourError, JobBehaviour};
use crate::config::SimConfig;
use crate::server::{PERSIST_EVERY, SimError, lock, now_ms, status, write_state};
use crate::world::CommandError;

/// The published world's file in the state dir (beside our first API's).
pub const PUBLISHED_STATE_FILE: &str = "manager-sim-published.json";

/// How many events a stream may have waiting beyond its snapshot before it is cut (its client
/// then reconnects and reads a fresh snapshot).
const STREAM_BACKLOG: usize = 4096;

mod extension;
pub use extension::ExtensionService;

type ExtSink = mpsc::Sender<Result<manager_proto::extension::WatchEvent, Status>>;

struct Inner {
    world: Mutex<PublishedWorld>,
    /// Calls served per RPC, by its name in the published proto.
    calls: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    /// Calls served per RPC of our extension, by its name in our proto.
    ext_calls: Mutex<std::collections::BTreeMap<&'static str, u64>>,
    streams: Mutex<Vec<mpsc::Sender<Result<EventStreamEvent, Status>>>>,
    /// Our extension's Watch streams.
    ext_streams: Mutex<Vec<ExtSink>>,
    timer: Arc<Notify>,
    /// Where the world is kept (`--state-dir`), if anywhere.
    state_file: Option<PathBuf>,
    /// Changed since it was last written.
    dirty: AtomicBool,
    /// The job socket the world's jobs speak, when the sim runs one
    /// ([`PublishedService::run_job_socket`]); without it the handshake is answered in process.
    job_socket: Mutex<Option<JobSocket>>,
}

/// The socket agent and what it was last told of the world, so only changes reach it.
struct JobSocket {
    agent: Arc<SocketAgent>,
    jobs: BTreeMap<String, SocketJob>,
    nodes: BTreeMap<String, bool>,
}

/// The published Manager service of manager-sim (see the module docs). Cloning shares it.
#[derive(Clone)]
pub struct PublishedService(Arc<Inner>);

impl std::fmt::Debug for PublishedService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishedService").finish_non_exhaustive()
    }
}

fn job_id(id: Option<JobId>) -> String {
    id.map(|j| j.job_id).unwrap_or_default()
}

fn node_id(id: Option<NodeId>) -> String {
    id.map(|n| n.node_id).unwrap_or_default()
}

impl PublishedService {
    /// A service over `world`, with its timer task (ended when the last clone is dropped).
    pub fn start(world: PublishedWorld) -> PublishedService {
        PublishedService::start_kept(world, None)
    }

    /// The service of `config`: its world read back from `config.state_dir` when the sim kept
    /// one there, else new; kept there from now on (at most every 250 ms, and by
    /// [`PublishedService::persist_final`]).
    pub fn open(config: &SimConfig) -> Result<PublishedService, SimError> {
        let now = now_ms();
        let Some(dir) = &config.state_dir else {
            return Ok(PublishedService::start(PublishedWorld::new(config, now)));
        };
        std::fs::create_dir_all(dir).map_err(|source| SimError::Io {
            what: format!("creating state dir {}", dir.display()),
            source,
        })?;
        let path = dir.join(PUBLISHED_STATE_FILE);
        let world = if path.exists() {
            let corrupt = |message: String| SimError::CorruptState {
                path: path.clone(),
                message,
            };
            let text = std::fs::read(&path).map_err(|source| SimError::Io {
                what: format!("reading {}", path.display()),
                source,
            })?;
            let saved: PersistedPublished =
                serde_json::from_slice(&text).map_err(|e| corrupt(e.to_string()))?;
            let world = PublishedWorld::restore(config, saved, now).map_err(corrupt)?;
            tracing::info!(path = %path.display(), "restored the published world");
            world
        } else {
            PublishedWorld::new(config, now)
        };
        let svc = PublishedService::start_kept(world, Some(path));
        svc.persist()?;
        tokio::spawn(run_persist(Arc::downgrade(&svc.0)));
        Ok(svc)
    }

    fn start_kept(world: PublishedWorld, state_file: Option<PathBuf>) -> PublishedService {
        let svc = PublishedService(Arc::new(Inner {
            world: Mutex::new(world),
            calls: Mutex::default(),
            ext_calls: Mutex::default(),
            streams: Mutex::new(Vec::new()),
            ext_streams: Mutex::new(Vec::new()),
            timer: Arc::new(Notify::new()),
            state_file,
            dirty: AtomicBool::new(true),
            job_socket: Mutex::new(None),
        }));
        tokio::spawn(run_timer(Arc::downgrade(&svc.0), Arc::clone(&svc.0.timer)));
        svc
    }

    /// The world's jobs speak the real job socket through `agent`, as our first API's do: each
    /// running instance's job is started on it (a configured process or a simulated job), and
    /// the handshake's asks are relayed to it, each answer handed back to the world.
    pub fn run_job_socket(&self, agent: Arc<SocketAgent>) {
        let weak = Arc::downgrade(&self.0);
        agent.report_aborts_to(Arc::new(
            move |id: &str, from_source: bool, reason: &str| {
                if let Some(inner) = weak.upgrade() {
                    let mut w = lock(&inner.world);
                    let now = now_ms();
                    w.advance(now);
                    w.migration_job_abort(id, from_source, reason, now);
                    flush(&inner, &mut w, now);
                }
            },
        ));
        let mut w = lock(&self.0.world);
        w.relay_asks();
        *lock(&self.0.job_socket) = Some(JobSocket {
            agent,
            jobs: BTreeMap::new(),
            nodes: BTreeMap::new(),
        });
        let now = now_ms();
        w.advance(now);
        flush(&self.0, &mut w, now);
    }

    /// Writes the world to the state dir if it changed since the last write.
    fn persist(&self) -> Result<(), SimError> {
        persist(&self.0, false)
    }

    /// The last write of a stopping sim: always written.
    pub fn persist_final(&self) -> Result<(), SimError> {
        persist(&self.0, true)
    }

    /// Calls served per RPC of the published API (an RPC never called is absent).
    pub fn calls(&self) -> std::collections::BTreeMap<&'static str, u64> {
        lock(&self.0.calls).clone()
    }

    fn count(&self, rpc: &'static str) {
        *lock(&self.0.calls).entry(rpc).or_default() += 1;
    }

    /// Calls served per RPC of our extension (an RPC never called is absent).
    pub fn ext_calls(&self) -> std::collections::BTreeMap<&'static str, u64> {
        lock(&self.0.ext_calls).clone()
    }

    fn count_ext(&self, rpc: &'static str) {
        *lock(&self.0.ext_calls).entry(rpc).or_default() += 1;
    }

    /// A migration's record as it is now (after the asks its call raised were answered).
    fn migration_now(&self, id: &str) -> manager_proto::extension::MigrationResponse {
        lock(&self.0.world).ext_migration(id)
    }

    /// The tonic server of this service.
    pub fn into_server(self) -> manager_proto::api::manager::manager_server::ManagerServer<Self> {
        manager_proto::api::manager::manager_server::ManagerServer::new(self)
    }

    /// Ends every open event stream; how many were open.
    pub fn cut_streams(&self) -> usize {
        let mut streams = lock(&self.0.streams);
        let open = streams.iter().filter(|tx| !tx.is_closed()).count();
        streams.clear();
        let mut ext = lock(&self.0.ext_streams);
        let ext_open = ext.iter().filter(|tx| !tx.is_closed()).count();
        ext.clear();
        open + ext_open
    }

    /// The provider will reclaim node `id` in `in_ms` (SimAdmin's NoticeNode) if this world
    /// holds it; `None` when it does not.
    pub fn notice_node(&self, id: &str, in_ms: u64, reason: &str) -> Option<Result<(), Status>> {
        if !lock(&self.0.world).has_node(id) {
            return None;
        }
        Some(self.apply(|w, now| w.notice_node(id, in_ms, reason, now)))
    }

    /// Kills node `id` if this world holds it (SimAdmin's KillNode); `None` when it does not.
    pub fn kill_node(&self, id: &str) -> Option<Result<(), Status>> {
        if !lock(&self.0.world).has_node(id) {
            return None;
        }
        Some(self.apply(|w, now| w.kill_node(id, now)))
    }

    /// Whether this world holds job `id`.
    pub fn has_job(&self, id: &str) -> bool {
        lock(&self.0.world).has_job(id)
    }

    /// Fails job `id`'s instance under `role` (every live one when empty) if this world holds
    /// the job (SimAdmin's FailJob); `None` when it does not. Answers the roles that failed.
    pub fn fail_job(
        &self,
        id: &str,
        role: &str,
        message: &str,
    ) -> Option<Result<Vec<String>, Status>> {
        if !self.has_job(id) {
            return None;
        }
        Some(self.apply(|w, now| w.fail_job(id, role, message, now)))
    }

    /// The next `count` starts are refused (SimAdmin's RejectNext).
    pub fn reject_next(&self, count: u32) {
        // Infallible: the closure's error type only fits `apply`.
        let _ = self.apply(|w, _| {
            w.reject_next(count);
            Ok(())
        });
    }

    /// Every elastic pool's provisioning delay (SimAdmin's SlowProvision).
    pub fn slow_provision(&self, delay_ms: u64) -> Result<(), Status> {
        self.apply(|w, _| w.slow_provision(delay_ms))
    }

    /// A zone dies, or is revived (SimAdmin's KillZone): the node ids killed.
    pub fn kill_zone(&self, zone: &str, revive: bool) -> Result<Vec<String>, Status> {
        self.apply(|w, now| w.kill_zone(zone, revive, now))
    }

    /// A zone is cut off, or healed (SimAdmin's PartitionZone): the node ids affected.
    pub fn partition_zone(&self, zone: &str, heal: bool) -> Result<Vec<String>, Status> {
        self.apply(|w, now| w.partition_zone(zone, heal, now))
    }

    /// How job `id` answers our extension's migration handshake from now on.
    pub fn set_migration_behaviour(
        &self,
        id: &str,
        behaviour: JobBehaviour,
    ) -> Result<(), BehaviourError> {
        lock(&self.0.world).set_migration_behaviour(id, behaviour)
    }

    /// The configuration's `jobSocket.behaviours` rules, for this world's jobs.
    pub fn set_behaviour_rules(&self, rules: Vec<crate::behaviour::BehaviourRule>) {
        lock(&self.0.world).set_behaviour_rules(rules);
    }

    /// What the sim saw of job `id` (SimAdmin's JobHistory) if this world saw it start;
    /// `None` when it did not.
    pub fn job_history(
        &self,
        id: &str,
    ) -> Option<Result<manager_proto::JobHistoryResponse, Status>> {
        let w = lock(&self.0.world);
        if !w.has_job_history(id) {
            return None;
        }
        Some(w.job_history(id, now_ms()).map_err(status))
    }

    /// Runs a command at the current time and sends what it did to every open stream.
    fn apply<R>(
        &self,
        f: impl FnOnce(&mut PublishedWorld, i64) -> Result<R, CommandError>,
    ) -> Result<R, Status> {
        let now = now_ms();
        let mut w = lock(&self.0.world);
        w.advance(now);
        let r = f(&mut w, now).map_err(status);
        self.0.dirty.store(true, Ordering::Release);
        // Sent under the world's lock, so every stream sees events in the world's order and
        // none between its snapshot and its first live event is lost.
        flush(&self.0, &mut w, now);
        drop(w);
        self.0.timer.notify_one();
        r
    }
}

/// Answers the handshake's asks as each job's behaviour says (cooperative unless SimAdmin set
/// one), or relays them to the jobs over their job socket, then sends what the world queued to
/// every open stream of each API.
fn flush(inner: &Arc<Inner>, w: &mut PublishedWorld, now: i64) {
    w.answer_asks(now);
    relay(inner, w);
    let events = w.take_events();
    let ext = w.take_ext_events();
    if !events.is_empty() || !ext.is_empty() {
        inner.dirty.store(true, Ordering::Release);
    }
    broadcast(inner, events);
    send_all(&inner.ext_streams, ext);
}

/// Tells the job socket what changed in the world (instances started or gone, nodes with or
/// without a listener) and hands it the handshake's asks; each answer comes back to the world
/// under its lock, and what it raises is relayed in turn.
fn relay(inner: &Arc<Inner>, w: &mut PublishedWorld) {
    let agent = {
        let mut socket = lock(&inner.job_socket);
        let Some(socket) = socket.as_mut() else {
            return;
        };
        let (jobs, nodes) = w.socket_view();
        for (id, has) in &nodes {
            if socket.nodes.get(id) != Some(has) {
                socket.agent.note_node(id, *has);
            }
        }
        socket.nodes = nodes.into_iter().collect();
        for id in socket.jobs.keys().filter(|id| !jobs.contains_key(*id)) {
            socket.agent.sync_instances(id, &[], &[]);
        }
        for (id, job) in &jobs {
            if socket.jobs.get(id) != Some(job) {
                let live: Vec<&str> = job.live.iter().map(String::as_str).collect();
                let running: Vec<&str> = job.running.iter().map(String::as_str).collect();
                socket.agent.sync_instances(id, &live, &running);
            }
        }
        socket.jobs = jobs;
        socket.agent.clone()
    };
    for ask in w.take_asks() {
        let inner = Arc::clone(inner);
        let agent = Arc::clone(&agent);
        tokio::spawn(async move {
            let reply = crate::JobAgent::answer(&*agent, ask.clone()).await;
            let mut w = lock(&inner.world);
            let now = now_ms();
            w.advance(now);
            w.migration_reply(&ask, reply, now);
            flush(&inner, &mut w, now);
        });
    }
}

fn persist(inner: &Inner, last: bool) -> Result<(), SimError> {
    let Some(path) = &inner.state_file else {
        return Ok(());
    };
    if !inner.dirty.swap(false, Ordering::AcqRel) && !last {
        return Ok(());
    }
    let saved = lock(&inner.world).persisted();
    let written = write_state(path, &saved);
    if written.is_err() {
        // Tried again at the next tick.
        inner.dirty.store(true, Ordering::Release);
    }
    written
}

/// Writes the world when it changed, every [`PERSIST_EVERY`]; ends with the service.
async fn run_persist(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(PERSIST_EVERY);
    loop {
        tick.tick().await;
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let written = tokio::task::spawn_blocking(move || persist(&strong, false)).await;
        match written {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "writing the published world failed"),
            Err(e) => tracing::error!(error = %e, "the published world's writer panicked"),
        }
    }
}

fn broadcast(inner: &Inner, events: Vec<EventStreamEvent>) {
    send_all(&inner.streams, events);
}

fn send_all<T: Clone>(streams: &Mutex<Vec<mpsc::Sender<Result<T, Status>>>>, events: Vec<T>) {
    if events.is_empty() {
        return;
    }
    let mut streams = lock(streams);
    streams.retain(|tx| {
        events.iter().all(|e| match tx.try_send(Ok(e.clone())) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                tracing::warn!("cutting a published event stream that fell behind");
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        })
    });
}

/// Starts nodes when their delay has passed. Holds the service only while it works, and ends
/// within a second of the service being dropped.
async fn run_timer(inner: std::sync::Weak<Inner>, timer: Arc<Notify>) {
    const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let due = lock(&strong.world).next_due_ms();
        drop(strong);
        let wait = due.map_or(RECHECK, |d| {
            std::time::Duration::from_millis(u64::try_from(d.saturating_sub(now_ms())).unwrap_or(0))
                .min(RECHECK)
        });
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = timer.notified() => {}
        }
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let mut w = lock(&strong.world);
        let now = now_ms();
        w.advance(now);
        flush(&strong, &mut w, now);
    }
}

type EventStreamOf<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl Manager for PublishedService {
    type CreateStatusChannelStream = EventStreamOf<NorskStatusEvent>;
    type JobSearchStream = EventStreamOf<CurrentJob>;
    type EventStreamStream = EventStreamOf<EventStreamEvent>;

    async fn create_status_channel(
        &self,
        _req: Request<()>,
    ) -> Result<Response<Self::CreateStatusChannelStream>, Status> {
        self.count("CreateStatusChannel");
        // A Hello, then nothing: the sim writes no log lines to its clients.
        let hello = NorskStatusEvent {
            message: Some(norsk_status_event::Message::Hello(Hello { version: None })),
        };
        let stream = futures::stream::once(async { Ok(hello) }).chain(futures::stream::pending());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn create_job(&self, req: Request<Job>) -> Result<Response<JobHash>, Status> {
        self.count("CreateJob");
        let job = req.into_inner();
        let hash = self.apply(|w, now| w.create_job(job, now))?;
        Ok(Response::new(JobHash { hash }))
    }

    async fn update_job(&self, req: Request<Job>) -> Result<Response<JobHash>, Status> {
        self.count("UpdateJob");
        let job = req.into_inner();
        let hash = self.apply(|w, now| w.update_job(job, now))?;
        Ok(Response::new(JobHash { hash }))
    }

    async fn delete_job(&self, req: Request<JobId>) -> Result<Response<()>, Status> {
        self.count("DeleteJob");
        let id = req.into_inner().job_id;
        self.apply(|w, _| w.delete_job(&id))?;
        Ok(Response::new(()))
    }

    async fn job_search(
        &self,
        req: Request<JobSearchRequest>,
    ) -> Result<Response<Self::JobSearchStream>, Status> {
        self.count("JobSearch");
        let filters = req.into_inner().job_filter;
        let found = lock(&self.0.world).job_search(&filters).map_err(status)?;
        Ok(Response::new(Box::pin(futures::stream::iter(
            found.into_iter().map(Ok),
        ))))
    }

    async fn create_aws_node(
        &self,
        req: Request<CreateAwsNodeRequest>,
    ) -> Result<Response<()>, Status> {
        self.count("CreateAwsNode");
        let req = req.into_inner();
        self.apply(|w, now| w.create_aws_node(&req, now))?;
        Ok(Response::new(()))
    }

    async fn create_oci_node(
        &self,
        req: Request<CreateOciNodeRequest>,
    ) -> Result<Response<()>, Status> {
        self.count("CreateOciNode");
        let req = req.into_inner();
        self.apply(|w, now| w.create_oci_node(&req, now))?;
        Ok(Response::new(()))
    }

    async fn update_physical_node(
        &self,
        _req: Request<UpdatePhysicalNodeRequest>,
    ) -> Result<Response<()>, Status> {
        self.count("UpdatePhysicalNode");
        Err(Status::unimplemented(
            "manager-sim does not simulate a physical node's daemon version",
        ))
    }

    async fn terminate_node(&self, req: Request<NodeId>) -> Result<Response<()>, Status> {
        self.count("TerminateNode");
        let id = req.into_inner().node_id;
        self.apply(|w, now| w.terminate_node(&id, now))?;
        Ok(Response::new(()))
    }

    async fn start_job(&self, req: Request<StartJobRequest>) -> Result<Response<()>, Status> {
        self.count("StartJob");
        let r = req.into_inner();
        let (job, node) = (job_id(r.job_id), node_id(r.node_id));
        self.apply(|w, now| w.start_job(&job, &r.role, &node, now))?;
        Ok(Response::new(()))
    }

    async fn stop_job(&self, req: Request<StopJobRequest>) -> Result<Response<()>, Status> {
        self.count("StopJob");
        let r = req.into_inner();
        let (job, node) = (job_id(r.job_id), node_id(r.node_id));
        self.apply(|w, now| w.stop_job(&job, &r.role, &node, now))?;
        Ok(Response::new(()))
    }

    async fn complete_job(&self, req: Request<JobId>) -> Result<Response<()>, Status> {
        self.count("CompleteJob");
        let id = req.into_inner().job_id;
        self.apply(|w, now| w.complete_job(&id, now))?;
        Ok(Response::new(()))
    }

    async fn event_stream(
        &self,
        req: Request<EventStreamRequest>,
    ) -> Result<Response<Self::EventStreamStream>, Status> {
        self.count("EventStream");
        let window = req.into_inner().pending_window_s;
        if window < 0 {
            return Err(Status::invalid_argument(format!(
                "pending_window_s must be >= 0, not {window}"
            )));
        }
        let mut w = lock(&self.0.world);
        let now = now_ms();
        w.advance(now);
        flush(&self.0, &mut w, now);
        let snapshot = w.snapshot();
        let (tx, rx) = mpsc::channel(snapshot.len() + STREAM_BACKLOG);
        for e in snapshot {
            // The channel was sized for the snapshot.
            let _ = tx.try_send(Ok(e));
        }
        lock(&self.0.streams).push(tx);
        drop(w);
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
