//! The orphan sweep's decisions: which of Manager's bundles and nodes belong to a custom resource
//! that is gone, and when one has been orphaned long enough to remove.
//!
//! Deleting an object normally cleans up through its finalizer (a Bundle's jobs, a
//! HotSpareTarget's idle spares). The sweep catches what that path missed: a restore of etcd, a
//! finalizer removed by hand, a bug. It considers only what has the operator's own id form and
//! tags (it cannot tell who made a thing: anything else with those ids or tags is taken for the
//! operator's) and is patient: a candidate must stay orphaned for the whole
//! grace period, continuously, before it is removed, so an object whose creation the operator's
//! caches have not seen yet is never mistaken for a gone one. The caller re-reads the owner from
//! the apiserver before removing anything.

use std::collections::BTreeMap;

use crate::ids::BundleId;
use crate::tags::{PROVISIONED_FOR_TAG, SPARE_TARGET_TAG};

/// Something in Manager the sweep may remove.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Orphan {
    /// A registered bundle whose Bundle object is gone (removing it stops its jobs).
    Bundle(BundleId),
    /// A node whose owner is gone and which runs nothing (removing it terminates it).
    Node(String),
}

impl Orphan {
    /// `bundle` or `node`, for metrics and Events.
    pub fn kind(&self) -> &'static str {
        match self {
            Orphan::Bundle(_) => "bundle",
            Orphan::Node(_) => "node",
        }
    }
}

/// Who a node was created for, as its tags say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeOwner {
    /// A HotSpareTarget (cluster-scoped), by name.
    SpareTarget(String),
    /// A replica of a bundle: the placement engine provisioned the node for it.
    BundleReplica(BundleId),
    /// A migration's target, by Manager's migration id.
    Migration(String),
}

/// The owner a node's tags name; `None` for a node the operator did not create.
pub fn node_owner<'a>(mut tag: impl FnMut(&str) -> Option<&'a str>) -> Option<NodeOwner> {
    if let Some(target) = tag(SPARE_TARGET_TAG).filter(|t| !t.is_empty()) {
        return Some(NodeOwner::SpareTarget(target.to_owned()));
    }
    let value = tag(PROVISIONED_FOR_TAG)?;
    if let Some(id) = value.strip_prefix("migration.") {
        return (!id.is_empty()).then(|| NodeOwner::Migration(id.to_owned()));
    }
    // `<bundle id>.r<replica>` (BundleId::provisioned_for).
    let (bundle, replica) = value.rsplit_once(".r")?;
    replica.parse::<u32>().ok()?;
    BundleId::parse(bundle).map(NodeOwner::BundleReplica)
}

/// Candidates seen orphaned, and since when: the sweep's memory between passes.
#[derive(Clone, Debug, Default)]
pub struct OrphanTracker {
    since: BTreeMap<Orphan, i64>,
}

impl OrphanTracker {
    /// Records this pass's candidates (everything orphaned now) and returns those orphaned
    /// continuously for at least `grace_ms`. A candidate missing from a pass is forgotten: its
    /// clock starts over if it is orphaned again.
    pub fn observe(
        &mut self,
        candidates: impl IntoIterator<Item = Orphan>,
        now_ms: i64,
        grace_ms: i64,
    ) -> Vec<Orphan> {
        let mut next = BTreeMap::new();
        for c in candidates {
            let since = self.since.get(&c).copied().unwrap_or(now_ms);
            next.insert(c, since);
        }
        self.since = next;
        self.since
            .iter()
            .filter(|(_, since)| now_ms.saturating_sub(**since) >= grace_ms)
            .map(|(c, _)| c.clone())
            .collect()
    }

    /// Forgets a candidate once it has been removed (or its owner turned out to exist).
    pub fn forget(&mut self, orphan: &Orphan) {
        self.since.remove(orphan);
    }

    /// Candidates being watched.
    pub fn len(&self) -> usize {
        self.since.len()
    }

    /// Whether none is being watched.
    pub fn is_empty(&self) -> bool {
        self.since.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn bundle(id: &str) -> Orphan {
        Orphan::Bundle(BundleId::parse(id).unwrap_or_else(|| panic!("{id}")))
    }

    fn tags<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl FnMut(&str) -> Option<&'a str> {
        move |k| pairs.iter().find(|(key, _)| *key == k).map(|(_, v)| *v)
    }

    #[test]
    fn a_node_names_its_owner_by_its_tags() {
        assert_eq!(
            node_owner(tags(&[
                (SPARE_TARGET_TAG, "gold-spares"),
                ("spare", "true")
            ])),
            Some(NodeOwner::SpareTarget("gold-spares".into()))
        );
        assert_eq!(
            node_owner(tags(&[(PROVISIONED_FOR_TAG, "video.news/r1")])),
            None,
            "not a bundle id"
        );
        assert_eq!(
            node_owner(tags(&[(PROVISIONED_FOR_TAG, "video.news.r1")])),
            BundleId::parse("video.news").map(NodeOwner::BundleReplica)
        );
        assert_eq!(
            node_owner(tags(&[(PROVISIONED_FOR_TAG, "migration.automanager-1234")])),
            Some(NodeOwner::Migration("automanager-1234".into()))
        );
        assert_eq!(
            node_owner(tags(&[])),
            None,
            "a node the operator did not create"
        );
        assert_eq!(
            node_owner(tags(&[(PROVISIONED_FOR_TAG, "video.news.rX")])),
            None
        );
    }

    #[test]
    fn a_candidate_is_due_only_after_the_whole_grace_period() {
        let mut t = OrphanTracker::default();
        let grace = 300_000;
        assert!(t.observe([bundle("ns.a")], 0, grace).is_empty());
        assert!(t.observe([bundle("ns.a")], 299_999, grace).is_empty());
        assert_eq!(
            t.observe([bundle("ns.a")], 300_000, grace),
            vec![bundle("ns.a")]
        );
    }

    #[test]
    fn a_candidate_that_reappears_starts_its_grace_over() {
        let mut t = OrphanTracker::default();
        let grace = 100;
        t.observe([bundle("ns.a")], 0, grace);
        // Its owner showed up for one pass (a cache catching up): forgotten.
        t.observe([], 50, grace);
        assert!(t.observe([bundle("ns.a")], 120, grace).is_empty());
        assert_eq!(
            t.observe([bundle("ns.a")], 220, grace),
            vec![bundle("ns.a")]
        );
        t.forget(&bundle("ns.a"));
        assert!(t.is_empty());
    }

    proptest! {
        /// Whatever the sequence of passes, nothing is due before it has been a candidate in
        /// every pass of the last `grace` milliseconds.
        #[test]
        fn nothing_is_due_before_a_continuous_grace_period(
            passes in proptest::collection::vec(proptest::collection::btree_set(0u8..4, 0..4), 1..30),
            step in 1i64..50,
            grace in 0i64..500,
        ) {
            let mut t = OrphanTracker::default();
            let mut continuous_since: BTreeMap<u8, i64> = BTreeMap::new();
            for (i, pass) in passes.iter().enumerate() {
                let now = i as i64 * step;
                continuous_since.retain(|k, _| pass.contains(k));
                for k in pass {
                    continuous_since.entry(*k).or_insert(now);
                }
                let due = t.observe(pass.iter().map(|k| Orphan::Node(format!("n{k}"))), now, grace);
                for k in pass {
                    let expected = now - continuous_since[k] >= grace;
                    prop_assert_eq!(due.contains(&Orphan::Node(format!("n{k}"))), expected);
                }
                prop_assert_eq!(due.len(), pass.iter().filter(|k| now - continuous_since[*k] >= grace).count());
            }
        }
    }
}
