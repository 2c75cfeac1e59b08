//! Leader election on a `coordination.k8s.io/v1` Lease, so two replicas can run and only one acts.
//!
//! Built on kube-lease-manager: its watch loop acquires, renews and (when its channel closes)
//! releases the Lease. [`run_leader_election`] wraps it with what the operator needs:
//! - a `watch::Receiver<bool>` that is `true` exactly while this replica holds the lease;
//! - retries with backoff when the Lease cannot be created or read (RBAC, apiserver down),
//!   reporting `false` meanwhile rather than failing the process;
//! - on `shutdown`, `false` is published first (stop acting), then the Lease is released so the
//!   standby takes over at once instead of after `leaseDuration`;
//! - when leader election is disabled in the settings, the receiver is always `true`.
//!
//! kube-lease-manager counts in whole seconds: `leaseDuration` is the Lease's
//! `leaseDurationSeconds`, and the holder renews `leaseDuration - renewEvery` seconds before the
//! lease would lapse (its "grace").

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::LeaderElectionConfig;

/// The field manager this operator's Lease writes are recorded under, suffixed by identity.
const FIELD_MANAGER_PREFIX: &str = "automanager-operator-lease";

/// Longest wait for the Lease release at shutdown; past it the lease simply lapses.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// A running election.
#[derive(Debug)]
pub struct LeaderElection {
    /// `true` while this replica holds the lease. Ends `false` when the election stops.
    pub is_leader: watch::Receiver<bool>,
    /// Finishes once the lease has been released after `shutdown` (await it before exiting).
    pub task: JoinHandle<()>,
}

/// Starts leader election for `identity` (unique per replica, e.g. the Pod name) and returns at
/// once. See the module docs for the behaviour.
pub async fn run_leader_election(
    client: kube::Client,
    settings: &LeaderElectionConfig,
    identity: String,
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
            task,
        };
    }
    let (tx, rx) = watch::channel(false);
    let settings = settings.clone();
    let task = tokio::spawn(async move {
        let shutdown = std::pin::pin!(shutdown);
        elect(client, &settings, &identity, &tx, shutdown).await;
        let _ = tx.send(false);
    });
    LeaderElection {
        is_leader: rx,
        task,
    }
}

/// Elects until `shutdown`, then publishes `false` and releases the lease.
async fn elect<F: Future<Output = ()>>(
    client: kube::Client,
    settings: &LeaderElectionConfig,
    identity: &str,
    tx: &watch::Sender<bool>,
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
                let stopping = loop {
                    let leader = *inner_rx.borrow_and_update();
                    if *tx.borrow() != leader {
                        tracing::info!(identity, leader, "leadership changed");
                    }
                    let _ = tx.send(leader);
                    tokio::select! {
                        () = &mut shutdown => break true,
                        changed = inner_rx.changed() => if changed.is_err() { break false },
                    }
                };
                // Stop acting first, then let go of the lease: closing the channel makes
                // kube-lease-manager's task release it and return.
                let _ = tx.send(false);
                drop(inner_rx);
                let abort = handle.abort_handle();
                match tokio::time::timeout(RELEASE_TIMEOUT, handle).await {
                    Ok(Ok(Ok(_))) if stopping => tracing::info!(identity, "lease released"),
                    Ok(Ok(Ok(_))) => {
                        tracing::warn!(identity, "lease manager stopped; restarting it")
                    }
                    Ok(Ok(Err(e))) => tracing::warn!(identity, error = %e, "lease manager failed"),
                    Ok(Err(e)) => tracing::warn!(identity, error = %e, "lease manager task failed"),
                    Err(_) => {
                        abort.abort();
                        tracing::warn!(
                            identity,
                            "lease release timed out; the lease will lapse instead"
                        );
                    }
                }
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
