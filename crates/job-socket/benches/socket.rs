//! Job-socket figures.
//!
//! `cargo bench -p job-socket --bench socket -- --summary` (what `make bench-socket` runs) prints
//! one line on stdout, `socket parse_mb_s=<x> relay_p99_us=<x>`, and the baselines measured in the
//! same run on stderr:
//! * `parse_mb_s`: frame parse + validate (JSON.parse semantics + the zod-equivalent checks) over
//!   a corpus of typical frames (median pass, see [`mb_per_s`]); baseline
//!   `serde_json::from_str::<serde_json::Value>` of the same frames, measured the same way.
//! * `relay_p99_us`: p99 of half the round trip Manager side → listener → source job → listener →
//!   Manager side (`get-state` out, `state` back) over loopback; baseline the same round trip
//!   through a bare tokio-tungstenite echo server.
//!
//! Without `--summary` it runs the criterion benchmarks of the same parsers.

use criterion::{Criterion, Throughput};
use futures::{SinkExt, StreamExt};
use job_socket::client::connect_migration_to;
use job_socket::frame::{WorkerToJob, parse_job_to_worker};
use job_socket::json::Json;
use job_socket::listener::{
    Command, EventKind, InstanceKey, InstanceSpec, JobSocketListener, ListenerConfig,
};
use job_socket::path::job_socket_url;
use std::hint::black_box;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

/// Frames as a handover produces them: a few large `state` documents, the rest small.
fn corpus() -> Vec<String> {
    let participant = |i: usize| {
        format!(
            r#"{{"id":"participant-{i}","kind":"video","position":{{"pts":{},"timescale":90000,"wallclock":"2026-12-03T08:00:{:02}.123Z"}},"config":{{"bitrate":6000000,"codec":"h264","gop":60,"profile":"high","labels":["main","backup","{i}"]}},"ready":true,"skew":-0.25}}"#,
            123_456_789 + i * 3003,
            i % 60
        )
    };
    let state = |n: usize| {
        let parts: Vec<String> = (0..n).map(participant).collect();
        format!(
            r#"{{"type":"state","payload":{{"version":3,"participants":[{}],"note":"handover \u00e9 ok"}}}}"#,
            parts.join(",")
        )
    };
    let mut frames = vec![
        r#"{"type":"hello","token":"0123456789abcdef0123456789abcdef"}"#.to_owned(),
        r#"{"type":"target-ready","payload":{"at":123456789,"participants":["video","audio"]}}"#.to_owned(),
        r#"{"type":"source-stopped-output","payload":{"pts":123459792,"timescale":90000}}"#.to_owned(),
        r#"{"type":"target-applied","applied":["video","audio"],"failed":[{"id":"captions","reason":"decoder busy"}],"skewMs":3.25}"#.to_owned(),
        r#"{"type":"abort","reason":"operator changed mind"}"#.to_owned(),
    ];
    frames.push(state(4));
    frames.push(state(16));
    frames.push(state(60));
    frames
}

/// Throughput of one pass over the corpus, median over about a second of passes. A pass takes
/// well under a scheduler time slice, so on a machine shared with other builds the median pass
/// runs uninterrupted while the preempted ones fall in the slow tail.
fn mb_per_s(frames: &[String], f: impl Fn(&str) -> bool) -> f64 {
    let bytes: usize = frames.iter().map(String::len).sum();
    for fr in frames {
        black_box(f(fr));
    }
    let start = Instant::now();
    let mut passes = Vec::new();
    while start.elapsed() < Duration::from_millis(1000) {
        let t = Instant::now();
        for fr in frames {
            assert!(black_box(f(fr)), "corpus frame must parse");
        }
        passes.push(t.elapsed());
    }
    passes.sort();
    let median = passes.get(passes.len() / 2).copied().unwrap_or_default();
    bytes as f64 / median.as_secs_f64().max(1e-9) / 1e6
}

fn p99(mut v: Vec<Duration>) -> f64 {
    v.sort();
    let idx = ((v.len() as f64) * 0.99).ceil() as usize;
    v.get(idx.saturating_sub(1))
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

const ROUNDS: usize = 2000;

async fn relay_half_rtts() -> Vec<Duration> {
    let (listener, mut events) = JobSocketListener::bind(ListenerConfig::loopback())
        .await
        .expect("bind");
    let worker = listener.handle();
    worker
        .register(InstanceSpec::new("job", "main", "t"))
        .expect("register");
    let url = job_socket_url("127.0.0.1", listener.local_addr().port(), "job", "main");
    let mut job = connect_migration_to(&url, "t").await.expect("connect");
    // The source job: answers every get-state with its state; reads aborts.
    let job_task = tokio::spawn(async move {
        while let Ok(Some(frame)) = job.next_event().await {
            if let WorkerToJob::GetState { .. } = frame {
                job.send_state(
                    Json::parse(r#"{"pts":123456789,"timescale":90000}"#).expect("json"),
                )
                .await
                .expect("state");
            }
        }
    });
    let key = InstanceKey::new("job", "main");
    let mut out = Vec::with_capacity(ROUNDS);
    for i in 0..ROUNDS + 100 {
        let id = format!("m{i}");
        let t0 = Instant::now();
        worker
            .send(
                &key,
                Command::GetState {
                    migration_id: id.clone(),
                },
            )
            .expect("get-state");
        loop {
            match events.recv().await.expect("event").kind {
                EventKind::Frame { .. } => break,
                _ => continue,
            }
        }
        let rtt = t0.elapsed();
        if i >= 100 {
            out.push(rtt / 2);
        }
        worker
            .send(
                &key,
                Command::Abort {
                    migration_id: id,
                    reason: "next round".into(),
                },
            )
            .expect("abort");
    }
    worker.unregister(&key);
    let _ = job_task.await;
    listener.shutdown().await;
    out
}

async fn echo_half_rtts() -> Vec<Duration> {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = tcp.local_addr().expect("addr");
    let server = tokio::spawn(async move {
        let (s, _) = tcp.accept().await.expect("accept");
        let _ = s.set_nodelay(true);
        let mut ws = tokio_tungstenite::accept_async(s).await.expect("upgrade");
        while let Some(Ok(m)) = ws.next().await {
            if m.is_text() && ws.send(m).await.is_err() {
                break;
            }
        }
    });
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{addr}/"))
        .await
        .expect("connect");
    let frame = r#"{"type":"get-state","migrationId":"m1"}"#;
    let mut out = Vec::with_capacity(ROUNDS);
    for i in 0..ROUNDS + 100 {
        let t0 = Instant::now();
        ws.send(Message::text(frame)).await.expect("send");
        let _ = ws.next().await.expect("echo").expect("echo ok");
        if i >= 100 {
            out.push(t0.elapsed() / 2);
        }
    }
    let _ = ws.close(None).await;
    let _ = server.await;
    out
}

fn summary() {
    let frames = corpus();
    let ours = mb_per_s(&frames, |f| {
        matches!(parse_job_to_worker(f), job_socket::frame::Parsed::Ok(_))
    });
    let serde = mb_per_s(&frames, |f| {
        serde_json::from_str::<serde_json::Value>(f).is_ok()
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let relay = p99(rt.block_on(relay_half_rtts()));
    let echo = p99(rt.block_on(echo_half_rtts()));
    println!("socket parse_mb_s={ours:.0} relay_p99_us={relay:.0}");
    eprintln!("baseline serde_json_value_mb_s={serde:.0} bare_ws_echo_p99_us={echo:.0} (same run)");
}

fn criterion_benches() {
    let frames = corpus();
    let bytes: usize = frames.iter().map(String::len).sum();
    let mut c = Criterion::default().configure_from_args();
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Bytes(bytes as u64));
    g.bench_function("job_socket_frame", |b| {
        b.iter(|| {
            frames
                .iter()
                .map(|f| parse_job_to_worker(f))
                .for_each(|p| drop(black_box(p)))
        });
    });
    g.bench_function("serde_json_value", |b| {
        b.iter(|| {
            frames
                .iter()
                .map(|f| serde_json::from_str::<serde_json::Value>(f))
                .for_each(|p| drop(black_box(p)))
        });
    });
    g.finish();
    c.final_summary();
}

fn main() {
    if std::env::args().any(|a| a == "--summary") {
        summary();
    } else {
        criterion_benches();
    }
}
