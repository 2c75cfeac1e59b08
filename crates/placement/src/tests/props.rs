//! Property tests over random clusters and requests.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;
use crate::naive;

const ZONES: [&str; 3] = ["a", "b", "c"];
const CAPS: [&str; 2] = ["gpu", "ssd"];
const POOLS: [&str; 3] = ["p0", "p1", "p2"];
const NOW: u64 = 100_000;

fn band() -> impl Strategy<Value = PriorityBand> {
    prop_oneof![
        Just(PriorityBand::Gold),
        Just(PriorityBand::Silver),
        Just(PriorityBand::Bronze)
    ]
}

fn caps() -> impl Strategy<Value = Vec<String>> {
    proptest::sample::subsequence(CAPS.to_vec(), 0..=2)
        .prop_map(|v| v.into_iter().map(str::to_owned).collect())
}

fn strength() -> impl Strategy<Value = Option<Strength>> {
    prop_oneof![5 => Just(None), 1 => Just(Some(Strength::Hard)), 2 => Just(Some(Strength::Soft))]
}

fn rules() -> impl Strategy<Value = PlacementRules> {
    (strength(), strength(), strength(), strength()).prop_map(|(a, b, c, d)| PlacementRules {
        same_node: a,
        different_node: b,
        same_zone: c,
        different_zone: d,
    })
}

fn pool_spec(name: &'static str) -> impl Strategy<Value = PoolSpec> {
    (
        any::<bool>(),
        any::<bool>(),
        proptest::sample::subsequence(ZONES.to_vec(), 0..=3),
        proptest::collection::vec((10u32..120, 1u32..16, caps()), 0..3),
        proptest::option::of(1u32..12),
    )
        .prop_map(move |(spread, elastic, zones, types, max_nodes)| PoolSpec {
            name: name.into(),
            kind: PoolKind::Aws,
            region: "r".into(),
            zones: zones.into_iter().map(str::to_owned).collect(),
            packing_strategy: if spread {
                PackingStrategy::Spread
            } else {
                PackingStrategy::Binpack
            },
            scale_out: if elastic {
                ScaleOut::Elastic
            } else {
                ScaleOut::Fixed
            },
            candidate_instance_types: types
                .into_iter()
                .enumerate()
                .map(|(i, (c, k, caps))| InstanceTypeSpec {
                    instance_type: format!("t{i}"),
                    total_capacity: f64::from(c),
                    total_cores: k,
                    capabilities: caps,
                })
                .collect(),
            max_nodes,
            terminating: false,
        })
}

#[derive(Debug, Clone)]
struct NodeGen {
    pool: usize,
    zone: Option<usize>,
    cap: u32,
    used: u32,
    cores: u32,
    used_cores: u32,
    caps: Vec<String>,
    flags: u8,
    band: Option<PriorityBand>,
    pending: Option<u64>,
}

fn node_gen() -> impl Strategy<Value = NodeGen> {
    (
        (
            0usize..4,
            proptest::option::of(0usize..3),
            0u32..100,
            0u32..60,
            0u32..16,
            0u32..8,
        ),
        (
            caps(),
            any::<u8>(),
            proptest::option::of(band()),
            proptest::option::weighted(0.15, 0u64..2 * NOW),
        ),
    )
        .prop_map(
            |((pool, zone, cap, used, cores, used_cores), (caps, flags, band, pending))| NodeGen {
                pool,
                zone,
                cap,
                used: used.min(cap),
                cores,
                used_cores: used_cores.min(cores),
                caps,
                flags,
                band,
                pending,
            },
        )
}

fn to_node(i: usize, g: &NodeGen) -> NodeSpec {
    NodeSpec {
        id: format!("n{i:02}"),
        pool: POOLS.get(g.pool).copied().unwrap_or("orphan").into(),
        zone: g.zone.map(|z| ZONES[z].to_owned()),
        instance_type: None,
        total_capacity: f64::from(g.cap),
        used_capacity: f64::from(g.used),
        total_cores: g.cores,
        used_cores: g.used_cores,
        capabilities: g.caps.clone(),
        cordoned: g.flags.is_multiple_of(10),
        healthy: g.flags % 10 != 1,
        spare: g.flags % 6 == 2,
        spare_band: g.band,
        pending_since_ms: g.pending,
    }
}

#[derive(Debug, Clone)]
struct Scenario {
    pools: Vec<PoolSpec>,
    nodes: Vec<NodeSpec>,
    request: PlacementRequest,
    /// (pool, zone) pairs the zone brake holds as degraded.
    degraded: Vec<(usize, usize)>,
}

fn job_gen() -> impl Strategy<Value = (u32, u32, Vec<String>, PriorityBand, Vec<usize>, Vec<usize>)>
{
    (
        0u32..60,
        0u32..6,
        prop_oneof![3 => Just(Vec::new()), 1 => caps()],
        band(),
        proptest::collection::vec(0usize..4, 0..2),
        proptest::collection::vec(0usize..4, 0..2),
    )
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        (pool_spec("p0"), pool_spec("p1"), pool_spec("p2")),
        proptest::collection::vec(node_gen(), 0..32),
        proptest::collection::vec(job_gen(), 1..4),
        (
            any::<bool>(),
            rules(),
            rules(),
            proptest::collection::vec((0usize..30, proptest::option::of(0usize..3)), 0..3),
        ),
        (
            proptest::sample::subsequence(vec![0usize, 1, 2, 3], 1..=4).prop_shuffle(),
            prop_oneof![
                2 => Just(Vec::new()),
                1 => proptest::collection::vec((0usize..3, 0usize..3), 1..3),
            ],
        ),
    )
        .prop_map(
            |(
                (p0, p1, p2),
                nodes,
                jobs,
                (recovery, intra, inter, others),
                (pool_order, degraded),
            )| {
                let n = jobs.len();
                let jobs: Vec<JobSpec> = jobs
                    .into_iter()
                    .enumerate()
                    .map(|(i, (cap, cores, caps, band, colo, sep))| JobSpec {
                        job_name: format!("j{i}"),
                        requirements: Requirements {
                            required_capacity: f64::from(cap) / 2.0,
                            required_cores: cores,
                            required_capabilities: caps,
                            priority_band: band,
                        },
                        co_locate_with: colo
                            .into_iter()
                            .filter(|&k| k < n && k != i)
                            .map(|k| format!("j{k}"))
                            .collect(),
                        separate_from: sep
                            .into_iter()
                            .filter(|&k| k < n && k != i)
                            .map(|k| format!("j{k}"))
                            .collect(),
                    })
                    .collect();
                let nodes: Vec<NodeSpec> = nodes
                    .iter()
                    .enumerate()
                    .map(|(i, g)| to_node(i, g))
                    .collect();
                let request = PlacementRequest {
                    bundle_id: "b".into(),
                    replica_index: 1,
                    jobs,
                    pools: pool_order
                        .into_iter()
                        .map(|i| POOLS.get(i).copied().unwrap_or("missing").to_owned())
                        .collect(),
                    kind: if recovery {
                        PlacementKind::Recovery
                    } else {
                        PlacementKind::First
                    },
                    intra_replica: intra,
                    inter_replica: inter,
                    other_replicas: others
                        .into_iter()
                        .map(|(n, z)| Position {
                            node: format!("n{n:02}"),
                            zone: z.map(|z| ZONES[z].to_owned()),
                        })
                        .collect(),
                    placed_siblings: Vec::new(),
                };
                Scenario {
                    pools: vec![p0, p1, p2],
                    nodes,
                    request,
                    degraded,
                }
            },
        )
}

fn load(s: &Scenario) -> Engine {
    let mut e = Engine::new(ClusterSnapshot {
        pools: s.pools.clone(),
        nodes: s.nodes.clone(),
        pending_window_ms: 60_000,
    })
    .expect("generated snapshot is valid");
    for &(p, z) in &s.degraded {
        e.set_provisioning_paused(POOLS[p], ZONES[z], true);
    }
    e
}

/// Whether node `id` is in a zone the scenario holds as degraded in its pool.
fn in_degraded_zone(s: &Scenario, id: &str) -> bool {
    s.nodes.iter().any(|n| {
        n.id == id
            && s.degraded
                .iter()
                .any(|&(p, z)| n.pool == POOLS[p] && n.zone.as_deref() == Some(ZONES[z]))
    })
}

fn milli_up(v: f64) -> u64 {
    (v * 1000.0).ceil() as u64
}

/// An independent check of a Placed decision against the hard rules, from the inputs alone.
fn check_placed(s: &Scenario, d: &Decision) -> Result<(), String> {
    let Outcome::Placed { pool, assignments } = &d.outcome else {
        return Ok(());
    };
    let req = &s.request;
    let nodes: HashMap<&str, &NodeSpec> = s.nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    // All or nothing: every job exactly once.
    let mut names: Vec<&str> = assignments.iter().map(|a| a.job_name.as_str()).collect();
    names.sort();
    let mut want: Vec<&str> = req.jobs.iter().map(|j| j.job_name.as_str()).collect();
    want.sort();
    if names != want {
        return Err(format!("assigned {names:?}, jobs {want:?}"));
    }
    let at: HashMap<&str, &str> = assignments
        .iter()
        .map(|a| (a.job_name.as_str(), a.node.as_str()))
        .collect();
    let mut load: BTreeMap<&str, (u64, u32)> = BTreeMap::new();
    for a in assignments {
        let n = nodes
            .get(a.node.as_str())
            .ok_or(format!("unknown node {}", a.node))?;
        let j = req
            .jobs
            .iter()
            .find(|j| j.job_name == a.job_name)
            .ok_or("unknown job")?;
        // A replica split across pools: each job in the pool its trace names.
        let job_pool = d.pool_of(&a.job_name).unwrap_or(pool);
        if n.pool != job_pool {
            return Err(format!("{} is not in {job_pool}", a.node));
        }
        if !req.pools.contains(&n.pool) {
            return Err(format!(
                "{} is in pool {}, not in the request's",
                a.node, n.pool
            ));
        }
        if n.cordoned || !n.healthy {
            return Err(format!("{} cordoned or unhealthy", a.node));
        }
        if let Some(t) = n.pending_since_ms
            && NOW.saturating_sub(t) > 60_000
        {
            return Err(format!("{} pending too long", a.node));
        }
        if n.spare {
            let band = j.requirements.priority_band;
            if req.kind == PlacementKind::First {
                return Err(format!("{} is a spare on a first placement", a.node));
            }
            // The band of the node's group may be stronger than the job's own; accept any
            // band of a job sharing the node.
            let ok_band = n.spare_band.is_none_or(|b| {
                b == band
                    || req.jobs.iter().any(|o| {
                        at.get(o.job_name.as_str()) == Some(&a.node.as_str())
                            && o.requirements.priority_band == b
                    })
            });
            if !ok_band {
                return Err(format!("{} is a spare of another band", a.node));
            }
        }
        if !j
            .requirements
            .required_capabilities
            .iter()
            .all(|c| n.capabilities.contains(c))
        {
            return Err(format!("{} lacks capabilities of {}", a.node, a.job_name));
        }
        let e = load.entry(a.node.as_str()).or_default();
        e.0 += milli_up(j.requirements.required_capacity);
        e.1 += j.requirements.required_cores;
        if req.inter_replica.different_node == Some(Strength::Hard)
            && req.other_replicas.iter().any(|p| p.node == a.node)
        {
            return Err(format!("{} shares a node with another replica", a.job_name));
        }
        let zones: Vec<&str> = req
            .other_replicas
            .iter()
            .filter_map(|p| {
                p.zone
                    .as_deref()
                    .or_else(|| nodes.get(p.node.as_str()).and_then(|n| n.zone.as_deref()))
            })
            .collect();
        let has_zone_info = req.other_replicas.iter().any(|p| {
            p.zone.is_some() || nodes.get(p.node.as_str()).is_some_and(|n| n.zone.is_some())
        });
        if req.inter_replica.same_zone == Some(Strength::Hard)
            && has_zone_info
            && !n.zone.as_deref().is_some_and(|z| zones.contains(&z))
        {
            return Err(format!("{} not in the other replicas' zone", a.job_name));
        }
        if req.inter_replica.different_zone == Some(Strength::Hard)
            && n.zone.as_deref().is_some_and(|z| zones.contains(&z))
        {
            return Err(format!("{} in another replica's zone", a.job_name));
        }
        for o in &j.co_locate_with {
            if at.get(o.as_str()) != Some(&a.node.as_str()) {
                return Err(format!("{} not with {o}", a.job_name));
            }
        }
        for o in &j.separate_from {
            if at.get(o.as_str()) == Some(&a.node.as_str()) {
                return Err(format!("{} shares a node with {o}", a.job_name));
            }
        }
    }
    if req.intra_replica.same_node == Some(Strength::Hard) && load.len() > 1 {
        return Err("hard sameNode replica spread over nodes".into());
    }
    for (node, (cap, cores)) in load {
        let n = nodes.get(node).ok_or("node")?;
        let free =
            ((n.total_capacity * 1000.0).floor() as u64).saturating_sub(milli_up(n.used_capacity));
        if cap > free || cores > n.total_cores.saturating_sub(n.used_cores) {
            return Err(format!("{node} over capacity or cores"));
        }
    }
    Ok(())
}

fn pool_index(req: &PlacementRequest, d: &Decision) -> Option<usize> {
    let pool = match &d.outcome {
        Outcome::Placed { pool, .. } | Outcome::Provision { pool, .. } => pool,
        Outcome::Unplaceable { .. } => return None,
    };
    req.pools.iter().position(|p| p == pool)
}

/// Places replica after replica like the operator would, adding provisioned nodes.
fn place_all_replicas(engine: &Engine, b: &BundleSpec) -> bool {
    let mut sim = engine.clone();
    let mut positions = Vec::new();
    let mut ok = true;
    for r in 0..b.replicas {
        let req = b.request_for_replica(r, PlacementKind::First, positions.clone());
        match crate::validate::place_with_provisioning(
            &mut sim,
            &req,
            NOW,
            &format!("~admission-{r}"),
        )
        .1
        {
            Ok(p) => positions.extend(p),
            Err(_) => ok = false,
        }
    }
    ok
}

proptest! {
    // 256 cases by default; PROPTEST_CASES raises it.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn the_engine_decides_exactly_as_the_naive_full_scan(s in scenario()) {
        let e = load(&s);
        prop_assert_eq!(e.place(&s.request, NOW), naive::place(&e, &s.request, NOW));
    }

    #[test]
    fn a_node_in_a_degraded_zone_is_used_only_when_nothing_else_fits(s in scenario()) {
        let e = load(&s);
        let d = e.place(&s.request, NOW);
        let uses_degraded = match &d.outcome {
            Outcome::Placed { assignments, .. } => {
                assignments.iter().any(|a| in_degraded_zone(&s, &a.node))
            }
            _ => false,
        };
        let last_resort = d.trace.pools.iter().any(|p| p.last_resort);
        if uses_degraded {
            prop_assert!(last_resort, "{:?}", d.trace);
        }
        if last_resort {
            // The same cluster with every node of the degraded zones cordoned cannot take the
            // replica: nothing outside them fitted.
            let mut without = e.clone();
            for n in &s.nodes {
                if in_degraded_zone(&s, &n.id) {
                    without.set_cordoned(&n.id, true).expect("known node");
                }
            }
            prop_assert_eq!(without.place(&s.request, NOW).kind(), OutcomeKind::Unplaceable);
        }
        if !s.degraded.is_empty() && d.kind() == OutcomeKind::Provision
            && let Outcome::Provision { pool, zone: Some(z), .. } = &d.outcome
        {
            prop_assert!(!e.provisioning_paused(pool, z), "provisions into degraded {}/{}", pool, z);
        }
    }

    #[test]
    fn hard_rules_capacity_and_cores_are_never_broken(s in scenario()) {
        let d = load(&s).place(&s.request, NOW);
        if let Err(why) = check_placed(&s, &d) {
            prop_assert!(false, "{}: {:?}", why, d);
        }
    }

    #[test]
    fn a_replica_is_all_or_nothing(s in scenario()) {
        let mut e = load(&s);
        let before: f64 = e.node_views().iter().map(|n| n.used_capacity).sum();
        let d = e.place(&s.request, NOW);
        match &d.outcome {
            Outcome::Placed { assignments, .. } => prop_assert_eq!(assignments.len(), s.request.jobs.len()),
            Outcome::Unplaceable { jobs } => prop_assert_eq!(jobs.len(), s.request.jobs.len()),
            Outcome::Provision { .. } => {}
        }
        let committed = e.commit(&d);
        let after: f64 = e.node_views().iter().map(|n| n.used_capacity).sum();
        if d.is_placed() {
            prop_assert!(committed.is_ok());
            let want: u64 = s.request.jobs.iter().map(|j| milli_up(j.requirements.required_capacity)).sum();
            prop_assert!(((after - before) * 1000.0 - want as f64).abs() < 1.0);
        } else {
            prop_assert!(committed.is_err());
            prop_assert_eq!(before, after);
        }
    }

    #[test]
    fn a_later_pool_is_used_only_when_earlier_ones_cannot_take_the_replica(s in scenario()) {
        let e = load(&s);
        let d = e.place(&s.request, NOW);
        // A degraded zone's nodes come after every pool: unless the decision had to use them,
        // an earlier pool is judged without them.
        let mut judge = e.clone();
        if !d.trace.pools.iter().any(|p| p.last_resort) {
            for n in &s.nodes {
                if in_degraded_zone(&s, &n.id) {
                    judge.set_cordoned(&n.id, true).expect("known node");
                }
            }
        }
        // Whole-replica placement is what orders pools; a replica split across pools is one
        // no pool could take whole.
        let k = if d.trace.jobs.is_empty() {
            pool_index(&s.request, &d)
        } else {
            Some(s.request.pools.len())
        };
        if let Some(k) = k {
            for earlier in &s.request.pools[..k] {
                let mut alone = s.request.clone();
                alone.pools = vec![earlier.clone()];
                let d = crate::place::place_whole_replica(&judge, &alone, NOW);
                prop_assert_eq!(d.kind(), OutcomeKind::Unplaceable, "pool {} could take it", earlier);
            }
        }
    }

    #[test]
    fn the_same_inputs_give_the_same_decision_whatever_the_load_order(s in scenario()) {
        let a = load(&s).place(&s.request, NOW);
        let mut reversed = s.clone();
        reversed.nodes.reverse();
        let b = load(&reversed).place(&s.request, NOW);
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a, load(&s).place(&s.request, NOW));
    }

    #[test]
    fn admission_is_ok_exactly_when_every_replica_places(s in scenario(), replicas in 1u32..4) {
        let e = load(&s);
        let b = BundleSpec {
            bundle_id: "b".into(),
            replicas,
            pools: s.request.pools.iter().filter(|p| POOLS.contains(&p.as_str())).cloned().collect(),
            jobs: s.request.jobs.clone(),
            replica_overrides: Default::default(),
            intra_replica_placement: s.request.intra_replica,
            inter_replica_placement: s.request.inter_replica,
        };
        let before = e.node_views();
        let r = validate_admission(&b, &e, NOW);
        prop_assert_eq!(&e.node_views(), &before);
        match r {
            AdmissionResult::ValidationErrors { errors } => prop_assert!(!e.validate_bundle(&b).is_empty(), "{:?}", errors),
            AdmissionResult::Ok => prop_assert!(place_all_replicas(&e, &b)),
            AdmissionResult::NoCapacity { .. } => prop_assert!(!place_all_replicas(&e, &b)),
        }
    }

    #[test]
    fn a_wave_of_commits_never_overfills_a_node(s in scenario(), wave in proptest::collection::vec(job_gen(), 1..30)) {
        let mut e = load(&s);
        for (i, (cap, cores, caps, band, _, _)) in wave.into_iter().enumerate() {
            let mut req = s.request.clone();
            req.bundle_id = format!("w{i}");
            req.jobs = vec![JobSpec {
                job_name: "j".into(),
                requirements: Requirements {
                    required_capacity: f64::from(cap),
                    required_cores: cores,
                    required_capabilities: caps,
                    priority_band: band,
                },
                co_locate_with: vec![],
                separate_from: vec![],
            }];
            let d = e.place(&req, NOW);
            prop_assert_eq!(&d, &naive::place(&e, &req, NOW));
            if d.is_placed() {
                e.commit(&d).expect("commit");
            }
        }
        for (n, orig) in e.node_views().iter().zip({
            let mut v = s.nodes.clone();
            v.sort_by(|a, b| a.id.cmp(&b.id));
            v
        }) {
            // Reservations only land where they fit, so a node is over only if it started over.
            let grew = n.used_capacity > orig.used_capacity + 1e-9 || n.used_cores > orig.used_cores;
            if grew {
                prop_assert!(n.used_capacity <= n.total_capacity + 1e-9, "{:?}", n);
                prop_assert!(n.used_cores <= n.total_cores, "{:?}", n);
            }
        }
    }
}

// ---- arbitrary, hostile input: never a panic ----

fn wild_f64() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        Just(-0.0),
        Just(0.0),
        Just(1e300),
        Just(-5.0),
        Just(f64::MAX),
        Just(f64::MIN_POSITIVE),
        0.0f64..200.0,
        any::<f64>(),
    ]
}

fn wild_name() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        Just("p0".to_owned()),
        Just("n1".to_owned()),
        Just("j0".to_owned()),
        "[a-z0-9~\u{e9}]{0,6}"
    ]
}

fn wild_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(0u32),
        Just(u32::MAX),
        Just(MAX_CORES),
        0u32..32,
        any::<u32>()
    ]
}

fn wild_job() -> impl Strategy<Value = JobSpec> {
    (
        wild_name(),
        wild_f64(),
        wild_u32(),
        proptest::collection::vec(wild_name(), 0..3),
        band(),
        proptest::collection::vec(wild_name(), 0..3),
        proptest::collection::vec(wild_name(), 0..3),
    )
        .prop_map(|(job_name, cap, cores, caps, band, colo, sep)| JobSpec {
            job_name,
            requirements: Requirements {
                required_capacity: cap,
                required_cores: cores,
                required_capabilities: caps,
                priority_band: band,
            },
            co_locate_with: colo,
            separate_from: sep,
        })
}

fn wild_pool() -> impl Strategy<Value = PoolSpec> {
    (
        wild_name(),
        any::<bool>(),
        any::<bool>(),
        proptest::collection::vec(wild_name(), 0..3),
        proptest::collection::vec(
            (
                wild_name(),
                wild_f64(),
                wild_u32(),
                proptest::collection::vec(wild_name(), 0..2),
            ),
            0..3,
        ),
        proptest::option::of(wild_u32()),
    )
        .prop_map(
            |(name, spread, elastic, zones, types, max_nodes)| PoolSpec {
                name,
                kind: PoolKind::Oci,
                region: String::new(),
                zones,
                packing_strategy: if spread {
                    PackingStrategy::Spread
                } else {
                    PackingStrategy::Binpack
                },
                scale_out: if elastic {
                    ScaleOut::Elastic
                } else {
                    ScaleOut::Fixed
                },
                candidate_instance_types: types
                    .into_iter()
                    .map(
                        |(instance_type, total_capacity, total_cores, capabilities)| {
                            InstanceTypeSpec {
                                instance_type,
                                total_capacity,
                                total_cores,
                                capabilities,
                            }
                        },
                    )
                    .collect(),
                max_nodes,
                terminating: false,
            },
        )
}

fn wild_node() -> impl Strategy<Value = NodeSpec> {
    (
        (
            wild_name(),
            wild_name(),
            proptest::option::of(wild_name()),
            wild_f64(),
            wild_f64(),
            wild_u32(),
            wild_u32(),
        ),
        (
            proptest::collection::vec(wild_name(), 0..2),
            any::<u8>(),
            proptest::option::of(band()),
            proptest::option::of(any::<u64>()),
        ),
    )
        .prop_map(
            |((id, pool, zone, cap, used, cores, used_cores), (caps, flags, band, pending))| {
                NodeSpec {
                    id,
                    pool,
                    zone,
                    instance_type: None,
                    total_capacity: cap,
                    used_capacity: used,
                    total_cores: cores,
                    used_cores,
                    capabilities: caps,
                    cordoned: flags & 1 == 1,
                    healthy: flags & 2 == 0,
                    spare: flags & 4 == 4,
                    spare_band: band,
                    pending_since_ms: pending,
                }
            },
        )
}

proptest! {
    // 256 cases by default; PROPTEST_CASES raises it.
    #![proptest_config(ProptestConfig::default())]

    #[test]
    fn hostile_input_never_panics(
        pools in proptest::collection::vec(wild_pool(), 0..4),
        nodes in proptest::collection::vec(wild_node(), 0..12),
        jobs in proptest::collection::vec(wild_job(), 0..5),
        pool_refs in proptest::collection::vec(wild_name(), 0..4),
        others in proptest::collection::vec((wild_name(), proptest::option::of(wild_name())), 0..3),
        siblings in proptest::collection::vec((wild_name(), wild_name()), 0..2),
        (intra, inter, recovery, replicas, now) in (rules(), rules(), any::<bool>(), wild_u32(), any::<u64>()),
    ) {
        let _ = Engine::new(ClusterSnapshot { pools: pools.clone(), nodes: nodes.clone(), pending_window_ms: 60_000 });
        let (mut e, _errors) = Engine::new_lenient(ClusterSnapshot { pools: pools.clone(), nodes: nodes.clone(), pending_window_ms: 60_000 });
        let req = PlacementRequest {
            bundle_id: "b".into(),
            replica_index: 0,
            jobs: jobs.clone(),
            pools: pool_refs.clone(),
            kind: if recovery { PlacementKind::Recovery } else { PlacementKind::First },
            intra_replica: intra,
            inter_replica: inter,
            other_replicas: others.into_iter().map(|(node, zone)| Position { node, zone }).collect(),
            placed_siblings: siblings.into_iter().map(|(job_name, node)| SiblingPosition { job_name, node, zone: None }).collect(),
        };
        let d = e.place(&req, now);
        prop_assert_eq!(&d, &naive::place(&e, &req, now));
        let _ = d.summary();
        let _ = e.commit(&d);
        let b = BundleSpec {
            bundle_id: "b".into(),
            replicas: replicas % 8,
            pools: pool_refs,
            jobs,
            replica_overrides: Default::default(),
            intra_replica_placement: intra,
            inter_replica_placement: inter,
        };
        let _ = validate_bundle(&b, &pools, &nodes);
        let _ = validate_admission(&b, &e, now);
        for n in &nodes {
            let _ = e.reserve(JobKey { bundle_id: "x".into(), replica_index: 0, job_name: n.id.clone() }, &n.id, n.used_capacity, n.used_cores);
            let _ = e.remove_node(&n.id);
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Upsert(usize, NodeGen),
    Remove(usize),
    Cordon(usize, bool),
    Healthy(usize, bool),
    Started(usize),
    Reserve(usize, u32, u32),
    Release(usize),
    Pool(PoolSpec),
    RemovePool(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..40, node_gen()).prop_map(|(i, g)| Op::Upsert(i, g)),
        (0usize..40).prop_map(Op::Remove),
        (0usize..40, any::<bool>()).prop_map(|(i, b)| Op::Cordon(i, b)),
        (0usize..40, any::<bool>()).prop_map(|(i, b)| Op::Healthy(i, b)),
        (0usize..40).prop_map(Op::Started),
        (0usize..40, 0u32..40, 0u32..4).prop_map(|(i, c, k)| Op::Reserve(i, c, k)),
        (0usize..40).prop_map(Op::Release),
        prop_oneof![pool_spec("p0"), pool_spec("p1"), pool_spec("p2")].prop_map(Op::Pool),
        (0usize..3).prop_map(Op::RemovePool),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    /// Indexes kept up to date op by op answer exactly like a full scan of the current state.
    #[test]
    fn indexes_stay_exact_through_any_sequence_of_updates(s in scenario(), ops in proptest::collection::vec(op(), 1..40)) {
        let mut e = load(&s);
        for op in ops {
            let id = |i: usize| format!("n{i:02}");
            let key = |i: usize| JobKey { bundle_id: "ops".into(), replica_index: 0, job_name: format!("k{i}") };
            match op {
                Op::Upsert(i, g) => { let _ = e.upsert_node(to_node(i, &g)); }
                Op::Remove(i) => { e.remove_node(&id(i)); }
                Op::Cordon(i, b) => { let _ = e.set_cordoned(&id(i), b); }
                Op::Healthy(i, b) => { let _ = e.set_healthy(&id(i), b); }
                Op::Started(i) => { let _ = e.mark_started(&id(i)); }
                Op::Reserve(i, c, k) => { let _ = e.reserve(key(i), &id(i), f64::from(c), k); }
                Op::Release(i) => { e.release_job(&key(i)); }
                Op::Pool(p) => { e.upsert_pool(p).expect("generated pool is valid"); }
                Op::RemovePool(i) => { e.remove_pool(POOLS[i]); }
            }
            prop_assert_eq!(e.place(&s.request, NOW), naive::place(&e, &s.request, NOW));
        }
    }
}

/// A family where only a split works: plain jobs (some kept apart by `separateFrom`) fit only
/// the first pool, whose nodes lack `gpu`; gpu jobs fit only the second pool, whose gpu nodes
/// each have room for one gpu job and nothing more.
fn split_only() -> impl Strategy<Value = Scenario> {
    (
        proptest::collection::vec((1u32..20, 0u32..3, proptest::option::of(0usize..4)), 1..4),
        proptest::collection::vec(1u32..20, 1..3),
        any::<bool>(),
    )
        .prop_map(|(plain, gpu, spread)| {
            let strategy = if spread {
                PackingStrategy::Spread
            } else {
                PackingStrategy::Binpack
            };
            let n_plain = plain.len();
            let mut jobs: Vec<JobSpec> = Vec::new();
            for (i, (cap, cores, sep)) in plain.iter().enumerate() {
                let mut j = JobSpec::new(
                    &format!("p{i}"),
                    f64::from(*cap),
                    *cores,
                    PriorityBand::Gold,
                );
                j.separate_from = sep
                    .filter(|&k| k < n_plain && k != i)
                    .map(|k| vec![format!("p{k}")])
                    .unwrap_or_default();
                jobs.push(j);
            }
            let mut nodes: Vec<NodeSpec> = Vec::new();
            // One plain node per plain job: room for all of them even when kept apart.
            for i in 0..n_plain {
                nodes.push(NodeSpec::ready(
                    &format!("a{i}"),
                    "p0",
                    Some(ZONES[i % 3]),
                    100.0,
                    16,
                ));
            }
            for (i, cap) in gpu.iter().enumerate() {
                // Sized to its node exactly: a gpu node has no room for anything else.
                let need = f64::from(*cap) + 20.0;
                let mut j = JobSpec::new(&format!("g{i}"), need, 1, PriorityBand::Gold);
                j.requirements.required_capabilities = vec!["gpu".into()];
                jobs.push(j);
                let mut n = NodeSpec::ready(&format!("g{i}"), "p1", Some(ZONES[i % 3]), need, 1);
                n.capabilities = vec!["gpu".into()];
                nodes.push(n);
            }
            let fixed = |name: &str| PoolSpec {
                name: name.into(),
                kind: PoolKind::Cluster,
                region: "r".into(),
                zones: Vec::new(),
                packing_strategy: strategy,
                scale_out: ScaleOut::Fixed,
                candidate_instance_types: Vec::new(),
                max_nodes: None,
                terminating: false,
            };
            Scenario {
                pools: vec![fixed("p0"), fixed("p1"), fixed("p2")],
                nodes,
                request: PlacementRequest {
                    bundle_id: "b".into(),
                    replica_index: 0,
                    jobs,
                    pools: vec!["p0".into(), "p1".into()],
                    kind: PlacementKind::First,
                    intra_replica: PlacementRules::none(),
                    inter_replica: PlacementRules::inter_replica_default(),
                    other_replicas: Vec::new(),
                    placed_siblings: Vec::new(),
                },
                degraded: Vec::new(),
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::default())]

    /// "No worse" by construction: whatever the whole-replica placer placed (or asked a node
    /// for), the engine decides exactly the same, pools, nodes and trace.
    #[test]
    fn whatever_the_whole_replica_placer_places_is_placed_the_same(s in scenario()) {
        let e = load(&s);
        let old = crate::place::place_whole_replica(&e, &s.request, NOW);
        let new = e.place(&s.request, NOW);
        let old_last_resort = old.trace.pools.iter().any(|p| p.last_resort);
        if old.kind() != OutcomeKind::Unplaceable && !old_last_resort {
            prop_assert_eq!(&new, &old);
        } else if old.kind() != OutcomeKind::Unplaceable {
            if new == old {
                return Ok(());
            }
            // The old placer fell back to the nodes of a degraded zone; a split that keeps
            // clear of them comes first.
            prop_assert!(!new.trace.jobs.is_empty(), "{:?}", new);
            prop_assert!(!new.trace.jobs.iter().flat_map(|j| &j.pools_tried).any(|p| p.last_resort));
            if let Outcome::Placed { assignments, .. } = &new.outcome {
                prop_assert!(assignments.iter().all(|a| !in_degraded_zone(&s, &a.node)));
            }
        } else if new.kind() != OutcomeKind::Unplaceable {
            // Only a replica no pool takes whole is split, and then every job says its pool.
            let placed: Vec<&str> = match &new.outcome {
                Outcome::Placed { assignments, .. } => {
                    assignments.iter().map(|a| a.job_name.as_str()).collect()
                }
                _ => new.trace.jobs.iter().map(|j| j.job_name.as_str()).collect(),
            };
            for job in placed {
                let t = new.trace.jobs.iter().find(|j| j.job_name == job);
                prop_assert!(t.is_some(), "no pool trace for {}", job);
                let t = t.expect("checked");
                // Every pool before the job's own was left, with a reason.
                let (last, before) = t.pools_tried.split_last().expect("a pool was tried");
                prop_assert_eq!(&last.pool, &t.pool);
                prop_assert!(last.outcome != PoolOutcome::Left);
                prop_assert!(before.iter().all(|p| p.outcome == PoolOutcome::Left && p.reason.is_some()));
            }
            if let Err(why) = check_placed(&s, &new) {
                prop_assert!(false, "{}: {:?}", why, new);
            }
        } else {
            prop_assert_eq!(&new, &old);
        }
    }

    /// Where only a split works, the old placer gives up and the engine places every job, in
    /// the pool it needs, breaking no hard rule.
    #[test]
    fn a_replica_only_a_split_can_place_is_placed(s in split_only()) {
        let e = load(&s);
        prop_assert_eq!(
            crate::place::place_whole_replica(&e, &s.request, NOW).kind(),
            OutcomeKind::Unplaceable
        );
        let d = e.place(&s.request, NOW);
        prop_assert!(d.is_placed(), "{}", d.trace.message);
        prop_assert!(d.is_split());
        for j in &s.request.jobs {
            let want = if j.job_name.starts_with('g') { "p1" } else { "p0" };
            prop_assert_eq!(d.pool_of(&j.job_name), Some(want), "{}", j.job_name);
        }
        if let Err(why) = check_placed(&s, &d) {
            prop_assert!(false, "{}: {:?}", why, d);
        }
        prop_assert_eq!(&d, &naive::place(&e, &s.request, NOW));
        let mut e = e;
        prop_assert!(e.commit(&d).is_ok());
    }
}

/// The split's worth over a fixed generated set: 1,000 clusters and requests drawn from the
/// general generator with proptest's fixed seed (`TestRunner::deterministic`), each placed by the
/// whole-replica placer and by the engine. Counts the replicas placed only because their jobs
/// split across pools and prints `fidelity-figure split_placed=<n>` for `make test-fidelity`.
/// Whatever the whole-replica placer placed, the engine places too.
#[test]
fn replicas_placed_only_by_a_split_in_a_fixed_generated_set() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    const SET: usize = 1_000;
    let mut runner = TestRunner::deterministic();
    let strategy = scenario();
    let (mut split_placed, mut whole_placed, mut lost) = (0usize, 0usize, Vec::new());
    for i in 0..SET {
        let s = strategy
            .new_tree(&mut runner)
            .expect("the generator draws a scenario")
            .current();
        let e = load(&s);
        let old = crate::place::place_whole_replica(&e, &s.request, NOW);
        let new = e.place(&s.request, NOW);
        match (
            old.kind() != OutcomeKind::Unplaceable,
            new.kind() != OutcomeKind::Unplaceable,
        ) {
            (true, true) => whole_placed += 1,
            (true, false) => lost.push(i),
            (false, true) => {
                if let Err(why) = check_placed(&s, &new) {
                    panic!("scenario {i}: {why}: {new:?}");
                }
                if new.is_split() {
                    split_placed += 1;
                }
            }
            (false, false) => {}
        }
    }
    assert!(
        lost.is_empty(),
        "the engine lost what the whole-replica placer placed: {lost:?}"
    );
    assert!(
        split_placed > 0,
        "no replica in the set needed a split: the set shows nothing"
    );
    eprintln!(
        "split: {split_placed} of {SET} generated replicas placed only by a split across pools ({whole_placed} placed whole by both)"
    );
    println!("fidelity-figure split_placed={split_placed}");
}
