//! One test per placement rule; each name reads as the rule.

use super::*;

fn binpack_pool() -> PoolSpec {
    pool("p", PackingStrategy::Binpack, ScaleOut::Fixed)
}

#[test]
fn binpack_takes_the_fullest_node_that_fits() {
    let e = engine(
        vec![binpack_pool()],
        vec![
            node("empty", "p", "a", 100.0, 0.0),
            node("full", "p", "a", 100.0, 95.0),
            node("half", "p", "a", 100.0, 50.0),
        ],
    );
    let d = e.place(&request(vec![job("j", 10.0)], &["p"]), 0);
    assert_eq!(node_of(&d, "j"), "half");
}

#[test]
fn spread_takes_the_emptiest_node() {
    let e = engine(
        vec![pool("p", PackingStrategy::Spread, ScaleOut::Fixed)],
        vec![
            node("half", "p", "a", 100.0, 50.0),
            node("empty", "p", "a", 100.0, 0.0),
            node("full", "p", "a", 100.0, 95.0),
        ],
    );
    let d = e.place(&request(vec![job("j", 10.0)], &["p"]), 0);
    assert_eq!(node_of(&d, "j"), "empty");
}

#[test]
fn ties_go_to_the_smallest_node_id_in_both_strategies() {
    for strategy in [PackingStrategy::Binpack, PackingStrategy::Spread] {
        let e = engine(
            vec![pool("p", strategy, ScaleOut::Fixed)],
            vec![
                node("n3", "p", "a", 100.0, 0.0),
                node("n1", "p", "b", 100.0, 0.0),
                node("n2", "p", "a", 100.0, 0.0),
            ],
        );
        let d = e.place(&request(vec![job("j", 10.0)], &["p"]), 0);
        assert_eq!(node_of(&d, "j"), "n1", "{strategy:?}");
    }
}

#[test]
fn binpack_ties_on_capacity_go_to_the_node_with_fewest_free_cores() {
    let mut many = node("a-many", "p", "a", 100.0, 0.0);
    many.total_cores = 32;
    let e = engine(
        vec![binpack_pool()],
        vec![many, node("b-few", "p", "a", 100.0, 0.0)],
    );
    assert_eq!(
        node_of(&e.place(&request(vec![job("j", 10.0)], &["p"]), 0), "j"),
        "b-few"
    );
}

#[test]
fn a_node_without_enough_free_capacity_is_rejected() {
    let e = engine(vec![binpack_pool()], vec![node("n", "p", "a", 100.0, 95.0)]);
    let d = e.place(&request(vec![job("j", 10.0)], &["p"]), 0);
    assert_eq!(d.kind(), OutcomeKind::Unplaceable);
    assert_eq!(
        d.trace.pools[0].rejections,
        vec![RejectionCount {
            reason: RejectReason::InsufficientCapacity,
            count: 1
        }]
    );
}

#[test]
fn a_node_without_enough_free_cores_is_rejected() {
    let mut n = node("n", "p", "a", 100.0, 0.0);
    n.used_cores = 15;
    let e = engine(vec![binpack_pool()], vec![n]);
    let d = e.place(
        &request(vec![JobSpec::new("j", 1.0, 2, PriorityBand::Gold)], &["p"]),
        0,
    );
    assert_eq!(d.kind(), OutcomeKind::Unplaceable);
    assert_eq!(
        d.summary().rejections[0].reason,
        RejectReason::InsufficientCores
    );
}

#[test]
fn a_job_lands_only_on_nodes_with_all_its_capabilities() {
    let mut gpu = node("z-gpu", "p", "a", 100.0, 0.0);
    gpu.capabilities = vec!["gpu".into(), "nvenc".into()];
    let mut half = node("a-gpu-only", "p", "a", 100.0, 0.0);
    half.capabilities = vec!["gpu".into()];
    let e = engine(
        vec![binpack_pool()],
        vec![half, gpu, node("plain", "p", "a", 100.0, 50.0)],
    );
    let mut j = job("j", 10.0);
    j.requirements.required_capabilities = vec!["nvenc".into(), "gpu".into()];
    assert_eq!(
        node_of(&e.place(&request(vec![j], &["p"]), 0), "j"),
        "z-gpu"
    );
}

#[test]
fn a_capability_no_node_offers_is_unplaceable_as_missing_capability() {
    let e = engine(vec![binpack_pool()], vec![node("n", "p", "a", 100.0, 0.0)]);
    let mut j = job("j", 10.0);
    j.requirements.required_capabilities = vec!["quantum".into()];
    let d = e.place(&request(vec![j], &["p"]), 0);
    let Outcome::Unplaceable { jobs } = &d.outcome else {
        panic!("{d:?}")
    };
    assert_eq!(
        jobs[0].reason,
        UnplaceableReason::NoNodeFits {
            reason: Some(RejectReason::MissingCapability)
        }
    );
}

#[test]
fn a_cordoned_node_takes_no_new_jobs() {
    let mut c = node("a-cordoned", "p", "a", 100.0, 50.0);
    c.cordoned = true;
    let mut e = engine(
        vec![binpack_pool()],
        vec![c, node("b", "p", "a", 100.0, 0.0)],
    );
    assert_eq!(
        node_of(&e.place(&request(vec![job("j", 10.0)], &["p"]), 0), "j"),
        "b"
    );
    e.set_cordoned("b", true).unwrap();
    let d = e.place(&request(vec![job("j", 10.0)], &["p"]), 0);
    assert_eq!(
        d.summary().rejections,
        vec![RejectionCount {
            reason: RejectReason::Cordoned,
            count: 2
        }]
    );
    e.set_cordoned("a-cordoned", false).unwrap();
    assert_eq!(
        node_of(&e.place(&request(vec![job("j", 10.0)], &["p"]), 0), "j"),
        "a-cordoned"
    );
}

#[test]
fn an_unhealthy_node_is_avoided() {
    let mut u = node("a-sick", "p", "a", 100.0, 50.0);
    u.healthy = false;
    let e = engine(
        vec![binpack_pool()],
        vec![u, node("b", "p", "a", 100.0, 0.0)],
    );
    assert_eq!(
        node_of(&e.place(&request(vec![job("j", 10.0)], &["p"]), 0), "j"),
        "b"
    );
}

fn spare(id: &str, band: Option<PriorityBand>) -> NodeSpec {
    let mut n = node(id, "p", "a", 100.0, 0.0);
    n.spare = true;
    n.spare_band = band;
    n
}

#[test]
fn first_placements_never_use_hot_spares() {
    let e = engine(
        vec![binpack_pool()],
        vec![spare("s", None), node("n", "p", "a", 100.0, 95.0)],
    );
    let d = e.place(&request(vec![job("j", 10.0)], &["p"]), 0);
    assert_eq!(d.kind(), OutcomeKind::Unplaceable);
    let reasons: Vec<_> = d.summary().rejections.iter().map(|r| r.reason).collect();
    assert!(
        reasons.contains(&RejectReason::SpareReserved),
        "{reasons:?}"
    );
}

fn recovery(band: PriorityBand) -> PlacementRequest {
    let mut r = request(vec![JobSpec::new("j", 10.0, 1, band)], &["p"]);
    r.kind = PlacementKind::Recovery;
    r
}

#[test]
fn gold_recovery_prefers_a_gold_spare_then_a_shared_spare_then_a_node() {
    let mut e = engine(
        vec![binpack_pool()],
        vec![
            spare("shared", None),
            spare("gold", Some(PriorityBand::Gold)),
            node("busy", "p", "a", 100.0, 50.0),
        ],
    );
    let d = e.place(&recovery(PriorityBand::Gold), 0);
    assert_eq!(node_of(&d, "j"), "gold");
    assert_eq!(d.summary().chosen_tier, Some(Tier::BandSpare));
    e.remove_node("gold");
    assert_eq!(
        node_of(&e.place(&recovery(PriorityBand::Gold), 0), "j"),
        "shared"
    );
    e.remove_node("shared");
    assert_eq!(
        node_of(&e.place(&recovery(PriorityBand::Gold), 0), "j"),
        "busy"
    );
}

#[test]
fn silver_recovery_takes_any_node_before_a_spare() {
    let e = engine(
        vec![binpack_pool()],
        vec![spare("shared", None), node("busy", "p", "a", 100.0, 50.0)],
    );
    assert_eq!(
        node_of(&e.place(&recovery(PriorityBand::Silver), 0), "j"),
        "busy"
    );
    let only_spare = engine(vec![binpack_pool()], vec![spare("shared", None)]);
    assert_eq!(
        node_of(&only_spare.place(&recovery(PriorityBand::Silver), 0), "j"),
        "shared"
    );
}

#[test]
fn a_band_dedicated_spare_serves_only_its_band() {
    let e = engine(
        vec![binpack_pool()],
        vec![spare("gold", Some(PriorityBand::Gold))],
    );
    let d = e.place(&recovery(PriorityBand::Silver), 0);
    assert_eq!(d.kind(), OutcomeKind::Unplaceable);
    assert_eq!(
        d.summary().rejections[0].reason,
        RejectReason::SpareForOtherBand
    );
}

#[test]
fn a_spare_that_takes_a_job_stops_being_a_spare() {
    let mut e = engine(vec![binpack_pool()], vec![spare("s", None)]);
    let d = e.place(&recovery(PriorityBand::Gold), 0);
    e.commit(&d).unwrap();
    assert!(!e.node_view("s").unwrap().spare);
    // ...so first placements may now use it.
    assert_eq!(
        node_of(&e.place(&request(vec![job("k", 10.0)], &["p"]), 0), "k"),
        "s"
    );
}

#[test]
fn separate_from_puts_jobs_on_different_nodes() {
    let e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 0.0),
            node("n2", "p", "a", 100.0, 0.0),
        ],
    );
    let mut a = job("a", 10.0);
    a.separate_from = vec!["b".into()];
    let d = e.place(&request(vec![a, job("b", 10.0)], &["p"]), 0);
    assert_ne!(node_of(&d, "a"), node_of(&d, "b"));
}

#[test]
fn co_locate_with_puts_jobs_on_one_node_with_their_summed_needs() {
    let e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 70.0),
            node("n2", "p", "a", 100.0, 50.0),
        ],
    );
    let mut a = job("a", 20.0);
    a.co_locate_with = vec!["b".into()];
    let d = e.place(&request(vec![a, job("b", 20.0)], &["p"]), 0);
    // 40 together do not fit n1 (30 free) though each alone would.
    assert_eq!(node_of(&d, "a"), "n2");
    assert_eq!(node_of(&d, "b"), "n2");
}

#[test]
fn a_co_location_cycle_is_one_group() {
    let e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 0.0),
            node("n2", "p", "a", 100.0, 0.0),
        ],
    );
    let mut a = job("a", 10.0);
    a.co_locate_with = vec!["b".into()];
    let mut b = job("b", 10.0);
    b.co_locate_with = vec!["c".into()];
    let mut c = job("c", 10.0);
    c.co_locate_with = vec!["a".into()];
    let d = e.place(&request(vec![a, b, c], &["p"]), 0);
    let nodes: Vec<_> = placed_nodes(&d).into_iter().map(|(_, n)| n).collect();
    assert!(nodes.iter().all(|n| n == &nodes[0]), "{nodes:?}");
}

#[test]
fn co_location_contradicting_separation_is_unplaceable_not_a_panic() {
    let e = engine(vec![binpack_pool()], vec![node("n1", "p", "a", 100.0, 0.0)]);
    let mut a = job("a", 10.0);
    a.co_locate_with = vec!["b".into()];
    let mut b = job("b", 10.0);
    b.separate_from = vec!["a".into()];
    let d = e.place(&request(vec![a, b, job("c", 1.0)], &["p"]), 0);
    let Outcome::Unplaceable { jobs } = &d.outcome else {
        panic!("{d:?}")
    };
    assert!(matches!(
        jobs[0].reason,
        UnplaceableReason::Contradictory { .. }
    ));
    assert!(matches!(
        jobs[2].reason,
        UnplaceableReason::ReplicaIncomplete { .. }
    ));
}

#[test]
fn a_replica_is_placed_whole_or_not_at_all() {
    let e = engine(vec![binpack_pool()], vec![node("n1", "p", "a", 100.0, 0.0)]);
    let d = e.place(
        &request(vec![job("small", 10.0), job("huge", 500.0)], &["p"]),
        0,
    );
    let Outcome::Unplaceable { jobs } = &d.outcome else {
        panic!("{d:?}")
    };
    assert_eq!(jobs.len(), 2);
    assert_eq!(
        jobs[0].reason,
        UnplaceableReason::ReplicaIncomplete {
            blocking_job: "huge".into()
        }
    );
    assert_eq!(
        jobs[1].reason,
        UnplaceableReason::NoNodeFits {
            reason: Some(RejectReason::InsufficientCapacity)
        }
    );
}

#[test]
fn replicas_never_share_a_node_by_default() {
    let e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 50.0),
            node("n2", "p", "a", 100.0, 0.0),
        ],
    );
    let mut r = request(vec![job("j", 10.0)], &["p"]);
    r.other_replicas = vec![Position {
        node: "n1".into(),
        zone: None,
    }];
    assert_eq!(node_of(&e.place(&r, 0), "j"), "n2");
    r.other_replicas.push(Position {
        node: "n2".into(),
        zone: None,
    });
    let d = e.place(&r, 0);
    assert_eq!(
        d.summary().rejections,
        vec![RejectionCount {
            reason: RejectReason::InterDifferentNode,
            count: 2
        }]
    );
}

#[test]
fn replicas_prefer_the_same_zone_and_report_when_they_cannot() {
    let e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 0.0),
            node("n2", "p", "b", 100.0, 50.0),
            node("n3", "p", "a", 100.0, 95.0),
        ],
    );
    let mut r = request(vec![job("j", 10.0)], &["p"]);
    r.other_replicas = vec![Position {
        node: "other".into(),
        zone: Some("a".into()),
    }];
    let d = e.place(&r, 0);
    // n2 is fuller, but zone a is preferred.
    assert_eq!(node_of(&d, "j"), "n1");
    assert!(d.trace.broken_soft_rules.is_empty());
    r.other_replicas = vec![Position {
        node: "other".into(),
        zone: Some("c".into()),
    }];
    let d = e.place(&r, 0);
    assert_eq!(node_of(&d, "j"), "n2");
    assert_eq!(d.trace.broken_soft_rules, vec![SoftRule::InterSameZone]);
}

#[test]
fn a_hard_different_zone_rule_keeps_replicas_out_of_each_others_zones() {
    let e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 50.0),
            node("n2", "p", "b", 100.0, 0.0),
        ],
    );
    let mut r = request(vec![job("j", 10.0)], &["p"]);
    r.inter_replica = PlacementRules {
        different_zone: Some(Strength::Hard),
        ..PlacementRules::inter_replica_default()
    };
    r.inter_replica.same_zone = None;
    r.other_replicas = vec![Position {
        node: "x".into(),
        zone: Some("a".into()),
    }];
    assert_eq!(node_of(&e.place(&r, 0), "j"), "n2");
}

#[test]
fn soft_rules_are_given_up_least_important_first() {
    // Different node (soft) matters more than same zone (soft): the only same-zone node holds
    // the other replica, so the engine keeps different-node and breaks same-zone.
    let e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 0.0),
            node("n2", "p", "b", 100.0, 0.0),
        ],
    );
    let mut r = request(vec![job("j", 10.0)], &["p"]);
    r.inter_replica.different_node = Some(Strength::Soft);
    r.other_replicas = vec![Position {
        node: "n1".into(),
        zone: None,
    }];
    let d = e.place(&r, 0);
    assert_eq!(node_of(&d, "j"), "n2");
    assert_eq!(d.trace.broken_soft_rules, vec![SoftRule::InterSameZone]);
}

#[test]
fn intra_replica_different_node_spreads_a_replicas_jobs() {
    let e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 0.0),
            node("n2", "p", "a", 100.0, 0.0),
        ],
    );
    let mut r = request(vec![job("a", 10.0), job("b", 10.0)], &["p"]);
    r.intra_replica.different_node = Some(Strength::Hard);
    let d = e.place(&r, 0);
    assert_ne!(node_of(&d, "a"), node_of(&d, "b"));
}

#[test]
fn intra_replica_hard_same_node_puts_the_whole_replica_on_one_node() {
    let e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 70.0),
            node("n2", "p", "a", 100.0, 0.0),
        ],
    );
    let mut r = request(vec![job("a", 20.0), job("b", 20.0)], &["p"]);
    r.intra_replica.same_node = Some(Strength::Hard);
    let d = e.place(&r, 0);
    assert_eq!(node_of(&d, "a"), "n2");
    assert_eq!(node_of(&d, "b"), "n2");
}

#[test]
fn recovery_joins_a_running_sibling_it_is_co_located_with() {
    let e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 50.0),
            node("n2", "p", "a", 100.0, 10.0),
        ],
    );
    let mut j = job("j", 10.0);
    j.co_locate_with = vec!["sib".into()];
    let mut r = request(vec![j], &["p"]);
    r.kind = PlacementKind::Recovery;
    r.placed_siblings = vec![SiblingPosition {
        job_name: "sib".into(),
        node: "n1".into(),
        zone: None,
    }];
    assert_eq!(node_of(&e.place(&r, 0), "j"), "n1");
}

#[test]
fn pools_are_tried_in_preference_order_and_spill_only_when_full() {
    let e = engine(
        vec![
            binpack_pool(),
            pool("q", PackingStrategy::Binpack, ScaleOut::Fixed),
        ],
        vec![
            node("p1", "p", "a", 100.0, 80.0),
            node("q1", "q", "a", 100.0, 0.0),
        ],
    );
    let d = e.place(&request(vec![job("j", 10.0)], &["p", "q"]), 0);
    assert_eq!(node_of(&d, "j"), "p1");
    let d = e.place(
        &request(vec![job("a", 10.0), job("b", 15.0)], &["p", "q"]),
        0,
    );
    // p cannot take the whole replica (25 > 20 free), so all of it goes to q.
    assert_eq!(node_of(&d, "a"), "q1");
    assert_eq!(node_of(&d, "b"), "q1");
    let s = d.summary();
    assert_eq!(s.pools_tried.len(), 2);
    assert_eq!(s.pools_tried[0].reason, Some(PoolLeftReason::NoNodeFits));
    assert_eq!(s.pools_tried[1].outcome, PoolOutcome::Placed);
}

#[test]
fn a_replica_override_puts_its_pools_first() {
    let mut b = BundleSpec {
        bundle_id: "b".into(),
        replicas: 2,
        pools: vec!["aws".into(), "oci".into()],
        jobs: vec![job("j", 1.0)],
        replica_overrides: Default::default(),
        intra_replica_placement: PlacementRules::none(),
        inter_replica_placement: PlacementRules::inter_replica_default(),
    };
    b.replica_overrides.insert(
        1,
        ReplicaOverride {
            pools: vec!["oci".into(), "aws".into()],
        },
    );
    assert_eq!(
        b.request_for_replica(0, PlacementKind::First, vec![]).pools,
        vec!["aws", "oci"]
    );
    assert_eq!(
        b.request_for_replica(1, PlacementKind::First, vec![]).pools,
        vec!["oci", "aws"]
    );
}

#[test]
fn a_terminating_pool_takes_no_new_placement_or_provisioning() {
    let mut fixed = binpack_pool();
    fixed.terminating = true;
    let e = engine(vec![fixed], vec![node("n1", "p", "a", 100.0, 0.0)]);
    let d = e.place(&request(vec![job("j", 10.0)], &["p"]), 0);
    assert!(matches!(d.outcome, Outcome::Unplaceable { .. }), "{d:?}");
    assert_eq!(d.trace.pools[0].reason, Some(PoolLeftReason::Terminating));
    // Next in the list takes it.
    let mut other = binpack_pool();
    other.name = "q".into();
    let mut gone = binpack_pool();
    gone.terminating = true;
    let e = engine(
        vec![gone, other],
        vec![
            node("n1", "p", "a", 100.0, 0.0),
            node("n2", "q", "a", 100.0, 0.0),
        ],
    );
    let d = e.place(&request(vec![job("j", 10.0)], &["p", "q"]), 0);
    assert_eq!(node_of(&d, "j"), "n2");
}

#[test]
fn a_terminating_pool_lets_its_users_recover_on_its_nodes_but_provisions_nothing() {
    let mut fixed = binpack_pool();
    fixed.terminating = true;
    let e = engine(vec![fixed], vec![node("n1", "p", "a", 100.0, 0.0)]);
    let mut recovery = request(vec![job("j", 10.0)], &["p"]);
    recovery.kind = PlacementKind::Recovery;
    let d = e.place(&recovery, 0);
    assert_eq!(node_of(&d, "j"), "n1", "{d:?}");
    // An elastic pool being deleted with no room left: no new node for the recovery.
    let mut gone = elastic(vec![itype("m", 100.0, 16, &[])]);
    gone.terminating = true;
    let e = engine(vec![gone], vec![node("n1", "e", "a", 100.0, 95.0)]);
    let mut recovery = request(vec![job("j", 10.0)], &["e"]);
    recovery.kind = PlacementKind::Recovery;
    let d = e.place(&recovery, 0);
    assert!(matches!(d.outcome, Outcome::Unplaceable { .. }), "{d:?}");
    assert_eq!(d.trace.pools[0].reason, Some(PoolLeftReason::Terminating));
}

#[test]
fn an_unknown_pool_is_skipped_with_a_reason() {
    let e = engine(vec![binpack_pool()], vec![node("n1", "p", "a", 100.0, 0.0)]);
    let d = e.place(&request(vec![job("j", 10.0)], &["nope", "p"]), 0);
    assert_eq!(node_of(&d, "j"), "n1");
    assert_eq!(d.trace.pools[0].reason, Some(PoolLeftReason::UnknownPool));
    let d = e.place(&request(vec![job("j", 10.0)], &["nope"]), 0);
    let Outcome::Unplaceable { jobs } = &d.outcome else {
        panic!()
    };
    assert_eq!(jobs[0].reason, UnplaceableReason::NoUsablePool);
}

fn elastic(types: Vec<InstanceTypeSpec>) -> PoolSpec {
    let mut p = pool("e", PackingStrategy::Binpack, ScaleOut::Elastic);
    p.candidate_instance_types = types;
    p
}

#[test]
fn an_elastic_pool_provisions_the_smallest_type_that_fits_the_whole_replica() {
    let e = engine(
        vec![elastic(vec![
            itype("xl", 100.0, 16, &[]),
            itype("s", 10.0, 4, &[]),
            itype("m", 30.0, 8, &[]),
        ])],
        vec![],
    );
    let mut a = job("a", 12.0);
    a.co_locate_with = vec!["b".into()];
    let d = e.place(&request(vec![a, job("b", 12.0)], &["e"]), 0);
    assert_eq!(
        d.outcome,
        Outcome::Provision {
            pool: "e".into(),
            instance_type: "m".into(),
            zone: Some("a".into())
        }
    );
    assert_eq!(d.summary().instance_type.as_deref(), Some("m"));
}

#[test]
fn provisioning_picks_a_type_with_the_needed_capabilities() {
    let e = engine(
        vec![elastic(vec![
            itype("cpu", 100.0, 16, &[]),
            itype("gpu", 100.0, 16, &["gpu"]),
        ])],
        vec![],
    );
    let mut j = job("j", 10.0);
    j.requirements.required_capabilities = vec!["gpu".into()];
    let d = e.place(&request(vec![j], &["e"]), 0);
    assert!(
        matches!(&d.outcome, Outcome::Provision { instance_type, .. } if instance_type == "gpu"),
        "{d:?}"
    );
}

#[test]
fn provisioning_picks_the_zone_that_honours_soft_rules() {
    let e = engine(vec![elastic(vec![itype("m", 100.0, 16, &[])])], vec![]);
    let mut r = request(vec![job("j", 10.0)], &["e"]);
    r.other_replicas = vec![Position {
        node: "gone".into(),
        zone: Some("b".into()),
    }];
    let d = e.place(&r, 0);
    assert_eq!(
        d.outcome,
        Outcome::Provision {
            pool: "e".into(),
            instance_type: "m".into(),
            zone: Some("b".into())
        }
    );
}

#[test]
fn a_fixed_pool_never_provisions() {
    let mut p = binpack_pool();
    p.candidate_instance_types = vec![itype("m", 100.0, 16, &[])];
    let e = engine(vec![p], vec![]);
    let d = e.place(&request(vec![job("j", 10.0)], &["p"]), 0);
    assert_eq!(d.kind(), OutcomeKind::Unplaceable);
    assert_eq!(d.trace.pools[0].reason, Some(PoolLeftReason::NoNodeFits));
}

#[test]
fn an_elastic_pool_at_max_nodes_does_not_provision() {
    let mut p = elastic(vec![itype("m", 100.0, 16, &[])]);
    p.max_nodes = Some(1);
    let e = engine(vec![p], vec![node("n", "e", "a", 100.0, 100.0)]);
    let d = e.place(&request(vec![job("j", 10.0)], &["e"]), 0);
    assert_eq!(
        d.trace.pools[0].reason,
        Some(PoolLeftReason::MaxNodesReached)
    );
}

#[test]
fn a_paused_zone_is_never_provisioned_into_and_resumes_when_unpaused() {
    let mut p = elastic(vec![itype("m", 100.0, 16, &[])]);
    p.zones = vec!["z1".into(), "z2".into()];
    let mut e = engine(vec![p], vec![]);
    let zone_of = |d: &Decision| match &d.outcome {
        Outcome::Provision { zone, .. } => zone.clone(),
        _ => None,
    };
    let req = request(vec![job("j", 10.0)], &["e"]);
    assert_eq!(zone_of(&e.place(&req, 0)).as_deref(), Some("z1"));
    e.set_provisioning_paused("e", "z1", true);
    assert!(e.provisioning_paused("e", "z1"));
    assert_eq!(zone_of(&e.place(&req, 0)).as_deref(), Some("z2"));
    e.set_provisioning_paused("e", "z2", true);
    let d = e.place(&req, 0);
    assert_eq!(d.kind(), OutcomeKind::Unplaceable, "every zone paused");
    e.set_provisioning_paused("e", "z1", false);
    assert_eq!(zone_of(&e.place(&req, 0)).as_deref(), Some("z1"));
}

/// Nodes `a1` (zone a, binpack's choice: the fullest) and `b1` (zone b) in fixed pool `p`.
fn two_zone_pool() -> Engine {
    engine(
        vec![binpack_pool()],
        vec![
            node("a1", "p", "a", 100.0, 50.0),
            node("b1", "p", "b", 100.0, 0.0),
        ],
    )
}

#[test]
fn a_degraded_zone_is_avoided_while_another_zone_fits() {
    let mut e = two_zone_pool();
    let mut req = request(vec![job("j", 10.0)], &["p"]);
    req.kind = PlacementKind::Recovery;
    assert_eq!(node_of(&e.place(&req, 0), "j"), "a1");
    e.set_provisioning_paused("p", "a", true);
    let d = e.place(&req, 0);
    assert_eq!(node_of(&d, "j"), "b1");
    assert!(
        d.trace.pools.iter().all(|p| !p.last_resort),
        "{:?}",
        d.trace
    );
}

#[test]
fn a_degraded_zone_comes_after_other_pools_and_new_nodes() {
    let mut e = engine(
        vec![binpack_pool(), elastic(vec![itype("m", 100.0, 16, &[])])],
        vec![node("a1", "p", "a", 100.0, 50.0)],
    );
    e.set_provisioning_paused("p", "a", true);
    let mut req = request(vec![job("j", 10.0)], &["p", "e"]);
    req.kind = PlacementKind::Recovery;
    let d = e.place(&req, 0);
    assert!(
        matches!(&d.outcome, Outcome::Provision { pool, .. } if pool == "e"),
        "a new node in another pool beats a survivor of a degraded zone: {d:?}"
    );
    assert_eq!(d.trace.pools[0].reason, Some(PoolLeftReason::NoNodeFits));
    assert_eq!(
        d.trace.pools[0].rejections,
        vec![RejectionCount {
            reason: RejectReason::ZoneDegraded,
            count: 1
        }]
    );
}

#[test]
fn a_node_in_a_degraded_zone_is_the_last_resort_and_the_trace_says_so() {
    let mut e = two_zone_pool();
    e.set_provisioning_paused("p", "a", true);
    // b1 is cordoned: nothing outside zone a can take the job.
    e.set_cordoned("b1", true).expect("known node");
    let d = e.place(&request(vec![job("j", 10.0)], &["p"]), 0);
    assert_eq!(node_of(&d, "j"), "a1");
    let attempts: Vec<(PoolOutcome, bool)> = d
        .trace
        .pools
        .iter()
        .map(|p| (p.outcome, p.last_resort))
        .collect();
    assert_eq!(
        attempts,
        vec![(PoolOutcome::Left, false), (PoolOutcome::Placed, true)]
    );
    assert!(
        d.trace.message.contains("last resort") && d.trace.message.contains("degraded zone a"),
        "{}",
        d.trace.message
    );
    let summary = d.summary();
    assert!(summary.pools_tried.iter().any(|p| p.last_resort));
    assert!(
        summary
            .rejections
            .iter()
            .any(|r| r.reason == RejectReason::ZoneDegraded)
    );
    e.set_provisioning_paused("p", "a", false);
    let d = e.place(&request(vec![job("j", 10.0)], &["p"]), 0);
    assert!(d.trace.pools.iter().all(|p| !p.last_resort));
    assert!(!d.trace.message.contains("last resort"));
}

#[test]
fn an_elastic_pool_with_no_type_big_enough_is_left() {
    let e = engine(vec![elastic(vec![itype("s", 10.0, 4, &[])])], vec![]);
    let d = e.place(&request(vec![job("j", 50.0)], &["e"]), 0);
    assert_eq!(
        d.trace.pools[0].reason,
        Some(PoolLeftReason::NoInstanceTypeFits)
    );
}

fn starting(id: &str, since: u64) -> NodeSpec {
    let mut n = node(id, "e", "a", 100.0, 0.0);
    n.pending_since_ms = Some(since);
    n
}

#[test]
fn a_starting_node_counts_as_capacity_within_the_pending_window() {
    let e = engine(
        vec![elastic(vec![itype("m", 100.0, 16, &[])])],
        vec![starting("new", 1_000)],
    );
    let d = e.place(
        &request(vec![job("j", 10.0)], &["e"]),
        1_000 + DEFAULT_PENDING_WINDOW_MS,
    );
    assert_eq!(node_of(&d, "j"), "new");
    let Outcome::Placed { assignments, .. } = &d.outcome else {
        panic!()
    };
    assert!(assignments[0].node_pending);
    // Past the window it is no longer counted: provision instead.
    let d = e.place(
        &request(vec![job("j", 10.0)], &["e"]),
        1_001 + DEFAULT_PENDING_WINDOW_MS,
    );
    assert_eq!(d.kind(), OutcomeKind::Provision);
}

#[test]
fn ready_nodes_are_preferred_over_starting_ones() {
    let e = engine(
        vec![elastic(vec![])],
        vec![starting("a-new", 0), node("z-ready", "e", "a", 100.0, 0.0)],
    );
    assert_eq!(
        node_of(&e.place(&request(vec![job("j", 10.0)], &["e"]), 0), "j"),
        "z-ready"
    );
}

#[test]
fn a_nan_capacity_makes_the_job_invalid_not_a_panic() {
    let e = engine(vec![binpack_pool()], vec![node("n", "p", "a", 100.0, 0.0)]);
    for bad in [f64::NAN, f64::INFINITY, -1.0, 1e300] {
        let d = e.place(&request(vec![job("j", bad), job("k", 1.0)], &["p"]), 0);
        let Outcome::Unplaceable { jobs } = &d.outcome else {
            panic!("{bad}: {d:?}")
        };
        assert!(
            matches!(jobs[0].reason, UnplaceableReason::InvalidJob { .. }),
            "{bad}"
        );
        assert!(matches!(
            jobs[1].reason,
            UnplaceableReason::ReplicaIncomplete { .. }
        ));
    }
}

#[test]
fn ten_thousand_jobs_in_one_replica_are_refused_cleanly() {
    let e = engine(vec![binpack_pool()], vec![node("n", "p", "a", 100.0, 0.0)]);
    let jobs: Vec<_> = (0..10_000).map(|i| job(&format!("j{i}"), 0.001)).collect();
    let d = e.place(&request(jobs, &["p"]), 0);
    let Outcome::Unplaceable { jobs } = &d.outcome else {
        panic!()
    };
    assert_eq!(jobs.len(), 10_000);
    assert_eq!(
        jobs[0].reason,
        UnplaceableReason::TooManyJobs {
            count: 10_000,
            limit: MAX_JOBS_PER_REPLICA
        }
    );
    assert!(d.summary().message.chars().count() <= SUMMARY_MAX_MESSAGE + 1);
}

#[test]
fn an_empty_replica_is_unplaceable_with_a_message() {
    let e = engine(vec![binpack_pool()], vec![]);
    let d = e.place(&request(vec![], &["p"]), 0);
    assert_eq!(d.outcome, Outcome::Unplaceable { jobs: vec![] });
    assert!(!d.trace.message.is_empty());
}

#[test]
fn commit_reserves_capacity_and_release_gives_it_back() {
    let mut e = engine(vec![binpack_pool()], vec![node("n", "p", "a", 100.0, 0.0)]);
    let d = e.place(&request(vec![job("a", 60.0)], &["p"]), 0);
    e.commit(&d).unwrap();
    assert_eq!(e.node_view("n").unwrap().free_capacity, 40.0);
    // The next placement of the wave sees the reservation.
    assert_eq!(
        e.place(&request(vec![job("b", 60.0)], &["p"]), 0).kind(),
        OutcomeKind::Unplaceable
    );
    let key = JobKey {
        bundle_id: "b".into(),
        replica_index: 0,
        job_name: "a".into(),
    };
    assert!(e.release_job(&key));
    assert!(!e.release_job(&key));
    assert_eq!(e.node_view("n").unwrap().free_capacity, 100.0);
    assert!(
        e.place(&request(vec![job("b", 60.0)], &["p"]), 0)
            .is_placed()
    );
}

#[test]
fn only_a_placed_decision_can_be_committed() {
    let mut e = engine(vec![binpack_pool()], vec![]);
    let d = e.place(&request(vec![job("a", 60.0)], &["p"]), 0);
    assert_eq!(e.commit(&d), Err(CommitError::NotPlaced));
}

#[test]
fn a_left_pool_counts_each_node_under_its_first_reason() {
    let mut c = node("c", "p", "a", 100.0, 0.0);
    c.cordoned = true;
    let mut g = node("g", "p", "a", 100.0, 95.0);
    g.capabilities = vec!["gpu".into()];
    let e = engine(
        vec![binpack_pool()],
        vec![
            c,
            g,
            node("n1", "p", "a", 100.0, 0.0),
            node("n2", "p", "a", 100.0, 99.0),
        ],
    );
    let mut j = job("j", 10.0);
    j.requirements.required_capabilities = vec!["gpu".into()];
    let d = e.place(&request(vec![j], &["p"]), 0);
    assert_eq!(
        d.trace.pools[0].rejections,
        vec![
            RejectionCount {
                reason: RejectReason::Cordoned,
                count: 1
            },
            RejectionCount {
                reason: RejectReason::MissingCapability,
                count: 2
            },
            RejectionCount {
                reason: RejectReason::InsufficientCapacity,
                count: 1
            },
        ]
    );
    assert_eq!(d.trace.pools[0].failed_job.as_deref(), Some("j"));
}

#[test]
fn the_summary_stays_bounded_whatever_the_sizes() {
    let pools: Vec<_> = (0..20)
        .map(|i| pool(&format!("p{i}"), PackingStrategy::Binpack, ScaleOut::Fixed))
        .collect();
    let nodes: Vec<_> = (0..200)
        .map(|i| node(&format!("n{i}"), &format!("p{}", i % 20), "a", 100.0, 99.0))
        .collect();
    let names: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let e = engine(pools, nodes);
    let d = e.place(
        &request((0..50).map(|i| job(&format!("j{i}"), 5.0)).collect(), &refs),
        0,
    );
    let s = d.summary();
    assert!(s.pools_tried.len() <= SUMMARY_MAX_POOLS);
    assert_eq!(s.pools_omitted, 12);
    assert!(s.rejections.len() <= RejectReason::ALL.len());
    assert!(s.message.chars().count() <= SUMMARY_MAX_MESSAGE + 1);
    let big = engine(
        vec![binpack_pool()],
        (0..50)
            .map(|i| node(&format!("n{i:02}"), "p", "a", 10.0, 0.0))
            .collect(),
    );
    let mut r = request(
        (0..50).map(|i| job(&format!("j{i}"), 6.0)).collect(),
        &["p"],
    );
    r.intra_replica.different_node = Some(Strength::Hard);
    let s = big.place(&r, 0).summary();
    assert_eq!(s.outcome, OutcomeKind::Placed);
    assert_eq!(s.nodes.len(), SUMMARY_MAX_NODES);
    assert_eq!(s.nodes_omitted, 46);
}

#[test]
fn decisions_serialise_with_stable_camel_case_names() {
    let e = engine(vec![binpack_pool()], vec![node("n", "p", "a", 100.0, 0.0)]);
    let d = e.place(&request(vec![job("j", 10.0)], &["p"]), 0);
    let v = serde_json::to_value(d.summary()).unwrap();
    for key in [
        "outcome",
        "pool",
        "chosenNode",
        "chosenTier",
        "poolsTried",
        "rejections",
        "brokenSoftRules",
        "message",
    ] {
        assert!(v.get(key).is_some(), "{key} missing in {v}");
    }
    assert_eq!(v["outcome"], "placed");
    let full = serde_json::to_value(&d).unwrap();
    assert_eq!(full["outcome"]["kind"], "placed");
    assert_eq!(full["outcome"]["assignments"][0]["score"]["tier"], "node");
    let back: Decision = serde_json::from_value(full).unwrap();
    assert_eq!(back, d);
}

#[test]
fn node_updates_move_a_node_between_buckets() {
    let mut e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 0.0),
            node("n2", "p", "a", 100.0, 10.0),
        ],
    );
    let r = request(vec![job("j", 10.0)], &["p"]);
    assert_eq!(node_of(&e.place(&r, 0), "j"), "n2");
    e.upsert_node(node("n1", "p", "b", 100.0, 50.0)).unwrap();
    assert_eq!(node_of(&e.place(&r, 0), "j"), "n1");
    e.remove_node("n1");
    assert_eq!(node_of(&e.place(&r, 0), "j"), "n2");
    e.upsert_node(node("n3", "p", "a", 100.0, 80.0)).unwrap();
    assert_eq!(node_of(&e.place(&r, 0), "j"), "n3");
}

#[test]
fn changing_a_pools_strategy_reorders_its_nodes() {
    let mut e = engine(
        vec![binpack_pool()],
        vec![
            node("n1", "p", "a", 100.0, 0.0),
            node("n2", "p", "a", 100.0, 50.0),
        ],
    );
    let r = request(vec![job("j", 10.0)], &["p"]);
    assert_eq!(node_of(&e.place(&r, 0), "j"), "n2");
    e.upsert_pool(pool("p", PackingStrategy::Spread, ScaleOut::Fixed))
        .unwrap();
    assert_eq!(node_of(&e.place(&r, 0), "j"), "n1");
    assert!(e.remove_pool("p"));
    assert_eq!(
        e.place(&r, 0).trace.pools[0].reason,
        Some(PoolLeftReason::UnknownPool)
    );
}

#[test]
fn invalid_pools_and_nodes_are_typed_errors() {
    let mut p = binpack_pool();
    p.candidate_instance_types = vec![itype("zero", 0.0, 4, &[])];
    let err = Engine::new(ClusterSnapshot {
        pools: vec![p],
        nodes: vec![
            node("n", "p", "a", f64::NAN, 0.0),
            node("", "p", "a", 1.0, 0.0),
            node("m", "p", "a", 1.0, -3.0),
        ],
        ..ClusterSnapshot::default()
    })
    .unwrap_err();
    assert_eq!(err.errors.len(), 4);
    assert!(matches!(
        err.errors[0],
        InputError::InvalidInstanceType { .. }
    ));
    assert!(matches!(
        err.errors[1],
        InputError::InvalidNumber {
            problem: NumberProblem::NotFinite,
            ..
        }
    ));
    assert!(matches!(err.errors[2], InputError::EmptyId { .. }));
    assert!(matches!(
        err.errors[3],
        InputError::InvalidNumber {
            problem: NumberProblem::Negative,
            ..
        }
    ));
}

#[test]
fn pool_usage_reports_nodes_spares_and_fill() {
    let e = engine(
        vec![binpack_pool()],
        vec![node("n", "p", "a", 100.0, 50.0), spare("s", None)],
    );
    let u = e.pool_usage("p").unwrap();
    assert_eq!((u.node_count, u.live_spares), (2, 1));
    assert!((u.used_capacity_fraction - 0.25).abs() < 1e-9);
}
