//! The worker listener over real loopback WebSockets: every close code, the hello timeout,
//! replacement, wrong side / phase, a full handover between a simulated source and target job,
//! and abort from either side at every abortable phase.

use futures::{SinkExt, StreamExt};
use job_socket::client::{ClientError, MigrationClient, connect_migration, connect_migration_to};
use job_socket::frame::{FailedParticipant, JobToWorker, TargetApplied, WorkerToJob};
use job_socket::json::Json;
use job_socket::listener::{
    Command, EventKind, InstanceKey, InstanceSpec, JobSocketListener, ListenerConfig,
    ListenerError, ListenerEvent, REFUSED,
};
use job_socket::path::job_socket_url;
use job_socket::phase::Phase;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

const WAIT: Duration = Duration::from_secs(10);

type RawWs =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

struct Worker {
    listener: JobSocketListener,
    events: mpsc::Receiver<ListenerEvent>,
}

impl Worker {
    async fn start(config: ListenerConfig) -> Self {
        let (listener, events) = JobSocketListener::bind(config).await.expect("bind");
        Self { listener, events }
    }

    async fn new() -> Self {
        Self::start(ListenerConfig::loopback()).await
    }

    fn url(&self, job: &str, role: &str) -> String {
        job_socket_url("127.0.0.1", self.listener.local_addr().port(), job, role)
    }

    fn register(&self, spec: InstanceSpec) {
        self.listener.handle().register(spec).expect("register");
    }

    fn send(&self, job: &str, role: &str, cmd: Command) -> Result<(), ListenerError> {
        self.listener
            .handle()
            .send(&InstanceKey::new(job, role), cmd)
    }

    fn phase(&self, job: &str, role: &str) -> Option<Phase> {
        self.listener
            .handle()
            .status(&InstanceKey::new(job, role))
            .and_then(|s| s.migration)
            .map(|m| m.phase)
    }

    async fn event(&mut self) -> EventKind {
        tokio::time::timeout(WAIT, self.events.recv())
            .await
            .expect("event in time")
            .expect("event")
            .kind
    }

    /// The next event that is a relayed frame.
    async fn frame(&mut self) -> (String, JobToWorker, Phase) {
        loop {
            if let EventKind::Frame {
                migration_id,
                frame,
                phase,
            } = self.event().await
            {
                return (migration_id, frame, phase);
            }
        }
    }
}

fn get_state(id: &str) -> Command {
    Command::GetState {
        migration_id: id.into(),
    }
}

async fn raw(url: &str) -> RawWs {
    tokio_tungstenite::connect_async(url)
        .await
        .expect("upgrade")
        .0
}

async fn send_text(ws: &mut RawWs, text: &str) {
    ws.send(Message::text(text.to_owned())).await.expect("send");
}

/// Reads until the worker's close frame; returns its code and reason.
async fn closed_with(ws: &mut RawWs) -> (u16, String) {
    let fut = async {
        while let Some(m) = ws.next().await {
            match m {
                Ok(Message::Close(Some(f))) => return (u16::from(f.code), f.reason.to_string()),
                Ok(Message::Close(None)) | Err(_) => return (0, String::new()),
                Ok(_) => {}
            }
        }
        (0, String::new())
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .expect("closed in time")
}

async fn hello(ws: &mut RawWs, token: &str) -> WorkerToJob {
    send_text(
        ws,
        &JobToWorker::Hello {
            token: token.into(),
        }
        .to_text(),
    )
    .await;
    next_frame(ws).await
}

async fn next_frame(ws: &mut RawWs) -> WorkerToJob {
    let fut = async {
        loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => {
                    return job_socket::frame::parse_worker_to_job(t.as_str())
                        .into_result()
                        .expect("valid frame");
                }
                Some(Ok(Message::Close(f))) => panic!("closed: {f:?}"),
                Some(Ok(_)) => {}
                other => panic!("stream ended: {other:?}"),
            }
        }
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .expect("frame in time")
}

// ── close codes ─────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn a_path_that_is_not_a_job_socket_path_is_closed_4401_at_once() {
    let w = Worker::new().await;
    let mut ws = raw(&format!("ws://{}/elsewhere", w.listener.local_addr())).await;
    let (code, reason) = closed_with(&mut ws).await;
    assert_eq!(code, 4401);
    assert!(reason.contains("not a job socket path"), "{reason}");
}

/// A path naming no instance and a wrong token look the same from outside, so a peer cannot
/// find out which job ids are live: the same wait for a hello, the same code and reason.
#[tokio::test]
async fn an_unknown_instance_and_a_wrong_token_are_refused_alike() {
    let config = ListenerConfig {
        hello_timeout: Duration::from_millis(300),
        ..ListenerConfig::loopback()
    };
    let w = Worker::start(config).await;
    w.register(InstanceSpec::new("job", "main", "right"));
    let refused = (4401, REFUSED.to_owned());
    for (job, role) in [("job", "main"), ("job", "other"), ("nope", "main")] {
        let mut ws = raw(&w.url(job, role)).await;
        send_text(&mut ws, r#"{"type":"hello","token":"wrong"}"#).await;
        assert_eq!(closed_with(&mut ws).await, refused, "{job}/{role}");
        // Without a hello: the same timeout for both.
        let mut ws = raw(&w.url(job, role)).await;
        let (code, reason) = closed_with(&mut ws).await;
        assert_eq!(code, 4401);
        assert!(reason.contains("no hello"), "{job}/{role}: {reason}");
    }
    let err = connect_migration_to(&w.url("job", "main"), "righ")
        .await
        .err();
    assert!(
        matches!(
            err,
            Some(ClientError::Closed {
                code: Some(4401),
                ..
            })
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn no_hello_within_the_timeout_is_closed_4401() {
    let config = ListenerConfig {
        hello_timeout: Duration::from_millis(200),
        ..ListenerConfig::loopback()
    };
    let w = Worker::start(config).await;
    w.register(InstanceSpec::new("job", "main", "t"));
    let mut ws = raw(&w.url("job", "main")).await;
    let (code, reason) = closed_with(&mut ws).await;
    assert_eq!(code, 4401);
    assert!(reason.contains("no hello"), "{reason}");
}

#[tokio::test]
async fn a_first_frame_other_than_hello_is_refused() {
    let w = Worker::new().await;
    w.register(InstanceSpec::new("job", "main", "t"));
    let mut ws = raw(&w.url("job", "main")).await;
    send_text(&mut ws, r#"{"type":"state","payload":null}"#).await;
    assert_eq!(closed_with(&mut ws).await.0, 4401);
    let mut ws = raw(&w.url("job", "main")).await;
    send_text(&mut ws, "not json").await;
    assert_eq!(
        closed_with(&mut ws).await,
        (4400, "frame is not valid JSON".to_owned())
    );
}

#[tokio::test]
async fn a_frame_over_64_kib_is_closed_4413_and_one_of_exactly_64_kib_is_read() {
    let w = Worker::new().await;
    w.register(InstanceSpec::new("job", "main", "t"));
    let mut ws = raw(&w.url("job", "main")).await;
    assert!(matches!(
        hello(&mut ws, "t").await,
        WorkerToJob::HelloAck { migration: None }
    ));
    // Exactly 64 KiB: read and judged on its content (an abort with no migration is out of phase).
    let head = r#"{"type":"abort","reason":""#;
    let pad = 64 * 1024 - head.len() - 2;
    let exact = format!("{head}{}\"}}", "x".repeat(pad));
    assert_eq!(exact.len(), 64 * 1024);
    send_text(&mut ws, &exact).await;
    assert_eq!(closed_with(&mut ws).await.0, 4400);
    let mut ws = raw(&w.url("job", "main")).await;
    hello(&mut ws, "t").await;
    send_text(&mut ws, &format!("{head}{}\"}}", "x".repeat(pad + 1))).await;
    assert_eq!(closed_with(&mut ws).await.0, 4413);
}

#[tokio::test]
async fn unparseable_binary_and_repeated_hello_frames_are_closed_4400_with_the_reason() {
    let w = Worker::new().await;
    w.register(InstanceSpec::new("job", "main", "t"));
    let mut ws = raw(&w.url("job", "main")).await;
    hello(&mut ws, "t").await;
    send_text(&mut ws, r#"{"type":"abort"}"#).await;
    let (code, reason) = closed_with(&mut ws).await;
    assert_eq!(code, 4400);
    assert!(
        reason.starts_with("invalid frame: ") && reason.contains("reason"),
        "{reason}"
    );

    let mut ws = raw(&w.url("job", "main")).await;
    hello(&mut ws, "t").await;
    ws.send(Message::binary(vec![1u8, 2, 3]))
        .await
        .expect("send");
    assert_eq!(closed_with(&mut ws).await.0, 4400);

    let mut ws = raw(&w.url("job", "main")).await;
    hello(&mut ws, "t").await;
    send_text(&mut ws, r#"{"type":"hello","token":"t"}"#).await;
    assert_eq!(closed_with(&mut ws).await.0, 4400);
}

#[tokio::test]
async fn frames_from_the_wrong_side_or_phase_are_closed_4400() {
    let w = Worker::new().await;
    w.register(InstanceSpec::new("job", "main", "t"));
    // No migration at all.
    let mut ws = raw(&w.url("job", "main")).await;
    hello(&mut ws, "t").await;
    send_text(&mut ws, r#"{"type":"state","payload":1}"#).await;
    let (code, reason) = closed_with(&mut ws).await;
    assert_eq!(code, 4400);
    assert!(reason.contains("no migration"), "{reason}");
    // A source awaiting state sends a target's frame.
    let mut ws = raw(&w.url("job", "main")).await;
    hello(&mut ws, "t").await;
    w.send("job", "main", get_state("m")).expect("get-state");
    assert!(matches!(
        next_frame(&mut ws).await,
        WorkerToJob::GetState { .. }
    ));
    send_text(&mut ws, r#"{"type":"target-ready","payload":1}"#).await;
    let (code, reason) = closed_with(&mut ws).await;
    assert_eq!(code, 4400);
    assert!(reason.contains("awaiting-state"), "{reason}");
    assert_eq!(w.phase("job", "main"), Some(Phase::AwaitingState));
}

#[tokio::test]
async fn a_second_connection_replaces_the_first_with_4409_and_keeps_the_phase() {
    let mut w = Worker::new().await;
    w.register(InstanceSpec::new("job", "main", "t"));
    let mut first = raw(&w.url("job", "main")).await;
    hello(&mut first, "t").await;
    w.send("job", "main", get_state("m")).expect("get-state");
    next_frame(&mut first).await;
    let mut second = raw(&w.url("job", "main")).await;
    hello(&mut second, "t").await;
    assert_eq!(
        closed_with(&mut first).await,
        (4409, "replaced by a newer connection".to_owned())
    );
    // The migration survives the replacement: the new connection answers it.
    send_text(&mut second, r#"{"type":"state","payload":{"pos":7}}"#).await;
    let (id, frame, phase) = w.frame().await;
    assert_eq!((id.as_str(), phase), ("m", Phase::StateGiven));
    assert_eq!(
        frame,
        JobToWorker::State {
            payload: Json::parse(r#"{"pos":7}"#).expect("json")
        }
    );
}

#[tokio::test]
async fn an_instance_registered_again_keeps_its_new_connection_when_the_old_one_ends() {
    let mut w = Worker::new().await;
    let key = InstanceKey::new("job", "main");
    w.register(InstanceSpec::new("job", "main", "old"));
    let mut first = raw(&w.url("job", "main")).await;
    hello(&mut first, "old").await;
    // The job moved away and back: the same key, a new registration, a new job.
    assert!(w.listener.handle().unregister(&key));
    w.register(InstanceSpec::new("job", "main", "new"));
    let mut second = raw(&w.url("job", "main")).await;
    hello(&mut second, "new").await;
    assert_eq!(closed_with(&mut first).await.0, 1000);
    let (mut connected, mut old_gone) = (Vec::new(), false);
    while connected.len() < 2 || !old_gone {
        match w.event().await {
            EventKind::Connected { connection, .. } => connected.push(connection),
            EventKind::Disconnected { connection, .. } => {
                assert_eq!(
                    Some(&connection),
                    connected.first(),
                    "only the old one ends"
                );
                old_gone = true;
            }
            _ => {}
        }
    }
    assert_ne!(
        connected[0], connected[1],
        "connection numbers are never reused"
    );
    let status = w.listener.handle().status(&key).expect("registered");
    assert!(status.connected, "the new job is still connected");
}

#[tokio::test]
async fn manager_commands_are_checked_against_instance_connection_and_phase() {
    let w = Worker::new().await;
    let cmd = || get_state("m");
    assert!(matches!(
        w.send("job", "main", cmd()),
        Err(ListenerError::UnknownInstance(_))
    ));
    w.register(InstanceSpec::new("job", "main", "t"));
    assert!(matches!(
        w.send("job", "main", cmd()),
        Err(ListenerError::NotConnected(_))
    ));
    assert!(matches!(
        w.listener
            .handle()
            .register(InstanceSpec::new("job", "main", "x")),
        Err(ListenerError::AlreadyRegistered(_))
    ));
    let mut c = connect_migration_to(&w.url("job", "main"), "t")
        .await
        .expect("connect");
    w.send("job", "main", cmd()).expect("get-state");
    assert!(matches!(
        w.send("job", "main", get_state("n")),
        Err(ListenerError::Phase(_))
    ));
    let big = Json::from("x".repeat(70_000));
    let apply = Command::CutoverReady {
        migration_id: "m".into(),
        payload: big,
    };
    assert!(matches!(
        w.send("job", "main", apply),
        Err(ListenerError::FrameTooLarge { .. })
    ));
    assert!(matches!(
        c.next_event().await,
        Ok(Some(WorkerToJob::GetState { .. }))
    ));
    // A job refuses to send an oversized frame rather than be closed for it.
    assert!(matches!(
        c.send_state(Json::from("y".repeat(70_000))).await,
        Err(ClientError::FrameTooLarge(_))
    ));
}

// ── handover ───────────────────────────────────────────────────────────────────────────

/// Source worker, target worker, and the two job clients, brought to `phase_reached`.
struct Handover {
    src_worker: Worker,
    dst_worker: Worker,
    source: MigrationClient,
    target: Option<MigrationClient>,
}

const MID: &str = "mig-1";

impl Handover {
    async fn start() -> Self {
        let mut src_worker = Worker::new().await;
        let dst_worker = Worker::new().await;
        src_worker.register(InstanceSpec::new("job", "main", "src-token"));
        let source = connect_migration_to(&src_worker.url("job", "main"), "src-token")
            .await
            .expect("source connects");
        assert_eq!(source.target_of(), None);
        assert!(matches!(
            src_worker.event().await,
            EventKind::Connected {
                target_of: None,
                ..
            }
        ));
        Self {
            src_worker,
            dst_worker,
            source,
            target: None,
        }
    }

    async fn get_state(&mut self) {
        self.src_worker
            .send(
                "job",
                "main",
                Command::GetState {
                    migration_id: MID.into(),
                },
            )
            .expect("get-state");
        let ev = self.source.next_event().await.expect("event");
        assert_eq!(
            ev,
            Some(WorkerToJob::GetState {
                migration_id: MID.into()
            })
        );
    }

    async fn state(&mut self) -> Json {
        self.source
            .send_state(Json::parse(r#"{"position":1234,"__proto__":{"x":1}}"#).expect("json"))
            .await
            .expect("state");
        let (id, frame, phase) = self.src_worker.frame().await;
        assert_eq!((id.as_str(), phase), (MID, Phase::StateGiven));
        let JobToWorker::State { payload } = frame else {
            panic!("expected state, got {frame:?}")
        };
        assert_eq!(
            payload.to_json_string(),
            r#"{"position":1234}"#,
            "__proto__ dropped as the reference does"
        );
        payload
    }

    async fn start_target(&mut self, initial: Json) {
        let spec = InstanceSpec::new("job", "migrationTarget", "dst-token")
            .target_of(MID, initial.clone());
        self.dst_worker.register(spec);
        let mut target =
            connect_migration_to(&self.dst_worker.url("job", "migrationTarget"), "dst-token")
                .await
                .expect("target connects");
        assert_eq!(target.target_of(), Some(MID));
        let ev = target.next_event().await.expect("initial-state");
        assert_eq!(
            ev,
            Some(WorkerToJob::InitialState {
                migration_id: MID.into(),
                payload: initial
            })
        );
        assert!(matches!(
            self.dst_worker.event().await,
            EventKind::Connected {
                target_of: Some(_),
                ..
            }
        ));
        self.target = Some(target);
    }

    fn target(&mut self) -> &mut MigrationClient {
        self.target.as_mut().expect("target started")
    }

    async fn target_ready(&mut self) -> Json {
        self.target()
            .target_ready(Json::from("ready-at-1234"))
            .await
            .expect("target-ready");
        let (_, frame, phase) = self.dst_worker.frame().await;
        assert_eq!(phase, Phase::TargetReady);
        let JobToWorker::TargetReady { payload } = frame else {
            panic!("expected target-ready")
        };
        payload
    }

    async fn cutover_ready(&mut self, payload: Json) {
        let cmd = Command::CutoverReady {
            migration_id: MID.into(),
            payload: payload.clone(),
        };
        self.src_worker
            .send("job", "main", cmd)
            .expect("cutover-ready");
        let ev = self.source.next_event().await.expect("event");
        assert_eq!(
            ev,
            Some(WorkerToJob::CutoverReady {
                migration_id: MID.into(),
                payload
            })
        );
    }

    async fn source_stopped(&mut self) -> Json {
        self.source
            .source_stopped_output(Json::from(1235.5))
            .await
            .expect("stopped");
        let (_, frame, phase) = self.src_worker.frame().await;
        assert_eq!(phase, Phase::SourceStopped);
        let JobToWorker::SourceStoppedOutput { payload } = frame else {
            panic!("expected source-stopped-output")
        };
        payload
    }

    /// Brings the handover to just after step `n` (1 = get-state sent … 5 = cutover-ready sent).
    async fn to_step(n: u8) -> Self {
        let mut h = Self::start().await;
        h.get_state().await;
        if n >= 2 {
            let state = h.state().await;
            if n >= 3 {
                h.start_target(state).await;
            }
            if n >= 4 {
                let ready = h.target_ready().await;
                if n >= 5 {
                    h.cutover_ready(ready).await;
                }
            }
        }
        h
    }
}

#[tokio::test]
async fn a_full_handover_relays_every_frame_between_source_and_target() {
    let mut h = Handover::to_step(5).await;
    let stopped = h.source_stopped().await;
    assert_eq!(stopped, Json::from(1235.5));
    let cmd = Command::CutoverApply {
        migration_id: MID.into(),
        payload: stopped.clone(),
    };
    h.dst_worker
        .send("job", "migrationTarget", cmd)
        .expect("cutover-apply");
    let ev = h.target().next_event().await.expect("event");
    assert_eq!(
        ev,
        Some(WorkerToJob::CutoverApply {
            migration_id: MID.into(),
            payload: stopped
        })
    );
    let summary = TargetApplied {
        applied: Some(vec!["video".into()]),
        failed: Some(vec![FailedParticipant {
            id: "audio".into(),
            reason: "codec".into(),
        }]),
        skew_ms: Some(3.5),
    };
    h.target()
        .target_applied(summary.clone())
        .await
        .expect("applied");
    let (_, frame, phase) = h.dst_worker.frame().await;
    assert_eq!(
        (frame, phase),
        (JobToWorker::TargetApplied(summary), Phase::Applied)
    );
    assert_eq!(
        h.src_worker.phase("job", "main"),
        Some(Phase::SourceStopped)
    );
    // Past the point of no return neither side may abort.
    assert!(
        h.src_worker
            .send(
                "job",
                "main",
                Command::Abort {
                    migration_id: MID.into(),
                    reason: "late".into()
                }
            )
            .is_err()
    );
    h.source.abort("too late").await.expect("sent");
    assert!(matches!(
        h.source.next_event().await,
        Err(ClientError::Closed {
            code: Some(4400),
            ..
        })
    ));
}

#[tokio::test]
async fn a_refused_state_ends_the_migration_on_the_source() {
    let mut h = Handover::to_step(1).await;
    h.source.refuse_state("mid-ad-break").await.expect("refuse");
    let (_, frame, phase) = h.src_worker.frame().await;
    assert_eq!(
        (frame, phase),
        (
            JobToWorker::StateRefused {
                reason: "mid-ad-break".into()
            },
            Phase::Refused
        )
    );
    // The instance is free for a new migration.
    h.src_worker
        .send("job", "main", get_state("mig-2"))
        .expect("new get-state");
}

#[tokio::test]
async fn the_source_job_can_abort_at_every_abortable_phase() {
    for step in [1u8, 2, 5] {
        let mut h = Handover::to_step(step).await;
        h.source.abort("operator said so").await.expect("abort");
        let (id, frame, phase) = h.src_worker.frame().await;
        assert_eq!((id.as_str(), phase), (MID, Phase::Aborted), "step {step}");
        assert_eq!(
            frame,
            JobToWorker::Abort {
                reason: "operator said so".into()
            }
        );
    }
}

#[tokio::test]
async fn the_target_job_can_abort_until_cutover_apply() {
    for step in [3u8, 4] {
        let mut h = Handover::to_step(step).await;
        h.target().abort("cannot decode").await.expect("abort");
        let (_, _, phase) = h.dst_worker.frame().await;
        assert_eq!(phase, Phase::Aborted, "step {step}");
    }
}

#[tokio::test]
async fn the_manager_can_abort_either_side_at_every_abortable_phase() {
    for step in [1u8, 2, 3, 4, 5] {
        let mut h = Handover::to_step(step).await;
        let abort = || Command::Abort {
            migration_id: MID.into(),
            reason: "operator".into(),
        };
        h.src_worker
            .send("job", "main", abort())
            .expect("abort source");
        let ev = h.source.next_event().await.expect("event");
        assert_eq!(
            ev,
            Some(WorkerToJob::Abort {
                migration_id: MID.into(),
                reason: "operator".into()
            }),
            "step {step}"
        );
        assert_eq!(h.src_worker.phase("job", "main"), Some(Phase::Aborted));
        if step >= 3 {
            h.dst_worker
                .send("job", "migrationTarget", abort())
                .expect("abort target");
            let ev = h.target().next_event().await.expect("event");
            assert!(matches!(ev, Some(WorkerToJob::Abort { .. })), "step {step}");
            assert_eq!(
                h.dst_worker.phase("job", "migrationTarget"),
                Some(Phase::Aborted)
            );
        }
    }
}

#[tokio::test]
async fn a_reconnecting_target_is_sent_its_initial_state_again() {
    let mut h = Handover::to_step(3).await;
    let again =
        connect_migration_to(&h.dst_worker.url("job", "migrationTarget"), "dst-token").await;
    let mut again = again.expect("reconnect");
    assert_eq!(again.target_of(), Some(MID));
    assert!(matches!(
        again.next_event().await,
        Ok(Some(WorkerToJob::InitialState { .. }))
    ));
    assert!(matches!(
        h.target().next_event().await,
        Err(ClientError::Closed {
            code: Some(4409),
            ..
        })
    ));
}

#[tokio::test]
async fn unregistering_closes_the_job_normally() {
    let mut h = Handover::start().await;
    assert!(
        h.src_worker
            .listener
            .handle()
            .unregister(&InstanceKey::new("job", "main"))
    );
    assert!(matches!(h.source.next_event().await, Ok(None)));
    assert!(matches!(
        h.src_worker.event().await,
        EventKind::Disconnected {
            code: Some(1000),
            ..
        }
    ));
}

#[tokio::test]
async fn shutdown_closes_jobs_with_going_away() {
    let w = Worker::new().await;
    w.register(InstanceSpec::new("job", "main", "t"));
    let mut ws = raw(&w.url("job", "main")).await;
    hello(&mut ws, "t").await;
    w.listener.shutdown().await;
    assert_eq!(closed_with(&mut ws).await.0, 1001);
}

#[tokio::test]
async fn without_the_env_names_the_client_is_a_no_op() {
    if std::env::var_os("NORSK_WORKER_WS_URL").is_some()
        || std::env::var_os("NORSK_WORKER_TOKEN").is_some()
    {
        eprintln!("SKIPPED: NORSK_WORKER_* set in this environment");
        return;
    }
    let mut c = connect_migration().await.expect("disabled client");
    assert!(!c.is_enabled());
    assert_eq!(c.target_of(), None);
    c.send_state(Json::Null).await.expect("no-op send");
    c.abort("x").await.expect("no-op abort");
    assert!(matches!(c.next_event().await, Ok(None)));
    assert!(!MigrationClient::disabled().is_enabled());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_stops_reading_is_dropped_without_blocking_the_manager_or_other_jobs() {
    let config = ListenerConfig {
        outbound_queue: 4,
        write_timeout: Duration::from_millis(300),
        ..ListenerConfig::loopback()
    };
    let mut w = Worker::start(config).await;
    w.register(InstanceSpec::new("job", "slow", "t"));
    w.register(InstanceSpec::new("job", "ok", "t"));
    let mut slow = raw(&w.url("job", "slow")).await;
    hello(&mut slow, "t").await; // … and never reads again
    let mut ok = connect_migration_to(&w.url("job", "ok"), "t")
        .await
        .expect("connect");
    let reason = "r".repeat(60_000);
    let mut dropped = false;
    'sending: for i in 0..20_000 {
        let id = format!("m{i}");
        let cmds = [
            Command::GetState {
                migration_id: id.clone(),
            },
            Command::Abort {
                migration_id: id,
                reason: reason.clone(),
            },
        ];
        for cmd in cmds {
            // `send` is synchronous: it can only enqueue or refuse, never wait for the job.
            match w.send("job", "slow", cmd) {
                Ok(()) => {}
                Err(ListenerError::SlowPeer(_) | ListenerError::NotConnected(_)) => {
                    dropped = true;
                    break 'sending;
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
        tokio::task::yield_now().await;
    }
    assert!(dropped, "a job that never reads must be cut off");
    // Another job on the same worker is unaffected.
    w.send("job", "ok", get_state("x")).expect("get-state");
    assert!(matches!(
        ok.next_event().await,
        Ok(Some(WorkerToJob::GetState { .. }))
    ));
    // And the slow job's connection task ends.
    loop {
        let ev = tokio::time::timeout(WAIT, w.events.recv())
            .await
            .expect("in time")
            .expect("event");
        if ev.instance.role == "slow" && matches!(ev.kind, EventKind::Disconnected { .. }) {
            break;
        }
    }
}

#[tokio::test]
async fn a_text_frame_that_is_not_utf8_is_closed_4400() {
    use tokio_tungstenite::tungstenite::protocol::frame::Frame;
    use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};
    let w = Worker::new().await;
    w.register(InstanceSpec::new("job", "main", "t"));
    let mut ws = raw(&w.url("job", "main")).await;
    hello(&mut ws, "t").await;
    let frame = Frame::message(vec![b'"', 0xff, b'"'], OpCode::Data(Data::Text), true);
    ws.send(Message::Frame(frame)).await.expect("send");
    assert_eq!(
        closed_with(&mut ws).await,
        (4400, "frame is not valid UTF-8".to_owned())
    );
}

// ── connection caps and the idle timeout ────────────────────────────────────────────────

/// A TCP connection to the listener from `from` (any 127.0.0.0/8 address is this host).
async fn tcp_from(from: [u8; 4], to: std::net::SocketAddr) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from((from, 0)))
        .expect("bind");
    socket.connect(to).await.expect("connect")
}

/// What the listener answers before closing, if it closes within `within` (an admitted
/// connection waits for its upgrade instead).
async fn refusal(stream: &mut tokio::net::TcpStream, within: Duration) -> Option<String> {
    use tokio::io::AsyncReadExt;
    let mut answer = Vec::new();
    match tokio::time::timeout(within, stream.read_to_end(&mut answer)).await {
        Ok(_) => Some(String::from_utf8_lossy(&answer).into_owned()),
        Err(_) => None,
    }
}

/// Waits until the listener's (open, refused) connection counts satisfy `ok`.
async fn connections_until(w: &Worker, what: &str, ok: impl Fn((usize, u64)) -> bool) {
    let handle = w.listener.handle();
    tokio::time::timeout(WAIT, async {
        while !ok(handle.connections()) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{what}: {:?}", handle.connections()));
}

async fn open_connections(w: &Worker, want: usize) {
    connections_until(w, &format!("{want} open"), |(open, _)| open == want).await;
}

#[tokio::test]
async fn connections_over_the_total_or_per_peer_cap_are_refused_with_503_and_slots_come_back() {
    let config = ListenerConfig {
        max_connections: 5,
        max_connections_per_peer: 3,
        hello_timeout: Duration::from_secs(30),
        ..ListenerConfig::loopback()
    };
    let w = Worker::start(config).await;
    let addr = w.listener.local_addr();
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(tcp_from([127, 0, 0, 1], addr).await);
    }
    open_connections(&w, 3).await;
    // A fourth from the same peer.
    let mut extra = tcp_from([127, 0, 0, 1], addr).await;
    let answer = refusal(&mut extra, WAIT).await.expect("refused");
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer:?}");
    // Other peers fill the total.
    for _ in 0..2 {
        held.push(tcp_from([127, 0, 0, 2], addr).await);
    }
    open_connections(&w, 5).await;
    let mut extra = tcp_from([127, 0, 0, 3], addr).await;
    assert!(refusal(&mut extra, WAIT).await.is_some(), "over the total");
    assert_eq!(w.listener.handle().connections(), (5, 2));
    // The held ones were admitted: they are waiting for their upgrade, not closed.
    assert!(
        refusal(&mut held[0], Duration::from_millis(100))
            .await
            .is_none()
    );
    // A closed connection gives its slot back; a job can then connect and hand over as usual.
    held.truncate(2);
    open_connections(&w, 2).await;
    w.register(InstanceSpec::new("job", "main", "t"));
    let mut ws = raw(&w.url("job", "main")).await;
    assert!(matches!(
        hello(&mut ws, "t").await,
        WorkerToJob::HelloAck { .. }
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_connections_is_refused_and_the_listener_keeps_serving_jobs() {
    let config = ListenerConfig {
        max_connections: 64,
        max_connections_per_peer: 32,
        hello_timeout: Duration::from_secs(30),
        ..ListenerConfig::loopback()
    };
    let w = Worker::start(config).await;
    let addr = w.listener.local_addr();
    let mut flood = Vec::new();
    for _ in 0..600 {
        flood.push(tcp_from([127, 0, 0, 9], addr).await);
    }
    connections_until(&w, "the flood refused", |(_, refused)| refused >= 600 - 32).await;
    let handle = w.listener.handle();
    assert_eq!(handle.connections(), (32, 600 - 32));
    // A job from another address is not locked out by the flood.
    w.register(InstanceSpec::new("job", "main", "t"));
    let mut ws = raw(&w.url("job", "main")).await;
    assert!(matches!(
        hello(&mut ws, "t").await,
        WorkerToJob::HelloAck { .. }
    ));
    drop(flood);
    open_connections(&w, 1).await;
}

/// 1,500 connections from one peer opened at once, more than the accept queue a listener gets
/// by default (1,024): every one is answered, a slot (closed at the hello timeout) or a 503,
/// none left waiting on the kernel's SYN-ACK retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_connections_is_queued_and_every_one_is_answered() {
    // Slots are held until the hello timeout, so the whole burst meets a full peer cap.
    let config = ListenerConfig {
        hello_timeout: Duration::from_secs(3),
        ..ListenerConfig::loopback()
    };
    let w = Worker::start(config).await;
    let addr = w.listener.local_addr();
    let connect = |_| async move {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, 7], 0)))
            .expect("bind");
        tokio::time::timeout(WAIT, socket.connect(addr))
            .await
            .expect("connected in time")
            .expect("connect")
    };
    let mut burst = futures::future::join_all((0..1_500).map(connect)).await;
    let answers = futures::future::join_all(
        burst
            .iter_mut()
            .map(|s| refusal(s, Duration::from_secs(10))),
    )
    .await;
    let unanswered = answers.iter().filter(|a| a.is_none()).count();
    let busy = answers
        .iter()
        .flatten()
        .filter(|a| a.starts_with("HTTP/1.1 503"))
        .count();
    assert_eq!(unanswered, 0, "{busy} refused with 503");
    // The peer's cap (1,024) held: the rest were refused.
    assert_eq!(busy, 1_500 - 1_024);
}

#[tokio::test]
async fn an_authenticated_job_that_sends_nothing_not_even_a_pong_is_closed_after_the_idle_timeout()
{
    let config = ListenerConfig {
        idle_timeout: Duration::from_millis(300),
        ..ListenerConfig::loopback()
    };
    let mut w = Worker::start(config).await;
    w.register(InstanceSpec::new("job", "live", "t"));
    w.register(InstanceSpec::new("job", "gone", "t"));
    // A live job that never sends a frame but reads its socket answers the pings by itself.
    let mut live = connect_migration_to(&w.url("job", "live"), "t")
        .await
        .expect("connect");
    let mut gone = raw(&w.url("job", "gone")).await;
    hello(&mut gone, "t").await;
    let reading = tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_millis(1500), live.next_event()).await;
        live
    });
    // The silent one is closed with 1001 and the reason; the live one stays.
    loop {
        if let EventKind::Disconnected { code, reason, .. } = w.event().await {
            assert_eq!(code, Some(1001), "{reason}");
            assert!(reason.contains("not even a pong"), "{reason}");
            break;
        }
    }
    let status = |role: &str| w.listener.handle().status(&InstanceKey::new("job", role));
    assert!(!status("gone").expect("gone").connected);
    let _live = reading.await.expect("reader");
    assert!(
        status("live").expect("live").connected,
        "a job that pongs is not idle"
    );
    // Its socket is closed (the close frame may be lost behind the pings it never answered).
    closed_with(&mut gone).await;
}
