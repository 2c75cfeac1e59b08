//! The rebalancer: whether a replica whose soft placement rules are broken (for example replicas
//! no longer in one zone after a recovery) should be moved back now, and which jobs go where.
//!
//! The TypeScript library (`@norskvideo/norsk-auto-manager`) reports a broken soft rule and
//! leaves it; the operator adds an opt-in move back (`Bundle.spec.rebalance`). The rules:
//!
//! 1. only a replica that breaks a soft rule **now** (its jobs' current nodes and zones against
//!    the other replicas' and against each other, [`broken_soft_rules`]) is moved;
//! 2. the placement engine proposes where the replica would go were it placed now (a first
//!    placement: hot spares are kept for recoveries); the move is made only when that proposal
//!    is on nodes that are up (no node still starting) and breaks a **strict subset** of the
//!    soft rules broken now, so a move never trades one broken rule for another and two moves
//!    never undo each other;
//! 3. the jobs whose proposed node differs from their current one move, each by a Migration with
//!    the job's declared strategy, so the migration queue and the disruption budget apply.
//!
//! Pure: the caller observes positions, asks the engine and passes its answer.

use std::collections::BTreeSet;

use automanager_placement::{PlacementRules, SoftRule, Strength};

/// Where one job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub node: String,
    pub zone: Option<String>,
}

/// The soft rules the placement of one replica's jobs (`replica`, by job) breaks against the
/// other replicas' jobs (`others`) and against each other.
pub fn broken_soft_rules(
    inter: &PlacementRules,
    intra: &PlacementRules,
    replica: &[At],
    others: &[At],
) -> BTreeSet<SoftRule> {
    let mut broken = BTreeSet::new();
    for (i, job) in replica.iter().enumerate() {
        check(
            inter,
            job,
            others.iter(),
            [
                SoftRule::InterSameNode,
                SoftRule::InterDifferentNode,
                SoftRule::InterSameZone,
                SoftRule::InterDifferentZone,
            ],
            &mut broken,
        );
        let siblings = replica
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(_, a)| a);
        check(
            intra,
            job,
            siblings,
            [
                SoftRule::IntraSameNode,
                SoftRule::IntraDifferentNode,
                SoftRule::IntraSameZone,
                SoftRule::IntraDifferentZone,
            ],
            &mut broken,
        );
    }
    broken
}

/// The engine's rule semantics: a rule applies once some other job has a node (a zone for the
/// zone rules); `same` asks for one of theirs, `different` for none of theirs.
fn check<'a>(
    rules: &PlacementRules,
    job: &At,
    others: impl Iterator<Item = &'a At>,
    [same_node, diff_node, same_zone, diff_zone]: [SoftRule; 4],
    broken: &mut BTreeSet<SoftRule>,
) {
    let others: Vec<&At> = others.collect();
    let nodes: BTreeSet<&str> = others.iter().map(|a| a.node.as_str()).collect();
    let zones: BTreeSet<&str> = others.iter().filter_map(|a| a.zone.as_deref()).collect();
    let soft = |s: Option<Strength>| s == Some(Strength::Soft);
    let on_their_node = nodes.contains(job.node.as_str());
    let in_their_zone = job.zone.as_deref().is_some_and(|z| zones.contains(z));
    if !nodes.is_empty() {
        if soft(rules.same_node) && !on_their_node {
            broken.insert(same_node);
        }
        if soft(rules.different_node) && on_their_node {
            broken.insert(diff_node);
        }
    }
    if !zones.is_empty() {
        if soft(rules.same_zone) && !in_their_zone {
            broken.insert(same_zone);
        }
        if soft(rules.different_zone) && in_their_zone {
            broken.insert(diff_zone);
        }
    }
}

/// Where the engine would place the replica now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// (job name, node) per job of the replica.
    pub assignments: Vec<(String, String)>,
    /// The soft rules the proposal breaks.
    pub broken: BTreeSet<SoftRule>,
    /// Some proposed node is still starting.
    pub pending: bool,
}

/// One job to move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub job_name: String,
    pub from: String,
    pub to: String,
}

/// What to do with one replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its soft rules hold: nothing to do.
    Holds,
    /// Broken, and no placement now would be better (no room where the rules hold): look again
    /// when capacity changes.
    NoBetterPlacement,
    /// Move these jobs.
    Move(Vec<Move>),
}

/// Decides for one replica: `current` is (job name, node) per job, `broken_now` what it breaks
/// now, `proposal` the engine's answer (`None` when it could not place the replica at all).
pub fn decide(
    current: &[(String, String)],
    broken_now: &BTreeSet<SoftRule>,
    proposal: Option<&Proposal>,
) -> Verdict {
    if broken_now.is_empty() {
        return Verdict::Holds;
    }
    let Some(p) = proposal else {
        return Verdict::NoBetterPlacement;
    };
    if p.pending || !(p.broken.is_subset(broken_now) && p.broken.len() < broken_now.len()) {
        return Verdict::NoBetterPlacement;
    }
    let moves: Vec<Move> = p
        .assignments
        .iter()
        .filter_map(|(job, to)| {
            let (_, from) = current.iter().find(|(j, _)| j == job)?;
            (from != to).then(|| Move {
                job_name: job.clone(),
                from: from.clone(),
                to: to.clone(),
            })
        })
        .collect();
    if moves.is_empty() {
        Verdict::NoBetterPlacement
    } else {
        Verdict::Move(moves)
    }
}

/// The soft rules' names, for messages.
pub fn rule_names(rules: &BTreeSet<SoftRule>) -> String {
    rules
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Replica `r`'s jobs and every other replica's, from each replica's positions (by replica, by
/// job); `None` when there is no replica `r`.
pub fn split(positions: &[Vec<At>], r: usize) -> Option<(Vec<At>, Vec<At>)> {
    let mine = positions.get(r)?.clone();
    let others = (positions.iter().enumerate())
        .filter(|(i, _)| *i != r)
        .flat_map(|(_, jobs)| jobs.iter().cloned())
        .collect();
    Some((mine, others))
}

/// What one look at a bundle found: its `RebalanceNeeded` condition and whether a change of
/// capacity in its pools should wake it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// Every soft rule holds (or no replica is settled enough to judge).
    Holds,
    /// `replica` breaks `rules` (named); a migration of the bundle is under way already.
    InProgress { replica: u32, rules: String },
    /// `replica` breaks `rules`; no node where they would hold has room yet.
    WaitingForCapacity { replica: u32, rules: String },
    /// `replica` breaks `rules` and could move, but the fleet's rate is used up.
    RateLimited {
        replica: u32,
        rules: String,
        /// `rebalance.maxPerMinute`.
        per_minute: u32,
    },
    /// `replica` breaks `rules`: these moves began, each with its Migration's name.
    Started {
        replica: u32,
        rules: String,
        moves: Vec<(Move, String)>,
    },
}

impl Finding {
    /// The `RebalanceNeeded` condition: (status, reason, message).
    pub fn condition(&self) -> (bool, &'static str, String) {
        match self {
            Finding::Holds => (
                false,
                "SoftRulesHold",
                "every soft placement rule holds".into(),
            ),
            Finding::InProgress { replica, rules } => (
                true,
                "MigrationInProgress",
                format!(
                    "replica {replica} breaks soft rule(s) {rules}; a migration of this bundle is under way"
                ),
            ),
            Finding::WaitingForCapacity { replica, rules } => (
                true,
                "WaitingForCapacity",
                format!(
                    "replica {replica} breaks soft rule(s) {rules}; no node where they would hold has room yet"
                ),
            ),
            Finding::RateLimited {
                replica,
                rules,
                per_minute,
            } => (
                true,
                "RateLimited",
                format!(
                    "replica {replica} breaks soft rule(s) {rules} and could move; rebalance.maxPerMinute ({per_minute}) is used up"
                ),
            ),
            Finding::Started {
                replica,
                rules,
                moves,
            } => {
                let note = moves
                    .iter()
                    .map(|(m, name)| {
                        format!(
                            "job {} from {} to {} (Migration {name})",
                            m.job_name, m.from, m.to
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("; ");
                (
                    true,
                    "MigrationStarted",
                    format!(
                        "replica {replica} breaks soft rule(s) {rules} and there is room where they hold: moving {note}"
                    ),
                )
            }
        }
    }

    /// Whether capacity in the bundle's pools could let it move: wake it when that changes.
    pub fn wait_for_capacity(&self) -> bool {
        matches!(
            self,
            Finding::WaitingForCapacity { .. } | Finding::RateLimited { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(node: &str, zone: &str) -> At {
        At {
            node: node.into(),
            zone: Some(zone.into()),
        }
    }

    fn set(rules: &[SoftRule]) -> BTreeSet<SoftRule> {
        rules.iter().copied().collect()
    }

    fn cur(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(j, n)| ((*j).into(), (*n).into())).collect()
    }

    fn proposal(v: &[(&str, &str)], broken: &[SoftRule], pending: bool) -> Proposal {
        Proposal {
            assignments: cur(v),
            broken: set(broken),
            pending,
        }
    }

    #[test]
    fn a_finding_says_what_the_condition_says_and_whether_capacity_wakes_it() {
        let rules = rule_names(&set(&[SoftRule::InterSameZone, SoftRule::IntraSameNode]));
        let started = Finding::Started {
            replica: 1,
            rules: rules.clone(),
            moves: vec![(
                Move {
                    job_name: "enc".into(),
                    from: "a".into(),
                    to: "b".into(),
                },
                "news-rebalance-x".into(),
            )],
        };
        let (on, reason, message) = started.condition();
        assert!(on);
        assert_eq!(reason, "MigrationStarted");
        assert!(
            message.ends_with("moving job enc from a to b (Migration news-rebalance-x)"),
            "{message}"
        );
        assert!(
            message.starts_with("replica 1 breaks soft rule(s) "),
            "{message}"
        );
        let waits = |f: Finding| (f.condition().1, f.wait_for_capacity());
        assert_eq!(waits(Finding::Holds), ("SoftRulesHold", false));
        assert_eq!(
            waits(Finding::InProgress {
                replica: 0,
                rules: rules.clone()
            }),
            ("MigrationInProgress", false)
        );
        assert_eq!(
            waits(Finding::WaitingForCapacity {
                replica: 0,
                rules: rules.clone()
            }),
            ("WaitingForCapacity", true)
        );
        assert_eq!(
            waits(Finding::RateLimited {
                replica: 0,
                rules,
                per_minute: 4
            }),
            ("RateLimited", true)
        );
        assert!(!Finding::Holds.condition().0);
    }

    #[test]
    fn split_parts_one_replica_from_the_others() {
        let positions = vec![
            vec![at("a", "z1")],
            vec![at("b", "z2"), at("c", "z2")],
            vec![],
        ];
        let (mine, others) = split(&positions, 1).unwrap_or_default();
        assert_eq!(mine, [at("b", "z2"), at("c", "z2")]);
        assert_eq!(others, [at("a", "z1")]);
        assert!(split(&positions, 3).is_none());
    }

    #[test]
    fn soft_rules_are_judged_as_the_engine_judges_them() {
        let inter = PlacementRules::inter_replica_default();
        let none = PlacementRules::none();
        // The default: another zone breaks same-zone; the hard different-node is not ours.
        assert_eq!(
            broken_soft_rules(&inter, &none, &[at("b1", "zb")], &[at("a1", "za")]),
            set(&[SoftRule::InterSameZone])
        );
        assert_eq!(
            broken_soft_rules(&inter, &none, &[at("a2", "za")], &[at("a1", "za")]),
            set(&[])
        );
        // No other replica placed: no inter rule applies.
        assert_eq!(
            broken_soft_rules(&inter, &none, &[at("b1", "zb")], &[]),
            set(&[])
        );
        // A node with no zone is in no zone.
        let zoneless = At {
            node: "x".into(),
            zone: None,
        };
        assert_eq!(
            broken_soft_rules(&inter, &none, &[zoneless], &[at("a1", "za")]),
            set(&[SoftRule::InterSameZone])
        );
        // Intra rules compare the replica's jobs with each other.
        let soft_same_node = PlacementRules {
            same_node: Some(Strength::Soft),
            ..PlacementRules::none()
        };
        let spread_zones = PlacementRules {
            different_zone: Some(Strength::Soft),
            different_node: Some(Strength::Soft),
            ..PlacementRules::none()
        };
        assert_eq!(
            broken_soft_rules(
                &none,
                &soft_same_node,
                &[at("a1", "za"), at("a2", "za")],
                &[]
            ),
            set(&[SoftRule::IntraSameNode])
        );
        assert_eq!(
            broken_soft_rules(&none, &spread_zones, &[at("a1", "za"), at("a1", "za")], &[]),
            set(&[SoftRule::IntraDifferentNode, SoftRule::IntraDifferentZone])
        );
        assert_eq!(
            broken_soft_rules(
                &spread_zones,
                &none,
                &[at("a1", "za")],
                &[at("b1", "zb"), at("a9", "za")]
            ),
            set(&[SoftRule::InterDifferentZone])
        );
    }

    #[test]
    fn table() {
        let zone = [SoftRule::InterSameZone];
        let b = |p: &Proposal| Some(p.clone());
        struct Case {
            name: &'static str,
            broken_now: Vec<SoftRule>,
            proposal: Option<Proposal>,
            want: Verdict,
        }
        let cases = vec![
            Case {
                name: "rules hold: nothing, whatever the engine says",
                broken_now: vec![],
                proposal: b(&proposal(&[("enc", "a3")], &[], false)),
                want: Verdict::Holds,
            },
            Case {
                name: "no room anywhere",
                broken_now: zone.to_vec(),
                proposal: None,
                want: Verdict::NoBetterPlacement,
            },
            Case {
                name: "the only room is where it is",
                broken_now: zone.to_vec(),
                proposal: b(&proposal(&[("enc", "b1")], &zone, false)),
                want: Verdict::NoBetterPlacement,
            },
            Case {
                name: "room elsewhere that breaks the same rule is no better",
                broken_now: zone.to_vec(),
                proposal: b(&proposal(&[("enc", "c1")], &zone, false)),
                want: Verdict::NoBetterPlacement,
            },
            Case {
                name: "trading one broken rule for another is no better",
                broken_now: zone.to_vec(),
                proposal: b(&proposal(
                    &[("enc", "a3")],
                    &[SoftRule::InterDifferentNode],
                    false,
                )),
                want: Verdict::NoBetterPlacement,
            },
            Case {
                name: "a node still starting is not room yet",
                broken_now: zone.to_vec(),
                proposal: b(&proposal(&[("enc", "a3")], &[], true)),
                want: Verdict::NoBetterPlacement,
            },
            Case {
                name: "room where the rule holds: move",
                broken_now: zone.to_vec(),
                proposal: b(&proposal(&[("enc", "a3")], &[], false)),
                want: Verdict::Move(vec![Move {
                    job_name: "enc".into(),
                    from: "b1".into(),
                    to: "a3".into(),
                }]),
            },
        ];
        for c in cases {
            let got = decide(
                &cur(&[("enc", "b1")]),
                &set(&c.broken_now),
                c.proposal.as_ref(),
            );
            assert_eq!(got, c.want, "{}", c.name);
        }
    }

    #[test]
    fn only_the_jobs_that_change_node_move() {
        let got = decide(
            &cur(&[("enc", "b1"), ("pkg", "a3")]),
            &set(&[SoftRule::IntraSameZone]),
            Some(&proposal(&[("enc", "a3"), ("pkg", "a3")], &[], false)),
        );
        assert_eq!(
            got,
            Verdict::Move(vec![Move {
                job_name: "enc".into(),
                from: "b1".into(),
                to: "a3".into(),
            }])
        );
    }

    fn arb_rules() -> impl Strategy<Value = BTreeSet<SoftRule>> {
        proptest::collection::btree_set(
            prop_oneof![
                Just(SoftRule::InterSameZone),
                Just(SoftRule::InterDifferentNode),
                Just(SoftRule::IntraSameNode),
                Just(SoftRule::IntraDifferentZone),
            ],
            0..4,
        )
    }

    proptest! {
        /// A move is only ever to strictly fewer broken rules, none of them new, so repeated
        /// rebalancing ends: every move lowers the count of broken rules.
        #[test]
        fn a_move_always_strictly_improves(
            now in arb_rules(),
            then in arb_rules(),
            pending in any::<bool>(),
            to in prop_oneof![Just("a3"), Just("b1")],
        ) {
            let p = proposal(&[("enc", to)], &then.iter().copied().collect::<Vec<_>>(), pending);
            match decide(&cur(&[("enc", "b1")]), &now, Some(&p)) {
                Verdict::Move(moves) => {
                    prop_assert!(!pending);
                    prop_assert!(then.is_subset(&now) && then.len() < now.len());
                    prop_assert!(moves.iter().all(|m| m.from != m.to));
                }
                Verdict::Holds => prop_assert!(now.is_empty()),
                Verdict::NoBetterPlacement => prop_assert!(
                    !now.is_empty()
                        && (pending || to == "b1" || !(then.is_subset(&now) && then.len() < now.len()))
                ),
            }
        }
    }
}
