//! The disruption budget and the migration queue, as the controllers use them: observe the
//! fleet (Migrations, the Bundles they concern, the mirror), decide with the pure
//! [`automanager_policy::disruption`] and [`automanager_policy::migration_queue`], and record
//! what was allowed in [`crate::state::Disruptions`] under the same lock as the decision.
//!
//! Voluntary actions that ask: a Migration leaving `Pending` (drain Migrations among them), a
//! `terminate` drain before it terminates its node, and a HotSpareTarget before it terminates
//! a spare that took a job meanwhile. Involuntary failures are never asked about; the Bundle
//! controller counts them (`automanager_involuntary_disruptions_total`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use automanager_api::{self as api, Bundle, Migration, MigrationPhase};
use automanager_policy::calendar::{Calendar, WindowSource, permit_all};
use automanager_policy::co_location;
use automanager_policy::disruption::{self, DEFAULT_MAX_UNAVAILABLE, Ledger, ReplicaStanding};
use automanager_policy::migration::is_terminal;
use automanager_policy::migration_queue::{self as queue, Admission, Purpose, WaitReason};
use automanager_policy::vocab::{PriorityBand, VoluntaryReason};
use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use manager_client::MirrorState;
use manager_proto as proto;

use super::{Context, Error};
use crate::mapping;
use crate::settings::BandCalendars;
use crate::state::{Admit, AdmittedMigration, Disruptions, HeldMove, HoldNews, PastBound};

/// What a bundle's budget needs: its replicas, budget and job names.
#[derive(Debug, Clone)]
struct BundleFacts {
    replicas: u32,
    max_unavailable: u32,
    jobs: Vec<String>,
    /// Each job's band, whose windows (the operator's settings) a move of it answers to too.
    bands: HashMap<String, PriorityBand>,
    /// Its disruption windows (empty when it declares none; holding everything when they
    /// cannot be read: the Bundle's own pass says why).
    calendar: Calendar,
    /// Each job's co-location group ([`co_location::group`]), for jobs in a group of two or
    /// more.
    groups: HashMap<String, BTreeSet<String>>,
    /// Whether the Bundle is Broken: its replicas that are down stay down until it is retried,
    /// so a budget it spends is held by that, not by moves in flight.
    broken: bool,
}

fn facts(b: &Bundle) -> BundleFacts {
    BundleFacts {
        broken: b
            .status
            .as_ref()
            .and_then(|s| api::find_condition(&s.conditions, "Broken"))
            .is_some_and(|c| c.is_true()),
        replicas: u32::try_from(b.spec.replicas).unwrap_or(0),
        // The CRD refuses a negative budget or one above replicas; an object stored under an
        // older CRD gets the default rather than no protection.
        max_unavailable: b
            .spec
            .max_unavailable_replicas()
            .unwrap_or(DEFAULT_MAX_UNAVAILABLE),
        jobs: b.spec.jobs.iter().map(|j| j.job_name.clone()).collect(),
        bands: b
            .spec
            .jobs
            .iter()
            .map(|j| (j.job_name.clone(), j.requirements.priority_band))
            .collect(),
        // Windows that cannot be read fail closed: every voluntary move is held (the Bundle's
        // own pass says why), never let through as if there were none.
        calendar: b.spec.disruption_calendar().unwrap_or_else(|e| {
            tracing::warn!(bundle = %b.name_any(), error = %e, "disruption windows cannot be read: voluntary moves held");
            Calendar::unreadable(e.to_string())
        }),
        groups: {
            let spec = mapping::bundle("", &b.spec);
            (spec.jobs.iter())
                .map(|j| {
                    let g = co_location::group(&spec.jobs, &spec.intra_replica_placement, &j.job_name);
                    (j.job_name.clone(), g)
                })
                .filter(|(_, g)| g.len() > 1)
                .collect()
        },
    }
}

/// What one decision looked at, read before the state lock is taken.
pub(crate) struct Fleet {
    migrations: Vec<Migration>,
    bundles: HashMap<String, Option<BundleFacts>>,
}

fn key(ns: &str, name: &str) -> String {
    format!("{ns}/{name}")
}

/// `now` stands in for a creation time the object does not have yet.
fn created(m: &Migration, now: DateTime<Utc>) -> DateTime<Utc> {
    m.metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| DateTime::from_timestamp_millis(t.0.as_millisecond()))
        .unwrap_or(now)
}

fn phase(m: &Migration) -> MigrationPhase {
    m.status.as_ref().map(|s| s.phase).unwrap_or_default()
}

/// A Migration that waits for the queue: Pending, not aborted, not being deleted.
fn waits(m: &Migration) -> bool {
    phase(m) == MigrationPhase::Pending
        && m.spec.abort.is_none()
        && m.metadata.deletion_timestamp.is_none()
}

fn bundle_id_of(m: &Migration) -> String {
    mapping::bundle_id(&m.namespace().unwrap_or_default(), &m.spec.job.bundle)
}

impl Fleet {
    /// Lists the Migrations in the watched namespaces and reads the Bundles the decision needs:
    /// those of every Migration not ended, of `extra` bundle ids, and of the jobs on nodes
    /// being terminated.
    pub(crate) async fn gather(ctx: &Context, extra: &[String]) -> Result<Fleet, Error> {
        let migrations: Vec<Migration> = match ctx.settings.scope.namespaces() {
            None => {
                Api::<Migration>::all(ctx.client.clone())
                    .list(&ListParams::default())
                    .await?
                    .items
            }
            Some(namespaces) => {
                let mut all = Vec::new();
                for ns in namespaces {
                    all.extend(
                        Api::<Migration>::namespaced(ctx.client.clone(), ns)
                            .list(&ListParams::default())
                            .await?
                            .items,
                    );
                }
                all
            }
        };
        let mut wanted: Vec<String> = migrations
            .iter()
            .filter(|m| !is_terminal(phase(m)))
            .map(bundle_id_of)
            .collect();
        wanted.extend(extra.iter().cloned());
        // The bundles of nodes being terminated and of Migrations admitted, in one look.
        wanted.extend(ctx.manager.mirror().read(|m| {
            ctx.state.read_disruptions(|book| {
                (book.terminating())
                    .flat_map(|node| m.jobs_on(node).map(|j| j.bundle_id.clone()))
                    .chain(book.admitted().map(|(_, a)| a.bundle_id.clone()))
                    .collect::<Vec<_>>()
            })
        }));
        wanted.sort();
        wanted.dedup();
        let mut bundles = HashMap::new();
        for id in wanted {
            let Some((ns, name)) = mapping::bundle_object(&id) else {
                bundles.insert(id, None);
                continue;
            };
            let found = Api::<Bundle>::namespaced(ctx.client.clone(), &ns)
                .get_opt(&name)
                .await?;
            bundles.insert(id, found.as_ref().map(facts));
        }
        Ok(Fleet {
            migrations,
            bundles,
        })
    }

    /// The Migrations running now: those past `Pending` and not ended, by the list, and those
    /// this process admitted that the list does not show yet.
    fn running(&self, book: &Disruptions) -> BTreeMap<String, AdmittedMigration> {
        let mut out: BTreeMap<String, AdmittedMigration> = book
            .admitted()
            .map(|(k, a)| (k.clone(), a.clone()))
            .collect();
        for m in &self.migrations {
            let p = phase(m);
            let k = key(&m.namespace().unwrap_or_default(), &m.name_any());
            if p == MigrationPhase::Pending || is_terminal(p) {
                continue;
            }
            let status = m.status.clone().unwrap_or_default();
            out.entry(k).or_insert(AdmittedMigration {
                bundle_id: bundle_id_of(m),
                replica: u32::try_from(m.spec.job.replica).unwrap_or(0),
                job_name: m.spec.job.job_name.clone(),
                source_node: status.source_node.unwrap_or_default(),
                target_node: status.target_node,
            });
        }
        // A Migration that ended (by the list) holds nothing, whatever this process recorded.
        for m in &self.migrations {
            if is_terminal(phase(m)) {
                out.remove(&key(&m.namespace().unwrap_or_default(), &m.name_any()));
            }
        }
        out
    }

    /// Whether the disruption windows of `bundle_id` and of its job `job`'s band hold a
    /// voluntary move for `reason` at `now`, and until when. A bundle not known holds nothing.
    fn window_hold(
        &self,
        bands: &BandCalendars,
        bundle_id: &str,
        job: &str,
        reason: VoluntaryReason,
        now: DateTime<Utc>,
    ) -> Option<WindowHold> {
        let f = self.bundles.get(bundle_id)?.as_ref()?;
        let mut calendars = vec![(WindowSource::Bundle, &f.calendar)];
        if let Some(band) = f.bands.get(job) {
            calendars.push((WindowSource::Band(*band), bands.get(*band)));
        }
        let unreadable = calendars
            .iter()
            .find_map(|(source, c)| c.unreadable_reason().map(|why| (*source, why.to_owned())));
        permit_all(&calendars, reason, now)
            .err()
            .map(|h| WindowHold {
                until: h.until.unwrap_or(h.recheck),
                found: h.until.is_some(),
                held_by: h.by,
                unreadable,
            })
    }

    /// The window of `held_by`'s calendars that opens at `until` for `reason`, in words: which
    /// window a held move waits for.
    fn opening_window(
        &self,
        bands: &BandCalendars,
        bundle_id: &str,
        reason: VoluntaryReason,
        hold: &WindowHold,
    ) -> Option<String> {
        if !hold.found || hold.unreadable.is_some() {
            return None;
        }
        let f = self.bundles.get(bundle_id)?.as_ref()?;
        hold.held_by.iter().find_map(|source| {
            let calendar = match source {
                WindowSource::Bundle => &f.calendar,
                WindowSource::Band(b) => bands.get(*b),
            };
            let w = (calendar.windows().iter())
                .filter(|w| w.covers(reason))
                .find(|w| w.recurrence.open_at(hold.until).is_some())?;
            let r = &w.recurrence;
            let took = r.duration().to_std().unwrap_or_default();
            Some(format!(
                "{} for {} ({})",
                r.schedule(),
                humantime::format_duration(took),
                r.time_zone()
            ))
        })
    }

    /// Whether the bundle is known and Broken.
    fn is_broken(&self, bundle_id: &str) -> bool {
        self.bundles
            .get(bundle_id)
            .and_then(Option::as_ref)
            .is_some_and(|f| f.broken)
    }

    /// Every known bundle's replicas as the budget sees them now.
    fn ledger(
        &self,
        mirror: &MirrorState,
        book: &Disruptions,
        running: &BTreeMap<String, AdmittedMigration>,
    ) -> Ledger<String> {
        let mut ledger = Ledger::new();
        for (id, facts) in &self.bundles {
            let Some(f) = facts else { continue };
            let standing = (0..f.replicas)
                .map(|r| ReplicaStanding {
                    replica: r,
                    running: f.jobs.iter().all(|name| {
                        mirror
                            .job_of(id, r, name)
                            .is_some_and(|j| j.instances.iter().any(running_normal))
                    }),
                    disrupted: running
                        .values()
                        .any(|a| a.bundle_id == *id && a.replica == r)
                        || f.jobs.iter().any(|name| {
                            mirror.job_of(id, r, name).is_some_and(|j| {
                                j.instances
                                    .iter()
                                    .any(|i| i.holds_capacity() && book.is_terminating(&i.node_id))
                            })
                        }),
                })
                .collect();
            ledger.insert(id.clone(), f.max_unavailable, standing);
        }
        ledger
    }
}

/// A voluntary move the disruption windows hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WindowHold {
    /// The first time every calendar admits the move, or when to look again (`found` false).
    until: DateTime<Utc>,
    /// The calendars closed now.
    held_by: Vec<WindowSource>,
    /// Whether the calendars open together within the look-ahead.
    found: bool,
    /// A calendar whose windows cannot be read, and why: it holds until they are fixed.
    unreadable: Option<(WindowSource, String)>,
}

/// Every budget the given bundles (and the Migrations in flight) have now, as one ledger: what
/// the reclaim-notice planner decides against.
pub(crate) async fn budget_ledger(
    ctx: &Context,
    bundles: &[String],
) -> Result<Ledger<String>, Error> {
    let fleet = Fleet::gather(ctx, bundles).await?;
    Ok(ctx.manager.mirror().read(|mirror| {
        ctx.state.read_disruptions(|book| {
            let running = fleet.running(book);
            fleet.ledger(mirror, book, &running)
        })
    }))
}

fn running_normal(i: &proto::JobInstance) -> bool {
    i.is_normal() && i.state() == proto::JobState::Running
}

/// The node a job's running normal instance is on.
fn source_of(mirror: &MirrorState, bundle_id: &str, replica: u32, job: &str) -> String {
    mirror
        .job_of(bundle_id, replica, job)
        .and_then(|j| j.instances.iter().find(|i| running_normal(i)))
        .map(|i| i.node_id.clone())
        .unwrap_or_default()
}

/// The queue's answer for a Pending Migration whose source runs on `source`, and how many
/// Migrations wait after this pass. A Migration that may begin is recorded as running before
/// the lock is released.
pub(crate) fn decide_migration(
    ctx: &Context,
    fleet: &Fleet,
    mig: &Migration,
    source: &str,
) -> (Admission<String>, usize) {
    let me = key(&mig.namespace().unwrap_or_default(), &mig.name_any());
    if let Some(wait) =
        window_wait(ctx, fleet, mig, &me).or_else(|| group_wait(ctx, fleet, mig, &me))
    {
        return (wait, 0);
    }
    queue_answer(ctx, fleet, mig, source, &me)
}

/// A Migration waits while another of its job's co-location group runs ([`co_location`]): the
/// group moves one job at a time, each pinned to where the one before put the group.
fn group_wait(
    ctx: &Context,
    fleet: &Fleet,
    mig: &Migration,
    me: &String,
) -> Option<Admission<String>> {
    let bundle_id = bundle_id_of(mig);
    let group = fleet
        .bundles
        .get(&bundle_id)?
        .as_ref()?
        .groups
        .get(&mig.spec.job.job_name)?;
    let replica = u32::try_from(mig.spec.job.replica).unwrap_or(0);
    let running = ctx.state.read_disruptions(|book| fleet.running(book));
    if running.contains_key(me) {
        return None;
    }
    let other = running.values().find(|a| {
        a.bundle_id == bundle_id
            && a.replica == replica
            && a.job_name != mig.spec.job.job_name
            && group.contains(&a.job_name)
    })?;
    Some(Admission::Wait {
        position: 1,
        reason: WaitReason::CoLocated {
            bundle: bundle_id,
            job: other.job_name.clone(),
        },
    })
}

/// A drain's, consolidation's or rebalance's Migration waits for its bundle's and band's
/// windows; a Migration a person created is not held, nor one admitted already.
fn window_wait(
    ctx: &Context,
    fleet: &Fleet,
    mig: &Migration,
    me: &String,
) -> Option<Admission<String>> {
    let labels = mig.labels();
    let reason = if labels.contains_key(api::DRAIN_NODE_LABEL) {
        VoluntaryReason::Drain
    } else {
        match labels.get(api::PURPOSE_LABEL).map(String::as_str) {
            Some(p @ ("rebalance" | "consolidation")) => {
                Purpose::from_label(Some(p)).voluntary_reason()
            }
            _ => return None,
        }
    };
    let bundle_id = bundle_id_of(mig);
    let hold = fleet.window_hold(
        &ctx.settings.band_calendars,
        &bundle_id,
        &mig.spec.job.job_name,
        reason,
        ctx.clock.now(),
    )?;
    if (ctx.state).read_disruptions(|book| fleet.running(book).contains_key(me)) {
        return None;
    }
    Some(Admission::Wait {
        position: 1,
        reason: WaitReason::Window {
            bundle: bundle_id,
            reason,
            until: hold.until,
            held_by: hold.held_by,
            found: hold.found,
            unreadable: hold.unreadable,
        },
    })
}

/// The migration queue's answer for `mig` among every waiting Migration, and how many wait
/// after this pass; a Migration that may begin is recorded as running before the lock is
/// released.
fn queue_answer(
    ctx: &Context,
    fleet: &Fleet,
    mig: &Migration,
    source: &str,
    me: &String,
) -> (Admission<String>, usize) {
    let now = ctx.clock.now();
    ctx.manager.mirror().read(|mirror| {
        ctx.state.decide_disruption(|book| {
            queue_decision(ctx, fleet, mig, source, me, mirror, book, now)
        })
    })
}

/// [`queue_answer`] under the state's lock: the answer, and the admission to record.
#[allow(clippy::too_many_arguments)]
fn queue_decision(
    ctx: &Context,
    fleet: &Fleet,
    mig: &Migration,
    source: &str,
    me: &String,
    mirror: &MirrorState,
    book: &Disruptions,
    now: DateTime<Utc>,
) -> ((Admission<String>, usize), Admit) {
    let running = fleet.running(book);
    if running.contains_key(me) {
        // Admitted already (a status write that did not land): it keeps its slot.
        return ((Admission::Begin, 0), Admit::Nothing);
    }
    let mut ledger = fleet.ledger(mirror, book, &running);
    let held: Vec<queue::Running> = running
        .values()
        .map(|a| queue::Running {
            source_node: a.source_node.clone(),
            target_node: a.target_node.clone(),
        })
        .collect();
    let mut waiting: Vec<queue::Waiting<String>> = fleet
        .migrations
        .iter()
        .filter(|m| waits(m))
        .filter(|m| key(&m.namespace().unwrap_or_default(), &m.name_any()) != *me)
        .map(|m| waiting_entry(mirror, m, None, now))
        .collect();
    waiting.push(waiting_entry(mirror, mig, Some(source), now));
    let answers = queue::admit(&held, &waiting, ctx.settings.migration_limits, &mut ledger);
    let queued = answers
        .iter()
        .filter(|(_, a)| matches!(a, Admission::Wait { .. }))
        .count();
    let mine = answers
        .into_iter()
        .find(|(k, _)| k == me)
        .map(|(_, a)| a)
        .unwrap_or(Admission::Begin);
    let admit = if mine == Admission::Begin {
        let job = &mig.spec.job;
        Admit::Migration(
            me.clone(),
            AdmittedMigration {
                bundle_id: mapping::bundle_id(&mig.namespace().unwrap_or_default(), &job.bundle),
                replica: u32::try_from(job.replica).unwrap_or(0),
                job_name: job.job_name.clone(),
                source_node: source.to_owned(),
                target_node: mig.spec.target_node.clone(),
            },
        )
    } else {
        Admit::Nothing
    };
    ((mine, queued), admit)
}

fn waiting_entry(
    mirror: &MirrorState,
    m: &Migration,
    source: Option<&str>,
    now: DateTime<Utc>,
) -> queue::Waiting<String> {
    let ns = m.namespace().unwrap_or_default();
    let job = &m.spec.job;
    let bundle_id = mapping::bundle_id(&ns, &job.bundle);
    let replica = u32::try_from(job.replica).unwrap_or(0);
    let labels = m.labels();
    let purpose = if labels.contains_key(api::DRAIN_NODE_LABEL) {
        Purpose::Drain
    } else {
        match Purpose::from_label(labels.get(api::PURPOSE_LABEL).map(String::as_str)) {
            // Only a job on a node Manager said it takes is moved ahead of a deadline; the
            // label alone ranks with drains.
            Purpose::Deadline if !super::migration::has_deadline(m, mirror) => Purpose::Drain,
            p => p,
        }
    };
    // A reclaim move the notice planner let past a budget (the node is taken anyway) is not
    // held by it again here.
    let budgeted = if labels.get(api::PURPOSE_LABEL).map(String::as_str) == Some("reclaim")
        && m.annotations()
            .contains_key(api::BUDGET_OVERRIDE_ANNOTATION)
    {
        None
    } else {
        Some((bundle_id.clone(), replica))
    };
    queue::Waiting {
        key: key(&ns, &m.name_any()),
        purpose,
        created: created(m, now).timestamp_millis(),
        source_node: source
            .map(str::to_owned)
            .unwrap_or_else(|| source_of(mirror, &bundle_id, replica, &job.job_name)),
        target_node: m.spec.target_node.clone(),
        replica: budgeted,
    }
}

/// A Migration ended or went away: it holds no slot and takes no replica down any more.
pub(crate) fn forget_migration(ctx: &Context, ns: &str, name: &str) {
    let past = (ctx.state).forget_migration(&key(ns, name), &held_migration(ns, name));
    if let Some(past) = past {
        ctx.metrics.set_held_moves(held_counts(past));
    }
}

/// The hold book's key of a Migration.
pub(crate) fn held_migration(ns: &str, name: &str) -> HeldMove {
    HeldMove::Migration(key(ns, name))
}

/// The words for a wait: the `Queued` condition's reason and message, and the blocking
/// bundle (`namespace/name`) when the budget is the cause.
pub(crate) fn describe_wait(
    position: usize,
    reason: &WaitReason<String>,
    replica: i32,
) -> (&'static str, String, Option<String>) {
    match reason {
        WaitReason::Budget {
            bundle,
            down,
            max_unavailable,
        } => {
            let shown = shown_bundle(bundle);
            (
                "DisruptionBudget",
                format!(
                    "waiting (position {position} in the migration queue): Bundle {shown} allows {max_unavailable} replica(s) down at once (disruption.maxUnavailableReplicas) and replica(s) {} are down or being moved; moving replica {replica} now would exceed it",
                    list(down)
                ),
                Some(shown),
            )
        }
        WaitReason::GlobalLimit { running, limit } => (
            "QueueFull",
            format!(
                "waiting (position {position} in the migration queue): {running} migrations run already, the most migration.maxParallel ({limit}) allows"
            ),
            None,
        ),
        WaitReason::NodeLimit { node, limit } => (
            "NodeBusy",
            format!(
                "waiting (position {position} in the migration queue): node {node} takes part in {limit} migrations already, the most migration.maxParallelPerNode allows"
            ),
            None,
        ),
        WaitReason::Window {
            bundle,
            reason,
            until,
            held_by,
            found,
            unreadable,
        } => {
            let shown = shown_bundle(bundle);
            let hold = WindowHold {
                until: *until,
                held_by: held_by.clone(),
                found: *found,
                unreadable: unreadable.clone(),
            };
            (
                "DisruptionWindow",
                window_message(&shown, *reason, &hold),
                Some(shown),
            )
        }
        WaitReason::CoLocated { bundle, job } => (
            "CoLocatedMigration",
            format!(
                "waiting: job {job} of Bundle {}'s replica {replica} shares this job's node by coLocateWith and is being moved; the group moves one job at a time, this one then to where {job} went",
                shown_bundle(bundle)
            ),
            None,
        ),
    }
}

/// The words for a move the windows hold: until when, for which reason, and whose windows
/// (the bundle's, its job's band's in the operator's settings, or both).
fn window_message(shown: &str, reason: VoluntaryReason, hold: &WindowHold) -> String {
    let reason = reason.as_str();
    let band_of = |b: &PriorityBand| {
        let b = b.as_str();
        format!(
            "the {b} band's disruption windows (bands.{b}.disruptionWindows in the operator's settings)"
        )
    };
    let (who, what) = match hold.held_by.as_slice() {
        [WindowSource::Band(b)] => (
            band_of(b),
            format!("{reason} moves of Bundle {shown}'s {} jobs", b.as_str()),
        ),
        [WindowSource::Bundle, WindowSource::Band(b)] => (
            format!(
                "Bundle {shown}'s disruption windows (disruption.windows) and {}",
                band_of(b)
            ),
            format!("{reason} moves"),
        ),
        _ => (
            format!("Bundle {shown}'s disruption windows"),
            format!("{reason} moves"),
        ),
    };
    if let Some((source, why)) = &hold.unreadable {
        let whose = match source {
            WindowSource::Bundle => {
                format!("Bundle {shown}'s disruption windows (disruption.windows)")
            }
            WindowSource::Band(b) => band_of(b),
        };
        return format!(
            "held: {whose} cannot be read ({why}); every {reason} move waits until they are fixed"
        );
    }
    let at = hold
        .until
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let shown_where = if hold.held_by.as_slice() == [WindowSource::Bundle] {
        " (disruption.windows)"
    } else {
        ""
    };
    if hold.found {
        format!("waiting until {at}: {who} hold {what} until then{shown_where}")
    } else {
        format!(
            "waiting: {who} hold {what}, and the bundle's and the band's windows do not open together within their next {} openings; looked at again at {at}{shown_where}",
            automanager_policy::calendar::JOINT_LOOKAHEAD
        )
    }
}

fn shown_bundle(bundle_id: &str) -> String {
    mapping::bundle_object(bundle_id)
        .map(|(ns, name)| format!("{ns}/{name}"))
        .unwrap_or_else(|| bundle_id.to_owned())
}

fn list(replicas: &[u32]) -> String {
    replicas
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Sets `DisruptionBlocked` on a waiting object's conditions: `True` with the reason while
/// `blocked`, `False` once a wait is over; an object that never waited carries none.
pub(crate) fn set_blocked_condition(
    conditions: &mut Vec<api::Condition>,
    blocked: Option<String>,
    generation: Option<i64>,
    now: DateTime<Utc>,
) {
    if blocked.is_none() && api::find_condition(conditions, "DisruptionBlocked").is_none() {
        return;
    }
    let waits = blocked.is_some();
    let reason = if waits {
        "DisruptionBudget"
    } else {
        "BudgetAllows"
    };
    api::set_condition(
        conditions,
        super::condition(
            "DisruptionBlocked",
            waits,
            reason,
            blocked.unwrap_or_default(),
            generation,
            now,
        ),
    );
}

/// Whether terminating `node_id` now keeps every budget of the bundles whose jobs run there.
/// `Ok` records the node as being terminated (its replicas count as down from now on); `Err`
/// says which bundle blocks it, as a message.
pub(crate) async fn allow_node_terminate(
    ctx: &Arc<Context>,
    node_id: &str,
    reason: VoluntaryReason,
) -> Result<Result<(), String>, Error> {
    Ok(node_terminate_hold(ctx, node_id, reason)
        .await?
        .map_err(|h| h.message))
}

/// [`allow_node_terminate`], answering what holds the terminate: the window that closes on a
/// job of the node, or the bundle whose budget (or Broken state) a terminate would break. The
/// hold's `since` is now; the caller's book keeps when the wait began.
pub(crate) async fn node_terminate_hold(
    ctx: &Arc<Context>,
    node_id: &str,
    reason: VoluntaryReason,
) -> Result<Result<(), Box<api::Hold>>, Error> {
    // Each job on the node: its bundle and its name (its band's windows apply to it).
    let on_node: Vec<(String, String)> = ctx.manager.mirror().read(|m| {
        m.jobs_on(node_id)
            .filter(|j| {
                j.instances
                    .iter()
                    .any(|i| i.node_id == node_id && i.holds_capacity())
            })
            .map(|j| (j.bundle_id.clone(), j.job_name.clone()))
            .collect()
    });
    let bundles: Vec<String> = on_node.iter().map(|(b, _)| b.clone()).collect();
    let fleet = Fleet::gather(ctx, &bundles).await?;
    let now = ctx.clock.now();
    // Allowed: the node is recorded as being terminated before the lock is released.
    Ok(ctx.manager.mirror().read(|mirror| {
        ctx.state.decide_disruption(|book| {
            let answer =
                terminate_answer(ctx, &fleet, &on_node, node_id, reason, mirror, book, now);
            let admit = match answer {
                Ok(()) => Admit::Terminate(node_id.to_owned()),
                Err(_) => Admit::Nothing,
            };
            (answer, admit)
        })
    }))
}

/// [`node_terminate_hold`]'s answer under the state's lock: `Ok` when the node may be
/// terminated (or is being terminated already), else the hold.
#[allow(clippy::too_many_arguments)]
fn terminate_answer(
    ctx: &Context,
    fleet: &Fleet,
    on_node: &[(String, String)],
    node_id: &str,
    reason: VoluntaryReason,
    mirror: &MirrorState,
    book: &Disruptions,
    now: DateTime<Utc>,
) -> Result<(), Box<api::Hold>> {
    if book.is_terminating(node_id) {
        return Ok(());
    }
    let mut held: Vec<(&String, WindowHold)> = on_node
        .iter()
        .filter_map(|(b, job)| {
            fleet
                .window_hold(&ctx.settings.band_calendars, b, job, reason, now)
                .map(|h| (b, h))
        })
        .collect();
    // The hold that lasts longest is the one the node waits for.
    held.sort_by_key(|(_, h)| std::cmp::Reverse(h.until));
    if let Some((bundle, hold)) = held.first() {
        let shown = shown_bundle(bundle);
        let message = format!(
            "{}; terminating node {node_id} would move its jobs",
            window_message(&shown, reason, hold)
        );
        let bands = &ctx.settings.band_calendars;
        let window = fleet.opening_window(bands, bundle, reason, hold);
        return Err(Box::new(window_hold_record(
            &shown, hold, window, message, now,
        )));
    }
    let running = fleet.running(book);
    let mut ledger = fleet.ledger(mirror, book, &running);
    let wanted: Vec<(String, u32)> = mirror
        .jobs_on(node_id)
        .filter(|j| {
            j.instances
                .iter()
                .any(|i| i.node_id == node_id && i.holds_capacity())
        })
        .map(|j| (j.bundle_id.clone(), j.replica))
        .collect();
    match ledger.take_all(&wanted) {
        Ok(()) => Ok(()),
        Err((bundle, verdict)) => {
            let down = match verdict {
                disruption::Verdict::Blocked {
                    down,
                    max_unavailable,
                } => (down, max_unavailable),
                disruption::Verdict::Allowed => (Vec::new(), 0),
            };
            let shown = shown_bundle(&bundle);
            let broken = fleet.is_broken(&bundle);
            let message = terminate_budget_message(&shown, broken, &down.0, down.1, node_id);
            Err(Box::new(budget_hold_record(&shown, broken, message, now)))
        }
    }
}

/// Why a budget (or a Broken bundle) holds the terminate of `node_id`: `down` are the bundle's
/// replicas down or being moved, `max` how many its budget allows down at once.
fn terminate_budget_message(
    shown: &str,
    broken: bool,
    down: &[u32],
    max: u32,
    node_id: &str,
) -> String {
    if down.is_empty() {
        format!(
            "waiting for the disruption budget of Bundle {shown}: it allows {max} replica(s) down at once (spec.disruption.maxUnavailableReplicas); terminating node {node_id} would take one down"
        )
    } else if broken {
        format!(
            "held by Bundle {shown}, which is Broken: replica(s) {} are down and are not restarted until it is retried (kubectl automanager retry), and its disruption budget allows {max} down at once; terminating node {node_id} would take another down",
            list(down)
        )
    } else {
        format!(
            "waiting for the disruption budget of Bundle {shown}: it allows {max} replica(s) down at once and replica(s) {} are down or being moved; terminating node {node_id} would take another down",
            list(down)
        )
    }
}

/// A hold by a bundle's budget, or by the bundle being Broken.
fn budget_hold_record(shown: &str, broken: bool, message: String, now: DateTime<Utc>) -> api::Hold {
    api::Hold {
        kind: if broken {
            api::HoldKind::BrokenBundle
        } else {
            api::HoldKind::DisruptionBudget
        },
        holder: format!("Bundle {shown}"),
        opens_at: None,
        window: None,
        since: now,
        past_bound_at: None,
        proceeded_at: None,
        message: clip(message),
    }
}

/// A hold by closed windows: whose, and when they next open together.
fn window_hold_record(
    shown: &str,
    hold: &WindowHold,
    window: Option<String>,
    message: String,
    now: DateTime<Utc>,
) -> api::Hold {
    let whose = |source: &WindowSource| match source {
        WindowSource::Bundle => format!("Bundle {shown}'s disruption windows"),
        WindowSource::Band(b) => format!(
            "the {} band's disruption windows (operator settings, for Bundle {shown})",
            b.as_str()
        ),
    };
    let holder = hold
        .unreadable
        .as_ref()
        .map(|(source, _)| whose(source))
        .unwrap_or_else(|| {
            let all: Vec<String> = hold.held_by.iter().map(whose).collect();
            if all.is_empty() {
                format!("Bundle {shown}'s disruption windows")
            } else {
                all.join(" and ")
            }
        });
    api::Hold {
        kind: api::HoldKind::DisruptionWindow,
        holder,
        opens_at: (hold.found && hold.unreadable.is_none()).then_some(hold.until),
        window,
        since: now,
        past_bound_at: None,
        proceeded_at: None,
        message: clip(message),
    }
}

/// At most the schema's 2048 characters.
fn clip(message: String) -> String {
    if message.len() <= 2048 {
        return message;
    }
    message.chars().take(2000).collect::<String>() + "..."
}

/// What holds a waiting Migration, when a Broken bundle, a budget or windows do (the queue's
/// own limits and a co-location group are not holds: they pass by themselves).
pub(crate) fn migration_hold(
    ctx: &Context,
    fleet: &Fleet,
    reason: &WaitReason<String>,
    message: &str,
) -> Option<api::Hold> {
    let now = ctx.clock.now();
    match reason {
        WaitReason::Budget { bundle, .. } => Some(budget_hold_record(
            &shown_bundle(bundle),
            fleet.is_broken(bundle),
            message.to_owned(),
            now,
        )),
        WaitReason::Window {
            bundle,
            reason,
            until,
            held_by,
            found,
            unreadable,
        } => {
            let hold = WindowHold {
                until: *until,
                held_by: held_by.clone(),
                found: *found,
                unreadable: unreadable.clone(),
            };
            let bands = &ctx.settings.band_calendars;
            let window = fleet.opening_window(bands, bundle, *reason, &hold);
            Some(window_hold_record(
                &shown_bundle(bundle),
                &hold,
                window,
                message.to_owned(),
                now,
            ))
        }
        _ => None,
    }
}

/// Records that `what` is held by `hold` now: one Event when the move is first held or its
/// holder changes, one Warning Event when the hold passes `disruption.holdWarnAfter`, and
/// `automanager_held_moves` updated. `recorded` is the hold the object's status carries (read
/// back after a restart). `next` is what the object does past the bound, for the Event.
pub(crate) async fn record_hold<K>(
    ctx: &Context,
    obj: &K,
    what: HeldMove,
    hold: api::Hold,
    recorded: Option<&api::Hold>,
    next: &str,
) -> HoldNews
where
    K: kube::Resource<DynamicType = ()>,
{
    let bound = ctx.settings.hold_warn_after;
    let (reporter, action) = match what {
        HeldMove::Drain(_) => ("Drain", "drain"),
        HeldMove::Migration(_) => ("Queue", "migration"),
    };
    let (news, past) = (ctx.state).hold_move(what, hold, recorded, ctx.clock.now(), bound);
    ctx.metrics.set_held_moves(held_counts(past));
    let h = &news.hold;
    if news.new_holder {
        tracing::info!(action, holder = %h.holder, reason = h.kind.as_str(), "voluntary move held");
        ctx.metrics.disruption_blocked(action);
        ctx.event(
            obj,
            kube::runtime::events::EventType::Warning,
            "DisruptionBlocked",
            reporter,
            format!("held by {} ({}): {}", h.holder, h.kind.as_str(), h.message),
        )
        .await;
    }
    if news.crossed_bound {
        tracing::warn!(action, holder = %h.holder, reason = h.kind.as_str(), since = %h.since, "voluntary move held past disruption.holdWarnAfter");
        ctx.event(
            obj,
            kube::runtime::events::EventType::Warning,
            "HeldTooLong",
            reporter,
            format!(
                "held by {} ({}) since {}, longer than disruption.holdWarnAfter ({}); {next}",
                h.holder,
                h.kind.as_str(),
                h.since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                humantime::format_duration(bound)
            ),
        )
        .await;
    }
    news
}

/// `what` is no longer held: its hold is forgotten and the metric updated.
pub(crate) fn release_hold(ctx: &Context, what: &HeldMove) -> bool {
    let Some(past) = ctx.state.release_move(what) else {
        return false;
    };
    ctx.metrics.set_held_moves(held_counts(past));
    true
}

/// A held drain went ahead (`whenHeld: Proceed`): its hold, marked, and the metric updated.
pub(crate) fn proceed_held(ctx: &Context, what: &HeldMove) -> Option<api::Hold> {
    let (hold, past) = ctx.state.proceed_move(what, ctx.clock.now());
    ctx.metrics.set_held_moves(held_counts(past));
    hold
}

fn held_counts(past: PastBound) -> Vec<(&'static str, &'static str, usize)> {
    past.into_iter()
        .map(|((kind, reason), n)| (kind, reason.as_str(), n))
        .collect()
}

/// Sets `DisruptionBlocked` from a hold: `True` with the holder's kind as the reason while
/// held, `False` once the wait is over; an object that never waited carries none.
pub(crate) fn set_held_condition(
    conditions: &mut Vec<api::Condition>,
    held: Option<&api::Hold>,
    generation: Option<i64>,
    now: DateTime<Utc>,
) {
    let Some(h) = held.filter(|h| h.proceeded_at.is_none()) else {
        set_blocked_condition(conditions, None, generation, now);
        return;
    };
    api::set_condition(
        conditions,
        super::condition(
            "DisruptionBlocked",
            true,
            h.kind.as_str(),
            h.message.clone(),
            generation,
            now,
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_wait_says_until_when_and_for_which_reason() {
        let until = DateTime::parse_from_rfc3339("2026-03-07T02:00:00Z")
            .map(|t| t.to_utc())
            .unwrap_or_default();
        let (reason, message, bundle) = describe_wait(
            1,
            &WaitReason::Window {
                bundle: "live.news".into(),
                reason: VoluntaryReason::Consolidation,
                until,
                held_by: vec![WindowSource::Bundle],
                found: true,
                unreadable: None,
            },
            0,
        );
        assert_eq!(reason, "DisruptionWindow");
        assert_eq!(
            message,
            "waiting until 2026-03-07T02:00:00Z: Bundle live/news's disruption windows hold consolidation moves until then (disruption.windows)"
        );
        assert_eq!(bundle.as_deref(), Some("live/news"));
    }

    #[test]
    fn a_wait_on_windows_that_cannot_be_read_says_so_and_names_no_time() {
        let (reason, message, _) = describe_wait(
            1,
            &WaitReason::Window {
                bundle: "live.news".into(),
                reason: VoluntaryReason::Drain,
                until: DateTime::<Utc>::MAX_UTC,
                held_by: vec![WindowSource::Band(PriorityBand::Gold)],
                found: true,
                unreadable: Some((
                    WindowSource::Band(PriorityBand::Gold),
                    "timeZone \"Mars/Olympus\" is not an IANA time zone name".into(),
                )),
            },
            0,
        );
        assert_eq!(reason, "DisruptionWindow");
        assert_eq!(
            message,
            "held: the gold band's disruption windows (bands.gold.disruptionWindows in the operator's settings) cannot be read (timeZone \"Mars/Olympus\" is not an IANA time zone name); every drain move waits until they are fixed"
        );
    }

    #[test]
    fn a_window_wait_names_the_band_calendar_when_the_band_holds() {
        let until = DateTime::parse_from_rfc3339("2026-03-07T02:00:00Z")
            .map(|t| t.to_utc())
            .unwrap_or_default();
        let band = |held_by: Vec<WindowSource>, found: bool| {
            describe_wait(
                1,
                &WaitReason::Window {
                    bundle: "live.news".into(),
                    reason: VoluntaryReason::Drain,
                    until,
                    held_by,
                    found,
                    unreadable: None,
                },
                0,
            )
            .1
        };
        assert_eq!(
            band(vec![WindowSource::Band(PriorityBand::Silver)], true),
            "waiting until 2026-03-07T02:00:00Z: the silver band's disruption windows (bands.silver.disruptionWindows in the operator's settings) hold drain moves of Bundle live/news's silver jobs until then"
        );
        assert_eq!(
            band(
                vec![WindowSource::Bundle, WindowSource::Band(PriorityBand::Gold)],
                true
            ),
            "waiting until 2026-03-07T02:00:00Z: Bundle live/news's disruption windows (disruption.windows) and the gold band's disruption windows (bands.gold.disruptionWindows in the operator's settings) hold drain moves until then"
        );
        let never = band(
            vec![WindowSource::Bundle, WindowSource::Band(PriorityBand::Gold)],
            false,
        );
        assert!(never.starts_with("waiting: "), "{never}");
        assert!(never.contains("do not open together"), "{never}");
        assert!(
            never.contains("looked at again at 2026-03-07T02:00:00Z"),
            "{never}"
        );
    }

    #[test]
    fn a_budget_wait_names_the_bundle_and_the_replicas_down() {
        let (reason, message, bundle) = describe_wait(
            1,
            &WaitReason::Budget {
                bundle: "live.news".into(),
                down: vec![1],
                max_unavailable: 1,
            },
            0,
        );
        assert_eq!(reason, "DisruptionBudget");
        assert_eq!(bundle.as_deref(), Some("live/news"));
        assert!(
            message.contains("Bundle live/news allows 1 replica(s)"),
            "{message}"
        );
        assert!(message.contains("replica(s) 1 are down"), "{message}");
        assert!(message.contains("position 1"), "{message}");
    }

    #[test]
    fn the_blocked_condition_appears_only_on_objects_that_waited() {
        let now = DateTime::from_timestamp(1_772_366_400, 0).unwrap_or_default();
        let mut never = Vec::new();
        set_blocked_condition(&mut never, None, None, now);
        assert!(never.is_empty());
        let mut waited = Vec::new();
        set_blocked_condition(&mut waited, Some("Bundle a/b".into()), Some(3), now);
        let c = api::find_condition(&waited, "DisruptionBlocked").expect("set");
        assert!(c.is_true());
        assert_eq!(
            (c.reason.as_str(), c.message.as_str()),
            ("DisruptionBudget", "Bundle a/b")
        );
        set_blocked_condition(&mut waited, None, Some(3), now);
        let c = api::find_condition(&waited, "DisruptionBlocked").expect("set");
        assert!(!c.is_true());
        assert_eq!(c.reason, "BudgetAllows");
    }

    #[test]
    fn limit_waits_name_the_setting() {
        let (reason, message, bundle) = describe_wait(
            3,
            &WaitReason::GlobalLimit {
                running: 5,
                limit: 5,
            },
            0,
        );
        assert_eq!((reason, bundle), ("QueueFull", None));
        assert!(message.contains("migration.maxParallel (5)"), "{message}");
        let (reason, message, _) = describe_wait(
            1,
            &WaitReason::NodeLimit {
                node: "n1".into(),
                limit: 2,
            },
            0,
        );
        assert_eq!(reason, "NodeBusy");
        assert!(message.contains("node n1"), "{message}");
    }
}
