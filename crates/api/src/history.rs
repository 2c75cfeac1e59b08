//! `PlacementHistory`: the recent placement decisions of one Bundle, kept by the apiserver.
//!
//! Why an object of its own and not more of the Bundle's status: the full trace of a decision is
//! kilobytes, and a Bundle's status is read by everything that watches Bundles (the operator's
//! own cache at 10k bundles, GitOps tools, `kubectl get -w`) and rewritten at every change of
//! a job's state. A history object is written only when a decision is made, read only by
//! whoever asks (`kubectl automanager trace`), and never cached by the operator. It has the
//! Bundle's name and namespace and an ownerReference to it, so Kubernetes' garbage collector
//! deletes it with the Bundle (the operator deletes it too when it cleans a Bundle up).
//!
//! Its size is bounded whatever the cluster: per replica (at most 16) the last
//! [`MAX_DECISIONS_PER_REPLICA`] decisions as one-line summaries of bounded fields, and the
//! engine's full trace of the newest one cut to at most [`MAX_TRACE_BYTES`] of JSON, with a
//! [`TraceTruncation`] marker saying what was left out when it had to be cut.
//!
//! Like a Lease it is a record the operator writes, not a request: its content is in `spec`,
//! it has no status, and people only read it.

use chrono::{DateTime, Utc};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::trace::{PlacementOutcome, Preemption};

/// Most decisions kept per replica (the newest; older ones are dropped first).
pub const MAX_DECISIONS_PER_REPLICA: usize = 5;
/// Largest full trace kept, as compact JSON. A larger one is cut (see [`bound_trace`]).
pub const MAX_TRACE_BYTES: usize = 16 * 1024;
/// Most nodes or pools named in one [`DecisionRecord`].
pub const MAX_NAMED: usize = 16;
/// Longest [`DecisionRecord::reason`].
pub const MAX_REASON: usize = 512;

/// The schema of the engine's full trace: a JSON object kept as the operator wrote it (the
/// placement engine's `Decision`; the plugin reads it with the same engine types).
fn decision_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "description": "The placement engine's full decision as JSON (outcome, pools tried with the candidates rejected per reason, the node chosen per job and why), as `kubectl automanager trace` renders it. Written by the operator; at most 16 KiB (see truncated).",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

/// The recent placement decisions of one Bundle: written by the operator when it decides, read
/// by `kubectl automanager trace`.
#[derive(CustomResource, JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "automanager.norsk.io",
    version = "v1alpha1",
    kind = "PlacementHistory",
    plural = "placementhistories",
    namespaced,
    shortname = "plh",
    doc = "The recent placement decisions of one Bundle (same name and namespace, owned by it): the last few per replica, each with when and by which operator replica it was made, and the full trace of the newest. Written by the operator only when it decides; read by `kubectl automanager trace`.",
    printcolumn(name = "Bundle", type_ = "string", json_path = ".spec.bundle"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct PlacementHistorySpec {
    /// The Bundle these decisions are of (the object has its name).
    #[schemars(length(max = 253))]
    pub bundle: String,
    /// One entry per replica that has had a decision, by replica index.
    #[serde(default)]
    #[schemars(length(max = 16))]
    pub replicas: Vec<ReplicaHistory>,
}

/// The recent decisions of one replica.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaHistory {
    /// The replica index.
    pub replica: i32,
    /// The last decisions, oldest first (at most 5). A decision the same as the one before it
    /// (a replica still waiting for the same node, say) is not added again.
    #[serde(default)]
    #[schemars(length(max = 5))]
    pub decisions: Vec<DecisionRecord>,
    /// The full trace of the newest decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_trace: Option<FullTrace>,
}

/// One decision, summarised.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DecisionRecord {
    /// When the decision was made.
    pub decided_at: DateTime<Utc>,
    /// Which operator replica made it: the leader's identity (its Pod's name when run as a Pod).
    #[schemars(length(max = 253))]
    pub leader: String,
    /// `placed`, `provisioning` or `unplaceable`.
    pub outcome: PlacementOutcome,
    /// Whether it was a recovery placement (after a failure), which may use hot spares.
    #[serde(default)]
    pub recovery: bool,
    /// The nodes chosen (placed) or the node asked for (provisioning); at most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 253)))]
    pub nodes: Vec<String>,
    /// The pools the replica's jobs went to (or the pool grown); at most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 63)))]
    pub pools: Vec<String>,
    /// Why, in one sentence (the engine's message).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 512))]
    pub reason: String,
}

impl DecisionRecord {
    /// Whether `other` says the same as this one, whenever and by whomever it was made.
    pub fn same_decision(&self, other: &DecisionRecord) -> bool {
        self.outcome == other.outcome
            && self.recovery == other.recovery
            && self.nodes == other.nodes
            && self.pools == other.pools
            && self.reason == other.reason
    }
}

/// The full trace of one decision.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FullTrace {
    /// When the decision was made.
    pub decided_at: DateTime<Utc>,
    /// Which operator replica made it.
    #[schemars(length(max = 253))]
    pub leader: String,
    /// Whether it was a recovery placement.
    #[serde(default)]
    pub recovery: bool,
    /// The engine's decision; absent only when even its outline was over 16 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "decision_schema")]
    pub decision: Option<serde_json::Value>,
    /// Set when the decision was cut to fit: what was left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<TraceTruncation>,
    /// Bronze jobs stopped to make room for this recovery, when it had to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted: Option<Preemption>,
}

/// What was left out of a full trace too large to keep.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceTruncation {
    /// The size of the whole decision, in bytes of compact JSON.
    pub full_bytes: i64,
    /// `rejections` (the per-pool candidate counts were dropped) or `trace` (only the outcome
    /// and the engine's message were kept).
    #[schemars(length(max = 63))]
    pub dropped: String,
}

/// The engine's decision as JSON, cut to at most [`MAX_TRACE_BYTES`]: whole when it fits; else
/// without the per-pool rejection counts (the bulk of a large trace); else only its outcome
/// and message; else nothing. The marker says which, and the whole size.
pub fn bound_trace(
    decision: serde_json::Value,
) -> (Option<serde_json::Value>, Option<TraceTruncation>) {
    let size = |v: &serde_json::Value| serde_json::to_vec(v).map_or(usize::MAX, |b| b.len());
    let full = size(&decision);
    if full <= MAX_TRACE_BYTES {
        return (Some(decision), None);
    }
    let marker = |dropped: &str| TraceTruncation {
        full_bytes: i64::try_from(full).unwrap_or(i64::MAX),
        dropped: dropped.to_owned(),
    };
    let mut lean = decision.clone();
    strip_rejections(&mut lean);
    if size(&lean) <= MAX_TRACE_BYTES {
        return (Some(lean), Some(marker("rejections")));
    }
    let mut outline = serde_json::Map::new();
    for key in ["bundleId", "replicaIndex", "outcome"] {
        if let Some(v) = decision.get(key) {
            outline.insert(key.to_owned(), v.clone());
        }
    }
    let message = decision
        .pointer("/trace/message")
        .cloned()
        .unwrap_or_default();
    outline.insert(
        "trace".to_owned(),
        serde_json::json!({"pools": [], "brokenSoftRules": [], "message": message}),
    );
    let outline = serde_json::Value::Object(outline);
    if size(&outline) <= MAX_TRACE_BYTES {
        (Some(outline), Some(marker("trace")))
    } else {
        (None, Some(marker("trace")))
    }
}

/// Empties every `rejections` list of the trace's pools and of its per-job pools.
fn strip_rejections(decision: &mut serde_json::Value) {
    let Some(trace) = decision.get_mut("trace") else {
        return;
    };
    let clear = |pools: Option<&mut serde_json::Value>| {
        for p in pools.and_then(|p| p.as_array_mut()).into_iter().flatten() {
            if let Some(r) = p.get_mut("rejections") {
                *r = serde_json::Value::Array(Vec::new());
            }
        }
    };
    clear(trace.get_mut("pools"));
    for job in trace
        .get_mut("jobs")
        .and_then(|j| j.as_array_mut())
        .into_iter()
        .flatten()
    {
        clear(job.get_mut("poolsTried"));
    }
}

impl PlacementHistorySpec {
    /// Adds a decision of `replica` with its full trace; `false` when it says the same as the
    /// replica's last one (nothing to write). Keeps the newest [`MAX_DECISIONS_PER_REPLICA`].
    pub fn record(&mut self, replica: i32, decision: DecisionRecord, trace: FullTrace) -> bool {
        let at = match self.replicas.binary_search_by_key(&replica, |r| r.replica) {
            Ok(i) => i,
            Err(i) => {
                self.replicas.insert(
                    i,
                    ReplicaHistory {
                        replica,
                        ..ReplicaHistory::default()
                    },
                );
                i
            }
        };
        let r = &mut self.replicas[at];
        if r.decisions
            .last()
            .is_some_and(|l| l.same_decision(&decision))
        {
            return false;
        }
        r.decisions.push(decision);
        let over = r.decisions.len().saturating_sub(MAX_DECISIONS_PER_REPLICA);
        r.decisions.drain(..over);
        r.last_trace = Some(trace);
        true
    }

    /// The replicas `0..replicas` only (a bundle scaled down forgets the replicas it lost).
    pub fn keep_replicas(&mut self, replicas: i32) {
        self.replicas.retain(|r| r.replica < replicas);
    }
}

/// `names` bounded for a [`DecisionRecord`]: the first [`MAX_NAMED`], each at most `max` bytes.
pub fn bounded_names<'a>(names: impl IntoIterator<Item = &'a str>, max: usize) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        let n = crate::bounded::clip(n, max).into_owned();
        if !out.contains(&n) {
            out.push(n);
        }
        if out.len() == MAX_NAMED {
            break;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(node: &str, at: i64) -> DecisionRecord {
        DecisionRecord {
            decided_at: DateTime::from_timestamp(at, 0).unwrap_or_default(),
            leader: "automanager-0".into(),
            outcome: PlacementOutcome::Placed,
            recovery: false,
            nodes: vec![node.into()],
            pools: vec!["aws".into()],
            reason: "placed".into(),
        }
    }

    fn trace(at: i64) -> FullTrace {
        FullTrace {
            decided_at: DateTime::from_timestamp(at, 0).unwrap_or_default(),
            leader: "automanager-0".into(),
            recovery: false,
            decision: Some(serde_json::json!({"outcome": {"kind": "placed"}})),
            truncated: None,
            preempted: None,
        }
    }

    #[test]
    fn a_replica_keeps_only_its_newest_decisions_oldest_first() {
        let mut h = PlacementHistorySpec::default();
        for i in 0..8 {
            assert!(h.record(1, record(&format!("n{i}"), i), trace(i)));
        }
        let r = &h.replicas[0];
        assert_eq!(r.decisions.len(), MAX_DECISIONS_PER_REPLICA);
        let nodes: Vec<&str> = r.decisions.iter().map(|d| d.nodes[0].as_str()).collect();
        assert_eq!(nodes, ["n3", "n4", "n5", "n6", "n7"]);
        assert_eq!(
            r.last_trace.as_ref().map(|t| t.decided_at.timestamp()),
            Some(7)
        );
    }

    #[test]
    fn the_same_decision_again_is_not_recorded_whoever_makes_it() {
        let mut h = PlacementHistorySpec::default();
        assert!(h.record(0, record("n1", 1), trace(1)));
        let mut again = record("n1", 2);
        again.leader = "automanager-1".into();
        assert!(!h.record(0, again, trace(2)));
        assert_eq!(h.replicas[0].decisions.len(), 1);
        assert!(h.record(0, record("n2", 3), trace(3)));
    }

    #[test]
    fn replicas_are_kept_in_index_order_and_dropped_when_scaled_down() {
        let mut h = PlacementHistorySpec::default();
        h.record(2, record("a", 1), trace(1));
        h.record(0, record("b", 1), trace(1));
        h.record(1, record("c", 1), trace(1));
        let order: Vec<i32> = h.replicas.iter().map(|r| r.replica).collect();
        assert_eq!(order, [0, 1, 2]);
        h.keep_replicas(2);
        assert_eq!(h.replicas.len(), 2);
    }

    fn pool(i: usize, rejections: usize) -> serde_json::Value {
        serde_json::json!({
            "pool": format!("pool-{i}"),
            "outcome": "left",
            "reason": "noNodeFits",
            "failedJob": "encode",
            "rejections": (0..rejections).map(|k| serde_json::json!({"reason": format!("reason-with-a-long-name-{k}"), "count": k})).collect::<Vec<_>>(),
        })
    }

    #[test]
    fn a_small_trace_is_kept_whole() {
        let d = serde_json::json!({"outcome": {"kind": "placed"}, "trace": {"pools": [pool(0, 3)], "message": "ok"}});
        let (kept, marker) = bound_trace(d.clone());
        assert_eq!(kept, Some(d));
        assert_eq!(marker, None);
    }

    #[test]
    fn a_large_trace_loses_its_rejection_counts_first_and_says_so() {
        let pools: Vec<_> = (0..16).map(|i| pool(i, 300)).collect();
        let d = serde_json::json!({"outcome": {"kind": "unplaceable", "jobs": []}, "trace": {"pools": pools, "message": "no pool"}});
        let full = serde_json::to_vec(&d).map(|b| b.len()).unwrap_or(0);
        assert!(full > MAX_TRACE_BYTES);
        let (kept, marker) = bound_trace(d);
        let kept = kept.expect("the pools without their counts fit");
        assert!(
            serde_json::to_vec(&kept)
                .map(|b| b.len())
                .unwrap_or(usize::MAX)
                <= MAX_TRACE_BYTES
        );
        assert_eq!(kept["trace"]["pools"][15]["pool"], "pool-15");
        assert_eq!(
            kept["trace"]["pools"][15]["rejections"],
            serde_json::json!([])
        );
        let marker = marker.expect("a marker");
        assert_eq!(marker.dropped, "rejections");
        assert_eq!(marker.full_bytes, i64::try_from(full).unwrap_or(0));
    }

    #[test]
    fn a_huge_trace_keeps_its_outcome_and_message() {
        let jobs: Vec<_> = (0..4000)
            .map(|i| serde_json::json!({"jobName": format!("job-{i}"), "reason": {"kind": "noUsablePool"}}))
            .collect();
        let d = serde_json::json!({"bundleId": "ns.b", "replicaIndex": 0, "outcome": {"kind": "unplaceable", "jobs": jobs}, "trace": {"pools": [], "message": "why"}});
        let (kept, marker) = bound_trace(d);
        assert_eq!(kept, None, "even the outcome is too large");
        assert_eq!(marker.map(|m| m.dropped), Some("trace".to_owned()));
        let d = serde_json::json!({"bundleId": "ns.b", "outcome": {"kind": "placed"}, "trace": {"pools": [], "message": "why", "jobs": (0..4000).map(|i| serde_json::json!({"jobName": format!("j{i}"), "pool": "p", "poolsTried": []})).collect::<Vec<_>>()}});
        let (kept, marker) = bound_trace(d);
        let kept = kept.expect("the outline fits");
        assert_eq!(kept["trace"]["message"], "why");
        assert_eq!(kept["outcome"]["kind"], "placed");
        assert_eq!(marker.map(|m| m.dropped), Some("trace".to_owned()));
    }

    #[test]
    fn a_history_reads_back_as_written() {
        let mut h = PlacementHistorySpec {
            bundle: "b".into(),
            replicas: Vec::new(),
        };
        h.record(0, record("n1", 1), trace(1));
        let obj = PlacementHistory::new("b", h);
        let json = serde_json::to_string(&obj).expect("serialises");
        assert!(json.contains("\"decidedAt\""), "{json}");
        assert!(json.contains("\"lastTrace\""), "{json}");
        let back: PlacementHistory = serde_json::from_str(&json).expect("reads back");
        assert_eq!(back.spec, obj.spec);
    }

    /// What one history costs: a typical one (two replicas, each placed and recovered once,
    /// full traces of a few hundred bytes) and the largest the bounds allow, which etcd's
    /// 1.5 MiB object limit must hold.
    #[test]
    fn a_history_is_small_and_its_largest_fits_in_one_object() {
        let mut typical = PlacementHistorySpec {
            bundle: "news-1".into(),
            replicas: Vec::new(),
        };
        let decision = serde_json::json!({"bundleId": "video.news-1", "replicaIndex": 0,
            "outcome": {"kind": "placed", "pool": "aws-east", "assignments": [{"jobName": "enc", "node": "aws-east-7f3a", "zone": "us-east-1a", "nodePending": false, "capacity": 8.0, "cores": 2, "score": {"tier": "node", "freeCapacityAfter": 24.0, "freeCoresAfter": 6}}]},
            "trace": {"pools": [{"pool": "aws-east", "outcome": "placed", "reason": null, "failedJob": null, "rejections": []}], "brokenSoftRules": [], "message": "placed 1 job(s) in pool aws-east on aws-east-7f3a"}});
        for r in 0..2 {
            for (i, recovery) in [(0, false), (1, true)] {
                let mut rec = record(&format!("aws-east-{r}{i}"), i);
                rec.recovery = recovery;
                rec.leader = "automanager-6c9d8f7b5-x2x4z".into();
                rec.reason = "placed 1 job(s) in pool aws-east on aws-east-7f3a".into();
                let mut t = trace(i);
                t.decision = Some(decision.clone());
                typical.record(r, rec, t);
            }
        }
        let bytes = |h: &PlacementHistorySpec| {
            serde_json::to_vec(&PlacementHistory::new(&h.bundle, h.clone())).map_or(0, |b| b.len())
        };
        let typical = bytes(&typical);
        let long = |n: usize| "x".repeat(n);
        let full_record = DecisionRecord {
            decided_at: DateTime::from_timestamp(1, 0).unwrap_or_default(),
            leader: long(253),
            outcome: PlacementOutcome::Unplaceable,
            recovery: true,
            nodes: (0..16).map(|i| format!("{i:02}{}", long(251))).collect(),
            pools: (0..16).map(|i| format!("{i:02}{}", long(61))).collect(),
            reason: long(MAX_REASON),
        };
        let mut largest = PlacementHistorySpec {
            bundle: long(253),
            replicas: Vec::new(),
        };
        for r in 0..16 {
            for i in 0..MAX_DECISIONS_PER_REPLICA {
                let mut rec = full_record.clone();
                rec.reason = format!("{i}{}", long(MAX_REASON - 1));
                let t = FullTrace {
                    decided_at: rec.decided_at,
                    leader: long(253),
                    recovery: true,
                    decision: Some(serde_json::json!({"pad": long(MAX_TRACE_BYTES - 10)})),
                    truncated: Some(TraceTruncation {
                        full_bytes: i64::MAX,
                        dropped: "rejections".into(),
                    }),
                    preempted: Some(Preemption {
                        at: rec.decided_at,
                        node: long(253),
                        victims: (0..16).map(|_| long(512)).collect(),
                    }),
                };
                largest.record(r, rec, t);
            }
        }
        let largest = bytes(&largest);
        println!("placement-history-bytes typical={typical} largest={largest}");
        assert!(typical < 4 * 1024, "{typical}");
        assert!(largest < 1024 * 1024, "{largest}");
    }

    #[test]
    fn names_are_bounded_in_count_and_length_without_repeats() {
        let long = "x".repeat(300);
        let many: Vec<String> = (0..40).map(|i| format!("n{i}")).collect();
        let names = bounded_names(
            std::iter::once(long.as_str())
                .chain(std::iter::once("n0"))
                .chain(many.iter().map(String::as_str)),
            253,
        );
        assert_eq!(names.len(), MAX_NAMED);
        assert!(names[0].len() <= 253);
        assert_eq!(names.iter().filter(|n| *n == "n0").count(), 1);
    }
}
