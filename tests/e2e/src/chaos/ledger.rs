//! What the chaos runner counts beside the invariants, from Manager's state as a Watch shows it
//! revision by revision: every touch of the foreign client's work ([`ForeignBook`]) and every
//! deadline a reclaim notice set that the operator missed ([`DeadlineBook`]).
//!
//! Both are pure: the runner turns each revision of its mirror into a [`View`] and feeds it in;
//! the unit tests feed hand-made views.

use std::collections::{BTreeMap, BTreeSet};

use crate::reliability::{InstanceState, operator_id};

/// Why an instance stopped, as Manager says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopWhy {
    /// Not stopped, or failed by itself (a crash).
    None,
    /// A `StopJob` call.
    Requested,
    /// A `TerminateNode` call on its node.
    NodeTerminated,
    /// Its node died (a kill, a zone outage, a reclaim notice's deadline).
    NodeLost,
    /// Its bundle was deleted or no longer has it.
    BundleRemoved,
    /// It was the source of a migration that completed.
    Migrated,
    /// It was the target of a migration that was aborted.
    MigrationAborted,
    /// Handed to its band's recovery by the caller.
    HandedToRecovery,
}

/// One instance of a job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceView {
    pub node_id: String,
    /// The job's normal instance (not a migration target).
    pub normal: bool,
    pub state: InstanceState,
    pub started_at_ms: i64,
    pub stop: StopWhy,
}

/// One job: one replica of one job name of a bundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobView {
    pub job_id: String,
    pub bundle_id: String,
    pub instances: Vec<InstanceView>,
}

/// One node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    pub id: String,
    pub terminated: bool,
    /// When a reclaim notice says Manager takes it (0: no notice).
    pub reclaim_at_ms: i64,
}

/// Manager's state at one revision, as far as the books care.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct View {
    pub nodes: Vec<NodeView>,
    pub jobs: Vec<JobView>,
    /// Every registered bundle, with its generation.
    pub bundles: BTreeMap<String, u64>,
}

/// One instance, told apart from the others of its job.
type InstanceKey = (String, String, i64, bool);

/// The foreign client's own record of what it asked Manager to do, and every change to its work
/// that it did not ask for: a start, a stop, a migration, a node terminated under it, its bundle
/// deleted or changed. What Manager does by itself (a node that dies, a job that crashes) is no
/// one's touch.
#[derive(Clone, Debug, Default)]
pub struct ForeignBook {
    /// Its bundles, with the generation it registered (or last saw changed); `None` until
    /// Manager's state first shows one whose generation the call did not answer.
    bundles: BTreeMap<String, Option<u64>>,
    /// Its bundles Manager's state has shown: only one seen can be found gone (the Watch may
    /// show a registration after the call that made it has returned).
    shown: BTreeSet<String>,
    /// Bundles it asked to delete.
    deleting: BTreeSet<String>,
    /// Starts it asked for and has not seen yet, by job: the nodes.
    starts: BTreeMap<String, Vec<String>>,
    /// Stops it asked for and has not seen yet, by job.
    stops: BTreeMap<String, usize>,
    seen: BTreeSet<InstanceKey>,
    judged: BTreeSet<InstanceKey>,
    touched: BTreeSet<String>,
    /// Its bundles and instances Manager's state has shown, kept through a wipe.
    shown_count: (usize, usize),
}

impl ForeignBook {
    /// It registered `bundle`, which Manager stored at `generation`.
    pub fn registered(&mut self, bundle: &str, generation: u64) {
        self.bundles.insert(bundle.to_owned(), Some(generation));
    }

    /// It stored `bundle` through a call that does not answer what Manager stored (the
    /// published API's `CreateJob`): the first generation Manager's state shows is its own.
    pub fn registered_unseen(&mut self, bundle: &str) {
        self.bundles.insert(bundle.to_owned(), None);
    }

    /// It is about to ask for `job` to start on `node`.
    pub fn asked_start(&mut self, job: &str, node: &str) {
        self.starts
            .entry(job.to_owned())
            .or_default()
            .push(node.to_owned());
    }

    /// The start it asked for was refused (nothing will start).
    pub fn start_refused(&mut self, job: &str, node: &str) {
        if let Some(nodes) = self.starts.get_mut(job)
            && let Some(i) = nodes.iter().position(|n| n == node)
        {
            nodes.remove(i);
        }
    }

    /// It is about to ask for `job` to stop.
    pub fn asked_stop(&mut self, job: &str) {
        *self.stops.entry(job.to_owned()).or_default() += 1;
    }

    /// The stop it asked for was refused (nothing will stop).
    pub fn stop_refused(&mut self, job: &str) {
        if let Some(n) = self.stops.get_mut(job) {
            *n = n.saturating_sub(1);
        }
    }

    /// It is about to ask for `bundle` to be deleted.
    pub fn asked_delete(&mut self, bundle: &str) {
        self.deleting.insert(bundle.to_owned());
    }

    /// Manager lost everything (started again with its state emptied): so did the client.
    pub fn wiped(&mut self) {
        let touched = std::mem::take(&mut self.touched);
        *self = ForeignBook {
            touched,
            shown_count: self.shown_count,
            ..ForeignBook::default()
        };
    }

    /// Whether `bundle_id` is one of the client's.
    pub fn owns(&self, bundle_id: &str) -> bool {
        self.bundles.contains_key(bundle_id)
    }

    /// Judges what changed in `view`.
    pub fn observe(&mut self, view: &View) {
        for (id, mine) in self.bundles.iter_mut() {
            match view.bundles.get(id) {
                Some(g) if mine.is_none() => {
                    self.shown_count.0 += usize::from(self.shown.insert(id.clone()));
                    *mine = Some(*g);
                }
                Some(g) if *mine != Some(*g) => {
                    self.shown_count.0 += usize::from(self.shown.insert(id.clone()));
                    self.touched.insert(format!(
                        "bundle {id}: changed by another client (generation {} -> {g})",
                        mine.unwrap_or_default()
                    ));
                    *mine = Some(*g);
                }
                Some(_) => {
                    self.shown_count.0 += usize::from(self.shown.insert(id.clone()));
                }
                None if self.shown.contains(id) && !self.deleting.contains(id) => {
                    self.touched
                        .insert(format!("bundle {id}: deleted by another client"));
                }
                None => {}
            }
        }
        for job in &view.jobs {
            if !self.owns(&job.bundle_id) {
                continue;
            }
            for i in &job.instances {
                let key = (
                    job.job_id.clone(),
                    i.node_id.clone(),
                    i.started_at_ms,
                    i.normal,
                );
                if self.seen.insert(key.clone()) {
                    self.shown_count.1 += 1;
                    self.judge_start(&job.job_id, i);
                }
                let ended = matches!(i.state, InstanceState::Stopping | InstanceState::Ended);
                if ended && self.judged.insert(key) {
                    self.judge_stop(job, i);
                }
            }
        }
    }

    fn judge_start(&mut self, job: &str, i: &InstanceView) {
        if !i.normal {
            self.touched.insert(format!(
                "{job}: a migration target started on {}",
                i.node_id
            ));
            return;
        }
        let asked = self.starts.get_mut(job).and_then(|nodes| {
            let at = nodes.iter().position(|n| *n == i.node_id)?;
            Some(nodes.remove(at))
        });
        if asked.is_none() {
            self.touched
                .insert(format!("{job}: started on {} by another client", i.node_id));
        }
    }

    fn judge_stop(&mut self, job: &JobView, i: &InstanceView) {
        let node = &i.node_id;
        let id = &job.job_id;
        match i.stop {
            StopWhy::None | StopWhy::NodeLost => {}
            StopWhy::Requested => match self.stops.get_mut(id) {
                Some(n) if *n > 0 => *n -= 1,
                _ => {
                    self.touched
                        .insert(format!("{id}: stopped on {node} by another client"));
                }
            },
            StopWhy::BundleRemoved if self.deleting.contains(&job.bundle_id) => {}
            StopWhy::BundleRemoved => {
                self.touched.insert(format!(
                    "{id}: removed on {node} with its bundle by another client"
                ));
            }
            StopWhy::NodeTerminated => {
                self.touched
                    .insert(format!("{id}: its node {node} was terminated under it"));
            }
            why => {
                self.touched.insert(format!("{id}: {why:?} on {node}"));
            }
        }
    }

    /// What of its work Manager's state has shown: `(bundles, instances)`, so a run tells a
    /// client whose work never showed (nothing to touch) from one left alone.
    pub fn shown(&self) -> (usize, usize) {
        self.shown_count
    }

    /// Every touch seen, one line each.
    pub fn touched(&self) -> &BTreeSet<String> {
        &self.touched
    }
}

/// Reclaim notices and their deadlines: while a noticed node lives, every operator job with a
/// live normal instance on it is noted; when the node goes, each such job must have a normal
/// instance RUNNING elsewhere that started before the deadline. One that has not is a miss,
/// unless it left the node with its Bundle (deleted, or no longer asking for it).
#[derive(Clone, Debug, Default)]
pub struct DeadlineBook {
    /// Noticed nodes still alive: the deadline, and every job seen on them since the notice.
    watching: BTreeMap<String, (i64, BTreeSet<String>)>,
    judged: BTreeSet<(String, i64)>,
    misses: BTreeSet<String>,
}

impl DeadlineBook {
    /// Judges what changed in `view`.
    pub fn observe(&mut self, view: &View) {
        let jobs: BTreeMap<&str, &JobView> = view
            .jobs
            .iter()
            .filter(|j| operator_id(&j.bundle_id))
            .map(|j| (j.job_id.as_str(), j))
            .collect();
        for n in &view.nodes {
            if n.reclaim_at_ms <= 0 {
                // No notice (or Manager forgot it, started again emptied).
                if !n.terminated {
                    self.watching.remove(&n.id);
                }
                continue;
            }
            let key = (n.id.clone(), n.reclaim_at_ms);
            if self.judged.contains(&key) {
                continue;
            }
            let on: BTreeSet<String> = jobs
                .values()
                .filter(|j| {
                    j.instances.iter().any(|i| {
                        i.normal
                            && i.node_id == n.id
                            && (matches!(i.state, InstanceState::Starting | InstanceState::Running)
                                || i.stop == StopWhy::NodeLost)
                    })
                })
                .map(|j| j.job_id.clone())
                .collect();
            let entry = self
                .watching
                .entry(n.id.clone())
                .or_insert_with(|| (n.reclaim_at_ms, BTreeSet::new()));
            entry.0 = n.reclaim_at_ms;
            entry.1.extend(on);
            if !n.terminated {
                continue;
            }
            self.judged.insert(key);
            let (deadline, candidates) = self.watching.remove(&n.id).unwrap_or_default();
            for id in candidates {
                // Gone with its Bundle: nothing to move.
                let Some(job) = jobs.get(id.as_str()) else {
                    continue;
                };
                let left_with_bundle = job
                    .instances
                    .iter()
                    .any(|i| i.normal && i.node_id == n.id && i.stop == StopWhy::BundleRemoved);
                let elsewhere = job.instances.iter().any(|i| {
                    i.normal
                        && i.node_id != n.id
                        && i.state == InstanceState::Running
                        && i.started_at_ms <= deadline
                });
                if !elsewhere && !left_with_bundle {
                    self.misses.insert(format!(
                        "{id}: on {} until it went (deadline {deadline}), not running elsewhere",
                        n.id
                    ));
                }
            }
        }
    }

    /// Every miss, one line each.
    pub fn misses(&self) -> &BTreeSet<String> {
        &self.misses
    }

    /// How many noticed nodes went and were judged.
    pub fn judged(&self) -> usize {
        self.judged.len()
    }
}
