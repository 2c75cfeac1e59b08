//! Per-operation figures at 10,000 nodes, half full (criterion): one replica's placement, a
//! commit + release pair, a node update, and a what-if dry run (the operator's `/v1/what-if`)
//! with 40,000 jobs reserved. `make bench-placement-ops`.

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

use automanager_placement::*;

const NODES: usize = 10_000;

fn engine() -> Engine {
    let mut pool = PoolSpec {
        name: "aws".into(),
        kind: PoolKind::Aws,
        region: "eu".into(),
        zones: vec!["a".into(), "b".into(), "c".into()],
        packing_strategy: PackingStrategy::Binpack,
        scale_out: ScaleOut::Fixed,
        candidate_instance_types: Vec::new(),
        max_nodes: None,
        terminating: false,
    };
    let mut spread = pool.clone();
    spread.name = "oci".into();
    spread.packing_strategy = PackingStrategy::Spread;
    pool.candidate_instance_types = Vec::new();
    let nodes = (0..NODES)
        .map(|i| {
            let mut n = NodeSpec::ready(
                &format!("node-{i:06}"),
                if i % 2 == 0 { "aws" } else { "oci" },
                Some(["a", "b", "c"][i % 3]),
                100.0,
                32,
            );
            // Half full, unevenly, so binpack has something to choose between.
            n.used_capacity = (i % 100) as f64;
            n.used_cores = (i % 32) as u32;
            if i % 5 == 0 {
                n.capabilities = vec!["gpu".into()];
            }
            n
        })
        .collect();
    Engine::new(ClusterSnapshot {
        pools: vec![pool, spread],
        nodes,
        ..ClusterSnapshot::default()
    })
    .expect("valid cluster")
}

fn request(pools: &[&str]) -> PlacementRequest {
    let mut encode = JobSpec::new("encode", 8.0, 2, PriorityBand::Gold);
    encode.requirements.required_capabilities = vec!["gpu".into()];
    PlacementRequest {
        bundle_id: "b".into(),
        replica_index: 1,
        jobs: vec![
            encode,
            JobSpec::new("package", 4.0, 1, PriorityBand::Silver),
        ],
        pools: pools.iter().map(|p| (*p).to_owned()).collect(),
        kind: PlacementKind::First,
        intra_replica: PlacementRules::none(),
        inter_replica: PlacementRules::inter_replica_default(),
        other_replicas: vec![Position {
            node: "node-000010".into(),
            zone: Some("b".into()),
        }],
        placed_siblings: Vec::new(),
    }
}

fn ops(c: &mut Criterion) {
    let mut e = engine();
    let binpack = request(&["aws"]);
    let spread = request(&["oci"]);
    c.bench_function("place 2-job replica, binpack, 10k nodes", |b| {
        b.iter(|| black_box(e.place(black_box(&binpack), 0)))
    });
    c.bench_function("place 2-job replica, spread, 10k nodes", |b| {
        b.iter(|| black_box(e.place(black_box(&spread), 0)))
    });
    let mut full = request(&["aws", "oci"]);
    full.jobs[1].requirements.required_capacity = 100.5;
    c.bench_function(
        "place, unplaceable: both pools left (trace counts), 10k nodes",
        |b| b.iter(|| black_box(e.place(black_box(&full), 0))),
    );
    let d = e.place(&binpack, 0);
    let keys: Vec<JobKey> = ["encode", "package"]
        .iter()
        .map(|j| JobKey {
            bundle_id: "b".into(),
            replica_index: 1,
            job_name: (*j).into(),
        })
        .collect();
    c.bench_function("commit + release a 2-job replica, 10k nodes", |b| {
        b.iter(|| {
            e.commit(black_box(&d)).expect("nodes exist");
            for k in &keys {
                e.release_job(k);
            }
        })
    });
    let mut node = NodeSpec::ready("node-000042", "aws", Some("a"), 100.0, 32);
    let mut used = 0.0;
    c.bench_function("upsert_node (usage changed), 10k nodes", |b| {
        b.iter(|| {
            used = if used > 90.0 { 0.0 } else { used + 1.0 };
            node.used_capacity = used;
            e.upsert_node(black_box(node.clone())).expect("valid node");
        })
    });
}

/// The dry run `/v1/what-if` makes, on an engine holding 40,000 placed jobs (10,000 bundles of
/// two replicas of one job each, as `make bench-scale` runs): its cost must not grow with them.
fn what_if(c: &mut Criterion) {
    let mut e = engine();
    for b in 0..10_000 {
        for r in 0..2 {
            let req = PlacementRequest {
                bundle_id: format!("default.bundle-{b:05}"),
                replica_index: r,
                jobs: vec![
                    JobSpec::new("enc", 1.0, 1, PriorityBand::Gold),
                    JobSpec::new("pkg", 1.0, 1, PriorityBand::Gold),
                ],
                pools: vec!["aws".into(), "oci".into()],
                kind: PlacementKind::First,
                intra_replica: PlacementRules::none(),
                inter_replica: PlacementRules::none(),
                other_replicas: Vec::new(),
                placed_siblings: Vec::new(),
            };
            let d = e.place(&req, 0);
            e.commit(&d).expect("room for 40,000 small jobs");
        }
    }
    let bundle = BundleSpec {
        bundle_id: "default.what-if".into(),
        replicas: 2,
        pools: vec!["aws".into(), "oci".into()],
        jobs: vec![
            JobSpec::new("encode", 8.0, 2, PriorityBand::Gold),
            JobSpec::new("package", 4.0, 1, PriorityBand::Gold),
        ],
        replica_overrides: Default::default(),
        intra_replica_placement: PlacementRules::none(),
        inter_replica_placement: PlacementRules::inter_replica_default(),
    };
    c.bench_function("what-if 2 replicas, 10k nodes, 40k jobs placed", |b| {
        b.iter(|| black_box(validate_admission_traced(black_box(&bundle), &e, 0)))
    });
}

criterion_group!(benches, ops, what_if);
criterion_main!(benches);
