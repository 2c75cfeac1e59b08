//! Wiring: the mirror pump, the controllers, the HTTP server and leader election.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{Bundle, HotSpareTarget, ManagerNode, Migration, PlacementPool};
use automanager_placement as pl;
use futures::StreamExt;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use manager_client::MirrorChange;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::{BroadcastStream, ReceiverStream};

use crate::controllers::{self, Context, node::Drains};
use crate::mapping;

/// Keeps the placement model in step with the mirror and turns mirror changes into controller
/// triggers: a job change wakes its bundle; a node coming or going wakes every bundle (capacity
/// changed) and the ManagerNode sync.
pub async fn run_mirror_pump(
    ctx: Arc<Context>,
    bundle_refs: mpsc::Sender<ObjectRef<Bundle>>,
    node_wake: mpsc::Sender<()>,
) {
    let mut rx = ctx.manager.subscribe();
    ctx.manager.mirror().read(|m| ctx.model().sync_all(m));
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
        let mut full = batch.is_empty();
        while batch.len() < 4096 {
            match rx.try_recv() {
                Ok(c) => batch.push(c),
                Err(broadcast::error::TryRecvError::Lagged(_)) => full = true,
                Err(_) => break,
            }
        }
        let mut nodes: HashSet<String> = HashSet::new();
        let mut bundles: HashSet<String> = HashSet::new();
        let mut wake_all = full;
        for change in &batch {
            match change {
                MirrorChange::NodeUpserted(n) => {
                    nodes.insert(n.node_id.clone());
                    wake_all = true;
                }
                MirrorChange::NodeRemoved { node_id } => {
                    nodes.insert(node_id.clone());
                    wake_all = true;
                }
                MirrorChange::InventoryUpdated(inv) => {
                    nodes.insert(inv.node_id.clone());
                    wake_all = true;
                }
                MirrorChange::JobUpserted(job) => {
                    nodes.extend(job.instances.iter().map(|i| i.node_id.clone()));
                    if !job.node_id.is_empty() {
                        nodes.insert(job.node_id.clone());
                    }
                    bundles.insert(job.bundle_id.clone());
                }
                MirrorChange::JobRejected(r) => {
                    if let Some(bundle) = r.job_id.rsplitn(3, '/').nth(2) {
                        bundles.insert(bundle.to_owned());
                    }
                }
                // Migrations follow Manager's migration records (and their jobs' instances).
                MirrorChange::MigrationUpdated(_) => {
                    wake_all = true;
                }
                MirrorChange::Resynced { .. } => {
                    full = true;
                    wake_all = true;
                }
                _ => {}
            }
        }
        ctx.manager.mirror().read(|m| {
            let mut model = ctx.model();
            if full {
                model.sync_all(m);
            } else {
                model.sync_nodes(m, nodes.iter().cloned());
            }
        });
        for b in bundles {
            if let Some((ns, name)) = mapping::bundle_object(&b) {
                let _ = bundle_refs.try_send(ObjectRef::new(name).within(ns));
            }
        }
        if wake_all {
            let _ = ctx.bundle_trigger.send(());
        }
        if !nodes.is_empty() || full {
            let _ = node_wake.try_send(());
        }
    }
}

/// Runs every controller until `shutdown` resolves.
pub async fn run_controllers(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + Clone + 'static,
) {
    let client = ctx.client.clone();
    let (ref_tx, ref_rx) = mpsc::channel::<ObjectRef<Bundle>>(4096);
    let (wake_tx, wake_rx) = mpsc::channel::<()>(1);
    let drains = Arc::new(Drains::default());

    let bundles_api: Api<Bundle> = match ctx.settings.watch_namespaces.as_slice() {
        [one] => Api::namespaced(client.clone(), one),
        _ => Api::all(client.clone()),
    };
    let all_bundles =
        BroadcastStream::new(ctx.bundle_trigger.subscribe()).filter_map(|r| async move { r.ok() });
    let bundle_controller = Controller::new(bundles_api, watcher::Config::default())
        .with_config(
            ControllerConfig::default()
                .concurrency(ctx.settings.bundle_concurrency)
                .debounce(Duration::from_millis(100)),
        )
        .reconcile_on(ReceiverStream::new(ref_rx))
        .reconcile_all_on(all_bundles)
        .graceful_shutdown_on(shutdown.clone())
        .run(
            {
                let namespaces = ctx.settings.watch_namespaces.clone();
                move |b: Arc<Bundle>, ctx: Arc<Context>| {
                    let watched = namespaces.is_empty()
                        || b.metadata
                            .namespace
                            .as_ref()
                            .is_some_and(|n| namespaces.contains(n));
                    async move {
                        if !watched {
                            return Ok(kube::runtime::controller::Action::await_change());
                        }
                        controllers::bundle::reconcile(b, ctx).await
                    }
                }
            },
            controllers::bundle::error_policy,
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));

    let pool_controller = Controller::new(
        Api::<PlacementPool>::all(client.clone()),
        watcher::Config::default(),
    );
    let pool_store = pool_controller.store();
    let pools_on_change =
        BroadcastStream::new(ctx.bundle_trigger.subscribe()).filter_map(|r| async move { r.ok() });
    let pool_controller = pool_controller
        .with_config(ControllerConfig::default().debounce(Duration::from_millis(500)))
        .reconcile_all_on(pools_on_change)
        .graceful_shutdown_on(shutdown.clone())
        .run(
            move |p: Arc<PlacementPool>, ctx: Arc<Context>| {
                let existing: Vec<String> = pool_store
                    .state()
                    .iter()
                    .map(|p| kube::ResourceExt::name_any(p.as_ref()))
                    .collect();
                async move {
                    controllers::pool::prune(&ctx, &existing);
                    controllers::pool::reconcile(p, ctx).await
                }
            },
            controllers::pool::error_policy,
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));

    // A migrate drain steps when one of its Migrations changes.
    let drain_migrations: Api<Migration> = match ctx.settings.watch_namespaces.as_slice() {
        [one] => Api::namespaced(client.clone(), one),
        _ => Api::all(client.clone()),
    };
    let node_controller = Controller::new(
        Api::<ManagerNode>::all(client.clone()),
        watcher::Config::default(),
    )
    .watches(
        drain_migrations,
        watcher::Config::default().labels(automanager_api::DRAIN_NODE_LABEL),
        |m: Migration| {
            m.annotations()
                .get(automanager_api::DRAIN_NODE_ANNOTATION)
                .map(|node| ObjectRef::<ManagerNode>::new(node))
        },
    )
    .graceful_shutdown_on(shutdown.clone())
    .run(
        {
            let drains = drains.clone();
            move |n: Arc<ManagerNode>, ctx: Arc<Context>| {
                controllers::node::reconcile(n, ctx, drains.clone())
            }
        },
        controllers::node::error_policy,
        ctx.clone(),
    )
    .for_each(|_| futures::future::ready(()));

    let spares_on_change =
        BroadcastStream::new(ctx.bundle_trigger.subscribe()).filter_map(|r| async move { r.ok() });
    let created = Arc::new(controllers::hotspare::Created::default());
    let spare_controller = Controller::new(
        Api::<HotSpareTarget>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(ControllerConfig::default().debounce(Duration::from_millis(200)))
    .reconcile_all_on(spares_on_change)
    .graceful_shutdown_on(shutdown.clone())
    .run(
        move |t: Arc<HotSpareTarget>, ctx: Arc<Context>| {
            controllers::hotspare::reconcile(t, ctx, created.clone())
        },
        controllers::hotspare::error_policy,
        ctx.clone(),
    )
    .for_each(|_| futures::future::ready(()));

    let migrations_on_change =
        BroadcastStream::new(ctx.bundle_trigger.subscribe()).filter_map(|r| async move { r.ok() });
    let migrations_api: Api<Migration> = match ctx.settings.watch_namespaces.as_slice() {
        [one] => Api::namespaced(client.clone(), one),
        _ => Api::all(client.clone()),
    };
    let migration_controller = Controller::new(migrations_api, watcher::Config::default())
        .with_config(ControllerConfig::default().debounce(Duration::from_millis(20)))
        .reconcile_all_on(migrations_on_change)
        .graceful_shutdown_on(shutdown.clone())
        .run(
            controllers::migration::reconcile,
            controllers::migration::error_policy,
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));

    let pump = tokio::spawn(run_mirror_pump(ctx.clone(), ref_tx, wake_tx));
    let node_sync = tokio::spawn(controllers::node::run_mirror_sync(
        ctx.clone(),
        drains,
        wake_rx,
    ));
    let connection = tokio::spawn(watch_connection(ctx.clone()));
    tokio::join!(
        bundle_controller,
        pool_controller,
        node_controller,
        spare_controller,
        migration_controller
    );
    pump.abort();
    node_sync.abort();
    connection.abort();
}

/// Publishes Manager's connection state as a metric, and re-reads the mirror after a reconnect.
async fn watch_connection(ctx: Arc<Context>) {
    let mut rx = ctx.manager.state();
    loop {
        let state = *rx.borrow_and_update();
        ctx.metrics.set_connection_state(state.as_str());
        if state == manager_client::ConnectionState::Ready {
            ctx.manager.mirror().read(|m| ctx.model().sync_all(m));
            let _ = ctx.bundle_trigger.send(());
        }
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// `/debug/trace` and `/v1/what-if` answered from the operator's state.
pub struct DebugState(pub Arc<Context>);

impl crate::http::DebugApi for DebugState {
    fn trace(&self, namespace: &str, bundle: &str) -> Option<serde_json::Value> {
        let traces = self.0.traces();
        let per_replica = traces.get(&(namespace.to_owned(), bundle.to_owned()))?;
        Some(serde_json::json!({
            "namespace": namespace,
            "bundle": bundle,
            "bundleId": mapping::bundle_id(namespace, bundle),
            "replicas": per_replica.iter().map(|(r, t)| serde_json::json!({"replica": r, "decidedAt": t.at, "recovery": t.recovery, "decision": t.decision})).collect::<Vec<_>>(),
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
        let now = crate::controllers::now_ms(chrono::Utc::now());
        let (result, decisions) =
            pl::validate_admission_traced(&spec, self.0.model().engine(), now);
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
