//! Bundle validation: static checks, and admission (static + a dry run of every replica).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, Outcome};
use crate::engine::{Engine, NumberProblem, check_cores, to_milli};
use crate::model::{
    BundleSpec, NodeSpec, PlacementKind, PlacementRules, PoolSpec, Position, Strength,
};
use crate::place::MAX_JOBS_PER_REPLICA;

/// Most replicas a bundle may declare.
pub const MAX_REPLICAS: u32 = 64;

#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum ValidationError {
    #[error("bundleId is empty")]
    EmptyBundleId,
    #[error("replicas is {replicas}; it must be between 1 and {max}")]
    ReplicaCount { replicas: u32, max: u32 },
    #[error("the bundle has no jobs")]
    NoJobs,
    #[error("the bundle has {count} jobs; at most {max}")]
    TooManyJobs { count: usize, max: usize },
    #[error("job #{index} has an empty jobName")]
    EmptyJobName { index: usize },
    #[error("jobName {job:?} is used twice")]
    DuplicateJobName { job: String },
    #[error("job {job:?}: {field} is {problem}")]
    InvalidRequirement {
        job: String,
        field: String,
        problem: NumberProblem,
    },
    #[error("job {job:?}: {field} names unknown job {target:?}")]
    UnknownJobReference {
        job: String,
        field: String,
        target: String,
    },
    #[error("job {job:?}: {detail}")]
    ContradictoryPlacement { job: String, detail: String },
    #[error("{scope} placement rules: {detail}")]
    ContradictoryRules { scope: String, detail: String },
    #[error("replica {replica} has no pools (bundle pools are empty and it has no override)")]
    NoPools { replica: u32 },
    #[error("pool {pool:?}{} does not exist", replica.map(|r| format!(" (override of replica {r})")).unwrap_or_default())]
    UnknownPool { pool: String, replica: Option<u32> },
    #[error("pool {pool:?} is listed twice{}", replica.map(|r| format!(" (override of replica {r})")).unwrap_or_default())]
    DuplicatePool { pool: String, replica: Option<u32> },
    #[error("replicaOverrides has index {index}, but the bundle has {replicas} replicas")]
    OverrideOutOfRange { index: u32, replicas: u32 },
    #[error(
        "job {job:?} needs capabilities {capabilities:?} that no instance type or node of pools {pools:?} offers"
    )]
    UnsatisfiableCapabilities {
        job: String,
        capabilities: Vec<String>,
        pools: Vec<String>,
    },
    #[error(
        "job {job:?} (with the jobs sharing its node) needs {capacity} capacity and {cores} cores: \
         more than any instance type or node of pools {pools:?} with its capabilities"
    )]
    NeverFits {
        job: String,
        capacity: f64,
        cores: u32,
        pools: Vec<String>,
    },
}

/// One job that the dry run could not place.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnplaceableJob {
    pub replica_index: u32,
    pub job_name: String,
    pub reason: String,
}

/// The answer of [`validate_admission`], as the TypeScript library's `validateBundleAdmission`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum AdmissionResult {
    Ok,
    ValidationErrors { errors: Vec<ValidationError> },
    NoCapacity { unplaceable: Vec<UnplaceableJob> },
}

/// Static checks of a bundle against pool definitions and the nodes known (pass an empty
/// slice when none are known: capabilities and sizes are then checked against candidate
/// instance types only).
pub fn validate_bundle(
    bundle: &BundleSpec,
    pools: &[PoolSpec],
    nodes: &[NodeSpec],
) -> Vec<ValidationError> {
    let by_name: HashMap<&str, &PoolSpec> = pools.iter().map(|p| (p.name.as_str(), p)).collect();
    let mut errors = Vec::new();
    if bundle.bundle_id.is_empty() {
        errors.push(ValidationError::EmptyBundleId);
    }
    if bundle.replicas == 0 || bundle.replicas > MAX_REPLICAS {
        errors.push(ValidationError::ReplicaCount {
            replicas: bundle.replicas,
            max: MAX_REPLICAS,
        });
    }
    check_jobs(bundle, &mut errors);
    for (scope, rules) in [
        ("intraReplica", &bundle.intra_replica_placement),
        ("interReplica", &bundle.inter_replica_placement),
    ] {
        if let Some(detail) = rule_conflict(rules) {
            errors.push(ValidationError::ContradictoryRules {
                scope: scope.into(),
                detail: detail.into(),
            });
        }
    }
    // Pool references.
    let mut lists: Vec<(Option<u32>, &[String])> = vec![(None, &bundle.pools)];
    for (&index, o) in &bundle.replica_overrides {
        if index >= bundle.replicas {
            errors.push(ValidationError::OverrideOutOfRange {
                index,
                replicas: bundle.replicas,
            });
        }
        if !o.pools.is_empty() {
            lists.push((Some(index), &o.pools));
        }
    }
    for (replica, list) in &lists {
        let mut seen = BTreeSet::new();
        for p in list.iter() {
            if !seen.insert(p.as_str()) {
                errors.push(ValidationError::DuplicatePool {
                    pool: p.clone(),
                    replica: *replica,
                });
            } else if !by_name.contains_key(p.as_str()) {
                errors.push(ValidationError::UnknownPool {
                    pool: p.clone(),
                    replica: *replica,
                });
            }
        }
    }
    if bundle.pools.is_empty()
        && let Some(r) =
            (0..bundle.replicas.min(MAX_REPLICAS)).find(|r| bundle.pools_for_replica(*r).is_empty())
    {
        errors.push(ValidationError::NoPools { replica: r });
    }
    // Satisfiability, per distinct pool list actually used by some replica.
    if errors.is_empty() {
        let mut used_lists: BTreeSet<Vec<String>> = BTreeSet::new();
        for r in 0..bundle.replicas {
            used_lists.insert(bundle.pools_for_replica(r).to_vec());
        }
        for list in used_lists {
            check_fit(bundle, &list, &by_name, nodes, &mut errors);
        }
    }
    errors
}

pub(crate) fn rule_conflict(r: &PlacementRules) -> Option<&'static str> {
    let hard = |s: Option<Strength>| s == Some(Strength::Hard);
    if hard(r.same_node) && hard(r.different_node) {
        Some("sameNode and differentNode are both hard")
    } else if hard(r.same_zone) && hard(r.different_zone) {
        Some("sameZone and differentZone are both hard")
    } else if hard(r.same_node) && hard(r.different_zone) {
        Some("sameNode and differentZone are both hard")
    } else {
        None
    }
}

fn check_jobs(bundle: &BundleSpec, errors: &mut Vec<ValidationError>) {
    if bundle.jobs.is_empty() {
        errors.push(ValidationError::NoJobs);
        return;
    }
    if bundle.jobs.len() > MAX_JOBS_PER_REPLICA {
        errors.push(ValidationError::TooManyJobs {
            count: bundle.jobs.len(),
            max: MAX_JOBS_PER_REPLICA,
        });
        return;
    }
    let mut names = BTreeSet::new();
    for (index, j) in bundle.jobs.iter().enumerate() {
        if j.job_name.is_empty() {
            errors.push(ValidationError::EmptyJobName { index });
        } else if !names.insert(j.job_name.as_str()) {
            errors.push(ValidationError::DuplicateJobName {
                job: j.job_name.clone(),
            });
        }
        if let Err(problem) = to_milli(j.requirements.required_capacity, true) {
            errors.push(ValidationError::InvalidRequirement {
                job: j.job_name.clone(),
                field: "requiredCapacity".into(),
                problem,
            });
        }
        if let Err(problem) = check_cores(j.requirements.required_cores) {
            errors.push(ValidationError::InvalidRequirement {
                job: j.job_name.clone(),
                field: "requiredCores".into(),
                problem,
            });
        }
    }
    for j in &bundle.jobs {
        for (field, list) in [
            ("coLocateWith", &j.co_locate_with),
            ("separateFrom", &j.separate_from),
        ] {
            for t in list {
                if !names.contains(t.as_str()) {
                    errors.push(ValidationError::UnknownJobReference {
                        job: j.job_name.clone(),
                        field: field.into(),
                        target: t.clone(),
                    });
                }
            }
        }
    }
    let groups = groups_of(bundle);
    for j in &bundle.jobs {
        for t in &j.separate_from {
            if groups
                .get(j.job_name.as_str())
                .is_some_and(|g| groups.get(t.as_str()) == Some(g))
            {
                let detail = if *t == j.job_name {
                    "separateFrom names the job itself".to_owned()
                } else if bundle.intra_replica_placement.same_node == Some(Strength::Hard) {
                    format!("separateFrom {t:?} contradicts the hard intra-replica sameNode rule")
                } else {
                    format!(
                        "separateFrom {t:?} contradicts coLocateWith (directly or through other jobs)"
                    )
                };
                errors.push(ValidationError::ContradictoryPlacement {
                    job: j.job_name.clone(),
                    detail,
                });
            }
        }
    }
}

/// Job name → co-location group id (coLocateWith closure; one group under a hard sameNode).
fn groups_of(bundle: &BundleSpec) -> HashMap<&str, usize> {
    let n = bundle.jobs.len();
    let idx: HashMap<&str, usize> = bundle
        .jobs
        .iter()
        .enumerate()
        .map(|(i, j)| (j.job_name.as_str(), i))
        .collect();
    let mut group: Vec<usize> = (0..n).collect();
    if bundle.intra_replica_placement.same_node == Some(Strength::Hard) {
        group = vec![0; n];
    } else {
        // Small n (bounded above): repeated relabelling to a fixed point is plenty.
        let mut changed = true;
        while changed {
            changed = false;
            for (i, j) in bundle.jobs.iter().enumerate() {
                for t in &j.co_locate_with {
                    let Some(&k) = idx.get(t.as_str()) else {
                        continue;
                    };
                    let (gi, gk) = (
                        group.get(i).copied().unwrap_or(i),
                        group.get(k).copied().unwrap_or(k),
                    );
                    if gi != gk {
                        let lo = gi.min(gk);
                        for g in group.iter_mut() {
                            if *g == gi || *g == gk {
                                *g = lo;
                            }
                        }
                        changed = true;
                    }
                }
            }
        }
    }
    bundle
        .jobs
        .iter()
        .zip(group)
        .map(|(j, g)| (j.job_name.as_str(), g))
        .collect()
}

fn check_fit(
    bundle: &BundleSpec,
    list: &[String],
    pools: &HashMap<&str, &PoolSpec>,
    nodes: &[NodeSpec],
    errors: &mut Vec<ValidationError>,
) {
    let groups = groups_of(bundle);
    let mut by_group: BTreeMap<usize, (String, f64, u32, BTreeSet<&str>)> = BTreeMap::new();
    for j in &bundle.jobs {
        let Some(&g) = groups.get(j.job_name.as_str()) else {
            continue;
        };
        let e = by_group
            .entry(g)
            .or_insert_with(|| (j.job_name.clone(), 0.0, 0, BTreeSet::new()));
        e.1 += j.requirements.required_capacity;
        e.2 = e.2.saturating_add(j.requirements.required_cores);
        e.3.extend(
            j.requirements
                .required_capabilities
                .iter()
                .map(String::as_str),
        );
    }
    // Every (capacity, cores, capabilities) a node of these pools has or could have.
    let mut offers: Vec<(f64, u32, BTreeSet<&str>)> = Vec::new();
    for name in list {
        if let Some(p) = pools.get(name.as_str()) {
            for t in &p.candidate_instance_types {
                offers.push((
                    t.total_capacity,
                    t.total_cores,
                    t.capabilities.iter().map(String::as_str).collect(),
                ));
            }
        }
    }
    for n in nodes.iter().filter(|n| list.contains(&n.pool)) {
        offers.push((
            n.total_capacity,
            n.total_cores,
            n.capabilities.iter().map(String::as_str).collect(),
        ));
    }
    for (job, cap, cores, caps) in by_group.values() {
        let with_caps: Vec<_> = offers.iter().filter(|o| caps.is_subset(&o.2)).collect();
        if with_caps.is_empty() {
            errors.push(ValidationError::UnsatisfiableCapabilities {
                job: job.clone(),
                capabilities: caps.iter().map(|s| (*s).to_owned()).collect(),
                pools: list.to_vec(),
            });
        } else if !with_caps.iter().any(|o| o.0 >= *cap && o.1 >= *cores) {
            errors.push(ValidationError::NeverFits {
                job: job.clone(),
                capacity: *cap,
                cores: *cores,
                pools: list.to_vec(),
            });
        }
    }
}

/// Static checks, then a dry run that places every replica in order against a copy of the
/// engine (each replica sees the earlier ones, as the operator would place them). A replica
/// that asks for a provision counts as admissible: the dry run adds the node it asks for and
/// places the replica on it. The engine itself is not changed.
pub fn validate_admission(bundle: &BundleSpec, engine: &Engine, now_ms: u64) -> AdmissionResult {
    validate_admission_traced(bundle, engine, now_ms).0
}

/// [`validate_admission`], with the dry run's final decision for every replica (in replica
/// order), for tools that show why (`what-if`). No decisions when static validation failed.
pub fn validate_admission_traced(
    bundle: &BundleSpec,
    engine: &Engine,
    now_ms: u64,
) -> (AdmissionResult, Vec<Decision>) {
    let errors = engine.validate_bundle(bundle);
    if !errors.is_empty() {
        return (AdmissionResult::ValidationErrors { errors }, Vec::new());
    }
    let mut sim = engine.clone();
    let mut positions: Vec<Position> = Vec::new();
    let mut unplaceable = Vec::new();
    let mut decisions = Vec::new();
    for r in 0..bundle.replicas {
        let req = bundle.request_for_replica(r, PlacementKind::First, positions.clone());
        let (decision, placed) =
            place_with_provisioning(&mut sim, &req, now_ms, &format!("~admission-{r}"));
        decisions.push(decision);
        match placed {
            Ok(placed) => positions.extend(placed),
            Err(jobs) => {
                unplaceable.extend(jobs.into_iter().map(|(job_name, reason)| UnplaceableJob {
                    replica_index: r,
                    job_name,
                    reason,
                }))
            }
        }
    }
    let result = if unplaceable.is_empty() {
        AdmissionResult::Ok
    } else {
        AdmissionResult::NoCapacity { unplaceable }
    };
    (result, decisions)
}

/// Where a replica's jobs landed, or (job, reason) for each job that did not.
pub(crate) type ReplicaPlacement = Result<Vec<Position>, Vec<(String, String)>>;

/// Places one replica on `sim`, adding the nodes `Provision` decisions ask for (at most two
/// rounds, or one per job when more: a replica split across pools asks for a node per unit
/// that needs one), and commits it. Returns the last decision and where its jobs landed, or (job,
/// reason) for each job.
pub(crate) fn place_with_provisioning(
    sim: &mut Engine,
    req: &crate::model::PlacementRequest,
    now_ms: u64,
    node_prefix: &str,
) -> (Decision, ReplicaPlacement) {
    let mut decision = sim.place(req, now_ms);
    for round in 0..req.jobs.len().clamp(2, crate::place::MAX_JOBS_PER_REPLICA) {
        let Outcome::Provision {
            pool,
            instance_type,
            zone,
        } = &decision.outcome
        else {
            break;
        };
        let Some(t) = sim
            .pool_spec(pool)
            .and_then(|p| {
                p.candidate_instance_types
                    .iter()
                    .find(|t| &t.instance_type == instance_type)
            })
            .cloned()
        else {
            break;
        };
        let mut node = NodeSpec::ready(
            &format!("{node_prefix}-{round}"),
            pool,
            zone.as_deref(),
            t.total_capacity,
            t.total_cores,
        );
        node.capabilities = t.capabilities.clone();
        node.instance_type = Some(t.instance_type.clone());
        if sim.upsert_node(node).is_err() {
            break;
        }
        decision = sim.place(req, now_ms);
    }
    let placed = match &decision.outcome {
        Outcome::Placed { assignments, .. } => {
            let placed = assignments
                .iter()
                .map(|a| Position {
                    node: a.node.clone(),
                    zone: a.zone.clone(),
                })
                .collect();
            if sim.commit(&decision).is_err() {
                Err(req
                    .jobs
                    .iter()
                    .map(|j| (j.job_name.clone(), "commit failed".to_owned()))
                    .collect())
            } else {
                Ok(placed)
            }
        }
        Outcome::Unplaceable { jobs } => Err(jobs
            .iter()
            .map(|j| (j.job_name.clone(), j.reason.to_string()))
            .collect()),
        Outcome::Provision {
            pool,
            instance_type,
            ..
        } => Err(req
            .jobs
            .iter()
            .map(|j| {
                (
                    j.job_name.clone(),
                    format!("needs more than one new {instance_type} node in pool {pool}"),
                )
            })
            .collect()),
    };
    (decision, placed)
}

impl Engine {
    /// [`validate_bundle`] against this engine's pools and nodes.
    pub fn validate_bundle(&self, bundle: &BundleSpec) -> Vec<ValidationError> {
        let pools: Vec<PoolSpec> = self.pool_specs().into_iter().cloned().collect();
        // The static checks read only a node's pool, size and capabilities: one node per
        // distinct shape says the same as all of them, and a what-if stays cheap at 10k nodes.
        let mut shapes = std::collections::HashSet::new();
        let nodes: Vec<NodeSpec> = self
            .nodes
            .iter()
            .flatten()
            .filter(|n| {
                // A node of no loaded pool is told apart by its pool's name.
                let unloaded = n.pool.is_none().then_some(&n.pool_name);
                shapes.insert((n.pool, unloaded, n.total_cap, n.total_cores, n.capset))
            })
            .map(|n| NodeSpec {
                id: n.id.to_string(),
                pool: n.pool_name.to_string(),
                zone: None,
                instance_type: None,
                total_capacity: crate::engine::from_milli(n.total_cap),
                used_capacity: 0.0,
                total_cores: n.total_cores,
                used_cores: 0,
                capabilities: self.capability_names(n.capset),
                cordoned: false,
                healthy: true,
                spare: false,
                spare_band: None,
                pending_since_ms: None,
            })
            .collect();
        validate_bundle(bundle, &pools, &nodes)
    }

    fn capability_names(&self, capset: crate::engine::CapSetId) -> Vec<String> {
        let bits = self.capset_bits(capset);
        let mut out = Vec::new();
        for (w, word) in bits.iter().enumerate() {
            for b in 0..64u32 {
                if word & (1u64 << b) != 0
                    && let Some(name) = self.caps.name(w as u32 * 64 + b)
                {
                    out.push(name.to_owned());
                }
            }
        }
        out
    }
}
