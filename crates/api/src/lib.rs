//! # automanager-api
//!
//! The custom resources of AutoManager, group `automanager.norsk.io`, version `v1alpha1`:
//!
//! | kind | scope | what it declares |
//! |---|---|---|
//! | [`Bundle`] | namespaced | a replicated group of jobs and where they may run |
//! | [`PlacementPool`] | cluster | a pool of nodes (aws / oci / an on-prem cluster) and how it is packed and grown |
//! | [`HotSpareTarget`] | cluster | how many warm, empty nodes a pool keeps for recovery |
//! | [`Migration`] | namespaced | a request to move one running job to another node |
//! | [`ManagerNode`] | cluster | a node Manager runs, mirrored by the operator; users set cordon and drain |
//! | [`PlacementHistory`] | namespaced | a Bundle's recent placement decisions, written by the operator (read-only for people) |
//!
//! Field names are the `@norskvideo/norsk-auto-manager` TypeScript library's own (`replicas`, `pools`, `requiredCapacity`, `priorityBand`, …)
//! so a user of the TypeScript `norsk-auto-manager` recognises every field. Where the library's shape
//! clashes with Kubernetes API conventions the convention wins and the field's description says so
//! (for example `replicaOverrides` is a list keyed by `replica`, not a map keyed by number).
//!
//! Static shape rules live in the schema itself as CEL `x-kubernetes-validations`, so the apiserver
//! rejects a bad object at `kubectl apply` time with a message naming the field. Every list and
//! string is bounded so that CEL cost limits are met and no object can be made huge.
//!
//! The CRD YAML in `crds/` is generated from these types by `crdgen` (`make crds`); a test fails
//! when the committed YAML drifts from the types.

// kube's `printcolumn(type_ = ...)` repeats key names across columns, which clippy mistakes for
// duplicated attributes.
#![allow(clippy::duplicated_attributes)]

/// Status fields bounded by construction (defined with the policy, which writes them).
pub use automanager_policy::bounded;
/// The window calendar a Bundle's `disruption.windows` are read with (the plugin shows it).
pub use automanager_policy::calendar;
pub mod bundle;
pub mod common;
pub mod condition;
pub mod crd;
pub mod history;
pub mod hotspare;
pub mod job_config;
pub mod job_template;
pub mod kstatus;
pub mod migration;
pub mod node;
pub mod pool;
pub mod reference;
pub mod trace;
pub mod window;

pub use bundle::*;
pub use common::*;
pub use condition::*;
pub use history::*;
pub use hotspare::*;
pub use kstatus::{Standing, set_standing};
pub use migration::*;
pub use node::*;
pub use pool::*;
pub use trace::*;
pub use window::*;

/// The API group of every AutoManager resource.
pub const GROUP: &str = "automanager.norsk.io";
/// The API version of every AutoManager resource.
pub const VERSION: &str = "v1alpha1";
/// The `kubectl get <category>` name that lists every AutoManager kind.
pub const CATEGORY: &str = "automanager";

/// Finalizer the operator puts on Bundles so their jobs are stopped and the bundle is
/// unregistered from Manager before the object goes away.
pub const BUNDLE_FINALIZER: &str = "automanager.norsk.io/bundle-cleanup";
/// Finalizer the operator puts on Migrations so an abortable migration is aborted (and its
/// target cleaned up) before the object goes away.
pub const MIGRATION_FINALIZER: &str = "automanager.norsk.io/migration-cleanup";
/// Finalizer the operator puts on HotSpareTargets so a deleted target's idle spares are
/// terminated rather than left running.
pub const SPARE_TARGET_FINALIZER: &str = "automanager.norsk.io/spare-cleanup";
/// Finalizer the operator puts on PlacementPools so a pool is not deleted while a Bundle or a
/// HotSpareTarget names it (its jobs would lose the pool they recover into).
pub const POOL_FINALIZER: &str = "automanager.norsk.io/pool-in-use";
/// Annotation a user sets to a new value to retry a Broken bundle:
/// `kubectl annotate --overwrite bundle NAME automanager.norsk.io/retry=$(date +%s)`.
pub const RETRY_ANNOTATION: &str = "automanager.norsk.io/retry";
/// Label on the Migrations a `migrate` drain creates; its value identifies the drained node
/// (a short hash of the node's object name, which may be longer than a label value may be).
pub const DRAIN_NODE_LABEL: &str = "automanager.norsk.io/drain-node";
/// Annotation on the Migrations a `migrate` drain creates: the drained ManagerNode's name.
pub const DRAIN_NODE_ANNOTATION: &str = "automanager.norsk.io/drained-node";
/// Label saying why a Migration runs: `rebalance` or `consolidation` rank behind drains in the
/// migration queue; absent (a drain's, or one a person created) ranks with drains.
pub const PURPOSE_LABEL: &str = "automanager.norsk.io/purpose";
/// Annotation on a reclaim Migration that goes ahead past its bundle's disruption budget (the
/// node is taken at its deadline either way): the notice planner's reason.
pub const BUDGET_OVERRIDE_ANNOTATION: &str = "automanager.norsk.io/budget-override";
/// Annotation on a move with a deadline (a reclaim notice's Migration): when its node is
/// taken, RFC 3339. Such a move takes over its job's held voluntary Migration.
pub const DEADLINE_ANNOTATION: &str = "automanager.norsk.io/deadline";
/// Label on the Migrations consolidation creates; its value identifies the node being emptied
/// (a short hash of the node id, as for [`DRAIN_NODE_LABEL`]).
pub const CONSOLIDATION_NODE_LABEL: &str = "automanager.norsk.io/consolidation-node";
/// Annotation on the Migrations consolidation creates: the Manager id of the node being emptied.
pub const CONSOLIDATION_NODE_ANNOTATION: &str = "automanager.norsk.io/consolidated-node";
/// Field manager the operator uses for server-side apply of status.
pub const FIELD_MANAGER: &str = "automanager-operator";
