//! What every controller is handed: the [`Context`] (the clients, the settings, the clock, the
//! state owner, the metrics, Events) and the [`Wakers`] the mirror pump and the controllers send
//! "look at this object again" through.

use std::sync::{Arc, Mutex};

use automanager_api::{Bundle, HotSpareTarget, Migration, PlacementPool};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, Resource};
use manager_client::ManagerClient;
use tokio::sync::{broadcast, mpsc};

use super::{Error, events};
use crate::clock::SharedClock;
use crate::mapping;
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::state::{EngineSnapshot, State};

/// Where the mirror pump and the controllers send "look at this object again".
#[derive(Clone)]
pub struct Wakers {
    /// A Bundle to look at again once a burst of changes has settled: its jobs' echoes, a
    /// drain or a Migration that moved it. The runtime debounces these ([`crate::runtime`]).
    pub bundles: mpsc::UnboundedSender<ObjectRef<Bundle>>,
    /// A Bundle with a recovery to make, or whose awaited capacity came: passed on at once,
    /// since every millisecond here is a viewer's gap.
    pub bundles_now: mpsc::UnboundedSender<ObjectRef<Bundle>>,
    pub pools: mpsc::UnboundedSender<ObjectRef<PlacementPool>>,
    pub spare_targets: mpsc::UnboundedSender<ObjectRef<HotSpareTarget>>,
    pub migrations: mpsc::UnboundedSender<ObjectRef<Migration>>,
    /// The ManagerNode status sync.
    pub node_sync: mpsc::Sender<()>,
    /// Every object of every kind (after a resync, when the change stream lagged).
    pub everything: broadcast::Sender<()>,
}

impl Wakers {
    /// Wakes Bundle `b` on its lane: `at_once` for a recovery or the capacity it waits on
    /// ([`Self::bundles_now`]), otherwise once its burst settles ([`Self::bundles`]).
    pub fn bundle(&self, b: ObjectRef<Bundle>, at_once: bool) {
        let lane = if at_once {
            &self.bundles_now
        } else {
            &self.bundles
        };
        let _ = lane.send(b);
    }
}

/// The receiving ends of [`Wakers`], taken once by the runtime.
pub struct WakeReceivers {
    pub bundles: mpsc::UnboundedReceiver<ObjectRef<Bundle>>,
    pub bundles_now: mpsc::UnboundedReceiver<ObjectRef<Bundle>>,
    pub pools: mpsc::UnboundedReceiver<ObjectRef<PlacementPool>>,
    pub spare_targets: mpsc::UnboundedReceiver<ObjectRef<HotSpareTarget>>,
    pub migrations: mpsc::UnboundedReceiver<ObjectRef<Migration>>,
    pub node_sync: mpsc::Receiver<()>,
}

fn wake_channels() -> (Wakers, WakeReceivers) {
    let (bundles, bundles_rx) = mpsc::unbounded_channel();
    let (bundles_now, bundles_now_rx) = mpsc::unbounded_channel();
    let (pools, pools_rx) = mpsc::unbounded_channel();
    let (spare_targets, spare_targets_rx) = mpsc::unbounded_channel();
    let (migrations, migrations_rx) = mpsc::unbounded_channel();
    let (node_sync, node_sync_rx) = mpsc::channel(1);
    let (everything, _) = broadcast::channel(16);
    (
        Wakers {
            bundles,
            bundles_now,
            pools,
            spare_targets,
            migrations,
            node_sync,
            everything,
        },
        WakeReceivers {
            bundles: bundles_rx,
            bundles_now: bundles_now_rx,
            pools: pools_rx,
            spare_targets: spare_targets_rx,
            migrations: migrations_rx,
            node_sync: node_sync_rx,
        },
    )
}

/// Everything the controllers share: clients, settings, metrics, the one state owner
/// ([`crate::state`]), the engine snapshot readers use, and the wakers.
pub struct Context {
    pub client: Client,
    pub manager: ManagerClient,
    pub settings: Settings,
    pub metrics: Metrics,
    /// Where every reconcile reads the time ([`crate::clock`]).
    pub clock: SharedClock,
    /// Events go through this queue, off the reconcile path ([`events`]).
    pub events: events::EventQueue,
    /// This replica's identity in leader election (its Pod's name when run as a Pod): what the
    /// placement history says made each decision.
    pub identity: String,
    /// The bundles' PlacementHistory writes, off the Bundle's path
    /// ([`super::bundle::history_writer`]).
    pub history: super::bundle::history_writer::HistoryWriter,
    /// The one state owner: every question and change is a method that locks inside.
    pub state: State,
    pub snapshot: EngineSnapshot,
    pub wake: Wakers,
    receivers: Mutex<Option<WakeReceivers>>,
}

impl Context {
    pub fn new(
        client: Client,
        manager: ManagerClient,
        settings: Settings,
        metrics: Metrics,
        clock: SharedClock,
        identity: &str,
    ) -> Arc<Self> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "automanager-operator".into(),
                instance: Some(identity.to_owned()),
            },
        );
        let (wake, receivers) = wake_channels();
        let state = State::new(&settings);
        Arc::new(Context {
            client,
            manager,
            state,
            snapshot: EngineSnapshot::default(),
            settings,
            metrics,
            clock,
            events: events::EventQueue::new(recorder),
            identity: identity.to_owned(),
            history: Default::default(),
            wake,
            receivers: Mutex::new(Some(receivers)),
        })
    }

    /// The wake receivers, once (the runtime takes them when controllers start).
    pub fn take_receivers(&self) -> Option<WakeReceivers> {
        self.receivers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Capacity came or went in `pool`: wakes the bundles waiting on it, its HotSpareTargets and
    /// its PlacementPool (its figures).
    pub fn wake_pool(&self, pool: &str) {
        let (bundles, targets) = self.state.waiters_of_pool(pool);
        for b in bundles {
            self.wake.bundle(b, true);
        }
        for t in targets {
            let _ = self.wake.spare_targets.send(t);
        }
        let _ = self.wake.pools.send(ObjectRef::new(pool));
    }

    /// Wakes the PlacementPool controller for `pool` only (a user of the pool went away, or its
    /// used capacity moved).
    pub fn wake_pool_controller(&self, pool: &str) {
        let _ = self.wake.pools.send(ObjectRef::new(pool));
    }

    /// How many Bundle passes run at a time (`concurrency.bundles`).
    pub fn bundle_slots(&self) -> usize {
        usize::from(self.settings.bundle_concurrency)
    }

    /// Records whether a bundle is Broken and updates the gauges.
    pub fn set_broken(&self, bundle_id: &str, broken: bool) {
        let count = self.state.set_broken(bundle_id, broken);
        if let Some(count) = count {
            self.metrics
                .set_broken_bundles(i64::try_from(count).unwrap_or(i64::MAX));
            if let Some(id) = mapping::BundleId::parse(bundle_id) {
                let (ns, name) = id.object();
                self.metrics.set_bundle_broken(ns, name, broken);
            }
        }
    }

    /// Whether the mirror is synced with Manager.
    pub fn manager_ready(&self) -> bool {
        self.manager.connection_state() == manager_client::ConnectionState::Ready
    }

    pub fn manager_unavailable(&self) -> Error {
        let state = self.manager.connection_state().as_str();
        let detail = self
            .manager
            .last_error()
            .map(|e| format!(": {e}"))
            .unwrap_or_default();
        Error::ManagerUnavailable(format!("connection {state}{detail}"))
    }

    /// Queues an Event about `obj` ([`events`]: published in order, off the reconcile path);
    /// failures are logged, never fatal.
    pub async fn event<K>(
        &self,
        obj: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) where
        K: Resource<DynamicType = ()>,
    {
        self.event_on(&obj.object_ref(&()), type_, reason, action, note)
            .await;
    }

    /// An Event about `reference`, which may name an object that no longer exists (the orphan
    /// sweep reports on owners that are gone).
    pub async fn event_on(
        &self,
        reference: &k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: action.into(),
            secondary: None,
        };
        self.events.publish(ev, reference.clone()).await;
    }
}
