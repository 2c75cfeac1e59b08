//! The simulated Manager's world as a pure state machine: commands and timer
//! ticks in, events out. No I/O, no clock, no async — the server layer owns
//! those — so every rule here is unit- and property-testable.
//!
//! Rules of the model:
//! - Every change emits one or more [`Event`]s with consecutive revisions; the
//!   world keeps a bounded log of them so watchers can resume.
//! - A job instance holds its job's capacity and cores on its node while it
//!   is STARTING, RUNNING or STOPPING; STOPPED and FAILED release them.
//! - Delayed transitions (node provisioning, instance start and stop) are
//!   timers; [`World::advance`] fires those that are due.
//! - Migrations move a job with a [`MigrationStrategy`]. A handover asks the
//!   job things (get-state, initial-state, cutover); those asks leave the
//!   world as [`JobAsk`]s and the answers come back through
//!   [`World::migration_reply`], so the answering side can be an in-process
//!   default ([`default_reply`]) or a real job socket. Overlap and
//!   stop-then-start ask the job nothing: the world starts the target (role
//!   MIGRATION_TARGET), stops the source and promotes the target to the
//!   job's normal instance at cutover, driven by its own instance timers.
//! - Every job's history (instance starts with their roles, time without a
//!   RUNNING instance) is kept for [`World::job_history`].

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};

use manager_proto::{
    Bundle, BundleDeleted, BundleJob, BundleUpdated, ConfigUpdated, CreateNodeRequest, Event,
    FailedParticipant, InstanceStart, InventoryUpdated, Job, JobHistoryResponse, JobInstance,
    JobRejected, JobRemoved, JobRequirements, JobRole, JobState, JobStopping, JobUpdated,
    Migration, MigrationParty, MigrationPhase, MigrationPhaseChanged, MigrationStrategy, Node,
    NodeInventory, NodePoweredOff, NodePoweringOff, NodeReclaimNotice, NodeStarted, NodeStarting,
    NodeState, NodeStopped, NodeTerminated, Pool, ProviderKind, RejectionReason, StopReason, event,
};
use serde::{Deserialize, Serialize};

use crate::config::{PoolConfig, TimingConfig};
use crate::validate;

/// Why a command was refused. Maps one-to-one onto gRPC status codes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    /// Malformed input (`INVALID_ARGUMENT`).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The named object does not exist (`NOT_FOUND`).
    #[error("not found: {0}")]
    NotFound(String),
    /// The request conflicts with the current state (`FAILED_PRECONDITION`).
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// The id is taken (`ALREADY_EXISTS`).
    #[error("already exists: {0}")]
    AlreadyExists(String),
    /// Manager cannot serve the request now (`UNAVAILABLE`); only injected by chaos.
    #[error("unavailable: {0}")]
    Unavailable(String),
}

/// The outcome of a start that reached the worker.
#[derive(Debug, Clone, PartialEq)]
pub enum StartOutcome {
    /// The instance is STARTING.
    Accepted,
    /// The worker refused.
    Rejected {
        /// Typed reason.
        reason: RejectionReason,
        /// Detail for people.
        message: String,
    },
}

/// Something the world asks a job during a migration (the worker → job
/// frames of the job socket).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobAsk {
    /// `get-state` to the source instance.
    GetState {
        /// Migration id.
        migration_id: String,
        /// Job id.
        job_id: String,
        /// Source node.
        node_id: String,
    },
    /// `initial-state` to the freshly started target instance.
    InitialState {
        /// Migration id.
        migration_id: String,
        /// Job id.
        job_id: String,
        /// Target node.
        node_id: String,
        /// The state (UTF-8 JSON).
        payload: Vec<u8>,
    },
    /// `cutover-ready` to the source instance.
    CutoverReady {
        /// Migration id.
        migration_id: String,
        /// Job id.
        job_id: String,
        /// Source node.
        node_id: String,
        /// Controller payload (UTF-8 JSON).
        payload: Vec<u8>,
    },
    /// `cutover-apply` to the target instance.
    CutoverApply {
        /// Migration id.
        migration_id: String,
        /// Job id.
        job_id: String,
        /// Target node.
        node_id: String,
        /// The source's source-stopped-output payload (UTF-8 JSON).
        payload: Vec<u8>,
    },
}

impl JobAsk {
    /// The migration the ask belongs to.
    pub fn migration_id(&self) -> &str {
        match self {
            JobAsk::GetState { migration_id, .. }
            | JobAsk::InitialState { migration_id, .. }
            | JobAsk::CutoverReady { migration_id, .. }
            | JobAsk::CutoverApply { migration_id, .. } => migration_id,
        }
    }

    /// The job the ask goes to.
    pub fn job_id(&self) -> &str {
        match self {
            JobAsk::GetState { job_id, .. }
            | JobAsk::InitialState { job_id, .. }
            | JobAsk::CutoverReady { job_id, .. }
            | JobAsk::CutoverApply { job_id, .. } => job_id,
        }
    }
}

/// A job's answer to a [`JobAsk`] (the job → worker frames).
#[derive(Debug, Clone, PartialEq)]
pub enum JobReply {
    /// `state` (answer to GetState).
    State(Vec<u8>),
    /// `state-refused` (answer to GetState).
    StateRefused(String),
    /// `target-ready` (answer to InitialState).
    TargetReady(Vec<u8>),
    /// `source-stopped-output` (answer to CutoverReady).
    SourceStoppedOutput(Vec<u8>),
    /// `target-applied` (answer to CutoverApply).
    TargetApplied {
        /// Participants applied.
        applied: Vec<String>,
        /// Participants that failed.
        failed: Vec<FailedParticipant>,
        /// Measured skew.
        skew_ms: f64,
    },
    /// `abort` from either side.
    Abort(String),
}

/// What a cooperative job with nothing special to hand over answers: an
/// empty (`null`) state, ready at once, applied with no participants.
pub fn default_reply(ask: &JobAsk) -> JobReply {
    match ask {
        JobAsk::GetState { .. } => JobReply::State(b"null".to_vec()),
        JobAsk::InitialState { .. } => JobReply::TargetReady(b"null".to_vec()),
        JobAsk::CutoverReady { .. } => JobReply::SourceStoppedOutput(b"null".to_vec()),
        JobAsk::CutoverApply { .. } => JobReply::TargetApplied {
            applied: Vec::new(),
            failed: Vec::new(),
            skew_ms: 0.0,
        },
    }
}

/// (job id, role) → (capacity, cores) reserved on one node.
type Reservations = BTreeMap<(String, i32), (f64, i32)>;

/// Instance starts kept per job for [`World::job_history`].
const MAX_HISTORY_STARTS: usize = 256;

/// What the world saw of one job (see [`World::job_history`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct JobRecord {
    starts: VecDeque<InstanceStart>,
    /// When the job first had a RUNNING instance.
    first_running_ms: Option<i64>,
    /// When its current gap (no RUNNING instance since it first ran) began.
    uncovered_since_ms: Option<i64>,
    /// Closed gaps, summed.
    uncovered_ms: u64,
    gaps: u32,
    max_running: u32,
    running: u32,
}

impl JobRecord {
    pub(crate) fn note_start(&mut self, start: InstanceStart) {
        if self.starts.len() >= MAX_HISTORY_STARTS {
            self.starts.pop_front();
        }
        self.starts.push_back(start);
    }

    pub(crate) fn note_running(&mut self, running: u32, now_ms: i64) {
        self.max_running = self.max_running.max(running);
        match (self.running, running) {
            (0, n) if n > 0 => {
                self.first_running_ms.get_or_insert(now_ms);
                if let Some(since) = self.uncovered_since_ms.take() {
                    self.uncovered_ms += u64::try_from(now_ms - since).unwrap_or(0);
                }
            }
            (n, 0) if n > 0 => {
                self.gaps += 1;
                self.uncovered_since_ms = Some(now_ms);
            }
            _ => {}
        }
        self.running = running;
    }

    pub(crate) fn to_proto(&self, now_ms: i64) -> JobHistoryResponse {
        let open = self
            .uncovered_since_ms
            .map_or(0, |since| u64::try_from(now_ms - since).unwrap_or(0));
        JobHistoryResponse {
            starts: self.starts.iter().cloned().collect(),
            uncovered_ms: self.uncovered_ms + open,
            gaps: self.gaps,
            max_running: self.max_running,
            running: self.running,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
enum Timer {
    NodeUp(String),
    NodeOff(String),
    Reclaim(String),
    InstanceRunning(String, i32),
    InstanceStopped(String, i32),
}

#[derive(Debug, Clone)]
struct PoolRuntime {
    config: PoolConfig,
    provision_delay_ms: u64,
    start_delay_ms: u64,
    stop_delay_ms: u64,
    next_zone: usize,
}

/// The part of the world that survives a restart (`--state-dir`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistedWorld {
    /// World identity.
    pub epoch: String,
    /// Last revision.
    pub revision: u64,
    /// Next elastic node sequence number.
    pub next_node_seq: u64,
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Jobs.
    pub jobs: Vec<Job>,
    /// Bundles.
    pub bundles: Vec<Bundle>,
    /// Migrations.
    pub migrations: Vec<Migration>,
    /// The retained event log.
    pub log: Vec<Event>,
    /// Provisioning delay per pool (changed by slow-provision).
    pub pool_delays: BTreeMap<String, u64>,
    /// Zones killed by `KillZone` and not revived: a node coming up there dies instead.
    #[serde(default)]
    pub dead_zones: BTreeSet<String>,
    /// Written by a clean shutdown, after which nothing was published: the file is the whole
    /// state. A periodic write may be behind what watchers saw (a `kill -9` loses the rest),
    /// so a world restored from one takes a new epoch.
    #[serde(default)]
    pub clean_shutdown: bool,
}

/// A consistent copy of the world's objects at one revision.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WorldSnapshot {
    /// World identity.
    pub epoch: String,
    /// The revision the copy is consistent at.
    pub revision: u64,
    /// Nodes by id.
    pub nodes: Vec<Node>,
    /// Jobs by id.
    pub jobs: Vec<Job>,
    /// Bundles by id.
    pub bundles: Vec<Bundle>,
    /// Migrations by id.
    pub migrations: Vec<Migration>,
}

/// Answer of [`World::events_after`].
#[derive(Debug, PartialEq)]
pub enum Resume {
    /// The events after the revision (possibly none: up to date).
    Events(Vec<Event>),
    /// The revision is older than the log; a snapshot is needed.
    TooOld,
    /// The revision is in the future of this world; it restarted without state.
    Unknown,
}

/// The simulated Manager.
#[derive(Debug)]
pub struct World {
    epoch: String,
    revision: u64,
    timing: TimingConfig,
    pools: BTreeMap<String, PoolRuntime>,
    nodes: BTreeMap<String, Node>,
    jobs: BTreeMap<String, Job>,
    bundles: BTreeMap<String, Bundle>,
    migrations: BTreeMap<String, Migration>,
    /// node id → (job id, role) → the (capacity, cores) that instance
    /// reserved when it started. Kept per instance so a bundle update that
    /// changes requirements does not rewrite running reservations.
    holding: BTreeMap<String, Reservations>,
    timers: BinaryHeap<Reverse<(i64, u64, Timer)>>,
    timer_seq: u64,
    log: VecDeque<Event>,
    log_capacity: usize,
    outbox: Vec<Event>,
    asks: Vec<JobAsk>,
    next_node_seq: u64,
    reject_next: u32,
    /// Chaos: CreateNode calls still to answer `UNAVAILABLE`.
    unavailable_creates: u32,
    partitioned: BTreeSet<String>,
    /// Chaos: zones that died (`kill_zone`) and were not revived.
    dead_zones: BTreeSet<String>,
    history: BTreeMap<String, JobRecord>,
    /// CreateNode idempotency keys: `request_id` → the node it created (every node that has
    /// one, so it lasts as long as the node and is rebuilt from the nodes on restore).
    node_by_request: BTreeMap<String, String>,
}

fn role_of(role: i32) -> i32 {
    if role == JobRole::MigrationTarget as i32 {
        JobRole::MigrationTarget as i32
    } else {
        JobRole::Normal as i32
    }
}

fn holds(state: i32) -> bool {
    state == JobState::Starting as i32
        || state == JobState::Running as i32
        || state == JobState::Stopping as i32
}

use crate::handshake::is_final;

/// A migration's strategy; unset reads as HANDOVER.
fn strategy_of(m: &Migration) -> MigrationStrategy {
    match MigrationStrategy::try_from(m.strategy) {
        Ok(MigrationStrategy::Overlap) => MigrationStrategy::Overlap,
        Ok(MigrationStrategy::StopThenStart) => MigrationStrategy::StopThenStart,
        _ => MigrationStrategy::Handover,
    }
}

/// What a worker advertises: its capabilities, plus the job socket one
/// while its listener is up; sorted, without duplicates.
fn advertised(mut capabilities: Vec<String>, job_socket: bool) -> Vec<String> {
    if job_socket {
        capabilities.push(manager_proto::JOB_SOCKET_CAPABILITY.to_owned());
    }
    capabilities.sort();
    capabilities.dedup();
    capabilities
}

/// Whether `node` is what `req` asks for: the same pool and tags, and the same provider, region,
/// instance type and zone where the request names one (a retry that leaves the zone to Manager
/// matches whichever zone the first call got).
fn satisfies(node: &Node, req: &CreateNodeRequest) -> bool {
    let named = |asked: &str, got: &str| asked.is_empty() || asked == got;
    node.pool == req.pool
        && (req.provider == ProviderKind::Unspecified as i32 || req.provider == node.provider)
        && named(&req.region, &node.region)
        && named(&req.instance_type, &node.instance_type)
        && named(&req.zone, &node.zone)
        && node.tags == req.tags
}

/// The deterministic id of a bundle's runtime job.
pub fn job_id(bundle_id: &str, replica: u32, job_name: &str) -> String {
    format!("{bundle_id}/{replica}/{job_name}")
}

impl World {
    /// A new world: fixed pools' declared nodes are STARTED at `now_ms`.
    pub fn new(
        pools: &[PoolConfig],
        timing: TimingConfig,
        event_log_capacity: usize,
        epoch: String,
        now_ms: i64,
    ) -> World {
        let mut world = World::empty(pools, timing, event_log_capacity, epoch);
        world.add_declared_nodes(now_ms);
        world
    }

    fn empty(
        pools: &[PoolConfig],
        timing: TimingConfig,
        event_log_capacity: usize,
        epoch: String,
    ) -> World {
        let pools = pools
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    PoolRuntime {
                        provision_delay_ms: p
                            .provision_delay_ms
                            .unwrap_or(timing.provision_delay_ms),
                        start_delay_ms: p
                            .start_delay_ms
                            .or(timing.start_delay_ms)
                            .unwrap_or_else(|| p.kind.default_start_delay_ms()),
                        stop_delay_ms: p
                            .stop_delay_ms
                            .or(timing.stop_delay_ms)
                            .unwrap_or_else(|| p.kind.default_stop_delay_ms()),
                        config: p.clone(),
                        next_zone: 0,
                    },
                )
            })
            .collect();
        World {
            epoch,
            revision: 0,
            timing,
            pools,
            nodes: BTreeMap::new(),
            jobs: BTreeMap::new(),
            bundles: BTreeMap::new(),
            migrations: BTreeMap::new(),
            holding: BTreeMap::new(),
            timers: BinaryHeap::new(),
            timer_seq: 0,
            log: VecDeque::new(),
            log_capacity: event_log_capacity.max(1),
            outbox: Vec::new(),
            asks: Vec::new(),
            next_node_seq: 1,
            reject_next: 0,
            unavailable_creates: 0,
            partitioned: BTreeSet::new(),
            dead_zones: BTreeSet::new(),
            history: BTreeMap::new(),
            node_by_request: BTreeMap::new(),
        }
    }

    fn add_declared_nodes(&mut self, now_ms: i64) {
        let declared: Vec<(PoolConfig, crate::config::DeclaredNode)> = self
            .pools
            .values()
            .filter(|p| p.config.scale_out == crate::config::ScaleOutConfig::Fixed)
            .flat_map(|p| p.config.nodes.iter().map(|n| (p.config.clone(), n.clone())))
            .collect();
        for (pool, decl) in declared {
            if self.nodes.contains_key(&decl.id) {
                continue;
            }
            let capabilities = advertised(decl.capabilities.clone(), pool.job_socket);
            let node = Node {
                node_id: decl.id.clone(),
                pool: pool.name.clone(),
                provider: pool.kind.to_proto() as i32,
                region: pool.region.clone(),
                zone: decl.zone.clone(),
                instance_type: String::new(),
                tags: Default::default(),
                state: NodeState::Started as i32,
                inventory: Some(NodeInventory {
                    node_id: decl.id.clone(),
                    zone: decl.zone.clone(),
                    capacity: decl.capacity,
                    cores: decl.cores,
                    capabilities,
                }),
                created_at_ms: now_ms,
                state_changed_at_ms: now_ms,
                request_id: String::new(),
                reclaim_at_ms: 0,
                reclaim_reason: String::new(),
            };
            self.nodes.insert(node.node_id.clone(), node.clone());
            self.emit_started(node, now_ms);
        }
    }

    /// Restores a persisted world. Pending transitions are rescheduled from
    /// the objects' states; migrations waiting on a job are aborted, since
    /// the conversation with the job did not survive the restart.
    pub fn restore(
        pools: &[PoolConfig],
        timing: TimingConfig,
        event_log_capacity: usize,
        saved: PersistedWorld,
        now_ms: i64,
    ) -> World {
        let mut world = World::empty(pools, timing, event_log_capacity, saved.epoch);
        world.revision = saved.revision;
        world.next_node_seq = saved.next_node_seq;
        world.dead_zones = saved.dead_zones;
        world.nodes = saved
            .nodes
            .into_iter()
            .map(|n| (n.node_id.clone(), n))
            .collect();
        world.node_by_request = world
            .nodes
            .values()
            .filter(|n| !n.request_id.is_empty())
            .map(|n| (n.request_id.clone(), n.node_id.clone()))
            .collect();
        world.jobs = saved
            .jobs
            .into_iter()
            .map(|j| (j.job_id.clone(), j))
            .collect();
        world.bundles = saved
            .bundles
            .into_iter()
            .map(|b| (b.bundle_id.clone(), b))
            .collect();
        world.migrations = saved
            .migrations
            .into_iter()
            .map(|m| (m.migration_id.clone(), m))
            .collect();
        world.log = saved.log.into_iter().collect();
        while world.log.len() > world.log_capacity {
            world.log.pop_front();
        }
        for (pool, delay) in saved.pool_delays {
            if let Some(p) = world.pools.get_mut(&pool) {
                p.provision_delay_ms = delay;
            }
        }
        let starting: Vec<(String, String)> = world
            .nodes
            .values()
            .filter(|n| n.state == NodeState::Starting as i32)
            .map(|n| (n.node_id.clone(), n.pool.clone()))
            .collect();
        for (node_id, pool) in starting {
            let delay = world.pools.get(&pool).map_or(0, |p| p.provision_delay_ms);
            world.schedule(now_ms, delay, Timer::NodeUp(node_id));
        }
        // Stops under way finish, and notices still fall due, after a restart.
        let powering_off: Vec<(String, u64)> = world
            .nodes
            .values()
            .filter(|n| n.state == NodeState::PoweringOff as i32)
            .map(|n| {
                let delay = world.pools.get(&n.pool).map_or(0, |p| p.stop_delay_ms);
                (n.node_id.clone(), delay)
            })
            .collect();
        for (node_id, delay) in powering_off {
            world.schedule(now_ms, delay, Timer::NodeOff(node_id));
        }
        let noticed: Vec<(String, i64)> = world
            .nodes
            .values()
            .filter(|n| n.reclaim_at_ms > 0 && n.state != NodeState::Terminated as i32)
            .map(|n| (n.node_id.clone(), n.reclaim_at_ms))
            .collect();
        for (node_id, at) in noticed {
            let delay = u64::try_from(at.saturating_sub(now_ms)).unwrap_or(0);
            world.schedule(now_ms, delay, Timer::Reclaim(node_id));
        }
        let mut timers = Vec::new();
        for job in world.jobs.values() {
            for inst in &job.instances {
                if holds(inst.state) {
                    let req = job.requirements.clone().unwrap_or_default();
                    world
                        .holding
                        .entry(inst.node_id.clone())
                        .or_default()
                        .insert(
                            (job.job_id.clone(), inst.role),
                            (req.required_capacity, req.required_cores),
                        );
                }
                if inst.state == JobState::Starting as i32 {
                    timers.push((
                        world.timing.job_start_delay_ms,
                        Timer::InstanceRunning(job.job_id.clone(), inst.role),
                    ));
                } else if inst.state == JobState::Stopping as i32 {
                    timers.push((
                        world.timing.job_stop_delay_ms,
                        Timer::InstanceStopped(job.job_id.clone(), inst.role),
                    ));
                }
            }
        }
        for (delay, t) in timers {
            world.schedule(now_ms, delay, t);
        }
        // Handover phases that wait on an answer from a job; the others wait
        // on the controller and can carry on. Overlap and stop-then-start
        // wait only on Manager's own timers, rescheduled above.
        let waiting_on_job = [
            MigrationPhase::Proposed as i32,
            MigrationPhase::PreparingTarget as i32,
            MigrationPhase::CuttingOver as i32,
        ];
        let waiting: Vec<String> = world
            .migrations
            .values()
            .filter(|m| {
                strategy_of(m) == MigrationStrategy::Handover && waiting_on_job.contains(&m.phase)
            })
            .map(|m| m.migration_id.clone())
            .collect();
        for id in waiting {
            world.abort_migration(&id, MigrationParty::Manager, "manager restarted", now_ms);
        }
        // A stop-then-start target's reservation is not an instance: take it again.
        let reserved: Vec<(String, String)> = world
            .migrations
            .values()
            .filter(|m| strategy_of(m) == MigrationStrategy::StopThenStart && !is_final(m.phase))
            .filter(|m| !m.target_node_id.is_empty())
            .map(|m| (m.job_id.clone(), m.target_node_id.clone()))
            .collect();
        for (job_id, node_id) in reserved {
            world.reserve_target(&job_id, &node_id);
        }
        let jobs: BTreeSet<String> = world
            .migrations
            .values()
            .filter(|m| !is_final(m.phase))
            .map(|m| m.job_id.clone())
            .collect();
        for job_id in jobs {
            world.step_migrations(&job_id, now_ms);
        }
        world.add_declared_nodes(now_ms);
        world
    }

    /// What survives a restart.
    pub fn persisted(&self) -> PersistedWorld {
        PersistedWorld {
            epoch: self.epoch.clone(),
            revision: self.revision,
            next_node_seq: self.next_node_seq,
            nodes: self.nodes.values().cloned().collect(),
            jobs: self.jobs.values().cloned().collect(),
            bundles: self.bundles.values().cloned().collect(),
            migrations: self.migrations.values().cloned().collect(),
            log: self.log.iter().cloned().collect(),
            pool_delays: self
                .pools
                .iter()
                .map(|(k, p)| (k.clone(), p.provision_delay_ms))
                .collect(),
            dead_zones: self.dead_zones.clone(),
            clean_shutdown: false,
        }
    }

    // ───────────────────────────── reads ─────────────────────────────

    /// World identity; changes only when the state is lost.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The revision of the last event.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// A node by id.
    pub fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.get(id)
    }

    /// A job by id.
    pub fn job(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    /// A migration by id.
    pub fn migration(&self, id: &str) -> Option<&Migration> {
        self.migrations.get(id)
    }

    /// All nodes, sorted by id, optionally of one pool.
    pub fn nodes(&self, pool: Option<&str>) -> Vec<Node> {
        self.nodes
            .values()
            .filter(|n| pool.is_none_or(|p| n.pool == p))
            .cloned()
            .collect()
    }

    /// The pools, sorted by name.
    pub fn pools(&self) -> Vec<Pool> {
        self.pools
            .values()
            .map(|p| p.config.to_proto(p.provision_delay_ms, p.start_delay_ms))
            .collect()
    }

    /// Capacity and cores in use on a node.
    pub fn usage(&self, node_id: &str) -> (f64, i32) {
        let mut capacity = 0.0;
        let mut cores = 0i32;
        if let Some(set) = self.holding.get(node_id) {
            for (c, k) in set.values() {
                capacity += c;
                cores = cores.saturating_add(*k);
            }
        }
        (capacity, cores)
    }

    /// A consistent copy of every object.
    pub fn snapshot(&self) -> WorldSnapshot {
        WorldSnapshot {
            epoch: self.epoch.clone(),
            revision: self.revision,
            nodes: self.nodes.values().cloned().collect(),
            jobs: self.jobs.values().cloned().collect(),
            bundles: self.bundles.values().cloned().collect(),
            migrations: self.migrations.values().cloned().collect(),
        }
    }

    /// Up to `max` events after `revision`.
    pub fn events_after(&self, revision: u64, max: usize) -> Resume {
        if revision > self.revision {
            return Resume::Unknown;
        }
        if revision == self.revision {
            return Resume::Events(Vec::new());
        }
        let Some(first) = self.log.front().map(|e| e.revision) else {
            return Resume::TooOld;
        };
        if revision + 1 < first {
            return Resume::TooOld;
        }
        let skip = usize::try_from(revision + 1 - first).unwrap_or(usize::MAX);
        Resume::Events(self.log.iter().skip(skip).take(max).cloned().collect())
    }

    /// The earliest pending timer, if any.
    pub fn next_due_ms(&self) -> Option<i64> {
        self.timers.peek().map(|Reverse((due, _, _))| *due)
    }

    /// Events emitted since the last call, in order.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.outbox)
    }

    /// Questions for jobs emitted since the last call.
    pub fn take_asks(&mut self) -> Vec<JobAsk> {
        std::mem::take(&mut self.asks)
    }

    // ───────────────────────────── plumbing ─────────────────────────────

    fn emit(&mut self, now_ms: i64, kind: event::Kind) {
        self.revision += 1;
        let ev = Event {
            revision: self.revision,
            at_ms: now_ms,
            kind: Some(kind),
        };
        if self.log.len() >= self.log_capacity {
            self.log.pop_front();
        }
        self.log.push_back(ev.clone());
        self.outbox.push(ev);
    }

    fn schedule(&mut self, now_ms: i64, delay_ms: u64, timer: Timer) {
        self.timer_seq += 1;
        let due = now_ms.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
        self.timers.push(Reverse((due, self.timer_seq, timer)));
    }

    fn emit_job(&mut self, job_id: &str, now_ms: i64) {
        if let Some(job) = self.jobs.get_mut(job_id) {
            job.updated_at_ms = now_ms;
            let job = job.clone();
            let running = job
                .instances
                .iter()
                .filter(|i| i.state == JobState::Running as i32)
                .count();
            // A job is in the history from its first start on.
            if let Some(h) = self.history.get_mut(job_id) {
                h.note_running(u32::try_from(running).unwrap_or(u32::MAX), now_ms);
            }
            self.emit(
                now_ms,
                event::Kind::JobUpdated(JobUpdated { job: Some(job) }),
            );
        }
    }

    fn emit_migration(&mut self, id: &str, now_ms: i64) {
        if let Some(m) = self.migrations.get_mut(id) {
            m.updated_at_ms = now_ms;
            let m = m.clone();
            self.emit(
                now_ms,
                event::Kind::MigrationPhase(MigrationPhaseChanged { migration: Some(m) }),
            );
        }
    }

    /// Sets an instance's state, keeps the holding index and the job's
    /// summary fields true. Returns false when there is no such instance.
    fn set_instance_state(
        &mut self,
        job_id: &str,
        role: i32,
        state: JobState,
        reason: Option<StopReason>,
        message: &str,
    ) -> bool {
        let Some(job) = self.jobs.get_mut(job_id) else {
            return false;
        };
        let Some(inst) = job.instances.iter_mut().find(|i| i.role == role) else {
            return false;
        };
        inst.state = state as i32;
        if let Some(r) = reason {
            inst.stop_reason = r as i32;
        }
        if !message.is_empty() {
            inst.message = message.to_owned();
        }
        let node_id = inst.node_id.clone();
        if !holds(state as i32)
            && let Some(set) = self.holding.get_mut(&node_id)
        {
            set.remove(&(job_id.to_owned(), role));
        }
        Self::refresh_summary(job);
        true
    }

    fn refresh_summary(job: &mut Job) {
        match job
            .instances
            .iter()
            .find(|i| i.role == JobRole::Normal as i32)
        {
            Some(inst) => {
                job.state = inst.state;
                job.node_id = inst.node_id.clone();
            }
            None => {
                job.state = JobState::Pending as i32;
                job.node_id.clear();
            }
        }
    }

    fn instance(&self, job_id: &str, role: i32) -> Option<&JobInstance> {
        self.jobs
            .get(job_id)
            .and_then(|j| j.instances.iter().find(|i| i.role == role))
    }

    /// Stops a holding instance: JobStopping, then STOPPING (to be STOPPED by
    /// a timer) or straight to `end` when given.
    fn stop_instance(
        &mut self,
        job_id: &str,
        role: i32,
        reason: StopReason,
        end: Option<JobState>,
        now_ms: i64,
    ) {
        let Some(inst) = self.instance(job_id, role) else {
            return;
        };
        if !holds(inst.state) {
            return;
        }
        let node_id = inst.node_id.clone();
        let already_stopping = inst.state == JobState::Stopping as i32;
        if !already_stopping || end.is_some() {
            self.emit(
                now_ms,
                event::Kind::JobStopping(JobStopping {
                    job_id: job_id.to_owned(),
                    node_id,
                    role,
                    reason: reason as i32,
                }),
            );
        }
        match end {
            Some(state) => {
                self.set_instance_state(job_id, role, state, Some(reason), "");
            }
            None => {
                self.set_instance_state(job_id, role, JobState::Stopping, Some(reason), "");
                self.schedule(
                    now_ms,
                    self.timing.job_stop_delay_ms,
                    Timer::InstanceStopped(job_id.to_owned(), role),
                );
            }
        }
        self.emit_job(job_id, now_ms);
        // Manager's own stop of a source at cutover is the migration itself.
        if reason != StopReason::Migrated {
            self.abort_migrations_touching(job_id, role, now_ms);
        }
    }

    /// A participant of an ongoing migration went away: abort it.
    fn abort_migrations_touching(&mut self, job_id: &str, role: i32, now_ms: i64) {
        let target_of = self
            .instance(job_id, role)
            .filter(|_| role == JobRole::MigrationTarget as i32)
            .map(|i| i.migration_id.clone());
        let ids: Vec<String> = self
            .migrations
            .values()
            .filter(|m| m.job_id == job_id && !is_final(m.phase))
            .filter(|m| target_of.as_ref().is_none_or(|t| *t == m.migration_id))
            .map(|m| m.migration_id.clone())
            .collect();
        let why = if target_of.is_some() {
            "the target instance stopped"
        } else {
            "the source instance stopped"
        };
        for id in ids {
            self.abort_migration(&id, MigrationParty::Manager, why, now_ms);
        }
    }

    fn abort_migration(&mut self, id: &str, by: MigrationParty, reason: &str, now_ms: i64) {
        let Some(m) = self.migrations.get_mut(id) else {
            return;
        };
        if is_final(m.phase) {
            return;
        }
        m.phase = MigrationPhase::Aborted as i32;
        m.aborted_by = by as i32;
        m.abort_reason = reason.to_owned();
        let job_id = m.job_id.clone();
        let mid = m.migration_id.clone();
        let target_node = m.target_node_id.clone();
        self.emit_migration(id, now_ms);
        // A target started for this migration is stopped.
        let target_role = JobRole::MigrationTarget as i32;
        if self
            .instance(&job_id, target_role)
            .is_some_and(|i| i.migration_id == mid && holds(i.state))
        {
            self.stop_instance(
                &job_id,
                target_role,
                StopReason::MigrationAborted,
                None,
                now_ms,
            );
        }
        self.release_target(&job_id, &target_node);
    }

    /// Holds the job's capacity on `node_id` for a stop-then-start target
    /// that is not started yet.
    fn reserve_target(&mut self, job_id: &str, node_id: &str) {
        let target_role = JobRole::MigrationTarget as i32;
        if self
            .instance(job_id, target_role)
            .is_some_and(|i| holds(i.state))
        {
            return;
        }
        let req = self
            .jobs
            .get(job_id)
            .and_then(|j| j.requirements.clone())
            .unwrap_or_default();
        self.holding.entry(node_id.to_owned()).or_default().insert(
            (job_id.to_owned(), target_role),
            (req.required_capacity, req.required_cores),
        );
    }

    /// Releases a target reservation on `node_id` that no live target
    /// instance holds.
    fn release_target(&mut self, job_id: &str, node_id: &str) {
        let target_role = JobRole::MigrationTarget as i32;
        if self
            .instance(job_id, target_role)
            .is_some_and(|i| i.node_id == node_id && holds(i.state))
        {
            return;
        }
        if let Some(set) = self.holding.get_mut(node_id) {
            set.remove(&(job_id.to_owned(), target_role));
        }
    }

    /// Moves the job's overlap and stop-then-start migrations on after one
    /// of its instances changed state: an overlap target that runs is
    /// TARGET_READY; a stop-then-start source that stopped has its target
    /// started on the reservation, and a target that runs is promoted.
    fn step_migrations(&mut self, job_id: &str, now_ms: i64) {
        let ids: Vec<String> = self
            .migrations
            .values()
            .filter(|m| m.job_id == job_id && !is_final(m.phase))
            .filter(|m| strategy_of(m) != MigrationStrategy::Handover)
            .map(|m| m.migration_id.clone())
            .collect();
        for id in ids {
            let Some(m) = self.migrations.get(&id).cloned() else {
                continue;
            };
            let target = self
                .instance(job_id, JobRole::MigrationTarget as i32)
                .filter(|i| i.migration_id == id)
                .cloned();
            let target_runs = target
                .as_ref()
                .is_some_and(|i| i.state == JobState::Running as i32);
            let phase = MigrationPhase::try_from(m.phase).unwrap_or_default();
            match (strategy_of(&m), phase) {
                (MigrationStrategy::Overlap, MigrationPhase::PreparingTarget) if target_runs => {
                    if let Some(m) = self.migrations.get_mut(&id) {
                        m.phase = MigrationPhase::TargetReady as i32;
                    }
                    self.emit_migration(&id, now_ms);
                }
                (MigrationStrategy::StopThenStart, MigrationPhase::CuttingOver) => {
                    let source_holds = self
                        .instance(job_id, JobRole::Normal as i32)
                        .is_some_and(|i| holds(i.state));
                    if target_runs {
                        self.complete_migration(job_id, &id, now_ms);
                    } else if target.is_none() && !source_holds {
                        self.start_reserved_target(job_id, &m, now_ms);
                    }
                }
                _ => {}
            }
        }
    }

    /// Starts a stop-then-start target on its reservation (the source has
    /// stopped); a refusal aborts the migration by the target.
    fn start_reserved_target(&mut self, job_id: &str, m: &Migration, now_ms: i64) {
        self.release_target(job_id, &m.target_node_id);
        let outcome = self.start_instance(
            job_id,
            &m.target_node_id,
            JobRole::MigrationTarget as i32,
            &m.migration_id,
            now_ms,
        );
        let (by, why) = match outcome {
            Ok(StartOutcome::Accepted) => return,
            Ok(StartOutcome::Rejected { message, .. }) => (
                MigrationParty::Target,
                format!("the target node refused the start: {message}"),
            ),
            Err(e) => (
                MigrationParty::Manager,
                format!("the target could not be started: {e}"),
            ),
        };
        self.abort_migration(&m.migration_id, by, &validate::excerpt(&why), now_ms);
    }

    // ───────────────────────────── timers ─────────────────────────────

    /// Fires every timer due at or before `now_ms`.
    pub fn advance(&mut self, now_ms: i64) {
        while let Some(Reverse((due, _, _))) = self.timers.peek() {
            if *due > now_ms {
                break;
            }
            let Some(Reverse((_, _, timer))) = self.timers.pop() else {
                break;
            };
            match timer {
                Timer::NodeUp(id) => self.node_up(&id, now_ms),
                Timer::NodeOff(id) => self.node_off(&id, now_ms),
                Timer::Reclaim(id) => {
                    if self.nodes.get(&id).is_some_and(|n| {
                        n.reclaim_at_ms > 0 && n.state != NodeState::Terminated as i32
                    }) {
                        let _ = self.kill_node(&id, now_ms);
                    }
                }
                Timer::InstanceRunning(job_id, role) => {
                    if self
                        .instance(&job_id, role)
                        .is_some_and(|i| i.state == JobState::Starting as i32)
                    {
                        self.set_instance_state(&job_id, role, JobState::Running, None, "");
                        self.emit_job(&job_id, now_ms);
                        self.step_migrations(&job_id, now_ms);
                    }
                }
                Timer::InstanceStopped(job_id, role) => {
                    if self
                        .instance(&job_id, role)
                        .is_some_and(|i| i.state == JobState::Stopping as i32)
                    {
                        self.set_instance_state(&job_id, role, JobState::Stopped, None, "");
                        self.emit_job(&job_id, now_ms);
                        self.step_migrations(&job_id, now_ms);
                    }
                }
            }
        }
    }

    fn node_up(&mut self, id: &str, now_ms: i64) {
        let Some(node) = self.nodes.get(id) else {
            return;
        };
        if node.state != NodeState::Starting as i32 {
            return;
        }
        if self.dead_zones.contains(&node.zone) {
            // Nothing comes up in a dead zone: the node is lost before it starts.
            let _ = self.kill_node(id, now_ms);
            return;
        }
        let Some(pool) = self.pools.get(&node.pool) else {
            return;
        };
        let it = pool
            .config
            .instance_types
            .iter()
            .find(|t| t.instance_type == node.instance_type)
            .cloned();
        let job_socket = pool.config.job_socket;
        let Some(node) = self.nodes.get_mut(id) else {
            return;
        };
        let (capacity, cores, capabilities) = it
            .map(|t| (t.capacity, t.cores, t.capabilities))
            .unwrap_or_default();
        let capabilities = advertised(capabilities, job_socket);
        node.state = NodeState::Started as i32;
        node.state_changed_at_ms = now_ms;
        node.inventory = Some(NodeInventory {
            node_id: id.to_owned(),
            zone: node.zone.clone(),
            capacity,
            cores,
            capabilities,
        });
        let node = node.clone();
        self.emit_started(node, now_ms);
    }

    /// A node is up: NodeStarted, then its inventory.
    fn emit_started(&mut self, node: Node, now_ms: i64) {
        let inventory = node.inventory.clone();
        self.emit(
            now_ms,
            event::Kind::NodeStarted(NodeStarted { node: Some(node) }),
        );
        self.emit(
            now_ms,
            event::Kind::Inventory(InventoryUpdated { inventory }),
        );
    }

    /// A stop finished: the node is POWERED_OFF.
    fn node_off(&mut self, id: &str, now_ms: i64) {
        let Some(node) = self.nodes.get_mut(id) else {
            return;
        };
        if node.state != NodeState::PoweringOff as i32 {
            return;
        }
        node.state = NodeState::PoweredOff as i32;
        node.state_changed_at_ms = now_ms;
        let node = node.clone();
        self.emit(
            now_ms,
            event::Kind::NodePoweredOff(NodePoweredOff { node: Some(node) }),
        );
    }

    // ───────────────────────────── nodes ─────────────────────────────

    /// StopNode: a started node that hosts nothing powers off, keeping its id and disk.
    pub fn stop_node(&mut self, node_id: &str, now_ms: i64) -> Result<Node, CommandError> {
        validate::id("node_id", node_id)?;
        let Some(node) = self.nodes.get(node_id) else {
            return Err(CommandError::NotFound(format!(
                "node {:?}",
                validate::excerpt(node_id)
            )));
        };
        let state = node.state;
        if state == NodeState::PoweringOff as i32 || state == NodeState::PoweredOff as i32 {
            return Ok(node.clone());
        }
        let Some(pool) = self.pools.get(&node.pool) else {
            return Err(CommandError::FailedPrecondition(format!(
                "node {node_id} belongs to no known pool"
            )));
        };
        if !pool.config.kind.can_stop() {
            return Err(CommandError::FailedPrecondition(format!(
                "pool {:?} is a cluster pool: its nodes cannot be stopped",
                pool.config.name
            )));
        }
        let delay = pool.stop_delay_ms;
        if state != NodeState::Started as i32 {
            return Err(CommandError::FailedPrecondition(format!(
                "node {node_id} is {}: only a started node can be stopped",
                NodeState::try_from(state).map_or("unknown", |s| s.as_str_name())
            )));
        }
        if self.holding.get(node_id).is_some_and(|h| !h.is_empty()) {
            return Err(CommandError::FailedPrecondition(format!(
                "node {node_id} hosts job instances: stop or move them first"
            )));
        }
        let Some(node) = self.nodes.get_mut(node_id) else {
            return Err(CommandError::NotFound(format!("node {node_id:?}")));
        };
        node.state = NodeState::PoweringOff as i32;
        node.state_changed_at_ms = now_ms;
        // A stopped worker advertises nothing; its inventory comes back when it starts.
        node.inventory = None;
        let node = node.clone();
        self.emit(
            now_ms,
            event::Kind::NodePoweringOff(NodePoweringOff {
                node: Some(node.clone()),
            }),
        );
        self.schedule(now_ms, delay, Timer::NodeOff(node_id.to_owned()));
        Ok(node)
    }

    /// StartNode: a powered-off node starts again, after its pool's start delay.
    pub fn start_node(&mut self, node_id: &str, now_ms: i64) -> Result<Node, CommandError> {
        validate::id("node_id", node_id)?;
        let Some(node) = self.nodes.get(node_id) else {
            return Err(CommandError::NotFound(format!(
                "node {:?}",
                validate::excerpt(node_id)
            )));
        };
        let state = node.state;
        if state == NodeState::Starting as i32 || state == NodeState::Started as i32 {
            return Ok(node.clone());
        }
        if state != NodeState::PoweredOff as i32 {
            return Err(CommandError::FailedPrecondition(format!(
                "node {node_id} is {}: only a powered-off node can be started",
                NodeState::try_from(state).map_or("unknown", |s| s.as_str_name())
            )));
        }
        let delay = self.pools.get(&node.pool).map_or(0, |p| p.start_delay_ms);
        let Some(node) = self.nodes.get_mut(node_id) else {
            return Err(CommandError::NotFound(format!("node {node_id:?}")));
        };
        node.state = NodeState::Starting as i32;
        node.state_changed_at_ms = now_ms;
        let node = node.clone();
        self.emit(
            now_ms,
            event::Kind::NodeStarting(NodeStarting {
                node: Some(node.clone()),
            }),
        );
        self.schedule(now_ms, delay, Timer::NodeUp(node_id.to_owned()));
        Ok(node)
    }

    /// Chaos: the provider announces it takes the node in `in_ms`; then it is killed.
    pub fn notice_node(
        &mut self,
        node_id: &str,
        in_ms: u64,
        reason: &str,
        now_ms: i64,
    ) -> Result<Node, CommandError> {
        validate::id("node_id", node_id)?;
        validate::reason("reason", reason)?;
        if in_ms > 86_400_000 {
            return Err(CommandError::InvalidArgument(
                "in_ms must be at most a day (86400000)".to_owned(),
            ));
        }
        let Some(node) = self.nodes.get_mut(node_id) else {
            return Err(CommandError::NotFound(format!(
                "node {:?}",
                validate::excerpt(node_id)
            )));
        };
        if node.state == NodeState::Terminated as i32 {
            return Err(CommandError::FailedPrecondition(format!(
                "node {node_id} is terminated"
            )));
        }
        node.reclaim_at_ms = now_ms.saturating_add(i64::try_from(in_ms).unwrap_or(i64::MAX));
        node.reclaim_reason = if reason.is_empty() {
            "spot-interruption".to_owned()
        } else {
            reason.to_owned()
        };
        let node = node.clone();
        self.emit(
            now_ms,
            event::Kind::ReclaimNotice(NodeReclaimNotice {
                node: Some(node.clone()),
            }),
        );
        self.schedule(now_ms, in_ms, Timer::Reclaim(node_id.to_owned()));
        Ok(node)
    }

    /// CreateNode.
    pub fn create_node(
        &mut self,
        req: &CreateNodeRequest,
        now_ms: i64,
    ) -> Result<Node, CommandError> {
        if self.unavailable_creates > 0 {
            self.unavailable_creates -= 1;
            return Err(CommandError::Unavailable(
                "the provider's API did not answer (injected)".into(),
            ));
        }
        validate::id("pool", &req.pool)?;
        validate::tags("tags", &req.tags)?;
        validate::reason("region", &req.region)?;
        validate::reason("instance_type", &req.instance_type)?;
        validate::reason("zone", &req.zone)?;
        if !req.request_id.is_empty() {
            validate::id("request_id", &req.request_id)?;
        }
        // No node has an empty request_id in the index.
        if let Some(node) = self
            .node_by_request
            .get(&req.request_id)
            .and_then(|id| self.nodes.get(id))
        {
            return if satisfies(node, req) {
                Ok(node.clone())
            } else {
                Err(CommandError::AlreadyExists(format!(
                    "request_id {:?} created node {} (pool {:?}, zone {:?}, instance type {:?}); this request asks for something else",
                    validate::excerpt(&req.request_id),
                    node.node_id,
                    node.pool,
                    node.zone,
                    node.instance_type
                )))
            };
        }
        let Some(pool) = self.pools.get_mut(&req.pool) else {
            return Err(CommandError::InvalidArgument(format!(
                "unknown pool {:?}",
                validate::excerpt(&req.pool)
            )));
        };
        let cfg = &pool.config;
        if cfg.scale_out != crate::config::ScaleOutConfig::Elastic {
            return Err(CommandError::FailedPrecondition(format!(
                "pool {:?} is fixed; its nodes are declared hardware",
                cfg.name
            )));
        }
        let kind = cfg.kind.to_proto();
        if req.provider != ProviderKind::Unspecified as i32 && req.provider != kind as i32 {
            return Err(CommandError::InvalidArgument(format!(
                "provider {} does not match pool {:?} of kind {}",
                ProviderKind::try_from(req.provider).map_or("unknown", |k| k.as_str_name()),
                cfg.name,
                kind.as_str_name()
            )));
        }
        if !req.region.is_empty() && req.region != cfg.region {
            return Err(CommandError::InvalidArgument(format!(
                "region {:?} does not match pool {:?} region {:?}",
                validate::excerpt(&req.region),
                cfg.name,
                cfg.region
            )));
        }
        let instance_type = if req.instance_type.is_empty() {
            cfg.instance_types.first().map(|t| t.instance_type.clone())
        } else {
            cfg.instance_types
                .iter()
                .find(|t| t.instance_type == req.instance_type)
                .map(|t| t.instance_type.clone())
        };
        let Some(instance_type) = instance_type else {
            return Err(CommandError::InvalidArgument(format!(
                "pool {:?} has no instance type {:?} (known: {})",
                cfg.name,
                validate::excerpt(&req.instance_type),
                cfg.instance_types
                    .iter()
                    .map(|t| t.instance_type.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        let zone = if req.zone.is_empty() {
            let n = cfg.zones.len().max(1);
            let z = cfg
                .zones
                .get(pool.next_zone % n)
                .cloned()
                .unwrap_or_default();
            pool.next_zone = pool.next_zone.wrapping_add(1);
            z
        } else if cfg.zones.contains(&req.zone) {
            req.zone.clone()
        } else {
            return Err(CommandError::InvalidArgument(format!(
                "zone {:?} is not one of pool {:?}'s zones ({})",
                validate::excerpt(&req.zone),
                cfg.name,
                cfg.zones.join(", ")
            )));
        };
        let delay = pool.provision_delay_ms;
        let node = Node {
            node_id: String::new(),
            pool: cfg.name.clone(),
            provider: kind as i32,
            region: cfg.region.clone(),
            zone,
            instance_type,
            tags: req.tags.clone(),
            state: NodeState::Starting as i32,
            inventory: None,
            created_at_ms: now_ms,
            state_changed_at_ms: now_ms,
            request_id: req.request_id.clone(),
            reclaim_at_ms: 0,
            reclaim_reason: String::new(),
        };
        let mut node = node;
        loop {
            let id = format!("{}-{}", node.pool, self.next_node_seq);
            self.next_node_seq += 1;
            if !self.nodes.contains_key(&id) {
                node.node_id = id;
                break;
            }
        }
        if !node.request_id.is_empty() {
            self.node_by_request
                .insert(node.request_id.clone(), node.node_id.clone());
        }
        self.nodes.insert(node.node_id.clone(), node.clone());
        self.emit(
            now_ms,
            event::Kind::NodeStarting(NodeStarting {
                node: Some(node.clone()),
            }),
        );
        self.schedule(now_ms, delay, Timer::NodeUp(node.node_id.clone()));
        Ok(node)
    }

    fn node_gone(&mut self, node_id: &str, reason: StopReason, end: JobState, now_ms: i64) {
        let hosted: Vec<(String, i32)> = self
            .holding
            .get(node_id)
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default();
        for (job_id, role) in hosted {
            self.stop_instance(&job_id, role, reason, Some(end), now_ms);
        }
        // Migrations whose target was meant for this node.
        let ids: Vec<String> = self
            .migrations
            .values()
            .filter(|m| {
                !is_final(m.phase) && (m.target_node_id == node_id || m.source_node_id == node_id)
            })
            .map(|m| m.migration_id.clone())
            .collect();
        for id in ids {
            self.abort_migration(
                &id,
                MigrationParty::Manager,
                "a participant's node went away",
                now_ms,
            );
        }
    }

    /// TerminateNode: stops every hosted instance (JobStopping each), then
    /// the node is TERMINATED.
    pub fn terminate_node(&mut self, node_id: &str, now_ms: i64) -> Result<Node, CommandError> {
        self.end_node(
            node_id,
            StopReason::NodeTerminated,
            JobState::Stopped,
            now_ms,
        )
    }

    /// Chaos: the node dies; hosted instances FAIL.
    pub fn kill_node(&mut self, node_id: &str, now_ms: i64) -> Result<Node, CommandError> {
        self.end_node(node_id, StopReason::NodeLost, JobState::Failed, now_ms)
    }

    fn end_node(
        &mut self,
        node_id: &str,
        reason: StopReason,
        end: JobState,
        now_ms: i64,
    ) -> Result<Node, CommandError> {
        validate::id("node_id", node_id)?;
        let Some(node) = self.nodes.get(node_id) else {
            return Err(CommandError::NotFound(format!(
                "node {:?}",
                validate::excerpt(node_id)
            )));
        };
        if node.state == NodeState::Terminated as i32 {
            return Ok(node.clone());
        }
        self.node_gone(node_id, reason, end, now_ms);
        let Some(node) = self.nodes.get_mut(node_id) else {
            return Err(CommandError::NotFound(format!("node {node_id:?}")));
        };
        node.state = NodeState::Terminated as i32;
        node.state_changed_at_ms = now_ms;
        let node = node.clone();
        self.emit(
            now_ms,
            event::Kind::NodeTerminated(NodeTerminated {
                node: Some(node.clone()),
            }),
        );
        Ok(node)
    }

    // ───────────────────────────── bundles ─────────────────────────────

    fn validate_bundle(bundle: &Bundle) -> Result<(), CommandError> {
        validate::name("bundle_id", &bundle.bundle_id, validate::MAX_ID_BYTES)?;
        if bundle.replicas == 0 || bundle.replicas > validate::MAX_REPLICAS {
            return Err(CommandError::InvalidArgument(format!(
                "replicas must be 1..={}, got {}",
                validate::MAX_REPLICAS,
                bundle.replicas
            )));
        }
        if bundle.jobs.is_empty() || bundle.jobs.len() > validate::MAX_JOBS_PER_BUNDLE {
            return Err(CommandError::InvalidArgument(format!(
                "a bundle needs 1..={} jobs, got {}",
                validate::MAX_JOBS_PER_BUNDLE,
                bundle.jobs.len()
            )));
        }
        validate::tags("labels", &bundle.labels)?;
        let mut names = BTreeSet::new();
        for job in &bundle.jobs {
            validate::name("job_name", &job.job_name, validate::MAX_JOB_NAME_BYTES)?;
            if !names.insert(job.job_name.as_str()) {
                return Err(CommandError::InvalidArgument(format!(
                    "job name {:?} appears twice",
                    job.job_name
                )));
            }
            let Some(req) = &job.requirements else {
                return Err(CommandError::InvalidArgument(format!(
                    "job {:?} has no requirements",
                    job.job_name
                )));
            };
            validate_requirements(&job.job_name, req)?;
            validate::json("config", &job.config)?;
            if job.template.len() > validate::MAX_TEMPLATE_BYTES {
                return Err(CommandError::InvalidArgument(format!(
                    "job {:?}: the template is {} bytes; at most {} are accepted",
                    job.job_name,
                    job.template.len(),
                    validate::MAX_TEMPLATE_BYTES
                )));
            }
        }
        Ok(())
    }

    /// RegisterBundle (create or update).
    pub fn register_bundle(
        &mut self,
        bundle: &Bundle,
        now_ms: i64,
    ) -> Result<(Bundle, Vec<String>), CommandError> {
        Self::validate_bundle(bundle)?;
        let mut stored = bundle.clone();
        let previous = self.bundles.get(&bundle.bundle_id);
        stored.generation = previous.map_or(1, |p| p.generation);
        let ids = |b: &Bundle| -> BTreeMap<String, BundleJob> {
            (0..b.replicas)
                .flat_map(|r| {
                    b.jobs
                        .iter()
                        .map(move |j| (job_id(&b.bundle_id, r, &j.job_name), j.clone()))
                })
                .collect()
        };
        let wanted = ids(&stored);
        if previous.is_some_and(|p| *p == stored) {
            return Ok((stored, wanted.into_keys().collect()));
        }
        let old: BTreeSet<String> = previous
            .map(|p| ids(p).into_keys().collect())
            .unwrap_or_default();
        if previous.is_some() {
            stored.generation += 1;
        }
        self.bundles
            .insert(stored.bundle_id.clone(), stored.clone());
        self.emit(
            now_ms,
            event::Kind::BundleUpdated(BundleUpdated {
                bundle: Some(stored.clone()),
            }),
        );
        for gone in old.iter().filter(|id| !wanted.contains_key(*id)) {
            self.remove_job(gone, now_ms);
        }
        for (id, spec) in &wanted {
            let replica = id
                .rsplit('/')
                .nth(1)
                .and_then(|r| r.parse::<u32>().ok())
                .unwrap_or_default();
            match self.jobs.get_mut(id) {
                Some(job) => {
                    if job.requirements != spec.requirements {
                        job.requirements.clone_from(&spec.requirements);
                        self.emit_job(id, now_ms);
                    }
                }
                None => {
                    let job = Job {
                        job_id: id.clone(),
                        bundle_id: stored.bundle_id.clone(),
                        replica,
                        job_name: spec.job_name.clone(),
                        requirements: spec.requirements.clone(),
                        state: JobState::Pending as i32,
                        node_id: String::new(),
                        instances: Vec::new(),
                        config: spec.config.clone(),
                        updated_at_ms: now_ms,
                    };
                    self.jobs.insert(id.clone(), job);
                    self.emit_job(id, now_ms);
                }
            }
        }
        Ok((stored, wanted.into_keys().collect()))
    }

    /// UpdateBundle: RegisterBundle for a bundle that must exist.
    pub fn update_bundle(
        &mut self,
        bundle: &Bundle,
        now_ms: i64,
    ) -> Result<(Bundle, Vec<String>), CommandError> {
        validate::id("bundle_id", &bundle.bundle_id)?;
        if !self.bundles.contains_key(&bundle.bundle_id) {
            return Err(CommandError::NotFound(format!(
                "bundle {:?}",
                validate::excerpt(&bundle.bundle_id)
            )));
        }
        self.register_bundle(bundle, now_ms)
    }

    fn remove_job(&mut self, job_id: &str, now_ms: i64) {
        for role in [JobRole::MigrationTarget as i32, JobRole::Normal as i32] {
            self.stop_instance(
                job_id,
                role,
                StopReason::BundleRemoved,
                Some(JobState::Stopped),
                now_ms,
            );
        }
        let ids: Vec<String> = self
            .migrations
            .values()
            .filter(|m| m.job_id == job_id && !is_final(m.phase))
            .map(|m| m.migration_id.clone())
            .collect();
        for id in ids {
            self.abort_migration(&id, MigrationParty::Manager, "the job was removed", now_ms);
        }
        if self.jobs.remove(job_id).is_some() {
            self.emit(
                now_ms,
                event::Kind::JobRemoved(JobRemoved {
                    job_id: job_id.to_owned(),
                }),
            );
        }
    }

    /// DeleteBundle.
    pub fn delete_bundle(
        &mut self,
        bundle_id: &str,
        now_ms: i64,
    ) -> Result<Vec<String>, CommandError> {
        validate::id("bundle_id", bundle_id)?;
        let Some(bundle) = self.bundles.get(bundle_id) else {
            return Err(CommandError::NotFound(format!(
                "bundle {:?}",
                validate::excerpt(bundle_id)
            )));
        };
        let ids: Vec<String> = (0..bundle.replicas)
            .flat_map(|r| {
                bundle
                    .jobs
                    .iter()
                    .map(move |j| job_id(bundle_id, r, &j.job_name))
            })
            .collect();
        for id in &ids {
            self.remove_job(id, now_ms);
        }
        self.bundles.remove(bundle_id);
        self.emit(
            now_ms,
            event::Kind::BundleDeleted(BundleDeleted {
                bundle_id: bundle_id.to_owned(),
            }),
        );
        Ok(ids)
    }

    // ───────────────────────────── jobs ─────────────────────────────

    fn worker_check(&mut self, job_id: &str, node_id: &str) -> Option<(RejectionReason, String)> {
        if self.reject_next > 0 {
            self.reject_next -= 1;
            return Some((
                RejectionReason::InjectedFault,
                "fault injected by reject-next".to_owned(),
            ));
        }
        let node = self.nodes.get(node_id)?;
        if node.state != NodeState::Started as i32 {
            return Some((
                RejectionReason::NodeNotReady,
                format!(
                    "node {node_id} is {}",
                    NodeState::try_from(node.state).map_or("unknown", |s| s.as_str_name())
                ),
            ));
        }
        let inv = node.inventory.clone().unwrap_or_default();
        let req = self
            .jobs
            .get(job_id)
            .and_then(|j| j.requirements.clone())
            .unwrap_or_default();
        if let Some(missing) = req
            .required_capabilities
            .iter()
            .find(|c| !inv.capabilities.contains(c))
        {
            return Some((
                RejectionReason::MissingCapability,
                format!("node {node_id} lacks capability {missing:?}"),
            ));
        }
        let (used_capacity, used_cores) = self.usage(node_id);
        let free_cores = inv.cores.saturating_sub(used_cores);
        if req.required_cores > free_cores {
            return Some((
                RejectionReason::InsufficientCores,
                format!(
                    "needs {} cores, {} free on {node_id}",
                    req.required_cores, free_cores
                ),
            ));
        }
        let free_capacity = inv.capacity - used_capacity;
        // A small epsilon so that sums of fractional capacities that fill a
        // node exactly are not refused for rounding.
        if req.required_capacity > free_capacity + 1e-9 {
            return Some((
                RejectionReason::InsufficientCapacity,
                format!(
                    "needs {} capacity, {} free on {node_id}",
                    req.required_capacity, free_capacity
                ),
            ));
        }
        None
    }

    fn check_job_and_node(&self, job_id: &str, node_id: &str) -> Result<(), CommandError> {
        validate::id("job_id", job_id)?;
        validate::id("node_id", node_id)?;
        if !self.jobs.contains_key(job_id) {
            return Err(CommandError::NotFound(format!(
                "job {:?}",
                validate::excerpt(job_id)
            )));
        }
        if !self.nodes.contains_key(node_id) {
            return Err(CommandError::NotFound(format!(
                "node {:?}",
                validate::excerpt(node_id)
            )));
        }
        Ok(())
    }

    /// StartJob.
    pub fn start_job(
        &mut self,
        job_id: &str,
        node_id: &str,
        role: i32,
        now_ms: i64,
    ) -> Result<StartOutcome, CommandError> {
        let role = role_of(role);
        // Between a stop-then-start source's stop and its target's promotion
        // the job is Manager's to start: a second normal instance would
        // leave two once the target is promoted.
        if role == JobRole::Normal as i32
            && let Some(m) = self.migrations.values().find(|m| {
                m.job_id == job_id
                    && m.phase == MigrationPhase::CuttingOver as i32
                    && strategy_of(m) == MigrationStrategy::StopThenStart
            })
        {
            return Err(CommandError::FailedPrecondition(format!(
                "job {job_id} is being moved by migration {} (stop-then-start cutover: Manager starts its target)",
                m.migration_id
            )));
        }
        self.start_instance(job_id, node_id, role, "", now_ms)
    }

    fn start_instance(
        &mut self,
        job_id: &str,
        node_id: &str,
        role: i32,
        migration_id: &str,
        now_ms: i64,
    ) -> Result<StartOutcome, CommandError> {
        self.check_job_and_node(job_id, node_id)?;
        if self.instance(job_id, role).is_some_and(|i| holds(i.state)) {
            return Err(CommandError::FailedPrecondition(format!(
                "job {job_id} already has a live {} instance",
                JobRole::try_from(role).map_or("unknown", |r| r.as_str_name())
            )));
        }
        if let Some((reason, message)) = self.worker_check(job_id, node_id) {
            self.emit(
                now_ms,
                event::Kind::JobRejected(JobRejected {
                    job_id: job_id.to_owned(),
                    node_id: node_id.to_owned(),
                    role,
                    reason: reason as i32,
                    message: message.clone(),
                }),
            );
            return Ok(StartOutcome::Rejected { reason, message });
        }
        let Some(job) = self.jobs.get_mut(job_id) else {
            return Err(CommandError::NotFound(format!("job {job_id:?}")));
        };
        job.instances.retain(|i| i.role != role);
        job.instances.push(JobInstance {
            node_id: node_id.to_owned(),
            role,
            state: JobState::Starting as i32,
            migration_id: migration_id.to_owned(),
            started_at_ms: now_ms,
            stop_reason: StopReason::Unspecified as i32,
            message: String::new(),
        });
        job.instances.sort_by_key(|i| i.role);
        Self::refresh_summary(job);
        self.history
            .entry(job_id.to_owned())
            .or_default()
            .note_start(InstanceStart {
                node_id: node_id.to_owned(),
                role,
                migration_id: migration_id.to_owned(),
                at_ms: now_ms,
            });
        let Some(job) = self.jobs.get(job_id) else {
            return Err(CommandError::NotFound(format!("job {job_id:?}")));
        };
        let req = job.requirements.clone().unwrap_or_default();
        self.holding.entry(node_id.to_owned()).or_default().insert(
            (job_id.to_owned(), role),
            (req.required_capacity, req.required_cores),
        );
        self.emit_job(job_id, now_ms);
        self.schedule(
            now_ms,
            self.timing.job_start_delay_ms,
            Timer::InstanceRunning(job_id.to_owned(), role),
        );
        Ok(StartOutcome::Accepted)
    }

    /// StopJob: idempotent (stopping a stopped instance is a no-op).
    pub fn stop_job(&mut self, job_id: &str, role: i32, now_ms: i64) -> Result<Job, CommandError> {
        self.stop_job_with(job_id, role, StopReason::Requested as i32, now_ms)
    }

    /// StopJob with a reason: `REQUESTED` (or unset) is a plain stop; `HANDED_TO_RECOVERY`
    /// stops the instance if it still holds its node and records the reason on it either way,
    /// so a caller's "this stop is a failure" survives the caller.
    pub fn stop_job_with(
        &mut self,
        job_id: &str,
        role: i32,
        reason: i32,
        now_ms: i64,
    ) -> Result<Job, CommandError> {
        validate::id("job_id", job_id)?;
        let reason = match StopReason::try_from(reason) {
            Ok(StopReason::Unspecified | StopReason::Requested) => StopReason::Requested,
            Ok(StopReason::HandedToRecovery) => StopReason::HandedToRecovery,
            _ => {
                return Err(CommandError::InvalidArgument(format!(
                    "reason {reason} is not one a caller may give: use STOP_REASON_REQUESTED or STOP_REASON_HANDED_TO_RECOVERY"
                )));
            }
        };
        if !self.jobs.contains_key(job_id) {
            return Err(CommandError::NotFound(format!(
                "job {:?}",
                validate::excerpt(job_id)
            )));
        }
        let role = role_of(role);
        let holding = self.instance(job_id, role).is_some_and(|i| holds(i.state));
        if holding {
            self.stop_instance(job_id, role, reason, None, now_ms);
        } else if reason == StopReason::HandedToRecovery
            && let Some(state) = self
                .instance(job_id, role)
                .and_then(|i| JobState::try_from(i.state).ok())
        {
            self.set_instance_state(job_id, role, state, Some(reason), "");
            self.emit_job(job_id, now_ms);
        }
        self.jobs
            .get(job_id)
            .cloned()
            .ok_or_else(|| CommandError::NotFound(format!("job {job_id:?}")))
    }

    /// UpdateJobConfig.
    pub fn update_job_config(
        &mut self,
        job_id: &str,
        config: &[u8],
        now_ms: i64,
    ) -> Result<Job, CommandError> {
        validate::id("job_id", job_id)?;
        validate::json("config", config)?;
        let Some(job) = self.jobs.get_mut(job_id) else {
            return Err(CommandError::NotFound(format!(
                "job {:?}",
                validate::excerpt(job_id)
            )));
        };
        job.config = config.to_vec();
        self.emit(
            now_ms,
            event::Kind::ConfigUpdated(ConfigUpdated {
                job_id: job_id.to_owned(),
                config: config.to_vec(),
            }),
        );
        self.emit_job(job_id, now_ms);
        self.jobs
            .get(job_id)
            .cloned()
            .ok_or_else(|| CommandError::NotFound(format!("job {job_id:?}")))
    }

    // ───────────────────────────── migration ─────────────────────────────

    fn migration_mut(&mut self, id: &str) -> Result<&mut Migration, CommandError> {
        validate::id("migration_id", id)?;
        self.migrations
            .get_mut(id)
            .ok_or_else(|| CommandError::NotFound(format!("migration {:?}", validate::excerpt(id))))
    }

    fn expect_phase(m: &Migration, phase: MigrationPhase) -> Result<(), CommandError> {
        if m.phase != phase as i32 {
            return Err(CommandError::FailedPrecondition(format!(
                "migration {} is {}, expected {}",
                m.migration_id,
                MigrationPhase::try_from(m.phase).map_or("unknown", |p| p.as_str_name()),
                phase.as_str_name()
            )));
        }
        Ok(())
    }

    /// NodeControllerMigrationGetState (the propose). A handover asks the
    /// source for its state; overlap and stop-then-start ask the job
    /// nothing and are STATE_RECEIVED at once.
    pub fn migration_get_state(
        &mut self,
        migration_id: &str,
        job_id: &str,
        strategy: i32,
        now_ms: i64,
    ) -> Result<Migration, CommandError> {
        validate::name("migration_id", migration_id, validate::MAX_ID_BYTES)?;
        validate::id("job_id", job_id)?;
        let strategy = crate::handshake::strategy(strategy)?;
        if self.migrations.contains_key(migration_id) {
            return Err(CommandError::AlreadyExists(format!(
                "migration {migration_id}"
            )));
        }
        let Some(source) = self.instance(job_id, JobRole::Normal as i32).cloned() else {
            if self.jobs.contains_key(job_id) {
                return Err(CommandError::FailedPrecondition(format!(
                    "job {job_id} has no running instance"
                )));
            }
            return Err(CommandError::NotFound(format!(
                "job {:?}",
                validate::excerpt(job_id)
            )));
        };
        if source.state != JobState::Running as i32 {
            return Err(CommandError::FailedPrecondition(format!(
                "job {job_id} is not RUNNING"
            )));
        }
        if let Some(other) = self
            .migrations
            .values()
            .find(|m| m.job_id == job_id && !is_final(m.phase))
        {
            return Err(CommandError::FailedPrecondition(format!(
                "job {job_id} is already being migrated by {}",
                other.migration_id
            )));
        }
        let handover = strategy == MigrationStrategy::Handover;
        let m = Migration {
            migration_id: migration_id.to_owned(),
            job_id: job_id.to_owned(),
            source_node_id: source.node_id.clone(),
            phase: crate::handshake::first_phase(strategy) as i32,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
            strategy: strategy as i32,
            ..Default::default()
        };
        self.migrations.insert(migration_id.to_owned(), m.clone());
        self.emit_migration(migration_id, now_ms);
        if handover {
            self.asks.push(JobAsk::GetState {
                migration_id: migration_id.to_owned(),
                job_id: job_id.to_owned(),
                node_id: source.node_id,
            });
        }
        Ok(m)
    }

    /// NodeControllerMigrationPrepareTarget.
    pub fn migration_prepare_target(
        &mut self,
        migration_id: &str,
        target_node_id: &str,
        initial_state: &[u8],
        now_ms: i64,
    ) -> Result<(Migration, StartOutcome), CommandError> {
        validate::id("target_node_id", target_node_id)?;
        validate::json("initial_state", initial_state)?;
        let m = self.migration_mut(migration_id)?.clone();
        Self::expect_phase(&m, MigrationPhase::StateReceived)?;
        if target_node_id == m.source_node_id {
            return Err(CommandError::InvalidArgument(
                "the target node must differ from the source node".to_owned(),
            ));
        }
        let strategy = strategy_of(&m);
        if strategy == MigrationStrategy::StopThenStart {
            return self.prepare_reserved_target(&m, target_node_id, now_ms);
        }
        let outcome = self.start_instance(
            &m.job_id,
            target_node_id,
            JobRole::MigrationTarget as i32,
            migration_id,
            now_ms,
        )?;
        if outcome != StartOutcome::Accepted {
            return Ok((m, outcome));
        }
        let m = self.migration_mut(migration_id)?;
        m.phase = MigrationPhase::PreparingTarget as i32;
        m.target_node_id = target_node_id.to_owned();
        let job_id = m.job_id.clone();
        self.emit_migration(migration_id, now_ms);
        // A handover target is ready when it says so; an overlap target once it runs
        // (`step_migrations`).
        if strategy == MigrationStrategy::Handover {
            self.asks.push(JobAsk::InitialState {
                migration_id: migration_id.to_owned(),
                job_id,
                node_id: target_node_id.to_owned(),
                payload: initial_state.to_vec(),
            });
        }
        let m = self.migration_mut(migration_id)?.clone();
        Ok((m, outcome))
    }

    /// Stop-then-start's PrepareTarget: the worker's check without a start,
    /// and the job's capacity reserved on the target node.
    fn prepare_reserved_target(
        &mut self,
        m: &Migration,
        target_node_id: &str,
        now_ms: i64,
    ) -> Result<(Migration, StartOutcome), CommandError> {
        let target_role = JobRole::MigrationTarget as i32;
        self.check_job_and_node(&m.job_id, target_node_id)?;
        if self
            .instance(&m.job_id, target_role)
            .is_some_and(|i| holds(i.state))
        {
            return Err(CommandError::FailedPrecondition(format!(
                "job {} already has a live JOB_ROLE_MIGRATION_TARGET instance",
                m.job_id
            )));
        }
        if let Some((reason, message)) = self.worker_check(&m.job_id, target_node_id) {
            self.emit(
                now_ms,
                event::Kind::JobRejected(JobRejected {
                    job_id: m.job_id.clone(),
                    node_id: target_node_id.to_owned(),
                    role: target_role,
                    reason: reason as i32,
                    message: message.clone(),
                }),
            );
            return Ok((m.clone(), StartOutcome::Rejected { reason, message }));
        }
        self.reserve_target(&m.job_id, target_node_id);
        let rec = self.migration_mut(&m.migration_id)?;
        rec.phase = MigrationPhase::TargetReady as i32;
        rec.target_node_id = target_node_id.to_owned();
        self.emit_migration(&m.migration_id, now_ms);
        let rec = self.migration_mut(&m.migration_id)?.clone();
        Ok((rec, StartOutcome::Accepted))
    }

    /// NodeControllerMigrationCutover. Handover: `cutover-ready` to the
    /// source. Overlap: the running target is promoted and the source
    /// stopped at once. Stop-then-start: the source is stopped; its target
    /// starts once the source has stopped (see `step_migrations`).
    pub fn migration_cutover(
        &mut self,
        migration_id: &str,
        payload: &[u8],
        now_ms: i64,
    ) -> Result<Migration, CommandError> {
        validate::json("payload", payload)?;
        let m = self.migration_mut(migration_id)?;
        Self::expect_phase(m, MigrationPhase::TargetReady)?;
        let job_id = m.job_id.clone();
        match strategy_of(m) {
            MigrationStrategy::Overlap => {
                self.complete_migration(&job_id, migration_id, now_ms);
                return Ok(self.migration_mut(migration_id)?.clone());
            }
            MigrationStrategy::StopThenStart => {
                m.phase = MigrationPhase::CuttingOver as i32;
                self.emit_migration(migration_id, now_ms);
                self.stop_instance(
                    &job_id,
                    JobRole::Normal as i32,
                    StopReason::Migrated,
                    None,
                    now_ms,
                );
                self.step_migrations(&job_id, now_ms);
                return Ok(self.migration_mut(migration_id)?.clone());
            }
            _ => {}
        }
        m.phase = MigrationPhase::CuttingOver as i32;
        let ask = JobAsk::CutoverReady {
            migration_id: migration_id.to_owned(),
            job_id: m.job_id.clone(),
            node_id: m.source_node_id.clone(),
            payload: payload.to_vec(),
        };
        self.emit_migration(migration_id, now_ms);
        self.asks.push(ask);
        Ok(self.migration_mut(migration_id)?.clone())
    }

    /// NodeControllerMigrationAbort: idempotent on an aborted migration,
    /// refused on a completed one.
    pub fn migration_abort(
        &mut self,
        migration_id: &str,
        reason: &str,
        now_ms: i64,
    ) -> Result<Migration, CommandError> {
        validate::reason("reason", reason)?;
        let m = self.migration_mut(migration_id)?;
        if m.phase == MigrationPhase::Completed as i32 {
            return Err(CommandError::FailedPrecondition(format!(
                "migration {migration_id} already completed"
            )));
        }
        self.abort_migration(migration_id, MigrationParty::Controller, reason, now_ms);
        Ok(self.migration_mut(migration_id)?.clone())
    }

    /// A job's answer to an ask. Answers to migrations that moved on
    /// (aborted, or a different phase) are ignored.
    pub fn migration_reply(&mut self, ask: &JobAsk, reply: JobReply, now_ms: i64) {
        use crate::handshake::{Step, awaiting, step};
        let id = ask.migration_id().to_owned();
        let Some(m) = self.migrations.get_mut(&id) else {
            return;
        };
        if m.phase != awaiting(ask) as i32 {
            return;
        }
        match step(ask, reply) {
            Step::Abort(by, reason) => self.abort_migration(&id, by, &reason, now_ms),
            Step::StateReceived(payload) => {
                m.phase = MigrationPhase::StateReceived as i32;
                m.source_state = payload;
                self.emit_migration(&id, now_ms);
            }
            Step::TargetReady(payload) => {
                m.phase = MigrationPhase::TargetReady as i32;
                m.target_ready_payload = payload;
                self.emit_migration(&id, now_ms);
            }
            Step::SourceStopped(payload) => {
                m.source_stopped_payload.clone_from(&payload);
                let next = JobAsk::CutoverApply {
                    migration_id: id.clone(),
                    job_id: m.job_id.clone(),
                    node_id: m.target_node_id.clone(),
                    payload,
                };
                self.asks.push(next);
            }
            Step::Applied {
                applied,
                failed,
                skew_ms,
            } => {
                m.applied = applied;
                m.failed = failed;
                m.skew_ms = skew_ms;
                let job_id = m.job_id.clone();
                self.complete_migration(&job_id, &id, now_ms);
            }
        }
    }

    /// A job's own `abort` frame that arrived between asks (a source right
    /// after `state`, a target right after `target-ready`). Ignored when
    /// the migration is unknown or already over.
    pub fn migration_job_abort(
        &mut self,
        migration_id: &str,
        from_source: bool,
        reason: &str,
        now_ms: i64,
    ) {
        let by = if from_source {
            MigrationParty::Source
        } else {
            MigrationParty::Target
        };
        self.abort_migration(migration_id, by, &validate::excerpt(reason), now_ms);
    }

    /// The target becomes the job's normal instance, the source stops and
    /// the migration COMPLETES (every strategy).
    fn complete_migration(&mut self, job_id: &str, migration_id: &str, now_ms: i64) {
        if let Some(m) = self.migrations.get_mut(migration_id) {
            m.phase = MigrationPhase::Completed as i32;
        }
        let normal = JobRole::Normal as i32;
        let target = JobRole::MigrationTarget as i32;
        // Stop the source first (emits JobStopping with reason MIGRATED).
        if let Some(src) = self.instance(job_id, normal).cloned() {
            if holds(src.state) {
                self.emit(
                    now_ms,
                    event::Kind::JobStopping(JobStopping {
                        job_id: job_id.to_owned(),
                        node_id: src.node_id.clone(),
                        role: normal,
                        reason: StopReason::Migrated as i32,
                    }),
                );
            }
            if let Some(set) = self.holding.get_mut(&src.node_id) {
                set.remove(&(job_id.to_owned(), normal));
            }
        }
        if let Some(job) = self.jobs.get_mut(job_id) {
            job.instances.retain(|i| i.role != normal);
            if let Some(inst) = job.instances.iter_mut().find(|i| i.role == target) {
                inst.role = normal;
                inst.migration_id.clear();
                // A target that answered target-ready and target-applied is
                // evidently up, even if its start timer (keyed by the old
                // role, so it would no longer find it) has not fired yet.
                if inst.state == JobState::Starting as i32 {
                    inst.state = JobState::Running as i32;
                }
                let node_id = inst.node_id.clone();
                if let Some(set) = self.holding.get_mut(&node_id)
                    && let Some(reserved) = set.remove(&(job_id.to_owned(), target))
                {
                    set.insert((job_id.to_owned(), normal), reserved);
                }
            }
            Self::refresh_summary(job);
        }
        self.emit_job(job_id, now_ms);
        self.emit_migration(migration_id, now_ms);
    }

    /// What the world saw of a job: its instance starts with their roles,
    /// and its time without a RUNNING instance since it first ran.
    pub fn job_history(
        &self,
        job_id: &str,
        now_ms: i64,
    ) -> Result<JobHistoryResponse, CommandError> {
        validate::id("job_id", job_id)?;
        self.history
            .get(job_id)
            .map(|h| h.to_proto(now_ms))
            .ok_or_else(|| {
                CommandError::NotFound(format!(
                    "job {:?} (never started since the sim started)",
                    validate::excerpt(job_id)
                ))
            })
    }

    // ───────────────────────────── chaos ─────────────────────────────

    /// Chaos: the job's normal instance FAILS.
    pub fn fail_job(
        &mut self,
        job_id: &str,
        message: &str,
        now_ms: i64,
    ) -> Result<Job, CommandError> {
        validate::id("job_id", job_id)?;
        validate::reason("message", message)?;
        let normal = JobRole::Normal as i32;
        match self.instance(job_id, normal) {
            None if !self.jobs.contains_key(job_id) => {
                return Err(CommandError::NotFound(format!(
                    "job {:?}",
                    validate::excerpt(job_id)
                )));
            }
            Some(i) if holds(i.state) => {}
            _ => {
                return Err(CommandError::FailedPrecondition(format!(
                    "job {job_id} has no live instance"
                )));
            }
        }
        let msg = if message.is_empty() {
            "failure injected by fail-job"
        } else {
            message
        };
        self.set_instance_state(job_id, normal, JobState::Failed, None, msg);
        self.emit_job(job_id, now_ms);
        self.abort_migrations_touching(job_id, normal, now_ms);
        self.jobs
            .get(job_id)
            .cloned()
            .ok_or_else(|| CommandError::NotFound(format!("job {job_id:?}")))
    }

    /// Chaos: refuse the next `count` starts.
    pub fn reject_next(&mut self, count: u32) {
        self.reject_next = count;
    }

    /// Chaos: answer the next `count` CreateNode calls `UNAVAILABLE` (a cloud API that is down),
    /// before looking at them.
    pub fn unavailable_creates(&mut self, count: u32) {
        self.unavailable_creates = count;
    }

    /// Chaos: set every elastic pool's provisioning delay.
    pub fn slow_provision(&mut self, delay_ms: u64) -> Result<(), CommandError> {
        if delay_ms > 3_600_000 {
            return Err(CommandError::InvalidArgument(format!(
                "delay_ms must be at most 3600000 (one hour), got {delay_ms}"
            )));
        }
        for p in self.pools.values_mut() {
            if p.config.scale_out == crate::config::ScaleOutConfig::Elastic {
                p.provision_delay_ms = delay_ms;
            }
        }
        Ok(())
    }

    /// Chaos: a zone dies, the way a zone outage takes it: every node in it that is not yet
    /// TERMINATED (starting, started, stopped, powered off) is killed as by
    /// [`World::kill_node`], in this one step, and until the zone is revived a node that would
    /// come up there (a new node, a started one) is killed instead. `revive` ends the outage:
    /// nodes come up there again; the killed ones stay TERMINATED. Returns the killed node ids
    /// (none when reviving).
    pub fn kill_zone(
        &mut self,
        zone: &str,
        revive: bool,
        now_ms: i64,
    ) -> Result<Vec<String>, CommandError> {
        validate::id("zone", zone)?;
        if revive {
            self.dead_zones.remove(zone);
            return Ok(Vec::new());
        }
        self.dead_zones.insert(zone.to_owned());
        let ids: Vec<String> = self
            .nodes
            .values()
            .filter(|n| n.zone == zone && n.state != NodeState::Terminated as i32)
            .map(|n| n.node_id.clone())
            .collect();
        for id in &ids {
            self.kill_node(id, now_ms)?;
        }
        Ok(ids)
    }

    /// Whether `zone` is dead ([`World::kill_zone`]).
    pub fn zone_dead(&self, zone: &str) -> bool {
        self.dead_zones.contains(zone)
    }

    /// Chaos: partition (STARTED nodes → STOPPED, instances FAIL) or heal
    /// (STOPPED nodes of a partitioned zone → STARTED) a zone. Returns the
    /// affected node ids.
    pub fn partition_zone(
        &mut self,
        zone: &str,
        heal: bool,
        now_ms: i64,
    ) -> Result<Vec<String>, CommandError> {
        validate::id("zone", zone)?;
        let (from, to) = if heal {
            if !self.partitioned.remove(zone) {
                return Ok(Vec::new());
            }
            (NodeState::Stopped, NodeState::Started)
        } else {
            self.partitioned.insert(zone.to_owned());
            (NodeState::Started, NodeState::Stopped)
        };
        let ids: Vec<String> = self
            .nodes
            .values()
            .filter(|n| n.zone == zone && n.state == from as i32)
            .map(|n| n.node_id.clone())
            .collect();
        for id in &ids {
            if !heal {
                self.node_gone(id, StopReason::NodeLost, JobState::Failed, now_ms);
            }
            if let Some(n) = self.nodes.get_mut(id) {
                n.state = to as i32;
                n.state_changed_at_ms = now_ms;
                let n = n.clone();
                let kind = if heal {
                    event::Kind::NodeStarted(NodeStarted { node: Some(n) })
                } else {
                    event::Kind::NodeStopped(NodeStopped { node: Some(n) })
                };
                self.emit(now_ms, kind);
            }
        }
        Ok(ids)
    }
}

fn validate_requirements(job_name: &str, req: &JobRequirements) -> Result<(), CommandError> {
    validate::non_negative(
        &format!("job {job_name:?} required_capacity"),
        req.required_capacity,
    )?;
    if req.required_cores < 0 {
        return Err(CommandError::InvalidArgument(format!(
            "job {job_name:?} required_cores must be >= 0, got {}",
            req.required_cores
        )));
    }
    if req.required_capabilities.len() > validate::MAX_CAPABILITIES {
        return Err(CommandError::InvalidArgument(format!(
            "job {job_name:?} has {} required capabilities, at most {} allowed",
            req.required_capabilities.len(),
            validate::MAX_CAPABILITIES
        )));
    }
    for c in &req.required_capabilities {
        validate::id("required capability", c)?;
    }
    if !matches!(
        req.priority_band.as_str(),
        "" | "gold" | "silver" | "bronze"
    ) {
        return Err(CommandError::InvalidArgument(format!(
            "job {job_name:?} priority_band must be gold, silver or bronze, got {:?}",
            validate::excerpt(&req.priority_band)
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "world_tests.rs"]
mod tests;
