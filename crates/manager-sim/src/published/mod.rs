//! Manager's published API (`norsk.api.manager.Manager`), served beside our first API on the
//! same port: nodes under ids their callers choose, stored jobs, instances under free-text roles,
//! `JobSearch`, and an `EventStream` that opens with a snapshot closed by
//! `InitialDataComplete`. Its world is its own: nodes and jobs made through one API are not seen
//! through the other. Every SimAdmin fault reaches it, said as the published API says things
//! (a crash is a stop with `JOB_STOPPED_JOB_FAILED`, a refused start an answered call whose
//! instance stops as failed before it runs, a cut-off node one whose health pings stopped), and
//! with `--state-dir` it is kept across a restart ([`PublishedService::open`]).
//!
//! Beside it, on the same port, [`ExtensionService`] serves our extension
//! (`automanager.manager.extension.v1.ManagerExtension`) over the same world: warm nodes,
//! reclaim notices and the migration handshake. Its asks go to the jobs over the real job socket
//! when the sim runs one ([`PublishedService::run_job_socket`], as `serve` does unless
//! `--no-job-socket`); otherwise they are answered in process, as a cooperative job with nothing
//! to hand over answers unless SimAdmin scripted the job.
//! [`crate::SimOptions::extension`] (`serve --no-extension`) leaves it out, so its calls answer
//! `UNIMPLEMENTED`.
//!
//! Not simulated yet: pending jobs and the pending window, and capacity (1.0.384 jobs carry no
//! requirements).

mod service;
mod world;

pub use service::{ExtensionService, PublishedService};
pub use world::PublishedWorld;
