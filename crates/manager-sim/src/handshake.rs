//! The migration handshake's rules that do not depend on a world: what a strategy value means,
//! which phase waits for which job answer, and what an answer does. Both worlds use them — our
//! first API's ([`crate::world::World`]) and the published world's extension
//! ([`crate::published::PublishedWorld`]) — so a handshake moves the same way over either API.

use manager_proto::{FailedParticipant, MigrationParty, MigrationPhase, MigrationStrategy};

use crate::world::{CommandError, JobAsk, JobReply};

/// A requested strategy: unset reads as HANDOVER; a value that is not a strategy is refused.
pub fn strategy(value: i32) -> Result<MigrationStrategy, CommandError> {
    match MigrationStrategy::try_from(value) {
        Ok(MigrationStrategy::Unspecified | MigrationStrategy::Handover) => {
            Ok(MigrationStrategy::Handover)
        }
        Ok(s) => Ok(s),
        Err(_) => Err(CommandError::InvalidArgument(format!(
            "strategy {value} is not a MigrationStrategy"
        ))),
    }
}

/// The phase a migration starts in: a handover waits for the source's state; the other
/// strategies need none.
pub fn first_phase(strategy: MigrationStrategy) -> MigrationPhase {
    if strategy == MigrationStrategy::Handover {
        MigrationPhase::Proposed
    } else {
        MigrationPhase::StateReceived
    }
}

/// Whether a phase is final (COMPLETED or ABORTED).
pub fn is_final(phase: i32) -> bool {
    phase == MigrationPhase::Completed as i32 || phase == MigrationPhase::Aborted as i32
}

/// The phase a migration must be in for an answer to `ask` to count.
pub fn awaiting(ask: &JobAsk) -> MigrationPhase {
    match ask {
        JobAsk::GetState { .. } => MigrationPhase::Proposed,
        JobAsk::InitialState { .. } => MigrationPhase::PreparingTarget,
        JobAsk::CutoverReady { .. } | JobAsk::CutoverApply { .. } => MigrationPhase::CuttingOver,
    }
}

/// What one answer of a job does to its migration.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// The source's state arrived: STATE_RECEIVED.
    StateReceived(Vec<u8>),
    /// The target is ready: TARGET_READY.
    TargetReady(Vec<u8>),
    /// The source stopped its output: keep its payload and ask the target to apply it.
    SourceStopped(Vec<u8>),
    /// The target applied: the migration completes.
    Applied {
        /// Participants applied.
        applied: Vec<String>,
        /// Participants that failed.
        failed: Vec<FailedParticipant>,
        /// Measured skew.
        skew_ms: f64,
    },
    /// The migration aborts, by this party, for this reason.
    Abort(MigrationParty, String),
}

/// What `reply` to `ask` does (the caller has checked the phase with [`awaiting`]). An answer
/// that does not fit its ask aborts the migration by the side that sent it.
pub fn step(ask: &JobAsk, reply: JobReply) -> Step {
    let by = if matches!(ask, JobAsk::GetState { .. } | JobAsk::CutoverReady { .. }) {
        MigrationParty::Source
    } else {
        MigrationParty::Target
    };
    match (ask, reply) {
        (_, JobReply::Abort(reason) | JobReply::StateRefused(reason)) => Step::Abort(by, reason),
        (JobAsk::GetState { .. }, JobReply::State(p)) => Step::StateReceived(p),
        (JobAsk::InitialState { .. }, JobReply::TargetReady(p)) => Step::TargetReady(p),
        (JobAsk::CutoverReady { .. }, JobReply::SourceStoppedOutput(p)) => Step::SourceStopped(p),
        (
            JobAsk::CutoverApply { .. },
            JobReply::TargetApplied {
                applied,
                failed,
                skew_ms,
            },
        ) => Step::Applied {
            applied,
            failed,
            skew_ms,
        },
        (ask, other) => Step::Abort(
            by,
            crate::validate::excerpt(&format!("unexpected answer {other:?} to {ask:?}")),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::default_reply;

    fn asks() -> [JobAsk; 4] {
        let (migration_id, job_id, node_id) = ("m".to_owned(), "j".to_owned(), "n".to_owned());
        [
            JobAsk::GetState {
                migration_id: migration_id.clone(),
                job_id: job_id.clone(),
                node_id: node_id.clone(),
            },
            JobAsk::InitialState {
                migration_id: migration_id.clone(),
                job_id: job_id.clone(),
                node_id: node_id.clone(),
                payload: Vec::new(),
            },
            JobAsk::CutoverReady {
                migration_id: migration_id.clone(),
                job_id: job_id.clone(),
                node_id: node_id.clone(),
                payload: Vec::new(),
            },
            JobAsk::CutoverApply {
                migration_id,
                job_id,
                node_id,
                payload: Vec::new(),
            },
        ]
    }

    #[test]
    fn a_cooperative_job_moves_each_ask_on_and_a_refusal_aborts_by_its_side() {
        let [get, init, ready, apply] = asks();
        assert_eq!(
            step(&get, default_reply(&get)),
            Step::StateReceived(b"null".to_vec())
        );
        assert_eq!(
            step(&init, default_reply(&init)),
            Step::TargetReady(b"null".to_vec())
        );
        assert_eq!(
            step(&ready, default_reply(&ready)),
            Step::SourceStopped(b"null".to_vec())
        );
        assert!(matches!(
            step(&apply, default_reply(&apply)),
            Step::Applied { .. }
        ));
        assert_eq!(
            step(&get, JobReply::StateRefused("busy".into())),
            Step::Abort(MigrationParty::Source, "busy".into())
        );
        assert_eq!(
            step(&init, JobReply::Abort("no".into())),
            Step::Abort(MigrationParty::Target, "no".into())
        );
        assert!(matches!(
            step(&get, JobReply::TargetReady(Vec::new())),
            Step::Abort(MigrationParty::Source, m) if m.contains("unexpected")
        ));
    }

    #[test]
    fn a_strategy_is_read_as_the_handshake_reads_it() {
        assert_eq!(strategy(0), Ok(MigrationStrategy::Handover));
        assert_eq!(strategy(2), Ok(MigrationStrategy::Overlap));
        assert!(matches!(
            strategy(99),
            Err(CommandError::InvalidArgument(_))
        ));
        assert_eq!(
            first_phase(MigrationStrategy::Overlap),
            MigrationPhase::StateReceived
        );
        assert_eq!(
            first_phase(MigrationStrategy::Handover),
            MigrationPhase::Proposed
        );
    }
}
