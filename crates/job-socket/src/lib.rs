//! job-socket (work in progress)
pub mod client;
pub mod conformance;
pub mod consts;
pub mod frame;
pub mod json;
pub mod listener;
pub mod path;
pub mod payload;
pub mod phase;
