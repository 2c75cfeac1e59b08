//! The voluntary disruptions' rules at the state's surface: a move is decided against what is
//! in flight and, when it may go, recorded as in flight before the lock is released (so two
//! passes never both take the last slot of a budget); a hold changes together with the
//! figures of moves held past their bound.

use std::collections::BTreeMap;
use std::time::Duration;

use automanager_api::{Hold, HoldKind};
use chrono::{DateTime, Utc};

use super::{AdmittedMigration, Disruptions, HeldMove, HoldNews, State};

/// What a decision over the disruptions in flight lets go ahead.
#[derive(Debug, Clone, PartialEq)]
pub enum Admit {
    /// Nothing: the move waits (or was in flight already).
    Nothing,
    /// This Migration, by its key, runs from now.
    Migration(String, AdmittedMigration),
    /// This node may be terminated.
    Terminate(String),
}

/// Moves held past the bound now and still waiting, by move kind and hold kind.
pub type PastBound = BTreeMap<(&'static str, HoldKind), usize>;

impl State {
    /// Reads the voluntary disruptions in flight (Migrations admitted, nodes being
    /// terminated, holds) under the lock; `read` must not block.
    pub fn read_disruptions<R>(&self, read: impl FnOnce(&Disruptions) -> R) -> R {
        read(self.lock().disruptions())
    }

    /// Decides a voluntary move against what is in flight, and records what the decision
    /// admits before the lock is released; `decide` must not block.
    pub fn decide_disruption<R>(&self, decide: impl FnOnce(&Disruptions) -> (R, Admit)) -> R {
        let mut s = self.lock();
        let (answer, admit) = decide(s.disruptions());
        match admit {
            Admit::Nothing => {}
            Admit::Migration(key, m) => s.disruptions_mut().admit(key, m),
            Admit::Terminate(node) => s.disruptions_mut().allow_terminate(&node),
        }
        answer
    }

    /// A Migration ended or went away: it holds no slot and takes no replica down any more,
    /// and its hold is released. The moves past their bound when a hold was released.
    pub fn forget_migration(&self, key: &str, held: &HeldMove) -> Option<PastBound> {
        let mut s = self.lock();
        s.disruptions_mut().forget_migration(key);
        let book = s.disruptions_mut();
        book.release(held).then(|| book.past_bound())
    }

    /// `what` is held by `hold`'s holder at `now` (see [`Disruptions::hold`]); with the moves
    /// past their bound after it.
    pub fn hold_move(
        &self,
        what: HeldMove,
        hold: Hold,
        recorded: Option<&Hold>,
        now: DateTime<Utc>,
        bound: Duration,
    ) -> (HoldNews, PastBound) {
        let mut s = self.lock();
        let book = s.disruptions_mut();
        let news = book.hold(what, hold, recorded, now, bound);
        (news, book.past_bound())
    }

    /// `what` is no longer held: the moves past their bound after it, when it was.
    pub fn release_move(&self, what: &HeldMove) -> Option<PastBound> {
        let mut s = self.lock();
        let book = s.disruptions_mut();
        book.release(what).then(|| book.past_bound())
    }

    /// A held drain went ahead at `now`: its hold, marked, and the moves past their bound.
    pub fn proceed_move(&self, what: &HeldMove, now: DateTime<Utc>) -> (Option<Hold>, PastBound) {
        let mut s = self.lock();
        let book = s.disruptions_mut();
        let hold = book.proceed(what, now);
        (hold, book.past_bound())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::settings::Settings;

    const LIMIT: usize = 2;

    fn migration(n: usize) -> AdmittedMigration {
        AdmittedMigration {
            bundle_id: "default.b".into(),
            replica: u32::try_from(n).unwrap_or(0),
            job_name: "enc".into(),
            source_node: format!("n{n}"),
            target_node: None,
        }
    }

    /// A queue of `LIMIT` slots, decided the way the Migration controller decides: against the
    /// Migrations admitted, admitting this one when a slot is free.
    fn ask(state: &State, n: usize) -> bool {
        let key = format!("default/m{n}");
        state.decide_disruption(|book| {
            if book.admitted().any(|(k, _)| *k == key) {
                return (true, Admit::Nothing);
            }
            if book.admitted().count() < LIMIT {
                (true, Admit::Migration(key.clone(), migration(n)))
            } else {
                (false, Admit::Nothing)
            }
        })
    }

    proptest! {
        /// What a decision admits is what the next decision sees: the slots never overfill,
        /// a Migration told to begin is admitted until it is forgotten, and one told to wait
        /// is not.
        #[test]
        fn an_admission_is_recorded_with_its_decision(
            steps in proptest::collection::vec((0usize..5, any::<bool>()), 1..40)
        ) {
            let state = State::new(&Settings::default());
            let mut admitted = std::collections::BTreeSet::new();
            for (n, forget) in steps {
                let key = format!("default/m{n}");
                if forget {
                    let _ = state.forget_migration(&key, &HeldMove::Migration(key.clone()));
                    admitted.remove(&key);
                } else if ask(&state, n) {
                    admitted.insert(key);
                }
                let book: std::collections::BTreeSet<String> =
                    state.read_disruptions(|b| b.admitted().map(|(k, _)| k.clone()).collect());
                prop_assert!(book.len() <= LIMIT);
                prop_assert_eq!(&book, &admitted);
            }
        }
    }

    /// Passes deciding at once never both take the last slot.
    #[test]
    fn concurrent_decisions_never_overfill_the_slots() {
        let state = Arc::new(State::new(&Settings::default()));
        let threads: Vec<_> = (0..8)
            .map(|n| {
                let state = Arc::clone(&state);
                std::thread::spawn(move || ask(&state, n))
            })
            .collect();
        let begun = threads
            .into_iter()
            .filter_map(|t| t.join().ok())
            .filter(|begun| *begun)
            .count();
        assert_eq!(begun, LIMIT);
        assert_eq!(state.read_disruptions(|b| b.admitted().count()), LIMIT);
    }

    #[test]
    fn an_allowed_terminate_is_recorded_and_a_held_one_is_not() {
        let state = State::new(&Settings::default());
        let held = state.decide_disruption(|_| (false, Admit::Nothing));
        assert!(!held);
        assert!(!state.read_disruptions(|b| b.is_terminating("n1")));
        state.decide_disruption(|_| ((), Admit::Terminate("n1".into())));
        assert!(state.read_disruptions(|b| b.is_terminating("n1")));
    }
}
