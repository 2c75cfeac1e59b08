//! Admission of a Pending Migration: the checks that end it in `Rejected` before anything in
//! Manager is touched.

use automanager_api::{
    self as api, Bundle, Migration, MigrationPhase, MigrationStatus, MigrationStrategy,
};
use automanager_policy::migration::{self as plan, Claim, HeldSource, MigrationRecord, SourceJob};
use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::events::EventType;
use manager_proto as proto;

use super::{manager_migration_id, push_phase, write_status};
use crate::controllers::{Context, Error, condition, disruption};
use crate::mapping;
use automanager_policy::migration_queue::Admission;

/// Why admission refuses a Migration: the condition's reason and message.
type Refusal = (&'static str, String);

/// What admission answers a Pending Migration.
pub(super) enum Verdict {
    /// It may go on (to the queue): the strategy in effect and the source node.
    Admitted(MigrationStrategy, String),
    /// It is refused: it ends `Rejected`.
    Refused(Refusal),
    /// It has nothing left to do and ends `Aborted` before it began, with the reason
    /// (`Superseded`, `SourceGone`) and the words.
    Ends(Refusal),
}

/// The admission checks of a Pending Migration: the strategy in effect and the source node, or
/// why it is rejected or ends.
pub(super) async fn admit(
    mig: &Migration,
    ctx: &Context,
    ns: &str,
    name: &str,
    job_id: &str,
) -> Result<Verdict, Error> {
    let strategy = match check_job(mig, ctx, ns).await? {
        Ok(strategy) => strategy,
        Err(refusal) => return Ok(Verdict::Refused(refusal)),
    };
    if !ctx.manager.features().migration_handshake {
        return Ok(Verdict::Refused((
            "ManagerCannotMigrate",
            format!(
                "this Manager has no migration handshake (its published API has none, and \
                 AutoManager's extension is not served): the job cannot be moved by a \
                 Migration ({} asked)",
                strategy.as_str()
            ),
        )));
    }
    if let Some(gone) = check_source_gone(mig, ctx, job_id) {
        return Ok(Verdict::Ends(("SourceGone", gone.to_string())));
    }
    match check_one_at_a_time(mig, ctx, ns).await? {
        Err(refusal) => return Ok(Verdict::Refused(refusal)),
        Ok(None) => {}
        Ok(Some(by)) => return Ok(Verdict::Ends(("Superseded", superseded_by(&by)))),
    }
    let checked = check_source(mig, ctx, job_id)
        .and_then(|source| check_target(mig, ctx, strategy, &source).map(|()| source));
    let source = match checked {
        Ok(source) => source,
        Err(refusal) => return Ok(Verdict::Refused(refusal)),
    };
    tracing::debug!(migration = %name, job = %job_id, strategy = strategy.as_str(), source = %source, "migration admitted");
    Ok(Verdict::Admitted(strategy, source))
}

/// Whether the Migration was made for a node its job has left, or that is gone: the node it
/// recorded as its source while held, or a drain's or consolidation's node.
fn check_source_gone(mig: &Migration, ctx: &Context, job_id: &str) -> Option<plan::SourceGone> {
    let recorded = mig.status.as_ref().and_then(|s| s.source_node.clone());
    ctx.manager.mirror().read(|m| {
        let node = recorded.or_else(|| {
            let annotations = mig.annotations();
            if let Some(id) = annotations.get(api::CONSOLIDATION_NODE_ANNOTATION) {
                return Some(id.clone());
            }
            // A drain names its node's object; the node is the one whose object that is.
            let object = annotations.get(api::DRAIN_NODE_ANNOTATION)?;
            m.nodes
                .keys()
                .find(|id| mapping::node_object_name(id) == *object)
                .cloned()
                .or_else(|| Some(object.clone()))
        })?;
        let gone = match m.nodes.get(&node).map(proto::Node::state) {
            None => Some("Manager no longer has it"),
            Some(proto::NodeState::Terminated) => Some("terminated"),
            Some(_) => None,
        };
        let running_on = m.jobs.get(job_id).and_then(|j| {
            j.instances
                .iter()
                .find(|i| i.is_normal() && i.state() == proto::JobState::Running)
                .map(|i| i.node_id.clone())
        });
        plan::source_gone(
            Some(HeldSource { node: &node, gone }),
            running_on.as_deref(),
        )
    })
}

/// The words for a Migration a move with a deadline took over (`by`: that Migration).
fn superseded_by(by: &Migration) -> String {
    let deadline = by
        .annotations()
        .get(api::DEADLINE_ANNOTATION)
        .map(|d| format!(" (its node is taken at {d})"))
        .unwrap_or_default();
    format!(
        "superseded by Migration {}, which moves the job ahead of a reclaim notice{deadline}; this Migration ends without acting, the job is that one's to move",
        by.name_any()
    )
}

/// The job exists in its Bundle: the strategy in effect (the job's declared one, or a safer one
/// the Migration asks for).
async fn check_job(
    mig: &Migration,
    ctx: &Context,
    ns: &str,
) -> Result<Result<MigrationStrategy, Refusal>, Error> {
    let job = &mig.spec.job;
    let bundles: Api<Bundle> = Api::namespaced(ctx.client.clone(), ns);
    let Some(bundle) = bundles.get_opt(&job.bundle).await? else {
        let why = format!("Bundle {ns}/{} does not exist", job.bundle);
        return Ok(Err(("UnknownJob", why)));
    };
    if job.replica < 0 || job.replica >= bundle.spec.replicas {
        let why = format!(
            "Bundle {ns}/{} has {} replica(s); replica {} does not exist",
            job.bundle, bundle.spec.replicas, job.replica
        );
        return Ok(Err(("UnknownJob", why)));
    }
    let Some(declared) = bundle.spec.jobs.iter().find(|j| j.job_name == job.job_name) else {
        let why = format!("Bundle {ns}/{} has no job {}", job.bundle, job.job_name);
        return Ok(Err(("UnknownJob", why)));
    };
    let declared = declared.migration.map(|m| m.strategy);
    Ok(plan::strategy_in_effect(declared, mig.spec.strategy)
        .map_err(|e| ("StrategyRefused", e.to_string())))
}

/// No other Migration object of the namespace moves the job now. A move with a deadline ends
/// the held Migrations of its job here (superseded); `Ok(Some(by))` when this one is held and
/// such a move, `by`, takes its job over.
async fn check_one_at_a_time(
    mig: &Migration,
    ctx: &Context,
    ns: &str,
) -> Result<Result<Option<Migration>, Refusal>, Error> {
    let all: Api<Migration> = Api::namespaced(ctx.client.clone(), ns);
    let now = ctx.clock.now();
    let listed = all.list(&ListParams::default()).await?.items;
    let (records, candidate) = ctx.manager.mirror().read(|mirror| {
        let with_deadline = |m: &Migration| MigrationRecord {
            deadline: has_deadline(m, mirror),
            ..record(m, now)
        };
        (
            listed.iter().map(with_deadline).collect::<Vec<_>>(),
            with_deadline(mig),
        )
    });
    let claim = match plan::one_at_a_time(&records, &candidate) {
        Ok(claim) => claim,
        Err(e) => return Ok(Err(("ConcurrentMigration", e.to_string()))),
    };
    match claim {
        Claim::Superseded { by } => Ok(Ok(listed.into_iter().find(|m| m.name_any() == by))),
        Claim::Go { supersede } => {
            for held in listed.iter().filter(|m| supersede.contains(&m.name_any())) {
                let prev = held.status.clone().unwrap_or_default();
                end(
                    ctx,
                    held,
                    &prev,
                    prev.clone(),
                    ("Superseded", superseded_by(mig)),
                )
                .await?;
                tracing::info!(migration = %held.name_any(), by = %mig.name_any(), "held migration superseded by a move with a deadline");
            }
            Ok(Ok(None))
        }
    }
}

/// The node the job runs on now, unless Manager holds a migration of the job that no Migration
/// object records (another client).
fn check_source(mig: &Migration, ctx: &Context, job_id: &str) -> Result<String, Refusal> {
    let (source, in_manager) = ctx.manager.mirror().read(|m| {
        let source = m.jobs.get(job_id).and_then(|j| {
            j.instances
                .iter()
                .find(|i| i.is_normal() && i.state() == proto::JobState::Running)
                .map(|i| i.node_id.clone())
        });
        // This Migration's own record (its admission was written to Manager but not to status)
        // is not another migration.
        let own = manager_migration_id(mig);
        let other = m
            .migrations
            .values()
            .find(|x| x.job_id == job_id && !x.is_final() && x.migration_id != own)
            .map(|x| x.migration_id.clone());
        (source, other)
    });
    if let Some(other) = in_manager {
        let job = record(mig, ctx.clock.now()).job;
        return Err((
            "ConcurrentMigration",
            format!(
                "{job} is already being migrated in Manager (migration {other}); one migration at a time per job: this one is refused, not queued"
            ),
        ));
    }
    source.ok_or_else(|| {
        (
            "SourceNotRunning",
            format!(
                "job {job_id} has no running instance to migrate; create the Migration again once it runs"
            ),
        )
    })
}

/// `spec.targetNode`, when given, is a node Manager has that can take the strategy.
fn check_target(
    mig: &Migration,
    ctx: &Context,
    strategy: MigrationStrategy,
    source: &str,
) -> Result<(), Refusal> {
    let Some(target) = &mig.spec.target_node else {
        return Ok(());
    };
    let Some(node) = ctx.manager.mirror().read(|m| m.nodes.get(target).cloned()) else {
        let why = format!("target node {target} does not exist in Manager");
        return Err(("TargetRefused", why));
    };
    let caps = node
        .inventory
        .as_ref()
        .map(|i| i.capabilities.clone())
        .unwrap_or_default();
    plan::check_target(strategy, target, &caps, Some(source))
        .map_err(|e| ("TargetRefused", e.to_string()))
}

/// The migration queue (parallelism limits, priority, the disruption budget, windows) for a
/// Migration that passed its checks: `true` when it may begin now (a `Queued` condition and a
/// hold it carried are cleared); `false` when it waits, with status written: `queuePosition`,
/// the `Queued` condition (reason `BrokenBundle`, `DisruptionBudget`, `DisruptionWindow`,
/// `QueueFull`, `NodeBusy` or `CoLocatedMigration`) and, when a Broken bundle, a budget or a
/// window holds it, `held` (holder, since when) with a `DisruptionBlocked` Event per holder
/// and a `HeldTooLong` Event past `disruption.holdWarnAfter`.
pub(super) async fn queue(
    ctx: &Context,
    mig: &Migration,
    status: &mut MigrationStatus,
    source: &str,
) -> Result<bool, Error> {
    let (ns, name) = (mig.namespace().unwrap_or_default(), mig.name_any());
    let own = mapping::bundle_id(&ns, &mig.spec.job.bundle);
    let fleet = disruption::Fleet::gather(ctx, &[own]).await?;
    let (answer, queued) = disruption::decide_migration(ctx, &fleet, mig, source);
    ctx.metrics.set_migrations_queued(queued);
    let (generation, now) = (mig.metadata.generation, ctx.clock.now());
    let Admission::Wait { position, reason } = answer else {
        status.queue_position = None;
        status.held = None;
        disruption::release_hold(ctx, &disruption::held_migration(&ns, &name));
        if api::find_condition(&status.conditions, "Queued").is_some() {
            api::set_condition(
                &mut status.conditions,
                condition("Queued", false, "Admitted", String::new(), generation, now),
            );
        }
        return Ok(true);
    };
    let prev = mig.status.clone().unwrap_or_default();
    // The node the job is on as it waits: a held Migration made for it ends if the job leaves
    // it or it goes, rather than moving the job later from wherever it runs then.
    status.source_node = Some(source.to_owned());
    let (reason_word, message, blocking) =
        disruption::describe_wait(position, &reason, mig.spec.job.replica);
    let hold = disruption::migration_hold(ctx, &fleet, &reason, &message);
    // The condition's reason names the holder's kind (a Broken bundle spends its budget).
    let reason_word = hold.as_ref().map_or(reason_word, |h| h.kind.as_str());
    let was = api::find_condition(&prev.conditions, "Queued")
        .filter(|c| c.status == api::ConditionStatus::True)
        .map(|c| (c.reason.clone(), c.message.clone()));
    status.queue_position = Some(i32::try_from(position).unwrap_or(i32::MAX));
    set_queued(status, reason_word, &message, generation, now);
    match hold {
        Some(hold) => {
            let next = "the Migration keeps waiting; see the runbook's AutoManagerMoveHeldTooLong";
            let what = disruption::held_migration(&ns, &name);
            let news =
                disruption::record_hold(ctx, mig, what, hold, prev.held.as_ref(), next).await;
            status.held = Some(news.hold);
        }
        None => {
            status.held = None;
            disruption::release_hold(ctx, &disruption::held_migration(&ns, &name));
            if new_wait(was.as_ref(), reason_word, blocking.as_deref()) {
                ctx.event(mig, EventType::Normal, "MigrationQueued", "Queue", message)
                    .await;
            }
        }
    }
    write_status(ctx, mig, &prev, status.clone()).await?;
    Ok(false)
}

/// The `Queued` and `Progressing` conditions and the standing of a waiting Migration.
fn set_queued(
    status: &mut MigrationStatus,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: DateTime<Utc>,
) {
    for (type_, value) in [("Queued", true), ("Progressing", false)] {
        api::set_condition(
            &mut status.conditions,
            condition(type_, value, reason, message.to_owned(), generation, now),
        );
    }
    api::set_standing(
        &mut status.conditions,
        api::Standing::Reconciling,
        "Queued",
        message.to_owned(),
        generation,
        now,
    );
}

/// Whether a wait is new and worth an Event: once per wait (and again when the blocking
/// bundle changes), not on every poll. `was` is the `Queued` condition's reason and message
/// when it was True. A budget's message names the bundle as `Bundle ns/name `, a window's as
/// `Bundle ns/name's`.
fn new_wait(was: Option<&(String, String)>, reason: &str, blocking: Option<&str>) -> bool {
    let blocked_by = |m: &str| {
        blocking.is_some_and(|b| {
            m.contains(&format!("Bundle {b} ")) || m.contains(&format!("Bundle {b}'s "))
        })
    };
    match was {
        None => true,
        Some((r, m)) => r != reason || (blocking.is_some() && !blocked_by(m)),
    }
}

/// `now` stands in for a creation time the object does not have yet.
pub(super) fn record(m: &Migration, now: DateTime<Utc>) -> MigrationRecord {
    MigrationRecord {
        name: m.name_any(),
        job: SourceJob {
            namespace: m.namespace().unwrap_or_default(),
            bundle: m.spec.job.bundle.clone(),
            replica: m.spec.job.replica,
            job_name: m.spec.job.job_name.clone(),
        },
        phase: m.status.as_ref().map(|s| s.phase).unwrap_or_default(),
        created_at: m
            .metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| DateTime::from_timestamp_millis(t.0.as_millisecond()))
            .unwrap_or(now),
        deadline: false,
    }
}

/// A move with a deadline: a reclaim notice's Migration (by its label or annotation) of a job
/// on a node Manager has announced it takes. The mark alone, which anyone who may create a
/// Migration can set, never lets a Migration take over others or pass the queue's limits.
pub(crate) fn has_deadline(m: &Migration, mirror: &manager_client::MirrorState) -> bool {
    let marked = m.annotations().contains_key(api::DEADLINE_ANNOTATION)
        || m.labels().get(api::PURPOSE_LABEL).map(String::as_str) == Some("reclaim");
    if !marked {
        return false;
    }
    let Some(ns) = m.namespace() else {
        return false;
    };
    let j = &m.spec.job;
    let Ok(replica) = u32::try_from(j.replica) else {
        return false;
    };
    let noticed: std::collections::BTreeSet<&str> =
        mirror.noticed_nodes().map(|n| n.node_id.as_str()).collect();
    mirror
        .job_of(&mapping::bundle_id(&ns, &j.bundle), replica, &j.job_name)
        .is_some_and(|job| {
            job.instances.iter().any(|i| {
                i.is_normal() && i.holds_capacity() && noticed.contains(i.node_id.as_str())
            })
        })
}

/// Ends a Migration that never began and has nothing left to do (superseded by a move with a
/// deadline, or its source gone): `Aborted` by the operator in `Pending`, with `reason` on its
/// conditions. Nothing in Manager was touched. It is what should happen, so it reads as ready.
pub(super) async fn end(
    ctx: &Context,
    mig: &Migration,
    prev: &MigrationStatus,
    mut status: MigrationStatus,
    (reason, message): Refusal,
) -> Result<(), Error> {
    let (generation, now) = (mig.metadata.generation, ctx.clock.now());
    let message: String = message.chars().take(1000).collect();
    status.phase = MigrationPhase::Aborted;
    status.queue_position = None;
    status.held = None;
    push_phase(&mut status, MigrationPhase::Aborted, now);
    status.abort = Some(api::AbortInfo {
        reason: message.clone(),
        phase: MigrationPhase::Pending,
        by: plan::AbortBy::Operator.as_str().to_owned(),
        at: now,
    });
    for (type_, value) in [("Aborted", true), ("Progressing", false), ("Queued", false)] {
        if type_ == "Queued" && api::find_condition(&status.conditions, type_).is_none() {
            continue;
        }
        api::set_condition(
            &mut status.conditions,
            condition(type_, value, reason, message.clone(), generation, now),
        );
    }
    api::set_standing(
        &mut status.conditions,
        api::Standing::Ready,
        reason,
        message.clone(),
        generation,
        now,
    );
    if let Ok((ns, name)) = crate::controllers::ns_name(mig) {
        disruption::forget_migration(ctx, &ns, &name);
    }
    ctx.event(mig, EventType::Normal, "MigrationEnded", "Admit", message)
        .await;
    write_status(ctx, mig, prev, status).await
}

pub(super) async fn reject(
    ctx: &Context,
    mig: &Migration,
    prev: &MigrationStatus,
    mut status: MigrationStatus,
    reason: &str,
    message: String,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    let generation = mig.metadata.generation;
    status.held = None;
    if let Ok((ns, name)) = crate::controllers::ns_name(mig) {
        disruption::release_hold(ctx, &disruption::held_migration(&ns, &name));
    }
    status.phase = MigrationPhase::Rejected;
    push_phase(&mut status, MigrationPhase::Rejected, now);
    for (type_, value) in [("Rejected", true), ("Progressing", false)] {
        api::set_condition(
            &mut status.conditions,
            condition(type_, value, reason, message.clone(), generation, now),
        );
    }
    api::set_standing(
        &mut status.conditions,
        api::Standing::Stalled,
        reason,
        message.clone(),
        generation,
        now,
    );
    ctx.event(
        mig,
        EventType::Warning,
        "MigrationRejected",
        "Admit",
        message,
    )
    .await;
    write_status(ctx, mig, prev, status).await
}
