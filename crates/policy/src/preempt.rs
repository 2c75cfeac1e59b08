//! Preemption for recovery: which bronze jobs a gold (or, when configured, silver) recovery
//! may stop when it finds no capacity and no spare.
//!
//! The TypeScript library (`@norskvideo/norsk-auto-manager`) has no preemption; the operator adds
//! it on top of the bronze band's drop semantics (a preempted bronze job is dropped, as it would
//! be had its node failed). The choice, on one node:
//!
//! 1. only bronze jobs are victims, never gold or silver;
//! 2. the fewest victims that free enough capacity and cores for the recovering replica;
//! 3. among choices of that size, the newest victims (the most recently started first: they
//!    have the least to lose);
//! 4. among nodes, the one needing the fewest victims, then the newest, then the node id, so the
//!    answer does not depend on the order of the input.
//!
//! Pure: no clock, no I/O. The search is exact for up to [`MAX_CANDIDATES_PER_NODE`] bronze jobs
//! per node (the newest ones); an older bronze job beyond that is never chosen.

use std::cmp::Ordering;

use crate::PriorityBand;

/// Bronze jobs considered per node (the newest). Bounds the search: combinations are tried by
/// increasing size, and a node with more bronze jobs than this keeps its oldest.
pub const MAX_CANDIDATES_PER_NODE: usize = 16;

/// What the recovering replica needs on one node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Need {
    pub capacity: f64,
    pub cores: u32,
}

/// A running job on a node, as preemption sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningJob {
    /// Manager's job id (unique).
    pub job_id: String,
    pub band: PriorityBand,
    pub capacity: f64,
    pub cores: u32,
    /// When this instance started (ms since the epoch): larger is newer.
    pub started_at_ms: i64,
}

/// A node the recovering replica could use if enough were freed on it: it passes every other
/// filter (capabilities, rules, not cordoned, healthy).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeCandidate {
    pub node_id: String,
    pub free_capacity: f64,
    pub free_cores: u32,
    pub jobs: Vec<RunningJob>,
}

/// The chosen preemption: stop `victims` (job ids, newest first) on `node_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    pub node_id: String,
    pub victims: Vec<String>,
}

/// Slack for float sums of capacity.
const EPS: f64 = 1e-9;

/// Picks the node and bronze victims for a recovery needing `need`; `None` when no node can be
/// freed enough by stopping bronze jobs alone (or when it needs no preemption at all: a node
/// that fits already is the caller's to use, not this function's).
pub fn choose_victims(need: Need, nodes: &[NodeCandidate]) -> Option<Preemption> {
    let mut best: Option<(Vec<&RunningJob>, &str)> = None;
    for node in nodes {
        if fits(node.free_capacity, node.free_cores, need) {
            continue;
        }
        let Some(victims) = victims_on(node, need) else {
            continue;
        };
        let better = match &best {
            None => true,
            Some((b, id)) => {
                compare(&victims, b).then_with(|| node.node_id.as_str().cmp(id)) == Ordering::Less
            }
        };
        if better {
            best = Some((victims, &node.node_id));
        }
    }
    best.map(|(victims, node)| Preemption {
        node_id: node.to_owned(),
        victims: victims.iter().map(|j| j.job_id.clone()).collect(),
    })
}

fn fits(capacity: f64, cores: u32, need: Need) -> bool {
    capacity + EPS >= need.capacity && cores >= need.cores
}

/// Newest first, then by id: the order victims are preferred in.
fn newer_first(a: &RunningJob, b: &RunningJob) -> Ordering {
    b.started_at_ms
        .cmp(&a.started_at_ms)
        .then_with(|| a.job_id.cmp(&b.job_id))
}

/// Fewer victims first; then the newer set (compared victim by victim, newest first).
fn compare(a: &[&RunningJob], b: &[&RunningJob]) -> Ordering {
    a.len().cmp(&b.len()).then_with(|| {
        for (x, y) in a.iter().zip(b) {
            let o = newer_first(x, y);
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    })
}

/// The fewest, then newest, bronze jobs of `node` whose stop frees `need`.
fn victims_on(node: &NodeCandidate, need: Need) -> Option<Vec<&RunningJob>> {
    let mut bronze: Vec<&RunningJob> = node
        .jobs
        .iter()
        .filter(|j| j.band == PriorityBand::Bronze)
        .collect();
    bronze.sort_by(|a, b| newer_first(a, b));
    bronze.truncate(MAX_CANDIDATES_PER_NODE);
    let total_cap: f64 = bronze.iter().map(|j| j.capacity.max(0.0)).sum();
    let total_cores: u32 = bronze.iter().map(|j| j.cores).fold(0, u32::saturating_add);
    if !fits(
        node.free_capacity + total_cap,
        node.free_cores.saturating_add(total_cores),
        need,
    ) {
        return None;
    }
    // Combinations of size k in lexicographic order over the newest-first list: the first that
    // frees enough is the newest set of the fewest victims.
    let n = bronze.len();
    for k in 1..=n {
        let mut idx: Vec<usize> = (0..k).collect();
        loop {
            let cap: f64 = idx.iter().map(|&i| bronze[i].capacity.max(0.0)).sum();
            let cores: u32 = idx
                .iter()
                .map(|&i| bronze[i].cores)
                .fold(0, u32::saturating_add);
            if fits(
                node.free_capacity + cap,
                node.free_cores.saturating_add(cores),
                need,
            ) {
                return Some(idx.iter().map(|&i| bronze[i]).collect());
            }
            if !next_combination(&mut idx, n) {
                break;
            }
        }
    }
    None
}

/// Advances `idx` (strictly increasing indices below `n`) to the next combination of its size in
/// lexicographic order; `false` after the last.
fn next_combination(idx: &mut [usize], n: usize) -> bool {
    let k = idx.len();
    let mut i = k;
    while i > 0 {
        i -= 1;
        if idx[i] < n - k + i {
            idx[i] += 1;
            for j in i + 1..k {
                idx[j] = idx[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn job(id: &str, band: PriorityBand, capacity: f64, cores: u32, at: i64) -> RunningJob {
        RunningJob {
            job_id: id.into(),
            band,
            capacity,
            cores,
            started_at_ms: at,
        }
    }

    fn node(id: &str, free: f64, free_cores: u32, jobs: Vec<RunningJob>) -> NodeCandidate {
        NodeCandidate {
            node_id: id.into(),
            free_capacity: free,
            free_cores,
            jobs,
        }
    }

    const B: PriorityBand = PriorityBand::Bronze;
    const S: PriorityBand = PriorityBand::Silver;
    const G: PriorityBand = PriorityBand::Gold;

    fn need(capacity: f64, cores: u32) -> Need {
        Need { capacity, cores }
    }

    #[test]
    fn table() {
        struct Case {
            name: &'static str,
            need: Need,
            nodes: Vec<NodeCandidate>,
            want: Option<(&'static str, Vec<&'static str>)>,
        }
        let cases = vec![
            Case {
                name: "one big bronze job beats two small ones",
                need: need(4.0, 0),
                nodes: vec![node(
                    "n1",
                    0.0,
                    0,
                    vec![
                        job("small-a", B, 2.0, 0, 30),
                        job("small-b", B, 2.0, 0, 20),
                        job("big", B, 4.0, 0, 10),
                    ],
                )],
                want: Some(("n1", vec!["big"])),
            },
            Case {
                name: "of equal count, the newest victim",
                need: need(2.0, 0),
                nodes: vec![node(
                    "n1",
                    0.0,
                    0,
                    vec![job("old", B, 2.0, 0, 10), job("new", B, 2.0, 0, 99)],
                )],
                want: Some(("n1", vec!["new"])),
            },
            Case {
                name: "gold and silver are never victims",
                need: need(2.0, 0),
                nodes: vec![node(
                    "n1",
                    0.0,
                    0,
                    vec![job("g", G, 8.0, 0, 99), job("s", S, 8.0, 0, 98)],
                )],
                want: None,
            },
            Case {
                name: "free room counts towards the need",
                need: need(3.0, 0),
                nodes: vec![node(
                    "n1",
                    2.0,
                    0,
                    vec![job("g", G, 4.0, 0, 1), job("b", B, 1.0, 0, 2)],
                )],
                want: Some(("n1", vec!["b"])),
            },
            Case {
                name: "cores are a second bound",
                need: need(1.0, 4),
                nodes: vec![node(
                    "n1",
                    0.0,
                    0,
                    vec![
                        job("cap-only", B, 5.0, 0, 50),
                        job("cores-a", B, 0.5, 2, 40),
                        job("cores-b", B, 0.5, 2, 30),
                    ],
                )],
                want: Some(("n1", vec!["cores-a", "cores-b"])),
            },
            Case {
                name: "the node with fewer victims wins over the newer ones",
                need: need(4.0, 0),
                nodes: vec![
                    node(
                        "a",
                        0.0,
                        0,
                        vec![job("a1", B, 2.0, 0, 100), job("a2", B, 2.0, 0, 99)],
                    ),
                    node("b", 0.0, 0, vec![job("b1", B, 4.0, 0, 1)]),
                ],
                want: Some(("b", vec!["b1"])),
            },
            Case {
                name: "victims come from one node, never two",
                need: need(4.0, 0),
                nodes: vec![
                    node("a", 0.0, 0, vec![job("a1", B, 2.0, 0, 1)]),
                    node("b", 0.0, 0, vec![job("b1", B, 2.0, 0, 1)]),
                ],
                want: None,
            },
            Case {
                name: "a node that already fits needs no preemption",
                need: need(1.0, 0),
                nodes: vec![node("a", 1.0, 0, vec![job("a1", B, 2.0, 0, 1)])],
                want: None,
            },
            Case {
                name: "ties on count and age break on the node id",
                need: need(1.0, 0),
                nodes: vec![
                    node("z", 0.0, 0, vec![job("z1", B, 1.0, 0, 5)]),
                    node("m", 0.0, 0, vec![job("m1", B, 1.0, 0, 5)]),
                ],
                want: Some(("m", vec!["m1"])),
            },
        ];
        for c in cases {
            let got = choose_victims(c.need, &c.nodes);
            let want = c.want.map(|(n, v)| Preemption {
                node_id: n.into(),
                victims: v.into_iter().map(String::from).collect(),
            });
            assert_eq!(got, want, "{}", c.name);
        }
    }

    fn arb_band() -> impl Strategy<Value = PriorityBand> {
        prop_oneof![Just(B), Just(S), Just(G)]
    }

    fn arb_nodes() -> impl Strategy<Value = Vec<NodeCandidate>> {
        proptest::collection::vec(
            (
                0u32..4,
                0u32..3,
                proptest::collection::vec((arb_band(), 1u32..5, 0u32..3, 0i64..20), 0..7),
            ),
            1..5,
        )
        .prop_map(|nodes| {
            nodes
                .into_iter()
                .enumerate()
                .map(|(n, (free, free_cores, jobs))| {
                    node(
                        &format!("n{n}"),
                        f64::from(free),
                        free_cores,
                        jobs.into_iter()
                            .enumerate()
                            .map(|(j, (band, cap, cores, at))| {
                                job(&format!("n{n}-j{j}"), band, f64::from(cap), cores, at)
                            })
                            .collect(),
                    )
                })
                .collect()
        })
    }

    /// The fewest bronze jobs of `n` whose stop frees `need`, by brute force over every subset.
    fn fewest_by_brute_force(n: &NodeCandidate, need: Need) -> Option<usize> {
        let bronze: Vec<&RunningJob> = n.jobs.iter().filter(|j| j.band == B).collect();
        (0u32..(1 << bronze.len()))
            .filter(|mask| {
                let (cap, cores) = bronze
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << i) != 0)
                    .fold((n.free_capacity, n.free_cores), |(c, k), (_, j)| {
                        (c + j.capacity, k + j.cores)
                    });
                fits(cap, cores, need)
            })
            .map(|mask| mask.count_ones() as usize)
            .min()
    }

    proptest! {
        #[test]
        fn victims_are_bronze_enough_and_no_more_than_needed(
            nodes in arb_nodes(),
            cap in 1u32..8,
            cores in 0u32..4,
        ) {
            let need = need(f64::from(cap), cores);
            let got = choose_victims(need, &nodes);
            let fewest_anywhere = nodes
                .iter()
                .filter(|n| !fits(n.free_capacity, n.free_cores, need))
                .filter_map(|n| fewest_by_brute_force(n, need))
                .min();
            match got {
                None => prop_assert_eq!(fewest_anywhere, None),
                Some(p) => {
                    let n = nodes.iter().find(|n| n.node_id == p.node_id);
                    prop_assert!(n.is_some());
                    let n = n.unwrap_or(&nodes[0]);
                    let victims: Vec<&RunningJob> = p
                        .victims
                        .iter()
                        .filter_map(|v| n.jobs.iter().find(|j| &j.job_id == v))
                        .collect();
                    prop_assert_eq!(victims.len(), p.victims.len(), "victims are jobs of the node");
                    prop_assert!(victims.iter().all(|j| j.band == B), "only bronze");
                    let cap: f64 = n.free_capacity + victims.iter().map(|j| j.capacity).sum::<f64>();
                    let cores: u32 = n.free_cores + victims.iter().map(|j| j.cores).sum::<u32>();
                    prop_assert!(fits(cap, cores, need), "enough is freed");
                    prop_assert_eq!(Some(victims.len()), fewest_anywhere, "no more than needed");
                }
            }
        }

        #[test]
        fn the_choice_does_not_depend_on_input_order(
            nodes in arb_nodes(),
            cap in 1u32..8,
            cores in 0u32..4,
        ) {
            let need = need(f64::from(cap), cores);
            let mut reversed: Vec<NodeCandidate> = nodes.iter().rev().cloned().collect();
            for n in &mut reversed {
                n.jobs.reverse();
            }
            prop_assert_eq!(choose_victims(need, &nodes), choose_victims(need, &reversed));
        }
    }
}
