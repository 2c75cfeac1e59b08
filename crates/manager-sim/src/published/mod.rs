//! Manager's published API (`norsk.api.manager.Manager`), served beside our first API on the
//! same port: nodes under ids their callers choose, stored jobs, instances under free-text roles,
//! `JobSearch`, and an `EventStream` that opens with a snapshot closed by
//! `InitialDataComplete`. Its world is its own: nodes and jobs made through one API are not seen
//! through the other. Not simulated yet: faults (SimAdmin acts on our first API's world),
//! persistence, pending jobs and the pending window, and capacity (1.0.384 jobs carry no
//! requirements).

mod service;
mod world;

pub use service::PublishedService;
pub use world::PublishedWorld;
