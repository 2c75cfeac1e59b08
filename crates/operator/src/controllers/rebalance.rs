//! The rebalancer, as the Bundle controller runs it on a Ready Bundle with `spec.rebalance`:
//! observe where each replica's jobs run now, ask the placement engine where the replica would go
//! were it placed now, let [`automanager_policy::rebalance`] decide, and create a Migration
//! (label `automanager.norsk.io/purpose: rebalance`, the job's declared strategy, the engine's
//! node as target) for each job that moves. The migration queue ranks it behind drains and the
//! disruption budget holds it while another replica of the bundle is down; the rebalancer adds a
//! fleet-wide rate (`rebalance.maxPerMinute`) and one rebalance at a time per bundle.
//!
//! Only replicas whose placement trace reports broken soft rules are looked at (a recovery that
//! had to break one says so), and only while they still break them.
//!
//! What it says: the Bundle's `RebalanceNeeded` condition (True with reason `MigrationStarted`,
//! `MigrationInProgress`, `WaitingForCapacity` or `RateLimited`; False with `SoftRulesHold`), a
//! `RebalanceStarted` Event per Migration and `automanager_rebalances_total`.

use automanager_api::{self as api, Bundle, Migration, MigrationJobRef};
use automanager_placement as pl;
use automanager_policy::rebalance::{self, At, Finding, Proposal, Verdict};
use chrono::{DateTime, Utc};
use kube::api::{Api, ListParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::move_request::{MoveName, MoveRequest, Requested, request_move};
use super::{Context, Error, now_ms};
use crate::mapping;

/// The Bundle condition the rebalancer keeps.
pub const CONDITION: &str = "RebalanceNeeded";

/// What one look found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Look {
    /// The `RebalanceNeeded` condition: (status, reason, message).
    pub condition: (bool, &'static str, String),
    /// Capacity in the bundle's pools could let it move: wake it when it changes.
    pub wait_for_capacity: bool,
}

impl From<Finding> for Look {
    fn from(f: Finding) -> Self {
        Look {
            condition: f.condition(),
            wait_for_capacity: f.wait_for_capacity(),
        }
    }
}

/// One look at a Ready bundle with `spec.rebalance: true`; `status` is the one about to be
/// written (its traces include this pass's decisions). Observe where the flagged replicas run,
/// ask the engine where each would go now, decide with [`rebalance::decide`], and create the
/// Migrations of the first replica that moves.
pub async fn look(
    ctx: &Context,
    bundle: &Bundle,
    status: &api::BundleStatus,
    bundle_id: &str,
    engine_bundle: &pl::BundleSpec,
    now: DateTime<Utc>,
) -> Result<Look, Error> {
    let flagged = flagged_replicas(status);
    if flagged.is_empty() {
        return Ok(Finding::Holds.into());
    }
    let Some((moving, positions)) = observe(ctx, bundle, bundle_id) else {
        return Ok(Finding::Holds.into());
    };
    let mut waiting: Option<Finding> = None;
    for replica in flagged {
        let Some((mine, others)) = rebalance::split(&positions, replica as usize) else {
            continue;
        };
        let broken_now = rebalance::broken_soft_rules(
            &engine_bundle.inter_replica_placement,
            &engine_bundle.intra_replica_placement,
            &mine,
            &others,
        );
        if broken_now.is_empty() {
            continue;
        }
        let rules = rebalance::rule_names(&broken_now);
        if moving || in_progress(ctx, bundle).await? {
            return Ok(Finding::InProgress { replica, rules }.into());
        }
        let proposal = propose(ctx, bundle, bundle_id, engine_bundle, replica, &others, now);
        let current: Vec<(String, String)> = bundle
            .spec
            .jobs
            .iter()
            .map(|j| j.job_name.clone())
            .zip(mine.iter().map(|a| a.node.clone()))
            .collect();
        match rebalance::decide(&current, &broken_now, proposal.as_ref()) {
            Verdict::Holds => {}
            Verdict::NoBetterPlacement => {
                waiting.get_or_insert(Finding::WaitingForCapacity { replica, rules });
            }
            Verdict::Move(moves) => {
                return Ok(act(ctx, bundle, replica, rules, moves, now).await?.into());
            }
        }
    }
    Ok(waiting.unwrap_or(Finding::Holds).into())
}

/// Replicas whose last placement had to break a soft rule.
fn flagged_replicas(status: &api::BundleStatus) -> Vec<u32> {
    status
        .replicas
        .iter()
        .filter(|r| {
            r.jobs.iter().any(|j| {
                j.last_placement
                    .as_ref()
                    .is_some_and(|t| !t.broken_soft_rules.is_empty())
            })
        })
        .filter_map(|r| u32::try_from(r.replica).ok())
        .collect()
}

/// Whether a Manager migration of the bundle is under way, and where each job of each replica
/// runs now (by replica, in the order of `spec.jobs`). `None` when a job is not running: the
/// bundle is not settled and is left alone.
fn observe(ctx: &Context, bundle: &Bundle, bundle_id: &str) -> Option<(bool, Vec<Vec<At>>)> {
    let replicas = u32::try_from(bundle.spec.replicas).unwrap_or(0);
    ctx.manager.mirror().read(|m| {
        let moving = m.migrations.values().any(|mig| {
            !mig.is_final()
                && m.jobs
                    .get(&mig.job_id)
                    .is_some_and(|j| j.bundle_id == bundle_id)
        });
        let positions: Option<Vec<Vec<At>>> = (0..replicas)
            .map(|r| {
                bundle
                    .spec
                    .jobs
                    .iter()
                    .map(|job| {
                        let j = m.job_of(bundle_id, r, &job.job_name)?;
                        (j.state() == manager_proto::JobState::Running && !j.node_id.is_empty())
                            .then(|| At {
                                node: j.node_id.clone(),
                                zone: m
                                    .zone_of(&j.node_id)
                                    .filter(|z| !z.is_empty())
                                    .map(str::to_owned),
                            })
                    })
                    .collect()
            })
            .collect();
        Some((moving, positions?))
    })
}

/// Where the engine would place `replica` were it placed now (a first placement: hot spares
/// are kept for recoveries); `None` when it could not place it at all.
fn propose(
    ctx: &Context,
    bundle: &Bundle,
    bundle_id: &str,
    engine_bundle: &pl::BundleSpec,
    replica: u32,
    others: &[At],
    now: DateTime<Utc>,
) -> Option<Proposal> {
    let request = pl::PlacementRequest {
        bundle_id: bundle_id.to_owned(),
        replica_index: replica,
        jobs: bundle.spec.jobs.iter().map(mapping::job).collect(),
        pools: engine_bundle.pools_for_replica(replica).to_vec(),
        kind: pl::PlacementKind::First,
        intra_replica: engine_bundle.intra_replica_placement,
        inter_replica: engine_bundle.inter_replica_placement,
        other_replicas: others
            .iter()
            .map(|a| pl::Position {
                node: a.node.clone(),
                zone: a.zone.clone(),
            })
            .collect(),
        placed_siblings: Vec::new(),
    };
    let decision = ctx.state.place(&request, now_ms(now));
    match &decision.outcome {
        pl::Outcome::Placed { assignments, .. } => Some(Proposal {
            assignments: assignments
                .iter()
                .map(|a| (a.job_name.clone(), a.node.clone()))
                .collect(),
            broken: decision.trace.broken_soft_rules.iter().copied().collect(),
            pending: assignments.iter().any(|a| a.node_pending),
        }),
        _ => None,
    }
}

/// Moves the replica's jobs, within the fleet's rate: one Migration per move, an Event and the
/// metric.
async fn act(
    ctx: &Context,
    bundle: &Bundle,
    replica: u32,
    rules: String,
    moves: Vec<rebalance::Move>,
    now: DateTime<Utc>,
) -> Result<Finding, Error> {
    let count = u32::try_from(moves.len()).unwrap_or(u32::MAX);
    if !ctx.state.take_rebalance_moves(count, now) {
        return Ok(Finding::RateLimited {
            replica,
            rules,
            per_minute: ctx.settings.rebalance_per_minute,
        });
    }
    let mut started = Vec::with_capacity(moves.len());
    for mv in moves {
        let name = create(ctx, bundle, replica, &mv).await?;
        ctx.metrics.rebalance_started();
        started.push((mv, name));
    }
    let finding = Finding::Started {
        replica,
        rules,
        moves: started,
    };
    let note = finding.condition().2;
    ctx.event(
        bundle,
        EventType::Normal,
        "RebalanceStarted",
        "Rebalance",
        note,
    )
    .await;
    Ok(finding)
}

/// A rebalancing Migration of this bundle that has not ended (it may still be queued, so not
/// in Manager yet): one rebalance at a time per bundle.
async fn in_progress(ctx: &Context, bundle: &Bundle) -> Result<bool, Error> {
    let ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    let list = Api::<Migration>::namespaced(ctx.client.clone(), &ns)
        .list(&ListParams::default().labels(&format!("{}=rebalance", api::PURPOSE_LABEL)))
        .await?;
    Ok(list.items.iter().any(|m| {
        m.spec.job.bundle == name
            && !m
                .status
                .as_ref()
                .is_some_and(|s| automanager_policy::migration::is_terminal(s.phase))
    }))
}

/// Creates the Migration of one move; answers its name.
async fn create(
    ctx: &Context,
    bundle: &Bundle,
    replica: u32,
    mv: &rebalance::Move,
) -> Result<String, Error> {
    let ns = bundle.namespace().unwrap_or_default();
    let name = bundle.name_any();
    let prefix: String = name.chars().take(40).collect();
    let fresh = MoveName::Fresh(format!(
        "{}-rebalance-",
        prefix.trim_end_matches(['-', '.'])
    ));
    let job = MigrationJobRef {
        bundle: name,
        replica: i32::try_from(replica).unwrap_or(i32::MAX),
        job_name: mv.job_name.clone(),
    };
    // The job's declared strategy.
    let req = MoveRequest::new(&ns, fresh, job)
        .to(Some(mv.to.clone()))
        .label(api::PURPOSE_LABEL, "rebalance")
        .owned_by(bundle.controller_owner_ref(&()));
    let (Requested::Created(created) | Requested::Exists(created)) =
        request_move(ctx, &req).await?;
    tracing::info!(namespace = %ns, bundle = %bundle.name_any(), replica, job = %mv.job_name, from = %mv.from, to = %mv.to, migration = %created, "rebalance: migrating job");
    Ok(created)
}
