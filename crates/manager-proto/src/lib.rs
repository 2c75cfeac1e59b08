//! Generated Rust code for Norsk Manager's gRPC APIs:
//!
//! - [`api`]: the published API, packages `norsk.api.manager` and `norsk.api.common`
//!   (`proto/norsk/api/`), transcribed from `@norskvideo/norsk-api` 1.0.384 and checked against
//!   that package's own tables and encodings by `tests/published_api.rs`;
//! - [`v1`] (re-exported at the top): `norsk.manager.v1` (`proto/norsk/manager/v1/manager.proto`),
//!   the API this project designed before the published one was known, still served by
//!   manager-sim and spoken by the operator until they move over;
//! - [`extension`], `automanager.manager.extension.v1`
//!   (`proto/automanager/manager/extension/v1/extension.proto`), our own extension service for
//!   what the published API lacks (warm nodes, the migration handshake, reclaim notices),
//!   optional and probed with `Describe`.
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

/// Norsk Manager's published API (see docs/manager-api.md).
pub mod api {
    /// `norsk.api.manager`: the `Manager` service and its messages.
    pub mod manager {
        #![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]
        tonic::include_proto!("norsk.api.manager");
    }

    /// `norsk.api.common`: ids, node metadata, services, ports, volumes and log lines.
    pub mod common {
        #![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]
        tonic::include_proto!("norsk.api.common");
    }

    /// Every published message by full name, and a decode-and-encode through our generated
    /// type for each (the conformance tests put the package's own encodings through it).
    pub mod registry {
        include!(concat!(env!("OUT_DIR"), "/published_registry.rs"));
    }
}

/// `automanager.manager.extension.v1`: our extension to the published API (ours, not Norsk's).
pub mod extension {
    #![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]
    include!(concat!(
        env!("OUT_DIR"),
        "/extension/automanager.manager.extension.v1.rs"
    ));

    /// The feature names `DescribeResponse.features` may carry.
    pub mod feature {
        /// StopNode, StartNode, and warm nodes on Watch.
        pub const WARM_NODES: &str = "warm-nodes";
        /// The four migration calls, and migrations on Watch.
        pub const MIGRATION_HANDSHAKE: &str = "migration-handshake";
        /// Reclaim notices on Watch.
        pub const RECLAIM_NOTICES: &str = "reclaim-notices";
    }
}

/// `norsk.manager.v1`: the API this project designed first.
pub mod v1 {
    #![allow(missing_docs, clippy::all, clippy::pedantic, clippy::unwrap_used)]
    tonic::include_proto!("norsk.manager.v1");
}

pub use v1::*;

pub mod ext;

/// The id of the capability a worker advertises while its job socket
/// listener is up; a handover target must have it. Defined once, by the job-socket contract.
pub use job_socket::consts::JOB_SOCKET_CAPABILITY;
