//! The bundle's PlacementHistory ([`api::PlacementHistory`]): the decisions a pass made, added
//! to the object the apiserver keeps for the bundle, so `kubectl automanager trace` shows them
//! after a restart or a failover, from any replica, without the operator's debugging port.
//!
//! Written by the [`super::history_writer`]'s task, off the Bundle's path and after the
//! Bundles' own writes; only when a replica's decision differs from the newest the history holds (a replica
//! waiting for the same node decides the same every pass: no read, no write), through the
//! operator's fenced client (a replica that lost the lease writes nothing), and always
//! conditional on the object being what the writer knows, so two writers never lose an entry.
//! One request per write, at 10k bundles every extra one slows every Bundle's way to Ready:
//!
//! - a Bundle never recorded before (no job's last placement in its status yet) gets its history
//!   created, with no read;
//! - a history this leader wrote last is patched with the new entries alone, conditional on
//!   the resourceVersion its write returned (its traces are not sent again);
//! - otherwise (the first write after start-up or a failover, or a create or patch refused
//!   because another writer was there) the object is read and written whole, conditional on
//!   the version read.
//!
//! The operator does not watch these objects (at 10k bundles that would be their whole size in
//! memory): it keeps per bundle only the version and each replica's newest summary.

use automanager_api::{self as api, PlacementHistory, PlacementHistorySpec};
use automanager_placement as pl;
use chrono::{DateTime, Utc};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde_json::{Value, json};

use super::history_writer::{BundleName, Target};
use crate::controllers::{Error, LastDecision};
use crate::state::{HistoryKnown, State};

/// A decision to add: its replica, when it was made, its summary and its full trace.
struct New {
    replica: u32,
    at: DateTime<Utc>,
    record: api::DecisionRecord,
    trace: api::FullTrace,
}

/// Adds the decisions of `bundle`'s replicas its history does not hold yet, as `leader` made
/// them (called by the [`super::history_writer`], off the Bundle's path). On a failure the
/// decisions stay in the bundle book, to be written by a later attempt: the history is for
/// people, and never holds up a placement.
pub(super) async fn write(
    client: &Client,
    state: &State,
    leader: &str,
    key: &BundleName,
    target: &Target,
) -> Result<(), Error> {
    let (ns, name) = key.clone();
    let (pending, known) = state.history_unwritten(key);
    if pending.is_empty() {
        return Ok(());
    }
    let replicas = target.replicas;
    let mut done = Vec::new();
    let mut new = Vec::new();
    for (r, last) in pending {
        let record = record(&last, leader);
        let said = (known.as_ref())
            .and_then(|k| k.newest(r))
            .is_some_and(|w| w.same_decision(&record));
        // A replica the bundle no longer has, or the decision the history's newest already
        // says: nothing to add (and no trace to build).
        if r >= replicas || said {
            done.push((r, last.at));
        } else {
            let trace = trace(&last, &record.leader);
            new.push(New {
                replica: r,
                at: last.at,
                record,
                trace,
            });
        }
    }
    let mut written = None;
    if !new.is_empty() {
        let api: Api<PlacementHistory> = Api::namespaced(client.clone(), &ns);
        match add(&api, target, &name, known.as_ref(), &new).await {
            Ok(w) => written = Some(w),
            Err(e) => {
                state.history_write_failed(key);
                return Err(e);
            }
        }
        tracing::debug!(bundle = %name, namespace = %ns, replicas = new.len(), "placement history written");
    }
    done.extend(new.iter().map(|n| (n.replica, n.at)));
    state.history_written(key, written, &done);
    Ok(())
}

/// Adds `new` to the history in one request when it can (see the module's doc), else reads it
/// and writes it whole; what the object holds after.
async fn add(
    api: &Api<PlacementHistory>,
    target: &Target,
    name: &str,
    known: Option<&HistoryKnown>,
    new: &[New],
) -> Result<HistoryKnown, Error> {
    let replicas = target.replicas;
    let written = if let Some((k, version)) = known.and_then(|k| Some((k, k.version.as_deref()?))) {
        let ops = patch_ops(k, version, new, replicas).map_err(kube::Error::SerdeError)?;
        let patch =
            Patch::Json::<()>(serde_json::from_value(ops).map_err(kube::Error::SerdeError)?);
        match api.patch(name, &PatchParams::default(), &patch).await {
            Ok(h) => Some(h),
            // The object is not what this leader wrote last (another writer, a deletion): the
            // patch changed nothing; read it.
            Err(kube::Error::Api(s)) => {
                tracing::debug!(bundle = %name, code = s.code, reason = %s.reason, "placement history changed since this leader wrote it; reading it");
                None
            }
            Err(e) => return Err(e.into()),
        }
    } else if target.first {
        match api
            .create(&PostParams::default(), &object(target, name, new))
            .await
        {
            Ok(h) => Some(h),
            // Written before (by a leader before this one): read it.
            Err(kube::Error::Api(s)) if s.code == 409 => None,
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };
    let h = match written {
        Some(h) => h,
        None => read_and_write(api, target, name, new).await?,
    };
    Ok(HistoryKnown::of(&h.spec, h.metadata.resource_version))
}

/// Reads the history and writes it whole with `new` added, conditional on the version read.
async fn read_and_write(
    api: &Api<PlacementHistory>,
    target: &Target,
    name: &str,
    new: &[New],
) -> Result<PlacementHistory, Error> {
    let current = api.get_opt(name).await?;
    if let Some(stale) = current.as_ref().filter(|h| of_an_earlier_bundle(h, target)) {
        // Left by an earlier Bundle of the same name (where no garbage collector runs, or
        // before it ran): its decisions are not this Bundle's, and an apply would add this
        // Bundle as a second controller beside the old one, which the apiserver refuses.
        tracing::info!(bundle = %name, "placement history of an earlier bundle of the same name replaced");
        let mut fresh = object(target, name, new);
        fresh.metadata.resource_version = stale.metadata.resource_version.clone();
        return Ok(api.replace(name, &PostParams::default(), &fresh).await?);
    }
    let version = current
        .as_ref()
        .and_then(|h| h.metadata.resource_version.clone());
    let mut spec = current
        .map(|h| h.spec)
        .unwrap_or_else(|| PlacementHistorySpec {
            bundle: name.to_owned(),
            replicas: Vec::new(),
        });
    add_to(&mut spec, new, target.replicas);
    apply(api, target, name, version.as_deref(), &spec).await
}

/// Whether `history` has a controller other than the bundle `target` writes for: a Bundle of
/// the same name deleted before it.
fn of_an_earlier_bundle(history: &PlacementHistory, target: &Target) -> bool {
    let Some(owner) = target.owner.as_ref() else {
        return false;
    };
    (history.metadata.owner_references.iter().flatten())
        .any(|r| r.controller == Some(true) && r.uid != owner.uid)
}

/// `spec` with `new` added and only the bundle's replicas kept.
fn add_to(spec: &mut PlacementHistorySpec, new: &[New], replicas: u32) {
    for n in new {
        let r = i32::try_from(n.replica).unwrap_or(i32::MAX);
        spec.record(r, n.record.clone(), n.trace.clone());
    }
    spec.keep_replicas(i32::try_from(replicas).unwrap_or(i32::MAX));
}

/// A new history of `new`, owned by the bundle (garbage-collected with it).
fn object(target: &Target, name: &str, new: &[New]) -> PlacementHistory {
    let mut spec = PlacementHistorySpec {
        bundle: name.to_owned(),
        replicas: Vec::new(),
    };
    add_to(&mut spec, new, target.replicas);
    let mut h = PlacementHistory::new(name, spec);
    h.metadata.owner_references = Some(target.owner.clone().into_iter().collect());
    h
}

/// The JSON patch (RFC 6902) that adds `new` to the history `known` describes: conditional on
/// its resourceVersion and on each replica entry it touches being where `known` says, it
/// drops the replicas the bundle no longer has, appends each new summary (dropping the oldest
/// past [`api::MAX_DECISIONS_PER_REPLICA`]) and sets the replica's newest trace. `new` in
/// replica order.
fn patch_ops(
    known: &HistoryKnown,
    version: &str,
    new: &[New],
    replicas: u32,
) -> Result<Value, serde_json::Error> {
    let test = |i: usize, replica: u32| json!({"op": "test", "path": format!("/spec/replicas/{i}/replica"), "value": replica});
    let mut ops =
        vec![json!({"op": "test", "path": "/metadata/resourceVersion", "value": version})];
    let mut entries: Vec<(u32, usize)> = known
        .replicas
        .iter()
        .map(|r| (r.replica, r.decisions))
        .collect();
    for i in (0..entries.len()).rev() {
        if entries[i].0 >= replicas {
            ops.push(test(i, entries[i].0));
            ops.push(json!({"op": "remove", "path": format!("/spec/replicas/{i}")}));
            entries.remove(i);
        }
    }
    for n in new {
        let record = serde_json::to_value(&n.record)?;
        let trace = serde_json::to_value(&n.trace)?;
        match entries.iter().position(|(r, _)| *r >= n.replica) {
            Some(i) if entries[i].0 == n.replica => {
                ops.push(test(i, n.replica));
                ops.push(json!({"op": "add", "path": format!("/spec/replicas/{i}/decisions/-"), "value": record}));
                if entries[i].1 >= api::MAX_DECISIONS_PER_REPLICA {
                    ops.push(
                        json!({"op": "remove", "path": format!("/spec/replicas/{i}/decisions/0")}),
                    );
                } else {
                    entries[i].1 += 1;
                }
                ops.push(json!({"op": "add", "path": format!("/spec/replicas/{i}/lastTrace"), "value": trace}));
            }
            at => {
                let i = at.unwrap_or(entries.len());
                let entry =
                    json!({"replica": n.replica, "decisions": [record], "lastTrace": trace});
                ops.push(
                    json!({"op": "add", "path": format!("/spec/replicas/{i}"), "value": entry}),
                );
                entries.insert(i, (n.replica, 1));
            }
        }
    }
    Ok(Value::Array(ops))
}

/// Server-side apply of the whole history, owned by the bundle (garbage-collected with it),
/// conditional on `version` when there was one.
async fn apply(
    api: &Api<PlacementHistory>,
    target: &Target,
    name: &str,
    version: Option<&str>,
    spec: &PlacementHistorySpec,
) -> Result<PlacementHistory, Error> {
    let mut metadata = serde_json::json!({
        "name": name,
        "ownerReferences": target.owner.iter().collect::<Vec<_>>(),
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
    Ok(api.patch(name, &params, &Patch::Apply(&patch)).await?)
}

/// Deletes `bundle`'s history (the garbage collector would, where one runs); a missing one is
/// no error. Called by [`super::history_writer::HistoryWriter::delete`], which first settles
/// the writes of it.
pub(super) async fn delete(client: &Client, (ns, name): &BundleName) {
    let api: Api<PlacementHistory> = Api::namespaced(client.clone(), ns);
    match api.delete(name, &Default::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            tracing::warn!(bundle = %name, namespace = %ns, error = %e, "could not delete the placement history")
        }
    }
}

/// One decision as the history summarises it.
pub fn record(last: &LastDecision, leader: &str) -> api::DecisionRecord {
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
    api::DecisionRecord {
        decided_at: last.at,
        leader: api::bounded::clip(leader, 253).into_owned(),
        outcome,
        recovery: last.recovery,
        nodes: api::bounded_names(nodes, 253),
        pools: api::bounded_names(pools, 63),
        reason: api::bounded::clip(&d.trace.message, api::MAX_REASON).into_owned(),
    }
}

/// One decision's full trace as the history keeps it (bounded); built only for a decision
/// that is written.
pub fn trace(last: &LastDecision, leader: &str) -> api::FullTrace {
    let (decision, truncated) =
        api::bound_trace(serde_json::to_value(&last.decision).unwrap_or_default());
    api::FullTrace {
        decided_at: last.at,
        leader: leader.to_owned(),
        recovery: last.recovery,
        decision,
        truncated,
        preempted: last.preempted.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned_by(
        uid: &str,
    ) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> {
        Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                api_version: "automanager.norsk.io/v1alpha1".into(),
                kind: "Bundle".into(),
                name: "news".into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            },
        )
    }

    #[test]
    fn a_history_controlled_by_another_bundle_of_the_name_is_an_earlier_ones() {
        let target = |uid: &str| Target {
            owner: owned_by(uid),
            replicas: 1,
            first: false,
        };
        let mut h = PlacementHistory::new("news", PlacementHistorySpec::default());
        h.metadata.owner_references = owned_by("old").map(|o| vec![o]);
        assert!(of_an_earlier_bundle(&h, &target("new")));
        assert!(!of_an_earlier_bundle(&h, &target("old")));
        // No owner to compare with, or a history no Bundle controls: nothing to replace.
        let unowned = Target {
            owner: None,
            ..target("new")
        };
        assert!(!of_an_earlier_bundle(&h, &unowned));
        h.metadata.owner_references = None;
        assert!(!of_an_earlier_bundle(&h, &target("new")));
    }

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
        let last = last(pl::Outcome::Placed {
            pool: "onprem".into(),
            assignments: vec![assignment("enc", "n1"), assignment("pkg", "n1")],
        });
        let (record, trace) = (
            record(&last, "automanager-0"),
            trace(&last, "automanager-0"),
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
        let record = super::record(
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
        let record = super::record(&last(pl::Outcome::Unplaceable { jobs: Vec::new() }), "l");
        assert_eq!(record.outcome, api::PlacementOutcome::Unplaceable);
        assert!(record.nodes.is_empty() && record.pools.is_empty());
    }

    fn new(replica: u32, node: &str, at: i64) -> New {
        let mut l = last(pl::Outcome::Placed {
            pool: "onprem".into(),
            assignments: vec![assignment("enc", node)],
        });
        l.at = DateTime::from_timestamp(at, 0).unwrap_or_default();
        New {
            replica,
            at: l.at,
            record: record(&l, "l"),
            trace: trace(&l, "l"),
        }
    }

    /// The stored object as JSON, at `version`.
    fn stored(spec: &PlacementHistorySpec, version: &str) -> Value {
        let mut h = PlacementHistory::new("b", spec.clone());
        h.metadata.resource_version = Some(version.into());
        serde_json::to_value(h).expect("serialises")
    }

    /// Applies `ops` as the apiserver would; `None` when a `test` fails (the apiserver refuses).
    fn patched(object: &Value, ops: Value) -> Option<PlacementHistorySpec> {
        let patch: json_patch::Patch = serde_json::from_value(ops).expect("a JSON patch");
        let mut object = object.clone();
        json_patch::patch(&mut object, &patch).ok()?;
        serde_json::from_value(object["spec"].clone()).ok()
    }

    #[test]
    fn the_patch_adds_what_reading_and_writing_the_whole_history_would() {
        // Replica 1 holds a full list and replica 3 a bundle scaled down to 3 no longer has;
        // replica 0 is new; replica 1 decides again.
        let mut spec = PlacementHistorySpec {
            bundle: "b".into(),
            replicas: Vec::new(),
        };
        add_to(&mut spec, &[new(3, "x", 1)], 4);
        for i in 0..api::MAX_DECISIONS_PER_REPLICA {
            add_to(&mut spec, &[new(1, &format!("n{i}"), i as i64 + 2)], 4);
        }
        let known = HistoryKnown::of(&spec, Some("41".into()));
        let object = stored(&spec, "41");
        let adding = [new(0, "a", 20), new(1, "b", 20)];

        let ops = patch_ops(&known, "41", &adding, 3).expect("ops");
        let by_patch = patched(&object, ops).expect("the patch applies");
        let mut whole = spec.clone();
        add_to(&mut whole, &adding, 3);
        assert_eq!(by_patch, whole);
        assert_eq!(
            whole.replicas.iter().map(|r| r.replica).collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!(
            whole.replicas[1].decisions.len(),
            api::MAX_DECISIONS_PER_REPLICA
        );
        assert_eq!(whole.replicas[1].decisions[4].nodes, ["b"]);
        assert_eq!(
            whole.replicas[1].last_trace.as_ref().map(|t| t.decided_at),
            Some(adding[1].at)
        );
    }

    #[test]
    fn the_patch_changes_nothing_unless_the_history_is_what_this_leader_wrote() {
        let mut spec = PlacementHistorySpec {
            bundle: "b".into(),
            replicas: Vec::new(),
        };
        add_to(&mut spec, &[new(0, "a", 1)], 2);
        let known = HistoryKnown::of(&spec, Some("41".into()));
        let ops = |k: &HistoryKnown| patch_ops(k, "41", &[new(1, "b", 2)], 2).expect("ops");

        // Another writer wrote since: a newer version.
        assert_eq!(patched(&stored(&spec, "42"), ops(&known)), None);
        // Same version, but this leader's picture of the entries is wrong.
        let mut wrong = known.clone();
        wrong.replicas[0].replica = 1;
        assert_eq!(patched(&stored(&spec, "41"), ops(&wrong)), None);
        // As known: it applies.
        assert!(patched(&stored(&spec, "41"), ops(&known)).is_some());
    }
}
