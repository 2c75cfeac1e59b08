//! Manager's published API (`norsk.api.manager`): a client and the mirror of its event stream.
//!
//! The operator still speaks `norsk.manager.v1` through [`crate::ManagerClient`]; this module is
//! the published API's side of the same job, built to replace it.

mod connection;
mod mirror;

pub use connection::{PublishedClient, PublishedConfig, StreamCounters};

pub use mirror::{
    InstanceKey, InstancePhase, InstanceView, JobListing, JobView, Malformed, NodeState, NodeView,
    PublishedChange, PublishedMirror, SnapshotBuilder, SnapshotStep, instances_of,
};
