//! The reclaim-notice planner: Manager said nodes will be taken at time T (a Spot interruption,
//! a provider's maintenance); which of their jobs move, by which strategy, in what order, to
//! where, what is provisioned early, what waits, and what is left to band recovery at T.
//!
//! The rules:
//!
//! - **Gapless first.** Jobs that move by `handover` or `overlap` go first: they are gapless only
//!   if they finish before T. Then `stopThenStart` jobs (a gap either way, but a short one now
//!   rather than a recovery at T). Within each, gold before silver before bronze, the earliest
//!   deadline first, then the job id.
//! - **Each job moves by its declared strategy.** A handover needs a target advertising the job
//!   socket.
//! - **Where to.** The room already free in the job's pools (best fit, in preference order), else
//!   a node provisioned early in the first elastic pool with room; nodes asked for by earlier
//!   passes are passed back in as free nodes that are not ready yet, so nothing is asked twice.
//!   This is a capacity estimate; the move's own placement picks the node.
//! - **Budgets where the deadline allows.** A move the disruption budget blocks waits, while
//!   waiting still leaves time for another move before its latest start; past that it goes ahead
//!   and the plan says which budget it breaks and why. A node being taken anyway is no reason to
//!   lose both replicas at T.
//! - **What cannot finish before T** (no room anywhere, or the target cannot be up and the move
//!   done in time) is left to band recovery at T: gold and silver restart, bronze is dropped.
//!   Replacements are provisioned early for those too, when a pool has room.
//! - **Too little time is still a reason to move.** An `overlap` or `stopThenStart` job whose
//!   room is up now moves now even when T is nearer than the time budgeted for its move: that
//!   time is an upper bound, a move is often far quicker, and one that loses the race ends no
//!   worse than the recovery at T would. A `handover` is begun only when it can finish.
//!
//! Pure: time is an argument; no I/O. Deterministic: the order of the inputs does not matter.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, TimeDelta, Utc};

use crate::disruption::{Ledger, Verdict};
use crate::vocab::{MigrationStrategy, PriorityBand};

/// A node Manager will take at `deadline`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoticedNode {
    pub node_id: String,
    pub deadline: DateTime<Utc>,
}

/// A job running on a noticed node.
#[derive(Debug, Clone, PartialEq)]
pub struct NoticedJob {
    pub job_id: String,
    pub node_id: String,
    /// The bundle's key in the budget ledger.
    pub bundle: String,
    pub replica: u32,
    pub band: PriorityBand,
    /// The strongest promise the job declares.
    pub strategy: MigrationStrategy,
    pub capacity: f64,
    pub cores: u32,
    /// The job's pools, in preference order.
    pub pools: Vec<String>,
    /// A move of this job is already under way (its reclaim Migration, or any other that has
    /// begun moving it).
    pub in_flight: bool,
    /// This notice's move of the job ended without moving it (refused, aborted, failed): why.
    /// It is not tried again; the job is left to band recovery at the deadline, and said so.
    pub move_ended: Option<String>,
}

/// Room on a node that is not being taken.
#[derive(Debug, Clone, PartialEq)]
pub struct FreeNode {
    pub node_id: String,
    pub pool: String,
    pub free_capacity: f64,
    pub free_cores: u32,
    /// It advertises the job socket (a handover target).
    pub job_socket: bool,
    /// When it will be up, for a node still starting; `None` when it is up.
    pub ready_at: Option<DateTime<Utc>>,
}

/// What an elastic pool can add now.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSupply {
    pub pool: String,
    /// Capacity and cores of the node it would provision.
    pub node_capacity: f64,
    pub node_cores: u32,
    /// Its nodes advertise the job socket.
    pub job_socket: bool,
    /// How long a new node takes to be up.
    pub ready_in: TimeDelta,
    /// Nodes it may be asked for now (maxNodes, the provisioning rate, the zone brake).
    pub room: u32,
}

/// How long a move takes once its target node is up, per strategy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoveTimes {
    pub overlap: TimeDelta,
    pub stop_then_start: TimeDelta,
    pub handover: TimeDelta,
}

impl MoveTimes {
    pub fn of(&self, s: MigrationStrategy) -> TimeDelta {
        match s {
            MigrationStrategy::Overlap => self.overlap,
            MigrationStrategy::StopThenStart => self.stop_then_start,
            MigrationStrategy::Handover => self.handover,
        }
    }
}

/// Where a move goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// A node that has the room (up now, or `ready_at`).
    Node(String),
    /// A node this plan provisions early in `pool`.
    Provisioned { pool: String },
}

/// Whether a move keeps its bundle's disruption budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BudgetUse {
    Within,
    /// The budget blocks it and waiting would miss the deadline.
    Broken {
        reason: String,
    },
}

/// A move to begin now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMove {
    pub job_id: String,
    pub from: String,
    pub strategy: MigrationStrategy,
    pub destination: Destination,
    pub deadline: DateTime<Utc>,
    /// The latest time it could begin and still finish before the deadline.
    pub start_by: DateTime<Utc>,
    pub budget: BudgetUse,
}

/// Why a job's move does not begin yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitReason {
    /// The budget blocks it; there is time to wait until `until` (its latest start).
    Budget {
        down: Vec<u32>,
        max_unavailable: u32,
        until: DateTime<Utc>,
    },
    /// Its target is being provisioned and is up at `ready_at`.
    Target {
        destination: Destination,
        ready_at: DateTime<Utc>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting {
    pub job_id: String,
    pub why: WaitReason,
}

/// Why a job is left to band recovery at T.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeftReason {
    /// No room in its pools and none can be provisioned.
    NoCapacity,
    /// A target is (or will be) there, but the move cannot finish before the deadline.
    TooLate { needed: TimeDelta, left: TimeDelta },
    /// Its move was made and ended without moving the job (the words say why).
    MoveEnded { why: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Left {
    pub job_id: String,
    pub band: PriorityBand,
    pub why: LeftReason,
}

/// The answer for one pass.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NoticePlan {
    /// Moves to begin now, in order.
    pub moves: Vec<PlannedMove>,
    pub waiting: Vec<Waiting>,
    /// Left to band recovery at T.
    pub left: Vec<Left>,
    /// Nodes to provision early, per pool.
    pub provision: BTreeMap<String, u32>,
    /// Jobs whose move is already under way.
    pub in_flight: Vec<String>,
}

/// Everything one pass looks at.
#[derive(Debug, Clone, Copy)]
pub struct NoticeInput<'a> {
    pub now: DateTime<Utc>,
    pub nodes: &'a [NoticedNode],
    pub jobs: &'a [NoticedJob],
    pub free: &'a [FreeNode],
    pub pools: &'a [PoolSupply],
    pub times: MoveTimes,
    /// Every bundle's budget and replica standings (moves in flight marked).
    pub budgets: &'a Ledger<String>,
}

fn strategy_class(s: MigrationStrategy) -> u8 {
    match s {
        MigrationStrategy::Handover | MigrationStrategy::Overlap => 0,
        MigrationStrategy::StopThenStart => 1,
    }
}

fn band_rank(b: PriorityBand) -> u8 {
    match b {
        PriorityBand::Gold => 0,
        PriorityBand::Silver => 1,
        PriorityBand::Bronze => 2,
    }
}

/// A node's room while the plan hands it out.
struct Slot {
    node_id: Option<String>,
    pool: String,
    capacity: f64,
    cores: u32,
    job_socket: bool,
    ready_at: DateTime<Utc>,
}

impl Slot {
    fn fits(&self, j: &NoticedJob, handover: bool) -> bool {
        self.capacity + 1e-9 >= j.capacity
            && self.cores >= j.cores
            && (!handover || self.job_socket)
    }
}

/// Plans one pass over the noticed nodes (see the module docs).
pub fn plan_notice(input: NoticeInput<'_>) -> NoticePlan {
    let deadlines = earliest_deadlines(input.nodes);
    let mut planner = Planner::new(&input, &deadlines);
    for (job, deadline) in in_plan_order(input.jobs, &deadlines) {
        planner.plan_job(job, deadline);
    }
    planner.plan
}

/// Each noticed node's earliest deadline.
fn earliest_deadlines(nodes: &[NoticedNode]) -> BTreeMap<&str, DateTime<Utc>> {
    let mut deadlines: BTreeMap<&str, DateTime<Utc>> = BTreeMap::new();
    for n in nodes {
        let d = deadlines.entry(n.node_id.as_str()).or_insert(n.deadline);
        *d = (*d).min(n.deadline);
    }
    deadlines
}

/// The jobs on noticed nodes with their deadlines, in the order the module docs give.
fn in_plan_order<'a>(
    jobs: &'a [NoticedJob],
    deadlines: &BTreeMap<&str, DateTime<Utc>>,
) -> Vec<(&'a NoticedJob, DateTime<Utc>)> {
    let mut ordered: Vec<(&NoticedJob, DateTime<Utc>)> = jobs
        .iter()
        .filter_map(|j| deadlines.get(j.node_id.as_str()).map(|d| (j, *d)))
        .collect();
    ordered.sort_by(|(a, da), (b, db)| {
        (strategy_class(a.strategy), band_rank(a.band), da, &a.job_id).cmp(&(
            strategy_class(b.strategy),
            band_rank(b.band),
            db,
            &b.job_id,
        ))
    });
    ordered
}

/// One pass's working state: the room handed out so far, the budgets as moves take them, and
/// the plan being written.
struct Planner<'a> {
    now: DateTime<Utc>,
    pools: &'a [PoolSupply],
    times: MoveTimes,
    /// Room on nodes not being taken, best fit first (least room), ties by id; nodes this plan
    /// provisions are appended as they are asked for.
    slots: Vec<Slot>,
    /// Nodes each elastic pool may still be asked for.
    room: BTreeMap<&'a str, u32>,
    ledger: Ledger<String>,
    seen: BTreeSet<&'a str>,
    plan: NoticePlan,
}

impl<'a> Planner<'a> {
    fn new(input: &NoticeInput<'a>, deadlines: &BTreeMap<&str, DateTime<Utc>>) -> Self {
        let now = input.now;
        let mut slots: Vec<Slot> = input
            .free
            .iter()
            .filter(|f| !deadlines.contains_key(f.node_id.as_str()))
            .map(|f| Slot {
                node_id: Some(f.node_id.clone()),
                pool: f.pool.clone(),
                capacity: f.free_capacity.max(0.0),
                cores: f.free_cores,
                job_socket: f.job_socket,
                ready_at: f.ready_at.unwrap_or(now).max(now),
            })
            .collect();
        slots.sort_by(|a, b| {
            a.capacity
                .total_cmp(&b.capacity)
                .then(a.cores.cmp(&b.cores))
                .then(a.node_id.cmp(&b.node_id))
        });
        Planner {
            now,
            pools: input.pools,
            times: input.times,
            slots,
            room: input
                .pools
                .iter()
                .map(|p| (p.pool.as_str(), p.room))
                .collect(),
            ledger: input.budgets.clone(),
            seen: BTreeSet::new(),
            plan: NoticePlan::default(),
        }
    }

    /// Decides one job: a move now, a wait, or left to band recovery at its deadline.
    fn plan_job(&mut self, job: &'a NoticedJob, deadline: DateTime<Utc>) {
        if !self.seen.insert(job.job_id.as_str()) {
            return;
        }
        if job.in_flight {
            self.plan.in_flight.push(job.job_id.clone());
            return;
        }
        if let Some(why) = &job.move_ended {
            self.leave(job, LeftReason::MoveEnded { why: why.clone() });
            return;
        }
        let needed = self.times.of(job.strategy);
        let start_by = deadline - needed;
        let Some((destination, ready_at)) = self.destination(job) else {
            self.leave(job, LeftReason::NoCapacity);
            return;
        };
        // Too little time by the estimate: an `overlap` or `stopThenStart` job whose room is up
        // now is still moved now (the estimate is an upper bound, and a move that loses the
        // race ends no worse than recovery at T); a handover is only begun when it can finish.
        let try_anyway = ready_at <= self.now && job.strategy != MigrationStrategy::Handover;
        if ready_at + needed > deadline && !try_anyway {
            let why = LeftReason::TooLate {
                needed: (ready_at - self.now) + needed,
                left: deadline - self.now,
            };
            self.leave(job, why);
            return;
        }
        if ready_at > self.now {
            self.wait(
                job,
                WaitReason::Target {
                    destination,
                    ready_at,
                },
            );
            return;
        }
        let Some(budget) = self.budget_use(job, deadline, needed) else {
            return;
        };
        self.ledger.mark(&job.bundle, job.replica);
        self.plan.moves.push(PlannedMove {
            job_id: job.job_id.clone(),
            from: job.node_id.clone(),
            strategy: job.strategy,
            destination,
            deadline,
            start_by,
            budget,
        });
    }

    /// Where the job goes and when that is up: room already there, else a node provisioned
    /// early; `None` when neither exists.
    fn destination(&mut self, job: &NoticedJob) -> Option<(Destination, DateTime<Utc>)> {
        let handover = job.strategy == MigrationStrategy::Handover;
        self.existing_room(job, handover)
            .or_else(|| self.provision_early(job, handover))
    }

    /// Room on a node already there (or already asked for), by pool preference, best fit
    /// within a pool; the room is taken.
    fn existing_room(
        &mut self,
        job: &NoticedJob,
        handover: bool,
    ) -> Option<(Destination, DateTime<Utc>)> {
        let i = job.pools.iter().find_map(|p| {
            self.slots
                .iter()
                .position(|s| &s.pool == p && s.fits(job, handover))
        })?;
        let s = &mut self.slots[i];
        s.capacity -= job.capacity;
        s.cores = s.cores.saturating_sub(job.cores);
        let dest = match &s.node_id {
            Some(id) => Destination::Node(id.clone()),
            None => Destination::Provisioned {
                pool: s.pool.clone(),
            },
        };
        Some((dest, s.ready_at))
    }

    /// A node provisioned early in the first of the job's pools with room that can hold it;
    /// what is left of that node becomes room for later jobs.
    fn provision_early(
        &mut self,
        job: &NoticedJob,
        handover: bool,
    ) -> Option<(Destination, DateTime<Utc>)> {
        let pools = self.pools;
        let s = job.pools.iter().find_map(|p| {
            pools.iter().find(|s| {
                &s.pool == p
                    && self.room.get(s.pool.as_str()).is_some_and(|r| *r > 0)
                    && s.node_capacity + 1e-9 >= job.capacity
                    && s.node_cores >= job.cores
                    && (!handover || s.job_socket)
            })
        })?;
        if let Some(r) = self.room.get_mut(s.pool.as_str()) {
            *r -= 1;
        }
        *self.plan.provision.entry(s.pool.clone()).or_default() += 1;
        let ready_at = self.now + s.ready_in.max(TimeDelta::zero());
        self.slots.push(Slot {
            node_id: None,
            pool: s.pool.clone(),
            capacity: s.node_capacity - job.capacity,
            cores: s.node_cores.saturating_sub(job.cores),
            job_socket: s.job_socket,
            ready_at,
        });
        let dest = Destination::Provisioned {
            pool: s.pool.clone(),
        };
        Some((dest, ready_at))
    }

    /// How a move now stands with its bundle's budget; `None` when it waits for the budget
    /// (time remains for the blocking move to finish and this one after it).
    fn budget_use(
        &mut self,
        job: &NoticedJob,
        deadline: DateTime<Utc>,
        needed: TimeDelta,
    ) -> Option<BudgetUse> {
        let start_by = deadline - needed;
        let Verdict::Blocked {
            down,
            max_unavailable,
        } = self.ledger.check(&job.bundle, job.replica)
        else {
            return Some(BudgetUse::Within);
        };
        if start_by - self.now >= needed {
            self.wait(
                job,
                WaitReason::Budget {
                    down,
                    max_unavailable,
                    until: start_by,
                },
            );
            return None;
        }
        let reason = format!(
            "replica(s) {} of bundle {} are down and maxUnavailableReplicas is {max_unavailable}; the node is taken at {} and waiting would miss it ({}s left, a move takes {}s)",
            down.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            job.bundle,
            deadline.to_rfc3339(),
            (deadline - self.now).num_seconds(),
            needed.num_seconds(),
        );
        Some(BudgetUse::Broken { reason })
    }

    fn leave(&mut self, job: &NoticedJob, why: LeftReason) {
        self.plan.left.push(Left {
            job_id: job.job_id.clone(),
            band: job.band,
            why,
        });
    }

    fn wait(&mut self, job: &NoticedJob, why: WaitReason) {
        self.plan.waiting.push(Waiting {
            job_id: job.job_id.clone(),
            why,
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::disruption::ReplicaStanding;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().unwrap()
    }

    fn secs(s: i64) -> TimeDelta {
        TimeDelta::seconds(s)
    }

    fn times() -> MoveTimes {
        MoveTimes {
            overlap: secs(5),
            stop_then_start: secs(3),
            handover: secs(8),
        }
    }

    fn job(
        id: &str,
        node: &str,
        bundle: &str,
        replica: u32,
        band: PriorityBand,
        s: MigrationStrategy,
    ) -> NoticedJob {
        NoticedJob {
            job_id: id.into(),
            node_id: node.into(),
            bundle: bundle.into(),
            replica,
            band,
            strategy: s,
            capacity: 10.0,
            cores: 1,
            pools: vec!["p".into()],
            in_flight: false,
            move_ended: None,
        }
    }

    fn free(id: &str, capacity: f64, socket: bool) -> FreeNode {
        FreeNode {
            node_id: id.into(),
            pool: "p".into(),
            free_capacity: capacity,
            free_cores: 16,
            job_socket: socket,
            ready_at: None,
        }
    }

    fn supply(room: u32, ready_in: i64) -> PoolSupply {
        PoolSupply {
            pool: "p".into(),
            node_capacity: 100.0,
            node_cores: 16,
            job_socket: true,
            ready_in: secs(ready_in),
            room,
        }
    }

    fn noticed(id: &str, in_s: i64) -> NoticedNode {
        NoticedNode {
            node_id: id.into(),
            deadline: t0() + secs(in_s),
        }
    }

    fn run(
        nodes: &[NoticedNode],
        jobs: &[NoticedJob],
        free: &[FreeNode],
        pools: &[PoolSupply],
        budgets: &Ledger<String>,
    ) -> NoticePlan {
        plan_notice(NoticeInput {
            now: t0(),
            nodes,
            jobs,
            free,
            pools,
            times: times(),
            budgets,
        })
    }

    use MigrationStrategy::{Handover, Overlap, StopThenStart};
    use PriorityBand::{Bronze, Gold, Silver};

    #[test]
    fn gapless_strategies_go_first_then_by_band() {
        let jobs = [
            job("sts-gold", "n", "a", 0, Gold, StopThenStart),
            job("ov-bronze", "n", "b", 0, Bronze, Overlap),
            job("ho-silver", "n", "c", 0, Silver, Handover),
            job("ov-gold", "n", "d", 0, Gold, Overlap),
        ];
        let p = run(
            &[noticed("n", 120)],
            &jobs,
            &[free("f", 100.0, true)],
            &[],
            &Ledger::new(),
        );
        let order: Vec<&str> = p.moves.iter().map(|m| m.job_id.as_str()).collect();
        assert_eq!(order, ["ov-gold", "ho-silver", "ov-bronze", "sts-gold"]);
        assert!(
            p.moves
                .iter()
                .all(|m| m.destination == Destination::Node("f".into()))
        );
        assert_eq!(p.moves[0].start_by, t0() + secs(115));
    }

    #[test]
    fn a_handover_needs_a_job_socket_target() {
        let jobs = [job("h", "n", "a", 0, Gold, Handover)];
        let p = run(
            &[noticed("n", 120)],
            &jobs,
            &[free("plain", 100.0, false), free("sock", 100.0, true)],
            &[],
            &Ledger::new(),
        );
        assert_eq!(p.moves[0].destination, Destination::Node("sock".into()));
    }

    #[test]
    fn no_room_provisions_early_and_waits_for_the_node() {
        let jobs: Vec<NoticedJob> = (0..12)
            .map(|i| {
                job(
                    &format!("j{i:02}"),
                    "n",
                    &format!("b{i}"),
                    0,
                    Silver,
                    Overlap,
                )
            })
            .collect();
        let p = run(
            &[noticed("n", 120)],
            &jobs,
            &[free("f", 20.0, true)],
            &[supply(5, 40)],
            &Ledger::new(),
        );
        // Two fit on f; ten more need a node of 100 each holding ten.
        assert_eq!(p.moves.len(), 2);
        assert_eq!(p.provision.get("p"), Some(&1));
        assert_eq!(p.waiting.len(), 10);
        assert!(p.waiting.iter().all(|w| matches!(&w.why, WaitReason::Target { ready_at, .. } if *ready_at == t0() + secs(40))));
    }

    #[test]
    fn a_target_too_slow_for_the_deadline_is_left_to_recovery_but_still_provisioned() {
        let jobs = [job("g", "n", "a", 0, Gold, Overlap)];
        let p = run(
            &[noticed("n", 60)],
            &jobs,
            &[],
            &[supply(1, 58)],
            &Ledger::new(),
        );
        assert_eq!(p.provision.get("p"), Some(&1));
        assert_eq!(
            p.left,
            vec![Left {
                job_id: "g".into(),
                band: Gold,
                why: LeftReason::TooLate {
                    needed: secs(63),
                    left: secs(60)
                }
            }]
        );
        let none = run(
            &[noticed("n", 60)],
            &jobs,
            &[],
            &[supply(0, 10)],
            &Ledger::new(),
        );
        assert_eq!(none.left[0].why, LeftReason::NoCapacity);
    }

    #[test]
    fn a_notice_shorter_than_a_move_still_moves_what_has_room_now_except_a_handover() {
        let jobs = [
            job("ov", "n", "a", 0, Gold, Overlap),
            job("sts", "n", "b", 0, Silver, StopThenStart),
            job("ho", "n", "c", 0, Gold, Handover),
        ];
        // Two seconds left; every move is budgeted longer than that.
        let p = run(
            &[noticed("n", 2)],
            &jobs,
            &[free("f", 100.0, true)],
            &[],
            &Ledger::new(),
        );
        let moved: Vec<&str> = p.moves.iter().map(|m| m.job_id.as_str()).collect();
        assert_eq!(moved, ["ov", "sts"]);
        assert_eq!(p.left.len(), 1);
        assert_eq!(p.left[0].job_id, "ho");
        assert!(matches!(p.left[0].why, LeftReason::TooLate { .. }));
    }

    #[test]
    fn budgets_hold_while_the_deadline_allows_and_are_broken_with_a_reason_when_not() {
        let mut ledger = Ledger::new();
        let up = |r| ReplicaStanding {
            replica: r,
            running: true,
            disrupted: false,
        };
        ledger.insert("b".to_owned(), 1, vec![up(0), up(1)]);
        // Both replicas on nodes being taken.
        let jobs = [
            job("r0", "n1", "b", 0, Gold, Overlap),
            job("r1", "n2", "b", 1, Gold, Overlap),
        ];
        let free_room = [free("f", 100.0, true)];
        let p = run(
            &[noticed("n1", 120), noticed("n2", 120)],
            &jobs,
            &free_room,
            &[],
            &ledger,
        );
        assert_eq!(p.moves.len(), 1);
        assert!(
            matches!(p.waiting[0].why, WaitReason::Budget { until, .. } if until == t0() + secs(115))
        );
        // Eight seconds before the deadline there is no time to wait for the first move.
        let late = run(
            &[noticed("n1", 8), noticed("n2", 8)],
            &jobs,
            &free_room,
            &[],
            &ledger,
        );
        assert_eq!(late.moves.len(), 2);
        let BudgetUse::Broken { reason } = &late.moves[1].budget else {
            panic!("{late:?}")
        };
        assert!(reason.contains("maxUnavailableReplicas is 1"), "{reason}");
        assert!(
            reason.contains("waiting would miss it (8s left, a move takes 5s)"),
            "{reason}"
        );
    }

    #[test]
    fn moves_under_way_and_nodes_not_noticed_are_left_alone() {
        let mut j = job("moving", "n", "a", 0, Gold, Overlap);
        j.in_flight = true;
        let p = run(
            &[noticed("n", 120)],
            &[j, job("elsewhere", "m", "b", 0, Gold, Overlap)],
            &[free("f", 100.0, true)],
            &[],
            &Ledger::new(),
        );
        assert_eq!(p.in_flight, vec!["moving".to_owned()]);
        assert!(p.moves.is_empty() && p.waiting.is_empty() && p.left.is_empty());
    }

    #[test]
    fn a_move_that_ended_without_moving_the_job_is_left_to_recovery_with_its_reason() {
        let mut ended = job("g", "n", "a", 0, Gold, Overlap);
        ended.move_ended = Some("Migration reclaim-n-1 ended Rejected: no room".into());
        let p = run(
            &[noticed("n", 120)],
            &[ended],
            &[free("f", 100.0, true)],
            &[],
            &Ledger::new(),
        );
        assert!(
            p.moves.is_empty() && p.waiting.is_empty(),
            "not tried again: {p:?}"
        );
        assert_eq!(
            p.left,
            vec![Left {
                job_id: "g".into(),
                band: Gold,
                why: LeftReason::MoveEnded {
                    why: "Migration reclaim-n-1 ended Rejected: no room".into()
                }
            }]
        );
    }

    // ---- properties ----

    fn arb_job() -> impl Strategy<Value = NoticedJob> {
        (
            0u8..40,
            0u8..6,
            0u8..10,
            0u32..2,
            prop_oneof![Just(Gold), Just(Silver), Just(Bronze)],
            prop_oneof![Just(Overlap), Just(Handover), Just(StopThenStart)],
            1u32..40,
        )
            .prop_map(|(id, node, bundle, replica, band, s, cap)| NoticedJob {
                capacity: f64::from(cap),
                ..job(
                    &format!("j{id}"),
                    &format!("n{node}"),
                    &format!("b{bundle}"),
                    replica,
                    band,
                    s,
                )
            })
    }

    fn arb_free() -> impl Strategy<Value = FreeNode> {
        (0u8..8, 0u32..120, any::<bool>())
            .prop_map(|(id, cap, socket)| free(&format!("f{id}"), f64::from(cap), socket))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every job of a noticed node is answered once; handovers finish before their deadline;
        /// no free node is promised more than its room; handovers go to job-socket nodes;
        /// gapless moves come before stop-then-start ones; provisioning fits the pools' room.
        #[test]
        fn the_plan_is_complete_and_within_its_bounds(
            jobs in proptest::collection::vec(arb_job(), 0..30),
            free_nodes in proptest::collection::vec(arb_free(), 0..6),
            room in 0u32..4,
            deadline in 1i64..180,
            ready_in in 0i64..120,
        ) {
            let nodes: Vec<NoticedNode> = (0..3).map(|i| noticed(&format!("n{i}"), deadline)).collect();
            let mut seen = BTreeSet::new();
            let jobs: Vec<NoticedJob> = jobs.into_iter().filter(|j| seen.insert(j.job_id.clone())).collect();
            let mut fseen = BTreeSet::new();
            let free_nodes: Vec<FreeNode> = free_nodes.into_iter().filter(|f| fseen.insert(f.node_id.clone())).collect();
            let mut ledger = Ledger::new();
            for b in 0..10 {
                ledger.insert(format!("b{b}"), 1, vec![
                    ReplicaStanding { replica: 0, running: true, disrupted: false },
                    ReplicaStanding { replica: 1, running: true, disrupted: false },
                ]);
            }
            let pools = [supply(room, ready_in)];
            let p = run(&nodes, &jobs, &free_nodes, &pools, &ledger);
            let noticed_jobs: BTreeSet<&str> = jobs.iter().filter(|j| j.node_id.as_str() < "n3").map(|j| j.job_id.as_str()).collect();
            let answered: Vec<&str> = p.moves.iter().map(|m| m.job_id.as_str())
                .chain(p.waiting.iter().map(|w| w.job_id.as_str()))
                .chain(p.left.iter().map(|l| l.job_id.as_str()))
                .chain(p.in_flight.iter().map(String::as_str))
                .collect();
            prop_assert_eq!(answered.len(), noticed_jobs.len());
            prop_assert_eq!(answered.iter().copied().collect::<BTreeSet<_>>(), noticed_jobs);
            let mut used: BTreeMap<&str, f64> = BTreeMap::new();
            for m in &p.moves {
                // A move that cannot finish by the estimate is only ever a try of a job that
                // needs no handover.
                prop_assert!(t0() + times().of(m.strategy) <= m.deadline || m.strategy != Handover);
                if let Destination::Node(id) = &m.destination {
                    let j = jobs.iter().find(|j| j.job_id == m.job_id).unwrap();
                    *used.entry(id.as_str()).or_default() += j.capacity;
                    let f = free_nodes.iter().find(|f| &f.node_id == id).unwrap();
                    if m.strategy == Handover { prop_assert!(f.job_socket); }
                }
            }
            for (id, u) in used {
                let f = free_nodes.iter().find(|f| f.node_id == id).unwrap();
                prop_assert!(u <= f.free_capacity + 1e-6);
            }
            let first_sts = p.moves.iter().position(|m| m.strategy == StopThenStart);
            let last_gapless = p.moves.iter().rposition(|m| m.strategy != StopThenStart);
            if let (Some(a), Some(b)) = (first_sts, last_gapless) { prop_assert!(b < a); }
            prop_assert!(p.provision.values().sum::<u32>() <= room);
            // Within a bundle, moves take more replicas down than its budget only when one of
            // them says which budget it breaks (a later job of a replica already down costs
            // nothing more).
            let mut within: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
            let mut broken: BTreeSet<String> = BTreeSet::new();
            for m in &p.moves {
                let j = jobs.iter().find(|j| j.job_id == m.job_id).unwrap();
                within.entry(j.bundle.clone()).or_default().insert(j.replica);
                if m.budget != BudgetUse::Within {
                    broken.insert(j.bundle.clone());
                }
            }
            prop_assert!(within.iter().all(|(b, r)| r.len() <= 1 || broken.contains(b)));
        }

        /// A fake clock steps through a notice with plenty of room: every job moves before its
        /// deadline, budgets are kept (a replica's move waits for the other's to finish), and
        /// nothing is left to recovery.
        #[test]
        fn with_room_and_time_every_job_moves_before_the_deadline(
            jobs in proptest::collection::vec(arb_job(), 1..30),
        ) {
            let mut seen = BTreeSet::new();
            let jobs: Vec<NoticedJob> = jobs.into_iter().filter(|j| seen.insert(j.job_id.clone())).collect();
            let nodes: Vec<NoticedNode> = (0..6).map(|i| noticed(&format!("n{i}"), 120)).collect();
            let room: Vec<FreeNode> = (0..12).map(|i| free(&format!("f{i}"), 200.0, true)).collect();
            let mut done: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
            let mut moving: BTreeMap<String, DateTime<Utc>> = BTreeMap::new();
            let mut now = t0();
            let mut broken = 0;
            while now < t0() + secs(120) {
                // Finished moves leave their node.
                let finished: Vec<String> = moving.iter().filter(|(_, end)| **end <= now).map(|(j, _)| j.clone()).collect();
                for j in finished { let end = moving.remove(&j).unwrap(); done.insert(j, end); }
                let mut ledger = Ledger::new();
                let mut bundles: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
                for j in &jobs { bundles.entry(&j.bundle).or_default().insert(j.replica); }
                for (b, replicas) in &bundles {
                    let standing = replicas.iter().map(|r| ReplicaStanding {
                        replica: *r,
                        running: true,
                        disrupted: jobs.iter().any(|j| &j.bundle == b && j.replica == *r && moving.contains_key(&j.job_id)),
                    }).collect();
                    ledger.insert((*b).to_owned(), 1, standing);
                }
                let pending: Vec<NoticedJob> = jobs.iter().filter(|j| !done.contains_key(&j.job_id))
                    .map(|j| NoticedJob { in_flight: moving.contains_key(&j.job_id), ..j.clone() }).collect();
                let p = plan_notice(NoticeInput { now, nodes: &nodes, jobs: &pending, free: &room, pools: &[], times: times(), budgets: &ledger });
                prop_assert!(p.left.is_empty(), "{:?}", p.left.clone());
                for m in &p.moves {
                    if m.budget != BudgetUse::Within { broken += 1; }
                    moving.insert(m.job_id.clone(), now + times().of(m.strategy));
                }
                now += secs(1);
            }
            prop_assert_eq!(done.len(), jobs.len());
            prop_assert!(done.values().all(|end| *end <= t0() + secs(120)));
            prop_assert_eq!(broken, 0);
        }
    }
}
