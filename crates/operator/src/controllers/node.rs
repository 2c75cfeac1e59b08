//! ManagerNodes: every Manager node mirrored into a `ManagerNode` object (status only), and the
//! user's `spec.cordoned` / `spec.drain` applied back.
//!
//! Two parts. [`run_mirror_sync`] is the only writer of ManagerNode status: it creates an object
//! for each node Manager reports, writes status when it changed (batched every
//! `statusWriteInterval`), and deletes objects of nodes gone or stopped for longer than
//! `removeStoppedNodesAfter`. [`reconcile`] watches the objects' spec: a cordon (or drain) keeps
//! placement off the node; `drain.mode: terminate` terminates it, and its jobs recover by band;
//! `drain.mode: migrate` moves every job off first (see [`super::drain`]).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{
    self as api, DrainMode, ManagerNode, ManagerNodeSpec, ManagerNodeStatus, NodeJob, NodeState,
};
use chrono::{DateTime, TimeZone, Utc};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use manager_client::MirrorState;
use manager_proto as proto;

use super::{Context, Error, condition};
use crate::mapping::{self, NodeOverlay};

/// Least time between two writes of a node's status that differ only in usage and jobs.
const USAGE_WRITE_INTERVAL: Duration = Duration::from_secs(2);

/// Whether two statuses differ at most in what changes with every job start or stop.
fn same_but_usage(a: &ManagerNodeStatus, b: &ManagerNodeStatus) -> bool {
    let strip = |s: &ManagerNodeStatus| ManagerNodeStatus {
        used_capacity: 0,
        used_cores: 0,
        jobs: Vec::new(),
        job_count: 0,
        drain: None,
        ..s.clone()
    };
    strip(a) == strip(b)
        && a.drain.as_ref().map(|d| d.completed_at) == b.drain.as_ref().map(|d| d.completed_at)
}

/// How often objects of nodes Manager no longer has are looked for.
const ORPHAN_SWEEP: Duration = Duration::from_secs(30);

/// A node's kstatus standing: starting or draining is progress, a node whose workers keep
/// refusing starts is stalled, a started node and one Manager stopped or terminated (nothing
/// more will happen to it) are ready, the reason saying which.
fn node_standing(status: &ManagerNodeStatus) -> (api::Standing, &'static str, String) {
    use api::Standing;
    if let Some(c) = api::find_condition(&status.conditions, "DisruptionBlocked")
        .filter(|c| c.is_true() && status.state == NodeState::Started)
    {
        // A drain asked for and held back by a disruption budget: on its way, not done.
        return (Standing::Reconciling, "Draining", c.message.clone());
    }
    if let Some(d) = status.drain.as_ref().filter(|d| d.completed_at.is_none()) {
        let msg = format!("draining: {} jobs remaining", d.jobs_remaining);
        return (Standing::Reconciling, "Draining", msg);
    }
    if status.state == NodeState::Started && status.drain.is_some() {
        // Drained, and Manager left it up: a physical node, its owner's.
        let msg = format!(
            "drained: none of our jobs is on it, and it {}",
            super::drain::LEFT_TO_OWNER
        );
        return (Standing::Ready, "Drained", msg);
    }
    let reported = format!("Manager reports the node {:?}", status.state).to_lowercase();
    match status.state {
        NodeState::Stopped => (Standing::Ready, "Stopped", reported),
        NodeState::Unreachable => (Standing::Ready, "Unreachable", reported),
        NodeState::Stopping => (Standing::Reconciling, "Stopping", reported),
        NodeState::Terminated => (Standing::Ready, "Terminated", reported),
        NodeState::Starting => (Standing::Reconciling, "Starting", reported),
        NodeState::Started if !status.healthy => match status.held_out_until {
            Some(until) if status.unhealthy_episodes > 1 => (
                Standing::Stalled,
                "FlappingHeldOut",
                format!(
                    "unhealthy {} times in a row ({} refused starts within the window now); a flapping node is kept out longer each time: placement avoids it until {}",
                    status.unhealthy_episodes,
                    status.recent_rejections,
                    until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
                ),
            ),
            _ => (
                Standing::Stalled,
                "RejectionRateTripped",
                format!(
                    "{} refused starts within the window; placement avoids the node",
                    status.recent_rejections
                ),
            ),
        },
        NodeState::Started => (Standing::Ready, "Started", reported),
    }
}

fn ms_to_time(ms: i64) -> Option<DateTime<Utc>> {
    (ms > 0)
        .then(|| Utc.timestamp_millis_opt(ms).single())
        .flatten()
}

fn node_state(n: &proto::Node) -> NodeState {
    match proto::NodeState::try_from(n.state) {
        Ok(proto::NodeState::Started) => NodeState::Started,
        Ok(proto::NodeState::Stopped) => NodeState::Unreachable,
        Ok(proto::NodeState::PoweringOff) => NodeState::Stopping,
        Ok(proto::NodeState::PoweredOff) => NodeState::Stopped,
        Ok(proto::NodeState::Terminated) => NodeState::Terminated,
        _ => NodeState::Starting,
    }
}

/// What one node holds: its jobs (sorted by job id, at most 512, the schema's bound), how many
/// there are, and the capacity and cores they use (all of them, past the bound too).
#[derive(Default, Clone)]
struct NodeLoad {
    jobs: Vec<NodeJob>,
    /// Every instance, past the bound too.
    count: usize,
    used: (f64, i32),
}

/// One node's load (its instances that hold capacity), from the mirror's node index.
fn load_of(mirror: &MirrorState, node_id: &str) -> NodeLoad {
    let mut load = NodeLoad::default();
    for j in mirror.jobs_on(node_id) {
        for i in j.instances.iter().filter(|i| i.node_id == node_id) {
            if !i.holds_capacity() {
                continue;
            }
            if let Some(r) = &j.requirements {
                load.used.0 += r.required_capacity;
                load.used.1 = load.used.1.saturating_add(r.required_cores);
            }
            load.jobs.push(NodeJob {
                job_id: j.job_id.clone(),
                bundle: mapping::bundle_object(&j.bundle_id)
                    .map(|(ns, name)| format!("{ns}/{name}")),
                replica: i32::try_from(j.replica).ok(),
                job_name: Some(j.job_name.clone()),
                role: if i.role == proto::JobRole::MigrationTarget as i32 {
                    "migrationTarget".into()
                } else {
                    String::new()
                },
                capacity: j
                    .requirements
                    .as_ref()
                    .map_or(0, |r| r.required_capacity.round() as i64),
            });
        }
    }
    load.count = load.jobs.len();
    load.jobs.sort_by(|a, b| a.job_id.cmp(&b.job_id));
    load.jobs.truncate(512);
    load
}

/// Each node's load as of the last pass, with the mirror's version of the node's jobs
/// ([`MirrorState::node_jobs_version`]): a pass derives again only the nodes whose jobs
/// changed. The loop runs every `statusWriteInterval`; deriving every node's list each time
/// cost a pass over the fleet's jobs four times a second.
#[derive(Default)]
struct LoadCache {
    epoch: String,
    loads: HashMap<String, (u64, NodeLoad)>,
}

impl LoadCache {
    fn load(&mut self, mirror: &MirrorState, node_id: &str) -> NodeLoad {
        if self.epoch != mirror.epoch {
            self.loads.clear();
            self.epoch.clone_from(&mirror.epoch);
        }
        let version = mirror.node_jobs_version(node_id);
        match self.loads.get(node_id) {
            Some((v, load)) if *v == version => load.clone(),
            _ => {
                let load = load_of(mirror, node_id);
                self.loads
                    .insert(node_id.to_owned(), (version, load.clone()));
                load
            }
        }
    }

    /// Forgets nodes the mirror no longer has.
    fn retain_nodes(&mut self, mirror: &MirrorState) {
        self.loads.retain(|id, _| mirror.nodes.contains_key(id));
    }
}

/// The status a node's object should carry, from the mirror and the operator's own view.
fn desired_status(
    n: &proto::Node,
    load: NodeLoad,
    overlay: NodeOverlay,
    rejections: u32,
    held: Option<api::Hold>,
    prev: Option<&ManagerNodeStatus>,
    now: DateTime<Utc>,
) -> ManagerNodeStatus {
    let state = node_state(n);
    let (spare, spare_band) = mapping::spare_of(n);
    let inv = n.inventory.as_ref();
    ManagerNodeStatus {
        observed_generation: None,
        node_id: n.node_id.clone(),
        provider: mapping::api_provider(n.provider),
        pool: n.pool.clone(),
        region: n.region.clone(),
        zone: inv
            .map(|i| i.zone.clone())
            .filter(|z| !z.is_empty())
            .unwrap_or_else(|| n.zone.clone()),
        instance_type: n.instance_type.clone(),
        state,
        total_capacity: inv.map_or(0, |i| i.capacity.round() as i64),
        used_capacity: load.used.0.round() as i64,
        total_cores: inv.map_or(0, |i| i.cores),
        used_cores: load.used.1,
        capabilities: inv.map(|i| i.capabilities.clone()).unwrap_or_default(),
        spare: spare && load.jobs.is_empty(),
        spare_band: if spare { spare_band } else { None },
        healthy: !overlay.unhealthy,
        recent_rejections: i32::try_from(rejections).unwrap_or(i32::MAX),
        // The flap back-off's figures are the health record's; the sync fills them in.
        unhealthy_episodes: 0,
        held_out_until: None,
        job_count: i32::try_from(load.count).unwrap_or(i32::MAX),
        jobs: load.jobs,
        drain: None,
        conditions: node_conditions(prev, overlay, rejections, held.as_ref(), now),
        held,
        stopped_at: matches!(state, NodeState::Unreachable | NodeState::Terminated)
            .then(|| ms_to_time(n.state_changed_at_ms))
            .flatten(),
        reclaim_at: ms_to_time(n.reclaim_at_ms),
        reclaim_reason: (!n.reclaim_reason.is_empty())
            .then(|| n.reclaim_reason.chars().take(128).collect()),
    }
}

/// `Cordoned`, `Unhealthy` and `DisruptionBlocked`, over the conditions the object carries.
/// Ready, Reconciling and Stalled are set once the drain is known ([`node_standing`]).
fn node_conditions(
    prev: Option<&ManagerNodeStatus>,
    overlay: NodeOverlay,
    rejections: u32,
    held: Option<&api::Hold>,
    now: DateTime<Utc>,
) -> Vec<api::Condition> {
    let mut conditions = prev.map(|p| p.conditions.clone()).unwrap_or_default();
    let cordoned = if overlay.cordoned {
        "Cordoned"
    } else {
        "Schedulable"
    };
    let c = condition("Cordoned", overlay.cordoned, cordoned, "", None, now);
    api::set_condition(&mut conditions, c);
    let (reason, message) = if overlay.unhealthy {
        let why =
            format!("{rejections} refused starts within the window; placement avoids the node");
        ("RejectionRateTripped", why)
    } else {
        ("Healthy", String::new())
    };
    let c = condition("Unhealthy", overlay.unhealthy, reason, message, None, now);
    api::set_condition(&mut conditions, c);
    super::disruption::set_held_condition(&mut conditions, held, None, now);
    conditions
}

/// Mirrors Manager's nodes into ManagerNode objects until the wake channel closes: one
/// [`MirrorSync::pass`] every `statusWriteInterval`, however often the mirror wakes it.
pub async fn run_mirror_sync(ctx: Arc<Context>, mut wake: tokio::sync::mpsc::Receiver<()>) {
    let mut sync = MirrorSync::start(ctx.clone()).await;
    let interval = ctx
        .settings
        .status_write_interval
        .max(Duration::from_millis(50));
    let mut last_pass = tokio::time::Instant::now();
    loop {
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            got = wake.recv() => if got.is_none() { return },
        }
        // A wave of mirror changes wakes this loop constantly: one pass per interval is enough.
        tokio::time::sleep_until(last_pass + interval).await;
        last_pass = tokio::time::Instant::now();
        sync.pass().await;
    }
}

/// The ManagerNode status sync: what it last wrote, and when.
pub struct MirrorSync {
    ctx: Arc<Context>,
    api: Api<ManagerNode>,
    /// The status each object carries, as this sync last wrote (or first listed) it.
    written: HashMap<String, ManagerNodeStatus>,
    written_at: HashMap<String, std::time::Instant>,
    last_sweep: std::time::Instant,
    loads: LoadCache,
}

impl MirrorSync {
    /// A sync that starts from the statuses the objects carry now ([`current_statuses`]).
    pub async fn start(ctx: Arc<Context>) -> MirrorSync {
        let api: Api<ManagerNode> = Api::all(ctx.client.clone());
        let written = current_statuses(&api).await;
        let last_sweep = ctx.clock.instant() - ORPHAN_SWEEP;
        MirrorSync {
            ctx,
            api,
            written,
            written_at: HashMap::new(),
            last_sweep,
            loads: LoadCache::default(),
        }
    }

    /// One pass: observe every node (keeping the health overlay current), then, with the
    /// cluster scope, write the statuses that changed and remove the objects of nodes gone or
    /// stopped long enough. Nothing while Manager is unreachable.
    pub async fn pass(&mut self) {
        if !self.ctx.manager_ready() {
            return;
        }
        let desired = self.observe();
        if !self.ctx.settings.scope.owns_cluster_scope() {
            return;
        }
        let keep: HashSet<String> = desired.iter().map(|(n, _)| n.clone()).collect();
        for (name, status) in &desired {
            self.write(name, status).await;
        }
        self.remove_stale(&keep).await;
        self.sweep_orphans(&keep).await;
    }

    /// Every node's desired status, by object name, in one pass over the mirror. Health
    /// verdicts expire: the overlay of nodes healthy again is cleared on the way. The model,
    /// drain and health locks are each held only for a node's own lookups, so placement is
    /// never held up behind this loop. Without the cluster scope only the overlay is kept.
    fn observe(&mut self) -> Vec<(String, ManagerNodeStatus)> {
        let ctx = &self.ctx;
        let now = ctx.clock.now();
        let unhealthy_now = ctx.state.unhealthy_nodes(now);
        let owns = ctx.settings.scope.owns_cluster_scope();
        let (loads, written) = (&mut self.loads, &self.written);
        ctx.manager.mirror().read(|m| {
            if owns {
                loads.retain_nodes(m);
            }
            let mut desired = Vec::with_capacity(m.nodes.len());
            for n in m.nodes.values() {
                let overlay = set_health(ctx, m, &n.node_id, unhealthy_now.contains(&n.node_id));
                if !owns || removable(ctx, n, now) {
                    continue;
                }
                let name = mapping::node_object_name(&n.node_id);
                let load = loads.load(m, &n.node_id);
                let status = node_status(ctx, n, load, overlay, written.get(&name), now);
                desired.push((name, status));
            }
            desired
        })
    }

    /// Writes `status` of the object `name` when it differs from what was written (usage and
    /// job lists at most every [`USAGE_WRITE_INTERVAL`]), creating the object first when there
    /// is none, with a lifecycle Event when the node's state changed.
    async fn write(&mut self, name: &str, status: &ManagerNodeStatus) {
        let ctx = &self.ctx;
        let last = self.written.get(name);
        if last == Some(status) {
            return;
        }
        // Usage and job lists change with every start during a wave: those are written at
        // most every USAGE_WRITE_INTERVAL per node; anything else (state, conditions, spare,
        // health, drain) at once.
        let usage_only = last.is_some_and(|l| same_but_usage(l, status));
        let recent = self.written_at.get(name).is_some_and(|t| {
            ctx.clock.instant().saturating_duration_since(*t) < USAGE_WRITE_INTERVAL
        });
        if usage_only && recent {
            return;
        }
        if last.is_none() {
            let obj = ManagerNode::new(name, ManagerNodeSpec::default());
            match self.api.create(&PostParams::default(), &obj).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => {
                    tracing::warn!(node = %name, error = %e, "could not create ManagerNode");
                    return;
                }
            }
        }
        let state_changed = last.is_none_or(|l| l.state != status.state);
        match super::apply_status(&self.api, name, status).await {
            Ok(_) => {
                if state_changed {
                    lifecycle_event(ctx, name, status).await;
                }
                self.written.insert(name.to_owned(), status.clone());
                self.written_at.insert(name.to_owned(), ctx.clock.instant());
            }
            Err(e) => {
                tracing::warn!(node = %name, error = %e, "could not write ManagerNode status")
            }
        }
    }

    /// Deletes the objects written for nodes that are gone or stopped long enough.
    async fn remove_stale(&mut self, keep: &HashSet<String>) {
        let stale: Vec<String> = self
            .written
            .keys()
            .filter(|n| !keep.contains(*n))
            .cloned()
            .collect();
        for name in stale {
            delete(&self.api, &name).await;
            self.written.remove(&name);
        }
    }

    /// Every [`ORPHAN_SWEEP`]: deletes objects of nodes Manager no longer has (written before
    /// this sync started, or by another), and forgets objects deleted by hand so they are
    /// recreated: the mirror is the truth, and the object is where a person cordons or drains
    /// the node.
    async fn sweep_orphans(&mut self, keep: &HashSet<String>) {
        let now = self.ctx.clock.instant();
        if now.saturating_duration_since(self.last_sweep) < ORPHAN_SWEEP {
            return;
        }
        self.last_sweep = now;
        let Ok(list) = self.api.list(&ListParams::default()).await else {
            return;
        };
        let existing: HashSet<String> = list.items.iter().map(|o| o.name_any()).collect();
        for name in existing.iter().filter(|n| !keep.contains(*n)) {
            delete(&self.api, name).await;
            self.written.remove(name);
        }
        self.written.retain(|name, _| existing.contains(name));
    }
}

/// Keeps the node's health overlay in the placement model at `unhealthy`; answers the overlay.
fn set_health(ctx: &Context, m: &MirrorState, node_id: &str, unhealthy: bool) -> NodeOverlay {
    ctx.state.set_health(m, node_id, unhealthy)
}

/// Whether the node has been stopped or terminated for longer than `removeStoppedNodesAfter`:
/// its object is removed, and not recreated.
fn removable(ctx: &Context, n: &proto::Node, now: DateTime<Utc>) -> bool {
    let gone_for = matches!(
        node_state(n),
        NodeState::Unreachable | NodeState::Terminated
    )
    .then(|| now.timestamp_millis().saturating_sub(n.state_changed_at_ms))
    .unwrap_or(0);
    let after = ctx.settings.remove_stopped_nodes_after.as_millis();
    gone_for > i64::try_from(after).unwrap_or(i64::MAX)
}

/// A node's whole status: [`desired_status`] with the health record's flap figures, the
/// drain's progress, the generation the user's spec was applied at and the standing.
fn node_status(
    ctx: &Context,
    n: &proto::Node,
    load: NodeLoad,
    overlay: NodeOverlay,
    prev: Option<&ManagerNodeStatus>,
    now: DateTime<Utc>,
) -> ManagerNodeStatus {
    let id = &n.node_id;
    let record = ctx.state.node_record(id);
    let held = record.drain_held;
    let mut status = desired_status(n, load, overlay, record.rejections, held, prev, now);
    if let Some(e) = record.episodes {
        status.unhealthy_episodes = i32::try_from(e.count).unwrap_or(i32::MAX);
        status.held_out_until = (e.held_until > now).then_some(e.held_until);
    }
    let gone = matches!(status.state, NodeState::Unreachable | NodeState::Terminated);
    status.drain = (ctx.state).drain_status(id, status.jobs.len(), gone, now);
    let generation = ctx.state.node_generation(id);
    status.observed_generation = generation;
    api::kstatus::observe_generation(&mut status.conditions, generation);
    let (standing, reason, message) = node_standing(&status);
    api::set_standing(
        &mut status.conditions,
        standing,
        reason,
        message,
        generation,
        now,
    );
    status
}

/// The status every ManagerNode carries now, by object name. The sync starts from it, so an
/// operator that restarts (or a new leader) writes only what differs from what is there, and
/// repeats no lifecycle Event: with nothing changed, nothing is written. Without the list (the
/// apiserver did not answer) every node is written once, as on a first start.
async fn current_statuses(api: &Api<ManagerNode>) -> HashMap<String, ManagerNodeStatus> {
    match api.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .filter_map(|o| Some((o.name_any(), o.status?)))
            .collect(),
        Err(e) => {
            tracing::warn!(error = %e, "could not list ManagerNodes; writing every node's status once");
            HashMap::new()
        }
    }
}

/// An Event on the ManagerNode when Manager's node changes state (the TypeScript library's
/// `onNodeStarting / onNodeStarted / onNodeStopped / onNodeTerminated`).
async fn lifecycle_event(ctx: &Context, name: &str, status: &ManagerNodeStatus) {
    let (reason, type_) = match status.state {
        NodeState::Starting => ("NodeStarting", EventType::Normal),
        NodeState::Started => ("NodeStarted", EventType::Normal),
        NodeState::Stopping => ("NodeStopping", EventType::Normal),
        NodeState::Stopped => ("NodeStopped", EventType::Normal),
        NodeState::Unreachable => ("NodeUnreachable", EventType::Warning),
        NodeState::Terminated => ("NodeTerminated", EventType::Normal),
    };
    let mut obj = ManagerNode::new(name, ManagerNodeSpec::default());
    obj.metadata.uid = None;
    ctx.event(
        &obj,
        type_,
        reason,
        "Mirror",
        format!(
            "Manager reports node {} {}",
            status.node_id,
            reason.trim_start_matches("Node").to_lowercase()
        ),
    )
    .await;
}

/// A worker refused a start on `node_id`: counted toward the node's health, and a node whose
/// rejection rate trips the threshold is marked unhealthy (placement avoids it), with a
/// `NodeUnhealthy` Event on its ManagerNode (the library's `onNodeUnhealthy`).
pub async fn record_rejection(ctx: &Context, node_id: &str) {
    let now = ctx.clock.now();
    let became_unhealthy =
        (ctx.manager.mirror()).read(|m| ctx.state.record_rejection(m, node_id, now));
    if !became_unhealthy {
        return;
    }
    tracing::warn!(node = %node_id, "node marked unhealthy: too many rejected starts");
    let name = mapping::node_object_name(node_id);
    let obj = ManagerNode::new(&name, ManagerNodeSpec::default());
    ctx.event(
        &obj,
        EventType::Warning,
        "NodeUnhealthy",
        "Health",
        format!(
            "node {node_id} refused {} starts within {}s: placements avoid it until the window passes quietly",
            ctx.settings.rejection_threshold,
            ctx.settings.rejection_window.as_secs()
        ),
    )
    .await;
}

async fn delete(api: &Api<ManagerNode>, name: &str) {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {
            tracing::info!(node = %name, "removed ManagerNode of a node Manager no longer runs")
        }
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => tracing::warn!(node = %name, error = %e, "could not delete ManagerNode"),
    }
}

/// How often a drain the disruption budget holds up looks again.
const BLOCKED_POLL: Duration = Duration::from_secs(1);

/// Applies a ManagerNode's spec: cordon, drain.
pub async fn reconcile(node: Arc<ManagerNode>, ctx: Arc<Context>) -> Result<Action, Error> {
    let result = super::timed("managernode", &ctx, apply(&node, &ctx)).await;
    if result.is_ok() {
        super::pass_succeeded(&ctx, node.as_ref());
    }
    result
}

/// One pass over a ManagerNode's spec: the cordon goes into the placement model, then a drain
/// (if asked for) takes its next step.
async fn apply(node: &ManagerNode, ctx: &Arc<Context>) -> Result<Action, Error> {
    let node_id = node
        .status
        .as_ref()
        .map(|s| s.node_id.clone())
        .filter(|id| !id.is_empty())
        .unwrap_or_else(|| node.name_any());
    let cordoned = node.spec.cordoned || node.spec.drain.is_some();
    let generation = node.metadata.generation;
    let was =
        (ctx.manager.mirror()).read(|m| ctx.state.apply_cordon(m, &node_id, cordoned, generation));
    if !ctx.settings.scope.owns_cluster_scope() {
        // The cordon is in the model for placement; its Events and drains are the owner's.
        return Ok(Action::await_change());
    }
    if was.cordoned != cordoned {
        cordon_changed(ctx, node, &node_id, cordoned).await;
    }
    let Some(drain) = node.spec.drain else {
        super::drain::unheld(ctx, &node_id);
        ctx.state.drain_withdrawn(&node_id);
        return Ok(Action::await_change());
    };
    if drain.mode == DrainMode::Migrate {
        return super::drain::step(node, &node_id, ctx).await;
    }
    terminate_drain(node, &node_id, drain.when_held(), ctx).await
}

/// The cordon changed: an Event, and the node's pool is woken (capacity came or went).
async fn cordon_changed(ctx: &Context, node: &ManagerNode, node_id: &str, cordoned: bool) {
    let (reason, what) = if cordoned {
        ("Cordoned", "no new placements")
    } else {
        ("Uncordoned", "placements allowed again")
    };
    let note = format!("node {node_id}: {what}");
    ctx.event(node, EventType::Normal, reason, "Cordon", note)
        .await;
    if let Some(pool) = ctx.manager.mirror().node(node_id).map(|n| n.pool) {
        ctx.wake_pool(&pool);
    }
}

/// `drain: {mode: terminate}`: once the disruption budget of every bundle with a job on the
/// node allows it (it is a voluntary disruption too), the node is terminated and its jobs
/// recover by band. Held past `disruption.holdWarnAfter` with `whenHeld: Proceed`, it is
/// terminated anyway, as the TypeScript library's `drainNode` would.
async fn terminate_drain(
    node: &ManagerNode,
    node_id: &str,
    when_held: api::WhenHeld,
    ctx: &Arc<Context>,
) -> Result<Action, Error> {
    if ctx.state.is_draining(node_id) {
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    if !ctx.manager_ready() {
        return Err(ctx.manager_unavailable());
    }
    // A terminate drain is a voluntary disruption too: it waits for the budget of every
    // bundle with a job on the node, and for a window that allows drains.
    let reason = automanager_policy::vocab::VoluntaryReason::Drain;
    match super::disruption::node_terminate_hold(ctx, node_id, reason).await? {
        Ok(()) => super::drain::unheld(ctx, node_id),
        Err(hold) => {
            if !super::drain::held_terminate(ctx, node, node_id, *hold, when_held).await {
                return Ok(Action::requeue(BLOCKED_POLL));
            }
        }
    }
    // Another client's job on the node is not ours to stop: the node waits for it, whatever
    // `whenHeld` says.
    let foreign = super::drain::foreign_jobs_on(ctx, node_id);
    if !foreign.is_empty() {
        super::drain::waits_for_others(ctx, node, node_id, &foreign).await;
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let jobs = node.status.as_ref().map_or(0, |s| s.jobs.len());
    ctx.state.begin_drain(node_id, jobs, ctx.clock.now());
    let gone = ctx.manager.mirror().node(node_id).is_none_or(|n| {
        matches!(
            node_state(&n),
            NodeState::Terminated | NodeState::Unreachable
        )
    });
    let left = if gone {
        false
    } else {
        let answered = ctx.manager.terminate_node(node_id).await?;
        super::drain::left_up(ctx, node_id, &answered)
    };
    let note = if left {
        format!(
            "node {node_id} cordoned; its {jobs} jobs were stopped and recover by band; it {}",
            super::drain::LEFT_TO_OWNER
        )
    } else {
        format!("node {node_id} cordoned and terminated; its {jobs} jobs recover by band")
    };
    ctx.event(node, EventType::Normal, "Draining", "Drain", note)
        .await;
    Ok(Action::requeue(Duration::from_secs(10)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use automanager_api::DrainStatus;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_772_366_400, 0).unwrap_or_default()
    }

    fn job(
        id: &str,
        bundle: &str,
        instances: &[(&str, proto::JobState, proto::JobRole)],
    ) -> proto::Job {
        proto::Job {
            job_id: id.into(),
            bundle_id: bundle.into(),
            job_name: "enc".into(),
            requirements: Some(proto::JobRequirements {
                required_capacity: 10.4,
                ..Default::default()
            }),
            instances: instances
                .iter()
                .map(|(node, state, role)| proto::JobInstance {
                    node_id: (*node).into(),
                    state: *state as i32,
                    role: *role as i32,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_node_stands_by_its_state_health_and_drain() {
        use api::Standing as S;
        let node = |state, healthy, drain: Option<DrainStatus>| ManagerNodeStatus {
            state,
            healthy,
            drain,
            ..Default::default()
        };
        let draining = DrainStatus {
            jobs_remaining: 2,
            ..Default::default()
        };
        let drained = DrainStatus {
            completed_at: Some(t0()),
            ..Default::default()
        };
        for (status, want, reason) in [
            (node(NodeState::Started, true, None), S::Ready, "Started"),
            (
                node(NodeState::Starting, true, None),
                S::Reconciling,
                "Starting",
            ),
            (
                node(NodeState::Started, false, None),
                S::Stalled,
                "RejectionRateTripped",
            ),
            (
                ManagerNodeStatus {
                    unhealthy_episodes: 3,
                    held_out_until: Some(t0()),
                    ..node(NodeState::Started, false, None)
                },
                S::Stalled,
                "FlappingHeldOut",
            ),
            (
                node(NodeState::Started, false, Some(draining.clone())),
                S::Reconciling,
                "Draining",
            ),
            (
                node(NodeState::Terminated, true, Some(drained.clone())),
                S::Ready,
                "Terminated",
            ),
            (
                node(NodeState::Started, true, Some(drained)),
                S::Ready,
                "Drained",
            ),
            (node(NodeState::Stopped, true, None), S::Ready, "Stopped"),
            (
                node(NodeState::Stopping, true, None),
                S::Reconciling,
                "Stopping",
            ),
            (
                node(NodeState::Unreachable, true, None),
                S::Ready,
                "Unreachable",
            ),
            (
                ManagerNodeStatus {
                    conditions: vec![condition(
                        "DisruptionBlocked",
                        true,
                        "DisruptionBudget",
                        "waiting for Bundle a/b",
                        None,
                        t0(),
                    )],
                    ..node(NodeState::Started, true, None)
                },
                S::Reconciling,
                "Draining",
            ),
        ] {
            let (standing, r, _) = node_standing(&status);
            assert_eq!((standing, r), (want, reason), "{status:?}");
        }
    }

    #[test]
    fn jobs_and_usage_are_counted_on_the_nodes_their_holding_instances_run_on() {
        use proto::{JobRole as R, JobState as S};
        let mut m = MirrorState::default();
        for j in [
            job("ns.b/1/enc", "ns.b", &[("n1", S::Running, R::Normal)]),
            job(
                "ns.b/0/enc",
                "ns.b",
                &[
                    ("n1", S::Running, R::Normal),
                    ("n2", S::Starting, R::MigrationTarget),
                ],
            ),
            job("ns.c/0/enc", "ns.c", &[("n2", S::Stopped, R::Normal)]),
        ] {
            m.insert_job(j);
        }
        let mut cache = LoadCache::default();
        let ids =
            |l: &NodeLoad| -> Vec<String> { l.jobs.iter().map(|j| j.job_id.clone()).collect() };
        let (n1, n2) = (cache.load(&m, "n1"), cache.load(&m, "n2"));
        assert_eq!(ids(&n1), ["ns.b/0/enc", "ns.b/1/enc"]);
        assert_eq!(
            ids(&n2),
            ["ns.b/0/enc"],
            "the stopped instance holds nothing"
        );
        assert!((n1.used.0 - 20.8).abs() < 1e-9);
        assert!((n2.used.0 - 10.4).abs() < 1e-9);
        let target = &n2.jobs[0];
        assert_eq!(target.role, "migrationTarget");
        assert_eq!(target.bundle.as_deref(), Some("ns/b"));
        assert_eq!(target.capacity, 10);

        // A job starting on n2 is seen on the next read; n1's jobs did not change.
        m.insert_job(job("ns.d/0/enc", "ns.d", &[("n2", S::Running, R::Normal)]));
        assert_eq!(ids(&cache.load(&m, "n2")), ["ns.b/0/enc", "ns.d/0/enc"]);
        assert_eq!(ids(&cache.load(&m, "n1")), ["ns.b/0/enc", "ns.b/1/enc"]);
        // The migration ends: the source on n1 is gone, the target on n2 is the job now.
        m.insert_job(job("ns.b/0/enc", "ns.b", &[("n2", S::Running, R::Normal)]));
        assert_eq!(ids(&cache.load(&m, "n1")), ["ns.b/1/enc"]);
        assert_eq!(cache.load(&m, "n2").jobs[0].role, "");
        m.remove_job("ns.b/1/enc");
        assert_eq!(cache.load(&m, "n1").count, 0);
    }
}
