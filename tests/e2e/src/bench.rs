//! What the `harness = false` benches share: a simulated fleet of many nodes in fixed pools (the
//! sim's config and the matching PlacementPools), creating many Bundles, following them to
//! Ready, the figures of a process (`/proc`), and the counters of the apiserver, the operator
//! and the sim.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use automanager_api::{Bundle, BundlePhase};
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};

use crate::SetupError;
use crate::stack::Stack;

/// The API group of AutoManager's custom resources.
pub const GROUP: &str = "automanager.norsk.io";

/// `name` from the environment as a whole number, or `default`.
pub fn env_usize(name: &str, default: usize) -> Result<usize, SetupError> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| SetupError(format!("{name}={v:?} is not a whole number"))),
        Err(_) => Ok(default),
    }
}

/// A fixed pool of identical nodes (`<name>-00000`, ...) spread over two zones.
#[derive(Debug, Clone)]
pub struct FleetPool {
    pub name: String,
    pub nodes: usize,
    pub capacity: u32,
    pub cores: u32,
}

impl FleetPool {
    pub fn new(name: &str, nodes: usize, capacity: u32, cores: u32) -> Self {
        FleetPool {
            name: name.to_owned(),
            nodes,
            capacity,
            cores,
        }
    }

    /// Its two zones.
    pub fn zones(&self) -> [String; 2] {
        [format!("{}-z-a", self.name), format!("{}-z-b", self.name)]
    }

    /// Its nodes as the sim declares them, `(id, zone)`: `<name>-00000` and every other node in
    /// the first zone, the rest in the second.
    pub fn node_ids(&self) -> Vec<(String, String)> {
        let [a, b] = self.zones();
        (0..self.nodes)
            .map(|i| {
                let zone = if i % 2 == 0 { &a } else { &b };
                (format!("{}-{i:05}", self.name), zone.clone())
            })
            .collect()
    }

    /// The PlacementPool object for this pool (`packing`: `spread` or `binpack`).
    pub fn placement_pool(&self, packing: &str) -> String {
        let [a, b] = self.zones();
        format!(
            "apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {{name: {name}}}
spec:
  kind: cluster
  region: {name}-dc
  zones: [{a}, {b}]
  packingStrategy: {packing}
  scaleOut: fixed
  candidateInstanceTypes: [{{instanceType: {name}, totalCapacity: {cap}, totalCores: {cores}}}]
",
            name = self.name,
            cap = self.capacity,
            cores = self.cores,
        )
    }
}

/// manager-sim's config for `pools` (jobs start and stop in 5 ms, nodes are declared).
pub fn fleet_sim_config(pools: &[FleetPool]) -> String {
    let mut out = String::from(
        "listen: 127.0.0.1:0\ntiming: {provisionDelayMs: 0, jobStartDelayMs: 5, jobStopDelayMs: 5}\npools:\n",
    );
    for p in pools {
        let [a, b] = p.zones();
        out.push_str(&format!(
            "  - name: {name}\n    kind: cluster\n    region: {name}-dc\n    zones: [{a}, {b}]\n    scaleOut: fixed\n    nodes:\n",
            name = p.name
        ));
        for (id, zone) in p.node_ids() {
            out.push_str(&format!(
                "      - {{id: {id}, zone: {zone}, capacity: {}, cores: {}}}\n",
                p.capacity, p.cores
            ));
        }
    }
    out
}

/// Creates `bundles`, `concurrency` at a time; returns how long the creates took.
pub async fn create_bundles(
    api: &Api<Bundle>,
    bundles: impl IntoIterator<Item = Bundle>,
    concurrency: usize,
) -> Result<Duration, SetupError> {
    let started = Instant::now();
    futures::stream::iter(bundles)
        .map(|b| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &b)
                    .await
                    .map(drop)
                    .map_err(|e| SetupError(format!("creating a bundle: {e}")))
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(started.elapsed())
}

/// A watch of every Bundle in a namespace that remembers which are Ready.
pub struct ReadyWatch {
    events: futures::stream::BoxStream<'static, Result<Bundle, watcher::Error>>,
    ready: HashSet<String>,
}

impl ReadyWatch {
    /// Starts watching; Bundles already Ready count as soon as the first list arrives.
    pub fn new(api: Api<Bundle>) -> Self {
        ReadyWatch {
            events: watcher::watcher(api, watcher::Config::default())
                .applied_objects()
                .boxed(),
            ready: HashSet::new(),
        }
    }

    /// Whether `name` was seen Ready (and not seen otherwise since).
    pub fn is_ready(&self, name: &str) -> bool {
        self.ready.contains(name)
    }

    /// Waits until every name in `names` is Ready, calling `tick` every 500 ms meanwhile (to
    /// sample a process, print progress). Fails after `timeout`.
    pub async fn wait_all(
        &mut self,
        names: &[String],
        timeout: Duration,
        mut tick: impl FnMut(usize),
    ) -> Result<(), SetupError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut every = tokio::time::interval(Duration::from_millis(500));
        loop {
            let missing = names.iter().filter(|n| !self.ready.contains(*n)).count();
            if missing == 0 {
                return Ok(());
            }
            tokio::select! {
                ev = self.events.try_next() => {
                    let b = match ev {
                        Ok(Some(b)) => b,
                        Ok(None) => return Err(SetupError("the bundle watch ended".into())),
                        Err(e) => return Err(SetupError(format!("bundle watch: {e}"))),
                    };
                    let name = b.metadata.name.clone().unwrap_or_default();
                    if b.status.as_ref().is_some_and(|s| s.phase == BundlePhase::Ready) {
                        self.ready.insert(name);
                    } else {
                        self.ready.remove(&name);
                    }
                }
                _ = every.tick() => tick(names.len() - missing),
                () = tokio::time::sleep_until(deadline) => {
                    return Err(SetupError(format!(
                        "only {} of {} bundles Ready after {timeout:?}",
                        names.len() - missing,
                        names.len()
                    )));
                }
            }
        }
    }
}

/// A process's resident memory in MiB (0 when unreadable).
pub fn rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

/// CPU seconds (user + system) a process has used, from `/proc/<pid>/stat` (0 when unreadable).
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // USER_HZ is 100 on Linux.
    (ticks(11) + ticks(12)) / 100.0
}

/// The machine's 1-minute load average (0 when unreadable).
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// The value of `label` in one Prometheus text line, or "".
fn label<'a>(line: &'a str, key: &str) -> &'a str {
    line.split(&format!("{key}=\""))
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or_default()
}

fn value(line: &str) -> f64 {
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The sum of every series of `name` in Prometheus text whose labels satisfy `keep`.
pub fn metric_sum(text: &str, name: &str, keep: impl Fn(&str) -> bool) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| keep(l))
        .map(value)
        .sum()
}

/// The value of `key` in a metric line's labels (for [`metric_sum`] filters).
pub fn has_label(line: &str, key: &str, want: &str) -> bool {
    label(line, key) == want
}

/// The apiserver's count of writes so far per `[group/]resource[/subresource] VERB` (the core
/// group has no prefix), from its own `apiserver_request_total` (verbs POST, PUT, PATCH, APPLY,
/// DELETE).
pub async fn apiserver_writes(client: &kube::Client) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    let Ok(req) = http::Request::get("/metrics").body(Vec::new()) else {
        return out;
    };
    let Ok(text) = client.request_text(req).await else {
        return out;
    };
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let verb = label(line, "verb");
        if !matches!(verb, "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE") {
            continue;
        }
        let group = label(line, "group");
        let sub = label(line, "subresource");
        let key = format!(
            "{group}{}{}{}{sub} {verb}",
            if group.is_empty() { "" } else { "/" },
            label(line, "resource"),
            if sub.is_empty() { "" } else { "/" },
        );
        *out.entry(key).or_default() += value(line);
    }
    out
}

/// The writes of one API group in an [`apiserver_writes`] reading.
pub fn of_group(writes: &BTreeMap<String, f64>, group: &str) -> BTreeMap<String, f64> {
    writes
        .iter()
        .filter(|(k, _)| k.strip_prefix(group).is_some_and(|r| r.starts_with('/')))
        .map(|(k, v)| (k.clone(), *v))
        .collect()
}

/// What changed between two [`apiserver_writes`] readings, as `key=n` (only keys that moved).
pub fn writes_between(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (d >= 1.0).then(|| (k.clone(), d))
        })
        .collect()
}

/// `key=n key=n ...` of a [`writes_between`] result, for a log line.
pub fn show_counts(counts: &BTreeMap<String, f64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k}={v:.0}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Reconciles the operator has run so far, per controller (`automanager_reconcile_duration_seconds_count`).
pub async fn operator_reconciles(stack: &Stack) -> Result<BTreeMap<String, f64>, SetupError> {
    let (code, text) = stack.http_get("/metrics").await?;
    if code != 200 {
        return Err(SetupError(format!("operator /metrics answered {code}")));
    }
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("automanager_reconcile_duration_seconds_count{"))
    {
        *out.entry(label(line, "controller").to_owned()).or_default() += value(line);
    }
    Ok(out)
}

/// The sum over controllers of an [`operator_reconciles`] reading.
pub fn total(counts: &BTreeMap<String, f64>) -> f64 {
    // From +0: an empty f64 sum is -0, printed "-0".
    counts.values().fold(0.0, |a, b| a + b)
}

/// Nearest-rank percentile `q` (0..=1) of sorted values (NaN when empty).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// "p50 … ms p99 … ms max … ms" of `sorted` (ascending), for a bench's human-readable lines.
pub fn spread_ms(sorted: &[f64]) -> String {
    format!(
        "p50 {:.0} ms p99 {:.0} ms max {:.0} ms",
        percentile(sorted, 0.5),
        percentile(sorted, 0.99),
        percentile(sorted, 1.0)
    )
}

/// `v` sorted ascending.
pub fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// Every Migration matching a label selector in one namespace, as last seen, kept after the
/// object is gone (a consolidated node's Migrations go with its ManagerNode): a background
/// watch, stopped on drop.
pub struct SeenMigrations {
    seen: std::sync::Arc<std::sync::Mutex<BTreeMap<String, automanager_api::Migration>>>,
    task: tokio::task::JoinHandle<()>,
}

impl SeenMigrations {
    /// Starts watching (from an initial list).
    pub fn start(api: Api<automanager_api::Migration>, labels: &str) -> Self {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::new()));
        let out = seen.clone();
        let mut events = watcher::watcher(api, watcher::Config::default().labels(labels))
            .default_backoff()
            .applied_objects()
            .boxed();
        let task = tokio::spawn(async move {
            while let Some(ev) = events.next().await {
                let Ok(m) = ev else { continue };
                let name = m.metadata.name.clone().unwrap_or_default();
                if let Ok(mut s) = out.lock() {
                    s.insert(name, m);
                }
            }
        });
        SeenMigrations { seen, task }
    }

    /// What was seen so far, by name.
    pub fn snapshot(&self) -> BTreeMap<String, automanager_api::Migration> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for SeenMigrations {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `e` as a set-up error.
pub fn err(e: impl std::fmt::Display) -> SetupError {
    SetupError(e.to_string())
}

/// A job instance state that holds its node: starting, running or stopping.
pub fn is_live(state: i32) -> bool {
    use manager_client::proto::JobState;
    [JobState::Starting, JobState::Running, JobState::Stopping]
        .iter()
        .any(|s| *s as i32 == state)
}

/// The node of `job_id` when it runs with exactly one live instance (its normal one) and no
/// migration of it is in flight: the state a kill or a migration starts from.
pub fn settled_node(m: &manager_client::MirrorState, job_id: &str) -> Option<String> {
    use manager_client::proto::{JobRole, JobState, MigrationPhase};
    let job = m.jobs.get(job_id)?;
    let live: Vec<_> = job.instances.iter().filter(|i| is_live(i.state)).collect();
    let single = matches!(live.as_slice(), [i] if i.state == JobState::Running as i32
        && i.role != JobRole::MigrationTarget as i32);
    let migrating = m.migrations.values().any(|mg| {
        mg.job_id == job_id
            && ![
                MigrationPhase::Completed as i32,
                MigrationPhase::Aborted as i32,
            ]
            .contains(&mg.phase)
    });
    (job.state == JobState::Running as i32 && single && !migrating && !job.node_id.is_empty())
        .then(|| job.node_id.clone())
}

/// Whether `node_id` is tagged a spare.
pub fn is_spare(m: &manager_client::MirrorState, node_id: &str) -> bool {
    m.nodes
        .get(node_id)
        .is_some_and(|n| n.tags.get("spare").is_some_and(|v| v == "true"))
}

/// Started, spare-tagged nodes of `pool` that hold no live job instance: hot spares ready to
/// take a recovery.
pub fn empty_spares(m: &manager_client::MirrorState, pool: &str) -> usize {
    use manager_client::proto::NodeState;
    let busy: std::collections::BTreeSet<&str> = m
        .jobs
        .values()
        .flat_map(|j| j.instances.iter())
        .filter(|i| is_live(i.state))
        .map(|i| i.node_id.as_str())
        .collect();
    m.nodes
        .values()
        .filter(|n| {
            n.pool == pool
                && n.state == NodeState::Started as i32
                && is_spare(m, &n.node_id)
                && !busy.contains(n.node_id.as_str())
        })
        .count()
}

/// `kubectl apply` of `yaml`; its stderr as the error when it fails.
pub async fn apply(stack: &Stack, yaml: &str) -> Result<(), SetupError> {
    let out = stack.env.apply_yaml(yaml).await?;
    if out.success() {
        Ok(())
    } else {
        Err(SetupError(out.stderr))
    }
}
