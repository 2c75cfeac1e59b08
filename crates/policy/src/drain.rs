//! The drain planner: what a `drain: {mode: migrate}` on one node needs done right now.
//!
//! Pure: the caller passes the jobs Manager shows on the node and the drain's Migrations as plain
//! data; [`plan_drain`] answers with a [`DrainPlan`]. No I/O, no clock.
//!
//! The rules (the TypeScript library's "Drain / cordon": migrate is the drop-free variant of
//! cordon + terminate):
//!
//! - **Every job gets one Migration.** A running job on the node that belongs to a Bundle and
//!   has no drain Migration yet is migrated; jobs are taken in job-id order, so a restarted
//!   operator picks the same next job. A job still starting waits until it runs (a Migration
//!   would refuse it, and the refusal would hand a bronze job to the drop).
//! - **Bounded parallelism.** At most `parallelism` drain Migrations are in flight at once
//!   (at least one, whatever the caller passes).
//! - **A failed migration falls back to band recovery.** When a job's Migration ended without
//!   moving it (aborted, refused, rejected, failed) and the job is still on the node, that job —
//!   and only that job — is handed to its band's recovery (gold and silver restart elsewhere,
//!   bronze is dropped). A job whose Migration completed is never handed over, even while the
//!   mirror still shows it on the node (it is about to disappear).
//! - **Another move first.** A job another Migration is moving (a reclaim notice's, a person's)
//!   gets no drain Migration until that move has ended: if it took the job away, there is
//!   nothing left to do; if not, the drain moves it then.
//! - **A move with a deadline takes over.** A job whose drain Migration was superseded (a
//!   reclaim notice's move took the job over while the drain's waited) is that move's: the
//!   drain creates no other Migration for it and never hands it to recovery.
//! - **Jobs that belong to no Bundle** cannot be migrated by the operator (it knows neither their
//!   rules nor their owner). One left by a Bundle of ours that is gone does not hold the drain up
//!   and stops with the node.
//! - **Another client's job is not ours to touch.** A job whose bundle id is not of the
//!   operator's form (or is another installation's) is neither moved nor stopped, and the node
//!   is not terminated under it: the drain waits, naming it, until its owner moves it.
//! - **Done** when no managed job is left on the node, no Migration is in flight and no other
//!   client's job runs there: the node is then terminated, like a `terminate` drain of an empty
//!   node.
//!
//! Counting: `migrated` is the number of Completed Migrations, `fell_back` the number of jobs
//! whose Migration failed (recovered or dropped by band, which the caller resolves).

use std::collections::{BTreeMap, BTreeSet};

/// A job Manager shows on the drained node (a normal instance that is starting or running).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainJob {
    pub job_id: String,
    /// It belongs to a Bundle, so a Migration can name it.
    pub managed: bool,
    /// Its instance runs (a starting one cannot be migrated yet: it waits, it is not refused).
    pub running: bool,
    /// Another Migration is moving it now (a reclaim notice's, a person's): the drain waits
    /// for that move rather than start one the one-at-a-time rule would refuse, which would
    /// then hand the job to recovery in the middle of its move.
    pub moving: bool,
    /// It is another client's (not of a Bundle of ours): the node is not terminated under it.
    pub foreign: bool,
}

/// Where one of the drain's Migrations stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrationOutcome {
    InFlight,
    Completed,
    /// Ended without moving the job (aborted, refused, rejected, failed).
    Failed,
    /// Ended before it began because a move with a deadline (a reclaim notice's) took the job
    /// over: that move owns the job now, so the drain neither moves it nor hands it to
    /// recovery, and waits while the job is still on the node.
    TakenOver,
}

/// One of the drain's Migrations, by the job it moves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainMigration {
    pub job_id: String,
    pub outcome: MigrationOutcome,
}

/// What to do now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DrainPlan {
    /// Jobs to create a Migration for now, in order.
    pub migrate: Vec<String>,
    /// Jobs whose Migration failed and which are still on the node: hand them to band recovery.
    pub fall_back: Vec<String>,
    /// Migrations in flight after `migrate` is carried out.
    pub in_flight: usize,
    /// Jobs moved by a completed Migration.
    pub migrated: usize,
    /// Jobs whose Migration failed.
    pub fell_back: usize,
    /// Managed jobs still on the node.
    pub remaining: usize,
    /// Other clients' jobs on the node: the drain waits for them to leave.
    pub foreign: Vec<String>,
    /// Nothing managed is left on the node, nothing is in flight and no other client's job is
    /// there: terminate the node.
    pub done: bool,
}

/// The next step of a migrate drain. `parallelism` below 1 counts as 1.
pub fn plan_drain(
    jobs_on_node: &[DrainJob],
    migrations: &[DrainMigration],
    parallelism: usize,
) -> DrainPlan {
    let parallelism = parallelism.max(1);
    // One outcome per job: a job listed twice counts by its most advanced record
    // (in flight beats failed beats nothing; completed beats all).
    let mut outcome: BTreeMap<&str, MigrationOutcome> = BTreeMap::new();
    for m in migrations {
        let rank = |o: MigrationOutcome| match o {
            MigrationOutcome::Failed => 0,
            MigrationOutcome::TakenOver => 1,
            MigrationOutcome::InFlight => 2,
            MigrationOutcome::Completed => 3,
        };
        outcome
            .entry(m.job_id.as_str())
            .and_modify(|o| {
                if rank(m.outcome) > rank(*o) {
                    *o = m.outcome;
                }
            })
            .or_insert(m.outcome);
    }
    let managed: BTreeSet<&str> = jobs_on_node
        .iter()
        .filter(|j| j.managed)
        .map(|j| j.job_id.as_str())
        .collect();
    let running: BTreeSet<&str> = jobs_on_node
        .iter()
        .filter(|j| j.running)
        .map(|j| j.job_id.as_str())
        .collect();
    let moving: BTreeSet<&str> = jobs_on_node
        .iter()
        .filter(|j| j.moving)
        .map(|j| j.job_id.as_str())
        .collect();

    let mut plan = DrainPlan {
        migrated: count(&outcome, MigrationOutcome::Completed),
        fell_back: count(&outcome, MigrationOutcome::Failed),
        in_flight: count(&outcome, MigrationOutcome::InFlight),
        remaining: managed.len(),
        ..DrainPlan::default()
    };
    for job in &managed {
        match outcome.get(job) {
            None if plan.in_flight < parallelism
                && running.contains(job)
                && !moving.contains(job) =>
            {
                plan.migrate.push((*job).to_owned());
                plan.in_flight += 1;
            }
            Some(MigrationOutcome::Failed) => plan.fall_back.push((*job).to_owned()),
            _ => {}
        }
    }
    plan.foreign = jobs_on_node
        .iter()
        .filter(|j| j.foreign && !j.managed)
        .map(|j| j.job_id.clone())
        .collect();
    plan.foreign.sort();
    plan.done = managed.is_empty() && plan.in_flight == 0 && plan.foreign.is_empty();
    plan
}

fn count(outcome: &BTreeMap<&str, MigrationOutcome>, which: MigrationOutcome) -> usize {
    outcome.values().filter(|o| **o == which).count()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn job(id: &str) -> DrainJob {
        DrainJob {
            job_id: id.into(),
            managed: true,
            running: true,
            moving: false,
            foreign: false,
        }
    }

    fn mig(id: &str, outcome: MigrationOutcome) -> DrainMigration {
        DrainMigration {
            job_id: id.into(),
            outcome,
        }
    }

    #[test]
    fn a_fresh_drain_migrates_up_to_the_parallelism_in_job_order() {
        let jobs = [job("c"), job("a"), job("b")];
        let plan = plan_drain(&jobs, &[], 2);
        assert_eq!(plan.migrate, ["a", "b"]);
        assert_eq!(plan.in_flight, 2);
        assert_eq!(plan.remaining, 3);
        assert!(!plan.done);
    }

    #[test]
    fn a_finished_migration_frees_a_slot_for_the_next_job() {
        let jobs = [job("b"), job("c")];
        let migs = [
            mig("a", MigrationOutcome::Completed),
            mig("b", MigrationOutcome::InFlight),
        ];
        let plan = plan_drain(&jobs, &migs, 2);
        assert_eq!(plan.migrate, ["c"]);
        assert_eq!(plan.migrated, 1);
    }

    #[test]
    fn a_failed_migration_hands_only_its_job_to_band_recovery() {
        let jobs = [job("a"), job("b")];
        let migs = [
            mig("a", MigrationOutcome::Failed),
            mig("b", MigrationOutcome::InFlight),
        ];
        let plan = plan_drain(&jobs, &migs, 2);
        assert_eq!(plan.fall_back, ["a"]);
        assert!(plan.migrate.is_empty());
        assert_eq!(plan.fell_back, 1);
    }

    #[test]
    fn a_job_a_deadline_move_took_over_is_neither_moved_again_nor_handed_over() {
        let migs = [mig("a", MigrationOutcome::TakenOver)];
        let plan = plan_drain(&[job("a"), job("b")], &migs, 1);
        assert!(plan.fall_back.is_empty(), "{plan:?}");
        assert_eq!(plan.migrate, ["b"], "no slot held for it: {plan:?}");
        assert_eq!((plan.migrated, plan.fell_back), (0, 0));
        assert!(!plan.done, "a is still on the node");
        // Once its move took it off the node, the drain ends.
        let plan = plan_drain(&[], &migs, 1);
        assert!(plan.done, "{plan:?}");
    }

    #[test]
    fn a_completed_job_the_mirror_still_shows_is_not_handed_over() {
        let plan = plan_drain(&[job("a")], &[mig("a", MigrationOutcome::Completed)], 2);
        assert!(plan.fall_back.is_empty() && plan.migrate.is_empty());
        assert!(!plan.done, "the job is still on the node");
    }

    #[test]
    fn jobs_left_by_a_gone_bundle_of_ours_neither_migrate_nor_hold_the_drain_up() {
        let jobs = [DrainJob {
            job_id: "ns.gone/0/x".into(),
            managed: false,
            running: true,
            moving: false,
            foreign: false,
        }];
        let plan = plan_drain(&jobs, &[mig("a", MigrationOutcome::Completed)], 2);
        assert!(plan.migrate.is_empty());
        assert!(plan.done);
    }

    #[test]
    fn another_clients_job_is_never_moved_and_keeps_the_node_from_termination() {
        let theirs = DrainJob {
            job_id: "their-bundle/0/x".into(),
            managed: false,
            running: true,
            moving: false,
            foreign: true,
        };
        let plan = plan_drain(
            std::slice::from_ref(&theirs),
            &[mig("a", MigrationOutcome::Completed)],
            2,
        );
        assert!(plan.migrate.is_empty() && plan.fall_back.is_empty());
        assert_eq!(plan.foreign, ["their-bundle/0/x"]);
        assert!(!plan.done, "their job still runs there");
        // Once its owner has moved it, the node is the drain's to terminate.
        assert!(plan_drain(&[], &[mig("a", MigrationOutcome::Completed)], 2).done);
    }

    #[test]
    fn the_drain_is_done_once_the_node_is_empty_and_nothing_is_in_flight() {
        let migs = [
            mig("a", MigrationOutcome::Completed),
            mig("b", MigrationOutcome::Failed),
        ];
        let plan = plan_drain(&[], &migs, 2);
        assert!(plan.done);
        assert_eq!((plan.migrated, plan.fell_back), (1, 1));
        let busy = plan_drain(&[], &[mig("c", MigrationOutcome::InFlight)], 2);
        assert!(!busy.done);
    }

    #[test]
    fn a_starting_job_waits_until_it_runs() {
        let starting = DrainJob {
            running: false,
            ..job("a")
        };
        let plan = plan_drain(&[starting, job("b")], &[], 2);
        assert_eq!(plan.migrate, ["b"]);
        assert_eq!(plan.remaining, 2);
        assert!(!plan.done);
    }

    #[test]
    fn a_job_another_migration_moves_waits_for_it_and_is_never_handed_over() {
        let moving = DrainJob {
            moving: true,
            ..job("a")
        };
        let plan = plan_drain(&[moving.clone(), job("b")], &[], 2);
        assert_eq!(plan.migrate, ["b"]);
        assert!(plan.fall_back.is_empty());
        assert!(!plan.done, "a is still on the node");
        // Its move ended without taking it off the node: the drain moves it then.
        let plan = plan_drain(&[job("a")], &[], 2);
        assert_eq!(plan.migrate, ["a"]);
    }

    #[test]
    fn a_zero_parallelism_still_moves_one_job_at_a_time() {
        let plan = plan_drain(&[job("a"), job("b")], &[], 0);
        assert_eq!(plan.migrate, ["a"]);
    }

    #[test]
    fn a_job_listed_twice_counts_by_its_most_advanced_migration() {
        let migs = [
            mig("a", MigrationOutcome::Failed),
            mig("a", MigrationOutcome::Completed),
        ];
        let plan = plan_drain(&[], &migs, 1);
        assert_eq!((plan.migrated, plan.fell_back), (1, 0));
    }

    fn outcome() -> impl Strategy<Value = Option<MigrationOutcome>> {
        prop_oneof![
            Just(None),
            Just(Some(MigrationOutcome::InFlight)),
            Just(Some(MigrationOutcome::Completed)),
            Just(Some(MigrationOutcome::Failed)),
            Just(Some(MigrationOutcome::TakenOver)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn never_more_than_the_parallelism_in_flight_and_never_a_job_twice(
            states in proptest::collection::vec(
                (any::<bool>(), outcome(), any::<bool>(), any::<bool>(), any::<bool>()),
                0..24,
            ),
            parallelism in 0usize..6,
        ) {
            let mut jobs = Vec::new();
            let mut migs = Vec::new();
            for (i, (on_node, o, managed, running, foreign)) in states.iter().enumerate() {
                let id = format!("j{i:02}");
                if *on_node {
                    jobs.push(DrainJob { job_id: id.clone(), managed: *managed, running: *running, moving: false, foreign: *foreign && !*managed });
                }
                if let Some(o) = o {
                    migs.push(mig(&id, *o));
                }
            }
            let before = migs.iter().filter(|m| m.outcome == MigrationOutcome::InFlight).count();
            let plan = plan_drain(&jobs, &migs, parallelism);
            // New work only ever fills free slots.
            prop_assert!(plan.migrate.is_empty() || plan.in_flight <= parallelism.max(1));
            prop_assert_eq!(plan.in_flight, before + plan.migrate.len());
            for j in &plan.migrate {
                prop_assert!(!migs.iter().any(|m| &m.job_id == j), "{} migrated twice", j);
                prop_assert!(jobs.iter().any(|d| &d.job_id == j && d.managed && d.running));
            }
            for j in &plan.fall_back {
                prop_assert!(migs.iter().any(|m| &m.job_id == j && m.outcome == MigrationOutcome::Failed));
                prop_assert!(jobs.iter().any(|d| &d.job_id == j));
            }
            prop_assert_eq!(plan.done, plan.remaining == 0 && plan.in_flight == 0 && plan.foreign.is_empty());
        }

        #[test]
        fn repeating_the_plan_until_done_migrates_every_managed_job_once(
            n in 0usize..20,
            parallelism in 1usize..5,
            fail_every in 1usize..6,
        ) {
            // A small simulation: each step, in-flight migrations end (every `fail_every`-th
            // fails), completed jobs leave the node, fallen-back jobs leave it too.
            let mut on_node: Vec<DrainJob> = (0..n).map(|i| job(&format!("j{i:02}"))).collect();
            let mut migs: Vec<DrainMigration> = Vec::new();
            for _ in 0..(4 * n + 4) {
                let plan = plan_drain(&on_node, &migs, parallelism);
                if plan.done {
                    break;
                }
                for j in plan.migrate {
                    migs.push(mig(&j, MigrationOutcome::InFlight));
                }
                for j in plan.fall_back {
                    on_node.retain(|d| d.job_id != j);
                }
                for (i, m) in migs.iter_mut().enumerate() {
                    if m.outcome == MigrationOutcome::InFlight {
                        m.outcome = if i % fail_every == fail_every - 1 {
                            MigrationOutcome::Failed
                        } else {
                            on_node.retain(|d| d.job_id != m.job_id);
                            MigrationOutcome::Completed
                        };
                    }
                }
            }
            let plan = plan_drain(&on_node, &migs, parallelism);
            prop_assert!(plan.done);
            prop_assert_eq!(migs.len(), n);
            prop_assert_eq!(plan.migrated + plan.fell_back, n);
        }
    }
}
