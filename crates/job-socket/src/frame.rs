//! Frames: the JSON text messages of the job socket, and their parsing exactly as the reference's
//! `parseJobToWorkerFrame` / `parseWorkerToJobFrame` (zod 4.4.3 schemas) parse them.
//!
//! Parsing is `JSON.parse` ([`Json::parse`]) followed by a hand-written equivalent of the zod
//! schema: a discriminated union on `type`, each member a `z.object` that strips unknown keys and
//! builds its output in declaration order, `payload` a `z.json()` (any JSON without non-finite
//! numbers, `__proto__` keys dropped at every depth). Rejection reasons reproduce
//! `z.prettifyError`'s text — every issue as `✖ <message>` plus `\n  → at <path>`, issues stably
//! sorted by path length — after the reference's `invalid frame: ` prefix.

use crate::json::{JsObject, JsString, Json, ParseFlags};
use serde::{Deserialize, Serialize};

/// The reference's reason for a frame whose text is not JSON.
pub const NOT_JSON: &str = "frame is not valid JSON";
/// The prefix of every other rejection reason.
pub const INVALID_PREFIX: &str = "invalid frame: ";

/// A frame a job sends to its worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum JobToWorker {
    /// First frame on every connection: the token the worker gave the job.
    Hello {
        /// `NORSK_WORKER_TOKEN`.
        token: JsString,
    },
    /// The source accepts a `get-state`: its state for the target (`null` is a fine acceptance).
    State {
        /// Opaque to the worker.
        payload: Json,
    },
    /// The source declines a `get-state`; the migration ends with no target placed.
    StateRefused {
        /// Why, for people.
        reason: JsString,
    },
    /// The target has applied its initial state and is ready for cutover.
    TargetReady {
        /// Opaque; relayed to the source in `cutover-ready`.
        payload: Json,
    },
    /// The source has stopped its output; past the point of no return.
    SourceStoppedOutput {
        /// Opaque; relayed to the target in `cutover-apply`.
        payload: Json,
    },
    /// The target applied the handover, and what it applied.
    TargetApplied(TargetApplied),
    /// The job gives up on the migration in progress.
    Abort {
        /// Why, for people.
        reason: JsString,
    },
}

/// The summary in a `target-applied` frame; every field optional (older jobs send none).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetApplied {
    /// Participants applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<Vec<JsString>>,
    /// Participants that failed to apply (reported, not fatal: the source has already stopped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<Vec<FailedParticipant>>,
    /// Measured skew between source stop and target start, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skew_ms: Option<f64>,
}

/// One participant that failed to apply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedParticipant {
    /// Participant id.
    pub id: JsString,
    /// Why it failed.
    pub reason: JsString,
}

/// A frame a worker sends to a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "kebab-case",
    rename_all_fields = "camelCase"
)]
pub enum WorkerToJob {
    /// Answer to `hello`; carries the migration when the instance was launched as its target.
    HelloAck {
        /// Present only for a migration target.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        migration: Option<TargetOf>,
    },
    /// The propose, asked of the source.
    GetState {
        /// Migration id.
        migration_id: JsString,
    },
    /// The source's state, handed to the target right after `hello-ack`.
    InitialState {
        /// Migration id.
        migration_id: JsString,
        /// The source's `state` payload.
        payload: Json,
    },
    /// Tells the source the target is ready; the source stops output and answers.
    CutoverReady {
        /// Migration id.
        migration_id: JsString,
        /// The target's `target-ready` payload.
        payload: Json,
    },
    /// Tells the target to take over.
    CutoverApply {
        /// Migration id.
        migration_id: JsString,
        /// The source's `source-stopped-output` payload.
        payload: Json,
    },
    /// The migration is aborted.
    Abort {
        /// Migration id.
        migration_id: JsString,
        /// Why, for people.
        reason: JsString,
    },
}

/// `hello-ack.migration`: this instance is the target of migration `id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetOf {
    /// Migration id.
    pub id: JsString,
    /// Always `"target"`.
    pub side: TargetSide,
}

/// The only side a `hello-ack` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetSide {
    /// The migration target.
    Target,
}

/// A parse result, as the reference's `ParsedFrame<T>`.
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed<T> {
    /// The frame, with unknown keys dropped.
    Ok(T),
    /// `frame is not valid JSON`, or `invalid frame: …` naming the fields.
    Err(String),
}

impl<T> Parsed<T> {
    /// As a `Result`.
    pub fn into_result(self) -> Result<T, String> {
        match self {
            Parsed::Ok(t) => Ok(t),
            Parsed::Err(r) => Err(r),
        }
    }
}

/// What the worker does with a text frame from a job (`parseJobToWorkerFrame`).
pub fn parse_job_to_worker(text: &str) -> Parsed<JobToWorker> {
    parse_with(text, JOB_TO_WORKER_TYPES, job_to_worker_shape)
}

/// What the job does with a text frame from the worker (`parseWorkerToJobFrame`).
pub fn parse_worker_to_job(text: &str) -> Parsed<WorkerToJob> {
    parse_with(text, WORKER_TO_JOB_TYPES, worker_to_job_shape)
}

const JOB_TO_WORKER_TYPES: &[&str] = &[
    "hello",
    "state",
    "state-refused",
    "target-ready",
    "source-stopped-output",
    "target-applied",
    "abort",
];
const WORKER_TO_JOB_TYPES: &[&str] = &[
    "hello-ack",
    "get-state",
    "initial-state",
    "cutover-ready",
    "cutover-apply",
    "abort",
];

fn parse_with<T>(
    text: &str,
    types: &[&str],
    shape: fn(&str, &mut Fields, &mut Issues) -> Option<T>,
) -> Parsed<T> {
    let Ok((raw, flags)) = Json::parse_flagged(text) else {
        return Parsed::Err(NOT_JSON.to_owned());
    };
    let mut issues = Issues(Vec::new(), flags);
    let out = validate(raw, types, shape, &mut issues);
    match out {
        Some(t) if issues.0.is_empty() => Parsed::Ok(t),
        _ => Parsed::Err(format!("{INVALID_PREFIX}{}", issues.pretty())),
    }
}

fn validate<T>(
    mut raw: Json,
    types: &[&str],
    shape: fn(&str, &mut Fields, &mut Issues) -> Option<T>,
    issues: &mut Issues,
) -> Option<T> {
    let Json::Object(obj) = &mut raw else {
        issues.push(invalid_type("object", raw.js_type_name()), vec![]);
        return None;
    };
    let mut fields = Fields(std::mem::take(obj));
    let ty = match fields.peek("type") {
        Some(Json::String(s)) => s
            .as_str()
            .and_then(|s| types.iter().find(|t| **t == s))
            .copied(),
        _ => None,
    };
    let Some(ty) = ty else {
        let expected: Vec<String> = types.iter().map(|t| format!("'{t}'")).collect();
        issues.push(
            format!(
                "Invalid discriminator value. Expected {}",
                expected.join(" | ")
            ),
            vec![Seg::Key("type")],
        );
        return None;
    };
    shape(ty, &mut fields, issues)
}

fn job_to_worker_shape(ty: &str, f: &mut Fields, is: &mut Issues) -> Option<JobToWorker> {
    Some(match ty {
        "hello" => JobToWorker::Hello {
            token: f.string("token", is)?,
        },
        "state" => JobToWorker::State {
            payload: f.payload(is)?,
        },
        "state-refused" => JobToWorker::StateRefused {
            reason: f.string("reason", is)?,
        },
        "target-ready" => JobToWorker::TargetReady {
            payload: f.payload(is)?,
        },
        "source-stopped-output" => JobToWorker::SourceStoppedOutput {
            payload: f.payload(is)?,
        },
        "target-applied" => {
            // All three are checked before giving up, so every bad field is named.
            let applied = f.opt_string_array("applied", is);
            let failed = f.opt_failed_array("failed", is);
            let skew_ms = f.opt_number("skewMs", is);
            JobToWorker::TargetApplied(TargetApplied {
                applied: applied?,
                failed: failed?,
                skew_ms: skew_ms?,
            })
        }
        "abort" => JobToWorker::Abort {
            reason: f.string("reason", is)?,
        },
        _ => return None,
    })
}

fn worker_to_job_shape(ty: &str, f: &mut Fields, is: &mut Issues) -> Option<WorkerToJob> {
    Some(match ty {
        "hello-ack" => WorkerToJob::HelloAck {
            migration: f.opt_target_of(is)?,
        },
        "get-state" => WorkerToJob::GetState {
            migration_id: f.string("migrationId", is)?,
        },
        "initial-state" | "cutover-ready" | "cutover-apply" => {
            let migration_id = f.string("migrationId", is);
            let payload = f.payload(is);
            let (migration_id, payload) = (migration_id?, payload?);
            match ty {
                "initial-state" => WorkerToJob::InitialState {
                    migration_id,
                    payload,
                },
                "cutover-ready" => WorkerToJob::CutoverReady {
                    migration_id,
                    payload,
                },
                _ => WorkerToJob::CutoverApply {
                    migration_id,
                    payload,
                },
            }
        }
        "abort" => {
            let migration_id = f.string("migrationId", is);
            let reason = f.string("reason", is);
            WorkerToJob::Abort {
                migration_id: migration_id?,
                reason: reason?,
            }
        }
        _ => return None,
    })
}

// ── zod emulation ───────────────────────────────────────────────────────────

#[derive(Debug, Clone)]
enum Seg {
    Key(&'static str),
    Index(usize),
}

#[derive(Default)]
struct Issues(Vec<(String, Vec<Seg>)>, ParseFlags);

impl Issues {
    fn push(&mut self, message: String, path: Vec<Seg>) {
        self.0.push((message, path));
    }

    /// `z.prettifyError`: issues stably sorted by path length, each `✖ msg` + `\n  → at path`.
    fn pretty(&self) -> String {
        let mut sorted: Vec<&(String, Vec<Seg>)> = self.0.iter().collect();
        sorted.sort_by_key(|(_, p)| p.len());
        let mut out = String::new();
        for (i, (msg, path)) in sorted.into_iter().enumerate() {
            if i > 0 {
                out.push('\n');
            }
            out.push_str("✖ ");
            out.push_str(msg);
            if !path.is_empty() {
                out.push_str("\n  → at ");
                for (j, seg) in path.iter().enumerate() {
                    match seg {
                        Seg::Key(k) if j == 0 => out.push_str(k),
                        Seg::Key(k) => {
                            out.push('.');
                            out.push_str(k);
                        }
                        Seg::Index(n) => out.push_str(&format!("[{n}]")),
                    }
                }
            }
        }
        out
    }
}

fn invalid_type(expected: &str, received: &str) -> String {
    format!("Invalid input: expected {expected}, received {received}")
}

/// The frame object's entries, taken out one declared field at a time (the rest are dropped,
/// as `z.object` strips them).
struct Fields(JsObject);

impl Fields {
    fn peek(&self, key: &str) -> Option<&Json> {
        self.0.get(key)
    }

    fn take(&mut self, key: &str) -> Option<Json> {
        self.0.take(key)
    }

    fn string(&mut self, key: &'static str, is: &mut Issues) -> Option<JsString> {
        take_string(self.take(key), vec![Seg::Key(key)], is)
    }

    fn payload(&mut self, is: &mut Issues) -> Option<Json> {
        // zod's record skips `__proto__` keys before validating their values, so they go first.
        // The parser's flags say whether the frame holds either anywhere; usually not.
        let flags = is.1;
        let payload = self.take("payload").map(|mut v| {
            if flags.proto_key {
                v.strip_proto_keys();
            }
            v
        });
        match payload {
            Some(v) if !flags.non_finite || v.is_zod_json() => Some(v),
            // `z.json()` is a union; its failure is one bare "Invalid input" at `payload`.
            _ => {
                is.push("Invalid input".to_owned(), vec![Seg::Key("payload")]);
                None
            }
        }
    }

    /// An optional array field, each element checked by `item` (all are checked, so every bad
    /// element is named).
    fn opt_array<T>(
        &mut self,
        key: &'static str,
        is: &mut Issues,
        mut item: impl FnMut(usize, Json, &mut Issues) -> Option<T>,
    ) -> Option<Option<Vec<T>>> {
        let items = match self.take(key) {
            None => return Some(None),
            Some(mut v) => match &mut v {
                Json::Array(items) => std::mem::take(items),
                other => {
                    is.push(
                        invalid_type("array", other.js_type_name()),
                        vec![Seg::Key(key)],
                    );
                    return None;
                }
            },
        };
        let mut out = Vec::with_capacity(items.len());
        let mut ok = true;
        for (i, v) in items.into_iter().enumerate() {
            match item(i, v, is) {
                Some(t) => out.push(t),
                None => ok = false,
            }
        }
        ok.then_some(Some(out))
    }

    fn opt_string_array(
        &mut self,
        key: &'static str,
        is: &mut Issues,
    ) -> Option<Option<Vec<JsString>>> {
        self.opt_array(key, is, |i, v, is| {
            take_string(Some(v), vec![Seg::Key(key), Seg::Index(i)], is)
        })
    }

    fn opt_failed_array(
        &mut self,
        key: &'static str,
        is: &mut Issues,
    ) -> Option<Option<Vec<FailedParticipant>>> {
        self.opt_array(key, is, |i, mut v, is| {
            let Json::Object(o) = &mut v else {
                is.push(
                    invalid_type("object", v.js_type_name()),
                    vec![Seg::Key(key), Seg::Index(i)],
                );
                return None;
            };
            let mut o = Fields(std::mem::take(o));
            let at = |field| vec![Seg::Key(key), Seg::Index(i), Seg::Key(field)];
            let id = take_string(o.take("id"), at("id"), is);
            let reason = take_string(o.take("reason"), at("reason"), is);
            Some(FailedParticipant {
                id: id?,
                reason: reason?,
            })
        })
    }

    fn opt_number(&mut self, key: &'static str, is: &mut Issues) -> Option<Option<f64>> {
        match self.take(key) {
            None => Some(None),
            Some(Json::Number(n)) if n.is_finite() => Some(Some(n)),
            Some(ref other) => {
                is.push(
                    invalid_type("number", other.js_type_name()),
                    vec![Seg::Key(key)],
                );
                None
            }
        }
    }

    fn opt_target_of(&mut self, is: &mut Issues) -> Option<Option<TargetOf>> {
        let mut v = match self.take("migration") {
            None => return Some(None),
            Some(v) => v,
        };
        let Json::Object(o) = &mut v else {
            is.push(
                invalid_type("object", v.js_type_name()),
                vec![Seg::Key("migration")],
            );
            return None;
        };
        let mut o = Fields(std::mem::take(o));
        let id = take_string(
            o.take("id"),
            vec![Seg::Key("migration"), Seg::Key("id")],
            is,
        );
        let side_ok = matches!(o.peek("side"), Some(Json::String(s)) if *s == "target");
        if !side_ok {
            is.push(
                "Invalid input: expected \"target\"".to_owned(),
                vec![Seg::Key("migration"), Seg::Key("side")],
            );
        }
        let id = id?;
        side_ok.then_some(Some(TargetOf {
            id,
            side: TargetSide::Target,
        }))
    }
}

fn take_string(v: Option<Json>, path: Vec<Seg>, is: &mut Issues) -> Option<JsString> {
    match v {
        Some(mut v) => match &mut v {
            Json::String(s) => Some(std::mem::take(s)),
            other => {
                is.push(invalid_type("string", other.js_type_name()), path);
                None
            }
        },
        None => {
            is.push(invalid_type("string", "undefined"), path);
            None
        }
    }
}

// ── printing ────────────────────────────────────────────────────────────────

fn obj(entries: Vec<(&str, Json)>) -> Json {
    let mut o = JsObject::new();
    for (k, v) in entries {
        o.insert(k, v);
    }
    Json::Object(o)
}

fn s(v: &JsString) -> Json {
    Json::String(v.clone())
}

impl JobToWorker {
    /// The frame as the value `JSON.stringify` would print (declared key order).
    pub fn to_json(&self) -> Json {
        match self {
            JobToWorker::Hello { token } => {
                obj(vec![("type", "hello".into()), ("token", s(token))])
            }
            JobToWorker::State { payload } => {
                obj(vec![("type", "state".into()), ("payload", payload.clone())])
            }
            JobToWorker::StateRefused { reason } => obj(vec![
                ("type", "state-refused".into()),
                ("reason", s(reason)),
            ]),
            JobToWorker::TargetReady { payload } => obj(vec![
                ("type", "target-ready".into()),
                ("payload", payload.clone()),
            ]),
            JobToWorker::SourceStoppedOutput { payload } => obj(vec![
                ("type", "source-stopped-output".into()),
                ("payload", payload.clone()),
            ]),
            JobToWorker::TargetApplied(t) => {
                let mut e = vec![("type", Json::from("target-applied"))];
                if let Some(a) = &t.applied {
                    e.push(("applied", Json::Array(a.iter().map(s).collect())));
                }
                if let Some(f) = &t.failed {
                    let items = f
                        .iter()
                        .map(|p| obj(vec![("id", s(&p.id)), ("reason", s(&p.reason))]))
                        .collect();
                    e.push(("failed", Json::Array(items)));
                }
                if let Some(k) = t.skew_ms {
                    e.push(("skewMs", Json::Number(k)));
                }
                obj(e)
            }
            JobToWorker::Abort { reason } => {
                obj(vec![("type", "abort".into()), ("reason", s(reason))])
            }
        }
    }

    /// The frame's text.
    pub fn to_text(&self) -> String {
        self.to_json().to_json_string()
    }

    /// The opaque payload, for frames that carry one (what goes into the gRPC `bytes payload`
    /// via [`crate::payload::encode_migration_payload`]).
    pub fn payload(&self) -> Option<&Json> {
        match self {
            JobToWorker::State { payload }
            | JobToWorker::TargetReady { payload }
            | JobToWorker::SourceStoppedOutput { payload } => Some(payload),
            _ => None,
        }
    }

    /// The `type` tag.
    pub fn kind(&self) -> &'static str {
        match self {
            JobToWorker::Hello { .. } => "hello",
            JobToWorker::State { .. } => "state",
            JobToWorker::StateRefused { .. } => "state-refused",
            JobToWorker::TargetReady { .. } => "target-ready",
            JobToWorker::SourceStoppedOutput { .. } => "source-stopped-output",
            JobToWorker::TargetApplied(_) => "target-applied",
            JobToWorker::Abort { .. } => "abort",
        }
    }
}

impl WorkerToJob {
    /// The frame as the value `JSON.stringify` would print (declared key order).
    pub fn to_json(&self) -> Json {
        let t = ("type", Json::from(self.kind()));
        match self {
            WorkerToJob::HelloAck { migration } => {
                let mut e = vec![t];
                if let Some(m) = migration {
                    e.push((
                        "migration",
                        obj(vec![("id", s(&m.id)), ("side", "target".into())]),
                    ));
                }
                obj(e)
            }
            WorkerToJob::GetState { migration_id } => {
                obj(vec![t, ("migrationId", s(migration_id))])
            }
            WorkerToJob::InitialState {
                migration_id,
                payload,
            }
            | WorkerToJob::CutoverReady {
                migration_id,
                payload,
            }
            | WorkerToJob::CutoverApply {
                migration_id,
                payload,
            } => obj(vec![
                t,
                ("migrationId", s(migration_id)),
                ("payload", payload.clone()),
            ]),
            WorkerToJob::Abort {
                migration_id,
                reason,
            } => obj(vec![
                t,
                ("migrationId", s(migration_id)),
                ("reason", s(reason)),
            ]),
        }
    }

    /// The frame's text.
    pub fn to_text(&self) -> String {
        self.to_json().to_json_string()
    }

    /// The `type` tag.
    pub fn kind(&self) -> &'static str {
        match self {
            WorkerToJob::HelloAck { .. } => "hello-ack",
            WorkerToJob::GetState { .. } => "get-state",
            WorkerToJob::InitialState { .. } => "initial-state",
            WorkerToJob::CutoverReady { .. } => "cutover-ready",
            WorkerToJob::CutoverApply { .. } => "cutover-apply",
            WorkerToJob::Abort { .. } => "abort",
        }
    }
}

/// `JSON.stringify(parseXFrame(text))`: `{"ok":true,"message":…}` or `{"ok":false,"reason":…}`.
pub fn parsed_to_json<T>(p: &Parsed<T>, message: impl Fn(&T) -> Json) -> Json {
    match p {
        Parsed::Ok(m) => obj(vec![("ok", Json::Bool(true)), ("message", message(m))]),
        Parsed::Err(r) => obj(vec![
            ("ok", Json::Bool(false)),
            ("reason", Json::from(r.as_str())),
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(t: &str) -> String {
        parsed_to_json(&parse_job_to_worker(t), JobToWorker::to_json).to_json_string()
    }

    #[test]
    fn unknown_keys_are_dropped_and_declared_order_is_kept() {
        assert_eq!(
            job(r#"{"token":"x","type":"hello","extra":1}"#),
            r#"{"ok":true,"message":{"type":"hello","token":"x"}}"#
        );
    }

    #[test]
    fn issues_are_sorted_by_path_length_like_prettify_error() {
        assert_eq!(
            job(r#"{"type":"target-applied","applied":["a",1],"failed":[{"id":1}],"skewMs":"x"}"#),
            r#"{"ok":false,"reason":"invalid frame: ✖ Invalid input: expected number, received string\n  → at skewMs\n✖ Invalid input: expected string, received number\n  → at applied[1]\n✖ Invalid input: expected string, received number\n  → at failed[0].id\n✖ Invalid input: expected string, received undefined\n  → at failed[0].reason"}"#
        );
    }

    #[test]
    fn payload_proto_keys_are_dropped_and_infinity_is_invalid() {
        assert_eq!(
            job(r#"{"type":"state","payload":{"x":{"__proto__":[1]},"__proto__":null}}"#),
            r#"{"ok":true,"message":{"type":"state","payload":{"x":{}}}}"#
        );
        assert_eq!(
            job(r#"{"type":"state","payload":[1e400]}"#),
            r#"{"ok":false,"reason":"invalid frame: ✖ Invalid input\n  → at payload"}"#
        );
    }

    #[test]
    fn text_that_is_not_json_has_the_exact_reason() {
        assert_eq!(
            parse_job_to_worker("\u{feff}{}"),
            Parsed::Err(NOT_JSON.to_owned())
        );
    }

    #[test]
    fn frames_serialise_and_reparse_to_themselves() {
        let f = WorkerToJob::CutoverApply {
            migration_id: "m".into(),
            payload: Json::Null,
        };
        assert_eq!(parse_worker_to_job(&f.to_text()), Parsed::Ok(f));
    }

    #[test]
    fn serde_tagging_matches_the_wire_form() {
        let frames = [
            r#"{"type":"hello","token":"t"}"#,
            r#"{"type":"state","payload":{"a":[1,"x",null,true]}}"#,
            r#"{"type":"target-applied","applied":["v"],"failed":[{"id":"a","reason":"r"}],"skewMs":2.5}"#,
            r#"{"type":"target-applied"}"#,
            r#"{"type":"abort","reason":"r"}"#,
        ];
        for text in frames {
            let Parsed::Ok(f) = parse_job_to_worker(text) else {
                panic!("{text}")
            };
            assert_eq!(serde_json::to_string(&f).expect("serialise"), text);
            assert_eq!(
                serde_json::from_str::<JobToWorker>(text).expect("deserialise"),
                f
            );
        }
        for text in [
            r#"{"type":"hello-ack","migration":{"id":"m","side":"target"}}"#,
            r#"{"type":"hello-ack"}"#,
            r#"{"type":"cutover-apply","migrationId":"m","payload":[]}"#,
            r#"{"type":"abort","migrationId":"m","reason":"r"}"#,
        ] {
            let Parsed::Ok(f) = parse_worker_to_job(text) else {
                panic!("{text}")
            };
            assert_eq!(serde_json::to_string(&f).expect("serialise"), text);
            assert_eq!(
                serde_json::from_str::<WorkerToJob>(text).expect("deserialise"),
                f
            );
        }
    }
}
