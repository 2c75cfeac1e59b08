//! Vocabulary shared by several kinds: priority bands, migration strategies, placement rules.

use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use automanager_policy::vocab::{MigrationStrategy, OnFailure, PriorityBand, RestartPlacement};

/// Whether a placement rule must hold (`hard`: a filter) or should hold (`soft`: an ordering
/// preference whose breach is reported in status).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Enforcement {
    /// The rule is a filter: a placement that breaks it is never made.
    Hard,
    /// The rule orders candidates: it is honoured when possible and reported when broken.
    Soft,
}

/// The relation a rule asks for between two placements.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Relation {
    /// Both on the same node (or zone).
    Same,
    /// On different nodes (or zones).
    Different,
    /// No constraint.
    Any,
}

/// One placement rule: a relation and how strictly it is enforced.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementRule {
    /// `same`, `different` or `any` (no constraint).
    pub relation: Relation,
    /// `hard` (a filter) or `soft` (a preference, reported in status when broken). Ignored for `any`.
    #[serde(default = "default_soft")]
    pub enforcement: Enforcement,
}

fn default_soft() -> Enforcement {
    Enforcement::Soft
}

impl PlacementRule {
    /// A rule that constrains nothing.
    pub const ANY: PlacementRule = PlacementRule {
        relation: Relation::Any,
        enforcement: Enforcement::Soft,
    };
}

/// Node and zone rules between two placements of one bundle.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(self.node.relation == 'same' && self.node.enforcement == 'hard' && self.zone.relation == 'different' && self.zone.enforcement == 'hard')").message("contradictory rules: node 'same' (hard) puts both on one node, so zone 'different' (hard) can never hold"))]
pub struct PlacementRules {
    /// Rule on nodes.
    pub node: PlacementRule,
    /// Rule on availability zones.
    pub zone: PlacementRule,
}

impl PlacementRules {
    /// The TypeScript library's defaults between replicas: different node (hard), same zone (soft).
    pub fn inter_replica_default() -> Self {
        PlacementRules {
            node: PlacementRule {
                relation: Relation::Different,
                enforcement: Enforcement::Hard,
            },
            zone: PlacementRule {
                relation: Relation::Same,
                enforcement: Enforcement::Soft,
            },
        }
    }

    /// The default within a replica: no constraint beyond each job's `coLocateWith` / `separateFrom`.
    pub fn intra_replica_default() -> Self {
        PlacementRules {
            node: PlacementRule::ANY,
            zone: PlacementRule::ANY,
        }
    }
}

/// One band's failure policy. Unset fields take the operator's configured defaults
/// (gold: restart, preferHotSpare; silver: restart, any; bronze: drop; maxRestartsPerHour 6).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct BandPolicy {
    /// `restart` or `drop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<OnFailure>,
    /// `preferHotSpare` or `any`; only meaningful with `onFailure: restart`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_placement: Option<RestartPlacement>,
    /// More restarts of one replica than this within a sliding hour marks the bundle Broken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1000))]
    pub max_restarts_per_hour: Option<i32>,
}

/// Per-band overrides of the operator's band defaults, for one bundle.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct BandOverrides {
    /// Overrides for gold jobs of this bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gold: Option<BandPolicy>,
    /// Overrides for silver jobs of this bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub silver: Option<BandPolicy>,
    /// Overrides for bronze jobs of this bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bronze: Option<BandPolicy>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_then_start_is_the_safest_strategy_and_handover_the_strongest() {
        use MigrationStrategy::*;
        assert!(StopThenStart.safety_rank() < Overlap.safety_rank());
        assert!(Overlap.safety_rank() < Handover.safety_rank());
        assert_eq!(MigrationStrategy::default(), StopThenStart);
    }

    #[test]
    fn names_match_the_api_spelling() {
        for s in [
            MigrationStrategy::Overlap,
            MigrationStrategy::StopThenStart,
            MigrationStrategy::Handover,
        ] {
            assert_eq!(
                serde_json::to_value(s).ok(),
                Some(serde_json::Value::from(s.as_str()))
            );
        }
        for b in [
            PriorityBand::Gold,
            PriorityBand::Silver,
            PriorityBand::Bronze,
        ] {
            assert_eq!(
                serde_json::to_value(b).ok(),
                Some(serde_json::Value::from(b.as_str()))
            );
        }
    }
}
