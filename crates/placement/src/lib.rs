//! # AutoManager placement engine
//!
//! Decides where every job runs. Pure: no I/O, no async, no clock, no Kubernetes or gRPC
//! types, and no dependency on any other crate of this workspace; the operator maps its CRDs
//! and the Manager mirror into this crate's input types ([`ClusterSnapshot`],
//! [`PlacementRequest`], [`BundleSpec`]). The same inputs always give the same decision.
//! Semantics for users are in `docs/placement.md`; this page is for callers.
//!
//! ## Using it
//!
//! ```
//! use automanager_placement::*;
//!
//! let pool = PoolSpec {
//!     name: "aws-east".into(), kind: PoolKind::Aws, region: "eu-west-1".into(),
//!     zones: vec!["a".into(), "b".into()], packing_strategy: PackingStrategy::Binpack,
//!     scale_out: ScaleOut::Elastic,
//!     candidate_instance_types: vec![InstanceTypeSpec {
//!         instance_type: "m5.xlarge".into(), total_capacity: 100.0, total_cores: 16, capabilities: vec![],
//!     }],
//!     max_nodes: None,
//!     terminating: false,
//! };
//! let snapshot = ClusterSnapshot {
//!     pools: vec![pool],
//!     nodes: vec![NodeSpec::ready("n1", "aws-east", Some("a"), 100.0, 16)],
//!     ..ClusterSnapshot::default()
//! };
//! let mut engine = Engine::new(snapshot).expect("valid snapshot");
//! let bundle = BundleSpec {
//!     bundle_id: "channel-1".into(), replicas: 1, pools: vec!["aws-east".into()],
//!     jobs: vec![JobSpec::new("encode", 8.0, 4, PriorityBand::Gold)],
//!     replica_overrides: Default::default(),
//!     intra_replica_placement: PlacementRules::none(),
//!     inter_replica_placement: PlacementRules::inter_replica_default(),
//! };
//! assert_eq!(validate_admission(&bundle, &engine, 0), AdmissionResult::Ok);
//! let request = bundle.request_for_replica(0, PlacementKind::First, vec![]);
//! let decision = engine.place(&request, 0);
//! assert!(decision.is_placed());
//! let status = decision.summary(); // bounded: copy into Bundle status
//! assert_eq!(status.chosen_node.as_deref(), Some("n1"));
//! engine.commit(&decision).expect("nodes exist");
//! ```
//!
//! * [`Engine::new`] / [`Engine::new_lenient`] load a [`ClusterSnapshot`];
//!   [`Engine::upsert_pool`], [`Engine::upsert_node`], [`Engine::remove_node`],
//!   [`Engine::set_cordoned`], [`Engine::mark_started`] keep it current from the mirror.
//! * [`Engine::place`] answers a [`PlacementRequest`] with a [`Decision`]: `Placed` (a node
//!   per job), `Provision` (a new node of a type in an elastic pool), or `Unplaceable` (a
//!   reason per job). It never mutates the engine.
//! * [`Engine::commit`] reserves a `Placed` decision's capacity so the next placement of a
//!   wave sees it; [`Engine::release_job`] gives it back when the job stops. Reservations are
//!   keyed by [`JobKey`] (bundle, replica, job name).
//! * [`validate_bundle`] (static) and [`validate_admission`] (static + dry run of every
//!   replica on a copy of the engine) check a bundle before it is accepted.
//!
//! ## Choices made where the design was silent
//!
//! * Capacity is held in thousandths of a unit (`u64`): demands round up, supplies round
//!   down, so rounding never over-commits, keys have a total order, and NaN cannot get in.
//!   Inputs must be finite, non-negative and at most [`MAX_CAPACITY`]; cores at most
//!   [`MAX_CORES`]. A replica has at most [`MAX_JOBS_PER_REPLICA`] jobs.
//! * Jobs joined by `coLocateWith` (transitively; cycles are fine) form a *group* that is
//!   placed on one node with the summed needs, the union of capabilities and the most
//!   important band. Groups are placed greedily, most constrained first (pinned to a running
//!   sibling, then largest capacity, cores, first job name). A hard intra-replica `sameNode`
//!   makes the whole replica one group.
//! * Soft rules order candidates lexicographically in a fixed importance order
//!   ([`SoftRule`]'s declaration order): the engine keeps each one while some node still
//!   honours it together with the ones kept before, and reports the rest as broken.
//! * Candidate order for a group: soft rules as above, then ready nodes before nodes still
//!   starting (within `pendingWindow`), then the recovery tier (gold: band spares, shared
//!   spares, nodes; silver and bronze: nodes, then spares; first placements: nodes only),
//!   then packing (binpack: least free capacity, then fewest free cores; spread: most free
//!   capacity, then most free cores), then the smallest node id.
//! * A pool is left only when it cannot take the whole replica: an elastic pool first asks
//!   for a new node (the smallest candidate type — by capacity, cores, name — with which the
//!   replica would fit, in the zone breaking fewest soft rules), unless it is at `maxNodes`.
//! * A replica no pool can take whole is placed group by group (same order), each group
//!   falling through the pool list on its own, checked against where the other groups landed
//!   whatever their pool; a group no existing node of an elastic pool takes asks that pool for
//!   a node (`Provision`). Only when the whole-replica pass finds nothing, so every decision it
//!   makes is unchanged; [`Trace::jobs`] then gives each job's pool and the pools it left.
//! * A spare that takes a job (commit) stops being a spare.
//! * `upsert_node` replaces the node's used capacity with what the mirror reports; reserve and
//!   release adjust it in between.
//! * Trace rejections are counted only for pools that were left, over every node of the pool,
//!   for the group that did not fit, each node under the first [`RejectReason`] that applies.
//!   A successful placement costs no scan.
//!
//! ## Indexes
//!
//! Per pool, ready nodes sit in buckets keyed by (capability set, zone, class), each split by
//! free-core range (0, 1, 2–3, 4–7, …) into `BTreeSet`s ordered by the packing key (free
//! capacity, free cores, node id). Capabilities are interned to bitsets, so a bucket is matched
//! with a few word operations, never a string compare. Each change of a node is remove +
//! insert (O(log n)). A search visits only buckets whose capabilities, zone and class qualify
//! and core ranges that can hold the need, and takes the first fitting entry of each (binpack:
//! a range lookup from the needed capacity; spread: the last entry). Starting nodes, and nodes
//! the replica already uses in this attempt, are checked one by one (there are few).
//! Rejection counts for a left pool are computed from bucket sizes, visiting only nodes that
//! have the capacity but lack cores and nodes named by a rule. The naive full-scan placer
//! (`naive`, feature `naive`) shares the driver and the per-node check, so property tests
//! compare exactly the indexes against the scan, traces included.

mod decision;
mod engine;
mod model;
#[cfg(any(test, feature = "naive"))]
pub mod naive;
mod place;
mod search;
mod validate;

#[cfg(test)]
mod tests;

pub use decision::{
    Assignment, Decision, JobPoolTrace, JobUnplaceable, NodeScore, Outcome, OutcomeKind,
    PoolAttempt, PoolLeftReason, PoolOutcome, PoolTry, RejectReason, RejectionCount,
    SUMMARY_MAX_MESSAGE, SUMMARY_MAX_NODES, SUMMARY_MAX_POOLS, SoftRule, Tier, Trace, TraceSummary,
    UnplaceableReason,
};
pub use engine::{
    CommitError, Engine, InputError, JobKey, MAX_CAPACITY, MAX_CORES, NodeView, NumberProblem,
    PoolUsage, SnapshotError,
};
pub use model::{
    BundleSpec, ClusterSnapshot, DEFAULT_PENDING_WINDOW_MS, InstanceTypeSpec, JobSpec, NodeSpec,
    PackingStrategy, PlacementKind, PlacementRequest, PlacementRules, PoolKind, PoolSpec, Position,
    PriorityBand, ReplicaOverride, Requirements, ScaleOut, SiblingPosition, Strength,
};
pub use place::MAX_JOBS_PER_REPLICA;
pub use validate::{
    AdmissionResult, MAX_REPLICAS, UnplaceableJob, ValidationError, validate_admission,
    validate_admission_traced, validate_bundle,
};

impl Engine {
    /// Decides where one replica goes. `now_ms` is only compared with nodes'
    /// `pendingSinceMs` (same clock, any epoch).
    pub fn place(&self, request: &PlacementRequest, now_ms: u64) -> Decision {
        place::place(self, &search::Fast, request, now_ms)
    }
}
