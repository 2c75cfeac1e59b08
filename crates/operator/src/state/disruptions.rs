//! Voluntary disruptions this process allowed: admitted Migrations, nodes whose terminate the
//! budget let through, the fleet-wide rebalancing rate and when each pool's consolidation was
//! last planned.
//!
//! Each is decided and recorded under the state lock, so two reconciles never both take the
//! last unit of a budget or the last queue slot; after a restart the same facts are read back
//! from Migration status and ManagerNode specs.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

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
}

impl Disruptions {
    pub(super) fn new(rebalance_budget: ProvisionBudget) -> Self {
        Disruptions {
            migrations: HashMap::new(),
            terminating: HashSet::new(),
            rebalance_budget,
            consolidation_planned: HashMap::new(),
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
