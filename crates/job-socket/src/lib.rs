//! # job-socket: the worker ↔ job handover contract
//!
//! The `handover` migration strategy needs the job's own cooperation: the job hands its state to
//! a target instance and stops its output at an exact position. That conversation runs over a
//! WebSocket between a worker and each job it hosts; this crate is our implementation of it,
//! wire-compatible with the reference `migration-socket.js`
//! (`@norskvideo/ctl-product-template-schema` 0.1.20, zod 4.4.3), which other implementations
//! (the TypeScript SDK, Studio's copy) also speak.
//!
//! | module | what |
//! |---|---|
//! | [`consts`] | port 6797, 64 KiB frames, 5 s hello timeout, env names, capability, close codes |
//! | [`json`] | JSON values with JavaScript semantics (`JSON.parse` / `JSON.stringify`) |
//! | [`frame`] | `JobToWorker` / `WorkerToJob` frames and the reference's parsing and rejection reasons |
//! | [`path`] | `/instances/<jobId>/<role>` encode / parse, `encodeURIComponent` / `decodeURIComponent` |
//! | [`payload`] | the gRPC `bytes payload` codec |
//! | [`phase`] | the handover phases one worker tracks, as a pure state machine |
//! | [`listener`] | the worker's listener and its channel API to the Manager side |
//! | [`client`] | the job's client SDK (`connect_migration`) |
//! | [`conformance`] | the line protocol of the `job-socket` conformance binary |
//!
//! ## Choices made where the issue left room
//!
//! * **Own JSON model instead of serde_json.** The reference's outputs are the contract, and they
//!   depend on JavaScript's data model: UTF-16 strings with lone surrogates, `f64` numbers
//!   (`1e400` → `Infinity` → printed `null`; `12345678901234567890` → `12345678901234567000`),
//!   V8's property order (array-index keys first, ascending, then insertion order; a duplicate
//!   key keeps its first position and last value) and `Number::toString` formatting. serde_json
//!   (even with `preserve_order` / `arbitrary_precision` / `float_roundtrip`) reproduces none of
//!   the ordering or surrogate behaviour, so [`json::Json`] is a small purpose-built model whose
//!   parser and printer are byte-exact against the reference (see the vectors).
//! * **No depth limit.** Parsing, validation, printing, cloning, comparing and dropping are all
//!   iterative, so a 64 KiB frame nested 32 k deep costs no stack. The reference itself has no
//!   limit in `JSON.parse` but overflows its stack inside zod at roughly 2–3 k levels
//!   (`RangeError`, depending on Node's stack size); we accept those frames rather than copy an
//!   accident of one runtime. The vectors cover depths 129, 1000 and 1500, where the reference answers.
//! * **Rejection reasons reproduce zod's text exactly** (`z.prettifyError`: issues stably sorted
//!   by path length), not just the required category, so vectors compare byte for byte.
//! * **Before `hello`**, a well-formed frame that is not `hello` closes 4401 (not authenticated);
//!   an unparseable one closes 4400 (unparseable always means 4400).
//! * **Phase state belongs to the instance**, not to the connection, so a job that reconnects
//!   (replacing its old socket with 4409) continues its migration.
//! * **The client SDK is a thin, typed pipe**: it validates inbound frames and refuses to send
//!   oversize ones; the worker enforces phases.
//!
//! See `docs/job-socket.md` for the operator-facing summary and `reference/` for the oracle.

#[cfg(feature = "runtime")]
pub mod client;
pub mod conformance;
pub mod consts;
pub mod frame;
pub mod json;
#[cfg(feature = "runtime")]
pub mod listener;
pub mod path;
pub mod payload;
pub mod phase;

#[cfg(feature = "runtime")]
pub use client::{MigrationClient, connect_migration, connect_migration_to};
pub use consts::CloseCode;
pub use frame::{
    JobToWorker, TargetApplied, WorkerToJob, parse_job_to_worker, parse_worker_to_job,
};
pub use json::{JsString, Json};
#[cfg(feature = "runtime")]
pub use listener::{
    Command, EventKind, InstanceKey, InstanceSpec, JobSocketListener, ListenerConfig,
    ListenerEvent, ListenerHandle,
};
pub use path::{job_socket_path, job_socket_url, parse_job_socket_path};
pub use payload::{decode_migration_payload, encode_migration_payload};
