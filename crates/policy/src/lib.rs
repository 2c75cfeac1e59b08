//! # automanager-policy
//!
//! What the operator decides, as plain functions and small state machines over plain data: no
//! kube, no tokio, no I/O, no clock (time is passed in). Controllers observe, call this crate,
//! act on its answer and record it; everything here is unit- and property-tested without a
//! cluster, like `automanager-placement` beside it.
//!
//! | module | decides |
//! |---|---|
//! | [`vocab`] | the words: bands, failure policy, migration strategies and phases |
//! | [`ids`] | the bundle id the operator gives Manager for a Bundle object |
//! | [`bounded`] | how status text is clipped to the schema's bounds |
//! | [`bundle`] | per job of a bundle: nothing, wait, place, recover, drop or broken |
//! | [`bundle_pass`] | a replica's placement request, whether a Bundle pass's status write waits, when the bundle is looked at again |
//! | [`calendar`] | when voluntary moves may happen (disruption windows) and when spare schedules apply |
//! | [`co_location`] | a job that shares its node by rule moves with its group: the target for the group, the members left behind follow |
//! | [`ledger`] | restarts per replica in a sliding hour (`maxRestartsPerHour`) |
//! | [`node_health`] | nodes whose workers refuse too many starts, and how long a flapping one is kept out |
//! | [`spares`] | what a HotSpareTarget needs done to its pool's spares |
//! | [`tiers`] | a target's hot (running) and warm (stopped) spares, their sizes and schedules |
//! | [`provision_budget`] | how many nodes a pool may be asked for now |
//! | [`provision_keys`] | which idempotency key the next CreateNode of an intent carries |
//! | [`provision_refusals`] | which CreateNode asks are held: a refusal Manager gives for good, a failed ask's growing back-off |
//! | [`pass`] | how a controller's pass ends: where its object stands, when it is looked at again |
//! | [`pass_failure`] | what a failed reconcile pass says in its object's conditions, and when it is tried again |
//! | [`consolidation`] | which nodes of an elastic binpack pool can be emptied without dropping output, and where their jobs go |
//! | [`drain`] | the next step of a `migrate` drain |
//! | [`disruption`] | whether a voluntary action may take a bundle's replica down now (the disruption budget) |
//! | [`migration_queue`] | which waiting migrations begin now (priority, parallelism, budget) |
//! | [`migration`] | the migration machine, and Manager's phases mapped to its events |
//! | [`pool`] | where a PlacementPool stands: its own faults, its deletion held by its users, new nodes held back |
//! | [`notice`] | which jobs of nodes Manager will reclaim move, how, in what order, and what is left to recovery |
//! | [`preempt`] | which bronze jobs a gold (or silver) recovery with no room may stop |
//! | [`rebalance`] | whether a replica whose soft rules are broken moves back now, and where |
//! | [`recovery_first`] | whether a pass waits for its starts and writes its status now, or leaves that until bundles that lost jobs have had their pass |
//! | [`start_settle`] | whether a pass that started jobs waits a moment for them to run before it records |
//! | [`zone_brake`] | which zones have lost so many nodes that provisioning into them pauses |
//! | [`orphans`] | Manager's bundles and nodes whose custom resource is gone, after a grace period |
//!
//! Behaviour follows the `@norskvideo/norsk-auto-manager` TypeScript library; where the operator
//! goes further the module says so.

pub mod bounded;
pub mod bundle;
pub mod bundle_pass;
pub mod calendar;
pub mod co_location;
pub mod consolidation;
pub mod disruption;
pub mod drain;
pub mod ids;
pub mod ledger;
pub mod migration;
pub mod migration_queue;
pub mod node_health;
pub mod notice;
pub mod orphans;
pub mod pass;
pub mod pass_failure;
pub mod pool;
pub mod preempt;
pub mod provision_budget;
pub mod provision_keys;
pub mod provision_refusals;
pub mod rebalance;
pub mod recovery_first;
pub mod spares;
pub mod start_settle;
pub mod tags;
pub mod tiers;
pub mod vocab;
pub mod zone_brake;

pub use vocab::*;

/// The capability a worker advertises while its job-socket listener is up; a handover target
/// must have it. Defined once, by the job-socket contract.
pub use job_socket::consts::JOB_SOCKET_CAPABILITY;
