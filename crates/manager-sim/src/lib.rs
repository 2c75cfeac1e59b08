//! placeholder (being written)
pub mod config;
pub mod server;
pub mod validate;
pub mod world;

pub use config::SimConfig;
pub use server::{DefaultAgent, JobAgent, Sim, SimError, SimHandle};
