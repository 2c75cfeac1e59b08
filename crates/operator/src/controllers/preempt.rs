//! Preemption for recovery, as the Bundle controller carries it out: a gold (or, when
//! configured, silver) recovery that finds no capacity and no hot spare stops bronze jobs on one
//! node to make room (`bands.<band>.preempt` in the operator's settings; off by default).
//!
//! - **Which nodes.** A dry run of the placement engine with every preemptible bronze job
//!   removed lists the nodes the replica could take were they freed, so every other filter
//!   (capabilities, rules, cordons, health, spares) is the engine's own; only nodes that take
//!   the whole replica are candidates.
//! - **Which victims.** [`automanager_policy::preempt::choose_victims`]: only bronze jobs whose
//!   band drops them (a Bundle that overrides bronze to `restart` is never preempted), not one
//!   being migrated, nor one of a namespace this operator does not watch; the fewest, then the
//!   newest, on one node.
//! - **How.** Each victim is handed to its band's recovery through Manager (`StopJob` with
//!   `STOP_REASON_HANDED_TO_RECOVERY`, as a failed drain hands a job over), so its Bundle
//!   records it `dropped`, exactly as a bronze job whose node failed, and Manager keeps the
//!   verdict across an operator restart: it is never placed again until the retry annotation.
//!   The recovering replica waits for the victims to stop (the stop wakes it) and is then placed
//!   by the ordinary placement, which finds the freed node.
//! - **Told.** A `Preempted` Warning Event on each victim's Bundle naming the recovering one, a
//!   `PreemptedBronze` Event on the recovering Bundle naming the victims,
//!   `automanager_preemptions_total{band}` and `automanager_jobs_preempted_total`, and the
//!   recovering job's placement trace (`lastPlacement.preempted`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use automanager_api::{self as api, Bundle, OnFailure, PriorityBand};
use automanager_placement as pl;
use automanager_policy::preempt::{self, NodeCandidate, RunningJob};
use chrono::{DateTime, Utc};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::{Context, Error, is_final_answer, now_ms};
use crate::mapping;
use crate::state::State;
use manager_client::MirrorState;

/// How long a preemption made for a replica holds off another one for it: its victims' capacity
/// is on its way. Past it (someone else took the room), the replica may preempt again.
const HOLD: Duration = Duration::from_secs(20);
/// Most candidate nodes the dry run lists.
const MAX_CANDIDATE_NODES: usize = 32;
/// Choices made again after a victim's Bundle turned out not to drop it.
const MAX_ROUNDS: usize = 3;

/// The recovery asking for room.
pub struct Recovering<'a> {
    pub bundle: &'a Bundle,
    pub bundle_id: &'a str,
    pub replica: u32,
    /// The most important band among the jobs being placed.
    pub band: PriorityBand,
    pub request: &'a pl::PlacementRequest,
    pub now: DateTime<Utc>,
}

/// The band of a replica's recovery: the most important of the jobs being placed.
pub fn recovering_band(spec: &api::BundleSpec, jobs: &[String]) -> Option<PriorityBand> {
    spec.jobs
        .iter()
        .filter(|j| jobs.contains(&j.job_name))
        .map(|j| j.requirements.priority_band)
        .min()
}

/// The preemption under way for this replica, if one is (made before and not yet placed).
fn pending(ctx: &Context, bundle_id: &str, replica: u32) -> Option<api::Preemption> {
    (ctx.state).pending_preemption(bundle_id, replica, ctx.clock.instant(), HOLD)
}

/// The replica's preemption after its placement, noted on its last decision for the trace:
/// done when the replica `started` (returned once, for the trace), else the one `made` by this
/// placement, else one made before and still under way. One operation on the state.
pub fn settle(
    ctx: &Context,
    bundle: &(String, String),
    bundle_id: &str,
    replica: u32,
    started: bool,
    made: Option<api::Preemption>,
) -> Option<api::Preemption> {
    let now = ctx.clock.instant();
    (ctx.state).settle_preemption(bundle, bundle_id, replica, started, made, now, HOLD)
}

/// Preempts for `rec` when its band may and some node can be freed: `Some` is the preemption
/// made now or still under way, and the replica waits for it.
pub async fn preempt_for(
    ctx: &Context,
    rec: &Recovering<'_>,
) -> Result<Option<api::Preemption>, Error> {
    if rec.band == PriorityBand::Bronze || !ctx.settings.bands.get(rec.band).preempt {
        return Ok(None);
    }
    if let Some(p) = pending(ctx, rec.bundle_id, rec.replica) {
        return Ok(Some(p));
    }
    let need = preempt::Need {
        capacity: rec
            .request
            .jobs
            .iter()
            .map(|j| j.requirements.required_capacity)
            .sum(),
        cores: rec
            .request
            .jobs
            .iter()
            .map(|j| j.requirements.required_cores)
            .fold(0, u32::saturating_add),
    };
    let mut excluded: HashSet<String> = HashSet::new();
    for _ in 0..MAX_ROUNDS {
        let Some((choice, bundle_of)) = choose(ctx, rec, need, &excluded) else {
            return Ok(None);
        };
        let mut victim_bundles: BTreeMap<String, Bundle> = BTreeMap::new();
        for v in &choice.victims {
            let Some(bid) = bundle_of.get(v) else {
                continue;
            };
            if victim_bundles.contains_key(bid) || excluded.contains(bid) {
                continue;
            }
            match droppable_bundle(ctx, bid).await? {
                Some(b) => {
                    victim_bundles.insert(bid.clone(), b);
                }
                None => {
                    excluded.insert(bid.clone());
                }
            }
        }
        let all_droppable = choice.victims.iter().all(|v| {
            bundle_of
                .get(v)
                .is_some_and(|b| victim_bundles.contains_key(b))
        });
        if !all_droppable {
            continue;
        }
        let record = api::Preemption {
            at: rec.now,
            node: choice.node_id.clone(),
            victims: choice
                .victims
                .iter()
                .take(api::MAX_PREEMPTION_VICTIMS)
                .cloned()
                .collect(),
        };
        act(ctx, rec, &choice, &bundle_of, &victim_bundles, &record).await?;
        return Ok(Some(record));
    }
    Ok(None)
}

/// The victims, chosen on the mirror and a dry run of the engine, with each victim's Manager
/// bundle id.
fn choose(
    ctx: &Context,
    rec: &Recovering<'_>,
    need: preempt::Need,
    excluded: &HashSet<String>,
) -> Option<(preempt::Preemption, HashMap<String, String>)> {
    ctx.manager.mirror().read(|m| {
        let (by_node, bundle_of) = bronze_jobs(m, rec, excluded);
        if by_node.is_empty() {
            return None;
        }
        let candidates = candidate_nodes(m, &ctx.state, rec, &by_node, &bundle_of)?;
        let choice = preempt::choose_victims(need, &candidates)?;
        Some((choice, bundle_of))
    })
}

/// The preemptible jobs by node: bronze, starting or running, of another bundle not excluded,
/// and not being migrated; and each one's Manager bundle id.
fn bronze_jobs(
    m: &MirrorState,
    rec: &Recovering<'_>,
    excluded: &HashSet<String>,
) -> (BTreeMap<String, Vec<RunningJob>>, HashMap<String, String>) {
    let moving: HashSet<&str> = m
        .migrations
        .values()
        .filter(|mig| !mig.is_final())
        .map(|mig| mig.job_id.as_str())
        .collect();
    let mut by_node: BTreeMap<String, Vec<RunningJob>> = BTreeMap::new();
    let mut bundle_of: HashMap<String, String> = HashMap::new();
    for job in m.jobs.values() {
        if job.bundle_id == rec.bundle_id
            || excluded.contains(&job.bundle_id)
            || job.node_id.is_empty()
            || moving.contains(job.job_id.as_str())
        {
            continue;
        }
        let Some(req) = &job.requirements else {
            continue;
        };
        if mapping::parse_band(&req.priority_band) != Some(PriorityBand::Bronze)
            || !matches!(
                job.state(),
                manager_proto::JobState::Running | manager_proto::JobState::Starting
            )
        {
            continue;
        }
        let started_at_ms = job
            .instances
            .iter()
            .filter(|i| i.is_normal())
            .map(|i| i.started_at_ms)
            .max()
            .unwrap_or(0);
        by_node
            .entry(job.node_id.clone())
            .or_default()
            .push(RunningJob {
                job_id: job.job_id.clone(),
                band: PriorityBand::Bronze,
                capacity: req.required_capacity.max(0.0),
                cores: u32::try_from(req.required_cores).unwrap_or(0),
                started_at_ms,
            });
        bundle_of.insert(job.job_id.clone(), job.bundle_id.clone());
    }
    (by_node, bundle_of)
}

/// The nodes that would take the whole replica were their bronze jobs gone: a dry run of the
/// engine without them, each answer cordoned in turn so the next finds another node. `None`
/// when the dry run cannot cordon a node it chose.
fn candidate_nodes(
    m: &MirrorState,
    state: &State,
    rec: &Recovering<'_>,
    by_node: &BTreeMap<String, Vec<RunningJob>>,
    bundle_of: &HashMap<String, String>,
) -> Option<Vec<NodeCandidate>> {
    let all: HashSet<String> = bundle_of.keys().cloned().collect();
    let mut dry = state.engine_without_jobs(m, &all);
    let mut candidates = Vec::new();
    while candidates.len() < MAX_CANDIDATE_NODES {
        let d = dry.place(rec.request, now_ms(rec.now));
        let pl::Outcome::Placed { assignments, .. } = &d.outcome else {
            break;
        };
        let mut nodes: Vec<&str> = assignments.iter().map(|a| a.node.as_str()).collect();
        nodes.sort_unstable();
        nodes.dedup();
        for n in &nodes {
            if dry.set_cordoned(n, true).is_err() {
                return None;
            }
        }
        // Victims come from one node: a replica the engine spreads over several is left to
        // wait for capacity.
        let [node] = nodes.as_slice() else {
            continue;
        };
        let (Some(jobs), Some(view)) = (by_node.get(*node), state.node_view(node)) else {
            continue;
        };
        candidates.push(NodeCandidate {
            node_id: (*node).to_owned(),
            free_capacity: view.free_capacity,
            free_cores: view.total_cores.saturating_sub(view.used_cores),
            jobs: jobs.clone(),
        });
    }
    Some(candidates)
}

/// The Bundle of a victim, when it is one of ours whose bronze band drops (a Bundle that
/// overrides bronze to `restart` would only restart the victim elsewhere).
async fn droppable_bundle(ctx: &Context, bundle_id: &str) -> Result<Option<Bundle>, Error> {
    // Another operator's bundles (one watching other namespaces on the same Manager) are not
    // this one's to stop.
    let Some(id) = ctx.settings.scope.our_bundle(bundle_id) else {
        return Ok(None);
    };
    let (ns, name) = id.object();
    let bundle = Api::<Bundle>::namespaced(ctx.client.clone(), ns)
        .get_opt(name)
        .await?;
    Ok(bundle.filter(|b| {
        b.metadata.deletion_timestamp.is_none()
            && ctx
                .settings
                .band(PriorityBand::Bronze, b.spec.bands.as_ref())
                .on_failure
                == OnFailure::Drop
    }))
}

/// Stops the victims through Manager and tells both sides.
async fn act(
    ctx: &Context,
    rec: &Recovering<'_>,
    choice: &preempt::Preemption,
    bundle_of: &HashMap<String, String>,
    victim_bundles: &BTreeMap<String, Bundle>,
    record: &api::Preemption,
) -> Result<(), Error> {
    // Recorded first: a pass that fails half-way still holds off a second preemption.
    ctx.state.record_preemption(
        rec.bundle_id,
        rec.replica,
        record.clone(),
        ctx.clock.instant(),
    );
    let recovering = format!(
        "{}/{}",
        rec.bundle.namespace().unwrap_or_default(),
        rec.bundle.name_any()
    );
    let band = rec.band.as_str();
    tracing::info!(bundle = %rec.bundle_id, replica = rec.replica, band, node = %choice.node_id, victims = ?choice.victims, "preempting bronze jobs for a recovery");
    for v in &choice.victims {
        match ctx.manager.hand_to_recovery(v).await {
            Ok(_) => {}
            // Gone or already stopped: its room is free either way.
            Err(e) if is_final_answer(&e) => {
                tracing::debug!(job = %v, error = %e, "preemption victim already gone");
            }
            Err(e) => return Err(e.into()),
        }
        if let Some(b) = bundle_of.get(v).and_then(|b| victim_bundles.get(b)) {
            ctx.event(
                b,
                EventType::Warning,
                "Preempted",
                "Preempt",
                format!(
                    "job {v} on node {} was stopped to make room for the {band} recovery of Bundle {recovering} replica {}; it is dropped, as its bronze band drops a job whose node fails (retry with the {} annotation)",
                    choice.node_id,
                    rec.replica,
                    api::RETRY_ANNOTATION
                ),
            )
            .await;
        }
    }
    ctx.metrics.preempted(band, choice.victims.len());
    ctx.event(
        rec.bundle,
        EventType::Normal,
        "PreemptedBronze",
        "Preempt",
        format!(
            "replica {} ({band}) found no capacity and no hot spare: stopped bronze job(s) {} on node {} to make room",
            rec.replica,
            choice.victims.join(", "),
            choice.node_id
        ),
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_recovering_band_is_the_most_important_of_the_jobs_placed() {
        let spec: api::BundleSpec = serde_json::from_value(serde_json::json!({
            "replicas": 1, "pools": ["p"],
            "jobs": [
                {"jobName": "a", "requirements": {"requiredCapacity": 1, "priorityBand": "bronze"}},
                {"jobName": "b", "requirements": {"requiredCapacity": 1, "priorityBand": "silver"}},
                {"jobName": "c", "requirements": {"requiredCapacity": 1, "priorityBand": "gold"}}
            ]
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        let names = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            recovering_band(&spec, &names(&["a", "b"])),
            Some(PriorityBand::Silver)
        );
        assert_eq!(
            recovering_band(&spec, &names(&["a", "b", "c"])),
            Some(PriorityBand::Gold)
        );
        assert_eq!(recovering_band(&spec, &names(&["x"])), None);
    }
}
