//! The PlacementHistory writer: the bundles' decisions written to their histories off the
//! Bundle's path, at a lower priority than the Bundles' own writes.
//!
//! A Bundle's pass records its decisions in memory ([`crate::state`]'s bundle book), writes its
//! status and queues the bundle here ([`HistoryWriter::queue`]), then returns: it never waits
//! for the history. This writer's own task writes each queued bundle's history
//! ([`super::history::write`]) with:
//!
//! - **coalescing**: a bundle is queued once however often it is queued before its write, and
//!   that one write adds every replica's newest decision not yet written; a bundle queued again
//!   while its write is in flight is written again after it;
//! - **priority**: while the Bundle controller is busy (at least a quarter of its passes'
//!   slots taken, [`busy`]) nothing is written unless a bundle has waited [`MAX_HOLD`], and then
//!   one write at a time; otherwise at most [`IN_FLIGHT`] at a time. A wave of new Bundles
//!   becomes Ready first, and its histories are written when the wave has passed;
//! - **bounded memory**: one entry per bundle (its name, its owner reference, its replica
//!   count), so at most one per Bundle the operator knows; the decisions themselves are the
//!   bundle book's (the newest per replica, which `/debug/trace` serves anyway);
//! - **retries**: a failed write is tried again after a back-off doubling from
//!   [`RETRY_FIRST`], [`ATTEMPTS`] times in all; then it is dropped, and the decisions wait in
//!   the bundle book for the bundle's next status write to queue it again. A write the fence
//!   refused (this replica no longer surely holds the lease) is dropped at once.
//!
//! Leadership: the writer runs only in a leader's process, and its writes go through the
//! fenced client. When the controllers stop for a shutdown, [`HistoryWriter::flush`] writes
//! what is queued (within a bound) before the lease is given up; when the lease is lost the
//! fence refuses those writes, and the queue is dropped with the process. What is lost then is
//! bounded: the decisions whose status was written less than one write's time before (the
//! Bundles quiet), or less than [`MAX_HOLD`] before (a wave under way); the Bundle's status
//! (`lastPlacement`) still shows the newest of them.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use automanager_api::Bundle;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Resource;
use tokio::sync::{Notify, watch};

use crate::controllers::{Context, Error, ns_name};

/// History writes in flight at once while the Bundles are quiet.
pub const IN_FLIGHT: usize = 4;
/// How long a bundle's history may wait while the Bundle controller is busy; past it, one
/// write at a time goes anyway.
pub const MAX_HOLD: Duration = Duration::from_secs(30);
/// The first retry's delay after a failed write; each next one doubles it.
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
/// Attempts at one bundle's write before it is dropped (queued again by its next status write).
pub const ATTEMPTS: u32 = 5;
/// How often the task looks again when nothing woke it (a hold or a back-off ending).
const TICK: Duration = Duration::from_millis(100);
/// How long a deletion of a history waits for a write of it in flight.
const FORGET_WAIT: Duration = Duration::from_secs(10);

/// A bundle's `(namespace, name)`.
pub type BundleName = (String, String);

/// What a write needs of its bundle, taken when it is queued.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// The bundle as the history's owner (garbage-collected with it).
    pub owner: Option<OwnerReference>,
    /// Its replica count (the history keeps only those replicas).
    pub replicas: u32,
    /// The bundle's status showed no placement decision when queued: nothing was ever
    /// recorded for it, so its history is created without reading first (a history a leader
    /// before wrote all the same answers 409, and is then read).
    pub first: bool,
}

impl Target {
    pub fn of(bundle: &Bundle) -> Target {
        // A status written before any decision (waiting for Manager or for a pool, say) has no
        // job's last placement: still nothing recorded.
        let decided = (bundle.status.iter())
            .flat_map(|s| &s.replicas)
            .flat_map(|r| &r.jobs)
            .any(|j| j.last_placement.is_some());
        Target {
            owner: bundle.controller_owner_ref(&()),
            replicas: u32::try_from(bundle.spec.replicas).unwrap_or(0),
            first: !decided,
        }
    }

    /// `self` queued again with `newer`: the newer bundle's figures, still `first` if either was.
    fn merged(self, newer: Target) -> Target {
        Target {
            first: self.first || newer.first,
            ..newer
        }
    }
}

#[derive(Debug)]
struct Entry {
    target: Target,
    /// When it was queued first (its hold counts from then).
    since: Instant,
    /// Not before then (a retry's back-off).
    not_before: Option<Instant>,
    /// Failed attempts so far.
    failures: u32,
}

/// The queue, as plain data: which bundle to write next, given the time and whether the
/// Bundles are busy.
#[derive(Debug, Default)]
pub struct Queue {
    entries: HashMap<BundleName, Entry>,
    /// Queued bundles, oldest first, each once.
    order: VecDeque<BundleName>,
    /// Bundles being written now.
    in_flight: HashMap<BundleName, InFlight>,
}

/// A write under way: its entry's age and failures (for a retry), and what was queued for the
/// bundle meanwhile, since when.
#[derive(Debug)]
struct InFlight {
    since: Instant,
    failures: u32,
    again: Option<(Target, Instant)>,
    /// The bundle went meanwhile: nothing more is written for it.
    gone: bool,
}

/// How a write ended, for [`Queue::done`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    Ok,
    /// Failed; tried again later unless out of attempts or `retry` is false.
    Failed {
        retry: bool,
    },
}

impl Queue {
    /// Queues `bundle` at `now` (once: a second time only updates its target).
    pub fn queue(&mut self, bundle: BundleName, target: Target, now: Instant) {
        if let Some(f) = self.in_flight.get_mut(&bundle) {
            f.again = Some(match f.again.take() {
                Some((t, since)) => (t.merged(target), since),
                None => (target, now),
            });
            return;
        }
        match self.entries.get_mut(&bundle) {
            Some(e) => e.target = e.target.clone().merged(target),
            None => {
                self.entries.insert(
                    bundle.clone(),
                    Entry {
                        target,
                        since: now,
                        not_before: None,
                        failures: 0,
                    },
                );
                self.order.push_back(bundle);
            }
        }
    }

    /// The next bundle to write at `now`, taken off the queue and counted in flight: none while
    /// [`IN_FLIGHT`] writes are; while `busy`, only one that waited [`MAX_HOLD`], and only
    /// while nothing else is in flight. With `drain`, neither the priority nor a back-off holds.
    pub fn next(&mut self, now: Instant, busy: bool, drain: bool) -> Option<(BundleName, Target)> {
        let limit = if busy && !drain { 1 } else { IN_FLIGHT };
        if self.in_flight.len() >= limit {
            return None;
        }
        let due = |e: &Entry| {
            (drain || e.not_before.is_none_or(|t| t <= now))
                && (drain || !busy || now.saturating_duration_since(e.since) >= MAX_HOLD)
        };
        // Busy, only the oldest can have waited its bound: the queue is not scanned at each
        // wake-up of a wave (thousands of entries, hundreds of wake-ups a second).
        let scan = if busy && !drain { 1 } else { self.order.len() };
        let at =
            (self.order.iter().take(scan)).position(|b| self.entries.get(b).is_some_and(due))?;
        let bundle = self.order.remove(at)?;
        let entry = self.entries.remove(&bundle)?;
        self.in_flight.insert(
            bundle.clone(),
            InFlight {
                since: entry.since,
                failures: entry.failures,
                again: None,
                gone: false,
            },
        );
        Some((bundle, entry.target))
    }

    /// `bundle`'s write ended at `now`: a failure is queued again after its back-off (unless it
    /// is out of attempts or not to be retried), and what was queued while it was in flight
    /// is queued again at once.
    pub fn done(&mut self, bundle: &BundleName, target: Target, written: Written, now: Instant) {
        let Some(InFlight {
            since,
            failures,
            again,
            gone,
        }) = self.in_flight.remove(bundle)
        else {
            return;
        };
        if gone {
            return;
        }
        let retry = match written {
            Written::Ok => None,
            Written::Failed { retry } => {
                let failures = failures.saturating_add(1);
                (retry && failures < ATTEMPTS).then_some(failures)
            }
        };
        let (target, since, failures, not_before) = match (again, retry) {
            (Some((t, _)), Some(failures)) => (target.merged(t), since, failures, None),
            (Some((t, at)), None) => (t, at, 0, None),
            (None, Some(failures)) => (target, since, failures, Some(now + backoff(failures))),
            (None, None) => return,
        };
        self.entries.insert(
            bundle.clone(),
            Entry {
                target,
                since,
                not_before,
                failures,
            },
        );
        self.order.push_back(bundle.clone());
    }

    /// `bundle` is gone: nothing of it is written any more.
    pub fn forget(&mut self, bundle: &BundleName) {
        if self.entries.remove(bundle).is_some() {
            self.order.retain(|b| b != bundle);
        }
        if let Some(f) = self.in_flight.get_mut(bundle) {
            f.again = None;
            f.gone = true;
        }
    }

    /// Whether a write of `bundle` is in flight.
    pub fn writing(&self, bundle: &BundleName) -> bool {
        self.in_flight.contains_key(bundle)
    }

    /// Bundles queued or being written.
    pub fn depth(&self) -> usize {
        self.entries.len() + self.in_flight.len()
    }
}

/// The delay before attempt `failures + 1`.
fn backoff(failures: u32) -> Duration {
    RETRY_FIRST.saturating_mul(1 << failures.saturating_sub(1).min(6))
}

/// The writer: the queue, its task (started on first use, inside the caller's runtime) and
/// how many bundles it holds (for [`HistoryWriter::flush`] and the queue gauge).
#[derive(Default)]
pub struct HistoryWriter {
    queue: Mutex<Queue>,
    wake: Notify,
    depth: watch::Sender<usize>,
    /// While a flush runs: neither the priority nor a back-off holds.
    draining: std::sync::atomic::AtomicBool,
    started: OnceLock<()>,
}

impl HistoryWriter {
    fn queue_lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `bundle`'s history write after its status write (a bundle with nothing new to
    /// add costs its writer one look at the bundle book and no request).
    pub fn queue(&self, ctx: &Arc<Context>, bundle: &Bundle) {
        let Ok(key) = ns_name(bundle) else { return };
        self.started
            .get_or_init(|| drop(tokio::spawn(run(Arc::downgrade(ctx)))));
        let depth = {
            let mut q = self.queue_lock();
            q.queue(key, Target::of(bundle), ctx.clock.instant());
            q.depth()
        };
        self.publish(ctx, depth);
        self.wake.notify_one();
    }

    /// `bundle` is gone: its history is deleted once its queued write is dropped and one in
    /// flight was waited for (up to `FORGET_WAIT`), so that the history is not created again
    /// after its deletion.
    pub async fn delete(&self, ctx: &Context, bundle: &BundleName) {
        self.forget(ctx, bundle, FORGET_WAIT).await;
        super::history::delete(&ctx.client, bundle).await;
    }

    /// `bundle` is gone: its queued write is dropped, and a write of it in flight is waited
    /// for (up to `within`).
    async fn forget(&self, ctx: &Context, bundle: &BundleName, within: Duration) {
        let depth = {
            let mut q = self.queue_lock();
            q.forget(bundle);
            q.depth()
        };
        self.publish(ctx, depth);
        let mut rx = self.depth.subscribe();
        let settled = rx.wait_for(|_| !self.queue_lock().writing(bundle));
        if tokio::time::timeout(within, settled).await.is_err() {
            tracing::warn!(bundle = %bundle.1, namespace = %bundle.0, "a placement history write of a deleted bundle is still in flight");
        }
    }

    /// Writes everything queued, without waiting for the Bundles to be quiet nor for a
    /// back-off, until nothing is left or `within` has passed: true when nothing is left.
    pub async fn flush(&self, within: Duration) -> bool {
        self.draining
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.wake.notify_one();
        let mut rx = self.depth.subscribe();
        let done = tokio::time::timeout(within, rx.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok());
        self.draining
            .store(false, std::sync::atomic::Ordering::SeqCst);
        done
    }

    /// Waits until nothing is queued or being written, or `within` has passed (the priority
    /// still holds): true when nothing is.
    pub async fn idle(&self, within: Duration) -> bool {
        let mut rx = self.depth.subscribe();
        tokio::time::timeout(within, rx.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Bundles queued or being written.
    pub fn pending(&self) -> usize {
        *self.depth.borrow()
    }

    fn publish(&self, ctx: &Context, depth: usize) {
        self.depth.send_replace(depth);
        ctx.metrics.set_history_queued(depth);
    }
}

/// Whether the Bundle controller is busy: a quarter of its slots (at least 2) run passes.
fn busy(ctx: &Context) -> bool {
    let slots = ctx.bundle_slots();
    let running = (ctx.state)
        .bundle_pass_slots(ctx.clock.instant(), slots)
        .running;
    running >= (slots / 4).max(2)
}

/// The writer's task: starts every write the queue allows, then waits for a bundle to be
/// queued, a write to end, or a tick; ends when the context is gone.
async fn run(ctx: Weak<Context>) {
    loop {
        let Some(c) = ctx.upgrade() else { return };
        let w = &c.history;
        let drain = w.draining.load(std::sync::atomic::Ordering::SeqCst);
        let busy = !drain && busy(&c);
        loop {
            let next = w.queue_lock().next(c.clock.instant(), busy, drain);
            let Some((bundle, target)) = next else { break };
            tokio::spawn(write_one(c.clone(), bundle, target));
        }
        // A wake-up while writes were started is kept by the Notify as a permit. The context
        // is held for one tick at most: the loop ends once it is gone.
        let _ = tokio::time::timeout(TICK, w.wake.notified()).await;
    }
}

async fn write_one(ctx: Arc<Context>, bundle: BundleName, target: Target) {
    let result =
        super::history::write(&ctx.client, &ctx.state, &ctx.identity, &bundle, &target).await;
    let written = match &result {
        Ok(()) => Written::Ok,
        Err(e) => {
            let fenced = is_fenced(e);
            if !fenced {
                ctx.metrics.history_write_failed();
            }
            tracing::warn!(bundle = %bundle.1, namespace = %bundle.0, error = %e, fenced, "could not write the placement history");
            Written::Failed { retry: !fenced }
        }
    };
    let w = &ctx.history;
    let depth = {
        let mut q = w.queue_lock();
        q.done(&bundle, target, written, ctx.clock.instant());
        q.depth()
    };
    w.publish(&ctx, depth);
    w.wake.notify_one();
}

/// Whether the fence refused the write (this replica no longer surely leads).
fn is_fenced(e: &Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = source {
        if s.is::<crate::fence::Fenced>() {
            return true;
        }
        source = s.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_is_first_until_its_status_shows_a_placement_decision() {
        let mut b = Bundle::new("news", serde_json::from_value(serde_json::json!({
            "replicas": 1, "pools": ["a"],
            "jobs": [{"jobName": "enc", "requirements": {"requiredCapacity": 1, "requiredCores": 1, "priorityBand": "gold"}}],
        })).expect("a bundle spec"));
        assert!(Target::of(&b).first, "no status yet");
        let mut job = automanager_api::JobStatus {
            job_name: "enc".into(),
            ..Default::default()
        };
        b.status = Some(automanager_api::BundleStatus {
            replicas: vec![automanager_api::ReplicaStatus {
                jobs: vec![job.clone()],
                ..Default::default()
            }],
            ..Default::default()
        });
        assert!(Target::of(&b).first, "a status written before any decision");
        job.last_placement = Some(
            serde_json::from_value(serde_json::json!({
                "decidedAt": "2026-01-01T00:00:00Z", "outcome": "placed",
            }))
            .expect("a trace summary"),
        );
        if let Some(s) = b.status.as_mut() {
            s.replicas[0].jobs = vec![job];
        }
        assert!(!Target::of(&b).first, "a decision recorded");
    }

    fn target(replicas: u32, first: bool) -> Target {
        Target {
            owner: None,
            replicas,
            first,
        }
    }

    fn name(n: &str) -> BundleName {
        ("ns".into(), n.into())
    }

    #[test]
    fn a_bundle_queued_twice_before_its_write_is_written_once_with_its_newest_figures() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        q.queue(name("a"), target(2, true), t0);
        q.queue(name("a"), target(3, false), t0 + Duration::from_secs(1));
        assert_eq!(q.depth(), 1);
        let (b, t) = q.next(t0, false, false).expect("one write");
        assert_eq!((b, t), (name("a"), target(3, true)), "still never written");
        assert_eq!(q.next(t0, false, false), None, "nothing else queued");
    }

    #[test]
    fn at_most_the_limit_is_in_flight_and_one_bundle_is_never_written_twice_at_once() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        for i in 0..IN_FLIGHT + 1 {
            q.queue(name(&i.to_string()), target(1, false), t0);
        }
        let started: Vec<_> = std::iter::from_fn(|| q.next(t0, false, false)).collect();
        assert_eq!(started.len(), IN_FLIGHT);
        // Queued again while its write is in flight: written again after it, not beside it.
        let (first, t) = started[0].clone();
        q.queue(first.clone(), target(1, false), t0);
        assert_eq!(q.depth(), IN_FLIGHT + 1);
        q.done(&first, t, Written::Ok, t0);
        let next: Vec<_> = std::iter::from_fn(|| q.next(t0, false, false)).collect();
        assert_eq!(
            next.iter().map(|(b, _)| b.clone()).collect::<Vec<_>>(),
            [name(&IN_FLIGHT.to_string())],
            "the oldest waiting goes first; the one just written waits its turn"
        );
    }

    #[test]
    fn while_the_bundles_are_busy_only_a_write_held_its_bound_goes_and_one_at_a_time() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        q.queue(name("a"), target(1, false), t0);
        q.queue(name("b"), target(1, false), t0);
        assert_eq!(q.next(t0, true, false), None, "held");
        let later = t0 + MAX_HOLD;
        assert!(q.next(later, true, false).is_some(), "held long enough");
        assert_eq!(q.next(later, true, false), None, "one at a time while busy");
        assert!(
            q.next(later, false, false).is_some(),
            "quiet: the limit is back"
        );
    }

    #[test]
    fn a_failed_write_waits_its_back_off_and_is_dropped_after_its_attempts() {
        let mut q = Queue::default();
        let mut now = Instant::now();
        q.queue(name("a"), target(1, false), now);
        for attempt in 1..=ATTEMPTS {
            let (b, t) = q.next(now, false, false).expect("due");
            q.done(&b, t, Written::Failed { retry: true }, now);
            if attempt == ATTEMPTS {
                break;
            }
            assert_eq!(q.next(now, false, false), None, "backing off");
            now += backoff(attempt);
        }
        assert_eq!(q.depth(), 0, "dropped after {ATTEMPTS} attempts");

        q.queue(name("b"), target(1, false), now);
        let (b, t) = q.next(now, false, false).expect("due");
        q.done(&b, t, Written::Failed { retry: false }, now);
        assert_eq!(q.depth(), 0, "a fenced write is not tried again");
    }

    #[test]
    fn a_flush_ignores_the_priority_and_the_back_off() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        q.queue(name("a"), target(1, false), t0);
        let (b, t) = q.next(t0, false, false).expect("due");
        q.done(&b, t, Written::Failed { retry: true }, t0);
        assert_eq!(q.next(t0, true, false), None);
        assert!(q.next(t0, true, true).is_some());
    }

    #[test]
    fn a_bundle_that_goes_is_not_written_again() {
        let mut q = Queue::default();
        let t0 = Instant::now();
        q.queue(name("a"), target(1, false), t0);
        q.queue(name("b"), target(1, false), t0);
        let (a, t) = q.next(t0, false, false).expect("due");
        q.queue(a.clone(), target(1, false), t0);
        q.forget(&a);
        q.forget(&name("b"));
        assert!(q.writing(&a), "its deletion waits for the write in flight");
        q.done(&a, t, Written::Failed { retry: true }, t0);
        assert!(!q.writing(&a));
        assert_eq!(q.depth(), 0);
    }
}
