//! The bundle's PlacementHistory ([`api::PlacementHistory`]): the decisions a pass made, added
//! to the object the apiserver keeps for the bundle, so `kubectl automanager trace` shows them
//! after a restart or a failover, from any replica, without the operator's debugging port.
//!
//! Written only when a replica's decision differs from the last one written for it (a
//! replica waiting for the same node decides the same every pass: no read, no write), by
//! server-side apply through the operator's fenced client, conditional on the version read,
//! so a replica that lost the lease writes nothing and two writers never lose an entry. The
//! operator does not watch these objects (at 10k bundles that would be their whole size in
//! memory): it reads one back only when it has something new for it.

use automanager_api::{self as api, Bundle, PlacementHistory, PlacementHistorySpec};
use automanager_placement as pl;
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};

use crate::controllers::{Context, Error, LastDecision, ns_name};

/// Adds the decisions of `bundle`'s replicas its history does not hold yet. A failure is
/// logged and the decisions stay to be written by a later pass: the history is for people,
/// and never holds up a placement.
pub(super) async fn write(ctx: &Context, bundle: &Bundle) {
    if let Err(e) = try_write(ctx, bundle).await {
        tracing::warn!(bundle = %bundle.metadata.name.as_deref().unwrap_or_default(), error = %e, "could not write the placement history");
    }
}

async fn try_write(ctx: &Context, bundle: &Bundle) -> Result<(), Error> {
    let (ns, name) = ns_name(bundle)?;
    let key = (ns.clone(), name.clone());
    let pending = ctx.state().bundles().history_unwritten(&key);
    if pending.is_empty() {
        return Ok(());
    }
    let mut new = Vec::new();
    for (r, last, written) in pending {
        let (record, trace) = entry(&last, &ctx.identity);
        if written.is_some_and(|w| w.same_decision(&record)) {
            ctx.state()
                .bundles_mut()
                .history_written(&key, r, last.at, record);
        } else {
            new.push((r, last.at, record, trace));
        }
    }
    if new.is_empty() {
        return Ok(());
    }
    let api: Api<PlacementHistory> = Api::namespaced(ctx.client.clone(), &ns);
    let current = api.get_opt(&name).await?;
    let version = current
        .as_ref()
        .and_then(|h| h.metadata.resource_version.clone());
    let mut spec = current
        .map(|h| h.spec)
        .unwrap_or_else(|| PlacementHistorySpec {
            bundle: name.clone(),
            replicas: Vec::new(),
        });
    let mut changed = false;
    for (r, _, record, trace) in &new {
        let r = i32::try_from(*r).unwrap_or(i32::MAX);
        changed |= spec.record(r, record.clone(), trace.clone());
    }
    spec.keep_replicas(bundle.spec.replicas);
    if changed {
        apply(&api, bundle, &name, version.as_deref(), &spec).await?;
        tracing::debug!(bundle = %name, namespace = %ns, replicas = new.len(), "placement history written");
    }
    let mut state = ctx.state();
    for (r, at, record, _) in new {
        state.bundles_mut().history_written(&key, r, at, record);
    }
    Ok(())
}

/// Server-side apply of the whole history, owned by the bundle (garbage-collected with it),
/// conditional on `version` when there was one.
async fn apply(
    api: &Api<PlacementHistory>,
    bundle: &Bundle,
    name: &str,
    version: Option<&str>,
    spec: &PlacementHistorySpec,
) -> Result<(), Error> {
    let mut metadata = serde_json::json!({
        "name": name,
        "ownerReferences": bundle.controller_owner_ref(&()).into_iter().collect::<Vec<_>>(),
    });
    if let Some(v) = version {
        metadata["resourceVersion"] = serde_json::Value::String(v.to_owned());
    }
    let patch = serde_json::json!({
        "apiVersion": PlacementHistory::api_version(&()),
        "kind": PlacementHistory::kind(&()),
        "metadata": metadata,
        "spec": spec,
    });
    let params = PatchParams::apply(api::FIELD_MANAGER).force();
    api.patch(name, &params, &Patch::Apply(&patch)).await?;
    Ok(())
}

/// Deletes `bundle`'s history (the garbage collector would, where one runs); a missing one is
/// no error.
pub(super) async fn delete(ctx: &Context, ns: &str, name: &str) {
    let api: Api<PlacementHistory> = Api::namespaced(ctx.client.clone(), ns);
    match api.delete(name, &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            tracing::warn!(bundle = %name, namespace = %ns, error = %e, "could not delete the placement history")
        }
    }
}

/// One decision as the history keeps it: the summary, and the full trace (bounded).
pub fn entry(last: &LastDecision, leader: &str) -> (api::DecisionRecord, api::FullTrace) {
    let d = &last.decision;
    let (outcome, nodes, pools): (_, Vec<&str>, Vec<&str>) = match &d.outcome {
        pl::Outcome::Placed { pool, assignments } => {
            let mut pools = Vec::new();
            for a in assignments {
                pools.push(d.pool_of(&a.job_name).unwrap_or(pool.as_str()));
            }
            if pools.is_empty() {
                pools.push(pool.as_str());
            }
            let nodes = assignments.iter().map(|a| a.node.as_str()).collect();
            (api::PlacementOutcome::Placed, nodes, pools)
        }
        pl::Outcome::Provision { pool, .. } => (
            api::PlacementOutcome::Provisioning,
            Vec::new(),
            vec![pool.as_str()],
        ),
        pl::Outcome::Unplaceable { .. } => {
            (api::PlacementOutcome::Unplaceable, Vec::new(), Vec::new())
        }
    };
    let leader = api::bounded::clip(leader, 253).into_owned();
    let record = api::DecisionRecord {
        decided_at: last.at,
        leader: leader.clone(),
        outcome,
        recovery: last.recovery,
        nodes: api::bounded_names(nodes, 253),
        pools: api::bounded_names(pools, 63),
        reason: api::bounded::clip(&d.trace.message, api::MAX_REASON).into_owned(),
    };
    let (decision, truncated) = api::bound_trace(serde_json::to_value(d).unwrap_or_default());
    let trace = api::FullTrace {
        decided_at: last.at,
        leader,
        recovery: last.recovery,
        decision,
        truncated,
        preempted: last.preempted.clone(),
    };
    (record, trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last(outcome: pl::Outcome) -> LastDecision {
        LastDecision {
            decision: pl::Decision {
                bundle_id: "ns.b".into(),
                replica_index: 0,
                outcome,
                trace: pl::Trace {
                    message: "why".into(),
                    ..pl::Trace::default()
                },
            },
            recovery: true,
            at: chrono::DateTime::UNIX_EPOCH,
            preempted: None,
        }
    }

    fn assignment(job: &str, node: &str) -> pl::Assignment {
        pl::Assignment {
            job_name: job.into(),
            node: node.into(),
            zone: None,
            node_pending: false,
            capacity: 1.0,
            cores: 1,
            score: pl::NodeScore {
                tier: pl::Tier::Node,
                free_capacity_after: 0.0,
                free_cores_after: 0,
            },
        }
    }

    #[test]
    fn a_placement_names_its_nodes_and_pool_once_and_says_who_decided() {
        let (record, trace) = entry(
            &last(pl::Outcome::Placed {
                pool: "onprem".into(),
                assignments: vec![assignment("enc", "n1"), assignment("pkg", "n1")],
            }),
            "automanager-0",
        );
        assert_eq!(record.outcome, api::PlacementOutcome::Placed);
        assert_eq!(record.nodes, ["n1"]);
        assert_eq!(record.pools, ["onprem"]);
        assert_eq!(
            (record.leader.as_str(), record.reason.as_str()),
            ("automanager-0", "why")
        );
        assert!(record.recovery && trace.recovery);
        let kept: pl::Decision =
            serde_json::from_value(trace.decision.expect("kept whole")).expect("reads back");
        assert_eq!(kept.trace.message, "why");
        assert_eq!(trace.truncated, None);
    }

    #[test]
    fn a_provision_names_its_pool_and_an_unplaceable_decision_nothing() {
        let (record, _) = entry(
            &last(pl::Outcome::Provision {
                pool: "aws".into(),
                instance_type: "m5".into(),
                zone: None,
            }),
            "l",
        );
        assert_eq!(record.outcome, api::PlacementOutcome::Provisioning);
        assert_eq!(
            (record.nodes.len(), record.pools.as_slice()),
            (0, &["aws".to_owned()][..])
        );
        let (record, _) = entry(&last(pl::Outcome::Unplaceable { jobs: Vec::new() }), "l");
        assert_eq!(record.outcome, api::PlacementOutcome::Unplaceable);
        assert!(record.nodes.is_empty() && record.pools.is_empty());
    }
}
