//! Tests: one unit test per rule (`rules`), property tests (`props`), shared fixtures here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod props;
mod rules;
mod split;
mod validation;

use crate::*;

pub(crate) fn pool(name: &str, strategy: PackingStrategy, scale: ScaleOut) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        kind: if scale == ScaleOut::Elastic {
            PoolKind::Aws
        } else {
            PoolKind::Cluster
        },
        region: "r1".into(),
        zones: vec!["a".into(), "b".into()],
        packing_strategy: strategy,
        scale_out: scale,
        candidate_instance_types: Vec::new(),
        max_nodes: None,
        terminating: false,
    }
}

pub(crate) fn itype(name: &str, cap: f64, cores: u32, caps: &[&str]) -> InstanceTypeSpec {
    InstanceTypeSpec {
        instance_type: name.into(),
        total_capacity: cap,
        total_cores: cores,
        capabilities: caps.iter().map(|c| (*c).to_owned()).collect(),
    }
}

pub(crate) fn node(id: &str, pool: &str, zone: &str, cap: f64, used: f64) -> NodeSpec {
    let mut n = NodeSpec::ready(id, pool, Some(zone), cap, 16);
    n.used_capacity = used;
    n
}

pub(crate) fn job(name: &str, cap: f64) -> JobSpec {
    JobSpec::new(name, cap, 1, PriorityBand::Silver)
}

pub(crate) fn request(jobs: Vec<JobSpec>, pools: &[&str]) -> PlacementRequest {
    PlacementRequest {
        bundle_id: "b".into(),
        replica_index: 0,
        jobs,
        pools: pools.iter().map(|p| (*p).to_owned()).collect(),
        kind: PlacementKind::First,
        intra_replica: PlacementRules::none(),
        inter_replica: PlacementRules::inter_replica_default(),
        other_replicas: Vec::new(),
        placed_siblings: Vec::new(),
    }
}

pub(crate) fn engine(pools: Vec<PoolSpec>, nodes: Vec<NodeSpec>) -> Engine {
    Engine::new(ClusterSnapshot {
        pools,
        nodes,
        ..ClusterSnapshot::default()
    })
    .expect("valid snapshot")
}

/// job name → node, for Placed decisions.
pub(crate) fn placed_nodes(d: &Decision) -> Vec<(String, String)> {
    match &d.outcome {
        Outcome::Placed { assignments, .. } => assignments
            .iter()
            .map(|a| (a.job_name.clone(), a.node.clone()))
            .collect(),
        other => panic!("expected Placed, got {other:?} ({})", d.trace.message),
    }
}

pub(crate) fn node_of(d: &Decision, job: &str) -> String {
    placed_nodes(d)
        .into_iter()
        .find(|(j, _)| j == job)
        .map(|(_, n)| n)
        .expect("job placed")
}
