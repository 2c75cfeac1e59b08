//! What the operator's unit tests build the same way: a small elastic pool, its nodes and a
//! mirror holding them.

use automanager_placement as pl;
use manager_client::MirrorState;
use manager_client::proto;

/// Pool `a` (aws, region `r`) of one instance type, `small`: 10 capacity, 4 cores.
pub(crate) fn pool() -> pl::PoolSpec {
    serde_json::from_value(serde_json::json!({
        "name": "a", "kind": "aws", "region": "r",
        "candidateInstanceTypes": [
            {"instanceType": "small", "totalCapacity": 10.0, "totalCores": 4}
        ],
    }))
    .expect("a pool spec")
}

/// A `small` node of pool `a` in `zone` (empty: none), in `state`.
pub(crate) fn node_in(id: &str, zone: &str, state: proto::NodeState) -> proto::Node {
    proto::Node {
        node_id: id.into(),
        pool: "a".into(),
        zone: zone.into(),
        instance_type: "small".into(),
        state: state as i32,
        ..Default::default()
    }
}

/// A mirror holding `nodes` and no job.
pub(crate) fn mirror_of(nodes: &[proto::Node]) -> MirrorState {
    let mut m = MirrorState::default();
    for n in nodes {
        m.nodes.insert(n.node_id.clone(), n.clone());
    }
    m
}
