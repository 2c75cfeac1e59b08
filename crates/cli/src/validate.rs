//! `validate`: offline checks of Bundles (and the other kinds) with the operator's own code,
//! no cluster needed.
//!
//! Every object is checked against its CRD schema ([`crate::schema`]); every Bundle then goes
//! through the placement engine's static validation (`validate_bundle`, the operator's
//! `InvalidSpec` check) against the PlacementPools given, converted from the CRD exactly as
//! the operator converts it. Each problem carries the field path it is about.

use std::collections::{BTreeMap, BTreeSet};

use automanager_api as api;
use automanager_placement as pl;
use serde::Serialize;

use crate::engine;
use crate::input::SourceObject;
use crate::schema::{FieldProblem, Schemas};

/// The outcome for one object.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReport {
    /// Where it was read from (`file` or `file#2`).
    pub origin: String,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    pub valid: bool,
    pub errors: Vec<FieldProblem>,
}

/// The outcome of a `validate` run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Every object is valid.
    pub valid: bool,
    pub objects: Vec<ObjectReport>,
    /// Objects that are not AutoManager kinds (left to the apiserver), by origin.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// What could not be checked, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

/// Checks `objects` (from `-f`) with the pools of `pool_objects` (from `--pools`) and the
/// PlacementPools among `objects`. `default_namespace` fills in a namespaced object's missing
/// namespace, as kubectl does.
pub fn validate(
    objects: &[SourceObject],
    pool_objects: &[SourceObject],
    default_namespace: &str,
    schemas: &Schemas,
) -> Report {
    let mut reports = Vec::new();
    let mut skipped = Vec::new();
    let mut notes = Vec::new();

    // Pools: from --pools and from -f, each checked like any object.
    let mut pools: BTreeMap<String, pl::PoolSpec> = BTreeMap::new();
    let mut pool_reports = Vec::new();
    for obj in pool_objects.iter().chain(objects) {
        if obj.kind() == "PlacementPool" && is_ours(obj) {
            let (report, spec) = check_pool(obj, schemas);
            if let Some(spec) = spec {
                pools.insert(spec.name.clone(), spec);
            }
            pool_reports.push((obj.origin.clone(), report));
        }
    }
    let pools_given = !pools.is_empty();
    if !pools_given {
        notes.push(
            "no PlacementPools given (--pools FILE, or pools among -f): pool names and whether jobs fit were not checked"
                .into(),
        );
    }
    let pool_list: Vec<pl::PoolSpec> = pools.values().cloned().collect();

    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    for obj in objects {
        if !is_ours(obj) {
            skipped.push(format!(
                "{} ({} {})",
                obj.origin,
                nonempty(obj.api_version(), "no apiVersion"),
                nonempty(obj.kind(), "no kind")
            ));
            continue;
        }
        let kind = obj.kind().to_owned();
        let namespaced = matches!(kind.as_str(), "Bundle" | "Migration");
        let namespace = namespaced.then(|| obj.namespace().unwrap_or(default_namespace).to_owned());
        let mut report = if kind == "PlacementPool" {
            match pool_reports.iter().find(|(o, _)| *o == obj.origin) {
                Some((_, r)) => r.clone(),
                None => check_pool(obj, schemas).0,
            }
        } else {
            let mut r = base_report(obj, schemas);
            if kind == "Bundle" && r.errors.is_empty() {
                r.errors.extend(check_bundle(
                    obj,
                    namespace.as_deref().unwrap_or(default_namespace),
                    &pool_list,
                    pools_given,
                ));
            }
            r
        };
        report.namespace = namespace.clone();
        let key = (
            kind.clone(),
            namespace.unwrap_or_default(),
            report.name.clone(),
        );
        if !report.name.is_empty() && !seen.insert(key) {
            report.errors.push(FieldProblem {
                path: "metadata.name".into(),
                message: format!(
                    "another {kind} named {:?} comes earlier in the input; the later one would replace it",
                    report.name
                ),
            });
        }
        report.valid = report.errors.is_empty();
        reports.push(report);
    }
    if reports.is_empty() && skipped.is_empty() {
        notes.push("the input holds no objects".into());
    }
    Report {
        valid: reports.iter().all(|r| r.valid),
        objects: reports,
        skipped,
        notes,
    }
}

fn nonempty<'a>(s: &'a str, otherwise: &'a str) -> &'a str {
    if s.is_empty() { otherwise } else { s }
}

fn is_ours(obj: &SourceObject) -> bool {
    obj.api_version()
        .split_once('/')
        .is_some_and(|(group, _)| group == api::GROUP)
}

/// apiVersion, kind, name and the schema.
fn base_report(obj: &SourceObject, schemas: &Schemas) -> ObjectReport {
    let mut errors = Vec::new();
    let expected = format!("{}/{}", api::GROUP, api::VERSION);
    if obj.api_version() != expected {
        errors.push(FieldProblem {
            path: "apiVersion".into(),
            message: format!(
                "{:?} is not served; AutoManager objects are {expected}",
                obj.api_version()
            ),
        });
    } else if !schemas.knows(obj.kind()) {
        errors.push(FieldProblem {
            path: "kind".into(),
            message: format!(
                "{:?} is not an AutoManager kind (Bundle, PlacementPool, HotSpareTarget, Migration, ManagerNode)",
                obj.kind()
            ),
        });
    } else {
        if obj.name().is_empty() {
            errors.push(FieldProblem {
                path: "metadata.name".into(),
                message: "is required".into(),
            });
        }
        errors.extend(schemas.check(obj.kind(), &obj.value));
    }
    ObjectReport {
        origin: obj.origin.clone(),
        kind: obj.kind().to_owned(),
        namespace: None,
        name: obj.name().to_owned(),
        valid: errors.is_empty(),
        errors,
    }
}

/// A pool's schema, then the engine's own check of it.
fn check_pool(obj: &SourceObject, schemas: &Schemas) -> (ObjectReport, Option<pl::PoolSpec>) {
    let mut report = base_report(obj, schemas);
    if !report.errors.is_empty() {
        return (report, None);
    }
    let pool: api::PlacementPool = match serde_json::from_value(obj.value.clone()) {
        Ok(p) => p,
        Err(e) => {
            report.errors.push(FieldProblem {
                path: "spec".into(),
                message: e.to_string(),
            });
            return (report, None);
        }
    };
    let spec = engine::pool(obj.name(), &pool.spec);
    let mut probe = pl::Engine::empty(pl::DEFAULT_PENDING_WINDOW_MS);
    if let Err(e) = probe.upsert_pool(spec.clone()) {
        report.errors.push(FieldProblem {
            path: "spec".into(),
            message: e.to_string(),
        });
        return (report, None);
    }
    (report, Some(spec))
}

/// The engine's static validation of a bundle, with field paths.
fn check_bundle(
    obj: &SourceObject,
    namespace: &str,
    pools: &[pl::PoolSpec],
    pools_given: bool,
) -> Vec<FieldProblem> {
    let bundle: api::Bundle = match serde_json::from_value(obj.value.clone()) {
        Ok(b) => b,
        Err(e) => {
            return vec![FieldProblem {
                path: "spec".into(),
                message: e.to_string(),
            }];
        }
    };
    let spec = engine::bundle(namespace, obj.name(), &bundle.spec);
    let known: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
    pl::validate_bundle(&spec, pools, &[])
        .into_iter()
        .filter(|e| pools_given || !matches!(e, pl::ValidationError::UnknownPool { .. }))
        .map(|e| {
            let mut message = e.to_string();
            if let pl::ValidationError::UnknownPool { .. } = &e {
                message.push_str(&format!(" (known: {})", known.join(", ")));
            }
            FieldProblem {
                path: field_path_of(&e, &bundle.spec),
                message,
            }
        })
        .collect()
}

/// Where in a Bundle's YAML a validation error points.
pub fn field_path_of(e: &pl::ValidationError, spec: &api::BundleSpec) -> String {
    use pl::ValidationError as E;
    let job_index = |name: &str| spec.jobs.iter().position(|j| j.job_name == name);
    let job = |name: &str, rest: &str| match job_index(name) {
        Some(i) => format!("spec.jobs[{i}]{rest}"),
        None => "spec.jobs".to_owned(),
    };
    let pool_path = |pool: &str, replica: Option<u32>, nth: usize| -> String {
        let (base, list) = match replica {
            None => ("spec.pools".to_owned(), spec.pools.as_slice()),
            Some(r) => match spec
                .replica_overrides
                .iter()
                .position(|o| u32::try_from(o.replica).ok() == Some(r))
            {
                Some(i) => (
                    format!("spec.replicaOverrides[{i}].pools"),
                    spec.replica_overrides[i].pools.as_slice(),
                ),
                None => return "spec.replicaOverrides".into(),
            },
        };
        match list.iter().enumerate().filter(|(_, p)| *p == pool).nth(nth) {
            Some((i, _)) => format!("{base}[{i}]"),
            None => base,
        }
    };
    match e {
        E::EmptyBundleId => "metadata.name".into(),
        E::ReplicaCount { .. } => "spec.replicas".into(),
        E::NoJobs | E::TooManyJobs { .. } => "spec.jobs".into(),
        E::EmptyJobName { index } => format!("spec.jobs[{index}].jobName"),
        E::DuplicateJobName { job: name } => {
            match spec
                .jobs
                .iter()
                .enumerate()
                .filter(|(_, j)| &j.job_name == name)
                .nth(1)
            {
                Some((i, _)) => format!("spec.jobs[{i}].jobName"),
                None => "spec.jobs".into(),
            }
        }
        E::InvalidRequirement {
            job: name, field, ..
        } => job(name, &format!(".requirements.{field}")),
        E::UnknownJobReference {
            job: name,
            field,
            target,
        } => {
            let list = job_index(name).map(|i| {
                let j = &spec.jobs[i];
                if field == "coLocateWith" {
                    &j.co_locate_with
                } else {
                    &j.separate_from
                }
            });
            match list.and_then(|l| l.iter().position(|t| t == target)) {
                Some(k) => job(name, &format!(".{field}[{k}]")),
                None => job(name, &format!(".{field}")),
            }
        }
        E::ContradictoryPlacement { job: name, .. } => job(name, ".separateFrom"),
        E::ContradictoryRules { scope, .. } => format!("spec.{scope}Placement"),
        E::NoPools { .. } => "spec.pools".into(),
        E::UnknownPool { pool, replica } => pool_path(pool, *replica, 0),
        E::DuplicatePool { pool, replica } => pool_path(pool, *replica, 1),
        E::OverrideOutOfRange { index, .. } => match spec
            .replica_overrides
            .iter()
            .position(|o| u32::try_from(o.replica).ok() == Some(*index))
        {
            Some(i) => format!("spec.replicaOverrides[{i}].replica"),
            None => "spec.replicaOverrides".into(),
        },
        E::UnsatisfiableCapabilities { job: name, .. } => {
            job(name, ".requirements.requiredCapabilities")
        }
        E::NeverFits { job: name, .. } => job(name, ".requirements"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::parse_documents;
    use std::path::Path;

    fn objs(text: &str) -> Vec<SourceObject> {
        parse_documents(Path::new("in.yaml"), text).expect("parses")
    }

    const POOL: &str = "apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {name: aws-east}
spec:
  kind: aws
  region: eu-west-1
  scaleOut: elastic
  candidateInstanceTypes:
    - {instanceType: m5.xlarge, totalCapacity: 100, totalCores: 16}
";

    fn bundle(jobs: &str, extra: &str) -> String {
        format!(
            "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: news}}\nspec:\n  replicas: 2\n  pools: [aws-east]\n  jobs:\n{jobs}{extra}"
        )
    }

    const ENCODE: &str =
        "    - {jobName: encode, requirements: {requiredCapacity: 40, priorityBand: gold}}\n";

    #[test]
    fn a_bundle_that_fits_its_pools_is_valid() {
        let s = Schemas::load().expect("schemas");
        let r = validate(&objs(&bundle(ENCODE, "")), &objs(POOL), "default", &s);
        assert!(r.valid, "{r:#?}");
        assert_eq!(r.objects[0].namespace.as_deref(), Some("default"));
        assert!(r.notes.is_empty());
    }

    #[test]
    fn engine_errors_point_at_their_field() {
        let s = Schemas::load().expect("schemas");
        let jobs = "    - {jobName: encode, requirements: {requiredCapacity: 400, priorityBand: gold}}\n    - {jobName: pack, requirements: {requiredCapacity: 1, requiredCapabilities: [gpu], priorityBand: bronze}}\n";
        let extra = "  replicaOverrides:\n    - {replica: 1, pools: [aws-east, oci-fra]}\n";
        let r = validate(&objs(&bundle(jobs, extra)), &objs(POOL), "default", &s);
        assert!(!r.valid);
        let paths: Vec<&str> = r.objects[0]
            .errors
            .iter()
            .map(|e| e.path.as_str())
            .collect();
        assert!(
            paths.contains(&"spec.replicaOverrides[0].pools[1]"),
            "{paths:?}"
        );
        let unknown = r.objects[0]
            .errors
            .iter()
            .find(|e| e.path == "spec.replicaOverrides[0].pools[1]")
            .expect("unknown pool");
        assert!(
            unknown.message.ends_with("(known: aws-east)"),
            "{unknown:?}"
        );
    }

    #[test]
    fn the_crds_cel_rules_and_list_keys_are_checked_offline_in_the_apiservers_words() {
        let s = Schemas::load().expect("schemas");
        assert!(s.cel_rules("Bundle") >= 10, "{}", s.cel_rules("Bundle"));
        let jobs = "    - {jobName: encode, coLocateWith: [encode], requirements: {requiredCapacity: 4, requiredCapabilities: [gpu, gpu], priorityBand: gold}}\n";
        let extra = "  disruption: {maxUnavailableReplicas: 3}\n  replicaOverrides:\n    - {replica: 1, pools: [aws-east]}\n    - {replica: 1, pools: [aws-east]}\n";
        let r = validate(&objs(&bundle(jobs, extra)), &objs(POOL), "default", &s);
        let problems: Vec<String> = r.objects[0]
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.path, e.message))
            .collect();
        assert!(
            problems
                .contains(&"spec.replicaOverrides[1]: Duplicate value: {\"replica\":1}".to_owned()),
            "{problems:#?}"
        );
        // The rules run once the lists' keys are right, as at the apiserver.
        let extra = "  disruption: {maxUnavailableReplicas: 3}\n";
        let r = validate(&objs(&bundle(jobs, extra)), &objs(POOL), "default", &s);
        let problems: Vec<String> = r.objects[0]
            .errors
            .iter()
            .map(|e| format!("{}: {}", e.path, e.message))
            .collect();
        for expected in [
            "spec.jobs[0].coLocateWith: Invalid value: \"object\": a job cannot list itself in coLocateWith",
            "spec.jobs[0].requirements.requiredCapabilities: Invalid value: \"array\": requiredCapabilities must not repeat a capability",
            "spec.disruption.maxUnavailableReplicas: Invalid value: \"object\": disruption.maxUnavailableReplicas must not exceed replicas",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(expected)),
                "{expected}\nnot in {problems:#?}"
            );
        }
    }

    #[test]
    fn fit_is_checked_once_references_are_right() {
        let s = Schemas::load().expect("schemas");
        let jobs = "    - {jobName: encode, requirements: {requiredCapacity: 400, priorityBand: gold}}\n    - {jobName: pack, requirements: {requiredCapacity: 1, requiredCapabilities: [gpu], priorityBand: bronze}}\n";
        let r = validate(&objs(&bundle(jobs, "")), &objs(POOL), "default", &s);
        let paths: Vec<&str> = r.objects[0]
            .errors
            .iter()
            .map(|e| e.path.as_str())
            .collect();
        assert!(paths.contains(&"spec.jobs[0].requirements"), "{paths:?}");
        assert!(
            paths.contains(&"spec.jobs[1].requirements.requiredCapabilities"),
            "{paths:?}"
        );
    }

    #[test]
    fn without_pools_pool_names_are_not_judged_but_a_note_says_so() {
        let s = Schemas::load().expect("schemas");
        let r = validate(&objs(&bundle(ENCODE, "")), &[], "default", &s);
        assert!(r.valid, "{r:#?}");
        assert_eq!(r.notes.len(), 1);
    }

    #[test]
    fn other_apis_are_skipped_and_a_duplicate_name_is_an_error() {
        let s = Schemas::load().expect("schemas");
        let text = format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n---\n{}---\n{}",
            bundle(ENCODE, ""),
            bundle(ENCODE, "")
        );
        let r = validate(&objs(&text), &objs(POOL), "default", &s);
        assert_eq!(r.skipped, ["in.yaml (v1 ConfigMap)"]);
        assert!(r.objects[0].valid);
        assert!(!r.objects[1].valid);
        assert_eq!(r.objects[1].errors[0].path, "metadata.name");
    }

    #[test]
    fn a_wrong_version_or_kind_is_named() {
        let s = Schemas::load().expect("schemas");
        let text = "apiVersion: automanager.norsk.io/v1\nkind: Bundle\nmetadata: {name: a}\n---\napiVersion: automanager.norsk.io/v1alpha1\nkind: Bundel\nmetadata: {name: b}\n";
        let r = validate(&objs(text), &[], "default", &s);
        assert_eq!(r.objects[0].errors[0].path, "apiVersion");
        assert_eq!(r.objects[1].errors[0].path, "kind");
    }
}
