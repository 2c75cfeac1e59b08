//! The operator's in-memory state, with one owner.
//!
//! Everything the controllers share that is not in Kubernetes or in Manager's mirror lives in
//! one [`OperatorState`] behind the one lock of [`State`], which the
//! [`crate::controllers::Context`] holds. It is grouped by concern, in the manner of Karpenter's
//! `state.Cluster` and Linkerd's policy `Index`: the placement model ([`ClusterModel`]),
//! per-bundle records ([`BundleBook`]), per-node records ([`NodeBook`]), node requests
//! ([`Provisioning`]), voluntary disruptions ([`Disruptions`]) and who to wake ([`WakeIndex`]).
//! Every field is private; controllers ask and tell through named operations of [`State`]
//! (`record_restart`, `begin_drain`, `take_request`, `admit`, ...), which lock inside, so an
//! invariant of one concern is kept in one file and no guard leaves this module.
//!
//! - **Lock order.** A caller may hold the mirror's read lock and then take this one
//!   (`mirror().read(|m| ctx.state.sync_all(m))`), never the other way round, and never holds
//!   this lock across an `.await`: take it, read or change, drop it. Nothing else locks in
//!   between, so no order can deadlock.
//! - **Durable policy state is not here alone.** Restart history is written to each Bundle's
//!   status and merged back in at every reconcile, a drop is a job state in status, and a job
//!   handed to its band's recovery is recorded by Manager as the instance's stop reason; so an
//!   operator restart, a `kill -9` or a leader change loses none of them (see
//!   docs/architecture.md).
//! - **Readers that must not wait** (`/v1/what-if`, `/debug/trace`) read a snapshot of the
//!   placement engine published at most every [`SNAPSHOT_EVERY`] while it changes
//!   ([`EngineSnapshot`]), so a dry run never holds this lock.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use automanager_placement as pl;
use automanager_policy::node_health::NodeHealth;
use automanager_policy::pass_failure::Retries;
use automanager_policy::provision_budget::ProvisionBudget;
use automanager_policy::zone_brake::{ZoneBrake, ZoneChange};

use crate::model::ClusterModel;
use crate::settings::Settings;

mod asks;
mod bundle_rules;
mod bundles;
mod disruption_rules;
mod disruptions;
mod migration_rules;
mod mirror_rules;
mod node_rules;
mod nodes;
mod pass_rules;
mod placement_rules;
mod pools;
mod provisioning;
mod shared;
mod wake;
mod wake_rules;

pub use asks::{Keyed, NodeAsk, NotKeyed};
pub use bundles::{BundleBook, HistoryKnown, KnownReplica};
pub use disruption_rules::{Admit, PastBound};
pub use disruptions::{AdmittedMigration, Disruptions, HeldMove, HoldNews};
pub use migration_rules::Moving;
pub use node_rules::NodeRecord;
pub use nodes::{DrainProgress, NodeBook};
pub use provisioning::Provisioning;
pub use shared::State;
pub use wake::{Held, WakeIndex};

/// How often at most the engine snapshot for what-if is refreshed while the engine changes.
pub const SNAPSHOT_EVERY: Duration = Duration::from_millis(200);

/// The longest a bundle's pass waits for the jobs it started to run (see
/// [`automanager_policy::start_settle`]).
pub const START_SETTLE: Duration = Duration::from_millis(300);

/// The last placement decision for one replica of a bundle: the full trace for
/// `/debug/trace`, and what status summarises (also when the status write was coalesced).
#[derive(Debug, Clone)]
pub struct LastDecision {
    pub decision: pl::Decision,
    pub recovery: bool,
    pub at: chrono::DateTime<chrono::Utc>,
    /// Bronze jobs stopped to make room for this recovery.
    pub preempted: Option<automanager_api::Preemption>,
}

/// Everything the controllers share that is not in Kubernetes or in Manager's mirror, with one
/// owner: each concern is a record type with private fields and named operations, reached
/// through the accessors below by [`State`]'s operations, which hold its lock.
pub struct OperatorState {
    /// The placement engine kept in step with the mirror, pools and cordons.
    model: ClusterModel,
    /// Whether the engine changed since the last snapshot.
    engine_changed: bool,
    bundles: BundleBook,
    nodes: NodeBook,
    provisioning: Provisioning,
    disruptions: Disruptions,
    wake: WakeIndex,
    /// Objects whose passes failed, and their growing back-off.
    retries: Retries,
}

impl OperatorState {
    pub fn new(settings: &Settings) -> Self {
        OperatorState {
            model: ClusterModel::new(
                u64::try_from(settings.pending_window.as_millis()).unwrap_or(u64::MAX),
            ),
            engine_changed: true,
            bundles: BundleBook::new(START_SETTLE),
            nodes: NodeBook::new(NodeHealth::with_flap(
                settings.rejection_threshold,
                settings.rejection_window,
                settings.flap,
            )),
            provisioning: Provisioning::new(
                ProvisionBudget::new(settings.provision_per_minute),
                settings.zone_brake.map(ZoneBrake::new),
            ),
            disruptions: Disruptions::new(ProvisionBudget::new(settings.rebalance_per_minute)),
            wake: WakeIndex::default(),
            retries: Retries::default(),
        }
    }

    /// The placement model, to read.
    pub fn model(&self) -> &ClusterModel {
        &self.model
    }

    /// The placement model, marked as changed for the next snapshot.
    pub fn model_mut(&mut self) -> &mut ClusterModel {
        self.engine_changed = true;
        &mut self.model
    }

    /// Restarts, decisions, Broken bundles, preemptions and start settling, per bundle.
    pub fn bundles(&self) -> &BundleBook {
        &self.bundles
    }

    pub fn bundles_mut(&mut self) -> &mut BundleBook {
        &mut self.bundles
    }

    /// Health, drains and generations, per Manager node.
    pub fn nodes(&self) -> &NodeBook {
        &self.nodes
    }

    pub fn nodes_mut(&mut self) -> &mut NodeBook {
        &mut self.nodes
    }

    /// Node requests: rate, idempotency keys, spares asked for, the zone brake.
    pub fn provisioning(&self) -> &Provisioning {
        &self.provisioning
    }

    pub fn provisioning_mut(&mut self) -> &mut Provisioning {
        &mut self.provisioning
    }

    /// Voluntary disruptions allowed: Migrations, node terminates, rebalancing, consolidation.
    pub fn disruptions(&self) -> &Disruptions {
        &self.disruptions
    }

    pub fn disruptions_mut(&mut self) -> &mut Disruptions {
        &mut self.disruptions
    }

    /// Who to wake for what.
    pub fn wake(&self) -> &WakeIndex {
        &self.wake
    }

    pub fn wake_mut(&mut self) -> &mut WakeIndex {
        &mut self.wake
    }

    /// Failed passes per object (the error policy's back-off).
    pub fn retries_mut(&mut self) -> &mut Retries {
        &mut self.retries
    }

    /// A node of `pool` in `zone` was lost with `up` nodes left there: the zone brake counts
    /// it, and a zone it degrades is paused for provisioning in the placement model.
    pub fn record_zone_loss(
        &mut self,
        pool: &str,
        zone: &str,
        up: u32,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<ZoneChange> {
        let change = self.provisioning.record_zone_loss(pool, zone, up, now)?;
        if let ZoneChange::Degraded(d) = &change {
            self.model_mut()
                .set_provisioning_paused(&d.pool, &d.zone, true);
        }
        Some(change)
    }

    /// Zones whose brake window passed quietly are released, and provisioning into each is
    /// resumed in the placement model.
    pub fn tick_zone_brake(&mut self, now: chrono::DateTime<chrono::Utc>) -> Vec<ZoneChange> {
        let changes = self.provisioning.tick_zone_brake(now);
        for c in &changes {
            if let ZoneChange::Cleared { pool, zone } = c {
                self.model_mut().set_provisioning_paused(pool, zone, false);
            }
        }
        changes
    }
}

/// The engine as readers that must not wait see it: replaced whole, read without a lock held
/// for longer than an `Arc` clone.
///
/// A replaced copy is not dropped at once: it is kept until the next refresh and handed back
/// to the refresher to drop outside every lock. Dropping an engine of a large fleet takes
/// milliseconds; done under the write lock it would hold up every reader, and done by a reader
/// that happened to hold the last reference (a what-if that began just before the swap) it
/// would land on that reader's answer.
#[derive(Default)]
pub struct EngineSnapshot {
    current: RwLock<Option<Arc<pl::Engine>>>,
    retired: std::sync::Mutex<Option<Arc<pl::Engine>>>,
}

impl EngineSnapshot {
    /// The latest snapshot (`None` before the first).
    pub fn get(&self) -> Option<Arc<pl::Engine>> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Publishes a new copy of the engine when `state` changed since the last one. Returns the
    /// copy retired a refresh ago, for the caller to drop once it has released its locks.
    #[must_use = "drop the retired copy after releasing the state lock"]
    fn refresh(&self, state: &mut OperatorState) -> Option<Arc<pl::Engine>> {
        if !state.engine_changed {
            return None;
        }
        state.engine_changed = false;
        let copy = Arc::new(state.model.engine().clone());
        let replaced = self
            .current
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .replace(copy);
        std::mem::replace(
            &mut *self.retired.lock().unwrap_or_else(|e| e.into_inner()),
            replaced,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_snapshot_is_handed_back_one_refresh_later() {
        let snapshot = EngineSnapshot::default();
        let mut state = OperatorState::new(&Settings::default());
        assert!(snapshot.refresh(&mut state).is_none());
        let first = snapshot.get().expect("published");
        assert!(
            snapshot.refresh(&mut state).is_none(),
            "unchanged: nothing new"
        );
        state.model_mut();
        assert!(
            snapshot.refresh(&mut state).is_none(),
            "the first copy is kept, retired"
        );
        state.model_mut();
        let retired = snapshot.refresh(&mut state).expect("handed back to drop");
        assert!(Arc::ptr_eq(&retired, &first));
    }
}
