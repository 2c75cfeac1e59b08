//! Pure translation between the published API's objects and the operator's port model (the
//! node, job and bundle records its placement reads). No I/O: the port calls these with what
//! its mirror and catalog hold.
//!
//! What the published API has no field for travels in our tags (see [`super::tags`]); an
//! object without our owner tag is not ours, and is left out of the model entirely, so nothing
//! the operator does can stop, delete or count it.

use std::collections::{BTreeMap, HashMap};

use manager_proto::api::common::provider_metadata::Metadata;
use manager_proto::api::common::{JobId, NodeMetadata};
use manager_proto::api::manager::Job as StoredJob;
use manager_proto::{
    Bundle, BundleJob, Job, JobInstance, JobRequirements, JobRole, JobState, Node, NodeInventory,
    NodeState as PortNodeState, ProviderKind, StopReason,
};
use prost::Message;

use super::catalog::CatalogPool;
use super::mirror::{InstancePhase, InstanceView, JobView, NodeState, NodeView, timestamp_ms};
use super::tags;

/// `JobHistoryJobStopping.Reason` values (1.0.384).
mod stopping {
    pub const NODE_STOPPED: i32 = 0;
    pub const NODE_TERMINATED: i32 = 1;
    pub const USER_REQUESTED: i32 = 2;
    pub const UNKNOWN_JOB: i32 = 3;
    pub const JOB_FAILED: i32 = 4;
}

/// `NodeStopping.Reason` values (1.0.384) that mean the node is going on purpose.
const NODE_GOING_ON_PURPOSE: [i32; 2] = [7, 8];

/// Why an instance this client stopped was stopped, when the port said more than "requested"
/// (the published API records only that a user asked).
pub type StopOverlay = HashMap<(String, String), StopReason>;

/// The port role of a published role, or `None` for a role that is not ours.
pub fn port_role(role: &str) -> Option<JobRole> {
    match role {
        tags::ROLE_NORMAL => Some(JobRole::Normal),
        tags::ROLE_MIGRATION_TARGET => Some(JobRole::MigrationTarget),
        _ => None,
    }
}

/// The published role of a port role (unspecified is the normal instance).
pub fn published_role(role: JobRole) -> &'static str {
    match role {
        JobRole::MigrationTarget => tags::ROLE_MIGRATION_TARGET,
        JobRole::Normal | JobRole::Unspecified => tags::ROLE_NORMAL,
    }
}

fn provider_of(meta: Option<&NodeMetadata>) -> Option<&Metadata> {
    meta?.provider_metadata.as_ref()?.metadata.as_ref()
}

/// Whether a node belongs in the model: one this installation created, or a physical node
/// tagged with a pool of the catalog.
pub fn node_is_ours(view: &NodeView, owner: &str, catalog: &BTreeMap<String, CatalogPool>) -> bool {
    if view.physical {
        return view
            .tags
            .get(tags::POOL)
            .is_some_and(|p| catalog.contains_key(p));
    }
    tags::owned_by(&view.tags, owner)
}

/// The port record of a node the stream reports (see [`node_is_ours`] first). Its inventory
/// comes from the pool's instance type once it runs: 1.0.384 reports no capacity.
pub fn port_node(view: &NodeView, catalog: &BTreeMap<String, CatalogPool>) -> Node {
    let pool_name = view.tags.get(tags::POOL).cloned().unwrap_or_default();
    let pool = catalog.get(&pool_name);
    let meta = view.metadata.as_ref();
    let (provider, region, mut instance_type) = match provider_of(meta) {
        Some(Metadata::Aws(a) | Metadata::Test(a)) => {
            (ProviderKind::Aws, a.region.clone(), a.instance_type.clone())
        }
        Some(Metadata::Oci(_)) => (ProviderKind::Oci, String::new(), String::new()),
        None => (ProviderKind::Cluster, String::new(), String::new()),
    };
    if instance_type.is_empty() {
        instance_type = view
            .tags
            .get(tags::INSTANCE_TYPE)
            .cloned()
            .unwrap_or_default();
    }
    let region = if region.is_empty() {
        pool.map(|p| p.pool.region.clone()).unwrap_or_default()
    } else {
        region
    };
    let provider = pool.map_or(provider, CatalogPool::kind);
    let zone = view.tags.get(tags::ZONE).cloned().unwrap_or_default();
    let state = match view.state {
        NodeState::Starting => PortNodeState::Starting,
        NodeState::Running => PortNodeState::Started,
        NodeState::Stopping
            if view
                .stopping_reason
                .is_some_and(|r| NODE_GOING_ON_PURPOSE.contains(&r)) =>
        {
            PortNodeState::Terminated
        }
        NodeState::Stopping => PortNodeState::Stopped,
    };
    // A physical node may declare its own capacity; otherwise its pool's instance type says.
    let declared = view
        .physical
        .then(|| parse_tag::<f64>(&view.tags, tags::CAPACITY))
        .flatten()
        .map(|capacity| {
            let r = requirements_of(&view.tags);
            (capacity, r.required_cores, r.required_capabilities)
        });
    let inventory = (view.state == NodeState::Running)
        .then(|| {
            declared.or_else(|| {
                pool.and_then(|p| p.instance_type(&instance_type))
                    .map(|t| (t.capacity, t.cores, t.capabilities.clone()))
            })
        })
        .flatten()
        .map(|(capacity, cores, capabilities)| NodeInventory {
            node_id: view.node_id.clone(),
            zone: zone.clone(),
            capacity,
            cores,
            capabilities,
        });
    let created_at_ms = meta
        .and_then(|m| m.created_at.as_ref())
        .map_or(0, timestamp_ms);
    Node {
        node_id: view.node_id.clone(),
        pool: pool_name,
        provider: provider as i32,
        region,
        zone,
        instance_type,
        tags: view.tags.clone().into_iter().collect(),
        state: state as i32,
        inventory,
        created_at_ms,
        state_changed_at_ms: created_at_ms,
        // A node this installation created is named by the key it asked with.
        request_id: if view.physical {
            String::new()
        } else {
            view.node_id.clone()
        },
        reclaim_at_ms: 0,
        reclaim_reason: String::new(),
    }
}

/// `NodeStopping.Reason` for a node its provider stopped (`PROVIDER_STOP`): what the published
/// stream says of a warm stop made through our extension.
pub const PROVIDER_STOP: i32 = 6;

/// The mirror's view of a warm node the published stream no longer lists, from what our
/// extension's Watch carries (its creation metadata).
pub fn warm_view(node_id: &str, power: &manager_proto::extension::NodePower) -> NodeView {
    let meta = power.metadata.clone();
    NodeView {
        node_id: node_id.to_owned(),
        physical: false,
        tags: meta.as_ref().map(|m| m.tags.clone()).unwrap_or_default(),
        state: NodeState::Stopping,
        metadata: meta,
        running: None,
        stopping_reason: Some(PROVIDER_STOP),
    }
}

/// The port state of a warm node's power state (`None`: not warm).
pub fn warm_state(power: &manager_proto::extension::NodePower) -> Option<PortNodeState> {
    use manager_proto::extension::PowerState as P;
    match P::try_from(power.state) {
        Ok(P::PoweringOff) => Some(PortNodeState::PoweringOff),
        Ok(P::PoweredOff) => Some(PortNodeState::PoweredOff),
        Ok(P::Starting) => Some(PortNodeState::Starting),
        _ => None,
    }
}

/// The port record of one of our extension's migrations.
pub fn port_migration(m: &manager_proto::extension::Migration) -> manager_proto::Migration {
    let node = |n: Option<&manager_proto::api::common::NodeId>| {
        n.map(|n| n.node_id.clone()).unwrap_or_default()
    };
    manager_proto::Migration {
        migration_id: m.migration_id.clone(),
        job_id: m
            .job_id
            .as_ref()
            .map(|j| j.job_id.clone())
            .unwrap_or_default(),
        source_node_id: node(m.source_node_id.as_ref()),
        target_node_id: node(m.target_node_id.as_ref()),
        // Our extension numbers phases, parties and strategies as our first API does.
        phase: m.phase,
        source_state: m.source_state.clone(),
        target_ready_payload: m.target_ready_payload.clone(),
        source_stopped_payload: m.source_stopped_payload.clone(),
        applied: m.applied.clone(),
        failed: m
            .failed
            .iter()
            .map(|f| manager_proto::FailedParticipant {
                id: f.id.clone(),
                reason: f.reason.clone(),
            })
            .collect(),
        skew_ms: m.skew_ms,
        abort_reason: m.abort_reason.clone(),
        aborted_by: m.aborted_by,
        created_at_ms: m.created_at.as_ref().map_or(0, timestamp_ms),
        updated_at_ms: m.updated_at.as_ref().map_or(0, timestamp_ms),
        strategy: m.strategy,
    }
}

/// The port record of a node that is gone from the stream.
pub fn gone_node(mut last: Node) -> Node {
    last.state = PortNodeState::Terminated as i32;
    last.inventory = None;
    last
}

/// Whether the instance stopped for failure before it ever ran: the published API's only way
/// to tell that a node refused a start (StartJob answers Empty).
pub fn refused(i: &InstanceView) -> bool {
    i.stop_reason == Some(stopping::JOB_FAILED)
        && !i.ran
        && matches!(i.phase, InstancePhase::Stopping | InstancePhase::Stopped)
}

fn instance_state(i: &InstanceView) -> (JobState, StopReason) {
    let failed = matches!(
        i.stop_reason,
        Some(stopping::NODE_STOPPED | stopping::UNKNOWN_JOB | stopping::JOB_FAILED)
    );
    let reason = match i.stop_reason {
        Some(stopping::NODE_STOPPED) => StopReason::NodeLost,
        Some(stopping::NODE_TERMINATED) => StopReason::NodeTerminated,
        Some(stopping::USER_REQUESTED) => StopReason::Requested,
        _ => StopReason::Unspecified,
    };
    let state = match i.phase {
        InstancePhase::Provisioned => JobState::Starting,
        InstancePhase::Running => JobState::Running,
        InstancePhase::Stopping | InstancePhase::Stopped if failed => JobState::Failed,
        InstancePhase::Stopping => JobState::Stopping,
        InstancePhase::Stopped => JobState::Stopped,
    };
    (state, reason)
}

fn parse_tag<T: std::str::FromStr>(t: &BTreeMap<String, String>, key: &str) -> Option<T> {
    t.get(key).and_then(|v| v.parse().ok())
}

/// The requirements a job's tags carry.
pub fn requirements_of(t: &BTreeMap<String, String>) -> JobRequirements {
    JobRequirements {
        required_capacity: parse_tag(t, tags::CAPACITY).unwrap_or(0.0),
        required_cores: parse_tag(t, tags::CORES).unwrap_or(0),
        required_capabilities: t
            .get(tags::CAPABILITIES)
            .map(|c| {
                c.split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        priority_band: t.get(tags::BAND).cloned().unwrap_or_default(),
    }
}

/// The port record of one of our stored jobs, or `None` when it is not ours (no owner tag of
/// ours, or no bundle tags).
pub fn port_job(view: &JobView, owner: &str, overlay: &StopOverlay) -> Option<Job> {
    let t = view.tags();
    if !tags::owned_by(t, owner) {
        return None;
    }
    let bundle_id = t.get(tags::BUNDLE)?.clone();
    let replica: u32 = parse_tag(t, tags::REPLICA)?;
    let job_name = t.get(tags::JOB)?.clone();
    let job_id = view.job_id().to_owned();
    let mut instances = Vec::new();
    let (mut state, mut node_id, mut updated_at_ms) = (JobState::Pending, String::new(), 0);
    for i in view.instances.values() {
        let Some(role) = port_role(&i.role) else {
            continue;
        };
        if refused(i) {
            // A start the node refused: never an instance, as our first API leaves such a
            // job pending rather than failed (the start's answer says it was refused).
            continue;
        }
        let (istate, mut reason) = instance_state(i);
        if role == JobRole::MigrationTarget
            && matches!(i.phase, InstancePhase::Stopping | InstancePhase::Stopped)
        {
            // A target that stopped (aborted) or went on under the job's role (completed) is
            // not an instance any more; the migration's record says which.
            continue;
        }
        if reason == StopReason::Requested
            && let Some(r) = overlay.get(&(job_id.clone(), i.role.clone()))
        {
            reason = *r;
        }
        if role == JobRole::Normal {
            state = istate;
            node_id = i.node_id.clone();
        }
        updated_at_ms = updated_at_ms.max(i.at_ms);
        instances.push(JobInstance {
            node_id: i.node_id.clone(),
            role: role as i32,
            state: istate as i32,
            migration_id: String::new(),
            started_at_ms: if istate == JobState::Running {
                i.at_ms
            } else {
                0
            },
            stop_reason: reason as i32,
            message: String::new(),
        });
    }
    Some(Job {
        job_id,
        bundle_id,
        replica,
        job_name,
        requirements: Some(requirements_of(t)),
        state: state as i32,
        node_id,
        instances,
        config: view.job.manager_configuration.clone().into_bytes(),
        updated_at_ms,
    })
}

/// A bundle rebuilt from its jobs' tags (the published API stores no bundles): the replica
/// count its jobs were written with, and each job name once with its requirements.
pub fn bundle_from_jobs<'a>(
    bundle_id: &str,
    jobs: impl IntoIterator<Item = (&'a Job, &'a BTreeMap<String, String>, &'a [u8])>,
) -> Option<Bundle> {
    let mut replicas = 0u32;
    let mut by_name: BTreeMap<String, BundleJob> = BTreeMap::new();
    for (job, t, template) in jobs {
        replicas = replicas
            .max(parse_tag(t, tags::REPLICAS).unwrap_or(0))
            .max(job.replica.saturating_add(1));
        by_name.entry(job.job_name.clone()).or_insert(BundleJob {
            job_name: job.job_name.clone(),
            requirements: job.requirements.clone(),
            config: job.config.clone(),
            template: template.to_vec(),
        });
    }
    if by_name.is_empty() {
        return None;
    }
    Some(Bundle {
        bundle_id: bundle_id.to_owned(),
        replicas,
        jobs: by_name.into_values().collect(),
        generation: 0,
        labels: HashMap::new(),
    })
}

/// How many replicas of `bundle` Manager holds whole, counting from replica 0: each with every
/// job name of the bundle in `stored` (replica, job name). The published API stores one job per
/// call, so a registration cut off half-way (Manager unreachable between two calls) leaves a
/// replica with some of its jobs only; counting it whole would make the rebuilt bundle equal to
/// what was asked, and the missing jobs would never be asked for again.
pub fn whole_replicas(bundle: &Bundle, stored: &std::collections::BTreeSet<(u32, String)>) -> u32 {
    (0..bundle.replicas)
        .take_while(|r| {
            bundle
                .jobs
                .iter()
                .all(|j| stored.contains(&(*r, j.job_name.clone())))
        })
        .count() as u32
}

/// The definition part of a stored job, encoded as the port carries a bundle job's template
/// (`BundleJob.template`): everything but what the port stamps in (id, tags, description,
/// configuration) and what Manager adds (hash, state, start time). Empty for a job stored
/// without a template.
pub fn template_of(stored: &StoredJob) -> Vec<u8> {
    definition_only(stored).encode_to_vec()
}

/// Only the definition fields of a job, so nothing a template carries can stand in for what
/// the port stamps or Manager owns.
fn definition_only(t: &StoredJob) -> StoredJob {
    StoredJob {
        services: t.services.clone(),
        norsk_media_version: t.norsk_media_version,
        norsk_service_parameters: t.norsk_service_parameters.clone(),
        volumes: t.volumes.clone(),
        shape: t.shape.clone(),
        architecture: t.architecture.clone(),
        subnet: t.subnet.clone(),
        availability_domain: t.availability_domain.clone(),
        ..Default::default()
    }
}

/// The stored job the port writes for replica `replica` of `bundle`'s job `job`: its template
/// (Manager's job definition) with the job's id, tags, description and configuration stamped
/// in. Refused when the template is not an encoded job definition.
pub fn stored_job(
    bundle: &Bundle,
    replica: u32,
    job: &BundleJob,
    owner: &str,
) -> Result<StoredJob, String> {
    let template = StoredJob::decode(job.template.as_slice()).map_err(|e| {
        format!(
            "job {}: the template is not a job definition: {e}",
            job.job_name
        )
    })?;
    let req = job.requirements.clone().unwrap_or_default();
    let mut t = BTreeMap::from([
        (tags::OWNER.to_owned(), owner.to_owned()),
        (tags::BUNDLE.to_owned(), bundle.bundle_id.clone()),
        (tags::REPLICA.to_owned(), replica.to_string()),
        (tags::REPLICAS.to_owned(), bundle.replicas.to_string()),
        (tags::JOB.to_owned(), job.job_name.clone()),
        (tags::CAPACITY.to_owned(), req.required_capacity.to_string()),
        (tags::CORES.to_owned(), req.required_cores.to_string()),
    ]);
    if !req.required_capabilities.is_empty() {
        t.insert(
            tags::CAPABILITIES.to_owned(),
            req.required_capabilities.join(","),
        );
    }
    if !req.priority_band.is_empty() {
        t.insert(tags::BAND.to_owned(), req.priority_band.clone());
    }
    Ok(StoredJob {
        job_id: Some(JobId {
            job_id: port_job_id(&bundle.bundle_id, replica, &job.job_name),
        }),
        description: format!(
            "replica {replica} of {} for Bundle {}",
            job.job_name, bundle.bundle_id
        ),
        tags: t.into_iter().collect(),
        manager_configuration: String::from_utf8_lossy(&job.config).into_owned(),
        ..definition_only(&template)
    })
}

/// A runtime job's id: `bundle/replica/job`, as the port model names it.
pub fn port_job_id(bundle_id: &str, replica: u32, job_name: &str) -> String {
    format!("{bundle_id}/{replica}/{job_name}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::published::mirror::JobListing;
    use manager_proto::api::manager::Job as Stored;

    fn bundle() -> Bundle {
        Bundle {
            bundle_id: "news".to_owned(),
            replicas: 2,
            jobs: vec![BundleJob {
                job_name: "encode".to_owned(),
                requirements: Some(JobRequirements {
                    required_capacity: 12.5,
                    required_cores: 4,
                    required_capabilities: vec!["gpu".to_owned(), "sdi".to_owned()],
                    priority_band: "gold".to_owned(),
                }),
                config: br#"{"a":1}"#.to_vec(),
                template: Vec::new(),
            }],
            ..Default::default()
        }
    }

    fn view(job: Stored, instances: Vec<InstanceView>) -> JobView {
        JobView {
            job,
            history: Vec::new(),
            listing: JobListing::Active,
            instances: instances.into_iter().map(|i| (i.role.clone(), i)).collect(),
            completed: false,
        }
    }

    fn instance(role: &str, phase: InstancePhase, stop_reason: Option<i32>) -> InstanceView {
        InstanceView {
            role: role.to_owned(),
            node_id: "n1".to_owned(),
            phase,
            at_ms: 5,
            stop_reason,
            ran: phase != InstancePhase::Provisioned,
        }
    }

    #[test]
    fn a_stored_job_carries_its_bundle_and_requirements_back_through_its_tags() {
        let b = bundle();
        let stored = stored_job(&b, 1, &b.jobs[0], "me").expect("a job definition");
        let job = port_job(&view(stored, Vec::new()), "me", &StopOverlay::new()).expect("ours");
        assert_eq!(job.job_id, "news/1/encode");
        assert_eq!((job.bundle_id.as_str(), job.replica), ("news", 1));
        assert_eq!(job.requirements, b.jobs[0].requirements);
        assert_eq!(job.config, b.jobs[0].config);
        assert_eq!(job.state, JobState::Pending as i32);
        let tags = stored_job(&b, 1, &b.jobs[0], "me")
            .expect("a job definition")
            .tags;
        let rebuilt = bundle_from_jobs("news", [(&job, &tags, &[][..])]).expect("a bundle");
        assert_eq!(rebuilt.replicas, 2);
        assert_eq!(rebuilt.jobs, b.jobs);
    }

    #[test]
    fn a_replica_missing_one_of_its_jobs_is_not_whole() {
        let mut b = bundle();
        let mut second = b.jobs[0].clone();
        second.job_name = "package".to_owned();
        b.jobs.push(second);
        let all: std::collections::BTreeSet<(u32, String)> = (0..b.replicas)
            .flat_map(|r| b.jobs.iter().map(move |j| (r, j.job_name.clone())))
            .collect();
        assert_eq!(whole_replicas(&b, &all), b.replicas);
        // Cut off after the first job of the last replica: that replica is not whole.
        let last = b.replicas - 1;
        let mut cut = all.clone();
        cut.retain(|(r, name)| *r < last || *name == b.jobs[0].job_name);
        assert_eq!(whole_replicas(&b, &cut), last);
        // A replica missing before a whole one: only those before the gap count.
        let mut gap = all;
        gap.retain(|(r, _)| *r != 0);
        assert_eq!(whole_replicas(&b, &gap), 0);
    }

    #[test]
    fn a_job_without_our_owner_tag_is_not_in_the_model() {
        let b = bundle();
        let mut stored = stored_job(&b, 0, &b.jobs[0], "someone-else").expect("a job definition");
        assert!(port_job(&view(stored.clone(), Vec::new()), "me", &StopOverlay::new()).is_none());
        stored.tags.remove(tags::OWNER);
        assert!(port_job(&view(stored, Vec::new()), "me", &StopOverlay::new()).is_none());
    }

    #[test]
    fn each_history_step_maps_to_the_port_state_and_stop_reason() {
        let cases = [
            (
                InstancePhase::Provisioned,
                None,
                JobState::Starting,
                StopReason::Unspecified,
            ),
            (
                InstancePhase::Running,
                None,
                JobState::Running,
                StopReason::Unspecified,
            ),
            (
                InstancePhase::Stopping,
                Some(2),
                JobState::Stopping,
                StopReason::Requested,
            ),
            (
                InstancePhase::Stopped,
                Some(2),
                JobState::Stopped,
                StopReason::Requested,
            ),
            (
                InstancePhase::Stopped,
                Some(1),
                JobState::Stopped,
                StopReason::NodeTerminated,
            ),
            (
                InstancePhase::Stopping,
                Some(0),
                JobState::Failed,
                StopReason::NodeLost,
            ),
            (
                InstancePhase::Stopped,
                Some(4),
                JobState::Failed,
                StopReason::Unspecified,
            ),
        ];
        let b = bundle();
        for (phase, reason, state, stop) in cases {
            let stored = stored_job(&b, 0, &b.jobs[0], "me").expect("a job definition");
            let v = view(stored, vec![instance(tags::ROLE_NORMAL, phase, reason)]);
            let job = port_job(&v, "me", &StopOverlay::new()).expect("ours");
            assert_eq!(job.state, state as i32, "{phase:?} {reason:?}");
            assert_eq!(
                job.instances[0].stop_reason, stop as i32,
                "{phase:?} {reason:?}"
            );
        }
    }

    #[test]
    fn a_start_that_failed_before_it_ran_is_a_refusal_and_leaves_the_job_pending() {
        let b = bundle();
        let stored = stored_job(&b, 0, &b.jobs[0], "me").expect("a job definition");
        let mut refused = instance(tags::ROLE_NORMAL, InstancePhase::Stopped, Some(4));
        refused.ran = false;
        assert!(super::refused(&refused));
        let job = port_job(
            &view(stored.clone(), vec![refused]),
            "me",
            &StopOverlay::new(),
        )
        .expect("ours");
        assert_eq!(job.state, JobState::Pending as i32);
        assert!(job.instances.is_empty(), "{job:?}");
        // One that ran and then failed is a failure for recovery.
        let failed = instance(tags::ROLE_NORMAL, InstancePhase::Stopped, Some(4));
        assert!(!super::refused(&failed));
        let job = port_job(&view(stored, vec![failed]), "me", &StopOverlay::new()).expect("ours");
        assert_eq!(job.state, JobState::Failed as i32);
    }

    #[test]
    fn a_stop_handed_to_recovery_keeps_that_reason_and_foreign_roles_are_left_out() {
        let b = bundle();
        let stored = stored_job(&b, 0, &b.jobs[0], "me").expect("a job definition");
        let v = view(
            stored,
            vec![
                instance(tags::ROLE_NORMAL, InstancePhase::Stopped, Some(2)),
                instance("someone-elses-role", InstancePhase::Running, None),
            ],
        );
        let overlay = StopOverlay::from([(
            ("news/0/encode".to_owned(), tags::ROLE_NORMAL.to_owned()),
            StopReason::HandedToRecovery,
        )]);
        let job = port_job(&v, "me", &overlay).expect("ours");
        assert_eq!(job.instances.len(), 1);
        assert_eq!(
            job.instances[0].stop_reason,
            StopReason::HandedToRecovery as i32
        );
    }
}
