//! The handover phases one worker sees for one instance, as a pure state machine (no I/O).
//!
//! Order (design doc, "Migration"): worker → source `get-state`; source → `state` (or
//! `state-refused`, which ends it); the target is started with role `migrationTarget` and gets
//! `hello-ack{migration}` + `initial-state`; target → `target-ready`; worker → source
//! `cutover-ready`; source → `source-stopped-output`; worker → target `cutover-apply`;
//! target → `target-applied`. Either side, or the Manager, may abort until the source has stopped
//! output: on the source until it sends `source-stopped-output`, on the target until the worker
//! sends it `cutover-apply` (after which the only answer is `target-applied`, listing failures).
//!
//! Each worker tracks only its own side: the source's worker never sees the target's frames.

use crate::frame::{JobToWorker, WorkerToJob};

/// Which end of a migration an instance is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The running instance being moved.
    Source,
    /// The instance started with role `migrationTarget`.
    Target,
}

/// Where one instance is in its migration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Source: `get-state` sent, waiting for `state` / `state-refused`.
    AwaitingState,
    /// Source: `state` received, waiting for the Manager's `cutover-ready`.
    StateGiven,
    /// Source: `cutover-ready` sent, waiting for `source-stopped-output`.
    AwaitingSourceStop,
    /// Source: output stopped. Final.
    SourceStopped,
    /// Target: registered with its initial state; `initial-state` goes out on `hello`;
    /// waiting for `target-ready`.
    AwaitingTargetReady,
    /// Target: `target-ready` received, waiting for the Manager's `cutover-apply`.
    TargetReady,
    /// Target: `cutover-apply` sent, waiting for `target-applied`.
    AwaitingApplied,
    /// Target: `target-applied` received. Final.
    Applied,
    /// Source: `state-refused` received. Final.
    Refused,
    /// Aborted by the job or the Manager. Final.
    Aborted,
}

impl Phase {
    /// Whether the migration is over (a new one may start on this instance).
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Phase::SourceStopped | Phase::Applied | Phase::Refused | Phase::Aborted
        )
    }

    /// Whether `abort` is still allowed.
    pub fn is_abortable(self) -> bool {
        matches!(
            self,
            Phase::AwaitingState
                | Phase::StateGiven
                | Phase::AwaitingSourceStop
                | Phase::AwaitingTargetReady
                | Phase::TargetReady
        )
    }

    /// The phase's name in messages and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Phase::AwaitingState => "awaiting-state",
            Phase::StateGiven => "state-given",
            Phase::AwaitingSourceStop => "awaiting-source-stop",
            Phase::SourceStopped => "source-stopped",
            Phase::AwaitingTargetReady => "awaiting-target-ready",
            Phase::TargetReady => "target-ready",
            Phase::AwaitingApplied => "awaiting-applied",
            Phase::Applied => "applied",
            Phase::Refused => "refused",
            Phase::Aborted => "aborted",
        }
    }
}

/// One instance's migration as its worker sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migration {
    /// The migration id.
    pub id: String,
    /// Which end this instance is.
    pub side: Side,
    /// Where it is.
    pub phase: Phase,
}

/// A frame or command that does not fit the current phase.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PhaseError {
    /// The frame is not one this side sends at this point (closes the job's socket with 4400).
    #[error("unexpected `{frame}` {context}")]
    WrongPhase {
        /// The frame's type.
        frame: &'static str,
        /// Where the instance was.
        context: String,
    },
    /// The Manager named a migration this instance is not in.
    #[error("migration `{asked}` is not in progress on this instance{}", current.as_ref().map(|c| format!(" (current: `{c}`)")).unwrap_or_default())]
    UnknownMigration {
        /// The id asked for.
        asked: String,
        /// The instance's live migration, if any.
        current: Option<String>,
    },
    /// The Manager asked for a second migration while one is live.
    #[error("migration `{0}` is already in progress on this instance")]
    Busy(String),
}

fn context(m: Option<&Migration>) -> String {
    match m {
        None => "with no migration in progress".to_owned(),
        Some(m) => format!(
            "in phase `{}` of migration `{}` ({})",
            m.phase.name(),
            m.id,
            if m.side == Side::Source {
                "source"
            } else {
                "target"
            }
        ),
    }
}

/// The state of a target instance before its job connects.
pub fn new_target(id: impl Into<String>) -> Migration {
    Migration {
        id: id.into(),
        side: Side::Target,
        phase: Phase::AwaitingTargetReady,
    }
}

/// A frame from the job (other than `hello`): the next state, or why it breaks the protocol.
pub fn on_job_frame(m: Option<&Migration>, frame: &JobToWorker) -> Result<Migration, PhaseError> {
    let wrong = || PhaseError::WrongPhase {
        frame: frame.kind(),
        context: context(m),
    };
    let Some(cur) = m.filter(|m| !m.phase.is_final()) else {
        return Err(wrong());
    };
    let next = match (cur.side, cur.phase, frame) {
        (Side::Source, Phase::AwaitingState, JobToWorker::State { .. }) => Phase::StateGiven,
        (Side::Source, Phase::AwaitingState, JobToWorker::StateRefused { .. }) => Phase::Refused,
        (Side::Source, Phase::AwaitingSourceStop, JobToWorker::SourceStoppedOutput { .. }) => {
            Phase::SourceStopped
        }
        (Side::Target, Phase::AwaitingTargetReady, JobToWorker::TargetReady { .. }) => {
            Phase::TargetReady
        }
        (Side::Target, Phase::AwaitingApplied, JobToWorker::TargetApplied(_)) => Phase::Applied,
        (_, p, JobToWorker::Abort { .. }) if p.is_abortable() => Phase::Aborted,
        _ => return Err(wrong()),
    };
    Ok(Migration {
        phase: next,
        ..cur.clone()
    })
}

/// A frame the Manager wants sent to the job: the next state, or why it cannot be sent now.
/// `hello-ack` and `initial-state` are the listener's own and never pass through here.
pub fn on_worker_frame(
    m: Option<&Migration>,
    frame: &WorkerToJob,
) -> Result<Migration, PhaseError> {
    let live = m.filter(|m| !m.phase.is_final());
    let (id, next) = match frame {
        WorkerToJob::GetState { migration_id } => {
            if let Some(cur) = live {
                return Err(PhaseError::Busy(cur.id.clone()));
            }
            let id = migration_id.to_string_lossy().into_owned();
            return Ok(Migration {
                id,
                side: Side::Source,
                phase: Phase::AwaitingState,
            });
        }
        WorkerToJob::CutoverReady { migration_id, .. } => (
            migration_id,
            (Side::Source, Phase::StateGiven, Phase::AwaitingSourceStop),
        ),
        WorkerToJob::CutoverApply { migration_id, .. } => (
            migration_id,
            (Side::Target, Phase::TargetReady, Phase::AwaitingApplied),
        ),
        WorkerToJob::Abort { migration_id, .. } => {
            let cur = matching(live, migration_id)?;
            if !cur.phase.is_abortable() {
                return Err(PhaseError::WrongPhase {
                    frame: frame.kind(),
                    context: context(Some(cur)),
                });
            }
            return Ok(Migration {
                phase: Phase::Aborted,
                ..cur.clone()
            });
        }
        WorkerToJob::HelloAck { .. } | WorkerToJob::InitialState { .. } => {
            return Err(PhaseError::WrongPhase {
                frame: frame.kind(),
                context: "(sent by the listener itself)".to_owned(),
            });
        }
    };
    let cur = matching(live, id)?;
    let (side, from, to) = next;
    if cur.side != side || cur.phase != from {
        return Err(PhaseError::WrongPhase {
            frame: frame.kind(),
            context: context(Some(cur)),
        });
    }
    Ok(Migration {
        phase: to,
        ..cur.clone()
    })
}

fn matching<'a>(
    live: Option<&'a Migration>,
    id: &crate::json::JsString,
) -> Result<&'a Migration, PhaseError> {
    match live {
        Some(cur) if *id == cur.id.as_str() => Ok(cur),
        _ => Err(PhaseError::UnknownMigration {
            asked: id.to_string_lossy().into_owned(),
            current: live.map(|c| c.id.clone()),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::TargetApplied;
    use crate::json::Json;

    fn job(kind: &str) -> JobToWorker {
        match kind {
            "state" => JobToWorker::State {
                payload: Json::Null,
            },
            "state-refused" => JobToWorker::StateRefused {
                reason: "no".into(),
            },
            "target-ready" => JobToWorker::TargetReady {
                payload: Json::Null,
            },
            "source-stopped-output" => JobToWorker::SourceStoppedOutput {
                payload: Json::Null,
            },
            "target-applied" => JobToWorker::TargetApplied(TargetApplied::default()),
            _ => JobToWorker::Abort { reason: "r".into() },
        }
    }

    fn worker(kind: &str, id: &str) -> WorkerToJob {
        let migration_id = id.into();
        match kind {
            "get-state" => WorkerToJob::GetState { migration_id },
            "cutover-ready" => WorkerToJob::CutoverReady {
                migration_id,
                payload: Json::Null,
            },
            "cutover-apply" => WorkerToJob::CutoverApply {
                migration_id,
                payload: Json::Null,
            },
            _ => WorkerToJob::Abort {
                migration_id,
                reason: "r".into(),
            },
        }
    }

    #[test]
    fn source_walks_get_state_state_cutover_ready_stopped() {
        let m = on_worker_frame(None, &worker("get-state", "m")).expect("get-state");
        let m = on_job_frame(Some(&m), &job("state")).expect("state");
        let m = on_worker_frame(Some(&m), &worker("cutover-ready", "m")).expect("cutover-ready");
        let m = on_job_frame(Some(&m), &job("source-stopped-output")).expect("stopped");
        assert_eq!(m.phase, Phase::SourceStopped);
        assert!(m.phase.is_final());
    }

    #[test]
    fn target_walks_ready_apply_applied() {
        let m = new_target("m");
        let m = on_job_frame(Some(&m), &job("target-ready")).expect("ready");
        let m = on_worker_frame(Some(&m), &worker("cutover-apply", "m")).expect("apply");
        let m = on_job_frame(Some(&m), &job("target-applied")).expect("applied");
        assert_eq!(m.phase, Phase::Applied);
    }

    #[test]
    fn state_refused_ends_the_migration_and_frees_the_instance() {
        let m = on_worker_frame(None, &worker("get-state", "m")).expect("get-state");
        let m = on_job_frame(Some(&m), &job("state-refused")).expect("refused");
        assert_eq!(m.phase, Phase::Refused);
        assert!(on_worker_frame(Some(&m), &worker("get-state", "n")).is_ok());
    }

    #[test]
    fn frames_from_the_wrong_side_or_phase_are_refused() {
        let src = on_worker_frame(None, &worker("get-state", "m")).expect("get-state");
        for k in ["target-ready", "target-applied", "source-stopped-output"] {
            assert!(
                matches!(
                    on_job_frame(Some(&src), &job(k)),
                    Err(PhaseError::WrongPhase { .. })
                ),
                "{k}"
            );
        }
        let tgt = new_target("m");
        for k in [
            "state",
            "state-refused",
            "source-stopped-output",
            "target-applied",
        ] {
            assert!(
                matches!(
                    on_job_frame(Some(&tgt), &job(k)),
                    Err(PhaseError::WrongPhase { .. })
                ),
                "{k}"
            );
        }
        assert!(matches!(
            on_job_frame(None, &job("abort")),
            Err(PhaseError::WrongPhase { .. })
        ));
    }

    #[test]
    fn abort_is_allowed_until_the_source_stops_output_and_not_after() {
        let m = on_worker_frame(None, &worker("get-state", "m")).expect("get-state");
        let m = on_job_frame(Some(&m), &job("state")).expect("state");
        let m = on_worker_frame(Some(&m), &worker("cutover-ready", "m")).expect("cutover-ready");
        assert_eq!(
            on_job_frame(Some(&m), &job("abort")).map(|m| m.phase),
            Ok(Phase::Aborted)
        );
        let stopped = on_job_frame(Some(&m), &job("source-stopped-output")).expect("stopped");
        assert!(on_job_frame(Some(&stopped), &job("abort")).is_err());
        let t = on_job_frame(Some(&new_target("m")), &job("target-ready")).expect("ready");
        let applying = on_worker_frame(Some(&t), &worker("cutover-apply", "m")).expect("apply");
        assert!(on_worker_frame(Some(&applying), &worker("abort", "m")).is_err());
        assert!(on_job_frame(Some(&applying), &job("abort")).is_err());
    }

    #[test]
    fn manager_commands_must_name_the_live_migration() {
        let m = on_worker_frame(None, &worker("get-state", "m")).expect("get-state");
        assert!(matches!(
            on_worker_frame(Some(&m), &worker("abort", "other")),
            Err(PhaseError::UnknownMigration { .. })
        ));
        assert!(matches!(
            on_worker_frame(Some(&m), &worker("get-state", "n")),
            Err(PhaseError::Busy(_))
        ));
        assert!(matches!(
            on_worker_frame(Some(&m), &worker("cutover-ready", "m")),
            Err(PhaseError::WrongPhase { .. })
        ));
    }

    fn rank(p: Phase) -> u8 {
        match p {
            Phase::AwaitingState | Phase::AwaitingTargetReady => 0,
            Phase::StateGiven | Phase::TargetReady => 1,
            Phase::AwaitingSourceStop | Phase::AwaitingApplied => 2,
            Phase::SourceStopped | Phase::Applied | Phase::Refused | Phase::Aborted => 3,
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        #[test]
        fn phases_only_move_forward_and_abort_only_from_abortable_phases(
            target in proptest::prelude::any::<bool>(),
            steps in proptest::collection::vec((0u8..10, proptest::prelude::any::<bool>()), 0..40),
        ) {
            const JOB: [&str; 6] = ["state", "state-refused", "target-ready", "source-stopped-output", "target-applied", "abort"];
            const WORKER: [&str; 4] = ["get-state", "cutover-ready", "cutover-apply", "abort"];
            let mut m = target.then(|| new_target("m"));
            for (pick, other_id) in steps {
                let before = m.clone();
                let next = if usize::from(pick) < JOB.len() {
                    on_job_frame(m.as_ref(), &job(JOB[usize::from(pick)]))
                } else {
                    let id = if other_id { "n" } else { "m" };
                    on_worker_frame(m.as_ref(), &worker(WORKER[usize::from(pick) - JOB.len()], id))
                };
                let Ok(next) = next else { continue };
                if next.phase == Phase::Aborted {
                    let b = before.as_ref().expect("abort needs a migration");
                    proptest::prop_assert!(b.phase.is_abortable(), "aborted from {:?}", b.phase);
                }
                match &before {
                    // A new migration starts only on a free instance, as a source awaiting state.
                    Some(b) if b.id == next.id && b.side == next.side && !b.phase.is_final() => {
                        proptest::prop_assert!(rank(next.phase) > rank(b.phase), "{:?} -> {:?}", b.phase, next.phase);
                    }
                    _ => {
                        proptest::prop_assert!(before.as_ref().is_none_or(|b| b.phase.is_final()));
                        proptest::prop_assert_eq!((next.side, next.phase), (Side::Source, Phase::AwaitingState));
                    }
                }
                m = Some(next);
            }
        }
    }
}
