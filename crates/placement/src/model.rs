//! The engine's input model: what the operator maps its CRDs and Manager mirror into.
//!
//! Ids are plain strings at this boundary; the engine interns them. Field names serialise in
//! camelCase and are part of the crate's stable interface.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Default `pendingWindow`: a node still starting counts as capacity for this long.
pub const DEFAULT_PENDING_WINDOW_MS: u64 = 60_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PoolKind {
    Aws,
    Oci,
    Cluster,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PackingStrategy {
    /// The fullest node that fits.
    #[default]
    Binpack,
    /// The emptiest node.
    Spread,
}

// One definition for the engine, the policy and the CRDs, which take their schema and
// descriptions from the doc comments below (so those are written for users).
/// Whether the pool can grow.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum ScaleOut {
    /// AutoManager may provision nodes (of the smallest candidate instance type that fits).
    Elastic,
    /// The pool's nodes are what exists; nothing is provisioned.
    #[default]
    Fixed,
}

// One definition for the engine, the policy and the CRDs, as ScaleOut above.
/// A job's priority band. It governs what happens when the job fails or loses its node.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum PriorityBand {
    /// Restarted on failure, preferring a hot spare (a spare dedicated to gold first).
    Gold,
    /// Restarted on failure on any node that fits.
    Silver,
    /// Dropped on failure: never restarted (an Event and a metric record the drop).
    Bronze,
}

impl PriorityBand {
    /// The band's name as written in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            PriorityBand::Gold => "gold",
            PriorityBand::Silver => "silver",
            PriorityBand::Bronze => "bronze",
        }
    }

    /// Rank for "most important band wins" when jobs share a node: gold 0, silver 1, bronze 2.
    pub(crate) fn rank(self) -> u8 {
        match self {
            PriorityBand::Gold => 0,
            PriorityBand::Silver => 1,
            PriorityBand::Bronze => 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceTypeSpec {
    pub instance_type: String,
    pub total_capacity: f64,
    pub total_cores: u32,
    #[serde(default)]
    pub capabilities: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolSpec {
    pub name: String,
    pub kind: PoolKind,
    #[serde(default)]
    pub region: String,
    /// Zones a provisioned node may be asked for, in preference order. Empty: the provider picks.
    #[serde(default)]
    pub zones: Vec<String>,
    #[serde(default)]
    pub packing_strategy: PackingStrategy,
    #[serde(default)]
    pub scale_out: ScaleOut,
    #[serde(default)]
    pub candidate_instance_types: Vec<InstanceTypeSpec>,
    /// Upper bound on the pool's node count (all nodes, spares and starting ones included).
    #[serde(default)]
    pub max_nodes: Option<u32>,
    /// The pool is being deleted: what runs there stays until it moves, but nothing new is
    /// placed or provisioned there.
    #[serde(default)]
    pub terminating: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSpec {
    pub id: String,
    /// The pool the node belongs to. A node of a pool the engine does not know is kept but is
    /// never a candidate.
    pub pool: String,
    #[serde(default)]
    pub zone: Option<String>,
    #[serde(default)]
    pub instance_type: Option<String>,
    pub total_capacity: f64,
    #[serde(default)]
    pub used_capacity: f64,
    pub total_cores: u32,
    #[serde(default)]
    pub used_cores: u32,
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub cordoned: bool,
    #[serde(default = "default_true")]
    pub healthy: bool,
    /// A hot spare: kept free for recovery placements.
    #[serde(default)]
    pub spare: bool,
    /// A spare dedicated to one band; `None` serves any band.
    #[serde(default)]
    pub spare_band: Option<PriorityBand>,
    /// Set while the node is still starting (milliseconds, same clock as `now`).
    #[serde(default)]
    pub pending_since_ms: Option<u64>,
}

fn default_true() -> bool {
    true
}

impl NodeSpec {
    /// A healthy, ready, empty, non-spare node: the common case, for tests and tools.
    pub fn ready(id: &str, pool: &str, zone: Option<&str>, capacity: f64, cores: u32) -> Self {
        NodeSpec {
            id: id.to_owned(),
            pool: pool.to_owned(),
            zone: zone.map(str::to_owned),
            instance_type: None,
            total_capacity: capacity,
            used_capacity: 0.0,
            total_cores: cores,
            used_cores: 0,
            capabilities: Vec::new(),
            cordoned: false,
            healthy: true,
            spare: false,
            spare_band: None,
            pending_since_ms: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSnapshot {
    #[serde(default)]
    pub pools: Vec<PoolSpec>,
    #[serde(default)]
    pub nodes: Vec<NodeSpec>,
    #[serde(default = "default_pending_window")]
    pub pending_window_ms: u64,
}

fn default_pending_window() -> u64 {
    DEFAULT_PENDING_WINDOW_MS
}

impl Default for ClusterSnapshot {
    fn default() -> Self {
        ClusterSnapshot {
            pools: Vec::new(),
            nodes: Vec::new(),
            pending_window_ms: DEFAULT_PENDING_WINDOW_MS,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Requirements {
    pub required_capacity: f64,
    #[serde(default)]
    pub required_cores: u32,
    #[serde(default)]
    pub required_capabilities: Vec<String>,
    pub priority_band: PriorityBand,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobSpec {
    pub job_name: String,
    pub requirements: Requirements,
    /// Jobs of the same replica that must share this job's node.
    #[serde(default)]
    pub co_locate_with: Vec<String>,
    /// Jobs of the same replica that must not share this job's node.
    #[serde(default)]
    pub separate_from: Vec<String>,
}

impl JobSpec {
    pub fn new(name: &str, capacity: f64, cores: u32, band: PriorityBand) -> Self {
        JobSpec {
            job_name: name.to_owned(),
            requirements: Requirements {
                required_capacity: capacity,
                required_cores: cores,
                required_capabilities: Vec::new(),
                priority_band: band,
            },
            co_locate_with: Vec::new(),
            separate_from: Vec::new(),
        }
    }
}

/// Whether a rule must hold (`hard`, a filter) or is a preference (`soft`, an ordering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Strength {
    Hard,
    Soft,
}

/// Placement rules within a replica (between its jobs) or between replicas of a bundle.
/// An absent rule is not applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementRules {
    #[serde(default)]
    pub same_node: Option<Strength>,
    #[serde(default)]
    pub different_node: Option<Strength>,
    #[serde(default)]
    pub same_zone: Option<Strength>,
    #[serde(default)]
    pub different_zone: Option<Strength>,
}

impl PlacementRules {
    /// No rules: the intra-replica default.
    pub fn none() -> Self {
        PlacementRules::default()
    }

    /// The inter-replica default: different node (hard), same zone (soft).
    pub fn inter_replica_default() -> Self {
        PlacementRules {
            same_node: None,
            different_node: Some(Strength::Hard),
            same_zone: Some(Strength::Soft),
            different_zone: None,
        }
    }
}

fn default_inter() -> PlacementRules {
    PlacementRules::inter_replica_default()
}

/// First placement of a replica, or re-placement after a failure (which may use hot spares).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum PlacementKind {
    #[default]
    First,
    Recovery,
}

/// Where a job of another replica of the same bundle runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Position {
    pub node: String,
    /// The node's zone; when absent the engine uses the zone it knows for `node`.
    #[serde(default)]
    pub zone: Option<String>,
}

/// A job of this same replica that is already running and is not being placed now
/// (recovery of part of a replica). Intra-replica rules, `coLocateWith` and `separateFrom`
/// are honoured against it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SiblingPosition {
    pub job_name: String,
    pub node: String,
    #[serde(default)]
    pub zone: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlacementRequest {
    pub bundle_id: String,
    pub replica_index: u32,
    /// The jobs to place now; placed as a unit.
    pub jobs: Vec<JobSpec>,
    /// Pools in preference order, replica override already applied.
    pub pools: Vec<String>,
    #[serde(default)]
    pub kind: PlacementKind,
    #[serde(default)]
    pub intra_replica: PlacementRules,
    #[serde(default = "default_inter")]
    pub inter_replica: PlacementRules,
    /// Positions of the jobs of the bundle's other replicas.
    #[serde(default)]
    pub other_replicas: Vec<Position>,
    #[serde(default)]
    pub placed_siblings: Vec<SiblingPosition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaOverride {
    #[serde(default)]
    pub pools: Vec<String>,
}

/// A bundle as the user declares it (the operator maps the Bundle CRD to this).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleSpec {
    pub bundle_id: String,
    pub replicas: u32,
    pub pools: Vec<String>,
    pub jobs: Vec<JobSpec>,
    #[serde(default)]
    pub replica_overrides: BTreeMap<u32, ReplicaOverride>,
    #[serde(default)]
    pub intra_replica_placement: PlacementRules,
    #[serde(default = "default_inter")]
    pub inter_replica_placement: PlacementRules,
}

impl BundleSpec {
    /// The pool preference list of one replica: its override when it has a non-empty one,
    /// else the bundle's.
    pub fn pools_for_replica(&self, replica_index: u32) -> &[String] {
        match self.replica_overrides.get(&replica_index) {
            Some(o) if !o.pools.is_empty() => &o.pools,
            _ => &self.pools,
        }
    }

    /// The request that places every job of one replica.
    pub fn request_for_replica(
        &self,
        replica_index: u32,
        kind: PlacementKind,
        other_replicas: Vec<Position>,
    ) -> PlacementRequest {
        PlacementRequest {
            bundle_id: self.bundle_id.clone(),
            replica_index,
            jobs: self.jobs.clone(),
            pools: self.pools_for_replica(replica_index).to_vec(),
            kind,
            intra_replica: self.intra_replica_placement,
            inter_replica: self.inter_replica_placement,
            other_replicas,
            placed_siblings: Vec::new(),
        }
    }
}
