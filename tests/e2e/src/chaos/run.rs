//! Runs chaos schedules against the real stack: one control plane, one sim and two operator
//! replicas (leader and standby, a 6 s lease) kept for the whole run, reset to the same known
//! state before every seed.
//!
//! The reset is what makes a replay faithful: both operators are `kill -9`ed; every Bundle,
//! Migration, PlacementHistory, ManagerNode, PlacementPool and HotSpareTarget is deleted with its
//! finalizers stripped, and the operators' Lease; the sim is started again with its state directory
//! emptied (every declared node back, no job, no bundle, a fresh start history and call
//! count); the pools are created again as the fleet declares them; both operators start and
//! the run waits until they are ready, every ManagerNode object exists and every pool counts
//! its nodes. Then the seed's wave is applied and its faults run at their times. What cannot be
//! replayed is the interleaving of the processes' own threads: the same seed sends the same
//! faults at the same offsets to the same targets, and the system answers as it does.
//!
//! While the faults run, a [`Monitor`] checks Manager on every change (duplicates, over-
//! capacity) and notes every cordon; an operator that exits (a lost lease) is started again at
//! once, as a Deployment would, unless the schedule holds it down. Once the last fault has
//! ended, the run polls [`observe`] + [`check`] until nothing is broken (at most [`SETTLE`]) and
//! prints one line per seed, and for a failing seed the schedule, every violation and the
//! logs' lines about the first lost Bundle; its logs are kept under `CHAOS_KEEP_DIR`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use manager_client::proto::manager_client::ManagerClient as ManagerApi1;
use manager_client::proto::{
    self as pb, CutStreamsRequest, DeleteBundleRequest, FailJobRequest, KillNodeRequest,
    NoticeNodeRequest, RegisterBundleRequest, StartJobRequest, StopJobRequest,
};
use manager_client::{ManagerClient, MirrorState};

use super::foreign::{self, PublishedForeign};
use super::ledger::{DeadlineBook, ForeignBook, InstanceView, JobView, NodeView, StopWhy, View};
use super::{
    ChaosConfig, FOREIGN_CAPACITY, Fault, ForeignBundle, Hold, JobRef, NAMESPACE, Phase, Replica,
    Schedule,
};
use crate::SetupError;
use crate::bench::fleet_sim_config;
use crate::reliability::{
    self, Monitor, Violations, check, explain_lost, observe, sim_admin, suite_settings,
};
use crate::stack::{ManagerApi, Proc, Stack, free_port, http_get_at, manager_view};

/// How long a seed may take to settle after its last fault: well over ten times the longest
/// settle seen on this fleet, short enough that a seed that never settles (a broken rule nothing
/// repairs) does not hold the run for long.
pub const SETTLE: Duration = Duration::from_secs(180);
/// The bound of any other wait (the machine may be shared and loaded).
const WAIT: Duration = Duration::from_secs(180);
/// The bound of one call to the apiserver or the sim while faults run.
const CALL: Duration = Duration::from_secs(30);
/// The operators' Lease, as the runner deletes it in the reset.
const LEASE_NAME: &str = "automanager-operator";

/// What a run does, from the environment.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub seeds: Vec<u64>,
    pub chaos: ChaosConfig,
    /// Where a failing seed's logs and schedule are kept.
    pub keep_dir: PathBuf,
}

fn env_u64(name: &str) -> Result<Option<u64>, SetupError> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| SetupError(format!("{name}={v:?} is not a whole number"))),
        _ => Ok(None),
    }
}

impl RunConfig {
    /// `CHAOS_SEED=s` replays seed `s` alone; otherwise `CHAOS_SEEDS` (default 10) seeds from
    /// `CHAOS_SEED_FROM` (default 1). `CHAOS_NODES` (52), `CHAOS_BUNDLES` (48) and
    /// `CHAOS_WINDOW_S` (30) size the fleet and the schedules (a replay needs the same);
    /// `CHAOS_KEEP_DIR` (default `.tmp/chaos` in the repository) keeps failing seeds' logs.
    pub fn from_env() -> Result<RunConfig, SetupError> {
        let seeds = match env_u64("CHAOS_SEED")? {
            Some(s) => vec![s],
            None => {
                let from = env_u64("CHAOS_SEED_FROM")?.unwrap_or(1);
                let n = env_u64("CHAOS_SEEDS")?.unwrap_or(10);
                (from..from.saturating_add(n)).collect()
            }
        };
        let nodes = env_u64("CHAOS_NODES")?.unwrap_or(52) as usize;
        let bundles = env_u64("CHAOS_BUNDLES")?.unwrap_or(48) as usize;
        let window_s = env_u64("CHAOS_WINDOW_S")?.unwrap_or(30);
        let keep_dir = std::env::var("CHAOS_KEEP_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| crate::repo_root().join(".tmp/chaos"));
        Ok(RunConfig {
            seeds,
            chaos: ChaosConfig::sized(nodes, bundles, window_s),
            keep_dir,
        })
    }
}

/// What one seed came to.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub seed: u64,
    pub faults: usize,
    pub violations: Violations,
    /// Migrations not ended and drains not done once settled (see [`unfinished_moves`]).
    pub unfinished: std::collections::BTreeSet<String>,
    /// Every stop, delete, restart or migration of the foreign client's work it did not ask for
    /// ([`ForeignBook`]).
    pub foreign_touched: BTreeSet<String>,
    /// Every job a reclaim notice's deadline caught on its node ([`DeadlineBook`]).
    pub deadline_misses: BTreeSet<String>,
    /// From the end of the last fault to the first check with nothing broken and every move
    /// ended (or to giving up).
    pub settle: Duration,
    /// The runner could not do what the schedule says (set-up, a reset): the seed failed
    /// without a verdict on the invariants.
    pub error: Option<String>,
    /// The whole seed, reset included.
    pub took: Duration,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.error.is_none()
            && self.violations.is_clean()
            && self.unfinished.is_empty()
            && self.foreign_touched.is_empty()
            && self.deadline_misses.is_empty()
    }

    /// `chaos seed=… faults=… duplicates=… lost=… overcapacity=… orphans=… rules=…
    /// disagreements=… settle_s=…`, then `cordon`, `unfinished`, `foreign_touched`,
    /// `deadline_misses`, `ok`, `took_s` and, last, any `error`.
    pub fn line(&self) -> String {
        let v = &self.violations;
        let mut line = format!(
            "chaos seed={} faults={} duplicates={} lost={} overcapacity={} orphans={} rules={} disagreements={} settle_s={:.1} cordon={} unfinished={} foreign_touched={} deadline_misses={} ok={} took_s={:.0}",
            self.seed,
            self.faults,
            v.duplicates.len(),
            v.lost.len(),
            v.overcapacity.len(),
            v.orphans.len(),
            v.rules.len(),
            v.disagreements.len(),
            self.settle.as_secs_f64(),
            v.placed_after_cordon.len(),
            self.unfinished.len(),
            self.foreign_touched.len(),
            self.deadline_misses.len(),
            self.ok(),
            self.took.as_secs_f64(),
        );
        if let Some(e) = &self.error {
            line.push_str(&format!(" error={}", e.replace('\n', " ")));
        }
        line
    }
}

/// The run's last line: seeds, failures, faults and every count summed.
pub fn summary(outcomes: &[Outcome], took: Duration) -> String {
    let sum = |f: &dyn Fn(&Violations) -> usize| -> usize {
        outcomes.iter().map(|o| f(&o.violations)).sum()
    };
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| o.seed.to_string())
        .collect();
    let settles: Vec<f64> = outcomes
        .iter()
        .filter(|o| o.error.is_none())
        .map(|o| o.settle.as_secs_f64())
        .collect();
    let max_settle = settles.iter().copied().fold(0.0, f64::max);
    let mean_settle = if settles.is_empty() {
        0.0
    } else {
        settles.iter().sum::<f64>() / settles.len() as f64
    };
    format!(
        "chaos summary seeds={} failed={} faults={} duplicates={} lost={} overcapacity={} orphans={} rules={} disagreements={} cordon={} unfinished={} foreign_touched={} deadline_misses={} errors={} settle_s_mean={mean_settle:.1} settle_s_max={max_settle:.1} took_s={:.0} failed_seeds={}",
        outcomes.len(),
        failed.len(),
        outcomes.iter().map(|o| o.faults).sum::<usize>(),
        sum(&|v| v.duplicates.len()),
        sum(&|v| v.lost.len()),
        sum(&|v| v.overcapacity.len()),
        sum(&|v| v.orphans.len()),
        sum(&|v| v.rules.len()),
        sum(&|v| v.disagreements.len()),
        sum(&|v| v.placed_after_cordon.len()),
        outcomes.iter().map(|o| o.unfinished.len()).sum::<usize>(),
        outcomes
            .iter()
            .map(|o| o.foreign_touched.len())
            .sum::<usize>(),
        outcomes
            .iter()
            .map(|o| o.deadline_misses.len())
            .sum::<usize>(),
        outcomes.iter().filter(|o| o.error.is_some()).count(),
        took.as_secs_f64(),
        if failed.is_empty() {
            "none".to_owned()
        } else {
            failed.join(",")
        },
    )
}

/// Runs every seed of `run` on one stack; prints a line per seed and the summary; returns the
/// outcomes. Fails only when the stack cannot be set up at all.
pub async fn run(run: &RunConfig) -> Result<Vec<Outcome>, SetupError> {
    let started = Instant::now();
    println!(
        "chaos run seeds={} first={} {} api={}",
        run.seeds.len(),
        run.seeds.first().copied().unwrap_or(0),
        run.chaos.describe(),
        api_name(ManagerApi::from_env())
    );
    let mut fleet = Fleet::start(&run.chaos).await?;
    let mut outcomes = Vec::new();
    for &seed in &run.seeds {
        let schedule = Schedule::generate(seed, &run.chaos);
        let seed_started = Instant::now();
        let mut outcome = match fleet.reset().await {
            Ok(()) => fleet.run_schedule(&schedule).await,
            Err(e) => {
                // A stack that cannot be reset is replaced by a fresh one for the next seed.
                eprintln!("chaos seed={seed}: the reset failed ({e}); starting a new stack");
                drop(fleet);
                fleet = Fleet::start(&run.chaos).await?;
                match fleet.reset().await {
                    Ok(()) => fleet.run_schedule(&schedule).await,
                    Err(e) => Outcome {
                        seed,
                        faults: schedule.events.len(),
                        violations: Violations::default(),
                        unfinished: Default::default(),
                        foreign_touched: Default::default(),
                        deadline_misses: Default::default(),
                        settle: Duration::ZERO,
                        error: Some(format!("reset: {e}")),
                        took: Duration::ZERO,
                    },
                }
            }
        };
        outcome.took = seed_started.elapsed();
        println!("{}", outcome.line());
        if !outcome.ok() {
            fleet.report_failure(&schedule, &outcome, run).await;
        }
        outcomes.push(outcome);
    }
    println!("{}", summary(&outcomes, started.elapsed()));
    Ok(outcomes)
}

/// The stack the seeds share.
struct Fleet {
    stack: Stack,
    config: ChaosConfig,
    state_dir: PathBuf,
    /// The second operator replica, and its HTTP base URL.
    standby: Option<Proc>,
    standby_http: String,
    /// Replicas the schedule holds down (between a kill and its restart).
    held: [bool; 2],
    /// The replica a leader pause froze.
    paused: Option<usize>,
    /// The seed's books (new for every seed).
    books: Books,
    /// The seed's foreign client, and its bundles' jobs by bundle.
    foreign: Option<ForeignClient>,
    foreign_jobs: BTreeMap<String, Vec<String>>,
    // Holds the sim's config and state directory; dropped after the stack.
    _dir: tempfile::TempDir,
}

/// A kube API for the dynamic objects of `K`, namespaced in [`NAMESPACE`] or cluster-wide.
fn api_of<K>(client: &kube::Client, namespaced: bool) -> Api<DynamicObject>
where
    K: kube::Resource<DynamicType = ()>,
{
    let resource = ApiResource::erase::<K>(&());
    if namespaced {
        Api::namespaced_with(client.clone(), NAMESPACE, &resource)
    } else {
        Api::all_with(client.clone(), &resource)
    }
}

/// `what` with a bound: its error, or "timed out".
async fn bounded<T, E: std::fmt::Display>(
    what: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(CALL, what).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {CALL:?}")),
    }
}

/// Server-side apply of `object` (a Bundle or a Migration) by the field manager `chaos`.
async fn apply_object(api: &Api<DynamicObject>, object: &serde_json::Value) -> Result<(), String> {
    let name = object["metadata"]["name"].as_str().unwrap_or_default();
    bounded(api.patch(
        name,
        &PatchParams::apply("chaos").force(),
        &Patch::Apply(object),
    ))
    .await
    .map(drop)
}

/// A JSON merge patch of `name`.
async fn merge(
    api: &Api<DynamicObject>,
    name: &str,
    patch: serde_json::Value,
) -> Result<(), String> {
    bounded(api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)))
        .await
        .map(drop)
}

/// Deletes `name`; gone already is fine.
async fn delete(api: &Api<DynamicObject>, name: &str) -> Result<(), String> {
    match tokio::time::timeout(CALL, api.delete(name, &DeleteParams::default())).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(kube::Error::Api(s))) if s.code == 404 => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("no answer within {CALL:?}")),
    }
}

/// Waits until `name` is gone, then creates `object` (a Bundle deleted a moment ago is held by
/// its finalizer until the operator has cleaned up).
async fn create_when_gone(api: Api<DynamicObject>, object: serde_json::Value) -> String {
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let deadline = Instant::now() + WAIT;
    loop {
        // Gone: create it. Still there, or no answer: look again.
        if let Ok(Ok(None)) = tokio::time::timeout(CALL, api.get_opt(&name)).await {
            let obj: DynamicObject = match serde_json::from_value(object.clone()) {
                Ok(o) => o,
                Err(e) => return format!("not an object: {e}"),
            };
            return match bounded(api.create(&PostParams::default(), &obj)).await {
                Ok(_) => "created again".to_owned(),
                Err(e) => format!("refused: {e}"),
            };
        }
        if Instant::now() > deadline {
            return format!("the old {name} was not gone within {WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Strips the finalizers of every object of `api` and deletes it; waits until none is left.
async fn wipe(api: &Api<DynamicObject>, what: &str) -> Result<(), SetupError> {
    let deadline = Instant::now() + WAIT;
    loop {
        let list = bounded(api.list(&ListParams::default()))
            .await
            .map_err(|e| SetupError(format!("listing {what}: {e}")))?;
        if list.items.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(SetupError(format!(
                "{} {what} still there after {WAIT:?}",
                list.items.len()
            )));
        }
        let names: Vec<(String, Option<String>)> = list
            .items
            .iter()
            .map(|o| {
                (
                    o.metadata.name.clone().unwrap_or_default(),
                    o.metadata.namespace.clone(),
                )
            })
            .collect();
        futures::stream::iter(names)
            .for_each_concurrent(8, |(name, _)| async move {
                let _ = merge(
                    api,
                    &name,
                    serde_json::json!({"metadata": {"finalizers": null}}),
                )
                .await;
                let _ = delete(api, &name).await;
            })
            .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The books of one seed, shared by the runner (the foreign client notes what it asks) and the
/// task that feeds them Manager's state.
#[derive(Clone, Default)]
struct Books {
    foreign: Arc<Mutex<ForeignBook>>,
    deadlines: Arc<Mutex<DeadlineBook>>,
}

impl Books {
    fn foreign(&self, f: impl FnOnce(&mut ForeignBook)) {
        if let Ok(mut b) = self.foreign.lock() {
            f(&mut b);
        }
    }

    fn observe_deadlines(&self, view: &View) {
        if let Ok(mut b) = self.deadlines.lock() {
            b.observe(view);
        }
    }

    fn observe_foreign(&self, view: &View) {
        self.foreign(|b| b.observe(view));
    }

    /// (foreign touches, deadline misses, noticed nodes judged, the foreign work shown).
    fn counts(&self) -> (BTreeSet<String>, BTreeSet<String>, usize, (usize, usize)) {
        let (touched, shown) = self
            .foreign
            .lock()
            .map(|b| (b.touched().clone(), b.shown()))
            .unwrap_or_default();
        let (misses, judged) = self
            .deadlines
            .lock()
            .map(|b| (b.misses().clone(), b.judged()))
            .unwrap_or_default();
        (touched, misses, judged, shown)
    }
}

fn stop_why(r: pb::StopReason) -> StopWhy {
    match r {
        pb::StopReason::Unspecified => StopWhy::None,
        pb::StopReason::Requested => StopWhy::Requested,
        pb::StopReason::NodeTerminated => StopWhy::NodeTerminated,
        pb::StopReason::NodeLost => StopWhy::NodeLost,
        pb::StopReason::BundleRemoved => StopWhy::BundleRemoved,
        pb::StopReason::Migrated => StopWhy::Migrated,
        pb::StopReason::MigrationAborted => StopWhy::MigrationAborted,
        pb::StopReason::HandedToRecovery => StopWhy::HandedToRecovery,
    }
}

/// The books' view of a mirror.
fn view_of(s: &MirrorState) -> View {
    View {
        nodes: s
            .nodes
            .values()
            .map(|n| NodeView {
                id: n.node_id.clone(),
                terminated: n.state() == pb::NodeState::Terminated,
                reclaim_at_ms: n.reclaim_at_ms,
            })
            .collect(),
        jobs: s
            .jobs
            .values()
            .map(|j| JobView {
                job_id: j.job_id.clone(),
                bundle_id: j.bundle_id.clone(),
                instances: j
                    .instances
                    .iter()
                    .map(|i| InstanceView {
                        node_id: i.node_id.clone(),
                        normal: i.is_normal(),
                        state: reliability::instance_state(i.state()),
                        started_at_ms: i.started_at_ms,
                        stop: stop_why(i.stop_reason()),
                    })
                    .collect(),
            })
            .collect(),
        bundles: s
            .bundles
            .values()
            .map(|b| (b.bundle_id.clone(), b.generation))
            .collect(),
    }
}

/// Feeds the books every revision of Manager's state until stopped: the deadlines from a
/// client seeing Manager as the operator does (its nodes, notices and jobs, in the stack's API),
/// the foreign work from Manager's side in that API: over our first API the same Watch (it shows
/// every bundle), over the published API a client of its own event stream, which shows every
/// stored job whoever made it ([`foreign::foreign_view`]).
struct LedgerWatch {
    client: ManagerClient,
    task: tokio::task::JoinHandle<()>,
    published: Option<(Arc<PublishedForeign>, tokio::task::JoinHandle<()>)>,
    books: Books,
}

impl LedgerWatch {
    async fn start(
        endpoint: &str,
        api: ManagerApi,
        books: Books,
    ) -> Result<LedgerWatch, SetupError> {
        let client = manager_view(endpoint, api).await?;
        client
            .wait_ready(WAIT)
            .await
            .map_err(|e| SetupError(format!("the sim's Watch did not sync: {e}")))?;
        let mirror = client.mirror().clone();
        let mut revisions = mirror.revisions();
        let fed = books.clone();
        let v1 = !api.published();
        let task = tokio::spawn(async move {
            loop {
                let view = mirror.read(view_of);
                fed.observe_deadlines(&view);
                if v1 {
                    fed.observe_foreign(&view);
                }
                // A few revisions at a time: the books judge each instance once, and Manager
                // keeps a stopped instance until its job starts again.
                tokio::time::sleep(Duration::from_millis(20)).await;
                if revisions.changed().await.is_err() {
                    return;
                }
            }
        });
        let published = if api.published() {
            let stream = PublishedForeign::connect(endpoint, WAIT)
                .await
                .map(Arc::new)
                .map_err(|e| SetupError(format!("the sim's event stream: {e}")))?;
            let mut changes = stream.subscribe();
            let (reader, fed) = (Arc::clone(&stream), books.clone());
            let task = tokio::spawn(async move {
                loop {
                    // Each job's whole history is in the view: a change missed while the
                    // books were busy is read with the next one.
                    fed.observe_foreign(&reader.view());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    match changes.recv().await {
                        Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    }
                }
            });
            Some((stream, task))
        } else {
            None
        };
        Ok(LedgerWatch {
            client,
            task,
            published,
            books,
        })
    }

    /// One last look, then the counts (see [`Books::counts`]).
    async fn stop(self) -> (BTreeSet<String>, BTreeSet<String>, usize, (usize, usize)) {
        self.task.abort();
        let view = self.client.mirror().read(view_of);
        self.books.observe_deadlines(&view);
        match &self.published {
            Some((stream, task)) => {
                task.abort();
                self.books.observe_foreign(&stream.view());
                stream.close().await;
            }
            None => self.books.observe_foreign(&view),
        }
        self.client.close().await;
        self.books.counts()
    }
}

/// The foreign client: over our first API its calls on a fresh channel each, over the
/// published API one client of its own ([`PublishedForeign`]). Ids are the schedule's; each is
/// sent and booked as [`foreign::wire_id`] says.
enum ForeignClient {
    V1 { endpoint: String },
    Published(PublishedForeign),
}

impl ForeignClient {
    async fn connect(endpoint: &str, api: ManagerApi) -> Result<ForeignClient, String> {
        if api.published() {
            Ok(ForeignClient::Published(
                PublishedForeign::connect(endpoint, WAIT).await?,
            ))
        } else {
            Ok(ForeignClient::V1 {
                endpoint: endpoint.to_owned(),
            })
        }
    }

    fn wire(&self, id: &str) -> String {
        foreign::wire_id(matches!(self, ForeignClient::Published(_)), id)
    }

    /// Starts `job` on `node`, noting it in `books` first.
    async fn start(&self, books: &Books, job: &str, node: &str) -> Result<(), String> {
        let job = self.wire(job);
        books.foreign(|b| b.asked_start(&job, node));
        let r = match self {
            ForeignClient::V1 { endpoint } => v1_foreign_start(endpoint, &job, node).await,
            ForeignClient::Published(p) => p.start(&job, node).await,
        };
        if r.is_err() {
            books.foreign(|b| b.start_refused(&job, node));
        }
        r
    }

    /// Stops `job` where it runs.
    async fn stop(&self, books: &Books, job: &str) -> Result<(), String> {
        let job = self.wire(job);
        match self {
            ForeignClient::V1 { endpoint } => {
                books.foreign(|b| b.asked_stop(&job));
                let r = async {
                    let mut m = manager_api(endpoint).await?;
                    bounded(m.stop_job(StopJobRequest {
                        job_id: job.clone(),
                        role: pb::JobRole::Normal as i32,
                        reason: pb::StopReason::Requested as i32,
                    }))
                    .await
                    .map(drop)
                }
                .await;
                if r.is_err() {
                    books.foreign(|b| b.stop_refused(&job));
                }
                r
            }
            ForeignClient::Published(p) => {
                // StopJob names the node: one the stream shows it on, or nothing to stop.
                let Some(node) = p.live_node(&job) else {
                    return Err(format!("{job} runs nowhere ({})", p.describe(&job)));
                };
                books.foreign(|b| b.asked_stop(&job));
                let r = p.stop(&job, &node).await;
                if r.is_err() {
                    books.foreign(|b| b.stop_refused(&job));
                }
                r
            }
        }
    }

    /// Deletes `bundle` (over the published API, which has no bundles: stops and deletes each
    /// of its jobs).
    async fn delete(&self, books: &Books, bundle: &str, jobs: &[String]) -> Result<(), String> {
        match self {
            ForeignClient::V1 { endpoint } => {
                books.foreign(|b| b.asked_delete(bundle));
                let mut m = manager_api(endpoint).await?;
                bounded(m.delete_bundle(DeleteBundleRequest {
                    bundle_id: bundle.to_owned(),
                }))
                .await
                .map(drop)
            }
            ForeignClient::Published(p) => {
                let mut errors = Vec::new();
                for job in jobs {
                    let id = self.wire(job);
                    books.foreign(|b| b.asked_delete(&id));
                    if p.live_node(&id).is_some()
                        && let Err(e) = self.stop(books, job).await
                    {
                        errors.push(format!("stopping {id}: {e}"));
                    }
                    if let Err(e) = p.delete(&id).await {
                        errors.push(format!("deleting {id}: {e}"));
                    }
                }
                if errors.is_empty() {
                    Ok(())
                } else {
                    Err(errors.join("; "))
                }
            }
        }
    }

    /// Stores every bundle (over the published API, every job) and starts each job on its node
    /// (a start refused is said, not an error: the schedule goes on without it).
    async fn start_all(&self, books: &Books, foreign: &[ForeignBundle]) -> Vec<String> {
        let mut notes = Vec::new();
        for b in foreign {
            let stored = match self {
                ForeignClient::V1 { endpoint } => v1_register(endpoint, books, b).await,
                ForeignClient::Published(p) => {
                    let mut r = Ok(());
                    for (name, _) in &b.jobs {
                        let id = self.wire(&b.job_id(name));
                        match p.create(&id).await {
                            Ok(()) => books.foreign(|book| book.registered_unseen(&id)),
                            Err(e) => r = Err(format!("{id}: {e}")),
                        }
                    }
                    r
                }
            };
            if let Err(e) = stored {
                notes.push(format!("foreign {}: not stored: {e}", b.id));
                continue;
            }
            for (name, node) in &b.jobs {
                if let Err(e) = self.start(books, &b.job_id(name), node).await {
                    notes.push(format!(
                        "foreign {}: not started on {node}: {e}",
                        b.job_id(name)
                    ));
                }
            }
        }
        notes
    }

    async fn close(&self) {
        if let ForeignClient::Published(p) = self {
            p.close().await;
        }
    }
}

/// A client of our first API at `endpoint`, for the foreign client.
async fn manager_api(endpoint: &str) -> Result<ManagerApi1<tonic::transport::Channel>, String> {
    let channel = reliability::sim_channel(endpoint, CALL, "Manager")
        .await
        .map_err(|e| e.to_string())?;
    Ok(ManagerApi1::new(channel))
}

/// Over our first API, the foreign client starts `job` on `node`.
async fn v1_foreign_start(endpoint: &str, job: &str, node: &str) -> Result<(), String> {
    let mut m = manager_api(endpoint).await?;
    let answer = bounded(m.start_job(StartJobRequest {
        job_id: job.to_owned(),
        node_id: node.to_owned(),
        role: pb::JobRole::Normal as i32,
    }))
    .await?
    .into_inner();
    if answer.accepted {
        Ok(())
    } else {
        Err(format!("the worker refused it: {}", answer.message))
    }
}

/// Over our first API, the foreign client registers bundle `b`.
async fn v1_register(endpoint: &str, books: &Books, b: &ForeignBundle) -> Result<(), String> {
    let bundle = pb::Bundle {
        bundle_id: b.id.clone(),
        replicas: 1,
        jobs: b
            .jobs
            .iter()
            .map(|(name, _)| pb::BundleJob {
                job_name: name.clone(),
                requirements: Some(pb::JobRequirements {
                    required_capacity: f64::from(FOREIGN_CAPACITY),
                    required_cores: 1,
                    priority_band: "silver".to_owned(),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        labels: [("client".to_owned(), "chaos-foreign".to_owned())].into(),
        ..Default::default()
    };
    let mut m = manager_api(endpoint).await?;
    let answer = bounded(m.register_bundle(RegisterBundleRequest {
        bundle: Some(bundle),
    }))
    .await?;
    let generation = answer.into_inner().bundle.map_or(0, |b| b.generation);
    books.foreign(|book| book.registered(&b.id, generation));
    Ok(())
}

/// A Migration of `job` named `name`, with `strategy` when given.
async fn create_migration(
    client: &kube::Client,
    name: &str,
    job: &JobRef,
    strategy: Option<&str>,
) -> Result<(), String> {
    let migrations = api_of::<automanager_api::Migration>(client, true);
    let mut spec = serde_json::json!({
        "job": {"bundle": job.bundle, "replica": job.replica, "jobName": job.job},
    });
    if let Some(s) = strategy {
        spec["strategy"] = serde_json::json!(s);
    }
    let object = serde_json::json!({
        "apiVersion": "automanager.norsk.io/v1alpha1",
        "kind": "Migration",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    });
    apply_object(&migrations, &object).await
}

/// Where Manager runs `job`'s normal instance now (starting or running).
async fn node_of(endpoint: &str, job: &JobRef) -> Result<Option<String>, String> {
    let state = reliability::manager_state(endpoint)
        .await
        .map_err(|e| e.to_string())?;
    Ok(state.jobs.get(&job.job_id()).and_then(|j| {
        j.instances
            .iter()
            .find(|i| {
                i.is_normal()
                    && matches!(
                        reliability::instance_state(i.state()),
                        reliability::InstanceState::Starting | reliability::InstanceState::Running
                    )
            })
            .map(|i| i.node_id.clone())
    }))
}

impl Fleet {
    async fn start(config: &ChaosConfig) -> Result<Fleet, SetupError> {
        let dir = tempfile::Builder::new()
            .prefix("automanager-chaos-")
            .tempdir()
            .map_err(|e| SetupError(e.to_string()))?;
        let sim_config = dir.path().join("manager-sim.yaml");
        std::fs::write(&sim_config, fleet_sim_config(&config.pools))
            .map_err(|e| SetupError(e.to_string()))?;
        let state_dir = dir.path().join("sim-state");
        let listen = format!("127.0.0.1:{}", free_port()?);
        let state = state_dir
            .to_str()
            .ok_or_else(|| SetupError("a temporary path that is not UTF-8".into()))?;
        let lease_s = config.lease_ms / 1000;
        let stack = Stack::start_custom(
            &sim_config,
            &["--no-job-socket", "--state-dir", state, "--listen", &listen],
            |c| {
                suite_settings(c);
                c.insert(
                    "leaderElection".into(),
                    serde_json::json!({"enabled": true, "leaseNamespace": NAMESPACE,
                        "leaseDuration": format!("{lease_s}s"), "renewEvery": "2s"}),
                );
            },
        )
        .await?;
        Ok(Fleet {
            stack,
            config: config.clone(),
            state_dir,
            standby: None,
            standby_http: String::new(),
            held: [false; 2],
            paused: None,
            books: Books::default(),
            foreign: None,
            foreign_jobs: BTreeMap::new(),
            _dir: dir,
        })
    }

    fn client(&self) -> kube::Client {
        self.stack.env.client()
    }

    /// Starts replica `i` (0: the stack's own operator, 1: the second replica).
    fn start_replica(&mut self, i: usize) -> Result<(), SetupError> {
        if i == 0 {
            self.stack.start_operator()
        } else {
            let kubeconfig = self.stack.operator_kubeconfig.clone();
            let (proc, http) = self.stack.start_replica("b", &kubeconfig)?;
            self.standby = Some(proc);
            self.standby_http = http;
            Ok(())
        }
    }

    fn replica(&mut self, i: usize) -> Option<&mut Proc> {
        if i == 0 {
            Some(&mut self.stack.operator)
        } else {
            self.standby.as_mut()
        }
    }

    fn running(&mut self, i: usize) -> bool {
        self.replica(i).is_some_and(Proc::running)
    }

    /// Starts again every replica that exited and is not held down, as a Deployment would.
    fn revive(&mut self) -> Vec<String> {
        let mut notes = Vec::new();
        for i in 0..2 {
            if self.held[i] || self.running(i) {
                continue;
            }
            let status = self
                .replica(i)
                .and_then(Proc::exit_status)
                .map_or_else(|| "killed".to_owned(), |s| s.to_string());
            match self.start_replica(i) {
                Ok(()) => notes.push(format!(
                    "replica {} exited ({status}); started again",
                    name(i)
                )),
                Err(e) => notes.push(format!("replica {} could not be started: {e}", name(i))),
            }
        }
        notes
    }

    /// The HTTP base of replica `i`.
    fn http(&self, i: usize) -> &str {
        if i == 0 {
            &self.stack.operator_http
        } else {
            &self.standby_http
        }
    }

    /// Whether replica `i` says it leads (`/readyz`), within 2 s.
    async fn leads(&self, i: usize) -> bool {
        let http = self.http(i).to_owned();
        if http.is_empty() {
            return false;
        }
        match tokio::time::timeout(Duration::from_secs(2), http_get_at(&http, "/readyz")).await {
            Ok(Ok((_, body))) => {
                serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|b| b["leader"] == true)
            }
            _ => false,
        }
    }

    /// The replica an operator fault hits: the leader, or the other one; when no replica says it
    /// leads, replica a stands for the leader.
    async fn resolve(&self, replica: Replica) -> (usize, &'static str) {
        let leader = if self.leads(0).await {
            Some(0)
        } else if self.leads(1).await {
            Some(1)
        } else {
            None
        };
        let i = match (replica, leader) {
            (Replica::Leader, Some(l)) => l,
            (Replica::Standby, Some(l)) => 1 - l,
            (Replica::Leader, None) => 0,
            (Replica::Standby, None) => 1,
        };
        (
            i,
            if leader.is_some() {
                ""
            } else {
                " (no replica led)"
            },
        )
    }

    /// Back to the known state every seed starts from (see the module's doc).
    async fn reset(&mut self) -> Result<(), SetupError> {
        // A paused apiserver or operator from an interrupted seed is resumed first.
        let _ = self.stack.env.resume_apiserver();
        self.stack.operator.kill9();
        if let Some(p) = self.standby.as_mut() {
            p.kill9();
        }
        self.held = [false; 2];
        self.paused = None;
        let client = self.client();
        use automanager_api::{
            Bundle, HotSpareTarget, ManagerNode, Migration, PlacementHistory, PlacementPool,
        };
        wipe(&api_of::<Migration>(&client, true), "Migrations").await?;
        wipe(&api_of::<Bundle>(&client, true), "Bundles").await?;
        // A Bundle's history is owned by it, but no garbage collector runs here: one left by
        // an earlier seed's Bundle of the same name names that Bundle as its owner.
        wipe(
            &api_of::<PlacementHistory>(&client, true),
            "PlacementHistories",
        )
        .await?;
        wipe(&api_of::<ManagerNode>(&client, false), "ManagerNodes").await?;
        wipe(&api_of::<PlacementPool>(&client, false), "PlacementPools").await?;
        wipe(&api_of::<HotSpareTarget>(&client, false), "HotSpareTargets").await?;
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(client.clone(), NAMESPACE);
        match tokio::time::timeout(CALL, leases.delete(LEASE_NAME, &DeleteParams::default())).await
        {
            Ok(Ok(_)) => {}
            Ok(Err(kube::Error::Api(s))) if s.code == 404 => {}
            Ok(Err(e)) => return Err(SetupError(format!("deleting the Lease: {e}"))),
            Err(_) => return Err(SetupError("deleting the Lease: no answer".into())),
        }
        // The sim as it starts: every declared node, nothing else.
        std::fs::create_dir_all(&self.state_dir).map_err(|e| SetupError(e.to_string()))?;
        let state_dir = self.state_dir.clone();
        self.stack.restart_sim(Some(&state_dir))?;
        self.drop_old_logs();
        let pools: String = self
            .config
            .pools
            .iter()
            .map(|p| format!("{}---\n", p.placement_pool("spread")))
            .collect();
        let out = self.stack.env.apply_yaml(&pools).await?;
        if !out.success() {
            return Err(SetupError(format!("applying the pools: {}", out.stderr)));
        }
        self.start_replica(0)?;
        self.start_replica(1)?;
        self.stack.wait_operator_ready(WAIT).await?;
        let http = self.standby_http.clone();
        let pools = self.config.pools.clone();
        let nodes = self.config.node_count();
        let stack = &self.stack;
        stack
            .wait_for("the second replica ready", WAIT, || {
                let http = http.clone();
                async move {
                    let (code, _) = http_get_at(&http, "/readyz").await?;
                    Ok((code == 200).then_some(()))
                }
            })
            .await?;
        stack
            .wait_for("every ManagerNode object and pool", WAIT, || {
                let pools = pools.clone();
                async move {
                    let objects = stack.get_json(&["managernodes"]).await?;
                    let count = objects["items"].as_array().map_or(0, Vec::len);
                    let mut counted = true;
                    for p in &pools {
                        let obj = stack.get_json(&["placementpool", &p.name]).await?;
                        counted &= obj["status"]["nodeCount"].as_u64() == Some(p.nodes as u64);
                    }
                    Ok((count == nodes && counted).then_some(()))
                }
            })
            .await?;
        Ok(())
    }

    /// Removes the logs of earlier seeds (a failing seed's were copied first), keeping the
    /// running sim's.
    fn drop_old_logs(&self) {
        let Ok(entries) = std::fs::read_dir(self.stack.dir.path()) else {
            return;
        };
        for path in entries.flatten().map(|e| e.path()) {
            let is_log = path.extension().is_some_and(|e| e == "log");
            let current_sim = path.file_name().is_some_and(|n| n == "manager-sim.log");
            if is_log && !current_sim {
                let _ = std::fs::remove_file(&path);
            }
        }
    }

    /// Applies the wave, runs every step at its time, settles and checks.
    async fn run_schedule(&mut self, schedule: &Schedule) -> Outcome {
        let seed = schedule.seed;
        let mut outcome = Outcome {
            seed,
            faults: schedule.events.len(),
            violations: Violations::default(),
            unfinished: Default::default(),
            foreign_touched: Default::default(),
            deadline_misses: Default::default(),
            settle: Duration::ZERO,
            error: None,
            took: Duration::ZERO,
        };
        let monitor = match Monitor::start_on(&self.stack).await {
            Ok(m) => m,
            Err(e) => {
                outcome.error = Some(format!("monitor: {e}"));
                return outcome;
            }
        };
        let cordons = monitor.cordons();
        self.books = Books::default();
        let ledger =
            match LedgerWatch::start(&self.stack.sim_endpoint, self.stack.api, self.books.clone())
                .await
            {
                Ok(l) => l,
                Err(e) => {
                    outcome.error = Some(format!("ledger: {e}"));
                    monitor.stop().await;
                    return outcome;
                }
            };
        let foreign = match ForeignClient::connect(&self.stack.sim_endpoint, self.stack.api).await {
            Ok(f) => f,
            Err(e) => {
                outcome.error = Some(format!("the foreign client: {e}"));
                monitor.stop().await;
                ledger.stop().await;
                return outcome;
            }
        };
        for note in foreign.start_all(&self.books, &schedule.foreign).await {
            eprintln!("chaos seed={seed} {note}");
        }
        self.foreign_jobs = schedule
            .foreign
            .iter()
            .map(|b| {
                let jobs = b.jobs.iter().map(|(name, _)| b.job_id(name)).collect();
                (b.id.clone(), jobs)
            })
            .collect();
        self.foreign = Some(foreign);
        let client = self.client();
        let bundles = api_of::<automanager_api::Bundle>(&client, true);
        let wave: Vec<serde_json::Value> = schedule
            .wave
            .iter()
            .map(|(name, spec)| spec.manifest(name))
            .collect();
        let refused: Vec<String> = futures::stream::iter(wave.iter())
            .map(|m| apply_object(&bundles, m))
            .buffer_unordered(8)
            .filter_map(|r| async move { r.err() })
            .collect()
            .await;
        if !refused.is_empty() {
            outcome.error = Some(format!("the wave was refused: {}", refused.join("; ")));
            monitor.stop().await;
            ledger.stop().await;
            self.close_foreign().await;
            return outcome;
        }
        let t0 = Instant::now();
        let mut background = Vec::new();
        let mut resolved: Vec<Option<usize>> = vec![None; schedule.events.len()];
        for step in schedule.steps() {
            let due = t0 + Duration::from_millis(step.at_ms);
            while Instant::now() < due {
                for note in self.revive() {
                    eprintln!(
                        "chaos seed={seed} +{:.2}s {note}",
                        t0.elapsed().as_secs_f64()
                    );
                }
                let left = due.saturating_duration_since(Instant::now());
                tokio::time::sleep(left.min(Duration::from_millis(200))).await;
            }
            let fault = &schedule.events[step.event].fault;
            let late = Instant::now().saturating_duration_since(due);
            let result = self
                .step(
                    fault,
                    step.phase,
                    &mut resolved[step.event],
                    &cordons,
                    &mut background,
                )
                .await;
            eprintln!(
                "chaos seed={seed} +{:.2}s{} {}{fault}: {result}",
                step.at_ms as f64 / 1000.0,
                if late > Duration::from_millis(500) {
                    format!(" (late {:.1}s)", late.as_secs_f64())
                } else {
                    String::new()
                },
                if step.phase == Phase::End {
                    "end of "
                } else {
                    ""
                },
            );
        }
        for task in background {
            let note = task.await.unwrap_or_else(|e| format!("task failed: {e}"));
            eprintln!("chaos seed={seed} background: {note}");
        }
        for note in self.revive() {
            eprintln!("chaos seed={seed} {note}");
        }
        let since = Instant::now();
        let (v, unfinished, err) = self.settle(seed, &schedule.holding()).await;
        outcome.settle = since.elapsed();
        outcome.unfinished = unfinished;
        let (seen, samples) = monitor.stop().await;
        let (touched, misses, judged, (foreign_shown, foreign_instances)) = ledger.stop().await;
        self.close_foreign().await;
        outcome.foreign_touched = touched;
        outcome.deadline_misses = misses;
        eprintln!(
            "chaos seed={seed}: the monitor took {samples} samples; {}; {judged} noticed nodes went; the foreign client's work showed {foreign_shown} stored and {foreign_instances} instances in Manager",
            self.moves().await
        );
        let mut v = v;
        v.merge(&seen);
        outcome.violations = v;
        outcome.error = err;
        outcome
    }

    async fn close_foreign(&mut self) {
        if let Some(f) = self.foreign.take() {
            f.close().await;
        }
    }

    /// Polls the invariants until nothing is broken and every Migration and drain has ended,
    /// or [`SETTLE`] has passed, starting again any operator that exits meanwhile.
    async fn settle(
        &mut self,
        seed: u64,
        holding: &BTreeMap<String, Hold>,
    ) -> (
        Violations,
        std::collections::BTreeSet<String>,
        Option<String>,
    ) {
        let start = Instant::now();
        let mut last = (Violations::default(), Default::default(), None);
        loop {
            for note in self.revive() {
                eprintln!("chaos seed={seed} settling: {note}");
            }
            let moves = async {
                let migrations = self
                    .stack
                    .get_json(&["migrations", "-n", NAMESPACE])
                    .await?;
                let nodes = self.stack.get_json(&["managernodes"]).await?;
                Ok::<_, SetupError>((migrations, nodes))
            };
            match (observe(&self.stack).await, moves.await) {
                (Ok(world), Ok((migrations, nodes))) => {
                    let unfinished = unfinished_moves(&migrations, &nodes, &world, holding);
                    let v = check(&world);
                    if v.is_clean() && unfinished.is_empty() {
                        eprintln!("chaos seed={seed}: settled: {}", census(&world));
                        return (v, unfinished, None);
                    }
                    last = (v, unfinished, None);
                }
                (Err(e), _) | (_, Err(e)) => last.2 = Some(format!("observing the stack: {e}")),
            }
            if start.elapsed() > SETTLE {
                return last;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// How the seed's Migrations and drains ended, for the log: the Migrations by phase, and
    /// the drains completed of those started.
    async fn moves(&self) -> String {
        let mut phases: std::collections::BTreeMap<String, usize> = Default::default();
        if let Ok(list) = self.stack.get_json(&["migrations", "-n", NAMESPACE]).await {
            for m in list["items"].as_array().into_iter().flatten() {
                let phase = m["status"]["phase"].as_str().unwrap_or("none").to_owned();
                *phases.entry(phase).or_default() += 1;
            }
        }
        let (mut drains, mut drained) = (0, 0);
        if let Ok(list) = self.stack.get_json(&["managernodes"]).await {
            for n in list["items"].as_array().into_iter().flatten() {
                if n["spec"]["drain"].is_object() {
                    drains += 1;
                    drained += usize::from(n["status"]["drain"]["completedAt"].is_string());
                }
            }
        }
        format!("Migrations {phases:?}; drains completed {drained} of {drains} still listed")
    }

    /// Does one step of a fault; what happened, for the log.
    async fn step(
        &mut self,
        fault: &Fault,
        phase: Phase,
        resolved: &mut Option<usize>,
        cordons: &reliability::CordonLog,
        background: &mut Vec<tokio::task::JoinHandle<String>>,
    ) -> String {
        let client = self.client();
        let bundles = api_of::<automanager_api::Bundle>(&client, true);
        let nodes = api_of::<automanager_api::ManagerNode>(&client, false);
        let said = |r: Result<(), String>| match r {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("refused: {e}"),
        };
        let endpoint = self.stack.sim_endpoint.clone();
        let admin = || async { sim_admin(&endpoint).await.map_err(|e| e.to_string()) };
        let notice = |node: String, in_ms: u64| async move {
            let mut a = admin().await?;
            bounded(a.notice_node(NoticeNodeRequest {
                node_id: node,
                in_ms,
                reason: "chaos".into(),
            }))
            .await
            .map(drop)
        };
        let kill = |node: String| async move {
            let mut a = admin().await?;
            bounded(a.kill_node(KillNodeRequest { node_id: node }))
                .await
                .map(drop)
        };
        let books = self.books.clone();
        match (fault, phase) {
            (Fault::Notice { node, in_ms }, _)
            | (Fault::DrainNotice { node, in_ms, .. }, Phase::End) => {
                said(notice(node.clone(), *in_ms).await)
            }
            (Fault::MigrateNotice { name, job, .. }, Phase::Start) => {
                said(create_migration(&client, name, job, None).await)
            }
            (Fault::MigrateNotice { job, in_ms, .. }, Phase::End) => {
                match node_of(&endpoint, job).await {
                    Ok(Some(node)) => {
                        format!("{node}: {}", said(notice(node.clone(), *in_ms).await))
                    }
                    Ok(None) => "no node to notice: the job runs nowhere".to_owned(),
                    Err(e) => format!("refused: {e}"),
                }
            }
            (Fault::DeletePool { pool, .. }, Phase::Start) => {
                let pools = api_of::<automanager_api::PlacementPool>(&client, false);
                said(delete(&pools, pool).await)
            }
            (Fault::DeletePool { node, .. }, Phase::End) => said(kill(node.clone()).await),
            (Fault::ForeignStop { job }, _) => match &self.foreign {
                Some(f) => said(f.stop(&books, job).await),
                None => "no foreign client".to_owned(),
            },
            (Fault::ForeignStart { job, node }, _) => match &self.foreign {
                Some(f) => said(f.start(&books, job, node).await),
                None => "no foreign client".to_owned(),
            },
            (Fault::ForeignDelete { bundle }, _) => match &self.foreign {
                Some(f) => {
                    let jobs = self.foreign_jobs.get(bundle).cloned().unwrap_or_default();
                    said(f.delete(&books, bundle, &jobs).await)
                }
                None => "no foreign client".to_owned(),
            },
            (Fault::KillNode { node }, _) => said(
                async {
                    let mut a = admin().await?;
                    bounded(a.kill_node(KillNodeRequest {
                        node_id: node.clone(),
                    }))
                    .await
                    .map(drop)
                }
                .await,
            ),
            (Fault::KillZone { nodes: ids, .. }, _) => match admin().await {
                Ok(a) => {
                    let kills = ids.iter().map(|id| {
                        let mut a = a.clone();
                        let node_id = id.clone();
                        async move { bounded(a.kill_node(KillNodeRequest { node_id })).await }
                    });
                    let failed = futures::future::join_all(kills)
                        .await
                        .into_iter()
                        .filter(Result::is_err)
                        .count();
                    format!("{} of {} nodes killed", ids.len() - failed, ids.len())
                }
                Err(e) => format!("refused: {e}"),
            },
            (Fault::CutStreams, _) => said(
                async {
                    let mut a = admin().await?;
                    bounded(a.cut_streams(CutStreamsRequest {})).await.map(drop)
                }
                .await,
            ),
            (Fault::FailJob { job }, _) => said(
                async {
                    let mut a = admin().await?;
                    bounded(a.fail_job(FailJobRequest {
                        job_id: job.job_id(),
                        message: "chaos: the job crashed".into(),
                    }))
                    .await
                    .map(drop)
                }
                .await,
            ),
            (Fault::RestartSim { .. }, Phase::Start) => {
                self.stack.sim.kill9();
                "sim killed".to_owned()
            }
            (Fault::RestartSim { wipe, .. }, Phase::End) => {
                let state_dir = self.state_dir.clone();
                if *wipe {
                    let _ = std::fs::create_dir_all(&state_dir);
                    // The foreign client's work goes with Manager's state.
                    books.foreign(ForeignBook::wiped);
                }
                match self.stack.restart_sim(wipe.then_some(state_dir.as_path())) {
                    Ok(()) => "sim started again".to_owned(),
                    Err(e) => format!("refused: {e}"),
                }
            }
            (Fault::KillOperator { replica, .. }, Phase::Start) => {
                let (i, how) = self.resolve(*replica).await;
                *resolved = Some(i);
                self.held[i] = true;
                if let Some(p) = self.replica(i) {
                    p.kill9();
                }
                format!("replica {} killed{how}", name(i))
            }
            (Fault::KillOperator { .. }, Phase::End) => {
                if let Some(i) = resolved.take() {
                    self.held[i] = false;
                }
                self.revive().join("; ")
            }
            (Fault::PauseLeader { .. }, Phase::Start) => {
                let (i, how) = self.resolve(Replica::Leader).await;
                let r = self.replica(i).map_or(Err("not running".to_owned()), |p| {
                    p.pause_signal("STOP").map_err(|e| e.to_string())
                });
                if r.is_ok() {
                    self.paused = Some(i);
                }
                format!("replica {}{how}: {}", name(i), said(r))
            }
            (Fault::PauseLeader { .. }, Phase::End) => match self.paused.take() {
                Some(i) => said(self.replica(i).map_or(Err("gone".to_owned()), |p| {
                    p.pause_signal("CONT").map_err(|e| e.to_string())
                })),
                None => "nothing paused".to_owned(),
            },
            (Fault::PauseApiserver { .. }, Phase::Start) => {
                said(self.stack.env.pause_apiserver().map_err(|e| e.to_string()))
            }
            (Fault::PauseApiserver { .. }, Phase::End) => {
                said(self.stack.env.resume_apiserver().map_err(|e| e.to_string()))
            }
            (Fault::RestartApiserver, _) => {
                let started = Instant::now();
                let r = self
                    .stack
                    .env
                    .restart_apiserver(WAIT)
                    .await
                    .map_err(|e| e.to_string());
                format!("{} ({:.1}s)", said(r), started.elapsed().as_secs_f64())
            }
            (Fault::UpdateBundle { name, spec } | Fault::CreateBundle { name, spec }, _) => {
                said(apply_object(&bundles, &spec.manifest(name)).await)
            }
            (Fault::DeleteBundle { name }, _) => said(delete(&bundles, name).await),
            (Fault::RecreateBundle { name, .. }, Phase::Start) => {
                said(delete(&bundles, name).await)
            }
            (Fault::RecreateBundle { name, spec, .. }, Phase::End) => {
                background.push(tokio::spawn(create_when_gone(
                    bundles.clone(),
                    spec.manifest(name),
                )));
                "creating it once the old one is gone".to_owned()
            }
            (
                Fault::Migrate {
                    name,
                    job,
                    strategy,
                },
                _,
            ) => said(create_migration(&client, name, job, *strategy).await),
            (Fault::Drain { node, mode }, _)
            | (Fault::DrainNotice { node, mode, .. }, Phase::Start) => {
                let r = merge(
                    &nodes,
                    node,
                    serde_json::json!({"spec": {"drain": {"mode": mode.as_str()}}}),
                )
                .await;
                if r.is_ok() {
                    cordons.note(node, true, reliability::now_ms());
                }
                said(r)
            }
            (Fault::Cordon { node, .. }, phase) => {
                let on = phase == Phase::Start;
                let r = merge(&nodes, node, serde_json::json!({"spec": {"cordoned": on}})).await;
                if r.is_ok() {
                    cordons.note(node, on, reliability::now_ms());
                }
                said(r)
            }
            (Fault::PoolEdit { pool, packing }, _) => {
                let pools = api_of::<automanager_api::PlacementPool>(&client, false);
                said(
                    merge(
                        &pools,
                        pool,
                        serde_json::json!({"spec": {"packingStrategy": packing}}),
                    )
                    .await,
                )
            }
        }
    }

    /// Prints what a failing seed needs to be read: the schedule, every violation, the replay
    /// command and the logs' lines about the first lost Bundle; keeps its logs and its objects.
    async fn report_failure(&self, schedule: &Schedule, outcome: &Outcome, run: &RunConfig) {
        eprintln!("{schedule}");
        eprintln!(
            "chaos seed={} failed:\n{}{}{}{}",
            outcome.seed,
            outcome.violations.details(),
            unfinished_lines(&outcome.unfinished),
            counted_lines(outcome),
            outcome.error.as_deref().unwrap_or_default()
        );
        eprintln!(
            "replay: {}={} CHAOS_SEED={} CHAOS_NODES={} CHAOS_BUNDLES={} CHAOS_WINDOW_S={} make test-chaos",
            crate::stack::MANAGER_API_ENV,
            api_name(self.stack.api),
            outcome.seed,
            run.chaos.node_count(),
            run.chaos.bundles,
            run.chaos.window_ms / 1000
        );
        explain_lost(&self.stack, &outcome.violations).await;
        let keep = run.keep_dir.join(format!("seed-{}", outcome.seed));
        if let Err(e) = keep_logs(self.stack.dir.path(), &keep, schedule, outcome) {
            eprintln!("chaos: the logs were not kept: {e}");
        } else {
            eprintln!("chaos: logs kept in {}", keep.display());
        }
        // The objects as the seed left them: what their statuses and conditions said.
        for (file, what) in [
            ("bundles.json", &["bundles", "-n", NAMESPACE][..]),
            ("migrations.json", &["migrations", "-n", NAMESPACE][..]),
            ("placementpools.json", &["placementpools"][..]),
            ("managernodes.json", &["managernodes"][..]),
        ] {
            let kept = match self.stack.get_json(what).await {
                Ok(v) => serde_json::to_string_pretty(&v)
                    .map_err(|e| e.to_string())
                    .and_then(|t| std::fs::write(keep.join(file), t).map_err(|e| e.to_string())),
                Err(e) => Err(e.to_string()),
            };
            if let Err(e) = kept {
                eprintln!("chaos: {file} was not kept: {e}");
            }
        }
    }
}

/// Copies every log of `from` into `to`, with the schedule and the violations beside them.
fn keep_logs(
    from: &Path,
    to: &Path,
    schedule: &Schedule,
    outcome: &Outcome,
) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for path in std::fs::read_dir(from)?.flatten().map(|e| e.path()) {
        if path.extension().is_some_and(|e| e == "log")
            && let Some(name) = path.file_name()
        {
            std::fs::copy(&path, to.join(name))?;
        }
    }
    std::fs::write(to.join("schedule.txt"), schedule.to_string())?;
    std::fs::write(
        to.join("violations.txt"),
        format!(
            "{}\n{}{}{}{}\n",
            outcome.line(),
            outcome.violations.details(),
            unfinished_lines(&outcome.unfinished),
            counted_lines(outcome),
            outcome.error.as_deref().unwrap_or_default()
        ),
    )
}

/// The phases a Migration ends in.
const ENDED: [&str; 5] = ["Completed", "Aborted", "Refused", "Rejected", "Failed"];

/// What has not finished moving, from `kubectl get migrations` and `kubectl get managernodes`
/// (JSON lists): every Migration not in an ending phase (with its reason), and every drain of a
/// node still started whose `status.drain.completedAt` is not set. A drain of a node that was
/// killed or terminated meanwhile has nothing left to move. A Migration its bundle's budget
/// holds for good ([`held_by_a_dropped_replica`]) has its answer and is not counted, nor is a
/// move the schedule's own holds keep waiting ([`held_by_its_bundle`]): a Migration of a
/// Bundle in `holding` queued by its window or budget, and a drain of a node where only such
/// Bundles' jobs still run.
pub fn unfinished_moves(
    migrations: &serde_json::Value,
    nodes: &serde_json::Value,
    world: &reliability::World,
    holding: &BTreeMap<String, Hold>,
) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for m in migrations["items"].as_array().into_iter().flatten() {
        let phase = m["status"]["phase"].as_str().unwrap_or("");
        if !ENDED.contains(&phase)
            && !held_by_a_dropped_replica(m, world)
            && !held_by_its_bundle(m, holding)
        {
            let why = m["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["status"] == "True")
                .map(|c| {
                    format!(
                        "{} {}: {}",
                        c["type"].as_str().unwrap_or_default(),
                        c["reason"].as_str().unwrap_or_default(),
                        c["message"].as_str().unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            out.insert(format!(
                "Migration {}: phase {:?} ({why})",
                m["metadata"]["name"].as_str().unwrap_or_default(),
                phase
            ));
        }
    }
    for n in nodes["items"].as_array().into_iter().flatten() {
        let draining = n["spec"]["drain"].is_object();
        let done = n["status"]["drain"]["completedAt"].is_string();
        let name = n["metadata"]["name"].as_str().unwrap_or_default();
        let terminate = n["spec"]["drain"]["mode"] == "terminate";
        if draining
            && !done
            && n["status"]["state"] == "started"
            && !held_on(name, terminate, world, holding)
        {
            out.insert(format!(
                "drain of {}: not completed ({} jobs remaining)",
                n["metadata"]["name"].as_str().unwrap_or_default(),
                n["status"]["drain"]["jobsRemaining"]
            ));
        }
    }
    out
}

/// Whether Migration `m` is queued by its Bundle's window or budget while the schedule has that
/// Bundle hold its moves for the whole run: waiting is its answer.
pub fn held_by_its_bundle(m: &serde_json::Value, holding: &BTreeMap<String, Hold>) -> bool {
    let queued = m["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| {
            c["type"] == "Queued"
                && c["status"] == "True"
                && (c["reason"] == "DisruptionWindow" || c["reason"] == "DisruptionBudget")
        });
    let ns = m["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE);
    queued
        && ns == NAMESPACE
        && m["spec"]["job"]["bundle"]
            .as_str()
            .is_some_and(|b| holding.contains_key(b))
}

/// Whether a drain of `node` rightly waits: another client's job runs there (the node is not
/// terminated under it), or on the schedule's holds: a job of a Bundle in `holding` still runs
/// there and, for a `migrate` drain (which moves each job on its own), every job still there
/// is such a one; a `terminate` drain waits for its holders as a whole.
fn held_on(
    node: &str,
    terminate: bool,
    world: &reliability::World,
    holding: &BTreeMap<String, Hold>,
) -> bool {
    let held = |bundle_id: &str| {
        bundle_id
            .strip_prefix(NAMESPACE)
            .and_then(|r| r.strip_prefix('.'))
            .is_some_and(|name| holding.contains_key(name))
    };
    let running_there: Vec<&str> = world
        .jobs
        .iter()
        .filter(|j| {
            j.instances.iter().any(|i| {
                i.normal && i.node_id == node && i.state == reliability::InstanceState::Running
            })
        })
        .map(|j| j.bundle_id.as_str())
        .collect();
    // Another client's job (a bundle id not of the operator's `<namespace>.<name>` form) is
    // not the operator's to stop: the drain rightly waits for it, whatever its mode.
    if running_there.iter().any(|b| !reliability::operator_id(b)) {
        return true;
    }
    let on: Vec<bool> = running_there.iter().map(|b| held(b)).collect();
    on.iter().any(|h| *h) && (terminate || on.iter().all(|h| *h))
}

/// Whether Migration `m` waits on its bundle's disruption budget (`Queued`, reason
/// `DisruptionBudget`) while another replica of that bundle is down for good: a job of it that
/// the bundle's status records `dropped` (a bronze job is not restarted) and that Manager runs
/// no instance of. The budget then stays spent until a person acts (the retry annotation, a
/// budget change), so the Migration rightly waits and says why; it will not end by itself.
fn held_by_a_dropped_replica(m: &serde_json::Value, world: &reliability::World) -> bool {
    let budget = m["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| {
            c["type"] == "Queued" && c["status"] == "True" && c["reason"] == "DisruptionBudget"
        });
    let ns = m["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE);
    let (Some(bundle), Some(replica)) = (
        m["spec"]["job"]["bundle"].as_str(),
        m["spec"]["job"]["replica"].as_u64(),
    ) else {
        return false;
    };
    let id = format!("{ns}.{bundle}");
    let running = |r: u32, job: &str| {
        world.jobs.iter().any(|j| {
            j.bundle_id == id
                && j.replica == r
                && j.job_name == job
                && (j.instances.iter())
                    .any(|i| i.normal && i.state == reliability::InstanceState::Running)
        })
    };
    budget
        && (world.bundles.iter().filter(|b| b.id == id)).any(|b| {
            b.dropped
                .iter()
                .any(|(r, job)| u64::from(*r) != replica && !running(*r, job))
        })
}

/// How much the settled system runs: Bundles, running jobs, the nodes they run on.
fn census(world: &reliability::World) -> String {
    let running: Vec<&str> = world
        .jobs
        .iter()
        .filter_map(|j| {
            j.instances
                .iter()
                .find(|i| i.normal && i.state == reliability::InstanceState::Running)
                .map(|i| i.node_id.as_str())
        })
        .collect();
    let nodes: std::collections::BTreeSet<&str> = running.iter().copied().collect();
    format!(
        "{} Bundles, {} jobs running on {} nodes ({} nodes started)",
        world.bundles.len(),
        running.len(),
        nodes.len(),
        world.nodes.iter().filter(|n| n.started).count()
    )
}

/// One `unfinished: …` line per unfinished move.
fn unfinished_lines(unfinished: &std::collections::BTreeSet<String>) -> String {
    unfinished
        .iter()
        .map(|u| format!("unfinished: {u}\n"))
        .collect()
}

/// One `foreign_touched: …` line per touch and one `deadline_miss: …` line per miss.
fn counted_lines(outcome: &Outcome) -> String {
    let touched = outcome
        .foreign_touched
        .iter()
        .map(|t| format!("foreign_touched: {t}\n"));
    let missed = outcome
        .deadline_misses
        .iter()
        .map(|m| format!("deadline_miss: {m}\n"));
    touched.chain(missed).collect()
}

/// `api` as [`crate::stack::MANAGER_API_ENV`] names it.
fn api_name(api: ManagerApi) -> &'static str {
    match api {
        ManagerApi::V1 => "v1",
        ManagerApi::Published => "published",
        ManagerApi::PublishedStandard => "published-standard",
    }
}

fn name(i: usize) -> &'static str {
    if i == 0 { "a" } else { "b" }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(seed: u64) -> Outcome {
        Outcome {
            seed,
            faults: 9,
            violations: Violations::default(),
            unfinished: Default::default(),
            foreign_touched: Default::default(),
            deadline_misses: Default::default(),
            settle: Duration::from_millis(4_250),
            error: None,
            took: Duration::from_secs(61),
        }
    }

    #[test]
    fn a_seed_prints_its_one_line_with_the_counts_first() {
        let mut o = outcome(17);
        assert_eq!(
            o.line(),
            "chaos seed=17 faults=9 duplicates=0 lost=0 overcapacity=0 orphans=0 rules=0 disagreements=0 settle_s=4.2 cordon=0 unfinished=0 foreign_touched=0 deadline_misses=0 ok=true took_s=61"
        );
        o.violations.lost.insert("x".into());
        o.error = Some("reset:\nno".into());
        assert!(o.line().contains(" lost=1 "));
        assert!(o.line().ends_with(" ok=false took_s=61 error=reset: no"));
        let mut o = outcome(18);
        o.unfinished.insert("drain of n".into());
        assert!(!o.ok());
        assert!(o.line().contains(" unfinished=1 foreign_touched=0 "));
        // A touch of the foreign client's work, or a deadline missed, fails the seed alone.
        let mut o = outcome(19);
        o.foreign_touched
            .insert("default-chaos-9000/0/enc: stopped on la-00001 by another client".into());
        assert!(!o.ok());
        assert!(
            o.line()
                .contains(" foreign_touched=1 deadline_misses=0 ok=false ")
        );
        let mut o = outcome(20);
        o.deadline_misses
            .insert("default.chaos-0001/0/enc: on la-00002".into());
        assert!(!o.ok());
        assert!(
            o.line()
                .contains(" foreign_touched=0 deadline_misses=1 ok=false ")
        );
        assert_eq!(
            counted_lines(&o),
            "deadline_miss: default.chaos-0001/0/enc: on la-00002\n"
        );
    }

    #[test]
    fn moves_not_ended_are_unfinished_and_a_drain_of_a_dead_node_is_not() {
        let migrations = serde_json::json!({"items": [
            {"metadata": {"name": "done"}, "status": {"phase": "Completed"}},
            {"metadata": {"name": "refused"}, "status": {"phase": "Rejected"}},
            {"metadata": {"name": "waiting"}, "status": {"phase": "Pending", "conditions": [
                {"type": "Queued", "status": "True", "reason": "DisruptionBudget", "message": "one replica down"},
                {"type": "Ready", "status": "False", "reason": "Pending", "message": ""}]}},
            {"metadata": {"name": "new"}},
        ]});
        let nodes = serde_json::json!({"items": [
            {"metadata": {"name": "n1"}, "spec": {"drain": {"mode": "migrate"}},
             "status": {"state": "started", "drain": {"jobsRemaining": 2}}},
            {"metadata": {"name": "n2"}, "spec": {"drain": {"mode": "migrate"}},
             "status": {"state": "started", "drain": {"completedAt": "2026-01-01T00:00:00Z"}}},
            {"metadata": {"name": "n3"}, "spec": {"drain": {"mode": "terminate"}},
             "status": {"state": "terminated"}},
            {"metadata": {"name": "n4"}, "spec": {"cordoned": true}, "status": {"state": "started"}},
        ]});
        let u = unfinished_moves(
            &migrations,
            &nodes,
            &reliability::World::default(),
            &BTreeMap::new(),
        );
        assert_eq!(
            u.iter().map(String::as_str).collect::<Vec<_>>(),
            [
                "Migration new: phase \"\" ()",
                "Migration waiting: phase \"Pending\" (Queued DisruptionBudget: one replica down)",
                "drain of n1: not completed (2 jobs remaining)",
            ]
        );
    }

    /// A drain that waits for another client's job to leave its node (the operator does not
    /// terminate a node under it) has its answer, in either mode; once only the operator's jobs
    /// are left there, it is unfinished again.
    #[test]
    fn a_drain_waiting_on_another_clients_job_is_not_unfinished() {
        let migrations = serde_json::json!({"items": []});
        let nodes = |mode: &str| {
            serde_json::json!({"items": [
                {"metadata": {"name": "n"}, "spec": {"drain": {"mode": mode}},
                 "status": {"state": "started", "drain": {"jobsRemaining": 1}}},
            ]})
        };
        let on_n = |bundle_id: &str| reliability::JobFact {
            bundle_id: bundle_id.into(),
            replica: 0,
            job_name: "enc".into(),
            required_capacity: 1.0,
            required_cores: 1,
            instances: vec![reliability::InstanceFact {
                node_id: "n".into(),
                normal: true,
                state: reliability::InstanceState::Running,
                started_at_ms: 0,
                reserved: None,
            }],
            max_running_ever: None,
        };
        let theirs = reliability::World {
            jobs: vec![on_n("default-chaos-9000")],
            ..Default::default()
        };
        let ours = reliability::World {
            jobs: vec![on_n("default.b")],
            ..Default::default()
        };
        for mode in ["migrate", "terminate"] {
            assert!(
                unfinished_moves(&migrations, &nodes(mode), &theirs, &BTreeMap::new()).is_empty(),
                "{mode}"
            );
            assert_eq!(
                unfinished_moves(&migrations, &nodes(mode), &ours, &BTreeMap::new()).len(),
                1,
                "{mode}"
            );
        }
    }

    /// A Migration of replica 0 held by the budget while replica 1's bronze job was dropped
    /// has its answer; held while replica 1 runs, or with replica 1 only recovering (not
    /// dropped), it is unfinished.
    #[test]
    fn a_migration_held_by_a_budget_a_dropped_replica_spends_is_not_unfinished() {
        let held = serde_json::json!({"items": [{
            "metadata": {"name": "m", "namespace": "default"},
            "spec": {"job": {"bundle": "b", "replica": 0, "jobName": "enc"}},
            "status": {"phase": "Pending", "conditions": [
                {"type": "Queued", "status": "True", "reason": "DisruptionBudget", "message": "replica 1 down"}]}}]});
        let nodes = serde_json::json!({"items": []});
        let job = |replica: u32, running: bool| reliability::JobFact {
            bundle_id: "default.b".into(),
            replica,
            job_name: "enc".into(),
            required_capacity: 1.0,
            required_cores: 1,
            instances: vec![reliability::InstanceFact {
                node_id: "n".into(),
                normal: true,
                state: if running {
                    reliability::InstanceState::Running
                } else {
                    reliability::InstanceState::Ended
                },
                started_at_ms: 0,
                reserved: None,
            }],
            max_running_ever: None,
        };
        let world = |dropped: bool, replica_1_runs: bool| reliability::World {
            jobs: vec![job(0, true), job(1, replica_1_runs)],
            bundles: vec![reliability::BundleFact {
                id: "default.b".into(),
                replicas: 2,
                job_names: vec!["enc".into()],
                dropped: if dropped {
                    [(1, "enc".to_owned())].into()
                } else {
                    Default::default()
                },
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(unfinished_moves(&held, &nodes, &world(true, false), &BTreeMap::new()).is_empty());
        assert_eq!(
            unfinished_moves(&held, &nodes, &world(false, false), &BTreeMap::new()).len(),
            1
        );
        assert_eq!(
            unfinished_moves(&held, &nodes, &world(true, true), &BTreeMap::new()).len(),
            1
        );
    }

    /// Moves the schedule's own holds keep waiting have their answer: a Migration of a held
    /// Bundle queued by its window or budget, a `migrate` drain of a node where only held
    /// Bundles' jobs run, and a `terminate` drain of a node where one does. A held Bundle's
    /// Migration pending for another reason, a `migrate` drain with any other job left, and a
    /// drain with no held job, are unfinished.
    #[test]
    fn moves_the_schedules_holds_keep_waiting_are_not_unfinished() {
        let queued = |name: &str, bundle: &str, reason: &str| {
            serde_json::json!({
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"job": {"bundle": bundle, "replica": 0, "jobName": "enc"}},
                "status": {"phase": "Pending", "conditions": [
                    {"type": "Queued", "status": "True", "reason": reason, "message": ""}]}})
        };
        let migrations = serde_json::json!({"items": [
            queued("w", "held-w", "DisruptionWindow"),
            queued("b", "held-b", "DisruptionBudget"),
            queued("other", "free", "DisruptionWindow"),
            queued("limit", "held-w", "ConcurrencyLimit"),
        ]});
        let drained = |name: &str| {
            serde_json::json!({"metadata": {"name": name}, "spec": {"drain": {"mode": "migrate"}},
                "status": {"state": "started", "drain": {"jobsRemaining": 1}}})
        };
        let mut mixed_terminate = drained("n-mixed-t");
        mixed_terminate["spec"]["drain"]["mode"] = serde_json::json!("terminate");
        let nodes = serde_json::json!({"items": [
            drained("n-held"), drained("n-mixed"), mixed_terminate, drained("n-free")]});
        let job = |bundle: &str, node: &str| reliability::JobFact {
            bundle_id: format!("default.{bundle}"),
            replica: 0,
            job_name: "enc".into(),
            required_capacity: 1.0,
            required_cores: 1,
            instances: vec![reliability::InstanceFact {
                node_id: node.into(),
                normal: true,
                state: reliability::InstanceState::Running,
                started_at_ms: 0,
                reserved: None,
            }],
            max_running_ever: None,
        };
        let world = reliability::World {
            jobs: vec![
                job("held-w", "n-held"),
                job("held-b", "n-mixed"),
                job("free", "n-mixed"),
                job("held-b", "n-mixed-t"),
                job("free", "n-mixed-t"),
                job("free", "n-free"),
            ],
            ..Default::default()
        };
        let holding: BTreeMap<String, Hold> = [
            ("held-w".to_owned(), Hold::Window),
            ("held-b".to_owned(), Hold::Budget),
        ]
        .into();
        let u = unfinished_moves(&migrations, &nodes, &world, &holding);
        assert_eq!(
            u.iter().map(String::as_str).collect::<Vec<_>>(),
            [
                "Migration limit: phase \"Pending\" (Queued ConcurrencyLimit: )",
                "Migration other: phase \"Pending\" (Queued DisruptionWindow: )",
                "drain of n-free: not completed (1 jobs remaining)",
                "drain of n-mixed: not completed (1 jobs remaining)",
            ]
        );
    }

    #[test]
    fn the_summary_sums_every_count_and_names_the_failed_seeds() {
        let mut bad = outcome(2);
        bad.violations.duplicates.insert("d".into());
        bad.violations.orphans.insert("o".into());
        let mut touched = outcome(4);
        touched.foreign_touched.insert("t1".into());
        touched.foreign_touched.insert("t2".into());
        touched.deadline_misses.insert("m".into());
        let line = summary(
            &[outcome(1), bad, outcome(3), touched],
            Duration::from_secs(200),
        );
        assert_eq!(
            line,
            "chaos summary seeds=4 failed=2 faults=36 duplicates=1 lost=0 overcapacity=0 orphans=1 rules=0 disagreements=0 cordon=0 unfinished=0 foreign_touched=2 deadline_misses=1 errors=0 settle_s_mean=4.2 settle_s_max=4.2 took_s=200 failed_seeds=2,4"
        );
    }
}
