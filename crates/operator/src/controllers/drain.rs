//! `drain: {mode: migrate}`: the drop-free drain. The node is cordoned (by the ManagerNode
//! reconcile), then every job on it is moved by a `Migration` this module creates, at most
//! `migration.drainParallelism` at a time; a job whose Migration fails is handed to its band's
//! recovery; once the node holds no job of ours it is terminated.
//!
//! The Migrations are ordinary objects (owned by the ManagerNode, labelled with the node), so the
//! user sees each move with `kubectl get migrations`, and a restarted operator picks the drain up
//! from them. What to do next is decided by the pure [`automanager_policy::drain`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{
    self as api, Bundle, ManagerNode, Migration, MigrationJobRef, MigrationPhase,
};
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use manager_client::ClientError;
use manager_proto as proto;

use super::move_request::{MoveName, MoveRequest, Requested, request_move};
use super::{Context, Error};
use crate::mapping;
use crate::state::{DrainProgress, HeldMove, HoldNews};
use automanager_policy::drain::{
    DrainJob, DrainMigration, DrainPlan, MigrationOutcome, plan_drain,
};

/// How often a drain in progress is looked at when no Migration change wakes it.
const STEP: Duration = Duration::from_secs(2);

/// The label value naming a drained node on its Migrations (label values are at most 63
/// characters; object names may be longer).
pub fn node_label(node_object: &str) -> String {
    format!("{:016x}", mapping::fnv1a(node_object))
}

/// The name of the Migration that moves `job_id` off `node_object`: stable, so a restarted
/// operator finds (or re-creates) the same object.
pub fn migration_name(node_object: &str, job_id: &str) -> String {
    named_migration("drain", node_object, job_id)
}

/// `<prefix>-<node object, clipped>-<hash of the job id>`: a valid object name of at most 63
/// characters for a `prefix` of at most 12.
pub fn named_migration(prefix: &str, node_object: &str, job_id: &str) -> String {
    let node: String = node_object.chars().take(40).collect();
    let node = node.trim_end_matches(['-', '.']);
    format!("{prefix}-{node}-{:08x}", mapping::fnv1a(job_id) as u32)
}

/// `(bundle namespace, bundle name, replica, job name)` of a Manager job, from Manager's own
/// record of it, when it belongs to a Bundle.
fn job_ref(ctx: &Context, job_id: &str) -> Option<(String, String, i32, String)> {
    ctx.manager.mirror().read(|m| {
        let job = m.jobs.get(job_id)?;
        let id = mapping::BundleId::parse(&job.bundle_id)?;
        let (ns, name) = id.object();
        Some((
            ns.to_owned(),
            name.to_owned(),
            i32::try_from(job.replica).ok()?,
            job.job_name.clone(),
        ))
    })
}

/// The Bundle a Manager job belongs to.
pub(crate) fn job_bundle(ctx: &Context, job_id: &str) -> Option<ObjectRef<Bundle>> {
    job_ref(ctx, job_id).map(|(ns, name, _, _)| ObjectRef::new(&name).within(&ns))
}

pub(crate) fn outcome(m: &Migration) -> MigrationOutcome {
    use MigrationPhase as P;
    // A move with a deadline took the job over before this one began: that move's to finish.
    let taken_over = m.status.as_ref().is_some_and(|s| {
        api::find_condition(&s.conditions, "Aborted").is_some_and(|c| c.reason == "Superseded")
    });
    match m.status.as_ref().map(|s| s.phase).unwrap_or_default() {
        P::Completed => MigrationOutcome::Completed,
        P::Aborted if taken_over => MigrationOutcome::TakenOver,
        P::Aborted | P::Refused | P::Rejected | P::Failed => MigrationOutcome::Failed,
        _ => MigrationOutcome::InFlight,
    }
}

/// Manager's id of the job a Migration names.
fn migration_job_id(ctx: &Context, m: &Migration) -> Option<String> {
    let ns = m.namespace()?;
    let j = &m.spec.job;
    let replica = u32::try_from(j.replica).ok()?;
    ctx.manager.mirror().read(|mirror| {
        mirror
            .job_of(&mapping::bundle_id(&ns, &j.bundle), replica, &j.job_name)
            .map(|job| job.job_id.clone())
    })
}

/// Bundles looked up during one step, by (namespace, name).
struct Bundles<'a> {
    ctx: &'a Context,
    seen: HashMap<(String, String), Option<Bundle>>,
}

impl Bundles<'_> {
    async fn get(&mut self, ns: &str, name: &str) -> Result<Option<&Bundle>, Error> {
        let key = (ns.to_owned(), name.to_owned());
        if !self.seen.contains_key(&key) {
            let watched = self.ctx.settings.scope.owns_namespace(ns);
            let found = if watched {
                Api::<Bundle>::namespaced(self.ctx.client.clone(), ns)
                    .get_opt(name)
                    .await?
            } else {
                None
            };
            self.seen.insert(key.clone(), found);
        }
        Ok(self.seen.get(&key).and_then(Option::as_ref))
    }

    /// Whether the job's band drops it on failure (bronze by default).
    async fn drops(&mut self, job_id: &str) -> Result<bool, Error> {
        let Some((ns, name, _, job)) = job_ref(self.ctx, job_id) else {
            return Ok(false);
        };
        let ctx = self.ctx;
        Ok(self.get(&ns, &name).await?.is_some_and(|b| {
            b.spec.jobs.iter().any(|j| {
                j.job_name == job
                    && ctx
                        .settings
                        .band(j.requirements.priority_band, b.spec.bands.as_ref())
                        .on_failure
                        == api::OnFailure::Drop
            })
        }))
    }
}

/// One step of a migrate drain of `node` (Manager id `node_id`): observe the jobs on the node
/// and the drain's Migrations, plan the next step with [`plan_drain`], act (create Migrations,
/// hand failed moves to recovery, terminate the emptied node) and record the progress.
pub async fn step(node: &ManagerNode, node_id: &str, ctx: &Arc<Context>) -> Result<Action, Error> {
    if !ctx.manager_ready() {
        return Err(ctx.manager_unavailable());
    }
    // Emptied and left to its owner (a physical node Manager does not terminate): done.
    if ctx.state.left_to_owner(node_id) {
        return Ok(Action::await_change());
    }
    let started_at = node
        .status
        .as_ref()
        .and_then(|s| s.drain.as_ref())
        .and_then(|d| d.started_at)
        .unwrap_or_else(|| ctx.clock.now());
    ctx.state.begin_drain(node_id, 0, started_at);
    // The node is gone already: its jobs recover by band (Manager reports them lost), and
    // nothing holds the drain any more.
    let Some(mut seen) = observe(node, node_id, ctx).await? else {
        unheld(ctx, node_id);
        return Ok(Action::await_change());
    };
    // A drain Migration held in the queue (by a Broken bundle, a budget or windows) holds the
    // drain up: the ManagerNode says so, naming the holder (the Migration carries it too).
    match seen.held.take() {
        Some(hold) => {
            held(ctx, node, node_id, hold, WAITS).await;
        }
        None => unheld(ctx, node_id),
    }
    let plan = plan_drain(
        &seen.jobs,
        &seen.migrations,
        usize::from(ctx.settings.drain_parallelism),
    );
    migrate(node, node_id, ctx, &plan.migrate).await?;
    fall_back(node, ctx, &plan.fall_back).await?;
    let dropped = record(node_id, ctx, &mut seen, &plan).await?;
    if !plan.foreign.is_empty() && plan.remaining == 0 && plan.in_flight == 0 {
        waits_for_others(ctx, node, node_id, &plan.foreign).await;
    }
    if plan.done {
        terminate(node, node_id, ctx, &plan, dropped).await?;
        return Ok(Action::await_change());
    }
    Ok(Action::requeue(STEP))
}

/// What a drain step sees: the jobs on the node, its Migrations and their outcomes, whether the
/// budget holds one of them, and the Bundles looked up on the way.
struct Seen<'a> {
    jobs: Vec<DrainJob>,
    migrations: Vec<DrainMigration>,
    held: Option<api::Hold>,
    bundles: Bundles<'a>,
}

/// `None` when Manager's node is no longer starting or started.
async fn observe<'a>(
    node: &ManagerNode,
    node_id: &str,
    ctx: &'a Context,
) -> Result<Option<Seen<'a>>, Error> {
    let state = ctx.manager.mirror().read(|m| {
        m.nodes
            .get(node_id)
            .and_then(|n| proto::NodeState::try_from(n.state).ok())
    });
    if !matches!(
        state,
        Some(proto::NodeState::Started | proto::NodeState::Starting)
    ) {
        return Ok(None);
    }
    let mut bundles = Bundles {
        ctx,
        seen: HashMap::new(),
    };
    let mut jobs = Vec::new();
    let mut listed_in: HashMap<String, Vec<Migration>> = HashMap::new();
    for (job_id, running) in jobs_on(ctx, node_id) {
        let (managed, moving) = match job_ref(ctx, &job_id) {
            Some((ns, name, replica, job_name)) => {
                let managed = bundles.get(&ns, &name).await?.is_some();
                if managed && !listed_in.contains_key(&ns) {
                    let all = Api::<Migration>::namespaced(ctx.client.clone(), &ns)
                        .list(&ListParams::default())
                        .await?
                        .items;
                    listed_in.insert(ns.clone(), all);
                }
                let ours = migration_name(&node.name_any(), &job_id);
                let listed = listed_in.get(&ns).map(Vec::as_slice).unwrap_or_default();
                (
                    managed,
                    moved_by_another(listed, &ours, (&name, replica, &job_name)),
                )
            }
            None => (false, false),
        };
        let foreign = is_foreign(ctx, &job_id);
        jobs.push(DrainJob {
            job_id,
            managed,
            running,
            moving,
            foreign,
        });
    }
    let listed = drop_stale(ctx, drain_migrations(ctx, &node.name_any()).await?).await;
    let migrations = listed
        .iter()
        .filter_map(|m| {
            Some(DrainMigration {
                job_id: migration_job_id(ctx, m)?,
                outcome: outcome(m),
            })
        })
        .collect();
    Ok(Some(Seen {
        jobs,
        migrations,
        held: migration_held(&listed),
        bundles,
    }))
}

/// Whether a Migration other than the drain's own (`ours`) is moving the job (bundle, replica,
/// job name) now: not ended, whatever its phase.
fn moved_by_another(listed: &[Migration], ours: &str, job: (&str, i32, &str)) -> bool {
    listed.iter().any(|m| {
        let j = &m.spec.job;
        m.name_any() != ours
            && (j.bundle.as_str(), j.replica, j.job_name.as_str()) == job
            && !automanager_policy::migration::is_terminal(
                m.status.as_ref().map(|s| s.phase).unwrap_or_default(),
            )
    })
}

/// The jobs Manager shows on the node (normal instances that start or run there), and whether
/// each runs.
fn jobs_on(ctx: &Context, node_id: &str) -> Vec<(String, bool)> {
    ctx.manager.mirror().read(|m| {
        m.jobs
            .values()
            .filter_map(|j| {
                let i = j.instances.iter().find(|i| {
                    i.node_id == node_id
                        && (i.role == proto::JobRole::Normal as i32
                            || i.role == proto::JobRole::Unspecified as i32)
                        && (i.state == proto::JobState::Starting as i32
                            || i.state == proto::JobState::Running as i32)
                })?;
                Some((j.job_id.clone(), i.state == proto::JobState::Running as i32))
            })
            .collect()
    })
}

/// Whether a Manager job is another client's: its bundle id is not one this installation
/// gives (`<namespace>.<name>` in a watched namespace). Not ours to move or stop, nor to
/// terminate its node under.
fn is_foreign(ctx: &Context, job_id: &str) -> bool {
    ctx.manager.mirror().read(|m| {
        m.jobs
            .get(job_id)
            .is_some_and(|j| ctx.settings.scope.our_bundle(&j.bundle_id).is_none())
    })
}

/// The other clients' jobs Manager shows on the node (starting or running there), in id order:
/// while there is one, a drain does not terminate the node.
pub(crate) fn foreign_jobs_on(ctx: &Context, node_id: &str) -> Vec<String> {
    let mut foreign: Vec<String> = jobs_on(ctx, node_id)
        .into_iter()
        .map(|(job_id, _)| job_id)
        .filter(|job_id| is_foreign(ctx, job_id))
        .collect();
    foreign.sort();
    foreign
}

/// A drain that has done its part waits for other clients' jobs to leave the node: a Warning
/// Event names them (repeats are aggregated by the Event recorder).
pub(crate) async fn waits_for_others(
    ctx: &Context,
    node: &ManagerNode,
    node_id: &str,
    foreign: &[String],
) {
    tracing::info!(node = %node_id, jobs = ?foreign, "drain waits: jobs of another client run on the node");
    ctx.event(
        node,
        EventType::Warning,
        "DrainWaitsForOtherClients",
        "Drain",
        format!(
            "node {node_id} is not terminated while jobs that are not this operator's run there ({}); it stays cordoned, and the drain ends once their owner has moved or stopped them",
            foreign.join(", ")
        ),
    )
    .await;
}

/// The Migrations labelled with the drained node.
async fn drain_migrations(ctx: &Context, node_object: &str) -> Result<Vec<Migration>, Error> {
    let selector = format!("{}={}", api::DRAIN_NODE_LABEL, node_label(node_object));
    Ok(super::list_watched(ctx, &ListParams::default().labels(&selector)).await?)
}

/// Whether a drain Migration ended because the node it was made for was gone (an earlier drain
/// of a node of the same name): it says nothing about this drain.
fn is_stale(m: &Migration) -> bool {
    m.status.as_ref().is_some_and(|s| {
        s.phase == MigrationPhase::Aborted
            && api::find_condition(&s.conditions, "Aborted")
                .is_some_and(|c| c.reason == "SourceGone")
    })
}

/// The drain's Migrations without the stale ones ([`is_stale`]), which are deleted: read as
/// failed moves they would hand the job to recovery, and their names are the ones this drain
/// creates its own under.
async fn drop_stale(ctx: &Context, listed: Vec<Migration>) -> Vec<Migration> {
    let (stale, live): (Vec<Migration>, Vec<Migration>) = listed.into_iter().partition(is_stale);
    for m in stale {
        let Some(ns) = m.namespace() else { continue };
        match Api::<Migration>::namespaced(ctx.client.clone(), &ns)
            .delete(&m.name_any(), &DeleteParams::background())
            .await
        {
            Ok(_) => {
                tracing::info!(migration = %m.name_any(), "drain: a Migration of an earlier drain of a gone node removed");
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => {
                tracing::warn!(migration = %m.name_any(), error = %e, "drain: could not remove a stale Migration");
            }
        }
    }
    live
}

/// What holds the drain, when one of its Migrations is held in the queue: the one held
/// longest, its message naming the Migration.
fn migration_held(migrations: &[Migration]) -> Option<api::Hold> {
    migrations
        .iter()
        .filter_map(|m| {
            let s = m.status.as_ref()?;
            let h = s
                .held
                .as_ref()
                .filter(|_| s.phase == MigrationPhase::Pending)?;
            Some(api::Hold {
                message: format!("Migration {}: {}", m.name_any(), h.message),
                past_bound_at: None,
                proceeded_at: None,
                ..h.clone()
            })
        })
        .min_by_key(|h| h.since)
}

/// What a held drain does past the bound, for the Event.
const WAITS: &str =
    "the drain keeps waiting (whenHeld: Wait); see the runbook's AutoManagerMoveHeldTooLong";
const PROCEEDS: &str = "whenHeld: Proceed: the node is terminated now, as the TypeScript library's drainNode would, and its jobs recover by band";

/// The drain of `node_id` is held by `hold`: recorded (the ManagerNode's `status.held` and
/// `DisruptionBlocked` condition, written by the status sync), with its Events and the metric.
pub(crate) async fn held(
    ctx: &Context,
    node: &ManagerNode,
    node_id: &str,
    hold: api::Hold,
    next: &str,
) -> HoldNews {
    let recorded = node.status.as_ref().and_then(|s| s.held.as_ref());
    let what = HeldMove::Drain(node_id.to_owned());
    let news = super::disruption::record_hold(ctx, node, what, hold, recorded, next).await;
    let _ = ctx.wake.node_sync.try_send(());
    news
}

/// The drain of `node_id` is not held (any more).
pub(crate) fn unheld(ctx: &Context, node_id: &str) {
    if super::disruption::release_hold(ctx, &HeldMove::Drain(node_id.to_owned())) {
        let _ = ctx.wake.node_sync.try_send(());
    }
}

/// A `terminate` drain held by `hold`: `true` when it goes ahead anyway, because the hold
/// passed `disruption.holdWarnAfter` and the drain says `whenHeld: Proceed`. Then the node is
/// recorded as being terminated (its replicas count as down), the hold keeps `proceededAt`,
/// and a `DrainProceeded` Event says what was overridden.
pub(crate) async fn held_terminate(
    ctx: &Context,
    node: &ManagerNode,
    node_id: &str,
    hold: api::Hold,
    when_held: api::WhenHeld,
) -> bool {
    let next = match when_held {
        api::WhenHeld::Wait => WAITS,
        api::WhenHeld::Proceed => PROCEEDS,
    };
    let news = held(ctx, node, node_id, hold, next).await;
    if when_held == api::WhenHeld::Wait || news.hold.past_bound_at.is_none() {
        return false;
    }
    let what = HeldMove::Drain(node_id.to_owned());
    super::disruption::proceed_held(ctx, &what);
    ctx.state.allow_terminate(node_id);
    let h = &news.hold;
    tracing::warn!(node = %node_id, holder = %h.holder, reason = h.kind.as_str(), "held terminate drain proceeds (whenHeld: Proceed)");
    ctx.event(
        node,
        EventType::Warning,
        "DrainProceeded",
        "Drain",
        format!(
            "held by {} ({}) since {}, past disruption.holdWarnAfter ({}); whenHeld: Proceed: node {node_id} is terminated anyway, as the TypeScript library's drainNode would, and its jobs recover by band",
            h.holder,
            h.kind.as_str(),
            h.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            humantime::format_duration(ctx.settings.hold_warn_after)
        ),
    )
    .await;
    let _ = ctx.wake.node_sync.try_send(());
    true
}

/// Creates the Migration of each job the plan moves now (it exists already after a restart:
/// fine).
async fn migrate(
    node: &ManagerNode,
    node_id: &str,
    ctx: &Context,
    jobs: &[String],
) -> Result<(), Error> {
    let node_object = node.name_any();
    for job_id in jobs {
        let Some((ns, bundle, replica, job_name)) = job_ref(ctx, job_id) else {
            continue;
        };
        let job = MigrationJobRef {
            bundle,
            replica,
            job_name,
        };
        let name = MoveName::Stable(migration_name(&node_object, job_id));
        let req = MoveRequest::new(&ns, name, job)
            .label(api::DRAIN_NODE_LABEL, node_label(&node_object))
            .annotate(api::DRAIN_NODE_ANNOTATION, node_object.clone())
            .owned_by(node.controller_owner_ref(&()));
        if let Requested::Created(name) = request_move(ctx, &req).await? {
            tracing::info!(node = %node_id, job = %job_id, migration = %name, "drain: migrating job");
        }
    }
    Ok(())
}

/// Hands each job whose migration failed to its band's recovery. Manager records the stop as
/// "handed to recovery", so the job's band decides even after an operator restart (gold and
/// silver restart, bronze is dropped).
async fn fall_back(node: &ManagerNode, ctx: &Context, jobs: &[String]) -> Result<(), Error> {
    for job_id in jobs {
        match ctx.manager.hand_to_recovery(job_id).await {
            Ok(_) => {}
            Err(e) if super::is_final_answer(&e) => {}
            Err(e) => return Err(e.into()),
        }
        ctx.event(
            node,
            EventType::Warning,
            "DrainFallback",
            "Drain",
            format!("the migration of {job_id} failed; the job is handed to its band's recovery"),
        )
        .await;
        if let Some(bundle) = job_bundle(ctx, job_id) {
            let _ = ctx.wake.bundles.send(bundle);
        }
    }
    Ok(())
}

/// Records the drain's progress, from its Migrations (so it survives a restart); answers how
/// many of the jobs handed to recovery their band drops.
async fn record(
    node_id: &str,
    ctx: &Context,
    seen: &mut Seen<'_>,
    plan: &DrainPlan,
) -> Result<usize, Error> {
    let mut dropped = 0usize;
    for m in seen
        .migrations
        .iter()
        .filter(|m| m.outcome == MigrationOutcome::Failed)
    {
        if seen.bundles.drops(&m.job_id).await? {
            dropped += 1;
        }
    }
    ctx.state.record_drain_progress(
        node_id,
        DrainProgress {
            migrated: plan.migrated,
            dropped,
            recovered: plan.fell_back.saturating_sub(dropped),
        },
    );
    Ok(dropped)
}

/// Terminates the emptied node, with the `Drained` Event.
async fn terminate(
    node: &ManagerNode,
    node_id: &str,
    ctx: &Context,
    plan: &DrainPlan,
    dropped: usize,
) -> Result<(), Error> {
    let left = match ctx.manager.terminate_node(node_id).await {
        Ok(n) => left_up(ctx, node_id, &n),
        // Over the published API other clients' jobs are out of the operator's view: Manager's
        // port refuses the terminate and names them, and the drain waits as it does for those
        // it sees.
        Err(ClientError::FailedPrecondition(m))
            if m.contains(manager_client::OTHER_CLIENTS_JOBS) =>
        {
            let named = m.rsplit(" runs ").next().unwrap_or_default();
            let foreign: Vec<String> = named.split(", ").map(str::to_owned).collect();
            waits_for_others(ctx, node, node_id, &foreign).await;
            return Ok(());
        }
        // Already on its way out (the mirror has not shown it yet): said once already.
        Err(ClientError::NotFound(_) | ClientError::FailedPrecondition(_)) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let end = if left {
        LEFT_TO_OWNER
    } else {
        "was terminated"
    };
    ctx.event(
        node,
        EventType::Normal,
        "Drained",
        "Drain",
        format!(
            "node {node_id} is empty ({} jobs migrated, {} handed to band recovery of which {dropped} dropped) and {end}",
            plan.migrated, plan.fell_back
        ),
    )
    .await;
    Ok(())
}

/// How a drain ends on a node Manager does not terminate.
pub(crate) const LEFT_TO_OWNER: &str = "was left to its owner (Manager does not terminate a physical node): it stays up, cordoned while its drain is set";

/// Whether Manager answered a terminate of `node_id` with the node still up (a physical node
/// is its owner's: our jobs leave it, the node stays); the drain then completes once none of
/// our jobs is on it.
pub(crate) fn left_up(ctx: &Context, node_id: &str, answered: &proto::Node) -> bool {
    let left = answered.state == proto::NodeState::Started as i32;
    if left {
        ctx.state.leave_to_owner(node_id);
    }
    left
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_migration_names_are_stable_valid_and_distinct_per_job() {
        let long = "n".repeat(253);
        // The longest prefix in use (consolidation's) as well as the drain's.
        for prefix in ["drain", "consolidate"] {
            for node in ["onprem-a1", long.as_str(), "a.b-"] {
                check_name(prefix, node);
            }
        }
        assert_eq!(node_label(&long).len(), 16);
    }

    fn check_name(prefix: &str, node: &str) {
        assert_eq!(
            named_migration("drain", node, "j"),
            migration_name(node, "j")
        );
        let a = named_migration(prefix, node, "ns.b/0/enc");
        let b = named_migration(prefix, node, "ns.b/1/enc");
        assert_ne!(a, b);
        assert_eq!(a, named_migration(prefix, node, "ns.b/0/enc"));
        assert!(a.len() <= 63, "{a}");
        assert!(
            a.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.'),
            "{a}"
        );
        assert!(!a.ends_with(['-', '.']), "{a}");
    }
}
