//! placeholder (being written)
pub mod config;
pub mod validate;
pub mod world;
