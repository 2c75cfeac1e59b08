//! The foreign client over Manager's published API (`norsk.api.manager`): another client of the
//! same Manager, whose stored jobs carry no owner tag of ours, started on nodes it did not
//! create under the same free-text role the operator uses, with ids of the operator's own form
//! (`<namespace>.<name>/<replica>/<job>`). What it does and what happens to its jobs is read
//! from Manager's side: its own event stream's jobs and their histories ([`foreign_view`]), not
//! the operator's view (which leaves such jobs out).

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use manager_client::proto::api::common::JobId;
use manager_client::proto::api::manager::job_history_entry::HistoryEntry;
use manager_client::proto::api::manager::{Job, JobHistoryEntry};
use manager_client::published::{
    InstancePhase, PublishedClient, PublishedConfig, PublishedMirror, tags, timestamp_ms,
};

use super::NAMESPACE;
use super::ledger::{InstanceView, JobView, StopWhy, View};
use crate::reliability::InstanceState;
use crate::stack::OWNER;

/// The role every instance of the foreign client runs under: the operator's own.
pub const ROLE: &str = tags::ROLE_NORMAL;

/// How long a delete waits for the job's instance to stop (Manager refuses to delete a job
/// that runs).
const STOPPED_WAIT: Duration = Duration::from_secs(30);

/// The id the foreign client uses over the published API for a schedule's foreign id
/// (`<namespace>-<name>…`): the operator's own form, `<namespace>.<name>…`. Over our first API
/// the schedule's id is kept (there, that form is the operator's rule of what is its own).
pub fn wire_id(published: bool, id: &str) -> String {
    let prefix = format!("{NAMESPACE}-");
    match id.strip_prefix(&prefix) {
        Some(rest) if published => format!("{NAMESPACE}.{rest}"),
        _ => id.to_owned(),
    }
}

/// The stored job the foreign client creates: its id, and tags that look like the operator's
/// (bundle, replica, job name, requirements) but with no owner tag.
pub fn foreign_job(job_id: &str) -> Job {
    let mut parts = job_id.splitn(3, '/');
    let bundle = parts.next().unwrap_or_default();
    let replica = parts.next().unwrap_or("0");
    let name = parts.next().unwrap_or_default();
    Job {
        job_id: Some(JobId {
            job_id: job_id.to_owned(),
        }),
        tags: BTreeMap::from([
            ("client".to_owned(), "chaos-foreign".to_owned()),
            (tags::BUNDLE.to_owned(), bundle.to_owned()),
            (tags::REPLICA.to_owned(), replica.to_owned()),
            (tags::JOB.to_owned(), name.to_owned()),
            (tags::CAPACITY.to_owned(), "2".to_owned()),
            (tags::CORES.to_owned(), "1".to_owned()),
        ]),
        ..Default::default()
    }
}

/// A fingerprint of a stored job's definition: another client's `UpdateJob` changes it.
fn fingerprint(job: &Job) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{job:?}").hash(&mut h);
    h.finish()
}

/// Why an instance stopped, from `JobHistoryJobStopping.Reason` (1.0.384): a node stopped is
/// lost, a node terminated is a `TerminateNode`, a user's request a `StopJob`; an unknown job or
/// its own failure is no client's doing.
fn stop_why(reason: i32) -> StopWhy {
    match reason {
        0 => StopWhy::NodeLost,
        1 => StopWhy::NodeTerminated,
        2 => StopWhy::Requested,
        _ => StopWhy::None,
    }
}

/// Every instance a job's history tells of, each from its start (`JobProvisioned`, or a
/// `JobRunning` with no start before it) to its stop, keyed as the books key them: the node
/// and time it started on, and whether it ran under the job's ordinary role.
pub fn instances_in(history: &[JobHistoryEntry]) -> Vec<InstanceView> {
    let mut out: Vec<InstanceView> = Vec::new();
    let mut open: BTreeMap<String, usize> = BTreeMap::new();
    for entry in history {
        let (role, meta, at, step) = match &entry.history_entry {
            Some(HistoryEntry::JobProvisioned(e)) => (
                &e.role,
                e.node_metadata.as_ref(),
                e.timestamp.as_ref(),
                InstancePhase::Provisioned,
            ),
            Some(HistoryEntry::JobRunning(e)) => (
                &e.role,
                e.node_metadata.as_ref(),
                e.timestamp.as_ref(),
                InstancePhase::Running,
            ),
            Some(HistoryEntry::JobStopping(e)) => {
                if let Some(&i) = open.get(&e.role) {
                    out[i].state = InstanceState::Stopping;
                    out[i].stop = stop_why(e.reason);
                }
                continue;
            }
            Some(HistoryEntry::JobStopped(e)) => {
                if let Some(i) = open.remove(&e.role) {
                    out[i].state = InstanceState::Ended;
                }
                continue;
            }
            _ => continue,
        };
        let node_id = meta
            .and_then(|m| m.node_id.as_ref())
            .map_or("", |n| n.node_id.as_str())
            .to_owned();
        match (step, open.get(role)) {
            (InstancePhase::Running, Some(&i)) if out[i].node_id == node_id => {
                out[i].state = InstanceState::Running;
            }
            _ => {
                open.insert(role.clone(), out.len());
                out.push(InstanceView {
                    node_id,
                    normal: role == ROLE,
                    state: if step == InstancePhase::Running {
                        InstanceState::Running
                    } else {
                        InstanceState::Starting
                    },
                    started_at_ms: at.map_or(0, timestamp_ms),
                    stop: StopWhy::None,
                });
            }
        }
    }
    out
}

/// The books' view of every job the published stream shows without the operator's owner tag:
/// each job is its own "bundle" (the published API has none), with its definition's
/// fingerprint as its generation.
pub fn foreign_view(m: &PublishedMirror) -> View {
    let theirs = m.jobs.values().filter(|j| !tags::owned_by(j.tags(), OWNER));
    let mut view = View::default();
    for j in theirs {
        let id = j.job_id().to_owned();
        view.bundles.insert(id.clone(), fingerprint(&j.job));
        view.jobs.push(JobView {
            job_id: id.clone(),
            bundle_id: id,
            instances: instances_in(&j.history),
        });
    }
    view
}

/// The foreign client's connection to the published API.
pub struct PublishedForeign {
    client: PublishedClient,
}

impl PublishedForeign {
    pub async fn connect(endpoint: &str, timeout: Duration) -> Result<PublishedForeign, String> {
        let client = PublishedClient::connect(PublishedConfig::new(endpoint.to_owned()))
            .map_err(|e| e.to_string())?;
        client
            .wait_ready(timeout)
            .await
            .map_err(|e| e.to_string())?;
        Ok(PublishedForeign { client })
    }

    /// The stream's view of the foreign jobs now.
    pub fn view(&self) -> View {
        self.client.with_mirror(foreign_view)
    }

    /// Every change the stream sees, to wake a reader.
    pub fn subscribe(
        &self,
    ) -> tokio::sync::broadcast::Receiver<manager_client::published::PublishedChange> {
        self.client.subscribe()
    }

    /// Stores `job_id`; its definition's fingerprint, as the stream will show it.
    pub async fn create(&self, job_id: &str) -> Result<(), String> {
        self.client
            .create_job(foreign_job(job_id))
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Starts `job_id` on `node` under [`ROLE`].
    pub async fn start(&self, job_id: &str, node: &str) -> Result<(), String> {
        self.client
            .start_job(job_id, ROLE, node)
            .await
            .map_err(|e| e.to_string())
    }

    /// The node `job_id`'s instance under [`ROLE`] is starting or running on, if any.
    pub fn live_node(&self, job_id: &str) -> Option<String> {
        self.client.with_mirror(|m| {
            let j = m.jobs.get(job_id)?;
            j.live_instances()
                .find(|i| i.role == ROLE)
                .map(|i| i.node_id.clone())
        })
    }

    /// What the stream shows of `job_id`, for the log: not stored, or each instance's node,
    /// state and stop.
    pub fn describe(&self, job_id: &str) -> String {
        self.client.with_mirror(|m| match m.jobs.get(job_id) {
            None => "not stored".to_owned(),
            Some(j) => {
                let all: Vec<String> = instances_in(&j.history)
                    .iter()
                    .map(|i| format!("{} {:?} {:?}", i.node_id, i.state, i.stop))
                    .collect();
                format!("stored, instances [{}]", all.join(", "))
            }
        })
    }

    /// Stops `job_id`'s instance on `node`.
    pub async fn stop(&self, job_id: &str, node: &str) -> Result<(), String> {
        self.client
            .stop_job(job_id, ROLE, node)
            .await
            .map_err(|e| e.to_string())
    }

    /// Deletes `job_id` once its instance has stopped (the stop asked before).
    pub async fn delete(&self, job_id: &str) -> Result<(), String> {
        let deadline = Instant::now() + STOPPED_WAIT;
        while self.live_node(job_id).is_some() {
            if Instant::now() > deadline {
                return Err(format!("{job_id} still runs after {STOPPED_WAIT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.client
            .delete_job(job_id)
            .await
            .map_err(|e| e.to_string())
    }

    pub async fn close(&self) {
        self.client.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chaos::ledger::ForeignBook;
    use manager_client::proto::api::common::{NodeId, NodeMetadata};
    use manager_client::proto::api::manager::{
        JobHistoryJobProvisioned, JobHistoryJobRunning, JobHistoryJobStopped, JobHistoryJobStopping,
    };
    use manager_client::published::{JobListing, JobView as PublishedJobView};

    fn meta(node: &str) -> Option<NodeMetadata> {
        Some(NodeMetadata {
            node_id: Some(NodeId {
                node_id: node.to_owned(),
            }),
            ..Default::default()
        })
    }

    /// One history step of `$ty` on `node` under `role` at `secs`.
    macro_rules! step {
        ($ty:ident, $node:expr, $role:expr, $secs:expr) => {{
            let mut e = $ty {
                node_metadata: meta($node),
                role: $role.into(),
                ..Default::default()
            };
            e.timestamp = Some(Default::default());
            if let Some(t) = e.timestamp.as_mut() {
                t.seconds = $secs;
            }
            e
        }};
    }

    fn entry(e: HistoryEntry) -> JobHistoryEntry {
        JobHistoryEntry {
            history_entry: Some(e),
        }
    }

    fn stopping(node: &str, secs: i64, reason: i32) -> HistoryEntry {
        let mut e = step!(JobHistoryJobStopping, node, ROLE, secs);
        e.reason = reason;
        HistoryEntry::JobStopping(e)
    }

    fn stored(id: &str, owner: Option<&str>, history: Vec<HistoryEntry>) -> PublishedJobView {
        let mut job = foreign_job(id);
        if let Some(o) = owner {
            job.tags.insert(tags::OWNER.to_owned(), o.to_owned());
        }
        PublishedJobView {
            job,
            history: history.into_iter().map(entry).collect(),
            listing: JobListing::Active,
            instances: BTreeMap::new(),
            completed: false,
        }
    }

    /// The view holds every job without the operator's owner tag, another installation's
    /// included, and none of the operator's; the foreign book judges it: its own stop is no
    /// touch, a stop it did not ask for and a changed definition are.
    #[test]
    fn the_view_is_every_job_not_the_operators_and_the_book_judges_it() {
        let started = || {
            vec![
                HistoryEntry::JobProvisioned(step!(JobHistoryJobProvisioned, "la-1", ROLE, 10)),
                HistoryEntry::JobRunning(step!(JobHistoryJobRunning, "la-1", ROLE, 11)),
            ]
        };
        let mut m = PublishedMirror::default();
        for (id, owner) in [
            ("default.chaos-9000/0/enc", None),
            ("default.chaos-9001/0/enc", Some("someone-else")),
            ("default.chaos-0001/0/enc", Some(OWNER)),
        ] {
            m.jobs.insert(id.to_owned(), stored(id, owner, started()));
        }
        let view = foreign_view(&m);
        assert_eq!(
            view.jobs
                .iter()
                .map(|j| j.job_id.as_str())
                .collect::<Vec<_>>(),
            ["default.chaos-9000/0/enc", "default.chaos-9001/0/enc"]
        );
        let mut book = ForeignBook::default();
        for id in ["default.chaos-9000/0/enc", "default.chaos-9001/0/enc"] {
            book.registered_unseen(id);
            book.asked_start(id, "la-1");
        }
        book.observe(&view);
        assert!(book.touched().is_empty(), "{:?}", book.touched());
        assert_eq!(book.shown(), (2, 2));
        // It stops 9000 itself; someone stops 9001 and changes 9000's definition.
        book.asked_stop("default.chaos-9000/0/enc");
        for id in ["default.chaos-9000/0/enc", "default.chaos-9001/0/enc"] {
            let mut h = started();
            h.push(stopping("la-1", 12, 2));
            let owner = (id.ends_with("9001/0/enc")).then_some("someone-else");
            m.jobs.insert(id.to_owned(), stored(id, owner, h));
        }
        if let Some(j) = m.jobs.get_mut("default.chaos-9000/0/enc") {
            j.job.current_hash = 7;
        }
        book.observe(&foreign_view(&m));
        let touched: Vec<&str> = book.touched().iter().map(String::as_str).collect();
        assert_eq!(touched.len(), 2, "{touched:?}");
        assert!(
            touched[0].starts_with("bundle default.chaos-9000/0/enc: changed by another client"),
            "{touched:?}"
        );
        assert_eq!(
            touched[1],
            "default.chaos-9001/0/enc: stopped on la-1 by another client"
        );
    }

    #[test]
    fn the_wire_id_over_the_published_api_is_of_the_operators_form() {
        assert_eq!(
            wire_id(true, "default-chaos-9000/0/enc"),
            "default.chaos-9000/0/enc"
        );
        assert_eq!(wire_id(true, "default-chaos-9001"), "default.chaos-9001");
        assert_eq!(
            wire_id(false, "default-chaos-9000/0/enc"),
            "default-chaos-9000/0/enc"
        );
        let job = foreign_job("default.chaos-9000/0/enc");
        assert!(!job.tags.contains_key(tags::OWNER));
        assert_eq!(job.tags[tags::BUNDLE], "default.chaos-9000");
        assert_eq!(job.tags[tags::JOB], "enc");
    }

    /// A start, a stop asked by a user, a start elsewhere and a stop by a node's death are two
    /// instances with their own starts and reasons; a start that never ran stays starting.
    #[test]
    fn a_history_is_each_instance_from_its_start_to_its_stop() {
        let history: Vec<JobHistoryEntry> = [
            HistoryEntry::JobProvisioned(step!(JobHistoryJobProvisioned, "la-00001", ROLE, 10)),
            HistoryEntry::JobRunning(step!(JobHistoryJobRunning, "la-00001", ROLE, 11)),
            stopping("la-00001", 12, 2),
            HistoryEntry::JobStopped(step!(JobHistoryJobStopped, "la-00001", ROLE, 13)),
            HistoryEntry::JobProvisioned(step!(JobHistoryJobProvisioned, "lb-00002", ROLE, 20)),
            HistoryEntry::JobRunning(step!(JobHistoryJobRunning, "lb-00002", ROLE, 21)),
            stopping("lb-00002", 22, 0),
            HistoryEntry::JobProvisioned(step!(
                JobHistoryJobProvisioned,
                "lc-00003",
                "migration-target",
                30
            )),
        ]
        .into_iter()
        .map(entry)
        .collect();
        let got = instances_in(&history);
        assert_eq!(
            got,
            vec![
                InstanceView {
                    node_id: "la-00001".into(),
                    normal: true,
                    state: InstanceState::Ended,
                    started_at_ms: 10_000,
                    stop: StopWhy::Requested,
                },
                InstanceView {
                    node_id: "lb-00002".into(),
                    normal: true,
                    state: InstanceState::Stopping,
                    started_at_ms: 20_000,
                    stop: StopWhy::NodeLost,
                },
                InstanceView {
                    node_id: "lc-00003".into(),
                    normal: false,
                    state: InstanceState::Starting,
                    started_at_ms: 30_000,
                    stop: StopWhy::None,
                },
            ]
        );
    }
}
