use super::*;
use proptest::prelude::*;

fn config() -> ChaosConfig {
    ChaosConfig::sized(52, 48, 30)
}

/// Every bound the module promises, checked from the schedule alone (not with the generator's
/// own bookkeeping); the broken ones, one line each.
fn broken_bounds(s: &Schedule, c: &ChaosConfig) -> Vec<String> {
    let mut out = Vec::new();
    let mut bad = |why: String| out.push(why);
    let nodes: BTreeMap<String, &str> = c
        .pools
        .iter()
        .flat_map(|p| {
            p.node_ids()
                .into_iter()
                .map(move |(id, _)| (id, p.name.as_str()))
        })
        .collect();

    // Times: in order, within the window.
    for w in s.events.windows(2) {
        if w[0].at_ms > w[1].at_ms {
            bad(format!(
                "events out of order: {} then {}",
                w[0].at_ms, w[1].at_ms
            ));
        }
    }
    for e in &s.events {
        if e.at_ms > c.window_ms {
            bad(format!("{} starts at {} past the window", e.fault, e.at_ms));
        }
    }

    // Nodes: known, distinct, at most half of each pool.
    let mut taken: Vec<&str> = Vec::new();
    for e in &s.events {
        let these: Vec<&str> = match &e.fault {
            Fault::KillNode { node } | Fault::Drain { node, .. } | Fault::Cordon { node, .. } => {
                vec![node]
            }
            Fault::KillZone { zone, nodes: ns } => {
                let pool = c.pools.iter().find(|p| p.zones().contains(zone));
                let expected: Vec<String> = pool
                    .map(|p| {
                        p.node_ids()
                            .into_iter()
                            .filter(|(_, z)| z == zone)
                            .map(|(id, _)| id)
                            .collect()
                    })
                    .unwrap_or_default();
                if *ns != expected {
                    bad(format!("kill-zone {zone} names {ns:?}, not its nodes"));
                }
                ns.iter().map(String::as_str).collect()
            }
            _ => Vec::new(),
        };
        taken.extend(these);
    }
    let distinct: BTreeSet<&str> = taken.iter().copied().collect();
    if distinct.len() != taken.len() {
        bad(format!("a node is taken twice: {taken:?}"));
    }
    for p in &c.pools {
        let n = taken
            .iter()
            .filter(|t| nodes.get(**t) == Some(&p.name.as_str()))
            .count();
        if n > p.nodes / 2 {
            bad(format!("{n} of the {} nodes of {} taken", p.nodes, p.name));
        }
    }
    for t in &taken {
        if !nodes.contains_key(*t) {
            bad(format!("unknown node {t}"));
        }
    }

    // Outages: one per process at a time; no write while the apiserver is down, no admin call
    // while the sim is down.
    let mut outages: Vec<(&str, u64, u64)> = Vec::new();
    let mut writes: Vec<u64> = Vec::new();
    let mut admin: Vec<u64> = Vec::new();
    for e in &s.events {
        let t = e.at_ms;
        match &e.fault {
            Fault::PauseApiserver { ms } => outages.push(("apiserver", t, t + ms)),
            Fault::RestartApiserver => outages.push(("apiserver", t, t + APISERVER_RESTART_MS)),
            Fault::RestartSim { down_ms, .. } => outages.push(("sim", t, t + down_ms)),
            Fault::KillOperator { down_ms, .. } => outages.push(("operator", t, t + down_ms)),
            Fault::PauseLeader { ms } => outages.push(("operator", t, t + ms)),
            Fault::KillNode { .. }
            | Fault::KillZone { .. }
            | Fault::CutStreams
            | Fault::FailJob { .. } => admin.push(t),
            Fault::Cordon {
                for_ms: Some(ms), ..
            } => writes.extend([t, t + ms]),
            Fault::RecreateBundle { gap_ms, .. } => writes.extend([t, t + gap_ms]),
            _ => writes.push(t),
        }
    }
    for (i, (a, f1, u1)) in outages.iter().enumerate() {
        for (b, f2, u2) in outages.iter().skip(i + 1) {
            if a == b && f1 < u2 && f2 < u1 {
                bad(format!("{a} outages overlap: {f1}..{u1} and {f2}..{u2}"));
            }
        }
        let due = match *a {
            "apiserver" => &writes,
            "sim" => &admin,
            _ => continue,
        };
        if let Some(t) = due.iter().find(|t| (*f1..*u1).contains(*t)) {
            bad(format!(
                "a call due at {t} while the {a} is down ({f1}..{u1})"
            ));
        }
    }

    // The costly faults, capped.
    let kinds = s.kinds();
    let count = |k: &str| kinds.get(k).copied().unwrap_or(0);
    for (k, most) in [
        ("kill-zone", 1),
        ("restart-apiserver", 1),
        ("drain", 2),
        ("create-bundle", MAX_CREATED),
    ] {
        if count(k) > most {
            bad(format!("{} of {k}", count(k)));
        }
    }
    if count("restart-sim-kept") + count("restart-sim-wiped") > 2 {
        bad("more than two sim restarts".into());
    }

    // Demand: the live Bundles after each fault fit in the bound.
    let most = c.capacity() * MAX_DEMAND_PCT / 100;
    let mut live: BTreeMap<String, u64> = s
        .wave
        .iter()
        .map(|(n, b)| (n.clone(), b.demand()))
        .collect();
    let mut check = |live: &BTreeMap<String, u64>, when: &str| {
        let d: u64 = live.values().sum();
        if d > most {
            bad(format!("demand {d} over {most} {when}"));
        }
    };
    check(&live, "in the wave");
    for e in &s.events {
        match &e.fault {
            Fault::UpdateBundle { name, spec }
            | Fault::CreateBundle { name, spec }
            | Fault::RecreateBundle { name, spec, .. } => {
                live.insert(name.clone(), spec.demand());
            }
            Fault::DeleteBundle { name } => {
                live.remove(name);
            }
            _ => {}
        }
        check(&live, &format!("after {}", e.fault));
    }

    // Jobs named by Migrations and crashes exist in the wave.
    let wave: BTreeMap<&str, &BundleSpec> = s.wave.iter().map(|(n, b)| (n.as_str(), b)).collect();
    for e in &s.events {
        if let Fault::Migrate { job, .. } | Fault::FailJob { job } = &e.fault {
            let exists = wave.get(job.bundle.as_str()).is_some_and(|b| {
                job.replica < b.replicas && b.jobs.iter().any(|j| j.name == job.job)
            });
            if !exists {
                bad(format!("{} names a job the wave does not have", e.fault));
            }
        }
    }
    out
}

#[test]
fn the_same_seed_gives_the_same_schedule_and_another_seed_another() {
    let c = config();
    let a = Schedule::generate(42, &c);
    assert_eq!(a, Schedule::generate(42, &c));
    assert_eq!(a.to_string(), Schedule::generate(42, &c).to_string());
    assert_ne!(a, Schedule::generate(43, &c));
    assert_eq!(a.seed, 42);
}

#[test]
fn every_fault_kind_is_reachable() {
    let c = config();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for seed in 0..300 {
        for (k, n) in Schedule::generate(seed, &c).kinds() {
            *seen.entry(k).or_default() += n;
        }
    }
    let missing: Vec<&&str> = KINDS.iter().filter(|k| !seen.contains_key(**k)).collect();
    assert!(
        missing.is_empty(),
        "never drawn: {missing:?} (seen {seen:?})"
    );
}

#[test]
fn default_schedules_keep_every_bound_and_draw_enough_faults() {
    let c = config();
    let mut faults = 0;
    for seed in 0..500 {
        let s = Schedule::generate(seed, &c);
        let broken = broken_bounds(&s, &c);
        assert!(
            broken.is_empty(),
            "seed {seed}:\n{}\n{s}",
            broken.join("\n")
        );
        assert_eq!(
            s.wave.len(),
            c.bundles,
            "seed {seed}: the default wave fits"
        );
        faults += s.events.len();
    }
    // Most drawn faults fit: the bounds do not starve the schedules.
    assert!(
        faults >= 500 * c.faults.0,
        "{faults} faults in 500 schedules"
    );
}

#[test]
fn steps_start_each_fault_and_end_the_windowed_ones_after_their_start() {
    let s = Schedule::generate(7, &config());
    let steps = s.steps();
    for w in steps.windows(2) {
        assert!(w[0].at_ms <= w[1].at_ms);
    }
    for (i, e) in s.events.iter().enumerate() {
        let mine: Vec<&Step> = steps.iter().filter(|st| st.event == i).collect();
        assert_eq!(mine[0].phase, Phase::Start);
        assert_eq!(mine[0].at_ms, e.at_ms);
        match e.fault.duration_ms() {
            Some(d) => {
                assert_eq!(mine.len(), 2);
                assert_eq!((mine[1].phase, mine[1].at_ms), (Phase::End, e.at_ms + d));
            }
            None => assert_eq!(mine.len(), 1),
        }
    }
}

#[test]
fn manifests_are_bundles_the_api_reads_back_as_drawn() {
    let c = config();
    let s = Schedule::generate(3, &c);
    for (name, spec) in &s.wave {
        let m = spec.manifest(name);
        let b: automanager_api::Bundle =
            serde_json::from_value(m.clone()).expect("a manifest is a Bundle");
        assert_eq!(b.metadata.name.as_deref(), Some(name.as_str()));
        assert_eq!(b.spec.replicas, spec.replicas as i32);
        assert_eq!(b.spec.pools, spec.pools);
        assert_eq!(b.spec.jobs.len(), spec.jobs.len());
        for (j, want) in b.spec.jobs.iter().zip(&spec.jobs) {
            assert_eq!(j.job_name, want.name);
            assert_eq!(j.requirements.required_capacity, i64::from(want.capacity));
            assert_eq!(
                j.co_locate_with,
                want.co_locate_with
                    .map(|c| vec![c.to_owned()])
                    .unwrap_or_default()
            );
        }
        // Every pool named exists in the fleet; a co-located job names a job of the Bundle.
        assert!(
            spec.pools
                .iter()
                .all(|p| c.pools.iter().any(|fp| &fp.name == p))
        );
        assert!(spec.pools.len() == 1 || spec.pools[0] != spec.pools[1]);
    }
}

#[test]
fn a_printed_schedule_names_every_fault_and_the_wave() {
    let s = Schedule::generate(11, &config());
    let text = s.to_string();
    assert!(text.starts_with(&format!(
        "chaos schedule seed=11 faults={} wave={}",
        s.events.len(),
        s.wave.len()
    )));
    for e in &s.events {
        assert!(text.contains(&e.fault.to_string()), "{text}");
    }
    assert!(text.contains("wave chaos-0000: "));
    assert_eq!(
        Fault::KillOperator {
            replica: Replica::Standby,
            down_ms: 1500
        }
        .to_string(),
        "kill-standby (kill -9) down 1.5s"
    );
}

#[test]
fn a_fleet_too_small_for_the_wave_gets_a_smaller_wave_within_the_bound() {
    let c = ChaosConfig::sized(12, 200, 30);
    let s = Schedule::generate(5, &c);
    assert!(s.wave.len() < 200);
    assert!(broken_bounds(&s, &c).is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_seed_and_size_keeps_every_bound(
        seed in any::<u64>(),
        nodes in 12usize..120,
        bundles in 0usize..80,
        window_s in 1u64..90,
    ) {
        let c = ChaosConfig::sized(nodes, bundles, window_s);
        let s = Schedule::generate(seed, &c);
        let broken = broken_bounds(&s, &c);
        prop_assert!(broken.is_empty(), "{}\n{s}", broken.join("\n"));
        prop_assert_eq!(&s, &Schedule::generate(seed, &c));
        prop_assert!(s.events.len() <= c.faults.1);
    }
}
