//! Reclaim notices: Manager said a node will be taken at time T (a Spot interruption, a
//! provider's maintenance). Before T every job on it is moved by its declared strategy,
//! handover and overlap first, with replacements provisioned early; what cannot move in time is
//! left to band recovery at T, and the ManagerNode's Events say so.
//!
//! A pass: observe the noticed nodes, their jobs, the room elsewhere and the budgets; decide
//! with the pure [`automanager_policy::notice`]; act (a Migration per move, labelled
//! `purpose: reclaim`, never held by a disruption window; CreateNode for the early nodes);
//! record (Events on the node when its plan changes).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{
    self as api, Bundle, ManagerNode, Migration, MigrationJobRef, MigrationPhase, PlacementPool,
};
use automanager_policy::notice::{
    self, BudgetUse, FreeNode, LeftReason, MoveTimes, NoticeInput, NoticePlan, NoticedJob,
    NoticedNode, PoolSupply,
};
use chrono::{TimeDelta, Utc};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::events::EventType;
use manager_proto as proto;

use super::move_request::{MoveName, MoveRequest, Requested, request_move};
use super::{Context, Error};
use crate::mapping;

/// How often noticed nodes are looked at.
const TICK: Duration = Duration::from_secs(1);

/// How long a move takes once its target is up, per strategy: what the planner budgets for.
/// Generous beside what the simulator and the handover protocol need, so a plan that fits fits.
const TIMES: MoveTimes = MoveTimes {
    overlap: TimeDelta::seconds(10),
    stop_then_start: TimeDelta::seconds(10),
    handover: TimeDelta::seconds(15),
};

/// Runs reclaim passes until the operator stops (the task is aborted).
pub async fn run_reclaim(ctx: Arc<Context>) {
    let mut told: HashMap<String, String> = HashMap::new();
    loop {
        tokio::time::sleep(TICK).await;
        if !ctx.settings.scope.owns_cluster_scope() || !ctx.manager_ready() {
            continue;
        }
        if let Err(e) = pass(&ctx, &mut told).await {
            tracing::warn!(error = %e, "reclaim pass failed; retried next tick");
        }
    }
}

/// One pass over every noticed node. `told` keeps the last summary published per node, so an
/// Event is written only when a node's plan changes.
pub async fn pass(ctx: &Arc<Context>, told: &mut HashMap<String, String>) -> Result<(), Error> {
    let now = ctx.clock.now();
    let nodes: Vec<NoticedNode> = ctx.manager.mirror().read(|m| {
        m.noticed_nodes()
            .filter(|n| n.state() != proto::NodeState::Terminated)
            .filter_map(|n| {
                Some(NoticedNode {
                    node_id: n.node_id.clone(),
                    deadline: chrono::DateTime::from_timestamp_millis(n.reclaim_at_ms)?,
                })
            })
            .filter(|n| n.deadline > now)
            .collect()
    });
    told.retain(|id, _| nodes.iter().any(|n| &n.node_id == id));
    if nodes.is_empty() {
        return Ok(());
    }
    let jobs = observe_jobs(ctx, &nodes).await?;
    let bundle_ids: Vec<String> = jobs
        .iter()
        .map(|(j, _)| j.bundle.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let budgets = super::disruption::budget_ledger(ctx, &bundle_ids).await?;
    let noticed: BTreeSet<&str> = nodes.iter().map(|n| n.node_id.as_str()).collect();
    let free = free_nodes(ctx, &noticed);
    let pools = supply(ctx, now).await?;
    let planned: Vec<NoticedJob> = jobs.iter().map(|(j, _)| j.clone()).collect();
    let plan = notice::plan_notice(NoticeInput {
        now,
        nodes: &nodes,
        jobs: &planned,
        free: &free,
        pools: &pools,
        times: TIMES,
        budgets: &budgets,
    });
    act(ctx, &plan, &jobs).await?;
    let node_of: HashMap<&str, &str> = jobs
        .iter()
        .map(|(j, _)| (j.job_id.as_str(), j.node_id.as_str()))
        .collect();
    let held: HashMap<&str, &[String]> = jobs
        .iter()
        .map(|(j, p)| (j.job_id.as_str(), p.held.as_slice()))
        .collect();
    record(ctx, &nodes, &plan, (&node_of, &held), told).await;
    Ok(())
}

/// Where a job's Migration goes: the Bundle's namespace and name, replica and job name.
#[derive(Debug, Clone)]
struct JobPlace {
    namespace: String,
    bundle: String,
    replica: i32,
    job_name: String,
    /// The job's held voluntary Migrations (Pending: a window, a budget or the queue holds
    /// them), which its move here takes over.
    held: Vec<String>,
}

/// Where a job's Migrations stand for its notice.
#[derive(Debug, Default)]
struct JobMoves {
    /// A move of the job is under way (ours, or another that owns the job now).
    in_flight: bool,
    /// Why our move ended without moving the job.
    ended: Option<String>,
    /// The held (Pending) Migrations our move takes over.
    held: Vec<String>,
    /// Our move was refused only because another move held the job, which has ended since:
    /// it is removed and made again.
    again: bool,
}

/// Whether a Migration was refused because another move held its job.
fn lost_to_another(m: &Migration) -> bool {
    m.status.as_ref().is_some_and(|s| {
        s.phase == MigrationPhase::Rejected
            && api::find_condition(&s.conditions, "Rejected")
                .is_some_and(|c| c.reason == "ConcurrentMigration")
    })
}

/// Where a job's Migrations stand for its notice ([`JobMoves`]).
fn job_migrations(listed: &[Migration], place: &JobPlace, reclaim_name: &str) -> JobMoves {
    let of_job: Vec<&Migration> = listed
        .iter()
        .filter(|m| {
            let j = &m.spec.job;
            j.bundle == place.bundle && j.replica == place.replica && j.job_name == place.job_name
        })
        .collect();
    let phase = |m: &Migration| m.status.as_ref().map(|s| s.phase).unwrap_or_default();
    let mut in_flight = false;
    let mut ended = None;
    let mut held = Vec::new();
    let mut lost = false;
    for m in of_job {
        let p = phase(m);
        let ours = m.name_any() == reclaim_name;
        if ours && matches!(p, MigrationPhase::Completed) {
            // Done: the mirror shows the job on the noticed node a moment longer.
            in_flight = true;
        } else if ours && automanager_policy::migration::is_terminal(p) {
            lost = lost_to_another(m);
            let why = m
                .status
                .as_ref()
                .and_then(|s| {
                    ["Rejected", "Aborted", "Progressing"]
                        .iter()
                        .find_map(|t| api::find_condition(&s.conditions, t))
                        .map(|c| c.message.clone())
                })
                .unwrap_or_default();
            ended = Some(format!("Migration {} ended {p:?}: {why}", m.name_any()));
        } else if ours
            || !(p == MigrationPhase::Pending || automanager_policy::migration::is_terminal(p))
        {
            // Ours, on its way; or another already moving the job (it owns the job now).
            in_flight = true;
        } else if p == MigrationPhase::Pending && m.spec.abort.is_none() {
            held.push(m.name_any());
        }
    }
    let again = lost && !in_flight;
    JobMoves {
        in_flight,
        ended: ended.filter(|_| !in_flight && !again),
        held,
        again,
    }
}

/// The jobs of ours and others' holding capacity on each noticed node, with that node's id.
fn running_on(ctx: &Context, nodes: &[NoticedNode]) -> Vec<(proto::Job, String)> {
    ctx.manager.mirror().read(|m| {
        nodes
            .iter()
            .flat_map(|n| {
                m.jobs_on(&n.node_id)
                    .filter(|j| {
                        j.instances
                            .iter()
                            .any(|i| i.node_id == n.node_id && i.is_normal() && i.holds_capacity())
                    })
                    .map(|j| (j.clone(), n.node_id.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    })
}

/// The move that held a job ended without taking it off the node: ours (`name`) is deleted to
/// be made again (the next pass finds the name free once this deletion is through).
async fn move_again(ctx: &Context, ns: &str, name: &str) -> Result<(), Error> {
    match Api::<Migration>::namespaced(ctx.client.clone(), ns)
        .delete(name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn observe_jobs(
    ctx: &Context,
    nodes: &[NoticedNode],
) -> Result<Vec<(NoticedJob, JobPlace)>, Error> {
    let on = running_on(ctx, nodes);
    let mut bundles: HashMap<(String, String), Option<Bundle>> = HashMap::new();
    let mut migrations: HashMap<String, Vec<Migration>> = HashMap::new();
    let mut out = Vec::new();
    for (job, node_id) in on {
        // Another installation's jobs on the node are not this one's to move.
        let Some(id) = ctx.settings.scope.our_bundle(&job.bundle_id) else {
            continue;
        };
        let (ns, name) = id.object();
        let key = (ns.to_owned(), name.to_owned());
        if !bundles.contains_key(&key) {
            let b = Api::<Bundle>::namespaced(ctx.client.clone(), ns)
                .get_opt(name)
                .await?;
            bundles.insert(key.clone(), b);
        }
        let Some(Some(bundle)) = bundles.get(&key) else {
            continue;
        };
        let Some(spec_job) = bundle.spec.jobs.iter().find(|j| j.job_name == job.job_name) else {
            continue;
        };
        let replica = i32::try_from(job.replica).unwrap_or(0);
        let req = job.requirements.clone().unwrap_or_default();
        let mut place = JobPlace {
            namespace: ns.to_owned(),
            bundle: name.to_owned(),
            replica,
            job_name: job.job_name.clone(),
            held: Vec::new(),
        };
        if !migrations.contains_key(ns) {
            let listed = Api::<Migration>::namespaced(ctx.client.clone(), ns)
                .list(&ListParams::default())
                .await?
                .items;
            migrations.insert(ns.to_owned(), listed);
        }
        let listed = migrations.get(ns).map(Vec::as_slice).unwrap_or_default();
        let ours = migration_name(&node_id, &job.job_id);
        let moves = job_migrations(listed, &place, &ours);
        if moves.again {
            move_again(ctx, ns, &ours).await?;
            tracing::info!(node = %node_id, job = %job.job_id, migration = %ours, "reclaim: the move that held the job ended; moving it again");
        }
        let (in_flight, move_ended) = (moves.in_flight || moves.again, moves.ended);
        place.held = moves.held;
        out.push((
            NoticedJob {
                job_id: job.job_id.clone(),
                node_id,
                bundle: job.bundle_id.clone(),
                replica: job.replica,
                band: mapping::parse_band(&req.priority_band).unwrap_or(api::PriorityBand::Silver),
                strategy: spec_job
                    .migration
                    .as_ref()
                    .map(|m| m.strategy)
                    .unwrap_or_default(),
                capacity: req.required_capacity,
                cores: u32::try_from(req.required_cores).unwrap_or(0),
                pools: bundle.spec.pools_for_replica(replica).to_vec(),
                in_flight,
                move_ended,
            },
            place,
        ));
    }
    Ok(out)
}

/// Room on started nodes that are not being taken.
fn free_nodes(ctx: &Context, noticed: &BTreeSet<&str>) -> Vec<FreeNode> {
    ctx.manager.mirror().read(|m| {
        m.nodes
            .values()
            .filter(|n| {
                n.state() == proto::NodeState::Started && !noticed.contains(n.node_id.as_str())
            })
            .filter_map(|n| {
                let inv = n.inventory.as_ref()?;
                let (used, cores) = m.node_usage(&n.node_id);
                Some(FreeNode {
                    node_id: n.node_id.clone(),
                    pool: n.pool.clone(),
                    free_capacity: inv.capacity - used,
                    free_cores: u32::try_from(inv.cores.saturating_sub(cores)).unwrap_or(0),
                    job_socket: inv
                        .capabilities
                        .iter()
                        .any(|c| c == automanager_policy::JOB_SOCKET_CAPABILITY),
                    ready_at: None,
                })
            })
            .collect()
    })
}

/// What each elastic pool can add now, and how fast: Manager's provisioning delay, or the
/// pool's declared start latency when that is longer.
async fn supply(ctx: &Context, now: chrono::DateTime<Utc>) -> Result<Vec<PoolSupply>, Error> {
    let pools = Api::<PlacementPool>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let delays: HashMap<String, u64> = match ctx.manager.list_pools().await {
        Ok(p) => p
            .into_iter()
            .map(|p| (p.name, p.provision_delay_ms))
            .collect(),
        Err(_) => HashMap::new(),
    };
    let mut out = Vec::new();
    for p in pools {
        if p.spec.scale_out != api::ScaleOut::Elastic {
            continue;
        }
        let name = p.name_any();
        let Some(t) = p.spec.candidate_instance_types.first() else {
            continue;
        };
        let nodes = ctx.manager.mirror().read(|m| {
            m.nodes
                .values()
                .filter(|n| n.pool == name && n.state() != proto::NodeState::Terminated)
                .count()
        });
        let room = automanager_policy::provision_budget::room_under_max_nodes(
            p.spec.max_nodes.map(|m| u32::try_from(m).unwrap_or(0)),
            u32::try_from(nodes).unwrap_or(u32::MAX),
        )
        .unwrap_or(u32::MAX)
        .min(ctx.state.provision_allowance(&name, now));
        let reported = Duration::from_millis(delays.get(&name).copied().unwrap_or(0));
        out.push(PoolSupply {
            ready_in: TimeDelta::from_std(p.spec.start_latency(reported)).unwrap_or(TimeDelta::MAX),
            pool: name,
            node_capacity: t.total_capacity as f64,
            node_cores: u32::try_from(t.total_cores).unwrap_or(0),
            job_socket: true,
            room,
        });
    }
    Ok(out)
}

/// The Migration that moves `job_id` off noticed node `node_id`: stable, so a later pass finds it.
fn migration_name(node_id: &str, job_id: &str) -> String {
    super::drain::named_migration("reclaim", &mapping::node_object_name(node_id), job_id)
}

async fn act(
    ctx: &Arc<Context>,
    plan: &NoticePlan,
    jobs: &[(NoticedJob, JobPlace)],
) -> Result<(), Error> {
    for m in &plan.moves {
        let Some((_, place)) = jobs.iter().find(|(j, _)| j.job_id == m.job_id) else {
            continue;
        };
        let job = MigrationJobRef {
            bundle: place.bundle.clone(),
            replica: place.replica,
            job_name: place.job_name.clone(),
        };
        let name = MoveName::Stable(migration_name(&m.from, &m.job_id));
        // The deadline marks it as a move that takes over the job's held Migration. The plan's
        // destination is a capacity estimate: the Migration's own placement picks the node, so
        // the Bundle's rules (other replicas, co-located jobs) hold for a reclaim move too.
        let mut req = MoveRequest::new(&place.namespace, name, job)
            .by(m.strategy)
            .label(api::PURPOSE_LABEL, "reclaim")
            .annotate(
                api::DEADLINE_ANNOTATION,
                m.deadline
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            );
        if let BudgetUse::Broken { reason } = &m.budget {
            req = req.annotate(
                api::BUDGET_OVERRIDE_ANNOTATION,
                reason.chars().take(1000).collect::<String>(),
            );
        }
        if let Requested::Created(_) = request_move(ctx, &req).await? {
            tracing::info!(node = %m.from, job = %m.job_id, strategy = m.strategy.as_str(), deadline = %m.deadline, takes_over = ?place.held, "reclaim: moving job");
        }
    }
    for (pool, count) in &plan.provision {
        for _ in 0..*count {
            if !ctx.state.take_provision_request(pool, ctx.clock.now()) {
                break;
            }
            let req = proto::CreateNodeRequest {
                pool: pool.clone(),
                ..Default::default()
            };
            match super::create_node(ctx, &format!("reclaim/{pool}"), req).await {
                Ok(node) => ctx.state.add_provisioned(&node),
                Err(Error::Manager(e)) if super::is_final_answer(&e) => {
                    tracing::warn!(pool = %pool, error = %e, "reclaim: early node refused");
                    break;
                }
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// One Event per noticed node whenever what the plan says about it changes.
async fn record(
    ctx: &Context,
    nodes: &[NoticedNode],
    plan: &NoticePlan,
    (node_of, held): (&HashMap<&str, &str>, &HashMap<&str, &[String]>),
    told: &mut HashMap<String, String>,
) {
    for n in nodes {
        let here = |job: &str| node_of.get(job).copied() == Some(n.node_id.as_str());
        let moving = plan.moves.iter().filter(|m| m.from == n.node_id).count();
        let in_flight = plan.in_flight.iter().filter(|j| here(j)).count();
        let waiting = plan.waiting.iter().filter(|w| here(&w.job_id)).count();
        let left: Vec<String> = plan
            .left
            .iter()
            .filter(|l| here(&l.job_id))
            .map(|l| match &l.why {
                LeftReason::NoCapacity => format!("{} (no room)", l.job_id),
                LeftReason::TooLate { needed, left } => format!(
                    "{} (needs {}s, {}s left)",
                    l.job_id,
                    needed.num_seconds(),
                    left.num_seconds()
                ),
                LeftReason::MoveEnded { why } => format!("{} ({why})", l.job_id),
            })
            .collect();
        let taken_over: Vec<&str> = plan
            .moves
            .iter()
            .filter(|m| m.from == n.node_id)
            .flat_map(|m| held.get(m.job_id.as_str()).copied().unwrap_or_default())
            .map(String::as_str)
            .collect();
        let broken: Vec<&str> = plan
            .moves
            .iter()
            .filter_map(|m| match &m.budget {
                BudgetUse::Broken { reason } if m.from == n.node_id => Some(reason.as_str()),
                _ => None,
            })
            .collect();
        let summary = format!(
            "node {} is reclaimed at {}: {moving} job(s) moving now{}, {in_flight} in flight, {waiting} waiting; left to band recovery: {}{}",
            n.node_id,
            n.deadline
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            if taken_over.is_empty() {
                String::new()
            } else {
                format!(" (taking over held Migration(s) {})", taken_over.join(", "))
            },
            if left.is_empty() {
                "none".to_owned()
            } else {
                left.join(", ")
            },
            if broken.is_empty() {
                String::new()
            } else {
                format!("; past a disruption budget: {}", broken.join("; "))
            }
        );
        if told.get(&n.node_id) == Some(&summary) {
            continue;
        }
        told.insert(n.node_id.clone(), summary.clone());
        let obj = ManagerNode::new(
            &mapping::node_object_name(&n.node_id),
            api::ManagerNodeSpec::default(),
        );
        let type_ = if left.is_empty() && broken.is_empty() {
            EventType::Normal
        } else {
            EventType::Warning
        };
        ctx.event(&obj, type_, "ReclaimNotice", "Reclaim", summary)
            .await;
    }
}
