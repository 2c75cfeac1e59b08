//! SimAdmin's faults in the published world, with the semantics our first API's world gives
//! them ([`crate::world::World`]'s chaos section), said the way the published API says things:
//! a failed instance is a `JobHistoryJobStopping` with a failure reason, a refused start is an
//! accepted call whose outcome on the stream is a stop before the instance ever ran, a node cut
//! off is a node stopping because its health pings stopped. Also what the sim saw of each job
//! ([`PublishedWorld::job_history`]) and how its jobs answer the migration handshake
//! ([`PublishedWorld::set_migration_behaviour`]).

use std::collections::{BTreeMap, BTreeSet};

use manager_proto::api::common::job_info_compose_message::Stage;
use manager_proto::api::common::job_info_message::Message as Info;
use manager_proto::api::common::{
    ActiveJobKey, JobInfoComposeMessage, JobInfoContainerEvent, JobInfoMessage,
};
use manager_proto::{InstanceStart, JobHistoryResponse, JobRole, MigrationParty};

use super::{
    CommandError, Event, HistoryEntry, JobHistoryJobProvisioned, JobHistoryJobStopped,
    JobHistoryJobStopping, JobId, JobUpdated, NodeMetadata, NodeStarted, NodeStopped, NodeStopping,
    PhysicalNode, PhysicalNodeConnected, PublishedWorld, RunningNodeMetadata,
    STOPPING_HEALTH_PING_EXCEEDED, checked_id, entry, ev, node_id, ts, with_history,
};
use crate::behaviour::{AbortAt, BehaviourError, Behaviours, JobBehaviour};
use crate::validate;
use crate::world::{JobAsk, JobRecord, JobReply, default_reply};

/// What a start refused by `reject-next` says, on the stream and in a migration's answer.
pub(in crate::published) const REFUSAL: &str = "fault injected by reject-next";
/// `JobHistoryJobStopping.Reason` of an instance that ended by itself
/// (`JOB_STOPPED_JOB_FAILED`): a crash is the job's own failure, not its node stopping
/// (`NODE_STOPPED`, `NODE_TERMINATED`), a request (`USER_REQUESTED`), or a node reporting a
/// job Manager does not know (`UNKNOWN_JOB`).
const JOB_STOPPING_JOB_FAILED: i32 = 4;
/// `JobHistoryJobStopping.Reason` for an instance whose node stopped (`JOB_STOPPED_NODE_STOPPED`).
const JOB_STOPPING_NODE_STOPPED: i32 = 0;
/// The longest provisioning delay `slow-provision` takes (as our first API's world).
const MAX_PROVISION_DELAY_MS: u64 = 3_600_000;
/// What the handshake's target reports applied (less those a behaviour fails): the
/// participants a simulated job on the job socket has.
const PARTICIPANTS: [&str; 2] = crate::socket_agent::PARTICIPANTS;

/// Faults in force, and what the sim saw of each job.
#[derive(Debug, Clone, Default)]
pub(in crate::published) struct ChaosState {
    /// Starts still to refuse.
    reject_next: u32,
    /// Zones that died and were not revived.
    pub(super) dead_zones: BTreeSet<String>,
    /// Zones cut off and not healed.
    pub(super) partitioned: BTreeSet<String>,
    /// The provisioning delay `slow-provision` set, if any.
    pub(super) provision_delay_ms: Option<u64>,
    /// What the sim saw of each job (in memory only, as our first API's world keeps it).
    records: BTreeMap<String, JobRecord>,
    /// How each job answers the handshake; cooperative unless set.
    behaviours: Behaviours,
    /// Answers a job gives later (a slow cutover): when, to what, what.
    replies: Vec<(i64, JobAsk, JobReply)>,
    /// The jobs speak a real job socket: asks wait in the world for the service to relay them
    /// ([`PublishedWorld::take_asks`]) rather than being answered here.
    asks_relayed: bool,
}

impl ChaosState {
    /// Whether the next start is refused (and one fewer is left to refuse).
    pub(super) fn take_rejection(&mut self) -> bool {
        if self.reject_next == 0 {
            return false;
        }
        self.reject_next -= 1;
        true
    }

    pub(super) fn zone_dead(&self, zone: &str) -> bool {
        !zone.is_empty() && self.dead_zones.contains(zone)
    }

    /// When the next delayed answer is due.
    pub(super) fn next_reply_ms(&self) -> Option<i64> {
        self.replies.iter().map(|(at, _, _)| *at).min()
    }
}

fn info(job: &str, role: &str, now_ms: i64, message: Info) -> Event {
    Event::JobInfo(JobInfoMessage {
        job_key: Some(ActiveJobKey {
            job_id: Some(JobId {
                job_id: job.to_owned(),
            }),
            role: role.to_owned(),
        }),
        timestamp: ts(now_ms),
        message: Some(message),
    })
}

/// What a job with behaviour `b` answers to `ask` (as the simulated job on the job socket
/// answers): the answer, how long it waits before giving it, and a job-side abort it sends
/// right after it, by which side.
fn scripted(ask: &JobAsk, b: &JobBehaviour) -> (JobReply, u64, Option<(MigrationParty, String)>) {
    let because = |at: AbortAt| format!("simulated abort at {}", at.name());
    let at = |point: AbortAt| b.abort_at == Some(point);
    match ask {
        JobAsk::GetState { .. } if at(AbortAt::GetState) => {
            (JobReply::Abort(because(AbortAt::GetState)), 0, None)
        }
        JobAsk::GetState { .. } if b.refuse_state => (
            JobReply::StateRefused("simulated refusal (refuse-state)".to_owned()),
            0,
            None,
        ),
        JobAsk::GetState { .. } if at(AbortAt::StateGiven) => (
            default_reply(ask),
            0,
            Some((MigrationParty::Source, because(AbortAt::StateGiven))),
        ),
        JobAsk::InitialState { .. } if at(AbortAt::InitialState) => {
            (JobReply::Abort(because(AbortAt::InitialState)), 0, None)
        }
        JobAsk::InitialState { .. } if at(AbortAt::TargetReady) => (
            default_reply(ask),
            0,
            Some((MigrationParty::Target, because(AbortAt::TargetReady))),
        ),
        JobAsk::CutoverReady { .. } if at(AbortAt::CutoverReady) => {
            (JobReply::Abort(because(AbortAt::CutoverReady)), 0, None)
        }
        JobAsk::CutoverReady { .. } => (default_reply(ask), b.cutover_delay_ms, None),
        JobAsk::CutoverApply { .. } => {
            // The participants of a simulated job on the job socket, as it reports them.
            let (applied, failed) = b.apply_outcome(&PARTICIPANTS);
            let failed = failed
                .into_iter()
                .map(|id| manager_proto::FailedParticipant {
                    id,
                    reason: "simulated failure (fail-participant)".to_owned(),
                })
                .collect();
            (
                JobReply::TargetApplied {
                    applied,
                    failed,
                    skew_ms: 0.0,
                },
                0,
                None,
            )
        }
        _ => (default_reply(ask), 0, None),
    }
}

impl PublishedWorld {
    /// Whether the world holds job `id`.
    pub fn has_job(&self, id: &str) -> bool {
        self.jobs.contains_key(id)
    }

    /// SimAdmin's RejectNext: the next `count` starts are refused by their node's worker (0
    /// clears). The published API answers a start `Empty` and reports its outcome on the
    /// stream, so a refused start is accepted, and its history says the instance was
    /// provisioned and stopped as failed without ever running (a `JobInfoMessage` carries
    /// why).
    pub fn reject_next(&mut self, count: u32) {
        self.chaos.reject_next = count;
    }

    /// The history of a start the worker refused.
    pub(super) fn refuse_start(
        &mut self,
        job: &str,
        role: &str,
        meta: NodeMetadata,
        running: Option<RunningNodeMetadata>,
        now_ms: i64,
    ) {
        let Some(stored) = self.jobs.get_mut(job) else {
            return;
        };
        stored.history.push(entry(HistoryEntry::JobProvisioned(
            JobHistoryJobProvisioned {
                timestamp: ts(now_ms),
                role: role.to_owned(),
                node_metadata: Some(meta.clone()),
                running_node_metadata: running.clone(),
            },
        )));
        stored
            .history
            .push(entry(HistoryEntry::JobStopping(JobHistoryJobStopping {
                timestamp: ts(now_ms),
                role: role.to_owned(),
                node_metadata: Some(meta.clone()),
                running_node_metadata: running.clone(),
                reason: JOB_STOPPING_JOB_FAILED,
            })));
        stored
            .history
            .push(entry(HistoryEntry::JobStopped(JobHistoryJobStopped {
                timestamp: ts(now_ms),
                role: role.to_owned(),
                node_metadata: Some(meta),
                running_node_metadata: running,
            })));
        let updated = ev(Event::JobUpdated(JobUpdated {
            job_with_history: Some(with_history(stored)),
        }));
        let why = Info::ComposeMessage(JobInfoComposeMessage {
            stage: Stage::Start as i32,
            text: REFUSAL.to_owned(),
        });
        self.events.push(ev(info(job, role, now_ms, why)));
        self.events.push(updated);
    }

    /// SimAdmin's FailJob: the job's instance under `role` (every live one when `role` is
    /// empty) fails: a `JobInfoMessage` carries `message`, then the instance stops with
    /// `JOB_STOPPED_JOB_FAILED`. Answers the roles that failed.
    pub fn fail_job(
        &mut self,
        job: &str,
        role: &str,
        message: &str,
        now_ms: i64,
    ) -> Result<Vec<String>, CommandError> {
        checked_id("job_id", job)?;
        validate::reason("message", message)?;
        if !role.is_empty() {
            checked_id("role", role)?;
        }
        let Some(stored) = self.jobs.get(job) else {
            return Err(CommandError::NotFound(format!(
                "job {:?}",
                validate::excerpt(job)
            )));
        };
        let roles: Vec<String> = if role.is_empty() {
            stored.instances.keys().cloned().collect()
        } else if stored.instances.contains_key(role) {
            vec![role.to_owned()]
        } else {
            return Err(CommandError::FailedPrecondition(format!(
                "job {job} has no live instance under role {role}"
            )));
        };
        if roles.is_empty() {
            return Err(CommandError::FailedPrecondition(format!(
                "job {job} has no live instance"
            )));
        }
        let message = if message.is_empty() {
            "failure injected by fail-job"
        } else {
            message
        };
        let service = stored
            .job
            .services
            .first()
            .map(|s| s.name.clone())
            .unwrap_or_default();
        for r in &roles {
            let crash = Info::ContainerEvent(JobInfoContainerEvent {
                service_name: service.clone(),
                text: message.to_owned(),
            });
            self.events.push(ev(info(job, r, now_ms, crash)));
            self.stop_instance(job, r, JOB_STOPPING_JOB_FAILED, now_ms);
        }
        Ok(roles)
    }

    /// SimAdmin's SlowProvision: every elastic pool's provisioning delay, for nodes created
    /// from now on.
    pub fn slow_provision(&mut self, delay_ms: u64) -> Result<(), CommandError> {
        if delay_ms > MAX_PROVISION_DELAY_MS {
            return Err(CommandError::InvalidArgument(format!(
                "delay_ms must be at most {MAX_PROVISION_DELAY_MS} (one hour), got {delay_ms}"
            )));
        }
        for o in self.offers.iter_mut().filter(|o| o.elastic) {
            o.provision_delay_ms = delay_ms;
        }
        self.chaos.provision_delay_ms = Some(delay_ms);
        Ok(())
    }

    /// SimAdmin's KillZone: every node in `zone` dies at once as [`PublishedWorld::kill_node`]
    /// kills one (starting, warm and cut-off ones too), and until `revive` a node that comes up
    /// there dies instead. Answers the killed node ids (none when reviving).
    pub fn kill_zone(
        &mut self,
        zone: &str,
        revive: bool,
        now_ms: i64,
    ) -> Result<Vec<String>, CommandError> {
        validate::id("zone", zone)?;
        if revive {
            self.chaos.dead_zones.remove(zone);
            return Ok(Vec::new());
        }
        self.chaos.dead_zones.insert(zone.to_owned());
        let ids: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.zone == zone)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            self.kill_node(id, now_ms)?;
        }
        Ok(ids)
    }

    /// SimAdmin's PartitionZone: the running nodes of `zone` stop answering — Manager reports
    /// each stopping for `HEALTH_PING_TIME_EXCEEDED` with its instances stopped as their node
    /// stopped, then stopped — and are kept; `heal` brings them back (`NodeStarted`, or
    /// `PhysicalNodeConnected` for a physical node), with nothing running. Nodes that come up
    /// in a partitioned zone later are not cut off. Answers the node ids affected.
    pub fn partition_zone(
        &mut self,
        zone: &str,
        heal: bool,
        now_ms: i64,
    ) -> Result<Vec<String>, CommandError> {
        validate::id("zone", zone)?;
        if heal {
            if !self.chaos.partitioned.remove(zone) {
                return Ok(Vec::new());
            }
            let ids: Vec<String> = self
                .nodes
                .iter()
                .filter(|(_, n)| n.zone == zone && n.partitioned)
                .map(|(id, _)| id.clone())
                .collect();
            for id in &ids {
                let Some(n) = self.nodes.get_mut(id) else {
                    continue;
                };
                n.partitioned = false;
                let back = if n.physical {
                    Event::PhysicalNodeConnected(PhysicalNodeConnected {
                        node: Some(PhysicalNode {
                            id: id.clone(),
                            tags: n.meta.tags.clone(),
                            ip_address: String::new(),
                        }),
                        instances: Vec::new(),
                    })
                } else {
                    Event::NodeStarted(NodeStarted {
                        node_metadata: Some(n.meta.clone()),
                        running_node_metadata: n.running.clone(),
                    })
                };
                self.events.push(ev(back));
            }
            return Ok(ids);
        }
        self.chaos.partitioned.insert(zone.to_owned());
        let ids: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| {
                n.zone == zone
                    && !n.partitioned
                    && n.ready_at_ms.is_none()
                    && n.power == super::ext::Power::On
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            self.events.push(ev(Event::NodeStopping(NodeStopping {
                node_id: node_id(id),
                reason: STOPPING_HEALTH_PING_EXCEEDED,
            })));
            for (job, role) in self.instances_on(id) {
                self.stop_instance(&job, &role, JOB_STOPPING_NODE_STOPPED, now_ms);
            }
            if let Some(n) = self.nodes.get_mut(id) {
                n.partitioned = true;
            }
            self.events.push(ev(Event::NodeStopped(NodeStopped {
                node_id: node_id(id),
            })));
        }
        Ok(ids)
    }

    /// SimAdmin's SetMigrationBehaviour: how job `job` answers the handshake of our
    /// extension from now on (replacing what was set before; cooperative by default).
    pub fn set_migration_behaviour(
        &mut self,
        job: &str,
        behaviour: JobBehaviour,
    ) -> Result<(), BehaviourError> {
        self.chaos.behaviours.set(job, behaviour)
    }

    /// The `jobSocket.behaviours` rules of the sim's configuration: how the jobs they match
    /// answer the handshake unless `set_migration_behaviour` said otherwise for one.
    pub fn set_behaviour_rules(&mut self, rules: Vec<crate::behaviour::BehaviourRule>) {
        self.chaos.behaviours.set_rules(rules);
    }

    /// From now on the handshake's asks are relayed to the jobs over their job socket by
    /// whoever takes them ([`PublishedWorld::take_asks`]); [`PublishedWorld::answer_asks`]
    /// leaves them be.
    pub fn relay_asks(&mut self) {
        self.chaos.asks_relayed = true;
    }

    /// Answers every ask the handshake raised, as each job's behaviour says (a slow cutover's
    /// answer waits for its time: [`PublishedWorld::advance`] gives it). Nothing while the
    /// asks are relayed to a job socket ([`PublishedWorld::relay_asks`]).
    pub fn answer_asks(&mut self, now_ms: i64) {
        if self.chaos.asks_relayed {
            return;
        }
        // Each answer raises at most one further ask, and a migration ends after four.
        loop {
            let asks = self.take_asks();
            if asks.is_empty() {
                return;
            }
            for ask in asks {
                let node = match &ask {
                    JobAsk::GetState { node_id, .. }
                    | JobAsk::InitialState { node_id, .. }
                    | JobAsk::CutoverReady { node_id, .. }
                    | JobAsk::CutoverApply { node_id, .. } => node_id.clone(),
                };
                if self.nodes.get(&node).is_some_and(|n| !n.job_socket) {
                    // Nothing there to ask: the side on that node aborts, as a job on our
                    // first API's socket agent does.
                    let why = format!(
                        "node {node} has no job socket listener ({})",
                        manager_proto::JOB_SOCKET_CAPABILITY
                    );
                    self.migration_reply(&ask, JobReply::Abort(why), now_ms);
                    continue;
                }
                let b = self.chaos.behaviours.get(ask.job_id());
                let (reply, delay_ms, abort_after) = scripted(&ask, &b);
                if delay_ms > 0 {
                    let at = now_ms.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
                    self.chaos.replies.push((at, ask, reply));
                    continue;
                }
                self.migration_reply(&ask, reply, now_ms);
                if let Some((by, reason)) = abort_after {
                    self.abort(ask.migration_id(), by, &reason, now_ms);
                }
            }
        }
    }

    /// Gives the delayed answers that are due.
    pub(super) fn deliver_replies(&mut self, now_ms: i64) {
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.chaos.replies)
            .into_iter()
            .partition(|(at, _, _)| *at <= now_ms);
        self.chaos.replies = later;
        for (_, ask, reply) in due {
            self.migration_reply(&ask, reply, now_ms);
        }
        self.answer_asks(now_ms);
    }

    /// SimAdmin's JobHistory: what the sim saw of job `job` since it started, as our first
    /// API's world reports it. A start under the target role of one of our extension's
    /// migrations reads as a migration's target, with its migration; a start under any other
    /// role as the job's normal instance.
    pub fn job_history(&self, job: &str, now_ms: i64) -> Result<JobHistoryResponse, CommandError> {
        checked_id("job_id", job)?;
        self.chaos
            .records
            .get(job)
            .map(|r| r.to_proto(now_ms))
            .ok_or_else(|| {
                CommandError::NotFound(format!(
                    "job {:?} (never started since the sim started)",
                    validate::excerpt(job)
                ))
            })
    }

    /// Whether the sim has seen job `job` start.
    pub fn has_job_history(&self, job: &str) -> bool {
        self.chaos.records.contains_key(job)
    }

    pub(super) fn note_start(&mut self, job: &str, role: &str, node: &str, now_ms: i64) {
        let migration = self.migration_for_target(job, role);
        let role = if migration.is_some() {
            JobRole::MigrationTarget
        } else {
            JobRole::Normal
        };
        let migration_id = migration.unwrap_or_default();
        self.chaos
            .records
            .entry(job.to_owned())
            .or_default()
            .note_start(InstanceStart {
                node_id: node.to_owned(),
                role: role as i32,
                migration_id,
                at_ms: now_ms,
            });
        self.note_running(job, now_ms);
    }

    pub(super) fn note_running(&mut self, job: &str, now_ms: i64) {
        let running = self.jobs.get(job).map_or(0, |s| {
            u32::try_from(s.instances.len().saturating_sub(s.starting.len())).unwrap_or(u32::MAX)
        });
        if let Some(r) = self.chaos.records.get_mut(job) {
            r.note_running(running, now_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use manager_proto::api::manager::{CreateAwsNodeRequest, Job};
    use manager_proto::extension::watch_event::Event as Ext;
    use manager_proto::extension::{
        MigrationCutoverRequest, MigrationGetStateRequest, MigrationPrepareTargetRequest,
        WatchEvent,
    };
    use manager_proto::{MigrationPhase as P, MigrationStrategy};

    use super::*;
    use crate::config::SimConfig;
    use crate::published::world::tests_kinds as kinds;

    /// The demo's world with jobs that run as soon as they start, so each fault's timing is
    /// the test's own (the start delay has its test in `world`).
    fn world() -> PublishedWorld {
        let mut config = SimConfig::demo();
        config.timing.job_start_delay_ms = 0;
        PublishedWorld::new(&config, 0)
    }

    /// An aws node `id` in `zone`, created at 0 and running from 1 000.
    fn running(w: &mut PublishedWorld, id: &str, zone: &str) {
        w.create_aws_node(
            &CreateAwsNodeRequest {
                node_id: node_id(id),
                tags: BTreeMap::from([("automanager.norsk.io/zone".to_owned(), zone.to_owned())]),
                region: "eu-west-1".to_owned(),
                instance_type: "m5.xlarge".to_owned(),
                ..Default::default()
            },
            0,
        )
        .expect("created");
        w.advance(1_000);
    }

    fn stored(w: &mut PublishedWorld, id: &str) {
        w.create_job(
            Job {
                job_id: Some(JobId {
                    job_id: id.to_owned(),
                }),
                ..Default::default()
            },
            1_000,
        )
        .expect("stored");
    }

    fn history(w: &PublishedWorld, job: &str) -> Vec<HistoryEntry> {
        w.jobs[job]
            .history
            .iter()
            .filter_map(|e| e.history_entry.clone())
            .collect()
    }

    fn infos(events: &[super::super::EventStreamEvent]) -> Vec<Info> {
        events
            .iter()
            .filter_map(|e| match &e.event {
                Some(Event::JobInfo(i)) => i.message.clone(),
                _ => None,
            })
            .collect()
    }

    fn stopping_reasons(w: &PublishedWorld, job: &str) -> Vec<(String, i32)> {
        history(w, job)
            .into_iter()
            .filter_map(|e| match e {
                HistoryEntry::JobStopping(s) => Some((s.role, s.reason)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_failed_instance_stops_as_failed_with_its_message_and_the_others_run_on() {
        let mut w = world();
        running(&mut w, "n1", "eu-west-1a");
        stored(&mut w, "ns.b/0/enc");
        w.start_job("ns.b/0/enc", "primary", "n1", 1_000)
            .expect("primary");
        w.start_job("ns.b/0/enc", "backup", "onprem-a1", 1_000)
            .expect("backup");
        w.take_events();

        let failed = w
            .fail_job("ns.b/0/enc", "primary", "encoder crashed", 2_000)
            .expect("failed");
        assert_eq!(failed, ["primary"]);
        let events = w.take_events();
        assert_eq!(kinds(&events), ["other", "JobUpdated"]);
        assert!(matches!(
            infos(&events).as_slice(),
            [Info::ContainerEvent(c)] if c.text == "encoder crashed"
        ));
        assert_eq!(
            stopping_reasons(&w, "ns.b/0/enc"),
            [("primary".to_owned(), JOB_STOPPING_JOB_FAILED)]
        );
        assert_eq!(
            w.jobs["ns.b/0/enc"].instances,
            BTreeMap::from([("backup".to_owned(), "onprem-a1".to_owned())])
        );

        // No role: every live instance fails; then there is nothing left to fail.
        assert_eq!(
            w.fail_job("ns.b/0/enc", "", "", 3_000).expect("failed"),
            ["backup"]
        );
        assert!(w.jobs["ns.b/0/enc"].instances.is_empty());
        assert!(matches!(
            w.fail_job("ns.b/0/enc", "", "", 3_000),
            Err(CommandError::FailedPrecondition(_))
        ));
        assert!(matches!(
            w.fail_job("ns.b/0/enc", "primary", "", 3_000),
            Err(CommandError::FailedPrecondition(_))
        ));
        assert!(matches!(
            w.fail_job("ns.other/0/enc", "", "", 3_000),
            Err(CommandError::NotFound(_))
        ));
    }

    #[test]
    fn a_refused_start_is_answered_and_stops_as_failed_before_it_ever_runs() {
        let mut w = world();
        running(&mut w, "n1", "eu-west-1a");
        stored(&mut w, "j");
        w.take_events();
        w.reject_next(1);

        w.start_job("j", "primary", "n1", 1_000)
            .expect("the call is answered");
        let events = w.take_events();
        assert_eq!(kinds(&events), ["other", "JobUpdated"]);
        assert!(matches!(
            infos(&events).as_slice(),
            [Info::ComposeMessage(c)] if c.text == REFUSAL && c.stage == Stage::Start as i32
        ));
        let steps: Vec<&str> = history(&w, "j")
            .iter()
            .map(|e| match e {
                HistoryEntry::JobCreated(_) => "created",
                HistoryEntry::JobProvisioned(_) => "provisioned",
                HistoryEntry::JobRunning(_) => "running",
                HistoryEntry::JobStopping(_) => "stopping",
                HistoryEntry::JobStopped(_) => "stopped",
                _ => "other",
            })
            .collect();
        assert_eq!(steps, ["created", "provisioned", "stopping", "stopped"]);
        assert_eq!(
            stopping_reasons(&w, "j"),
            [("primary".to_owned(), JOB_STOPPING_JOB_FAILED)]
        );
        assert!(w.jobs["j"].instances.is_empty());
        assert!(
            !w.has_job_history("j"),
            "a refused start is not an instance start"
        );

        // Only the next one was refused.
        w.start_job("j", "primary", "n1", 1_100).expect("started");
        assert_eq!(w.jobs["j"].instances.len(), 1);
    }

    #[test]
    fn slow_provision_delays_the_nodes_created_after_it() {
        let mut w = world();
        assert!(matches!(
            w.slow_provision(3_600_001),
            Err(CommandError::InvalidArgument(_))
        ));
        w.slow_provision(5_000).expect("set");
        w.create_aws_node(
            &CreateAwsNodeRequest {
                node_id: node_id("slow"),
                region: "eu-west-1".to_owned(),
                instance_type: "m5.xlarge".to_owned(),
                ..Default::default()
            },
            10_000,
        )
        .expect("created");
        w.take_events();
        w.advance(14_999);
        assert!(w.take_events().is_empty(), "still provisioning");
        w.advance(15_000);
        assert_eq!(kinds(&w.take_events()), ["NodeStarted"]);
    }

    #[test]
    fn a_dead_zone_kills_its_nodes_at_once_and_every_node_that_comes_up_there_until_revived() {
        let mut w = world();
        running(&mut w, "a1", "eu-west-1a");
        running(&mut w, "b1", "eu-west-1b");
        stored(&mut w, "j");
        w.start_job("j", "primary", "a1", 1_000).expect("started");
        // A node still starting in the zone dies too.
        w.create_aws_node(
            &CreateAwsNodeRequest {
                node_id: node_id("a2"),
                tags: BTreeMap::from([(
                    "automanager.norsk.io/zone".to_owned(),
                    "eu-west-1a".to_owned(),
                )]),
                region: "eu-west-1".to_owned(),
                instance_type: "m5.xlarge".to_owned(),
                ..Default::default()
            },
            1_000,
        )
        .expect("created");
        w.take_events();

        let mut killed = w.kill_zone("eu-west-1a", false, 1_100).expect("killed");
        killed.sort();
        assert_eq!(killed, ["a1", "a2"]);
        assert!(!w.has_node("a1") && !w.has_node("a2") && w.has_node("b1"));
        assert_eq!(
            stopping_reasons(&w, "j"),
            [("primary".to_owned(), JOB_STOPPING_NODE_STOPPED)]
        );
        let events = w.take_events();
        assert_eq!(
            kinds(&events)
                .iter()
                .filter(|k| **k == "NodeStopped")
                .count(),
            2
        );

        // A node created there while it is dead dies when it would come up.
        running(&mut w, "a3", "eu-west-1a");
        assert!(!w.has_node("a3"));
        w.kill_zone("eu-west-1a", true, 2_000).expect("revived");
        running(&mut w, "a4", "eu-west-1a");
        assert!(w.has_node("a4"));
        assert!(matches!(
            w.kill_zone("", false, 2_000),
            Err(CommandError::InvalidArgument(_))
        ));
    }

    #[test]
    fn a_partitioned_zone_s_nodes_stop_answering_and_come_back_empty_on_heal() {
        let mut w = world();
        stored(&mut w, "j");
        w.start_job("j", "primary", "onprem-a1", 1_000)
            .expect("started");
        w.take_events();

        let mut cut = w.partition_zone("rack-a", false, 2_000).expect("cut");
        cut.sort();
        assert_eq!(cut, ["onprem-a1", "onprem-a2"]);
        let events = w.take_events();
        assert_eq!(
            kinds(&events),
            [
                "NodeStopping",
                "JobUpdated",
                "NodeStopped",
                "NodeStopping",
                "NodeStopped"
            ]
        );
        assert!(events.iter().all(|e| match &e.event {
            Some(Event::NodeStopping(s)) => s.reason == STOPPING_HEALTH_PING_EXCEEDED,
            _ => true,
        }));
        assert_eq!(
            stopping_reasons(&w, "j"),
            [("primary".to_owned(), JOB_STOPPING_NODE_STOPPED)]
        );
        // Manager has them as stopped: not in a snapshot, nothing starts there.
        let snapshot = w.snapshot();
        assert_eq!(
            kinds(&snapshot)
                .iter()
                .filter(|k| **k == "PhysicalNodeConnected")
                .count(),
            2
        );
        assert!(matches!(
            w.start_job("j", "primary", "onprem-a1", 2_100),
            Err(CommandError::FailedPrecondition(_))
        ));

        let mut back = w.partition_zone("rack-a", true, 3_000).expect("healed");
        back.sort();
        assert_eq!(back, ["onprem-a1", "onprem-a2"]);
        assert_eq!(
            kinds(&w.take_events()),
            ["PhysicalNodeConnected", "PhysicalNodeConnected"]
        );
        w.start_job("j", "primary", "onprem-a1", 3_100)
            .expect("it answers again");
        assert!(
            w.partition_zone("rack-a", true, 3_200)
                .expect("nothing to heal")
                .is_empty()
        );
    }

    /// Job `j` running under `primary` on onprem-a1, and a migration `m` of it proposed with
    /// `strategy`, its asks answered as each job's behaviour says.
    fn propose(w: &mut PublishedWorld, strategy: MigrationStrategy) {
        stored(w, "j");
        w.start_job("j", "primary", "onprem-a1", 1_000)
            .expect("started");
        w.ext_migration_get_state(
            &MigrationGetStateRequest {
                migration_id: "m".to_owned(),
                job_id: Some(JobId {
                    job_id: "j".to_owned(),
                }),
                source_role: "primary".to_owned(),
                strategy: strategy as i32,
            },
            1_000,
        )
        .expect("proposed");
        w.answer_asks(1_000);
    }

    fn prepare_and_cut_over(w: &mut PublishedWorld, now: i64) {
        w.ext_migration_prepare_target(
            &MigrationPrepareTargetRequest {
                migration_id: "m".to_owned(),
                target_node_id: node_id("onprem-b1"),
                target_role: "migration-target".to_owned(),
                initial_state: b"null".to_vec(),
            },
            now,
        )
        .expect("prepared");
        w.answer_asks(now);
        w.ext_migration_cutover(
            &MigrationCutoverRequest {
                migration_id: "m".to_owned(),
                payload: b"null".to_vec(),
            },
            now,
        )
        .expect("cutting over");
        w.answer_asks(now);
    }

    fn migration(w: &PublishedWorld) -> manager_proto::extension::Migration {
        w.ext_migration("m").migration.expect("recorded")
    }

    fn phase(w: &PublishedWorld) -> P {
        P::try_from(migration(w).phase).expect("a phase")
    }

    #[test]
    fn a_job_that_refuses_its_state_ends_the_handover_by_the_source() {
        let mut w = world();
        w.set_migration_behaviour(
            "j",
            JobBehaviour {
                refuse_state: true,
                ..Default::default()
            },
        )
        .expect("set");
        propose(&mut w, MigrationStrategy::Handover);
        assert_eq!(phase(&w), P::Aborted);
        let m = migration(&w);
        assert_eq!(m.aborted_by, MigrationParty::Source as i32);
        assert!(m.abort_reason.contains("refuse-state"), "{m:?}");
    }

    #[test]
    fn a_job_that_aborts_after_giving_its_state_aborts_the_handover() {
        let mut w = world();
        w.set_migration_behaviour(
            "j",
            JobBehaviour {
                abort_at: Some(AbortAt::StateGiven),
                ..Default::default()
            },
        )
        .expect("set");
        propose(&mut w, MigrationStrategy::Handover);
        let m = migration(&w);
        assert_eq!(phase(&w), P::Aborted);
        assert_eq!(m.aborted_by, MigrationParty::Source as i32);
        assert_eq!(m.abort_reason, "simulated abort at state-given");
        assert!(!m.source_state.is_empty(), "the state was given first");
    }

    #[test]
    fn a_slow_cutover_completes_only_when_its_time_comes_and_failed_participants_are_reported() {
        let mut w = world();
        w.set_migration_behaviour(
            "j",
            JobBehaviour {
                cutover_delay_ms: 700,
                fail_participants: vec!["output".to_owned()],
                ..Default::default()
            },
        )
        .expect("set");
        propose(&mut w, MigrationStrategy::Handover);
        prepare_and_cut_over(&mut w, 1_000);
        assert_eq!(phase(&w), P::CuttingOver);
        assert_eq!(w.next_due_ms(), Some(1_700));
        w.advance(1_699);
        assert_eq!(phase(&w), P::CuttingOver);
        w.advance(1_700);
        assert_eq!(phase(&w), P::Completed);
        let m = migration(&w);
        assert_eq!(m.applied, ["input"]);
        assert!(matches!(m.failed.as_slice(), [f] if f.id == "output"));
        assert_eq!(
            w.jobs["j"].instances,
            BTreeMap::from([("primary".to_owned(), "onprem-b1".to_owned())])
        );
        let ext: Vec<WatchEvent> = w.take_ext_events();
        assert!(
            ext.iter()
                .any(|e| matches!(&e.event, Some(Ext::Migration(_))))
        );
    }

    #[test]
    fn a_configured_rule_scripts_the_jobs_it_matches_until_an_override() {
        let mut w = world();
        w.set_behaviour_rules(vec![crate::behaviour::BehaviourRule::new(
            "j*",
            JobBehaviour {
                refuse_state: true,
                ..Default::default()
            },
        )]);
        propose(&mut w, MigrationStrategy::Handover);
        assert_eq!(phase(&w), P::Aborted, "the rule refused the state");

        let mut w = world();
        w.set_behaviour_rules(vec![crate::behaviour::BehaviourRule::new(
            "j*",
            JobBehaviour {
                refuse_state: true,
                ..Default::default()
            },
        )]);
        w.set_migration_behaviour("j", JobBehaviour::default())
            .expect("set");
        propose(&mut w, MigrationStrategy::Handover);
        assert_eq!(phase(&w), P::StateReceived, "the override wins");
    }

    #[test]
    fn a_handover_touching_a_node_without_a_job_socket_listener_aborts_by_that_side() {
        let tag = |w: &PublishedWorld| {
            w.nodes["onprem-a1"]
                .meta
                .tags
                .get("automanager.norsk.io/capabilities")
                .cloned()
                .unwrap_or_default()
        };
        assert!(tag(&world()).contains(manager_proto::JOB_SOCKET_CAPABILITY));
        let mut config = SimConfig::demo();
        for p in &mut config.pools {
            if p.name == "onprem" {
                p.job_socket = false;
            }
        }
        let mut w = PublishedWorld::new(&config, 0);
        assert!(!tag(&w).contains(manager_proto::JOB_SOCKET_CAPABILITY));
        propose(&mut w, MigrationStrategy::Handover);
        assert_eq!(phase(&w), P::Aborted);
        let m = migration(&w);
        assert_eq!(m.aborted_by, MigrationParty::Source as i32);
        assert!(m.abort_reason.contains("no job socket listener"), "{m:?}");
    }

    #[test]
    fn a_cooperative_handover_reports_every_participant_applied() {
        let mut w = world();
        propose(&mut w, MigrationStrategy::Handover);
        prepare_and_cut_over(&mut w, 1_000);
        assert_eq!(phase(&w), P::Completed);
        let m = migration(&w);
        assert_eq!(m.applied, PARTICIPANTS);
        assert!(m.failed.is_empty());
    }

    #[test]
    fn an_abort_while_the_cutover_is_slow_drops_the_late_answer() {
        let mut w = world();
        w.set_migration_behaviour(
            "j",
            JobBehaviour {
                cutover_delay_ms: 700,
                ..Default::default()
            },
        )
        .expect("set");
        propose(&mut w, MigrationStrategy::Handover);
        prepare_and_cut_over(&mut w, 1_000);
        w.ext_migration_abort(
            &manager_proto::extension::MigrationAbortRequest {
                migration_id: "m".to_owned(),
                reason: "operator gave up".to_owned(),
            },
            1_200,
        )
        .expect("aborted");
        w.advance(2_000);
        assert_eq!(phase(&w), P::Aborted);
        assert_eq!(
            w.jobs["j"].instances,
            BTreeMap::from([("primary".to_owned(), "onprem-a1".to_owned())])
        );
    }

    #[test]
    fn a_job_s_history_counts_its_starts_by_role_and_the_time_it_had_none_running() {
        let mut w = world();
        assert!(matches!(
            w.job_history("j", 0),
            Err(CommandError::NotFound(_))
        ));
        propose(&mut w, MigrationStrategy::Overlap);
        prepare_and_cut_over(&mut w, 1_500);
        assert_eq!(phase(&w), P::Completed);
        w.kill_node("onprem-b1", 2_000).expect("killed");
        w.start_job("j", "primary", "onprem-a2", 2_600)
            .expect("restarted");
        let h = w.job_history("j", 3_000).expect("seen");
        let starts: Vec<(&str, i32, &str, i64)> = h
            .starts
            .iter()
            .map(|s| (s.node_id.as_str(), s.role, s.migration_id.as_str(), s.at_ms))
            .collect();
        assert_eq!(
            starts,
            [
                ("onprem-a1", JobRole::Normal as i32, "", 1_000),
                ("onprem-b1", JobRole::MigrationTarget as i32, "m", 1_500),
                ("onprem-a2", JobRole::Normal as i32, "", 2_600),
            ]
        );
        assert_eq!(h.gaps, 1);
        assert_eq!(h.uncovered_ms, 600);
        assert_eq!(h.max_running, 2, "source and target overlapped");
        assert_eq!(h.running, 1);
    }
}
