//! Who to wake for what: the index that lets one Manager event cost only the reconciles it
//! concerns.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use automanager_api::{Bundle, HotSpareTarget, Migration};
use automanager_policy::recovery_first::{Backlog, Slots};
use kube::runtime::reflector::ObjectRef;

/// What a pass of a bundle holds for its end: the weightiest change of its jobs that came
/// during it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Held {
    #[default]
    Nothing,
    /// A job changed: its next pass may wait for the burst to settle.
    Change,
    /// A job failed or was lost: its next pass is a recovery and goes at once.
    Loss,
}

/// Who to wake when something changes in Manager, so that one node event costs only the
/// reconciles it concerns (not every object of every kind).
#[derive(Debug, Default)]
pub struct WakeIndex {
    /// Bundles with a replica waiting for capacity (unplaceable or provisioning), by the pools
    /// they would take: a node or capacity change in the pool wakes them.
    waiting_on_pool: HashMap<String, HashSet<ObjectRef<Bundle>>>,
    /// The pools each waiting bundle is registered under (to unregister).
    pools_of_waiting: HashMap<ObjectRef<Bundle>, Vec<String>>,
    /// Migrations by Manager's migration id.
    migrations_by_manager_id: HashMap<String, ObjectRef<Migration>>,
    /// Migrations in progress by the job they move.
    migrations_by_job: HashMap<String, ObjectRef<Migration>>,
    /// HotSpareTargets by pool.
    spare_targets_by_pool: HashMap<String, HashSet<ObjectRef<HotSpareTarget>>>,
    /// Bundles in a pass now, and what change of their jobs came during it. Such a change is
    /// held back: it may be the pass's own starts coming up, which its status already shows;
    /// the pass's end wakes the bundle again if anything else changed.
    in_pass: HashMap<ObjectRef<Bundle>, Held>,
    /// Bundles woken to recover lost jobs whose pass has not begun
    /// ([`automanager_policy::recovery_first`]).
    backlog: Backlog<ObjectRef<Bundle>>,
}

impl WakeIndex {
    /// Records the pools `bundle` waits on (none: it waits on nothing).
    pub fn set_waiting(&mut self, bundle: &ObjectRef<Bundle>, pools: Vec<String>) {
        if let Some(old) = self.pools_of_waiting.remove(bundle) {
            for p in old {
                if let Some(set) = self.waiting_on_pool.get_mut(&p) {
                    set.remove(bundle);
                    if set.is_empty() {
                        self.waiting_on_pool.remove(&p);
                    }
                }
            }
        }
        if pools.is_empty() {
            return;
        }
        for p in &pools {
            self.waiting_on_pool
                .entry(p.clone())
                .or_default()
                .insert(bundle.clone());
        }
        self.pools_of_waiting.insert(bundle.clone(), pools);
    }

    /// Bundles waiting on capacity in `pool`.
    pub fn waiting_on(&self, pool: &str) -> impl Iterator<Item = &ObjectRef<Bundle>> {
        self.waiting_on_pool.get(pool).into_iter().flatten()
    }

    /// Records a Migration's Manager id and job while it is in progress; `None` forgets it.
    pub fn set_migration(
        &mut self,
        migration: &ObjectRef<Migration>,
        ids: Option<(String, String)>,
    ) {
        self.migrations_by_manager_id.retain(|_, m| m != migration);
        self.migrations_by_job.retain(|_, m| m != migration);
        if let Some((manager_id, job_id)) = ids {
            self.migrations_by_manager_id
                .insert(manager_id, migration.clone());
            self.migrations_by_job.insert(job_id, migration.clone());
        }
    }

    /// The Migration driving Manager's migration `manager_id`.
    pub fn migration_by_manager_id(&self, manager_id: &str) -> Option<&ObjectRef<Migration>> {
        self.migrations_by_manager_id.get(manager_id)
    }

    /// The Migration in progress for `job_id`.
    pub fn migration_of_job(&self, job_id: &str) -> Option<&ObjectRef<Migration>> {
        self.migrations_by_job.get(job_id)
    }

    /// Records the pool of a HotSpareTarget (`None`: it is gone).
    pub fn set_spare_target(&mut self, target: &ObjectRef<HotSpareTarget>, pool: Option<&str>) {
        for set in self.spare_targets_by_pool.values_mut() {
            set.remove(target);
        }
        self.spare_targets_by_pool.retain(|_, s| !s.is_empty());
        if let Some(pool) = pool {
            self.spare_targets_by_pool
                .entry(pool.to_owned())
                .or_default()
                .insert(target.clone());
        }
    }

    /// HotSpareTargets of `pool`.
    pub fn spare_targets_of(&self, pool: &str) -> impl Iterator<Item = &ObjectRef<HotSpareTarget>> {
        self.spare_targets_by_pool.get(pool).into_iter().flatten()
    }

    /// A pass of `bundle` begins.
    pub fn begin_pass(&mut self, bundle: &ObjectRef<Bundle>) {
        self.in_pass.insert(bundle.clone(), Held::Nothing);
        self.backlog.pass_began(bundle);
    }

    /// `bundle` was woken at `now` because a job of it failed or was lost.
    pub fn lost_jobs(&mut self, bundle: &ObjectRef<Bundle>, now: Instant) {
        self.backlog.lost_jobs(bundle, now);
    }

    /// The backlog, the Bundle passes running now and the controller's `slots`, for
    /// [`automanager_policy::recovery_first`].
    pub fn slots(&mut self, now: Instant, slots: usize) -> Slots {
        Slots {
            backlog: self.backlog.waiting(now),
            running: self.in_pass.len(),
            slots,
        }
    }

    /// A change of `bundle`'s jobs (`loss`: one failed or was lost): true when a pass of it
    /// runs now (the change is held for [`Self::end_pass`]), false when the caller should wake
    /// it.
    pub fn hold_for_pass(&mut self, bundle: &ObjectRef<Bundle>, loss: bool) -> bool {
        match self.in_pass.get_mut(bundle) {
            Some(held) => {
                *held = (*held).max(if loss { Held::Loss } else { Held::Change });
                true
            }
            None => false,
        }
    }

    /// The pass of `bundle` ends: what change of its jobs was held during it.
    pub fn end_pass(&mut self, bundle: &ObjectRef<Bundle>) -> Held {
        self.in_pass.remove(bundle).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_waits_on_the_pools_it_was_last_registered_under_only() {
        let mut w = WakeIndex::default();
        let b = ObjectRef::<Bundle>::new("b").within("ns");
        w.set_waiting(&b, vec!["p".into(), "q".into()]);
        assert_eq!(w.waiting_on("p").count(), 1);
        w.set_waiting(&b, vec!["q".into()]);
        assert_eq!(w.waiting_on("p").count(), 0);
        assert_eq!(w.waiting_on("q").count(), 1);
        w.set_waiting(&b, Vec::new());
        assert_eq!(w.waiting_on("q").count(), 0);
    }

    #[test]
    fn a_job_change_during_a_pass_is_held_for_its_end_and_only_then() {
        let mut w = WakeIndex::default();
        let b = ObjectRef::<Bundle>::new("b").within("ns");
        let other = ObjectRef::<Bundle>::new("c").within("ns");
        assert!(!w.hold_for_pass(&b, false), "no pass: wake it now");
        w.begin_pass(&b);
        assert_eq!(
            w.end_pass(&b),
            Held::Nothing,
            "nothing came during the pass"
        );
        w.begin_pass(&b);
        assert!(w.hold_for_pass(&b, false));
        assert!(
            !w.hold_for_pass(&other, false),
            "another bundle is woken as usual"
        );
        assert_eq!(
            w.end_pass(&b),
            Held::Change,
            "the held change is handed to the pass's end"
        );
        assert!(
            !w.hold_for_pass(&b, false),
            "after the pass, changes wake it again"
        );
    }

    #[test]
    fn a_loss_during_a_pass_outweighs_the_changes_around_it() {
        let mut w = WakeIndex::default();
        let b = ObjectRef::<Bundle>::new("b").within("ns");
        w.begin_pass(&b);
        assert!(w.hold_for_pass(&b, false));
        assert!(w.hold_for_pass(&b, true));
        assert!(w.hold_for_pass(&b, false));
        assert_eq!(
            w.end_pass(&b),
            Held::Loss,
            "a recovery is owed: its wake goes at once"
        );
    }

    #[test]
    fn migrations_are_found_by_manager_id_and_job_until_forgotten() {
        let mut w = WakeIndex::default();
        let m = ObjectRef::<Migration>::new("m").within("ns");
        w.set_migration(&m, Some(("automanager-1".into(), "ns.b/0/j".into())));
        assert_eq!(w.migration_by_manager_id("automanager-1"), Some(&m));
        assert_eq!(w.migration_of_job("ns.b/0/j"), Some(&m));
        w.set_migration(&m, None);
        assert_eq!(w.migration_by_manager_id("automanager-1"), None);
    }

    #[test]
    fn spare_targets_move_with_their_pool() {
        let mut w = WakeIndex::default();
        let t = ObjectRef::<HotSpareTarget>::new("t");
        w.set_spare_target(&t, Some("p"));
        assert_eq!(w.spare_targets_of("p").count(), 1);
        w.set_spare_target(&t, None);
        assert_eq!(w.spare_targets_of("p").count(), 0);
    }
}
