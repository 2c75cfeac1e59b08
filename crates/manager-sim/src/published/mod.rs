//! Manager's published API (`norsk.api.manager.Manager`), served beside our first API on the
//! same port: nodes under ids their callers choose, stored jobs, instances under free-text roles,
//! `JobSearch`, and an `EventStream` that opens with a snapshot closed by
//! `InitialDataComplete`. Its world is its own: nodes and jobs made through one API are not seen
//! through the other. SimAdmin's `kill-node`, `notice-node` and `cut-streams` reach it.
//!
//! Beside it, on the same port, [`ExtensionService`] serves our extension
//! (`automanager.manager.extension.v1.ManagerExtension`) over the same world: warm nodes,
//! reclaim notices and the migration handshake (its asks answered as a cooperative job with
//! nothing to hand over answers; no job socket). [`crate::SimOptions::extension`] (`serve
//! --no-extension`) leaves it out, so its calls answer `UNIMPLEMENTED`.
//!
//! Not simulated yet: persistence, pending jobs and the pending window, and capacity (1.0.384
//! jobs carry no requirements).

mod service;
mod world;

pub use service::{ExtensionService, PublishedService};
pub use world::PublishedWorld;
