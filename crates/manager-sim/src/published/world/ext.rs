//! Our extension (`automanager.manager.extension.v1`) in the published world: warm nodes, reclaim
//! notices and the migration handshake, with the events its `Watch` sends. What the published
//! stream can say of these it says as a real Manager would: a warm stop is the provider
//! stopping the node (`NodeStopping{PROVIDER_STOP}`, then `NodeStopped`), a warm start is a node
//! starting, and a completed migration is the source stopped by request with the target going
//! on under the source's role.

pub(super) use manager_proto::extension::PowerState;
use manager_proto::extension::watch_event::Event as Ext;
use manager_proto::extension::{
    Migration, MigrationAbortRequest, MigrationCutoverRequest, MigrationGetStateRequest,
    MigrationPrepareTargetRequest, MigrationResponse, NodePower, ReclaimNotice, SnapshotComplete,
    TargetRejection, WatchEvent,
};
use manager_proto::{MigrationParty, MigrationPhase, MigrationStrategy};

use super::chaos::REFUSAL;
use super::{
    CommandError, Event, HistoryEntry, JobHistoryJobRunning, JobHistoryJobStopped, JobId,
    JobUpdated, NodeMetadata, NodeStarting, NodeStopped, NodeStopping, PublishedWorld, checked_id,
    entry, ev, node_id, ts, with_history,
};
use crate::handshake::{self, Step};
use crate::validate;
use crate::world::{JobAsk, JobReply};

/// `NodeStopping.Reason` for a node its provider stopped (`PROVIDER_STOP`): what the published
/// stream says of a warm stop.
const STOPPING_PROVIDER_STOP: i32 = 6;
/// `JobHistoryJobStopping.Reason` for a stop by request.
const JOB_STOPPING_REQUESTED: i32 = 2;
/// The longest a reclaim notice may give a node.
const MAX_NOTICE_MS: u64 = 86_400_000;

/// A node's place in a warm stop and start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(in crate::published) enum Power {
    /// Not warm: running or starting as the published stream says.
    On,
    /// StopNode accepted; off at `off_at_ms`.
    PoweringOff { off_at_ms: i64 },
    /// Off and kept.
    Off,
    /// StartNode accepted; the published stream reports it starting.
    Waking,
}

/// The extension's own records, and what its Watch has to send.
#[derive(Debug, Clone, Default)]
pub(in crate::published) struct ExtState {
    migrations: std::collections::BTreeMap<String, Migration>,
    events: Vec<WatchEvent>,
    asks: Vec<JobAsk>,
}

fn we(event: Ext) -> WatchEvent {
    WatchEvent { event: Some(event) }
}

fn job_of(m: &Migration) -> &str {
    m.job_id.as_ref().map_or("", |j| j.job_id.as_str())
}

fn node_of(id: Option<&manager_proto::api::common::NodeId>) -> &str {
    id.map_or("", |n| n.node_id.as_str())
}

impl ExtState {
    pub(super) fn power(&mut self, id: &str, meta: &NodeMetadata, state: PowerState, now_ms: i64) {
        self.events.push(we(Ext::NodePower(NodePower {
            node_id: node_id(id),
            state: state as i32,
            metadata: Some(meta.clone()),
            since: ts(now_ms),
        })));
    }
}

impl PublishedWorld {
    /// The events our extension's Watch has to send, in order.
    pub fn take_ext_events(&mut self) -> Vec<WatchEvent> {
        std::mem::take(&mut self.ext.events)
    }

    /// What the migration handshake asks jobs, in order (answered with
    /// [`PublishedWorld::migration_reply`]).
    pub fn take_asks(&mut self) -> Vec<JobAsk> {
        std::mem::take(&mut self.ext.asks)
    }

    /// What a new extension Watch is sent first: every warm node, every reclaim notice, every
    /// migration, then `SnapshotComplete`.
    pub fn ext_snapshot(&self) -> Vec<WatchEvent> {
        let mut out = Vec::new();
        for (id, n) in &self.nodes {
            let state = match n.power {
                Power::On => None,
                Power::PoweringOff { .. } => Some(PowerState::PoweringOff),
                Power::Off => Some(PowerState::PoweredOff),
                Power::Waking => Some(PowerState::Starting),
            };
            if let Some(state) = state {
                out.push(we(Ext::NodePower(NodePower {
                    node_id: node_id(id),
                    state: state as i32,
                    metadata: Some(n.meta.clone()),
                    since: None,
                })));
            }
            if let Some((at, reason)) = &n.notice {
                out.push(we(Ext::ReclaimNotice(ReclaimNotice {
                    node_id: node_id(id),
                    deadline: ts(*at),
                    reason: reason.clone(),
                })));
            }
        }
        out.extend(
            self.ext
                .migrations
                .values()
                .cloned()
                .map(Ext::Migration)
                .map(we),
        );
        out.push(we(Ext::SnapshotComplete(SnapshotComplete {})));
        out
    }

    /// Powering-off nodes whose time has come are off; nodes whose notice ran out are lost.
    pub(super) fn advance_ext(&mut self, now_ms: i64) {
        let mut reclaimed = Vec::new();
        for (id, node) in &mut self.nodes {
            if let Power::PoweringOff { off_at_ms } = node.power
                && off_at_ms <= now_ms
            {
                node.power = Power::Off;
                node.running = None;
                self.events.push(ev(Event::NodeStopped(NodeStopped {
                    node_id: node_id(id),
                })));
                self.ext
                    .power(id, &node.meta, PowerState::PoweredOff, now_ms);
            }
            if node.notice.as_ref().is_some_and(|(at, _)| *at <= now_ms) {
                reclaimed.push(id.clone());
            }
        }
        for id in reclaimed {
            // The provider took it back: lost as a killed node is.
            let _ = self.kill_node(&id, now_ms);
        }
    }

    /// A warm node goes for good (terminated or lost while off).
    pub(super) fn forget_warm(&mut self, id: &str, now_ms: i64) {
        if let Some(node) = self.nodes.remove(id) {
            if matches!(node.power, Power::PoweringOff { .. }) {
                self.events.push(ev(Event::NodeStopped(NodeStopped {
                    node_id: node_id(id),
                })));
            }
            self.ext
                .power(id, &node.meta, PowerState::Terminated, now_ms);
        }
    }

    /// Our StopNode: a running node that hosts nothing powers off and is kept.
    pub fn stop_node_warm(&mut self, id: &str, now_ms: i64) -> Result<NodePower, CommandError> {
        checked_id("node_id", id)?;
        let Some(node) = self.nodes.get(id) else {
            return Err(CommandError::NotFound(format!(
                "node {:?}",
                validate::excerpt(id)
            )));
        };
        if node.physical {
            return Err(CommandError::FailedPrecondition(format!(
                "node {id} is a physical node: its power is not Manager's"
            )));
        }
        match node.power {
            Power::PoweringOff { .. } | Power::Off => return Ok(self.power_of(id)),
            Power::Waking => {
                return Err(CommandError::FailedPrecondition(format!(
                    "node {id} is starting"
                )));
            }
            Power::On => {}
        }
        if node.ready_at_ms.is_some() {
            return Err(CommandError::FailedPrecondition(format!(
                "node {id} is still starting"
            )));
        }
        let hosted = self.instances_on(id);
        if !hosted.is_empty() {
            return Err(CommandError::FailedPrecondition(format!(
                "node {id} hosts {} instance(s): only an empty node is kept warm",
                hosted.len()
            )));
        }
        let delay = i64::try_from(node.stop_delay_ms).unwrap_or(i64::MAX);
        let meta = node.meta.clone();
        if let Some(n) = self.nodes.get_mut(id) {
            n.power = Power::PoweringOff {
                off_at_ms: now_ms.saturating_add(delay),
            };
            n.notice = None;
        }
        self.events.push(ev(Event::NodeStopping(NodeStopping {
            node_id: node_id(id),
            reason: STOPPING_PROVIDER_STOP,
        })));
        self.ext.power(id, &meta, PowerState::PoweringOff, now_ms);
        self.advance_ext(now_ms);
        Ok(self.power_of(id))
    }

    /// Our StartNode: a powered-off node starts again under its id.
    pub fn start_node_warm(&mut self, id: &str, now_ms: i64) -> Result<NodePower, CommandError> {
        checked_id("node_id", id)?;
        let Some(node) = self.nodes.get_mut(id) else {
            return Err(CommandError::NotFound(format!(
                "node {:?}",
                validate::excerpt(id)
            )));
        };
        match node.power {
            Power::On | Power::Waking => return Ok(self.power_of(id)),
            Power::PoweringOff { .. } => {
                return Err(CommandError::FailedPrecondition(format!(
                    "node {id} is still powering off"
                )));
            }
            Power::Off => {}
        }
        node.power = Power::Waking;
        node.ready_at_ms =
            Some(now_ms.saturating_add(i64::try_from(node.start_delay_ms).unwrap_or(i64::MAX)));
        let meta = node.meta.clone();
        self.events.push(ev(Event::NodeStarting(NodeStarting {
            node_metadata: Some(meta.clone()),
        })));
        self.ext.power(id, &meta, PowerState::Starting, now_ms);
        self.advance(now_ms);
        Ok(self.power_of(id))
    }

    fn power_of(&self, id: &str) -> NodePower {
        let node = self.nodes.get(id);
        let state = match node.map(|n| n.power) {
            None => PowerState::Terminated,
            Some(Power::PoweringOff { .. }) => PowerState::PoweringOff,
            Some(Power::Off) => PowerState::PoweredOff,
            Some(Power::Waking) => PowerState::Starting,
            Some(Power::On) => PowerState::Running,
        };
        NodePower {
            node_id: node_id(id),
            state: state as i32,
            metadata: node.map(|n| n.meta.clone()),
            since: None,
        }
    }

    /// SimAdmin's NoticeNode: the provider will take node `id` back in `in_ms`.
    pub fn notice_node(
        &mut self,
        id: &str,
        in_ms: u64,
        reason: &str,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        checked_id("node_id", id)?;
        validate::reason("reason", reason)?;
        if in_ms > MAX_NOTICE_MS {
            return Err(CommandError::InvalidArgument(format!(
                "in_ms must be at most a day ({MAX_NOTICE_MS})"
            )));
        }
        let Some(node) = self.nodes.get_mut(id) else {
            return Err(CommandError::NotFound(format!(
                "node {:?}",
                validate::excerpt(id)
            )));
        };
        if node.power != Power::On {
            return Err(CommandError::FailedPrecondition(format!(
                "node {id} is powered off: nothing runs there to reclaim"
            )));
        }
        let at = now_ms.saturating_add(i64::try_from(in_ms).unwrap_or(i64::MAX));
        let reason = if reason.is_empty() {
            "spot-interruption".to_owned()
        } else {
            reason.to_owned()
        };
        node.notice = Some((at, reason.clone()));
        self.ext.events.push(we(Ext::ReclaimNotice(ReclaimNotice {
            node_id: node_id(id),
            deadline: ts(at),
            reason,
        })));
        self.advance_ext(now_ms);
        Ok(())
    }

    fn emit_migration(&mut self, id: &str, now_ms: i64) {
        if let Some(m) = self.ext.migrations.get_mut(id) {
            m.updated_at = ts(now_ms);
            let m = m.clone();
            self.ext.events.push(we(Ext::Migration(m)));
        }
    }

    /// A migration's record as a MigrationResponse (`NOT_FOUND`-free: an unknown id answers an
    /// empty record, which only a caller that never asked for it could see).
    pub fn ext_migration(&self, id: &str) -> MigrationResponse {
        MigrationResponse {
            migration: self.ext.migrations.get(id).cloned(),
            ..Default::default()
        }
    }

    fn migration(&self, id: &str) -> Result<&Migration, CommandError> {
        self.ext
            .migrations
            .get(id)
            .ok_or_else(|| CommandError::NotFound(format!("migration {:?}", validate::excerpt(id))))
    }

    fn set_phase(&mut self, id: &str, phase: MigrationPhase, now_ms: i64) {
        if let Some(m) = self.ext.migrations.get_mut(id) {
            m.phase = phase as i32;
        }
        self.emit_migration(id, now_ms);
    }

    /// Our MigrationGetState: the propose.
    pub fn ext_migration_get_state(
        &mut self,
        req: &MigrationGetStateRequest,
        now_ms: i64,
    ) -> Result<MigrationResponse, CommandError> {
        let id = req.migration_id.as_str();
        validate::name("migration_id", id, validate::MAX_ID_BYTES)?;
        let job = req.job_id.as_ref().map_or("", |j| j.job_id.as_str());
        checked_id("job_id", job)?;
        checked_id("source_role", &req.source_role)?;
        let strategy = handshake::strategy(req.strategy)?;
        if self.ext.migrations.contains_key(id) {
            return Err(CommandError::AlreadyExists(format!("migration {id}")));
        }
        let Some(stored) = self.jobs.get(job) else {
            return Err(CommandError::NotFound(format!(
                "job {:?}",
                validate::excerpt(job)
            )));
        };
        let Some(source) = stored.instances.get(&req.source_role).cloned() else {
            return Err(CommandError::FailedPrecondition(format!(
                "job {job} runs nothing under role {:?}",
                validate::excerpt(&req.source_role)
            )));
        };
        if let Some(other) = self
            .ext
            .migrations
            .values()
            .find(|m| job_of(m) == job && !handshake::is_final(m.phase))
        {
            return Err(CommandError::FailedPrecondition(format!(
                "job {job} is already being migrated by {}",
                other.migration_id
            )));
        }
        let m = Migration {
            migration_id: id.to_owned(),
            job_id: Some(JobId {
                job_id: job.to_owned(),
            }),
            source_role: req.source_role.clone(),
            source_node_id: node_id(&source),
            strategy: strategy as i32,
            phase: handshake::first_phase(strategy) as i32,
            created_at: ts(now_ms),
            ..Default::default()
        };
        self.ext.migrations.insert(id.to_owned(), m);
        self.emit_migration(id, now_ms);
        if strategy == MigrationStrategy::Handover {
            self.ext.asks.push(JobAsk::GetState {
                migration_id: id.to_owned(),
                job_id: job.to_owned(),
                node_id: source,
            });
        }
        self.answer(id, None)
    }

    fn answer(
        &self,
        id: &str,
        rejected: Option<(TargetRejection, String)>,
    ) -> Result<MigrationResponse, CommandError> {
        let migration = Some(self.migration(id)?.clone());
        Ok(match rejected {
            None => MigrationResponse {
                migration,
                ..Default::default()
            },
            Some((why, message)) => MigrationResponse {
                migration,
                target_rejected: true,
                rejection: why as i32,
                message,
            },
        })
    }

    /// Our MigrationPrepareTarget.
    pub fn ext_migration_prepare_target(
        &mut self,
        req: &MigrationPrepareTargetRequest,
        now_ms: i64,
    ) -> Result<MigrationResponse, CommandError> {
        let id = req.migration_id.as_str();
        let target = node_of(req.target_node_id.as_ref());
        checked_id("target_node_id", target)?;
        checked_id("target_role", &req.target_role)?;
        validate::json("initial_state", &req.initial_state)?;
        let m = self.migration(id)?.clone();
        if m.phase != MigrationPhase::StateReceived as i32 {
            return Err(phase_error(&m, MigrationPhase::StateReceived));
        }
        if target == node_of(m.source_node_id.as_ref()) {
            return Err(CommandError::InvalidArgument(
                "the target node must differ from the source node".to_owned(),
            ));
        }
        if req.target_role == m.source_role {
            return Err(CommandError::InvalidArgument(
                "the target role must differ from the source role".to_owned(),
            ));
        }
        let Some(node) = self.nodes.get(target) else {
            return Err(CommandError::NotFound(format!(
                "node {:?}",
                validate::excerpt(target)
            )));
        };
        if node.power != Power::On || node.ready_at_ms.is_some() {
            let why = format!("node {target} is not running");
            return self.answer(id, Some((TargetRejection::NodeNotReady, why)));
        }
        let job = job_of(&m).to_owned();
        if let Some(on) = self
            .jobs
            .get(&job)
            .and_then(|s| s.instances.get(&req.target_role))
        {
            let why = format!("job {job} already runs under {} on {on}", req.target_role);
            return self.answer(id, Some((TargetRejection::RoleTaken, why)));
        }
        let strategy = MigrationStrategy::try_from(m.strategy).unwrap_or_default();
        if let Some(rec) = self.ext.migrations.get_mut(id) {
            rec.target_node_id = node_id(target);
            rec.target_role = req.target_role.clone();
        }
        if strategy == MigrationStrategy::StopThenStart {
            // Nothing starts before the cutover: the target is ready once it is chosen.
            self.set_phase(id, MigrationPhase::TargetReady, now_ms);
            return self.answer(id, None);
        }
        if !self.start_instance(&job, &req.target_role, target, now_ms)? {
            let why = format!("node {target}'s worker refused the start: {REFUSAL}");
            return self.answer(id, Some((TargetRejection::WorkerRefused, why)));
        }
        self.set_phase(id, MigrationPhase::PreparingTarget, now_ms);
        if strategy == MigrationStrategy::Handover {
            self.ext.asks.push(JobAsk::InitialState {
                migration_id: id.to_owned(),
                job_id: job,
                node_id: target.to_owned(),
                payload: req.initial_state.clone(),
            });
        } else {
            // An overlap target is ready once it runs, which in this world is at once.
            self.set_phase(id, MigrationPhase::TargetReady, now_ms);
        }
        self.answer(id, None)
    }

    /// Our MigrationCutover.
    pub fn ext_migration_cutover(
        &mut self,
        req: &MigrationCutoverRequest,
        now_ms: i64,
    ) -> Result<MigrationResponse, CommandError> {
        let id = req.migration_id.as_str();
        validate::json("payload", &req.payload)?;
        let m = self.migration(id)?.clone();
        if m.phase != MigrationPhase::TargetReady as i32 {
            return Err(phase_error(&m, MigrationPhase::TargetReady));
        }
        let job = job_of(&m).to_owned();
        let source = node_of(m.source_node_id.as_ref()).to_owned();
        let target = node_of(m.target_node_id.as_ref()).to_owned();
        match MigrationStrategy::try_from(m.strategy).unwrap_or_default() {
            MigrationStrategy::Overlap => self.complete(id, now_ms),
            MigrationStrategy::StopThenStart => {
                self.set_phase(id, MigrationPhase::CuttingOver, now_ms);
                self.stop_instance(&job, &m.source_role, JOB_STOPPING_REQUESTED, now_ms);
                match self.start_instance(&job, &m.target_role, &target, now_ms) {
                    Ok(true) => self.complete(id, now_ms),
                    Ok(false) => self.abort(id, MigrationParty::Target, REFUSAL, now_ms),
                    Err(e) => self.abort(id, MigrationParty::Target, &e.to_string(), now_ms),
                }
            }
            _ => {
                self.set_phase(id, MigrationPhase::CuttingOver, now_ms);
                self.ext.asks.push(JobAsk::CutoverReady {
                    migration_id: id.to_owned(),
                    job_id: job,
                    node_id: source,
                    payload: req.payload.clone(),
                });
            }
        }
        self.answer(id, None)
    }

    /// Our MigrationAbort: idempotent on an aborted migration, refused on a completed one.
    pub fn ext_migration_abort(
        &mut self,
        req: &MigrationAbortRequest,
        now_ms: i64,
    ) -> Result<MigrationResponse, CommandError> {
        let id = req.migration_id.as_str();
        validate::reason("reason", &req.reason)?;
        let m = self.migration(id)?;
        if m.phase == MigrationPhase::Completed as i32 {
            return Err(CommandError::FailedPrecondition(format!(
                "migration {id} already completed"
            )));
        }
        self.abort(id, MigrationParty::Controller, &req.reason, now_ms);
        self.answer(id, None)
    }

    /// A job's answer to an ask; answers to a migration that moved on are ignored.
    pub fn migration_reply(&mut self, ask: &JobAsk, reply: JobReply, now_ms: i64) {
        let id = ask.migration_id().to_owned();
        let Some(m) = self.ext.migrations.get_mut(&id) else {
            return;
        };
        if m.phase != handshake::awaiting(ask) as i32 {
            return;
        }
        match handshake::step(ask, reply) {
            Step::Abort(by, reason) => self.abort(&id, by, &reason, now_ms),
            Step::StateReceived(p) => {
                m.source_state = p;
                self.set_phase(&id, MigrationPhase::StateReceived, now_ms);
            }
            Step::TargetReady(p) => {
                m.target_ready_payload = p;
                self.set_phase(&id, MigrationPhase::TargetReady, now_ms);
            }
            Step::SourceStopped(p) => {
                m.source_stopped_payload.clone_from(&p);
                let next = JobAsk::CutoverApply {
                    migration_id: id.clone(),
                    job_id: job_of(m).to_owned(),
                    node_id: node_of(m.target_node_id.as_ref()).to_owned(),
                    payload: p,
                };
                self.ext.asks.push(next);
            }
            Step::Applied {
                applied,
                failed,
                skew_ms,
            } => {
                m.applied = applied;
                m.failed = failed
                    .into_iter()
                    .map(|f| manager_proto::extension::FailedParticipant {
                        id: f.id,
                        reason: f.reason,
                    })
                    .collect();
                m.skew_ms = skew_ms;
                self.complete(&id, now_ms);
            }
        }
    }

    /// The source stops by request and the target goes on under the source's role.
    fn complete(&mut self, id: &str, now_ms: i64) {
        let Some(m) = self.ext.migrations.get_mut(id) else {
            return;
        };
        m.phase = MigrationPhase::Completed as i32;
        let m = m.clone();
        let job = job_of(&m).to_owned();
        // Final first, so the source's stop below is the migration's, not a loss.
        self.stop_instance(&job, &m.source_role, JOB_STOPPING_REQUESTED, now_ms);
        let target = node_of(m.target_node_id.as_ref()).to_owned();
        let (meta, running) = match self.nodes.get(&target) {
            Some(n) => (Some(n.meta.clone()), n.running.clone()),
            None => (None, None),
        };
        if let Some(stored) = self.jobs.get_mut(&job)
            && stored.instances.get(&m.target_role) == Some(&target)
        {
            stored.instances.remove(&m.target_role);
            stored.instances.insert(m.source_role.clone(), target);
            stored
                .history
                .push(entry(HistoryEntry::JobStopped(JobHistoryJobStopped {
                    timestamp: ts(now_ms),
                    role: m.target_role.clone(),
                    node_metadata: meta.clone(),
                    running_node_metadata: None,
                })));
            stored
                .history
                .push(entry(HistoryEntry::JobRunning(JobHistoryJobRunning {
                    timestamp: ts(now_ms),
                    role: m.source_role.clone(),
                    node_metadata: meta,
                    running_node_metadata: running,
                    service_port_mappings: Default::default(),
                })));
            self.events.push(ev(Event::JobUpdated(JobUpdated {
                job_with_history: Some(with_history(stored)),
            })));
        }
        self.emit_migration(id, now_ms);
    }

    pub(super) fn abort(&mut self, id: &str, by: MigrationParty, reason: &str, now_ms: i64) {
        let Some(m) = self.ext.migrations.get_mut(id) else {
            return;
        };
        if handshake::is_final(m.phase) {
            return;
        }
        m.phase = MigrationPhase::Aborted as i32;
        m.aborted_by = by as i32;
        m.abort_reason = validate::excerpt(reason);
        let m = m.clone();
        self.emit_migration(id, now_ms);
        // A target started for this migration is stopped.
        let job = job_of(&m);
        let target = node_of(m.target_node_id.as_ref());
        if !m.target_role.is_empty()
            && self
                .jobs
                .get(job)
                .and_then(|s| s.instances.get(&m.target_role))
                .is_some_and(|on| on == target)
        {
            self.stop_instance(job, &m.target_role, JOB_STOPPING_REQUESTED, now_ms);
        }
    }

    /// A job's own abort between asks (over its job socket): the migration aborts by that side.
    pub fn migration_job_abort(&mut self, id: &str, from_source: bool, reason: &str, now_ms: i64) {
        let by = if from_source {
            MigrationParty::Source
        } else {
            MigrationParty::Target
        };
        self.abort(id, by, reason, now_ms);
    }

    /// Every migration, by id.
    pub(super) fn ext_migrations(&self) -> impl Iterator<Item = &Migration> {
        self.ext.migrations.values()
    }

    /// A migration read back from the state dir.
    pub(super) fn restore_migration(&mut self, m: Migration) {
        self.ext.migrations.insert(m.migration_id.clone(), m);
    }

    /// The migration in progress whose target is job `job`'s instance under `role`.
    pub(super) fn migration_for_target(&self, job: &str, role: &str) -> Option<String> {
        self.ext
            .migrations
            .values()
            .find(|m| job_of(m) == job && m.target_role == role && !handshake::is_final(m.phase))
            .map(|m| m.migration_id.clone())
    }

    /// An instance stopped: a migration it was part of aborts (by Manager), unless the stop is
    /// the cutover's own stop of its source.
    pub(super) fn instance_gone(&mut self, job: &str, role: &str, now_ms: i64) {
        let touched: Vec<(String, &'static str)> = self
            .ext
            .migrations
            .values()
            .filter(|m| job_of(m) == job && !handshake::is_final(m.phase))
            .filter_map(|m| {
                if m.source_role == role && m.phase != MigrationPhase::CuttingOver as i32 {
                    Some((m.migration_id.clone(), "the source instance stopped"))
                } else if m.target_role == role {
                    Some((m.migration_id.clone(), "the target instance stopped"))
                } else {
                    None
                }
            })
            .collect();
        for (id, why) in touched {
            self.abort(&id, MigrationParty::Manager, why, now_ms);
        }
    }
}

fn phase_error(m: &Migration, expected: MigrationPhase) -> CommandError {
    CommandError::FailedPrecondition(format!(
        "migration {} is {}, expected {}",
        m.migration_id,
        MigrationPhase::try_from(m.phase).map_or("unknown", |p| p.as_str_name()),
        expected.as_str_name()
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use manager_proto::api::manager::{CreateAwsNodeRequest, Job};
    use manager_proto::extension::{Migration, MigrationPhase as P};

    use super::*;
    use crate::config::SimConfig;
    use crate::world::default_reply;

    fn world() -> PublishedWorld {
        PublishedWorld::new(&SimConfig::demo(), 0)
    }

    /// A running aws node `id`, at time 1 000.
    fn running(w: &mut PublishedWorld, id: &str) {
        w.create_aws_node(
            &CreateAwsNodeRequest {
                node_id: node_id(id),
                tags: BTreeMap::from([("pool".to_owned(), "aws-east".to_owned())]),
                region: "eu-west-1".to_owned(),
                instance_type: "m5.xlarge".to_owned(),
                ..Default::default()
            },
            0,
        )
        .expect("created");
        w.advance(1_000);
    }

    /// Job `j` stored and running under `primary` on `node`.
    fn job_on(w: &mut PublishedWorld, node: &str) {
        w.create_job(
            Job {
                job_id: Some(JobId {
                    job_id: "j".to_owned(),
                }),
                ..Default::default()
            },
            1_000,
        )
        .expect("stored");
        w.start_job("j", "primary", node, 1_000).expect("started");
        w.take_events();
        w.take_ext_events();
    }

    fn powers(events: &[WatchEvent]) -> Vec<PowerState> {
        events
            .iter()
            .filter_map(|e| match &e.event {
                Some(Ext::NodePower(p)) => PowerState::try_from(p.state).ok(),
                _ => None,
            })
            .collect()
    }

    fn phases(events: &[WatchEvent]) -> Vec<P> {
        events
            .iter()
            .filter_map(|e| match &e.event {
                Some(Ext::Migration(m)) => P::try_from(m.phase).ok(),
                _ => None,
            })
            .collect()
    }

    /// Answers every ask as a cooperative job does.
    fn answer(w: &mut PublishedWorld, now: i64) {
        loop {
            let asks = w.take_asks();
            if asks.is_empty() {
                return;
            }
            for a in asks {
                w.migration_reply(&a, default_reply(&a), now);
            }
        }
    }

    fn instances(w: &PublishedWorld) -> BTreeMap<String, String> {
        w.jobs
            .get("j")
            .map(|s| s.instances.clone())
            .unwrap_or_default()
    }

    fn propose(id: &str, strategy: MigrationStrategy) -> MigrationGetStateRequest {
        MigrationGetStateRequest {
            migration_id: id.to_owned(),
            job_id: Some(JobId {
                job_id: "j".to_owned(),
            }),
            source_role: "primary".to_owned(),
            strategy: strategy as i32,
        }
    }

    fn prepare(id: &str, node: &str) -> MigrationPrepareTargetRequest {
        MigrationPrepareTargetRequest {
            migration_id: id.to_owned(),
            target_node_id: node_id(node),
            target_role: "migration-target".to_owned(),
            initial_state: Vec::new(),
        }
    }

    fn cutover(id: &str) -> MigrationCutoverRequest {
        MigrationCutoverRequest {
            migration_id: id.to_owned(),
            payload: Vec::new(),
        }
    }

    fn record(w: &PublishedWorld, id: &str) -> Migration {
        w.ext_migration(id).migration.expect("a migration")
    }

    #[test]
    fn a_warm_node_powers_off_keeps_its_id_and_starts_again() {
        let mut w = world();
        running(&mut w, "n1");
        w.take_events();
        let p = w.stop_node_warm("n1", 2_000).expect("stopping");
        assert_eq!(p.state, PowerState::PoweringOff as i32);
        assert_eq!(
            super::super::tests_kinds(&w.take_events()),
            ["NodeStopping"]
        );
        // Asking again while it powers off changes nothing.
        w.stop_node_warm("n1", 2_001).expect("idempotent");
        assert!(matches!(
            w.start_node_warm("n1", 2_002),
            Err(CommandError::FailedPrecondition(_))
        ));
        let due = w.next_due_ms().expect("the power-off is due");
        w.advance(due);
        assert_eq!(super::super::tests_kinds(&w.take_events()), ["NodeStopped"]);
        assert_eq!(
            powers(&w.take_ext_events()),
            [PowerState::PoweringOff, PowerState::PoweredOff]
        );
        // Off: the published snapshot leaves it out; ours lists it as kept.
        assert!(!super::super::tests_kinds(&w.snapshot()).contains(&"NodeRunning"));
        assert_eq!(powers(&w.ext_snapshot()), [PowerState::PoweredOff]);
        w.create_job(
            Job {
                job_id: Some(JobId {
                    job_id: "j".to_owned(),
                }),
                ..Default::default()
            },
            due,
        )
        .expect("stored");
        assert!(matches!(
            w.start_job("j", "primary", "n1", due),
            Err(CommandError::FailedPrecondition(m)) if m.contains("powered off")
        ));
        w.take_events();
        let p = w.start_node_warm("n1", due).expect("starting");
        assert_eq!(p.state, PowerState::Starting as i32);
        let ready = w.next_due_ms().expect("the start is due");
        w.advance(ready);
        assert_eq!(
            super::super::tests_kinds(&w.take_events()),
            ["NodeStarting", "NodeStarted"]
        );
        assert_eq!(
            powers(&w.take_ext_events()),
            [PowerState::Starting, PowerState::Running]
        );
        w.start_job("j", "primary", "n1", ready)
            .expect("a started node takes work");
    }

    #[test]
    fn warm_stops_of_the_wrong_node_are_refused_with_reasons() {
        let mut w = world();
        for (id, what) in [
            ("", "empty"),
            (&*"n".repeat(300), "oversized"),
            ("a\nb", "control characters"),
        ] {
            assert!(
                matches!(
                    w.stop_node_warm(id, 0),
                    Err(CommandError::InvalidArgument(_))
                ),
                "{what}"
            );
        }
        assert!(matches!(
            w.stop_node_warm("nope", 0),
            Err(CommandError::NotFound(_))
        ));
        assert!(matches!(
            w.stop_node_warm("onprem-a1", 0),
            Err(CommandError::FailedPrecondition(m)) if m.contains("physical")
        ));
        running(&mut w, "n1");
        job_on(&mut w, "n1");
        assert!(matches!(
            w.stop_node_warm("n1", 2_000),
            Err(CommandError::FailedPrecondition(m)) if m.contains("hosts")
        ));
        assert!(w.take_ext_events().is_empty(), "a refusal changes nothing");
        // A node that never stopped starts as a no-op.
        let p = w.start_node_warm("n1", 2_000).expect("idempotent");
        assert_eq!(p.state, PowerState::Running as i32);
    }

    #[test]
    fn a_terminated_warm_node_is_gone_from_both_streams() {
        let mut w = world();
        running(&mut w, "n1");
        w.stop_node_warm("n1", 1_000).expect("stopping");
        let due = w.next_due_ms().expect("due");
        w.advance(due);
        w.take_events();
        w.take_ext_events();
        w.terminate_node("n1", due).expect("terminated");
        assert!(
            w.take_events().is_empty(),
            "the published stream reported it stopped already"
        );
        assert_eq!(powers(&w.take_ext_events()), [PowerState::Terminated]);
        assert!(powers(&w.ext_snapshot()).is_empty());
    }

    #[test]
    fn a_reclaim_notice_is_announced_and_the_node_is_lost_at_its_deadline() {
        let mut w = world();
        running(&mut w, "n1");
        job_on(&mut w, "n1");
        w.notice_node("n1", 5_000, "", 2_000).expect("noticed");
        let notice = w.take_ext_events();
        assert!(matches!(
            &notice[..],
            [WatchEvent { event: Some(Ext::ReclaimNotice(n)) }]
                if n.reason == "spot-interruption" && n.deadline == ts(7_000)
        ));
        assert_eq!(
            w.ext_snapshot().len(),
            2,
            "the notice, then SnapshotComplete"
        );
        w.advance(6_999);
        assert!(w.has_node("n1"));
        w.advance(7_000);
        assert!(!w.has_node("n1"), "reclaimed at the deadline");
        assert!(instances(&w).is_empty(), "its instance stopped with it");
        assert!(matches!(
            w.notice_node("onprem-a1", MAX_NOTICE_MS + 1, "", 0),
            Err(CommandError::InvalidArgument(_))
        ));
        assert!(matches!(
            w.notice_node("onprem-a1", 10, &"r".repeat(2_000), 0),
            Err(CommandError::InvalidArgument(_))
        ));
        assert!(matches!(
            w.notice_node("gone", 10, "", 0),
            Err(CommandError::NotFound(_))
        ));
    }

    #[test]
    fn an_overlap_migration_moves_the_instance_under_its_role() {
        let mut w = world();
        running(&mut w, "n1");
        running(&mut w, "n2");
        job_on(&mut w, "n1");
        w.ext_migration_get_state(&propose("m1", MigrationStrategy::Overlap), 2_000)
            .expect("proposed");
        w.ext_migration_prepare_target(&prepare("m1", "n2"), 2_000)
            .expect("prepared");
        assert_eq!(
            instances(&w),
            BTreeMap::from([
                ("migration-target".to_owned(), "n2".to_owned()),
                ("primary".to_owned(), "n1".to_owned()),
            ]),
            "both run before the cutover"
        );
        w.ext_migration_cutover(&cutover("m1"), 2_000)
            .expect("cut over");
        assert_eq!(
            instances(&w),
            BTreeMap::from([("primary".to_owned(), "n2".to_owned())])
        );
        assert_eq!(
            phases(&w.take_ext_events()),
            [
                P::StateReceived,
                P::PreparingTarget,
                P::TargetReady,
                P::Completed
            ]
        );
        assert!(matches!(
            w.ext_migration_abort(
                &MigrationAbortRequest {
                    migration_id: "m1".to_owned(),
                    reason: String::new()
                },
                2_000
            ),
            Err(CommandError::FailedPrecondition(_))
        ));
    }

    #[test]
    fn a_handover_moves_phase_by_phase_on_the_jobs_answers() {
        let mut w = world();
        running(&mut w, "n1");
        running(&mut w, "n2");
        job_on(&mut w, "n1");
        w.ext_migration_get_state(&propose("m1", MigrationStrategy::Handover), 2_000)
            .expect("proposed");
        assert_eq!(record(&w, "m1").phase, P::Proposed as i32);
        answer(&mut w, 2_000);
        assert_eq!(record(&w, "m1").phase, P::StateReceived as i32);
        w.ext_migration_prepare_target(&prepare("m1", "n2"), 2_000)
            .expect("prepared");
        assert_eq!(record(&w, "m1").phase, P::PreparingTarget as i32);
        answer(&mut w, 2_000);
        assert_eq!(record(&w, "m1").phase, P::TargetReady as i32);
        w.ext_migration_cutover(&cutover("m1"), 2_000)
            .expect("cut over");
        assert_eq!(record(&w, "m1").phase, P::CuttingOver as i32);
        answer(&mut w, 2_000);
        assert_eq!(record(&w, "m1").phase, P::Completed as i32);
        assert_eq!(
            instances(&w),
            BTreeMap::from([("primary".to_owned(), "n2".to_owned())])
        );
    }

    #[test]
    fn a_stop_then_start_migration_starts_the_target_only_at_the_cutover() {
        let mut w = world();
        running(&mut w, "n1");
        running(&mut w, "n2");
        job_on(&mut w, "n1");
        w.ext_migration_get_state(&propose("m1", MigrationStrategy::StopThenStart), 2_000)
            .expect("proposed");
        w.ext_migration_prepare_target(&prepare("m1", "n2"), 2_000)
            .expect("prepared");
        assert_eq!(record(&w, "m1").phase, P::TargetReady as i32);
        assert_eq!(instances(&w).len(), 1, "nothing started yet");
        w.ext_migration_cutover(&cutover("m1"), 2_000)
            .expect("cut over");
        assert_eq!(record(&w, "m1").phase, P::Completed as i32);
        assert_eq!(
            instances(&w),
            BTreeMap::from([("primary".to_owned(), "n2".to_owned())])
        );
    }

    #[test]
    fn malformed_and_contradictory_migration_calls_are_refused_and_change_nothing() {
        let mut w = world();
        running(&mut w, "n1");
        running(&mut w, "n2");
        job_on(&mut w, "n1");
        let mut bad = propose("m/1", MigrationStrategy::Overlap);
        assert!(matches!(
            w.ext_migration_get_state(&bad, 0),
            Err(CommandError::InvalidArgument(_))
        ));
        bad = propose(&"m".repeat(300), MigrationStrategy::Overlap);
        assert!(matches!(
            w.ext_migration_get_state(&bad, 0),
            Err(CommandError::InvalidArgument(_))
        ));
        bad = propose("m1", MigrationStrategy::Overlap);
        bad.strategy = 42;
        assert!(matches!(
            w.ext_migration_get_state(&bad, 0),
            Err(CommandError::InvalidArgument(_))
        ));
        bad = propose("m1", MigrationStrategy::Overlap);
        bad.source_role = "backup".to_owned();
        assert!(matches!(
            w.ext_migration_get_state(&bad, 0),
            Err(CommandError::FailedPrecondition(_))
        ));
        bad.job_id = None;
        assert!(matches!(
            w.ext_migration_get_state(&bad, 0),
            Err(CommandError::InvalidArgument(_))
        ));
        assert!(w.take_ext_events().is_empty());
        w.ext_migration_get_state(&propose("m1", MigrationStrategy::Handover), 0)
            .expect("proposed");
        assert!(matches!(
            w.ext_migration_get_state(&propose("m1", MigrationStrategy::Handover), 0),
            Err(CommandError::AlreadyExists(_))
        ));
        assert!(matches!(
            w.ext_migration_get_state(&propose("m2", MigrationStrategy::Handover), 0),
            Err(CommandError::FailedPrecondition(m)) if m.contains("already being migrated")
        ));
        // Before the source answered, no target can be prepared nor a cutover made.
        assert!(matches!(
            w.ext_migration_prepare_target(&prepare("m1", "n2"), 0),
            Err(CommandError::FailedPrecondition(_))
        ));
        answer(&mut w, 0);
        assert!(matches!(
            w.ext_migration_cutover(&cutover("m1"), 0),
            Err(CommandError::FailedPrecondition(_))
        ));
        assert!(matches!(
            w.ext_migration_prepare_target(&prepare("m1", "n1"), 0),
            Err(CommandError::InvalidArgument(m)) if m.contains("differ")
        ));
        let mut same_role = prepare("m1", "n2");
        same_role.target_role = "primary".to_owned();
        assert!(matches!(
            w.ext_migration_prepare_target(&same_role, 0),
            Err(CommandError::InvalidArgument(_))
        ));
        let mut not_json = prepare("m1", "n2");
        not_json.initial_state = b"{not json".to_vec();
        assert!(matches!(
            w.ext_migration_prepare_target(&not_json, 0),
            Err(CommandError::InvalidArgument(_))
        ));
        let mut huge = prepare("m1", "n2");
        huge.initial_state = format!("\"{}\"", "x".repeat(70 * 1024)).into_bytes();
        assert!(matches!(
            w.ext_migration_prepare_target(&huge, 0),
            Err(CommandError::InvalidArgument(_))
        ));
        // A powered-off target is an answer, and the migration waits for another.
        w.stop_node_warm("n2", 0).expect("stopping");
        let r = w
            .ext_migration_prepare_target(&prepare("m1", "n2"), 0)
            .expect("an answer");
        assert!(r.target_rejected);
        assert_eq!(r.rejection, TargetRejection::NodeNotReady as i32);
        assert_eq!(record(&w, "m1").phase, P::StateReceived as i32);
        assert!(matches!(
            w.ext_migration_cutover(&cutover("nope"), 0),
            Err(CommandError::NotFound(_))
        ));
        let abort = MigrationAbortRequest {
            migration_id: "m1".to_owned(),
            reason: "enough".to_owned(),
        };
        w.ext_migration_abort(&abort, 0).expect("aborted");
        w.ext_migration_abort(&abort, 0).expect("idempotent");
        let m = record(&w, "m1");
        assert_eq!(
            (m.phase, m.aborted_by),
            (P::Aborted as i32, MigrationParty::Controller as i32)
        );
    }

    #[test]
    fn a_migration_whose_source_node_dies_aborts_by_manager_and_its_target_stops() {
        let mut w = world();
        running(&mut w, "n1");
        running(&mut w, "n2");
        job_on(&mut w, "n1");
        w.ext_migration_get_state(&propose("m1", MigrationStrategy::Handover), 0)
            .expect("proposed");
        answer(&mut w, 0);
        w.ext_migration_prepare_target(&prepare("m1", "n2"), 0)
            .expect("prepared");
        w.kill_node("n1", 0).expect("killed");
        let m = record(&w, "m1");
        assert_eq!(
            (m.phase, m.aborted_by),
            (P::Aborted as i32, MigrationParty::Manager as i32)
        );
        assert!(instances(&w).is_empty(), "the target was stopped too");
    }
}
