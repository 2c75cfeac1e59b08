//! Events published off the reconcile path, as client-go's event recorder does: a reconcile
//! hands its Event to a queue and goes on, and background tasks publish the queue.
//!
//! Why: an Event is a write to the apiserver, and a reconcile that awaits it holds its
//! concurrency slot for as long as the apiserver takes. In a mass failure (a zone lost) the
//! apiserver is the busiest process on the machine, and recoveries waiting behind `Restarted`
//! Events were what kept gold jobs down (docs/fleet-safety-brakes.md, `bench-zone-outage`).
//!
//! Unlike client-go, nothing is dropped: a full queue makes the caller wait, so under a
//! sustained overload reconciles slow down to the rate the apiserver takes Events, as they did
//! before. The queue is [`SHARDS`] queues, each published one Event at a time, and every Event
//! about one object goes to the same shard: an object's Events keep their order, and the
//! recorder's series (a repeated reason becomes a count on the first Event) sees each repeat
//! after the Event it repeats instead of racing it into a duplicate.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use tokio::sync::{OnceCell, mpsc, watch};

/// Events waiting to be published, over all shards, before a caller has to wait (client-go
/// keeps 1,000).
pub const QUEUE: usize = 1024;
/// Queues published side by side, so Events in flight to the apiserver at once.
pub const SHARDS: usize = 8;

type Queued = (Event, ObjectReference);

/// The queue and its publishing tasks (started on first use, inside the caller's runtime).
pub struct EventQueue {
    recorder: Recorder,
    shards: OnceCell<Vec<mpsc::Sender<Queued>>>,
    /// Events queued and not yet answered by the apiserver.
    pending: Arc<watch::Sender<usize>>,
}

impl EventQueue {
    pub fn new(recorder: Recorder) -> Self {
        EventQueue {
            recorder,
            shards: OnceCell::new(),
            pending: Arc::new(watch::Sender::new(0)),
        }
    }

    /// Queues `ev` about `reference`; waits only while its shard's queue is full.
    pub async fn publish(&self, ev: Event, reference: ObjectReference) {
        let shards = self.shards.get_or_init(|| async { self.start() }).await;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (&reference.namespace, &reference.kind, &reference.name).hash(&mut h);
        let tx = &shards[(h.finish() as usize) % shards.len()];
        self.pending.send_modify(|n| *n += 1);
        if tx.send((ev, reference)).await.is_err() {
            // A shard's task ends only when its sender is gone; this one is still here.
            self.pending.send_modify(|n| *n = n.saturating_sub(1));
        }
    }

    fn start(&self) -> Vec<mpsc::Sender<Queued>> {
        (0..SHARDS)
            .map(|_| {
                let (tx, mut rx) = mpsc::channel::<Queued>(QUEUE / SHARDS);
                let recorder = self.recorder.clone();
                let pending = self.pending.clone();
                tokio::spawn(async move {
                    while let Some((ev, reference)) = rx.recv().await {
                        if let Err(e) = recorder.publish(&ev, &reference).await {
                            tracing::warn!(
                                object = %reference.name.clone().unwrap_or_default(),
                                reason = %ev.reason,
                                error = %e,
                                "could not publish event"
                            );
                        }
                        pending.send_modify(|n| *n = n.saturating_sub(1));
                    }
                });
                tx
            })
            .collect()
    }

    /// Events queued and not yet answered.
    pub fn pending(&self) -> usize {
        *self.pending.borrow()
    }

    /// Waits until every queued Event was answered, or `within` passed; true when flushed.
    pub async fn flush(&self, within: Duration) -> bool {
        let mut rx = self.pending.subscribe();
        tokio::time::timeout(within, rx.wait_for(|n| *n == 0))
            .await
            .is_ok_and(|r| r.is_ok())
    }
}
