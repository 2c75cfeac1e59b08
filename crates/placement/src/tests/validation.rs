//! validate_bundle and validate_admission.

use super::*;

fn bundle(jobs: Vec<JobSpec>, pools: &[&str], replicas: u32) -> BundleSpec {
    BundleSpec {
        bundle_id: "b".into(),
        replicas,
        pools: pools.iter().map(|p| (*p).to_owned()).collect(),
        jobs,
        replica_overrides: Default::default(),
        intra_replica_placement: PlacementRules::none(),
        inter_replica_placement: PlacementRules::inter_replica_default(),
    }
}

fn pools() -> Vec<PoolSpec> {
    let mut e = pool("e", PackingStrategy::Binpack, ScaleOut::Elastic);
    e.candidate_instance_types = vec![itype("m", 100.0, 16, &[]), itype("g", 100.0, 16, &["gpu"])];
    vec![e, pool("f", PackingStrategy::Binpack, ScaleOut::Fixed)]
}

#[test]
fn a_well_formed_bundle_has_no_validation_errors() {
    assert_eq!(
        validate_bundle(&bundle(vec![job("a", 10.0)], &["e", "f"], 2), &pools(), &[]),
        vec![]
    );
}

#[test]
fn static_validation_lists_every_problem() {
    let mut a = job("a", f64::NAN);
    a.co_locate_with = vec!["ghost".into()];
    let mut b = bundle(vec![a, job("a", 1.0), job("", 1.0)], &["e", "nope", "e"], 0);
    b.replica_overrides.insert(
        3,
        ReplicaOverride {
            pools: vec!["other".into()],
        },
    );
    b.inter_replica_placement.same_zone = Some(Strength::Hard);
    b.inter_replica_placement.different_zone = Some(Strength::Hard);
    b.bundle_id = String::new();
    let errors = validate_bundle(&b, &pools(), &[]);
    let kinds: Vec<String> = errors
        .iter()
        .map(|e| {
            serde_json::to_value(e).unwrap()["kind"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    for k in [
        "emptyBundleId",
        "replicaCount",
        "duplicateJobName",
        "emptyJobName",
        "invalidRequirement",
        "unknownJobReference",
        "contradictoryRules",
        "overrideOutOfRange",
        "unknownPool",
        "duplicatePool",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
    }
    assert!(errors.iter().all(|e| !e.to_string().is_empty()));
}

#[test]
fn capabilities_must_be_offered_by_some_type_or_node_of_the_pools() {
    let mut j = job("a", 10.0);
    j.requirements.required_capabilities = vec!["gpu".into()];
    assert_eq!(
        validate_bundle(&bundle(vec![j.clone()], &["e"], 1), &pools(), &[]),
        vec![]
    );
    let errors = validate_bundle(&bundle(vec![j.clone()], &["f"], 1), &pools(), &[]);
    assert!(
        matches!(errors[0], ValidationError::UnsatisfiableCapabilities { .. }),
        "{errors:?}"
    );
    let mut n = node("n", "f", "a", 100.0, 0.0);
    n.capabilities = vec!["gpu".into()];
    assert_eq!(
        validate_bundle(&bundle(vec![j], &["f"], 1), &pools(), &[n]),
        vec![]
    );
}

#[test]
fn a_group_bigger_than_any_node_never_fits() {
    let mut a = job("a", 60.0);
    a.co_locate_with = vec!["b".into()];
    let errors = validate_bundle(&bundle(vec![a, job("b", 60.0)], &["e"], 1), &pools(), &[]);
    assert!(
        matches!(errors[0], ValidationError::NeverFits { .. }),
        "{errors:?}"
    );
}

#[test]
fn separation_inside_a_co_location_group_is_contradictory() {
    let mut a = job("a", 1.0);
    a.co_locate_with = vec!["b".into()];
    let mut b = job("b", 1.0);
    b.co_locate_with = vec!["c".into()];
    let mut c = job("c", 1.0);
    c.separate_from = vec!["a".into()];
    let errors = validate_bundle(&bundle(vec![a, b, c], &["e"], 1), &pools(), &[]);
    assert!(
        matches!(errors[0], ValidationError::ContradictoryPlacement { .. }),
        "{errors:?}"
    );
}

#[test]
fn admission_is_ok_when_every_replica_places() {
    let e = engine(
        pools(),
        vec![
            node("f1", "f", "a", 100.0, 0.0),
            node("f2", "f", "b", 100.0, 0.0),
        ],
    );
    let before = e.node_views();
    assert_eq!(
        validate_admission(&bundle(vec![job("a", 60.0)], &["f"], 2), &e, 0),
        AdmissionResult::Ok
    );
    assert_eq!(
        e.node_views(),
        before,
        "admission must not change the engine"
    );
}

#[test]
fn admission_reports_no_capacity_per_replica_and_job() {
    let e = engine(pools(), vec![node("f1", "f", "a", 100.0, 0.0)]);
    // Two replicas must be on different nodes; the fixed pool has one.
    let r = validate_admission(&bundle(vec![job("a", 60.0)], &["f"], 2), &e, 0);
    let AdmissionResult::NoCapacity { unplaceable } = r else {
        panic!("{r:?}")
    };
    assert_eq!(unplaceable.len(), 1);
    assert_eq!(
        (
            unplaceable[0].replica_index,
            unplaceable[0].job_name.as_str()
        ),
        (1, "a")
    );
}

#[test]
fn admission_counts_elastic_provisioning_as_capacity() {
    let e = engine(pools(), vec![]);
    assert_eq!(
        validate_admission(&bundle(vec![job("a", 60.0)], &["e"], 3), &e, 0),
        AdmissionResult::Ok
    );
    assert_eq!(e.node_count(), 0);
}

#[test]
fn admission_returns_validation_errors_first() {
    let e = engine(pools(), vec![]);
    let r = validate_admission(&bundle(vec![job("a", 1.0)], &["zzz"], 1), &e, 0);
    assert!(
        matches!(r, AdmissionResult::ValidationErrors { .. }),
        "{r:?}"
    );
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["kind"], "validationErrors");
}

#[test]
fn the_traced_admission_gives_one_decision_per_replica_and_the_same_answer() {
    let e = engine(pools(), vec![node("f1", "f", "a", 100.0, 0.0)]);
    let b = bundle(vec![job("a", 60.0)], &["f"], 2);
    let (result, decisions) = crate::validate_admission_traced(&b, &e, 0);
    assert_eq!(result, validate_admission(&b, &e, 0));
    assert_eq!(decisions.len(), 2);
    assert_eq!(decisions[1].replica_index, 1);
    let (invalid, none) =
        crate::validate_admission_traced(&bundle(vec![job("a", 1.0)], &["zzz"], 1), &e, 0);
    assert!(matches!(invalid, AdmissionResult::ValidationErrors { .. }));
    assert!(none.is_empty());
}
