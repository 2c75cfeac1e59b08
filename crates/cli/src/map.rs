//! `map`: the fleet as a picture. Pools, their zones and nodes; each node's used and free
//! capacity; each bundle replica on a node as a mark (`A0`: bundle `A`'s replica 0) drawn into
//! the node's capacity bar in proportion to what it uses; cordoned, draining, spare and
//! unhealthy nodes flagged; one bundle's replicas highlighted with `--bundle`. Built from the
//! ManagerNode objects (what the operator mirrors from Manager) and the PlacementPools, so it
//! needs only read access, and `-o json` is the same data.
//!
//! Pure: [`build`] takes the objects, [`render`] the result.

use std::collections::BTreeMap;

use automanager_api as api;
use serde::Serialize;

/// Cells of a node's capacity bar.
const BAR_CELLS: usize = 20;

/// The whole map.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetMap {
    pub pools: Vec<PoolMap>,
    /// Every bundle with a replica on some node, with its mark's letters.
    pub bundles: Vec<BundleKey>,
    /// The bundle `--bundle` named (`namespace/name`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub highlight: Option<String>,
}

/// A bundle and the letters its replicas' marks carry.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleKey {
    pub letters: String,
    /// `namespace/name`, or `(no bundle)` for jobs Manager runs for no Bundle.
    pub bundle: String,
    /// Replicas seen on nodes.
    pub replicas: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolMap {
    pub pool: String,
    /// `aws`, `oci`, `cluster`; empty when no PlacementPool of that name exists.
    pub kind: String,
    pub packing: String,
    pub scale_out: String,
    pub total_capacity: i64,
    pub used_capacity: i64,
    pub free_capacity: i64,
    pub zones: Vec<ZoneMap>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ZoneMap {
    pub zone: String,
    pub nodes: Vec<NodeMap>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeMap {
    /// The ManagerNode's name.
    pub node: String,
    pub node_id: String,
    pub instance_type: String,
    pub state: String,
    pub total_capacity: i64,
    pub used_capacity: i64,
    pub free_capacity: i64,
    pub total_cores: i32,
    pub used_cores: i32,
    pub free_cores: i32,
    pub cordoned: bool,
    pub draining: bool,
    pub spare: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spare_band: Option<String>,
    pub healthy: bool,
    pub replicas: Vec<ReplicaMark>,
}

/// One bundle replica's jobs on one node.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaMark {
    /// `A0`: the bundle's letters and the replica index (`?` when unknown).
    pub mark: String,
    pub bundle: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica: Option<i32>,
    pub jobs: Vec<String>,
    /// Capacity its jobs use on this node.
    pub capacity: i64,
    /// Some of its jobs are a migration's target instances.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub migration_target: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub highlighted: bool,
}

const NO_BUNDLE: &str = "(no bundle)";

/// Letters for the `i`-th bundle: A … Z, then AA, AB, …
pub fn letters(mut i: usize) -> String {
    let mut out = Vec::new();
    loop {
        out.push(b'A' + (i % 26) as u8);
        if i < 26 {
            break;
        }
        i = i / 26 - 1;
    }
    out.reverse();
    String::from_utf8_lossy(&out).into_owned()
}

fn lower<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

/// The map of `nodes`, grouped by the pools they report, with `pools` for each pool's kind
/// and packing; `pool` keeps one pool only; `highlight` (`namespace/name`) marks one bundle.
pub fn build(
    nodes: &[api::ManagerNode],
    pools: &[api::PlacementPool],
    pool: Option<&str>,
    highlight: Option<&str>,
) -> FleetMap {
    let statuses: Vec<(&api::ManagerNode, api::ManagerNodeStatus)> = nodes
        .iter()
        .map(|n| (n, n.status.clone().unwrap_or_default()))
        .filter(|(_, s)| pool.is_none_or(|p| p == s.pool))
        .collect();
    // Letters by bundle name, so the same bundle keeps its letters from run to run while the
    // set of bundles stays the same.
    let mut bundle_replicas: BTreeMap<String, std::collections::BTreeSet<Option<i32>>> =
        BTreeMap::new();
    for (_, s) in &statuses {
        for j in &s.jobs {
            let b = j.bundle.clone().unwrap_or_else(|| NO_BUNDLE.into());
            bundle_replicas.entry(b).or_default().insert(j.replica);
        }
    }
    let mut names: Vec<&String> = bundle_replicas.keys().filter(|b| *b != NO_BUNDLE).collect();
    names.sort();
    let mut keys: Vec<BundleKey> = names
        .iter()
        .enumerate()
        .map(|(i, b)| BundleKey {
            letters: letters(i),
            bundle: (*b).clone(),
            replicas: bundle_replicas[*b].len(),
        })
        .collect();
    if let Some(r) = bundle_replicas.get(NO_BUNDLE) {
        keys.push(BundleKey {
            letters: "?".into(),
            bundle: NO_BUNDLE.into(),
            replicas: r.len(),
        });
    }
    let letters_of: BTreeMap<&str, &str> = keys
        .iter()
        .map(|k| (k.bundle.as_str(), k.letters.as_str()))
        .collect();

    let specs: BTreeMap<String, &api::PlacementPoolSpec> = pools
        .iter()
        .map(|p| (p.metadata.name.clone().unwrap_or_default(), &p.spec))
        .collect();
    let mut by_pool: BTreeMap<String, BTreeMap<String, Vec<NodeMap>>> = BTreeMap::new();
    for (n, s) in &statuses {
        let mut per_replica: BTreeMap<(String, Option<i32>), ReplicaMark> = BTreeMap::new();
        for j in &s.jobs {
            let b = j.bundle.clone().unwrap_or_else(|| NO_BUNDLE.into());
            let letters = letters_of.get(b.as_str()).copied().unwrap_or("?");
            let highlighted = highlight.is_some_and(|h| h == b);
            let m = per_replica
                .entry((b.clone(), j.replica))
                .or_insert_with(|| ReplicaMark {
                    mark: format!(
                        "{letters}{}",
                        j.replica.map_or("?".to_owned(), |r| r.to_string())
                    ),
                    bundle: b.clone(),
                    replica: j.replica,
                    jobs: Vec::new(),
                    capacity: 0,
                    migration_target: false,
                    highlighted,
                });
            m.jobs
                .push(j.job_name.clone().unwrap_or_else(|| j.job_id.clone()));
            m.capacity = m.capacity.saturating_add(j.capacity);
            m.migration_target |= j.role == "migrationTarget";
        }
        let mut replicas: Vec<ReplicaMark> = per_replica.into_values().collect();
        replicas.sort_by(|a, b| {
            letters_key(&a.mark)
                .cmp(&letters_key(&b.mark))
                .then(a.replica.cmp(&b.replica))
        });
        let node = NodeMap {
            node: n.metadata.name.clone().unwrap_or_default(),
            node_id: s.node_id.clone(),
            instance_type: s.instance_type.clone(),
            state: lower(&s.state),
            total_capacity: s.total_capacity,
            used_capacity: s.used_capacity,
            free_capacity: s.total_capacity.saturating_sub(s.used_capacity).max(0),
            total_cores: s.total_cores,
            used_cores: s.used_cores,
            free_cores: s.total_cores.saturating_sub(s.used_cores).max(0),
            cordoned: n.spec.cordoned,
            draining: n.spec.drain.is_some(),
            spare: s.spare,
            spare_band: s.spare_band.as_ref().map(lower),
            healthy: s.healthy,
            replicas,
        };
        by_pool
            .entry(s.pool.clone())
            .or_default()
            .entry(s.zone.clone())
            .or_default()
            .push(node);
    }
    let pools = by_pool
        .into_iter()
        .map(|(name, zones)| {
            let spec = specs.get(&name);
            let zones: Vec<ZoneMap> = zones
                .into_iter()
                .map(|(zone, mut nodes)| {
                    nodes.sort_by(|a, b| a.node.cmp(&b.node));
                    ZoneMap { zone, nodes }
                })
                .collect();
            let started = || {
                zones
                    .iter()
                    .flat_map(|z| &z.nodes)
                    .filter(|n| n.state == "started")
            };
            let total: i64 = started().map(|n| n.total_capacity).sum();
            let used: i64 = started().map(|n| n.used_capacity).sum();
            PoolMap {
                kind: spec.map(|s| lower(&s.kind)).unwrap_or_default(),
                packing: spec.map(|s| lower(&s.packing_strategy)).unwrap_or_default(),
                scale_out: spec.map(|s| lower(&s.scale_out)).unwrap_or_default(),
                pool: name,
                total_capacity: total,
                used_capacity: used,
                free_capacity: total.saturating_sub(used).max(0),
                zones,
            }
        })
        .collect();
    FleetMap {
        pools,
        bundles: keys,
        highlight: highlight.map(str::to_owned),
    }
}

/// Sorts `B1` before `AA0`: by the letters' length, then the letters.
fn letters_key(mark: &str) -> (usize, String) {
    let l: String = mark
        .chars()
        .take_while(|c| c.is_ascii_uppercase() || *c == '?')
        .collect();
    (l.len(), l)
}

/// A node's capacity bar: each replica's share drawn with its letters' first character
/// (highlighted ones as `#`), the rest free (`·`), or `x` on a node that takes nothing new
/// (cordoned, draining, a spare, unhealthy, not started).
fn node_bar(n: &NodeMap) -> String {
    let total = n.total_capacity.max(1) as f64;
    let mut cells: Vec<char> = Vec::with_capacity(BAR_CELLS);
    let mut drawn = 0.0f64;
    for r in &n.replicas {
        let before = (drawn / total * BAR_CELLS as f64).round() as usize;
        drawn += r.capacity.max(0) as f64;
        let after = ((drawn / total * BAR_CELLS as f64).round() as usize).min(BAR_CELLS);
        // Every replica shows, however small.
        let after = after.max((before + 1).min(BAR_CELLS));
        let c = if r.highlighted {
            '#'
        } else {
            r.mark.chars().next().unwrap_or('?')
        };
        while cells.len() < after {
            cells.push(c);
        }
    }
    // A spare is held for recovery: ordinary placements do not land there either.
    let closed = n.cordoned || n.draining || n.spare || !n.healthy || n.state != "started";
    while cells.len() < BAR_CELLS {
        cells.push(if closed { 'x' } else { '·' });
    }
    cells.into_iter().collect()
}

fn flags(n: &NodeMap) -> Vec<String> {
    let mut f = Vec::new();
    if n.state != "started" {
        f.push(n.state.clone());
    }
    if n.cordoned {
        f.push("cordoned".into());
    }
    if n.draining {
        f.push("draining".into());
    }
    if n.spare {
        f.push(match &n.spare_band {
            Some(b) => format!("spare({b})"),
            None => "spare".into(),
        });
    }
    if !n.healthy {
        f.push("unhealthy".into());
    }
    f
}

/// The map as text: one block per pool, a line per zone, a line per node.
pub fn render(map: &FleetMap) -> String {
    let mut out = String::new();
    if map.pools.is_empty() {
        return "No ManagerNodes (the operator mirrors Manager's nodes as ManagerNode objects once it runs).\n".into();
    }
    let name_width = map
        .pools
        .iter()
        .flat_map(|p| &p.zones)
        .flat_map(|z| &z.nodes)
        .map(|n| n.node.chars().count())
        .max()
        .unwrap_or(4);
    for p in &map.pools {
        let what: Vec<&str> = [p.kind.as_str(), p.packing.as_str(), p.scale_out.as_str()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect();
        let nodes: usize = p.zones.iter().map(|z| z.nodes.len()).sum();
        out.push_str(&format!(
            "pool {}{} · {nodes} node{} · capacity {} used, {} free of {}\n",
            p.pool,
            if what.is_empty() {
                " (no PlacementPool)".to_owned()
            } else {
                format!(" ({})", what.join(", "))
            },
            if nodes == 1 { "" } else { "s" },
            p.used_capacity,
            p.free_capacity,
            p.total_capacity
        ));
        for z in &p.zones {
            out.push_str(&format!(
                "  zone {}\n",
                if z.zone.is_empty() { "(none)" } else { &z.zone }
            ));
            for n in &z.nodes {
                let marks: Vec<String> = n
                    .replicas
                    .iter()
                    .map(|r| {
                        let m = if r.migration_target {
                            format!("{}+", r.mark)
                        } else {
                            r.mark.clone()
                        };
                        if r.highlighted { format!("[{m}]") } else { m }
                    })
                    .collect();
                let mut line = format!(
                    "    {:<name_width$}  [{}] {:>5} used {:>5} free",
                    n.node,
                    node_bar(n),
                    n.used_capacity,
                    n.free_capacity,
                );
                let f = flags(n);
                if !f.is_empty() {
                    line.push_str(&format!("  {}", f.join(" ")));
                }
                if !marks.is_empty() {
                    line.push_str(&format!("  {}", marks.join(" ")));
                }
                out.push_str(line.trim_end());
                out.push('\n');
            }
        }
    }
    if !map.bundles.is_empty() {
        out.push_str("\nbundles: ");
        let keys: Vec<String> = map
            .bundles
            .iter()
            .map(|k| format!("{} {}", k.letters, k.bundle))
            .collect();
        out.push_str(&keys.join(" · "));
        out.push('\n');
    }
    if let Some(h) = &map.highlight {
        let spots: Vec<String> = map
            .pools
            .iter()
            .flat_map(|p| p.zones.iter().map(move |z| (p, z)))
            .flat_map(|(p, z)| z.nodes.iter().map(move |n| (p, z, n)))
            .flat_map(|(p, z, n)| {
                n.replicas
                    .iter()
                    .filter(|r| r.highlighted)
                    .map(move |r| format!("{} on {} ({}/{})", r.mark, n.node, p.pool, z.zone))
            })
            .collect();
        if spots.is_empty() {
            out.push_str(&format!("{h}: no replica on any node\n"));
        } else {
            out.push_str(&format!("{h} (#, [ ]): {}\n", spots.join(", ")));
        }
    }
    out.push_str("marks: A0 = bundle A's replica 0, + = a migration's target; bar: a letter per replica's share, · free, x takes nothing new\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_go_past_z() {
        assert_eq!(letters(0), "A");
        assert_eq!(letters(25), "Z");
        assert_eq!(letters(26), "AA");
        assert_eq!(letters(27), "AB");
        assert_eq!(letters(26 * 27), "AAA");
    }
}
