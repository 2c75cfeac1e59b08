//! Four of the TypeScript library's promises proven on the real stack (real apiserver + etcd,
//! the manager-sim binary, the operator binary): a drain's overlap and handover jobs never
//! without a running instance, a flapping node held out longer each time, spares up before a
//! scheduled window opens, and a reclaim notice run to its deadline with every job moved first.
//!
//! Uncovered time is Manager's own accounting (the sim's `JobHistory`), never the operator's
//! view. Each test prints a `fidelity-figure key=value` line once its assertions passed;
//! `make test-fidelity` collects them into one summary line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use automanager_api::MigrationPhase::{Completed, StoppingSource};
use automanager_api::MigrationStrategy::{self, Handover, Overlap, StopThenStart};
use automanager_api::PriorityBand::Silver;
use automanager_api::{
    DRAIN_NODE_LABEL, DrainMode, HotSpareTarget, ManagerNode, Migration, NodeState, PURPOSE_LABEL,
};
use automanager_e2e::scenario::{
    BundleView, Conditions, JobManifest, MigrationView, bundle, fixed_pool, job, job_id, show,
    spare_target,
};
use automanager_e2e::stack::Stack;
use automanager_e2e::{apply_example_pools, repo_root};
use chrono::{DateTime, TimeDelta, Timelike, Utc};
use manager_client::proto::{JobHistoryRequest, JobHistoryResponse, JobRole};

/// The demo's stack with the example pools.
async fn start() -> Stack {
    let stack = Stack::start().await.expect("stack");
    apply_example_pools(&stack).await.unwrap();
    stack
}

/// One silver job of 20 units declaring `strategy`, on the on-prem pool.
fn moving_job(name: &str, strategy: MigrationStrategy) -> automanager_api::Bundle {
    bundle(
        name,
        1,
        &["onprem"],
        [job("enc", 20, Silver).cores(2).moves_by(strategy)],
    )
}

/// Runs one `moving_job` per (name, strategy) on `node` (the other on-prem nodes cordoned
/// meanwhile), then uncordons the others and waits until the operator has taken that in.
async fn all_on(stack: &Stack, node: &str, jobs: &[(&str, MigrationStrategy)]) {
    let others: Vec<&str> = ["onprem-a1", "onprem-a2", "onprem-b1"]
        .into_iter()
        .filter(|n| *n != node)
        .collect();
    for n in &others {
        stack.cordon(n).await;
        stack.wait_cordoned(n, true).await;
    }
    for (name, strategy) in jobs {
        stack.create(&moving_job(name, *strategy)).await;
    }
    for (name, _) in jobs {
        let b = stack.expect_ready(name).await;
        assert_eq!(b.node_of(0, "enc"), Some(node), "{}", show(&b));
    }
    for n in &others {
        stack.uncordon(n).await;
    }
    for n in &others {
        stack.wait_cordoned(n, false).await;
    }
}

/// Manager's raw history of job `id` (with each start's time).
async fn raw_history(stack: &Stack, id: &str) -> JobHistoryResponse {
    let mut admin = automanager_e2e::reliability::sim_admin(&stack.sim_endpoint)
        .await
        .expect("the sim's admin API");
    admin
        .job_history(JobHistoryRequest {
            job_id: id.to_owned(),
        })
        .await
        .unwrap_or_else(|e| panic!("the sim's history of {id}: {e}"))
        .into_inner()
}

/// The Migration labelled `label` (a key, or `key=value`) that moved `bundle`'s job.
async fn migration_of(stack: &Stack, label: &str, bundle: &str) -> Migration {
    let all = stack.list_labelled::<Migration>(label).await;
    let mut mine: Vec<Migration> = all
        .iter()
        .filter(|m| m.spec.job.bundle == bundle)
        .cloned()
        .collect();
    assert_eq!(
        mine.len(),
        1,
        "one Migration ({label}) of {bundle}:\n{}",
        show(&all)
    );
    mine.remove(0)
}

/// The library's drop-free drain: a `mode: migrate` drain of a node running an overlap, a
/// handover and a stopThenStart job. Manager's history says the overlap and handover jobs always
/// had a running instance; the stopThenStart job was without one once, for no longer than its
/// Migration spent between stopping the source and completing.
#[tokio::test]
async fn a_migrate_drain_leaves_overlap_and_handover_jobs_never_uncovered() {
    let stack = start().await;
    let jobs = [
        ("dg-over", Overlap),
        ("dg-hand", Handover),
        ("dg-stop", StopThenStart),
    ];
    all_on(&stack, "onprem-a1", &jobs).await;

    stack.drain("onprem-a1", DrainMode::Migrate).await;
    let node = stack.wait_drained("onprem-a1").await;
    let drain = node
        .status
        .as_ref()
        .and_then(|s| s.drain.clone())
        .expect("a drained node has drain figures");
    assert_eq!(
        (
            drain.jobs_migrated,
            drain.jobs_recovered,
            drain.jobs_dropped
        ),
        (3, 0, 0),
        "{}",
        show(&node)
    );

    let mut overlap_handover_uncovered_ms = 0;
    for (name, strategy) in jobs {
        stack.expect_ready_off(name, "onprem-a1").await;
        let m = migration_of(&stack, DRAIN_NODE_LABEL, name).await;
        assert_eq!(m.phase(), Some(Completed), "{}", show(&m));
        assert_eq!(m.strategy(), Some(strategy), "{}", show(&m));
        let target = m.target_node().expect("a target node").to_owned();
        let history = stack.job_history(&job_id(name, 0, "enc")).await;
        assert_eq!(
            history.starts,
            [
                ("onprem-a1".to_owned(), "normal".to_owned()),
                (target, "migrationTarget".to_owned())
            ],
            "{name}: moved once by its Migration: {}",
            show(&history)
        );
        if strategy == StopThenStart {
            // The one gap lies between the source's stop and the Migration's completion (both
            // clocks are this machine's; status times may be whole seconds).
            let stopping = m.entered(StoppingSource).expect("StoppingSource entered");
            let completed = m.entered(Completed).expect("Completed entered");
            let span_ms = (completed - stopping).num_milliseconds();
            assert_eq!(history.gaps, 1, "{name}: {}", show(&history));
            assert!(
                i64::try_from(history.uncovered_ms).unwrap() <= span_ms + 1_000,
                "{name}: uncovered {} ms, beyond its Migration's StoppingSource..Completed ({span_ms} ms): {}",
                history.uncovered_ms,
                show(&m)
            );
            eprintln!(
                "fidelity: drain {name} (stopThenStart) uncovered {} ms in {} gap, within its Migration's StoppingSource..Completed span of {span_ms} ms",
                history.uncovered_ms, history.gaps
            );
        } else {
            assert_eq!(
                (history.gaps, history.uncovered_ms),
                (0, 0),
                "{name} ({strategy:?}) was without a running instance: {}",
                show(&history)
            );
            overlap_handover_uncovered_ms += history.uncovered_ms;
        }
    }
    println!("fidelity-figure drain_gaps_overlap_handover={overlap_handover_uncovered_ms}");
}

/// The flap settings' first hold-out (the rejection window), in seconds.
const FLAP_BASE_S: i64 = 5;

/// A flapping node through the operator binary: a one-node pool whose worker refuses a start
/// (the sim's `reject-next`) each time the node is back. With one refusal tripping it, the node
/// is held out for the rejection window the first time, twice that the second, four times the
/// third; its ManagerNode says so in `unhealthyEpisodes`, `heldOutUntil` and the `Stalled`
/// condition (`FlappingHeldOut` from the second episode on), and it takes work again after each.
#[tokio::test]
async fn a_flapping_node_is_held_out_one_two_and_four_times_the_base() {
    let dir = tempfile::tempdir().unwrap();
    let (sim_config, pool) = fixed_pool(dir.path(), "rack", &[("r1", "za")]).unwrap();
    let stack = Stack::start_custom(&sim_config, &[], |c| {
        c.insert(
            "nodeHealth".into(),
            serde_json::json!({
                "rejectionThreshold": 1,
                "rejectionWindow": format!("{FLAP_BASE_S}s"),
                "flapMaxHold": "10m",
                "flapMemory": "1h",
            }),
        );
    })
    .await
    .expect("stack");
    stack.create(&pool).await;
    stack
        .wait_until("r1", "to be mirrored healthy", |n: &ManagerNode| {
            n.status
                .as_ref()
                .is_some_and(|s| s.state == NodeState::Started && s.healthy)
        })
        .await;

    let mut holds = Vec::new();
    for episode in 1..=3 {
        // The worker refuses the next start; a new bundle asks for one. The episode begins
        // between `before` and the moment its status is read.
        stack.chaos(&["reject-next", "1"]).unwrap();
        let before = Utc::now();
        let name = format!("flap-{episode}");
        stack
            .create(&bundle(&name, 1, &["rack"], [job("enc", 10, Silver)]))
            .await;
        let n = stack
            .wait_until(
                "r1",
                &format!("to be in unhealthy episode {episode}"),
                |n: &ManagerNode| {
                    n.status.as_ref().is_some_and(|s| {
                        s.unhealthy_episodes == episode && s.held_out_until.is_some()
                    })
                },
            )
            .await;
        let observed = Utc::now();
        let s = n.status.as_ref().unwrap();
        assert!(!s.healthy, "{}", show(&n));
        let until = s.held_out_until.unwrap();
        let expected = TimeDelta::seconds(FLAP_BASE_S << (episode - 1));
        // held_until = trip + hold, trip within [before, observed]; a second either side for
        // timestamps written in whole seconds.
        let (shortest, longest) = (until - observed, until - before);
        let slack = TimeDelta::seconds(1);
        assert!(
            shortest - slack <= expected && expected <= longest + slack,
            "episode {episode}: held out until {until}, so for {shortest} to {longest}, not {expected}: {}",
            show(&n)
        );
        let want_reason = if episode == 1 {
            "RejectionRateTripped"
        } else {
            "FlappingHeldOut"
        };
        assert_eq!(
            (n.condition_status("Stalled"), n.condition_reason("Stalled")),
            (
                Some(automanager_api::ConditionStatus::True),
                Some(want_reason)
            ),
            "episode {episode}: {}",
            show(&n)
        );
        if episode > 1 {
            let msg = n.condition_message("Stalled").unwrap_or_default();
            assert!(
                msg.contains(&format!("unhealthy {episode} times in a row")),
                "{msg}"
            );
        }
        eprintln!(
            "fidelity: flap episode {episode}: held out until {until} ({expected} expected; {shortest}..{longest} from the status)"
        );
        holds.push(expected);

        // Back after the hold-out: healthy, the episode remembered, and placement uses it
        // again (the bundle it refused runs there now).
        let back = stack
            .wait_until(
                "r1",
                &format!("to be healthy again after episode {episode}"),
                |n: &ManagerNode| {
                    n.status.as_ref().is_some_and(|s| {
                        s.healthy && s.held_out_until.is_none() && s.unhealthy_episodes == episode
                    })
                },
            )
            .await;
        let came_back = Utc::now();
        assert!(
            came_back + slack >= until,
            "episode {episode}: healthy at {came_back}, before its hold-out ended at {until}: {}",
            show(&back)
        );
        assert!(
            !back.has_condition("Stalled"),
            "episode {episode}: still stalled: {}",
            show(&back)
        );
        stack.wait_until_running_on(&name, 0, "r1").await;
    }
    assert_eq!(
        holds,
        [1, 2, 4].map(|k| TimeDelta::seconds(FLAP_BASE_S * k)),
        "1x, 2x, 4x the base"
    );
    println!("fidelity-figure flap_holdout_tested=yes");
}

/// The aws-east pool's start latency in the schedule test's sim, declared on its PlacementPool
/// too (`startLatencySeconds`: Manager's published API reports none): with the operator's
/// margin (a quarter of it, at least 10 s) a schedule applies 16 s ahead of its window.
const SCHEDULE_START_DELAY_MS: i64 = 6_000;
const SCHEDULE_LEAD: TimeDelta = TimeDelta::seconds(16);

/// A spare schedule whose clock starts before its window: the target is created with no spares
/// (the window opens at the next whole minute at least 30 s past its lead), the schedule applies
/// a lead ahead of the window, and by Manager's own record both spares were created no earlier
/// than the lead and up before the window opened, and still up once it had.
#[tokio::test]
async fn a_scheduled_spare_tier_is_up_when_its_window_opens() {
    let demo = std::fs::read_to_string(repo_root().join("deploy/demo/manager-sim.yaml")).unwrap();
    let config = demo.replacen(
        "  - name: aws-east\n",
        &format!("  - name: aws-east\n    startDelayMs: {SCHEDULE_START_DELAY_MS}\n"),
        1,
    );
    assert_ne!(config, demo);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manager-sim.yaml");
    std::fs::write(&path, config).unwrap();
    let stack = Stack::start_custom(&path, &[], |_| {})
        .await
        .expect("stack");
    apply_example_pools(&stack).await.unwrap();
    let declared = format!(
        r#"{{"spec":{{"startLatencySeconds":{}}}}}"#,
        SCHEDULE_START_DELAY_MS / 1_000
    );
    let out = (stack.env)
        .run_kubectl([
            "patch",
            "placementpool",
            "aws-east",
            "--type",
            "merge",
            "-p",
            &declared,
        ])
        .await
        .unwrap();
    assert!(
        out.success(),
        "declaring aws-east's start latency: {}",
        out.stderr
    );

    // The next whole minute with room for the target's first status before the lead begins.
    let earliest = Utc::now() + SCHEDULE_LEAD + TimeDelta::seconds(30);
    let opens = (earliest + TimeDelta::seconds(59))
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .unwrap();
    let lead_begins = opens - SCHEDULE_LEAD;
    let pattern = format!("{} {} * * *", opens.minute(), opens.hour());
    let mut target = spare_target("ahead", "aws-east", 0, "m5.xlarge", "eu-west-1");
    target.spec.schedules = vec![
        serde_json::from_value(
            serde_json::json!({"schedule": pattern, "duration": "2m", "hot": {"count": 2}}),
        )
        .unwrap(),
    ];
    stack.create(&target).await;

    // Before the lead: nothing in effect, and the change due when the lead begins.
    let t = stack
        .wait_until("ahead", "to have its first status", |t: &HotSpareTarget| {
            t.status
                .as_ref()
                .is_some_and(|s| s.next_schedule_change.is_some())
        })
        .await;
    let s = t.status.as_ref().unwrap();
    assert!(
        Utc::now() < lead_begins,
        "the first status came after the lead began: {}",
        show(&t)
    );
    assert_eq!(
        (
            s.target_count,
            s.active_schedules.len(),
            s.live_spares + s.pending_spares
        ),
        (0, 0, 0),
        "{}",
        show(&t)
    );
    assert_eq!(
        s.next_schedule_change,
        Some(lead_begins),
        "the schedule applies its pool's start latency plus the margin ahead: {}",
        show(&t)
    );

    // The lead: both spares up, the schedule in effect.
    let t = stack
        .wait_until(
            "ahead",
            "to have its scheduled spares up",
            |t: &HotSpareTarget| {
                t.status.as_ref().is_some_and(|s| {
                    s.live_spares == 2
                        && s.target_count == 2
                        && s.active_schedules == [pattern.clone()]
                })
            },
        )
        .await;
    let spares = t.status.as_ref().unwrap().spare_nodes.clone();
    assert_eq!(spares.len(), 2, "{}", show(&t));
    let started_before_opening = |state: &manager_client::MirrorState| -> Vec<String> {
        spares
            .iter()
            .filter_map(|id| state.nodes.get(id))
            .filter(|n| {
                n.state() == manager_client::proto::NodeState::Started
                    && n.created_at_ms >= lead_begins.timestamp_millis() - 1_000
                    && n.state_changed_at_ms < opens.timestamp_millis()
            })
            .map(|n| n.node_id.clone())
            .collect()
    };
    let manager = automanager_e2e::reliability::manager_state(&stack.sim_endpoint)
        .await
        .unwrap();
    assert_eq!(
        started_before_opening(&manager),
        spares,
        "by Manager's record, both spares were created after the lead began ({lead_begins}) and started before the window opened ({opens}): {:?}",
        spares
            .iter()
            .map(|id| manager.nodes.get(id))
            .collect::<Vec<_>>()
    );

    // The window opens: the same spares are up, started before it.
    let until_open = (opens + TimeDelta::seconds(1) - Utc::now())
        .to_std()
        .unwrap_or_default();
    tokio::time::sleep(until_open).await;
    let manager = automanager_e2e::reliability::manager_state(&stack.sim_endpoint)
        .await
        .unwrap();
    assert_eq!(
        started_before_opening(&manager),
        spares,
        "at the window's opening ({opens}): {:?}",
        spares
            .iter()
            .map(|id| manager.nodes.get(id))
            .collect::<Vec<_>>()
    );
    let t: HotSpareTarget = stack.get("ahead").await;
    let s = t.status.as_ref().unwrap();
    assert_eq!(
        (s.live_spares, s.active_schedules.clone()),
        (2, vec![pattern.clone()]),
        "{}",
        show(&t)
    );
    let ahead_ms: Vec<i64> = spares
        .iter()
        .filter_map(|id| manager.nodes.get(id))
        .map(|n| opens.timestamp_millis() - n.state_changed_at_ms)
        .collect();
    eprintln!(
        "fidelity: schedule {pattern:?} opens at {opens}; applied from {lead_begins}; spares {spares:?} started {ahead_ms:?} ms before it opened (Manager's record)"
    );
    println!("fidelity-figure schedule_ahead_tested=yes");
}

/// How long Manager gives the noticed node in the notice test.
const NOTICE_S: &str = "30";

/// A reclaim notice (the sim's `notice-node`) run to its deadline: every job on the node is
/// moved by its declared strategy, by Manager's history each started elsewhere and its
/// Migration completed before the node went, never restarted after; the overlap and handover
/// jobs never without a running instance.
#[tokio::test]
async fn a_reclaim_notice_run_to_its_deadline_moves_every_job_before_the_node_goes() {
    let stack = start().await;
    let jobs = [
        ("nt-over", Overlap),
        ("nt-hand", Handover),
        ("nt-stop", StopThenStart),
    ];
    let noticed = "onprem-a2";
    all_on(&stack, noticed, &jobs).await;

    stack
        .chaos(&["notice-node", noticed, "--in", NOTICE_S])
        .unwrap();
    let n = stack
        .wait_until(noticed, "to carry its reclaim notice", |n: &ManagerNode| {
            n.status.as_ref().is_some_and(|s| s.reclaim_at.is_some())
        })
        .await;
    let deadline: DateTime<Utc> = n.status.as_ref().and_then(|s| s.reclaim_at).unwrap();
    stack
        .wait_until(noticed, "to be taken at its deadline", |n: &ManagerNode| {
            n.status
                .as_ref()
                .is_some_and(|s| s.state == NodeState::Terminated)
        })
        .await;

    let reclaim_label = format!("{PURPOSE_LABEL}=reclaim");
    let (mut moved, mut gaps, mut report) = (0, 0, Vec::new());
    for (name, strategy) in jobs {
        let m = migration_of(&stack, &reclaim_label, name).await;
        let history = raw_history(&stack, &job_id(name, 0, "enc")).await;
        let target = history
            .starts
            .iter()
            .find(|s| s.role() == JobRole::MigrationTarget);
        let completed = m.entered(Completed);
        let in_time = m.phase() == Some(Completed)
            && completed.is_some_and(|c| c < deadline)
            && history.starts.len() == 2
            && history.starts[0].node_id == noticed
            && target.is_some_and(|t| {
                t.node_id != noticed
                    && Some(t.node_id.as_str()) == m.target_node()
                    && t.at_ms < deadline.timestamp_millis()
            })
            && history.running == 1;
        if in_time {
            moved += 1;
        }
        let uncovered = history.gaps > 0 || history.uncovered_ms > 0;
        if strategy != StopThenStart && uncovered {
            gaps += 1;
        }
        report.push(format!(
            "{name} ({strategy:?}): moved before the deadline {in_time}, completed {:?} ms before it, {} gap(s), uncovered {} ms, starts {:?}",
            completed.map(|c| (deadline - c).num_milliseconds()),
            history.gaps,
            history.uncovered_ms,
            history
                .starts
                .iter()
                .map(|s| (s.node_id.as_str(), s.role().as_str_name(), s.at_ms))
                .collect::<Vec<_>>()
        ));
    }
    let percent = moved * 100 / jobs.len();
    let report = report.join("\n");
    eprintln!("fidelity: notice deadline {deadline}\n{report}");
    assert_eq!((percent, gaps), (100, 0), "deadline {deadline}:\n{report}");
    for (name, _) in jobs {
        stack.expect_ready_off(name, noticed).await;
    }
    println!("fidelity-figure notice_moved_before_deadline={percent}% notice_gaps={gaps}");
}
