//! What this installation owns, answered in one place.
//!
//! Several operators may share one Manager: each watches its own namespaces, and one of them
//! does the cluster-scoped work (PlacementPools, HotSpareTargets, ManagerNodes, spares). Every
//! path that must not touch another installation's objects (controllers, the orphan sweep,
//! recovery, preemption, reclaim notices, drains) asks [`Scope`], so splitting the work further
//! (more releases, shards) changes this type and nothing else.

use automanager_policy::ids::BundleId;

/// The namespaces and the cluster-scoped work this installation owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The namespaces watched; empty means every namespace.
    namespaces: Vec<String>,
    /// This installation does the cluster-scoped work.
    cluster: bool,
}

impl Default for Scope {
    /// Every namespace and the cluster scope: one installation per Manager.
    fn default() -> Self {
        Scope::new(Vec::new(), true)
    }
}

impl Scope {
    /// `namespaces` watched (none: all), and whether the cluster-scoped work is ours.
    pub fn new(namespaces: Vec<String>, cluster: bool) -> Self {
        Scope {
            namespaces,
            cluster,
        }
    }

    /// Whether namespaced objects (Bundles, Migrations) in `namespace` are ours.
    pub fn owns_namespace(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// Whether Manager's bundle `id` is one of our Bundles' (its namespace is ours).
    pub fn owns_bundle(&self, id: &BundleId) -> bool {
        self.owns_namespace(id.object().0)
    }

    /// Manager's bundle id as ours: `None` for an id that names no Bundle or another
    /// installation's.
    pub fn our_bundle(&self, bundle_id: &str) -> Option<BundleId> {
        BundleId::parse(bundle_id).filter(|id| self.owns_bundle(id))
    }

    /// Whether a Migration named by its namespace-qualified id could be another
    /// installation's: only an installation watching every namespace can say it is ours
    /// without reading it.
    pub fn owns_every_namespace(&self) -> bool {
        self.namespaces.is_empty()
    }

    /// The namespaces watched, when a list narrows the watch; `None` for every namespace.
    pub fn namespaces(&self) -> Option<&[String]> {
        (!self.namespaces.is_empty()).then_some(self.namespaces.as_slice())
    }

    /// Whether the cluster-scoped work (pools, spare targets, nodes, spares) is ours.
    pub fn owns_cluster_scope(&self) -> bool {
        self.cluster
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_namespace_when_none_are_listed_and_only_those_listed_otherwise() {
        let all = Scope::default();
        assert!(all.owns_namespace("anything") && all.owns_every_namespace());
        assert_eq!(all.namespaces(), None);
        let some = Scope::new(vec!["a".into(), "b".into()], false);
        assert!(some.owns_namespace("a") && some.owns_namespace("b"));
        assert!(!some.owns_namespace("c") && !some.owns_every_namespace());
        assert!(!some.owns_cluster_scope());
        assert_eq!(
            some.namespaces(),
            Some(&["a".to_owned(), "b".to_owned()][..])
        );
    }

    #[test]
    fn a_bundle_is_ours_when_its_namespace_is() {
        let some = Scope::new(vec!["video".into()], true);
        assert!(some.our_bundle("video.news").is_some());
        assert!(some.our_bundle("other.news").is_none());
        assert!(some.our_bundle("not-a-bundle-id").is_none());
    }
}
