//! The operator's one source of time. Every decision that depends on time (a restart window, a
//! back-off, a spare's age, a migration's deadline, a disruption window) reads it from the
//! [`Clock`] in the controllers' context, so a test holds a [`FakeClock`] and moves time instead
//! of waiting. The policy crate takes time as an argument and never reads it.
//!
//! Two readings, because they answer different questions: [`Clock::now`] is wall-clock time,
//! what status fields, Events and the Lease record and what timestamps in objects are compared
//! with; [`Clock::instant`] is monotonic, what windows held only in memory are measured with
//! (a wall clock that steps must not shorten them). Timers (`tokio::time::sleep`, intervals)
//! stay on tokio's clock, which a test pauses and advances with `tokio::time::pause`.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

/// Where the operator reads the time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Wall-clock time.
    fn now(&self) -> DateTime<Utc>;
    /// Monotonic time.
    fn instant(&self) -> Instant;
    /// Milliseconds since the Unix epoch of [`Clock::now`], as the placement engine counts.
    fn now_ms(&self) -> u64 {
        u64::try_from(self.now().timestamp_millis()).unwrap_or(0)
    }
}

/// The clock the controllers share.
pub type SharedClock = Arc<dyn Clock>;

/// The system's clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl SystemClock {
    /// The system clock, shared.
    pub fn shared() -> SharedClock {
        Arc::new(SystemClock)
    }
}

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn instant(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that stands still until told to move; both readings move together. Clones share
/// the time.
#[derive(Debug, Clone)]
pub struct FakeClock(Arc<Mutex<(DateTime<Utc>, Instant)>>);

impl FakeClock {
    /// A clock reading `start`; its monotonic reading starts at the real one.
    pub fn at(start: DateTime<Utc>) -> FakeClock {
        FakeClock(Arc::new(Mutex::new((start, Instant::now()))))
    }

    /// Moves both readings `by` forward.
    pub fn advance(&self, by: Duration) {
        let mut t = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        t.0 += chrono::Duration::from_std(by).unwrap_or(chrono::Duration::MAX);
        t.1 += by;
    }

    /// The same clock, shared as the controllers hold it.
    pub fn shared(&self) -> SharedClock {
        Arc::new(self.clone())
    }
}

impl Clock for FakeClock {
    fn now(&self) -> DateTime<Utc> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    fn instant(&self) -> Instant {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fake_clock_moves_only_when_told_and_both_readings_together() {
        let start = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or_default();
        let clock = FakeClock::at(start);
        let shared = clock.shared();
        let i0 = shared.instant();
        assert_eq!(shared.now(), start);
        clock.advance(Duration::from_secs(90));
        assert_eq!(shared.now(), start + chrono::Duration::seconds(90));
        assert_eq!(shared.instant() - i0, Duration::from_secs(90));
        assert_eq!(shared.now_ms(), 1_767_225_690_000);
    }

    #[test]
    fn the_system_clock_moves_forward() {
        let clock = SystemClock::shared();
        let (a, b) = (clock.instant(), clock.instant());
        assert!(b >= a);
        assert!(clock.now_ms() > 1_700_000_000_000);
    }
}
