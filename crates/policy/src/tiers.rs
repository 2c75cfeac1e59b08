//! Spare tiers: a `HotSpareTarget`'s **hot** spares (running, empty, as in [`crate::spares`]) and
//! **warm** spares (stopped: they keep their disk and id, cost no compute, and start in the
//! pool's start latency), and the **schedules** that change both over the week.
//!
//! Sizes ([`TierSize`]) are a count, or a share of the pool's working nodes with a minimum and a
//! maximum: the shape of the Kubernetes cluster autoscaler's CapacityBuffer proposal
//! (`replicas`, or `percentage` with `limits`), so the idea reads familiar.
//!
//! [`plan_tiers`] decides one reconcile; the hot tier is [`plan_spares`] itself (membership,
//! live/pending, oldest-excess, `maxAge` rotation), and this module adds:
//!
//! - **Hot refills from warm first.** A hot spare taken by a recovery is replaced by starting a
//!   warm spare (the youngest first, never one in a zone the zone brake holds), and only then by
//!   creating a node.
//! - **Warm refills by create-then-stop.** A warm shortfall is met by stopping surplus hot
//!   spares (the oldest first, unless past `maxAge`), then by creating nodes: a created node
//!   comes up as a surplus hot spare and is stopped then. Nodes on their way (starting beyond
//!   the hot target, stopping) count as coming.
//! - **Excess goes oldest first**: surplus hot spares the warm tier does not need and surplus
//!   warm spares are terminated.
//! - **Rotation** (`maxAge`) replaces one spare at a time in each tier, and only when the window
//!   calendar admits `spareRotation` now (a rotation under way finishes; a new one waits).
//! - **Every tier is bounded**: creations (hot first, then warm) fit the pool's `maxNodes` room,
//!   the provisioning rate, and the zone brake (nothing is created when every zone of the pool
//!   is held). Starting a warm spare creates no node: the stopped node already counts.
//! - **A pool that cannot stop nodes** (a `cluster` pool) has no warm tier: its warm size counts
//!   as 0 and the plan says so. Fixed pools never act, as for hot spares.
//!
//! Schedules ([`tiers_in_effect`]) are applied ahead by the pool's start latency, so the spares
//! of a window are running when it opens; they end on time.
//!
//! Pure: the clock is an argument; no I/O.

use std::collections::BTreeSet;

use chrono::{DateTime, TimeDelta, Utc};

use std::time::Duration;

use crate::calendar::Recurrence;
use crate::pass::{NextLook, Verdict};
use crate::spares::{
    Brake, MAX_TARGET_COUNT, REFRESH, Retrying, RotationStep, SpareNode, SparePlan, SpareSpecError,
    SpareState, SpareTarget, Underflow, belongs, count, parse_max_age, plan_spares,
};
use crate::vocab::{ScaleOut, Standing};

/// How many spares a tier keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierSize {
    /// Exactly this many (0 to 1000).
    Count(u32),
    /// `percent` of the pool's working nodes, rounded up, kept within `[min, max]`.
    Share { percent: u32, min: u32, max: u32 },
}

impl Default for TierSize {
    fn default() -> Self {
        TierSize::Count(0)
    }
}

impl TierSize {
    /// Checks the bounds the schema also enforces.
    pub fn validate(&self) -> Result<(), SpareSpecError> {
        match *self {
            TierSize::Count(n) if n > MAX_TARGET_COUNT => Err(SpareSpecError::InvalidTier(
                format!("a tier count must be at most {MAX_TARGET_COUNT}, not {n}"),
            )),
            TierSize::Share { percent, .. } if percent > 100 => Err(SpareSpecError::InvalidTier(
                format!("a tier share must be at most 100 percent, not {percent}"),
            )),
            TierSize::Share { min, max, .. } if min > max => Err(SpareSpecError::InvalidTier(
                format!("a tier share's min ({min}) must not exceed its max ({max})"),
            )),
            TierSize::Share { max, .. } if max > MAX_TARGET_COUNT => {
                Err(SpareSpecError::InvalidTier(format!(
                    "a tier share's max must be at most {MAX_TARGET_COUNT}, not {max}"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The count this size asks for in a pool with `working_nodes` nodes running jobs.
    pub fn resolve(&self, working_nodes: u32) -> u32 {
        match *self {
            TierSize::Count(n) => n.min(MAX_TARGET_COUNT),
            TierSize::Share { percent, min, max } => {
                let share = (u64::from(working_nodes) * u64::from(percent)).div_ceil(100);
                let share = u32::try_from(share).unwrap_or(u32::MAX);
                share.clamp(min.min(max), max).min(MAX_TARGET_COUNT)
            }
        }
    }
}

/// The sizes of both tiers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierSizes {
    pub hot: TierSize,
    pub warm: TierSize,
}

impl TierSizes {
    pub fn validate(&self) -> Result<(), SpareSpecError> {
        self.hot.validate()?;
        self.warm.validate()
    }
}

/// Tier sizes that apply while a recurrence is open (e.g. 12 hot from Friday 18:00 for 5h30m,
/// Europe/Oslo).
#[derive(Debug, Clone, PartialEq)]
pub struct TierSchedule {
    pub recurrence: Recurrence,
    pub sizes: TierSizes,
}

/// The counts in effect now, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiersInEffect {
    pub hot: u32,
    pub warm: u32,
    /// The schedules (by index) that set the counts; empty when the base sizes apply.
    pub active: Vec<usize>,
    /// When the counts may next change (a schedule's lead begins or its window ends).
    pub next_change: Option<DateTime<Utc>>,
}

/// How far ahead of its window a schedule applies, for a pool that brings a spare up in
/// `start_latency`: that latency and a quarter more, at least 10 s more. Applied exactly
/// `start_latency` ahead, the spares came up just after the window opened: the target's own
/// pass and Manager's call come on top of the latency.
pub fn schedule_lead(start_latency: TimeDelta) -> TimeDelta {
    let margin = (start_latency / 4).max(TimeDelta::seconds(10));
    start_latency + margin
}

/// The tier counts at `now`: the largest of every active schedule's (a schedule is active from
/// `lead` before its window opens until the window ends), or the base sizes when none is
/// active. `working_nodes` resolves shares; `lead` is [`schedule_lead`] of the pool's start
/// latency.
pub fn tiers_in_effect(
    base: &TierSizes,
    schedules: &[TierSchedule],
    working_nodes: u32,
    now: DateTime<Utc>,
    lead: TimeDelta,
) -> TiersInEffect {
    let active: Vec<usize> = schedules
        .iter()
        .enumerate()
        .filter(|(_, s)| s.recurrence.active_with_lead(now, lead))
        .map(|(i, _)| i)
        .collect();
    let (hot, warm) = if active.is_empty() {
        (
            base.hot.resolve(working_nodes),
            base.warm.resolve(working_nodes),
        )
    } else {
        active.iter().fold((0, 0), |(h, w), i| {
            let s = &schedules[*i].sizes;
            (
                h.max(s.hot.resolve(working_nodes)),
                w.max(s.warm.resolve(working_nodes)),
            )
        })
    };
    let next_change = schedules
        .iter()
        .filter_map(|s| s.recurrence.next_change_with_lead(now, lead))
        .min();
    TiersInEffect {
        hot,
        warm,
        active,
        next_change,
    }
}

/// What bounds the nodes a plan may create.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TierBounds {
    /// The pool's `maxNodes`, if any.
    pub max_nodes: Option<u32>,
    /// Nodes that still fit under `maxNodes` (stopped nodes count as nodes): `None` unbounded.
    pub room: Option<u32>,
    /// CreateNode requests the pool's rate allows now.
    pub allowance: u32,
    /// Zones of the pool the zone brake holds: no warm spare there is started.
    pub degraded_zones: BTreeSet<String>,
    /// Every zone of the pool is held: nothing is created.
    pub all_zones_degraded: bool,
}

/// What the pool can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolTraits {
    pub scale_out: ScaleOut,
    /// Whether its nodes can be stopped and started (not a `cluster` pool).
    pub can_stop: bool,
}

/// One tier's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TierCounts {
    pub target: u32,
    /// Hot: running and empty. Warm: stopped and empty, less those this plan starts.
    pub ready: u32,
    /// On their way, including what this plan asks for.
    pub pending: u32,
}

/// What to do about one `HotSpareTarget`'s two tiers now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierPlan {
    pub hot: TierCounts,
    pub warm: TierCounts,
    /// Warm spares to start (hot refill), youngest first.
    pub start: Vec<String>,
    /// Surplus hot spares to stop (warm refill).
    pub stop: Vec<String>,
    /// Nodes to create for the hot tier.
    pub create_hot: u32,
    /// Nodes to create for the warm tier (to be stopped once up).
    pub create_warm: u32,
    /// Spares to terminate (surplus of either tier, and aged spares whose replacement is in).
    pub terminate: Vec<String>,
    /// The hot tier's rotation step.
    pub rotate: Option<RotationStep>,
    /// The warm spare being rotated out (its replacement is created in `create_warm`).
    pub warm_rotate: Option<String>,
    /// An aged spare waits for the disruption window to admit `spareRotation`.
    pub rotation_held: bool,
    /// Hot spares below target.
    pub underflow: Option<Underflow>,
    /// Warm spares below target.
    pub warm_underflow: Option<Underflow>,
    /// Spares that now hold a job.
    pub taken: Vec<String>,
    /// Every spare of either tier (ready or on its way), sorted.
    pub spare_nodes: Vec<String>,
    /// Why fewer nodes are created than the tiers need.
    pub braked: Option<Brake>,
    /// A warm size was asked of a pool that cannot stop nodes; it counts as 0.
    pub warm_unsupported: bool,
}

impl TierPlan {
    /// Whether the plan asks Manager for anything.
    pub fn is_noop(&self) -> bool {
        self.start.is_empty()
            && self.stop.is_empty()
            && self.terminate.is_empty()
            && self.create_hot == 0
            && self.create_warm == 0
    }

    /// Nodes to create, both tiers.
    pub fn creates(&self) -> u32 {
        self.create_hot.saturating_add(self.create_warm)
    }

    /// `status.underflowSince` for the hot tier: kept while the underflow lasts, `now` when it
    /// begins, cleared when it ends.
    pub fn underflow_since(
        &self,
        previous: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        self.underflow.as_ref().map(|_| previous.unwrap_or(now))
    }
}

impl TierPlan {
    /// The `SpareUnderflow` condition for the hot tier: (status, reason, message).
    pub fn underflow_condition(&self) -> (bool, &'static str, String) {
        crate::spares::underflow_condition(self.underflow.as_ref(), self.hot.ready, self.hot.target)
    }

    /// The `maxNodes` brake, when it holds back spares a tier needs: the target cannot be met
    /// until nodes go or the bound rises.
    pub fn unreachable(&self) -> Option<&Brake> {
        self.braked
            .as_ref()
            .filter(|b| matches!(b, Brake::MaxNodes { .. }))
    }

    /// Both tiers' figures, as conditions and Events say them.
    fn counts(&self) -> String {
        let mut counts = format!(
            "{} live, {} pending, target {}",
            self.hot.ready, self.hot.pending, self.hot.target
        );
        if self.warm.target > 0 || self.warm.ready + self.warm.pending > 0 {
            counts.push_str(&format!(
                "; warm: {} stopped, {} coming, target {}",
                self.warm.ready, self.warm.pending, self.warm.target
            ));
        }
        counts
    }

    /// Where the target stands once the plan is acted on: as [`SparePlan::verdict`], over the
    /// hot tier, with the warm tier's figures beside it. Underflow with spares on their way is
    /// progress; underflow nothing can fix (a fixed pool, a pool at its `maxNodes`) is stalled.
    pub fn verdict(&self, pool: &str, retrying: Option<&Retrying>) -> Verdict {
        let counts = self.counts();
        let (standing, reason) = match &self.underflow {
            Some(_) if self.unreachable().is_some() => (Standing::Stalled, "PoolAtMaxNodes"),
            Some(_) if retrying.is_some() => (Standing::Reconciling, "ProvisioningRetrying"),
            Some(_) if self.hot.pending > 0 => (Standing::Reconciling, "Provisioning"),
            Some(_) => (Standing::Stalled, "SpareUnderflow"),
            None if !self.terminate.is_empty() => (Standing::Reconciling, "TerminatingExcess"),
            None if self.rotate.is_some() => (Standing::Reconciling, "Rotating"),
            None => (Standing::Ready, "AtTarget"),
        };
        let message = match (&self.underflow, self.unreachable(), retrying) {
            (Some(_), Some(brake), _) => {
                format!("{}; {counts}", brake.message(pool, self.hot.target))
            }
            (Some(_), None, Some(r)) => format!(
                "no spare node from pool {pool} yet ({}); asked again in {}s; {counts}",
                r.why,
                r.after.as_secs().max(1)
            ),
            (Some(u), None, None) => format!("{}; {counts}", u.message()),
            (None, _, _) => counts,
        };
        Verdict::new(standing, reason, message)
    }

    /// When the target is looked at again: once a failed ask's back-off is over; soon while
    /// the plan changes anything, a rotation runs or warm spares are on their way; after the
    /// rate's minute moves on when it held spares back; else at [`REFRESH`]; and never later
    /// than when a schedule's sizes next change (`next_change`, from now).
    pub fn next_look(
        &self,
        retrying: Option<&Retrying>,
        next_change: Option<Duration>,
    ) -> NextLook {
        let after = if let Some(r) = retrying {
            r.after.max(Duration::from_secs(1))
        } else if !self.is_noop() || self.rotate.is_some() || self.warm.pending > 0 {
            Duration::from_secs(1)
        } else if matches!(self.braked, Some(Brake::Rate { .. })) {
            Duration::from_secs(5)
        } else {
            REFRESH
        };
        let until_change = next_change.map_or(after, |d| d.max(Duration::from_millis(100)));
        NextLook::After(after.min(until_change))
    }
}

/// Everything one plan looks at.
#[derive(Debug, Clone, Copy)]
pub struct TierInput<'a> {
    pub target_name: &'a str,
    /// The target's pool, band, node spec and `maxAge` (`target_count` is ignored: `hot` rules).
    pub spec: &'a SpareTarget,
    pub hot: u32,
    pub warm: u32,
    pub pool: PoolTraits,
    /// The pool's spare-tagged nodes.
    pub nodes: &'a [SpareNode],
    pub now: DateTime<Utc>,
    /// Whether the disruption calendar admits `spareRotation` now.
    pub rotation_allowed: bool,
    pub bounds: &'a TierBounds,
}

/// Plans one reconcile of a target's hot and warm tiers (see the module docs).
pub fn plan_tiers(input: TierInput<'_>) -> Result<TierPlan, SpareSpecError> {
    for n in [input.hot, input.warm] {
        TierSize::Count(n).validate()?;
    }
    let mut tiers = Tiers::new(input)?;
    let mut plan = tiers.initial_plan();
    if input.pool.scale_out == ScaleOut::Fixed {
        return Ok(plan);
    }
    tiers.hold_new_rotation(&mut plan);
    let remaining = tiers.refill_hot_from_warm(&mut plan);
    let mut creates = Creates {
        hot: tiers.hot.provision.saturating_sub(count(plan.start.len())),
        warm: 0,
    };
    let surplus_pending = tiers.settle_hot_surplus(&mut plan, &remaining, &mut creates);
    tiers.apply_bounds(&mut plan, &mut creates);
    plan.create_hot = creates.hot;
    plan.create_warm = creates.warm;
    plan.rotate = tiers.hot.rotate.clone();
    plan.hot.pending = tiers
        .hot
        .pending
        .saturating_add(count(plan.start.len()))
        .saturating_add(creates.hot);
    plan.warm.pending = tiers
        .stopping
        .saturating_add(surplus_pending)
        .saturating_add(count(plan.stop.len()))
        .saturating_add(creates.warm);
    Ok(plan)
}

/// Nodes to create per tier, before and after the bounds.
struct Creates {
    hot: u32,
    warm: u32,
}

/// What one plan works from: the input, the hot tier's own plan, and the target's warm spares.
struct Tiers<'a> {
    input: TierInput<'a>,
    max_age: Option<TimeDelta>,
    warm_target: u32,
    /// The hot tier planned as a plain spare target of size `hot`.
    hot: SparePlan,
    /// The target's powered-off spares holding no job, youngest first (the node most recently
    /// made is the last to age out).
    powered_off: Vec<&'a SpareNode>,
    /// The target's spares stopping now.
    stopping: u32,
}

impl<'a> Tiers<'a> {
    fn new(input: TierInput<'a>) -> Result<Self, SpareSpecError> {
        let spec = input.spec;
        let max_age = spec.max_age.as_deref().map(parse_max_age).transpose()?;
        let hot_spec = SpareTarget {
            target_count: i32::try_from(input.hot).unwrap_or(i32::MAX),
            ..spec.clone()
        };
        let hot = plan_spares(
            input.target_name,
            &hot_spec,
            input.pool.scale_out,
            input.nodes,
            input.now,
        )?;
        // First occurrence of an id wins (as for hot).
        let mut seen = BTreeSet::new();
        let mut powered_off: Vec<&SpareNode> = Vec::new();
        let mut stopping = 0u32;
        for n in input.nodes {
            if !belongs(n, input.target_name, spec.for_band) || !seen.insert(n.node_id.as_str()) {
                continue;
            }
            match (n.state, n.holds_jobs) {
                (SpareState::PoweredOff, false) => powered_off.push(n),
                (SpareState::Stopping, false) => stopping += 1,
                _ => {}
            }
        }
        powered_off.sort_by(|a, b| (b.created_at, &a.node_id).cmp(&(a.created_at, &b.node_id)));
        Ok(Tiers {
            input,
            max_age,
            warm_target: if input.pool.can_stop { input.warm } else { 0 },
            hot,
            powered_off,
            stopping,
        })
    }

    fn aged(&self, n: &SpareNode) -> bool {
        self.max_age
            .is_some_and(|m| self.input.now.signed_duration_since(n.created_at) > m)
    }

    fn warm_underflow(&self, current: u32) -> Option<Underflow> {
        (current < self.warm_target).then(|| Underflow {
            pool: self.input.spec.pool.clone(),
            current,
            target: self.warm_target,
        })
    }

    /// The plan before anything is asked: both tiers' standing.
    fn initial_plan(&self) -> TierPlan {
        let hp = &self.hot;
        let warm_ready = count(self.powered_off.len());
        let mut spare_nodes: Vec<String> = hp
            .spare_nodes
            .iter()
            .cloned()
            .chain(self.powered_off.iter().map(|n| n.node_id.clone()))
            .collect();
        spare_nodes.sort();
        TierPlan {
            hot: TierCounts {
                target: hp.target,
                ready: hp.live,
                pending: hp.pending,
            },
            warm: TierCounts {
                target: self.warm_target,
                ready: warm_ready,
                pending: self.stopping,
            },
            start: Vec::new(),
            stop: Vec::new(),
            create_hot: 0,
            create_warm: 0,
            terminate: Vec::new(),
            rotate: None,
            warm_rotate: None,
            rotation_held: false,
            underflow: hp.underflow.clone(),
            warm_underflow: self.warm_underflow(warm_ready),
            taken: hp.taken.clone(),
            spare_nodes,
            braked: None,
            warm_unsupported: self.input.warm > 0 && !self.input.pool.can_stop,
        }
    }

    /// A new rotation waits for the window; one under way finishes.
    fn hold_new_rotation(&mut self, plan: &mut TierPlan) {
        if let Some(RotationStep::ProvisionReplacement { .. }) = self.hot.rotate
            && !self.input.rotation_allowed
        {
            self.hot.provision = self.hot.provision.saturating_sub(1);
            self.hot.rotate = None;
            plan.rotation_held = true;
        }
    }

    /// Hot refill from warm spares first (none in a held zone); returns the warm spares left
    /// warm, youngest first. A warm spare being started is the hot tier's from now on.
    fn refill_hot_from_warm(&self, plan: &mut TierPlan) -> Vec<&'a SpareNode> {
        let degraded = &self.input.bounds.degraded_zones;
        let need = usize::try_from(self.hot.provision).unwrap_or(usize::MAX);
        plan.start = self
            .powered_off
            .iter()
            .filter(|n| !degraded.contains(&n.zone))
            .take(need)
            .map(|n| n.node_id.clone())
            .collect();
        let remaining: Vec<&SpareNode> = self
            .powered_off
            .iter()
            .filter(|n| !plan.start.contains(&n.node_id))
            .copied()
            .collect();
        plan.warm.ready = count(remaining.len());
        plan.warm_underflow = self.warm_underflow(plan.warm.ready);
        remaining
    }

    /// Hot surplus: the aged spare of a rotation goes; the rest may become warm. Sets the warm
    /// tier's creates, stops, surplus terminations and warm rotation; returns the hot tier's
    /// surplus still on its way (it becomes warm once up).
    fn settle_hot_surplus(
        &self,
        plan: &mut TierPlan,
        remaining: &[&SpareNode],
        creates: &mut Creates,
    ) -> u32 {
        let hp = &self.hot;
        let retiring = match &hp.rotate {
            Some(RotationStep::RetireAged { aged }) => Some(aged.as_str()),
            _ => None,
        };
        let hot_surplus_live = hp.live.saturating_sub(hp.target);
        let surplus_pending = hp
            .live
            .saturating_add(hp.pending)
            .saturating_sub(hp.target)
            .saturating_sub(hot_surplus_live)
            // A rotation's replacement on its way is not surplus: the aged spare leaves for it.
            .saturating_sub(u32::from(matches!(
                hp.rotate,
                Some(RotationStep::AwaitReplacement { .. })
            )));
        let mut warm_have = count(remaining.len())
            .saturating_add(self.stopping)
            .saturating_add(surplus_pending);
        for id in &hp.terminate {
            let is_aged = retiring == Some(id.as_str())
                || self
                    .input
                    .nodes
                    .iter()
                    .any(|n| &n.node_id == id && self.aged(n));
            if !is_aged && warm_have < self.warm_target {
                plan.stop.push(id.clone());
                warm_have += 1;
            } else {
                plan.terminate.push(id.clone());
            }
        }
        creates.warm = self.warm_target.saturating_sub(warm_have);
        if warm_have > self.warm_target {
            // Surplus warm spares, oldest first, never one being started.
            let excess = usize::try_from(warm_have - self.warm_target).unwrap_or(usize::MAX);
            plan.terminate.extend(
                remaining
                    .iter()
                    .rev()
                    .take(excess)
                    .map(|n| n.node_id.clone()),
            );
        } else if warm_have == self.warm_target
            && self.stopping == 0
            && surplus_pending == 0
            && plan.stop.is_empty()
            && let Some(oldest) = remaining.last().filter(|n| self.aged(n))
        {
            // Warm rotation: a replacement first (create-then-stop), then the aged one is surplus.
            if self.input.rotation_allowed {
                creates.warm += 1;
                plan.warm_rotate = Some(oldest.node_id.clone());
            } else {
                plan.rotation_held = true;
            }
        }
        surplus_pending
    }

    /// The pool's bounds (zones, `maxNodes`, the rate) cut the creates: hot before warm.
    fn apply_bounds(&mut self, plan: &mut TierPlan, creates: &mut Creates) {
        let bounds = self.input.bounds;
        let wanted = creates.hot.saturating_add(creates.warm);
        let fits = bounds.room.unwrap_or(u32::MAX);
        let allowed = if bounds.all_zones_degraded {
            0
        } else {
            wanted.min(fits).min(bounds.allowance)
        };
        if allowed >= wanted {
            return;
        }
        plan.braked = Some(if bounds.all_zones_degraded {
            Brake::Zones { wanted }
        } else {
            match bounds.max_nodes {
                Some(max_nodes) if fits < wanted => Brake::MaxNodes {
                    max_nodes,
                    wanted,
                    room: fits,
                },
                _ => Brake::Rate {
                    wanted,
                    allowed: bounds.allowance,
                },
            }
        });
        let hot_cut = creates.hot.min(allowed);
        if hot_cut == 0
            && plan.start.is_empty()
            && matches!(
                self.hot.rotate,
                Some(RotationStep::ProvisionReplacement { .. })
            )
        {
            self.hot.rotate = None;
        }
        creates.hot = hot_cut;
        let warm_cut = creates.warm.min(allowed - hot_cut);
        if warm_cut < creates.warm {
            plan.warm_rotate = None;
        }
        creates.warm = warm_cut;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {

    #[test]
    fn a_schedule_applies_its_pools_start_latency_and_a_margin_ahead() {
        assert_eq!(schedule_lead(TimeDelta::zero()), TimeDelta::seconds(10));
        assert_eq!(schedule_lead(TimeDelta::seconds(3)), TimeDelta::seconds(13));
        assert_eq!(
            schedule_lead(TimeDelta::seconds(120)),
            TimeDelta::seconds(150),
            "a quarter more once that is over 10 s"
        );
    }
    use super::*;
    use crate::vocab::PriorityBand;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().unwrap()
    }

    fn spec(max_age: Option<&str>) -> SpareTarget {
        SpareTarget {
            pool: "aws-east".into(),
            target_count: 0,
            for_band: None,
            instance_type: "m5.xlarge".into(),
            region: "eu-west-1".into(),
            max_age: max_age.map(str::to_owned),
        }
    }

    fn node(id: &str, state: SpareState, age_min: i64) -> SpareNode {
        SpareNode {
            node_id: id.into(),
            state,
            created_at: t0() - TimeDelta::minutes(age_min),
            band: None,
            holds_jobs: false,
            target_name: None,
            zone: "a".into(),
        }
    }

    fn elastic() -> PoolTraits {
        PoolTraits {
            scale_out: ScaleOut::Elastic,
            can_stop: true,
        }
    }

    fn open_bounds() -> TierBounds {
        TierBounds {
            allowance: 60,
            ..TierBounds::default()
        }
    }

    fn plan(hot: u32, warm: u32, s: &SpareTarget, nodes: &[SpareNode]) -> TierPlan {
        plan_with(hot, warm, s, nodes, true, &open_bounds(), elastic())
    }

    fn plan_with(
        hot: u32,
        warm: u32,
        s: &SpareTarget,
        nodes: &[SpareNode],
        rotation_allowed: bool,
        bounds: &TierBounds,
        pool: PoolTraits,
    ) -> TierPlan {
        plan_tiers(TierInput {
            target_name: "t",
            spec: s,
            hot,
            warm,
            pool,
            nodes,
            now: t0(),
            rotation_allowed,
            bounds,
        })
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn sizes_resolve_counts_and_shares_within_min_and_max() {
        let share = |percent, min, max| TierSize::Share { percent, min, max };
        let cases = [
            (TierSize::Count(3), 100, 3),
            (share(10, 2, 20), 0, 2),
            (share(10, 2, 20), 35, 4),
            (share(10, 2, 20), 1000, 20),
            (share(0, 0, 5), 100, 0),
            (share(100, 0, 1000), 7, 7),
        ];
        for (size, working, want) in cases {
            assert_eq!(size.resolve(working), want, "{size:?} of {working}");
        }
        assert!(share(101, 0, 1).validate().is_err());
        assert!(share(10, 5, 4).validate().is_err());
        assert!(share(10, 0, 1001).validate().is_err());
        assert!(TierSize::Count(1001).validate().is_err());
        assert!(share(10, 4, 4).validate().is_ok());
    }

    #[test]
    fn a_taken_hot_spare_is_refilled_by_starting_the_youngest_warm_spare() {
        let mut taken = node("h1", SpareState::Started, 10);
        taken.holds_jobs = true;
        let nodes = [
            taken,
            node("h2", SpareState::Started, 10),
            node("w-old", SpareState::PoweredOff, 50),
            node("w-young", SpareState::PoweredOff, 5),
        ];
        let p = plan(2, 2, &spec(None), &nodes);
        assert_eq!(p.taken, vec!["h1".to_owned()]);
        assert_eq!(p.start, vec!["w-young".to_owned()]);
        assert_eq!(p.create_hot, 0);
        // The warm tier is now one short: created, to be stopped once up.
        assert_eq!(p.create_warm, 1);
        assert_eq!((p.hot.ready, p.hot.pending), (1, 1));
        assert_eq!((p.warm.ready, p.warm.pending), (1, 1));
    }

    #[test]
    fn with_no_warm_spare_left_the_hot_tier_creates() {
        let p = plan(2, 1, &spec(None), &[node("h1", SpareState::Started, 1)]);
        assert!(p.start.is_empty());
        assert_eq!((p.create_hot, p.create_warm), (1, 1));
    }

    #[test]
    fn a_warm_spare_in_a_held_zone_is_not_started() {
        let mut w = node("w", SpareState::PoweredOff, 1);
        w.zone = "b".into();
        let bounds = TierBounds {
            degraded_zones: ["b".to_owned()].into(),
            ..open_bounds()
        };
        let p = plan_with(1, 0, &spec(None), &[w], true, &bounds, elastic());
        assert!(p.start.is_empty());
        assert_eq!(p.create_hot, 1);
        // And the surplus warm spare (target 0) goes.
        assert_eq!(p.terminate, vec!["w".to_owned()]);
    }

    #[test]
    fn surplus_hot_spares_become_warm_before_anything_is_created() {
        let nodes: Vec<SpareNode> = (0..4)
            .map(|i| node(&format!("h{i}"), SpareState::Started, 40 - i))
            .collect();
        let p = plan(2, 1, &spec(None), &nodes);
        assert_eq!(p.stop, vec!["h0".to_owned()]);
        assert_eq!(p.terminate, vec!["h1".to_owned()]);
        assert_eq!(p.creates(), 0);
    }

    #[test]
    fn created_and_stopping_nodes_count_as_coming_warm() {
        // Hot is at target, one node is starting beyond it (a warm creation) and one stopping.
        let nodes = [
            node("h", SpareState::Started, 1),
            node("new", SpareState::Starting, 0),
            node("s", SpareState::Stopping, 3),
        ];
        let p = plan(1, 2, &spec(None), &nodes);
        assert!(p.is_noop(), "{p:?}");
        assert_eq!((p.warm.ready, p.warm.pending), (0, 2));
        assert!(p.warm_underflow.is_some());
    }

    #[test]
    fn every_tier_is_bounded_hot_first() {
        let bounds = TierBounds {
            max_nodes: Some(10),
            room: Some(3),
            ..open_bounds()
        };
        let p = plan_with(2, 4, &spec(None), &[], true, &bounds, elastic());
        assert_eq!((p.create_hot, p.create_warm), (2, 1));
        assert_eq!(
            p.braked,
            Some(Brake::MaxNodes {
                max_nodes: 10,
                wanted: 6,
                room: 3
            })
        );
        let rate = TierBounds {
            allowance: 1,
            ..open_bounds()
        };
        let p = plan_with(2, 4, &spec(None), &[], true, &rate, elastic());
        assert_eq!((p.create_hot, p.create_warm), (1, 0));
        assert!(matches!(p.braked, Some(Brake::Rate { .. })));
        let zones = TierBounds {
            all_zones_degraded: true,
            ..open_bounds()
        };
        let p = plan_with(2, 4, &spec(None), &[], true, &zones, elastic());
        assert_eq!(p.creates(), 0);
        assert_eq!(p.braked, Some(Brake::Zones { wanted: 6 }));
        assert_eq!(
            p.braked.as_ref().map(|b| b.message("aws-east", 2)),
            Some(
                "every zone of pool aws-east is degraded (zone brake): 6 spare(s) wait until one clears"
                    .to_owned()
            )
        );
    }

    #[test]
    fn a_pool_that_cannot_stop_has_no_warm_tier_and_says_so() {
        let cluster = PoolTraits {
            scale_out: ScaleOut::Elastic,
            can_stop: false,
        };
        let p = plan_with(1, 3, &spec(None), &[], true, &open_bounds(), cluster);
        assert!(p.warm_unsupported);
        assert_eq!((p.warm.target, p.create_warm, p.create_hot), (0, 0, 1));
    }

    #[test]
    fn fixed_pools_only_report() {
        let fixed = PoolTraits {
            scale_out: ScaleOut::Fixed,
            can_stop: false,
        };
        let p = plan_with(2, 0, &spec(None), &[], true, &open_bounds(), fixed);
        assert!(p.is_noop());
        assert_eq!(p.underflow.map(|u| (u.current, u.target)), Some((0, 2)));
    }

    #[test]
    fn rotation_waits_for_the_window_and_a_rotation_under_way_finishes() {
        let s = spec(Some("1h"));
        let nodes = [node("old", SpareState::Started, 61)];
        let held = plan_with(1, 0, &s, &nodes, false, &open_bounds(), elastic());
        assert!(held.is_noop());
        assert!(held.rotation_held);
        let open = plan_with(1, 0, &s, &nodes, true, &open_bounds(), elastic());
        assert_eq!(open.create_hot, 1);
        assert!(!open.rotation_held);
        // The replacement is up: the aged spare goes even outside the window.
        let done = plan_with(
            1,
            1,
            &s,
            &[nodes[0].clone(), node("new", SpareState::Started, 0)],
            false,
            &open_bounds(),
            elastic(),
        );
        assert_eq!(done.terminate, vec!["old".to_owned()]);
        assert!(done.stop.is_empty(), "an aged spare is never made warm");
    }

    #[test]
    fn an_aged_warm_spare_is_replaced_then_retired() {
        let s = spec(Some("1h"));
        let p = plan(0, 1, &s, &[node("w", SpareState::PoweredOff, 61)]);
        assert_eq!((p.create_warm, p.warm_rotate.as_deref()), (1, Some("w")));
        let p = plan(
            0,
            1,
            &s,
            &[
                node("w", SpareState::PoweredOff, 61),
                node("w2", SpareState::PoweredOff, 0),
            ],
        );
        assert_eq!(p.terminate, vec!["w".to_owned()]);
    }

    #[test]
    fn schedules_apply_ahead_by_the_start_latency_and_the_largest_wins() {
        let friday = TierSchedule {
            recurrence: Recurrence::parse("0 18 * * FRI", "5h30m", "Europe/Oslo").unwrap(),
            sizes: TierSizes {
                hot: TierSize::Count(12),
                warm: TierSize::Count(4),
            },
        };
        let night = TierSchedule {
            recurrence: Recurrence::parse("0 20 * * *", "2h", "Europe/Oslo").unwrap(),
            sizes: TierSizes {
                hot: TierSize::Count(3),
                warm: TierSize::Share {
                    percent: 50,
                    min: 0,
                    max: 10,
                },
            },
        };
        let base = TierSizes {
            hot: TierSize::Count(2),
            warm: TierSize::Count(0),
        };
        let schedules = [friday, night];
        let lead = TimeDelta::seconds(90);
        // Friday 2026-01-09 18:00 Oslo is 17:00 UTC.
        let at = |h, m, s| Utc.with_ymd_and_hms(2026, 1, 9, h, m, s).single().unwrap();
        let e = tiers_in_effect(&base, &schedules, 40, at(16, 58, 29), lead);
        assert_eq!((e.hot, e.warm, e.active.clone()), (2, 0, vec![]));
        assert_eq!(e.next_change, Some(at(16, 58, 30)));
        let e = tiers_in_effect(&base, &schedules, 40, at(16, 58, 30), lead);
        assert_eq!((e.hot, e.warm, e.active.clone()), (12, 4, vec![0]));
        let e = tiers_in_effect(&base, &schedules, 40, at(19, 0, 0), lead);
        // 50 % of 40 working nodes is 20, held to the share's max of 10.
        assert_eq!((e.hot, e.warm, e.active.clone()), (12, 10, vec![0, 1]));
        let e = tiers_in_effect(&base, &schedules, 40, at(22, 30, 0), lead);
        assert_eq!((e.hot, e.warm), (2, 0));
    }

    // ---- properties on a fake clock ----

    fn arb_nodes() -> impl Strategy<Value = Vec<SpareNode>> {
        let state = prop_oneof![
            Just(SpareState::Starting),
            Just(SpareState::Started),
            Just(SpareState::Started),
            Just(SpareState::Stopping),
            Just(SpareState::PoweredOff),
            Just(SpareState::PoweredOff),
            Just(SpareState::Stopped),
            Just(SpareState::Terminated),
        ];
        let one = (0u8..14, state, 0i64..200, prop::bool::weighted(0.1), 0u8..3).prop_map(
            |(id, state, age, holds_jobs, zone)| SpareNode {
                holds_jobs: holds_jobs
                    && matches!(state, SpareState::Started | SpareState::Starting),
                zone: ["a", "b", "c"][zone as usize].to_owned(),
                ..node(&format!("n{id}"), state, age)
            },
        );
        prop::collection::vec(one, 0..14)
    }

    fn arb_bounds() -> impl Strategy<Value = TierBounds> {
        (
            proptest::option::of(0u32..12),
            0u32..8,
            proptest::sample::subsequence(vec!["a", "b", "c"], 0..=3),
        )
            .prop_map(|(room, allowance, degraded)| TierBounds {
                max_nodes: room.map(|r| r + 20),
                room,
                allowance,
                all_zones_degraded: degraded.len() == 3,
                degraded_zones: degraded.into_iter().map(str::to_owned).collect(),
            })
    }

    fn unique(nodes: Vec<SpareNode>) -> Vec<SpareNode> {
        let mut seen = BTreeSet::new();
        nodes
            .into_iter()
            .filter(|n| seen.insert(n.node_id.clone()))
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Every action touches only a node of the right state, never one holding a job, never
        /// twice; creations fit every bound; no warm spare in a held zone is started.
        #[test]
        fn actions_are_safe_and_bounded(
            hot in 0u32..6, warm in 0u32..6, nodes in arb_nodes(), bounds in arb_bounds(),
            rotation in any::<bool>(), aged in any::<bool>(),
        ) {
            let nodes = unique(nodes);
            let s = spec(aged.then_some("1h"));
            let p = plan_with(hot, warm, &s, &nodes, rotation, &bounds, elastic());
            let find = |id: &String| nodes.iter().find(|n| &n.node_id == id);
            for id in &p.start {
                let n = find(id);
                prop_assert!(n.is_some_and(|n| n.state == SpareState::PoweredOff && !bounds.degraded_zones.contains(&n.zone)));
            }
            for id in p.stop.iter().chain(&p.terminate) {
                let n = find(id);
                prop_assert!(n.is_some_and(|n| !n.holds_jobs && matches!(n.state, SpareState::Started | SpareState::PoweredOff)));
            }
            let all: Vec<&String> = p.start.iter().chain(&p.stop).chain(&p.terminate).collect();
            let set: BTreeSet<&&String> = all.iter().collect();
            prop_assert_eq!(set.len(), all.len(), "a node in two actions");
            prop_assert!(p.creates() <= bounds.allowance);
            prop_assert!(p.creates() <= bounds.room.unwrap_or(u32::MAX));
            if bounds.all_zones_degraded { prop_assert_eq!(p.creates(), 0); }
            let replacing = matches!(p.rotate, Some(RotationStep::ProvisionReplacement { .. }));
            if !rotation {
                prop_assert!(p.warm_rotate.is_none());
                prop_assert!(!replacing);
            }
        }

        /// Warm before create: a hot shortfall creates only once no startable warm spare is left.
        #[test]
        fn hot_refills_from_warm_first(hot in 0u32..6, warm in 0u32..6, nodes in arb_nodes()) {
            let nodes = unique(nodes);
            let p = plan(hot, warm, &spec(None), &nodes);
            let startable = nodes.iter().filter(|n| n.state == SpareState::PoweredOff && !n.holds_jobs).count();
            if p.create_hot > 0 {
                prop_assert_eq!(p.start.len(), startable);
            }
        }

        /// Without a warm tier the hot tier is exactly the hot-spare planner.
        #[test]
        fn without_warm_the_hot_tier_is_plan_spares(hot in 0u32..6, nodes in arb_nodes()) {
            let nodes: Vec<SpareNode> = unique(nodes).into_iter().filter(|n| n.state != SpareState::PoweredOff).collect();
            let mut s = spec(None);
            let p = plan(hot, 0, &s, &nodes);
            s.target_count = hot as i32;
            let old = plan_spares("t", &s, ScaleOut::Elastic, &nodes, t0()).unwrap();
            prop_assert_eq!(p.create_hot, old.provision);
            prop_assert!(p.start.is_empty() && p.stop.is_empty());
            prop_assert_eq!(p.terminate, old.terminate);
        }

        /// A simulated pool on a fake clock: created and started nodes come up a step later,
        /// stopped ones power off a step later, terminated ones vanish, recoveries take hot
        /// spares now and then. Once the recoveries stop, both tiers settle at their targets
        /// with nothing left to do; live hot spares never drop below target by the planner's
        /// own hand.
        #[test]
        fn tiers_converge_on_a_fake_clock(
            hot in 0u32..5, warm in 0u32..5, start in arb_nodes(),
            takes in proptest::collection::vec(any::<bool>(), 20), allowance in 1u32..4,
        ) {
            let mut nodes: Vec<SpareNode> = unique(start).into_iter()
                .filter(|n| !n.holds_jobs && !matches!(n.state, SpareState::Stopped | SpareState::Terminated))
                .collect();
            let bounds = TierBounds { allowance, ..TierBounds::default() };
            let mut now = t0();
            let mut next = 0;
            for round in 0..60 {
                let p = plan_tiers(TierInput {
                    target_name: "t", spec: &spec(None), hot, warm, pool: elastic(), nodes: &nodes, now,
                    rotation_allowed: true, bounds: &bounds,
                }).unwrap();
                // Nodes move one step.
                for n in &mut nodes {
                    n.state = match n.state {
                        SpareState::Starting => SpareState::Started,
                        SpareState::Stopping => SpareState::PoweredOff,
                        s => s,
                    };
                }
                nodes.retain(|n| !p.terminate.contains(&n.node_id) && !n.holds_jobs);
                for n in &mut nodes {
                    if p.start.contains(&n.node_id) { n.state = SpareState::Starting; }
                    if p.stop.contains(&n.node_id) { n.state = SpareState::Stopping; }
                }
                // The planner stops only surplus: never fewer live than target by its own hand.
                let live_after = nodes.iter().filter(|n| n.state == SpareState::Started).count() as u32;
                prop_assert!(p.stop.is_empty() || live_after >= hot, "round {round}");
                for _ in 0..p.creates() {
                    next += 1;
                    nodes.push(SpareNode { created_at: now, ..node(&format!("new{next}"), SpareState::Starting, 0) });
                }
                // A recovery takes a live hot spare in the first rounds.
                if takes.get(round).copied().unwrap_or(false)
                    && let Some(n) = nodes.iter_mut().find(|n| n.state == SpareState::Started)
                {
                    n.holds_jobs = true;
                }
                now += TimeDelta::seconds(30);
            }
            let p = plan_tiers(TierInput {
                target_name: "t", spec: &spec(None), hot, warm, pool: elastic(), nodes: &nodes, now,
                rotation_allowed: true, bounds: &bounds,
            }).unwrap();
            prop_assert_eq!((p.hot.ready, p.hot.pending), (hot, 0));
            prop_assert_eq!((p.warm.ready, p.warm.pending), (warm, 0));
            prop_assert!(p.is_noop(), "not settled: {:?}", p.clone());
        }

        /// Shares resolve within their bounds and grow with the pool.
        #[test]
        fn shares_are_monotonic_and_bounded(percent in 0u32..=100, min in 0u32..50, span in 0u32..50, a in 0u32..2000, b in 0u32..2000) {
            let size = TierSize::Share { percent, min, max: min + span };
            let (lo, hi) = (a.min(b), a.max(b));
            prop_assert!(size.resolve(lo) <= size.resolve(hi));
            prop_assert!((min..=min + span).contains(&size.resolve(a)));
        }

        /// Over a simulated week the schedule's counts hold at every instant of its window.
        #[test]
        fn a_schedule_holds_through_its_window(minute in 0i64..(7 * 24 * 60), lead_s in 0i64..600) {
            let sched = TierSchedule {
                recurrence: Recurrence::parse("0 18 * * FRI", "5h30m", "Europe/Oslo").unwrap(),
                sizes: TierSizes { hot: TierSize::Count(12), warm: TierSize::Count(3) },
            };
            let base = TierSizes { hot: TierSize::Count(2), warm: TierSize::Count(0) };
            let t = t0() + TimeDelta::minutes(minute);
            let e = tiers_in_effect(&base, std::slice::from_ref(&sched), 10, t, TimeDelta::seconds(lead_s));
            if sched.recurrence.open_at(t).is_some() {
                prop_assert_eq!((e.hot, e.warm), (12, 3));
            }
            if let Some(c) = e.next_change { prop_assert!(c > t); }
        }
    }

    #[test]
    fn a_band_dedicated_target_counts_only_its_band() {
        let mut gold = node("g", SpareState::PoweredOff, 1);
        gold.band = Some(PriorityBand::Gold);
        let mut s = spec(None);
        s.for_band = Some(PriorityBand::Gold);
        let p = plan(1, 0, &s, &[gold, node("plain", SpareState::PoweredOff, 1)]);
        assert_eq!(p.start, vec!["g".to_owned()]);
    }
}
