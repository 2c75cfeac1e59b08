//! The pass's record: wait a moment for its starts to run, look again, build the status from
//! what it saw and did ([`automanager_mapping::bundle_status`]), let the rebalancer look at a
//! Ready bundle, note the pools it waits on, tell what happened in Events, and write the status
//! unless only starts about to run are left ([`automanager_policy::bundle_pass`]), then queue the
//! bundle for its PlacementHistory's writer ([`super::history_writer`]). Every status write of a Bundle goes
//! through [`write_status`] here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use automanager_api::{self as api, Bundle, BundlePhase, BundleStatus};
use automanager_policy::bundle::{Need, ReplicaIntent, ReplicaPlan};
use automanager_policy::bundle_pass::{self, Recorded};
use automanager_policy::ledger::ReplicaKey;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use manager_client::MirrorState;
use manager_proto as proto;

use super::{Outcome, Pass, PassMark, Seen, is_condition};
use crate::controllers::{Context, Error, ns_name};
use crate::mapping::bundle_status::{self, Decided, JobFacts, ReplicaFacts, StatusFacts};
use crate::model::StartMark;

/// How long a status write that waits for starts about to run puts the next look off.
const WRITE_WAITS: Duration = Duration::from_millis(500);

impl Pass<'_> {
    /// Status, Events, metrics and wake-ups from what the pass decided and did.
    pub(super) async fn record(
        &self,
        ctx: &Arc<Context>,
        plans: &BTreeMap<u32, ReplicaPlan>,
        outcomes: &BTreeMap<u32, Outcome>,
        mark: &mut PassMark<'_>,
    ) -> Result<Action, Error> {
        let broken = self.broken(plans);
        let seen = self.settle(ctx, outcomes, mark).await;
        let mut status = self.status(ctx, &seen, plans, outcomes, broken.as_deref());
        ctx.set_broken(&self.bundle_id, status.phase == BundlePhase::Broken);
        let rebalance = self.rebalance(ctx, &mut status).await?;
        let rebalance_waits = rebalance.as_ref().is_some_and(|l| l.wait_for_capacity);
        self.wait_on(ctx, outcomes, rebalance_waits);
        self.announce(ctx, outcomes, broken.as_deref()).await;
        let recorded = Recorded {
            phase: status.phase,
            retried: self.retried,
            unplaceable: outcomes.values().any(|o| o.result.unplaceable.is_some()),
            waiting: outcomes
                .values()
                .any(|o| o.result.provisioning || o.result.provisioning_retry.is_some())
                || plans.values().any(|p| p.intent == ReplicaIntent::Wait),
            started: outcomes.values().any(|o| o.started),
            jobs: seen
                .values()
                .flatten()
                .map(|s| (s.job.phase, s.job.started_at_ms))
                .collect(),
            now_ms: self.now.timestamp_millis(),
        };
        if recorded.write_waits() {
            return Ok(Action::requeue(WRITE_WAITS));
        }
        if let Some(after) = self.defer_status(ctx, &status) {
            return Ok(Action::requeue(after));
        }
        write_status(ctx, self.bundle, &self.prev, status).await?;
        // The history is written by its own task, after the Bundles' own writes.
        ctx.history.queue(ctx, self.bundle);
        let next = bundle_pass::next_look(
            recorded.phase,
            recorded.unplaceable,
            rebalance.is_some_and(|l| l.condition.0),
            bundle_pass::clear_in(plans, restarted(plans, outcomes, &seen)),
            outcomes.values().filter_map(|o| o.retry_in).min(),
        );
        Ok(crate::controllers::next_action(next))
    }

    /// While bundles that lost jobs wait for their pass, this pass's status write waits
    /// ([`automanager_policy::recovery_first`]): `Some(after)` to look again then instead of
    /// writing now.
    fn defer_status(&self, ctx: &Context, status: &BundleStatus) -> Option<Duration> {
        ctx.state.defer_bundle_status(
            &self.name(),
            *status != self.prev,
            ctx.clock.instant(),
            ctx.bundle_slots(),
        )
    }

    /// Why the bundle is Broken, when a replica is past its restart ceiling.
    fn broken(&self, plans: &BTreeMap<u32, ReplicaPlan>) -> Option<String> {
        plans.iter().find_map(|(r, p)| match p.intent {
            ReplicaIntent::Broken { restarts, max_restarts } => Some(format!(
                "replica {r} failed again after {restarts} restarts in the last hour (maxRestartsPerHour {max_restarts}); no more retries until `kubectl annotate --overwrite bundle {} {}=<new value>`",
                self.bundle.name_any(),
                api::RETRY_ANNOTATION
            )),
            _ => None,
        })
    }

    /// Waits for this pass's starts to run, then looks again: the status records what the
    /// mirror shows now, and the pass's mark what it recorded of its own starts.
    async fn settle(
        &self,
        ctx: &Context,
        outcomes: &BTreeMap<u32, Outcome>,
        mark: &mut PassMark<'_>,
    ) -> BTreeMap<u32, Vec<Seen>> {
        let started: Vec<(&str, &(String, StartMark))> = outcomes
            .values()
            .flat_map(|o| o.started_jobs.iter().map(|(id, at)| (id.as_str(), at)))
            .collect();
        settle_starts(ctx, &started).await;
        let seen = self.observe(ctx, None);
        mark.started = seen
            .values()
            .flatten()
            .filter_map(|s| {
                let id = s
                    .job_id
                    .as_ref()
                    .filter(|id| started.iter().any(|(s, _)| s == id))?;
                Some((id.clone(), s.job.phase))
            })
            .collect();
        seen
    }

    /// The pools whose capacity wakes the bundle: those its replicas wait on, and every pool
    /// of the bundle while room there could let the rebalancer move it back.
    fn wait_on(&self, ctx: &Context, outcomes: &BTreeMap<u32, Outcome>, rebalance_waits: bool) {
        let mut waiting_on: Vec<String> = outcomes
            .values()
            .flat_map(|o| o.waiting_on.iter().cloned())
            .collect();
        if rebalance_waits {
            for r in 0..self.replicas() {
                waiting_on.extend(self.engine_bundle.pools_for_replica(r).iter().cloned());
            }
            waiting_on.sort();
            waiting_on.dedup();
        }
        ctx.state.set_bundle_waiting(&self.bundle_ref, waiting_on);
    }

    /// The pass's first placements in one `Placed` Event, and `BundleBroken` once.
    async fn announce(
        &self,
        ctx: &Context,
        outcomes: &BTreeMap<u32, Outcome>,
        broken: Option<&str>,
    ) {
        let placed: Vec<&str> = outcomes
            .values()
            .filter_map(|o| o.placed_note.as_deref())
            .collect();
        if !placed.is_empty() {
            let note = placed.join("; ");
            ctx.event(self.bundle, EventType::Normal, "Placed", "Place", note)
                .await;
        }
        if let Some(reason) = broken
            && !is_condition(&self.prev, "Broken", "RestartCeilingExceeded")
        {
            ctx.metrics.bundle_broken();
            let note = reason.to_owned();
            ctx.event(
                self.bundle,
                EventType::Warning,
                "BundleBroken",
                "Recover",
                note,
            )
            .await;
        }
    }

    /// The rebalancer's look at a Ready bundle with `spec.rebalance` (see
    /// [`crate::controllers::rebalance`]), recorded as its `RebalanceNeeded` condition; the
    /// condition goes when `spec.rebalance` is off.
    async fn rebalance(
        &self,
        ctx: &Context,
        status: &mut BundleStatus,
    ) -> Result<Option<crate::controllers::rebalance::Look>, Error> {
        use crate::controllers::rebalance;
        if !self.bundle.spec.rebalance {
            status
                .conditions
                .retain(|c| c.type_ != rebalance::CONDITION);
            return Ok(None);
        }
        if status.phase != BundlePhase::Ready {
            return Ok(None);
        }
        let look = rebalance::look(
            ctx,
            self.bundle,
            status,
            &self.bundle_id,
            &self.engine_bundle,
            self.now,
        )
        .await?;
        let (on, reason, message) = &look.condition;
        let c = crate::controllers::condition(
            rebalance::CONDITION,
            *on,
            reason,
            message.clone(),
            self.generation,
            self.now,
        );
        api::set_condition(&mut status.conditions, c);
        Ok(Some(look))
    }

    /// The status from what the pass saw (`seen`), planned and did: the facts gathered here,
    /// the status made by [`bundle_status::bundle_status`].
    fn status(
        &self,
        ctx: &Context,
        seen: &BTreeMap<u32, Vec<Seen>>,
        plans: &BTreeMap<u32, ReplicaPlan>,
        outcomes: &BTreeMap<u32, Outcome>,
        broken: Option<&str>,
    ) -> BundleStatus {
        let remembered = ctx.state.last_decisions(&self.name());
        let none = Outcome::default();
        let replicas = ctx.manager.mirror().read(|m| {
            seen.iter()
                .map(|(r, jobs)| {
                    let outcome = outcomes.get(r).unwrap_or(&none);
                    let remembered = remembered.get(r).map(|last| Decided {
                        decision: &last.decision,
                        recovery: last.recovery,
                        at: last.at,
                        preempted: last.preempted.as_ref(),
                    });
                    let rp = ReplicaPass {
                        r: *r,
                        jobs,
                        plan: plans.get(r),
                        outcome,
                        remembered,
                    };
                    self.replica_facts(ctx, m, rp)
                })
                .collect()
        });
        let unreadable_windows = self
            .bundle
            .spec
            .disruption_calendar()
            .err()
            .map(|e| e.to_string());
        bundle_status::bundle_status(&StatusFacts {
            prev: &self.prev,
            retry: self.retry.clone(),
            generation: self.generation,
            now: self.now,
            broken,
            unreadable_windows: unreadable_windows.as_deref(),
            replicas,
        })
    }

    /// One replica's facts for its status: restart counts, and each job where it runs, what it
    /// needs, and the trace of its last placement.
    fn replica_facts<'s>(
        &'s self,
        ctx: &Context,
        m: &MirrorState,
        rp: ReplicaPass<'s>,
    ) -> ReplicaFacts<'s> {
        let key = ReplicaKey::new(&self.bundle_id, rp.r);
        let (restarts, restart_times) = ctx.state.restarts(&key, self.now);
        let decided = rp.outcome.decision.as_ref().map(|(d, recovery)| Decided {
            decision: d,
            recovery: *recovery,
            at: self.now,
            preempted: rp.outcome.preempted.as_ref(),
        });
        let jobs = rp
            .jobs
            .iter()
            .map(|s| {
                let name = s.job.job_name.as_str();
                let need = rp
                    .plan
                    .and_then(|p| p.needs.get(name))
                    .copied()
                    .unwrap_or(Need::Place);
                let previous = self
                    .prev_job(rp.r, name)
                    .and_then(|p| p.last_placement.as_ref());
                let (pool, zone) = m
                    .nodes
                    .get(&s.node_id)
                    .map(|n| (n.pool.clone(), n.zone().to_owned()))
                    .unwrap_or_default();
                JobFacts {
                    name,
                    job_id: s.job_id.as_deref(),
                    phase: s.job.phase,
                    need,
                    node: &s.node_id,
                    pool,
                    zone,
                    config: &s.config,
                    wanted_config: self.wanted_config(name),
                    last_placement: bundle_status::last_placement(
                        name,
                        decided,
                        rp.remembered,
                        previous,
                    ),
                }
            })
            .collect();
        ReplicaFacts {
            replica: rp.r,
            restarts,
            restart_times,
            result: &rp.outcome.result,
            jobs,
        }
    }

    /// Job `name` of replica `r` as the status the pass read shows it.
    fn prev_job(&self, r: u32, name: &str) -> Option<&api::JobStatus> {
        self.prev
            .replicas
            .iter()
            .find(|x| u32::try_from(x.replica).ok() == Some(r))
            .and_then(|x| x.jobs.iter().find(|j| j.job_name == name))
    }

    /// The configuration job `name`'s spec asks for.
    fn wanted_config(&self, name: &str) -> Vec<u8> {
        self.bundle
            .spec
            .jobs
            .iter()
            .find(|j| j.job_name == name)
            .map(api::BundleJob::config_bytes)
            .unwrap_or_default()
    }
}

/// One replica as the pass saw, planned and placed it, for its status.
struct ReplicaPass<'s> {
    r: u32,
    jobs: &'s [Seen],
    plan: Option<&'s ReplicaPlan>,
    outcome: &'s Outcome,
    /// A decision made in a pass whose status write waited.
    remembered: Option<Decided<'s>>,
}

/// For each replica this pass restarted, how long until its count may clear: its band's
/// `restartClearAfter` (the longest of its jobs'), or nothing under the library's rule.
fn restarted<'a>(
    plans: &'a BTreeMap<u32, ReplicaPlan>,
    outcomes: &'a BTreeMap<u32, Outcome>,
    seen: &'a BTreeMap<u32, Vec<Seen>>,
) -> impl Iterator<Item = i64> + 'a {
    plans.iter().filter_map(move |(r, p)| {
        let restarted = matches!(p.intent, ReplicaIntent::Place { recovery: true, .. })
            && outcomes.get(r).is_some_and(|o| o.started);
        restarted.then(|| {
            seen.get(r)
                .into_iter()
                .flatten()
                .map(|s| s.band.clear_after_ms())
                .max()
                .unwrap_or(0)
        })
    })
}

/// Waits (see [`automanager_policy::start_settle`]) until the jobs this pass started run, so
/// the pass records them running instead of leaving that to a second pass. `started` is each
/// job with its node and Manager's answer: until the mirror reflects that start, it shows the
/// job as it was before (failed, for a recovery), which is no sign the start ran.
async fn settle_starts(ctx: &Context, started: &[(&str, &(String, StartMark))]) {
    if started.is_empty() {
        return;
    }
    let Some(bound) = (ctx.state).start_settle_bound(ctx.clock.instant(), ctx.bundle_slots())
    else {
        return;
    };
    let began = ctx.clock.instant();
    let running = |m: &MirrorState| {
        started.iter().all(|(id, (node, mark))| {
            m.jobs.get(*id).is_some_and(|j| {
                mark.reflected_in(j, node)
                    && !matches!(
                        j.state(),
                        proto::JobState::Pending | proto::JobState::Starting
                    )
            })
        })
    };
    let took = ctx
        .manager
        .wait_until(bound, running)
        .await
        .ok()
        .map(|()| ctx.clock.instant().saturating_duration_since(began));
    ctx.state.record_start_settle(took);
}

/// Writes status by server-side apply, only when it changed.
pub(super) async fn write_status(
    ctx: &Context,
    bundle: &Bundle,
    prev: &BundleStatus,
    status: BundleStatus,
) -> Result<(), Error> {
    if &status == prev {
        return Ok(());
    }
    let (ns, name) = ns_name(bundle)?;
    // Conditional: status holds the restart history, which a stale writer must not roll back.
    crate::controllers::apply_status_if(
        &Api::<Bundle>::namespaced(ctx.client.clone(), &ns),
        &name,
        bundle.metadata.resource_version.as_deref(),
        &status,
    )
    .await
}
