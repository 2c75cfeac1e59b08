//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas can run and only one acts.
//!
//! Built on kube-lease-manager: its watch loop acquires, renews and (when its channel closes)
//! releases the Lease. [`run_leader_election`] wraps it with what the operator needs:
//! - a `watch::Receiver<bool>` that is `true` exactly while this replica holds the lease;
//! - retries with backoff when the Lease cannot be created or read (RBAC, apiserver down),
//!   reporting `false` meanwhile rather than failing the process;
//! - on `shutdown`, `false` is published first (stop acting), then the Lease is released so the
//!   standby takes over at once instead of after `leaseDuration`;
//! - when leader election is disabled in the settings, the receiver is always `true`;
//! - the holder re-reads the Lease every second and reports `false` once it cannot confirm,
//!   from the Lease's `renewTime + leaseDurationSeconds`, that the lease is still its own.
//!   kube-lease-manager alone keeps saying "leader" while it cannot reach the apiserver, after
//!   the others may have taken the lease over; this closes that gap. The holder renews at least
//!   2 s before expiry (the settings enforce it), so a healthy holder reads its renewed lease
//!   before the deadline; the same margin absorbs clock skew between replicas.
//!
//! kube-lease-manager counts in whole seconds: `leaseDuration` is the Lease's
//! `leaseDurationSeconds`, and the holder renews `leaseDuration - renewEvery` seconds before the
//! lease would lapse (its "grace").

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::clock::{Clock, SharedClock};
use crate::config::LeaderElectionConfig;
use crate::fence::Fence;

/// The field manager this operator's Lease writes are recorded under, suffixed by identity.
const FIELD_MANAGER_PREFIX: &str = "automanager-operator-lease";

/// Longest wait for the Lease release at shutdown; past it the lease simply lapses.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// How often the holder re-reads the Lease to confirm it still holds it.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// Reads the Lease: `Some(until)` (unix seconds: `renewTime + leaseDurationSeconds`) while
/// `identity` holds it, `Some(0)` when someone else does or it is gone, `None` when it could
/// not be read in time (the previous answer then runs out by itself).
async fn confirm(
    leases: &Api<Lease>,
    settings: &LeaderElectionConfig,
    identity: &str,
) -> Option<i64> {
    let read = tokio::time::timeout(CHECK_EVERY * 2, leases.get_opt(&settings.lease_name));
    let lease = match read.await {
        Ok(Ok(lease)) => lease,
        Ok(Err(e)) => {
            tracing::warn!(identity, error = %e, "cannot read the Lease to confirm leadership");
            return None;
        }
        Err(_) => {
            tracing::warn!(
                identity,
                "reading the Lease to confirm leadership timed out"
            );
            return None;
        }
    };
    let spec = lease.and_then(|l| l.spec);
    let Some(spec) = spec.filter(|s| s.holder_identity.as_deref() == Some(identity)) else {
        return Some(0);
    };
    let renewed = spec
        .renew_time
        .or(spec.acquire_time)
        .map_or(0, |t| t.0.as_second());
    let duration = spec
        .lease_duration_seconds
        .map_or(settings.lease_duration_seconds(), |d| {
            u64::try_from(d).unwrap_or(0)
        });
    Some(renewed.saturating_add(i64::try_from(duration).unwrap_or(0)))
}

/// A running election.
#[derive(Debug)]
pub struct LeaderElection {
    /// `true` while this replica holds the lease. Ends `false` when the election stops.
    pub is_leader: watch::Receiver<bool>,
    /// Open only while the lease is surely held ([`crate::fence`]): fence the clients that
    /// act with it.
    pub fence: Fence,
    /// Finishes once the lease has been released after `shutdown` (await it before exiting).
    pub task: JoinHandle<()>,
}

/// Starts leader election for `identity` (unique per replica, e.g. the Pod name) and returns at
/// once. See the module docs for the behaviour.
pub async fn run_leader_election(
    client: kube::Client,
    settings: &LeaderElectionConfig,
    identity: String,
    clock: SharedClock,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> LeaderElection {
    if !settings.enabled {
        let (tx, rx) = watch::channel(true);
        let task = tokio::spawn(async move {
            shutdown.await;
            // Stop acting on shutdown, like an elected leader would.
            let _ = tx.send(false);
        });
        return LeaderElection {
            is_leader: rx,
            fence: Fence::always_open(),
            task,
        };
    }
    let (tx, rx) = watch::channel(false);
    let settings = settings.clone();
    let fence = Fence::closed(clock.clone());
    let held = fence.clone();
    let task = tokio::spawn(async move {
        let shutdown = std::pin::pin!(shutdown);
        elect(client, &settings, &identity, &tx, &held, &*clock, shutdown).await;
        held.close();
        let _ = tx.send(false);
    });
    LeaderElection {
        is_leader: rx,
        fence,
        task,
    }
}

/// Elects until `shutdown`, then publishes `false` and releases the lease.
async fn elect<F: Future<Output = ()>>(
    client: kube::Client,
    settings: &LeaderElectionConfig,
    identity: &str,
    tx: &watch::Sender<bool>,
    fence: &Fence,
    clock: &dyn Clock,
    mut shutdown: Pin<&mut F>,
) {
    let mut delay = Duration::from_millis(500);
    loop {
        let built = tokio::select! {
            () = &mut shutdown => return,
            built = build(client.clone(), settings, identity) => built,
        };
        match built {
            Ok(manager) => {
                let (mut inner_rx, handle) = manager.watch().await;
                tracing::info!(
                    lease = %settings.lease_name,
                    namespace = %settings.lease_namespace,
                    identity,
                    "leader election started"
                );
                let leases: Api<Lease> = Api::namespaced(client.clone(), &settings.lease_namespace);
                let lease = Held {
                    leases: &leases,
                    settings,
                    identity,
                    tx,
                    fence,
                };
                let stopping = lease.follow(&mut inner_rx, clock, &mut shutdown).await;
                lease.release(inner_rx, handle, stopping).await;
                if stopping {
                    return;
                }
            }
            Err(e) => {
                tracing::warn!(
                    lease = %settings.lease_name,
                    namespace = %settings.lease_namespace,
                    error = %e,
                    retry_in_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    "cannot set up leader election; retrying"
                );
            }
        }
        tokio::select! {
            () = &mut shutdown => return,
            () = tokio::time::sleep(delay) => {}
        }
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

/// One run of kube-lease-manager's task: what `elect` follows and then lets go of.
struct Held<'a> {
    leases: &'a Api<Lease>,
    settings: &'a LeaderElectionConfig,
    identity: &'a str,
    tx: &'a watch::Sender<bool>,
    fence: &'a Fence,
}

impl Held<'_> {
    /// Publishes leadership as the lease manager reports it, confirmed by reading the Lease,
    /// until `shutdown` (true) or the lease manager's task ends (false).
    async fn follow<F: Future<Output = ()>>(
        &self,
        inner_rx: &mut watch::Receiver<bool>,
        clock: &dyn Clock,
        shutdown: &mut Pin<&mut F>,
    ) -> bool {
        let (settings, identity) = (self.settings, self.identity);
        let mut check = tokio::time::interval(CHECK_EVERY);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Until when the lease is known to be ours (unix seconds), from the last read.
        let mut valid_until: Option<i64> = None;
        loop {
            let held = *inner_rx.borrow_and_update();
            let leader = held && valid_until.is_some_and(|t| clock.now().timestamp() < t);
            match valid_until.filter(|_| leader) {
                Some(t) => self.fence.hold_for(Duration::from_secs(
                    u64::try_from(t.saturating_sub(clock.now().timestamp())).unwrap_or(0),
                )),
                None => self.fence.close(),
            }
            if *self.tx.borrow() != leader {
                tracing::info!(identity, leader, "leadership changed");
            }
            let _ = self.tx.send(leader);
            tokio::select! {
                () = &mut *shutdown => return true,
                changed = inner_rx.changed() => {
                    if changed.is_err() {
                        return false;
                    }
                    if *inner_rx.borrow() {
                        valid_until = confirm(self.leases, settings, identity).await.or(valid_until);
                    }
                }
                _ = check.tick() => {
                    if held {
                        valid_until = confirm(self.leases, settings, identity).await.or(valid_until);
                    }
                }
            }
        }
    }

    /// Stops acting first, then lets go of the lease: closing the channel makes
    /// kube-lease-manager's task release it and return. Its release trusts its cached view of
    /// the Lease and would clear a lease someone else has taken since, so only what a fresh
    /// read shows is still ours is released.
    async fn release(
        &self,
        inner_rx: watch::Receiver<bool>,
        handle: tokio::task::JoinHandle<
            Result<kube_lease_manager::LeaseManager, LeaseManagerError>,
        >,
        stopping: bool,
    ) {
        let identity = self.identity;
        self.fence.close();
        let _ = self.tx.send(false);
        let abort = handle.abort_handle();
        let ours = confirm(self.leases, self.settings, identity)
            .await
            .is_some_and(|t| t > 0);
        if !ours {
            abort.abort();
            tracing::info!(identity, "not holding the lease; nothing to release");
        }
        drop(inner_rx);
        match tokio::time::timeout(RELEASE_TIMEOUT, handle).await {
            Ok(Ok(Ok(_))) if stopping => tracing::info!(identity, "lease released"),
            Ok(Ok(Ok(_))) => {
                tracing::warn!(identity, "lease manager stopped; restarting it")
            }
            Ok(Ok(Err(e))) => tracing::warn!(identity, error = %e, "lease manager failed"),
            Ok(Err(e)) if e.is_cancelled() => {}
            Ok(Err(e)) => tracing::warn!(identity, error = %e, "lease manager task failed"),
            Err(_) => {
                abort.abort();
                tracing::warn!(
                    identity,
                    "lease release timed out; the lease will lapse instead"
                );
            }
        }
    }
}

async fn build(
    client: kube::Client,
    settings: &LeaderElectionConfig,
    identity: &str,
) -> Result<kube_lease_manager::LeaseManager, LeaseManagerError> {
    LeaseManagerBuilder::new(client, settings.lease_name.clone())
        .with_namespace(settings.lease_namespace.clone())
        .with_identity(identity)
        .with_duration(settings.lease_duration_seconds())
        .with_grace(settings.grace_seconds())
        .with_field_manager(format!("{FIELD_MANAGER_PREFIX}-{identity}"))
        .build()
        .await
}
