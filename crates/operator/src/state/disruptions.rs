//! Voluntary disruptions this process allowed: admitted Migrations, nodes whose terminate the
//! budget let through, the fleet-wide rebalancing rate and when each pool's consolidation was
//! last planned; and the voluntary moves held back (who holds each, since when, whether the
//! hold passed `disruption.holdWarnAfter`).
//!
//! Each is decided and recorded under the state lock, so two reconciles never both take the
//! last unit of a budget or the last queue slot; after a restart the same facts are read back
//! from Migration status and ManagerNode specs.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use automanager_api::{Hold, HoldKind};

use automanager_policy::provision_budget::ProvisionBudget;
use chrono::{DateTime, Utc};

/// A Migration the queue let begin: the replica it takes down and the nodes it holds a slot on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmittedMigration {
    pub bundle_id: String,
    pub replica: u32,
    pub job_name: String,
    pub source_node: String,
    pub target_node: Option<String>,
}

/// A voluntary move that can be held: a drain (by Manager's node id) or a Migration (by
/// `namespace/name`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HeldMove {
    Drain(String),
    Migration(String),
}

impl HeldMove {
    /// The `kind` label of `automanager_held_moves`.
    pub fn kind(&self) -> &'static str {
        match self {
            HeldMove::Drain(_) => "drain",
            HeldMove::Migration(_) => "migration",
        }
    }
}

/// What recording a hold changed: what the caller says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldNews {
    /// The move is newly held, or by another holder than before: worth one Event.
    pub new_holder: bool,
    /// The hold passed the bound just now: worth one Warning Event.
    pub crossed_bound: bool,
    /// The hold as it stands, for status.
    pub hold: Hold,
}

/// The one key of the fleet-wide rebalancing rate.
const REBALANCE_KEY: &str = "rebalance";

/// The disruption records. Every change goes through a named operation.
#[derive(Debug)]
pub struct Disruptions {
    /// Admitted Migrations by `namespace/name`, until they end.
    migrations: HashMap<String, AdmittedMigration>,
    /// Nodes whose terminate (a `terminate` drain) the budget allowed: the replicas of the
    /// jobs still on them are down.
    terminating: HashSet<String>,
    /// Rebalancing Migrations created in the last minute (the same sliding window as the
    /// provisioning rate).
    rebalance_budget: ProvisionBudget,
    /// When each pool's consolidation was last planned, and for which generation of its spec.
    consolidation_planned: HashMap<String, (Instant, Option<i64>)>,
    /// Voluntary moves held back now, with who holds them and since when.
    holds: HashMap<HeldMove, Hold>,
}

impl Disruptions {
    pub(super) fn new(rebalance_budget: ProvisionBudget) -> Self {
        Disruptions {
            migrations: HashMap::new(),
            terminating: HashSet::new(),
            rebalance_budget,
            consolidation_planned: HashMap::new(),
            holds: HashMap::new(),
        }
    }

    /// The Migrations admitted and not ended, by `namespace/name`.
    pub fn admitted(&self) -> impl Iterator<Item = (&String, &AdmittedMigration)> {
        self.migrations.iter()
    }

    /// The Migration `key` was admitted.
    pub fn admit(&mut self, key: String, migration: AdmittedMigration) {
        self.migrations.insert(key, migration);
    }

    /// The Migration `key` ended or went away.
    pub fn forget_migration(&mut self, key: &str) {
        self.migrations.remove(key);
    }

    /// Whether the budget let `node`'s terminate through.
    pub fn is_terminating(&self, node: &str) -> bool {
        self.terminating.contains(node)
    }

    /// The nodes whose terminate the budget let through.
    pub fn terminating(&self) -> impl Iterator<Item = &String> {
        self.terminating.iter()
    }

    /// The budget let `node`'s terminate through.
    pub fn allow_terminate(&mut self, node: &str) {
        self.terminating.insert(node.to_owned());
    }

    /// Takes `moves` rebalancing Migrations of the fleet's rate at once, or none: false when
    /// fewer are left this minute.
    pub fn take_rebalance_moves(&mut self, moves: u32, now: DateTime<Utc>) -> bool {
        if self.rebalance_budget.allowance(REBALANCE_KEY, now) < moves {
            return false;
        }
        for _ in 0..moves {
            self.rebalance_budget.take(REBALANCE_KEY, now);
        }
        true
    }

    /// When `pool`'s consolidation was last planned, and for which spec generation.
    pub fn consolidation_planned(&self, pool: &str) -> Option<(Instant, Option<i64>)> {
        self.consolidation_planned.get(pool).copied()
    }

    /// `pool`'s consolidation was planned at `at` for spec `generation`.
    pub fn record_consolidation_plan(&mut self, pool: &str, at: Instant, generation: Option<i64>) {
        self.consolidation_planned
            .insert(pool.to_owned(), (at, generation));
    }

    /// `pool` is gone, or its consolidation is off.
    pub fn forget_consolidation(&mut self, pool: &str) {
        self.consolidation_planned.remove(pool);
    }

    /// `what` is held by `hold`'s holder at `now`. The hold keeps the time it began (this
    /// process's record, else `recorded`, what the object's status said before a restart) across
    /// a change of holder, and is past the bound once held for `bound`.
    pub fn hold(
        &mut self,
        what: HeldMove,
        hold: Hold,
        recorded: Option<&Hold>,
        now: chrono::DateTime<chrono::Utc>,
        bound: Duration,
    ) -> HoldNews {
        let prev = self.holds.get(&what).or(recorded).cloned();
        let since = prev.as_ref().map_or(now, |p| p.since.min(now));
        let new_holder = prev
            .as_ref()
            .is_none_or(|p| (p.kind, p.holder.as_str()) != (hold.kind, hold.holder.as_str()));
        let past = chrono::TimeDelta::from_std(bound).is_ok_and(|b| now - since >= b);
        let was_past = prev.as_ref().and_then(|p| p.past_bound_at);
        let hold = Hold {
            since,
            past_bound_at: was_past.or(past.then_some(now)),
            proceeded_at: prev.as_ref().and_then(|p| p.proceeded_at),
            ..hold
        };
        self.holds.insert(what, hold.clone());
        HoldNews {
            new_holder,
            crossed_bound: past && was_past.is_none(),
            hold,
        }
    }

    /// A held drain went ahead at `now` (`whenHeld: Proceed`); its hold stays on record.
    pub fn proceed(&mut self, what: &HeldMove, now: chrono::DateTime<chrono::Utc>) -> Option<Hold> {
        let h = self.holds.get_mut(what)?;
        h.proceeded_at.get_or_insert(now);
        Some(h.clone())
    }

    /// `what` is no longer held (or gone): true when it was.
    pub fn release(&mut self, what: &HeldMove) -> bool {
        self.holds.remove(what).is_some()
    }

    /// The hold on `what`, if any.
    pub fn held(&self, what: &HeldMove) -> Option<Hold> {
        self.holds.get(what).cloned()
    }

    /// Moves held past the bound now and still waiting, by move kind and hold kind; every
    /// combination is present, zero when none, so the metric's series stay put.
    pub fn past_bound(&self) -> BTreeMap<(&'static str, HoldKind), usize> {
        let mut out = BTreeMap::new();
        for kind in ["drain", "migration"] {
            for reason in [
                HoldKind::BrokenBundle,
                HoldKind::DisruptionBudget,
                HoldKind::DisruptionWindow,
            ] {
                out.insert((kind, reason), 0);
            }
        }
        for (what, h) in &self.holds {
            if h.past_bound_at.is_some() && h.proceeded_at.is_none() {
                *out.entry((what.kind(), h.kind)).or_default() += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(kind: HoldKind, holder: &str) -> Hold {
        Hold {
            kind,
            holder: holder.into(),
            opens_at: None,
            window: None,
            since: DateTime::UNIX_EPOCH,
            past_bound_at: None,
            proceeded_at: None,
            message: String::new(),
        }
    }

    #[test]
    fn a_hold_is_news_once_per_holder_and_crosses_its_bound_once() {
        let mut d = Disruptions::new(ProvisionBudget::new(3));
        let t0 = DateTime::UNIX_EPOCH + chrono::TimeDelta::hours(1);
        let at = |mins| t0 + chrono::TimeDelta::minutes(mins);
        let bound = Duration::from_secs(30 * 60);
        let node = HeldMove::Drain("n1".into());
        let budget = held_by(HoldKind::DisruptionBudget, "Bundle live/news");
        let first = d.hold(node.clone(), budget.clone(), None, at(0), bound);
        assert!(first.new_holder && !first.crossed_bound);
        assert_eq!(first.hold.since, t0);
        let again = d.hold(node.clone(), budget.clone(), None, at(10), bound);
        assert!(!again.new_holder, "the same holder is not news again");
        let broken = held_by(HoldKind::BrokenBundle, "Bundle live/news");
        let other = d.hold(node.clone(), broken.clone(), None, at(20), bound);
        assert!(other.new_holder, "another holder is news");
        assert_eq!(
            other.hold.since, t0,
            "the wait began when the first hold did"
        );
        let past = d.hold(node.clone(), broken.clone(), None, at(30), bound);
        assert!(past.crossed_bound);
        assert_eq!(past.hold.past_bound_at, Some(at(30)));
        assert!(
            !d.hold(node.clone(), broken, None, at(31), bound)
                .crossed_bound
        );
        let counts = d.past_bound();
        assert_eq!(counts[&("drain", HoldKind::BrokenBundle)], 1);
        assert_eq!(counts[&("migration", HoldKind::DisruptionWindow)], 0);
        assert!(d.proceed(&node, at(32)).is_some());
        assert_eq!(d.past_bound()[&("drain", HoldKind::BrokenBundle)], 0);
        assert!(d.release(&node));
        assert!(!d.release(&node));
    }

    #[test]
    fn a_hold_read_back_from_status_keeps_its_start_and_is_not_news() {
        let mut d = Disruptions::new(ProvisionBudget::new(3));
        let t0 = DateTime::UNIX_EPOCH + chrono::TimeDelta::hours(1);
        let recorded = Hold {
            since: t0,
            ..held_by(HoldKind::DisruptionWindow, "Bundle live/news")
        };
        let what = HeldMove::Migration("live/m".into());
        let later = t0 + chrono::TimeDelta::minutes(45);
        let news = d.hold(
            what,
            held_by(HoldKind::DisruptionWindow, "Bundle live/news"),
            Some(&recorded),
            later,
            Duration::from_secs(30 * 60),
        );
        assert!(!news.new_holder);
        assert!(news.crossed_bound);
        assert_eq!(news.hold.since, t0);
    }

    #[test]
    fn rebalancing_moves_are_taken_all_or_none() {
        let mut d = Disruptions::new(ProvisionBudget::new(3));
        let now = DateTime::UNIX_EPOCH;
        assert!(d.take_rebalance_moves(2, now));
        assert!(
            !d.take_rebalance_moves(2, now),
            "one left: two are refused whole"
        );
        assert!(d.take_rebalance_moves(1, now));
        assert!(!d.take_rebalance_moves(1, now));
    }
}
