//! `PlacementPool`: a pool of nodes jobs may be placed on.

use chrono::{DateTime, Utc};
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

/// An AWS launch template, by id or by name, and optionally a version (absent: the template's
/// default version).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.id) != has(self.name)").message("a launch template is named by exactly one of id and name"))]
pub struct LaunchTemplateRef {
    /// The template's id, e.g. `lt-0abcd1234ef567890`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub id: Option<String>,
    /// The template's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub name: Option<String>,
    /// The template's version (`$Latest`, `$Default` or a number).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub version: Option<String>,
}

/// How an `aws` pool's nodes are launched when the operator speaks Manager's published API,
/// whose CreateAwsNode takes a launch template and no zone: the template a zone's nodes are
/// launched with is what puts them in that zone (its subnet).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AwsLaunch {
    /// The template of a zone without its own entry in `zoneLaunchTemplates`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launch_template: Option<LaunchTemplateRef>,
    /// Per zone of the pool, the template whose subnet is in that zone.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub zone_launch_templates: std::collections::BTreeMap<String, LaunchTemplateRef>,
}

/// How an `oci` pool's nodes are launched when the operator speaks Manager's published API
/// (CreateOciNode takes an availability domain, a shape and a subnet).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OciLaunch {
    /// The subnet of an availability domain without its own entry in `zoneSubnets`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 255))]
    pub subnet: Option<String>,
    /// Per availability domain (a zone of the pool), the subnet its nodes are launched in.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16))]
    pub zone_subnets: std::collections::BTreeMap<String, String>,
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
#[x_kube(validation = Rule::new("!has(self.consolidation) || !has(self.consolidation.mode) || self.consolidation.mode == 'off' || (self.scaleOut == 'elastic' && (!has(self.packingStrategy) || self.packingStrategy == 'binpack'))").message("consolidation applies only to an elastic binpack pool (scaleOut: elastic, packingStrategy: binpack)").field_path(".consolidation"))]
#[x_kube(validation = Rule::new("!has(self.consolidation) || !has(self.consolidation.minNodes) || !has(self.maxNodes) || self.consolidation.minNodes <= self.maxNodes").message("consolidation.minNodes must not exceed maxNodes").field_path(".consolidation.minNodes"))]
#[x_kube(validation = Rule::new("!has(self.aws) || self.kind == 'aws'").message("aws launch settings apply only to a pool of kind aws").field_path(".aws"))]
#[x_kube(validation = Rule::new("!has(self.oci) || self.kind == 'oci'").message("oci launch settings apply only to a pool of kind oci").field_path(".oci"))]
#[x_kube(validation = Rule::new("!has(self.aws) || !has(self.aws.zoneLaunchTemplates) || self.aws.zoneLaunchTemplates.all(z, z in self.zones)").message("every zone in aws.zoneLaunchTemplates must be one of the pool's zones").field_path(".aws.zoneLaunchTemplates"))]
#[x_kube(validation = Rule::new("!has(self.oci) || !has(self.oci.zoneSubnets) || self.oci.zoneSubnets.all(z, z in self.zones)").message("every zone in oci.zoneSubnets must be one of the pool's zones").field_path(".oci.zoneSubnets"))]
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
    /// Consolidation: empty under-used nodes by moving their jobs (without dropping output) and
    /// terminate them. Off when absent. See docs/fleet-consolidation.md.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidation: Option<ConsolidationSpec>,
    /// `aws` pools over Manager's published API: the launch templates nodes are created with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws: Option<AwsLaunch>,
    /// `oci` pools over Manager's published API: the subnets nodes are created in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciLaunch>,
    /// How long a node of this pool takes from being asked for to running, in seconds, as its
    /// owner knows it. Spare schedules apply this far ahead of their windows, and moves ahead
    /// of a reclaim notice expect a new node of the pool up this long after asking. Manager's
    /// published API reports no such time, so there this is the pool's start latency (absent:
    /// none); over our first API the larger of this and what Manager reports counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub start_latency_seconds: Option<i32>,
}

/// A PlacementPool spec value the CRD's schema rules out, found by the operator (an object
/// written before the rule, or past an apiserver that does not check it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PoolSpecError {
    #[error(
        "startLatencySeconds is {0}: it must be 0 to {max}",
        max = PlacementPoolSpec::MAX_START_LATENCY_SECONDS
    )]
    StartLatencyOutOfRange(i32),
}

impl PlacementPoolSpec {
    /// The largest `startLatencySeconds`.
    pub const MAX_START_LATENCY_SECONDS: i32 = 3600;

    /// The values the operator checks itself, beyond what the placement engine checks.
    pub fn validate(&self) -> Result<(), PoolSpecError> {
        match self.start_latency_seconds {
            Some(s) if !(0..=Self::MAX_START_LATENCY_SECONDS).contains(&s) => {
                Err(PoolSpecError::StartLatencyOutOfRange(s))
            }
            _ => Ok(()),
        }
    }

    /// `startLatencySeconds`, when set and valid.
    pub fn declared_start_latency(&self) -> Option<std::time::Duration> {
        self.start_latency_seconds
            .filter(|s| (0..=Self::MAX_START_LATENCY_SECONDS).contains(s))
            .and_then(|s| u64::try_from(s).ok())
            .map(std::time::Duration::from_secs)
    }

    /// How long a node of this pool takes from being asked for to running: the longer of
    /// what Manager reports (`reported`) and what the pool declares.
    pub fn start_latency(&self, reported: std::time::Duration) -> std::time::Duration {
        self.declared_start_latency()
            .map_or(reported, |declared| declared.max(reported))
    }
}

/// Whether consolidation runs, only plans, or is off.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ConsolidationMode {
    /// Nothing is planned or moved (the default).
    #[default]
    Off,
    /// The plan (node → jobs → target node) is written to `status.consolidation` and nothing
    /// moves: a what-if.
    DryRun,
    /// Nodes are emptied, one at a time, through Migrations labelled
    /// `automanager.norsk.io/purpose: consolidation`, then terminated.
    Enabled,
}

/// How a pool is consolidated.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsolidationSpec {
    /// `off` (default), `dryRun` (plan only, shown in status) or `enabled`.
    #[serde(default)]
    pub mode: ConsolidationMode,
    /// The fewest non-spare nodes consolidation leaves in the pool (default 0). Spares are
    /// never consolidated; their HotSpareTargets keep them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100_000))]
    pub min_nodes: Option<i32>,
    /// Seconds to wait after one node is consolidated (or given up on) before the next is
    /// started (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86_400))]
    pub cooldown_seconds: Option<i32>,
    /// A node must have been up this many seconds before it is emptied (default 120), so a
    /// node provisioned a moment ago for a job about to start is left alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 86_400))]
    pub min_node_age_seconds: Option<i32>,
}

impl ConsolidationSpec {
    /// Default `cooldownSeconds`.
    pub const DEFAULT_COOLDOWN_SECONDS: i32 = 30;
    /// Default `minNodeAgeSeconds`.
    pub const DEFAULT_MIN_NODE_AGE_SECONDS: i32 = 120;

    pub fn min_nodes(&self) -> u32 {
        self.min_nodes
            .and_then(|n| u32::try_from(n).ok())
            .unwrap_or(0)
    }

    pub fn cooldown(&self) -> std::time::Duration {
        secs(self.cooldown_seconds, Self::DEFAULT_COOLDOWN_SECONDS)
    }

    pub fn min_node_age(&self) -> std::time::Duration {
        secs(
            self.min_node_age_seconds,
            Self::DEFAULT_MIN_NODE_AGE_SECONDS,
        )
    }
}

fn secs(v: Option<i32>, default: i32) -> std::time::Duration {
    let s = v.unwrap_or(default).max(0);
    std::time::Duration::from_secs(u64::try_from(s).unwrap_or(0))
}

/// One planned move of a consolidation plan.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsolidationMove {
    /// Manager's job id.
    #[schemars(length(max = 253))]
    pub job_id: String,
    /// The Bundle, as `<namespace>/<name>`.
    #[schemars(length(max = 317))]
    pub bundle: String,
    /// The job's replica index.
    pub replica: i32,
    /// The job's name in its Bundle.
    #[schemars(length(max = 63))]
    pub job_name: String,
    /// Where the job goes.
    #[schemars(length(max = 253))]
    pub target_node: String,
}

/// A node a consolidation plan empties, and the moves that empty it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsolidationNode {
    /// The node to empty and terminate.
    #[schemars(length(max = 253))]
    pub node: String,
    /// The node's jobs and where each goes; empty when the node holds none.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub moves: Vec<ConsolidationMove>,
    /// Moves left out of `moves` (the list is bounded).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub moves_omitted: i32,
}

fn is_zero(n: &i32) -> bool {
    *n == 0
}

/// What consolidation plans and does in a pool.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsolidationStatus {
    /// The nodes the last plan would empty, in order, with their moves (`dryRun` and
    /// `enabled`); the first 16.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub plan: Vec<ConsolidationNode>,
    /// How many nodes the last plan would empty (may exceed the length of `plan`).
    #[serde(default)]
    pub planned_nodes: i32,
    /// When the plan was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub planned_at: Option<DateTime<Utc>>,
    /// The node being emptied now (`enabled`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub current_node: Option<String>,
    /// Nodes consolidation has emptied and terminated in this pool.
    #[serde(default)]
    pub nodes_terminated: i64,
    /// When the last node was terminated or given up on (the cool-down starts there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_action_at: Option<DateTime<Utc>>,
}

impl ConsolidationStatus {
    /// Planned nodes kept in status.
    pub const MAX_PLANNED_NODES: usize = 16;
    /// Moves kept per planned node.
    pub const MAX_MOVES_PER_NODE: usize = 64;
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
    /// Consolidation's plan and progress (absent while `spec.consolidation.mode` is `off`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidation: Option<ConsolidationStatus>,
    /// kstatus `Ready` (the pool is valid and usable), `Reconciling` and `Stalled` (see
    /// docs/kstatus.md), each with `observedGeneration`.
    #[serde(default)]
    #[schemars(length(max = 16), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn spec(start_latency_seconds: Option<i32>) -> PlacementPoolSpec {
        serde_json::from_value(serde_json::json!({
            "kind": "aws", "region": "eu-west-1", "scaleOut": "fixed",
            "startLatencySeconds": start_latency_seconds,
        }))
        .unwrap()
    }

    #[test]
    fn a_declared_start_latency_counts_when_manager_reports_less() {
        let s = spec(Some(6));
        assert_eq!(s.start_latency(Duration::ZERO), Duration::from_secs(6));
        assert_eq!(
            s.start_latency(Duration::from_millis(200)),
            Duration::from_secs(6)
        );
    }

    #[test]
    fn manager_s_start_latency_counts_when_it_is_longer_than_the_declared_one() {
        assert_eq!(
            spec(Some(6)).start_latency(Duration::from_secs(30)),
            Duration::from_secs(30)
        );
    }

    #[test]
    fn without_a_declared_start_latency_manager_s_counts() {
        let s = spec(None);
        assert_eq!(s.declared_start_latency(), None);
        assert_eq!(
            s.start_latency(Duration::from_secs(30)),
            Duration::from_secs(30)
        );
        assert_eq!(s.validate(), Ok(()));
    }

    #[test]
    fn a_start_latency_outside_0_to_3600_seconds_is_invalid_and_not_used() {
        for bad in [-1, 3601] {
            let s = spec(Some(bad));
            assert_eq!(
                s.validate(),
                Err(PoolSpecError::StartLatencyOutOfRange(bad))
            );
            assert_eq!(s.declared_start_latency(), None);
            assert_eq!(
                s.start_latency(Duration::from_secs(2)),
                Duration::from_secs(2)
            );
        }
        for good in [0, 3600] {
            assert_eq!(spec(Some(good)).validate(), Ok(()));
        }
        assert_eq!(
            PoolSpecError::StartLatencyOutOfRange(4000).to_string(),
            "startLatencySeconds is 4000: it must be 0 to 3600"
        );
    }

    #[test]
    fn the_start_latency_is_written_as_start_latency_seconds() {
        let v = serde_json::to_value(spec(Some(90))).unwrap();
        assert_eq!(v["startLatencySeconds"], 90);
        let v = serde_json::to_value(spec(None)).unwrap();
        assert!(v.get("startLatencySeconds").is_none(), "{v}");
    }
}
