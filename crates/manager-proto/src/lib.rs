//! Generated Rust code for the Norsk Manager gRPC API, package
//! `norsk.manager.v1` (`proto/norsk/manager/v1/manager.proto`).
//!
//! Generated code: messages (prost 0.14), the `Manager` and `SimAdmin` clients
//! and servers (tonic 0.14); and, in [`ext`], a few helpers on the generated
//! enums (`JobState::holds_capacity`, `JobInstance::is_normal`, `Node::zone`)
//! so every crate reads them the same way.
//!
//! Code generation choice: `build.rs` parses the proto with
//! [`protox`](https://docs.rs/protox) — a pure-Rust protobuf compiler — and
//! hands the descriptor set to `tonic-prost-build`, so no system `protoc` is
//! needed on developer machines or in CI.
//!
//! Every message also derives `serde::Serialize`/`Deserialize` (enums appear
//! as their `i32` values); `manager-sim` uses that to persist its world.

/// `norsk.manager.v1`: the Manager API.
pub mod v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]
    tonic::include_proto!("norsk.manager.v1");
}

pub use v1::*;

pub mod ext;

/// The id of the capability a worker advertises while its job socket
/// listener is up; a handover target must have it. Defined once, by the job-socket contract.
pub use job_socket::consts::JOB_SOCKET_CAPABILITY;
