//! The words e2e scenarios are written in: manifests built from AutoManager's own types and
//! applied with kubectl as a user applies them, typed reads of every kind, and waits that say
//! what they wait for and, when they give up, show the object as it last was.
//!
//! ```ignore
//! stack.create(&bundle("gpu", 1, &["onprem", "aws-west"], [job("infer", 50, Silver).needs(&["nvidia-gpu"])])).await;
//! let b = stack.expect_ready("gpu").await;
//! assert_eq!(b.job(0, "infer").and_then(|j| j.pool.as_deref()), Some("aws-west"), "{}", show(&b));
//! ```
//!
//! Bundles and Migrations live in [`NS`]; the other kinds are cluster-scoped. Every helper
//! here is a test helper: it panics with what it saw rather than return an error, except the
//! `try_` reads, which are for probes inside [`Stack::wait_for`].

#![allow(clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt::{self, Debug};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use automanager_api::{
    BandOverrides, BandPolicy, Bundle, BundleJob, BundlePhase, BundleSpec, CandidateInstanceType,
    Condition, ConditionStatus, DisruptionBudget, Drain, DrainMode, HotSpareTarget,
    HotSpareTargetSpec, JobMigration, JobRequirements, JobState, JobStatus, ManagerNode, Migration,
    MigrationJobRef, MigrationPhase, MigrationSpec, MigrationStrategy, PackingStrategy,
    PlacementPool, PlacementPoolSpec, PlacementRules, PoolKind, PriorityBand, ReplicaStatus,
    ScaleOut, SpareNodeSpec,
};
use chrono::{DateTime, Utc};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use kube::{Client, Resource};
use manager_client::proto::{JobHistoryRequest, JobHistoryResponse, JobRole};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::stack::Stack;
use crate::{CommandOutput, SetupError};

/// The namespace of every Bundle and Migration the scenarios create.
pub const NS: &str = "default";

/// How long a wait may take before the scenario fails: generous, since several control planes
/// share a loaded machine; a wait returns as soon as what it waits for holds.
pub const PATIENCE: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// Manifests
// ---------------------------------------------------------------------------------------------

/// A job of `capacity` units in `band` pinning one core, with no capability, co-location or
/// migration strategy (so `stopThenStart`).
pub fn job(name: &str, capacity: i64, band: PriorityBand) -> BundleJob {
    BundleJob {
        job_name: name.to_owned(),
        requirements: JobRequirements {
            required_capacity: capacity,
            required_cores: 1,
            required_capabilities: Vec::new(),
            priority_band: band,
        },
        co_locate_with: Vec::new(),
        separate_from: Vec::new(),
        migration: None,
        config: None,
        template: None,
    }
}

/// Builder words for a [`BundleJob`].
pub trait JobManifest: Sized {
    /// Pins `cores` cores.
    fn cores(self, cores: i32) -> Self;
    /// Needs nodes advertising every one of `capabilities`.
    fn needs(self, capabilities: &[&str]) -> Self;
    /// Declares `strategy` as the strongest way it may be moved.
    fn moves_by(self, strategy: MigrationStrategy) -> Self;
}

impl JobManifest for BundleJob {
    fn cores(mut self, cores: i32) -> Self {
        self.requirements.required_cores = cores;
        self
    }

    fn needs(mut self, capabilities: &[&str]) -> Self {
        self.requirements.required_capabilities =
            capabilities.iter().map(|c| (*c).to_owned()).collect();
        self
    }

    fn moves_by(mut self, strategy: MigrationStrategy) -> Self {
        self.migration = Some(JobMigration { strategy });
        self
    }
}

/// A Bundle in [`NS`]: `replicas` replicas of `jobs` in `pools` (in preference order), with
/// the default rules between replicas (different node, hard; same zone, soft).
pub fn bundle(
    name: &str,
    replicas: i32,
    pools: &[&str],
    jobs: impl IntoIterator<Item = BundleJob>,
) -> Bundle {
    let mut b = Bundle::new(
        name,
        BundleSpec {
            replicas,
            pools: pools.iter().map(|p| (*p).to_owned()).collect(),
            jobs: jobs.into_iter().collect(),
            replica_overrides: Vec::new(),
            intra_replica_placement: None,
            inter_replica_placement: PlacementRules::inter_replica_default(),
            bands: None,
            disruption: None,
            rebalance: false,
        },
    );
    b.metadata.namespace = Some(NS.to_owned());
    b
}

/// Builder words for a [`Bundle`].
pub trait BundleManifest: Sized {
    /// Marks the bundle Broken after more than `n` restarts of a `band` replica within an hour.
    fn max_restarts_per_hour(self, band: PriorityBand, n: i32) -> Self;
    /// Lets voluntary actions take down at most `n` replicas at once.
    fn disruption_budget(self, n: i32) -> Self;
    /// Moves a replica back once a soft rule it breaks could hold again.
    fn rebalancing(self) -> Self;
}

impl BundleManifest for Bundle {
    fn max_restarts_per_hour(mut self, band: PriorityBand, n: i32) -> Self {
        let policy = Some(BandPolicy {
            max_restarts_per_hour: Some(n),
            ..BandPolicy::default()
        });
        let bands = self.spec.bands.get_or_insert_with(BandOverrides::default);
        match band {
            PriorityBand::Gold => bands.gold = policy,
            PriorityBand::Silver => bands.silver = policy,
            PriorityBand::Bronze => bands.bronze = policy,
        }
        self
    }

    fn disruption_budget(mut self, n: i32) -> Self {
        let budget = self
            .spec
            .disruption
            .get_or_insert_with(DisruptionBudget::default);
        budget.max_unavailable_replicas = Some(n);
        self
    }

    fn rebalancing(mut self) -> Self {
        self.spec.rebalance = true;
        self
    }
}

/// A Migration in [`NS`] of job `job_name` of replica `replica` of `bundle`, to a node the
/// placement engine picks, with the job's declared strategy.
pub fn migration(name: &str, bundle: &str, replica: i32, job_name: &str) -> Migration {
    let mut m = Migration::new(
        name,
        MigrationSpec {
            job: MigrationJobRef {
                bundle: bundle.to_owned(),
                replica,
                job_name: job_name.to_owned(),
            },
            target_node: None,
            strategy: None,
            abort: None,
        },
    );
    m.metadata.namespace = Some(NS.to_owned());
    m
}

/// Builder words for a [`Migration`].
pub trait MigrationManifest: Sized {
    /// Moves the job to `node`.
    fn to_node(self, node: &str) -> Self;
    /// Asks for `strategy` rather than the job's declared one.
    fn by(self, strategy: MigrationStrategy) -> Self;
    /// Labels it with `automanager.norsk.io/purpose: <purpose>`.
    fn for_purpose(self, purpose: &str) -> Self;
}

impl MigrationManifest for Migration {
    fn to_node(mut self, node: &str) -> Self {
        self.spec.target_node = Some(node.to_owned());
        self
    }

    fn by(mut self, strategy: MigrationStrategy) -> Self {
        self.spec.strategy = Some(strategy);
        self
    }

    fn for_purpose(mut self, purpose: &str) -> Self {
        self.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .insert(
                automanager_api::PURPOSE_LABEL.to_owned(),
                purpose.to_owned(),
            );
        self
    }
}

/// A HotSpareTarget keeping `count` spares of `instance_type` in `region` for `pool`, for any
/// band.
pub fn spare_target(
    name: &str,
    pool: &str,
    count: i32,
    instance_type: &str,
    region: &str,
) -> HotSpareTarget {
    HotSpareTarget::new(
        name,
        HotSpareTargetSpec {
            pool: pool.to_owned(),
            target_count: count,
            for_band: None,
            spec: SpareNodeSpec {
                instance_type: instance_type.to_owned(),
                region: region.to_owned(),
            },
            max_age: None,
            hot: None,
            warm: None,
            schedules: Vec::new(),
        },
    )
}

/// A kind of node a pool has or provisions, with no capability.
pub fn instance_type(name: &str, capacity: i64, cores: i32) -> CandidateInstanceType {
    CandidateInstanceType {
        instance_type: name.to_owned(),
        total_capacity: capacity,
        total_cores: cores,
        capabilities: Vec::new(),
    }
}

/// An elastic pool of `kind` in `region` over `zones`, growing with nodes of `instance`.
pub fn elastic_pool(
    name: &str,
    kind: PoolKind,
    region: &str,
    zones: &[&str],
    packing: PackingStrategy,
    instance: CandidateInstanceType,
) -> PlacementPool {
    PlacementPool::new(
        name,
        PlacementPoolSpec {
            kind,
            region: region.to_owned(),
            zones: zones.iter().map(|z| (*z).to_owned()).collect(),
            packing_strategy: packing,
            scale_out: ScaleOut::Elastic,
            candidate_instance_types: vec![instance],
            max_nodes: None,
            consolidation: None,
            aws: None,
            oci: None,
            start_latency_seconds: None,
        },
    )
}

/// A fixed (on-prem) binpack pool named `pool` whose nodes, each of capacity 100 and 32 cores,
/// are `(id, zone)`: writes the manager-sim config declaring them into `dir` and returns its
/// path and the PlacementPool.
pub fn fixed_pool(
    dir: &Path,
    pool: &str,
    nodes: &[(&str, &str)],
) -> Result<(PathBuf, PlacementPool), SetupError> {
    let mut zones: Vec<&str> = Vec::new();
    for (_, z) in nodes {
        if !zones.contains(z) {
            zones.push(z);
        }
    }
    let declared: Vec<serde_json::Value> = nodes
        .iter()
        .map(|(id, zone)| serde_json::json!({"id": id, "zone": zone, "capacity": 100, "cores": 32}))
        .collect();
    // manager-sim's config is the sim's own format (no typed struct outside its crate).
    let config = serde_json::json!({
        "listen": "127.0.0.1:0",
        "timing": {"provisionDelayMs": 100, "jobStartDelayMs": 20, "jobStopDelayMs": 20},
        "pools": [{
            "name": pool, "kind": "cluster", "region": "dc", "zones": zones,
            "scaleOut": "fixed", "nodes": declared,
        }],
    });
    let path = dir.join("manager-sim.yaml");
    let text = serde_saphyr::to_string(&config).map_err(|e| SetupError(e.to_string()))?;
    std::fs::write(&path, text).map_err(|e| SetupError(e.to_string()))?;
    let placement_pool = PlacementPool::new(
        pool,
        PlacementPoolSpec {
            kind: PoolKind::Cluster,
            region: "dc".to_owned(),
            zones: zones.iter().map(|z| (*z).to_owned()).collect(),
            packing_strategy: PackingStrategy::Binpack,
            scale_out: ScaleOut::Fixed,
            candidate_instance_types: vec![instance_type("rack-server", 100, 32)],
            max_nodes: None,
            consolidation: None,
            aws: None,
            oci: None,
            start_latency_seconds: None,
        },
    );
    Ok((path, placement_pool))
}

/// An object as YAML, the way `kubectl get -o yaml` shows it: for `kubectl apply` and for
/// failure messages.
pub fn to_yaml<T: Serialize>(obj: &T) -> String {
    serde_saphyr::to_string(obj).unwrap_or_else(|e| format!("<not serializable: {e}>"))
}

/// Shows an object as YAML in a failure message: `assert!(.., "{}", show(&b))`.
pub fn show<T: Serialize>(obj: &T) -> Shown<'_, T> {
    Shown(obj)
}

/// See [`show`].
pub struct Shown<'a, T>(&'a T);

impl<T: Serialize> fmt::Display for Shown<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&to_yaml(self.0))
    }
}

/// Manager's id of job `job_name` of replica `replica` of Bundle `bundle` in [`NS`].
/// Whether `node`'s drain completed, in terms that hold over either Manager API: none of our
/// jobs is on it, and Manager ended it (terminated or stopped), or, for a node Manager does not
/// terminate (a physical node over the published API), left it up to its owner, which the
/// node's `Ready` condition says with reason `Drained`.
pub fn drained(node: &ManagerNode) -> bool {
    node.status.as_ref().is_some_and(|s| {
        let ended = matches!(
            s.state,
            automanager_api::NodeState::Terminated | automanager_api::NodeState::Stopped
        );
        let left_to_owner = s.state == automanager_api::NodeState::Started
            && s.job_count == 0
            && automanager_api::find_condition(&s.conditions, "Ready")
                .is_some_and(|c| c.is_true() && c.reason == "Drained");
        s.drain.as_ref().is_some_and(|d| d.completed_at.is_some()) && (ended || left_to_owner)
    })
}

pub fn job_id(bundle: &str, replica: i32, job_name: &str) -> String {
    format!("{NS}.{bundle}/{replica}/{job_name}")
}

// ---------------------------------------------------------------------------------------------
// Reading objects
// ---------------------------------------------------------------------------------------------

/// An AutoManager kind the scenarios read: where its objects live and what kubectl calls it.
pub trait Kind:
    Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned + Send + Sync + 'static
{
    /// The kind's name as kubectl takes it (`bundle`, `managernode`, …).
    const KUBECTL: &'static str;
    /// Its objects: in [`NS`] for namespaced kinds, else the cluster's.
    fn api(client: Client) -> Api<Self>;
    /// kubectl's `-n NS` for a namespaced kind.
    fn namespace_args() -> &'static [&'static str] {
        &[]
    }
    /// The object's `status.conditions`.
    fn conditions(&self) -> &[Condition];
}

macro_rules! kind {
    ($ty:ty, $kubectl:literal, namespaced) => {
        impl Kind for $ty {
            const KUBECTL: &'static str = $kubectl;
            fn api(client: Client) -> Api<Self> {
                Api::namespaced(client, NS)
            }
            fn namespace_args() -> &'static [&'static str] {
                &["-n", NS]
            }
            fn conditions(&self) -> &[Condition] {
                self.status
                    .as_ref()
                    .map_or(&[], |s| s.conditions.as_slice())
            }
        }
    };
    ($ty:ty, $kubectl:literal, cluster) => {
        impl Kind for $ty {
            const KUBECTL: &'static str = $kubectl;
            fn api(client: Client) -> Api<Self> {
                Api::all(client)
            }
            fn conditions(&self) -> &[Condition] {
                self.status
                    .as_ref()
                    .map_or(&[], |s| s.conditions.as_slice())
            }
        }
    };
}

kind!(Bundle, "bundle", namespaced);
kind!(Migration, "migration", namespaced);
kind!(ManagerNode, "managernode", cluster);
kind!(PlacementPool, "placementpool", cluster);
kind!(HotSpareTarget, "hotsparetarget", cluster);

/// Reading an object's conditions.
pub trait Conditions {
    /// The condition of `type_`, if the status has one.
    fn condition(&self, type_: &str) -> Option<&Condition>;
    /// Its status (`True`, `False`, `Unknown`), if present.
    fn condition_status(&self, type_: &str) -> Option<ConditionStatus> {
        self.condition(type_).map(|c| c.status)
    }
    /// Its reason, if present.
    fn condition_reason(&self, type_: &str) -> Option<&str> {
        self.condition(type_).map(|c| c.reason.as_str())
    }
    /// Its message, if present.
    fn condition_message(&self, type_: &str) -> Option<&str> {
        self.condition(type_).map(|c| c.message.as_str())
    }
    /// Whether it is present and `True`.
    fn has_condition(&self, type_: &str) -> bool {
        self.condition_status(type_) == Some(ConditionStatus::True)
    }
}

impl<K: Kind> Conditions for K {
    fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions().iter().find(|c| c.type_ == type_)
    }
}

/// Reading a Bundle's status.
pub trait BundleView {
    /// `status.phase`, once the operator wrote a status.
    fn phase(&self) -> Option<BundlePhase>;
    /// `status.placedReplicas` (0 without a status).
    fn placed_replicas(&self) -> i32;
    /// Replica `replica`'s status.
    fn replica(&self, replica: i32) -> Option<&ReplicaStatus>;
    /// Job `job_name` of replica `replica`.
    fn job(&self, replica: i32, job_name: &str) -> Option<&JobStatus>;
    /// Every job of every replica.
    fn jobs(&self) -> Vec<&JobStatus>;
    /// The node job `job_name` of replica `replica` runs on, as the status says.
    fn node_of(&self, replica: i32, job_name: &str) -> Option<&str> {
        self.job(replica, job_name)?.node_id.as_deref()
    }
    /// The pool job `job_name` of replica `replica` runs in, as the status says.
    fn pool_of(&self, replica: i32, job_name: &str) -> Option<&str> {
        self.job(replica, job_name)?.pool.as_deref()
    }
    /// The state of job `job_name` of replica `replica`.
    fn state_of(&self, replica: i32, job_name: &str) -> Option<JobState> {
        self.job(replica, job_name).map(|j| j.state)
    }
    /// Restarts of replica `replica` within the last hour.
    fn restarts_last_hour(&self, replica: i32) -> Option<i32> {
        self.replica(replica).map(|r| r.restarts_last_hour)
    }
    /// Whether any job of the bundle is on `node`.
    fn has_job_on(&self, node: &str) -> bool {
        self.jobs()
            .iter()
            .any(|j| j.node_id.as_deref() == Some(node))
    }
}

impl BundleView for Bundle {
    fn phase(&self) -> Option<BundlePhase> {
        self.status.as_ref().map(|s| s.phase)
    }

    fn placed_replicas(&self) -> i32 {
        self.status.as_ref().map_or(0, |s| s.placed_replicas)
    }

    fn replica(&self, replica: i32) -> Option<&ReplicaStatus> {
        self.status
            .as_ref()?
            .replicas
            .iter()
            .find(|r| r.replica == replica)
    }

    fn job(&self, replica: i32, job_name: &str) -> Option<&JobStatus> {
        self.replica(replica)?
            .jobs
            .iter()
            .find(|j| j.job_name == job_name)
    }

    fn jobs(&self) -> Vec<&JobStatus> {
        self.status
            .iter()
            .flat_map(|s| &s.replicas)
            .flat_map(|r| &r.jobs)
            .collect()
    }
}

/// Reading a Migration's status.
pub trait MigrationView {
    /// `status.phase`, once the operator wrote a status.
    fn phase(&self) -> Option<MigrationPhase>;
    /// Every phase entered, in order.
    fn phases(&self) -> Vec<MigrationPhase>;
    /// When it first entered a phase `which` picks.
    fn first_entered(&self, which: impl Fn(MigrationPhase) -> bool) -> Option<DateTime<Utc>>;
    /// When it entered `phase`.
    fn entered(&self, phase: MigrationPhase) -> Option<DateTime<Utc>> {
        self.first_entered(|p| p == phase)
    }
    /// When the queue admitted it: the first phase it entered other than `Pending`.
    fn admitted_at(&self) -> Option<DateTime<Utc>> {
        self.first_entered(|p| p != MigrationPhase::Pending)
    }
    /// Whether it ended (completed, aborted, refused, rejected or failed).
    fn finished(&self) -> bool {
        use MigrationPhase::*;
        matches!(
            self.phase(),
            Some(Completed | Aborted | Refused | Rejected | Failed)
        )
    }
    /// The node it moved (or moves) the job to, per its status.
    fn target_node(&self) -> Option<&str>;
    /// The node the job ran on, per its status.
    fn source_node(&self) -> Option<&str>;
    /// The strategy in effect.
    fn strategy(&self) -> Option<MigrationStrategy>;
}

impl MigrationView for Migration {
    fn phase(&self) -> Option<MigrationPhase> {
        self.status.as_ref().map(|s| s.phase)
    }

    fn phases(&self) -> Vec<MigrationPhase> {
        self.status
            .iter()
            .flat_map(|s| &s.phases)
            .map(|p| p.phase)
            .collect()
    }

    fn first_entered(&self, which: impl Fn(MigrationPhase) -> bool) -> Option<DateTime<Utc>> {
        self.status
            .as_ref()?
            .phases
            .iter()
            .find(|p| which(p.phase))
            .map(|p| p.entered_at)
    }

    fn target_node(&self) -> Option<&str> {
        self.status.as_ref()?.target_node.as_deref()
    }

    fn source_node(&self) -> Option<&str> {
        self.status.as_ref()?.source_node.as_deref()
    }

    fn strategy(&self) -> Option<MigrationStrategy> {
        self.status.as_ref()?.strategy
    }
}

/// Reading an Event (`events.k8s.io/v1`), whose every field is optional on the wire.
pub trait EventView {
    /// The name of the object it is about.
    fn regarding_name(&self) -> &str;
    /// Its reason.
    fn reason_str(&self) -> &str;
    /// Its note.
    fn note_str(&self) -> &str;
    /// Whether it is about `name`, for `reason`, with a note containing each of `note_has`.
    fn is(&self, name: &str, reason: &str, note_has: &[&str]) -> bool {
        self.regarding_name() == name
            && self.reason_str() == reason
            && note_has.iter().all(|n| self.note_str().contains(n))
    }
}

impl EventView for Event {
    fn regarding_name(&self) -> &str {
        self.regarding
            .as_ref()
            .and_then(|r| r.name.as_deref())
            .unwrap_or_default()
    }

    fn reason_str(&self) -> &str {
        self.reason.as_deref().unwrap_or_default()
    }

    fn note_str(&self) -> &str {
        self.note.as_deref().unwrap_or_default()
    }
}

/// The operator's `/debug/trace/<namespace>/<bundle>` answer, as far as the scenarios read it
/// (the full decision is the placement crate's, rendered by `kubectl automanager trace`).
#[derive(Debug, Clone, serde::Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DebugTrace {
    pub namespace: String,
    pub bundle: String,
    #[serde(default)]
    pub replicas: Vec<DebugReplicaTrace>,
}

/// One replica's last decision in a [`DebugTrace`].
#[derive(Debug, Clone, serde::Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DebugReplicaTrace {
    pub replica: u32,
    #[serde(default)]
    pub recovery: bool,
    /// Bronze jobs stopped to make room for this recovery, when it had to.
    #[serde(default)]
    pub preempted: Option<automanager_api::Preemption>,
}

/// What the sim saw of one job (`SimAdmin.JobHistory`), with the roles by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct JobHistory {
    /// Every instance start, oldest first: (node, `normal` or `migrationTarget`).
    pub starts: Vec<(String, String)>,
    /// Milliseconds, since the job first ran, with no running instance.
    pub uncovered_ms: u64,
    /// How many times the job went from a running instance to none.
    pub gaps: u32,
    /// The most instances running at once.
    pub max_running: u32,
}

impl From<JobHistoryResponse> for JobHistory {
    fn from(h: JobHistoryResponse) -> Self {
        JobHistory {
            starts: h
                .starts
                .iter()
                .map(|s| {
                    let role = match s.role() {
                        JobRole::MigrationTarget => "migrationTarget",
                        _ => "normal",
                    };
                    (s.node_id.clone(), role.to_owned())
                })
                .collect(),
            uncovered_ms: h.uncovered_ms,
            gaps: h.gaps,
            max_running: h.max_running,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The stack, spoken to
// ---------------------------------------------------------------------------------------------

/// `kubectl apply -f -` of several objects at once (one apply, so they arrive together).
fn yaml_stream<T: Serialize>(objects: &[T]) -> String {
    objects
        .iter()
        .map(to_yaml)
        .collect::<Vec<_>>()
        .join("---\n")
}

impl Stack {
    /// `kubectl apply -f -` of `object`, serialized from its type, as a user applies a
    /// manifest; panics with kubectl's error.
    pub async fn create<T: Serialize>(&self, object: &T) {
        crate::apply(self, &to_yaml(object)).await;
    }

    /// [`Stack::create`] of every object of `objects` in one `kubectl apply`.
    pub async fn create_all<T: Serialize>(&self, objects: &[T]) {
        crate::apply(self, &yaml_stream(objects)).await;
    }

    /// `kubectl ARGS`; panics unless it succeeds. Returns its output.
    pub async fn kubectl(&self, args: &[&str]) -> CommandOutput {
        let out = self.env.run_kubectl(args).await.expect("kubectl runs");
        assert!(out.success(), "kubectl {args:?} failed: {}", out.stderr);
        out
    }

    /// `kubectl patch KIND NAME --type merge -p PATCH` (a partial object, as JSON).
    pub async fn merge_patch<K: Kind>(&self, name: &str, patch: &serde_json::Value) {
        let patch = patch.to_string();
        let mut args = vec!["patch", K::KUBECTL, name];
        args.extend_from_slice(K::namespace_args());
        args.extend_from_slice(&["--type", "merge", "-p", &patch]);
        self.kubectl(&args).await;
    }

    /// `kubectl delete KIND NAME --wait=true`: returns once the object is gone.
    pub async fn delete<K: Kind>(&self, name: &str) {
        let mut args = vec!["delete", K::KUBECTL, name];
        args.extend_from_slice(K::namespace_args());
        args.extend_from_slice(&["--wait=true", "--timeout=120s"]);
        self.kubectl(&args).await;
    }

    /// The object `name` of kind `K`, or why it cannot be read (for probes).
    pub async fn try_get<K: Kind>(&self, name: &str) -> Result<K, SetupError> {
        K::api(self.env.client())
            .get(name)
            .await
            .map_err(|e| SetupError(format!("reading {} {name}: {e}", K::KUBECTL)))
    }

    /// Every object of kind `K` (in [`NS`] when namespaced) matching the label selector
    /// `labels` (empty: all), or why they cannot be listed (for probes).
    pub async fn try_list<K: Kind>(&self, labels: &str) -> Result<Vec<K>, SetupError> {
        let params = if labels.is_empty() {
            ListParams::default()
        } else {
            ListParams::default().labels(labels)
        };
        K::api(self.env.client())
            .list(&params)
            .await
            .map(|l| l.items)
            .map_err(|e| SetupError(format!("listing {}s: {e}", K::KUBECTL)))
    }

    /// The object `name` of kind `K`; panics when it cannot be read.
    pub async fn get<K: Kind>(&self, name: &str) -> K {
        self.try_get(name).await.unwrap_or_else(|e| panic!("{e}"))
    }

    /// Every object of kind `K`; panics when they cannot be listed.
    pub async fn list<K: Kind>(&self) -> Vec<K> {
        self.list_labelled("").await
    }

    /// Every object of kind `K` matching the label selector `labels`.
    pub async fn list_labelled<K: Kind>(&self, labels: &str) -> Vec<K> {
        self.try_list(labels)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Bundle `name`.
    pub async fn bundle(&self, name: &str) -> Bundle {
        self.get(name).await
    }

    /// Migration `name`.
    pub async fn migration(&self, name: &str) -> Migration {
        self.get(name).await
    }

    /// Every Migration, by name.
    pub async fn migrations(&self) -> BTreeMap<String, Migration> {
        by_name(self.list().await)
    }

    /// ManagerNode `name`.
    pub async fn node(&self, name: &str) -> ManagerNode {
        self.get(name).await
    }

    /// Every ManagerNode.
    pub async fn nodes(&self) -> Vec<ManagerNode> {
        self.list().await
    }

    /// PlacementPool `name`.
    pub async fn pool(&self, name: &str) -> PlacementPool {
        self.get(name).await
    }

    /// Polls object `name` of kind `K` until `ok` holds for it and returns it; panics after
    /// [`PATIENCE`] with `what`, the object as last read and the operator's log tail.
    pub async fn wait_until<K: Kind>(&self, name: &str, what: &str, ok: impl Fn(&K) -> bool) -> K {
        let last: Mutex<Option<K>> = Mutex::new(None);
        let (ok, last_ref) = (&ok, &last);
        let found = self
            .wait_for(
                &format!("{} {name} {what}", K::KUBECTL),
                PATIENCE,
                move || async move {
                    let obj = self.try_get::<K>(name).await?;
                    let done = ok(&obj);
                    if let Ok(mut l) = last_ref.lock() {
                        *l = Some(obj.clone());
                    }
                    Ok(done.then_some(obj))
                },
            )
            .await;
        match found {
            Ok(obj) => obj,
            Err(e) => {
                let seen = last.lock().ok().and_then(|mut l| l.take());
                panic!(
                    "{e}\n{} {name} as last read:\n{}{}",
                    K::KUBECTL,
                    seen.map_or_else(|| "(never read)".to_owned(), |o| to_yaml(&o)),
                    self.sim_log_tail()
                )
            }
        }
    }

    /// Polls every object of kind `K` (matching the label selector `labels`) until `ok` picks
    /// an answer from them; panics after [`PATIENCE`] with `what`, the objects as last listed
    /// and the operator's log tail.
    pub async fn wait_until_list<K: Kind, T>(
        &self,
        labels: &str,
        what: &str,
        ok: impl Fn(&[K]) -> Option<T>,
    ) -> T {
        let last: Mutex<Vec<K>> = Mutex::new(Vec::new());
        let (ok, last_ref) = (&ok, &last);
        let found = self
            .wait_for(what, PATIENCE, move || async move {
                let objs = self.try_list::<K>(labels).await?;
                let answer = ok(&objs);
                if let Ok(mut l) = last_ref.lock() {
                    *l = objs;
                }
                Ok(answer)
            })
            .await;
        match found {
            Ok(answer) => answer,
            Err(e) => {
                let seen = last.lock().map(|l| yaml_stream(&l)).unwrap_or_default();
                panic!(
                    "{e}\nthe {}s as last listed:\n{seen}{}",
                    K::KUBECTL,
                    self.sim_log_tail()
                )
            }
        }
    }

    /// Waits until object `name` of kind `K` has condition `type_` with `status`.
    pub async fn wait_for_condition<K: Kind>(
        &self,
        name: &str,
        type_: &str,
        status: ConditionStatus,
    ) -> K {
        self.wait_until(name, &format!("to have {type_}={status:?}"), |o: &K| {
            o.condition_status(type_) == Some(status)
        })
        .await
    }

    /// Waits until object `name` of kind `K` has condition `type_` with `reason`.
    pub async fn wait_for_reason<K: Kind>(&self, name: &str, type_: &str, reason: &str) -> K {
        self.wait_until(name, &format!("to have {type_} for {reason}"), |o: &K| {
            o.condition_reason(type_) == Some(reason)
        })
        .await
    }

    /// Waits until Bundle `name` is in `phase`.
    pub async fn expect_phase(&self, name: &str, phase: BundlePhase) -> Bundle {
        self.wait_until(name, &format!("to be {phase:?}"), |b: &Bundle| {
            b.phase() == Some(phase)
        })
        .await
    }

    /// Waits until Bundle `name` is Ready: every replica's jobs run.
    pub async fn expect_ready(&self, name: &str) -> Bundle {
        self.expect_phase(name, BundlePhase::Ready).await
    }

    /// Waits until Bundle `name` is Ready with none of its jobs on `node`. A moved bundle is
    /// Ready before and after its move and its status follows Manager's events, so waiting for
    /// the phase alone can read the status from before the move.
    pub async fn expect_ready_off(&self, name: &str, node: &str) -> Bundle {
        self.wait_until(
            name,
            &format!("to be Ready with no job on {node}"),
            |b: &Bundle| b.phase() == Some(BundlePhase::Ready) && !b.has_job_on(node),
        )
        .await
    }

    /// Waits until every job of replica `replica` of Bundle `name` is running on `node`.
    pub async fn wait_until_running_on(&self, name: &str, replica: i32, node: &str) -> Bundle {
        self.wait_until(
            name,
            &format!("to run replica {replica} on {node}"),
            |b: &Bundle| {
                b.replica(replica).is_some_and(|r| {
                    !r.jobs.is_empty()
                        && r.jobs.iter().all(|j| {
                            j.state == JobState::Running && j.node_id.as_deref() == Some(node)
                        })
                })
            },
        )
        .await
    }

    /// Waits until Migration `name` is in `phase`.
    pub async fn expect_migration_phase(&self, name: &str, phase: MigrationPhase) -> Migration {
        self.wait_until(name, &format!("to be {phase:?}"), |m: &Migration| {
            m.phase() == Some(phase)
        })
        .await
    }

    /// `kubectl patch managernode NODE` with `spec` (a part of ManagerNode's spec) as a user
    /// cordons or drains, retried until the operator has mirrored the node.
    async fn patch_node_spec(&self, node: &str, spec: serde_json::Value) {
        let patch = serde_json::json!({ "spec": spec }).to_string();
        crate::patch_node(self, node, &patch).await;
    }

    /// Cordons `node` (`spec.cordoned: true`).
    pub async fn cordon(&self, node: &str) {
        self.patch_node_spec(node, serde_json::json!({"cordoned": true}))
            .await;
    }

    /// Uncordons `node` (`spec.cordoned: false`).
    pub async fn uncordon(&self, node: &str) {
        self.patch_node_spec(node, serde_json::json!({"cordoned": false}))
            .await;
    }

    /// Asks for a drain of `node` in `mode` (`spec.drain`).
    pub async fn drain(&self, node: &str, mode: DrainMode) {
        let drain = Drain {
            mode,
            when_held: None,
        };
        self.patch_node_spec(node, serde_json::json!({ "drain": drain }))
            .await;
    }

    /// Waits until the operator reports `node` cordoned (`cordoned`) or schedulable again.
    pub async fn wait_cordoned(&self, node: &str, cordoned: bool) -> ManagerNode {
        let status = if cordoned {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        self.wait_for_condition(node, "Cordoned", status).await
    }

    /// Waits until `node`'s drain completed ([`drained`]).
    pub async fn wait_drained(&self, node: &str) -> ManagerNode {
        self.wait_until(node, "to be drained", drained).await
    }

    /// Every Event (`events.k8s.io/v1`) in the cluster.
    pub async fn try_events(&self) -> Result<Vec<Event>, SetupError> {
        Api::<Event>::all(self.env.client())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|e| SetupError(format!("listing Events: {e}")))
    }

    /// Every Event for `reason`.
    pub async fn events_for(&self, reason: &str) -> Vec<Event> {
        let all = self.try_events().await.unwrap_or_else(|e| panic!("{e}"));
        all.into_iter()
            .filter(|e| e.reason_str() == reason)
            .collect()
    }

    /// Waits for an Event about `name` for `reason` whose note contains each of `note_has`, and
    /// returns it: Events are published off the reconcile path, a moment after the status
    /// written after them.
    pub async fn expect_event(&self, name: &str, reason: &str, note_has: &[&str]) -> Event {
        self.wait_for_event(
            &format!("a {reason} Event about {name} saying {note_has:?}"),
            |e| e.is(name, reason, note_has),
        )
        .await
    }

    /// Waits for an Event `ok` accepts, and returns it. Panics after [`PATIENCE`] with
    /// `what` and every Event seen.
    pub async fn wait_for_event(&self, what: &str, ok: impl Fn(&Event) -> bool) -> Event {
        let ok = &ok;
        let found = self
            .wait_for(what, PATIENCE, move || async move {
                let events = self.try_events().await?;
                Ok(events.into_iter().find(|e| ok(e)))
            })
            .await;
        match found {
            Ok(e) => e,
            Err(e) => panic!(
                "{e}\nevery Event:\n{}",
                crate::events_table(self).await.unwrap_or_default()
            ),
        }
    }

    /// What the sim saw of job `job_id`: every instance start and its time without a running
    /// instance.
    pub async fn job_history(&self, job_id: &str) -> JobHistory {
        let mut admin = crate::reliability::sim_admin(&self.sim_endpoint)
            .await
            .expect("the sim's admin API");
        admin
            .job_history(JobHistoryRequest {
                job_id: job_id.to_owned(),
            })
            .await
            .unwrap_or_else(|e| panic!("the sim's history of {job_id}: {e}"))
            .into_inner()
            .into()
    }

    /// The operator's full trace of Bundle `name` (`/debug/trace`); panics unless served.
    pub async fn debug_trace(&self, name: &str) -> DebugTrace {
        let (code, body) = self
            .debug_get(&format!("/debug/trace/{NS}/{name}"))
            .await
            .expect("the debugging API answers");
        assert_eq!(code, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    /// The newest lines of the sim's log, for a failure message.
    fn sim_log_tail(&self) -> String {
        let log = self.sim.log_text();
        let tail: Vec<&str> = log.lines().rev().take(30).collect();
        if tail.is_empty() {
            String::new()
        } else {
            format!(
                "\nmanager-sim log tail (newest first):\n{}",
                tail.join("\n")
            )
        }
    }
}

/// Objects by `metadata.name`.
pub fn by_name<K: Kind>(objects: Vec<K>) -> BTreeMap<String, K> {
    objects
        .into_iter()
        .map(|o| (o.meta().name.clone().unwrap_or_default(), o))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_manifest_is_what_a_user_writes_and_reads_back_the_same() {
        let b = bundle(
            "gpu",
            2,
            &["onprem", "aws-west"],
            [job("infer", 50, PriorityBand::Silver)
                .cores(2)
                .needs(&["nvidia-gpu"])
                .moves_by(MigrationStrategy::Handover)],
        )
        .max_restarts_per_hour(PriorityBand::Gold, 3)
        .disruption_budget(0)
        .rebalancing();
        let yaml = to_yaml(&b);
        for line in [
            "apiVersion: automanager.norsk.io/v1alpha1",
            "kind: Bundle",
            "namespace: default",
            "requiredCapabilities:",
            "strategy: handover",
            "maxRestartsPerHour: 3",
            "maxUnavailableReplicas: 0",
            "rebalance: true",
        ] {
            assert!(yaml.contains(line), "{line:?} missing from:\n{yaml}");
        }
        assert!(!yaml.contains("status"), "{yaml}");
        let back: Bundle = serde_saphyr::from_str(&yaml).expect("reads back");
        assert_eq!((back.metadata, back.spec), (b.metadata, b.spec));
    }

    #[test]
    fn a_migration_manifest_carries_its_target_strategy_and_purpose() {
        let m = migration("move", "news", 1, "enc")
            .to_node("a3")
            .by(MigrationStrategy::StopThenStart)
            .for_purpose("consolidation");
        let yaml = to_yaml(&m);
        for line in [
            "kind: Migration",
            "automanager.norsk.io/purpose: consolidation",
            "targetNode: a3",
            "strategy: stopThenStart",
            "replica: 1",
        ] {
            assert!(yaml.contains(line), "{line:?} missing from:\n{yaml}");
        }
        let back: Migration = serde_saphyr::from_str(&yaml).expect("reads back");
        assert_eq!((back.metadata, back.spec), (m.metadata, m.spec));
    }

    #[test]
    fn several_objects_are_one_yaml_stream() {
        let s = yaml_stream(&[
            bundle("a", 1, &["p"], [job("j", 1, PriorityBand::Bronze)]),
            bundle("b", 1, &["p"], [job("j", 1, PriorityBand::Bronze)]),
        ]);
        assert_eq!(s.matches("kind: Bundle").count(), 2, "{s}");
        assert_eq!(s.matches("---\n").count(), 1, "{s}");
    }

    #[test]
    fn a_fixed_pool_declares_its_nodes_to_the_sim_and_its_zones_to_the_pool() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let (path, pool) = fixed_pool(
            dir.path(),
            "rows",
            &[("a1", "za"), ("b1", "zb"), ("a2", "za")],
        )
        .expect("written");
        assert_eq!(pool.spec.zones, ["za", "zb"]);
        assert_eq!(pool.spec.scale_out, ScaleOut::Fixed);
        let config: serde_json::Value =
            serde_saphyr::from_str(&std::fs::read_to_string(path).expect("read")).expect("YAML");
        let nodes = config
            .pointer("/pools/0/nodes")
            .and_then(|n| n.as_array())
            .map_or(0, Vec::len);
        assert_eq!(nodes, 3, "{config}");
    }
}
