//! The mirror of Manager's published event stream (`norsk.api.manager.Manager/EventStream`): its
//! nodes, jobs and their instances, and the pure rules that keep it.
//!
//! The published stream has no revisions, resume points or heartbeats: every connection opens
//! with a snapshot (any events, closed by `InitialDataComplete`), then live changes. So a
//! reconnect rebuilds the mirror from that snapshot in a [`SnapshotBuilder`] and
//! [`PublishedMirror::replace`] reports only what differs from what was held: a reconnect that
//! finds nothing changed yields no change at all, so nothing downstream acts on it.

use std::collections::BTreeMap;

use manager_proto::api::common::{
    ActiveJobKey, JobInfoMessage, NodeId, NodeMetadata, RunningNodeMetadata,
};
use manager_proto::api::manager::event_stream_event::Event;
use manager_proto::api::manager::job_history_entry::HistoryEntry;
use manager_proto::api::manager::{
    EventStreamEvent, Job, JobHistoryEntry, JobWithHistory, ProviderHealth, RunningJob,
};

/// Where a node is in its life, as the stream last said.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeState {
    /// Created, not yet running.
    Starting,
    /// Running (NodeStarted, or a NodeRunning of the snapshot).
    Running,
    /// Being stopped; the reason is in [`NodeView::stopping_reason`].
    Stopping,
}

/// A node as the mirror holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    /// The node's id (the caller chose it at creation, or the machine's own for a physical node).
    pub node_id: String,
    /// A physical node that connected to Manager (not created through it).
    pub physical: bool,
    /// The node's tags: those set at creation, or a physical node's own.
    pub tags: BTreeMap<String, String>,
    /// Where the node is in its life.
    pub state: NodeState,
    /// What Manager knows from the node's creation.
    pub metadata: Option<NodeMetadata>,
    /// Addresses and instance id, once it runs.
    pub running: Option<RunningNodeMetadata>,
    /// `NodeStopping.Reason`, while stopping.
    pub stopping_reason: Option<i32>,
}

/// An instance of a job: the job and the role it runs under.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InstanceKey {
    /// The job.
    pub job_id: String,
    /// The free-text role.
    pub role: String,
}

/// Where an instance is, from its job's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum InstancePhase {
    /// A node was provisioned for it.
    Provisioned,
    /// Running.
    Running,
    /// Being stopped.
    Stopping,
    /// Stopped.
    Stopped,
}

/// One role of a job, from its history: the latest step and the node it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstanceView {
    /// The role.
    pub role: String,
    /// The node the latest step names (empty if it named none).
    pub node_id: String,
    /// The latest step.
    pub phase: InstancePhase,
    /// When the latest step happened, in Unix milliseconds (0 when the entry had no time).
    pub at_ms: i64,
    /// `JobHistoryJobStopping.Reason` of the instance's last stop, kept through `JobStopped`.
    pub stop_reason: Option<i32>,
    /// Whether it ran (`JobRunning`) since its latest start (`JobProvisioned`).
    pub ran: bool,
}

/// How the stream last reported a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobListing {
    /// `JobActive`, or `JobUpdated`.
    Active,
    /// `JobPending`: its start time is ahead, within the stream's pending window.
    Pending,
    /// `JobOutOfWindow`: pending beyond the window.
    OutOfWindow,
}

/// A stored job as the mirror holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct JobView {
    /// The job's definition, tags included.
    pub job: Job,
    /// Its history, as last sent.
    pub history: Vec<JobHistoryEntry>,
    /// How it was last listed.
    pub listing: JobListing,
    /// Each role's latest step, by role.
    pub instances: BTreeMap<String, InstanceView>,
    /// The history ends with `JobCompleted`.
    pub completed: bool,
}

impl JobView {
    /// The job's id.
    pub fn job_id(&self) -> &str {
        job_id_of(&self.job)
    }

    /// The job's tags.
    pub fn tags(&self) -> &BTreeMap<String, String> {
        &self.job.tags
    }

    /// The roles running (or provisioned) and the node each is on.
    pub fn live_instances(&self) -> impl Iterator<Item = &InstanceView> {
        self.instances
            .values()
            .filter(|i| matches!(i.phase, InstancePhase::Provisioned | InstancePhase::Running))
    }
}

/// One thing that changed in the mirror. Upserts carry the new view; removals the last one.
#[derive(Debug, Clone, PartialEq)]
pub enum PublishedChange {
    /// A node appeared or changed.
    NodeUpserted(NodeView),
    /// A node stopped (live), or is gone from a new snapshot.
    NodeRemoved(NodeView),
    /// A job appeared or changed.
    JobUpserted(JobView),
    /// A job was deleted (live), or is gone from a new snapshot.
    JobRemoved(JobView),
    /// The providers' health changed.
    ProviderHealth(Vec<ProviderHealth>),
    /// A note from a running instance (not stored).
    JobInfo(JobInfoMessage),
    /// Our extension: a node's power state changed (powering off, off, starting from off; a
    /// `RUNNING` or `TERMINATED` one is no longer warm).
    NodePower(manager_proto::extension::NodePower),
    /// Our extension: a node will be reclaimed.
    ReclaimNotice(manager_proto::extension::ReclaimNotice),
    /// Our extension: a migration's new phase.
    Migration(manager_proto::extension::Migration),
    /// A new snapshot was read (after a connect or a reconnect); the changes before this one
    /// were its differences to what the mirror held.
    Resynced,
}

/// An event the mirror could not use, with why; the rest of the stream goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    /// The event carried no payload (an event type newer than this build, or an empty message).
    #[error("an event with no payload (a newer event type?)")]
    Empty,
    /// An id the event must carry is empty or missing.
    #[error("{0} without an id")]
    MissingId(&'static str),
}

/// Nodes, jobs and provider health, as the stream has told them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PublishedMirror {
    /// Nodes by id: starting, running or stopping (a stopped node is removed).
    pub nodes: BTreeMap<String, NodeView>,
    /// Jobs by id (a deleted job is removed).
    pub jobs: BTreeMap<String, JobView>,
    /// The providers' health, from `InitialDataComplete` and later changes.
    pub health: Vec<ProviderHealth>,
}

/// Collects one connection's snapshot: every event before `InitialDataComplete`.
#[derive(Debug, Default)]
pub struct SnapshotBuilder {
    staging: PublishedMirror,
    malformed: Vec<Malformed>,
}

/// What a snapshot event did to the builder.
#[derive(Debug)]
pub enum SnapshotStep {
    /// More snapshot to come.
    Collecting,
    /// `InitialDataComplete`: the snapshot is whole.
    Complete(PublishedMirror),
}

impl SnapshotBuilder {
    /// Takes one event of the snapshot.
    pub fn push(&mut self, event: EventStreamEvent) -> SnapshotStep {
        if let Some(Event::InitialDataComplete(done)) = event.event {
            let mut mirror = std::mem::take(&mut self.staging);
            mirror.health = done.health;
            return SnapshotStep::Complete(mirror);
        }
        if let Err(e) = self.staging.apply(event) {
            self.malformed.push(e);
        }
        SnapshotStep::Collecting
    }

    /// The snapshot's events the mirror could not use.
    pub fn malformed(&self) -> &[Malformed] {
        &self.malformed
    }
}

fn id_of(id: Option<&NodeId>) -> &str {
    id.map_or("", |n| n.node_id.as_str())
}

fn job_id_of(job: &Job) -> &str {
    job.job_id.as_ref().map_or("", |j| j.job_id.as_str())
}

/// Each role's latest step in `history`, and whether the job completed.
pub fn instances_of(history: &[JobHistoryEntry]) -> (BTreeMap<String, InstanceView>, bool) {
    let mut out: BTreeMap<String, InstanceView> = BTreeMap::new();
    let mut completed = false;
    for entry in history {
        let (role, meta, phase, at, reason) = match &entry.history_entry {
            Some(HistoryEntry::JobProvisioned(e)) => (
                &e.role,
                e.node_metadata.as_ref(),
                InstancePhase::Provisioned,
                e.timestamp.as_ref(),
                None,
            ),
            Some(HistoryEntry::JobRunning(e)) => (
                &e.role,
                e.node_metadata.as_ref(),
                InstancePhase::Running,
                e.timestamp.as_ref(),
                None,
            ),
            Some(HistoryEntry::JobStopping(e)) => (
                &e.role,
                e.node_metadata.as_ref(),
                InstancePhase::Stopping,
                e.timestamp.as_ref(),
                Some(e.reason),
            ),
            Some(HistoryEntry::JobStopped(e)) => (
                &e.role,
                e.node_metadata.as_ref(),
                InstancePhase::Stopped,
                e.timestamp.as_ref(),
                None,
            ),
            Some(HistoryEntry::JobCompleted(_)) => {
                completed = true;
                continue;
            }
            _ => continue,
        };
        let node_id = id_of(meta.and_then(|m| m.node_id.as_ref())).to_owned();
        // A stop's reason outlives the `JobStopped` that ends it; a new start clears it.
        let stop_reason = match phase {
            InstancePhase::Stopping => reason,
            InstancePhase::Stopped => out.get(role).and_then(|i| i.stop_reason),
            InstancePhase::Provisioned | InstancePhase::Running => None,
        };
        let ran = match phase {
            InstancePhase::Provisioned => false,
            InstancePhase::Running => true,
            InstancePhase::Stopping | InstancePhase::Stopped => {
                out.get(role).is_some_and(|i| i.ran)
            }
        };
        out.insert(
            role.clone(),
            InstanceView {
                role: role.clone(),
                node_id,
                phase,
                at_ms: at.map_or(0, timestamp_ms),
                stop_reason,
                ran,
            },
        );
    }
    (out, completed)
}

/// A protobuf time as Unix milliseconds (saturating; out-of-range nanos count as none).
pub fn timestamp_ms(t: &prost_types::Timestamp) -> i64 {
    let nanos = i64::from(t.nanos.clamp(0, 999_999_999));
    t.seconds
        .saturating_mul(1000)
        .saturating_add(nanos / 1_000_000)
}

fn job_view(jwh: JobWithHistory, listing: JobListing) -> Result<JobView, Malformed> {
    let job = jwh.job.ok_or(Malformed::MissingId("a job"))?;
    if job_id_of(&job).is_empty() {
        return Err(Malformed::MissingId("a job"));
    }
    let (instances, completed) = instances_of(&jwh.history_entry);
    Ok(JobView {
        job,
        history: jwh.history_entry,
        listing,
        instances,
        completed,
    })
}

impl PublishedMirror {
    /// Applies one live event; returns what changed (nothing when the event restates what the
    /// mirror holds). `InitialDataComplete` outside a snapshot only updates provider health.
    pub fn apply(&mut self, event: EventStreamEvent) -> Result<Vec<PublishedChange>, Malformed> {
        let event = event.event.ok_or(Malformed::Empty)?;
        Ok(match event {
            Event::NodeRunning(n) => {
                let meta = n.node_metadata.ok_or(Malformed::MissingId("NodeRunning"))?;
                let mut view = self.node_from(meta, false)?;
                view.state = NodeState::Running;
                view.running = n.running_node_metadata;
                // The instances it lists are the jobs' too (their histories, sent as JobActive);
                // the mirror keeps them once, on the jobs, so the live path (NodeStarted, which
                // lists none) and the snapshot path agree.
                self.upsert_node(view)
            }
            Event::PhysicalNodeConnected(p) => {
                let node = p
                    .node
                    .ok_or(Malformed::MissingId("PhysicalNodeConnected"))?;
                if node.id.is_empty() {
                    return Err(Malformed::MissingId("PhysicalNodeConnected"));
                }
                let view = NodeView {
                    node_id: node.id.clone(),
                    physical: true,
                    tags: node.tags.clone(),
                    state: NodeState::Running,
                    metadata: None,
                    running: None,
                    stopping_reason: None,
                };
                self.upsert_node(view)
            }
            Event::NodeStarting(n) => {
                let meta = n
                    .node_metadata
                    .ok_or(Malformed::MissingId("NodeStarting"))?;
                let mut view = self.node_from(meta, false)?;
                // A node that starts (again) runs nothing yet.
                view.state = NodeState::Starting;
                view.running = None;
                self.upsert_node(view)
            }
            Event::NodeStarted(n) => {
                let meta = n.node_metadata.ok_or(Malformed::MissingId("NodeStarted"))?;
                let mut view = self.node_from(meta, false)?;
                view.state = NodeState::Running;
                view.running = n.running_node_metadata;
                self.upsert_node(view)
            }
            Event::NodeStopping(n) => {
                let id = id_of(n.node_id.as_ref()).to_owned();
                if id.is_empty() {
                    return Err(Malformed::MissingId("NodeStopping"));
                }
                match self.nodes.get(&id).cloned() {
                    Some(mut view) => {
                        view.state = NodeState::Stopping;
                        view.stopping_reason = Some(n.reason);
                        self.upsert_node(view)
                    }
                    // Stopping a node this mirror never saw: nothing to hold.
                    None => Vec::new(),
                }
            }
            Event::NodeStopped(n) => {
                let id = id_of(n.node_id.as_ref());
                if id.is_empty() {
                    return Err(Malformed::MissingId("NodeStopped"));
                }
                self.nodes
                    .remove(id)
                    .map(PublishedChange::NodeRemoved)
                    .into_iter()
                    .collect()
            }
            Event::JobActive(j) => self.upsert_job(j.job_with_history, JobListing::Active)?,
            Event::JobUpdated(j) => self.upsert_job(j.job_with_history, JobListing::Active)?,
            Event::JobPending(j) => self.upsert_job(j.job_with_history, JobListing::Pending)?,
            Event::JobOutOfWindow(j) => {
                self.upsert_job(j.job_with_history, JobListing::OutOfWindow)?
            }
            Event::JobDeleted(d) => {
                let id = d.job_id.map(|j| j.job_id).unwrap_or_default();
                if id.is_empty() {
                    return Err(Malformed::MissingId("JobDeleted"));
                }
                self.jobs
                    .remove(&id)
                    .map(PublishedChange::JobRemoved)
                    .into_iter()
                    .collect()
            }
            Event::InitialDataComplete(done) => self.set_health(done.health),
            Event::ProviderHealthChange(h) => {
                // One provider's health replaces that provider's entry.
                let mut health = self.health.clone();
                let same = |x: &ProviderHealth| {
                    std::mem::discriminant(&x.health) == std::mem::discriminant(&h.health)
                };
                health.retain(|x| !same(x));
                health.push(h);
                self.set_health(health)
            }
            Event::JobInfo(info) => vec![PublishedChange::JobInfo(info)],
        })
    }

    /// Replaces the mirror with `next` (a whole snapshot) and returns the differences: nodes and
    /// jobs that appeared, changed or are gone, and the health if it changed. An unchanged
    /// snapshot returns nothing.
    pub fn replace(&mut self, next: PublishedMirror) -> Vec<PublishedChange> {
        let mut changes = Vec::new();
        for (id, old) in &self.nodes {
            if !next.nodes.contains_key(id) {
                changes.push(PublishedChange::NodeRemoved(old.clone()));
            }
        }
        for (id, new) in &next.nodes {
            if self.nodes.get(id) != Some(new) {
                changes.push(PublishedChange::NodeUpserted(new.clone()));
            }
        }
        for (id, old) in &self.jobs {
            if !next.jobs.contains_key(id) {
                changes.push(PublishedChange::JobRemoved(old.clone()));
            }
        }
        for (id, new) in &next.jobs {
            if self.jobs.get(id) != Some(new) {
                changes.push(PublishedChange::JobUpserted(new.clone()));
            }
        }
        if self.health != next.health {
            changes.push(PublishedChange::ProviderHealth(next.health.clone()));
        }
        *self = next;
        changes
    }

    /// The events a Manager holding this mirror's state would send as a snapshot (nodes, then
    /// jobs, then `InitialDataComplete`); a fresh [`SnapshotBuilder`] fed them rebuilds an equal
    /// mirror. Used by tests and by fakes that serve a mirror.
    pub fn snapshot_events(&self) -> Vec<EventStreamEvent> {
        use manager_proto::api::manager::{
            InitialDataComplete, JobActive, JobOutOfWindow, JobPending, NodeRunning, NodeStarting,
            PhysicalNode, PhysicalNodeConnected,
        };
        let running_jobs = |v: &NodeView| -> Vec<RunningJob> {
            self.instances_on(&v.node_id)
                .into_iter()
                .map(|k| RunningJob {
                    job_key: Some(ActiveJobKey {
                        job_id: Some(manager_proto::api::common::JobId { job_id: k.job_id }),
                        role: k.role,
                    }),
                    node_id: Some(NodeId {
                        node_id: v.node_id.clone(),
                    }),
                })
                .collect()
        };
        let mut out = Vec::new();
        for v in self.nodes.values() {
            let event = if v.physical {
                Event::PhysicalNodeConnected(PhysicalNodeConnected {
                    node: Some(PhysicalNode {
                        id: v.node_id.clone(),
                        tags: v.tags.clone(),
                        ip_address: String::new(),
                    }),
                    instances: running_jobs(v),
                })
            } else if v.state == NodeState::Starting {
                Event::NodeStarting(NodeStarting {
                    node_metadata: v.metadata.clone(),
                })
            } else {
                Event::NodeRunning(NodeRunning {
                    node_metadata: v.metadata.clone(),
                    running_node_metadata: v.running.clone(),
                    instances: running_jobs(v),
                })
            };
            out.push(EventStreamEvent { event: Some(event) });
            if v.state == NodeState::Stopping {
                out.push(EventStreamEvent {
                    event: Some(Event::NodeStopping(
                        manager_proto::api::manager::NodeStopping {
                            node_id: Some(NodeId {
                                node_id: v.node_id.clone(),
                            }),
                            reason: v.stopping_reason.unwrap_or_default(),
                        },
                    )),
                });
            }
        }
        for j in self.jobs.values() {
            let jwh = Some(JobWithHistory {
                job: Some(j.job.clone()),
                history_entry: j.history.clone(),
            });
            let event = match j.listing {
                JobListing::Active => Event::JobActive(JobActive {
                    job_with_history: jwh,
                }),
                JobListing::Pending => Event::JobPending(JobPending {
                    job_with_history: jwh,
                }),
                JobListing::OutOfWindow => Event::JobOutOfWindow(JobOutOfWindow {
                    job_with_history: jwh,
                }),
            };
            out.push(EventStreamEvent { event: Some(event) });
        }
        out.push(EventStreamEvent {
            event: Some(Event::InitialDataComplete(InitialDataComplete {
                health: self.health.clone(),
            })),
        });
        out
    }

    /// The instances running (or provisioned) on `node_id`, from the jobs' histories.
    pub fn instances_on(&self, node_id: &str) -> Vec<InstanceKey> {
        self.jobs
            .values()
            .flat_map(|j| {
                j.live_instances()
                    .filter(|i| i.node_id == node_id)
                    .map(|i| InstanceKey {
                        job_id: j.job_id().to_owned(),
                        role: i.role.clone(),
                    })
            })
            .collect()
    }

    /// The node an event's metadata names, starting from what the mirror holds of it.
    fn node_from(&self, meta: NodeMetadata, physical: bool) -> Result<NodeView, Malformed> {
        let id = id_of(meta.node_id.as_ref()).to_owned();
        if id.is_empty() {
            return Err(Malformed::MissingId("a node event"));
        }
        let mut view = self.nodes.get(&id).cloned().unwrap_or(NodeView {
            node_id: id,
            physical,
            tags: BTreeMap::new(),
            state: NodeState::Starting,
            metadata: None,
            running: None,
            stopping_reason: None,
        });
        view.tags = meta.tags.clone();
        view.metadata = Some(meta);
        view.stopping_reason = None;
        Ok(view)
    }

    fn upsert_node(&mut self, view: NodeView) -> Vec<PublishedChange> {
        if self.nodes.get(&view.node_id) == Some(&view) {
            return Vec::new();
        }
        self.nodes.insert(view.node_id.clone(), view.clone());
        vec![PublishedChange::NodeUpserted(view)]
    }

    fn upsert_job(
        &mut self,
        jwh: Option<JobWithHistory>,
        listing: JobListing,
    ) -> Result<Vec<PublishedChange>, Malformed> {
        let view = job_view(jwh.ok_or(Malformed::MissingId("a job event"))?, listing)?;
        if self.jobs.get(view.job_id()) == Some(&view) {
            return Ok(Vec::new());
        }
        self.jobs.insert(view.job_id().to_owned(), view.clone());
        Ok(vec![PublishedChange::JobUpserted(view)])
    }

    fn set_health(&mut self, health: Vec<ProviderHealth>) -> Vec<PublishedChange> {
        if self.health == health {
            return Vec::new();
        }
        self.health = health.clone();
        vec![PublishedChange::ProviderHealth(health)]
    }
}

#[cfg(test)]
mod tests {
    use manager_proto::api::common::{JobId, NodeMetadata};
    use manager_proto::api::manager::{
        JobActive, JobDeleted, JobHistoryJobRunning, JobHistoryJobStopped, JobPending, JobUpdated,
        NodeRunning, NodeStarted, NodeStarting, NodeStopped, NodeStopping, PhysicalNode,
        PhysicalNodeConnected,
    };
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn ev(e: Event) -> EventStreamEvent {
        EventStreamEvent { event: Some(e) }
    }

    fn meta(node: &str, pool: &str) -> NodeMetadata {
        NodeMetadata {
            node_id: Some(NodeId {
                node_id: node.to_owned(),
            }),
            tags: BTreeMap::from([("pool".to_owned(), pool.to_owned())]),
            ..Default::default()
        }
    }

    fn job(id: &str, history: Vec<(&str, &str, bool)>) -> Option<JobWithHistory> {
        let history_entry = history
            .into_iter()
            .map(|(role, node, running)| {
                let node_metadata = Some(meta(node, "p"));
                let role = role.to_owned();
                JobHistoryEntry {
                    history_entry: Some(if running {
                        HistoryEntry::JobRunning(JobHistoryJobRunning {
                            role,
                            node_metadata,
                            ..Default::default()
                        })
                    } else {
                        HistoryEntry::JobStopped(JobHistoryJobStopped {
                            role,
                            node_metadata,
                            ..Default::default()
                        })
                    }),
                }
            })
            .collect();
        Some(JobWithHistory {
            job: Some(Job {
                job_id: Some(JobId {
                    job_id: id.to_owned(),
                }),
                tags: BTreeMap::from([("owner".to_owned(), "us".to_owned())]),
                ..Default::default()
            }),
            history_entry,
        })
    }

    /// A small event language over three nodes, three jobs and two roles.
    fn arb_event() -> impl Strategy<Value = EventStreamEvent> {
        let node = prop::sample::select(vec!["n1", "n2", "n3"]);
        let pool = prop::sample::select(vec!["a", "b"]);
        let job_id = prop::sample::select(vec!["j1", "j2", "j3"]);
        let step = (
            prop::sample::select(vec!["primary", "backup"]),
            prop::sample::select(vec!["n1", "n2", "n3"]),
            any::<bool>(),
        );
        prop_oneof![
            (node.clone(), pool.clone()).prop_map(|(n, p)| ev(Event::NodeStarting(NodeStarting {
                node_metadata: Some(meta(n, p))
            }))),
            (node.clone(), pool.clone()).prop_map(|(n, p)| ev(Event::NodeStarted(NodeStarted {
                node_metadata: Some(meta(n, p)),
                running_node_metadata: None
            }))),
            (
                node.clone(),
                pool,
                prop::collection::vec(job_id.clone(), 0..3)
            )
                .prop_map(|(n, p, jobs)| ev(Event::NodeRunning(NodeRunning {
                    node_metadata: Some(meta(n, p)),
                    running_node_metadata: None,
                    instances: jobs
                        .into_iter()
                        .map(|j| RunningJob {
                            job_key: Some(ActiveJobKey {
                                job_id: Some(JobId {
                                    job_id: j.to_owned()
                                }),
                                role: "primary".to_owned()
                            }),
                            node_id: Some(NodeId {
                                node_id: n.to_owned()
                            }),
                        })
                        .collect(),
                }))),
            (node.clone(), 0..3i32).prop_map(|(n, reason)| ev(Event::NodeStopping(NodeStopping {
                node_id: Some(NodeId {
                    node_id: n.to_owned()
                }),
                reason
            }))),
            node.clone()
                .prop_map(|n| ev(Event::NodeStopped(NodeStopped {
                    node_id: Some(NodeId {
                        node_id: n.to_owned()
                    })
                }))),
            node.prop_map(|n| ev(Event::PhysicalNodeConnected(PhysicalNodeConnected {
                node: Some(PhysicalNode {
                    id: format!("phys-{n}"),
                    ..Default::default()
                }),
                instances: Vec::new(),
            }))),
            (job_id.clone(), prop::collection::vec(step.clone(), 0..4)).prop_map(|(j, h)| ev(
                Event::JobActive(JobActive {
                    job_with_history: job(j, h)
                })
            )),
            (job_id.clone(), prop::collection::vec(step.clone(), 0..4)).prop_map(|(j, h)| ev(
                Event::JobUpdated(JobUpdated {
                    job_with_history: job(j, h)
                })
            )),
            (job_id.clone(), prop::collection::vec(step, 0..2)).prop_map(|(j, h)| ev(
                Event::JobPending(JobPending {
                    job_with_history: job(j, h)
                })
            )),
            job_id.prop_map(|j| ev(Event::JobDeleted(JobDeleted {
                job_id: Some(JobId {
                    job_id: j.to_owned()
                })
            }))),
        ]
    }

    fn mirror_of(events: Vec<EventStreamEvent>) -> PublishedMirror {
        let mut m = PublishedMirror::default();
        for e in events {
            m.apply(e).expect("well-formed");
        }
        m
    }

    fn rebuilt(m: &PublishedMirror) -> PublishedMirror {
        let mut b = SnapshotBuilder::default();
        for e in m.snapshot_events() {
            if let SnapshotStep::Complete(m) = b.push(e) {
                assert!(b.malformed().is_empty(), "{:?}", b.malformed());
                return m;
            }
        }
        panic!("a snapshot without InitialDataComplete");
    }

    proptest! {
        /// A reconnect to an unchanged Manager: the rebuilt mirror equals the one held, and
        /// replacing reports no change, so nothing acts on the reconnect.
        #[test]
        fn a_reconnect_to_an_unchanged_manager_changes_nothing(
            events in prop::collection::vec(arb_event(), 0..40)
        ) {
            let mut held = mirror_of(events);
            let again = rebuilt(&held);
            prop_assert_eq!(&again, &held);
            prop_assert_eq!(held.replace(again), Vec::new());
        }

        /// A reconnect to a changed Manager: afterwards the mirror is the new snapshot, and the
        /// changes name exactly the nodes and jobs that differ.
        #[test]
        fn a_reconnect_reports_exactly_the_differences(
            before in prop::collection::vec(arb_event(), 0..30),
            after in prop::collection::vec(arb_event(), 0..30),
        ) {
            let mut held = mirror_of(before);
            let next = rebuilt(&mirror_of(after));
            let mut expected: BTreeSet<String> = BTreeSet::new();
            for id in held.nodes.keys().chain(next.nodes.keys()) {
                if held.nodes.get(id) != next.nodes.get(id) {
                    expected.insert(format!("node {id}"));
                }
            }
            for id in held.jobs.keys().chain(next.jobs.keys()) {
                if held.jobs.get(id) != next.jobs.get(id) {
                    expected.insert(format!("job {id}"));
                }
            }
            let changes = held.replace(next.clone());
            let named: BTreeSet<String> = changes
                .iter()
                .filter_map(|c| match c {
                    PublishedChange::NodeUpserted(n) | PublishedChange::NodeRemoved(n) => {
                        Some(format!("node {}", n.node_id))
                    }
                    PublishedChange::JobUpserted(j) | PublishedChange::JobRemoved(j) => {
                        Some(format!("job {}", j.job_id()))
                    }
                    _ => None,
                })
                .collect();
            prop_assert_eq!(named.len(), changes.iter().filter(|c| !matches!(c, PublishedChange::ProviderHealth(_))).count());
            prop_assert_eq!(named, expected);
            prop_assert_eq!(held, next);
        }

        /// Restating what the mirror holds changes nothing.
        #[test]
        fn a_repeated_event_changes_nothing(
            events in prop::collection::vec(arb_event(), 1..30)
        ) {
            let mut m = PublishedMirror::default();
            for e in events {
                m.apply(e.clone()).expect("well-formed");
                let again = m.apply(e.clone()).expect("well-formed");
                // A job-info note is transient and is reported each time.
                let transient = matches!(e.event, Some(Event::JobInfo(_)));
                prop_assert!(transient || again.is_empty(), "{:?} -> {:?}", e, again);
            }
        }
    }

    #[test]
    fn instances_come_from_each_roles_latest_step() {
        let mut m = PublishedMirror::default();
        m.apply(ev(Event::JobActive(JobActive {
            job_with_history: job(
                "j1",
                vec![
                    ("primary", "n1", true),
                    ("backup", "n2", true),
                    ("primary", "n1", false),
                    ("primary", "n3", true),
                ],
            ),
        })))
        .expect("well-formed");
        let live: Vec<(String, String)> = m.jobs["j1"]
            .live_instances()
            .map(|i| (i.role.clone(), i.node_id.clone()))
            .collect();
        assert_eq!(
            live,
            vec![
                ("backup".to_owned(), "n2".to_owned()),
                ("primary".to_owned(), "n3".to_owned())
            ]
        );
    }

    #[test]
    fn a_malformed_event_is_refused_with_why_and_changes_nothing() {
        let mut m = PublishedMirror::default();
        assert_eq!(
            m.apply(EventStreamEvent { event: None }),
            Err(Malformed::Empty)
        );
        assert_eq!(
            m.apply(ev(Event::NodeStarted(NodeStarted::default()))),
            Err(Malformed::MissingId("NodeStarted"))
        );
        assert_eq!(
            m.apply(ev(Event::JobActive(JobActive {
                job_with_history: Some(JobWithHistory::default())
            }))),
            Err(Malformed::MissingId("a job"))
        );
        assert_eq!(m, PublishedMirror::default());
    }

    #[test]
    fn a_stopped_node_leaves_the_mirror() {
        let mut m = PublishedMirror::default();
        m.apply(ev(Event::NodeStarted(NodeStarted {
            node_metadata: Some(meta("n1", "a")),
            running_node_metadata: None,
        })))
        .expect("well-formed");
        let changes = m
            .apply(ev(Event::NodeStopped(NodeStopped {
                node_id: Some(NodeId {
                    node_id: "n1".to_owned(),
                }),
            })))
            .expect("well-formed");
        assert!(matches!(&changes[..], [PublishedChange::NodeRemoved(n)] if n.node_id == "n1"));
        assert!(m.nodes.is_empty());
    }
}
