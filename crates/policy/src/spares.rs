//! The spare planner: what one `HotSpareTarget` needs done to its pool's spares right now.
//!
//! Pure: the caller passes the target, whether the pool is elastic or fixed, the clock and the
//! pool's spare-tagged nodes as plain data ([`SpareNode`]); [`plan_spares`] answers with a
//! [`SparePlan`] (how many spares to request, which to terminate, the rotation step, underflow).
//! No I/O, no clock, no Kubernetes or Manager types beyond the CRD spec.
//!
//! The rules, from the TypeScript library's "Hot spares" section:
//!
//! - **Membership.** A node counts for a target when its spare band equals the target's
//!   `forBand` (an unbanded target counts only unbanded spares) and, when the node carries a
//!   [`SPARE_TARGET_TAG`] tag, that tag names this target. Spares this planner asks for
//!   carry all three tags ([`spare_provision_request`]), so two targets on one pool never
//!   share a node.
//! - **Live and pending.** A started node holding no job is a *live* spare; a starting node
//!   holding no job is *pending* and counts as coming. Stopped and terminated nodes count for
//!   nothing.
//! - **A spare that takes a job is no longer a spare.** It is counted out (listed in
//!   [`SparePlan::taken`]), which is what makes underflow visible at once and a replacement
//!   provisioned. The planner never terminates a node that holds a job.
//! - **Under target → provision** `target − live − pending` (elastic pools only).
//! - **Over target → terminate the oldest excess** live spares, `live − target` of them, oldest
//!   first (ties by node id). Pending spares are never terminated: when they come up and push
//!   live over target, the oldest are removed then. So terminations never take live below target.
//! - **Rotation (`maxAge`).** When the pool is steady (live = target, nothing pending) and the
//!   oldest live spare is older than `maxAge`, one replacement is requested
//!   ([`RotationStep::ProvisionReplacement`]). While it is starting nothing else rotates
//!   ([`RotationStep::AwaitReplacement`]). Once it is live the pool is one over target and the
//!   oldest-excess rule terminates the aged spare ([`RotationStep::RetireAged`]). One at a time,
//!   and live never drops below target during a rotation unless fewer than target existed.
//! - **Fixed pools never act.** They cannot grow or be trusted to shrink by us: the plan only
//!   reports underflow (the TypeScript library's `onSpareUnderflow` for cluster pools), with no provisioning,
//!   termination or rotation.
//! - **Underflow** is reported whenever live < target (pending spares do not hide it: a gold
//!   job failing now could not use them), with pool, current and target.
//!
//! Bad input has a defined answer: a `targetCount` outside 0..=1000 or a malformed `maxAge` is a
//! [`SpareSpecError`] (the apiserver's schema already refuses both, so this only guards against
//! objects written around it); duplicate node ids count once (the first occurrence among the
//! target's nodes).

use std::collections::BTreeSet;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};

use crate::pass::{NextLook, Verdict};
pub use crate::tags::SPARE_TARGET_TAG;
use crate::tags::{SPARE_BAND_TAG, SPARE_TAG};
use crate::vocab::{PriorityBand, ScaleOut, Standing};

/// What a `HotSpareTarget` asks for, as plain data (the CRD's spec without Kubernetes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpareTarget {
    /// The pool the spares belong to.
    pub pool: String,
    /// How many live spares to keep (the schema bounds it to 0..=1000).
    pub target_count: i32,
    /// The band the spares are dedicated to, if any.
    pub for_band: Option<PriorityBand>,
    /// The instance type to provision.
    pub instance_type: String,
    /// The region to provision in.
    pub region: String,
    /// Rotate spares older than this (a duration such as `24h`).
    pub max_age: Option<String>,
}

/// The largest `targetCount` the schema allows.
pub const MAX_TARGET_COUNT: u32 = 1000;

/// The shortest `maxAge` the schema allows.
pub const MIN_MAX_AGE: TimeDelta = TimeDelta::minutes(1);

/// The longest `maxAge` accepted (ten years): longer is almost certainly a typo.
pub const MAX_MAX_AGE: TimeDelta = TimeDelta::days(3650);

/// The longest `maxAge` string the schema allows.
const MAX_AGE_MAX_LEN: usize = 32;

/// A spare node's lifecycle state as Manager reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpareState {
    /// Provisioned, not yet up: counts as a pending spare.
    Starting,
    /// Up: a live spare when it holds no job.
    Started,
    /// Unreachable (Manager's `STOPPED`: partitioned, may come back): counts for nothing.
    Stopped,
    /// Being stopped on request, keeping its disk and id: on its way to the warm tier. The hot
    /// tier counts it for nothing.
    Stopping,
    /// Stopped on request (powered off, no compute): a warm spare when it holds no job. The hot
    /// tier counts it for nothing; starting it brings it back as `Starting`.
    PoweredOff,
    /// Gone: counts for nothing.
    Terminated,
}

/// One spare-tagged node of the pool, as plain data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpareNode {
    /// Manager's node id.
    pub node_id: String,
    /// Its state.
    pub state: SpareState,
    /// When it was created (its age decides rotation and which excess spare goes first).
    pub created_at: DateTime<Utc>,
    /// The band it is dedicated to (`spare-band` tag), if any.
    pub band: Option<PriorityBand>,
    /// Whether it runs any job (then it is no longer a spare).
    pub holds_jobs: bool,
    /// The `HotSpareTarget` it was provisioned for ([`SPARE_TARGET_TAG`] tag), if tagged.
    pub target_name: Option<String>,
    /// Its zone (empty when not known yet): a warm spare in a zone the zone brake holds is
    /// not started.
    pub zone: String,
}

/// One step of a `maxAge` rotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RotationStep {
    /// `aged` is past `maxAge`: one replacement is requested (it is included in
    /// [`SparePlan::provision`]); `aged` stays until the replacement is live.
    ProvisionReplacement {
        /// The spare being rotated out.
        aged: String,
    },
    /// A replacement (or surplus spare) is starting; `aged` goes once it is live.
    AwaitReplacement {
        /// The spare being rotated out.
        aged: String,
    },
    /// `aged` is in [`SparePlan::terminate`]: the caller records the rotation time.
    RetireAged {
        /// The spare being terminated for age.
        aged: String,
    },
}

/// Live spares are below target (the TypeScript library's `onSpareUnderflow(pool, current, target)`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Underflow {
    /// The pool.
    pub pool: String,
    /// Live spares now.
    pub current: u32,
    /// The target.
    pub target: u32,
}

impl Underflow {
    /// The `SpareUnderflow` condition's message and the Warning Event's note.
    pub fn message(&self) -> String {
        format!(
            "pool {} has {} live spare(s), below its target of {}",
            self.pool, self.current, self.target
        )
    }
}

/// What to do about one `HotSpareTarget` now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SparePlan {
    /// The target count (validated).
    pub target: u32,
    /// Live spares observed (started, holding no job).
    pub live: u32,
    /// Pending spares observed (starting, holding no job).
    pub pending: u32,
    /// New spares to request now (rotation replacement included). Always 0 on fixed pools.
    pub provision: u32,
    /// Spares to terminate now, oldest first. Always empty on fixed pools.
    pub terminate: Vec<String>,
    /// The rotation step in progress, if any.
    pub rotate: Option<RotationStep>,
    /// Set when live < target.
    pub underflow: Option<Underflow>,
    /// Spares of this target that now hold a job: no longer spares (for Events).
    pub taken: Vec<String>,
    /// Ids of the live and pending spares observed, sorted (`status.spareNodes`).
    pub spare_nodes: Vec<String>,
    /// Set when the provisioning brake held back some of the spares wanted ([`SparePlan::brake`]).
    pub braked: Option<Brake>,
}

/// Why fewer spares are asked for than the target needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Brake {
    /// The pool is at its `maxNodes`: the target cannot be met until nodes go or the bound rises.
    MaxNodes {
        /// The pool's `maxNodes`.
        max_nodes: u32,
        /// Spares wanted now.
        wanted: u32,
        /// Spares that fit under `maxNodes`.
        room: u32,
    },
    /// The pool's request rate is used up for this minute; the rest follow later.
    Rate {
        /// Spares wanted now.
        wanted: u32,
        /// Requests the rate allows now.
        allowed: u32,
    },
    /// Every zone of the pool is held by the zone brake: nothing is provisioned until one clears.
    Zones {
        /// Spares wanted now.
        wanted: u32,
    },
}

impl Brake {
    /// The reason word for conditions.
    pub fn reason(&self) -> &'static str {
        match self {
            Brake::MaxNodes { .. } => "PoolAtMaxNodes",
            Brake::Rate { .. } => "ProvisioningRateLimited",
            Brake::Zones { .. } => "ZonesDegraded",
        }
    }

    /// A sentence for conditions and Events.
    pub fn message(&self, pool: &str, target: u32) -> String {
        match self {
            // No room: the pool may be above the bound (a lowered maxNodes), not only at it.
            Brake::MaxNodes {
                max_nodes,
                wanted,
                room: 0,
            } => format!(
                "target {target} cannot be met: pool {pool} is at or above its maxNodes ({max_nodes}); {wanted} more spare(s) wanted, room for none"
            ),
            Brake::MaxNodes {
                max_nodes,
                wanted,
                room,
            } => format!(
                "target {target} cannot be met: pool {pool} is near its maxNodes ({max_nodes}); {wanted} more spare(s) wanted, room for {room}"
            ),
            Brake::Rate { wanted, allowed } => format!(
                "pool {pool} may ask for {allowed} more node(s) this minute; {wanted} spare(s) wanted, the rest follow"
            ),
            Brake::Zones { wanted } => format!(
                "every zone of pool {pool} is degraded (zone brake): {wanted} spare(s) wait until one clears"
            ),
        }
    }
}

impl SparePlan {
    /// Whether the plan asks for any change on Manager.
    pub fn is_noop(&self) -> bool {
        self.provision == 0 && self.terminate.is_empty()
    }

    /// The plan with the provisioning brake applied: at most `room` more nodes in the pool (its
    /// `maxNodes` less the nodes it has; `None` when unbounded) and at most `allowance` requests
    /// now (the pool's rate). The `maxNodes` bound wins the reason when both hold back spares.
    /// A rotation whose replacement cannot be asked for does not start.
    pub fn brake(mut self, max_nodes: Option<u32>, room: Option<u32>, allowance: u32) -> Self {
        let wanted = self.provision;
        let fits = room.unwrap_or(u32::MAX);
        let allowed = wanted.min(fits).min(allowance);
        if allowed == wanted {
            return self;
        }
        self.braked = Some(match max_nodes {
            Some(max_nodes) if fits < wanted => Brake::MaxNodes {
                max_nodes,
                wanted,
                room: fits,
            },
            _ => Brake::Rate {
                wanted,
                allowed: allowance,
            },
        });
        self.provision = allowed;
        if allowed == 0 && matches!(self.rotate, Some(RotationStep::ProvisionReplacement { .. })) {
            self.rotate = None;
        }
        self
    }

    /// `status.underflowSince`: kept from the previous status while the underflow lasts, set to
    /// `now` when it begins, cleared when it ends.
    pub fn underflow_since(
        &self,
        previous: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Option<DateTime<Utc>> {
        self.underflow.as_ref().map(|_| previous.unwrap_or(now))
    }
}

/// The `SpareUnderflow` condition for spares `live` of `target` (status, reason, message).
pub fn underflow_condition(
    underflow: Option<&Underflow>,
    live: u32,
    target: u32,
) -> (bool, &'static str, String) {
    match underflow {
        Some(u) => (true, "BelowTarget", u.message()),
        None => (
            false,
            "AtTarget",
            format!("{live} live spares, target {target}"),
        ),
    }
}

impl SparePlan {
    /// The `SpareUnderflow` condition: (status, reason, message).
    pub fn underflow_condition(&self) -> (bool, &'static str, String) {
        underflow_condition(self.underflow.as_ref(), self.live, self.target)
    }

    /// The `maxNodes` brake, when it holds back spares the target needs: the target cannot be
    /// met until nodes go or the bound rises.
    pub fn unreachable(&self) -> Option<&Brake> {
        self.braked
            .as_ref()
            .filter(|b| matches!(b, Brake::MaxNodes { .. }))
    }

    /// Where the target stands once the plan is acted on. Underflow with spares on their way
    /// is progress; underflow nothing can fix (a fixed pool has no nodes to spare, a pool at
    /// its `maxNodes`) is stalled until nodes or the target change, and says why.
    pub fn verdict(&self, pool: &str, retrying: Option<&Retrying>) -> Verdict {
        let counts = format!(
            "{} live, {} pending, target {}",
            self.live, self.pending, self.target
        );
        let (standing, reason) = match &self.underflow {
            Some(_) if self.unreachable().is_some() => (Standing::Stalled, "PoolAtMaxNodes"),
            Some(_) if retrying.is_some() => (Standing::Reconciling, "ProvisioningRetrying"),
            Some(_) if self.pending + self.provision > 0 => (Standing::Reconciling, "Provisioning"),
            Some(_) => (Standing::Stalled, "SpareUnderflow"),
            None if !self.terminate.is_empty() => (Standing::Reconciling, "TerminatingExcess"),
            None if self.rotate.is_some() => (Standing::Reconciling, "Rotating"),
            None => (Standing::Ready, "AtTarget"),
        };
        let message = match (&self.underflow, self.unreachable(), retrying) {
            (Some(_), Some(brake), _) => {
                format!("{}; {counts}", brake.message(pool, self.target))
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

    /// When the target is looked at again: once a failed ask's back-off is over, soon while
    /// spares are asked for or a rotation runs, after the rate's minute moves on when it held
    /// spares back, else at [`REFRESH`].
    pub fn next_look(&self, retrying: Option<&Retrying>) -> NextLook {
        NextLook::After(if let Some(r) = retrying {
            r.after.max(Duration::from_secs(1))
        } else if self.provision > 0 || self.rotate.is_some() {
            Duration::from_secs(1)
        } else if matches!(self.braked, Some(Brake::Rate { .. })) {
            Duration::from_secs(5)
        } else {
            REFRESH
        })
    }
}

/// A spare that could not be asked for now: the last ask failed (it was not refused) and the
/// next waits its back-off.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retrying {
    /// Why the last ask failed.
    pub why: String,
    /// How long until the next ask.
    pub after: Duration,
}

/// Rotation and a target's figures are looked at least this often.
pub const REFRESH: Duration = Duration::from_secs(30);

/// Why a HotSpareTarget's pass records a stall instead of a plan (Stalled, but for a Manager
/// outage, which is waited out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stall {
    /// `spec.pool` is no name a PlacementPool can have: no request is made for it.
    InvalidPoolName(String),
    /// No PlacementPool of that name.
    UnknownPool(String),
    /// The pool lists candidate instance types and the target's is not among them: Manager
    /// would refuse every ask.
    UnknownInstanceType {
        /// The pool.
        pool: String,
        /// The target's instance type.
        wanted: String,
        /// The pool's candidate instance types.
        known: Vec<String>,
    },
    /// Manager is unreachable (why, as the operator's error says it).
    ManagerUnavailable(String),
    /// The spec is one the planner cannot work with.
    InvalidSpec(SpareSpecError),
    /// Manager refused to provision a spare (the refusal, described); final for this spec.
    ProvisioningRefused(String),
}

impl Stall {
    /// The conditions' reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Stall::InvalidPoolName(_) | Stall::UnknownPool(_) => "UnknownPool",
            Stall::UnknownInstanceType { .. } => "UnknownInstanceType",
            Stall::ManagerUnavailable(_) => "ManagerUnavailable",
            Stall::InvalidSpec(_) => "InvalidSpec",
            Stall::ProvisioningRefused(_) => "ProvisioningRefused",
        }
    }

    /// The conditions' message.
    pub fn message(&self) -> String {
        match self {
            Stall::InvalidPoolName(pool) => format!(
                "{pool:?} is not a PlacementPool name (lowercase letters, digits, '-' and '.')"
            ),
            Stall::UnknownPool(pool) => format!("PlacementPool {pool} does not exist"),
            Stall::UnknownInstanceType {
                pool,
                wanted,
                known,
            } => format!(
                "pool {pool} has no instance type {wanted:?} (known: {})",
                known.join(", ")
            ),
            Stall::ManagerUnavailable(why) => why.clone(),
            Stall::InvalidSpec(e) => e.to_string(),
            Stall::ProvisioningRefused(refusal) => refusal.clone(),
        }
    }

    /// The stall as a verdict: Stalled, but for a Manager outage, which the operator waits out
    /// (Reconciling: nothing in the target needs fixing).
    pub fn verdict(&self) -> Verdict {
        match self {
            Stall::ManagerUnavailable(_) => {
                Verdict::new(Standing::Reconciling, self.reason(), self.message())
            }
            _ => Verdict::stalled(self.reason(), self.message()),
        }
    }

    /// When the target is looked at again: a missing pool may appear and Manager may come back
    /// or change its mind; the rest wait for a change of spec.
    pub fn next_look(&self) -> NextLook {
        match self {
            Stall::UnknownPool(_) | Stall::ProvisioningRefused(_) => NextLook::After(REFRESH),
            Stall::ManagerUnavailable(_) => NextLook::After(Duration::from_secs(3)),
            Stall::InvalidPoolName(_)
            | Stall::UnknownInstanceType { .. }
            | Stall::InvalidSpec(_) => NextLook::OnChange,
        }
    }
}

/// Whether the target's instance type is one the pool offers (a pool that lists none offers
/// any).
pub fn check_instance_type(pool: &str, known: &[String], wanted: &str) -> Result<(), Stall> {
    if known.is_empty() || known.iter().any(|t| t == wanted) {
        return Ok(());
    }
    Err(Stall::UnknownInstanceType {
        pool: pool.to_owned(),
        wanted: wanted.to_owned(),
        known: known.to_vec(),
    })
}

/// What to ask Manager for when provisioning a spare of a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProvisionRequest {
    /// The pool.
    pub pool: String,
    /// The instance type.
    pub instance_type: String,
    /// The region.
    pub region: String,
    /// Tags: `spare=true`, `spare-band=<band>` when dedicated,
    /// `automanager.hot-spare-target=<name>`.
    pub tags: Vec<(String, String)>,
}

/// A `HotSpareTarget` spec the planner cannot work with.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpareSpecError {
    /// `targetCount` is negative or above [`MAX_TARGET_COUNT`].
    #[error("targetCount must be between 0 and {MAX_TARGET_COUNT}, not {0}")]
    TargetOutOfRange(i32),
    /// A tier's size cannot be worked with (a share above 100 %, a minimum above its maximum).
    #[error("{0}")]
    InvalidTier(String),
    /// `maxAge` is not a duration of at least 1m (and at most ten years).
    #[error("maxAge `{value}` {problem}")]
    InvalidMaxAge {
        /// The value (at most 32 characters shown).
        value: String,
        /// What is wrong with it.
        problem: &'static str,
    },
}

/// The request for one new spare of `target_name` (the TypeScript library's `createAwsNode` with `spare=true`).
pub fn spare_provision_request(target_name: &str, spec: &SpareTarget) -> ProvisionRequest {
    let mut tags = vec![(SPARE_TAG.to_owned(), "true".to_owned())];
    if let Some(band) = spec.for_band {
        tags.push((SPARE_BAND_TAG.to_owned(), band.as_str().to_owned()));
    }
    tags.push((SPARE_TARGET_TAG.to_owned(), target_name.to_owned()));
    ProvisionRequest {
        pool: spec.pool.clone(),
        instance_type: spec.instance_type.clone(),
        region: spec.region.clone(),
        tags,
    }
}

/// Plans one reconcile of the target `target_name` over its pool's spare-tagged `nodes`.
///
/// See the module docs for the rules. Deterministic: the order of `nodes` does not matter.
pub fn plan_spares(
    target_name: &str,
    spec: &SpareTarget,
    scale_out: ScaleOut,
    nodes: &[SpareNode],
    now: DateTime<Utc>,
) -> Result<SparePlan, SpareSpecError> {
    let target = u32::try_from(spec.target_count)
        .ok()
        .filter(|t| *t <= MAX_TARGET_COUNT)
        .ok_or(SpareSpecError::TargetOutOfRange(spec.target_count))?;
    let max_age = spec.max_age.as_deref().map(parse_max_age).transpose()?;

    let mut seen = BTreeSet::new();
    let mut live: Vec<&SpareNode> = Vec::new();
    let mut pending: Vec<&SpareNode> = Vec::new();
    let mut taken: Vec<String> = Vec::new();
    for n in nodes {
        if !belongs(n, target_name, spec.for_band) || !seen.insert(n.node_id.as_str()) {
            continue;
        }
        match (n.state, n.holds_jobs) {
            (SpareState::Started | SpareState::Starting, true) => taken.push(n.node_id.clone()),
            (SpareState::Started, false) => live.push(n),
            (SpareState::Starting, false) => pending.push(n),
            (
                SpareState::Stopped
                | SpareState::Stopping
                | SpareState::PoweredOff
                | SpareState::Terminated,
                _,
            ) => {}
        }
    }
    // Oldest first; the id breaks ties so the plan is independent of input order.
    live.sort_by(|a, b| (a.created_at, &a.node_id).cmp(&(b.created_at, &b.node_id)));
    taken.sort();
    let mut spare_nodes: Vec<String> = live
        .iter()
        .chain(pending.iter())
        .map(|n| n.node_id.clone())
        .collect();
    spare_nodes.sort();

    let live_count = count(live.len());
    let pending_count = count(pending.len());
    let underflow = (live_count < target).then(|| Underflow {
        pool: spec.pool.clone(),
        current: live_count,
        target,
    });
    let mut plan = SparePlan {
        target,
        live: live_count,
        pending: pending_count,
        provision: 0,
        terminate: Vec::new(),
        rotate: None,
        underflow,
        taken,
        spare_nodes,
        braked: None,
    };
    if scale_out == ScaleOut::Fixed {
        return Ok(plan);
    }

    plan.provision = target.saturating_sub(live_count.saturating_add(pending_count));
    let excess = live.len().saturating_sub(target as usize);
    plan.terminate = live
        .iter()
        .take(excess)
        .map(|n| n.node_id.clone())
        .collect();

    if let Some(max_age) = max_age {
        let is_aged = |n: &SpareNode| now.signed_duration_since(n.created_at) > max_age;
        let retired = live.iter().take(excess).find(|n| is_aged(n));
        let next_aged = live.get(excess).filter(|n| is_aged(n));
        plan.rotate = match (retired, next_aged) {
            (Some(n), _) => Some(RotationStep::RetireAged {
                aged: n.node_id.clone(),
            }),
            (None, Some(n)) if live_count.saturating_add(pending_count) > target => {
                Some(RotationStep::AwaitReplacement {
                    aged: n.node_id.clone(),
                })
            }
            (None, Some(n)) if live_count == target && pending_count == 0 => {
                plan.provision = 1;
                Some(RotationStep::ProvisionReplacement {
                    aged: n.node_id.clone(),
                })
            }
            // Below target with spares coming: fill the gap first, rotate once steady.
            _ => None,
        };
    }
    Ok(plan)
}

pub(crate) fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

pub(crate) fn belongs(n: &SpareNode, target_name: &str, for_band: Option<PriorityBand>) -> bool {
    n.band == for_band && n.target_name.as_deref().is_none_or(|t| t == target_name)
}

/// Parses `maxAge` as the schema defines it: one or more `<number>[.<fraction>]<unit>` parts,
/// unit one of `ns us ms s m h` (Go's duration syntax without sign), at least 1m, at most ten
/// years, at most 32 characters.
pub fn parse_max_age(value: &str) -> Result<TimeDelta, SpareSpecError> {
    let err = |problem| SpareSpecError::InvalidMaxAge {
        value: value.chars().take(MAX_AGE_MAX_LEN).collect(),
        problem,
    };
    if value.is_empty() {
        return Err(err("is empty: use a duration such as 24h or 90m"));
    }
    if value.len() > MAX_AGE_MAX_LEN {
        return Err(err("is longer than 32 characters"));
    }
    let bytes = value.as_bytes();
    let mut i = 0;
    let mut total_ns: u128 = 0;
    while i < bytes.len() {
        let int_start = i;
        while bytes.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if i == int_start {
            return Err(err("is not a duration such as 24h, 90m or 1h30m"));
        }
        let int_digits = bytes.get(int_start..i).unwrap_or_default();
        let mut frac_digits: &[u8] = &[];
        if bytes.get(i) == Some(&b'.') {
            i += 1;
            let frac_start = i;
            while bytes.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            if i == frac_start {
                return Err(err("has a decimal point without digits after it"));
            }
            // Digits past nanosecond precision of an hour cannot matter; ignoring them keeps
            // the arithmetic below from overflowing on long fractions.
            frac_digits = bytes
                .get(frac_start..i.min(frac_start + 18))
                .unwrap_or_default();
        }
        let unit_start = i;
        while bytes.get(i).is_some_and(u8::is_ascii_alphabetic) {
            i += 1;
        }
        let unit_ns: u128 = match bytes.get(unit_start..i).unwrap_or_default() {
            b"ns" => 1,
            b"us" => 1_000,
            b"ms" => 1_000_000,
            b"s" => 1_000_000_000,
            b"m" => 60_000_000_000,
            b"h" => 3_600_000_000_000,
            b"" => return Err(err("has a number without a unit (ns, us, ms, s, m, h)")),
            _ => return Err(err("has an unknown unit: use ns, us, ms, s, m or h")),
        };
        // At most 32 characters, so every digit run fits in u128 arithmetic below.
        let int_part = digits_value(int_digits);
        let mut part = int_part.checked_mul(unit_ns);
        if !frac_digits.is_empty() {
            let scale = 10u128.checked_pow(count(frac_digits.len()));
            let frac = digits_value(frac_digits)
                .checked_mul(unit_ns)
                .zip(scale)
                .map(|(f, s)| f / s);
            part = part.zip(frac).and_then(|(a, b)| a.checked_add(b));
        }
        total_ns = part
            .and_then(|p| total_ns.checked_add(p))
            .ok_or_else(|| err("is longer than ten years"))?;
    }
    let max_ns = u128::try_from(MAX_MAX_AGE.num_nanoseconds().unwrap_or(i64::MAX)).unwrap_or(0);
    if total_ns > max_ns {
        return Err(err("is longer than ten years"));
    }
    let delta = i64::try_from(total_ns)
        .map(TimeDelta::nanoseconds)
        .map_err(|_| err("is longer than ten years"))?;
    if delta < MIN_MAX_AGE {
        return Err(err("is shorter than the 1m minimum"));
    }
    Ok(delta)
}

/// The value of an ASCII digit run; saturates (the callers' length cap keeps it exact).
fn digits_value(digits: &[u8]) -> u128 {
    digits.iter().fold(0u128, |acc, d| {
        acc.saturating_mul(10)
            .saturating_add(u128::from(d.saturating_sub(b'0')))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;

    fn t0() -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0)
            .single()
            .unwrap_or_default()
    }

    fn spec(target: i32, band: Option<PriorityBand>, max_age: Option<&str>) -> SpareTarget {
        SpareTarget {
            pool: "aws-east".into(),
            target_count: target,
            for_band: band,
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
            zone: String::new(),
        }
    }

    fn live(id: &str, age_min: i64) -> SpareNode {
        node(id, SpareState::Started, age_min)
    }

    fn plan(s: &SpareTarget, nodes: &[SpareNode]) -> SparePlan {
        plan_spares("t", s, ScaleOut::Elastic, nodes, t0()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_plan_stands_ready_at_target_and_reconciling_while_spares_come() {
        let at_target = plan(&spec(2, None, None), &[live("a", 5), live("b", 5)]);
        let v = at_target.verdict("aws-east", None);
        assert_eq!((v.standing, v.reason), (Standing::Ready, "AtTarget"));
        assert_eq!(v.message, "2 live, 0 pending, target 2");
        assert_eq!(
            at_target.underflow_condition(),
            (false, "AtTarget", "2 live spares, target 2".to_owned())
        );
        assert_eq!(at_target.next_look(None), NextLook::After(REFRESH));

        let short = plan(&spec(3, None, None), &[live("a", 5)]);
        let v = short.verdict("aws-east", None);
        assert_eq!(
            (v.standing, v.reason),
            (Standing::Reconciling, "Provisioning")
        );
        assert_eq!(
            v.message,
            "pool aws-east has 1 live spare(s), below its target of 3; 1 live, 0 pending, target 3"
        );
        assert!(short.underflow_condition().0);
        assert_eq!(
            short.next_look(None),
            NextLook::After(Duration::from_secs(1))
        );

        let over = plan(&spec(1, None, None), &[live("a", 9), live("b", 5)]);
        let v = over.verdict("aws-east", None);
        assert_eq!(
            (v.standing, v.reason),
            (Standing::Reconciling, "TerminatingExcess")
        );
    }

    #[test]
    fn a_failed_ask_is_progress_that_says_why_and_when_it_is_asked_again() {
        let short = plan(&spec(2, None, None), &[]);
        let retry = Retrying {
            why: "CreateNode got no answer".into(),
            after: Duration::from_secs(4),
        };
        let v = short.verdict("aws-east", Some(&retry));
        assert_eq!(
            (v.standing, v.reason),
            (Standing::Reconciling, "ProvisioningRetrying")
        );
        assert_eq!(
            v.message,
            "no spare node from pool aws-east yet (CreateNode got no answer); asked again in 4s; 0 live, 0 pending, target 2"
        );
        assert_eq!(
            short.next_look(Some(&retry)),
            NextLook::After(Duration::from_secs(4))
        );
        let soon = Retrying {
            after: Duration::ZERO,
            ..retry
        };
        assert_eq!(
            short.next_look(Some(&soon)),
            NextLook::After(Duration::from_secs(1)),
            "never at once"
        );
        // At target, a failed ask changes nothing.
        let full = plan(&spec(1, None, None), &[live("a", 5)]);
        assert_eq!(full.verdict("aws-east", Some(&soon)).reason, "AtTarget");
    }

    #[test]
    fn underflow_no_spare_can_fix_is_stalled_and_says_why() {
        let fixed = plan_spares("t", &spec(2, None, None), ScaleOut::Fixed, &[], t0())
            .unwrap_or_else(|e| panic!("{e}"));
        let v = fixed.verdict("onprem", None);
        assert_eq!(
            (v.standing, v.reason),
            (Standing::Stalled, "SpareUnderflow")
        );

        let full = plan(&spec(5, None, None), &[]).brake(Some(3), Some(0), 60);
        assert!(full.unreachable().is_some());
        let v = full.verdict("aws-east", None);
        assert_eq!(
            (v.standing, v.reason),
            (Standing::Stalled, "PoolAtMaxNodes")
        );
        assert!(
            v.message.starts_with(
                "target 5 cannot be met: pool aws-east is at or above its maxNodes (3); 5 more spare(s) wanted, room for none"
            ),
            "{}",
            v.message
        );
        assert!(
            v.message.ends_with("0 live, 0 pending, target 5"),
            "{}",
            v.message
        );

        let rate = plan(&spec(5, None, None), &[]).brake(None, None, 2);
        assert!(rate.unreachable().is_none());
        assert_eq!(
            rate.next_look(None),
            NextLook::After(Duration::from_secs(1))
        );
        let none_now = plan(&spec(5, None, None), &[]).brake(None, None, 0);
        assert_eq!(
            none_now.next_look(None),
            NextLook::After(Duration::from_secs(5))
        );
    }

    #[test]
    fn stalls_name_their_reason_and_when_to_look_again() {
        let unknown = check_instance_type("aws-east", &["m5".into(), "c5".into()], "x1")
            .err()
            .unwrap_or_else(|| panic!("x1 is not offered"));
        assert_eq!(unknown.reason(), "UnknownInstanceType");
        assert_eq!(
            unknown.message(),
            "pool aws-east has no instance type \"x1\" (known: m5, c5)"
        );
        assert_eq!(unknown.next_look(), NextLook::OnChange);
        assert_eq!(check_instance_type("p", &["m5".into()], "m5"), Ok(()));
        assert_eq!(check_instance_type("p", &[], "anything"), Ok(()));
        for (stall, reason, next, standing) in [
            (
                Stall::InvalidPoolName("A_B".into()),
                "UnknownPool",
                NextLook::OnChange,
                Standing::Stalled,
            ),
            (
                Stall::UnknownPool("p".into()),
                "UnknownPool",
                NextLook::After(REFRESH),
                Standing::Stalled,
            ),
            (
                Stall::ManagerUnavailable("down".into()),
                "ManagerUnavailable",
                NextLook::After(Duration::from_secs(3)),
                Standing::Reconciling,
            ),
            (
                Stall::InvalidSpec(SpareSpecError::TargetOutOfRange(-1)),
                "InvalidSpec",
                NextLook::OnChange,
                Standing::Stalled,
            ),
            (
                Stall::ProvisioningRefused("quota".into()),
                "ProvisioningRefused",
                NextLook::After(REFRESH),
                Standing::Stalled,
            ),
        ] {
            assert_eq!(
                (stall.reason(), stall.next_look()),
                (reason, next),
                "{stall:?}"
            );
            let v = stall.verdict();
            assert_eq!((v.standing, v.reason), (standing, reason));
            assert!(!v.message.is_empty());
        }
        assert_eq!(
            Stall::ProvisioningRefused("Manager refused: quota".into()).message(),
            "Manager refused: quota",
            "the refusal's own words"
        );
    }

    #[test]
    fn a_target_beyond_max_nodes_provisions_only_up_to_the_bound_and_says_so() {
        let p = plan(&spec(1000, None, None), &[]).brake(Some(20), Some(20), 60);
        assert_eq!(p.provision, 20);
        assert_eq!(
            p.braked,
            Some(Brake::MaxNodes {
                max_nodes: 20,
                wanted: 1000,
                room: 20
            })
        );
        assert!(
            p.underflow.is_some(),
            "a target that cannot be met is an underflow"
        );
        assert_eq!(
            p.braked
                .as_ref()
                .map(|b| b.message("aws-east", 1000))
                .as_deref(),
            Some(
                "target 1000 cannot be met: pool aws-east is near its maxNodes (20); 1000 more spare(s) wanted, room for 20"
            )
        );
    }

    #[test]
    fn the_rate_limit_spreads_a_large_target_over_minutes() {
        let p = plan(&spec(100, None, None), &[]).brake(None, None, 60);
        assert_eq!(p.provision, 60);
        assert_eq!(
            p.braked.as_ref().map(Brake::reason),
            Some("ProvisioningRateLimited")
        );
        let unbraked = plan(&spec(3, None, None), &[]).brake(Some(20), Some(5), 60);
        assert_eq!((unbraked.provision, unbraked.braked), (3, None));
    }

    #[test]
    fn a_rotation_whose_replacement_does_not_fit_does_not_start() {
        let s = spec(1, None, Some("1h"));
        let p = plan(&s, &[live("old", 120)]).brake(Some(1), Some(0), 60);
        assert_eq!((p.provision, p.rotate), (0, None));
        assert!(
            p.terminate.is_empty(),
            "the aged spare stays until a replacement can come"
        );
    }

    #[test]
    fn under_target_provisions_the_missing_spares() {
        let p = plan(&spec(3, None, None), &[live("a", 5)]);
        assert_eq!((p.provision, p.live, p.pending), (2, 1, 0));
        assert!(p.terminate.is_empty());
    }

    #[test]
    fn pending_spares_count_as_coming() {
        let p = plan(
            &spec(3, None, None),
            &[live("a", 5), node("b", SpareState::Starting, 1)],
        );
        assert_eq!((p.provision, p.live, p.pending), (1, 1, 1));
    }

    #[test]
    fn pending_spares_do_not_hide_underflow() {
        let p = plan(&spec(2, None, None), &[node("b", SpareState::Starting, 1)]);
        assert_eq!(
            p.underflow,
            Some(Underflow {
                pool: "aws-east".into(),
                current: 0,
                target: 2
            })
        );
    }

    #[test]
    fn over_target_terminates_the_oldest_excess_first() {
        let p = plan(
            &spec(1, None, None),
            &[live("young", 1), live("oldest", 30), live("middle", 10)],
        );
        assert_eq!(p.terminate, vec!["oldest".to_owned(), "middle".to_owned()]);
        assert_eq!(p.provision, 0);
        assert_eq!(p.underflow, None);
    }

    #[test]
    fn equal_ages_terminate_in_node_id_order() {
        let p = plan(
            &spec(1, None, None),
            &[live("b", 5), live("a", 5), live("c", 5)],
        );
        assert_eq!(p.terminate, vec!["a".to_owned(), "b".to_owned()]);
    }

    #[test]
    fn pending_spares_are_never_terminated() {
        let p = plan(
            &spec(1, None, None),
            &[live("a", 5), node("b", SpareState::Starting, 1)],
        );
        assert!(p.terminate.is_empty());
        assert_eq!(p.provision, 0);
    }

    #[test]
    fn a_spare_holding_a_job_is_no_longer_a_spare_and_is_replaced() {
        let mut taken = live("taken", 5);
        taken.holds_jobs = true;
        let p = plan(&spec(2, None, None), &[taken, live("b", 3)]);
        assert_eq!(p.live, 1);
        assert_eq!(p.taken, vec!["taken".to_owned()]);
        assert_eq!(p.provision, 1);
        assert!(p.underflow.is_some());
        assert!(!p.terminate.contains(&"taken".to_owned()));
    }

    #[test]
    fn a_node_holding_a_job_is_never_terminated_even_over_target() {
        let mut busy = live("busy", 100);
        busy.holds_jobs = true;
        let p = plan(&spec(0, None, None), &[busy, live("b", 3)]);
        assert_eq!(p.terminate, vec!["b".to_owned()]);
    }

    #[test]
    fn stopped_and_terminated_spares_count_for_nothing() {
        let p = plan(
            &spec(2, None, None),
            &[
                node("s", SpareState::Stopped, 5),
                node("t", SpareState::Terminated, 5),
            ],
        );
        assert_eq!((p.live, p.pending, p.provision), (0, 0, 2));
        assert!(p.terminate.is_empty());
    }

    #[test]
    fn band_dedicated_spares_count_only_for_that_bands_target() {
        let mut gold = live("gold", 5);
        gold.band = Some(PriorityBand::Gold);
        let plain = live("plain", 5);
        let nodes = [gold, plain];
        let gold_plan = plan(&spec(1, Some(PriorityBand::Gold), None), &nodes);
        assert_eq!(gold_plan.spare_nodes, vec!["gold".to_owned()]);
        let unbanded_plan = plan(&spec(1, None, None), &nodes);
        assert_eq!(unbanded_plan.spare_nodes, vec!["plain".to_owned()]);
        let silver_plan = plan(&spec(1, Some(PriorityBand::Silver), None), &nodes);
        assert_eq!((silver_plan.live, silver_plan.provision), (0, 1));
    }

    #[test]
    fn spares_tagged_for_another_target_are_not_counted() {
        let mut other = live("other", 5);
        other.target_name = Some("someone-else".into());
        let mut mine = live("mine", 5);
        mine.target_name = Some("t".into());
        let p = plan(&spec(1, None, None), &[other, mine]);
        assert_eq!(p.spare_nodes, vec!["mine".to_owned()]);
        assert!(p.terminate.is_empty());
    }

    #[test]
    fn duplicate_node_ids_count_once() {
        let p = plan(&spec(2, None, None), &[live("a", 5), live("a", 5)]);
        assert_eq!((p.live, p.provision), (1, 1));
    }

    #[test]
    fn fixed_pools_never_provision_or_terminate_and_report_underflow_only() {
        let s = spec(3, None, Some("1h"));
        let under = plan_spares("t", &s, ScaleOut::Fixed, &[live("a", 500)], t0())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(under.provision, 0);
        assert_eq!(under.rotate, None);
        assert_eq!(
            under.underflow.as_ref().map(|u| (u.current, u.target)),
            Some((1, 3))
        );
        let over_nodes: Vec<SpareNode> = (0..5).map(|i| live(&format!("n{i}"), 500)).collect();
        let over = plan_spares("t", &s, ScaleOut::Fixed, &over_nodes, t0())
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(over.is_noop());
        assert_eq!(over.rotate, None);
        assert_eq!(over.underflow, None);
    }

    #[test]
    fn at_target_with_young_spares_nothing_happens() {
        let p = plan(&spec(2, None, Some("1h")), &[live("a", 5), live("b", 10)]);
        assert!(p.is_noop());
        assert_eq!(p.rotate, None);
        assert_eq!(p.underflow, None);
    }

    #[test]
    fn an_aged_spare_gets_its_replacement_provisioned_before_it_is_terminated() {
        let p = plan(
            &spec(2, None, Some("1h")),
            &[live("old", 61), live("b", 10)],
        );
        assert_eq!(p.provision, 1);
        assert!(p.terminate.is_empty());
        assert_eq!(
            p.rotate,
            Some(RotationStep::ProvisionReplacement { aged: "old".into() })
        );
    }

    #[test]
    fn while_the_replacement_starts_the_aged_spare_stays() {
        let p = plan(
            &spec(2, None, Some("1h")),
            &[
                live("old", 61),
                live("b", 10),
                node("new", SpareState::Starting, 0),
            ],
        );
        assert!(p.is_noop());
        assert_eq!(
            p.rotate,
            Some(RotationStep::AwaitReplacement { aged: "old".into() })
        );
    }

    #[test]
    fn once_the_replacement_is_live_the_aged_spare_is_retired() {
        let p = plan(
            &spec(2, None, Some("1h")),
            &[live("old", 61), live("b", 10), live("new", 0)],
        );
        assert_eq!(p.terminate, vec!["old".to_owned()]);
        assert_eq!(p.provision, 0);
        assert_eq!(
            p.rotate,
            Some(RotationStep::RetireAged { aged: "old".into() })
        );
    }

    #[test]
    fn rotation_waits_while_the_pool_is_below_target() {
        let p = plan(
            &spec(3, None, Some("1h")),
            &[live("old", 61), node("new", SpareState::Starting, 0)],
        );
        assert_eq!(p.provision, 1);
        assert_eq!(p.rotate, None);
    }

    #[test]
    fn exactly_max_age_is_not_yet_aged() {
        let p = plan(&spec(1, None, Some("1h")), &[live("a", 60)]);
        assert_eq!(p.rotate, None);
    }

    #[test]
    fn a_spare_from_the_future_is_not_aged() {
        let p = plan(&spec(1, None, Some("1h")), &[live("a", -600)]);
        assert_eq!(p.rotate, None);
    }

    #[test]
    fn underflow_since_is_kept_while_it_lasts_and_cleared_after() {
        let earlier = t0() - TimeDelta::minutes(3);
        let under = plan(&spec(1, None, None), &[]);
        assert_eq!(under.underflow_since(None, t0()), Some(t0()));
        assert_eq!(under.underflow_since(Some(earlier), t0()), Some(earlier));
        let ok = plan(&spec(1, None, None), &[live("a", 1)]);
        assert_eq!(ok.underflow_since(Some(earlier), t0()), None);
    }

    #[test]
    fn underflow_message_names_pool_current_and_target() {
        let u = Underflow {
            pool: "aws-east".into(),
            current: 1,
            target: 2,
        };
        assert_eq!(
            u.message(),
            "pool aws-east has 1 live spare(s), below its target of 2"
        );
    }

    #[test]
    fn target_count_outside_0_to_1000_is_an_error() {
        for bad in [-1, 1001, i32::MIN, i32::MAX] {
            assert_eq!(
                plan_spares("t", &spec(bad, None, None), ScaleOut::Elastic, &[], t0()),
                Err(SpareSpecError::TargetOutOfRange(bad))
            );
        }
        assert!(plan_spares("t", &spec(0, None, None), ScaleOut::Elastic, &[], t0()).is_ok());
        assert!(plan_spares("t", &spec(1000, None, None), ScaleOut::Elastic, &[], t0()).is_ok());
    }

    #[test]
    fn provision_request_tags_spare_band_and_target() {
        let r = spare_provision_request("gold-spares", &spec(1, Some(PriorityBand::Gold), None));
        assert_eq!(r.pool, "aws-east");
        assert_eq!(r.instance_type, "m5.xlarge");
        assert_eq!(r.region, "eu-west-1");
        assert_eq!(
            r.tags,
            vec![
                ("spare".to_owned(), "true".to_owned()),
                ("spare-band".to_owned(), "gold".to_owned()),
                (SPARE_TARGET_TAG.to_owned(), "gold-spares".to_owned()),
            ]
        );
        let unbanded = spare_provision_request("x", &spec(1, None, None));
        assert_eq!(unbanded.tags.len(), 2);
    }

    #[test]
    fn max_age_accepts_the_schema_durations() {
        let ok = |s: &str| parse_max_age(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(ok("24h"), TimeDelta::hours(24));
        assert_eq!(ok("90m"), TimeDelta::minutes(90));
        assert_eq!(ok("1h30m"), TimeDelta::minutes(90));
        assert_eq!(ok("1.5h"), TimeDelta::minutes(90));
        assert_eq!(ok("1m"), TimeDelta::minutes(1));
        assert_eq!(ok("60s"), TimeDelta::minutes(1));
        assert_eq!(ok("60000ms"), TimeDelta::minutes(1));
        assert_eq!(ok("59s1000000us"), TimeDelta::minutes(1));
        assert_eq!(ok("59s1000000000ns"), TimeDelta::minutes(1));
    }

    #[test]
    fn max_age_rejects_malformed_short_and_huge_values() {
        for bad in [
            "",
            "h",
            "10",
            "1.h",
            ".5h",
            "-1h",
            "1 h",
            "1d",
            "1H",
            "59s",
            "1µs",
            "100000h",
            "99999999999999999999999999999h",
            "1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h",
        ] {
            assert!(
                matches!(
                    parse_max_age(bad),
                    Err(SpareSpecError::InvalidMaxAge { .. })
                ),
                "{bad:?} was accepted"
            );
        }
        let e = plan_spares(
            "t",
            &spec(1, None, Some("5d")),
            ScaleOut::Elastic,
            &[],
            t0(),
        );
        assert_eq!(
            e.map_err(|e| e.to_string()),
            Err("maxAge `5d` has an unknown unit: use ns, us, ms, s, m or h".to_owned())
        );
    }

    // ---- properties ----

    fn arb_state() -> impl Strategy<Value = SpareState> {
        prop_oneof![
            Just(SpareState::Starting),
            Just(SpareState::Started),
            Just(SpareState::Started),
            Just(SpareState::Stopped),
            Just(SpareState::Stopping),
            Just(SpareState::PoweredOff),
            Just(SpareState::Terminated),
        ]
    }

    fn arb_band() -> impl Strategy<Value = Option<PriorityBand>> {
        prop_oneof![
            3 => Just(None),
            1 => Just(Some(PriorityBand::Gold)),
            1 => Just(Some(PriorityBand::Silver)),
        ]
    }

    fn arb_node() -> impl Strategy<Value = SpareNode> {
        (
            0u8..12,
            arb_state(),
            -10i64..300,
            arb_band(),
            prop::bool::weighted(0.15),
            prop_oneof![4 => Just(None), 1 => Just(Some("t".to_owned())), 1 => Just(Some("u".to_owned()))],
        )
            .prop_map(|(id, state, age, band, holds_jobs, target_name)| SpareNode {
                node_id: format!("n{id}"),
                state,
                created_at: t0() - TimeDelta::minutes(age),
                band,
                holds_jobs,
                target_name,
                zone: String::new(),
            })
    }

    fn arb_spec() -> impl Strategy<Value = SpareTarget> {
        (
            0i32..8,
            arb_band(),
            prop_oneof![Just(None), Just(Some("1h")), Just(Some("90m"))],
        )
            .prop_map(|(t, b, a)| spec(t, b, a))
    }

    fn arb_scale_out() -> impl Strategy<Value = ScaleOut> {
        prop_oneof![Just(ScaleOut::Elastic), Just(ScaleOut::Fixed)]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn never_terminates_below_target_nor_a_non_live_spare(
            s in arb_spec(), scale in arb_scale_out(), nodes in prop::collection::vec(arb_node(), 0..16),
        ) {
            let p = plan_spares("t", &s, scale, &nodes, t0()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(p.terminate.len() as u32 <= p.live.saturating_sub(p.target));
            for id in &p.terminate {
                // Duplicate ids: the planner reads the first occurrence among the target's nodes.
                let n = nodes.iter().find(|n| &n.node_id == id && belongs(n, "t", s.for_band));
                prop_assert!(n.is_some_and(|n| n.state == SpareState::Started && !n.holds_jobs));
            }
            let unique: BTreeSet<_> = p.terminate.iter().collect();
            prop_assert_eq!(unique.len(), p.terminate.len());
        }

        #[test]
        fn a_plan_is_ready_only_at_target_with_nothing_to_do(
            s in arb_spec(), scale in arb_scale_out(), nodes in prop::collection::vec(arb_node(), 0..16),
        ) {
            let p = plan_spares("t", &s, scale, &nodes, t0()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let v = p.verdict(&s.pool, None);
            let quiet = p.underflow.is_none() && p.terminate.is_empty() && p.rotate.is_none();
            prop_assert_eq!(v.standing == Standing::Ready, quiet);
            prop_assert_eq!(p.underflow_condition().0, p.underflow.is_some());
            let target = format!("target {}", p.target);
            prop_assert!(v.message.contains(&target), "{}", v.message);
        }

        #[test]
        fn the_brake_never_asks_for_more_than_room_or_rate(
            s in arb_spec(), nodes in prop::collection::vec(arb_node(), 0..16),
            room in proptest::option::of(0u32..30), allowance in 0u32..30,
        ) {
            let p = plan_spares("t", &s, ScaleOut::Elastic, &nodes, t0()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let wanted = p.provision;
            let b = p.brake(room.map(|r| r + 5), room, allowance);
            prop_assert!(b.provision <= allowance && b.provision <= room.unwrap_or(u32::MAX));
            prop_assert_eq!(b.braked.is_some(), b.provision < wanted);
        }

        #[test]
        fn elastic_pools_reach_target_with_live_pending_and_provision(
            s in arb_spec(), nodes in prop::collection::vec(arb_node(), 0..16),
        ) {
            let p = plan_spares("t", &s, ScaleOut::Elastic, &nodes, t0()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(p.live + p.pending + p.provision >= p.target);
            // Never more than one spare beyond what the target needs (the rotation replacement).
            let needed = p.target.saturating_sub(p.live + p.pending);
            let replacing = matches!(p.rotate, Some(RotationStep::ProvisionReplacement { .. }));
            prop_assert!(p.provision == needed || (p.provision == 1 && needed == 0 && replacing));
        }

        #[test]
        fn fixed_pools_never_act(
            s in arb_spec(), nodes in prop::collection::vec(arb_node(), 0..16),
        ) {
            let p = plan_spares("t", &s, ScaleOut::Fixed, &nodes, t0()).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert!(p.is_noop());
            prop_assert!(p.rotate.is_none());
            prop_assert_eq!(p.underflow.is_some(), p.live < p.target);
        }

        #[test]
        fn the_plan_does_not_depend_on_input_order(
            s in arb_spec(), scale in arb_scale_out(), nodes in prop::collection::vec(arb_node(), 0..16), seed in any::<u64>(),
        ) {
            // Duplicate ids may differ in content and the first occurrence wins, so compare
            // only inputs with unique ids.
            let mut seen = BTreeSet::new();
            let unique: Vec<SpareNode> = nodes.into_iter().filter(|n| seen.insert(n.node_id.clone())).collect();
            let mut shuffled = unique.clone();
            let len = shuffled.len();
            if len > 1 {
                shuffled.rotate_left((seed % len as u64) as usize);
                shuffled.reverse();
            }
            prop_assert_eq!(
                plan_spares("t", &s, scale, &unique, t0()),
                plan_spares("t", &s, scale, &shuffled, t0())
            );
        }

        /// Runs the reconciler against a simulated elastic pool: requested spares appear as
        /// starting and come up one reconcile later, terminated spares vanish, time moves on.
        /// Live never drops below min(target, live before), and with the clock still the pool
        /// settles at exactly target with nothing older than maxAge.
        #[test]
        fn rotation_never_leaves_fewer_than_target_live_and_converges(
            target in 0i32..6, ages in prop::collection::vec(0i64..200, 0..9), step_min in 0i64..30,
        ) {
            let s = spec(target, None, Some("1h"));
            let mut nodes: Vec<SpareNode> = ages.iter().enumerate().map(|(i, a)| live(&format!("n{i}"), *a)).collect();
            let mut now = t0();
            let mut next_id = 0;
            for round in 0..60 {
                let p = plan_spares("t", &s, ScaleOut::Elastic, &nodes, now).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let live_before = p.live;
                nodes.retain(|n| !p.terminate.contains(&n.node_id));
                let live_after = nodes.iter().filter(|n| n.state == SpareState::Started).count() as u32;
                prop_assert!(live_after >= live_before.min(p.target), "round {round}: {live_before} -> {live_after}");
                for n in &mut nodes {
                    if n.state == SpareState::Starting { n.state = SpareState::Started; }
                }
                for _ in 0..p.provision {
                    next_id += 1;
                    nodes.push(SpareNode { created_at: now, ..node(&format!("new{next_id}"), SpareState::Starting, 0) });
                }
                // Time moves for the first rounds only, then stands still so the pool can settle.
                if round < 10 { now += TimeDelta::minutes(step_min); }
            }
            let p = plan_spares("t", &s, ScaleOut::Elastic, &nodes, now).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!((p.live, p.pending, p.provision), (p.target, 0, 0));
            prop_assert!(p.terminate.is_empty());
            prop_assert_eq!(p.rotate, None);
        }

        #[test]
        fn max_age_parsing_never_panics(value in "[0-9.a-zµ ]{0,40}") {
            let _ = parse_max_age(&value);
        }
    }
}
