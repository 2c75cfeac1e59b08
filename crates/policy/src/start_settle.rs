//! Whether a pass that started jobs waits a moment for them to run before it records.
//!
//! A bundle's pass places and starts its jobs; Manager reports them `Running` a moment later.
//! If the pass records at once, its status says `Placing` (or skips the write) and the
//! `Running` change wakes a second pass only to write `Ready`: two reconciles per placement, the
//! second one a status echo. Waiting briefly for the starts lets one pass write the settled
//! status, and the runtime then drops the wake-up that its own starts coming up would cause.
//!
//! The wait holds one of the controller's reconcile slots, so it only pays while Manager starts
//! jobs quickly. [`StartSettle`] keeps a moving average of how long recent waits took (a wait
//! that timed out counts as twice the bound) and waits only while that average is within the
//! bound; every [`PROBE_EVERY`]th pass waits anyway, so a Manager that became fast again is
//! noticed. Against a slow Manager the cost is one bounded wait in [`PROBE_EVERY`] passes.
//!
//! Pure: the caller measures the wait and reports it.

use std::time::Duration;

/// One pass in this many waits even while recent waits were slow.
pub const PROBE_EVERY: u32 = 16;

/// Weight of the newest wait in the moving average.
const NEWEST: f64 = 0.2;

/// The moving average of recent start waits, and the passes since the last wait.
#[derive(Debug, Clone)]
pub struct StartSettle {
    bound: Duration,
    average_ms: f64,
    skipped: u32,
}

impl StartSettle {
    /// Waits of at most `bound`; the average starts at zero (the first passes wait).
    pub fn new(bound: Duration) -> Self {
        StartSettle {
            bound,
            average_ms: 0.0,
            skipped: 0,
        }
    }

    /// The longest a pass waits.
    pub fn bound(&self) -> Duration {
        self.bound
    }

    /// Whether this pass should wait for its starts. Counts the passes that do not.
    pub fn should_wait(&mut self) -> bool {
        if self.average_ms <= self.bound.as_secs_f64() * 1000.0 || self.skipped + 1 >= PROBE_EVERY {
            self.skipped = 0;
            true
        } else {
            self.skipped += 1;
            false
        }
    }

    /// Records how a wait went: `Some(took)` when every start ran within the bound, `None` when
    /// it timed out.
    pub fn record(&mut self, took: Option<Duration>) {
        let sample = took.map_or(self.bound.as_secs_f64() * 2000.0, |d| {
            d.as_secs_f64() * 1000.0
        });
        self.average_ms = self.average_ms * (1.0 - NEWEST) + sample * NEWEST;
    }

    /// The moving average, in milliseconds.
    pub fn average_ms(&self) -> f64 {
        self.average_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const BOUND: Duration = Duration::from_millis(300);

    #[test]
    fn quick_starts_keep_every_pass_waiting() {
        let mut s = StartSettle::new(BOUND);
        for _ in 0..100 {
            assert!(s.should_wait());
            s.record(Some(Duration::from_millis(25)));
        }
        assert!(s.average_ms() < 30.0);
    }

    #[test]
    fn timeouts_stop_the_waits_but_a_probe_still_runs() {
        let mut s = StartSettle::new(BOUND);
        for _ in 0..10 {
            if s.should_wait() {
                s.record(None);
            }
        }
        assert!(s.average_ms() > 300.0, "{}", s.average_ms());
        let waits = (0..PROBE_EVERY * 4).filter(|_| s.should_wait()).count();
        assert_eq!(waits, 4, "one probe in {PROBE_EVERY} passes");
    }

    #[test]
    fn a_manager_that_became_fast_again_is_waited_for_after_a_few_probes() {
        let mut s = StartSettle::new(BOUND);
        for _ in 0..20 {
            s.record(None);
        }
        let mut passes = 0;
        while !(s.should_wait() && s.average_ms() <= 300.0) {
            passes += 1;
            assert!(passes < 200, "never waited again");
            // Only the passes that wait measure anything.
            if s.skipped == 0 {
                s.record(Some(Duration::from_millis(20)));
            }
        }
    }

    proptest! {
        /// Whatever the waits took, a pass waits at least once in every PROBE_EVERY passes,
        /// and the average stays within what a wait can report.
        #[test]
        fn waits_are_never_starved(samples in proptest::collection::vec(proptest::option::of(0u64..1000), 1..200)) {
            let mut s = StartSettle::new(BOUND);
            let mut since_wait = 0;
            for took in samples {
                if s.should_wait() {
                    since_wait = 0;
                    s.record(took.map(Duration::from_millis));
                } else {
                    since_wait += 1;
                }
                prop_assert!(since_wait < PROBE_EVERY);
                prop_assert!(s.average_ms() >= 0.0 && s.average_ms() <= 1000.0_f64.max(600.0));
            }
        }
    }
}
