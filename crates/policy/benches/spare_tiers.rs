//! `make bench-spare-tiers`: the spare tiers, the window calendar and the reclaim-notice planner
//! over a simulated week and a simulated notice, on a fake clock. Pure policy: no operator, no
//! Manager; what is simulated (load, move durations) is stated below, and every figure has its
//! baseline from the same run on stderr. Ends with one summary line on stdout.
//!
//! - **Idle node-hours.** A week of minutes with a live-video load curve (quiet nights, busy
//!   evenings, a Friday match night); the hot spares a schedule keeps (12 from Friday 18:00 to
//!   23:30 Europe/Oslo, 6 on other evenings, 2 otherwise, with 6 warm ones), applied ahead by a
//!   90 s start latency, against a flat target sized for the peak (12 around the clock).
//!   Stopped (warm) spares cost no compute and are counted apart.
//! - **Voluntary moves outside windows.** Every minute consolidation, rebalance, spare rotation
//!   and drains ask to move something at random; the calendar (02:00-05:00 Europe/Oslo for all
//!   of them, plus Sunday 10:00-12:00 for drains) admits or holds each; every admitted move's
//!   time is then checked against the windows by walking their starts one by one.
//! - **Reclaim.** 1,000 nodes of 8 jobs, 5 % of them noticed at once with 120 s warning; the
//!   planner runs every second, moves take 8 s (handover), 5 s (overlap) or 3 s (stop then
//!   start) once begun, every bundle has two replicas and a budget of one. The baseline is no
//!   notice handling: every job of a noticed node fails at the deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use automanager_policy::calendar::{Calendar, Recurrence, Window};
use automanager_policy::disruption::{Ledger, ReplicaStanding};
use automanager_policy::notice::{
    self, FreeNode, MoveTimes, NoticeInput, NoticedJob, NoticedNode, PoolSupply,
};
use automanager_policy::tiers::{TierSchedule, TierSize, TierSizes, tiers_in_effect};
use automanager_policy::vocab::{MigrationStrategy, PriorityBand, VoluntaryReason};
use chrono::{DateTime, Datelike, TimeDelta, TimeZone, Timelike, Utc};

/// A small deterministic generator (xorshift), so every run sees the same week.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() % 1_000_000) as f64 / 1_000_000.0 < p
    }
}

fn week_start() -> DateTime<Utc> {
    // Monday 2026-03-23 00:00 UTC; the week holds the spring-forward night of 2026-03-29.
    Utc.with_ymd_and_hms(2026, 3, 23, 0, 0, 0).single().unwrap()
}

/// Working nodes at `t` (Oslo local time): quiet nights, busy evenings, a Friday match night.
fn load(t: DateTime<Utc>) -> u32 {
    let local = t.with_timezone(&chrono_tz::Europe::Oslo);
    let h = local.hour();
    let friday = local.weekday() == chrono::Weekday::Fri;
    match h {
        0..=5 => 20,
        6..=17 => 60,
        18..=23 if friday => 200,
        18..=23 => 120,
        _ => 60,
    }
}

fn idle_hours() -> (f64, f64, f64) {
    let count = |n| TierSize::Count(n);
    let base = TierSizes {
        hot: count(2),
        warm: count(6),
    };
    let schedules = vec![
        TierSchedule {
            recurrence: Recurrence::parse("0 18 * * FRI", "5h30m", "Europe/Oslo").unwrap(),
            sizes: TierSizes {
                hot: count(12),
                warm: count(6),
            },
        },
        TierSchedule {
            recurrence: Recurrence::parse("0 18 * * MON-THU,SAT,SUN", "5h30m", "Europe/Oslo")
                .unwrap(),
            sizes: TierSizes {
                hot: count(6),
                warm: count(6),
            },
        },
    ];
    let lead = TimeDelta::seconds(90);
    let mut scheduled_hot = 0.0;
    let mut scheduled_warm = 0.0;
    let mut flat_hot = 0.0;
    let minute = 1.0 / 60.0;
    let mut t = week_start();
    let end = t + TimeDelta::days(7);
    while t < end {
        let e = tiers_in_effect(&base, &schedules, load(t), t, lead);
        // A Friday match needs 12 hot spares; every Friday window minute must have them.
        let local = t.with_timezone(&chrono_tz::Europe::Oslo);
        if local.weekday() == chrono::Weekday::Fri
            && (local.hour() == 18 || (local.hour() > 18 && local.hour() < 23))
        {
            assert_eq!(e.hot, 12, "at {t}");
        }
        scheduled_hot += f64::from(e.hot) * minute;
        scheduled_warm += f64::from(e.warm) * minute;
        flat_hot += 12.0 * minute;
        t += TimeDelta::minutes(1);
    }
    (flat_hot, scheduled_hot, scheduled_warm)
}

fn windows_week() -> (u32, u32, u32) {
    let all = Window::parse("0 2 * * *", "3h", "Europe/Oslo", &[]).unwrap();
    let drains = Window::parse(
        "0 10 * * SUN",
        "2h",
        "Europe/Oslo",
        &[VoluntaryReason::Drain],
    )
    .unwrap();
    let cal = Calendar::new(vec![all, drains]);
    let reasons = [
        VoluntaryReason::Drain,
        VoluntaryReason::Consolidation,
        VoluntaryReason::Rebalance,
        VoluntaryReason::SpareRotation,
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut admitted, mut held, mut outside) = (0u32, 0u32, 0u32);
    // Held moves retry at the time the calendar names.
    let mut pending: Vec<(DateTime<Utc>, VoluntaryReason)> = Vec::new();
    let mut t = week_start();
    let end = t + TimeDelta::days(7);
    while t < end {
        for r in reasons {
            if rng.chance(0.05) {
                pending.push((t, r));
            }
        }
        let mut still = Vec::new();
        for (at, r) in pending.drain(..) {
            if at > t {
                still.push((at, r));
                continue;
            }
            match cal.permit(r, t) {
                p if p.allows() => {
                    admitted += 1;
                    // The independent check: some window naming `r` started in (t - d, t].
                    let inside = cal.windows().iter().filter(|w| w.covers(r)).any(|w| {
                        let rec = &w.recurrence;
                        let mut s = rec.next_start(t - rec.duration() - TimeDelta::days(1), false);
                        let mut found = false;
                        while let Some(x) = s {
                            if x > t {
                                break;
                            }
                            found |= x > t - rec.duration();
                            s = rec.next_start(x, false);
                        }
                        found
                    });
                    if !inside {
                        outside += 1;
                    }
                }
                p => {
                    held += 1;
                    still.push((p.held_until().unwrap_or(t + TimeDelta::minutes(1)), r));
                }
            }
        }
        pending = still;
        t += TimeDelta::minutes(1);
    }
    (admitted, held, outside)
}

struct ReclaimFigures {
    movable: usize,
    moved_before_deadline: usize,
    gaps: usize,
    /// Gold and silver jobs not moved by the deadline: their band restarts them at T.
    left_gold_silver: usize,
    dropped_bronze: usize,
    budget_broken: usize,
    plan_p99_ms: f64,
    baseline_gaps: usize,
    baseline_dropped_bronze: usize,
}

fn reclaim() -> ReclaimFigures {
    let now0 = week_start();
    let times = MoveTimes {
        overlap: TimeDelta::seconds(5),
        stop_then_start: TimeDelta::seconds(3),
        handover: TimeDelta::seconds(8),
    };
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    const NODES: usize = 1000;
    const PER_NODE: usize = 8;
    // Every bundle has two replicas on different nodes: job k of node n pairs with node n+500.
    let mut jobs: Vec<NoticedJob> = Vec::new();
    for n in 0..NODES {
        for k in 0..PER_NODE {
            let pair = (n % (NODES / 2)) * PER_NODE + k;
            let strategy = match rng.next() % 10 {
                0..=3 => MigrationStrategy::Handover,
                4..=6 => MigrationStrategy::Overlap,
                _ => MigrationStrategy::StopThenStart,
            };
            let band = match rng.next() % 10 {
                0..=3 => PriorityBand::Gold,
                4..=7 => PriorityBand::Silver,
                _ => PriorityBand::Bronze,
            };
            jobs.push(NoticedJob {
                job_id: format!("b{pair}/{}/enc", n / (NODES / 2)),
                node_id: format!("n{n:04}"),
                bundle: format!("b{pair}"),
                replica: u32::try_from(n / (NODES / 2)).unwrap(),
                band,
                strategy,
                capacity: 10.0,
                cores: 1,
                pools: vec!["p".into()],
                in_flight: false,
                move_ended: None,
            });
        }
    }
    // 5 % noticed at once: every 20th node, 120 s warning.
    let deadline = now0 + TimeDelta::seconds(120);
    let noticed: Vec<NoticedNode> = (0..NODES)
        .step_by(20)
        .map(|n| NoticedNode {
            node_id: format!("n{n:04}"),
            deadline,
        })
        .collect();
    let noticed_ids: BTreeSet<String> = noticed.iter().map(|n| n.node_id.clone()).collect();
    // Each node holds 8 jobs of 10 in 100 capacity: 20 free.
    let free: Vec<FreeNode> = (0..NODES)
        .map(|n| FreeNode {
            node_id: format!("n{n:04}"),
            pool: "p".into(),
            free_capacity: 20.0,
            free_cores: 8,
            job_socket: true,
            ready_at: None,
        })
        .collect();
    let pools = [PoolSupply {
        pool: "p".into(),
        node_capacity: 100.0,
        node_cores: 16,
        job_socket: true,
        ready_in: TimeDelta::seconds(40),
        room: 20,
    }];
    let on_noticed: Vec<&NoticedJob> = jobs
        .iter()
        .filter(|j| noticed_ids.contains(&j.node_id))
        .collect();
    let gapless = |s: MigrationStrategy| s != MigrationStrategy::StopThenStart;
    let baseline_gaps = on_noticed.iter().filter(|j| gapless(j.strategy)).count();
    let baseline_dropped_bronze = on_noticed
        .iter()
        .filter(|j| j.band == PriorityBand::Bronze)
        .count();

    let mut moving: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    let mut done: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
    let mut plan_ms: Vec<f64> = Vec::new();
    let mut broken = 0;
    let mut now = now0;
    while now < deadline {
        let finished: Vec<String> = moving
            .iter()
            .filter(|(_, end)| **end <= now)
            .map(|(j, _)| j.clone())
            .collect();
        for j in finished {
            let end = moving.remove(&j).unwrap();
            done.insert(j, end);
        }
        let mut ledger = Ledger::new();
        let mut replicas: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
        for j in &on_noticed {
            replicas.entry(&j.bundle).or_default().insert(j.replica);
        }
        for (b, _) in replicas {
            let standing = (0..2)
                .map(|r| ReplicaStanding {
                    replica: r,
                    running: true,
                    disrupted: moving.contains_key(&format!("{b}/{r}/enc")),
                })
                .collect();
            ledger.insert(b.to_owned(), 1, standing);
        }
        let pending: Vec<NoticedJob> = on_noticed
            .iter()
            .filter(|j| !done.contains_key(&j.job_id))
            .map(|j| NoticedJob {
                in_flight: moving.contains_key(&j.job_id),
                ..(*j).clone()
            })
            .collect();
        let started = Instant::now();
        let p = notice::plan_notice(NoticeInput {
            now,
            nodes: &noticed,
            jobs: &pending,
            free: &free,
            pools: &pools,
            times,
            budgets: &ledger,
        });
        plan_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        for m in &p.moves {
            if m.budget != notice::BudgetUse::Within {
                broken += 1;
            }
            moving.insert(m.job_id.clone(), now + times.of(m.strategy));
        }
        now += TimeDelta::seconds(1);
    }
    let moved = on_noticed
        .iter()
        .filter(|j| done.get(&j.job_id).is_some_and(|end| *end <= deadline))
        .count();
    let not_moved: Vec<&&NoticedJob> = on_noticed
        .iter()
        .filter(|j| !done.contains_key(&j.job_id))
        .collect();
    plan_ms.sort_by(f64::total_cmp);
    let p99 = plan_ms[(plan_ms.len() * 99 / 100).min(plan_ms.len() - 1)];
    ReclaimFigures {
        movable: on_noticed.len(),
        moved_before_deadline: moved,
        gaps: not_moved.iter().filter(|j| gapless(j.strategy)).count(),
        left_gold_silver: not_moved
            .iter()
            .filter(|j| j.band != PriorityBand::Bronze)
            .count(),
        dropped_bronze: not_moved
            .iter()
            .filter(|j| j.band == PriorityBand::Bronze)
            .count(),
        budget_broken: broken,
        plan_p99_ms: p99,
        baseline_gaps,
        baseline_dropped_bronze,
    }
}

fn main() {
    let (flat, scheduled, warm) = idle_hours();
    eprintln!(
        "idle hot spare node-hours over the week: flat 12 = {flat:.0}, scheduled = {scheduled:.0} (plus {warm:.0} stopped node-hours, no compute)"
    );
    let (admitted, held, outside) = windows_week();
    eprintln!(
        "voluntary moves over the week: {admitted} admitted, {held} holds (retried when the window opens), {outside} outside a window"
    );
    let r = reclaim();
    eprintln!(
        "reclaim: {} jobs on 50 noticed nodes of 1000; moved before the deadline {}; baseline without notice handling: {} gapless jobs cut, {} bronze dropped; budgets broken {}",
        r.movable,
        r.moved_before_deadline,
        r.baseline_gaps,
        r.baseline_dropped_bronze,
        r.budget_broken
    );
    println!(
        "spare-tiers idle_node_hours_saved={:.0} voluntary_moves_outside_windows={outside} moved_before_deadline={:.1}% gaps={} gold_silver_left_to_recovery={} dropped_bronze={} notice_plan_p99_ms={:.2}",
        flat - scheduled,
        100.0 * r.moved_before_deadline as f64 / r.movable.max(1) as f64,
        r.gaps,
        r.left_gold_silver,
        r.dropped_bronze,
        r.plan_p99_ms,
    );
}
