//! Wiring: the mirror pump, the controllers, the engine snapshot and the debugging API.
//!
//! **Targeted wake-ups.** A Manager change wakes only the objects it concerns, so one node event
//! costs the reconciles of the bundles with a job there, not one per object:
//!
//! | Manager change | wakes |
//! |---|---|
//! | a job changed | its Bundle (held until the end of a pass of it running now, then unless it is that pass's own start coming up), its Migration in progress; the PlacementPool of the node (its used capacity moved) and that pool's HotSpareTargets; when an instance stopped, the bundles waiting for capacity in that pool |
//! | a start was refused | the job's Bundle |
//! | a node came, went or changed (inventory included) | bundles waiting on its pool, the pool's HotSpareTargets and PlacementPool, and the bundle or Migration it was provisioned for |
//! | a migration changed | the Migration driving it |
//! | a resync, or a lagged change stream | everything (rare) |
//!
//! Who waits where is kept in [`crate::state::WakeIndex`], written by the reconciles
//! themselves. Status echoes do not wake anything: each kind's watch passes only changes of
//! generation, annotations, finalizers or deletion ([`spec_changes`]).

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{Bundle, HotSpareTarget, ManagerNode, Migration, PlacementPool};
use automanager_placement as pl;
use automanager_policy::ids::BundleId;
use futures::{FutureExt, StreamExt, TryStreamExt};
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::scheduler::{ScheduleRequest, debounced_scheduler};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Resource, ResourceExt};
use manager_client::MirrorChange;
use tokio::sync::broadcast;
use tokio_stream::wrappers::{BroadcastStream, UnboundedReceiverStream};

use crate::controllers::{self, Context};
use crate::lean::Lean;
use crate::mapping;
use crate::state::SNAPSHOT_EVERY;

/// How long a stopping operator waits for its queued Events to be published.
const EVENT_FLUSH: Duration = Duration::from_secs(3);

/// The watch predicate every kind uses: an object is reconciled when its generation (spec),
/// annotations (the retry annotation), finalizers or deletion change, never for a status write
/// (ours or anyone's).
pub fn spec_changes<K: Resource>(obj: &K) -> Option<u64> {
    let meta = obj.meta();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    meta.generation.hash(&mut h);
    meta.deletion_timestamp.is_some().hash(&mut h);
    meta.finalizers.hash(&mut h);
    meta.annotations.hash(&mut h);
    Some(h.finish())
}

/// What one batch of mirror changes wakes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Wakes {
    /// Nodes whose engine entry must be re-read.
    pub nodes: HashSet<String>,
    /// Bundles (by Manager id) whose jobs changed.
    pub bundles: HashSet<String>,
    /// Of those, the bundles with a job now failed or stopped: they have a recovery to make.
    pub lost_jobs: HashSet<String>,
    /// Pools where capacity came or went (node changes, stopped instances).
    pub pools_capacity: HashSet<String>,
    /// Pools where a job changed (spares may have been taken).
    pub pools_jobs: HashSet<String>,
    /// Manager migration ids that changed.
    pub migrations: HashSet<String>,
    /// Jobs that changed (their Migrations in progress).
    pub jobs: HashSet<String>,
    /// Tags `automanager.provisioned-for` of nodes that changed.
    pub provisioned_for: HashSet<String>,
    /// Re-read and wake everything.
    pub everything: bool,
}

/// Sorts a batch of mirror changes into what they wake. Pure; `pool_of` names a node's pool.
pub fn classify(
    batch: &[MirrorChange],
    mirror: &manager_client::MirrorState,
    pool_of: impl Fn(&str) -> Option<String>,
) -> Wakes {
    let mut w = Wakes::default();
    for change in batch {
        match change {
            MirrorChange::NodeUpserted(n) => {
                w.nodes.insert(n.node_id.clone());
                w.pools_capacity.insert(n.pool.clone());
                if let Some(tag) = n.tags.get(mapping::PROVISIONED_FOR_TAG) {
                    w.provisioned_for.insert(tag.clone());
                }
            }
            MirrorChange::NodeRemoved { node_id } => {
                w.nodes.insert(node_id.clone());
                w.pools_capacity.extend(pool_of(node_id));
            }
            MirrorChange::InventoryUpdated(inv) => {
                w.nodes.insert(inv.node_id.clone());
                w.pools_capacity.extend(pool_of(&inv.node_id));
            }
            MirrorChange::JobUpserted(job) => {
                w.bundles.insert(job.bundle_id.clone());
                if matches!(
                    job.state(),
                    manager_proto::JobState::Failed | manager_proto::JobState::Stopped
                ) {
                    w.lost_jobs.insert(job.bundle_id.clone());
                }
                w.jobs.insert(job.job_id.clone());
                for i in &job.instances {
                    w.nodes.insert(i.node_id.clone());
                    let pool = pool_of(&i.node_id);
                    w.pools_jobs.extend(pool.clone());
                    if !i.holds_capacity() {
                        w.pools_capacity.extend(pool);
                    }
                }
                if !job.node_id.is_empty() {
                    w.nodes.insert(job.node_id.clone());
                }
            }
            MirrorChange::JobRemoved { job_id } => {
                w.jobs.insert(job_id.clone());
            }
            MirrorChange::JobRejected(r) => {
                if let Some(job) = mirror.jobs.get(&r.job_id) {
                    w.bundles.insert(job.bundle_id.clone());
                }
                w.jobs.insert(r.job_id.clone());
            }
            MirrorChange::MigrationUpdated(m) => {
                w.migrations.insert(m.migration_id.clone());
                w.jobs.insert(m.job_id.clone());
            }
            MirrorChange::MigrationRemoved { migration_id } => {
                w.migrations.insert(migration_id.clone());
            }
            MirrorChange::Resynced { .. } => w.everything = true,
            _ => {}
        }
    }
    w.nodes.retain(|n| !n.is_empty());
    w.pools_capacity.retain(|p| !p.is_empty());
    w.pools_jobs.retain(|p| !p.is_empty());
    w
}

fn bundle_ref(bundle_id: &str) -> Option<ObjectRef<Bundle>> {
    let id = BundleId::parse(bundle_id)?;
    let (ns, name) = id.object();
    Some(ObjectRef::new(name).within(ns))
}

/// Keeps the placement model in step with the mirror and turns mirror changes into targeted
/// wake-ups (see the module docs).
pub async fn run_mirror_pump(ctx: Arc<Context>) {
    let mut rx = ctx.manager.subscribe();
    ctx.manager.mirror().read(|m| ctx.state.sync_all(m));
    loop {
        let first = match rx.recv().await {
            Ok(c) => Some(c),
            Err(broadcast::error::RecvError::Lagged(n)) => {
                tracing::warn!(
                    missed = n,
                    "mirror change stream lagged; re-reading the whole mirror"
                );
                None
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        // Batch what is queued so a wave of events is one model update.
        let mut batch: Vec<MirrorChange> = first.into_iter().collect();
        let mut lagged = batch.is_empty();
        while batch.len() < 4096 {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(broadcast::error::TryRecvError::Lagged(_)) => lagged = true,
                Err(_) => break,
            }
        }
        // The losses and the pools of nodes the mirror dropped are read from the model before
        // it takes the batch in, all while the mirror is held at the batch.
        let (mut wakes, lost_zones) = ctx.manager.mirror().read(|m| {
            let lost_zones = controllers::zones::observe_losses(
                &batch,
                m,
                &ctx.state,
                |n| ctx.manager.asked_to_terminate(n),
                ctx.clock.now(),
            );
            let pool_of = |node: &str| {
                (m.nodes.get(node))
                    .map(|n| n.pool.clone())
                    .or_else(|| ctx.state.node_pool(node))
            };
            let wakes = classify(&batch, m, pool_of);
            if wakes.everything || lagged {
                ctx.state.sync_all(m);
            } else {
                ctx.state.sync_nodes(m, wakes.nodes.iter().cloned());
            }
            (wakes, lost_zones)
        });
        wakes.everything |= lagged;
        deliver(&ctx, &wakes);
        if !lost_zones.is_empty() {
            controllers::zones::announce(&ctx, lost_zones).await;
        }
    }
}

/// Sends the wake-ups of one batch.
fn deliver(ctx: &Context, w: &Wakes) {
    if w.everything {
        let _ = ctx.wake.everything.send(());
        let _ = ctx.wake.node_sync.try_send(());
        return;
    }
    // A bundle in a pass now gets the change when the pass ends, unless it is that pass's own
    // start coming up (see `WakeIndex::hold_for_pass`).
    let changed =
        (w.bundles.iter()).filter_map(|b| Some((bundle_ref(b)?, w.lost_jobs.contains(b))));
    for (r, loss) in ctx.state.bundle_jobs_changed(changed, ctx.clock.instant()) {
        ctx.wake.bundle(r, loss);
    }
    // `<bundle id>.r<replica>` or `migration.<id>`: whoever waits for that node.
    let mut provisioned_for_migrations = Vec::new();
    for tag in &w.provisioned_for {
        if let Some(id) = tag.strip_prefix("migration.") {
            provisioned_for_migrations.push(id);
        } else if let Some((bundle, _)) = tag.rsplit_once(".r")
            && let Some(r) = bundle_ref(bundle)
        {
            ctx.wake.bundle(r, true);
        }
    }
    for pool in &w.pools_capacity {
        ctx.wake_pool(pool);
    }
    for pool in w.pools_jobs.difference(&w.pools_capacity) {
        for t in ctx.state.spare_targets_of(pool) {
            let _ = ctx.wake.spare_targets.send(t);
        }
        // The pool's used capacity moved; its controller debounces a burst into one pass.
        ctx.wake_pool_controller(pool);
    }
    let manager_ids =
        (provisioned_for_migrations.into_iter()).chain(w.migrations.iter().map(String::as_str));
    let jobs = w.jobs.iter().map(String::as_str);
    for m in ctx.state.migrations_concerned(manager_ids, jobs) {
        let _ = ctx.wake.migrations.send(m);
    }
    if !w.nodes.is_empty() {
        let _ = ctx.wake.node_sync.try_send(());
    }
}

/// Drops what no controller reads before an object is kept: the apiserver's field-ownership
/// records and kubectl's copy of the last applied object, which together can be larger than the
/// rest of a Bundle and are held for every object of the fleet.
fn trim_for_store<K: Resource>(obj: &mut K) {
    obj.managed_fields_mut().clear();
    obj.annotations_mut()
        .remove("kubectl.kubernetes.io/last-applied-configuration");
}

/// A watch of `apis` that reflects every change into a store and passes on only spec changes
/// ([`spec_changes`]): a controller built on it is not woken by status echoes. Objects are
/// decoded [`Lean`]: their field-ownership records are skipped, not built and dropped.
///
/// Several `apis` (one per watched namespace) are watched side by side into the one store
/// ([`NamespacedStore`]), so the operator needs rights in those namespaces only.
fn spec_watch<K>(
    apis: Vec<Api<Lean<K>>>,
) -> (
    reflector::Store<K>,
    futures::stream::BoxStream<'static, Result<K, watcher::Error>>,
)
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (reader, writer) = reflector::store();
    let watch = |api: Api<Lean<K>>| {
        watcher(api, watcher::Config::default())
            .map_ok(unwrap_lean)
            .default_backoff()
            .modify(trim_for_store)
    };
    let applied = if apis.len() == 1 {
        let api = apis.into_iter().next().expect("one api");
        watch(api).reflect(writer).applied_objects().boxed()
    } else {
        let namespaces = apis
            .iter()
            .map(|a| a.namespace().unwrap_or_default().to_owned())
            .collect();
        let mut store = NamespacedStore::new(writer, namespaces);
        futures::stream::select_all(
            apis.into_iter()
                .enumerate()
                .map(|(i, api)| watch(api).map_ok(move |e| (i, e)).boxed()),
        )
        .flat_map(move |r| {
            futures::stream::iter(match r {
                Ok((i, event)) => store.apply(i, event).into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            })
        })
        .boxed()
    };
    let stream = applied
        .predicate_filter(spec_changes::<K>, Default::default())
        .boxed();
    (reader, stream)
}

/// One store fed by one watch per namespace. kube's reflector takes a watch's first list (and
/// every relist) as the whole store, so several watches cannot share a plain writer: one
/// namespace's relist would drop the others' objects. Here a relist replaces only its own
/// namespace's objects, and the store reads ready once every namespace's first list is in.
struct NamespacedStore<K: Resource<DynamicType = ()> + Clone + 'static> {
    writer: reflector::store::Writer<K>,
    /// Per watch, its namespace.
    namespaces: Vec<String>,
    /// Per watch: the list in progress (between `Init` and `InitDone`).
    listing: Vec<Option<Vec<K>>>,
    /// Per watch, until every first list is in: what it has seen so far, by name.
    first: Vec<Option<std::collections::BTreeMap<String, K>>>,
    ready: bool,
}

impl<K: Resource<DynamicType = ()> + Clone + 'static> NamespacedStore<K> {
    fn new(writer: reflector::store::Writer<K>, namespaces: Vec<String>) -> Self {
        let watches = namespaces.len();
        Self {
            writer,
            namespaces,
            listing: vec![None; watches],
            first: vec![None; watches],
            ready: false,
        }
    }

    /// Applies one event of watch `i`; returns the objects to pass on (as
    /// `applied_objects` would: every object applied or listed).
    fn apply(&mut self, i: usize, event: watcher::Event<K>) -> Vec<K> {
        use watcher::Event as E;
        match event {
            E::Init => {
                if let Some(l) = self.listing.get_mut(i) {
                    *l = Some(Vec::new());
                }
                Vec::new()
            }
            E::InitApply(k) => {
                if let Some(Some(l)) = self.listing.get_mut(i) {
                    l.push(k.clone());
                }
                vec![k]
            }
            E::InitDone => {
                let listed = self
                    .listing
                    .get_mut(i)
                    .and_then(Option::take)
                    .unwrap_or_default();
                if self.ready {
                    self.replace_namespace(i, listed);
                } else if let Some(f) = self.first.get_mut(i) {
                    *f = Some(listed.into_iter().map(|k| (k.name_any(), k)).collect());
                    self.publish_if_complete();
                }
                Vec::new()
            }
            E::Apply(k) => {
                if self.ready {
                    self.writer.apply_watcher_event(&E::Apply(k.clone()));
                } else if let Some(Some(f)) = self.first.get_mut(i) {
                    f.insert(k.name_any(), k.clone());
                }
                vec![k]
            }
            E::Delete(k) => {
                if self.ready {
                    self.writer.apply_watcher_event(&E::Delete(k));
                } else if let Some(Some(f)) = self.first.get_mut(i) {
                    f.remove(&k.name_any());
                }
                Vec::new()
            }
        }
    }

    /// Once every watch has listed, the store is filled in one go and reads ready.
    fn publish_if_complete(&mut self) {
        if !self.first.iter().all(Option::is_some) {
            return;
        }
        self.writer.apply_watcher_event(&watcher::Event::Init);
        for f in self.first.iter_mut() {
            for (_, k) in f.take().unwrap_or_default() {
                self.writer
                    .apply_watcher_event(&watcher::Event::InitApply(k));
            }
        }
        self.writer.apply_watcher_event(&watcher::Event::InitDone);
        self.ready = true;
    }

    /// A relist of one namespace: its objects are now `listed`, the others' stay.
    fn replace_namespace(&mut self, i: usize, listed: Vec<K>) {
        let Some(ns) = self.namespaces.get(i).cloned() else {
            return;
        };
        let keep: HashSet<String> = listed.iter().map(|k| k.name_any()).collect();
        for gone in self.writer.as_reader().state() {
            if gone.namespace().as_deref() == Some(ns.as_str()) && !keep.contains(&gone.name_any())
            {
                self.writer
                    .apply_watcher_event(&watcher::Event::Delete((*gone).clone()));
            }
        }
        for k in listed {
            self.writer.apply_watcher_event(&watcher::Event::Apply(k));
        }
    }
}

fn unwrap_lean<K>(event: watcher::Event<Lean<K>>) -> watcher::Event<K> {
    use watcher::Event as E;
    match event {
        E::Apply(Lean(k)) => E::Apply(k),
        E::Delete(Lean(k)) => E::Delete(k),
        E::Init => E::Init,
        E::InitApply(Lean(k)) => E::InitApply(k),
        E::InitDone => E::InitDone,
    }
}

/// How long a Bundle's settling wake-ups ([`controllers::Wakers::bundles`]) wait for more of
/// the same burst: a job's starting and running echoes, say, make one pass, not two.
const BUNDLE_SETTLE_DEBOUNCE: Duration = Duration::from_millis(100);

/// The Bundle controller's wake-ups: `soon` debounced by [`BUNDLE_SETTLE_DEBOUNCE`] (kube's
/// own scheduler, as a controller's `debounce` would), `now` (a recovery, or the capacity a
/// waiting bundle asked for) passed on at once. The controller still runs one pass of an
/// object at a time and folds a wake-up during it into one more pass.
pub fn bundle_wakes(
    soon: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Bundle>>,
    now: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Bundle>>,
) -> impl futures::Stream<Item = ObjectRef<Bundle>> + Send + 'static {
    let soon = debounced_scheduler(
        UnboundedReceiverStream::new(soon).map(|r| ScheduleRequest {
            message: r,
            run_at: tokio::time::Instant::now(),
        }),
        BUNDLE_SETTLE_DEBOUNCE,
    );
    futures::stream::select(UnboundedReceiverStream::new(now), soon)
}

fn everything(ctx: &Context) -> impl futures::Stream<Item = ()> + Send + 'static {
    BroadcastStream::new(ctx.wake.everything.subscribe()).filter_map(|r| async move { r.ok() })
}

/// The objects `apis` touch, one watch per API, merged (a trigger stream: no store).
fn watch_each<K>(
    apis: Vec<Api<K>>,
    config: &watcher::Config,
) -> impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    futures::stream::select_all(apis.into_iter().map(|api| {
        watcher(api, config.clone())
            .default_backoff()
            .touched_objects()
            .boxed()
    }))
}

/// Resolves once `shutdown` has and `store` has never synced; otherwise never. kube-runtime
/// holds a controller's runner until its store's first list is in, and a runner so held does not
/// end when its triggers do (kube-runtime 5, `Runner::poll_next`), so a graceful stop with a
/// hung apiserver would wait forever. A controller that never synced has no reconcile in flight:
/// ending its stream at once loses nothing.
async fn ended_if_never_synced<K>(
    shutdown: impl std::future::Future<Output = ()>,
    store: reflector::Store<K>,
) where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    shutdown.await;
    if matches!(store.wait_until_ready().now_or_never(), Some(Ok(()))) {
        std::future::pending::<()>().await;
    }
    tracing::info!(
        kind = %K::kind(&()),
        "stopping a controller whose first list never came back"
    );
}

/// What `shutdown`-aware controllers take: the signal, cloned into each.
trait Shutdown: std::future::Future<Output = ()> + Send + Sync + Clone + 'static {}
impl<F: std::future::Future<Output = ()> + Send + Sync + Clone + 'static> Shutdown for F {}

/// Runs every controller until `shutdown` resolves.
pub async fn run_controllers(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let Some(rx) = ctx.take_receivers() else {
        tracing::error!("controllers were started twice in one process");
        return;
    };
    let (bundles, bundles_known) =
        bundle_controller(&ctx, rx.bundles, rx.bundles_now, shutdown.clone());
    let pools = pool_controller(&ctx, rx.pools, shutdown.clone());
    let nodes = node_controller(&ctx, shutdown.clone());
    let (spares, spare_targets_known) = spare_controller(&ctx, rx.spare_targets, shutdown.clone());
    let (migrations, migrations_known) =
        migration_controller(&ctx, rx.migrations, shutdown.clone());
    let loops = Loops::spawn(
        &ctx,
        rx.node_sync,
        controllers::sweep::Owners {
            bundles: bundles_known,
            spare_targets: spare_targets_known,
            migrations: migrations_known,
        },
    );
    tokio::join!(bundles, pools, nodes, spares, migrations);
    // Decisions whose history is still queued: written now if the fence still allows it (a
    // shutdown), refused at once if not (a lost lease).
    if !ctx.history.flush(EVENT_FLUSH).await {
        tracing::warn!(
            bundles = ctx.history.pending(),
            "stopping with placement histories not yet written"
        );
    }
    loops.abort();
    // Events the last reconciles queued are what a person reads about them: publish them
    // before going. A fenced (deposed) operator's writes are refused anyway, so this is short.
    if !ctx.events.flush(EVENT_FLUSH).await {
        tracing::warn!(
            pending = ctx.events.pending(),
            "stopping with events not yet published"
        );
    }
}

/// The Bundle controller, and its store (the orphan sweep's list of owners).
fn bundle_controller(
    ctx: &Arc<Context>,
    soon: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Bundle>>,
    now: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Bundle>>,
    shutdown: impl Shutdown,
) -> (
    impl std::future::Future<Output = ()> + Send,
    reflector::Store<Bundle>,
) {
    let (store, events) = spec_watch(controllers::watched_apis::<Lean<Bundle>>(ctx));
    let known = store.clone();
    let synced = store.clone();
    let controller = Controller::for_stream(events, store)
        .with_config(
            // No debounce here: the wake-ups that may come in bursts are debounced in
            // `bundle_wakes`, so a recovery's are not.
            ControllerConfig::default().concurrency(ctx.settings.bundle_concurrency),
        )
        .reconcile_on(bundle_wakes(soon, now))
        .reconcile_all_on(everything(ctx))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            // The store holds the watched namespaces' Bundles only: a wake-up for another
            // operator's bundle (same Manager, other namespaces) finds nothing and is dropped.
            controllers::reconcile_finalized::<Bundle>,
            controllers::error_policy,
            ctx.clone(),
        )
        .take_until(ended_if_never_synced(shutdown, synced))
        .for_each(|_| futures::future::ready(()));
    (controller, known)
}

/// The PlacementPool controller; each reconcile first forgets pools that are gone.
fn pool_controller(
    ctx: &Arc<Context>,
    wakes: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<PlacementPool>>,
    shutdown: impl Shutdown,
) -> impl std::future::Future<Output = ()> + Send {
    let (store, events) = spec_watch(vec![Api::<Lean<PlacementPool>>::all(ctx.client.clone())]);
    let known = store.clone();
    let synced = store.clone();
    Controller::for_stream(events, store)
        .with_config(ControllerConfig::default().debounce(Duration::from_millis(500)))
        .reconcile_on(UnboundedReceiverStream::new(wakes))
        .reconcile_all_on(everything(ctx))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            move |p: Arc<PlacementPool>, ctx: Arc<Context>| {
                let existing: Vec<String> = known.state().iter().map(|p| p.name_any()).collect();
                async move {
                    controllers::pool::prune(&ctx, &existing);
                    controllers::pool::reconcile(p, ctx).await
                }
            },
            controllers::error_policy,
            ctx.clone(),
        )
        .take_until(ended_if_never_synced(shutdown, synced))
        .for_each(|_| futures::future::ready(()))
}

/// The ManagerNode controller. A migrate drain steps when one of its Migrations changes.
fn node_controller(
    ctx: &Arc<Context>,
    shutdown: impl Shutdown,
) -> impl std::future::Future<Output = ()> + Send {
    let (store, events) = spec_watch(vec![Api::<Lean<ManagerNode>>::all(ctx.client.clone())]);
    let synced = store.clone();
    Controller::for_stream(events, store)
        .watches_stream(
            watch_each(
                controllers::watched_apis::<Migration>(ctx),
                &watcher::Config::default().labels(automanager_api::DRAIN_NODE_LABEL),
            ),
            |m: Migration| {
                m.annotations()
                    .get(automanager_api::DRAIN_NODE_ANNOTATION)
                    .map(|node| ObjectRef::<ManagerNode>::new(node))
            },
        )
        .graceful_shutdown_on(shutdown.clone())
        .run(
            controllers::node::reconcile,
            controllers::error_policy,
            ctx.clone(),
        )
        .take_until(ended_if_never_synced(shutdown, synced))
        .for_each(|_| futures::future::ready(()))
}

/// The HotSpareTarget controller, and its store.
fn spare_controller(
    ctx: &Arc<Context>,
    wakes: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<HotSpareTarget>>,
    shutdown: impl Shutdown,
) -> (
    impl std::future::Future<Output = ()> + Send,
    reflector::Store<HotSpareTarget>,
) {
    let (store, events) = spec_watch(vec![Api::<Lean<HotSpareTarget>>::all(ctx.client.clone())]);
    let known = store.clone();
    let synced = store.clone();
    let controller = Controller::for_stream(events, store)
        .with_config(ControllerConfig::default().debounce(Duration::from_millis(200)))
        .reconcile_on(UnboundedReceiverStream::new(wakes))
        .reconcile_all_on(everything(ctx))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            controllers::reconcile_finalized::<HotSpareTarget>,
            controllers::error_policy,
            ctx.clone(),
        )
        .take_until(ended_if_never_synced(shutdown, synced))
        .for_each(|_| futures::future::ready(()));
    (controller, known)
}

/// The Migration controller, and its store.
fn migration_controller(
    ctx: &Arc<Context>,
    wakes: tokio::sync::mpsc::UnboundedReceiver<ObjectRef<Migration>>,
    shutdown: impl Shutdown,
) -> (
    impl std::future::Future<Output = ()> + Send,
    reflector::Store<Migration>,
) {
    let (store, events) = spec_watch(controllers::watched_apis::<Lean<Migration>>(ctx));
    let known = store.clone();
    let synced = store.clone();
    let controller = Controller::for_stream(events, store)
        .with_config(ControllerConfig::default().debounce(Duration::from_millis(20)))
        .reconcile_on(UnboundedReceiverStream::new(wakes))
        .reconcile_all_on(everything(ctx))
        .graceful_shutdown_on(shutdown.clone())
        .run(
            controllers::migration::reconcile,
            controllers::migration::error_policy,
            ctx.clone(),
        )
        .take_until(ended_if_never_synced(shutdown, synced))
        .for_each(|_| futures::future::ready(()));
    (controller, known)
}

/// The loops beside the controllers, for as long as the controllers run.
struct Loops(Vec<tokio::task::JoinHandle<()>>);

impl Loops {
    fn spawn(
        ctx: &Arc<Context>,
        node_sync: tokio::sync::mpsc::Receiver<()>,
        owners: controllers::sweep::Owners,
    ) -> Loops {
        let mut loops = vec![
            tokio::spawn(run_mirror_pump(ctx.clone())),
            tokio::spawn(controllers::node::run_mirror_sync(ctx.clone(), node_sync)),
            tokio::spawn(watch_connection(ctx.clone())),
            tokio::spawn(publish_snapshots(ctx.clone())),
            tokio::spawn(controllers::zones::run_zone_clock(ctx.clone())),
            tokio::spawn(controllers::reclaim::run_reclaim(ctx.clone())),
        ];
        if let Some((interval, grace)) = ctx.settings.orphan_sweep {
            loops.push(tokio::spawn(controllers::sweep::run_orphan_sweep(
                ctx.clone(),
                owners,
                interval,
                grace,
            )));
        }
        Loops(loops)
    }

    fn abort(self) {
        for l in self.0 {
            l.abort();
        }
    }
}

/// Keeps `automanager_manager_connection_state` equal to the Manager client's state, from the
/// moment the client exists until it is dropped: on every replica (a standby mirrors Manager
/// too) and while the leader still waits for its first sync.
pub async fn follow_connection_state(
    mut rx: tokio::sync::watch::Receiver<manager_client::ConnectionState>,
    metrics: crate::metrics::Metrics,
) {
    loop {
        metrics.set_connection_state(rx.borrow_and_update().as_str());
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Re-reads the mirror after a reconnect.
async fn watch_connection(ctx: Arc<Context>) {
    let mut rx = ctx.manager.state();
    loop {
        let state = *rx.borrow_and_update();
        if state == manager_client::ConnectionState::Ready {
            ctx.manager.mirror().read(|m| ctx.state.sync_all(m));
            let _ = ctx.wake.everything.send(());
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Refreshes the engine snapshot what-if reads, at most every [`SNAPSHOT_EVERY`] and only
/// when the engine changed.
async fn publish_snapshots(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(SNAPSHOT_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let retired = ctx.state.refresh_snapshot(&ctx.snapshot);
        drop(retired);
    }
}

/// `/debug/trace` and `/v1/what-if` answered from the operator's state.
pub struct DebugState(pub Arc<Context>);

impl crate::http::DebugApi for DebugState {
    fn trace(&self, namespace: &str, bundle: &str) -> Option<serde_json::Value> {
        // One entry cloned under the lock; the JSON is built after it is released.
        let per_replica = (self.0.state).trace(&(namespace.to_owned(), bundle.to_owned()))?;
        Some(serde_json::json!({
            "namespace": namespace,
            "bundle": bundle,
            "bundleId": mapping::bundle_id(namespace, bundle),
            "replicas": per_replica.iter().map(|(r, t)| {
                let mut v = serde_json::json!({"replica": r, "decidedAt": t.at, "recovery": t.recovery, "decision": t.decision});
                if let Some(p) = &t.preempted {
                    v["preempted"] = serde_json::json!(p);
                }
                v
            }).collect::<Vec<_>>(),
        }))
    }

    fn what_if(&self, bundle: &Bundle) -> serde_json::Value {
        let ns = bundle
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = bundle
            .metadata
            .name
            .clone()
            .unwrap_or_else(|| "what-if".into());
        let spec = mapping::bundle(&mapping::bundle_id(&ns, &name), &bundle.spec);
        let now = crate::controllers::now_ms(self.0.clock.now());
        // The dry run reads the published snapshot: it never holds the state lock.
        let engine = match self.0.snapshot.get() {
            Some(e) => e,
            None => {
                let retired = self.0.state.refresh_snapshot(&self.0.snapshot);
                drop(retired);
                self.0
                    .snapshot
                    .get()
                    .unwrap_or_else(|| Arc::new(pl::Engine::empty(0)))
            }
        };
        let (result, decisions) = pl::validate_admission_traced(&spec, &engine, now);
        // The admission result as before (`kind` ...), plus the dry run's decision per replica.
        let mut answer = serde_json::to_value(result).unwrap_or_default();
        if let Some(obj) = answer.as_object_mut() {
            obj.insert(
                "decisions".into(),
                serde_json::to_value(decisions).unwrap_or_default(),
            );
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use manager_proto as proto;

    /// The gauge follows the client from the first state on, whatever the replica's role: a
    /// Manager that cannot be reached reads `transientFailure`, never `idle`.
    #[tokio::test]
    async fn the_connection_gauge_follows_the_client_from_the_start() {
        use manager_client::ConnectionState;
        let metrics = crate::metrics::Metrics::new();
        let (tx, rx) = tokio::sync::watch::channel(ConnectionState::Connecting);
        let task = tokio::spawn(follow_connection_state(rx, metrics.clone()));
        let reads = |state: &str| {
            let m = metrics.clone();
            let line = format!("automanager_manager_connection_state{{state=\"{state}\"}} 1");
            async move {
                for _ in 0..500 {
                    if m.encode().contains(&line) {
                        return true;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                }
                false
            }
        };
        assert!(reads("connecting").await);
        tx.send_replace(ConnectionState::TransientFailure);
        assert!(reads("transientFailure").await);
        tx.send_replace(ConnectionState::Ready);
        assert!(reads("ready").await);
        drop(tx);
        task.await.expect("the follower ends with the client");
    }

    fn node(id: &str, pool: &str) -> proto::Node {
        proto::Node {
            node_id: id.into(),
            pool: pool.into(),
            ..Default::default()
        }
    }

    fn job(id: &str, bundle: &str, node: &str, state: proto::JobState) -> proto::Job {
        proto::Job {
            job_id: id.into(),
            bundle_id: bundle.into(),
            node_id: node.into(),
            instances: vec![proto::JobInstance {
                node_id: node.into(),
                state: state as i32,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_job_change_wakes_its_bundle_and_frees_capacity_only_when_it_stopped() {
        let m = manager_client::MirrorState::default();
        let pool_of = |n: &str| (n == "n1").then(|| "p".to_owned());
        let w = classify(
            &[MirrorChange::JobUpserted(job(
                "ns.b/0/j",
                "ns.b",
                "n1",
                proto::JobState::Running,
            ))],
            &m,
            pool_of,
        );
        assert_eq!(w.bundles, HashSet::from(["ns.b".to_owned()]));
        assert!(w.pools_capacity.is_empty(), "a start frees nothing");
        assert_eq!(w.pools_jobs, HashSet::from(["p".to_owned()]));
        let w = classify(
            &[MirrorChange::JobUpserted(job(
                "ns.b/0/j",
                "ns.b",
                "n1",
                proto::JobState::Stopped,
            ))],
            &m,
            pool_of,
        );
        assert_eq!(w.pools_capacity, HashSet::from(["p".to_owned()]));
        assert!(!w.everything);
    }

    #[test]
    fn a_job_that_failed_or_stopped_marks_its_bundle_as_having_a_recovery_to_make() {
        let m = manager_client::MirrorState::default();
        let with_state = |id: &str, bundle: &str, state: proto::JobState| {
            let mut j = job(id, bundle, "n1", state);
            j.state = state as i32;
            MirrorChange::JobUpserted(j)
        };
        let w = classify(
            &[
                with_state("ns.a/0/j", "ns.a", proto::JobState::Failed),
                with_state("ns.b/0/j", "ns.b", proto::JobState::Stopped),
                with_state("ns.c/0/j", "ns.c", proto::JobState::Running),
                with_state("ns.d/0/j", "ns.d", proto::JobState::Starting),
            ],
            &m,
            |_| None,
        );
        assert_eq!(w.bundles.len(), 4);
        assert_eq!(
            w.lost_jobs,
            HashSet::from(["ns.a".to_owned(), "ns.b".to_owned()])
        );
    }

    #[test]
    fn a_node_change_wakes_its_pool_and_whoever_it_was_provisioned_for() {
        let m = manager_client::MirrorState::default();
        let mut n = node("n9", "aws-east");
        n.tags
            .insert(mapping::PROVISIONED_FOR_TAG.into(), "ns.b.r1".into());
        let w = classify(&[MirrorChange::NodeUpserted(n)], &m, |_| None);
        assert_eq!(w.pools_capacity, HashSet::from(["aws-east".to_owned()]));
        assert_eq!(w.provisioned_for, HashSet::from(["ns.b.r1".to_owned()]));
        assert!(
            w.bundles.is_empty(),
            "no bundle is woken for a node as such"
        );
    }

    #[test]
    fn only_a_resync_wakes_everything() {
        let m = manager_client::MirrorState::default();
        let w = classify(
            &[MirrorChange::Resynced {
                revision: 1,
                reason: proto::SnapshotReason::Initial,
            }],
            &m,
            |_| None,
        );
        assert!(w.everything);
    }

    #[test]
    fn the_watch_predicate_ignores_status_and_resource_version() {
        let mut b = Bundle::new(
            "b",
            serde_json::from_value(serde_json::json!({
                "replicas": 1, "pools": ["p"],
                "jobs": [{"jobName": "j", "requirements": {"requiredCapacity": 1, "priorityBand": "gold"}}]
            }))
            .unwrap_or_else(|e| panic!("{e}")),
        );
        b.metadata.generation = Some(1);
        let before = spec_changes(&b);
        b.metadata.resource_version = Some("99".into());
        b.status = Some(Default::default());
        assert_eq!(spec_changes(&b), before, "a status write is not a change");
        b.metadata.annotations = Some([("automanager.norsk.io/retry".into(), "1".into())].into());
        assert_ne!(spec_changes(&b), before, "a retry annotation is");
        let annotated = spec_changes(&b);
        b.metadata.generation = Some(2);
        assert_ne!(spec_changes(&b), annotated, "a spec change is");
    }

    fn bundle(name: &str) -> ObjectRef<Bundle> {
        ObjectRef::new(name).within("live")
    }

    /// On tokio's paused clock: no test here waits on the wall clock.
    #[tokio::test(start_paused = true)]
    async fn a_recovery_wake_goes_at_once_and_settling_wakes_fold_after_the_debounce() {
        let (soon_tx, soon_rx) = tokio::sync::mpsc::unbounded_channel();
        let (now_tx, now_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut wakes = Box::pin(bundle_wakes(soon_rx, now_rx));
        let start = tokio::time::Instant::now();

        soon_tx.send(bundle("echoes")).expect("sent");
        now_tx.send(bundle("recovering")).expect("sent");
        assert_eq!(wakes.next().await, Some(bundle("recovering")));
        assert_eq!(tokio::time::Instant::now(), start, "no wait for a recovery");

        // More of the same burst within the debounce fold into one wake-up, which comes once
        // the burst has been quiet for the debounce.
        tokio::time::advance(Duration::from_millis(60)).await;
        soon_tx.send(bundle("echoes")).expect("sent");
        assert_eq!(wakes.next().await, Some(bundle("echoes")));
        assert_eq!(
            tokio::time::Instant::now() - start,
            Duration::from_millis(60) + BUNDLE_SETTLE_DEBOUNCE
        );
        drop((soon_tx, now_tx));
        assert_eq!(wakes.next().await, None, "no second wake-up for the burst");
    }

    fn cm(ns: &str, name: &str) -> k8s_openapi::api::core::v1::ConfigMap {
        let mut c = k8s_openapi::api::core::v1::ConfigMap::default();
        c.metadata.namespace = Some(ns.into());
        c.metadata.name = Some(name.into());
        c
    }

    fn names(store: &reflector::Store<k8s_openapi::api::core::v1::ConfigMap>) -> Vec<String> {
        let mut n: Vec<String> = store
            .state()
            .iter()
            .map(|c| format!("{}/{}", c.namespace().unwrap_or_default(), c.name_any()))
            .collect();
        n.sort();
        n
    }

    /// Two namespaces watched side by side fill one store: it reads ready once both have
    /// listed, and a relist of one replaces that namespace's objects only.
    #[test]
    fn watches_of_several_namespaces_share_one_store() {
        use watcher::Event as E;
        let (reader, writer) = reflector::store();
        let mut s = NamespacedStore::new(writer, vec!["news".into(), "sports".into()]);
        s.apply(0, E::Init);
        assert_eq!(s.apply(0, E::InitApply(cm("news", "a"))).len(), 1);
        s.apply(0, E::InitDone);
        // Between its first list and the other namespace's, a change of news is kept.
        s.apply(0, E::Apply(cm("news", "b")));
        assert!(reader.wait_until_ready().now_or_never().is_none());
        assert!(names(&reader).is_empty());
        s.apply(1, E::Init);
        s.apply(1, E::InitApply(cm("sports", "c")));
        s.apply(1, E::InitDone);
        assert!(matches!(
            reader.wait_until_ready().now_or_never(),
            Some(Ok(()))
        ));
        assert_eq!(names(&reader), ["news/a", "news/b", "sports/c"]);
        // news relists without b and with d: sports is untouched.
        s.apply(0, E::Init);
        s.apply(0, E::InitApply(cm("news", "a")));
        s.apply(0, E::InitApply(cm("news", "d")));
        assert_eq!(names(&reader), ["news/a", "news/b", "sports/c"]);
        s.apply(0, E::InitDone);
        assert_eq!(names(&reader), ["news/a", "news/d", "sports/c"]);
        // An empty relist of sports empties sports alone; watch events go on as usual.
        s.apply(1, E::Init);
        s.apply(1, E::InitDone);
        s.apply(0, E::Delete(cm("news", "a")));
        assert_eq!(s.apply(1, E::Apply(cm("sports", "e"))).len(), 1);
        assert_eq!(names(&reader), ["news/d", "sports/e"]);
    }
}
