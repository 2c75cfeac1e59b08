//! The tags this operator sets on the nodes and jobs it creates through the published API, and
//! reads back: Manager stores them and returns them on every event, so they carry what the
//! published API has no field for (pool, zone, bundle, replica, job name, requirements) and
//! mark what is ours.

use std::collections::BTreeMap;

/// Every tag key of ours starts with this.
pub const PREFIX: &str = "automanager.norsk.io/";
/// The installation that created the object; only objects with ours are ever touched.
pub const OWNER: &str = "automanager.norsk.io/owner";
/// The PlacementPool a node belongs to.
pub const POOL: &str = "automanager.norsk.io/pool";
/// The zone a node was placed in.
pub const ZONE: &str = "automanager.norsk.io/zone";
/// The instance type a node was created with (physical nodes may declare theirs).
pub const INSTANCE_TYPE: &str = "automanager.norsk.io/instance-type";
/// The Bundle a job belongs to.
pub const BUNDLE: &str = "automanager.norsk.io/bundle";
/// The replica of the Bundle.
pub const REPLICA: &str = "automanager.norsk.io/replica";
/// The job's name within its Bundle.
pub const JOB: &str = "automanager.norsk.io/job";
/// The Bundle's replica count when the job was written.
pub const REPLICAS: &str = "automanager.norsk.io/replicas";
/// The job's required capacity score.
pub const CAPACITY: &str = "automanager.norsk.io/capacity";
/// The job's required cores.
pub const CORES: &str = "automanager.norsk.io/cores";
/// The job's required capabilities, comma-separated.
pub const CAPABILITIES: &str = "automanager.norsk.io/capabilities";
/// The job's priority band.
pub const BAND: &str = "automanager.norsk.io/band";

/// The role of a job's ordinary instance.
pub const ROLE_NORMAL: &str = "primary";
/// The role of a migration's target instance.
pub const ROLE_MIGRATION_TARGET: &str = "migration-target";

/// Whether `tags` say the object was created by the installation `owner`.
pub fn owned_by(tags: &BTreeMap<String, String>, owner: &str) -> bool {
    tags.get(OWNER).is_some_and(|o| o == owner)
}
