//! Hostile peers at the two network boundaries the operator shares with others: a rogue gRPC
//! client sending malformed, oversized and out-of-range requests to Manager (the sim) while the
//! operator works against the same Manager, and hostile and flooding WebSocket clients at the
//! job socket listener (the sim's, standing in for a worker's) while handovers run over it.
//!
//! Each request or connection must get a clear answer: a gRPC status with a code other than
//! `UNKNOWN` or `INTERNAL` and a message, a WebSocket close with a code and a reason, or an HTTP
//! refusal before the upgrade. Valid requests are never aimed at the operator's objects (every
//! id is one the operator does not use), so what the scenario tests is how the boundary answers,
//! not whether a peer with the same rights as the operator can undo its work.

use std::net::SocketAddr;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use manager_client::proto as pb;
use pb::manager_client::ManagerClient as Grpc;
use tokio_tungstenite::tungstenite::Message;
use tonic::transport::Channel;

use crate::SetupError;

/// The rogue's bundle id: not of the operator's `<namespace>.<name>` form.
pub const ROGUE_BUNDLE: &str = "rogue-bundle";

/// Strings no field expects: empty, control and bidi characters, path tricks, 1 MiB, and 5 MiB
/// (over the 4 MiB a gRPC server decodes by default).
fn hostile_strings() -> Vec<(&'static str, String)> {
    vec![
        ("empty", String::new()),
        ("control", "a\u{0}b\u{7}c\u{1b}[31m\r\n".to_owned()),
        ("bidi-emoji", "\u{202e}x\u{1F4A9}\u{200b}".to_owned()),
        ("path", "../../etc/passwd/0/enc".to_owned()),
        ("one-mib", "m".repeat(1024 * 1024)),
        ("five-mib", "f".repeat(5 * 1024 * 1024)),
    ]
}

fn hostile_bytes() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("not-json", b"\xff\xfe\x00garbage{".to_vec()),
        ("one-mib", vec![b'{'; 1024 * 1024]),
        ("five-mib", vec![0; 5 * 1024 * 1024]),
    ]
}

/// Enum values no version of the proto defines.
const HOSTILE_ENUMS: [i32; 3] = [-1, 9_999, i32::MAX];

/// A change to the rogue's bundle.
type BundleChange = fn(&mut pb::Bundle);

/// One rogue request: what it was, and the call that sends it.
type Call = (
    String,
    Box<
        dyn FnOnce(Grpc<Channel>) -> futures::future::BoxFuture<'static, Result<(), tonic::Status>>
            + Send,
    >,
);

macro_rules! call {
    ($what:expr, $method:ident, $req:expr) => {{
        let req = $req;
        let call: Call = (
            $what,
            Box::new(move |mut c: Grpc<Channel>| {
                Box::pin(async move { c.$method(req).await.map(drop) })
            }),
        );
        call
    }};
}

fn rogue_bundle() -> pb::Bundle {
    pb::Bundle {
        bundle_id: ROGUE_BUNDLE.to_owned(),
        replicas: 1,
        jobs: vec![pb::BundleJob {
            job_name: "enc".to_owned(),
            requirements: Some(pb::JobRequirements {
                required_capacity: 10.0,
                required_cores: 1,
                required_capabilities: Vec::new(),
                priority_band: "silver".to_owned(),
            }),
            config: b"{}".to_vec(),
            template: Vec::new(),
        }],
        generation: 1,
        labels: Default::default(),
    }
}

/// The rogue's corpus: every string, bytes, number and enum field of the requests a Manager
/// client sends, each set to each hostile value of its type, on ids the operator does not use.
pub fn grpc_corpus() -> Vec<Call> {
    let rogue_job = format!("{ROGUE_BUNDLE}/0/enc");
    let mut calls: Vec<Call> = Vec::new();
    let create = || pb::CreateNodeRequest {
        pool: "rogue-pool".to_owned(),
        provider: 1,
        region: "eu-west-1".to_owned(),
        instance_type: "m5.xlarge".to_owned(),
        zone: "eu-west-1a".to_owned(),
        tags: Default::default(),
        request_id: "rogue-request".to_owned(),
    };
    for (label, s) in hostile_strings() {
        for field in [
            "pool",
            "region",
            "instanceType",
            "zone",
            "requestId",
            "tagKey",
            "tagValue",
        ] {
            let mut r = create();
            match field {
                "pool" => r.pool = s.clone(),
                "region" => r.region = s.clone(),
                "instanceType" => r.instance_type = s.clone(),
                "zone" => r.zone = s.clone(),
                "requestId" => r.request_id = s.clone(),
                "tagKey" => r.tags = [(s.clone(), "v".to_owned())].into_iter().collect(),
                _ => r.tags = [("k".to_owned(), s.clone())].into_iter().collect(),
            }
            calls.push(call!(format!("CreateNode {field}={label}"), create_node, r));
        }
        calls.push(call!(
            format!("TerminateNode nodeId={label}"),
            terminate_node,
            pb::TerminateNodeRequest { node_id: s.clone() }
        ));
        calls.push(call!(
            format!("ListNodes pool={label}"),
            list_nodes,
            pb::ListNodesRequest { pool: s.clone() }
        ));
        for field in [
            "bundleId",
            "jobName",
            "priorityBand",
            "capability",
            "labelKey",
        ] {
            let mut b = rogue_bundle();
            match field {
                "bundleId" => b.bundle_id = s.clone(),
                "jobName" => b.jobs[0].job_name = s.clone(),
                "priorityBand" => {
                    if let Some(r) = b.jobs[0].requirements.as_mut() {
                        r.priority_band = s.clone();
                    }
                }
                "capability" => {
                    if let Some(r) = b.jobs[0].requirements.as_mut() {
                        r.required_capabilities = vec![s.clone()];
                    }
                }
                _ => b.labels = [(s.clone(), "v".to_owned())].into_iter().collect(),
            }
            calls.push(call!(
                format!("RegisterBundle {field}={label}"),
                register_bundle,
                pb::RegisterBundleRequest { bundle: Some(b) }
            ));
        }
        calls.push(call!(
            format!("DeleteBundle bundleId={label}"),
            delete_bundle,
            pb::DeleteBundleRequest {
                bundle_id: s.clone()
            }
        ));
        for (field, job_id, node_id) in [
            ("jobId", s.clone(), "rogue-node".to_owned()),
            ("nodeId", rogue_job.clone(), s.clone()),
        ] {
            calls.push(call!(
                format!("StartJob {field}={label}"),
                start_job,
                pb::StartJobRequest {
                    job_id,
                    node_id,
                    role: 1
                }
            ));
        }
        calls.push(call!(
            format!("StopJob jobId={label}"),
            stop_job,
            pb::StopJobRequest {
                job_id: s.clone(),
                role: 1,
                reason: 1
            }
        ));
        calls.push(call!(
            format!("UpdateJobConfig jobId={label}"),
            update_job_config,
            pb::UpdateJobConfigRequest {
                job_id: s.clone(),
                config: b"{}".to_vec()
            }
        ));
        calls.push(call!(
            format!("MigrationGetState migrationId={label}"),
            migration_get_state,
            pb::NodeControllerMigrationGetState {
                migration_id: s.clone(),
                job_id: rogue_job.clone(),
                strategy: 1
            }
        ));
        calls.push(call!(
            format!("MigrationGetState jobId={label}"),
            migration_get_state,
            pb::NodeControllerMigrationGetState {
                migration_id: "rogue-migration".to_owned(),
                job_id: s.clone(),
                strategy: 1
            }
        ));
        calls.push(call!(
            format!("MigrationPrepareTarget targetNodeId={label}"),
            migration_prepare_target,
            pb::NodeControllerMigrationPrepareTarget {
                migration_id: "rogue-migration".to_owned(),
                target_node_id: s.clone(),
                initial_state: Vec::new()
            }
        ));
        calls.push(call!(
            format!("MigrationAbort reason={label}"),
            migration_abort,
            pb::NodeControllerMigrationAbort {
                migration_id: "rogue-migration".to_owned(),
                reason: s.clone()
            }
        ));
    }
    for (label, bytes) in hostile_bytes() {
        let mut b = rogue_bundle();
        b.jobs[0].config = bytes.clone();
        calls.push(call!(
            format!("RegisterBundle config={label}"),
            register_bundle,
            pb::RegisterBundleRequest { bundle: Some(b) }
        ));
        calls.push(call!(
            format!("UpdateJobConfig config={label}"),
            update_job_config,
            pb::UpdateJobConfigRequest {
                job_id: rogue_job.clone(),
                config: bytes.clone()
            }
        ));
        calls.push(call!(
            format!("MigrationPrepareTarget initialState={label}"),
            migration_prepare_target,
            pb::NodeControllerMigrationPrepareTarget {
                migration_id: "rogue-migration".to_owned(),
                target_node_id: "rogue-node".to_owned(),
                initial_state: bytes.clone()
            }
        ));
        calls.push(call!(
            format!("MigrationCutover payload={label}"),
            migration_cutover,
            pb::NodeControllerMigrationCutover {
                migration_id: "rogue-migration".to_owned(),
                payload: bytes
            }
        ));
    }
    for e in HOSTILE_ENUMS {
        let mut r = create();
        r.provider = e;
        calls.push(call!(format!("CreateNode provider={e}"), create_node, r));
        calls.push(call!(
            format!("StartJob role={e}"),
            start_job,
            pb::StartJobRequest {
                job_id: rogue_job.clone(),
                node_id: "rogue-node".to_owned(),
                role: e
            }
        ));
        calls.push(call!(
            format!("StopJob reason={e}"),
            stop_job,
            pb::StopJobRequest {
                job_id: rogue_job.clone(),
                role: e,
                reason: e
            }
        ));
        calls.push(call!(
            format!("MigrationGetState strategy={e}"),
            migration_get_state,
            pb::NodeControllerMigrationGetState {
                migration_id: "rogue-migration".to_owned(),
                job_id: rogue_job.clone(),
                strategy: e
            }
        ));
    }
    let numbers: [(&str, BundleChange); 11] = [
        ("replicas=0", |b| b.replicas = 0),
        ("replicas=u32-max", |b| b.replicas = u32::MAX),
        ("capacity=NaN", |b| {
            set_req(b, |r| r.required_capacity = f64::NAN)
        }),
        ("capacity=-1", |b| {
            set_req(b, |r| r.required_capacity = -1.0)
        }),
        ("capacity=inf", |b| {
            set_req(b, |r| r.required_capacity = f64::INFINITY)
        }),
        ("capacity=1e308", |b| {
            set_req(b, |r| r.required_capacity = 1e308)
        }),
        ("cores=-1", |b| set_req(b, |r| r.required_cores = -1)),
        ("cores=i32-max", |b| {
            set_req(b, |r| r.required_cores = i32::MAX)
        }),
        ("requirements=none", |b| b.jobs[0].requirements = None),
        ("jobs=none", |b| b.jobs.clear()),
        ("jobs=10000", |b| {
            let one = b.jobs[0].clone();
            b.jobs = (0..10_000)
                .map(|i| pb::BundleJob {
                    job_name: format!("j{i}"),
                    ..one.clone()
                })
                .collect();
        }),
    ];
    for (label, change) in numbers {
        let mut b = rogue_bundle();
        change(&mut b);
        calls.push(call!(
            format!("RegisterBundle {label}"),
            register_bundle,
            pb::RegisterBundleRequest { bundle: Some(b) }
        ));
    }
    let mut b = rogue_bundle();
    b.labels = (0..10_000)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect();
    calls.push(call!(
        "RegisterBundle labels=10000".to_owned(),
        register_bundle,
        pb::RegisterBundleRequest { bundle: Some(b) }
    ));
    calls.push(call!(
        "RegisterBundle bundle=none".to_owned(),
        register_bundle,
        pb::RegisterBundleRequest { bundle: None }
    ));
    let mut r = create();
    r.tags = (0..10_000)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect();
    calls.push(call!("CreateNode tags=10000".to_owned(), create_node, r));
    calls
}

fn set_req(b: &mut pb::Bundle, f: impl FnOnce(&mut pb::JobRequirements)) {
    if let Some(r) = b.jobs.first_mut().and_then(|j| j.requirements.as_mut()) {
        f(r);
    }
}

/// How the rogue's requests were answered.
#[derive(Debug, Default)]
pub struct GrpcTally {
    pub refused: usize,
    pub accepted: Vec<String>,
    /// Answers that are not clear: `UNKNOWN` or `INTERNAL`, or no message.
    pub unclear: Vec<String>,
}

/// Whether a refusal says what was wrong with the request.
fn clear(status: &tonic::Status) -> bool {
    !matches!(status.code(), tonic::Code::Unknown | tonic::Code::Internal)
        && !status.message().trim().is_empty()
}

/// Sends the whole corpus, and Watch requests with hostile resume points, epochs and heartbeat
/// intervals, to the Manager at `endpoint`; deletes whatever bundle it managed to register.
pub async fn rogue_grpc(endpoint: &str) -> Result<GrpcTally, SetupError> {
    let channel =
        crate::reliability::sim_channel(endpoint, Duration::from_secs(20), "Manager").await?;
    let client = Grpc::new(channel).max_decoding_message_size(64 * 1024 * 1024);
    let mut tally = GrpcTally::default();
    let mut judge = |what: String, outcome: Result<(), tonic::Status>| match outcome {
        Ok(()) => tally.accepted.push(what),
        Err(s) if clear(&s) => tally.refused += 1,
        Err(s) => tally.unclear.push(format!(
            "{what}: {:?} {:?}",
            s.code(),
            s.message().chars().take(200).collect::<String>()
        )),
    };
    for (what, send) in grpc_corpus() {
        judge(what, send(client.clone()).await);
    }
    let watches = [
        ("resumeRevision=u64-max", u64::MAX, String::new(), 0),
        ("epoch=one-mib", 1, "e".repeat(1024 * 1024), 0),
        ("epoch=control", 1, "a\u{0}\u{1b}".to_owned(), 0),
        ("heartbeat=u64-max", 0, String::new(), u64::MAX),
        ("heartbeat=1ms", 0, String::new(), 1),
    ];
    for (label, resume_revision, epoch, heartbeat_interval_ms) in watches {
        let mut c = client.clone();
        let outcome = async {
            let mut stream = c
                .watch(pb::WatchRequest {
                    resume_revision,
                    epoch,
                    heartbeat_interval_ms,
                })
                .await?
                .into_inner();
            // The first message (a snapshot or a resync) or a status: either is an answer.
            match tokio::time::timeout(Duration::from_secs(5), stream.message()).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(s)) => Err(s),
                Err(_) => Err(tonic::Status::unknown("no answer within 5 s")),
            }
        }
        .await;
        judge(format!("Watch {label}"), outcome);
    }
    // Whatever bundle the corpus managed to register is removed again: every registered id
    // that is not of the operator's form.
    let state = crate::reliability::manager_state(endpoint).await?;
    for id in state
        .bundles
        .keys()
        .filter(|id| !crate::reliability::operator_id(id))
    {
        let mut c = client.clone();
        c.delete_bundle(pb::DeleteBundleRequest {
            bundle_id: id.clone(),
        })
        .await
        .map_err(|s| SetupError(format!("deleting the rogue's bundle {id:?}: {s}")))?;
    }
    Ok(tally)
}

/// How the job socket listener answered a hostile WebSocket client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SocketAnswer {
    /// Closed with this code and reason.
    Closed(u16, String),
    /// Refused before the upgrade with this HTTP status line.
    Refused(String),
    /// Neither within the time allowed.
    Nothing,
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn closed_with(ws: &mut Ws, within: Duration) -> SocketAnswer {
    let read = async {
        while let Some(m) = ws.next().await {
            match m {
                Ok(Message::Close(Some(f))) => {
                    return SocketAnswer::Closed(u16::from(f.code), f.reason.to_string());
                }
                Ok(Message::Close(None)) | Err(_) => {
                    return SocketAnswer::Closed(0, String::new());
                }
                Ok(_) => {}
            }
        }
        SocketAnswer::Closed(0, String::new())
    };
    tokio::time::timeout(within, read)
        .await
        .unwrap_or(SocketAnswer::Nothing)
}

/// One hostile WebSocket client: connects to `path` at `addr`, sends `frames`, and reports how
/// it was closed.
pub async fn hostile_client(addr: SocketAddr, path: &str, frames: Vec<Message>) -> SocketAnswer {
    let url = format!("ws://{addr}{path}");
    let mut ws = match tokio_tungstenite::connect_async(url.as_str()).await {
        Ok((ws, _)) => ws,
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => {
            return SocketAnswer::Refused(r.status().to_string());
        }
        Err(e) => return SocketAnswer::Refused(e.to_string()),
    };
    for f in frames {
        if ws.send(f).await.is_err() {
            break;
        }
    }
    closed_with(&mut ws, Duration::from_secs(15)).await
}

/// The hostile WebSocket clients: (what, path, frames). `job` names a live instance's path
/// (`/instances/<job id>/normal`), whose token the clients do not have.
pub fn socket_corpus(job: &str) -> Vec<(String, String, Vec<Message>)> {
    let live = format!("/instances/{}/normal", job.replace('/', "%2F"));
    let hello = |token: &str| Message::text(format!(r#"{{"type":"hello","token":"{token}"}}"#));
    vec![
        (
            "not a job socket path".to_owned(),
            "/etc/passwd".into(),
            vec![hello("x")],
        ),
        (
            "an unknown instance".into(),
            "/instances/rogue-bundle%2F0%2Fenc/normal".into(),
            vec![hello("x")],
        ),
        (
            "a live instance, wrong token".into(),
            live.clone(),
            vec![hello("wrong")],
        ),
        ("a live instance, no hello".into(), live.clone(), Vec::new()),
        (
            "a first frame that is not JSON".into(),
            live.clone(),
            vec![Message::text("not json")],
        ),
        (
            "a first frame other than hello".into(),
            live.clone(),
            vec![Message::text(r#"{"type":"state","payload":null}"#)],
        ),
        (
            "a binary first frame".into(),
            live.clone(),
            vec![Message::binary(vec![0xff; 64])],
        ),
        (
            "a 1 MiB first frame".into(),
            live.clone(),
            vec![Message::text("x".repeat(1024 * 1024))],
        ),
        (
            "a hello with a 60 KiB token".into(),
            live,
            vec![hello(&"t".repeat(60 * 1024))],
        ),
    ]
    .into_iter()
    .map(|(what, path, frames): (String, String, Vec<Message>)| (what, path, frames))
    .collect()
}

/// `n` TCP connections to `addr` from `from` (any 127.0.0.0/8 address is this host), opened
/// at once and held open and silent: a flood from one peer. Connections the host could not open
/// (no local port left, a full accept queue) are left out.
pub async fn flood(from: [u8; 4], addr: SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    let connect = |_| async move {
        let socket = tokio::net::TcpSocket::new_v4().ok()?;
        socket.bind(SocketAddr::from((from, 0))).ok()?;
        tokio::time::timeout(Duration::from_secs(2), socket.connect(addr))
            .await
            .ok()?
            .ok()
    };
    futures::future::join_all((0..n).map(connect))
        .await
        .into_iter()
        .flatten()
        .collect()
}
