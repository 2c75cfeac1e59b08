//! The pass's act on one replica the planner says to place: policy's decision
//! ([`automanager_policy::bundle_pass::decide`]: the request, the engine's answer and its
//! reservation, with the cluster model as the book, under the state lock), then Manager: start
//! the jobs, provision a node, or (a recovery with no room) preempt bronze jobs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use automanager_api as api;
use automanager_placement as pl;
use automanager_policy::bundle::{self as plan, ReplicaPlan};
use automanager_policy::bundle_pass::{self, JobAt};
use kube::runtime::events::EventType;
use manager_client::{ClientError, MirrorState};
use manager_proto as proto;

use super::{Outcome, Pass, Seen, is_condition};
use crate::controllers::{Context, Error, now_ms};
use crate::mapping;
use crate::model::StartMark;

/// One replica the planner says to place, and what its placement looks at.
pub(super) struct Replica<'x> {
    pub(super) r: u32,
    /// The replica's jobs as observed.
    pub(super) seen: &'x [Seen],
    pub(super) plan: &'x ReplicaPlan,
    /// The jobs to place now.
    pub(super) jobs: &'x [String],
    pub(super) recovery: bool,
}

/// A decision that placed the replica, with Manager's ids of its jobs.
struct Placed<'x> {
    r: u32,
    recovery: bool,
    decision: &'x pl::Decision,
    pool: &'x str,
    assignments: &'x [pl::Assignment],
    job_ids: &'x HashMap<String, String>,
}

/// How the starts of a placed replica went.
#[derive(Default)]
struct Starts {
    /// The jobs Manager started: key, id, and node with Manager's answer.
    started: Vec<(pl::JobKey, String, (String, StartMark))>,
    /// Some worker refused its start.
    refused: bool,
    /// The first error that was not a refusal.
    error: Option<ClientError>,
}

impl Pass<'_> {
    /// Places one replica's jobs as a unit and starts them. `all` is every replica as
    /// observed; `decided` where replicas placed earlier in this pass went.
    pub(super) async fn place_replica(
        &self,
        ctx: &Arc<Context>,
        rep: &Replica<'_>,
        all: &BTreeMap<u32, Vec<Seen>>,
        decided: &[pl::Position],
    ) -> Result<Outcome, Error> {
        // Every job must be known to Manager before it can be started: the mirror shows a
        // freshly registered bundle's jobs a moment later, and that change wakes us.
        let Some(job_ids) = job_ids(rep) else {
            return Ok(Outcome::default());
        };
        let heals = self.uses_a_pool_being_deleted(ctx, rep.r).await?;
        let (request, decision) = self.decide(ctx, rep, all, decided, &job_ids, heals);
        let mut outcome = self.act_on(ctx, rep, &request, &decision, &job_ids).await?;
        outcome.preempted = crate::controllers::preempt::settle(
            ctx,
            &self.name(),
            &self.bundle_id,
            rep.r,
            outcome.started,
            outcome.preempted.take(),
        );
        outcome.decision = Some((decision, rep.recovery));
        Ok(outcome)
    }

    /// Whether the replica's pools include one being deleted that this Bundle already used:
    /// it was created before the deletion began. Its jobs may then be placed on that pool's
    /// existing nodes (nothing is provisioned there), whatever brought them down, so the
    /// deletion, which waits on this Bundle, is not waiting on a Bundle it keeps down. A Bundle
    /// created since is new there, and is kept out.
    async fn uses_a_pool_being_deleted(&self, ctx: &Context, replica: u32) -> Result<bool, Error> {
        let terminating =
            (ctx.state).terminating_pools(self.engine_bundle.pools_for_replica(replica));
        let Some(created) = self.bundle.metadata.creation_timestamp.as_ref() else {
            return Ok(false);
        };
        let pools = kube::Api::<api::PlacementPool>::all(ctx.client.clone());
        for name in terminating {
            let deleted = pools
                .get_opt(&name)
                .await?
                .and_then(|p| p.metadata.deletion_timestamp);
            if deleted.is_some_and(|d| created.0 < d.0) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Policy's decision for the replica, reserved in the model and remembered for the trace
    /// under one hold of the state lock (acted on after it is released), with its request.
    fn decide(
        &self,
        ctx: &Context,
        rep: &Replica<'_>,
        all: &BTreeMap<u32, Vec<Seen>>,
        decided: &[pl::Position],
        job_ids: &HashMap<String, String>,
        heals: bool,
    ) -> (pl::PlacementRequest, pl::Decision) {
        let made = ctx.manager.mirror().read(|m| {
            let seen = jobs_at(m, all);
            let ask = bundle_pass::Ask {
                bundle: &self.engine_bundle,
                replica: rep.r,
                jobs: rep.jobs,
                // A user of a pool being deleted heals there like a recovery (existing nodes
                // only), whether Manager failed its jobs or lost them.
                recovery: rep.recovery || heals,
                needs: &rep.plan.needs,
                seen: &seen,
                decided_elsewhere: decided,
            };
            let now_ms = now_ms(self.now);
            ctx.state
                .decide_placement(m, job_ids, self.name(), rep.recovery, self.now, |book| {
                    bundle_pass::decide(book, &ask, now_ms)
                })
        });
        if let Some(e) = &made.unreserved {
            tracing::warn!(bundle = %self.bundle_id, replica = rep.r, error = %e, "could not reserve a placement");
        }
        ctx.metrics.placement_attempted();
        let bundle_pass::Decided {
            request, decision, ..
        } = made;
        (request, decision)
    }

    /// Acts on the engine's decision: start the jobs (their node is up), wait for a node
    /// starting, ask for a node, preempt for a recovery with no room, or say it cannot be
    /// placed.
    async fn act_on(
        &self,
        ctx: &Arc<Context>,
        rep: &Replica<'_>,
        request: &pl::PlacementRequest,
        decision: &pl::Decision,
        job_ids: &HashMap<String, String>,
    ) -> Result<Outcome, Error> {
        let mut outcome = Outcome::default();
        match &decision.outcome {
            pl::Outcome::Placed { pool, assignments }
                if assignments.iter().any(|a| a.node_pending) =>
            {
                // The chosen node is still starting: start the jobs once it is up.
                outcome.result.provisioning = true;
                outcome.waiting_on = vec![pool.clone()];
            }
            pl::Outcome::Placed { pool, assignments } => {
                let placed = Placed {
                    r: rep.r,
                    recovery: rep.recovery,
                    decision,
                    pool,
                    assignments,
                    job_ids,
                };
                self.start(ctx, &placed, &mut outcome).await?;
            }
            pl::Outcome::Provision {
                pool,
                instance_type,
                zone,
            } => {
                outcome.result.provisioning = true;
                outcome.waiting_on = vec![pool.clone()];
                // A recovery with no room starts a warm spare (seconds) before asking for a
                // new node (minutes).
                if !(rep.recovery && self.start_warm_spare(ctx, pool, rep.jobs).await?) {
                    let ask = (pool.as_str(), instance_type.as_str(), zone.as_deref());
                    self.provision(ctx, rep.r, ask, &mut outcome).await?;
                }
            }
            pl::Outcome::Unplaceable { .. } if rep.recovery => {
                if let Some(p) = self.preempt(ctx, rep.r, rep.jobs, request).await? {
                    // The victims are stopping; their stop wakes this bundle, whose next pass
                    // places the replica in the room they leave.
                    outcome.preempted = Some(p);
                    outcome.waiting_on = request.pools.clone();
                } else {
                    self.unplaceable(ctx, rep.r, decision, request, &mut outcome)
                        .await;
                }
            }
            pl::Outcome::Unplaceable { .. } => {
                self.unplaceable(ctx, rep.r, decision, request, &mut outcome)
                    .await;
            }
        }
        Ok(outcome)
    }

    /// Starts a stopped spare of `pool` for a recovery of `jobs`; whether one was started.
    async fn start_warm_spare(
        &self,
        ctx: &Arc<Context>,
        pool: &str,
        jobs: &[String],
    ) -> Result<bool, Error> {
        let bands: Vec<api::PriorityBand> = (self.bundle.spec.jobs.iter())
            .filter(|j| jobs.contains(&j.job_name))
            .map(|j| j.requirements.priority_band)
            .collect();
        let started = crate::controllers::hotspare::start_warm_spare(ctx, pool, &bands).await?;
        Ok(started.is_some())
    }

    fn key(&self, r: u32, job_name: &str) -> pl::JobKey {
        pl::JobKey {
            bundle_id: self.bundle_id.clone(),
            replica_index: r,
            job_name: job_name.to_owned(),
        }
    }

    /// A recovery with no room: preempt bronze jobs when its band may (see
    /// [`crate::controllers::preempt`]).
    async fn preempt(
        &self,
        ctx: &Context,
        r: u32,
        jobs: &[String],
        request: &pl::PlacementRequest,
    ) -> Result<Option<api::Preemption>, Error> {
        use crate::controllers::preempt;
        let Some(band) = preempt::recovering_band(&self.bundle.spec, jobs) else {
            return Ok(None);
        };
        let rec = preempt::Recovering {
            bundle: self.bundle,
            bundle_id: &self.bundle_id,
            replica: r,
            band,
            request,
            now: self.now,
        };
        preempt::preempt_for(ctx, &rec).await
    }

    /// Nothing can take the replica: say so (once per stall) and wait on its pools.
    async fn unplaceable(
        &self,
        ctx: &Context,
        r: u32,
        decision: &pl::Decision,
        request: &pl::PlacementRequest,
        outcome: &mut Outcome,
    ) {
        if let pl::Outcome::Unplaceable { jobs } = &decision.outcome {
            ctx.metrics.placement_failed();
            let blocked = ctx.state.unplaceable(r, jobs, &decision.trace.pools);
            if !is_condition(&self.prev, api::kstatus::STALLED, blocked.cause.reason()) {
                let note = blocked.message.clone();
                ctx.event(
                    self.bundle,
                    EventType::Warning,
                    "PlacementFailed",
                    "Place",
                    note,
                )
                .await;
            }
            outcome.result.unplaceable = Some(blocked);
            outcome.waiting_on = request.pools.clone();
        }
    }

    /// Starts every job of a placed replica at once; a replica is placed whole or not at all.
    async fn start(
        &self,
        ctx: &Arc<Context>,
        placed: &Placed<'_>,
        outcome: &mut Outcome,
    ) -> Result<(), Error> {
        let starts = self.start_all(ctx, placed).await;
        if starts.refused || starts.error.is_some() {
            // Stop what did start, so the next pass places the replica again as a unit instead
            // of pinning the rest to a node that just refused part of it.
            roll_back(ctx, &starts.started).await;
        }
        if let Some(e) = starts.error {
            return Err(e.into());
        }
        if starts.refused {
            return Ok(());
        }
        // Counted only once every start was answered (the metric's help says so).
        ctx.metrics.placement_succeeded();
        outcome.started = true;
        outcome
            .started_jobs
            .extend(starts.started.into_iter().map(|(_, id, at)| (id, at)));
        self.announce_start(ctx, placed, outcome).await;
        Ok(())
    }

    /// Asks Manager to start each job of the replica on its node, all at once, and reads the
    /// answers: a start accepted is reserved until the mirror shows it, a refused one is
    /// counted against its node's health.
    async fn start_all(&self, ctx: &Context, placed: &Placed<'_>) -> Starts {
        let starts = placed.assignments.iter().filter_map(|a| {
            let job_id = placed.job_ids.get(&a.job_name)?;
            Some(async move {
                let answer = ctx
                    .manager
                    .start_job(job_id, &a.node, proto::JobRole::Normal)
                    .await;
                (a, job_id, answer)
            })
        });
        let mut out = Starts::default();
        for (a, job_id, answer) in futures::future::join_all(starts).await {
            let k = self.key(placed.r, &a.job_name);
            match answer {
                Ok(job) => {
                    let mark = StartMark::of(&job, &a.node);
                    (ctx.manager.mirror()).read(|m| ctx.state.start_answered(m, &k, mark));
                    out.started
                        .push((k, job_id.clone(), (a.node.clone(), mark)));
                }
                Err(ClientError::Rejected {
                    reason, message, ..
                }) => {
                    out.refused = true;
                    (ctx.manager.mirror()).read(|m| ctx.state.abandon_start(m, &k));
                    ctx.metrics.job_rejected();
                    crate::controllers::node::record_rejection(ctx, &a.node).await;
                    let note = format!("node {} refused {job_id}: {reason:?} {message}", a.node);
                    ctx.event(
                        self.bundle,
                        EventType::Warning,
                        "JobRejected",
                        "Start",
                        note,
                    )
                    .await;
                }
                Err(e) => {
                    (ctx.manager.mirror()).read(|m| ctx.state.abandon_start(m, &k));
                    out.error.get_or_insert(e);
                }
            }
        }
        out
    }

    /// The Events of a replica started: `Restarted` for a recovery (first placements are told
    /// in the pass's one `Placed` Event), a spill to a later pool, soft rules not honoured.
    async fn announce_start(&self, ctx: &Context, placed: &Placed<'_>, outcome: &mut Outcome) {
        let (r, pool) = (placed.r, placed.pool);
        let mut nodes: Vec<&str> = placed.assignments.iter().map(|a| a.node.as_str()).collect();
        nodes.dedup();
        // A replica split across pools names each pool its jobs went to.
        let mut pools: Vec<&str> = Vec::new();
        for a in placed.assignments {
            if let Some(p) = placed.decision.pool_of(&a.job_name)
                && !pools.contains(&p)
            {
                pools.push(p);
            }
        }
        let note = if pools.len() > 1 {
            format!(
                "replica {r} on {} in pools {}",
                nodes.join(", "),
                pools.join(", ")
            )
        } else {
            format!("replica {r} on {} in pool {pool}", nodes.join(", "))
        };
        if placed.recovery {
            ctx.event(self.bundle, EventType::Normal, "Restarted", "Place", note)
                .await;
        } else {
            outcome.placed_note = Some(note);
        }
        let trace = &placed.decision.trace;
        if placed.decision.is_split() {
            let note = format!("replica {r} split across pools: {}", trace.message);
            ctx.event(
                self.bundle,
                EventType::Normal,
                "SpilledToPool",
                "Place",
                note,
            )
            .await;
        } else if self
            .engine_bundle
            .pools_for_replica(r)
            .first()
            .is_some_and(|p| p != pool)
        {
            let note = format!("replica {r} spilled to pool {pool}: {}", trace.message);
            ctx.event(
                self.bundle,
                EventType::Normal,
                "SpilledToPool",
                "Place",
                note,
            )
            .await;
        }
        if !trace.broken_soft_rules.is_empty() {
            let rules: Vec<&str> = trace.broken_soft_rules.iter().map(|s| s.as_str()).collect();
            let note = format!("replica {r}: soft rules not honoured: {}", rules.join(", "));
            ctx.event(
                self.bundle,
                EventType::Warning,
                "SoftRuleBroken",
                "Place",
                note,
            )
            .await;
        }
    }

    /// Asks Manager for a node (`pool`, instance type, zone) in an elastic pool, unless one
    /// asked for this replica is still on its way. A refusal or a failed ask is the replica's
    /// outcome, not the pass's error: the status says why, and the ask is not repeated before
    /// its time.
    async fn provision(
        &self,
        ctx: &Arc<Context>,
        r: u32,
        (pool, instance_type, zone): (&str, &str, Option<&str>),
        outcome: &mut Outcome,
    ) -> Result<(), Error> {
        let tag = mapping::BundleId::of(
            self.bundle_ref.namespace.as_deref().unwrap_or_default(),
            &self.bundle_ref.name,
        )
        .provisioned_for(r);
        let node = match crate::controllers::request_node(ctx, pool, instance_type, zone, tag).await
        {
            Ok(Some(node)) => node,
            Ok(None) => return Ok(()),
            Err(e) => return self.provision_failed(ctx, r, pool, e, outcome).await,
        };
        let note = format!(
            "replica {r}: asked for a {instance_type} node in pool {pool} ({})",
            node.node_id
        );
        ctx.event(
            self.bundle,
            EventType::Normal,
            "Provisioning",
            "Provision",
            note,
        )
        .await;
        Ok(())
    }

    /// The node replica `r` needs could not be asked for: Manager refused it for good (the
    /// replica is held, with Manager's message, and a Warning Event once), the last ask failed
    /// and waits its back-off, or provisioning in the pool is paused. Any other error is the
    /// pass's.
    async fn provision_failed(
        &self,
        ctx: &Context,
        r: u32,
        pool: &str,
        error: Error,
        outcome: &mut Outcome,
    ) -> Result<(), Error> {
        match error {
            Error::ProvisioningRefused(refusal) => {
                let message = format!("replica {r} cannot be placed: {}", refusal.describe());
                if !is_condition(&self.prev, api::kstatus::STALLED, "ProvisioningRefused") {
                    let (reason, note) = ("ProvisioningRefused", message.clone());
                    ctx.event(self.bundle, EventType::Warning, reason, "Provision", note)
                        .await;
                }
                outcome.result.provisioning = false;
                outcome.result.unplaceable = Some(plan::Blocked {
                    cause: plan::BlockedCause::ProvisioningRefused,
                    message,
                });
            }
            Error::ProvisioningRetry { message, retry_in } => {
                outcome.result.provisioning_retry = Some(format!(
                    "replica {r}: no node from pool {pool} yet ({message}); asked again in {}s",
                    retry_in.as_secs().max(1)
                ));
                outcome.retry_in = Some(retry_in);
            }
            Error::ProvisioningPaused(message) => {
                outcome.result.provisioning_retry = Some(format!(
                    "replica {r}: provisioning in pool {pool} paused: {message}"
                ));
            }
            other => return Err(other),
        }
        Ok(())
    }
}

/// Manager's id of each job to place, by name; `None` while the mirror does not show them all.
fn job_ids(rep: &Replica<'_>) -> Option<HashMap<String, String>> {
    rep.jobs
        .iter()
        .map(|name| {
            let seen = rep.seen.iter().find(|s| &s.job.job_name == name)?;
            Some((name.clone(), seen.job_id.clone()?))
        })
        .collect()
}

/// Every job of the bundle where the pass saw it, with its node's zone from the mirror.
fn jobs_at(m: &MirrorState, all: &BTreeMap<u32, Vec<Seen>>) -> Vec<JobAt> {
    let zone = |node: &str| m.zone_of(node).filter(|z| !z.is_empty()).map(str::to_owned);
    (all.iter())
        .flat_map(|(r, jobs)| jobs.iter().map(move |s| (*r, s)))
        .map(|(r, s)| JobAt {
            replica: r,
            job_name: s.job.job_name.clone(),
            phase: s.job.phase,
            start_in_flight: s.job.start_in_flight,
            node: s.node_id.clone(),
            zone: zone(&s.node_id),
        })
        .collect()
}

/// Stops the jobs of a replica whose start failed part way, and gives their reservations back.
async fn roll_back(ctx: &Context, started: &[(pl::JobKey, String, (String, StartMark))]) {
    for (k, job_id, _) in started {
        if let Err(e) = ctx.manager.stop_job(job_id, proto::JobRole::Normal).await {
            tracing::warn!(job = %job_id, error = %e, "could not roll back a partial replica start");
        }
        (ctx.manager.mirror()).read(|m| ctx.state.abandon_start(m, k));
    }
}
