//! `what-if` in the plugin: the operator's placement engine, run here on the PlacementPools and
//! ManagerNodes the apiserver holds, so a person on call asks "would this Bundle fit now?"
//! with read access to those objects and nothing exposed on the network.
//!
//! The answer is the leader's own engine on the same pools and nodes, as their objects show
//! them. It can differ from the leader's in what the objects do not carry or carry late: starts
//! the leader has made that a ManagerNode's status does not show yet (its used capacity lags by
//! a status write), a provisioning pause of the zone brake, the operator's own
//! `pendingWindow` if it is not the default, and a Bundle of the same name that already runs
//! (its jobs are counted as used capacity, not replaced). `--from-operator` asks the leader.

use automanager_api as api;
use automanager_placement as pl;
use chrono::{DateTime, Utc};

/// The engine's view of the fleet, from the objects: every pool, and every node that can take
/// a job (started, or starting: pending capacity since it was created).
pub fn snapshot(
    pools: &[api::PlacementPool],
    nodes: &[api::ManagerNode],
    now: DateTime<Utc>,
) -> pl::ClusterSnapshot {
    let pools = pools
        .iter()
        .map(|p| crate::engine::pool(p.metadata.name.as_deref().unwrap_or_default(), &p.spec))
        .collect();
    let nodes = nodes.iter().filter_map(|n| node(n, now)).collect();
    pl::ClusterSnapshot {
        pools,
        nodes,
        pending_window_ms: pl::DEFAULT_PENDING_WINDOW_MS,
    }
}

/// One ManagerNode as the engine sees it, or `None` when it takes no job.
fn node(n: &api::ManagerNode, now: DateTime<Utc>) -> Option<pl::NodeSpec> {
    let s = n.status.as_ref()?;
    let pending_since_ms = match s.state {
        api::NodeState::Started => None,
        api::NodeState::Starting => {
            let created_ms = (n.metadata.creation_timestamp.as_ref())
                .map_or(now.timestamp_millis(), |t| t.0.as_millisecond());
            Some(u64::try_from(created_ms).unwrap_or(0))
        }
        _ => return None,
    };
    let held_out = s.held_out_until.is_some_and(|until| until > now);
    Some(pl::NodeSpec {
        id: s.node_id.clone(),
        pool: s.pool.clone(),
        zone: (!s.zone.is_empty()).then(|| s.zone.clone()),
        instance_type: (!s.instance_type.is_empty()).then(|| s.instance_type.clone()),
        total_capacity: s.total_capacity.max(0) as f64,
        used_capacity: s.used_capacity.max(0) as f64,
        total_cores: u32::try_from(s.total_cores).unwrap_or(0),
        used_cores: u32::try_from(s.used_cores).unwrap_or(0),
        capabilities: s.capabilities.clone(),
        cordoned: n.spec.cordoned || n.spec.drain.is_some(),
        healthy: s.healthy && !held_out,
        spare: s.spare,
        spare_band: if s.spare { s.spare_band } else { None },
        pending_since_ms,
    })
}

/// The admission answer for `bundle` on `snapshot` at `now`, with the dry run's decisions: the
/// same function the operator's `/v1/what-if` answers with.
pub fn what_if(
    bundle: &pl::BundleSpec,
    snapshot: pl::ClusterSnapshot,
    now: DateTime<Utc>,
) -> (pl::AdmissionResult, Vec<pl::Decision>) {
    let (engine, _) = pl::Engine::new_lenient(snapshot);
    let now_ms = u64::try_from(now.timestamp_millis()).unwrap_or(0);
    pl::validate_admission_traced(bundle, &engine, now_ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> api::PlacementPool {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "PlacementPool",
            "metadata": {"name": "onprem"},
            "spec": {"kind": "cluster", "region": "r", "packingStrategy": "binpack", "scaleOut": "fixed",
                     "candidateInstanceTypes": [{"instanceType": "box", "totalCapacity": 100, "totalCores": 8}]}
        }))
        .expect("a pool")
    }

    fn node(name: &str, used: i64, state: &str, cordoned: bool) -> api::ManagerNode {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "ManagerNode",
            "metadata": {"name": name},
            "spec": {"cordoned": cordoned},
            "status": {"nodeId": name, "pool": "onprem", "zone": "a", "instanceType": "box", "state": state,
                       "totalCapacity": 100, "usedCapacity": used, "totalCores": 8, "usedCores": 0,
                       "healthy": true}
        }))
        .expect("a node")
    }

    fn bundle(capacity: i64) -> pl::BundleSpec {
        let spec: api::BundleSpec = serde_json::from_value(serde_json::json!({
            "replicas": 2, "pools": ["onprem"],
            "jobs": [{"jobName": "enc", "requirements": {"requiredCapacity": capacity, "priorityBand": "gold"}}]
        }))
        .expect("a spec");
        crate::engine::bundle("ns", "b", &spec)
    }

    #[test]
    fn a_bundle_fits_on_the_nodes_the_objects_show_and_not_on_cordoned_or_stopped_ones() {
        let now = Utc::now();
        let nodes = [
            node("n1", 20, "started", false),
            node("n2", 90, "started", false),
            node("n3", 0, "started", true),
            node("n4", 0, "stopped", false),
        ];
        let snap = snapshot(&[pool()], &nodes, now);
        assert_eq!(snap.nodes.len(), 3, "a stopped node takes no job");
        let (fits, decisions) = what_if(&bundle(10), snap.clone(), now);
        assert_eq!(fits, pl::AdmissionResult::Ok, "{decisions:?}");
        // Two replicas of 80 need two nodes with 80 free: only n1 has it (n3 is cordoned), where
        // two of 10 fit on n1 and n2.
        let (full, _) = what_if(&bundle(80), snap, now);
        assert!(
            matches!(full, pl::AdmissionResult::NoCapacity { .. }),
            "{full:?}"
        );
    }
}
