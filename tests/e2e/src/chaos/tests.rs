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
            Fault::KillNode { node }
            | Fault::Drain { node, .. }
            | Fault::Cordon { node, .. }
            | Fault::Notice { node, .. }
            | Fault::DrainNotice { node, .. } => {
                vec![node]
            }
            Fault::DeletePool { pool, node, .. } => {
                if nodes.get(node) != Some(&pool.as_str()) {
                    bad(format!(
                        "delete-pool {pool} kills {node}, not one of its nodes"
                    ));
                }
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
    // A notice of the node a job runs on when it is due may take a node of any of its pools.
    let reserved: Vec<&Vec<String>> = s
        .events
        .iter()
        .filter_map(|e| match &e.fault {
            Fault::MigrateNotice { pools, .. } => Some(pools),
            _ => None,
        })
        .collect();
    for p in &c.pools {
        let n = taken
            .iter()
            .filter(|t| nodes.get(**t) == Some(&p.name.as_str()))
            .count()
            + reserved.iter().filter(|r| r.contains(&p.name)).count();
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
            | Fault::FailJob { .. }
            | Fault::Notice { .. }
            | Fault::ForeignStop { .. }
            | Fault::ForeignStart { .. }
            | Fault::ForeignDelete { .. } => admin.push(t),
            Fault::DrainNotice { after_ms, .. }
            | Fault::MigrateNotice { after_ms, .. }
            | Fault::DeletePool { after_ms, .. } => {
                writes.push(t);
                admin.push(t + after_ms);
            }
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

    // Every process stays up from a notice to a little past its deadline.
    for e in &s.events {
        let quiet = match &e.fault {
            Fault::Notice { in_ms, .. } => Some((e.at_ms, e.at_ms + in_ms)),
            Fault::DrainNotice {
                after_ms, in_ms, ..
            }
            | Fault::MigrateNotice {
                after_ms, in_ms, ..
            } => Some((e.at_ms + after_ms, e.at_ms + after_ms + in_ms)),
            _ => None,
        };
        if let Some((from, until)) = quiet
            && let Some((what, f, u)) = outages.iter().find(|(_, f, u)| from < *u && *f < until)
        {
            bad(format!(
                "{what} down {f}..{u} while {} runs out ({from}..{until})",
                e.fault
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
        ("delete-pool", 1),
        ("foreign-delete", 1),
    ] {
        if count(k) > most {
            bad(format!("{} of {k}", count(k)));
        }
    }
    if count("restart-sim-kept") + count("restart-sim-wiped") > 2 {
        bad("more than two sim restarts".into());
    }
    if count("notice-node") + count("notice-drained") + count("notice-migrated") > MAX_NOTICES {
        bad("more than two reclaim notices".into());
    }

    // No Bundle drawn after a pool's deletion names it.
    let mut closed: BTreeSet<&str> = BTreeSet::new();
    for e in &s.events {
        match &e.fault {
            Fault::DeletePool { pool, .. } => {
                closed.insert(pool);
            }
            Fault::UpdateBundle { spec, .. }
            | Fault::CreateBundle { spec, .. }
            | Fault::RecreateBundle { spec, .. } => {
                if let Some(p) = spec.pools.iter().find(|p| closed.contains(p.as_str())) {
                    bad(format!("{} names {p}, which is being deleted", e.fault));
                }
            }
            _ => {}
        }
    }

    // The foreign client: ids of its own (no operator's form), jobs on known nodes, and faults
    // that name its jobs and bundles.
    let mut foreign_jobs: BTreeSet<String> = BTreeSet::new();
    for b in &s.foreign {
        if crate::reliability::operator_id(&b.id) {
            bad(format!(
                "foreign bundle {} has an id of the operator's form",
                b.id
            ));
        }
        for (name, node) in &b.jobs {
            if !nodes.contains_key(node) {
                bad(format!("foreign {} on unknown node {node}", b.job_id(name)));
            }
            foreign_jobs.insert(b.job_id(name));
        }
    }
    for e in &s.events {
        let known = match &e.fault {
            Fault::ForeignStop { job } | Fault::ForeignStart { job, .. } => {
                foreign_jobs.contains(job)
            }
            Fault::ForeignDelete { bundle } => s.foreign.iter().any(|b| &b.id == bundle),
            _ => true,
        };
        if !known {
            bad(format!("{} names nothing of the foreign client", e.fault));
        }
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

    // Every Migration has a name of its own.
    let mut names = BTreeSet::new();
    for e in &s.events {
        if let Fault::Migrate { name, .. } | Fault::MigrateNotice { name, .. } = &e.fault
            && !names.insert(name.as_str())
        {
            bad(format!("{} reuses the name {name}", e.fault));
        }
    }

    // Jobs named by Migrations and crashes exist in the wave.
    let wave: BTreeMap<&str, &BundleSpec> = s.wave.iter().map(|(n, b)| (n.as_str(), b)).collect();
    for e in &s.events {
        if let Fault::Migrate { job, .. }
        | Fault::FailJob { job }
        | Fault::MigrateNotice { job, .. } = &e.fault
        {
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

#[test]
fn the_new_interplays_are_drawn_with_their_targets() {
    let c = config();
    let (mut held_targets, mut migrate_notices, mut closed_after_delete) = (0, 0, 0);
    for seed in 0..300 {
        let s = Schedule::generate(seed, &c);
        let holding: BTreeSet<&str> = s
            .wave
            .iter()
            .filter(|(_, b)| b.hold.is_some())
            .map(|(n, _)| n.as_str())
            .collect();
        for e in &s.events {
            match &e.fault {
                Fault::MigrateNotice { job, pools, .. } => {
                    migrate_notices += 1;
                    held_targets += usize::from(holding.contains(job.bundle.as_str()));
                    let wave = s.wave.iter().find(|(n, _)| *n == job.bundle);
                    assert_eq!(wave.map(|(_, b)| &b.pools), Some(pools), "{}", e.fault);
                }
                Fault::DeletePool { .. } => closed_after_delete += 1,
                _ => {}
            }
        }
        // Two or three foreign bundles, each with its own jobs on fleet nodes.
        assert!((2..=3).contains(&s.foreign.len()), "seed {seed}");
        assert!(s.foreign.iter().all(|b| b.id.starts_with("default-chaos-")));
    }
    // A notice after a Migration mostly targets a Bundle that holds its moves.
    assert!(migrate_notices > 0 && held_targets * 2 > migrate_notices);
    assert!(closed_after_delete > 0);
}

#[test]
fn a_held_bundle_declares_a_window_closed_now_or_a_budget_of_zero() {
    assert_eq!(closed_window(3)["schedule"], "0 15 * * *");
    assert_eq!(closed_window(20)["schedule"], "0 8 * * *");
    let mut spec = Schedule::generate(3, &config()).wave[0].1.clone();
    spec.hold = Some(Hold::Window);
    let m = spec.manifest_at("w", 10);
    assert_eq!(
        m["spec"]["disruption"],
        serde_json::json!({"windows": [{"schedule": "0 22 * * *", "duration": "1h"}]})
    );
    let b: automanager_api::Bundle = serde_json::from_value(m).expect("a Bundle");
    assert!(b.spec.disruption.is_some());
    spec.hold = Some(Hold::Budget);
    assert_eq!(
        spec.manifest_at("b", 10)["spec"]["disruption"],
        serde_json::json!({"maxUnavailableReplicas": 0})
    );
    assert!(spec.to_string().ends_with(" budget 0"), "{spec}");
    spec.hold = None;
    assert!(spec.manifest_at("n", 10)["spec"]["disruption"].is_null());
}

#[test]
fn holding_follows_each_bundles_last_spec() {
    let spec = |hold| BundleSpec {
        replicas: 1,
        pools: vec!["la".into()],
        jobs: Vec::new(),
        spread_zones: false,
        hold,
    };
    let s = Schedule {
        seed: 0,
        wave: vec![
            ("a".into(), spec(Some(Hold::Window))),
            ("b".into(), spec(None)),
            ("c".into(), spec(Some(Hold::Budget))),
        ],
        foreign: Vec::new(),
        events: vec![
            Event {
                at_ms: 0,
                fault: Fault::UpdateBundle {
                    name: "a".into(),
                    spec: spec(None),
                },
            },
            Event {
                at_ms: 1,
                fault: Fault::CreateBundle {
                    name: "d".into(),
                    spec: spec(Some(Hold::Budget)),
                },
            },
        ],
    };
    assert_eq!(
        s.holding(),
        [
            ("c".to_owned(), Hold::Budget),
            ("d".to_owned(), Hold::Budget)
        ]
        .into()
    );
    let closed: BTreeSet<String> = ["la".to_owned()].into();
    assert_eq!(spec(None).without_pools(&closed), None);
}

#[test]
fn a_pair_writes_at_its_start_and_calls_the_sim_at_its_end() {
    let f = Fault::DrainNotice {
        node: "la-00001".into(),
        mode: DrainMode::Migrate,
        after_ms: 2_000,
        in_ms: 10_000,
    };
    assert_eq!(
        f.instants(5_000),
        [(Needs::Apiserver, 5_000), (Needs::SimAdmin, 7_000)]
    );
    assert_eq!(f.quiet(5_000), Some((7_000, 19_000)));
    assert_eq!(
        Fault::Cordon {
            node: "n".into(),
            for_ms: Some(3_000)
        }
        .instants(1_000),
        [(Needs::Apiserver, 1_000), (Needs::Apiserver, 4_000)]
    );
    assert_eq!(
        Fault::ForeignStop { job: "j".into() }.instants(9),
        [(Needs::SimAdmin, 9)]
    );
    assert_eq!(
        Fault::RestartSim {
            wipe: false,
            down_ms: 500
        }
        .instants(9),
        []
    );
}

mod books {
    use super::super::ledger::*;
    use crate::reliability::InstanceState::{self, *};

    fn inst(node: &str, at: i64, state: InstanceState, stop: StopWhy) -> InstanceView {
        InstanceView {
            node_id: node.into(),
            normal: true,
            state,
            started_at_ms: at,
            stop,
        }
    }

    fn job(id: &str, instances: Vec<InstanceView>) -> JobView {
        JobView {
            job_id: id.into(),
            bundle_id: id.split('/').next().unwrap_or_default().into(),
            instances,
        }
    }

    fn view(jobs: Vec<JobView>, bundles: &[(&str, u64)]) -> View {
        View {
            nodes: Vec::new(),
            jobs,
            bundles: bundles.iter().map(|(b, g)| ((*b).to_owned(), *g)).collect(),
        }
    }

    const F: &str = "default-chaos-9000";
    const J: &str = "default-chaos-9000/0/enc";

    fn started_book() -> ForeignBook {
        let mut b = ForeignBook::default();
        b.registered(F, 1);
        // The Watch may show the registration only after the call returned: not yet shown is
        // not gone.
        b.observe(&view(Vec::new(), &[]));
        assert!(b.touched().is_empty(), "{:?}", b.touched());
        b.asked_start(J, "la-00001");
        b.observe(&view(
            vec![job(J, vec![inst("la-00001", 10, Running, StopWhy::None)])],
            &[(F, 1)],
        ));
        b
    }

    #[test]
    fn what_the_foreign_client_asked_for_and_what_manager_did_itself_are_no_touch() {
        let mut b = started_book();
        // Its own stop, then its own start elsewhere.
        b.asked_stop(J);
        b.observe(&view(
            vec![job(
                J,
                vec![inst("la-00001", 10, Ended, StopWhy::Requested)],
            )],
            &[(F, 1)],
        ));
        b.asked_start(J, "lb-00002");
        b.observe(&view(
            vec![job(J, vec![inst("lb-00002", 20, Running, StopWhy::None)])],
            &[(F, 1)],
        ));
        // The node dies under it: Manager's doing.
        b.observe(&view(
            vec![job(J, vec![inst("lb-00002", 20, Ended, StopWhy::NodeLost)])],
            &[(F, 1)],
        ));
        // Its own delete.
        b.asked_delete(F);
        b.observe(&view(Vec::new(), &[]));
        assert!(b.touched().is_empty(), "{:?}", b.touched());
    }

    #[test]
    fn a_stop_a_start_a_migration_a_termination_and_a_bundle_change_it_did_not_ask_for_are_touches()
    {
        let mut b = started_book();
        b.observe(&view(
            vec![job(
                J,
                vec![inst("la-00001", 10, Stopping, StopWhy::Requested)],
            )],
            &[(F, 2)],
        ));
        b.observe(&view(
            vec![job(
                J,
                vec![
                    inst("lb-00003", 30, Running, StopWhy::None),
                    InstanceView {
                        normal: false,
                        ..inst("lc-00001", 31, Starting, StopWhy::None)
                    },
                ],
            )],
            &[(F, 2)],
        ));
        b.observe(&view(
            vec![job(
                J,
                vec![inst("lb-00003", 30, Ended, StopWhy::NodeTerminated)],
            )],
            &[],
        ));
        assert_eq!(
            b.touched().iter().map(String::as_str).collect::<Vec<_>>(),
            [
                "bundle default-chaos-9000: changed by another client (generation 1 -> 2)",
                "bundle default-chaos-9000: deleted by another client",
                "default-chaos-9000/0/enc: a migration target started on lc-00001",
                "default-chaos-9000/0/enc: its node lb-00003 was terminated under it",
                "default-chaos-9000/0/enc: started on lb-00003 by another client",
                "default-chaos-9000/0/enc: stopped on la-00001 by another client",
            ]
        );
        // Judged once: the same view again adds nothing.
        let n = b.touched().len();
        b.observe(&view(
            vec![job(
                J,
                vec![inst("lb-00003", 30, Ended, StopWhy::NodeTerminated)],
            )],
            &[],
        ));
        assert_eq!(b.touched().len(), n);
    }

    #[test]
    fn a_wiped_manager_takes_the_foreign_work_with_it_and_keeps_what_was_counted() {
        let mut b = started_book();
        b.observe(&view(
            vec![job(J, vec![inst("la-00001", 10, Ended, StopWhy::Migrated)])],
            &[(F, 1)],
        ));
        assert_eq!(b.touched().len(), 1);
        b.wiped();
        b.observe(&view(Vec::new(), &[]));
        assert_eq!(b.touched().len(), 1, "{:?}", b.touched());
        assert!(!b.owns(F));
        // Jobs of bundles it never registered are not its own.
        b.observe(&view(
            vec![job(
                "default.chaos-0001/0/enc",
                vec![inst("la-00001", 5, Ended, StopWhy::Requested)],
            )],
            &[("default.chaos-0001", 3)],
        ));
        assert_eq!(b.touched().len(), 1);
    }

    fn node(id: &str, reclaim_at_ms: i64, terminated: bool) -> NodeView {
        NodeView {
            id: id.into(),
            terminated,
            reclaim_at_ms,
        }
    }

    const A: &str = "default.chaos-0001/0/enc";
    const B: &str = "default.chaos-0002/0/enc";
    const C: &str = "default.chaos-0003/1/pkg";
    const D: &str = "default.chaos-0004/0/enc";

    /// Four operator jobs on a noticed node (deadline 1000): A moved before it (a migration's
    /// target started at 900 runs on), B was still there when the node went, C left with its
    /// Bundle, D was restarted elsewhere only after the deadline. B and D are misses; a foreign
    /// job there is not the operator's to move.
    #[test]
    fn a_job_not_running_elsewhere_when_its_noticed_node_goes_is_a_miss() {
        let mut d = DeadlineBook::default();
        let on_n = |j: &str| job(j, vec![inst("n", 1, Running, StopWhy::None)]);
        let before = View {
            nodes: vec![node("n", 1_000, false), node("m", 0, false)],
            jobs: vec![on_n(A), on_n(B), on_n(C), on_n(D), on_n(J)],
            bundles: Default::default(),
        };
        d.observe(&before);
        assert_eq!(d.judged(), 0);
        let after = View {
            nodes: vec![node("n", 1_000, true), node("m", 0, false)],
            jobs: vec![
                job(
                    A,
                    vec![
                        inst("n", 1, Ended, StopWhy::Migrated),
                        inst("m", 900, Running, StopWhy::None),
                    ],
                ),
                job(B, vec![inst("n", 1, Ended, StopWhy::NodeLost)]),
                job(C, vec![inst("n", 1, Ended, StopWhy::BundleRemoved)]),
                job(D, vec![inst("m", 1_200, Running, StopWhy::None)]),
                job(J, vec![inst("n", 1, Ended, StopWhy::NodeLost)]),
            ],
            bundles: Default::default(),
        };
        d.observe(&after);
        d.observe(&after);
        assert_eq!(d.judged(), 1);
        assert_eq!(
            d.misses().iter().map(String::as_str).collect::<Vec<_>>(),
            [
                "default.chaos-0002/0/enc: on n until it went (deadline 1000), not running elsewhere",
                "default.chaos-0004/0/enc: on n until it went (deadline 1000), not running elsewhere",
            ]
        );
    }

    #[test]
    fn a_node_without_a_notice_or_forgotten_by_a_wiped_manager_is_not_judged() {
        let mut d = DeadlineBook::default();
        let on = |n: &str, state| job(A, vec![inst(n, 1, state, StopWhy::None)]);
        d.observe(&View {
            nodes: vec![node("n", 1_000, false), node("k", 0, false)],
            jobs: vec![on("n", Running)],
            bundles: Default::default(),
        });
        // Manager starts again emptied: n is back, noticed no more; k is killed, unnoticed.
        d.observe(&View {
            nodes: vec![node("n", 0, false), node("k", 0, true)],
            jobs: Vec::new(),
            bundles: Default::default(),
        });
        d.observe(&View {
            nodes: vec![node("n", 0, true)],
            jobs: vec![job(A, vec![inst("n", 1, Ended, StopWhy::NodeLost)])],
            bundles: Default::default(),
        });
        assert_eq!(d.judged(), 0);
        assert!(d.misses().is_empty());
    }
}
