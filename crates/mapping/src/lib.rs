//! Translations between the three vocabularies the operator speaks: the CRDs
//! (`automanager_api`), the placement engine's model (`automanager_placement`) and Manager's
//! wire types (`manager_proto`). Pure functions, no I/O.
//!
//! The translations to and from Manager's wire types are behind the `wire` feature (on by
//! default): the kubectl plugin uses the CRD and engine ones only, without tonic and prost.

pub mod bundle_status;
#[cfg(feature = "wire")]
pub mod job_template;

use std::collections::BTreeMap;

use automanager_api as api;
use automanager_placement as pl;
#[cfg(feature = "wire")]
use manager_proto as proto;

pub use automanager_policy::tags::{
    PROVISIONED_FOR_TAG, SPARE_BAND_TAG, SPARE_TAG, SPARE_TARGET_TAG,
};

/// Manager's bundle id for a Bundle object ([`BundleId`] holds the format).
pub fn bundle_id(namespace: &str, name: &str) -> String {
    BundleId::of(namespace, name).to_string()
}

#[cfg(feature = "wire")]
/// Manager's job state as the bundle planner reads it.
pub fn job_phase(state: proto::JobState) -> automanager_policy::bundle::JobPhase {
    use automanager_policy::bundle::JobPhase as P;
    match state {
        proto::JobState::Starting => P::Starting,
        proto::JobState::Running => P::Running,
        proto::JobState::Stopping => P::Stopping,
        proto::JobState::Stopped => P::Stopped,
        proto::JobState::Failed => P::Failed,
        proto::JobState::Pending | proto::JobState::Unspecified => P::Pending,
    }
}

#[cfg(feature = "wire")]
/// Manager's stop reason as the bundle planner reads it.
pub fn stop_cause(reason: proto::StopReason) -> automanager_policy::bundle::StopCause {
    use automanager_policy::bundle::StopCause as C;
    match reason {
        proto::StopReason::Unspecified => C::Unknown,
        proto::StopReason::Requested | proto::StopReason::MigrationAborted => C::Requested,
        proto::StopReason::NodeLost => C::NodeLost,
        proto::StopReason::NodeTerminated => C::NodeTerminated,
        proto::StopReason::HandedToRecovery => C::HandedToRecovery,
        proto::StopReason::BundleRemoved | proto::StopReason::Migrated => C::Gone,
    }
}

/// A HotSpareTarget's spec as the spare planner reads it.
pub fn spare_target(spec: &api::HotSpareTargetSpec) -> automanager_policy::spares::SpareTarget {
    automanager_policy::spares::SpareTarget {
        pool: spec.pool.clone(),
        target_count: spec.target_count,
        for_band: spec.for_band,
        instance_type: spec.spec.instance_type.clone(),
        region: spec.spec.region.clone(),
        max_age: spec.max_age.clone(),
    }
}

pub use automanager_policy::ids::{BundleId, MAX_MANAGER_ID};

/// Why a Bundle's ids would not fit Manager's bound, if they would not. The CRD refuses names
/// over `automanager_api::MAX_NAME`; this guards objects written around that rule (an older
/// CRD, say) so the bundle says why instead of failing every pass.
pub fn ids_too_long(bundle_id: &str, spec: &api::BundleSpec) -> Option<String> {
    let last_replica = spec.replicas.saturating_sub(1).max(0).to_string();
    let longest_job = spec
        .jobs
        .iter()
        .map(|j| j.job_name.len())
        .max()
        .unwrap_or(0);
    let job_id = bundle_id.len() + 1 + last_replica.len() + 1 + longest_job;
    (job_id > MAX_MANAGER_ID).then(|| {
        format!(
            "job ids of this bundle would be {job_id} bytes (`{bundle_id}/<replica>/<jobName>`), more than the {MAX_MANAGER_ID} Manager accepts: use a shorter name (at most {} characters) or job names",
            api::MAX_NAME
        )
    })
}

/// A job configuration that cannot be sent: larger than Manager accepts, or nested deeper than
/// AutoManager passes on (see `automanager_api::job_config`). Says which, once.
pub fn config_refused(spec: &api::BundleSpec) -> Option<String> {
    spec.jobs.iter().find_map(|j| {
        let config = j.config.as_ref()?;
        let len = config.as_json().len();
        if len > api::MAX_JOB_CONFIG_BYTES {
            return Some(format!(
                "jobs[{}].config is {len} bytes as JSON, more than the {} Manager accepts",
                j.job_name,
                api::MAX_JOB_CONFIG_BYTES
            ));
        }
        let depth = config.depth();
        (depth > api::MAX_JOB_CONFIG_DEPTH).then(|| {
            format!(
                "jobs[{}].config nests {depth} levels deep, more than the {} AutoManager accepts",
                j.job_name,
                api::MAX_JOB_CONFIG_DEPTH
            )
        })
    })
}

/// The Bundle object a Manager bundle id belongs to, as `(namespace, name)`.
pub fn bundle_object(bundle_id: &str) -> Option<(String, String)> {
    let id = BundleId::parse(bundle_id)?;
    let (ns, name) = id.object();
    Some((ns.to_owned(), name.to_owned()))
}

/// FNV-1a of `s`: stable across runs and platforms, for names derived from ids.
pub use automanager_api::bounded::fnv1a;

/// The object name of a ManagerNode for a Manager node id: the id itself when it is a valid
/// DNS subdomain, else a sanitised form with a short hash so distinct ids stay distinct.
pub fn node_object_name(node_id: &str) -> String {
    let valid = !node_id.is_empty()
        && node_id.len() <= 253
        && node_id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && node_id
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && node_id
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if valid {
        return node_id.to_owned();
    }
    let mut clean: String = node_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    clean.truncate(200);
    let clean = clean.trim_matches('-');
    let hash = fnv1a(node_id);
    format!(
        "{}-{:08x}",
        if clean.is_empty() { "node" } else { clean },
        hash as u32
    )
}

pub fn parse_band(s: &str) -> Option<api::PriorityBand> {
    match s {
        "gold" => Some(api::PriorityBand::Gold),
        "silver" => Some(api::PriorityBand::Silver),
        "bronze" => Some(api::PriorityBand::Bronze),
        _ => None,
    }
}

/// Capacity and cores are whole units in the CRDs; the engine and Manager use f64 / u32.
fn cores(c: i32) -> u32 {
    u32::try_from(c).unwrap_or(0)
}

pub fn rules(r: &api::PlacementRules) -> pl::PlacementRules {
    fn strength(e: api::Enforcement) -> pl::Strength {
        match e {
            api::Enforcement::Hard => pl::Strength::Hard,
            api::Enforcement::Soft => pl::Strength::Soft,
        }
    }
    let mut out = pl::PlacementRules::none();
    match r.node.relation {
        api::Relation::Same => out.same_node = Some(strength(r.node.enforcement)),
        api::Relation::Different => out.different_node = Some(strength(r.node.enforcement)),
        api::Relation::Any => {}
    }
    match r.zone.relation {
        api::Relation::Same => out.same_zone = Some(strength(r.zone.enforcement)),
        api::Relation::Different => out.different_zone = Some(strength(r.zone.enforcement)),
        api::Relation::Any => {}
    }
    out
}

pub fn job(j: &api::BundleJob) -> pl::JobSpec {
    pl::JobSpec {
        job_name: j.job_name.clone(),
        requirements: pl::Requirements {
            required_capacity: j.requirements.required_capacity as f64,
            required_cores: cores(j.requirements.required_cores),
            required_capabilities: j.requirements.required_capabilities.clone(),
            priority_band: j.requirements.priority_band,
        },
        co_locate_with: j.co_locate_with.clone(),
        separate_from: j.separate_from.clone(),
    }
}

/// A Bundle as the engine sees it.
pub fn bundle(bundle_id: &str, spec: &api::BundleSpec) -> pl::BundleSpec {
    pl::BundleSpec {
        bundle_id: bundle_id.to_owned(),
        replicas: u32::try_from(spec.replicas).unwrap_or(0),
        pools: spec.pools.clone(),
        jobs: spec.jobs.iter().map(job).collect(),
        replica_overrides: spec
            .replica_overrides
            .iter()
            .filter_map(|o| {
                Some((
                    u32::try_from(o.replica).ok()?,
                    pl::ReplicaOverride {
                        pools: o.pools.clone(),
                    },
                ))
            })
            .collect::<BTreeMap<_, _>>(),
        intra_replica_placement: rules(&spec.intra_replica_rules()),
        inter_replica_placement: rules(&spec.inter_replica_placement),
    }
}

#[cfg(feature = "wire")]
/// A Bundle as Manager registers it.
pub fn proto_bundle(bundle_id: &str, spec: &api::BundleSpec) -> proto::Bundle {
    proto::Bundle {
        bundle_id: bundle_id.to_owned(),
        replicas: u32::try_from(spec.replicas).unwrap_or(0),
        jobs: spec
            .jobs
            .iter()
            .map(|j| proto::BundleJob {
                job_name: j.job_name.clone(),
                requirements: Some(proto::JobRequirements {
                    required_capacity: j.requirements.required_capacity as f64,
                    required_cores: j.requirements.required_cores,
                    required_capabilities: j.requirements.required_capabilities.clone(),
                    priority_band: j.requirements.priority_band.as_str().to_owned(),
                }),
                config: j.config_bytes(),
                template: job_template::template_bytes(j.template.as_ref()),
            })
            .collect(),
        ..Default::default()
    }
}

#[cfg(feature = "wire")]
/// Whether Manager's registered bundle already matches what we would register (the generation
/// Manager keeps is its own and is ignored).
pub fn registered_matches(registered: &proto::Bundle, wanted: &proto::Bundle) -> bool {
    registered.bundle_id == wanted.bundle_id
        && registered.replicas == wanted.replicas
        && registered.jobs == wanted.jobs
}

pub fn pool_kind(k: api::PoolKind) -> pl::PoolKind {
    match k {
        api::PoolKind::Aws => pl::PoolKind::Aws,
        api::PoolKind::Oci => pl::PoolKind::Oci,
        api::PoolKind::Cluster => pl::PoolKind::Cluster,
    }
}

#[cfg(feature = "wire")]
pub fn provider(k: api::PoolKind) -> proto::ProviderKind {
    match k {
        api::PoolKind::Aws => proto::ProviderKind::Aws,
        api::PoolKind::Oci => proto::ProviderKind::Oci,
        api::PoolKind::Cluster => proto::ProviderKind::Cluster,
    }
}

#[cfg(feature = "wire")]
/// The Manager provider of an engine pool kind.
pub fn provider_of(k: pl::PoolKind) -> proto::ProviderKind {
    match k {
        pl::PoolKind::Aws => proto::ProviderKind::Aws,
        pl::PoolKind::Oci => proto::ProviderKind::Oci,
        pl::PoolKind::Cluster => proto::ProviderKind::Cluster,
    }
}

#[cfg(feature = "wire")]
pub fn api_provider(p: i32) -> Option<api::PoolKind> {
    match proto::ProviderKind::try_from(p).ok()? {
        proto::ProviderKind::Aws => Some(api::PoolKind::Aws),
        proto::ProviderKind::Oci => Some(api::PoolKind::Oci),
        proto::ProviderKind::Cluster => Some(api::PoolKind::Cluster),
        proto::ProviderKind::Unspecified => None,
    }
}

/// A PlacementPool as the engine sees it.
pub fn pool(name: &str, spec: &api::PlacementPoolSpec) -> pl::PoolSpec {
    pl::PoolSpec {
        name: name.to_owned(),
        kind: pool_kind(spec.kind),
        region: spec.region.clone(),
        zones: spec.zones.clone(),
        packing_strategy: match spec.packing_strategy {
            api::PackingStrategy::Binpack => pl::PackingStrategy::Binpack,
            api::PackingStrategy::Spread => pl::PackingStrategy::Spread,
        },
        scale_out: spec.scale_out,
        candidate_instance_types: spec
            .candidate_instance_types
            .iter()
            .map(|t| pl::InstanceTypeSpec {
                instance_type: t.instance_type.clone(),
                total_capacity: t.total_capacity as f64,
                total_cores: cores(t.total_cores),
                capabilities: t.capabilities.clone(),
            })
            .collect(),
        max_nodes: spec.max_nodes.and_then(|m| u32::try_from(m).ok()),
        terminating: false,
    }
}

/// What the operator layers over Manager's view of a node.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeOverlay {
    /// `ManagerNode.spec.cordoned`, or a drain in progress.
    pub cordoned: bool,
    /// False when the node's rejection rate tripped the threshold.
    pub unhealthy: bool,
    /// Consolidation is emptying the node: no new placements, as a cordon.
    pub consolidating: bool,
}

#[cfg(feature = "wire")]
/// Whether Manager's node is a hot spare, and for which band.
pub fn spare_of(node: &proto::Node) -> (bool, Option<api::PriorityBand>) {
    let spare = node.tags.get(SPARE_TAG).is_some_and(|v| v == "true");
    (
        spare,
        node.tags.get(SPARE_BAND_TAG).and_then(|b| parse_band(b)),
    )
}

#[cfg(feature = "wire")]
/// A Manager node as the engine sees it, or `None` when it can take no job (stopped or
/// terminated). A starting node counts as pending capacity; its size comes from its inventory
/// or, before the worker reports one, from its pool's candidate instance type.
pub fn node(
    n: &proto::Node,
    usage: (f64, i32),
    overlay: NodeOverlay,
    pool_spec: Option<&pl::PoolSpec>,
) -> Option<pl::NodeSpec> {
    let state = proto::NodeState::try_from(n.state).unwrap_or(proto::NodeState::Unspecified);
    let pending = match state {
        proto::NodeState::Started => false,
        proto::NodeState::Starting => true,
        _ => return None,
    };
    let (capacity, total_cores, capabilities, zone) = match &n.inventory {
        Some(inv) => (
            inv.capacity,
            u32::try_from(inv.cores).unwrap_or(0),
            inv.capabilities.clone(),
            inv.zone.clone(),
        ),
        None => {
            let t = pool_spec?
                .candidate_instance_types
                .iter()
                .find(|t| t.instance_type == n.instance_type)?;
            (
                t.total_capacity,
                t.total_cores,
                t.capabilities.clone(),
                n.zone.clone(),
            )
        }
    };
    let zone = if zone.is_empty() {
        n.zone.clone()
    } else {
        zone
    };
    let (spare, spare_band) = spare_of(n);
    let spare = spare && usage.0 <= 0.0;
    Some(pl::NodeSpec {
        id: n.node_id.clone(),
        pool: n.pool.clone(),
        zone: (!zone.is_empty()).then_some(zone),
        instance_type: (!n.instance_type.is_empty()).then(|| n.instance_type.clone()),
        total_capacity: capacity.max(0.0),
        used_capacity: usage.0.max(0.0),
        total_cores,
        used_cores: u32::try_from(usage.1).unwrap_or(0),
        capabilities,
        // A node Manager will take (a reclaim notice) is no place for new work: nothing is
        // placed, recovered or moved onto it, as on a cordoned node.
        cordoned: overlay.cordoned || overlay.consolidating || n.reclaim_at_ms > 0,
        healthy: !overlay.unhealthy,
        spare,
        spare_band: if spare { spare_band } else { None },
        pending_since_ms: pending.then(|| u64::try_from(n.created_at_ms).unwrap_or(0)),
    })
}

/// The bounded trace summary the Bundle status keeps, from the engine's summary.
pub fn trace_summary(
    s: &pl::TraceSummary,
    recovery: bool,
    decided_at: chrono::DateTime<chrono::Utc>,
    job_node: Option<&str>,
) -> api::PlacementTraceSummary {
    let outcome = match s.outcome {
        pl::OutcomeKind::Placed => api::PlacementOutcome::Placed,
        pl::OutcomeKind::Provision => api::PlacementOutcome::Provisioning,
        pl::OutcomeKind::Unplaceable => api::PlacementOutcome::Unplaceable,
    };
    let pools_tried = s
        .pools_tried
        .iter()
        .take(api::MAX_POOLS_TRIED)
        .map(|p| api::PoolAttempt {
            pool: p.pool.clone(),
            outcome: match p.outcome {
                pl::PoolOutcome::Placed => api::PlacementOutcome::Placed,
                pl::PoolOutcome::Provision => api::PlacementOutcome::Provisioning,
                pl::PoolOutcome::Left => api::PlacementOutcome::Unplaceable,
            },
            reason: p.reason.map(|r| r.as_str().to_owned()).unwrap_or_default(),
        })
        .collect();
    api::PlacementTraceSummary {
        decided_at,
        outcome,
        recovery,
        node: job_node
            .map(str::to_owned)
            .or_else(|| s.chosen_node.clone()),
        pool: s.pool.clone(),
        score: None,
        pools_tried,
        rejections: s
            .rejections
            .iter()
            .take(api::MAX_REJECTION_REASONS)
            .map(|r| api::RejectionCount {
                reason: r.reason.as_str().to_owned(),
                count: i64::try_from(r.count).unwrap_or(i64::MAX),
            })
            .collect(),
        broken_soft_rules: s
            .broken_soft_rules
            .iter()
            .take(api::MAX_BROKEN_SOFT_RULES)
            .map(|r| r.as_str().to_owned())
            .collect(),
        message: s.message.chars().take(1000).collect(),
        preempted: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_longer_than_manager_accepts_are_named_before_anything_is_sent() {
        let spec: api::BundleSpec = serde_json::from_value(serde_json::json!({
            "replicas": 2, "pools": ["p"],
            "jobs": [{"jobName": "e".repeat(63), "requirements": {"requiredCapacity": 1, "priorityBand": "gold"}}]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let fits = bundle_id(&"n".repeat(63), &"b".repeat(api::MAX_NAME));
        assert_eq!(ids_too_long(&fits, &spec), None);
        let long = bundle_id("default", &"b".repeat(250));
        assert!(ids_too_long(&long, &spec).is_some_and(|m| m.contains("more than the 253")));
    }

    #[cfg(feature = "wire")]
    #[test]
    fn a_node_under_a_reclaim_notice_takes_no_new_work() {
        let n = proto::Node {
            node_id: "n1".into(),
            pool: "p".into(),
            state: proto::NodeState::Started as i32,
            inventory: Some(proto::NodeInventory {
                capacity: 10.0,
                cores: 4,
                ..Default::default()
            }),
            ..Default::default()
        };
        let open = node(&n, (0.0, 0), NodeOverlay::default(), None).unwrap_or_else(|| panic!());
        assert!(!open.cordoned);
        let noticed = proto::Node {
            reclaim_at_ms: 1_700_000_000_000,
            ..n
        };
        let closed =
            node(&noticed, (0.0, 0), NodeOverlay::default(), None).unwrap_or_else(|| panic!());
        assert!(closed.cordoned);
    }

    #[test]
    fn valid_node_ids_are_object_names_and_others_are_sanitised_distinctly() {
        assert_eq!(node_object_name("aws-east-1"), "aws-east-1");
        let a = node_object_name("Node_A/1");
        let b = node_object_name("node-a-1");
        assert_ne!(a, b);
        assert!(a.starts_with("node-a-1-"));
        assert!(node_object_name("").starts_with("node-"));
        assert!(node_object_name(&"X".repeat(400)).len() <= 253);
    }

    #[test]
    fn relation_rules_map_to_the_engine_rules() {
        let r = rules(&api::PlacementRules::inter_replica_default());
        assert_eq!(r, pl::PlacementRules::inter_replica_default());
        assert_eq!(
            rules(&api::PlacementRules::intra_replica_default()),
            pl::PlacementRules::none()
        );
    }
}
