//! The bundle planner: per job and per replica of one Bundle, what is needed now, and what the
//! bundle's status says about it.
//!
//! The rules, from the `@norskvideo/norsk-auto-manager` TypeScript library's "Priority bands":
//!
//! - A job that runs or is starting needs nothing; one that is stopping makes its replica wait
//!   (nothing of the replica is placed until it has stopped, so a replica is placed whole), and
//!   so does one an unfinished Manager migration holds (a stop-then-start source is down before
//!   its target starts: Manager brings it back, not a second placement).
//! - A job never placed, or stopped on purpose, gets a **first placement**.
//! - A job that **failed**, lost its node (`NodeLost`, `NodeTerminated`) or was **handed to
//!   recovery** (a migration that failed past its point of no return, a drain whose migration of
//!   it failed; Manager records that as the stop reason, so it outlives the operator) is
//!   recovered by its band: `restart` places it again as a **recovery** (counted against
//!   `maxRestartsPerHour`, hot spares preferred for gold), `drop` (bronze by default) **drops** it:
//!   it stays down until the retry annotation or a spec change.
//! - More than `maxRestartsPerHour` restarts of a replica within a sliding hour marks the bundle
//!   **Broken**: with a ceiling of 6, six restarts are made and the seventh is refused.
//! - "A successful restart clears the count". By default (`ClearRestartsOn::StableRunning`, this
//!   project's rule) a replica whose every job has been Running for its band's
//!   `restartClearAfter` since the newest start has its count cleared: success is staying up, so
//!   a job that crashes right after each start still reaches the ceiling. With
//!   `ClearRestartsOn::SuccessfulRestart` (the library's rule, read literally) the count clears
//!   as soon as every job of the replica is Running again.
//!
//! Pure: the caller observes (the mirror, the previous status, the ledger) and passes plain data.

use std::collections::BTreeMap;

use crate::bounded::{MAX_CONDITION_MESSAGE, join_bounded};
use crate::vocab::{BundlePhase, ClearRestartsOn, JobState, OnFailure, Standing};

/// Where Manager says a job's normal instance is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobPhase {
    /// Registered, never started.
    Pending,
    /// Started on a node, not yet running.
    Starting,
    /// Running.
    Running,
    /// Being stopped.
    Stopping,
    /// Stopped.
    Stopped,
    /// Failed.
    Failed,
}

/// Why a stopped instance stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopCause {
    /// Nothing recorded.
    Unknown,
    /// Someone asked for the stop (a rollback, a migration's source, a user).
    Requested,
    /// Its node died or became unreachable.
    NodeLost,
    /// Its node was terminated (a `terminate` drain, say).
    NodeTerminated,
    /// Handed to its band's recovery by a failed migration or a drain's fallback.
    HandedToRecovery,
    /// Its bundle no longer has it, or it moved away (a completed migration's source).
    Gone,
}

/// One job of one replica, as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedJob {
    /// The job's name in the spec.
    pub job_name: String,
    /// Its normal instance's phase.
    pub phase: JobPhase,
    /// Why it stopped, when it did.
    pub stop_cause: StopCause,
    /// When its normal instance started (ms since the epoch; 0 when never).
    pub started_at_ms: i64,
    /// Manager accepted a start the mirror does not show yet: never start it twice.
    pub start_in_flight: bool,
    /// An unfinished Manager migration holds the job: Manager moves it (a stop-then-start
    /// source stops before its target starts), so the replica waits for the outcome.
    pub moving: bool,
    /// The previous status says it was dropped (so a drop is reported once, not every pass).
    pub dropped_before: bool,
}

/// A job's band, as it applies to this bundle (the operator's defaults with the bundle's
/// overrides).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BandRule {
    /// `restart` or `drop`.
    pub on_failure: OnFailure,
    /// The restart ceiling per replica per sliding hour.
    pub max_restarts_per_hour: u32,
    /// How long a restarted replica must run before its count is cleared (ms), under
    /// [`ClearRestartsOn::StableRunning`].
    pub restart_clear_after_ms: i64,
    /// Which rule clears the count.
    pub clear_restarts_on: ClearRestartsOn,
}

impl BandRule {
    /// How long every job of a restarted replica must have been Running before its count
    /// clears (ms): 0 under the library's rule, where being Running again is the success.
    pub fn clear_after_ms(&self) -> i64 {
        match self.clear_restarts_on {
            ClearRestartsOn::StableRunning => self.restart_clear_after_ms,
            ClearRestartsOn::SuccessfulRestart => 0,
        }
    }
}

/// What one job needs now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Running or on its way.
    Nothing,
    /// Being stopped: its replica waits.
    Wait,
    /// A first placement.
    Place,
    /// A recovery placement (restart by band).
    Recover,
    /// Dropped by its band: stays down.
    Dropped,
}

fn failed(job: &ObservedJob) -> bool {
    match job.phase {
        JobPhase::Failed => true,
        JobPhase::Stopped => matches!(
            job.stop_cause,
            StopCause::NodeLost | StopCause::NodeTerminated | StopCause::HandedToRecovery
        ),
        _ => false,
    }
}

/// What `job` needs. `undrop`: a retry or a spec change since the drop, which places a dropped
/// job again (as a first placement).
pub fn need(job: &ObservedJob, band: &BandRule, undrop: bool) -> Need {
    if job.start_in_flight {
        return Need::Nothing;
    }
    match job.phase {
        JobPhase::Running | JobPhase::Starting => Need::Nothing,
        JobPhase::Stopping => Need::Wait,
        _ if job.moving => Need::Wait,
        _ if failed(job) => match band.on_failure {
            OnFailure::Restart => Need::Recover,
            OnFailure::Drop if undrop => Need::Place,
            OnFailure::Drop => Need::Dropped,
        },
        JobPhase::Stopped | JobPhase::Pending | JobPhase::Failed => Need::Place,
    }
}

/// One replica's jobs, observed, each with its band.
#[derive(Clone, Debug)]
pub struct ReplicaInput<'a> {
    /// The replica index.
    pub replica: u32,
    /// Its jobs in spec order.
    pub jobs: &'a [(ObservedJob, BandRule)],
    /// Restarts of the replica within the last hour (the ledger's count).
    pub restarts_in_window: u32,
    /// A retry or a spec change since the last pass ([`need`]).
    pub undrop: bool,
    /// Now (ms since the epoch).
    pub now_ms: i64,
}

/// What to do with one replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplicaIntent {
    /// Nothing to place. `clear_restarts`: the replica has stayed up long enough since its
    /// newest start for its restart count to be cleared; `clear_in_ms`: when it will have, if it
    /// has restarts to clear and keeps running (so the caller can look again then).
    Settled {
        /// Clear the replica's restart count now.
        clear_restarts: bool,
        /// Milliseconds until the count may be cleared, while it has one to clear.
        clear_in_ms: Option<i64>,
    },
    /// A job is stopping: place nothing yet.
    Wait,
    /// Place these jobs together; `recovery` when any of them failed (counted, spares first).
    Place {
        /// The jobs to place, in spec order.
        jobs: Vec<String>,
        /// Whether this is a recovery placement.
        recovery: bool,
        /// The restart ceiling that applies (the lowest of the jobs' bands).
        max_restarts: u32,
    },
    /// The replica failed again with its restart count at the ceiling: the bundle is Broken.
    Broken {
        /// Restarts within the last hour.
        restarts: u32,
        /// The ceiling.
        max_restarts: u32,
    },
}

/// The plan for one replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplicaPlan {
    /// What to do.
    pub intent: ReplicaIntent,
    /// What each job needs, by name.
    pub needs: BTreeMap<String, Need>,
    /// Jobs dropped in this pass (not dropped before): an Event and a metric each.
    pub newly_dropped: Vec<String>,
}

/// Plans one replica.
pub fn plan_replica(input: &ReplicaInput<'_>) -> ReplicaPlan {
    let mut needs = BTreeMap::new();
    let mut newly_dropped = Vec::new();
    for (job, band) in input.jobs {
        let n = need(job, band, input.undrop);
        if n == Need::Dropped && !job.dropped_before {
            newly_dropped.push(job.job_name.clone());
        }
        needs.insert(job.job_name.clone(), n);
    }
    let of = |job: &ObservedJob| needs.get(&job.job_name).copied();
    let intent = if input.jobs.iter().any(|(j, _)| of(j) == Some(Need::Wait)) {
        ReplicaIntent::Wait
    } else {
        let to_place: Vec<&(ObservedJob, BandRule)> = input
            .jobs
            .iter()
            .filter(|(j, _)| matches!(of(j), Some(Need::Place | Need::Recover)))
            .collect();
        if to_place.is_empty() {
            let all_running = !input.jobs.is_empty()
                && input
                    .jobs
                    .iter()
                    .all(|(j, _)| j.phase == JobPhase::Running && !j.start_in_flight);
            let newest = input
                .jobs
                .iter()
                .map(|(j, _)| j.started_at_ms)
                .max()
                .unwrap_or(0);
            let clear_after = input
                .jobs
                .iter()
                .map(|(_, b)| b.clear_after_ms())
                .max()
                .unwrap_or(0);
            let up_for = input.now_ms.saturating_sub(newest);
            // Nothing to wait for under the library's rule, even when Manager's clock runs
            // ahead of ours (the start would look as if it were in the future).
            let clear_restarts = all_running && (clear_after <= 0 || up_for >= clear_after);
            ReplicaIntent::Settled {
                clear_restarts,
                clear_in_ms: (all_running && !clear_restarts && input.restarts_in_window > 0)
                    .then(|| clear_after.saturating_sub(up_for)),
            }
        } else {
            let recovery = to_place.iter().any(|(j, _)| of(j) == Some(Need::Recover));
            let max_restarts = to_place
                .iter()
                .map(|(_, b)| b.max_restarts_per_hour)
                .min()
                .unwrap_or(6);
            if recovery && input.restarts_in_window >= max_restarts {
                ReplicaIntent::Broken {
                    restarts: input.restarts_in_window,
                    max_restarts,
                }
            } else {
                ReplicaIntent::Place {
                    jobs: to_place.iter().map(|(j, _)| j.job_name.clone()).collect(),
                    recovery,
                    max_restarts,
                }
            }
        }
    };
    ReplicaPlan {
        intent,
        needs,
        newly_dropped,
    }
}

/// How a replica's placement in this pass went, for the status.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PlacementResult {
    /// The replica cannot be placed now, and why.
    pub unplaceable: Option<Blocked>,
    /// Waiting for a node being provisioned.
    pub provisioning: bool,
    /// The node it waits for could not be had yet and is asked for again later: why, and when.
    pub provisioning_retry: Option<String>,
}

/// A replica no pool can take now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub cause: BlockedCause,
    /// Per job (and pool), why; bounded by the caller.
    pub message: String,
}

/// What holds a replica back, most actionable first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum BlockedCause {
    /// Manager refused the node it needs, for good: the pool's spec or Manager must change.
    ProvisioningRefused,
    /// An elastic pool would make a node for it but is at its `maxNodes`.
    MaxNodes,
    /// Pools it names are being deleted: nothing new lands there (its users' recoveries may
    /// still use their nodes).
    PoolTerminating,
    /// No node fits and none can be made.
    NoCapacity,
}

/// A pool's `maxNodes` and the nodes it counts against it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaxNodes {
    pub bound: u32,
    pub nodes: u32,
}

impl BlockedCause {
    /// The conditions' reason.
    pub fn reason(self) -> &'static str {
        match self {
            BlockedCause::ProvisioningRefused => "ProvisioningRefused",
            BlockedCause::MaxNodes => "MaxNodesReached",
            BlockedCause::PoolTerminating => "PoolTerminating",
            BlockedCause::NoCapacity => "NoCapacity",
        }
    }
}

/// Why replica `r` cannot be placed, from the engine's unplaceable decision: its jobs' reasons
/// and the pools it tried. A pool left because it is at (or above) its `maxNodes` is named
/// first, with the bound and, when it has more, its nodes (`max_nodes` answers both per pool):
/// raising it, or freeing nodes there, is what places the replica, whatever the rejections of
/// the nodes it has.
pub fn unplaceable(
    r: u32,
    jobs: &[automanager_placement::JobUnplaceable],
    pools: &[automanager_placement::PoolAttempt],
    max_nodes: impl Fn(&str) -> Option<MaxNodes>,
) -> Blocked {
    use automanager_placement::PoolLeftReason;
    let at_max: Vec<String> = pools
        .iter()
        .filter(|p| p.reason == Some(PoolLeftReason::MaxNodesReached))
        .map(|p| {
            let (where_, bound) = match max_nodes(&p.pool) {
                Some(m) if m.nodes > m.bound => (
                    "above",
                    format!(" ({}; it has {} nodes)", m.bound, m.nodes),
                ),
                Some(m) => ("at", format!(" ({})", m.bound)),
                None => ("at", String::new()),
            };
            match &p.failed_job {
                Some(job) => format!(
                    "pool {} is {where_} its maxNodes{bound} and none of its nodes can take job {job}",
                    p.pool
                ),
                None => format!("pool {} is {where_} its maxNodes{bound}", p.pool),
            }
        })
        .collect();
    if !at_max.is_empty() {
        return Blocked {
            cause: BlockedCause::MaxNodes,
            message: format!(
                "replica {r} cannot be placed: {}; no new node is made there until nodes go or maxNodes is raised",
                at_max.join("; ")
            ),
        };
    }
    let terminating: Vec<&str> = pools
        .iter()
        .filter(|p| p.reason == Some(PoolLeftReason::Terminating))
        .map(|p| p.pool.as_str())
        .collect();
    if !terminating.is_empty() {
        let others: Vec<String> = pools
            .iter()
            .filter(|p| p.reason != Some(PoolLeftReason::Terminating))
            .map(|p| {
                let why = p.reason.map(|r| r.as_str()).unwrap_or("not placed");
                format!("{}: {why}", p.pool)
            })
            .collect();
        return Blocked {
            cause: BlockedCause::PoolTerminating,
            message: format!(
                "replica {r} cannot be placed: pool {} is being deleted: nothing new is placed or provisioned there (the jobs of Bundles already using it still recover on its nodes){}",
                terminating.join(", pool "),
                if others.is_empty() {
                    String::new()
                } else {
                    format!("; {}", others.join("; "))
                }
            ),
        };
    }
    let reasons: Vec<String> = jobs
        .iter()
        .map(|j| format!("{}: {}", j.job_name, j.reason))
        .collect();
    Blocked {
        cause: BlockedCause::NoCapacity,
        message: format!("replica {r} cannot be placed: {}", reasons.join("; ")),
    }
}

/// The state status shows for a job.
pub fn job_state(phase: JobPhase, need: Need, result: &PlacementResult) -> JobState {
    let state = match (need, phase) {
        (Need::Dropped, _) => JobState::Dropped,
        (_, JobPhase::Running) => JobState::Running,
        (_, JobPhase::Starting) => JobState::Starting,
        (_, JobPhase::Stopping) => JobState::Stopping,
        (_, JobPhase::Failed) => JobState::Failed,
        (_, JobPhase::Stopped) => JobState::Stopped,
        (_, JobPhase::Pending) => JobState::Pending,
    };
    match state {
        JobState::Pending | JobState::Failed | JobState::Stopped
            if result.unplaceable.is_some() =>
        {
            JobState::Unplaceable
        }
        JobState::Pending | JobState::Failed | JobState::Stopped if result.provisioning => {
            JobState::Provisioning
        }
        s => s,
    }
}

/// What the bundle's status says as a whole: its phase and kstatus standing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `status.phase`.
    pub phase: BundlePhase,
    /// Replicas whose every job runs.
    pub placed_replicas: u32,
    /// Ready / Reconciling / Stalled.
    pub standing: Standing,
    /// The conditions' reason.
    pub reason: &'static str,
    /// The conditions' message (bounded).
    pub message: String,
}

/// The verdict over every replica's job states and how each replica's placement went in this
/// pass (`results`); `broken` the Broken reason.
pub fn verdict(
    replicas: &[Vec<JobState>],
    results: &[&PlacementResult],
    broken: Option<&str>,
) -> Verdict {
    let blocked: Vec<&Blocked> = results
        .iter()
        .filter_map(|r| r.unplaceable.as_ref())
        .collect();
    let unplaceable: Vec<String> = blocked.iter().map(|b| b.message.clone()).collect();
    let blocked_by = blocked.iter().map(|b| b.cause).min();
    let provisioning = results.iter().any(|r| r.provisioning);
    let retrying: Vec<String> = results
        .iter()
        .filter_map(|r| r.provisioning_retry.clone())
        .collect();
    let total = u32::try_from(replicas.len()).unwrap_or(u32::MAX);
    let placed = replicas
        .iter()
        .filter(|r| !r.is_empty() && r.iter().all(|s| *s == JobState::Running))
        .count();
    let placed = u32::try_from(placed).unwrap_or(u32::MAX);
    let all = || replicas.iter().flatten();
    let any = |s: JobState| all().any(|x| *x == s);
    let any_dropped = any(JobState::Dropped);
    let any_unplaceable = any(JobState::Unplaceable);
    let any_busy = all().any(|s| {
        matches!(
            s,
            JobState::Pending
                | JobState::Provisioning
                | JobState::Starting
                | JobState::Stopping
                | JobState::Failed
                | JobState::Stopped
        )
    });
    let phase = if broken.is_some() {
        BundlePhase::Broken
    } else if placed == total && !any_dropped {
        BundlePhase::Ready
    } else if any_busy && !any_unplaceable {
        BundlePhase::Placing
    } else if any(JobState::Running) || any_dropped {
        BundlePhase::Degraded
    } else if any_unplaceable {
        BundlePhase::Pending
    } else {
        BundlePhase::Placing
    };
    let running = format!("{placed} of {total} replicas running");
    let (standing, reason, message) = match phase {
        BundlePhase::Ready => (Standing::Ready, "AllReplicasRunning", running),
        BundlePhase::Broken => (
            Standing::Stalled,
            "RestartCeilingExceeded",
            broken.unwrap_or_default().to_owned(),
        ),
        // Some job fits nowhere: no Ready until capacity or the spec changes, even if other
        // jobs are still being placed. The reason names what holds it back: a refusal from
        // Manager, a pool's maxNodes, or capacity.
        _ if !unplaceable.is_empty() => (
            Standing::Stalled,
            blocked_by.unwrap_or(BlockedCause::NoCapacity).reason(),
            join_bounded(&unplaceable, "; ", MAX_CONDITION_MESSAGE),
        ),
        // Jobs their band dropped on purpose, every other job running: the bundle runs what
        // its bands promise, so it is Ready; the drops are the `Degraded` condition's
        // ([`dropped_jobs`]), and stay down until a retry or a spec change.
        BundlePhase::Degraded => (
            Standing::Ready,
            "RunningWithDrops",
            format!(
                "{running}; every job runs but those their band dropped after they failed (onFailure: drop), as the Degraded condition lists; retry them with the automanager.norsk.io/retry annotation"
            ),
        ),
        _ if !retrying.is_empty() => (
            Standing::Reconciling,
            "ProvisioningRetrying",
            join_bounded(&retrying, "; ", MAX_CONDITION_MESSAGE),
        ),
        _ => (
            Standing::Reconciling,
            if provisioning {
                "Provisioning"
            } else {
                "Placing"
            },
            running,
        ),
    };
    Verdict {
        phase,
        placed_replicas: placed,
        standing,
        reason,
        message,
    }
}

/// The type of a bundle's condition that says whether jobs its bands dropped on purpose are
/// down. Not one of the kstatus three: a bundle with drops is still Ready (its bands promise no
/// more), so tools that read kstatus see it as Current, and this condition says what is missing.
pub const DEGRADED: &str = "Degraded";

/// The [`DEGRADED`] condition: whether it holds, its reason and message. `dropped` names the
/// jobs down because their band dropped them (as `replica 0 job enc`), in status order.
pub fn dropped_jobs(dropped: &[String]) -> (bool, &'static str, String) {
    if dropped.is_empty() {
        return (false, "NoJobsDropped", String::new());
    }
    let (one, verb) = if dropped.len() == 1 {
        ("job", "was")
    } else {
        ("jobs", "were")
    };
    let message = format!(
        "{} {one} {verb} dropped after failing, as {} band asks (onFailure: drop): {}; they stay down until a retry (the automanager.norsk.io/retry annotation) or a spec change",
        dropped.len(),
        if dropped.len() == 1 { "its" } else { "their" },
        dropped.join(", ")
    );
    (
        true,
        "JobsDropped",
        crate::bounded::clip(&message, MAX_CONDITION_MESSAGE).into_owned(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const HOUR_MS: i64 = 3_600_000;

    fn gold() -> BandRule {
        BandRule {
            on_failure: OnFailure::Restart,
            max_restarts_per_hour: 3,
            restart_clear_after_ms: 600_000,
            clear_restarts_on: ClearRestartsOn::StableRunning,
        }
    }

    /// Gold under the TypeScript library's rule: a restart that runs clears the count.
    fn gold_library_rule() -> BandRule {
        BandRule {
            clear_restarts_on: ClearRestartsOn::SuccessfulRestart,
            ..gold()
        }
    }

    fn bronze() -> BandRule {
        BandRule {
            on_failure: OnFailure::Drop,
            ..gold()
        }
    }

    fn job(name: &str, phase: JobPhase, cause: StopCause) -> ObservedJob {
        ObservedJob {
            job_name: name.into(),
            phase,
            stop_cause: cause,
            started_at_ms: 0,
            start_in_flight: false,
            moving: false,
            dropped_before: false,
        }
    }

    fn plan(jobs: &[(ObservedJob, BandRule)], restarts: u32) -> ReplicaPlan {
        plan_replica(&ReplicaInput {
            replica: 0,
            jobs,
            restarts_in_window: restarts,
            undrop: false,
            now_ms: HOUR_MS,
        })
    }

    #[test]
    fn the_need_table() {
        use JobPhase as P;
        use StopCause as C;
        let rows = [
            (P::Running, C::Unknown, Need::Nothing, Need::Nothing),
            (P::Starting, C::Unknown, Need::Nothing, Need::Nothing),
            (P::Stopping, C::Requested, Need::Wait, Need::Wait),
            (P::Pending, C::Unknown, Need::Place, Need::Place),
            (P::Stopped, C::Requested, Need::Place, Need::Place),
            (P::Stopped, C::Gone, Need::Place, Need::Place),
            (P::Failed, C::Unknown, Need::Recover, Need::Dropped),
            (P::Stopped, C::NodeLost, Need::Recover, Need::Dropped),
            (P::Stopped, C::NodeTerminated, Need::Recover, Need::Dropped),
            (
                P::Stopped,
                C::HandedToRecovery,
                Need::Recover,
                Need::Dropped,
            ),
        ];
        for (phase, cause, restart, drop) in rows {
            let j = job("j", phase, cause);
            assert_eq!(
                need(&j, &gold(), false),
                restart,
                "{phase:?} {cause:?} gold"
            );
            assert_eq!(
                need(&j, &bronze(), false),
                drop,
                "{phase:?} {cause:?} bronze"
            );
        }
    }

    #[test]
    fn a_start_manager_accepted_is_never_made_twice() {
        let mut j = job("j", JobPhase::Failed, StopCause::Unknown);
        j.start_in_flight = true;
        assert_eq!(need(&j, &gold(), false), Need::Nothing);
    }

    #[test]
    fn a_job_manager_is_moving_waits_for_the_migration_not_placed_again() {
        // A stop-then-start source has stopped (reason MIGRATED) and its target is not up yet.
        let mut j = job("j", JobPhase::Stopped, StopCause::Gone);
        j.moving = true;
        assert_eq!(need(&j, &gold(), false), Need::Wait);
        let p = plan(&[(j.clone(), gold())], 0);
        assert_eq!(p.intent, ReplicaIntent::Wait);
        // Once Manager's migration has ended, an unfinished move is a placement again.
        j.moving = false;
        assert_eq!(need(&j, &gold(), false), Need::Place);
    }

    #[test]
    fn a_retry_places_a_dropped_job_again_as_a_first_placement() {
        let j = job("j", JobPhase::Failed, StopCause::Unknown);
        assert_eq!(need(&j, &bronze(), true), Need::Place);
    }

    #[test]
    fn a_drop_is_reported_once() {
        let mut j = job("b", JobPhase::Stopped, StopCause::NodeLost);
        let p = plan(&[(j.clone(), bronze())], 0);
        assert_eq!(p.newly_dropped, vec!["b".to_owned()]);
        assert_eq!(
            p.intent,
            ReplicaIntent::Settled {
                clear_restarts: false,
                clear_in_ms: None
            }
        );
        j.dropped_before = true;
        assert!(plan(&[(j, bronze())], 0).newly_dropped.is_empty());
    }

    #[test]
    fn a_stopping_job_makes_the_whole_replica_wait() {
        let p = plan(
            &[
                (job("a", JobPhase::Stopping, StopCause::Requested), gold()),
                (job("b", JobPhase::Failed, StopCause::Unknown), gold()),
            ],
            0,
        );
        assert_eq!(p.intent, ReplicaIntent::Wait);
    }

    #[test]
    fn failed_jobs_are_placed_with_their_replica_as_a_recovery() {
        let p = plan(
            &[
                (job("a", JobPhase::Running, StopCause::Unknown), gold()),
                (job("b", JobPhase::Failed, StopCause::Unknown), gold()),
                (job("c", JobPhase::Pending, StopCause::Unknown), gold()),
            ],
            0,
        );
        assert_eq!(
            p.intent,
            ReplicaIntent::Place {
                jobs: vec!["b".into(), "c".into()],
                recovery: true,
                max_restarts: 3
            }
        );
    }

    #[test]
    fn the_ceiling_allows_max_restarts_and_breaks_on_the_next() {
        let jobs = [(job("a", JobPhase::Failed, StopCause::Unknown), gold())];
        assert!(matches!(plan(&jobs, 2).intent, ReplicaIntent::Place { .. }));
        assert_eq!(
            plan(&jobs, 3).intent,
            ReplicaIntent::Broken {
                restarts: 3,
                max_restarts: 3
            }
        );
        // A first placement is never refused by the ceiling.
        let first = [(job("a", JobPhase::Pending, StopCause::Unknown), gold())];
        assert!(matches!(
            plan(&first, 99).intent,
            ReplicaIntent::Place { .. }
        ));
    }

    #[test]
    fn the_lowest_ceiling_of_the_jobs_placed_applies() {
        let strict = BandRule {
            max_restarts_per_hour: 1,
            ..gold()
        };
        let jobs = [
            (job("a", JobPhase::Failed, StopCause::Unknown), gold()),
            (job("b", JobPhase::Failed, StopCause::Unknown), strict),
        ];
        assert!(matches!(
            plan(&jobs, 1).intent,
            ReplicaIntent::Broken {
                max_restarts: 1,
                ..
            }
        ));
    }

    #[test]
    fn a_replica_that_stayed_up_for_restart_clear_after_has_its_count_cleared() {
        let mut a = job("a", JobPhase::Running, StopCause::Unknown);
        a.started_at_ms = HOUR_MS - 600_000;
        assert_eq!(
            plan(&[(a.clone(), gold())], 2).intent,
            ReplicaIntent::Settled {
                clear_restarts: true,
                clear_in_ms: None
            }
        );
        a.started_at_ms = HOUR_MS - 599_000;
        assert_eq!(
            plan(&[(a.clone(), gold())], 2).intent,
            ReplicaIntent::Settled {
                clear_restarts: false,
                clear_in_ms: Some(1_000)
            },
            "the caller is told when to look again"
        );
        assert_eq!(
            plan(&[(a, gold())], 0).intent,
            ReplicaIntent::Settled {
                clear_restarts: false,
                clear_in_ms: None
            },
            "nothing to clear, nothing to wait for"
        );
    }

    #[test]
    fn under_the_librarys_rule_a_restart_clears_the_count_as_soon_as_the_replica_runs() {
        let mut a = job("a", JobPhase::Running, StopCause::Unknown);
        a.started_at_ms = HOUR_MS - 1_000;
        let settled = |clear_restarts| ReplicaIntent::Settled {
            clear_restarts,
            clear_in_ms: None,
        };
        assert_eq!(
            plan(&[(a.clone(), gold_library_rule())], 2).intent,
            settled(true),
            "running one second after the restart is success"
        );
        assert_eq!(
            plan(&[(a.clone(), gold())], 2).intent,
            ReplicaIntent::Settled {
                clear_restarts: false,
                clear_in_ms: Some(599_000)
            },
            "our rule waits for restartClearAfter"
        );
        // Manager's clock a little ahead of ours: the start looks as if it were in the future.
        a.started_at_ms = HOUR_MS + 5_000;
        assert_eq!(
            plan(&[(a.clone(), gold_library_rule())], 2).intent,
            settled(true)
        );
        // Not every job of the replica runs yet: no success.
        let b = job("b", JobPhase::Starting, StopCause::Unknown);
        assert_eq!(
            plan(
                &[(a.clone(), gold_library_rule()), (b, gold_library_rule())],
                2
            )
            .intent,
            settled(false)
        );
        // A replica whose jobs are in bands under both rules waits for the longest.
        a.started_at_ms = HOUR_MS - 1_000;
        let c = ObservedJob {
            started_at_ms: HOUR_MS - 1_000,
            ..job("c", JobPhase::Running, StopCause::Unknown)
        };
        assert_eq!(
            plan(&[(a, gold_library_rule()), (c, gold())], 2).intent,
            ReplicaIntent::Settled {
                clear_restarts: false,
                clear_in_ms: Some(599_000)
            }
        );
    }

    /// A job that runs for a minute after each restart, then fails: our rule counts every
    /// restart and breaks the bundle past the ceiling; the library's clears the count at each
    /// restart seen running, so the loop goes on.
    #[test]
    fn a_crash_loop_seen_running_breaks_the_bundle_under_our_rule_only() {
        let run = |band: BandRule| {
            let mut restarts = 0;
            for cycle in 0..10 {
                let mut up = job("a", JobPhase::Running, StopCause::Unknown);
                up.started_at_ms = HOUR_MS - 60_000;
                if let ReplicaIntent::Settled {
                    clear_restarts: true,
                    ..
                } = plan(&[(up, band)], restarts).intent
                {
                    restarts = 0;
                }
                let down = job("a", JobPhase::Failed, StopCause::Unknown);
                match plan(&[(down, band)], restarts).intent {
                    ReplicaIntent::Place { recovery: true, .. } => restarts += 1,
                    ReplicaIntent::Broken { .. } => return Some(cycle),
                    other => panic!("{other:?}"),
                }
            }
            None
        };
        assert_eq!(
            run(gold()),
            Some(3),
            "broken at the fourth failure (ceiling 3)"
        );
        assert_eq!(run(gold_library_rule()), None, "never broken");
    }

    #[test]
    fn job_states_show_unplaceable_and_provisioning_for_jobs_waiting_to_be_placed() {
        let unplaceable = blocked(BlockedCause::NoCapacity, "no room");
        let provisioning = PlacementResult {
            provisioning: true,
            ..Default::default()
        };
        let none = PlacementResult::default();
        assert_eq!(
            job_state(JobPhase::Pending, Need::Place, &unplaceable),
            JobState::Unplaceable
        );
        assert_eq!(
            job_state(JobPhase::Failed, Need::Recover, &provisioning),
            JobState::Provisioning
        );
        assert_eq!(
            job_state(JobPhase::Running, Need::Nothing, &unplaceable),
            JobState::Running
        );
        assert_eq!(
            job_state(JobPhase::Failed, Need::Dropped, &none),
            JobState::Dropped
        );
    }

    fn blocked(cause: BlockedCause, message: &str) -> PlacementResult {
        PlacementResult {
            unplaceable: Some(Blocked {
                cause,
                message: message.into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_verdict_table() {
        use JobState as S;
        let run = vec![S::Running];
        let none = PlacementResult::default();
        let v = verdict(&[run.clone(), run.clone()], &[], None);
        assert_eq!(
            (v.phase, v.standing, v.placed_replicas),
            (BundlePhase::Ready, Standing::Ready, 2)
        );
        let v = verdict(&[run.clone(), vec![S::Starting]], &[&none], None);
        assert_eq!(
            (v.phase, v.standing),
            (BundlePhase::Placing, Standing::Reconciling)
        );
        let provisioning = PlacementResult {
            provisioning: true,
            ..Default::default()
        };
        let v = verdict(
            &[run.clone(), vec![S::Provisioning]],
            &[&provisioning],
            None,
        );
        assert_eq!(v.reason, "Provisioning");
        // Dropped on purpose, the rest running: Ready (kstatus Current), phase Degraded.
        let v = verdict(&[run.clone(), vec![S::Dropped]], &[], None);
        assert_eq!(
            (v.phase, v.standing, v.reason),
            (BundlePhase::Degraded, Standing::Ready, "RunningWithDrops")
        );
        assert_eq!(v.standing.kstatus(), "Current");
        assert!(
            v.message.contains("1 of 2 replicas running"),
            "{}",
            v.message
        );
        // Dropped while another job is still being placed: in progress, not stalled.
        let v = verdict(&[vec![S::Dropped, S::Starting]], &[&none], None);
        assert_eq!(
            (v.phase, v.standing),
            (BundlePhase::Placing, Standing::Reconciling)
        );
        let no_room = blocked(BlockedCause::NoCapacity, "replica 0 cannot be placed");
        let v = verdict(&[vec![S::Unplaceable]], &[&no_room], None);
        assert_eq!(
            (v.phase, v.standing, v.reason),
            (BundlePhase::Pending, Standing::Stalled, "NoCapacity")
        );
        let v = verdict(
            &[run.clone(), vec![S::Unplaceable]],
            &[&none, &no_room],
            None,
        );
        assert_eq!((v.phase, v.reason), (BundlePhase::Degraded, "NoCapacity"));
        let v = verdict(&[run], &[], Some("replica 0 failed again"));
        assert_eq!(
            (v.phase, v.standing, v.reason),
            (
                BundlePhase::Broken,
                Standing::Stalled,
                "RestartCeilingExceeded"
            )
        );
    }

    #[test]
    fn the_degraded_condition_names_the_dropped_jobs() {
        assert_eq!(dropped_jobs(&[]), (false, "NoJobsDropped", String::new()));
        let (on, reason, message) = dropped_jobs(&["replica 0 job enc".into()]);
        assert_eq!((on, reason), (true, "JobsDropped"));
        assert!(
            message.starts_with("1 job was dropped after failing, as its band asks")
                && message.contains(": replica 0 job enc;")
                && message.contains("automanager.norsk.io/retry"),
            "{message}"
        );
        let (_, _, message) =
            dropped_jobs(&["replica 0 job enc".into(), "replica 1 job audio".into()]);
        assert!(
            message.contains("2 jobs were dropped")
                && message.contains("replica 0 job enc, replica 1 job audio"),
            "{message}"
        );
        let many: Vec<String> = (0..2000).map(|r| format!("replica {r} job enc")).collect();
        assert!(dropped_jobs(&many).2.len() <= MAX_CONDITION_MESSAGE);
    }

    #[test]
    fn a_replica_kept_out_of_a_pool_being_deleted_names_the_pool_not_capacity() {
        use automanager_placement::{JobUnplaceable, PoolAttempt, PoolLeftReason, PoolOutcome};
        let jobs = [JobUnplaceable {
            job_name: "enc".into(),
            reason: automanager_placement::UnplaceableReason::NoUsablePool,
        }];
        let left = |pool: &str, reason| PoolAttempt {
            pool: pool.into(),
            outcome: PoolOutcome::Left,
            reason: Some(reason),
            failed_job: None,
            rejections: Vec::new(),
            last_resort: false,
        };
        let b = unplaceable(
            0,
            &jobs,
            &[left("aws", PoolLeftReason::Terminating)],
            |_| None,
        );
        assert_eq!(b.cause, BlockedCause::PoolTerminating);
        assert_eq!(b.cause.reason(), "PoolTerminating");
        assert_eq!(
            b.message,
            "replica 0 cannot be placed: pool aws is being deleted: nothing new is placed or provisioned there (the jobs of Bundles already using it still recover on its nodes)"
        );
        let b = unplaceable(
            0,
            &jobs,
            &[
                left("aws", PoolLeftReason::Terminating),
                left("onprem", PoolLeftReason::NoNodeFits),
            ],
            |_| None,
        );
        assert!(b.message.ends_with("; onprem: noNodeFits"), "{}", b.message);
    }

    #[test]
    fn a_replica_held_back_by_a_pools_max_nodes_says_max_nodes_not_capacity() {
        use automanager_placement::{
            JobUnplaceable, PoolAttempt, PoolLeftReason, PoolOutcome, RejectReason,
            UnplaceableReason,
        };
        let jobs = [JobUnplaceable {
            job_name: "enc".into(),
            reason: UnplaceableReason::NoNodeFits {
                reason: Some(RejectReason::InsufficientCapacity),
            },
        }];
        let left = |pool: &str, reason| PoolAttempt {
            pool: pool.into(),
            outcome: PoolOutcome::Left,
            reason: Some(reason),
            failed_job: Some("enc".into()),
            rejections: Vec::new(),
            last_resort: false,
        };
        let bound = |p: &str| (p == "aws").then_some(MaxNodes { bound: 2, nodes: 2 });
        let b = unplaceable(
            1,
            &jobs,
            &[
                left("onprem", PoolLeftReason::NoNodeFits),
                left("aws", PoolLeftReason::MaxNodesReached),
            ],
            bound,
        );
        assert_eq!(b.cause, BlockedCause::MaxNodes);
        assert_eq!(
            b.message,
            "replica 1 cannot be placed: pool aws is at its maxNodes (2) and none of its nodes can take job enc; no new node is made there until nodes go or maxNodes is raised"
        );
        let b = unplaceable(
            1,
            &jobs,
            &[left("onprem", PoolLeftReason::NoNodeFits)],
            bound,
        );
        assert_eq!(b.cause, BlockedCause::NoCapacity);
        assert_eq!(
            b.message,
            "replica 1 cannot be placed: enc: no node fits (mostly: insufficientCapacity)"
        );
        // A lowered bound leaves the pool above it: it says so, and how many nodes it has.
        let b = unplaceable(
            1,
            &jobs,
            &[left("aws", PoolLeftReason::MaxNodesReached)],
            |_| Some(MaxNodes { bound: 2, nodes: 5 }),
        );
        assert_eq!(
            b.message,
            "replica 1 cannot be placed: pool aws is above its maxNodes (2; it has 5 nodes) and none of its nodes can take job enc; no new node is made there until nodes go or maxNodes is raised"
        );
    }

    #[test]
    fn the_reason_names_what_holds_a_replica_back_most_actionable_first() {
        use JobState as S;
        let states = [
            vec![S::Unplaceable],
            vec![S::Unplaceable],
            vec![S::Unplaceable],
        ];
        let no_room = blocked(BlockedCause::NoCapacity, "r0: no room");
        let max = blocked(BlockedCause::MaxNodes, "r1: pool p is at its maxNodes (2)");
        let refused = blocked(BlockedCause::ProvisioningRefused, "r2: Manager refused");
        let v = verdict(&states, &[&no_room, &max], None);
        assert_eq!(
            (v.standing, v.reason),
            (Standing::Stalled, "MaxNodesReached")
        );
        assert!(v.message.contains("r0: no room") && v.message.contains("maxNodes (2)"));
        let v = verdict(&states, &[&no_room, &max, &refused], None);
        assert_eq!(v.reason, "ProvisioningRefused");
        assert!(v.message.contains("Manager refused"), "{}", v.message);
    }

    #[test]
    fn a_node_asked_for_again_later_is_in_progress_and_says_why() {
        let retry = PlacementResult {
            provisioning: true,
            provisioning_retry: Some("CreateNode failed (unavailable); asked again in 4s".into()),
            ..Default::default()
        };
        let v = verdict(&[vec![JobState::Provisioning]], &[&retry], None);
        assert_eq!(
            (v.phase, v.standing, v.reason),
            (
                BundlePhase::Placing,
                Standing::Reconciling,
                "ProvisioningRetrying"
            )
        );
        assert!(v.message.contains("asked again in 4s"), "{}", v.message);
    }

    #[test]
    fn the_no_capacity_message_is_bounded() {
        let results: Vec<PlacementResult> = (0..500)
            .map(|i| {
                blocked(
                    BlockedCause::NoCapacity,
                    &format!("replica {i} cannot be placed: job-{i}: no node of pool p has room"),
                )
            })
            .collect();
        let refs: Vec<&PlacementResult> = results.iter().collect();
        let v = verdict(&[vec![JobState::Unplaceable]], &refs, None);
        assert!(v.message.len() <= MAX_CONDITION_MESSAGE);
    }

    fn arb_phase() -> impl Strategy<Value = JobPhase> {
        prop_oneof![
            Just(JobPhase::Pending),
            Just(JobPhase::Starting),
            Just(JobPhase::Running),
            Just(JobPhase::Stopping),
            Just(JobPhase::Stopped),
            Just(JobPhase::Failed),
        ]
    }

    fn arb_cause() -> impl Strategy<Value = StopCause> {
        prop_oneof![
            Just(StopCause::Unknown),
            Just(StopCause::Requested),
            Just(StopCause::NodeLost),
            Just(StopCause::NodeTerminated),
            Just(StopCause::HandedToRecovery),
            Just(StopCause::Gone),
        ]
    }

    fn arb_job() -> impl Strategy<Value = (ObservedJob, BandRule)> {
        (
            0u8..8,
            arb_phase(),
            arb_cause(),
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            1u32..8,
            any::<bool>(),
        )
            .prop_map(
                |(n, phase, cause, in_flight, dropped, drop_band, max, moving)| {
                    let band = BandRule {
                        on_failure: if drop_band {
                            OnFailure::Drop
                        } else {
                            OnFailure::Restart
                        },
                        max_restarts_per_hour: max,
                        restart_clear_after_ms: 600_000,
                        clear_restarts_on: ClearRestartsOn::StableRunning,
                    };
                    let job = ObservedJob {
                        job_name: format!("j{n}"),
                        phase,
                        stop_cause: cause,
                        started_at_ms: 0,
                        start_in_flight: in_flight,
                        moving,
                        dropped_before: dropped,
                    };
                    (job, band)
                },
            )
    }

    proptest! {
        #[test]
        fn a_plan_never_places_a_running_stopping_or_dropped_job_and_never_exceeds_the_ceiling(
            jobs in proptest::collection::vec(arb_job(), 1..8),
            restarts in 0u32..10,
            undrop in any::<bool>(),
        ) {
            // Job names are unique within a replica (the CRD says so).
            let mut seen = std::collections::BTreeSet::new();
            let jobs: Vec<_> = jobs.into_iter().filter(|(j, _)| seen.insert(j.job_name.clone())).collect();
            let p = plan_replica(&ReplicaInput { replica: 0, jobs: &jobs, restarts_in_window: restarts, undrop, now_ms: HOUR_MS });
            match &p.intent {
                ReplicaIntent::Place { jobs: placed, recovery, max_restarts } => {
                    for name in placed {
                        let (j, _) = jobs.iter().find(|(j, _)| &j.job_name == name).ok_or_else(|| TestCaseError::fail("unknown job"))?;
                        prop_assert!(!j.start_in_flight);
                        prop_assert!(!j.moving);
                        prop_assert!(matches!(j.phase, JobPhase::Pending | JobPhase::Stopped | JobPhase::Failed));
                    }
                    prop_assert!(!recovery || restarts < *max_restarts);
                }
                ReplicaIntent::Wait => prop_assert!(jobs.iter().any(|(j, _)| !j.start_in_flight && (j.phase == JobPhase::Stopping || j.moving))),
                ReplicaIntent::Broken { restarts: r, max_restarts } => prop_assert!(r >= max_restarts),
                ReplicaIntent::Settled { .. } => {}
            }
            for name in &p.newly_dropped {
                prop_assert_eq!(p.needs.get(name), Some(&Need::Dropped));
            }
        }
    }
}
