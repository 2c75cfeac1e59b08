//! A Bundle's status from what its pass saw, planned and did: each replica's jobs (where they
//! run, their state by the planner, the trace of their last placement), the replicas' restart
//! counts, and the phase and conditions by the planner's verdict
//! ([`automanager_policy::bundle::verdict`]). Pure: the pass gathers the facts and writes the
//! answer.

use automanager_api as api;
use automanager_placement as pl;
use automanager_policy::bundle::{self as plan, JobPhase, Need, PlacementResult};
use chrono::{DateTime, Utc};

use crate::trace_summary;

/// A placement decision, and what it was for.
#[derive(Clone, Copy, Debug)]
pub struct Decided<'a> {
    pub decision: &'a pl::Decision,
    pub recovery: bool,
    pub at: DateTime<Utc>,
    /// Bronze jobs stopped to make room for this recovery.
    pub preempted: Option<&'a api::Preemption>,
}

impl Decided<'_> {
    /// Whether the decision is about `job` (it placed it, could not, or asked for a node for
    /// its replica).
    pub fn touches(&self, job: &str) -> bool {
        match &self.decision.outcome {
            pl::Outcome::Placed { assignments, .. } => {
                assignments.iter().any(|a| a.job_name == job)
            }
            pl::Outcome::Unplaceable { jobs } => jobs.iter().any(|j| j.job_name == job),
            pl::Outcome::Provision { .. } => true,
        }
    }

    /// The node the decision chose for `job`.
    pub fn node_for(&self, job: &str) -> Option<&str> {
        match &self.decision.outcome {
            pl::Outcome::Placed { assignments, .. } => assignments
                .iter()
                .find(|a| a.job_name == job)
                .map(|a| a.node.as_str()),
            _ => None,
        }
    }

    /// The decision as `job`'s trace in status: for a replica split across pools, the job's
    /// own pool and the pools it left.
    pub fn trace(&self, job: &str) -> api::PlacementTraceSummary {
        let mut t = trace_summary(
            &self.decision.summary_for_job(job),
            self.recovery,
            self.at,
            self.node_for(job),
        );
        t.preempted = self.preempted.cloned();
        t
    }
}

/// The trace status shows for `job`: this pass's decision when it is about the job; else a
/// decision made in a pass whose status write waited (`remembered`), when newer than what
/// status shows; else what status shows.
pub fn last_placement(
    job: &str,
    now: Option<Decided<'_>>,
    remembered: Option<Decided<'_>>,
    previous: Option<&api::PlacementTraceSummary>,
) -> Option<api::PlacementTraceSummary> {
    if let Some(d) = now.filter(|d| d.touches(job)) {
        return Some(d.trace(job));
    }
    match remembered {
        Some(d) if d.touches(job) && previous.is_none_or(|p| p.decided_at < d.at) => {
            Some(d.trace(job))
        }
        _ => previous.cloned(),
    }
}

/// One job as the pass saw it.
#[derive(Clone, Debug)]
pub struct JobFacts<'a> {
    pub name: &'a str,
    /// Manager's id, once the mirror shows the job.
    pub job_id: Option<&'a str>,
    pub phase: JobPhase,
    /// What the planner says it needs.
    pub need: Need,
    /// Its node (empty when none), and that node's pool and zone (empty when unknown).
    pub node: &'a str,
    pub pool: String,
    pub zone: String,
    /// The configuration Manager holds for it, and the one its spec asks for.
    pub config: &'a [u8],
    pub wanted_config: Vec<u8>,
    /// The trace status shows for it ([`last_placement`]).
    pub last_placement: Option<api::PlacementTraceSummary>,
}

/// One replica as the pass saw it and placed it.
#[derive(Clone, Debug)]
pub struct ReplicaFacts<'a> {
    pub replica: u32,
    /// Restarts within the last hour, and when.
    pub restarts: u32,
    pub restart_times: Vec<DateTime<Utc>>,
    /// How its placement in this pass went.
    pub result: &'a PlacementResult,
    pub jobs: Vec<JobFacts<'a>>,
}

/// Everything a Bundle's status is made from.
#[derive(Clone, Debug)]
pub struct StatusFacts<'a> {
    /// The status the pass read: its conditions carry over.
    pub prev: &'a api::BundleStatus,
    /// The retry marker the pass acted on, if any.
    pub retry: Option<String>,
    pub generation: Option<i64>,
    pub now: DateTime<Utc>,
    /// Why the bundle is Broken, when it is.
    pub broken: Option<&'a str>,
    /// Why its disruption windows cannot be read, when they cannot (its voluntary moves are
    /// held meanwhile).
    pub unreadable_windows: Option<&'a str>,
    pub replicas: Vec<ReplicaFacts<'a>>,
}

/// The status for `f`.
pub fn bundle_status(f: &StatusFacts<'_>) -> api::BundleStatus {
    let mut status = api::BundleStatus {
        last_retry: f.retry.clone().or_else(|| f.prev.last_retry.clone()),
        conditions: f.prev.conditions.clone(),
        ..Default::default()
    };
    let mut states: Vec<Vec<api::JobState>> = Vec::new();
    for r in &f.replicas {
        let restarts = i32::try_from(r.restarts).unwrap_or(i32::MAX);
        let jobs: Vec<api::JobStatus> = r
            .jobs
            .iter()
            .map(|j| job_status(j, r.result, restarts))
            .collect();
        states.push(jobs.iter().map(|j| j.state).collect());
        status.replicas.push(api::ReplicaStatus {
            replica: i32::try_from(r.replica).unwrap_or(i32::MAX),
            restarts_last_hour: restarts,
            restart_times: r.restart_times.clone(),
            jobs,
        });
    }
    let results: Vec<&PlacementResult> = f.replicas.iter().map(|r| r.result).collect();
    let v = plan::verdict(&states, &results, f.broken);
    status.phase = v.phase;
    status.placed_replicas = i32::try_from(v.placed_replicas).unwrap_or(i32::MAX);
    status.observed_generation = f.generation;
    // Windows that cannot be read stall the bundle (its jobs still run and recover), unless it
    // is Broken, which says more: the person must fix the spec either way.
    let (standing, reason, message) = match f.unreadable_windows {
        Some(why) if f.broken.is_none() => (
            automanager_policy::Standing::Stalled,
            "InvalidSpec",
            api::bounded::join_bounded(
                &[
                    format!("spec.disruption.windows cannot be read: {why}"),
                    "every voluntary move of this bundle (drain, consolidation, rebalance) is held until they are fixed; its jobs still run and recover".to_owned(),
                    v.message,
                ],
                "; ",
                api::bounded::MAX_CONDITION_MESSAGE,
            ),
        ),
        _ => (v.standing, v.reason, v.message),
    };
    api::set_standing(
        &mut status.conditions,
        standing,
        reason,
        message,
        f.generation,
        f.now,
    );
    let broken = match f.broken {
        Some(why) => (api::ConditionStatus::True, "RestartCeilingExceeded", why),
        None => (api::ConditionStatus::False, "WithinRestartCeiling", ""),
    };
    api::set_condition(
        &mut status.conditions,
        api::Condition::new("Broken", broken.0, broken.1, broken.2, f.generation, f.now),
    );
    // Jobs their band dropped on purpose: beside the standing, which stays Ready for them.
    let dropped: Vec<String> = status
        .replicas
        .iter()
        .flat_map(|r| {
            r.jobs
                .iter()
                .filter(|j| j.state == api::JobState::Dropped)
                .map(move |j| format!("replica {} job {}", r.replica, j.job_name))
        })
        .collect();
    let (on, reason, message) = plan::dropped_jobs(&dropped);
    let on = if on {
        api::ConditionStatus::True
    } else {
        api::ConditionStatus::False
    };
    api::set_condition(
        &mut status.conditions,
        api::Condition::new(plan::DEGRADED, on, reason, message, f.generation, f.now),
    );
    status
}

/// A job's status: its state by the planner, and where it runs while it holds a node.
fn job_status(j: &JobFacts<'_>, result: &PlacementResult, restarts: i32) -> api::JobStatus {
    let state = plan::job_state(j.phase, j.need, result);
    let holds = matches!(
        state,
        api::JobState::Running | api::JobState::Starting | api::JobState::Stopping
    );
    let shown = |v: &str| (!v.is_empty() && holds).then(|| v.to_owned());
    api::JobStatus {
        config_digest: api::config_digest(j.config),
        config_applied: j.job_id.map(|_| j.config == j.wanted_config.as_slice()),
        job_name: j.name.to_owned(),
        job_id: j.job_id.map(str::to_owned),
        node_id: shown(j.node),
        pool: shown(&j.pool),
        zone: shown(&j.zone),
        state,
        restarts_last_hour: restarts,
        last_placement: j.last_placement.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use automanager_policy::bundle::{Blocked, BlockedCause};

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_772_366_400 + secs, 0).unwrap_or_default()
    }

    fn placed(node: &str) -> pl::Decision {
        pl::Decision {
            bundle_id: "live.news".into(),
            replica_index: 0,
            outcome: pl::Outcome::Placed {
                pool: "east".into(),
                assignments: vec![pl::Assignment {
                    job_name: "enc".into(),
                    node: node.into(),
                    zone: None,
                    node_pending: false,
                    capacity: 10.0,
                    cores: 1,
                    score: pl::NodeScore {
                        tier: pl::Tier::Node,
                        free_capacity_after: 90.0,
                        free_cores_after: 15,
                    },
                }],
            },
            trace: pl::Trace::default(),
        }
    }

    #[test]
    fn a_job_of_a_replica_split_across_pools_shows_its_own_pool_and_why_it_left_the_first() {
        let mut d = placed("n1");
        let pl::Outcome::Placed { assignments, .. } = &mut d.outcome else {
            unreachable!("placed() places");
        };
        let mut gpu = assignments[0].clone();
        gpu.job_name = "infer".into();
        gpu.node = "g1".into();
        assignments.push(gpu);
        let attempt = |pool: &str, outcome, reason| pl::PoolAttempt {
            pool: pool.into(),
            outcome,
            reason,
            failed_job: None,
            rejections: Vec::new(),
            last_resort: false,
        };
        d.trace.jobs = vec![
            pl::JobPoolTrace {
                job_name: "enc".into(),
                pool: "east".into(),
                pools_tried: vec![attempt("east", pl::PoolOutcome::Placed, None)],
            },
            pl::JobPoolTrace {
                job_name: "infer".into(),
                pool: "gpu".into(),
                pools_tried: vec![
                    attempt(
                        "east",
                        pl::PoolOutcome::Left,
                        Some(pl::PoolLeftReason::NoNodeFits),
                    ),
                    attempt("gpu", pl::PoolOutcome::Placed, None),
                ],
            },
        ];
        let decided = Decided {
            decision: &d,
            recovery: false,
            at: at(0),
            preempted: None,
        };
        let t = decided.trace("infer");
        assert_eq!(t.pool.as_deref(), Some("gpu"));
        assert_eq!(t.node.as_deref(), Some("g1"));
        assert_eq!(
            t.pools_tried,
            vec![
                api::PoolAttempt {
                    pool: "east".into(),
                    outcome: api::PlacementOutcome::Unplaceable,
                    reason: "noNodeFits".into(),
                },
                api::PoolAttempt {
                    pool: "gpu".into(),
                    outcome: api::PlacementOutcome::Placed,
                    reason: String::new(),
                },
            ]
        );
        let t = decided.trace("enc");
        assert_eq!(t.pool.as_deref(), Some("east"));
        assert_eq!(t.node.as_deref(), Some("n1"));
        assert_eq!(t.pools_tried.len(), 1);
    }

    fn job<'a>(phase: JobPhase, need: Need, node: &'a str) -> JobFacts<'a> {
        JobFacts {
            name: "enc",
            job_id: Some("live.news/0/enc"),
            phase,
            need,
            node,
            pool: "east".into(),
            zone: "z1".into(),
            config: b"",
            wanted_config: Vec::new(),
            last_placement: None,
        }
    }

    #[test]
    fn this_passs_decision_wins_then_a_newer_remembered_one_then_what_status_shows() {
        let now_d = placed("n2");
        let old_d = placed("n1");
        let now = Decided {
            decision: &now_d,
            recovery: true,
            at: at(20),
            preempted: None,
        };
        let remembered = Decided {
            decision: &old_d,
            recovery: false,
            at: at(10),
            preempted: None,
        };
        let t = last_placement("enc", Some(now), Some(remembered), None).unwrap_or_else(|| {
            panic!("a trace");
        });
        assert_eq!((t.node.as_deref(), t.recovery), (Some("n2"), true));
        let shown = remembered.trace("enc");
        let older = api::PlacementTraceSummary {
            decided_at: at(5),
            ..shown.clone()
        };
        assert_eq!(
            last_placement("enc", None, Some(remembered), Some(&older)),
            Some(shown.clone()),
            "a remembered decision newer than status"
        );
        let newer = api::PlacementTraceSummary {
            decided_at: at(15),
            ..shown
        };
        assert_eq!(
            last_placement("enc", None, Some(remembered), Some(&newer)),
            Some(newer.clone()),
            "status already shows a newer one"
        );
        assert_eq!(
            last_placement("other", Some(now), None, Some(&newer)),
            Some(newer),
            "a decision about other jobs"
        );
    }

    #[test]
    fn a_status_shows_where_jobs_run_only_while_they_hold_a_node_and_the_verdicts_phase() {
        let prev = api::BundleStatus::default();
        let ok = PlacementResult::default();
        let blocked = PlacementResult {
            unplaceable: Some(Blocked {
                cause: BlockedCause::NoCapacity,
                message: "replica 1 cannot be placed: enc: no room".into(),
            }),
            ..PlacementResult::default()
        };
        let status = bundle_status(&StatusFacts {
            prev: &prev,
            retry: Some("r1".into()),
            generation: Some(3),
            now: at(0),
            broken: None,
            unreadable_windows: None,
            replicas: vec![
                ReplicaFacts {
                    replica: 0,
                    restarts: 2,
                    restart_times: vec![at(-60), at(-30)],
                    result: &ok,
                    jobs: vec![job(JobPhase::Running, Need::Nothing, "n1")],
                },
                ReplicaFacts {
                    replica: 1,
                    restarts: 0,
                    restart_times: Vec::new(),
                    result: &blocked,
                    jobs: vec![job(JobPhase::Failed, Need::Recover, "n9")],
                },
            ],
        });
        assert_eq!(status.observed_generation, Some(3));
        assert_eq!(status.last_retry.as_deref(), Some("r1"));
        assert_eq!(status.placed_replicas, 1);
        let r0 = &status.replicas[0].jobs[0];
        assert_eq!(
            (
                r0.node_id.as_deref(),
                r0.zone.as_deref(),
                r0.restarts_last_hour
            ),
            (Some("n1"), Some("z1"), 2)
        );
        let r1 = &status.replicas[1].jobs[0];
        assert_eq!(
            (r1.node_id.as_deref(), r1.state),
            (None, api::JobState::Unplaceable)
        );
        let stalled = api::find_condition(&status.conditions, "Stalled").map(|c| c.is_true());
        assert_eq!(stalled, Some(true), "{:?}", status.conditions);
        let broken = api::find_condition(&status.conditions, "Broken").map(|c| c.reason.clone());
        assert_eq!(broken.as_deref(), Some("WithinRestartCeiling"));
    }

    #[test]
    fn jobs_dropped_by_their_band_leave_the_bundle_ready_and_degraded_naming_them() {
        let prev = api::BundleStatus::default();
        let ok = PlacementResult::default();
        let facts = |need| StatusFacts {
            prev: &prev,
            retry: None,
            generation: Some(4),
            now: at(0),
            broken: None,
            unreadable_windows: None,
            replicas: vec![
                ReplicaFacts {
                    replica: 0,
                    restarts: 0,
                    restart_times: Vec::new(),
                    result: &ok,
                    jobs: vec![job(JobPhase::Running, Need::Nothing, "n1")],
                },
                ReplicaFacts {
                    replica: 1,
                    restarts: 0,
                    restart_times: Vec::new(),
                    result: &ok,
                    jobs: vec![job(JobPhase::Failed, need, "n2")],
                },
            ],
        };
        let status = bundle_status(&facts(Need::Dropped));
        assert_eq!(status.phase, api::BundlePhase::Degraded);
        assert_eq!(
            api::kstatus::standing(&status.conditions),
            Some(api::Standing::Ready),
            "{:?}",
            status.conditions
        );
        let ready = api::find_condition(&status.conditions, "Ready").expect("Ready");
        assert_eq!(ready.reason, "RunningWithDrops");
        let degraded = api::find_condition(&status.conditions, "Degraded").expect("Degraded");
        assert!(degraded.is_true());
        assert_eq!(degraded.reason, "JobsDropped");
        assert_eq!(degraded.observed_generation, Some(4));
        assert!(
            degraded.message.contains("replica 1 job enc")
                && !degraded.message.contains("replica 0"),
            "{}",
            degraded.message
        );
        // Retried and running again: no longer Degraded.
        let status = bundle_status(&facts(Need::Nothing));
        let degraded = api::find_condition(&status.conditions, "Degraded").expect("Degraded");
        assert_eq!(
            (degraded.is_true(), degraded.reason.as_str()),
            (false, "NoJobsDropped")
        );
    }

    #[test]
    fn windows_that_cannot_be_read_stall_a_running_bundle_naming_the_window() {
        let prev = api::BundleStatus::default();
        let ok = PlacementResult::default();
        let facts = |unreadable| StatusFacts {
            prev: &prev,
            retry: None,
            generation: Some(2),
            now: at(0),
            broken: None,
            unreadable_windows: unreadable,
            replicas: vec![ReplicaFacts {
                replica: 0,
                restarts: 0,
                restart_times: Vec::new(),
                result: &ok,
                jobs: vec![job(JobPhase::Running, Need::Nothing, "n1")],
            }],
        };
        let ready = bundle_status(&facts(None));
        assert!(api::find_condition(&ready.conditions, "Ready").is_some_and(|c| c.is_true()));
        let why = "schedule \"0 0 31 2 *\" never matches a date (within nine years)";
        let status = bundle_status(&facts(Some(why)));
        let stalled = api::find_condition(&status.conditions, "Stalled").expect("Stalled");
        assert!(stalled.is_true());
        assert_eq!(stalled.reason, "InvalidSpec");
        assert!(
            stalled.message.contains("0 0 31 2 *") && stalled.message.contains("held"),
            "{}",
            stalled.message
        );
        assert!(api::find_condition(&status.conditions, "Ready").is_some_and(|c| !c.is_true()));
        assert_eq!(
            status.replicas[0].jobs[0].state,
            api::JobState::Running,
            "its jobs still run"
        );
    }
}
