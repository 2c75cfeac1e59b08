//! What a Bundle pass decides around the planner ([`crate::bundle`]): where a replica's
//! placement request puts the bundle's other jobs, whether the pass's status write waits for
//! starts about to run, and when the bundle is looked at again.
//!
//! - **The request.** A replica is placed as a unit: the jobs being placed now, with the jobs of
//!   the replica that need nothing as placed siblings (intra-replica rules, `coLocateWith` and
//!   `separateFrom` see them), and every job of the other replicas that holds a node (running,
//!   starting, or a start Manager accepted that the mirror does not show yet) as another
//!   replica's position, plus the replicas this same pass placed a moment before (the mirror
//!   does not show them yet).
//! - **The decision.** [`decide`] gives back what an earlier, unstarted placement of the same
//!   jobs reserved, asks the engine, and reserves a placed answer in the caller's
//!   [`Reservations`] book (the operator's cluster model), so placement is reached through
//!   policy.
//! - **A write that waits.** While the only thing left is jobs just started (running, or
//!   starting for less than [`TRANSIENT_START_MS`]), a `Placing` status is not written: the
//!   starts coming up wake the bundle, and a wave of starts is one settled write per bundle. A
//!   retry request, a replica that cannot be placed, a node being provisioned or asked for
//!   again, or a replica waiting for a stop, is written at once.
//! - **The next look.** A Ready bundle is looked at again when a replica's restart count clears
//!   (so status shows it when it happens), at the latest after [`SETTLED`] ([`REBALANCE`] while
//!   the rebalancer has something to say); a Broken one only when it changes; one that cannot
//!   be placed after [`STALLED`] (capacity changes wake it sooner); anything in progress after
//!   [`BUSY`], or when a failed node ask's back-off ends if that is later.
//!
//! Pure: the caller observes and passes plain data.

use std::collections::BTreeMap;
use std::time::Duration;

use automanager_placement as pl;

use crate::bundle::{JobPhase, Need, ReplicaIntent, ReplicaPlan};
use crate::pass::NextLook;
use crate::vocab::BundlePhase;

/// A job started less than this long ago is "about to run": its status write is coalesced.
pub const TRANSIENT_START_MS: i64 = 2_000;
/// Look again while something is in progress (a node starting, a job starting).
pub const BUSY: Duration = Duration::from_secs(2);
/// Look again while stalled (no capacity): capacity changes in the pools also wake it.
pub const STALLED: Duration = Duration::from_secs(30);
/// The periodic look at a settled bundle (clears restart counts of replicas that stayed up).
pub const SETTLED: Duration = Duration::from_secs(300);
/// The look at a settled bundle that would rebalance: a migration ends, the rate refills,
/// capacity comes back through a change that does not wake it.
pub const REBALANCE: Duration = Duration::from_secs(10);

/// One job of the bundle where the pass saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobAt {
    pub replica: u32,
    pub job_name: String,
    pub phase: JobPhase,
    /// Manager accepted a start the mirror does not show yet.
    pub start_in_flight: bool,
    /// Its node (empty when it has none).
    pub node: String,
    /// The node's zone, when known.
    pub zone: Option<String>,
}

/// What one replica's placement request is made of.
#[derive(Clone, Copy, Debug)]
pub struct Ask<'a> {
    pub bundle: &'a pl::BundleSpec,
    pub replica: u32,
    /// The jobs to place now.
    pub jobs: &'a [String],
    /// A recovery placement (hot spares first) rather than a first one.
    pub recovery: bool,
    /// What each job of the replica needs: one needing nothing stays where it is.
    pub needs: &'a BTreeMap<String, Need>,
    /// Every job of the bundle, as the pass saw it.
    pub seen: &'a [JobAt],
    /// Where replicas placed earlier in this pass went.
    pub decided_elsewhere: &'a [pl::Position],
}

/// The placement request for `ask` (see the module docs).
pub fn placement_request(ask: &Ask<'_>) -> pl::PlacementRequest {
    let mut placed_siblings = Vec::new();
    let mut other_replicas: Vec<pl::Position> = ask.decided_elsewhere.to_vec();
    for j in ask.seen.iter().filter(|j| !j.node.is_empty()) {
        if j.replica == ask.replica {
            if ask.needs.get(&j.job_name) == Some(&Need::Nothing) {
                placed_siblings.push(pl::SiblingPosition {
                    job_name: j.job_name.clone(),
                    node: j.node.clone(),
                    zone: j.zone.clone(),
                });
            }
        } else if j.start_in_flight || matches!(j.phase, JobPhase::Running | JobPhase::Starting) {
            other_replicas.push(pl::Position {
                node: j.node.clone(),
                zone: j.zone.clone(),
            });
        }
    }
    pl::PlacementRequest {
        bundle_id: ask.bundle.bundle_id.clone(),
        replica_index: ask.replica,
        jobs: ask
            .bundle
            .jobs
            .iter()
            .filter(|j| ask.jobs.contains(&j.job_name))
            .map(|j| pinned_to_group(&without_dropped(j, ask.needs), ask, &placed_siblings))
            .collect(),
        pools: ask.bundle.pools_for_replica(ask.replica).to_vec(),
        kind: if ask.recovery {
            pl::PlacementKind::Recovery
        } else {
            pl::PlacementKind::First
        },
        intra_replica: ask.bundle.intra_replica_placement,
        inter_replica: ask.bundle.inter_replica_placement,
        other_replicas,
        placed_siblings,
    }
}

/// The engine with what the caller has reserved in it: placements made and not yet shown by
/// Manager's state. The operator's cluster model keeps the book (it knows the mirror); the pass
/// decides through it here, so a replica's placement goes controller → policy → placement.
pub trait Reservations {
    /// The engine to place in, with every reservation held.
    fn engine(&self) -> &pl::Engine;
    /// Gives back what an earlier placement of `key` reserved and never started.
    fn release(&mut self, key: &pl::JobKey);
    /// Holds a placed decision's capacity until Manager's state shows the starts.
    fn reserve(&mut self, decision: &pl::Decision) -> Result<(), pl::CommitError>;
}

/// A replica's placement as [`decide`] made it.
#[derive(Debug)]
pub struct Decided {
    pub request: pl::PlacementRequest,
    pub decision: pl::Decision,
    /// A placed decision whose capacity could not be reserved (the engine refused the commit):
    /// the pass still acts on it, and the mirror catches up with what really started.
    pub unreserved: Option<pl::CommitError>,
}

/// Places one replica: its request ([`placement_request`]), with what an earlier, unstarted
/// placement of the same jobs reserved given back first, the engine's decision, and that
/// decision reserved in `book` when it placed the replica.
pub fn decide(book: &mut impl Reservations, ask: &Ask<'_>, now_ms: u64) -> Decided {
    let request = placement_request(ask);
    for job_name in ask.jobs {
        book.release(&pl::JobKey {
            bundle_id: ask.bundle.bundle_id.clone(),
            replica_index: ask.replica,
            job_name: job_name.clone(),
        });
    }
    let decision = book.engine().place(&request, now_ms);
    let unreserved = if decision.is_placed() {
        book.reserve(&decision).err()
    } else {
        None
    };
    Decided {
        request,
        decision,
        unreserved,
    }
}

/// `job` with `coLocateWith` naming every member of its co-location group that stays where it
/// runs ([`crate::co_location::group`], both directions): the engine pins a job to the siblings
/// it names itself, so without this an `enc` restarted alone would not be pinned to the running
/// `pkg` that declares `coLocateWith: [enc]`.
fn pinned_to_group(
    job: &pl::JobSpec,
    ask: &Ask<'_>,
    placed_siblings: &[pl::SiblingPosition],
) -> pl::JobSpec {
    let mut job = job.clone();
    let group = crate::co_location::group(
        &ask.bundle.jobs,
        &ask.bundle.intra_replica_placement,
        &job.job_name,
    );
    for s in placed_siblings {
        if group.contains(&s.job_name)
            && s.job_name != job.job_name
            && !job.co_locate_with.contains(&s.job_name)
        {
            job.co_locate_with.push(s.job_name.clone());
        }
    }
    job
}

/// `job` without its `coLocateWith` and `separateFrom` entries naming a job its band dropped:
/// a job that stays down binds nothing, and the engine refuses a rule naming a job that is
/// neither placed now nor running (a silver `pkg` co-located with a dropped bronze `enc` would
/// never be restarted).
fn without_dropped(job: &pl::JobSpec, needs: &BTreeMap<String, Need>) -> pl::JobSpec {
    let mut job = job.clone();
    let dropped = |name: &String| needs.get(name) == Some(&Need::Dropped);
    job.co_locate_with.retain(|t| !dropped(t));
    job.separate_from.retain(|t| !dropped(t));
    job
}

/// What the pass recorded, for whether its write waits and when it looks again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The phase the status says.
    pub phase: BundlePhase,
    /// The pass acted on a new retry request.
    pub retried: bool,
    /// A replica cannot be placed now.
    pub unplaceable: bool,
    /// A replica waits for a node being provisioned, a node asked for again later, or a stop.
    pub waiting: bool,
    /// The pass started jobs.
    pub started: bool,
    /// Every job of the bundle, by phase and when its instance started.
    pub jobs: Vec<(JobPhase, i64)>,
    /// Now, in milliseconds.
    pub now_ms: i64,
}

impl Recorded {
    /// Whether the status write waits for starts about to run (see the module docs).
    pub fn write_waits(&self) -> bool {
        let just_started = |(phase, started_at_ms): &(JobPhase, i64)| {
            *phase == JobPhase::Running
                || (*phase == JobPhase::Starting
                    && self.now_ms.saturating_sub(*started_at_ms) < TRANSIENT_START_MS)
        };
        self.phase == BundlePhase::Placing
            && !self.retried
            && !self.unplaceable
            && !self.waiting
            && (self.jobs.iter().all(just_started) || self.started)
    }
}

/// When a replica's restart count clears, if one will: the soonest of the settled replicas'
/// `clear_in_ms` and, for each replica restarted in this pass, its band's
/// `restartClearAfter` (the pass records it running, so no later pass would look before).
pub fn clear_in(
    plans: &BTreeMap<u32, ReplicaPlan>,
    restarted: impl IntoIterator<Item = i64>,
) -> Option<Duration> {
    plans
        .values()
        .filter_map(|p| match p.intent {
            ReplicaIntent::Settled { clear_in_ms, .. } => clear_in_ms,
            _ => None,
        })
        .chain(restarted)
        .min()
        .map(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(0)) + Duration::from_millis(50))
}

/// When the bundle is looked at again (see the module docs). `rebalancing`: the rebalancer's
/// condition is on; `retry_in`: the soonest back-off of a failed node ask.
pub fn next_look(
    phase: BundlePhase,
    unplaceable: bool,
    rebalancing: bool,
    clear_in: Option<Duration>,
    retry_in: Option<Duration>,
) -> NextLook {
    match phase {
        BundlePhase::Ready => {
            let settled = if rebalancing { REBALANCE } else { SETTLED };
            NextLook::After(clear_in.map_or(settled, |d| d.min(settled)))
        }
        BundlePhase::Broken => NextLook::OnChange,
        _ if unplaceable => NextLook::After(STALLED),
        // A node ask that failed is looked at again when its back-off ends, not before.
        _ => NextLook::After(retry_in.map_or(BUSY, |d| d.max(BUSY))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bundle(replicas: u32) -> pl::BundleSpec {
        pl::BundleSpec {
            bundle_id: "live.news".into(),
            replicas,
            pools: vec!["east".into(), "west".into()],
            jobs: vec![
                pl::JobSpec::new("enc", 10.0, 1, pl::PriorityBand::Gold),
                pl::JobSpec::new("pkg", 1.0, 1, pl::PriorityBand::Gold),
            ],
            replica_overrides: [(
                1,
                pl::ReplicaOverride {
                    pools: vec!["west".into()],
                },
            )]
            .into(),
            intra_replica_placement: pl::PlacementRules::default(),
            inter_replica_placement: pl::PlacementRules::default(),
        }
    }

    fn at(replica: u32, job: &str, phase: JobPhase, node: &str) -> JobAt {
        JobAt {
            replica,
            job_name: job.into(),
            phase,
            start_in_flight: false,
            node: node.into(),
            zone: Some(format!("z-{node}")),
        }
    }

    /// A book that is the engine itself, recording what the pass asked of it.
    struct Book {
        engine: pl::Engine,
        released: Vec<pl::JobKey>,
    }

    impl Reservations for Book {
        fn engine(&self) -> &pl::Engine {
            &self.engine
        }
        fn release(&mut self, key: &pl::JobKey) {
            self.engine.release_job(key);
            self.released.push(key.clone());
        }
        fn reserve(&mut self, decision: &pl::Decision) -> Result<(), pl::CommitError> {
            self.engine.commit(decision)
        }
    }

    fn book(nodes: &[(&str, f64)]) -> Book {
        let pool = |name: &str| pl::PoolSpec {
            name: name.into(),
            kind: pl::PoolKind::Cluster,
            region: "r".into(),
            zones: vec![],
            packing_strategy: pl::PackingStrategy::Binpack,
            scale_out: pl::ScaleOut::Fixed,
            candidate_instance_types: vec![],
            max_nodes: None,
            terminating: false,
        };
        let snapshot = pl::ClusterSnapshot {
            pools: vec![pool("east"), pool("west")],
            nodes: nodes
                .iter()
                .map(|(id, cap)| pl::NodeSpec::ready(id, "east", None, *cap, 16))
                .collect(),
            ..pl::ClusterSnapshot::default()
        };
        Book {
            engine: pl::Engine::new(snapshot).expect("valid snapshot"),
            released: vec![],
        }
    }

    #[test]
    fn a_decision_gives_back_the_jobs_earlier_reservation_places_and_reserves_what_it_placed() {
        let b = bundle(2);
        let jobs = vec!["enc".to_string(), "pkg".to_string()];
        let needs: BTreeMap<String, Need> = BTreeMap::new();
        let ask = Ask {
            bundle: &b,
            replica: 0,
            jobs: &jobs,
            recovery: false,
            needs: &needs,
            seen: &[],
            decided_elsewhere: &[],
        };
        let mut book = book(&[("n1", 11.0)]);
        let first = decide(&mut book, &ask, 0);
        assert!(first.decision.is_placed(), "{:?}", first.decision.outcome);
        assert!(first.unreserved.is_none());
        assert_eq!(first.request, placement_request(&ask));
        let keys: Vec<_> = book.released.drain(..).map(|k| k.job_name).collect();
        assert_eq!(
            keys, jobs,
            "what the replica's jobs held before is given back first"
        );
        // The placement holds n1's room: deciding again for the same replica gives it back
        // and lands there again, where a placement that kept it would find n1 full.
        let again = decide(&mut book, &ask, 0);
        assert!(again.decision.is_placed(), "{:?}", again.decision.outcome);
        let other = Ask { replica: 2, ..ask };
        let full = decide(&mut book, &other, 0);
        assert!(!full.decision.is_placed(), "n1 is reserved for replica 0");
        assert!(
            full.unreserved.is_none(),
            "nothing placed, nothing reserved"
        );
    }

    #[test]
    fn a_request_holds_the_jobs_placed_now_siblings_that_stay_and_other_replicas_that_hold_a_node()
    {
        let b = bundle(3);
        let needs: BTreeMap<String, Need> =
            [("enc".into(), Need::Recover), ("pkg".into(), Need::Nothing)].into();
        let mut in_flight = at(2, "enc", JobPhase::Failed, "n5");
        in_flight.start_in_flight = true;
        let seen = vec![
            at(0, "enc", JobPhase::Running, "n1"),
            at(0, "pkg", JobPhase::Stopped, "n1"),
            at(1, "enc", JobPhase::Failed, "n2"),
            at(1, "pkg", JobPhase::Running, "n2"),
            at(2, "pkg", JobPhase::Pending, ""),
            in_flight,
        ];
        let decided = [pl::Position {
            node: "n9".into(),
            zone: None,
        }];
        let r = placement_request(&Ask {
            bundle: &b,
            replica: 1,
            jobs: &["enc".to_owned()],
            recovery: true,
            needs: &needs,
            seen: &seen,
            decided_elsewhere: &decided,
        });
        assert_eq!(r.replica_index, 1);
        assert_eq!(r.kind, pl::PlacementKind::Recovery);
        assert_eq!(r.pools, ["west"], "replica 1's override");
        let jobs: Vec<&str> = r.jobs.iter().map(|j| j.job_name.as_str()).collect();
        assert_eq!(jobs, ["enc"]);
        let siblings: Vec<(&str, &str)> = r
            .placed_siblings
            .iter()
            .map(|s| (s.job_name.as_str(), s.node.as_str()))
            .collect();
        assert_eq!(siblings, [("pkg", "n2")], "the sibling that needs nothing");
        let others: Vec<&str> = r.other_replicas.iter().map(|p| p.node.as_str()).collect();
        assert_eq!(
            others,
            ["n9", "n1", "n5"],
            "decided, running, a start in flight"
        );
    }

    #[test]
    fn rules_naming_a_dropped_job_are_left_out_and_the_others_kept() {
        let mut b = bundle(1);
        b.jobs
            .push(pl::JobSpec::new("thumb", 1.0, 1, pl::PriorityBand::Gold));
        b.jobs[1].co_locate_with = vec!["enc".into(), "thumb".into()];
        b.jobs[1].separate_from = vec!["enc".into()];
        let needs: BTreeMap<String, Need> = [
            ("enc".into(), Need::Dropped),
            ("pkg".into(), Need::Recover),
            ("thumb".into(), Need::Recover),
        ]
        .into();
        let r = placement_request(&Ask {
            bundle: &b,
            replica: 0,
            jobs: &["pkg".to_owned(), "thumb".to_owned()],
            recovery: true,
            needs: &needs,
            seen: &[],
            decided_elsewhere: &[],
        });
        assert_eq!(r.jobs[0].job_name, "pkg");
        assert_eq!(r.jobs[0].co_locate_with, ["thumb"]);
        assert!(r.jobs[0].separate_from.is_empty());
    }

    #[test]
    fn a_job_restarted_alone_is_pinned_to_the_running_job_that_shares_its_node() {
        let mut b = bundle(1);
        b.jobs[1].co_locate_with = vec!["enc".into()];
        let needs: BTreeMap<String, Need> =
            [("enc".into(), Need::Recover), ("pkg".into(), Need::Nothing)].into();
        let seen = vec![
            at(0, "enc", JobPhase::Failed, "n1"),
            at(0, "pkg", JobPhase::Running, "n2"),
        ];
        let recover_enc = |b: &pl::BundleSpec| {
            placement_request(&Ask {
                bundle: b,
                replica: 0,
                jobs: &["enc".to_owned()],
                recovery: true,
                needs: &needs,
                seen: &seen,
                decided_elsewhere: &[],
            })
        };
        let r = recover_enc(&b);
        assert_eq!(r.jobs[0].job_name, "enc");
        assert_eq!(r.jobs[0].co_locate_with, ["pkg"], "pinned to pkg's node");
        // Jobs with no rule between them stay free.
        let mut free = bundle(1);
        free.jobs[1].co_locate_with.clear();
        assert!(recover_enc(&free).jobs[0].co_locate_with.is_empty());
    }

    #[test]
    fn a_first_placement_of_a_new_replica_asks_for_its_pools() {
        let b = bundle(1);
        let needs: BTreeMap<String, Need> =
            [("enc".into(), Need::Place), ("pkg".into(), Need::Place)].into();
        let r = placement_request(&Ask {
            bundle: &b,
            replica: 0,
            jobs: &["enc".to_owned(), "pkg".to_owned()],
            recovery: false,
            needs: &needs,
            seen: &[],
            decided_elsewhere: &[],
        });
        assert_eq!(r.kind, pl::PlacementKind::First);
        assert_eq!(r.pools, ["east", "west"]);
        assert_eq!(r.jobs.len(), 2);
        assert!(r.other_replicas.is_empty() && r.placed_siblings.is_empty());
    }

    fn recorded(phase: BundlePhase, jobs: Vec<(JobPhase, i64)>) -> Recorded {
        Recorded {
            phase,
            retried: false,
            unplaceable: false,
            waiting: false,
            started: false,
            jobs,
            now_ms: 10_000,
        }
    }

    #[test]
    fn a_placing_status_of_fresh_starts_waits_and_anything_else_is_written() {
        let fresh = recorded(
            BundlePhase::Placing,
            vec![(JobPhase::Running, 0), (JobPhase::Starting, 9_000)],
        );
        assert!(fresh.write_waits());
        let slow = recorded(BundlePhase::Placing, vec![(JobPhase::Starting, 7_000)]);
        assert!(!slow.write_waits(), "a start that takes long is shown");
        assert!(
            Recorded {
                started: true,
                ..slow.clone()
            }
            .write_waits(),
            "this pass's own starts"
        );
        for held in [
            Recorded {
                retried: true,
                ..fresh.clone()
            },
            Recorded {
                unplaceable: true,
                ..fresh.clone()
            },
            Recorded {
                waiting: true,
                ..fresh.clone()
            },
            recorded(BundlePhase::Ready, fresh.jobs.clone()),
        ] {
            assert!(!held.write_waits(), "{held:?}");
        }
    }

    fn plans(intents: Vec<ReplicaIntent>) -> BTreeMap<u32, ReplicaPlan> {
        intents
            .into_iter()
            .enumerate()
            .map(|(r, intent)| {
                (
                    u32::try_from(r).unwrap_or(0),
                    ReplicaPlan {
                        intent,
                        needs: BTreeMap::new(),
                        newly_dropped: Vec::new(),
                    },
                )
            })
            .collect()
    }

    #[test]
    fn the_soonest_restart_count_to_clear_brings_the_next_look_forward() {
        let p = plans(vec![
            ReplicaIntent::Settled {
                clear_restarts: false,
                clear_in_ms: Some(40_000),
            },
            ReplicaIntent::Settled {
                clear_restarts: false,
                clear_in_ms: None,
            },
            ReplicaIntent::Wait,
        ]);
        assert_eq!(clear_in(&p, []), Some(Duration::from_millis(40_050)));
        assert_eq!(clear_in(&p, [5_000]), Some(Duration::from_millis(5_050)));
        assert_eq!(clear_in(&plans(vec![ReplicaIntent::Wait]), []), None);
        let ready = |clear| next_look(BundlePhase::Ready, false, false, clear, None);
        assert_eq!(ready(None), NextLook::After(SETTLED));
        assert_eq!(
            ready(Some(Duration::from_secs(7))),
            NextLook::After(Duration::from_secs(7))
        );
        assert_eq!(
            next_look(BundlePhase::Ready, false, true, None, None),
            NextLook::After(REBALANCE)
        );
    }

    #[test]
    fn a_broken_bundle_waits_for_a_change_a_stalled_one_looks_slowly_and_a_retry_after_its_back_off()
     {
        assert_eq!(
            next_look(BundlePhase::Broken, true, false, None, None),
            NextLook::OnChange
        );
        assert_eq!(
            next_look(BundlePhase::Pending, true, false, None, None),
            NextLook::After(STALLED)
        );
        assert_eq!(
            next_look(BundlePhase::Placing, false, false, None, None),
            NextLook::After(BUSY)
        );
        let late = Duration::from_secs(40);
        assert_eq!(
            next_look(BundlePhase::Placing, false, false, None, Some(late)),
            NextLook::After(late)
        );
        assert_eq!(
            next_look(
                BundlePhase::Placing,
                false,
                false,
                None,
                Some(Duration::from_millis(10))
            ),
            NextLook::After(BUSY),
            "never sooner than the busy interval"
        );
    }

    proptest! {
        /// The request places exactly the jobs asked for, never names the replica's own jobs
        /// as another replica's, and a sibling is only a job of the replica that stays.
        #[test]
        fn a_request_never_mixes_the_replica_with_the_others(
            replica in 0u32..3,
            seen in proptest::collection::vec(
                (0u32..3, prop::sample::select(vec!["enc", "pkg"]),
                 prop::sample::select(vec![JobPhase::Running, JobPhase::Starting, JobPhase::Failed, JobPhase::Pending]),
                 any::<bool>(), prop::sample::select(vec!["", "n1", "n2", "n3"])),
                0..12),
            stays in any::<bool>(),
        ) {
            let b = bundle(3);
            let needs: BTreeMap<String, Need> = [
                ("enc".into(), Need::Recover),
                ("pkg".into(), if stays { Need::Nothing } else { Need::Recover }),
            ].into();
            let seen: Vec<JobAt> = seen.into_iter().map(|(r, j, phase, flight, node)| JobAt {
                replica: r, job_name: j.into(), phase, start_in_flight: flight,
                node: node.into(), zone: None,
            }).collect();
            let req = placement_request(&Ask {
                bundle: &b, replica, jobs: &["enc".to_owned()], recovery: true,
                needs: &needs, seen: &seen, decided_elsewhere: &[],
            });
            prop_assert!(req.jobs.iter().all(|j| j.job_name == "enc"));
            prop_assert!(req.placed_siblings.iter().all(|s| stays && s.job_name == "pkg"));
            let others = seen.iter().filter(|j| j.replica != replica && !j.node.is_empty()
                && (j.start_in_flight || matches!(j.phase, JobPhase::Running | JobPhase::Starting))).count();
            prop_assert_eq!(req.other_replicas.len(), others);
        }
    }
}
