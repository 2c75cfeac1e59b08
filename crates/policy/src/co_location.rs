//! Moving a job that shares its node by rule: a replica's jobs joined by `coLocateWith` (in
//! either direction) or by a hard intra-replica `sameNode` move as one group.
//!
//! A Migration moves one job. Moving `enc` alone, when `pkg` declares `coLocateWith: [enc]`,
//! would leave the pair on two nodes and nothing would bring them together again. So a
//! Migration's target is chosen for the job's whole group where it runs now (a node with room
//! for all of them), the group's other members that already run elsewhere pin it, and once the
//! job has moved, each member left behind on the old node follows it with a Migration of its own
//! to the same node. Two Migrations of one group never run at once: the second waits for the
//! first, then its target is pinned to where the first put the group.
//!
//! Pure: the caller says which jobs the replica has and where each runs.

use std::collections::{BTreeMap, BTreeSet};

use automanager_placement as pl;

/// The members of `job`'s group among `jobs` (one replica's job specs), `job` included: the
/// jobs joined to it by `coLocateWith` in either direction, transitively, or every job when the
/// replica's intra rule `sameNode` is hard. A job named nowhere is a group of one.
pub fn group(jobs: &[pl::JobSpec], intra: &pl::PlacementRules, job: &str) -> BTreeSet<String> {
    let names: BTreeSet<&str> = jobs.iter().map(|j| j.job_name.as_str()).collect();
    if !names.contains(job) {
        return BTreeSet::from([job.to_owned()]);
    }
    if intra.same_node == Some(pl::Strength::Hard) {
        return names.into_iter().map(str::to_owned).collect();
    }
    let mut edges: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for j in jobs {
        for t in j
            .co_locate_with
            .iter()
            .filter(|t| names.contains(t.as_str()))
        {
            edges.entry(&j.job_name).or_default().insert(t);
            edges.entry(t).or_default().insert(&j.job_name);
        }
    }
    let mut seen = BTreeSet::from([job]);
    let mut todo = vec![job];
    while let Some(n) = todo.pop() {
        for &m in edges.get(n).into_iter().flatten() {
            if seen.insert(m) {
                todo.push(m);
            }
        }
    }
    seen.into_iter().map(str::to_owned).collect()
}

/// The placement request's jobs for moving `job` off `source`: the members of its group that
/// run on `source` now (`job` first), each with `coLocateWith` naming the members that run
/// elsewhere, so the engine pins the group to them; and the members elsewhere, which stay where
/// they are. `running` is where each member runs now (a member not in it does not run).
pub fn move_request(
    jobs: &[pl::JobSpec],
    intra: &pl::PlacementRules,
    job: &str,
    source: &str,
    running: &BTreeMap<String, String>,
) -> (Vec<pl::JobSpec>, BTreeSet<String>) {
    let members = group(jobs, intra, job);
    let on_source = |n: &String| n == job || running.get(n).is_some_and(|at| at == source);
    let elsewhere: BTreeSet<String> = members
        .iter()
        .filter(|n| !on_source(n) && running.contains_key(*n))
        .cloned()
        .collect();
    let mut moving: Vec<pl::JobSpec> = jobs
        .iter()
        .filter(|j| members.contains(&j.job_name) && on_source(&j.job_name))
        .cloned()
        .collect();
    moving.sort_by_key(|j| j.job_name != job);
    for j in &mut moving {
        for e in &elsewhere {
            if !j.co_locate_with.contains(e) {
                j.co_locate_with.push(e.clone());
            }
        }
    }
    (moving, elsewhere)
}

/// The members of `job`'s group left on `source` once `job` has moved to `target`: each is to
/// follow it there. `running` is where each job of the replica runs now.
pub fn followers(
    jobs: &[pl::JobSpec],
    intra: &pl::PlacementRules,
    job: &str,
    source: &str,
    target: &str,
    running: &BTreeMap<String, String>,
) -> Vec<String> {
    if source == target {
        return Vec::new();
    }
    group(jobs, intra, job)
        .into_iter()
        .filter(|n| n != job && running.get(n).is_some_and(|at| at == source))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn job(name: &str, with: &[&str]) -> pl::JobSpec {
        let mut j = pl::JobSpec::new(name, 1.0, 1, pl::PriorityBand::Gold);
        j.co_locate_with = with.iter().map(|s| (*s).to_owned()).collect();
        j
    }

    fn set(v: &[&str]) -> BTreeSet<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn at(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter()
            .map(|(j, n)| ((*j).to_owned(), (*n).to_owned()))
            .collect()
    }

    #[test]
    fn a_group_is_joined_by_co_location_either_way_and_by_a_hard_same_node() {
        let jobs = [
            job("enc", &[]),
            job("pkg", &["enc"]),
            job("thumb", &["pkg"]),
            job("audio", &[]),
        ];
        let none = pl::PlacementRules::default();
        assert_eq!(group(&jobs, &none, "enc"), set(&["enc", "pkg", "thumb"]));
        assert_eq!(group(&jobs, &none, "thumb"), set(&["enc", "pkg", "thumb"]));
        assert_eq!(group(&jobs, &none, "audio"), set(&["audio"]));
        assert_eq!(group(&jobs, &none, "gone"), set(&["gone"]));
        let hard = pl::PlacementRules {
            same_node: Some(pl::Strength::Hard),
            ..pl::PlacementRules::default()
        };
        assert_eq!(group(&jobs, &hard, "audio").len(), 4);
    }

    #[test]
    fn a_move_takes_the_members_on_its_node_and_is_pinned_to_those_elsewhere() {
        let jobs = [
            job("enc", &[]),
            job("pkg", &["enc"]),
            job("thumb", &["enc"]),
        ];
        let none = pl::PlacementRules::default();
        let (moving, elsewhere) = move_request(
            &jobs,
            &none,
            "pkg",
            "n1",
            &at(&[("enc", "n1"), ("pkg", "n1"), ("thumb", "n2")]),
        );
        let names: Vec<&str> = moving.iter().map(|j| j.job_name.as_str()).collect();
        assert_eq!(
            names,
            ["pkg", "enc"],
            "the job first, then its member on n1"
        );
        assert_eq!(elsewhere, set(&["thumb"]));
        assert!(
            moving
                .iter()
                .all(|j| j.co_locate_with.contains(&"thumb".to_owned()))
        );
    }

    #[test]
    fn the_members_left_on_the_old_node_follow() {
        let jobs = [job("enc", &[]), job("pkg", &["enc"]), job("audio", &[])];
        let none = pl::PlacementRules::default();
        let running = at(&[("enc", "n2"), ("pkg", "n1"), ("audio", "n1")]);
        assert_eq!(
            followers(&jobs, &none, "enc", "n1", "n2", &running),
            ["pkg"]
        );
        assert!(followers(&jobs, &none, "enc", "n1", "n1", &running).is_empty());
        assert!(followers(&jobs, &none, "audio", "n1", "n2", &running).is_empty());
    }

    proptest! {
        /// A group holds its job, is the same from each of its members, and a move's request
        /// holds the job and only members of its group.
        #[test]
        fn groups_are_closed_and_moves_stay_inside_them(
            links in proptest::collection::vec((0usize..5, 0usize..5), 0..8),
            who in 0usize..5,
            nodes in proptest::collection::vec(0usize..3, 5),
        ) {
            let names = ["a", "b", "c", "d", "e"];
            let mut jobs: Vec<pl::JobSpec> = names.iter().map(|n| job(n, &[])).collect();
            for (x, y) in links {
                if x != y {
                    jobs[x].co_locate_with.push(names[y].to_owned());
                }
            }
            let none = pl::PlacementRules::default();
            let g = group(&jobs, &none, names[who]);
            prop_assert!(g.contains(names[who]));
            for m in &g {
                prop_assert_eq!(&group(&jobs, &none, m), &g);
            }
            let running: BTreeMap<String, String> = names
                .iter()
                .zip(&nodes)
                .map(|(n, i)| ((*n).to_owned(), format!("n{i}")))
                .collect();
            let source = running[names[who]].clone();
            let (moving, elsewhere) = move_request(&jobs, &none, names[who], &source, &running);
            prop_assert_eq!(&moving[0].job_name, names[who]);
            prop_assert!(moving.iter().all(|j| g.contains(&j.job_name)));
            prop_assert!(elsewhere.iter().all(|e| g.contains(e) && running[e] != source));
        }
    }
}
