//! `trace` from a Bundle's PlacementHistory (what the apiserver keeps): per replica, its recent
//! decisions, each with when and by which operator replica it was made, then the newest one in
//! full, as the operator's own trace shows it.

use automanager_api as api;
use automanager_placement as pl;

use super::Tree;
use super::trace::{ReplicaTrace, TraceView, replica_tree};

/// The history narrowed to `view`'s replica. `Err` names what matched nothing.
pub fn filtered(
    history: &api::PlacementHistory,
    namespace: &str,
    view: &TraceView,
) -> Result<api::PlacementHistory, String> {
    let mut out = history.clone();
    if let Some(r) = view.replica {
        out.spec
            .replicas
            .retain(|h| u32::try_from(h.replica).ok() == Some(r));
        if out.spec.replicas.is_empty() {
            let known: Vec<String> = (history.spec.replicas.iter())
                .map(|h| h.replica.to_string())
                .collect();
            return Err(format!(
                "bundle {namespace}/{} has no decision for replica {r} (replicas with one: {})",
                history.spec.bundle,
                if known.is_empty() {
                    "none".into()
                } else {
                    known.join(", ")
                }
            ));
        }
    }
    Ok(out)
}

/// The newest decision of a replica as the full trace renders it, when its trace was kept
/// and reads as the engine's decision.
pub fn last_trace(h: &api::ReplicaHistory) -> Option<ReplicaTrace> {
    let t = h.last_trace.as_ref()?;
    let decision: pl::Decision = serde_json::from_value(t.decision.clone()?).ok()?;
    Some(ReplicaTrace {
        replica: u32::try_from(h.replica).ok()?,
        decided_at: Some(stamp(&t.decided_at)),
        leader: Some(t.leader.clone()),
        recovery: t.recovery,
        decision,
        preempted: t.preempted.clone(),
    })
}

fn stamp(at: &chrono::DateTime<chrono::Utc>) -> String {
    at.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// One summarised decision as a line.
pub fn decision_line(d: &api::DecisionRecord) -> String {
    let kind = if d.recovery {
        "recovery"
    } else {
        "first placement"
    };
    let what = match d.outcome {
        api::PlacementOutcome::Placed => format!(
            "placed on {} (pool {})",
            if d.nodes.is_empty() {
                "?".into()
            } else {
                d.nodes.join(", ")
            },
            d.pools.join(", ")
        ),
        api::PlacementOutcome::Provisioning => {
            format!("provisioning a node in {}", d.pools.join(", "))
        }
        api::PlacementOutcome::Unplaceable => "unplaceable".to_owned(),
    };
    let why = if d.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", d.reason)
    };
    format!(
        "{} by {} · {kind} · {what}{why}",
        stamp(&d.decided_at),
        d.leader
    )
}

/// The history as text. `job` narrows the full traces as `trace --job` does.
pub fn render(history: &api::PlacementHistory, namespace: &str, view: &TraceView) -> String {
    let name = &history.spec.bundle;
    let mut root = Tree::new(format!(
        "Bundle {namespace}/{name}: placement decisions, as the apiserver keeps them (PlacementHistory {namespace}/{name})"
    ));
    if history.spec.replicas.is_empty() {
        root = root.leaf("no placement decision yet");
    }
    for h in &history.spec.replicas {
        let mut node = Tree::new(format!("replica {}", h.replica));
        let mut list = Tree::new(format!(
            "last {} decision{}, oldest first",
            h.decisions.len(),
            if h.decisions.len() == 1 { "" } else { "s" }
        ));
        for d in &h.decisions {
            list = list.leaf(decision_line(d));
        }
        node = node.child(list);
        node = node.child(full_trace(h, view));
        root = root.child(node);
    }
    root.render()
}

/// The newest decision in full, narrowed to `view.job`, with the truncation marker if any.
fn full_trace(h: &api::ReplicaHistory, view: &TraceView) -> Tree {
    let mut full = Tree::new("the newest decision in full");
    let Some(kept) = h.last_trace.as_ref() else {
        return full.leaf("not kept");
    };
    if let Some(t) = &kept.truncated {
        full = full.leaf(format!(
            "cut to fit 16 KiB (the whole trace was {} bytes): {} left out",
            t.full_bytes,
            match t.dropped.as_str() {
                "rejections" => "the candidates rejected per pool were",
                _ => "all but the outcome and the engine's message was",
            }
        ));
    }
    match last_trace(h) {
        Some(mut t) => {
            if let Some(job) = &view.job {
                narrow_to_job(&mut t.decision, job);
            }
            full.child(replica_tree(&t, view))
        }
        None => full.leaf("not readable by this plugin (a newer operator's format?)"),
    }
}

/// Keeps only `job`'s assignment or reason (a provision is for the whole replica).
fn narrow_to_job(d: &mut pl::Decision, job: &str) {
    match &mut d.outcome {
        pl::Outcome::Placed { assignments, .. } => assignments.retain(|a| a.job_name == job),
        pl::Outcome::Unplaceable { jobs } => jobs.retain(|j| j.job_name == job),
        pl::Outcome::Provision { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::from_timestamp(s, 0).unwrap_or_default()
    }

    #[test]
    fn each_decision_says_when_and_by_which_leader() {
        let d = api::DecisionRecord {
            decided_at: at(1_800_000_000),
            leader: "automanager-7d9-abc".into(),
            outcome: api::PlacementOutcome::Placed,
            recovery: true,
            nodes: vec!["n2".into()],
            pools: vec!["onprem".into()],
            reason: "placed in onprem".into(),
        };
        let line = decision_line(&d);
        assert_eq!(
            line,
            "2027-01-15T08:00:00.000Z by automanager-7d9-abc · recovery · placed on n2 (pool onprem): placed in onprem"
        );
    }

    #[test]
    fn an_unreadable_or_cut_trace_is_said_so() {
        let mut spec = api::PlacementHistorySpec {
            bundle: "b".into(),
            replicas: Vec::new(),
        };
        spec.record(
            0,
            api::DecisionRecord {
                decided_at: at(1),
                leader: "l".into(),
                outcome: api::PlacementOutcome::Unplaceable,
                recovery: false,
                nodes: vec![],
                pools: vec![],
                reason: String::new(),
            },
            api::FullTrace {
                decided_at: at(1),
                leader: "l".into(),
                recovery: false,
                decision: None,
                truncated: Some(api::TraceTruncation {
                    full_bytes: 99_999,
                    dropped: "trace".into(),
                }),
                preempted: None,
            },
        );
        let h = api::PlacementHistory::new("b", spec);
        let text = render(&h, "ns", &TraceView::default());
        assert!(text.contains("the whole trace was 99999 bytes"), "{text}");
        assert!(text.contains("not readable"), "{text}");
        assert!(
            filtered(
                &h,
                "ns",
                &TraceView {
                    replica: Some(3),
                    ..TraceView::default()
                }
            )
            .is_err()
        );
    }
}
