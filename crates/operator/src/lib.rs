//! # automanager-operator
//!
//! The operator binary's library: one controller per custom resource, reconciling the user's
//! desired state against Manager's state as mirrored by `manager-client`, with placement
//! decided by `automanager-placement`.

pub mod clock;
pub mod config;
pub mod controllers;
pub mod fence;
pub mod http;
pub mod leader;
pub mod lean;
/// The CRD ↔ engine ↔ Manager translations live in their own pure crate; re-exported so the
/// controllers keep saying `mapping::`.
pub use automanager_mapping as mapping;
pub mod metrics;
pub mod model;
pub mod probe;
pub mod process_metrics;
pub mod published_catalog;
pub mod runtime;
pub mod scope;
pub mod settings;
pub mod state;
#[cfg(test)]
mod test_fixtures;
