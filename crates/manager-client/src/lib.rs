//! The operator's view of Norsk Manager: a gRPC client plus **the mirror**,
//! an in-memory copy of Manager's nodes (with inventories), jobs, bundles and
//! migrations kept current from the server-streaming `Watch` call.
//!
//! # How it behaves
//!
//! - [`ManagerClient::connect`] validates the [`ClientConfig`], creates a lazily
//!   connecting channel (connect timeout, optional TLS and bearer token) and
//!   starts one background task that owns the `Watch` stream.
//! - The first stream asks for a snapshot (`resume_revision = 0`); later ones
//!   resume from the mirror's revision and epoch. When Manager cannot resume
//!   (revision older than its event log, or its world was reset) it sends a
//!   snapshot instead, and the mirror emits exactly the differences as
//!   [`MirrorChange`]s followed by [`MirrorChange::Resynced`], so controllers
//!   see what changed while disconnected.
//! - Events at or below the mirror's revision are ignored and a gap forces a
//!   resume, so no event is applied twice or skipped.
//! - A stalled Manager is a failure, not a wait: a Watch that has not sent
//!   `Synced` within [`ClientConfig::sync_timeout`], or an open stream silent
//!   for [`ClientConfig::idle_timeout`] (Manager is asked for a heartbeat every
//!   [`ClientConfig::heartbeat_interval`]), is dropped and retried with
//!   backoff, and the state says `transientFailure` meanwhile.
//! - Connection state (`idle | connecting | ready | transientFailure |
//!   shutdown`) is a `tokio::sync::watch` ([`ManagerClient::state`]); `ready`
//!   means synced. Reconnects use exponential backoff with full jitter
//!   (200 ms doubling to 30 s by default, reset after a successful sync).
//! - Changes go to a `tokio::sync::broadcast` ([`ManagerClient::subscribe`]);
//!   a receiver that lags should re-read the whole mirror.
//! - Below the client sits one [`ManagerPort`]: [`GrpcPort`] for Manager's gRPC API
//!   ([`ManagerClient::connect`]), [`InProcess`] for a Manager service called in this process
//!   ([`ManagerClient::over`]), or an adapter of another transport.
//! - Commands wrap the unary RPCs with a per-call deadline and return typed
//!   [`ClientError`]s; a worker refusing a start is [`ClientError::Rejected`].
//! - [`ManagerClient::close`] is idempotent; commands after it fail with
//!   [`ClientError::Closed`].
//!
//! The pure update rules ([`MirrorState::apply_event`],
//! [`MirrorState::replace`]) have no I/O and are property-tested against
//! manager-sim's own world model.
//!
//! # Example: sim in process, client, mirror, changes, commands
//!
//! ```no_run
//! use std::time::Duration;
//! use manager_client::{ClientConfig, ManagerClient, MirrorChange};
//! use manager_proto::{Bundle, BundleJob, CreateNodeRequest, JobRequirements, JobRole};
//! use manager_sim::{Sim, SimConfig};
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! // 1. A real Manager simulator on 127.0.0.1:<free port>, stopped on drop.
//! let sim = Sim::start(SimConfig::demo()).await?;
//!
//! // 2. Connect and wait for the first sync.
//! let client = ManagerClient::connect(ClientConfig::new(sim.endpoint())).await?;
//! client.wait_ready(Duration::from_secs(5)).await?;
//!
//! // 3. Subscribe to changes (controller triggers).
//! let mut changes = client.subscribe();
//!
//! // 4. Commands.
//! let node = client
//!     .create_node(CreateNodeRequest { pool: "aws-east".into(), ..Default::default() })
//!     .await?;
//! let bundle = Bundle {
//!     bundle_id: "channel-1".into(),
//!     replicas: 2,
//!     jobs: vec![BundleJob {
//!         job_name: "encode".into(),
//!         requirements: Some(JobRequirements { required_capacity: 8.0, required_cores: 4, ..Default::default() }),
//!         ..Default::default()
//!     }],
//!     ..Default::default()
//! };
//! let registered = client.register_bundle(bundle).await?; // job ids "channel-1/0/encode", "channel-1/1/encode"
//! let node_id = node.node_id.clone();
//! client.wait_until(Duration::from_secs(5), |m| {
//!     m.nodes.get(&node_id).is_some_and(|n| n.inventory.is_some())
//! }).await?;
//! client.start_job(&registered.job_ids[0], &node.node_id, JobRole::Normal).await?;
//!
//! // 5. Read the mirror and react to changes.
//! let running = client.mirror().read(|m| m.jobs.len());
//! while let Ok(change) = changes.recv().await {
//!     if let MirrorChange::JobUpserted(job) = change {
//!         println!("{} is now {:?} ({running} jobs mirrored)", job.job_id, job.state());
//!         break;
//!     }
//! }
//! client.close().await;
//! # Ok(()) }
//! ```

mod client;
pub mod mirror;
pub mod port;
pub mod published;

pub use client::{
    AuthInterceptor, ClientConfig, ClientError, ConnectionState, ManagerClient, TlsOptions,
    WriteFence, backoff_delay,
};
pub use manager_proto as proto;
pub use mirror::{Mirror, MirrorChange, MirrorState, SnapshotData};
pub use port::{GrpcPort, InProcess, ManagerFeatures, ManagerPort, WatchStream};

/// How a port's refusal to terminate a node begins when jobs of another client of the same
/// Manager run on it (a `FAILED_PRECONDITION`): a drain waits for them rather than end them.
pub const OTHER_CLIENTS_JOBS: &str = "jobs of another client run on the node";
