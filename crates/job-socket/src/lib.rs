//! job-socket (work in progress)
pub mod conformance;
pub mod consts;
pub mod frame;
pub mod json;
pub mod path;
pub mod payload;
