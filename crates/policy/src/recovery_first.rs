//! Recoveries before paperwork: while bundles that lost jobs wait for a reconcile pass, the
//! passes that run do only what cannot wait.
//!
//! A mass failure (a zone lost) wakes hundreds of bundles at once, each needing one StartJob to
//! run again, and the Bundle controller runs a bounded number of passes at a time. The slowest
//! thing a pass does then is its status write, to an apiserver busiest at that very moment: in
//! a zone outage of 334 gold jobs on a loaded machine the writes took 150 to 650 ms each, both
//! in the recovering passes and in the passes that came back only to write `Ready`, and the wave
//! lasted as long as all those writes divided by the slots (2.9 s), while the StartJobs
//! themselves took a few milliseconds.
//!
//! So while bundles that lost a job queue for a pass (the **backlog**: they wait, and with the
//! passes running they are more than the controller's slots), a pass does not wait for the jobs
//! it started to run, and does not write its status: it starts what it must and is looked at
//! again shortly, to write once the queue is gone. A status is put off for at most
//! [`MAX_DEFER`], so failures that never stop cannot keep status from being written. A backlog
//! that finds free slots is no queue: those passes begin as soon as they are woken, and a single
//! node's loss (a few bundles) keeps one pass per recovery, which waits for its starts and
//! writes once.
//!
//! Pure: the caller passes the clock.

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A bundle counted in the backlog whose pass has not begun this long after is no longer
/// counted (it was deleted, or its wake-up was merged into a pass that had already begun).
pub const FORGET_AFTER: Duration = Duration::from_secs(10);

/// The longest a status write is put off.
pub const MAX_DEFER: Duration = Duration::from_secs(5);

/// How soon a pass that put its status off is looked at again.
pub const RECHECK: Duration = Duration::from_millis(250);

/// Bundles woken because a job of theirs failed or was lost, whose pass has not begun.
#[derive(Debug, Clone)]
pub struct Backlog<K> {
    waiting: HashMap<K, Instant>,
}

impl<K> Default for Backlog<K> {
    fn default() -> Self {
        Backlog {
            waiting: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> Backlog<K> {
    /// `bundle` was woken at `now` to recover lost jobs.
    pub fn lost_jobs(&mut self, bundle: &K, now: Instant) {
        self.waiting.entry(bundle.clone()).or_insert(now);
    }

    /// A pass of `bundle` began: it is no longer waiting.
    pub fn pass_began(&mut self, bundle: &K) {
        self.waiting.remove(bundle);
    }

    /// How many bundles wait now.
    pub fn waiting(&mut self, now: Instant) -> usize {
        self.waiting
            .retain(|_, since| now.saturating_duration_since(*since) < FORGET_AFTER);
        self.waiting.len()
    }
}

/// How many bundles that lost jobs wait for a pass, how many passes run now (this one among
/// them), and how many the controller runs at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slots {
    pub backlog: usize,
    pub running: usize,
    pub slots: usize,
}

impl Slots {
    /// Whether bundles that lost jobs queue for a pass: some wait, and with the passes running
    /// they are more than the slots.
    pub fn queued(self) -> bool {
        self.backlog > 0 && self.backlog.saturating_add(self.running) > self.slots.max(1)
    }
}

/// Whether a pass that started jobs waits for them to run before it records: not while others
/// queue for a pass.
pub fn settle_starts(slots: Slots) -> bool {
    !slots.queued()
}

/// When a pass writes the status it decided: `None` now, `Some(after)` to be looked at again
/// after that instead, while bundles queue for a pass and the write was first put off less than
/// [`MAX_DEFER`] ago (`deferred_since`).
pub fn defer_status(
    slots: Slots,
    deferred_since: Option<Instant>,
    now: Instant,
) -> Option<Duration> {
    let put_off = deferred_since.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
    (slots.queued() && put_off < MAX_DEFER).then_some(RECHECK)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_bundle_waits_from_its_wake_up_until_its_pass_begins() {
        let mut b = Backlog::default();
        let t = Instant::now();
        b.lost_jobs(&"a", t);
        b.lost_jobs(&"b", t);
        b.lost_jobs(&"a", t + Duration::from_secs(1));
        assert_eq!(b.waiting(t), 2);
        b.pass_began(&"a");
        assert_eq!(b.waiting(t), 1);
        assert_eq!(b.waiting(t + FORGET_AFTER), 0, "a pass that never came");
    }

    fn q(backlog: usize, running: usize, slots: usize) -> Slots {
        Slots {
            backlog,
            running,
            slots,
        }
    }

    #[test]
    fn the_status_waits_for_the_backlog_but_not_forever() {
        let t = Instant::now();
        assert_eq!(defer_status(q(0, 2, 2), None, t), None);
        assert_eq!(defer_status(q(3, 2, 2), None, t), Some(RECHECK));
        assert_eq!(
            defer_status(
                q(3, 2, 2),
                Some(t),
                t + MAX_DEFER - Duration::from_millis(1)
            ),
            Some(RECHECK)
        );
        assert_eq!(defer_status(q(3, 2, 2), Some(t), t + MAX_DEFER), None);
        assert!(settle_starts(q(0, 2, 2)));
        assert!(!settle_starts(q(3, 2, 2)));
    }

    #[test]
    fn a_backlog_that_finds_free_slots_is_no_queue() {
        let t = Instant::now();
        assert_eq!(
            defer_status(q(9, 9, 32), None, t),
            None,
            "a node's few bundles"
        );
        assert!(settle_starts(q(9, 9, 32)));
        assert_eq!(
            defer_status(q(334, 32, 32), None, t),
            Some(RECHECK),
            "a zone's"
        );
        assert!(
            !settle_starts(q(5, 32, 32)),
            "the tail of a zone's, every slot busy"
        );
        assert!(settle_starts(q(5, 27, 32)), "the last ones, a slot each");
        assert!(q(1, 1, 0).queued(), "no slots reads as one");
    }

    proptest! {
        /// Whatever the backlog does, a status is written no later than MAX_DEFER after it was
        /// first put off.
        #[test]
        fn a_status_is_never_put_off_past_the_bound(
            backlogs in proptest::collection::vec(0usize..5, 1..100),
        ) {
            let t0 = Instant::now();
            let mut now = t0;
            let mut since: Option<Instant> = None;
            for backlog in backlogs {
                match defer_status(q(backlog, 2, 2), since, now) {
                    Some(after) => {
                        since.get_or_insert(now);
                        now += after;
                    }
                    None => {
                        prop_assert!(since.is_none_or(|s| now.saturating_duration_since(s) <= MAX_DEFER + RECHECK));
                        since = None;
                    }
                }
                if let Some(s) = since {
                    prop_assert!(now.saturating_duration_since(s) <= MAX_DEFER + RECHECK);
                }
            }
        }
    }
}
