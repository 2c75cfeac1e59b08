//! The CRD → placement-engine conversion, as the operator does it.
//!
//! The plugin validates with the operator's own code, so it converts objects exactly as the
//! operator does, with the same pure functions (`automanager-mapping`).

use automanager_api as api;
use automanager_mapping as mapping;
use automanager_placement as pl;

/// Manager's bundle id of a Bundle object (`<namespace>.<name>`).
pub fn bundle_id(namespace: &str, name: &str) -> String {
    mapping::bundle_id(namespace, name)
}

/// A Bundle's spec as the engine sees it.
pub fn bundle(namespace: &str, name: &str, spec: &api::BundleSpec) -> pl::BundleSpec {
    mapping::bundle(&mapping::bundle_id(namespace, name), spec)
}

/// A PlacementPool's spec as the engine sees it.
pub fn pool(name: &str, spec: &api::PlacementPoolSpec) -> pl::PoolSpec {
    mapping::pool(name, spec)
}

/// The ManagerNode object name of a Manager node id.
pub fn node_object_name(node_id: &str) -> String {
    mapping::node_object_name(node_id)
}
