//! Write fencing: a replica changes nothing, in Kubernetes or in Manager, unless it surely holds
//! the lease.
//!
//! "Surely" is a deadline on the monotonic clock: each time the holder reads its Lease back
//! ([`crate::leader`]) the fence is held open until that Lease's `renewTime +
//! leaseDurationSeconds`, less a margin. A leader that is paused (SIGSTOP, a long GC-like stall,
//! a frozen VM) past its lease finds the deadline gone the instant it resumes, before its
//! election loop has run again, so nothing it had in flight is written after another replica
//! may have taken over. The same check guards the Kubernetes client (a tower layer refusing
//! every request that is not a read) and Manager's client (its state-changing commands), so
//! Events, status patches, finalizer edits, CreateNode and StartJob are all covered.
//!
//! The election's own Lease traffic goes through an unfenced client: a replica must be able to
//! acquire and renew the lease to become leader at all.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use tower::{BoxError, Layer, Service};

use crate::clock::{SharedClock, SystemClock};

/// Taken off the Lease's expiry: clock skew between this replica and the apiserver, and the
/// time a write spends in flight.
pub const MARGIN: Duration = Duration::from_secs(1);

#[derive(Debug)]
enum State {
    /// Leader election is off: this is the only replica.
    AlwaysOpen,
    /// Writes are allowed until the instant, if any.
    Until(Option<Instant>),
}

/// Whether this replica may write now. Cheap to clone; clones share the state.
#[derive(Clone, Debug)]
pub struct Fence(Arc<Mutex<State>>, SharedClock);

impl Fence {
    /// A fence that never closes (leader election disabled).
    pub fn always_open() -> Fence {
        Fence(
            Arc::new(Mutex::new(State::AlwaysOpen)),
            SystemClock::shared(),
        )
    }

    /// A closed fence, opened by [`Fence::hold_for`]; its deadlines are on `clock`.
    pub fn closed(clock: SharedClock) -> Fence {
        Fence(Arc::new(Mutex::new(State::Until(None))), clock)
    }

    /// Whether writes are allowed at this instant.
    pub fn allows_writes(&self) -> bool {
        match &*self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            State::AlwaysOpen => true,
            State::Until(until) => until.is_some_and(|u| self.1.instant() < u),
        }
    }

    /// Opens the fence until `remaining` from now, less [`MARGIN`] (the lease is held for
    /// `remaining` more).
    pub fn hold_for(&self, remaining: Duration) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let State::Until(until) = &mut *state {
            *until = remaining
                .checked_sub(MARGIN)
                .and_then(|r| self.1.instant().checked_add(r));
        }
    }

    /// Closes the fence now (the lease is lost, or not known to be held).
    pub fn close(&self) {
        let mut state = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let State::Until(until) = &mut *state {
            *until = None;
        }
    }

    /// The tower layer that fences a Kubernetes client's writes on this fence.
    pub fn layer(&self) -> FenceLayer {
        FenceLayer(self.clone())
    }

    /// The check Manager's client runs before each state-changing command.
    pub fn for_manager(&self) -> manager_client::WriteFence {
        let fence = self.clone();
        Arc::new(move || fence.allows_writes())
    }
}

/// The error a fenced write fails with.
#[derive(Debug, thiserror::Error)]
#[error("write refused: this replica does not hold the leader lease")]
pub struct Fenced;

/// Refuses every request that is not a read while the fence is closed.
#[derive(Clone, Debug)]
pub struct FenceLayer(Fence);

impl<S> Layer<S> for FenceLayer {
    type Service = FencedService<S>;

    fn layer(&self, inner: S) -> FencedService<S> {
        FencedService {
            inner,
            fence: self.0.clone(),
        }
    }
}

/// See [`FenceLayer`].
#[derive(Clone, Debug)]
pub struct FencedService<S> {
    inner: S,
    fence: Fence,
}

/// Reads (and watches, which are GETs) go through whatever the fence says.
fn is_read(method: &http::Method) -> bool {
    matches!(
        *method,
        http::Method::GET | http::Method::HEAD | http::Method::OPTIONS
    )
}

impl<S, B> Service<http::Request<B>> for FencedService<S>
where
    S: Service<http::Request<B>>,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: http::Request<B>) -> <Self as Service<http::Request<B>>>::Future {
        if !is_read(req.method()) && !self.fence.allows_writes() {
            tracing::warn!(method = %req.method(), uri = %req.uri(), "write fenced: not the leader");
            return Box::pin(std::future::ready(Err(Box::new(Fenced) as BoxError)));
        }
        let call = self.inner.call(req);
        Box::pin(async move { call.await.map_err(Into::into) })
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use tower::ServiceExt;

    use super::*;
    use crate::clock::FakeClock;

    #[test]
    fn a_closed_fence_refuses_until_held_and_a_held_one_closes_at_its_deadline() {
        let clock = FakeClock::at(chrono::DateTime::UNIX_EPOCH);
        let f = Fence::closed(clock.shared());
        assert!(!f.allows_writes());
        f.hold_for(Duration::from_secs(10));
        assert!(f.allows_writes());
        // Less than the margin left: as good as expired.
        f.hold_for(Duration::from_millis(500));
        assert!(!f.allows_writes());
        f.hold_for(MARGIN + Duration::from_millis(30));
        assert!(f.allows_writes());
        clock.advance(Duration::from_millis(29));
        assert!(f.allows_writes());
        clock.advance(Duration::from_millis(1));
        assert!(!f.allows_writes(), "the deadline passed without a renewal");
        f.hold_for(Duration::from_secs(10));
        f.close();
        assert!(!f.allows_writes());
    }

    #[test]
    fn without_election_the_fence_is_always_open() {
        let f = Fence::always_open();
        f.close();
        assert!(f.allows_writes());
        assert!((f.for_manager())());
    }

    #[tokio::test]
    async fn the_layer_lets_reads_through_and_refuses_writes_while_closed() {
        let fence = Fence::closed(SystemClock::shared());
        let svc = fence
            .layer()
            .layer(tower::service_fn(|_: http::Request<()>| async {
                Ok::<_, Infallible>("answered")
            }));
        let req = |m: http::Method| {
            http::Request::builder()
                .method(m)
                .uri("/apis/automanager.norsk.io/v1alpha1/bundles")
                .body(())
                .unwrap_or_default()
        };
        assert!(svc.clone().oneshot(req(http::Method::GET)).await.is_ok());
        for m in [
            http::Method::POST,
            http::Method::PUT,
            http::Method::PATCH,
            http::Method::DELETE,
        ] {
            let err = svc.clone().oneshot(req(m.clone())).await;
            assert!(
                err.is_err_and(|e| e.is::<Fenced>()),
                "{m} went through a closed fence"
            );
        }
        fence.hold_for(Duration::from_secs(10));
        assert!(svc.clone().oneshot(req(http::Method::PATCH)).await.is_ok());
    }
}
