//! The rules of a Bundle pass's bookkeeping at the state's surface: a change of a bundle's jobs
//! that comes during its pass is held for the pass's end and wakes it again only when Manager
//! moved past what the pass recorded; while bundles that lost jobs queue for a pass, a pass
//! neither waits for its starts nor writes its status ([`automanager_policy::recovery_first`]),
//! each decided and recorded under one hold of the lock.

use std::time::{Duration, Instant};

use automanager_api::Bundle;
use automanager_policy::recovery_first::{self, Slots};
use kube::runtime::reflector::ObjectRef;

use super::{Held, State};

impl State {
    /// A pass of `bundle` begins: changes of its jobs are held for its end, and it no longer
    /// waits in the recovery backlog.
    pub fn begin_bundle_pass(&self, bundle: &ObjectRef<Bundle>) {
        self.lock().wake_mut().begin_pass(bundle);
    }

    /// The pass of `bundle` ends: the change held during it when one was and `moved_past`
    /// (asked under the lock, so it must not block) says Manager moved past what the pass
    /// recorded; `None` when nothing calls for another pass.
    pub fn end_bundle_pass(
        &self,
        bundle: &ObjectRef<Bundle>,
        moved_past: impl FnOnce() -> bool,
    ) -> Option<Held> {
        let held = self.lock().wake_mut().end_pass(bundle);
        (held != Held::Nothing && moved_past()).then_some(held)
    }

    /// The recovery backlog, the passes running now and the controller's `slots` at `now`.
    pub fn bundle_pass_slots(&self, now: Instant, slots: usize) -> Slots {
        self.lock().wake_mut().slots(now, slots)
    }

    /// Whether `bundle`'s status write, `changed` from what it holds, waits at `now` for the
    /// bundles queued to recover: `Some(after)` to look again then. A write put off is
    /// remembered from its first put-off (so it waits no longer than
    /// [`recovery_first::MAX_DEFER`]); one that goes ahead, or is not needed, is forgotten.
    pub fn defer_bundle_status(
        &self,
        bundle: &(String, String),
        changed: bool,
        now: Instant,
        slots: usize,
    ) -> Option<Duration> {
        let mut s = self.lock();
        let after = if changed {
            let queue = s.wake_mut().slots(now, slots);
            recovery_first::defer_status(queue, s.bundles().status_deferred_since(bundle), now)
        } else {
            None
        };
        match after {
            Some(_) => s.bundles_mut().defer_status(bundle, now),
            None => s.bundles_mut().status_recorded(bundle),
        }
        after
    }

    /// How long a pass that started jobs waits at `now` for them to run: `None` while bundles
    /// that lost jobs queue for a pass (this one's slot is theirs sooner), or when recent
    /// passes show waiting does not pay.
    pub fn start_settle_bound(&self, now: Instant, slots: usize) -> Option<Duration> {
        let mut s = self.lock();
        if !recovery_first::settle_starts(s.wake_mut().slots(now, slots)) {
            return None;
        }
        s.bundles_mut().settle_bound()
    }

    /// How long a pass's starts took to run (`None`: not within the bound).
    pub fn record_start_settle(&self, took: Option<Duration>) {
        self.lock().bundles_mut().record_settle(took);
    }

    /// The pools whose capacity wakes `bundle` (none: it waits on nothing).
    pub fn set_bundle_waiting(&self, bundle: &ObjectRef<Bundle>, pools: Vec<String>) {
        self.lock().wake_mut().set_waiting(bundle, pools);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::settings::Settings;

    const BUNDLES: [&str; 2] = ["a", "b"];

    fn bundle(i: usize) -> ObjectRef<Bundle> {
        ObjectRef::new(BUNDLES[i]).within("ns")
    }

    /// One thing that happens to the bundles' passes: one begins or ends (Manager moved past
    /// what it recorded, or not), or a job of one changes (lost, or not).
    #[derive(Debug, Clone)]
    enum Step {
        Begin(usize),
        End(usize, bool),
        Change(usize, bool),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0..BUNDLES.len()).prop_map(Step::Begin),
            (0..BUNDLES.len(), any::<bool>()).prop_map(|(b, m)| Step::End(b, m)),
            (0..BUNDLES.len(), any::<bool>()).prop_map(|(b, l)| Step::Change(b, l)),
        ]
    }

    proptest! {
        /// A pass's end asks for another pass exactly when a change came during it and Manager
        /// moved past what it recorded, with the weightiest change held (a loss over a
        /// change); a change outside a pass is never held, and nothing carries over to the
        /// next pass.
        #[test]
        fn a_pass_ends_with_the_weightiest_change_held_during_it(
            steps in proptest::collection::vec(step(), 1..60)
        ) {
            let state = State::new(&Settings::default());
            let mut in_pass: [Option<Held>; 2] = [None; 2];
            for s in steps {
                match s {
                    Step::Begin(b) => {
                        state.begin_bundle_pass(&bundle(b));
                        in_pass[b] = Some(Held::Nothing);
                    }
                    Step::End(b, moved) => {
                        let mut asked = false;
                        let again = state.end_bundle_pass(&bundle(b), || {
                            asked = true;
                            moved
                        });
                        let held = in_pass[b].take().unwrap_or_default();
                        let expected = (held != Held::Nothing && moved).then_some(held);
                        prop_assert_eq!(again, expected);
                        prop_assert_eq!(asked, held != Held::Nothing, "the mirror is asked only when a change was held");
                    }
                    Step::Change(b, loss) => {
                        let held = state.lock().wake_mut().hold_for_pass(&bundle(b), loss);
                        prop_assert_eq!(held, in_pass[b].is_some());
                        if let Some(h) = in_pass[b].as_mut() {
                            *h = (*h).max(if loss { Held::Loss } else { Held::Change });
                        }
                    }
                }
            }
        }
    }

    /// One slot, and bundle `b` woken at `now` to recover with `a`'s pass running: `b` queues.
    fn queued(now: Instant) -> State {
        let state = State::new(&Settings::default());
        state.begin_bundle_pass(&bundle(0));
        state.lock().wake_mut().lost_jobs(&bundle(1), now);
        state
    }

    #[test]
    fn a_changed_status_waits_for_a_queue_of_recoveries_no_longer_than_the_bound() {
        let t0 = Instant::now();
        let state = queued(t0);
        let name = ("ns".to_owned(), "a".to_owned());
        assert_eq!(
            state.defer_bundle_status(&name, false, t0, 1),
            None,
            "an unchanged status has nothing to write and never waits"
        );
        assert_eq!(
            state.defer_bundle_status(&name, true, t0, 1),
            Some(recovery_first::RECHECK)
        );
        let later = t0 + recovery_first::MAX_DEFER / 2;
        assert_eq!(
            state.defer_bundle_status(&name, true, later, 1),
            Some(recovery_first::RECHECK),
            "still within the bound from the first put-off"
        );
        assert_eq!(
            state.defer_bundle_status(&name, true, t0 + recovery_first::MAX_DEFER, 1),
            None,
            "put off since the first time for the whole bound: written"
        );
        assert_eq!(
            state.defer_bundle_status(&name, true, t0 + recovery_first::MAX_DEFER, 1),
            Some(recovery_first::RECHECK),
            "the write that went ahead was forgotten: a new put-off counts afresh"
        );
        assert_eq!(
            state.defer_bundle_status(&name, true, t0, 2),
            None,
            "with a free slot the waiting bundle is no queue"
        );
    }

    #[test]
    fn a_pass_waits_for_its_starts_only_while_no_recovery_queues() {
        let t0 = Instant::now();
        let state = queued(t0);
        assert_eq!(state.start_settle_bound(t0, 1), None);
        state.begin_bundle_pass(&bundle(1));
        assert_eq!(
            state.start_settle_bound(t0, 2),
            Some(crate::state::START_SETTLE),
            "the backlog's pass began: nothing queues"
        );
    }
}
