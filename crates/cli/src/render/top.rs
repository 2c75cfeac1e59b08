//! `top pools` / `top nodes`: capacity and cores in use, from the objects the operator keeps
//! current (ManagerNode and PlacementPool status), so they need only read access to the API.

use std::collections::BTreeMap;

use automanager_api as api;
use serde::Serialize;

use super::{bar, num, table};

/// One node's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    pub node: String,
    pub pool: String,
    pub zone: String,
    pub state: String,
    pub instance_type: String,
    pub used_capacity: i64,
    pub total_capacity: i64,
    pub used_cores: i32,
    pub total_cores: i32,
    pub jobs: usize,
    pub cordoned: bool,
    pub draining: bool,
    pub spare: bool,
    pub healthy: bool,
    pub capabilities: Vec<String>,
}

/// One pool's row.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRow {
    pub pool: String,
    pub kind: String,
    pub scale_out: String,
    pub packing: String,
    pub nodes: i64,
    /// Summed over the pool's started nodes.
    pub used_capacity: i64,
    pub total_capacity: i64,
    pub used_cores: i64,
    pub total_cores: i64,
    pub live_spares: i64,
    pub spare_target: i64,
    pub ready: String,
}

fn lower<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// Rows of `nodes`, by pool then name, optionally only `pool`'s.
pub fn node_rows(nodes: &[api::ManagerNode], pool: Option<&str>) -> Vec<NodeRow> {
    let mut rows: Vec<NodeRow> = nodes
        .iter()
        .filter_map(|n| {
            let s = n.status.clone().unwrap_or_default();
            if pool.is_some_and(|p| p != s.pool) {
                return None;
            }
            Some(NodeRow {
                node: n.metadata.name.clone().unwrap_or_default(),
                pool: s.pool,
                zone: s.zone,
                state: lower(&s.state),
                instance_type: s.instance_type,
                used_capacity: s.used_capacity,
                total_capacity: s.total_capacity,
                used_cores: s.used_cores,
                total_cores: s.total_cores,
                // `jobCount` counts past the list's bound; an older operator did not write it.
                jobs: usize::try_from(s.job_count)
                    .unwrap_or_default()
                    .max(s.jobs.len()),
                cordoned: n.spec.cordoned,
                draining: n.spec.drain.is_some(),
                spare: s.spare,
                healthy: s.healthy,
                capabilities: s.capabilities,
            })
        })
        .collect();
    rows.sort_by(|a, b| a.pool.cmp(&b.pool).then(a.node.cmp(&b.node)));
    rows
}

/// Rows of a `meta.k8s.io/v1` Table of ManagerNodes (the apiserver's rendering of the CRD's
/// printer columns), by pool then name, optionally only `pool`'s. `None` when the answer is
/// not such a Table (an apiserver or proxy that ignored the request for one): the caller then
/// reads the objects.
pub fn node_rows_from_table(table: &serde_json::Value, pool: Option<&str>) -> Option<Vec<NodeRow>> {
    use serde_json::Value;
    if table.get("kind").and_then(Value::as_str) != Some("Table") {
        return None;
    }
    let columns: Vec<&str> = table
        .get("columnDefinitions")?
        .as_array()?
        .iter()
        .map(|c| c.get("name").and_then(Value::as_str).unwrap_or_default())
        .collect();
    let at = |name: &str| columns.iter().position(|c| *c == name);
    let (name, pool_col, zone, state) = (at("Name")?, at("Pool")?, at("Zone")?, at("State")?);
    let (used, capacity, cordoned, spare) =
        (at("Used")?, at("Capacity")?, at("Cordoned")?, at("Spare")?);
    let (instance, cores_used, cores, jobs) = (
        at("Instance Type")?,
        at("Cores Used")?,
        at("Cores")?,
        at("Jobs")?,
    );
    let (healthy, drain, capabilities) = (at("Healthy")?, at("Drain")?, at("Capabilities")?);
    let mut rows = Vec::new();
    for row in table.get("rows")?.as_array()? {
        let cells = row.get("cells")?.as_array()?;
        let text = |i: usize| {
            cells
                .get(i)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        let int = |i: usize| cells.get(i).and_then(Value::as_i64).unwrap_or_default();
        let flag = |i: usize| cells.get(i).and_then(Value::as_bool);
        let row_pool = text(pool_col);
        if pool.is_some_and(|p| p != row_pool) {
            continue;
        }
        rows.push(NodeRow {
            node: text(name),
            pool: row_pool,
            zone: text(zone),
            state: text(state),
            instance_type: text(instance),
            used_capacity: int(used),
            total_capacity: int(capacity),
            used_cores: i32::try_from(int(cores_used)).unwrap_or(i32::MAX),
            total_cores: i32::try_from(int(cores)).unwrap_or(i32::MAX),
            jobs: usize::try_from(int(jobs)).unwrap_or_default(),
            cordoned: flag(cordoned).unwrap_or(false),
            draining: !text(drain).is_empty(),
            spare: flag(spare).unwrap_or(false),
            // The field's default: a node whose status does not say yet is not held out.
            healthy: flag(healthy).unwrap_or(true),
            // A string column of a list: the apiserver prints it as JSON.
            capabilities: serde_json::from_str(&text(capabilities)).unwrap_or_default(),
        });
    }
    rows.sort_by(|a, b| a.pool.cmp(&b.pool).then(a.node.cmp(&b.node)));
    Some(rows)
}

/// Rows of `pools`, with capacity and cores summed over their started `nodes`.
pub fn pool_rows(pools: &[api::PlacementPool], nodes: &[NodeRow]) -> Vec<PoolRow> {
    let started = lower(&api::NodeState::Started);
    let mut sums: BTreeMap<&str, (i64, i64, i64, i64)> = BTreeMap::new();
    for n in nodes.iter().filter(|n| n.state == started) {
        let e = sums.entry(n.pool.as_str()).or_default();
        e.0 += n.used_capacity;
        e.1 += n.total_capacity;
        e.2 += i64::from(n.used_cores);
        e.3 += i64::from(n.total_cores);
    }
    let mut rows: Vec<PoolRow> = pools
        .iter()
        .map(|p| {
            let name = p.metadata.name.clone().unwrap_or_default();
            let s = p.status.clone().unwrap_or_default();
            let (uc, tc, ucore, tcore) = sums.get(name.as_str()).copied().unwrap_or_default();
            let ready = api::find_condition(&s.conditions, "Ready")
                .map(|c| {
                    if c.is_true() {
                        "True".to_owned()
                    } else {
                        format!("False ({})", c.reason)
                    }
                })
                .unwrap_or_else(|| "Unknown".into());
            PoolRow {
                kind: lower(&p.spec.kind),
                scale_out: lower(&p.spec.scale_out),
                packing: lower(&p.spec.packing_strategy),
                nodes: s.node_count,
                used_capacity: uc,
                total_capacity: tc,
                used_cores: ucore,
                total_cores: tcore,
                live_spares: s.live_spares,
                spare_target: s.spare_target,
                ready,
                pool: name,
            }
        })
        .collect();
    rows.sort_by(|a, b| a.pool.cmp(&b.pool));
    rows
}

fn flags(r: &NodeRow) -> String {
    let mut f = Vec::new();
    if r.cordoned {
        f.push("cordoned");
    }
    if r.draining {
        f.push("draining");
    }
    if r.spare {
        f.push("spare");
    }
    if !r.healthy {
        f.push("unhealthy");
    }
    if f.is_empty() {
        "-".into()
    } else {
        f.join(",")
    }
}

/// `top nodes` as a table.
pub fn render_nodes(rows: &[NodeRow], wide: bool) -> String {
    if rows.is_empty() {
        return "No ManagerNodes (the operator creates one per node Manager runs).\n".into();
    }
    let mut header = vec![
        "NODE", "POOL", "ZONE", "STATE", "CAPACITY", "", "CORES", "", "JOBS", "FLAGS",
    ];
    if wide {
        header.extend(["INSTANCE TYPE", "CAPABILITIES"]);
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.node.clone(),
                r.pool.clone(),
                r.zone.clone(),
                r.state.clone(),
                bar(r.used_capacity as f64, r.total_capacity as f64),
                format!("{}/{}", r.used_capacity, r.total_capacity),
                bar(f64::from(r.used_cores), f64::from(r.total_cores)),
                format!("{}/{}", r.used_cores, r.total_cores),
                r.jobs.to_string(),
                flags(r),
            ];
            if wide {
                row.push(r.instance_type.clone());
                row.push(if r.capabilities.is_empty() {
                    "-".into()
                } else {
                    r.capabilities.join(",")
                });
            }
            row
        })
        .collect();
    table(&header, &body)
}

/// `top pools` as a table.
pub fn render_pools(rows: &[PoolRow], wide: bool) -> String {
    if rows.is_empty() {
        return "No PlacementPools.\n".into();
    }
    let mut header = vec![
        "POOL", "KIND", "SCALE", "NODES", "CAPACITY", "", "CORES", "", "SPARES", "READY",
    ];
    if wide {
        header.push("PACKING");
    }
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![
                r.pool.clone(),
                r.kind.clone(),
                r.scale_out.clone(),
                r.nodes.to_string(),
                bar(r.used_capacity as f64, r.total_capacity as f64),
                format!(
                    "{}/{}",
                    num(r.used_capacity as f64),
                    num(r.total_capacity as f64)
                ),
                bar(r.used_cores as f64, r.total_cores as f64),
                format!("{}/{}", r.used_cores, r.total_cores),
                format!("{}/{}", r.live_spares, r.spare_target),
                r.ready.clone(),
            ];
            if wide {
                row.push(r.packing.clone());
            }
            row
        })
        .collect();
    table(&header, &body)
}
