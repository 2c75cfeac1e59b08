//! A replica no single pool can take, placed unit by unit across pools.

use super::*;
use crate::place::place_whole_replica;

fn fixed(name: &str) -> PoolSpec {
    pool(name, PackingStrategy::Binpack, ScaleOut::Fixed)
}

fn with_caps(mut n: NodeSpec, caps: &[&str]) -> NodeSpec {
    n.capabilities = caps.iter().map(|c| (*c).to_owned()).collect();
    n
}

fn needing(mut j: JobSpec, cap: &str) -> JobSpec {
    j.requirements.required_capabilities = vec![cap.to_owned()];
    j
}

fn job_trace<'a>(d: &'a Decision, job: &str) -> &'a JobPoolTrace {
    d.trace
        .jobs
        .iter()
        .find(|j| j.job_name == job)
        .unwrap_or_else(|| panic!("no trace for {job}: {:?}", d.trace))
}

/// (pool, outcome, reason) of each pool tried for a job.
fn trail(d: &Decision, job: &str) -> Vec<(String, PoolOutcome, Option<PoolLeftReason>)> {
    job_trace(d, job)
        .pools_tried
        .iter()
        .map(|p| (p.pool.clone(), p.outcome, p.reason))
        .collect()
}

fn dominant(p: &PoolAttempt) -> Option<RejectReason> {
    p.rejections
        .iter()
        .max_by_key(|r| r.count)
        .map(|r| r.reason)
}

#[test]
fn a_job_needing_what_only_the_second_pool_has_goes_there_and_its_sibling_stays_in_the_first() {
    // The gpu node has room for the gpu job only, so neither pool takes the replica whole.
    let e = engine(
        vec![fixed("aws"), fixed("gpu")],
        vec![
            node("n1", "aws", "a", 100.0, 0.0),
            with_caps(node("g1", "gpu", "a", 10.0, 0.0), &["gpu"]),
        ],
    );
    let req = request(
        vec![job("enc", 8.0), needing(job("infer", 8.0), "gpu")],
        &["aws", "gpu"],
    );
    assert_eq!(
        place_whole_replica(&e, &req, 0).kind(),
        OutcomeKind::Unplaceable
    );
    let d = e.place(&req, 0);
    assert_eq!(node_of(&d, "enc"), "n1");
    assert_eq!(node_of(&d, "infer"), "g1");
    assert!(d.is_split());
    assert_eq!(d.pool_of("enc"), Some("aws"));
    assert_eq!(d.pool_of("infer"), Some("gpu"));
    // The outcome names the most preferred pool used.
    assert!(matches!(&d.outcome, Outcome::Placed { pool, .. } if pool == "aws"));
    assert_eq!(
        trail(&d, "enc"),
        vec![("aws".into(), PoolOutcome::Placed, None)]
    );
    assert_eq!(
        trail(&d, "infer"),
        vec![
            (
                "aws".into(),
                PoolOutcome::Left,
                Some(PoolLeftReason::NoNodeFits)
            ),
            ("gpu".into(), PoolOutcome::Placed, None),
        ]
    );
    let left = &job_trace(&d, "infer").pools_tried[0];
    assert_eq!(left.failed_job.as_deref(), Some("infer"));
    assert_eq!(dominant(left), Some(RejectReason::MissingCapability));
    // The whole-replica attempts stay in the trace: why no single pool took it.
    assert!(d.trace.pools.iter().all(|p| p.outcome == PoolOutcome::Left));
    assert!(
        d.trace.message.contains("split across pools"),
        "{}",
        d.trace.message
    );
    // Status shows each job its own pool and trail.
    let s = d.summary_for_job("infer");
    assert_eq!(s.pool.as_deref(), Some("gpu"));
    assert_eq!(s.chosen_node.as_deref(), Some("g1"));
    assert_eq!(
        s.pools_tried.iter().map(|p| p.outcome).collect::<Vec<_>>(),
        vec![PoolOutcome::Left, PoolOutcome::Placed]
    );
    assert_eq!(s.rejections[0].reason, RejectReason::MissingCapability);
    assert_eq!(d.summary_for_job("enc").pool.as_deref(), Some("aws"));
    // It commits like any placement: both nodes hold their job.
    let mut e = e;
    e.commit(&d).expect("commit");
    assert_eq!(e.node_view("g1").expect("g1").used_capacity, 8.0);
    assert_eq!(e.node_view("n1").expect("n1").used_capacity, 8.0);
}

#[test]
fn a_replica_one_pool_can_take_whole_is_not_split() {
    let e = engine(
        vec![fixed("aws"), fixed("gpu")],
        vec![
            node("n1", "aws", "a", 100.0, 0.0),
            with_caps(node("g1", "gpu", "a", 100.0, 0.0), &["gpu"]),
        ],
    );
    let req = request(
        vec![job("enc", 8.0), needing(job("infer", 8.0), "gpu")],
        &["aws", "gpu"],
    );
    let d = e.place(&req, 0);
    assert_eq!(d, place_whole_replica(&e, &req, 0));
    assert!(d.trace.jobs.is_empty());
    assert_eq!(node_of(&d, "enc"), "g1");
    assert_eq!(d.pool_of("enc"), Some("gpu"));
}

#[test]
fn co_located_jobs_are_one_unit_and_never_split_across_pools() {
    // `infer` needs the gpu pool and must share a node with `enc`; the gpu node cannot hold
    // both, and the aws node has no gpu: there is nowhere for the pair.
    let mut infer = needing(job("infer", 8.0), "gpu");
    infer.co_locate_with = vec!["enc".into()];
    let req = request(
        vec![job("enc", 8.0), infer, job("mux", 1.0)],
        &["aws", "gpu"],
    );
    let e = engine(
        vec![fixed("aws"), fixed("gpu")],
        vec![
            node("n1", "aws", "a", 100.0, 0.0),
            with_caps(node("g1", "gpu", "a", 10.0, 0.0), &["gpu"]),
        ],
    );
    let d = e.place(&req, 0);
    assert_eq!(d.kind(), OutcomeKind::Unplaceable, "{}", d.trace.message);
    // With room for the pair on the gpu node, the pair goes there together; `mux` is its own
    // unit and stays in the first pool.
    let e = engine(
        vec![fixed("aws"), fixed("gpu")],
        vec![
            node("n1", "aws", "a", 100.0, 0.0),
            with_caps(node("g1", "gpu", "a", 16.0, 0.0), &["gpu"]),
        ],
    );
    let d = e.place(&req, 0);
    assert_eq!(node_of(&d, "enc"), "g1");
    assert_eq!(node_of(&d, "infer"), "g1");
    assert_eq!(node_of(&d, "mux"), "n1");
    assert_eq!(trail(&d, "enc"), trail(&d, "infer"));
}

#[test]
fn separate_from_holds_across_pools() {
    // `a` and `b` must not share a node. The aws pool has one node, the gpu pool one gpu node:
    // neither pool can take the replica whole.
    let mut a = job("a", 10.0);
    a.separate_from = vec!["b".into()];
    let req = request(
        vec![a, job("b", 9.0), needing(job("g", 1.0), "gpu")],
        &["aws", "gpu"],
    );
    let e = engine(
        vec![fixed("aws"), fixed("gpu")],
        vec![
            node("n1", "aws", "a", 100.0, 0.0),
            with_caps(node("g1", "gpu", "a", 100.0, 0.0), &["gpu"]),
        ],
    );
    let d = e.place(&req, 0);
    assert_eq!(node_of(&d, "a"), "n1");
    assert_eq!(node_of(&d, "b"), "g1", "b left n1 because a is there");
    assert_eq!(node_of(&d, "g"), "g1");
    let left = &job_trace(&d, "b").pools_tried[0];
    assert_eq!(left.pool, "aws");
    assert_eq!(dominant(left), Some(RejectReason::SeparateFrom));
}

#[test]
fn the_inter_replica_rule_holds_across_pools() {
    // The other replica runs on n1 (hard different node). The gpu node only has room for the
    // gpu job (the bigger unit, so placed first), so `enc` leaves aws (n1 taken by the other
    // replica) and gpu (full) for onprem.
    let mut req = request(
        vec![job("enc", 8.0), needing(job("infer", 9.0), "gpu")],
        &["aws", "gpu", "onprem"],
    );
    req.other_replicas = vec![Position {
        node: "n1".into(),
        zone: None,
    }];
    let e = engine(
        vec![fixed("aws"), fixed("gpu"), fixed("onprem")],
        vec![
            node("n1", "aws", "a", 100.0, 0.0),
            with_caps(node("g1", "gpu", "a", 10.0, 0.0), &["gpu"]),
            node("m1", "onprem", "a", 100.0, 0.0),
        ],
    );
    let d = e.place(&req, 0);
    assert_eq!(node_of(&d, "infer"), "g1");
    assert_eq!(node_of(&d, "enc"), "m1");
    assert_eq!(d.pool_of("enc"), Some("onprem"));
    let t = &job_trace(&d, "enc").pools_tried;
    assert_eq!(t.len(), 3);
    assert_eq!(dominant(&t[0]), Some(RejectReason::InterDifferentNode));
    assert_eq!(dominant(&t[1]), Some(RejectReason::InsufficientCapacity));
    assert_eq!(t[2].outcome, PoolOutcome::Placed);
}

#[test]
fn a_unit_asks_for_a_node_in_the_first_elastic_pool_that_could_take_it_then_lands_there() {
    // The elastic aws pool is empty and its type has no gpu; the gpu pool only has room for
    // the gpu job. The gpu job goes to the gpu pool, and `enc` asks aws for a node.
    let mut aws = pool("aws", PackingStrategy::Binpack, ScaleOut::Elastic);
    aws.candidate_instance_types = vec![itype("m5", 50.0, 16, &[])];
    let req = request(
        vec![job("enc", 8.0), needing(job("infer", 9.0), "gpu")],
        &["aws", "gpu"],
    );
    let mut e = engine(
        vec![aws, fixed("gpu")],
        vec![with_caps(node("g1", "gpu", "a", 10.0, 0.0), &["gpu"])],
    );
    assert_eq!(
        place_whole_replica(&e, &req, 0).kind(),
        OutcomeKind::Unplaceable
    );
    let d = e.place(&req, 0);
    match &d.outcome {
        Outcome::Provision {
            pool,
            instance_type,
            ..
        } => {
            assert_eq!(pool, "aws");
            assert_eq!(instance_type, "m5");
        }
        other => panic!("expected Provision, got {other:?}"),
    }
    assert_eq!(d.pool_of("infer"), Some("gpu"));
    assert_eq!(
        trail(&d, "infer")[0],
        (
            "aws".into(),
            PoolOutcome::Left,
            Some(PoolLeftReason::NoInstanceTypeFits)
        )
    );
    assert_eq!(
        trail(&d, "enc"),
        vec![("aws".into(), PoolOutcome::Provision, None)]
    );
    // The node starts; the next placement counts it and places the replica split.
    let mut new = NodeSpec::ready("new-1", "aws", None, 50.0, 16);
    new.pending_since_ms = Some(0);
    e.upsert_node(new).expect("node");
    let d = e.place(&req, 1_000);
    assert_eq!(node_of(&d, "enc"), "new-1");
    assert_eq!(node_of(&d, "infer"), "g1");
}

#[test]
fn a_unit_that_fits_no_pool_leaves_the_replica_unplaceable_as_before() {
    let e = engine(
        vec![fixed("aws"), fixed("gpu")],
        vec![
            node("n1", "aws", "a", 100.0, 0.0),
            with_caps(node("g1", "gpu", "a", 10.0, 0.0), &["gpu"]),
        ],
    );
    let req = request(
        vec![job("enc", 8.0), needing(job("infer", 8.0), "tpu")],
        &["aws", "gpu"],
    );
    let d = e.place(&req, 0);
    assert_eq!(d, place_whole_replica(&e, &req, 0));
    assert_eq!(d.kind(), OutcomeKind::Unplaceable);
}

#[test]
fn admission_counts_a_replica_that_only_places_split() {
    let e = engine(
        vec![fixed("aws"), fixed("gpu")],
        vec![
            node("n1", "aws", "a", 100.0, 0.0),
            with_caps(node("g1", "gpu", "a", 10.0, 0.0), &["gpu"]),
        ],
    );
    let b = BundleSpec {
        bundle_id: "b".into(),
        replicas: 1,
        pools: vec!["aws".into(), "gpu".into()],
        jobs: vec![job("enc", 8.0), needing(job("infer", 8.0), "gpu")],
        replica_overrides: Default::default(),
        intra_replica_placement: PlacementRules::none(),
        inter_replica_placement: PlacementRules::inter_replica_default(),
    };
    assert_eq!(validate_admission(&b, &e, 0), AdmissionResult::Ok);
}
