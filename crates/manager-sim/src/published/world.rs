//! The published API's world: nodes under ids their callers chose, stored jobs, and instances of
//! them under free-text roles. Pure: every command takes the time and queues the events a
//! Manager would send on `EventStream`; [`PublishedWorld::take_events`] hands them out.
//!
//! What it simulates of the providers comes from the sim's pools: `CreateAwsNode` must name a
//! region and instance type an `aws` pool offers, `CreateOciNode` a shape (an instance type) and
//! availability domain (a zone) of an `oci` pool; the node starts after the pool's provisioning
//! delay. The nodes of `cluster` pools are physical nodes that connected at start. 1.0.384 jobs
//! carry no requirements, so nothing here checks capacity.

use std::collections::BTreeMap;

use manager_proto::api::common::provider_metadata::Metadata;
use manager_proto::api::common::running_node_provider_metadata::Instance;
use manager_proto::api::common::{
    ActiveJobKey, AwsMetadata, JobId, NodeId, NodeMetadata, ProviderMetadata, RunningAwsMetadata,
    RunningNodeMetadata, RunningNodeProviderMetadata, RunningOciMetadata,
};
use manager_proto::api::manager::event_stream_event::Event;
use manager_proto::api::manager::job_history_entry::HistoryEntry;
use manager_proto::api::manager::{
    AwsHealth, AwsRegionHealth, CreateAwsNodeRequest, CreateOciNodeRequest, CurrentJob,
    EventStreamEvent, InitialDataComplete, Job, JobActive, JobDeleted, JobFilter, JobHistoryEntry,
    JobHistoryJobCompleted, JobHistoryJobCreated, JobHistoryJobProvisioned, JobHistoryJobRunning,
    JobHistoryJobStopped, JobHistoryJobStopping, JobUpdated, JobWithHistory, NodeRunning,
    NodeStarted, NodeStarting, NodeStopped, NodeStopping, OciHealth, OciRegionHealth, PhysicalNode,
    PhysicalNodeConnected, ProviderHealth, RunningJob, job_filter,
};
use prost_types::Timestamp;

use crate::config::{PoolKind, SimConfig};
use crate::world::CommandError;

/// `NodeStopping.Reason` for a node its caller terminated (`USER_REQUESTED`).
const STOPPING_TERMINATED: i32 = 8;
/// `JobHistoryJobStopping.Reason` for an instance its caller stopped (`JOB_STOPPED_USER_REQUESTED`).
const JOB_STOPPING_REQUESTED: i32 = 2;
/// `NodeStopping.Reason` for a node that stopped answering (`HEALTH_PING_TIME_EXCEEDED`).
const STOPPING_HEALTH_PING_EXCEEDED: i32 = 4;
/// `JobHistoryJobStopping.Reason` for an instance whose node stopped (`JOB_STOPPED_NODE_STOPPED`).
const JOB_STOPPING_NODE_STOPPED: i32 = 0;
/// `JobHistoryJobStopping.Reason` for an instance whose node was terminated
/// (`JOB_STOPPED_NODE_TERMINATED`).
const JOB_STOPPING_NODE_TERMINATED: i32 = 1;
/// The tags of a physical node that say where it belongs and what it holds.
const PHYSICAL_POOL_TAG: &str = "automanager.norsk.io/pool";
const PHYSICAL_ZONE_TAG: &str = "automanager.norsk.io/zone";
const PHYSICAL_CAPACITY_TAG: &str = "automanager.norsk.io/capacity";
const PHYSICAL_CORES_TAG: &str = "automanager.norsk.io/cores";
const PHYSICAL_CAPABILITIES_TAG: &str = "automanager.norsk.io/capabilities";
/// The longest id, tag key or tag value the sim accepts.
const MAX_ID: usize = 253;
/// The most tags on one node or job.
const MAX_TAGS: usize = 64;

#[derive(Debug, Clone)]
struct Node {
    meta: NodeMetadata,
    physical: bool,
    /// When a starting node runs; `None` once it does.
    ready_at_ms: Option<i64>,
    running: Option<RunningNodeMetadata>,
    /// Where it is in a warm stop and start (our extension); `On` for every other node.
    power: ext::Power,
    /// The provider's reclaim notice (our extension): when, and why.
    notice: Option<(i64, String)>,
    /// How long its provider takes to start it from off, and to power it off.
    start_delay_ms: u64,
    stop_delay_ms: u64,
    /// Its zone: a physical node's declared one, an OCI node's availability domain, an AWS
    /// node's `automanager.norsk.io/zone` tag (or its pool's only zone); empty when unknown.
    zone: String,
    /// Cut off by `partition-zone`: reported stopped, kept, back on heal.
    partitioned: bool,
    /// Its worker runs a job-socket listener (its pool's `jobSocket`): a handover touching a
    /// node without one aborts, as with our first API's socket agent.
    job_socket: bool,
}

/// One job's instances as a job-socket agent sees them ([`PublishedWorld::socket_view`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SocketJob {
    /// The nodes any instance of the job holds.
    pub live: Vec<String>,
    /// The nodes where its own instance runs (not a migration's target in progress).
    pub running: Vec<String>,
}

#[derive(Debug, Clone)]
struct StoredJob {
    job: Job,
    history: Vec<JobHistoryEntry>,
    /// Live instances: role → node.
    instances: BTreeMap<String, String>,
    /// Instances provisioned and not yet running: role → when they run (`timing.jobStartDelayMs`
    /// after their start).
    starting: BTreeMap<String, i64>,
}

/// An elastic pool as the provider calls see it.
#[derive(Debug, Clone)]
struct Offer {
    kind: PoolKind,
    region: String,
    zones: Vec<String>,
    instance_types: Vec<String>,
    provision_delay_ms: u64,
    start_delay_ms: u64,
    stop_delay_ms: u64,
    /// Whether `slow-provision` reaches it (an elastic pool).
    elastic: bool,
    /// Its workers run a job-socket listener.
    job_socket: bool,
}

/// The published API's world (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct PublishedWorld {
    nodes: BTreeMap<String, Node>,
    jobs: BTreeMap<String, StoredJob>,
    offers: Vec<Offer>,
    hashes: i64,
    events: Vec<EventStreamEvent>,
    /// What our extension adds: migrations, and what its Watch has to send.
    ext: ext::ExtState,
    /// Faults SimAdmin injected, and what the sim saw of each job.
    chaos: chaos::ChaosState,
    /// How long a started instance takes to run (`timing.jobStartDelayMs`), as our first API's
    /// world. A migration's target starts at once here.
    job_start_delay_ms: u64,
}

fn ts(ms: i64) -> Option<Timestamp> {
    Some(Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: i32::try_from(ms.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    })
}

fn ev(event: Event) -> EventStreamEvent {
    EventStreamEvent { event: Some(event) }
}

fn node_id(id: &str) -> Option<NodeId> {
    Some(NodeId {
        node_id: id.to_owned(),
    })
}

fn checked_id(what: &str, id: &str) -> Result<(), CommandError> {
    if id.is_empty() {
        return Err(CommandError::InvalidArgument(format!("{what} is required")));
    }
    if id.len() > MAX_ID || id.chars().any(char::is_control) {
        return Err(CommandError::InvalidArgument(format!(
            "{what} must be at most {MAX_ID} bytes without control characters"
        )));
    }
    Ok(())
}

fn checked_tags(tags: &BTreeMap<String, String>) -> Result<(), CommandError> {
    if tags.len() > MAX_TAGS {
        return Err(CommandError::InvalidArgument(format!(
            "at most {MAX_TAGS} tags, not {}",
            tags.len()
        )));
    }
    for (k, v) in tags {
        checked_id("a tag key", k)?;
        if v.len() > MAX_ID {
            return Err(CommandError::InvalidArgument(format!(
                "tag {k}: a value must be at most {MAX_ID} bytes"
            )));
        }
    }
    Ok(())
}

mod chaos;
mod ext;
mod persist;

pub(crate) use persist::PersistedPublished;

fn entry(e: HistoryEntry) -> JobHistoryEntry {
    JobHistoryEntry {
        history_entry: Some(e),
    }
}

impl PublishedWorld {
    /// The world of `config` at `now_ms`: its elastic pools as offers, its fixed pools' nodes
    /// connected.
    pub fn new(config: &SimConfig, now_ms: i64) -> Self {
        let mut world = PublishedWorld {
            job_start_delay_ms: config.timing.job_start_delay_ms,
            ..PublishedWorld::default()
        };
        for pool in &config.pools {
            if pool.kind == PoolKind::Cluster {
                for n in &pool.nodes {
                    // A physical node carries what its administrator declared: its pool,
                    // zone and capacity, under the tag keys AutoManager reads.
                    let mut tags = BTreeMap::from([
                        (PHYSICAL_POOL_TAG.to_owned(), pool.name.clone()),
                        (PHYSICAL_ZONE_TAG.to_owned(), n.zone.clone()),
                        (PHYSICAL_CAPACITY_TAG.to_owned(), n.capacity.to_string()),
                        (PHYSICAL_CORES_TAG.to_owned(), n.cores.to_string()),
                    ]);
                    // A worker with a job-socket listener says so among its capabilities, as
                    // our first API's workers advertise it.
                    let mut capabilities = n.capabilities.clone();
                    if pool.job_socket {
                        capabilities.push(manager_proto::JOB_SOCKET_CAPABILITY.to_owned());
                    }
                    if !capabilities.is_empty() {
                        tags.insert(PHYSICAL_CAPABILITIES_TAG.to_owned(), capabilities.join(","));
                    }
                    world.nodes.insert(
                        n.id.clone(),
                        Node {
                            meta: NodeMetadata {
                                node_id: node_id(&n.id),
                                tags,
                                created_at: ts(now_ms),
                                provider_metadata: None,
                            },
                            physical: true,
                            ready_at_ms: None,
                            running: None,
                            power: ext::Power::On,
                            notice: None,
                            start_delay_ms: 0,
                            stop_delay_ms: 0,
                            zone: n.zone.clone(),
                            partitioned: false,
                            job_socket: pool.job_socket,
                        },
                    );
                }
                continue;
            }
            world.offers.push(Offer {
                kind: pool.kind,
                region: pool.region.clone(),
                zones: pool.zones.clone(),
                instance_types: pool
                    .instance_types
                    .iter()
                    .map(|t| t.instance_type.clone())
                    .collect(),
                provision_delay_ms: pool
                    .provision_delay_ms
                    .unwrap_or(config.timing.provision_delay_ms),
                start_delay_ms: pool
                    .start_delay_ms
                    .or(config.timing.start_delay_ms)
                    .unwrap_or(pool.kind.default_start_delay_ms()),
                stop_delay_ms: pool
                    .stop_delay_ms
                    .or(config.timing.stop_delay_ms)
                    .unwrap_or(pool.kind.default_stop_delay_ms()),
                elastic: pool.scale_out == crate::config::ScaleOutConfig::Elastic,
                job_socket: pool.job_socket,
            });
        }
        world
    }

    /// The events queued since the last call, in order.
    pub fn take_events(&mut self) -> Vec<EventStreamEvent> {
        std::mem::take(&mut self.events)
    }

    /// When the next timed change is due (a node runs or powers off, a notice ends), if any.
    pub fn next_due_ms(&self) -> Option<i64> {
        self.nodes
            .values()
            .flat_map(|n| {
                let off = match n.power {
                    ext::Power::PoweringOff { off_at_ms } => Some(off_at_ms),
                    _ => None,
                };
                [n.ready_at_ms, off, n.notice.as_ref().map(|(at, _)| *at)]
            })
            .flatten()
            .chain(self.chaos.next_reply_ms())
            .chain(
                self.jobs
                    .values()
                    .flat_map(|s| s.starting.values().copied()),
            )
            .min()
    }

    /// Starts the nodes whose provisioning delay has passed (a node due in a dead zone dies
    /// instead), and hands the jobs' delayed answers to the handshake.
    pub fn advance(&mut self, now_ms: i64) {
        let mut dying = Vec::new();
        for (id, node) in &mut self.nodes {
            if node.ready_at_ms.is_some_and(|t| t <= now_ms) {
                if self.chaos.zone_dead(&node.zone) {
                    dying.push(id.clone());
                    continue;
                }
                node.ready_at_ms = None;
                let aws = matches!(
                    node.meta.provider_metadata,
                    Some(ProviderMetadata {
                        metadata: Some(Metadata::Aws(_))
                    })
                );
                node.running = Some(RunningNodeMetadata {
                    private_dns_name: format!("{id}.sim.internal"),
                    private_ip_address: "127.0.0.1".to_owned(),
                    provider_metadata: Some(RunningNodeProviderMetadata {
                        instance: Some(if aws {
                            Instance::Aws(RunningAwsMetadata {
                                instance_id: format!("i-{id}"),
                            })
                        } else {
                            Instance::Oci(RunningOciMetadata {})
                        }),
                    }),
                    ..Default::default()
                });
                self.events.push(ev(Event::NodeStarted(NodeStarted {
                    node_metadata: Some(node.meta.clone()),
                    running_node_metadata: node.running.clone(),
                })));
                if node.power == ext::Power::Waking {
                    node.power = ext::Power::On;
                    self.ext
                        .power(id, &node.meta, ext::PowerState::Running, now_ms);
                }
            }
        }
        for id in dying {
            let _ = self.kill_node(&id, now_ms);
        }
        self.run_due_instances(now_ms);
        self.advance_ext(now_ms);
        self.deliver_replies(now_ms);
    }

    /// CreateAwsNode: a node under the caller's id, in an `aws` pool offering the region and
    /// instance type.
    pub fn create_aws_node(
        &mut self,
        req: &CreateAwsNodeRequest,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        let id = req.node_id.as_ref().map_or("", |n| n.node_id.as_str());
        let offer = self.offer(PoolKind::Aws, &req.region, &req.instance_type, None)?;
        let delay = (
            offer.provision_delay_ms,
            offer.start_delay_ms,
            offer.stop_delay_ms,
        );
        // The AWS call names no zone: the launch template's subnet puts the node there, which
        // the sim does not model, so it reads the zone its caller recorded in the tags.
        let zone = req
            .tags
            .get(PHYSICAL_ZONE_TAG)
            .cloned()
            .or_else(|| match offer.zones.as_slice() {
                [only] => Some(only.clone()),
                _ => None,
            })
            .unwrap_or_default();
        let metadata = Metadata::Aws(AwsMetadata {
            instance_type: req.instance_type.clone(),
            region: req.region.clone(),
            architecture: 0,
        });
        let job_socket = offer.job_socket;
        self.create_node(id, &req.tags, metadata, delay, (zone, job_socket), now_ms)
    }

    /// CreateOciNode: a node under the caller's id, in an `oci` pool offering the shape (an
    /// instance type) in the availability domain (a zone).
    pub fn create_oci_node(
        &mut self,
        req: &CreateOciNodeRequest,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        let id = req.node_id.as_ref().map_or("", |n| n.node_id.as_str());
        let offer = self.offer(
            PoolKind::Oci,
            "",
            &req.shape,
            Some(&req.availability_domain),
        )?;
        let delay = (
            offer.provision_delay_ms,
            offer.start_delay_ms,
            offer.stop_delay_ms,
        );
        self.create_node(
            id,
            &req.tags,
            Metadata::Oci(Default::default()),
            delay,
            (req.availability_domain.clone(), offer.job_socket),
            now_ms,
        )
    }

    fn offer(
        &self,
        kind: PoolKind,
        region: &str,
        instance_type: &str,
        zone: Option<&str>,
    ) -> Result<&Offer, CommandError> {
        self.offers
            .iter()
            .find(|o| {
                o.kind == kind
                    && (region.is_empty() || o.region == region)
                    && o.instance_types.iter().any(|t| t == instance_type)
                    && zone.is_none_or(|z| o.zones.iter().any(|x| x == z))
            })
            .ok_or_else(|| {
                CommandError::InvalidArgument(format!(
                    "no {kind:?} pool of this sim offers {instance_type:?}{}{}",
                    if region.is_empty() {
                        String::new()
                    } else {
                        format!(" in region {region:?}")
                    },
                    zone.map(|z| format!(" in {z:?}")).unwrap_or_default()
                ))
            })
    }

    fn create_node(
        &mut self,
        id: &str,
        tags: &BTreeMap<String, String>,
        metadata: Metadata,
        (delay_ms, start_delay_ms, stop_delay_ms): (u64, u64, u64),
        (zone, job_socket): (String, bool),
        now_ms: i64,
    ) -> Result<(), CommandError> {
        checked_id("node_id", id)?;
        checked_tags(tags)?;
        if self.nodes.contains_key(id) {
            return Err(CommandError::AlreadyExists(format!("node {id} exists")));
        }
        let meta = NodeMetadata {
            node_id: node_id(id),
            tags: tags.clone(),
            created_at: ts(now_ms),
            provider_metadata: Some(ProviderMetadata {
                metadata: Some(metadata),
            }),
        };
        self.events.push(ev(Event::NodeStarting(NodeStarting {
            node_metadata: Some(meta.clone()),
        })));
        self.nodes.insert(
            id.to_owned(),
            Node {
                meta,
                physical: false,
                ready_at_ms: Some(
                    now_ms.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX)),
                ),
                running: None,
                power: ext::Power::On,
                notice: None,
                start_delay_ms,
                stop_delay_ms,
                zone,
                partitioned: false,
                job_socket,
            },
        );
        Ok(())
    }

    /// TerminateNode: its instances stop, then the node.
    pub fn terminate_node(&mut self, id: &str, now_ms: i64) -> Result<(), CommandError> {
        let Some(node) = self.nodes.get(id) else {
            return Err(CommandError::NotFound(format!("node {id}")));
        };
        if node.physical {
            return Err(CommandError::FailedPrecondition(format!(
                "node {id} is a physical node: it is not Manager's to terminate"
            )));
        }
        if node.power != ext::Power::On && node.power != ext::Power::Waking {
            // A warm node: the published stream reported it stopped already.
            self.forget_warm(id, now_ms);
            return Ok(());
        }
        if node.partitioned {
            // Reported stopped when it went silent, with its instances: it just goes.
            self.nodes.remove(id);
            return Ok(());
        }
        self.events.push(ev(Event::NodeStopping(NodeStopping {
            node_id: node_id(id),
            reason: STOPPING_TERMINATED,
        })));
        let hosted = self.instances_on(id);
        for (job, role) in hosted {
            self.stop_instance(&job, &role, JOB_STOPPING_NODE_TERMINATED, now_ms);
        }
        self.nodes.remove(id);
        self.events.push(ev(Event::NodeStopped(NodeStopped {
            node_id: node_id(id),
        })));
        Ok(())
    }

    /// The (job, role) of every instance on node `id`.
    fn instances_on(&self, id: &str) -> Vec<(String, String)> {
        self.jobs
            .iter()
            .flat_map(|(j, s)| {
                s.instances
                    .iter()
                    .filter(|(_, n)| n.as_str() == id)
                    .map(|(role, _)| (j.clone(), role.clone()))
            })
            .collect()
    }

    /// What runs where, as a job-socket agent needs it: per job, the nodes its instances hold
    /// and those where its own instance runs (any role but the target of a migration in
    /// progress); and per node, whether its worker runs a job-socket listener.
    pub fn socket_view(&self) -> (BTreeMap<String, SocketJob>, Vec<(String, bool)>) {
        let jobs = self
            .jobs
            .iter()
            .filter(|(_, s)| !s.instances.is_empty())
            .map(|(id, s)| {
                let mut job = SocketJob::default();
                for (role, node) in &s.instances {
                    job.live.push(node.clone());
                    if !s.starting.contains_key(role)
                        && self.migration_for_target(id, role).is_none()
                    {
                        job.running.push(node.clone());
                    }
                }
                (id.clone(), job)
            })
            .collect();
        let nodes = self
            .nodes
            .iter()
            .map(|(id, n)| (id.clone(), n.job_socket))
            .collect();
        (jobs, nodes)
    }

    /// Whether the world holds node `id`.
    pub fn has_node(&self, id: &str) -> bool {
        self.nodes.contains_key(id)
    }

    /// The node dies (a fault, not a request): Manager stops hearing from it, so its instances
    /// stop with `JOB_STOPPED_NODE_STOPPED` and the node with `HEALTH_PING_TIME_EXCEEDED`, and
    /// it is gone.
    pub fn kill_node(&mut self, id: &str, now_ms: i64) -> Result<(), CommandError> {
        let Some(node) = self.nodes.get(id) else {
            return Err(CommandError::NotFound(format!("node {id}")));
        };
        if node.power != ext::Power::On && node.power != ext::Power::Waking {
            self.forget_warm(id, now_ms);
            return Ok(());
        }
        if node.partitioned {
            // Reported stopped when its zone was cut off: it never comes back.
            self.nodes.remove(id);
            return Ok(());
        }
        self.events.push(ev(Event::NodeStopping(NodeStopping {
            node_id: node_id(id),
            reason: STOPPING_HEALTH_PING_EXCEEDED,
        })));
        let hosted = self.instances_on(id);
        for (job, role) in hosted {
            self.stop_instance(&job, &role, JOB_STOPPING_NODE_STOPPED, now_ms);
        }
        self.nodes.remove(id);
        self.events.push(ev(Event::NodeStopped(NodeStopped {
            node_id: node_id(id),
        })));
        Ok(())
    }

    /// CreateJob: stores the definition; answers its hash.
    pub fn create_job(&mut self, job: Job, now_ms: i64) -> Result<i64, CommandError> {
        let id = job
            .job_id
            .as_ref()
            .map_or("", |j| j.job_id.as_str())
            .to_owned();
        checked_id("job_id", &id)?;
        checked_tags(&job.tags)?;
        if self.jobs.contains_key(&id) {
            return Err(CommandError::AlreadyExists(format!("job {id} exists")));
        }
        self.hashes += 1;
        let mut job = job;
        job.current_hash = self.hashes;
        let stored = StoredJob {
            job,
            history: vec![entry(HistoryEntry::JobCreated(JobHistoryJobCreated {
                timestamp: ts(now_ms),
            }))],
            instances: BTreeMap::new(),
            starting: BTreeMap::new(),
        };
        self.events.push(ev(Event::JobActive(JobActive {
            job_with_history: Some(with_history(&stored)),
        })));
        self.jobs.insert(id, stored);
        Ok(self.hashes)
    }

    /// UpdateJob: replaces the definition; answers its hash.
    pub fn update_job(&mut self, job: Job, now_ms: i64) -> Result<i64, CommandError> {
        let id = job
            .job_id
            .as_ref()
            .map_or("", |j| j.job_id.as_str())
            .to_owned();
        checked_tags(&job.tags)?;
        let Some(stored) = self.jobs.get_mut(&id) else {
            return Err(CommandError::NotFound(format!("job {id}")));
        };
        self.hashes += 1;
        let mut job = job;
        job.current_hash = self.hashes;
        let previous = std::mem::replace(&mut stored.job, job);
        stored.history.push(entry(HistoryEntry::JobUpdated(
            manager_proto::api::manager::JobHistoryJobUpdated {
                timestamp: ts(now_ms),
                previous_job: Some(previous),
            },
        )));
        self.events.push(ev(Event::JobUpdated(JobUpdated {
            job_with_history: Some(with_history(stored)),
        })));
        Ok(self.hashes)
    }

    /// DeleteJob: a job with no live instance.
    pub fn delete_job(&mut self, id: &str) -> Result<(), CommandError> {
        let Some(stored) = self.jobs.get(id) else {
            return Err(CommandError::NotFound(format!("job {id}")));
        };
        if !stored.instances.is_empty() {
            return Err(CommandError::FailedPrecondition(format!(
                "job {id} still runs under {}: stop or complete it first",
                stored
                    .instances
                    .keys()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        self.jobs.remove(id);
        self.events.push(ev(Event::JobDeleted(JobDeleted {
            job_id: Some(JobId {
                job_id: id.to_owned(),
            }),
        })));
        Ok(())
    }

    /// StartJob: an instance of `job` under `role` on a running node. A start the worker
    /// refuses (`reject-next`) is still answered `Empty`: its outcome is on the stream.
    pub fn start_job(
        &mut self,
        job: &str,
        role: &str,
        node: &str,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        self.start_instance_after(job, role, node, self.job_start_delay_ms, now_ms)
            .map(|_| ())
    }

    /// The instances whose start delay has passed run.
    fn run_due_instances(&mut self, now_ms: i64) {
        let due: Vec<(String, String)> = self
            .jobs
            .iter()
            .flat_map(|(id, s)| {
                s.starting
                    .iter()
                    .filter(move |(_, at)| **at <= now_ms)
                    .map(move |(role, _)| (id.clone(), role.clone()))
            })
            .collect();
        for (job, role) in due {
            self.instance_runs(&job, &role, now_ms);
        }
    }

    /// Instance `role` of `job`, provisioned, runs now: its `JobRunning`.
    fn instance_runs(&mut self, job: &str, role: &str, now_ms: i64) {
        let Some(stored) = self.jobs.get_mut(job) else {
            return;
        };
        stored.starting.remove(role);
        let Some(node) = stored.instances.get(role).cloned() else {
            return;
        };
        let (meta, running) = match self.nodes.get(&node) {
            Some(n) => (Some(n.meta.clone()), n.running.clone()),
            None => (None, None),
        };
        stored
            .history
            .push(entry(HistoryEntry::JobRunning(JobHistoryJobRunning {
                timestamp: ts(now_ms),
                role: role.to_owned(),
                node_metadata: meta,
                running_node_metadata: running,
                service_port_mappings: BTreeMap::new(),
            })));
        self.events.push(ev(Event::JobUpdated(JobUpdated {
            job_with_history: Some(with_history(stored)),
        })));
        self.note_running(job, now_ms);
    }

    /// A start that runs at once (a migration's target): `Ok(false)` when the node's worker
    /// refused it.
    fn start_instance(
        &mut self,
        job: &str,
        role: &str,
        node: &str,
        now_ms: i64,
    ) -> Result<bool, CommandError> {
        self.start_instance_after(job, role, node, 0, now_ms)
    }

    /// StartJob's work: the instance is provisioned now and runs `delay_ms` later; `Ok(false)`
    /// when the node's worker refused the start.
    fn start_instance_after(
        &mut self,
        job: &str,
        role: &str,
        node: &str,
        delay_ms: u64,
        now_ms: i64,
    ) -> Result<bool, CommandError> {
        checked_id("role", role)?;
        let Some(n) = self.nodes.get(node) else {
            return Err(CommandError::NotFound(format!("node {node}")));
        };
        if n.ready_at_ms.is_some() {
            return Err(CommandError::FailedPrecondition(format!(
                "node {node} is still starting"
            )));
        }
        if n.power != ext::Power::On {
            return Err(CommandError::FailedPrecondition(format!(
                "node {node} is powered off"
            )));
        }
        if n.partitioned {
            return Err(CommandError::FailedPrecondition(format!(
                "node {node} is not answering (its zone is partitioned)"
            )));
        }
        let meta = n.meta.clone();
        let running = n.running.clone();
        let Some(stored) = self.jobs.get(job) else {
            return Err(CommandError::NotFound(format!("job {job}")));
        };
        if let Some(on) = stored.instances.get(role) {
            return Err(CommandError::FailedPrecondition(format!(
                "job {job} already runs under role {role} on {on}"
            )));
        }
        if self.chaos.take_rejection() {
            self.refuse_start(job, role, meta, running, now_ms);
            return Ok(false);
        }
        let Some(stored) = self.jobs.get_mut(job) else {
            return Err(CommandError::NotFound(format!("job {job}")));
        };
        stored.instances.insert(role.to_owned(), node.to_owned());
        stored.history.push(entry(HistoryEntry::JobProvisioned(
            JobHistoryJobProvisioned {
                timestamp: ts(now_ms),
                role: role.to_owned(),
                node_metadata: Some(meta),
                running_node_metadata: running,
            },
        )));
        let at = now_ms.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
        stored.starting.insert(role.to_owned(), at);
        // A start counts when Manager accepts it, as in our first API's world; the time
        // without a running instance ends when it runs.
        self.note_start(job, role, node, now_ms);
        if delay_ms == 0 {
            self.instance_runs(job, role, now_ms);
            return Ok(true);
        }
        if let Some(stored) = self.jobs.get(job) {
            self.events.push(ev(Event::JobUpdated(JobUpdated {
                job_with_history: Some(with_history(stored)),
            })));
        }
        Ok(true)
    }

    /// StopJob: the instance of `job` under `role`, which must be on `node`.
    pub fn stop_job(
        &mut self,
        job: &str,
        role: &str,
        node: &str,
        now_ms: i64,
    ) -> Result<(), CommandError> {
        let Some(stored) = self.jobs.get(job) else {
            return Err(CommandError::NotFound(format!("job {job}")));
        };
        match stored.instances.get(role) {
            Some(on) if on == node => {}
            Some(on) => {
                return Err(CommandError::NotFound(format!(
                    "job {job} runs under role {role} on {on}, not on {node}"
                )));
            }
            None => {
                return Err(CommandError::NotFound(format!(
                    "job {job} does not run under role {role}"
                )));
            }
        }
        self.stop_instance(job, role, JOB_STOPPING_REQUESTED, now_ms);
        Ok(())
    }

    /// CompleteJob: every instance stops and the job completes.
    pub fn complete_job(&mut self, id: &str, now_ms: i64) -> Result<(), CommandError> {
        let Some(stored) = self.jobs.get(id) else {
            return Err(CommandError::NotFound(format!("job {id}")));
        };
        let roles: Vec<String> = stored.instances.keys().cloned().collect();
        for role in roles {
            self.stop_instance(id, &role, JOB_STOPPING_REQUESTED, now_ms);
        }
        if let Some(stored) = self.jobs.get_mut(id) {
            stored
                .history
                .push(entry(HistoryEntry::JobCompleted(JobHistoryJobCompleted {
                    timestamp: ts(now_ms),
                })));
            self.events.push(ev(Event::JobUpdated(JobUpdated {
                job_with_history: Some(with_history(stored)),
            })));
        }
        Ok(())
    }

    fn stop_instance(&mut self, job: &str, role: &str, reason: i32, now_ms: i64) {
        let Some(stored) = self.jobs.get_mut(job) else {
            return;
        };
        let Some(node) = stored.instances.remove(role) else {
            return;
        };
        stored.starting.remove(role);
        let meta = self.nodes.get(&node).map(|n| n.meta.clone());
        stored
            .history
            .push(entry(HistoryEntry::JobStopping(JobHistoryJobStopping {
                timestamp: ts(now_ms),
                role: role.to_owned(),
                node_metadata: meta.clone(),
                running_node_metadata: None,
                reason,
            })));
        stored
            .history
            .push(entry(HistoryEntry::JobStopped(JobHistoryJobStopped {
                timestamp: ts(now_ms),
                role: role.to_owned(),
                node_metadata: meta,
                running_node_metadata: None,
            })));
        self.events.push(ev(Event::JobUpdated(JobUpdated {
            job_with_history: Some(with_history(stored)),
        })));
        self.note_running(job, now_ms);
        // A migration this instance took part in cannot go on.
        self.instance_gone(job, role, now_ms);
    }

    /// JobSearch: every job matching all the filters, with its running instances.
    pub fn job_search(&self, filters: &[JobFilter]) -> Result<Vec<CurrentJob>, CommandError> {
        let mut out = Vec::new();
        for (id, stored) in &self.jobs {
            let mut all = true;
            for f in filters {
                if !matches(f, id, &stored.job)? {
                    all = false;
                    break;
                }
            }
            if all {
                out.push(CurrentJob {
                    job: Some(stored.job.clone()),
                    instances: instances(id, stored),
                });
            }
        }
        Ok(out)
    }

    /// What a new EventStream is sent first: nodes, jobs, then `InitialDataComplete` with every
    /// offered region's (or availability domain's) health.
    pub fn snapshot(&self) -> Vec<EventStreamEvent> {
        // Every instance by its node, in one pass over the jobs.
        let mut by_node: BTreeMap<&str, Vec<RunningJob>> = BTreeMap::new();
        for (j, s) in &self.jobs {
            for (role, node) in &s.instances {
                by_node
                    .entry(node.as_str())
                    .or_default()
                    .push(running_job(j, role, node));
            }
        }
        let mut out = Vec::new();
        for (id, node) in &self.nodes {
            let on_node = by_node.remove(id.as_str()).unwrap_or_default();
            if node.power != ext::Power::On && node.power != ext::Power::Waking {
                // Stopped, as the published stream said: only our extension's Watch lists it.
                continue;
            }
            if node.partitioned {
                // Not answering: Manager has it as stopped until its zone heals.
                continue;
            }
            let event = if node.physical {
                Event::PhysicalNodeConnected(PhysicalNodeConnected {
                    node: Some(PhysicalNode {
                        id: id.clone(),
                        tags: node.meta.tags.clone(),
                        ip_address: String::new(),
                    }),
                    instances: on_node,
                })
            } else if node.ready_at_ms.is_some() {
                Event::NodeStarting(NodeStarting {
                    node_metadata: Some(node.meta.clone()),
                })
            } else {
                Event::NodeRunning(NodeRunning {
                    node_metadata: Some(node.meta.clone()),
                    running_node_metadata: node.running.clone(),
                    instances: on_node,
                })
            };
            out.push(ev(event));
        }
        for stored in self.jobs.values() {
            out.push(ev(Event::JobActive(JobActive {
                job_with_history: Some(with_history(stored)),
            })));
        }
        out.push(ev(Event::InitialDataComplete(InitialDataComplete {
            health: self.health(),
        })));
        out
    }

    fn health(&self) -> Vec<ProviderHealth> {
        use manager_proto::api::manager::provider_health::Health;
        let mut aws = Vec::new();
        let mut oci = Vec::new();
        for o in &self.offers {
            match o.kind {
                PoolKind::Aws => aws.push(AwsRegionHealth {
                    region: o.region.clone(),
                    health: 0,
                }),
                PoolKind::Oci => oci.extend(o.zones.iter().map(|z| OciRegionHealth {
                    availability_domain: z.clone(),
                    health: 0,
                })),
                PoolKind::Cluster => {}
            }
        }
        let mut out = Vec::new();
        if !aws.is_empty() {
            out.push(ProviderHealth {
                health: Some(Health::Aws(AwsHealth { region_health: aws })),
            });
        }
        if !oci.is_empty() {
            out.push(ProviderHealth {
                health: Some(Health::Oci(OciHealth { region_health: oci })),
            });
        }
        out
    }
}

fn with_history(stored: &StoredJob) -> JobWithHistory {
    JobWithHistory {
        job: Some(stored.job.clone()),
        history_entry: stored.history.clone(),
    }
}

fn running_job(job: &str, role: &str, node: &str) -> RunningJob {
    RunningJob {
        job_key: Some(ActiveJobKey {
            job_id: Some(JobId {
                job_id: job.to_owned(),
            }),
            role: role.to_owned(),
        }),
        node_id: node_id(node),
    }
}

fn instances(id: &str, stored: &StoredJob) -> Vec<RunningJob> {
    stored
        .instances
        .iter()
        .map(|(role, node)| running_job(id, role, node))
        .collect()
}

/// Whether a job matches one filter. Regular expressions are not evaluated by the sim.
fn matches(f: &JobFilter, id: &str, job: &Job) -> Result<bool, CommandError> {
    use manager_proto::api::manager::date_filter::Comparison as D;
    use manager_proto::api::manager::id_filter::Comparison as I;
    use manager_proto::api::manager::tag_filter::Comparison as T;
    let unsupported = |what: &str| {
        Err(CommandError::InvalidArgument(format!(
            "manager-sim does not evaluate {what} filters"
        )))
    };
    Ok(match &f.job_filter {
        None => true,
        Some(job_filter::JobFilter::TagFilter(t)) => {
            let v = job.tags.get(&t.tag_name);
            match &t.comparison {
                None => true,
                Some(T::Eq(x)) => v == Some(x),
                Some(T::Neq(x)) => v != Some(x),
                Some(T::Exists(e)) => v.is_some() == *e,
                Some(T::Re(_)) => return unsupported("regular-expression"),
            }
        }
        Some(job_filter::JobFilter::IdFilter(i)) => match &i.comparison {
            None => true,
            Some(I::Eq(x)) => id == x,
            Some(I::Neq(x)) => id != x,
            Some(I::Re(_)) => return unsupported("regular-expression"),
        },
        Some(job_filter::JobFilter::DateFilter(d)) => {
            let key = |t: &Timestamp| (t.seconds, t.nanos);
            let Some(start) = job.start_date_time.as_ref().map(key) else {
                return Ok(false);
            };
            match &d.comparison {
                None => true,
                Some(D::Eq(t)) => start == key(t),
                Some(D::Lt(t)) => start < key(t),
                Some(D::Lte(t)) => start <= key(t),
                Some(D::Gt(t)) => start > key(t),
                Some(D::Gte(t)) => start >= key(t),
                Some(D::Within(w)) => {
                    w.start_date.as_ref().is_none_or(|s| start >= key(s))
                        && w.end_date.as_ref().is_none_or(|e| start <= key(e))
                }
            }
        }
    })
}

/// The kind of each event, for tests.
#[cfg(test)]
fn tests_kinds(events: &[EventStreamEvent]) -> Vec<&'static str> {
    events
        .iter()
        .map(|e| match &e.event {
            Some(Event::NodeStarting(_)) => "NodeStarting",
            Some(Event::NodeStarted(_)) => "NodeStarted",
            Some(Event::NodeStopping(_)) => "NodeStopping",
            Some(Event::NodeStopped(_)) => "NodeStopped",
            Some(Event::NodeRunning(_)) => "NodeRunning",
            Some(Event::PhysicalNodeConnected(_)) => "PhysicalNodeConnected",
            Some(Event::JobActive(_)) => "JobActive",
            Some(Event::JobUpdated(_)) => "JobUpdated",
            Some(Event::JobDeleted(_)) => "JobDeleted",
            Some(Event::InitialDataComplete(_)) => "InitialDataComplete",
            _ => "other",
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn world() -> PublishedWorld {
        PublishedWorld::new(&SimConfig::demo(), 1_000)
    }

    fn aws(id: &str) -> CreateAwsNodeRequest {
        CreateAwsNodeRequest {
            node_id: node_id(id),
            tags: BTreeMap::from([("pool".to_owned(), "aws-east".to_owned())]),
            region: "eu-west-1".to_owned(),
            instance_type: "m5.xlarge".to_owned(),
            ..Default::default()
        }
    }

    fn job(id: &str) -> Job {
        Job {
            job_id: Some(JobId {
                job_id: id.to_owned(),
            }),
            ..Default::default()
        }
    }

    fn kinds(events: &[EventStreamEvent]) -> Vec<&'static str> {
        super::tests_kinds(events)
    }

    #[test]
    fn a_node_starts_after_its_pools_delay_and_takes_instances_only_then() {
        let mut w = world();
        w.create_aws_node(&aws("n1"), 1_000).expect("created");
        assert_eq!(kinds(&w.take_events()), ["NodeStarting"]);
        w.create_job(job("j"), 1_000).expect("stored");
        w.take_events();
        assert!(matches!(
            w.start_job("j", "primary", "n1", 1_000),
            Err(CommandError::FailedPrecondition(_))
        ));
        // The demo's aws pool starts nodes after 200 ms.
        w.advance(1_199);
        assert!(w.take_events().is_empty());
        w.advance(1_200);
        assert_eq!(kinds(&w.take_events()), ["NodeStarted"]);
        w.start_job("j", "primary", "n1", 1_300).expect("started");
        assert_eq!(kinds(&w.take_events()), ["JobUpdated"]);
    }

    /// The history of role `role` of job `id`, as entry kinds.
    fn steps(w: &PublishedWorld, id: &str, role: &str) -> Vec<&'static str> {
        w.jobs[id]
            .history
            .iter()
            .filter_map(|e| match e.history_entry.as_ref()? {
                HistoryEntry::JobProvisioned(p) if p.role == role => Some("provisioned"),
                HistoryEntry::JobRunning(r) if r.role == role => Some("running"),
                HistoryEntry::JobStopping(s) if s.role == role => Some("stopping"),
                HistoryEntry::JobStopped(s) if s.role == role => Some("stopped"),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_started_job_runs_after_the_start_delay_and_a_stop_meanwhile_ends_it() {
        let mut config = SimConfig::demo();
        config.timing.job_start_delay_ms = 20;
        let mut w = PublishedWorld::new(&config, 1_000);
        w.create_aws_node(&aws("n1"), 1_000).expect("created");
        w.advance(1_200);
        w.create_job(job("j"), 1_200).expect("stored");
        w.create_job(job("k"), 1_200).expect("stored");
        w.take_events();
        w.start_job("j", "primary", "n1", 1_300).expect("started");
        assert_eq!(steps(&w, "j", "primary"), ["provisioned"]);
        assert_eq!(w.next_due_ms(), Some(1_320));
        let (socket_jobs, _) = w.socket_view();
        assert!(socket_jobs["j"].running.is_empty(), "not running yet");
        w.advance(1_319);
        assert!(w.take_events().len() == 1, "only the start's own update");
        w.advance(1_320);
        assert_eq!(kinds(&w.take_events()), ["JobUpdated"]);
        assert_eq!(steps(&w, "j", "primary"), ["provisioned", "running"]);
        assert_eq!(w.next_due_ms(), None);
        // A stop before the instance runs ends it; it never runs later.
        w.start_job("k", "primary", "n1", 1_400).expect("started");
        w.stop_job("k", "primary", "n1", 1_405).expect("stopped");
        w.advance(1_500);
        assert_eq!(
            steps(&w, "k", "primary"),
            ["provisioned", "stopping", "stopped"]
        );
        assert_eq!(w.next_due_ms(), None);
    }

    #[test]
    fn refusals_name_what_is_wrong_and_change_nothing() {
        let mut w = world();
        let mut bad = aws("n1");
        bad.instance_type = "x9.huge".to_owned();
        assert!(matches!(
            w.create_aws_node(&bad, 0),
            Err(CommandError::InvalidArgument(m)) if m.contains("x9.huge")
        ));
        assert!(matches!(
            w.create_aws_node(&aws(""), 0),
            Err(CommandError::InvalidArgument(_))
        ));
        assert!(matches!(
            w.create_aws_node(&aws(&"x".repeat(300)), 0),
            Err(CommandError::InvalidArgument(_))
        ));
        w.create_aws_node(&aws("n1"), 0).expect("created");
        assert!(matches!(
            w.create_aws_node(&aws("n1"), 0),
            Err(CommandError::AlreadyExists(_))
        ));
        assert!(matches!(
            w.terminate_node("onprem-a1", 0),
            Err(CommandError::FailedPrecondition(_))
        ));
        assert!(matches!(
            w.stop_job("nope", "primary", "n1", 0),
            Err(CommandError::NotFound(_))
        ));
        w.take_events();
        assert!(matches!(
            w.delete_job("nope"),
            Err(CommandError::NotFound(_))
        ));
        assert!(w.take_events().is_empty());
    }

    #[test]
    fn terminating_a_node_stops_its_instances_first() {
        let mut w = world();
        w.create_aws_node(&aws("n1"), 0).expect("created");
        w.advance(1_000);
        w.create_job(job("j"), 1_000).expect("stored");
        w.start_job("j", "primary", "n1", 1_000).expect("started");
        w.start_job("j", "backup", "onprem-a1", 1_000)
            .expect("started");
        assert!(matches!(
            w.delete_job("j"),
            Err(CommandError::FailedPrecondition(_))
        ));
        w.take_events();
        w.terminate_node("n1", 2_000).expect("terminated");
        assert_eq!(
            kinds(&w.take_events()),
            ["NodeStopping", "JobUpdated", "NodeStopped"]
        );
        let found = w.job_search(&[]).expect("search");
        assert_eq!(
            found[0].instances.len(),
            1,
            "the backup on onprem-a1 runs on"
        );
    }

    #[test]
    fn a_snapshot_lists_every_node_and_job_then_initial_data_complete() {
        let mut w = world();
        w.create_aws_node(&aws("n1"), 0).expect("created");
        w.create_job(job("j"), 0).expect("stored");
        let snapshot = w.snapshot();
        let k = kinds(&snapshot);
        assert_eq!(
            k.iter().filter(|k| **k == "PhysicalNodeConnected").count(),
            4
        );
        assert_eq!(k.iter().filter(|k| **k == "NodeStarting").count(), 1);
        assert_eq!(k.iter().filter(|k| **k == "JobActive").count(), 1);
        assert_eq!(k.last(), Some(&"InitialDataComplete"));
    }
}
