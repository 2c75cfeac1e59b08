//! The line protocol of the `job-socket` conformance binary, as pure functions: one input line
//! in, one JSON line out. `reference/cli.mjs` implements the same protocol over the reference, so
//! any implementation can be checked against ours with the shared vectors.
//!
//! Inputs the issue leaves undefined get a defined answer, identical in `cli.mjs`:
//! `encode-payload` of a line that is not JSON → `{"error":"input is not valid JSON"}`;
//! `decode-payload` of a line that is not padded standard base64 → `{"error":"input is not valid base64"}`.

use crate::frame::{
    JobToWorker, WorkerToJob, parse_job_to_worker, parse_worker_to_job, parsed_to_json,
};
use crate::json::{JsObject, Json};
use crate::path::parse_job_socket_path;
use crate::payload::{decode_migration_payload, encode_migration_payload};
use base64::Engine as _;

/// Which side sent the frames being parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum From {
    /// `parseJobToWorkerFrame`.
    Job,
    /// `parseWorkerToJobFrame`.
    Worker,
}

/// `JSON.stringify(parseXFrame(line))`.
pub fn parse_frame(from: From, line: &str) -> String {
    match from {
        From::Job => parsed_to_json(&parse_job_to_worker(line), JobToWorker::to_json),
        From::Worker => parsed_to_json(&parse_worker_to_job(line), WorkerToJob::to_json),
    }
    .to_json_string()
}

/// `JSON.stringify(parseJobSocketPath(line) ?? null)`.
pub fn parse_path(line: &str) -> String {
    match parse_job_socket_path(line) {
        Some(p) => {
            let mut o = JsObject::new();
            o.insert("jobId", Json::from(p.job_id));
            o.insert("role", Json::from(p.role));
            Json::Object(o).to_json_string()
        }
        None => "null".to_owned(),
    }
}

fn engine() -> base64::engine::GeneralPurpose {
    // Padding required (the vectors' canonical form); stray trailing bits tolerated, as Node's
    // `Buffer.from(…, "base64")` tolerates them.
    base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    )
}

/// Base64 of `encodeMigrationPayload(line === "" ? undefined : JSON.parse(line))`, as a JSON string.
pub fn encode_payload(line: &str) -> String {
    let bytes = if line.is_empty() {
        encode_migration_payload(None)
    } else {
        match Json::parse(line) {
            Ok(v) => encode_migration_payload(Some(&v)),
            Err(_) => return r#"{"error":"input is not valid JSON"}"#.to_owned(),
        }
    };
    Json::from(engine().encode(bytes)).to_json_string()
}

/// `JSON.stringify(decodeMigrationPayload(base64 bytes of line))`.
pub fn decode_payload(line: &str) -> String {
    match engine().decode(line) {
        Ok(bytes) => decode_migration_payload(Some(&bytes)).to_json_string(),
        Err(_) => r#"{"error":"input is not valid base64"}"#.to_owned(),
    }
}

/// Splits stdin as `cli.mjs` does: on `\n`, without a final empty line after a trailing newline,
/// each line decoded as lossy UTF-8 (what Node's `readFileSync(0, "utf8")` does).
pub fn lines(input: &[u8]) -> Vec<String> {
    let mut parts: Vec<&[u8]> = input.split(|b| *b == b'\n').collect();
    if parts.last().is_some_and(|l| l.is_empty()) {
        parts.pop();
    }
    parts
        .into_iter()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect()
}
