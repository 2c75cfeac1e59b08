//! Recovery after a node event, with the runtime's own mirror pump waking Bundles and a worker
//! that runs their passes as the controller does (one pass at a time per bundle; a wake-up
//! during a pass schedules one more after it): how many passes each recovery takes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use automanager_api::{Bundle, BundlePhase, BundleStatus};
use automanager_operator::controllers;
use automanager_operator::runtime;
use kube::runtime::reflector::ObjectRef;
use manager_client::proto;
use tokio::sync::mpsc;

use super::{BOUND, Tier};

/// Passes per bundle, and the bundles whose pass runs now or is due.
#[derive(Default)]
struct Worker {
    passes: BTreeMap<String, u32>,
    /// Per bundle, each pass's result and the status it left.
    after: BTreeMap<String, Vec<(bool, Option<BundleStatus>)>>,
    running: BTreeSet<String>,
    again: BTreeSet<String>,
}

/// Runs the pump and a Bundle worker until dropped.
struct Runtime {
    worker: Arc<Mutex<Worker>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Runtime {
    fn start(t: &Tier) -> Runtime {
        let receivers = t.ctx.take_receivers().expect("the wake receivers");
        let worker = Arc::new(Mutex::new(Worker::default()));
        let pump = tokio::spawn(runtime::run_mirror_pump(t.ctx.clone()));
        let (done_tx, done_rx) = mpsc::unbounded_channel::<ObjectRef<Bundle>>();
        let dispatch = tokio::spawn(dispatch(
            t.clone_parts(),
            worker.clone(),
            // The runtime's own two lanes: settling wake-ups debounced, recoveries at once.
            Box::pin(runtime::bundle_wakes(
                receivers.bundles,
                receivers.bundles_now,
            )),
            done_tx,
            done_rx,
        ));
        Runtime {
            worker,
            tasks: vec![pump, dispatch],
        }
    }

    fn passes(&self) -> BTreeMap<String, u32> {
        self.worker.lock().unwrap().passes.clone()
    }

    /// The status bundle `name`'s first pass left, and whether it succeeded.
    fn first_pass(&self, name: &str) -> Option<(bool, Option<BundleStatus>)> {
        let w = self.worker.lock().unwrap();
        w.after.get(name).and_then(|a| a.first().cloned())
    }

    fn idle(&self) -> bool {
        let w = self.worker.lock().unwrap();
        w.running.is_empty() && w.again.is_empty()
    }
}

type Parts = (tier::apiserver::MemoryApiserver, Arc<controllers::Context>);

use super::tier;

impl Tier {
    fn clone_parts(&self) -> Parts {
        (self.api.clone(), self.ctx.clone())
    }
}

async fn dispatch(
    (api, ctx): Parts,
    worker: Arc<Mutex<Worker>>,
    mut wakes: std::pin::Pin<Box<dyn futures::Stream<Item = ObjectRef<Bundle>> + Send>>,
    done_tx: mpsc::UnboundedSender<ObjectRef<Bundle>>,
    mut done_rx: mpsc::UnboundedReceiver<ObjectRef<Bundle>>,
) {
    let run = |r: ObjectRef<Bundle>| {
        let (api, ctx, worker, done) = (api.clone(), ctx.clone(), worker.clone(), done_tx.clone());
        tokio::spawn(async move {
            let ns = r.namespace.clone().unwrap_or_default();
            if let Some(b) = api.get::<Bundle>(Some(&ns), &r.name) {
                let result = controllers::reconcile_finalized(Arc::new(b), ctx).await;
                let left = api.get::<Bundle>(Some(&ns), &r.name).and_then(|b| b.status);
                let mut w = worker.lock().unwrap();
                *w.passes.entry(r.name.clone()).or_default() += 1;
                let passes = w.after.entry(r.name.clone()).or_default();
                passes.push((result.is_ok(), left));
            }
            let _ = done.send(r);
        });
    };
    loop {
        tokio::select! {
            Some(r) = futures::StreamExt::next(&mut wakes) => {
                let mut w = worker.lock().unwrap();
                if w.running.contains(&r.name) {
                    w.again.insert(r.name.clone());
                } else {
                    w.running.insert(r.name.clone());
                    drop(w);
                    run(r);
                }
            }
            Some(r) = done_rx.recv() => {
                let mut w = worker.lock().unwrap();
                if w.again.remove(&r.name) {
                    drop(w);
                    run(r);
                } else {
                    w.running.remove(&r.name);
                }
            }
            else => return,
        }
    }
}

impl Tier {
    /// Bundles `name-<i>` of 2 replicas × 2 co-located silver jobs on onprem, as the scale
    /// bench makes them, placed and running.
    async fn fleet_of_bundles(&self, name: &str, count: usize) -> Vec<String> {
        let mut names = Vec::new();
        for i in 0..count {
            let n = format!("{name}-{i}");
            let mut b = Bundle::new(
                &n,
                serde_json::from_value(serde_json::json!({
                    "replicas": 2, "pools": ["onprem"], "jobs": [
                        {"jobName": "encode", "requirements": {"requiredCapacity": 3, "requiredCores": 1, "priorityBand": "silver"}},
                        {"jobName": "package", "requirements": {"requiredCapacity": 1, "requiredCores": 1, "priorityBand": "silver"}, "coLocateWith": ["encode"]}
                    ]
                }))
                .unwrap(),
            );
            b.metadata.namespace = Some("live".into());
            self.api.insert(&b);
            self.bundle_pass(&n).await.expect("the finalizer pass");
            self.bundle_pass(&n).await.expect("the placing pass");
            names.push(n);
        }
        self.until_mirror("every job runs", |m| {
            m.jobs
                .values()
                .filter(|j| j.state() == proto::JobState::Running)
                .count()
                == count * 4
        })
        .await;
        names
    }

    /// Those of `names` with a job on `node`, as their status records it.
    fn bundles_on<'n>(
        &'n self,
        names: &'n [String],
        node: &'n str,
    ) -> impl Iterator<Item = String> + 'n {
        names
            .iter()
            .filter(move |n| {
                let s = self.stored_bundle(n).status.unwrap_or_default();
                s.replicas
                    .iter()
                    .flat_map(|r| &r.jobs)
                    .any(|j| j.node_id.as_deref() == Some(node))
            })
            .cloned()
    }

    fn ready_off(&self, name: &str, node: &str) -> bool {
        ready_off(self.stored_bundle(name).status.as_ref(), node)
    }
}

/// Ready, with every job on a node other than `node`.
fn ready_off(status: Option<&BundleStatus>, node: &str) -> bool {
    status.is_some_and(|s| {
        s.phase == BundlePhase::Ready
            && s.replicas
                .iter()
                .flat_map(|r| &r.jobs)
                .all(|j| j.node_id.as_deref().is_some_and(|n| n != node))
    })
}

/// The scale bench's node event, small: bundles of two replicas of two co-located jobs lose
/// one node. Each recovery's first pass starts the replica elsewhere, waits for Manager to show
/// its starts running, and records the bundle Ready; its own starts coming up wake no second
/// pass. (A few bundles are no queue for the controller's slots, so no pass puts its status
/// off: `automanager_policy::recovery_first`.) (A recovery's jobs show `Failed` in the mirror until Manager's record of the start
/// arrives: that is no sign the start ran, and a pass that took it for one recorded `Placing`
/// and needed two more passes.)
#[tokio::test]
async fn each_bundle_recovers_from_a_lost_node_in_one_pass() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    let names = t.fleet_of_bundles("news", 6).await;
    let rt = Runtime::start(&t);
    let on_a1: Vec<String> = t.bundles_on(&names, "onprem-a1").collect();
    assert!(!on_a1.is_empty());

    t._sim
        .with_world(|w, now| w.kill_node("onprem-a1", now))
        .expect("killed");

    let deadline = tokio::time::Instant::now() + BOUND;
    while !(on_a1.iter().all(|n| t.ready_off(n, "onprem-a1")) && rt.idle()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never recovered: {:?}",
            rt.passes()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for n in &on_a1 {
        let (ok, left) = rt.first_pass(n).expect("a pass");
        assert!(ok, "{n}'s pass failed");
        assert!(
            ready_off(left.as_ref(), "onprem-a1"),
            "{n}'s first pass recorded it Ready elsewhere: {left:?}"
        );
    }
    let passes = rt.passes();
    assert!(
        on_a1.iter().all(|n| passes.get(n) == Some(&1)),
        "one pass per recovery: {passes:?}"
    );
    let others: Vec<&String> = passes.keys().filter(|n| !on_a1.contains(n)).collect();
    assert!(
        others.is_empty(),
        "bundles the node did not hold were left alone: {others:?}"
    );
}

/// A lost node's bundles are woken on the lane that skips the settling debounce: a recovery
/// starts as soon as the mirror shows the loss, while echoes of the same bundles' jobs
/// starting would wait for their burst to settle.
#[tokio::test]
async fn a_lost_nodes_bundles_are_woken_at_once_not_after_the_settling_debounce() {
    let t = Tier::start(|_| {}).await.with_example_pools().await;
    let names = t.fleet_of_bundles("news", 4).await;
    let on_a1: BTreeSet<String> = t.bundles_on(&names, "onprem-a1").collect();
    assert!(!on_a1.is_empty());
    let mut receivers = t.ctx.take_receivers().expect("the wake receivers");
    let pump = tokio::spawn(runtime::run_mirror_pump(t.ctx.clone()));

    t._sim
        .with_world(|w, now| w.kill_node("onprem-a1", now))
        .expect("killed");

    let mut now = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + BOUND;
    while now != on_a1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "woken at once: {now:?}, expected {on_a1:?}"
        );
        if let Ok(Some(r)) =
            tokio::time::timeout(Duration::from_millis(10), receivers.bundles_now.recv()).await
        {
            now.insert(r.name);
        }
    }
    pump.abort();
    let mut soon = BTreeSet::new();
    while let Ok(r) = receivers.bundles.try_recv() {
        soon.insert(r.name);
    }
    assert!(
        soon.is_disjoint(&on_a1),
        "a recovering bundle was also put on the settling lane: {soon:?}"
    );
}
