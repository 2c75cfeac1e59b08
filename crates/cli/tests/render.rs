//! The plugin's human output, pinned with snapshots on fixed inputs. The traces come from the
//! real placement engine over a fixed cluster, so the snapshots also show what a person sees
//! for real decisions: a pool left with rejections, a spill, a soft rule broken, a provision,
//! an unplaceable job.

use std::collections::BTreeMap;
use std::path::Path;

use automanager_api as api;
use automanager_cli::render::{self, trace::*, whatif::WhatIf};
use automanager_placement as pl;
use chrono::{TimeZone, Utc};

fn pool(name: &str, scale: pl::ScaleOut, zones: &[&str]) -> pl::PoolSpec {
    pl::PoolSpec {
        name: name.into(),
        kind: pl::PoolKind::Aws,
        region: "eu-west-1".into(),
        zones: zones.iter().map(|z| z.to_string()).collect(),
        packing_strategy: pl::PackingStrategy::Binpack,
        scale_out: scale,
        candidate_instance_types: vec![pl::InstanceTypeSpec {
            instance_type: "m5.xlarge".into(),
            total_capacity: 100.0,
            total_cores: 16,
            capabilities: vec![],
        }],
        max_nodes: Some(4),
        terminating: false,
    }
}

fn node(id: &str, pool: &str, zone: &str, used: f64, cordoned: bool) -> pl::NodeSpec {
    let mut n = pl::NodeSpec::ready(id, pool, Some(zone), 100.0, 16);
    n.used_capacity = used;
    n.cordoned = cordoned;
    n
}

/// A fixed cluster: `onprem` (fixed, nearly full, one node cordoned), `aws-east` (elastic).
fn engine() -> pl::Engine {
    let snapshot = pl::ClusterSnapshot {
        pools: vec![
            pool("onprem", pl::ScaleOut::Fixed, &["rack-a", "rack-b"]),
            pool(
                "aws-east",
                pl::ScaleOut::Elastic,
                &["eu-west-1a", "eu-west-1b"],
            ),
        ],
        nodes: vec![
            node("onprem-a1", "onprem", "rack-a", 90.0, false),
            node("onprem-a2", "onprem", "rack-a", 0.0, true),
            node("onprem-b1", "onprem", "rack-b", 95.0, false),
            node("aws-east-1", "aws-east", "eu-west-1a", 40.0, false),
            node("aws-east-2", "aws-east", "eu-west-1b", 10.0, false),
        ],
        ..pl::ClusterSnapshot::default()
    };
    pl::Engine::new(snapshot).expect("valid cluster")
}

fn bundle(jobs: Vec<pl::JobSpec>) -> pl::BundleSpec {
    pl::BundleSpec {
        bundle_id: "video.news".into(),
        replicas: 2,
        pools: vec!["onprem".into(), "aws-east".into()],
        jobs,
        replica_overrides: Default::default(),
        intra_replica_placement: pl::PlacementRules::none(),
        inter_replica_placement: pl::PlacementRules::inter_replica_default(),
    }
}

/// Both replicas of a two-job bundle placed in order, as the operator places them.
fn placed_trace() -> BundleTrace {
    let mut e = engine();
    let b = bundle(vec![
        pl::JobSpec::new("encode", 30.0, 4, pl::PriorityBand::Gold),
        pl::JobSpec::new("package", 10.0, 2, pl::PriorityBand::Gold),
    ]);
    let mut positions = Vec::new();
    let mut replicas = Vec::new();
    for r in 0..2 {
        let d = e.place(
            &b.request_for_replica(r, pl::PlacementKind::First, positions.clone()),
            0,
        );
        if let pl::Outcome::Placed { assignments, .. } = &d.outcome {
            positions.extend(assignments.iter().map(|a| pl::Position {
                node: a.node.clone(),
                zone: a.zone.clone(),
            }));
        }
        e.commit(&d).expect("commit");
        replicas.push(ReplicaTrace {
            replica: r,
            decided_at: Some(format!("2026-11-01T10:00:0{r}Z")),
            leader: None,
            recovery: false,
            decision: d,
            preempted: None,
        });
    }
    BundleTrace {
        namespace: "video".into(),
        bundle: "news".into(),
        bundle_id: "video.news".into(),
        replicas,
    }
}

fn view(wide: bool) -> TraceView {
    TraceView {
        packing: BTreeMap::from([
            ("onprem".to_string(), "binpack".to_string()),
            ("aws-east".to_string(), "binpack".to_string()),
        ]),
        wide,
        ..TraceView::default()
    }
}

#[test]
fn trace_of_a_bundle_that_spilled_to_its_second_pool() {
    insta::assert_snapshot!(render::trace::render(&placed_trace(), &view(false)));
}

#[test]
fn trace_of_a_recovery_that_preempted_bronze_jobs() {
    let mut t = placed_trace();
    t.replicas.truncate(1);
    t.replicas[0].recovery = true;
    t.replicas[0].preempted = Some(automanager_api::Preemption {
        at: chrono::DateTime::parse_from_rfc3339("2026-11-01T10:00:00Z")
            .expect("time")
            .to_utc(),
        node: "aws-east-1".into(),
        victims: vec!["video.cheap/0/enc".into(), "video.cheaper/0/enc".into()],
    });
    let text = render::trace::render(&t, &view(false));
    assert!(text.contains("preempted: no capacity and no hot spare, so bronze job(s) video.cheap/0/enc, video.cheaper/0/enc on node aws-east-1"), "{text}");
    insta::assert_snapshot!(text);
}

#[test]
fn trace_wide_adds_reservations() {
    insta::assert_snapshot!(render::trace::render(&placed_trace(), &view(true)));
}

#[test]
fn trace_of_one_job_of_one_replica() {
    let v = TraceView {
        replica: Some(1),
        job: Some("package".into()),
        ..view(false)
    };
    let t = placed_trace().filtered(&v).expect("found");
    insta::assert_snapshot!(render::trace::render(&t, &v));
}

#[test]
fn a_filter_that_matches_nothing_says_what_exists() {
    let t = placed_trace();
    let e = t
        .filtered(&TraceView {
            replica: Some(7),
            ..TraceView::default()
        })
        .expect_err("no replica 7");
    assert_eq!(
        e,
        "bundle video/news has no decision for replica 7 (replicas with one: 0, 1)"
    );
    let e = t
        .filtered(&TraceView {
            job: Some("mux".into()),
            ..TraceView::default()
        })
        .expect_err("no job mux");
    assert_eq!(e, "no decision of bundle video/news mentions job \"mux\"");
}

#[test]
fn trace_of_a_provision_and_an_unplaceable_replica() {
    let e = engine();
    let big = bundle(vec![pl::JobSpec::new(
        "encode",
        95.0,
        4,
        pl::PriorityBand::Silver,
    )]);
    let provision = e.place(
        &big.request_for_replica(0, pl::PlacementKind::First, vec![]),
        0,
    );
    let huge = bundle(vec![
        pl::JobSpec::new("encode", 300.0, 4, pl::PriorityBand::Bronze),
        pl::JobSpec::new("thumbs", 1.0, 1, pl::PriorityBand::Bronze),
    ]);
    let unplaceable = e.place(
        &huge.request_for_replica(0, pl::PlacementKind::First, vec![]),
        0,
    );
    let t = BundleTrace {
        namespace: "video".into(),
        bundle: "news".into(),
        bundle_id: "video.news".into(),
        replicas: vec![
            ReplicaTrace {
                replica: 0,
                decided_at: None,
                leader: None,
                recovery: true,
                decision: provision,
                preempted: None,
            },
            ReplicaTrace {
                replica: 1,
                decided_at: None,
                leader: None,
                recovery: false,
                decision: unplaceable,
                preempted: None,
            },
        ],
    };
    insta::assert_snapshot!(render::trace::render(&t, &view(false)));
}

#[test]
fn the_trace_json_of_the_operator_reads_back() {
    let t = placed_trace();
    let text = serde_json::to_string(&t).expect("json");
    let back: BundleTrace = serde_json::from_str(&text).expect("reads");
    assert_eq!(back, t);
}

fn bundle_spec() -> api::BundleSpec {
    serde_saphyr::from_str(
        "replicas: 2\npools: [onprem]\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 50, priorityBand: gold}}\n",
    )
    .expect("spec")
}

#[test]
fn what_if_answers() {
    let e = engine();
    let mut b = bundle(vec![pl::JobSpec::new(
        "encode",
        50.0,
        4,
        pl::PriorityBand::Gold,
    )]);
    b.pools = vec!["onprem".into()];
    let no_capacity = WhatIf {
        result: pl::validate_admission(&b, &e, 0),
        decisions: vec![e.place(
            &b.request_for_replica(0, pl::PlacementKind::First, vec![]),
            0,
        )],
    };
    let mut bad = b.clone();
    bad.pools.push("oci-fra".into());
    let invalid = WhatIf {
        result: pl::validate_admission(&bad, &e, 0),
        decisions: vec![],
    };
    let ok = WhatIf {
        result: pl::AdmissionResult::Ok,
        decisions: vec![],
    };
    let spec = bundle_spec();
    let mut spec_bad = spec.clone();
    spec_bad.pools.push("oci-fra".into());
    let text = format!(
        "{}\n{}\n{}",
        render::whatif::render("video/news", &no_capacity, &spec, &view(false)),
        render::whatif::render("video/news", &invalid, &spec_bad, &view(false)),
        render::whatif::render("video/news", &ok, &spec, &view(false)),
    );
    insta::assert_snapshot!(text);
    assert!(!no_capacity.fits() && !invalid.fits() && ok.fits());
}

#[test]
fn what_if_json_reads_with_and_without_decisions() {
    let old: WhatIf = serde_json::from_str(r#"{"kind": "ok"}"#).expect("ok");
    assert!(old.fits());
    let nc: WhatIf = serde_json::from_str(
        r#"{"kind": "noCapacity", "unplaceable": [{"replicaIndex": 1, "jobName": "encode", "reason": "no node fits"}], "decisions": []}"#,
    )
    .expect("noCapacity");
    assert!(!nc.fits());
}

fn objects<T: serde::de::DeserializeOwned>(yaml: &str) -> Vec<T> {
    serde_saphyr::from_multiple(yaml).expect("objects")
}

const NODES: &str = r#"
apiVersion: automanager.norsk.io/v1alpha1
kind: ManagerNode
metadata: {name: aws-east-1}
spec: {cordoned: false}
status: {nodeId: aws-east-1, pool: aws-east, zone: eu-west-1a, instanceType: m5.xlarge, state: started,
         totalCapacity: 100, usedCapacity: 70, totalCores: 16, usedCores: 12, capabilities: [norsk.io/job-socket],
         jobs: [{jobId: video.news/0/encode, capacity: 40}, {jobId: video.sport/0/encode, capacity: 30}]}
---
apiVersion: automanager.norsk.io/v1alpha1
kind: ManagerNode
metadata: {name: aws-east-2}
spec: {cordoned: true, drain: {mode: migrate}}
status: {nodeId: aws-east-2, pool: aws-east, zone: eu-west-1b, instanceType: m5.xlarge, state: started,
         totalCapacity: 100, usedCapacity: 10, totalCores: 16, usedCores: 2, healthy: false,
         jobs: [{jobId: video.news/1/encode, capacity: 10}]}
---
apiVersion: automanager.norsk.io/v1alpha1
kind: ManagerNode
metadata: {name: aws-east-3}
spec: {}
status: {nodeId: aws-east-3, pool: aws-east, zone: eu-west-1a, instanceType: m5.xlarge, state: started,
         totalCapacity: 100, usedCapacity: 0, totalCores: 16, usedCores: 0, spare: true, spareBand: gold}
---
apiVersion: automanager.norsk.io/v1alpha1
kind: ManagerNode
metadata: {name: onprem-a1}
spec: {}
status: {nodeId: onprem-a1, pool: onprem, zone: rack-a, state: started, totalCapacity: 200, usedCapacity: 200,
         totalCores: 32, usedCores: 32, capabilities: [sdi-capture]}
---
apiVersion: automanager.norsk.io/v1alpha1
kind: ManagerNode
metadata: {name: aws-east-4}
spec: {}
status: {nodeId: aws-east-4, pool: aws-east, zone: eu-west-1b, state: starting, totalCapacity: 100, totalCores: 16}
"#;

const POOLS: &str = r#"
apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {name: aws-east}
spec: {kind: aws, region: eu-west-1, scaleOut: elastic, candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 100, totalCores: 16}]}
status: {nodeCount: 4, liveSpares: 1, spareTarget: 2, usedCapacityFraction: 0.267,
         conditions: [{type: Ready, status: "True", reason: Valid, lastTransitionTime: "2026-11-01T09:00:00Z"}]}
---
apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {name: onprem}
spec: {kind: cluster, region: oslo-dc1, scaleOut: fixed, packingStrategy: spread}
status: {nodeCount: 1, conditions: [{type: Ready, status: "False", reason: UnknownToManager, message: x, lastTransitionTime: "2026-11-01T09:00:00Z"}]}
---
apiVersion: automanager.norsk.io/v1alpha1
kind: PlacementPool
metadata: {name: empty}
spec: {kind: oci, region: eu-frankfurt-1, scaleOut: elastic, candidateInstanceTypes: [{instanceType: E4, totalCapacity: 80, totalCores: 8}]}
"#;

#[test]
fn top_nodes() {
    let nodes: Vec<api::ManagerNode> = objects(NODES);
    let rows = render::top::node_rows(&nodes, None);
    insta::assert_snapshot!(format!(
        "{}\n{}",
        render::top::render_nodes(&rows, false),
        render::top::render_nodes(&render::top::node_rows(&nodes, Some("onprem")), true)
    ));
    assert!(render::top::node_rows(&nodes, Some("nope")).is_empty());
}

#[test]
fn top_pools() {
    let nodes: Vec<api::ManagerNode> = objects(NODES);
    let pools: Vec<api::PlacementPool> = objects(POOLS);
    let rows = render::top::pool_rows(&pools, &render::top::node_rows(&nodes, None));
    insta::assert_snapshot!(format!(
        "{}\n{}",
        render::top::render_pools(&rows, false),
        render::top::render_pools(&rows, true)
    ));
    // Only started nodes count toward capacity: the starting aws-east-4 is not in the sums.
    assert_eq!(rows[0].total_capacity, 300);
    assert_eq!(rows[0].used_capacity, 80);
}

#[test]
fn broken_bundles() {
    let bundles: Vec<api::Bundle> = objects(
        r#"
apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {name: news, namespace: video}
spec: {replicas: 2, pools: [aws-east], jobs: [{jobName: encode, requirements: {requiredCapacity: 8, priorityBand: gold}}]}
status:
  phase: Broken
  replicas: [{replica: 0, restartsLastHour: 7}, {replica: 1, restartsLastHour: 1}]
  conditions:
    - {type: Broken, status: "True", reason: RestartCeilingExceeded, lastTransitionTime: "2026-11-01T09:45:00Z",
       message: "replica 0 restarted 7 times in the last hour (maxRestartsPerHour 6); not retried until automanager.norsk.io/retry changes"}
---
apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {name: sport, namespace: video}
spec: {replicas: 1, pools: [aws-east], jobs: [{jobName: encode, requirements: {requiredCapacity: 8, priorityBand: gold}}]}
status: {phase: Ready}
"#,
    );
    let rows = render::broken::rows(&bundles);
    assert_eq!(rows.len(), 1);
    let now = Utc
        .with_ymd_and_hms(2026, 11, 1, 10, 0, 0)
        .single()
        .expect("time");
    insta::assert_snapshot!(format!(
        "{}\n{}",
        render::broken::render(&rows, now),
        render::broken::render(&[], now)
    ));
}

#[test]
fn validate_report() {
    let root = package_dir().join("../..");
    let mut objects = Vec::new();
    for f in [
        "examples/cross-cloud-dr.yaml",
        "examples/invalid/bundle-unknown-field.yaml",
        "examples/invalid/bundle-colocate-unknown-job.yaml",
        "examples/invalid/bundle-replicas-too-many.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(f)).expect("example");
        objects
            .extend(automanager_cli::input::parse_documents(Path::new(f), &text).expect("parses"));
    }
    let pools_text = std::fs::read_to_string(root.join("examples/pools.yaml")).expect("pools");
    let pools =
        automanager_cli::input::parse_documents(Path::new("examples/pools.yaml"), &pools_text)
            .expect("pools parse");
    let schemas = automanager_cli::schema::Schemas::load().expect("schemas");
    let report = automanager_cli::validate::validate(&objects, &pools, "default", &schemas);
    assert!(!report.valid);
    insta::assert_snapshot!(render::validate::render(&report));
    insta::assert_json_snapshot!(report);
}

#[test]
fn top_nodes_from_the_apiservers_table() {
    // The shape kube-apiserver answers for `as=Table` with `includeObject=None`.
    let columns = [
        "Name",
        "Pool",
        "Zone",
        "Used",
        "Capacity",
        "Cordoned",
        "Spare",
        "State",
        "Age",
        "Instance Type",
        "Cores Used",
        "Cores",
        "Jobs",
        "Healthy",
        "Drain",
        "Capabilities",
    ];
    let table = serde_json::json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "columnDefinitions": columns.iter().map(|c| serde_json::json!({"name": c, "type": "string"})).collect::<Vec<_>>(),
        "rows": [
            {"cells": ["onprem-a1", "onprem", "rack-a", 200, 200, false, false, "started", "3d", null, 32, 32, 7, true, null, "[\"sdi-capture\"]"]},
            {"cells": ["aws-east-2", "aws-east", "eu-west-1b", 10, 100, true, false, "started", "1h", "m5.xlarge", 2, 16, 1, false, "migrate", null]},
            {"cells": ["aws-east-3", "aws-east", "eu-west-1a", 0, 100, false, true, "started", "1h", "m5.xlarge", 0, 16, 0, null, null, "[]"]}
        ]
    });
    let rows = render::top::node_rows_from_table(&table, None).expect("a Table");
    let names: Vec<&str> = rows.iter().map(|r| r.node.as_str()).collect();
    assert_eq!(
        names,
        ["aws-east-2", "aws-east-3", "onprem-a1"],
        "by pool, then name"
    );
    assert_eq!(rows[0].used_cores, 2);
    assert!(rows[0].cordoned && rows[0].draining && !rows[0].healthy);
    assert!(
        rows[1].spare && rows[1].healthy,
        "no Healthy cell is the field's default"
    );
    assert_eq!(rows[2].capabilities, ["sdi-capture"]);
    assert_eq!(rows[2].jobs, 7);
    assert_eq!(rows[2].instance_type, "");
    let onprem = render::top::node_rows_from_table(&table, Some("onprem")).expect("a Table");
    assert_eq!(onprem.len(), 1);

    // Not a Table (a proxy that ignored the Accept header), or one without our columns: the
    // caller reads the objects instead.
    let list = serde_json::json!({"kind": "ManagerNodeList", "items": []});
    assert!(render::top::node_rows_from_table(&list, None).is_none());
    let mut old = table.clone();
    old["columnDefinitions"] = serde_json::json!([{"name": "Name"}, {"name": "Pool"}]);
    assert!(render::top::node_rows_from_table(&old, None).is_none());
}

#[test]
fn disruption_windows_per_bundle_and_reason() {
    let bundles: Vec<api::Bundle> = objects(
        r#"
apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {name: news, namespace: video}
spec:
  replicas: 2
  pools: [aws-east]
  jobs: [{jobName: encode, requirements: {requiredCapacity: 8, priorityBand: silver}}]
  disruption:
    windows:
      - {schedule: "0 2 * * *", duration: 3h, timeZone: Europe/Oslo}
      - {schedule: "0 10 * * SUN", duration: 2h, timeZone: Europe/Oslo, reasons: [drain]}
---
apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {name: sport, namespace: video}
spec:
  replicas: 1
  pools: [aws-east]
  jobs: [{jobName: encode, requirements: {requiredCapacity: 8, priorityBand: gold}}]
  disruption:
    windows: [{schedule: "0 6 * * *", duration: 2h, timeZone: America/New_York, reasons: [consolidation]}]
---
apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {name: quiet, namespace: video}
spec: {replicas: 1, pools: [aws-east], jobs: [{jobName: encode, requirements: {requiredCapacity: 8, priorityBand: gold}}]}
---
apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {name: mars, namespace: video}
spec:
  replicas: 1
  pools: [aws-east]
  jobs: [{jobName: encode, requirements: {requiredCapacity: 8, priorityBand: gold}}]
  disruption:
    windows: [{schedule: "@daily", duration: 1h, timeZone: Mars/Olympus}]
"#,
    );
    let migrations: Vec<api::Migration> = objects(
        r#"
apiVersion: automanager.norsk.io/v1alpha1
kind: Migration
metadata: {name: news-consolidate-1, namespace: video}
spec: {job: {bundle: news, replica: 0, jobName: encode}}
status:
  phase: Pending
  conditions:
    - {type: Queued, status: "True", reason: DisruptionWindow, lastTransitionTime: "2026-11-06T11:00:00Z",
       message: "waiting until 2026-11-07T01:00:00Z: Bundle video/news's disruption windows (disruption.windows) and the silver band's disruption windows (bands.silver.disruptionWindows in the operator's settings) hold consolidation moves until then"}
---
apiVersion: automanager.norsk.io/v1alpha1
kind: Migration
metadata: {name: other-1, namespace: video}
spec: {job: {bundle: elsewhere, replica: 0, jobName: encode}}
status:
  phase: Pending
  conditions:
    - {type: Queued, status: "True", reason: DisruptionWindow, lastTransitionTime: "2026-11-06T11:00:00Z", message: "not shown"}
"#,
    );
    // Friday 6 November 2026, 12:00 UTC: 13:00 in Oslo (CET), 07:00 in New York (EST).
    let now = Utc
        .with_ymd_and_hms(2026, 11, 6, 12, 0, 0)
        .single()
        .expect("time");
    let v = render::windows::view(&bundles, &migrations, now);
    let row = |bundle: &str, reason: &str| {
        v.rows
            .iter()
            .find(|r| r.bundle == bundle && r.reason == reason)
            .unwrap_or_else(|| panic!("no row {bundle} {reason}"))
    };
    use render::windows::WindowState::*;
    // news: every reason waits for 02:00 in Oslo (01:00 UTC); the Sunday window, for drains
    // only, opens later.
    let drain = row("news", "drain");
    assert_eq!(drain.state, Held);
    assert_eq!(
        drain.until,
        Some(
            Utc.with_ymd_and_hms(2026, 11, 7, 1, 0, 0)
                .single()
                .expect("time")
        )
    );
    assert_eq!(drain.until_local.as_deref(), Some("2026-11-07 02:00 CET"));
    assert_eq!(drain.time_zone.as_deref(), Some("Europe/Oslo"));
    // sport: consolidation is allowed until 08:00 in New York; nothing else is restricted.
    let consolidation = row("sport", "consolidation");
    assert_eq!(consolidation.state, Allowed);
    assert_eq!(
        consolidation.until,
        Some(
            Utc.with_ymd_and_hms(2026, 11, 6, 13, 0, 0)
                .single()
                .expect("time")
        )
    );
    assert_eq!(
        consolidation.until_local.as_deref(),
        Some("2026-11-06 08:00 EST")
    );
    assert_eq!(row("sport", "drain").state, AnyTime);
    assert_eq!(row("quiet", "rebalance").state, AnyTime);
    let mars = row("mars", "drain");
    assert_eq!(mars.state, Invalid);
    assert!(
        mars.problem
            .as_deref()
            .is_some_and(|p| p.contains("Mars/Olympus")),
        "{mars:?}"
    );
    // Only the held moves of the bundles shown.
    assert_eq!(v.held.len(), 1);
    assert_eq!(v.held[0].migration, "news-consolidate-1");
    let json = serde_json::to_value(&v).expect("json");
    assert_eq!(json["rows"][0]["bundle"], "mars");
    assert_eq!(json["held"][0]["bundle"], "news");
    insta::assert_snapshot!(render::windows::render(&v));
}

/// This package's directory, as cargo tells the running test: a test executable cargo finds
/// fresh may have been built in another checkout that shares the target dir, and the path
/// compiled into it would read that checkout's files.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}

#[test]
fn trace_of_a_replica_split_across_pools() {
    // Only onprem has sdi and only aws-east's node has a gpu, and no new aws-east node would
    // have sdi: neither pool takes the replica whole, so each job goes its own way.
    let mut sdi = node("onprem-a1", "onprem", "rack-a", 0.0, false);
    sdi.capabilities = vec!["sdi".into()];
    let mut gpu = node("aws-east-1", "aws-east", "eu-west-1a", 40.0, false);
    gpu.capabilities = vec!["gpu".into()];
    let e = pl::Engine::new(pl::ClusterSnapshot {
        pools: vec![
            pool("onprem", pl::ScaleOut::Fixed, &["rack-a"]),
            pool("aws-east", pl::ScaleOut::Elastic, &["eu-west-1a"]),
        ],
        nodes: vec![sdi, gpu],
        ..pl::ClusterSnapshot::default()
    })
    .expect("valid cluster");
    let mut capture = pl::JobSpec::new("capture", 20.0, 2, pl::PriorityBand::Gold);
    capture.requirements.required_capabilities = vec!["sdi".into()];
    let mut infer = pl::JobSpec::new("infer", 30.0, 4, pl::PriorityBand::Gold);
    infer.requirements.required_capabilities = vec!["gpu".into()];
    let b = bundle(vec![capture, infer]);
    let d = e.place(
        &b.request_for_replica(0, pl::PlacementKind::First, vec![]),
        0,
    );
    assert!(d.is_split(), "{}", d.trace.message);
    let t = BundleTrace {
        namespace: "video".into(),
        bundle: "news".into(),
        bundle_id: "video.news".into(),
        replicas: vec![ReplicaTrace {
            replica: 0,
            decided_at: Some("2026-11-01T10:00:00Z".into()),
            leader: None,
            recovery: false,
            decision: d,
            preempted: None,
        }],
    };
    insta::assert_snapshot!(render::trace::render(&t, &view(false)));
}
