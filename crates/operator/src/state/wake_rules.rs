//! Who Manager's changes wake, at the state's surface: a bundle whose jobs changed is held for
//! the end of a pass of it running now, or else woken (at once when it lost a job, and then
//! queued in the recovery backlog, so its pass goes before other passes' paperwork); a Migration
//! of ours is found by Manager's migration id or by the job it moves; HotSpareTargets by their
//! pool. Each answer is read, and what it records written, under one hold.

use std::collections::HashSet;
use std::time::Instant;

use automanager_api::{Bundle, HotSpareTarget, Migration};
use kube::runtime::reflector::ObjectRef;

use super::State;

impl State {
    /// The jobs of `changed` bundles changed at `now` (with each, whether one of its jobs failed
    /// or was lost). Answers the bundles to wake, each with whether at once; a bundle a pass
    /// runs for now is left out, its change held for that pass's end.
    pub fn bundle_jobs_changed(
        &self,
        changed: impl IntoIterator<Item = (ObjectRef<Bundle>, bool)>,
        now: Instant,
    ) -> Vec<(ObjectRef<Bundle>, bool)> {
        let mut s = self.lock();
        let wake = s.wake_mut();
        let mut woken = Vec::new();
        for (bundle, loss) in changed {
            if wake.hold_for_pass(&bundle, loss) {
                continue;
            }
            if loss {
                wake.lost_jobs(&bundle, now);
            }
            woken.push((bundle, loss));
        }
        woken
    }

    /// The Migrations of ours that Manager's changes of `manager_ids` (Manager's migration
    /// ids) and of `jobs` concern, each once.
    pub fn migrations_concerned<'a>(
        &self,
        manager_ids: impl IntoIterator<Item = &'a str>,
        jobs: impl IntoIterator<Item = &'a str>,
    ) -> Vec<ObjectRef<Migration>> {
        let s = self.lock();
        let wake = s.wake();
        let by_id = (manager_ids.into_iter()).filter_map(|id| wake.migration_by_manager_id(id));
        let by_job = jobs
            .into_iter()
            .filter_map(|job| wake.migration_of_job(job));
        let mut seen = HashSet::new();
        (by_id.chain(by_job))
            .filter(|m| seen.insert(*m))
            .cloned()
            .collect()
    }

    /// The HotSpareTargets of `pool`.
    pub fn spare_targets_of(&self, pool: &str) -> Vec<ObjectRef<HotSpareTarget>> {
        self.lock().wake().spare_targets_of(pool).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::Held;
    use super::*;
    use crate::settings::Settings;

    fn bundle(name: &str) -> ObjectRef<Bundle> {
        ObjectRef::new(name).within("ns")
    }

    #[test]
    fn a_changed_bundle_in_a_pass_is_held_for_its_end_and_one_not_in_a_pass_is_woken() {
        let state = State::new(&Settings::default());
        let now = Instant::now();
        state.begin_bundle_pass(&bundle("busy"));

        let woken = state.bundle_jobs_changed(
            [
                (bundle("busy"), true),
                (bundle("lost"), true),
                (bundle("echo"), false),
            ],
            now,
        );

        assert_eq!(woken, [(bundle("lost"), true), (bundle("echo"), false)]);
        assert_eq!(
            state.end_bundle_pass(&bundle("busy"), || true),
            Some(Held::Loss),
            "the loss held during the pass calls for another"
        );
    }

    #[test]
    fn only_a_bundle_woken_for_a_loss_queues_for_recovery() {
        let state = State::new(&Settings::default());
        let now = Instant::now();
        state.begin_bundle_pass(&bundle("busy"));

        let _ = state.bundle_jobs_changed([(bundle("echo"), false), (bundle("busy"), true)], now);
        assert_eq!(state.bundle_pass_slots(now, 1).backlog, 0);

        let _ = state.bundle_jobs_changed([(bundle("lost"), true)], now);
        assert_eq!(state.bundle_pass_slots(now, 1).backlog, 1);
        state.begin_bundle_pass(&bundle("lost"));
        assert_eq!(
            state
                .bundle_pass_slots(now + Duration::from_millis(1), 1)
                .backlog,
            0,
            "its pass began: it no longer waits"
        );
    }

    #[test]
    fn a_migration_is_found_by_managers_id_or_by_the_job_it_moves_once() {
        let state = State::new(&Settings::default());
        let m = ObjectRef::<Migration>::new("move-enc").within("ns");
        state.track_migration(&m, Some(("mig-1".into(), "job-1".into())));

        let once = std::slice::from_ref(&m);
        assert_eq!(state.migrations_concerned(["mig-1"], ["job-1"]), once);
        assert_eq!(state.migrations_concerned(["mig-1"], []), once);
        assert_eq!(state.migrations_concerned([], ["job-1"]), once);
        assert!(state.migrations_concerned(["mig-2"], ["job-2"]).is_empty());

        state.track_migration(&m, None);
        assert!(state.migrations_concerned(["mig-1"], ["job-1"]).is_empty());
    }
}
