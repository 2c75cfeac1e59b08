//! `manager-sim`: a real tonic Norsk Manager for the demo and every test.
//!
//! It serves the `norsk.manager.v1.Manager` gRPC API (see
//! `proto/norsk/manager/v1/manager.proto` and `docs/manager-api.md`) plus a
//! `SimAdmin` service for fault injection, over loopback or any address.
//!
//! # Layers
//!
//! - [`world`]: the pure state machine. Commands and timer ticks in, events
//!   out; no I/O, no clock, no async. Pools (elastic ones provision after a
//!   delay, fixed ones have declared nodes), worker-side enforcement (a start
//!   beyond free capacity, free cores or missing capabilities is refused with
//!   a typed [`manager_proto::RejectionReason`] and a `JobRejected` event),
//!   job lifecycle `starting → running → stopping → stopped | failed`, node
//!   termination emitting `JobStopping` for every hosted instance, bundles
//!   expanded into one job per replica × job name with the deterministic id
//!   `<bundleId>/<replica>/<jobName>` (replica 0-based), migrations.
//! - [`server`]: the tonic layer: bearer token (compared in constant time),
//!   optional TLS (rustls), request size caps, a bounded buffer per watcher
//!   (a watcher that falls behind is cut with `RESOURCE_EXHAUSTED` instead of
//!   growing memory), the bounded event log that lets a client resume, the
//!   `--state-dir` persistence (a JSON file rewritten atomically at most every
//!   250 ms and on shutdown; the published API's world keeps a file of its own
//!   beside it), and the timer task.
//! - [`config`]: the YAML file (see `examples/demo.yaml` and
//!   `docs/manager-sim.md`); unknown keys are errors and every problem is
//!   listed.
//!
//! # Migration and the job socket
//!
//! The four `NodeControllerMigration*` calls move a migration through its
//! phases, but the answers (`state`, `target-ready`, `source-stopped-output`,
//! `target-applied`, or `state-refused` / `abort`) come from the job. The
//! world emits them as [`world::JobAsk`]s and takes the answers back through
//! [`world::World::migration_reply`]; the server hands each ask to a
//! [`JobAgent`]. Two agents exist:
//!
//! - [`SocketAgent`] (`manager-sim serve`'s default, and
//!   [`Sim::start_with_job_socket`] in tests): the sim runs one real
//!   `job-socket` listener on `127.0.0.1:0` standing in for every worker's
//!   (a real deployment has one per worker host), registers each running
//!   instance, and runs a simulated job per instance that connects with the
//!   real job client SDK and answers like a handover-capable job. Per-job
//!   switches ([`behaviour`]: refuse state, slow cutover, fail a
//!   participant, abort at a point) come from the YAML's `jobSocket:`
//!   section ([`SimSetup`]) or `SimAdmin.SetMigrationBehaviour`
//!   (`manager-sim chaos migration-behaviour`).
//! - [`DefaultAgent`] ([`Sim::start`], `serve --no-job-socket`): in
//!   process, answers like a cooperative job with nothing to hand over.
//!   [`Sim::start`] keeps it so existing tests need no sockets.
//!
//! Either way nodes advertise `norsk.io/job-socket` per pool
//! (`jobSocket: true|false`, default true); a node without it gets no
//! listener, so the socket agent aborts a handover touching it.
//!
//! # Use in tests
//!
//! ```no_run
//! # async fn t() -> Result<(), manager_sim::SimError> {
//! use manager_sim::{Sim, SimConfig};
//! let sim = Sim::start(SimConfig::demo()).await?; // 127.0.0.1:<free port>
//! let endpoint = sim.endpoint();                   // "http://127.0.0.1:PORT"
//! // set up state fast, bypassing gRPC (events still reach watchers):
//! sim.with_world(|world, now| world.reject_next(1));
//! sim.shutdown().await; // or just drop it
//! # Ok(()) }
//! ```
//!
//! As a binary: `manager-sim serve --config examples/demo.yaml [--state-dir
//! DIR] [--token T]` prints `manager-sim listening on 127.0.0.1:PORT`;
//! `manager-sim chaos kill-node ID --addr http://127.0.0.1:PORT` and friends
//! inject faults.

pub mod behaviour;
pub mod config;
pub mod exec;
pub mod handshake;
pub mod overrides;
pub mod published;
pub mod server;
pub mod socket_agent;
pub mod validate;
pub mod world;

pub use behaviour::{AbortAt, BehaviourError, JobBehaviour, JobSocketConfig};
pub use config::{SimConfig, SimSetup};
pub use server::{
    DefaultAgent, FAIL_JOB_ROLE_HEADER, FnAgent, JobAgent, JobEvents, Sim, SimError, SimHandle,
    SimOptions, SimService, now_ms,
};
pub use socket_agent::{SocketAgent, SocketAgentError};
