//! Manager's published API (`norsk.api.manager`): a client, the mirror of its event stream,
//! and [`PublishedPort`], which carries the operator's port operations over it.

mod catalog;
mod connection;
mod extension;
mod mirror;
mod port;
pub mod tags;
pub mod translate;

pub use catalog::{CatalogPool, PoolCatalog, ZoneLaunch};
pub use connection::{PublishedClient, PublishedConfig, StreamCounters};
pub use extension::ExtensionMirror;
pub use port::PublishedPort;

pub use mirror::{
    InstanceKey, InstancePhase, InstanceView, JobListing, JobView, Malformed, NodeState, NodeView,
    PublishedChange, PublishedMirror, SnapshotBuilder, SnapshotStep, instances_of, timestamp_ms,
};
