//! `PlacementPool`: a pool of nodes jobs may be placed on.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;

pub use automanager_policy::vocab::ScaleOut;

/// Where a pool's nodes come from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PoolKind {
    /// Amazon Web Services instances, created through Manager.
    Aws,
    /// Oracle Cloud Infrastructure instances, created through Manager.
    Oci,
    /// An on-prem cluster of nodes that already exist.
    Cluster,
}

/// How jobs are packed onto a pool's nodes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum PackingStrategy {
    /// Fill the fullest node that fits first, so fewer nodes run.
    #[default]
    Binpack,
    /// Use the emptiest node that fits first, so a node's loss touches fewer jobs.
    Spread,
}

/// A kind of node the pool has or can provision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CandidateInstanceType {
    /// The provider's instance type name, e.g. `m5.xlarge`.
    #[schemars(length(min = 1, max = 63))]
    pub instance_type: String,
    /// Capacity of one such node, in benchmarked reference-workload units (whole units;
    /// the TypeScript library's numbers are whole units too).
    #[schemars(range(min = 0, max = 1_000_000))]
    pub total_capacity: i64,
    /// CPU cores of one such node available for pinning.
    #[schemars(range(min = 0, max = 4096))]
    pub total_cores: i32,
    /// Capabilities such a node advertises (hardware or software features, e.g. `nvidia-gpu`).
    #[serde(default)]
    #[schemars(length(max = 32), inner(length(min = 1, max = 253)))]
    pub capabilities: Vec<String>,
}

/// A pool of nodes: the TypeScript library's `PlacementPool`. The pool's `name` is the object's `metadata.name`.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "automanager.norsk.io",
    version = "v1alpha1",
    kind = "PlacementPool",
    plural = "placementpools",
    shortname = "ppool",
    category = "automanager",
    status = "PlacementPoolStatus",
    doc = "A pool of nodes jobs may be placed on: its provider, region, zones, packing strategy and whether it can grow.",
    printcolumn(name = "Kind", type_ = "string", json_path = ".spec.kind"),
    printcolumn(name = "Scale", type_ = "string", json_path = ".spec.scaleOut"),
    printcolumn(
        name = "Packing",
        type_ = "string",
        json_path = ".spec.packingStrategy"
    ),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.nodeCount"),
    printcolumn(name = "Spares", type_ = "integer", json_path = ".status.liveSpares"),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.kind != 'cluster' || self.scaleOut == 'fixed'").message("a pool of kind cluster must have scaleOut: fixed (an on-prem cluster cannot provision nodes)").field_path(".scaleOut"))]
#[x_kube(validation = Rule::new("self.scaleOut != 'elastic' || self.candidateInstanceTypes.size() > 0").message("an elastic pool needs at least one entry in candidateInstanceTypes (the types it may provision)").field_path(".candidateInstanceTypes"))]
#[x_kube(validation = Rule::new("self.candidateInstanceTypes.all(t, self.candidateInstanceTypes.filter(u, u.instanceType == t.instanceType).size() == 1)").message("instanceType must be unique within candidateInstanceTypes").field_path(".candidateInstanceTypes"))]
#[x_kube(validation = Rule::new("self.kind == oldSelf.kind").message("kind is immutable: create a new pool instead"))]
#[x_kube(validation = Rule::new("self.region == oldSelf.region").message("region is immutable: create a new pool instead"))]
pub struct PlacementPoolSpec {
    /// Where the nodes come from: `aws`, `oci` or `cluster` (on-prem).
    pub kind: PoolKind,
    /// The provider region, e.g. `eu-west-1`; for `cluster` pools a site name.
    #[schemars(length(min = 1, max = 63))]
    pub region: String,
    /// Availability zones nodes of this pool may be in; empty means any the provider reports.
    #[serde(default)]
    #[schemars(length(max = 16), inner(length(min = 1, max = 63)))]
    pub zones: Vec<String>,
    /// `binpack` (default: fullest node that fits) or `spread` (emptiest node that fits).
    #[serde(default)]
    pub packing_strategy: PackingStrategy,
    /// `elastic` (AutoManager may provision nodes) or `fixed` (use what exists).
    pub scale_out: ScaleOut,
    /// The instance types this pool has or may provision. Required (non-empty) for elastic pools;
    /// for fixed pools it describes the hardware for static validation.
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub candidate_instance_types: Vec<CandidateInstanceType>,
    /// Upper bound on the pool's node count for elastic growth (absent: no bound).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100_000))]
    pub max_nodes: Option<i32>,
}

/// What the operator observes of a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementPoolStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Nodes Manager runs in this pool (starting or started).
    #[serde(default)]
    pub node_count: i64,
    /// Spare nodes that are up and hold no job.
    #[serde(default)]
    pub live_spares: i64,
    /// Spares the pool's HotSpareTargets ask for, summed.
    #[serde(default)]
    pub spare_target: i64,
    /// Used capacity over total capacity of the pool's started nodes, 0 to 1.
    #[serde(default)]
    pub used_capacity_fraction: f64,
    /// kstatus `Ready` (the pool is valid and usable), `Reconciling` and `Stalled` (see
    /// docs/kstatus.md), each with `observedGeneration`.
    #[serde(default)]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}
