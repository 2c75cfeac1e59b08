//! Property tests of the plugin's pure parts: whatever a person types or a file holds, they
//! answer (never panic), and what they accept reads back the same.

use std::path::Path;
use std::sync::LazyLock;
use std::time::Duration;

use automanager_cli::actions::parse_job_ref;
use automanager_cli::error::{humantime, parse_duration};
use automanager_cli::input::parse_documents;
use automanager_cli::render::bar;
use automanager_cli::schema::Schemas;
use automanager_cli::validate::validate;
use proptest::prelude::*;

// Compiled once: a schema compile per case would dominate the run.
#[allow(clippy::expect_used)]
static SCHEMAS: LazyLock<Schemas> = LazyLock::new(|| Schemas::load().expect("schemas"));

proptest! {
    #[test]
    fn a_printed_duration_parses_back(secs in 0u64..7 * 24 * 3600) {
        let d = Duration::from_secs(secs);
        prop_assert_eq!(parse_duration(&humantime(d)), Ok(d));
    }

    #[test]
    fn any_duration_text_gets_an_answer(text in "\\PC{0,12}") {
        let _ = parse_duration(&text);
    }

    #[test]
    fn bars_have_ten_cells_and_a_percentage(used in any::<f64>(), total in any::<f64>()) {
        let b = bar(used, total);
        prop_assert_eq!(b.chars().filter(|c| *c == '█' || *c == '░').count(), 10);
        prop_assert!(b.ends_with('%'));
    }

    #[test]
    fn job_refs_parse_back(bundle in "[a-z][a-z0-9.-]{0,20}", replica in 0i32..16, job in "[a-z][a-z0-9-]{0,20}") {
        let r = parse_job_ref(&format!("{bundle}/{replica}/{job}")).expect("well-formed");
        prop_assert_eq!((r.bundle, r.replica, r.job), (bundle, replica, job));
    }

    #[test]
    fn any_job_ref_text_gets_an_answer(text in "\\PC{0,40}") {
        let _ = parse_job_ref(&text);
    }

    /// Bundles with arbitrary values where the schema and the engine look: every object gets
    /// a report, every problem a field path.
    #[test]
    fn any_bundle_gets_a_report_with_paths(
        replicas in prop_oneof![Just(serde_json::json!(2)), any::<i64>().prop_map(serde_json::Value::from), Just(serde_json::json!("two"))],
        capacity in prop_oneof![any::<i64>().prop_map(serde_json::Value::from), any::<f64>().prop_map(|f| serde_json::json!(f)), Just(serde_json::Value::Null)],
        pools in proptest::collection::vec("[a-z-]{0,8}", 0..4),
        names in proptest::collection::vec("[a-zA-Z_-]{0,6}", 1..4),
        refs in proptest::collection::vec("[a-z]{0,3}", 0..3),
    ) {
        let jobs: Vec<serde_json::Value> = names.iter().map(|n| serde_json::json!({
            "jobName": n,
            "coLocateWith": refs,
            "requirements": {"requiredCapacity": capacity, "priorityBand": "gold"}
        })).collect();
        let bundle = serde_json::json!({
            "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "b"},
            "spec": {"replicas": replicas, "pools": pools, "jobs": jobs}
        });
        let pool = "apiVersion: automanager.norsk.io/v1alpha1\nkind: PlacementPool\nmetadata: {name: aws-east}\nspec: {kind: aws, region: r, scaleOut: elastic, candidateInstanceTypes: [{instanceType: t, totalCapacity: 100, totalCores: 16}]}\n";
        let objects = parse_documents(Path::new("b.json"), &bundle.to_string()).expect("an object");
        let pools = parse_documents(Path::new("p.yaml"), pool).expect("a pool");
        let report = validate(&objects, &pools, "default", &SCHEMAS);
        prop_assert_eq!(report.objects.len(), 1);
        let o = &report.objects[0];
        prop_assert_eq!(o.valid, o.errors.is_empty());
        for e in &o.errors {
            prop_assert!(!e.path.is_empty() && !e.message.is_empty());
        }
    }
}
