//! The fleet-wide migration queue: which waiting migrations may begin now.
//!
//! Pure: the caller passes the migrations in flight, the waiting ones and the disruption
//! budget ledger; [`admit`] answers for each waiting migration whether it begins now or waits,
//! and why. No I/O, no clock.
//!
//! The rules (the operator goes further than the `@norskvideo/norsk-auto-manager` TypeScript
//! library here; KubeVirt limits parallel migrations the same way):
//!
//! - **Order.** Waiting migrations are taken by priority, then age (older first), then
//!   namespace/name: moves with a deadline (a reclaim notice's) first, then drains, then
//!   rebalancing, then consolidation. A Migration a person
//!   created ranks with drains: someone asked for it now, and like a drain it usually makes
//!   room for maintenance.
//! - **Parallelism.** At most `global` migrations run at once in the fleet, and at most
//!   `per_node` touch one node (as source, or as target once it is known).
//! - **Budget.** A migration takes its replica down while it runs ([`crate::disruption`]); one
//!   the budget blocks waits without holding a slot, and the migrations behind it may go.
//!   One whose node is full waits too, and those behind it for other nodes may go; once the
//!   global limit is reached everything else waits.
//! - **Deadlines.** A move with a deadline is never held by the parallelism limits nor by its
//!   bundle's budget: the node is taken at its deadline whatever the fleet's pace, and its
//!   replica goes down then whether it moved or not, so waiting can only lose the job. It
//!   counts in both, so voluntary moves wait behind it (its replica is down in the ledger).

use std::collections::BTreeMap;

use crate::disruption::{Ledger, Verdict};

/// Why a migration is run: its rank in the queue (lower goes first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Purpose {
    /// A move ahead of a deadline: a reclaim notice's.
    Deadline,
    /// A node drain, or a Migration a person created.
    Drain,
    Rebalance,
    Consolidation,
}

impl Purpose {
    pub fn as_str(self) -> &'static str {
        match self {
            Purpose::Deadline => "reclaim",
            Purpose::Drain => "drain",
            Purpose::Rebalance => "rebalance",
            Purpose::Consolidation => "consolidation",
        }
    }

    /// The reason a disruption window governs this purpose (a deadline's move is not
    /// voluntary and no window holds it; it reads as the drain it usually overtakes).
    pub fn voluntary_reason(self) -> crate::vocab::VoluntaryReason {
        match self {
            Purpose::Deadline | Purpose::Drain => crate::vocab::VoluntaryReason::Drain,
            Purpose::Rebalance => crate::vocab::VoluntaryReason::Rebalance,
            Purpose::Consolidation => crate::vocab::VoluntaryReason::Consolidation,
        }
    }

    /// From the purpose label's value; anything else (a person's Migration) ranks with drains.
    pub fn from_label(value: Option<&str>) -> Purpose {
        match value {
            Some("reclaim") => Purpose::Deadline,
            Some("rebalance") => Purpose::Rebalance,
            Some("consolidation") => Purpose::Consolidation,
            _ => Purpose::Drain,
        }
    }
}

/// Limits from the operator's `migration:` settings (values below 1 count as 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub global: usize,
    pub per_node: usize,
}

/// A migration in flight: it holds a slot on its nodes and in the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Running {
    pub source_node: String,
    pub target_node: Option<String>,
}

/// A migration waiting to begin. `B` names its bundle in the budget ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting<B> {
    /// `namespace/name`, unique.
    pub key: String,
    pub purpose: Purpose,
    /// Creation time, in any monotonic unit (milliseconds since the epoch).
    pub created: i64,
    pub source_node: String,
    pub target_node: Option<String>,
    /// The bundle and replica it takes down; `None` for a job of no Bundle.
    pub replica: Option<(B, u32)>,
}

/// Why a waiting migration does not begin now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitReason<B> {
    /// The bundle's disruption budget: `down` are the other replicas down now.
    Budget {
        bundle: B,
        down: Vec<u32>,
        max_unavailable: u32,
    },
    /// `global` migrations run already.
    GlobalLimit { running: usize, limit: usize },
    /// `node` takes part in `per_node` migrations already.
    NodeLimit { node: String, limit: usize },
    /// Disruption windows hold moves for `reason` of the bundle's job: `held_by` are the
    /// calendars closed now (the bundle's, the job's band's), `until` the first time all admit
    /// it, or when to look again when `found` is false (they never opened together within the
    /// look-ahead). `unreadable` names a calendar whose windows cannot be read, and why: it
    /// holds every move until they are fixed. Decided by the caller with
    /// [`crate::calendar::permit_all`]; the queue itself never answers this.
    Window {
        bundle: B,
        reason: crate::vocab::VoluntaryReason,
        until: chrono::DateTime<chrono::Utc>,
        held_by: Vec<crate::calendar::WindowSource>,
        found: bool,
        unreadable: Option<(crate::calendar::WindowSource, String)>,
    },
    /// A Migration of `job`, which shares the job's node by rule ([`crate::co_location`]),
    /// runs now: the group moves one job at a time. Decided by the caller; the queue itself
    /// never answers this.
    CoLocated { bundle: B, job: String },
}

/// The answer for one waiting migration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission<B> {
    Begin,
    /// `position` counts from 1 among the migrations still waiting after this pass.
    Wait {
        position: usize,
        reason: WaitReason<B>,
    },
}

/// Decides every waiting migration, in queue order. The ledger is updated with the ones that
/// begin. Answers `(key, admission)` in queue order.
pub fn admit<B: Ord + Clone>(
    running: &[Running],
    waiting: &[Waiting<B>],
    limits: Limits,
    ledger: &mut Ledger<B>,
) -> Vec<(String, Admission<B>)> {
    let global = limits.global.max(1);
    let per_node = limits.per_node.max(1);
    let mut on_node: BTreeMap<&str, usize> = BTreeMap::new();
    for r in running {
        for n in nodes(&r.source_node, r.target_node.as_deref()) {
            *on_node.entry(n).or_default() += 1;
        }
    }
    let mut in_flight = running.len();
    let mut order: Vec<&Waiting<B>> = waiting.iter().collect();
    order.sort_by(|a, b| (a.purpose, a.created, &a.key).cmp(&(b.purpose, b.created, &b.key)));
    let mut out = Vec::with_capacity(order.len());
    let mut position = 0;
    for w in order {
        let paced = w.purpose != Purpose::Deadline;
        let reason = if paced && in_flight >= global {
            Some(WaitReason::GlobalLimit {
                running: in_flight,
                limit: global,
            })
        } else if let Some(full) = nodes(&w.source_node, w.target_node.as_deref())
            .filter(|_| paced)
            .find(|n| on_node.get(n).copied().unwrap_or(0) >= per_node)
        {
            Some(WaitReason::NodeLimit {
                node: full.to_owned(),
                limit: per_node,
            })
        } else {
            match &w.replica {
                Some((bundle, replica)) => match ledger.take(bundle, *replica) {
                    Verdict::Allowed => None,
                    // A deadline beats a budget: its replica is down from now on either way.
                    Verdict::Blocked { .. } if !paced => {
                        ledger.mark(bundle, *replica);
                        None
                    }
                    Verdict::Blocked {
                        down,
                        max_unavailable,
                    } => Some(WaitReason::Budget {
                        bundle: bundle.clone(),
                        down,
                        max_unavailable,
                    }),
                },
                None => None,
            }
        };
        match reason {
            None => {
                in_flight += 1;
                for n in nodes(&w.source_node, w.target_node.as_deref()) {
                    *on_node.entry(n).or_default() += 1;
                }
                out.push((w.key.clone(), Admission::Begin));
            }
            Some(reason) => {
                position += 1;
                out.push((w.key.clone(), Admission::Wait { position, reason }));
            }
        }
    }
    out
}

/// The nodes a migration touches (an empty name is no node).
fn nodes<'a>(source: &'a str, target: Option<&'a str>) -> impl Iterator<Item = &'a str> {
    std::iter::once(source)
        .chain(target.filter(|t| *t != source))
        .filter(|n| !n.is_empty())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::disruption::ReplicaStanding;
    use proptest::prelude::*;

    fn w(key: &str, purpose: Purpose, created: i64, source: &str) -> Waiting<String> {
        Waiting {
            key: key.into(),
            purpose,
            created,
            source_node: source.into(),
            target_node: None,
            replica: None,
        }
    }

    fn limits(global: usize, per_node: usize) -> Limits {
        Limits { global, per_node }
    }

    fn begun(out: &[(String, Admission<String>)]) -> Vec<&str> {
        out.iter()
            .filter(|(_, a)| *a == Admission::Begin)
            .map(|(k, _)| k.as_str())
            .collect()
    }

    #[test]
    fn a_deadline_move_goes_first_and_past_the_limits_and_voluntary_moves_wait_behind_it() {
        let running = [Running {
            source_node: "n1".into(),
            target_node: Some("n2".into()),
        }];
        let waiting = [
            w("drain", Purpose::Drain, 0, "n1"),
            w("reclaim", Purpose::Deadline, 9, "n1"),
        ];
        let out = admit(&running, &waiting, limits(1, 1), &mut Ledger::new());
        assert_eq!(begun(&out), ["reclaim"]);
        assert_eq!(out[0].0, "reclaim", "first in the queue");
        assert!(matches!(
            out[1].1,
            Admission::Wait {
                reason: WaitReason::GlobalLimit { running: 2, .. },
                ..
            }
        ));
        assert_eq!(Purpose::from_label(Some("reclaim")), Purpose::Deadline);
    }

    #[test]
    fn a_deadline_move_beats_its_budget_and_takes_its_replica_down() {
        let mut ledger = Ledger::new();
        ledger.insert(
            "b".to_owned(),
            1,
            vec![
                ReplicaStanding {
                    replica: 0,
                    running: true,
                    disrupted: false,
                },
                ReplicaStanding {
                    replica: 1,
                    running: true,
                    disrupted: true,
                },
                ReplicaStanding {
                    replica: 2,
                    running: true,
                    disrupted: false,
                },
            ],
        );
        let mut reclaim = w("reclaim", Purpose::Deadline, 0, "n1");
        reclaim.replica = Some(("b".to_owned(), 0));
        let mut drain = w("drain", Purpose::Drain, 0, "n2");
        drain.replica = Some(("b".to_owned(), 2));
        let out = admit(&[], &[reclaim, drain], limits(5, 5), &mut ledger);
        assert_eq!(out[0], ("reclaim".to_owned(), Admission::Begin));
        assert!(
            matches!(
                &out[1].1,
                Admission::Wait {
                    reason: WaitReason::Budget { down, .. },
                    ..
                } if down.contains(&0)
            ),
            "{out:?}"
        );
    }

    #[test]
    fn drains_go_before_rebalancing_before_consolidation_then_oldest_first() {
        let waiting = [
            w("c", Purpose::Consolidation, 1, "n1"),
            w("r", Purpose::Rebalance, 0, "n2"),
            w("d2", Purpose::Drain, 5, "n3"),
            w("d1", Purpose::Drain, 4, "n4"),
        ];
        let out = admit(&[], &waiting, limits(2, 2), &mut Ledger::new());
        assert_eq!(begun(&out), ["d1", "d2"]);
        let keys: Vec<&str> = out.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["d1", "d2", "r", "c"]);
        assert_eq!(
            out[2].1,
            Admission::Wait {
                position: 1,
                reason: WaitReason::GlobalLimit {
                    running: 2,
                    limit: 2
                }
            }
        );
        assert!(matches!(out[3].1, Admission::Wait { position: 2, .. }));
    }

    #[test]
    fn running_migrations_hold_their_slots_on_both_nodes() {
        let running = [Running {
            source_node: "n1".into(),
            target_node: Some("n2".into()),
        }];
        let mut to_n2 = w("b", Purpose::Drain, 1, "n3");
        to_n2.target_node = Some("n2".into());
        let waiting = [
            w("a", Purpose::Drain, 0, "n1"),
            to_n2,
            w("c", Purpose::Drain, 2, "n4"),
        ];
        let out = admit(&running, &waiting, limits(10, 1), &mut Ledger::new());
        assert_eq!(begun(&out), ["c"]);
        assert_eq!(
            out[0].1,
            Admission::Wait {
                position: 1,
                reason: WaitReason::NodeLimit {
                    node: "n1".into(),
                    limit: 1
                }
            }
        );
    }

    #[test]
    fn a_migration_the_budget_blocks_lets_the_ones_behind_it_go() {
        let mut ledger = Ledger::new();
        let standing = |replica, running| ReplicaStanding {
            replica,
            running,
            disrupted: false,
        };
        ledger.insert(
            "b".to_owned(),
            1,
            vec![standing(0, true), standing(1, true)],
        );
        let mut first = w("first", Purpose::Drain, 0, "n1");
        first.replica = Some(("b".into(), 0));
        let mut second = w("second", Purpose::Drain, 1, "n2");
        second.replica = Some(("b".into(), 1));
        let other = w("other", Purpose::Drain, 2, "n3");
        let out = admit(&[], &[second, first, other], limits(5, 2), &mut ledger);
        assert_eq!(begun(&out), ["first", "other"]);
        assert_eq!(
            out[1].1,
            Admission::Wait {
                position: 1,
                reason: WaitReason::Budget {
                    bundle: "b".into(),
                    down: vec![0],
                    max_unavailable: 1
                }
            }
        );
    }

    #[test]
    fn limits_below_one_count_as_one() {
        let waiting = [
            w("a", Purpose::Drain, 0, "n1"),
            w("b", Purpose::Drain, 1, "n2"),
        ];
        let out = admit(&[], &waiting, limits(0, 0), &mut Ledger::new());
        assert_eq!(begun(&out), ["a"]);
    }

    #[test]
    fn purposes_read_from_the_label_and_a_persons_migration_ranks_with_drains() {
        assert_eq!(Purpose::from_label(Some("rebalance")), Purpose::Rebalance);
        assert_eq!(
            Purpose::from_label(Some("consolidation")),
            Purpose::Consolidation
        );
        assert_eq!(Purpose::from_label(Some("drain")), Purpose::Drain);
        assert_eq!(Purpose::from_label(None), Purpose::Drain);
        assert_eq!(Purpose::from_label(Some("urgent!")), Purpose::Drain);
    }

    fn purpose() -> impl Strategy<Value = Purpose> {
        prop_oneof![
            Just(Purpose::Drain),
            Just(Purpose::Rebalance),
            Just(Purpose::Consolidation)
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Repeating the pass as migrations end never runs more than the limits, never breaks
        /// a budget, and lets every migration begin once.
        #[test]
        fn never_over_the_limits_and_everything_runs_once(
            specs in proptest::collection::vec((purpose(), 0i64..50, 0usize..4, 0u32..3), 0..24),
            global in 1usize..5,
            per_node in 1usize..3,
        ) {
            let waiting: Vec<Waiting<String>> = specs.iter().enumerate().map(|(i, (p, t, n, r))| Waiting {
                key: format!("m{i:02}"),
                purpose: *p,
                created: *t,
                source_node: format!("n{n}"),
                target_node: None,
                replica: Some((format!("b{}", i % 3), *r)),
            }).collect();
            let mut queue = waiting.clone();
            let mut running: Vec<(Waiting<String>, u32)> = Vec::new();
            let mut begun_once = std::collections::BTreeSet::new();
            for _ in 0..(4 * waiting.len() + 4) {
                // Each bundle: three replicas, all running; those being migrated are disrupted.
                let mut ledger = Ledger::new();
                for b in 0..3 {
                    let bundle = format!("b{b}");
                    let standing = (0..3).map(|r| ReplicaStanding {
                        replica: r,
                        running: true,
                        disrupted: running.iter().any(|(m, _)| m.replica == Some((bundle.clone(), r))),
                    }).collect();
                    ledger.insert(bundle, 1, standing);
                }
                let held: Vec<Running> = running.iter().map(|(m, _)| Running {
                    source_node: m.source_node.clone(),
                    target_node: None,
                }).collect();
                let out = admit(&held, &queue, Limits { global, per_node }, &mut ledger);
                for (key, a) in out {
                    if a == Admission::Begin {
                        prop_assert!(begun_once.insert(key.clone()), "{} began twice", key);
                        let i = queue.iter().position(|m| m.key == key).unwrap();
                        running.push((queue.remove(i), 1));
                    }
                }
                prop_assert!(running.len() <= global);
                let mut per: BTreeMap<&str, usize> = BTreeMap::new();
                for (m, _) in &running {
                    *per.entry(m.source_node.as_str()).or_default() += 1;
                }
                prop_assert!(per.values().all(|n| *n <= per_node));
                let mut per_bundle: BTreeMap<&str, std::collections::BTreeSet<u32>> = BTreeMap::new();
                for (m, _) in &running {
                    if let Some((b, r)) = &m.replica {
                        per_bundle.entry(b.as_str()).or_default().insert(*r);
                    }
                }
                prop_assert!(per_bundle.values().all(|rs| rs.len() <= 1), "budget broken");
                // Every running migration ends after one step.
                running.retain_mut(|(_, left)| { *left = left.saturating_sub(1); *left > 0 });
                if queue.is_empty() && running.is_empty() {
                    break;
                }
            }
            prop_assert!(queue.is_empty(), "left waiting: {:?}", queue);
            prop_assert_eq!(begun_once.len(), waiting.len());
        }
    }
}
