//! The zone brake, acted on: nodes Manager loses (stopped or terminated without the operator
//! asking) are counted per pool and zone ([`automanager_policy::zone_brake`]); a zone that
//! trips the brake has provisioning into it paused in the placement engine, a `ZoneDegraded`
//! condition on its PlacementPool and a Warning Event; once its window passes quietly it clears
//! (a Normal Event) and waiting bundles are woken.

use std::sync::Arc;
use std::time::Duration;

use automanager_api::PlacementPool;
use automanager_policy::zone_brake::{DegradedZone, ZoneBrake, ZoneChange};
use chrono::{DateTime, Utc};
use kube::runtime::events::EventType;
use manager_client::{MirrorChange, MirrorState};
use manager_proto as proto;

use super::Context;
use crate::state::State;

/// How often degraded zones are checked for a quiet window.
const CLOCK: Duration = Duration::from_secs(1);

fn live(state: i32) -> bool {
    matches!(
        proto::NodeState::try_from(state),
        Ok(proto::NodeState::Starting | proto::NodeState::Started)
    )
}

fn zone_of(n: &proto::Node) -> &str {
    n.inventory
        .as_ref()
        .map(|i| i.zone.as_str())
        .filter(|z| !z.is_empty())
        .unwrap_or(n.zone.as_str())
}

/// A node Manager lost: its pool and zone, and how many nodes of that pool are left up there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeLoss {
    pub node: String,
    pub pool: String,
    pub zone: String,
    pub up: u32,
}

/// The nodes of `batch` that Manager lost: a node the placement model holds (`held`) that the
/// mirror `m` now shows stopped or terminated, without this operator having asked. Ask `held`
/// before the model takes the batch in.
pub fn lost_nodes(
    batch: &[MirrorChange],
    m: &MirrorState,
    held: impl Fn(&str) -> bool,
    asked_to_terminate: impl Fn(&str) -> bool,
) -> Vec<NodeLoss> {
    let mut lost = Vec::new();
    for c in batch {
        let MirrorChange::NodeUpserted(n) = c else {
            continue;
        };
        // A node stopped on request (a warm spare) was not lost.
        let stopped_on_request = matches!(
            proto::NodeState::try_from(n.state),
            Ok(proto::NodeState::PoweringOff | proto::NodeState::PoweredOff)
        );
        if live(n.state)
            || stopped_on_request
            || !held(&n.node_id)
            || asked_to_terminate(&n.node_id)
        {
            continue;
        }
        let zone = zone_of(n);
        if zone.is_empty() {
            continue;
        }
        let up = m
            .nodes
            .values()
            .filter(|o| o.pool == n.pool && live(o.state) && zone_of(o) == zone)
            .count();
        lost.push(NodeLoss {
            node: n.node_id.clone(),
            pool: n.pool.clone(),
            zone: zone.to_owned(),
            up: u32::try_from(up).unwrap_or(u32::MAX),
        });
    }
    lost
}

/// Counts the nodes of `batch` that Manager lost ([`lost_nodes`]) toward the zone brake, which
/// pauses provisioning into a zone that trips it. Call before the model takes the batch in.
pub fn observe_losses(
    batch: &[MirrorChange],
    m: &MirrorState,
    state: &State,
    asked_to_terminate: impl Fn(&str) -> bool,
    now: DateTime<Utc>,
) -> Vec<ZoneChange> {
    if !state.zone_brake_enabled() {
        return Vec::new();
    }
    let lost = lost_nodes(
        batch,
        m,
        |node| state.node_pool(node).is_some(),
        asked_to_terminate,
    );
    let mut changes = Vec::new();
    for l in lost {
        tracing::info!(node = %l.node, pool = %l.pool, zone = %l.zone, up = l.up, "node lost");
        changes.extend(state.record_zone_loss(&l.pool, &l.zone, l.up, now));
    }
    changes
}

/// Tells the person on call, and the pool's waiters, what changed.
pub async fn announce(ctx: &Context, changes: Vec<ZoneChange>) {
    for change in changes {
        match change {
            ZoneChange::Degraded(d) => {
                tracing::warn!(pool = %d.pool, zone = %d.zone, lost = d.lost, had = d.had, "zone degraded: provisioning into it paused");
                ctx.metrics.zone_degraded(&d.pool, &d.zone, true);
                ctx.event_on(
                    &pool_ref(&d.pool),
                    EventType::Warning,
                    "ZoneDegraded",
                    "Provision",
                    degraded_message(&d, ctx.settings.zone_brake.map(|b| b.window)),
                )
                .await;
                ctx.wake_pool(&d.pool);
            }
            ZoneChange::Cleared { pool, zone } => {
                tracing::info!(pool = %pool, zone = %zone, "zone recovered: provisioning into it resumes");
                ctx.metrics.zone_degraded(&pool, &zone, false);
                ctx.event_on(
                    &pool_ref(&pool),
                    EventType::Normal,
                    "ZoneRecovered",
                    "Provision",
                    format!(
                        "zone {zone} lost no node for a whole window: provisioning into it resumes"
                    ),
                )
                .await;
                ctx.wake_pool(&pool);
            }
        }
    }
}

/// A reference to the PlacementPool `pool` for its Events (pools are cluster-scoped).
fn pool_ref(pool: &str) -> k8s_openapi::api::core::v1::ObjectReference {
    use kube::Resource;
    k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some(PlacementPool::api_version(&()).into_owned()),
        kind: Some(PlacementPool::kind(&()).into_owned()),
        name: Some(pool.to_owned()),
        ..Default::default()
    }
}

/// The `ZoneDegraded` condition's and Event's message for one zone.
pub fn degraded_message(d: &DegradedZone, window: Option<chrono::TimeDelta>) -> String {
    format!(
        "zone {} lost {} of its {} nodes within {}s: no node is provisioned into it until {} (a window with no further loss); recovery goes on in other zones and pools",
        d.zone,
        d.lost,
        d.had,
        window.map_or(0, |w| w.num_seconds()),
        d.until.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )
}

/// The zone a CreateNode into `pool` should name, given the zone brake: `requested` when it is
/// not degraded; an error naming the zone when it is. An empty request (Manager's choice) stays
/// empty while the pool has lost no node recently; otherwise it names the pool's zone that is not
/// degraded with the fewest recent losses, then the fewest live nodes (so spares replaced during
/// an outage, before the zone trips the brake, already go elsewhere), or fails when every zone
/// is degraded.
pub fn provision_zone(
    m: &MirrorState,
    b: &ZoneBrake,
    zones: &[String],
    pool: &str,
    requested: &str,
) -> Result<String, String> {
    if !requested.is_empty() {
        return match b.degraded_in(pool).iter().find(|d| d.zone == requested) {
            Some(d) => Err(degraded_message(d, Some(b.settings().window))),
            None => Ok(requested.to_owned()),
        };
    }
    if zones.is_empty() || zones.iter().all(|z| b.recent_losses(pool, z) == 0) {
        // No zones named (Manager chooses, the brake cannot steer it), or nothing lost lately.
        return Ok(String::new());
    }
    zones
        .iter()
        .filter(|z| !b.is_degraded(pool, z))
        .min_by_key(|z| {
            let up = m
                .nodes
                .values()
                .filter(|n| n.pool == pool && live(n.state) && zone_of(n) == z.as_str())
                .count();
            (b.recent_losses(pool, z), up)
        })
        .cloned()
        .ok_or_else(|| {
            format!(
                "every zone of pool {pool} is degraded ({}); no node is provisioned until one recovers",
                zones.join(", ")
            )
        })
}

/// Clears degraded zones whose window passed quietly, every second.
pub async fn run_zone_clock(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(CLOCK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let changes = ctx.state.tick_zone_brake(ctx.clock.now());
        if !changes.is_empty() {
            announce(&ctx, changes).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use automanager_policy::zone_brake::ZoneBrakeSettings;
    use chrono::TimeDelta;

    use super::*;
    use crate::settings::Settings;

    use crate::test_fixtures::{mirror_of as mirror, node_in as node, pool};

    fn upserted(nodes: &[proto::Node]) -> Vec<MirrorChange> {
        nodes
            .iter()
            .cloned()
            .map(MirrorChange::NodeUpserted)
            .collect()
    }

    fn state(brake: bool) -> State {
        State::new(&Settings {
            zone_brake: brake.then_some(ZoneBrakeSettings {
                lost_fraction: 0.5,
                window: TimeDelta::seconds(300),
                min_lost: 2,
            }),
            ..Settings::default()
        })
    }

    #[test]
    fn only_a_held_node_down_without_being_asked_is_lost() {
        use proto::NodeState as S;
        let batch = [
            node("gone", "z1", S::Terminated),
            node("stopped", "z1", S::Stopped),
            node("spare", "z1", S::PoweredOff),
            node("asked", "z1", S::Terminated),
            node("unknown", "z1", S::Terminated),
            node("no-zone", "", S::Terminated),
            node("up", "z1", S::Started),
            node("other-zone", "z2", S::Started),
        ];
        let m = mirror(&batch);
        let lost = lost_nodes(&upserted(&batch), &m, |n| n != "unknown", |n| n == "asked");
        let names: Vec<&str> = lost.iter().map(|l| l.node.as_str()).collect();
        assert_eq!(names, ["gone", "stopped"]);
        assert_eq!(
            lost[0],
            NodeLoss {
                node: "gone".into(),
                pool: "a".into(),
                zone: "z1".into(),
                up: 1,
            },
            "counted against the nodes of its pool and zone still up"
        );
    }

    #[test]
    fn nodes_the_model_held_lost_in_one_zone_pause_it_and_no_other() {
        use proto::NodeState as S;
        let state = state(true);
        let up = [
            node("n1", "z1", S::Started),
            node("n2", "z1", S::Started),
            node("n3", "z2", S::Started),
        ];
        let before = mirror(&up);
        state.load_pool(&before, pool()).expect("valid");
        state.sync_all(&before);

        let down = [
            node("n1", "z1", S::Terminated),
            node("n2", "z1", S::Terminated),
        ];
        let after = mirror(&[down[0].clone(), down[1].clone(), up[2].clone()]);
        let now = DateTime::UNIX_EPOCH;
        let changes = observe_losses(&upserted(&down), &after, &state, |_| false, now);

        assert!(
            matches!(changes.as_slice(), [ZoneChange::Degraded(d)] if d.zone == "z1"),
            "{changes:?}"
        );
        assert!(state.provisioning_paused("a", "z1"));
        assert!(!state.provisioning_paused("a", "z2"));
    }

    #[test]
    fn without_a_brake_no_loss_is_counted() {
        use proto::NodeState as S;
        let state = state(false);
        let up = [node("n1", "z1", S::Started), node("n2", "z1", S::Started)];
        let before = mirror(&up);
        state.load_pool(&before, pool()).expect("valid");
        state.sync_all(&before);

        let down = [
            node("n1", "z1", S::Terminated),
            node("n2", "z1", S::Terminated),
        ];
        let changes = observe_losses(
            &upserted(&down),
            &mirror(&down),
            &state,
            |_| false,
            DateTime::UNIX_EPOCH,
        );

        assert!(changes.is_empty());
        assert!(!state.provisioning_paused("a", "z1"));
    }
}
