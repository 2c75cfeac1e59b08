//! Small helpers on the generated types, so every crate reads Manager's enums the same way.

use crate::v1::{JobInstance, JobRole, JobState, Migration, MigrationPhase, Node};

impl JobState {
    /// Whether an instance in this state holds its capacity and cores on its node (a worker
    /// reserves them from the start until the instance has stopped).
    pub fn holds_capacity(self) -> bool {
        matches!(
            self,
            JobState::Starting | JobState::Running | JobState::Stopping
        )
    }
}

impl JobInstance {
    /// Whether this is the job's ordinary instance (not a migration target).
    pub fn is_normal(&self) -> bool {
        matches!(self.role(), JobRole::Normal | JobRole::Unspecified)
    }

    /// Whether the instance holds capacity on its node ([`JobState::holds_capacity`]).
    pub fn holds_capacity(&self) -> bool {
        self.state().holds_capacity()
    }
}

impl MigrationPhase {
    /// Whether a migration in this phase has ended (completed or aborted).
    pub fn is_final(self) -> bool {
        matches!(self, MigrationPhase::Completed | MigrationPhase::Aborted)
    }
}

impl Migration {
    /// Whether Manager's migration has ended ([`MigrationPhase::is_final`]).
    pub fn is_final(&self) -> bool {
        self.phase().is_final()
    }
}

impl Node {
    /// The node's availability zone: its inventory's when the worker advertised one, else the
    /// one it was created in.
    pub fn zone(&self) -> &str {
        self.inventory
            .as_ref()
            .map(|i| i.zone.as_str())
            .filter(|z| !z.is_empty())
            .unwrap_or(&self.zone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::v1::NodeInventory;

    #[test]
    fn only_completed_and_aborted_migrations_are_final() {
        for (p, fin) in [
            (MigrationPhase::Unspecified, false),
            (MigrationPhase::Proposed, false),
            (MigrationPhase::StateReceived, false),
            (MigrationPhase::PreparingTarget, false),
            (MigrationPhase::TargetReady, false),
            (MigrationPhase::CuttingOver, false),
            (MigrationPhase::Completed, true),
            (MigrationPhase::Aborted, true),
        ] {
            assert_eq!(p.is_final(), fin, "{p:?}");
        }
    }

    #[test]
    fn only_starting_running_and_stopping_instances_hold_capacity() {
        for (s, holds) in [
            (JobState::Unspecified, false),
            (JobState::Pending, false),
            (JobState::Starting, true),
            (JobState::Running, true),
            (JobState::Stopping, true),
            (JobState::Stopped, false),
            (JobState::Failed, false),
        ] {
            assert_eq!(s.holds_capacity(), holds, "{s:?}");
        }
    }

    #[test]
    fn the_inventory_zone_wins_when_advertised() {
        let mut n = Node {
            zone: "a".into(),
            ..Default::default()
        };
        assert_eq!(n.zone(), "a");
        n.inventory = Some(NodeInventory {
            zone: String::new(),
            ..Default::default()
        });
        assert_eq!(n.zone(), "a");
        n.inventory = Some(NodeInventory {
            zone: "b".into(),
            ..Default::default()
        });
        assert_eq!(n.zone(), "b");
    }
}
