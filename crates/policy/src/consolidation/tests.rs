//! The consolidation planner: a table of the rules and properties over random fleets.

use super::*;
use MigrationStrategy as S;
use proptest::prelude::*;

const POOL: &str = "elastic";
const SOCKET: &str = crate::JOB_SOCKET_CAPABILITY;

fn pool() -> pl::PoolSpec {
    pl::PoolSpec {
        name: POOL.into(),
        kind: pl::PoolKind::Aws,
        region: "r".into(),
        zones: vec!["a".into(), "b".into()],
        packing_strategy: pl::PackingStrategy::Binpack,
        scale_out: pl::ScaleOut::Elastic,
        candidate_instance_types: vec![pl::InstanceTypeSpec {
            instance_type: "m".into(),
            total_capacity: 100.0,
            total_cores: 16,
            capabilities: vec![SOCKET.into()],
        }],
        max_nodes: None,
        terminating: false,
    }
}

/// A ready node of 100 / 16 cores in zone `a` advertising the job socket, holding `jobs`.
fn node(id: &str, jobs: &[&PlacedJob]) -> pl::NodeSpec {
    let mut n = pl::NodeSpec::ready(id, POOL, Some("a"), 100.0, 16);
    n.capabilities = vec![SOCKET.into()];
    n.used_capacity = jobs
        .iter()
        .filter(|j| j.node == id)
        .map(|j| j.spec.requirements.required_capacity)
        .sum();
    n.used_cores = jobs
        .iter()
        .filter(|j| j.node == id)
        .map(|j| j.spec.requirements.required_cores)
        .sum();
    n
}

/// A one-job replica `bundle/replica/enc` of `cap` capacity and 1 core on `node`.
fn job(bundle: &str, replica: u32, cap: f64, node: &str, strategy: S) -> PlacedJob {
    PlacedJob {
        job_id: format!("{bundle}/{replica}/enc"),
        bundle_id: bundle.into(),
        replica,
        spec: pl::JobSpec::new("enc", cap, 1, pl::PriorityBand::Gold),
        node: node.into(),
        zone: Some("a".into()),
        strategy,
    }
}

fn rules(jobs: &[PlacedJob], allow: bool) -> BTreeMap<String, BundleRules> {
    jobs.iter()
        .map(|j| {
            (
                j.bundle_id.clone(),
                BundleRules {
                    intra_replica: pl::PlacementRules::none(),
                    inter_replica: pl::PlacementRules::inter_replica_default(),
                    allow_stop_then_start: allow,
                },
            )
        })
        .collect()
}

struct Case {
    nodes: Vec<pl::NodeSpec>,
    jobs: Vec<PlacedJob>,
    bundles: BTreeMap<String, BundleRules>,
    held: BTreeMap<String, String>,
    min_nodes: u32,
}

impl Case {
    fn new(node_ids: &[&str], jobs: Vec<PlacedJob>) -> Self {
        let refs: Vec<&PlacedJob> = jobs.iter().collect();
        Case {
            nodes: node_ids.iter().map(|id| node(id, &refs)).collect(),
            bundles: rules(&jobs, false),
            jobs,
            held: BTreeMap::new(),
            min_nodes: 0,
        }
    }

    fn plan(&self) -> Plan {
        let pool = pool();
        plan(&Input {
            pool: &pool,
            nodes: &self.nodes,
            held: &self.held,
            jobs: &self.jobs,
            bundles: &self.bundles,
            min_nodes: self.min_nodes,
            max_nodes: 64,
        })
    }
}

fn emptied(p: &Plan) -> Vec<&str> {
    p.nodes.iter().map(|n| n.node.as_str()).collect()
}

fn kept<'a>(p: &'a Plan, node: &str) -> Option<&'a KeepReason> {
    p.kept.iter().find(|(n, _)| n == node).map(|(_, r)| r)
}

#[test]
fn the_least_used_node_is_emptied_onto_the_fullest_that_fits() {
    let c = Case::new(
        &["n1", "n2", "n3"],
        vec![
            job("b1", 0, 60.0, "n1", S::Handover),
            job("b2", 0, 30.0, "n2", S::Handover),
            job("b3", 0, 20.0, "n3", S::Overlap),
        ],
    );
    let p = c.plan();
    // n3 (20) goes first, onto the fullest node with room (n1: 60 + 20 ≤ 100); then n2 (30)
    // has room nowhere (n1 is at 80).
    assert_eq!(emptied(&p), ["n3"]);
    assert_eq!(p.nodes[0].moves.len(), 1);
    assert_eq!(p.nodes[0].moves[0].target, "n1");
    assert_eq!(p.nodes[0].moves[0].job_id, "b3/0/enc");
    assert_eq!(
        kept(&p, "n2"),
        Some(&KeepReason::NoRoom {
            job_id: "b2/0/enc".into()
        })
    );
}

#[test]
fn an_empty_node_is_planned_with_no_moves() {
    let c = Case::new(&["n1", "n2"], vec![job("b1", 0, 60.0, "n1", S::Handover)]);
    let p = c.plan();
    assert_eq!(emptied(&p), ["n2"]);
    assert!(p.nodes[0].moves.is_empty());
}

#[test]
fn stop_then_start_jobs_move_only_with_the_bundles_allowance() {
    let mut c = Case::new(
        &["n1", "n2"],
        vec![
            job("b1", 0, 90.0, "n1", S::Handover),
            job("b2", 0, 10.0, "n2", S::StopThenStart),
        ],
    );
    c.held.insert("n1".into(), "held by the test".into());
    let p = c.plan();
    assert!(p.nodes.is_empty(), "{p:?}");
    assert!(
        matches!(kept(&p, "n2"), Some(KeepReason::Immovable { job_id, .. }) if job_id == "b2/0/enc"),
        "{p:?}"
    );
    c.bundles = rules(&c.jobs, true);
    assert_eq!(emptied(&c.plan()), ["n2"]);
}

#[test]
fn the_floor_of_nodes_is_kept() {
    let mut c = Case::new(&["n1", "n2", "n3", "n4"], vec![]);
    c.min_nodes = 2;
    let p = c.plan();
    assert_eq!(emptied(&p), ["n1", "n2"]);
    assert_eq!(kept(&p, "n3"), Some(&KeepReason::Floor { min_nodes: 2 }));
    assert_eq!(kept(&p, "n4"), Some(&KeepReason::Floor { min_nodes: 2 }));
}

#[test]
fn spares_are_neither_emptied_nor_targets_and_do_not_count_toward_the_floor() {
    let mut c = Case::new(
        &["n1", "n2", "s1"],
        vec![
            job("b1", 0, 60.0, "n1", S::Handover),
            job("b2", 0, 50.0, "n2", S::Handover),
        ],
    );
    c.nodes[2].spare = true;
    let p = c.plan();
    // n2's 50 fits only on the (empty) spare: it stays.
    assert!(p.nodes.is_empty(), "{p:?}");
    assert_eq!(kept(&p, "s1"), Some(&KeepReason::Spare));
    c.min_nodes = 1;
    c.jobs = vec![job("b1", 0, 60.0, "n1", S::Handover)];
    c.nodes = vec![node("n1", &[&c.jobs[0]]), node("n2", &[]), node("s1", &[])];
    c.nodes[2].spare = true;
    // Two non-spare nodes, floor 1: the empty n2 may go, the spare stays.
    assert_eq!(emptied(&c.plan()), ["n2"]);
}

#[test]
fn a_handover_needs_a_target_with_the_job_socket() {
    let mut c = Case::new(
        &["n1", "n2"],
        vec![
            job("b1", 0, 60.0, "n1", S::Handover),
            job("b2", 0, 10.0, "n2", S::Handover),
        ],
    );
    c.nodes[0].capabilities.clear();
    let p = c.plan();
    assert!(
        !p.nodes
            .iter()
            .any(|n| n.moves.iter().any(|m| m.target == "n1")),
        "{p:?}"
    );
    // An overlap job has no such need.
    c.jobs[1].strategy = S::Overlap;
    assert_eq!(emptied(&c.plan()), ["n2"]);
}

#[test]
fn different_node_between_replicas_holds() {
    // b1's replicas are on n1 and n2; n2's replica may not join n1, so n2 stays.
    let c = Case::new(
        &["n1", "n2"],
        vec![
            job("b1", 0, 10.0, "n1", S::Handover),
            job("b1", 1, 10.0, "n2", S::Handover),
        ],
    );
    let p = c.plan();
    assert!(p.nodes.is_empty(), "{p:?}");
    assert_eq!(
        kept(&p, "n1"),
        Some(&KeepReason::NoRoom {
            job_id: "b1/0/enc".into()
        })
    );
}

#[test]
fn a_move_that_would_break_a_soft_rule_is_not_planned() {
    // Same zone between replicas is soft: replica 1 may go to n3 (zone a) but not n2 (zone b).
    let mut c = Case::new(
        &["n1", "n2", "n3", "n4"],
        vec![
            job("b1", 0, 10.0, "n1", S::Handover),
            job("b1", 1, 10.0, "n4", S::Handover),
            job("x", 0, 80.0, "n2", S::Handover),
            job("y", 0, 85.0, "n3", S::Handover),
        ],
    );
    c.nodes[1].zone = Some("b".into());
    c.jobs[2].zone = Some("b".into());
    let p = c.plan();
    for n in &p.nodes {
        for m in &n.moves {
            assert_ne!(
                (m.job_id.as_str(), m.target.as_str()),
                ("b1/1/enc", "n2"),
                "{p:?}"
            );
        }
    }
}

#[test]
fn co_located_jobs_keep_their_node() {
    let mut a = job("b1", 0, 10.0, "n2", S::Handover);
    a.spec.co_locate_with = vec!["mux".into()];
    let mut b = job("b1", 0, 10.0, "n2", S::Handover);
    b.job_id = "b1/0/mux".into();
    b.spec.job_name = "mux".into();
    let c = Case::new(
        &["n1", "n2"],
        vec![job("x", 0, 90.0, "n1", S::Handover), a, b],
    );
    let p = c.plan();
    assert!(p.nodes.is_empty(), "{p:?}");
    assert!(
        matches!(kept(&p, "n2"), Some(KeepReason::Immovable { .. })),
        "{p:?}"
    );
}

#[test]
fn held_cordoned_starting_and_unmanaged_nodes_are_not_emptied() {
    let mut c = Case::new(
        &["n1", "n2", "n3", "n4", "n5"],
        vec![
            job("b1", 0, 10.0, "n1", S::Handover),
            job("b2", 0, 10.0, "n5", S::Handover),
        ],
    );
    c.held.insert("n2".into(), "too young".into());
    c.nodes[2].cordoned = true;
    c.nodes[3].pending_since_ms = Some(1);
    c.bundles.remove("b2");
    let p = c.plan();
    assert_eq!(kept(&p, "n2"), Some(&KeepReason::Held("too young".into())));
    assert_eq!(kept(&p, "n3"), Some(&KeepReason::NotReady));
    assert_eq!(kept(&p, "n4"), Some(&KeepReason::NotReady));
    assert!(matches!(kept(&p, "n5"), Some(KeepReason::Immovable { .. })));
    // Nodes that are not emptied still take moves: n1's job goes to the fullest with room,
    // n5 (whose own job may not move).
    assert_eq!(emptied(&p), ["n1"]);
    assert_eq!(p.nodes[0].moves[0].target, "n5");
}

#[test]
fn the_lower_bound_rounds_up_by_capacity_or_cores() {
    let r = |cap: f64, cores: u32| pl::Requirements {
        required_capacity: cap,
        required_cores: cores,
        required_capabilities: vec![],
        priority_band: pl::PriorityBand::Gold,
    };
    assert_eq!(lower_bound(&[], 100.0, 16), 0);
    assert_eq!(lower_bound(&[r(50.0, 1), r(50.0, 1)], 100.0, 16), 1);
    assert_eq!(lower_bound(&[r(50.0, 1), r(50.1, 1)], 100.0, 16), 2);
    assert_eq!(lower_bound(&[r(1.0, 16), r(1.0, 1)], 100.0, 16), 2);
}

// ---- properties ----

#[derive(Debug, Clone)]
struct Fleet {
    nodes: Vec<pl::NodeSpec>,
    jobs: Vec<PlacedJob>,
    bundles: BTreeMap<String, BundleRules>,
    min_nodes: u32,
}

/// Up to 10 nodes (some spare, some without the job socket) and up to 20 bundles of one or two
/// replicas, each replica one job of 5..50 on a node with room for it.
fn arb_fleet() -> impl Strategy<Value = Fleet> {
    (
        2usize..10,
        prop::collection::vec(
            (1u32..3, 5u32..50, 0u8..3, any::<bool>(), 0usize..100),
            0..20,
        ),
        prop::collection::vec((any::<bool>(), any::<bool>(), any::<bool>()), 10),
        0u32..5,
    )
        .prop_map(|(n, specs, flags, min_nodes)| {
            let mut nodes: Vec<pl::NodeSpec> =
                (0..n).map(|i| node(&format!("n{i}"), &[])).collect();
            for (node, (spare, socket, zone_b)) in nodes.iter_mut().zip(flags) {
                node.spare = spare && node.id != "n0";
                if !socket {
                    node.capabilities.clear();
                }
                if zone_b {
                    node.zone = Some("b".into());
                }
            }
            let mut jobs = Vec::new();
            let mut bundles = BTreeMap::new();
            for (b, (replicas, cap, strategy, allow, seed)) in specs.into_iter().enumerate() {
                let bundle = format!("b{b}");
                let strategy = [S::Handover, S::Overlap, S::StopThenStart][usize::from(strategy)];
                let mut used_nodes = Vec::new();
                for r in 0..replicas {
                    // The first non-spare node with room that holds no other replica.
                    let pick = (0..nodes.len())
                        .map(|k| (k + seed) % nodes.len())
                        .find(|&k| {
                            let nd = &nodes[k];
                            !nd.spare
                                && nd.used_capacity + f64::from(cap) <= nd.total_capacity
                                && !used_nodes.contains(&k)
                        });
                    let Some(k) = pick else { break };
                    used_nodes.push(k);
                    let mut j = job(&bundle, r, f64::from(cap), &nodes[k].id, strategy);
                    j.zone = nodes[k].zone.clone();
                    nodes[k].used_capacity += f64::from(cap);
                    nodes[k].used_cores += 1;
                    jobs.push(j);
                }
                bundles.insert(
                    bundle,
                    BundleRules {
                        intra_replica: pl::PlacementRules::none(),
                        inter_replica: pl::PlacementRules::inter_replica_default(),
                        allow_stop_then_start: allow,
                    },
                );
            }
            Fleet {
                nodes,
                jobs,
                bundles,
                min_nodes,
            }
        })
}

fn run(f: &Fleet) -> Plan {
    let pool = pool();
    let held = BTreeMap::new();
    plan(&Input {
        pool: &pool,
        nodes: &f.nodes,
        held: &held,
        jobs: &f.jobs,
        bundles: &f.bundles,
        min_nodes: f.min_nodes,
        max_nodes: 64,
    })
}

fn planned(nodes: &[(&str, usize)]) -> Plan {
    Plan {
        nodes: nodes
            .iter()
            .map(|(n, moves)| PlannedNode {
                node: (*n).into(),
                moves: (0..*moves)
                    .map(|i| Move {
                        job_id: format!("ns.b/{i}/enc"),
                        bundle_id: "ns.b".into(),
                        replica: u32::try_from(i).unwrap_or(0),
                        job_name: "enc".into(),
                        target: "t".into(),
                    })
                    .collect(),
            })
            .collect(),
        kept: Vec::new(),
    }
}

fn at(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_772_000_000 + secs, 0).unwrap_or_default()
}

#[test]
fn a_summary_names_the_nodes_emptied_and_counts_the_kept_by_reason() {
    let mut p = planned(&[("n1", 2), ("n2", 0)]);
    p.kept = vec![
        ("n3".into(), KeepReason::NoRoom { job_id: "j".into() }),
        ("n4".into(), KeepReason::NoRoom { job_id: "k".into() }),
        ("n5".into(), KeepReason::Held("too young".into())),
        ("n6".into(), KeepReason::Floor { min_nodes: 2 }),
    ];
    assert_eq!(
        p.summary(),
        "would empty 2 node(s): n1 (2 moves), n2 (0 moves); kept: 1 busy or too young, 2 no room elsewhere, 1 the pool keeps at least 2 node(s)"
    );
    assert_eq!(Plan::default().summary(), "no node can be emptied");
}

#[test]
fn the_first_planned_node_is_begun_once_the_cooldown_has_passed() {
    let p = planned(&[("n1", 1), ("n2", 1)]);
    let cooldown = std::time::Duration::from_secs(30);
    assert_eq!(next(&p, None, cooldown, at(0)), Next::Empty(&p.nodes[0]));
    assert_eq!(
        next(&p, Some(at(0)), cooldown, at(10)),
        Next::CoolDown { until: at(30) }
    );
    assert_eq!(
        next(&p, Some(at(0)), cooldown, at(30)),
        Next::Empty(&p.nodes[0])
    );
    assert_eq!(next(&Plan::default(), None, cooldown, at(0)), Next::Nothing);
}

#[test]
fn a_failed_move_gives_the_node_up_and_all_done_ends_it() {
    use MigrationOutcome as O;
    let m = |name: &str, o: O, phase: &str| (name.to_owned(), o, phase.to_owned());
    assert_eq!(
        progress(&[
            m("a", O::Completed, "Completed"),
            m("b", O::InFlight, "Cutover")
        ]),
        Progress::Moving { done: 1, total: 2 }
    );
    assert_eq!(
        progress(&[m("a", O::InFlight, "Cutover"), m("b", O::Failed, "Aborted")]),
        Progress::Failed {
            migration: "b".into(),
            phase: "Aborted".into()
        }
    );
    assert_eq!(
        progress(&[m("a", O::Completed, "Completed")]),
        Progress::Done { total: 1 }
    );
    assert_eq!(progress(&[]), Progress::Done { total: 0 });
}

proptest! {
    #[test]
    fn a_plan_keeps_every_rule(f in arb_fleet()) {
        let p = run(&f);
        let non_spare = f.nodes.iter().filter(|n| !n.spare).count();
        // Never below the floor.
        prop_assert!(non_spare - p.nodes.len() >= f.min_nodes as usize || p.nodes.is_empty(),
            "below the floor: {} of {non_spare} emptied, floor {}", p.nodes.len(), f.min_nodes);
        let emptied: BTreeSet<&str> = p.nodes.iter().map(|n| n.node.as_str()).collect();
        // Where every job ends up.
        let mut at: BTreeMap<&str, &str> = f.jobs.iter().map(|j| (j.job_id.as_str(), j.node.as_str())).collect();
        for n in &p.nodes {
            let on: BTreeSet<&str> = f.jobs.iter().filter(|j| j.node == n.node).map(|j| j.job_id.as_str()).collect();
            let moved: BTreeSet<&str> = n.moves.iter().map(|m| m.job_id.as_str()).collect();
            prop_assert_eq!(on, moved, "every job of an emptied node moves, and only those");
            for m in &n.moves {
                at.insert(m.job_id.as_str(), m.target.as_str());
            }
        }
        for n in &p.nodes {
            let spare = f.nodes.iter().find(|x| x.id == n.node).map(|x| x.spare);
            prop_assert_eq!(spare, Some(false), "a spare is never emptied");
            for m in &n.moves {
                let job = f.jobs.iter().find(|j| j.job_id == m.job_id);
                prop_assert!(job.is_some());
                let job = job.unwrap_or(&f.jobs[0]);
                // Never a stopThenStart job without the allowance.
                prop_assert!(job.strategy != S::StopThenStart || f.bundles[&job.bundle_id].allow_stop_then_start);
                let target = f.nodes.iter().find(|x| x.id == m.target);
                prop_assert!(target.is_some());
                let target = target.unwrap_or(&f.nodes[0]);
                prop_assert!(!target.spare, "never onto a spare");
                prop_assert!(!emptied.contains(m.target.as_str()), "never onto an emptied node");
                prop_assert_ne!(&m.target, &n.node);
                if job.strategy == S::Handover {
                    prop_assert!(target.capabilities.iter().any(|c| c == SOCKET), "handover target has the socket");
                }
            }
        }
        // Capacity holds on every node once all moves are done, and replicas of a bundle never
        // share a node (different node between replicas is hard by default).
        for n in &f.nodes {
            let load: f64 = f.jobs.iter().filter(|j| at[j.job_id.as_str()] == n.id).map(|j| j.spec.requirements.required_capacity).sum();
            prop_assert!(load <= n.total_capacity + 1e-9, "{} holds {load}", n.id);
            prop_assert!(!emptied.contains(n.id.as_str()) || load == 0.0);
        }
        // Hence never below the lower bound: the jobs still fit on the nodes left.
        let reqs: Vec<pl::Requirements> = f.jobs.iter().map(|j| j.spec.requirements.clone()).collect();
        let bound = lower_bound(&reqs, 100.0, 16) as usize;
        prop_assert!(non_spare - p.nodes.len() >= bound, "{} nodes left, bound {bound}", non_spare - p.nodes.len());
        let mut seen = BTreeSet::new();
        for j in &f.jobs {
            prop_assert!(seen.insert((j.bundle_id.as_str(), at[j.job_id.as_str()])), "two replicas of {} share a node", j.bundle_id);
        }
    }

    #[test]
    fn a_plan_does_not_depend_on_input_order(f in arb_fleet(), seed in any::<u64>()) {
        let p = run(&f);
        let mut g = f.clone();
        // A deterministic shuffle: reverse, then rotate by `seed`.
        g.nodes.reverse();
        g.jobs.reverse();
        if !g.jobs.is_empty() {
            let k = usize::try_from(seed % g.jobs.len() as u64).unwrap_or(0);
            g.jobs.rotate_left(k);
        }
        let k = usize::try_from(seed % g.nodes.len() as u64).unwrap_or(0);
        g.nodes.rotate_left(k);
        prop_assert_eq!(p, run(&g));
    }

    #[test]
    fn progress_is_done_only_when_every_move_completed(
        outcomes in proptest::collection::vec(0u8..4, 0..12)
    ) {
        use MigrationOutcome as O;
        let ms: Vec<(String, O, String)> = outcomes
            .iter()
            .enumerate()
            .map(|(i, o)| (format!("m{i}"), [O::InFlight, O::Completed, O::Failed, O::TakenOver][usize::from(*o)], String::new()))
            .collect();
        let completed = ms.iter().filter(|(_, o, _)| *o == O::Completed).count();
        let given_up = |o: &O| matches!(o, O::Failed | O::TakenOver);
        match progress(&ms) {
            Progress::Done { total } => prop_assert_eq!(completed, total),
            Progress::Moving { done, total } => {
                prop_assert!(done < total);
                prop_assert!(ms.iter().all(|(_, o, _)| !given_up(o)));
            }
            Progress::Failed { .. } => prop_assert!(ms.iter().any(|(_, o, _)| given_up(o))),
        }
    }
}
