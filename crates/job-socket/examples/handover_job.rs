//! A minimal live job that can be moved with the `handover` migration strategy, on this crate's
//! job client SDK. The same job as `examples/job-socket/typescript` (see its README): a counter
//! stands in for output, and the handover state carries the output position and a session id
//! from one instance to the next.
//!
//! ```sh
//! cargo run -p job-socket --example handover_job   # with NORSK_WORKER_WS_URL and NORSK_WORKER_TOKEN set by the worker
//! ```
//!
//! One JSON line per event on stdout, the same events as the TypeScript job.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use job_socket::frame::{TargetApplied, WorkerToJob};
use job_socket::json::JsObject;
use job_socket::{JsString, Json, connect_migration};

/// The output counter: milliseconds produced, while producing.
#[derive(Default)]
struct Output {
    base: f64,
    since: Option<Instant>,
}

impl Output {
    fn start(&mut self, position: f64) {
        self.base = position;
        self.since = Some(Instant::now());
    }
    fn stop(&mut self) -> f64 {
        self.base = self.position();
        self.since = None;
        self.base
    }
    fn position(&self) -> f64 {
        self.base
            + self
                .since
                .map_or(0.0, |s| s.elapsed().as_secs_f64() * 1000.0)
    }
}

fn now_ms() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

fn log(event: &str, detail: serde_json::Value) {
    let mut line = serde_json::json!({"event": event});
    if let (Some(l), Some(d)) = (line.as_object_mut(), detail.as_object()) {
        l.extend(d.clone());
    }
    println!("{line}");
}

fn object(entries: &[(&str, Json)]) -> Json {
    let mut o = JsObject::new();
    for (k, v) in entries {
        o.insert(*k, v.clone());
    }
    Json::Object(o)
}

fn number(payload: &Json, key: &str) -> Option<f64> {
    match payload.as_object()?.get(key)? {
        Json::Number(n) if n.is_finite() && *n >= 0.0 => Some(*n),
        _ => None,
    }
}

fn text(payload: &Json, key: &str) -> Option<String> {
    match payload.as_object()?.get(key)? {
        Json::String(s) if !s.to_string_lossy().is_empty() => {
            Some(s.to_string_lossy().into_owned())
        }
        _ => None,
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut output = Output::default();
    let mut session = format!(
        "{:032x}",
        now_ms().to_bits() ^ u64::from(std::process::id())
    );
    let mut handovers = 0.0;
    let mut socket = connect_migration().await?;
    if !socket.is_enabled() {
        log("no-job-socket", serde_json::json!({}));
        output.start(0.0);
        // No listener on this worker: run, but this job cannot be handed over.
        loop {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
    }
    let target = socket.target_of().map(str::to_owned);
    match &target {
        Some(id) => log("started-as-target", serde_json::json!({"migrationId": id})),
        None => {
            output.start(0.0);
            log("producing", serde_json::json!({"session": session}));
        }
    }
    while let Some(frame) = socket.next_event().await? {
        match frame {
            WorkerToJob::GetState { migration_id } => {
                let position = output.position();
                let state = object(&[
                    ("position", Json::Number(position)),
                    ("session", Json::from(session.as_str())),
                    ("handovers", Json::Number(handovers)),
                ]);
                log(
                    "state-given",
                    serde_json::json!({"migrationId": migration_id.to_string_lossy(), "position": position, "session": session}),
                );
                socket.send_state(state).await?;
            }
            WorkerToJob::InitialState {
                migration_id,
                payload,
            } => {
                let (Some(position), Some(s)) =
                    (number(&payload, "position"), text(&payload, "session"))
                else {
                    log("refusing-initial-state", serde_json::json!({}));
                    socket
                        .abort("initial-state is not this job's handover state")
                        .await?;
                    continue;
                };
                session = s;
                handovers = number(&payload, "handovers").unwrap_or(0.0) + 1.0;
                output.start(position);
                output.stop();
                log(
                    "initial-state-received",
                    serde_json::json!({"migrationId": migration_id.to_string_lossy(), "state": {"position": position, "session": session, "handovers": handovers - 1.0}}),
                );
                socket
                    .target_ready(object(&[
                        ("resumeFrom", Json::Number(position)),
                        ("session", Json::from(session.as_str())),
                    ]))
                    .await?;
            }
            WorkerToJob::CutoverReady { migration_id, .. } => {
                let position = output.stop();
                log(
                    "source-stopped-output",
                    serde_json::json!({"migrationId": migration_id.to_string_lossy(), "position": position}),
                );
                socket
                    .source_stopped_output(object(&[
                        ("position", Json::Number(position)),
                        ("stoppedAtMs", Json::Number(now_ms())),
                        ("session", Json::from(session.as_str())),
                    ]))
                    .await?;
            }
            WorkerToJob::CutoverApply { payload, .. } => {
                let position = number(&payload, "position").unwrap_or_else(|| output.position());
                let skew = number(&payload, "stoppedAtMs").map_or(0.0, |t| (now_ms() - t).max(0.0));
                output.start(position);
                log(
                    "producing",
                    serde_json::json!({"session": session, "position": position, "handovers": handovers, "skewMs": skew}),
                );
                socket
                    .target_applied(TargetApplied {
                        applied: Some(vec![JsString::from("output")]),
                        failed: Some(Vec::new()),
                        skew_ms: Some(skew),
                    })
                    .await?;
            }
            WorkerToJob::Abort {
                migration_id,
                reason,
            } => {
                log(
                    "aborted",
                    serde_json::json!({"migrationId": migration_id.to_string_lossy(), "reason": reason.to_string_lossy(), "target": target.is_some()}),
                );
                // A source keeps producing; a target waits for its worker to stop it.
                if target.is_none() {
                    let p = output.position();
                    output.start(p);
                }
            }
            WorkerToJob::HelloAck { .. } => {}
        }
    }
    log("closed", serde_json::json!({}));
    Ok(())
}
