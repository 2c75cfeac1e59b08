//! A stalled Manager: one that accepts the Watch and never answers, or goes silent after
//! `Synced`. The client must call that a failure within its deadlines and keep retrying, and
//! heartbeats must keep a merely quiet stream alive.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{bundle, config, fast};
use manager_client::{ClientConfig, ClientError, ConnectionState, ManagerClient};
use manager_proto::manager_client::ManagerClient as RawClient;
use manager_proto::manager_server::{Manager, ManagerServer};
use manager_proto::{
    CreateNodeRequest, CreateNodeResponse, DeleteBundleRequest, DeleteBundleResponse,
    ListNodesRequest, ListNodesResponse, ListPoolsRequest, ListPoolsResponse, MigrationResponse,
    NodeControllerMigrationAbort, NodeControllerMigrationCutover, NodeControllerMigrationGetState,
    NodeControllerMigrationPrepareTarget, RegisterBundleRequest, RegisterBundleResponse,
    StartJobRequest, StartJobResponse, StartNodeRequest, StartNodeResponse, StopJobRequest,
    StopJobResponse, StopNodeRequest, StopNodeResponse, TerminateNodeRequest,
    TerminateNodeResponse, UpdateJobConfigRequest, UpdateJobConfigResponse, WatchRequest,
    WatchResponse, watch_response,
};
use manager_sim::Sim;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// How the fake Manager ignores a Watch.
#[derive(Clone, Copy)]
enum Silence {
    /// The call is accepted (response headers sent) and the stream never yields.
    OpenStream,
    /// The handler never returns: not even response headers.
    NoHeaders,
}

/// A Manager that accepts connections and Watch calls and never answers them.
#[derive(Clone)]
struct SilentManager {
    silence: Silence,
    watches: Arc<AtomicUsize>,
}

type Reply<T> = Result<Response<T>, Status>;

async fn never<T>() -> Reply<T> {
    std::future::pending().await
}

#[tonic::async_trait]
impl Manager for SilentManager {
    async fn create_node(&self, _: Request<CreateNodeRequest>) -> Reply<CreateNodeResponse> {
        never().await
    }
    async fn terminate_node(
        &self,
        _: Request<TerminateNodeRequest>,
    ) -> Reply<TerminateNodeResponse> {
        never().await
    }
    async fn stop_node(&self, _: Request<StopNodeRequest>) -> Reply<StopNodeResponse> {
        never().await
    }
    async fn start_node(&self, _: Request<StartNodeRequest>) -> Reply<StartNodeResponse> {
        never().await
    }
    async fn list_nodes(&self, _: Request<ListNodesRequest>) -> Reply<ListNodesResponse> {
        never().await
    }
    async fn list_pools(&self, _: Request<ListPoolsRequest>) -> Reply<ListPoolsResponse> {
        never().await
    }
    async fn register_bundle(
        &self,
        _: Request<RegisterBundleRequest>,
    ) -> Reply<RegisterBundleResponse> {
        never().await
    }
    async fn update_bundle(
        &self,
        _: Request<RegisterBundleRequest>,
    ) -> Reply<RegisterBundleResponse> {
        never().await
    }
    async fn delete_bundle(&self, _: Request<DeleteBundleRequest>) -> Reply<DeleteBundleResponse> {
        never().await
    }
    async fn start_job(&self, _: Request<StartJobRequest>) -> Reply<StartJobResponse> {
        never().await
    }
    async fn stop_job(&self, _: Request<StopJobRequest>) -> Reply<StopJobResponse> {
        never().await
    }
    async fn update_job_config(
        &self,
        _: Request<UpdateJobConfigRequest>,
    ) -> Reply<UpdateJobConfigResponse> {
        never().await
    }
    async fn migration_get_state(
        &self,
        _: Request<NodeControllerMigrationGetState>,
    ) -> Reply<MigrationResponse> {
        never().await
    }
    async fn migration_prepare_target(
        &self,
        _: Request<NodeControllerMigrationPrepareTarget>,
    ) -> Reply<MigrationResponse> {
        never().await
    }
    async fn migration_cutover(
        &self,
        _: Request<NodeControllerMigrationCutover>,
    ) -> Reply<MigrationResponse> {
        never().await
    }
    async fn migration_abort(
        &self,
        _: Request<NodeControllerMigrationAbort>,
    ) -> Reply<MigrationResponse> {
        never().await
    }

    type WatchStream =
        Pin<Box<dyn futures::Stream<Item = Result<WatchResponse, Status>> + Send + 'static>>;

    async fn watch(&self, _: Request<WatchRequest>) -> Reply<Self::WatchStream> {
        self.watches.fetch_add(1, Ordering::SeqCst);
        match self.silence {
            Silence::OpenStream => Ok(Response::new(Box::pin(futures::stream::pending()))),
            Silence::NoHeaders => never().await,
        }
    }
}

/// Serves a [`SilentManager`] on loopback; returns its endpoint and its Watch call count.
async fn silent_manager(silence: Silence) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let watches = Arc::new(AtomicUsize::new(0));
    let svc = SilentManager {
        silence,
        watches: watches.clone(),
    };
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ManagerServer::new(svc))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    (format!("http://{addr}"), watches)
}

/// Fast backoff and short Watch deadlines.
fn deadlines(
    endpoint: String,
    sync: Duration,
    heartbeat: Duration,
    idle: Duration,
) -> ClientConfig {
    let mut c = fast(endpoint);
    c.sync_timeout = sync;
    c.heartbeat_interval = heartbeat;
    c.idle_timeout = idle;
    c
}

/// Waits for `want`, returning how long it took.
async fn state_reached(
    client: &ManagerClient,
    want: ConnectionState,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    let mut rx = client.state();
    tokio::time::timeout(within, rx.wait_for(|s| *s == want))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "not {want:?} within {within:?}: {:?}, last error {:?}",
                client.connection_state(),
                client.last_error()
            )
        })
        .unwrap();
    start.elapsed()
}

#[tokio::test]
async fn a_manager_that_accepts_the_watch_and_never_answers_is_a_transient_failure_retried() {
    for silence in [Silence::OpenStream, Silence::NoHeaders] {
        let (endpoint, watches) = silent_manager(silence).await;
        let sync = Duration::from_millis(400);
        let cfg = deadlines(
            endpoint,
            sync,
            Duration::from_millis(100),
            Duration::from_secs(5),
        );
        let client = ManagerClient::connect(cfg).await.unwrap();
        let mut states = client.state();
        let took = state_reached(
            &client,
            ConnectionState::TransientFailure,
            Duration::from_secs(3),
        )
        .await;
        // Not before the deadline, and not much after it.
        assert!(took >= sync - Duration::from_millis(50), "{took:?}");
        assert!(took < sync + Duration::from_secs(1), "{took:?}");
        let error = client.last_error().unwrap_or_default();
        assert!(error.contains("sync deadline"), "{error}");
        // It keeps trying (with backoff), and never calls the silence ready.
        tokio::time::timeout(Duration::from_secs(5), async {
            while watches.load(Ordering::SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("three Watch attempts");
        assert!(states.has_changed().unwrap());
        assert_ne!(*states.borrow_and_update(), ConnectionState::Ready);
        assert!(client.wait_ready(Duration::from_millis(200)).await.is_err());
        client.close().await;
    }
}

#[tokio::test]
async fn a_stream_silent_after_synced_is_a_transient_failure_and_resumes_when_manager_answers() {
    let sim = Sim::start(config()).await.unwrap();
    let idle = Duration::from_millis(500);
    let cfg = deadlines(
        sim.endpoint(),
        Duration::from_secs(5),
        Duration::from_millis(100),
        idle,
    );
    let client = ManagerClient::connect(cfg).await.unwrap();
    client.wait_ready(common::WAIT).await.unwrap();

    sim.stall_watches(true);
    // A change Manager makes while its stream is stalled.
    sim.with_world(|w, now| w.register_bundle(&bundle("during", 1, 1.0, 0), now))
        .unwrap();
    let took = state_reached(
        &client,
        ConnectionState::TransientFailure,
        Duration::from_secs(3),
    )
    .await;
    assert!(took < idle + Duration::from_secs(1), "{took:?}");
    let error = client.last_error().unwrap_or_default();
    assert!(error.contains("not even a heartbeat"), "{error}");
    assert!(client.mirror().read(|m| m.bundles.is_empty()));
    // Stays out of ready while Manager is stalled: every new stream fails its deadline too.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_ne!(client.connection_state(), ConnectionState::Ready);

    sim.stall_watches(false);
    state_reached(&client, ConnectionState::Ready, common::WAIT).await;
    client
        .wait_until(common::WAIT, |m| m.bundles.contains_key("during"))
        .await
        .unwrap();
    client.close().await;
}

#[tokio::test]
async fn heartbeats_keep_a_quiet_stream_ready() {
    let sim = Sim::start(config()).await.unwrap();
    let cfg = deadlines(
        sim.endpoint(),
        Duration::from_secs(5),
        Duration::from_millis(100),
        Duration::from_millis(400),
    );
    let client = ManagerClient::connect(cfg).await.unwrap();
    client.wait_ready(common::WAIT).await.unwrap();
    let mut states = client.state();
    states.borrow_and_update();
    // Nothing happens in the world for several idle timeouts.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!states.has_changed().unwrap(), "{:?}", client.last_error());
    assert_eq!(client.connection_state(), ConnectionState::Ready);
    assert_eq!(client.last_error(), None);
    client.close().await;
}

/// The stream's next message, within 2 s.
async fn next(stream: &mut tonic::Streaming<WatchResponse>) -> WatchResponse {
    tokio::time::timeout(Duration::from_secs(2), stream.message())
        .await
        .expect("a message within 2 s")
        .expect("no error")
        .expect("not the end")
}

#[tokio::test]
async fn manager_sends_heartbeats_with_the_revision_sent_and_refuses_bad_intervals() {
    let sim = Sim::start(config()).await.unwrap();
    sim.with_world(|w, now| w.register_bundle(&bundle("b", 1, 1.0, 0), now))
        .unwrap();
    let mut raw = RawClient::connect(sim.endpoint()).await.unwrap();
    let mut stream = raw
        .watch(WatchRequest {
            heartbeat_interval_ms: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let synced = loop {
        if let Some(watch_response::Kind::Synced(s)) = stream.message().await.unwrap().unwrap().kind
        {
            break s;
        }
    };
    let Some(watch_response::Kind::Heartbeat(h)) = next(&mut stream).await.kind else {
        panic!("a heartbeat after Synced");
    };
    assert_eq!(
        (h.epoch.as_str(), h.revision),
        (synced.epoch.as_str(), synced.revision)
    );
    // An event, then the next heartbeat carries its revision.
    sim.with_world(|w, now| w.delete_bundle("b", now)).unwrap();
    let Some(watch_response::Kind::Events(batch)) = next(&mut stream).await.kind else {
        panic!("the events");
    };
    let last = batch.events.last().unwrap().revision;
    let Some(watch_response::Kind::Heartbeat(h)) = next(&mut stream).await.kind else {
        panic!("a heartbeat after the events");
    };
    assert_eq!(h.revision, last);

    for bad in [1, 99, 3_600_001, u64::MAX] {
        let status = raw
            .watch(WatchRequest {
                heartbeat_interval_ms: bad,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{bad}: {status:?}"
        );
        assert!(
            status.message().contains("heartbeat_interval_ms"),
            "{status:?}"
        );
    }
}

/// Makes a config's Watch deadlines unworkable.
type Spoil = fn(&mut ClientConfig);

#[tokio::test]
async fn watch_deadlines_that_cannot_work_are_config_errors() {
    let base = || ClientConfig::new("http://127.0.0.1:1");
    let cases: [(&str, Spoil); 4] = [
        ("sync_timeout", |c| c.sync_timeout = Duration::ZERO),
        ("heartbeat_interval", |c| {
            c.heartbeat_interval = Duration::from_millis(10)
        }),
        ("heartbeat_interval", |c| {
            c.heartbeat_interval = Duration::from_secs(7200)
        }),
        ("idle_timeout", |c| c.idle_timeout = c.heartbeat_interval),
    ];
    for (field, set) in cases {
        let mut c = base();
        set(&mut c);
        match ManagerClient::connect(c).await {
            Err(ClientError::Config(m)) => assert!(m.contains(field), "{m}"),
            other => panic!("{field}: {other:?}"),
        }
    }
    // Without heartbeats any positive idle timeout will do.
    let mut c = base();
    c.heartbeat_interval = Duration::ZERO;
    c.idle_timeout = Duration::from_secs(60);
    ManagerClient::connect(c).await.unwrap().close().await;
}
