//! The mirror of our extension's `Watch` (`automanager.manager.extension.v1`): warm nodes,
//! reclaim notices and migrations, which the published event stream cannot say. Pure: the
//! connection feeds it events and publishes the changes it answers.

use std::collections::{BTreeMap, BTreeSet};

use manager_proto::extension::watch_event::Event;
use manager_proto::extension::{Migration, NodePower, PowerState, ReclaimNotice, WatchEvent};

use super::mirror::{Malformed, PublishedChange};

/// What our extension's Watch has told, and which of its features the Manager serves.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtensionMirror {
    /// The features `Describe` named (empty: no extension, standard mode).
    pub features: BTreeSet<String>,
    /// Nodes powering off, off, or starting again from off, by id.
    pub warm: BTreeMap<String, NodePower>,
    /// Reclaim notices by node id (dropped with the node).
    pub notices: BTreeMap<String, ReclaimNotice>,
    /// Migrations by id, as last reported.
    pub migrations: BTreeMap<String, Migration>,
    /// The snapshot's `SnapshotComplete` arrived.
    pub complete: bool,
}

fn id_of(n: Option<&manager_proto::api::common::NodeId>) -> &str {
    n.map_or("", |n| n.node_id.as_str())
}

impl ExtensionMirror {
    /// An empty mirror of a Manager serving `features`.
    pub fn serving(features: BTreeSet<String>) -> Self {
        ExtensionMirror {
            features,
            ..Default::default()
        }
    }

    /// Whether the Manager serves feature `name`.
    pub fn serves(&self, name: &str) -> bool {
        self.features.contains(name)
    }

    /// Applies one Watch event; answers what changed.
    pub fn apply(&mut self, event: WatchEvent) -> Result<Vec<PublishedChange>, Malformed> {
        match event.event.ok_or(Malformed::Empty)? {
            Event::NodePower(p) => {
                let id = id_of(p.node_id.as_ref()).to_owned();
                if id.is_empty() {
                    return Err(Malformed::MissingId("NodePower"));
                }
                // Running again, or gone: the published stream speaks for it (or nothing does).
                let warm = matches!(
                    PowerState::try_from(p.state),
                    Ok(PowerState::PoweringOff | PowerState::PoweredOff | PowerState::Starting)
                );
                let changed = if warm {
                    self.warm.insert(id.clone(), p.clone()).as_ref() != Some(&p)
                } else {
                    self.warm.remove(&id).is_some()
                };
                if matches!(PowerState::try_from(p.state), Ok(PowerState::Terminated)) {
                    self.notices.remove(&id);
                }
                Ok(if changed || !warm {
                    vec![PublishedChange::NodePower(p)]
                } else {
                    Vec::new()
                })
            }
            Event::ReclaimNotice(n) => {
                let id = id_of(n.node_id.as_ref()).to_owned();
                if id.is_empty() {
                    return Err(Malformed::MissingId("ReclaimNotice"));
                }
                if self.notices.get(&id) == Some(&n) {
                    return Ok(Vec::new());
                }
                self.notices.insert(id, n.clone());
                Ok(vec![PublishedChange::ReclaimNotice(n)])
            }
            Event::Migration(m) => {
                if m.migration_id.is_empty() {
                    return Err(Malformed::MissingId("Migration"));
                }
                if self.migrations.get(&m.migration_id) == Some(&m) {
                    return Ok(Vec::new());
                }
                self.migrations.insert(m.migration_id.clone(), m.clone());
                Ok(vec![PublishedChange::Migration(m)])
            }
            Event::SnapshotComplete(_) => {
                self.complete = true;
                Ok(Vec::new())
            }
        }
    }

    /// A node left the published stream for good: its notice goes with it.
    pub fn node_gone(&mut self, node_id: &str) {
        if !self.warm.contains_key(node_id) {
            self.notices.remove(node_id);
        }
    }

    /// Replaces this mirror with `next` (a new snapshot); answers the differences.
    pub fn replace(&mut self, next: ExtensionMirror) -> Vec<PublishedChange> {
        let mut changes = Vec::new();
        for (id, p) in &next.warm {
            if self.warm.get(id) != Some(p) {
                changes.push(PublishedChange::NodePower(p.clone()));
            }
        }
        for (id, p) in &self.warm {
            if !next.warm.contains_key(id) {
                // No longer warm: it runs again or is gone; the published snapshot says which.
                let mut gone = p.clone();
                gone.state = PowerState::Running as i32;
                changes.push(PublishedChange::NodePower(gone));
            }
        }
        for (id, n) in &next.notices {
            if self.notices.get(id) != Some(n) {
                changes.push(PublishedChange::ReclaimNotice(n.clone()));
            }
        }
        for (id, m) in &next.migrations {
            if self.migrations.get(id) != Some(m) {
                changes.push(PublishedChange::Migration(m.clone()));
            }
        }
        *self = next;
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use manager_proto::api::common::NodeId;
    use manager_proto::extension::SnapshotComplete;

    fn power(id: &str, state: PowerState) -> WatchEvent {
        WatchEvent {
            event: Some(Event::NodePower(NodePower {
                node_id: Some(NodeId {
                    node_id: id.to_owned(),
                }),
                state: state as i32,
                ..Default::default()
            })),
        }
    }

    #[test]
    fn a_warm_node_is_held_until_it_runs_again_and_a_repeat_changes_nothing() {
        let mut m = ExtensionMirror::default();
        assert_eq!(
            m.apply(power("n1", PowerState::PoweredOff))
                .expect("ok")
                .len(),
            1
        );
        assert!(m.warm.contains_key("n1"));
        assert!(
            m.apply(power("n1", PowerState::PoweredOff))
                .expect("ok")
                .is_empty()
        );
        m.apply(power("n1", PowerState::Running)).expect("ok");
        assert!(m.warm.is_empty());
        assert_eq!(
            m.apply(WatchEvent { event: None }),
            Err(Malformed::Empty),
            "an event of a newer kind is refused, not a panic"
        );
        assert_eq!(
            m.apply(power("", PowerState::PoweredOff)),
            Err(Malformed::MissingId("NodePower"))
        );
    }

    #[test]
    fn a_new_snapshot_reports_only_the_differences() {
        let mut held = ExtensionMirror::default();
        held.apply(power("n1", PowerState::PoweredOff)).expect("ok");
        let mut same = ExtensionMirror::default();
        same.apply(power("n1", PowerState::PoweredOff)).expect("ok");
        same.apply(WatchEvent {
            event: Some(Event::SnapshotComplete(SnapshotComplete {})),
        })
        .expect("ok");
        assert!(held.replace(same.clone()).is_empty());
        let changes = held.replace(ExtensionMirror::default());
        assert!(
            matches!(&changes[..], [PublishedChange::NodePower(p)] if p.state == PowerState::Running as i32)
        );
    }
}
