//! The objects and patches the write commands send: exactly what a person would write with
//! `kubectl patch`, `kubectl annotate` or `kubectl create -f`, so the plugin adds no behaviour of
//! its own. Also how `--wait` reads progress from those objects. Pure.

use automanager_api as api;
use serde_json::{Value, json};

/// `kubectl patch managernode NODE --type merge -p '{"spec":{"cordoned":true}}'`.
pub fn cordon_patch(cordoned: bool) -> Value {
    json!({"spec": {"cordoned": cordoned}})
}

/// `kubectl patch managernode NODE --type merge -p '{"spec":{"drain":{"mode":"migrate"}}}'`.
pub fn drain_patch(mode: api::DrainMode) -> Value {
    json!({"spec": {"drain": {"mode": mode}}})
}

/// `kubectl patch migration NAME --type merge -p '{"spec":{"abort":{"reason":"..."}}}'`.
pub fn abort_patch(reason: &str) -> Value {
    json!({"spec": {"abort": {"reason": reason}}})
}

/// `kubectl annotate --overwrite bundle NAME automanager.norsk.io/retry=VALUE`.
pub fn retry_patch(value: &str) -> Value {
    json!({"metadata": {"annotations": {api::RETRY_ANNOTATION: value}}})
}

/// The bundles (`namespace/name`) whose status says a job of theirs runs on Manager's node
/// `node_id`, sorted. The operator mirrors a node into its ManagerNode a moment after Manager
/// reports it, so a node a bundle already names may not have its object yet.
pub fn bundles_naming(bundles: &[api::Bundle], node_id: &str) -> Vec<String> {
    let mut names: Vec<String> = bundles
        .iter()
        .filter(|b| {
            b.status.as_ref().is_some_and(|s| {
                s.replicas
                    .iter()
                    .flat_map(|r| &r.jobs)
                    .any(|j| j.node_id.as_deref() == Some(node_id))
            })
        })
        .map(|b| {
            format!(
                "{}/{}",
                b.metadata.namespace.as_deref().unwrap_or_default(),
                b.metadata.name.as_deref().unwrap_or_default()
            )
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A job of a bundle: `BUNDLE/REPLICA/JOB`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRef {
    pub bundle: String,
    pub replica: i32,
    pub job: String,
}

/// Parses `BUNDLE/REPLICA/JOB` (the bundle in the command's namespace).
pub fn parse_job_ref(text: &str) -> Result<JobRef, String> {
    let usage = || {
        format!(
            "{text:?} is not BUNDLE/REPLICA/JOB (for example news-1/0/encode; the bundle is in --namespace)"
        )
    };
    let parts: Vec<&str> = text.split('/').collect();
    let [bundle, replica, job] = parts.as_slice() else {
        return Err(usage());
    };
    if bundle.is_empty() || job.is_empty() {
        return Err(usage());
    }
    let replica: i32 = replica
        .parse()
        .ok()
        .filter(|r| (0..api::MAX_REPLICAS).contains(r))
        .ok_or_else(|| {
            format!(
                "replica {replica:?} in {text:?} is not a replica index (0 to {})",
                api::MAX_REPLICAS - 1
            )
        })?;
    Ok(JobRef {
        bundle: (*bundle).to_owned(),
        replica,
        job: (*job).to_owned(),
    })
}

/// A Migration for `job`, named `<bundle>-<replica>-<job>-<random>` by the apiserver.
pub fn migration(
    namespace: &str,
    job: &JobRef,
    target: Option<&str>,
    strategy: Option<api::MigrationStrategy>,
) -> api::Migration {
    let mut prefix = format!("{}-{}-{}", job.bundle, job.replica, job.job);
    // generateName leaves room for its 5 random characters within 253.
    prefix.truncate(200);
    let prefix = format!("{}-", prefix.trim_end_matches(['-', '.']));
    let mut m = api::Migration::new(
        "",
        api::MigrationSpec {
            job: api::MigrationJobRef {
                bundle: job.bundle.clone(),
                replica: job.replica,
                job_name: job.job.clone(),
            },
            target_node: target.map(str::to_owned),
            strategy,
            abort: None,
        },
    );
    m.metadata.name = None;
    m.metadata.generate_name = Some(prefix);
    m.metadata.namespace = Some(namespace.to_owned());
    m
}

/// How a watched object stands, for `--wait`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// New permanent lines since the last look.
    pub events: Vec<String>,
    /// The current state, one line.
    pub status: String,
    /// `Some(true)` finished well, `Some(false)` finished badly, `None` still going.
    pub done: Option<bool>,
    /// Why it finished badly.
    pub failure: Option<String>,
}

/// Progress of a Migration: each phase entered is an event (`seen` counts those reported).
pub fn migration_step(m: &api::Migration, seen: &mut usize) -> Step {
    let s = m.status.clone().unwrap_or_default();
    let mut events = Vec::new();
    for p in s.phases.iter().skip(*seen) {
        events.push(format!(
            "phase {:?} at {}",
            p.phase,
            p.entered_at.format("%H:%M:%S%.3f")
        ));
    }
    *seen = (*seen).max(s.phases.len());
    let target = s
        .target_node
        .as_deref()
        .map(|t| format!(" → {t}"))
        .unwrap_or_default();
    let source = s.source_node.as_deref().unwrap_or("?");
    let strategy = s
        .strategy
        .map(|x| x.as_str())
        .unwrap_or("(strategy pending)");
    let status = format!(
        "migration {}: {:?} · {strategy} · {source}{target}",
        m.metadata.name.as_deref().unwrap_or(""),
        s.phase
    );
    use api::MigrationPhase as P;
    let (done, failure) = match s.phase {
        P::Completed => (Some(true), None),
        P::Aborted | P::Refused | P::Rejected | P::Failed => {
            let why = s
                .abort
                .as_ref()
                .map(|a| format!("{} by {} in {:?}", a.reason, a.by, a.phase))
                .or_else(|| {
                    ["Rejected", "Aborted", "Ready"].iter().find_map(|t| {
                        api::find_condition(&s.conditions, t)
                            .filter(|c| !c.message.is_empty())
                            .map(|c| format!("{}: {}", c.reason, c.message))
                    })
                })
                .unwrap_or_default();
            (Some(false), Some(format!("{:?}: {why}", s.phase)))
        }
        _ => (None, None),
    };
    Step {
        events,
        status,
        done,
        failure,
    }
}

/// Progress of a drain, from the ManagerNode (`None`: the object is gone, so is the node).
pub fn drain_step(node: Option<&api::ManagerNode>, last: &mut Option<String>) -> Step {
    let Some(n) = node else {
        return Step {
            events: vec!["the ManagerNode is gone: the node was terminated".into()],
            status: "drained".into(),
            done: Some(true),
            failure: None,
        };
    };
    let s = n.status.clone().unwrap_or_default();
    let name = n.metadata.name.as_deref().unwrap_or("");
    let counts = s.drain.as_ref().map(|d| {
        format!(
            "{} job{} left · {} migrated · {} recovered · {} dropped",
            d.jobs_remaining,
            if d.jobs_remaining == 1 { "" } else { "s" },
            d.jobs_migrated,
            d.jobs_recovered,
            d.jobs_dropped
        )
    });
    let status = format!(
        "draining {name}: {} · node {:?}",
        counts
            .clone()
            .unwrap_or_else(|| "waiting for the operator to start".into()),
        s.state
    );
    let mut events = Vec::new();
    if let Some(c) = &counts
        && last.as_ref() != Some(c)
    {
        events.push(c.clone());
        *last = Some(c.clone());
    }
    let finished = s.drain.as_ref().is_some_and(|d| d.completed_at.is_some())
        || matches!(
            s.state,
            api::NodeState::Stopped | api::NodeState::Terminated
        );
    Step {
        events,
        status,
        done: finished.then_some(true),
        failure: None,
    }
}

/// Progress of a retried Bundle: done once the operator took the retry in and the bundle is
/// no longer Broken (Ready, or Degraded with its reason).
pub fn retry_step(b: &api::Bundle, value: &str, last: &mut Option<String>) -> Step {
    let s = b.status.clone().unwrap_or_default();
    let taken = s.last_retry.as_deref() == Some(value);
    let phase = format!("{:?}", s.phase);
    let mut events = Vec::new();
    if last.as_deref() != Some(phase.as_str()) {
        events.push(format!("phase {phase}"));
        *last = Some(phase.clone());
    }
    let status = format!(
        "bundle {}: {phase} · {}/{} replicas placed{}",
        b.metadata.name.as_deref().unwrap_or(""),
        s.placed_replicas,
        b.spec.replicas,
        if taken { "" } else { " · retry not seen yet" }
    );
    let done = match (taken, s.phase) {
        (true, api::BundlePhase::Ready) => Some(true),
        (true, api::BundlePhase::Broken) => Some(false),
        _ => None,
    };
    let failure = (done == Some(false)).then(|| {
        api::find_condition(&s.conditions, "Broken")
            .map(|c| format!("Broken again: {}", c.message))
            .unwrap_or_else(|| "Broken again".into())
    });
    Step {
        events,
        status,
        done,
        failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    #[test]
    fn job_refs_parse_and_refuse_clearly() {
        assert_eq!(
            parse_job_ref("news-1/0/encode"),
            Ok(JobRef {
                bundle: "news-1".into(),
                replica: 0,
                job: "encode".into()
            })
        );
        assert!(parse_job_ref("news-1/encode").is_err());
        assert!(parse_job_ref("news-1//encode").is_err());
        let e = parse_job_ref("news-1/99/encode").expect_err("out of range");
        assert!(e.contains("0 to 15"), "{e}");
        assert!(parse_job_ref("/0/encode").is_err());
    }

    #[test]
    fn a_node_is_expected_when_a_bundle_status_names_it() {
        let bundle = |ns: &str, name: &str, nodes: &[&str]| -> api::Bundle {
            serde_json::from_value(json!({
                "apiVersion": "automanager.norsk.io/v1alpha1", "kind": "Bundle",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": 1, "pools": ["p"],
                         "jobs": [{"jobName": "enc", "requirements": {"requiredCapacity": 1, "priorityBand": "gold"}}]},
                "status": {"replicas": [{"replica": 0, "jobs": nodes.iter().map(|n| json!(
                    {"jobName": "enc", "state": "running", "nodeId": n})).collect::<Vec<_>>()}]}
            }))
            .expect("bundle")
        };
        let bundles = [
            bundle("video", "b", &["onprem-a1"]),
            bundle("default", "a", &["onprem-b1", "onprem-a1"]),
            bundle("default", "c", &[]),
        ];
        assert_eq!(
            bundles_naming(&bundles, "onprem-a1"),
            ["default/a", "video/b"]
        );
        assert!(bundles_naming(&bundles, "no-such-node").is_empty());
    }

    #[test]
    fn a_migration_is_generated_from_its_job() {
        let j = parse_job_ref("news-1/1/encode").expect("ok");
        let m = migration(
            "video",
            &j,
            Some("aws-east-2"),
            Some(api::MigrationStrategy::Handover),
        );
        let v = serde_json::to_value(&m).expect("json");
        assert_eq!(v["metadata"]["generateName"], "news-1-1-encode-");
        assert_eq!(v["metadata"]["namespace"], "video");
        assert!(v["metadata"].get("name").is_none());
        assert_eq!(
            v["spec"],
            json!({"job": {"bundle": "news-1", "replica": 1, "jobName": "encode"},
                   "targetNode": "aws-east-2", "strategy": "handover"})
        );
    }

    #[test]
    fn patches_are_what_kubectl_would_send() {
        assert_eq!(cordon_patch(true), json!({"spec": {"cordoned": true}}));
        assert_eq!(
            drain_patch(api::DrainMode::Migrate),
            json!({"spec": {"drain": {"mode": "migrate"}}})
        );
        assert_eq!(
            retry_patch("1700000000"),
            json!({"metadata": {"annotations": {"automanager.norsk.io/retry": "1700000000"}}})
        );
        assert_eq!(
            abort_patch("maintenance"),
            json!({"spec": {"abort": {"reason": "maintenance"}}})
        );
    }

    #[test]
    fn migration_progress_reports_each_phase_once_and_ends() {
        let j = parse_job_ref("b/0/enc").expect("ok");
        let mut m = migration("ns", &j, None, None);
        m.metadata.name = Some("b-0-enc-x".into());
        let t = Utc
            .with_ymd_and_hms(2026, 1, 1, 10, 0, 0)
            .single()
            .expect("time");
        let phase = |p| api::PhaseTransition {
            phase: p,
            entered_at: t,
        };
        m.status = Some(api::MigrationStatus {
            phase: api::MigrationPhase::StartingTarget,
            phases: vec![
                phase(api::MigrationPhase::Pending),
                phase(api::MigrationPhase::StartingTarget),
            ],
            ..Default::default()
        });
        let mut seen = 0;
        let s = migration_step(&m, &mut seen);
        assert_eq!(s.events.len(), 2);
        assert_eq!(s.done, None);
        let s = migration_step(&m, &mut seen);
        assert!(s.events.is_empty());
        if let Some(st) = m.status.as_mut() {
            st.phase = api::MigrationPhase::Aborted;
            st.abort = Some(api::AbortInfo {
                reason: "source refused".into(),
                phase: api::MigrationPhase::StartingTarget,
                by: "source".into(),
                at: t,
            });
        }
        let s = migration_step(&m, &mut seen);
        assert_eq!(s.done, Some(false));
        assert_eq!(
            s.failure.as_deref(),
            Some("Aborted: source refused by source in StartingTarget")
        );
    }
}
