//! Asking Manager for nodes: a replica's or a Migration target's node ([`request_node`]) and
//! every CreateNode with its idempotency key, refusals and back-off ([`create_node`]).

use automanager_policy::provision_refusals::{Hold, Refusal};
use manager_client::ClientError;
use manager_proto as proto;

use super::{Context, Error, zones};
use crate::mapping;
use crate::state::{Keyed, NodeAsk, NotKeyed};

/// Asks Manager for a node of `instance_type` in `pool` (zone optional) for whatever `tag` names,
/// unless one asked for it is still on its way ([`provision_in_flight`]), and tells the engine a
/// node is coming. `None` when nothing was asked (one is on its way, the pool is not loaded, or
/// the pool's provisioning rate is used up for this minute).
pub async fn request_node(
    ctx: &Context,
    pool: &str,
    instance_type: &str,
    zone: Option<&str>,
    tag: String,
) -> Result<Option<proto::Node>, Error> {
    // One look at the mirror and the state: nothing can change between the checks and the
    // rate this ask takes.
    let (now, wall) = (ctx.clock.instant(), ctx.clock.now());
    let ask = ctx.manager.mirror().read(|m| {
        if provision_in_flight(m, &tag) {
            return None;
        }
        let ask = ctx
            .state
            .admit_node_ask(&m.epoch, now, wall, &tag, pool, instance_type, zone);
        Some(ask)
    });
    let spec = match ask {
        None | Some(NodeAsk::PoolUnknown) => None,
        Some(NodeAsk::Ask(spec)) => Some(spec),
        // A refused or backed-off ask takes nothing of the pool's rate.
        Some(NodeAsk::Held(hold)) => return Err(held_error(hold)),
        Some(NodeAsk::ZoneDegraded) => {
            tracing::info!(pool, zone = zone.unwrap_or_default(), tag = %tag, "zone degraded: not provisioning into it");
            None
        }
        Some(NodeAsk::RateSpent) => {
            tracing::info!(pool, tag = %tag, "provisioning rate for the pool is used up this minute; asking later");
            None
        }
    };
    let Some(spec) = spec else {
        return Ok(None);
    };
    let req = proto::CreateNodeRequest {
        pool: pool.to_owned(),
        provider: mapping::provider_of(spec.kind) as i32,
        region: spec.region.clone(),
        instance_type: instance_type.to_owned(),
        zone: zone.unwrap_or_default().to_owned(),
        tags: [(mapping::PROVISIONED_FOR_TAG.to_owned(), tag.clone())]
            .into_iter()
            .collect(),
        request_id: String::new(),
    };
    let node = create_node(ctx, &tag, req).await?;
    ctx.state.add_provisioned(&node);
    Ok(Some(node))
}

/// CreateNode for `intent` (a replica's tag, a spare target) with an idempotency key: an ask
/// whose answer was lost is repeated with its key, so Manager answers with the node it made
/// rather than making a second (see `automanager_policy::provision_keys`).
pub async fn create_node(
    ctx: &Context,
    intent: &str,
    mut req: proto::CreateNodeRequest,
) -> Result<proto::Node, Error> {
    let now = ctx.clock.instant();
    let keyed = ctx.manager.mirror().read(|m| {
        ctx.state.key_node_ask(
            m,
            now,
            intent,
            &req.pool,
            &req.instance_type,
            |brake, zones| zones::provision_zone(m, brake, zones, &req.pool, &req.zone),
            || format!("automanager-{:032x}", rand::random::<u128>()),
        )
    });
    let key = match keyed {
        Ok(Keyed { zone, key }) => {
            req.zone = zone;
            key
        }
        // A pool being deleted gets no new node, for a replica or a spare.
        Err(NotKeyed::PoolTerminating) => {
            return Err(Error::ProvisioningPaused(format!(
                "PlacementPool {} is being deleted: no new node is made in it",
                req.pool
            )));
        }
        Err(NotKeyed::Held(hold)) => return Err(held_error(hold)),
        Err(NotKeyed::Zone(why)) => return Err(Error::ProvisioningPaused(why)),
    };
    req.request_id.clone_from(&key);
    let (pool, instance_type) = (req.pool.clone(), req.instance_type.clone());
    match ctx.manager.create_node(req).await {
        Ok(node) => {
            ctx.state.node_ask_answered(intent);
            Ok(node)
        }
        Err(e) => {
            if let Some(code) = refused_for_good(&e) {
                let refusal = Refusal {
                    pool: pool.clone(),
                    instance_type,
                    code: code.to_owned(),
                    message: refusal_message(&e),
                };
                tracing::warn!(intent, pool = %pool, instance_type = %refusal.instance_type, error = %e, "Manager refused CreateNode; not asking again until the pool or Manager changes");
                let epoch = ctx.manager.mirror().read(|m| m.epoch.clone());
                ctx.state.refused(refusal.clone(), &epoch);
                // The pool's status says so too.
                ctx.wake_pool_controller(&pool);
                return Err(Error::ProvisioningRefused(refusal));
            }
            if outcome_unknown(&e) {
                tracing::info!(intent, request_id = %key, error = %e, "CreateNode got no answer; the next ask repeats its key");
                ctx.state.node_ask_unanswered(intent, key, now);
            }
            if matches!(e, ClientError::Fenced(_) | ClientError::Closed) {
                // Not Manager's answer: this operator may not write now.
                return Err(e.into());
            }
            let message = e.to_string();
            let retry_in = ctx.state.node_ask_failed(intent, message.clone(), now);
            tracing::info!(intent, pool = %pool, error = %e, retry_in_ms = u64::try_from(retry_in.as_millis()).unwrap_or(u64::MAX), "CreateNode failed; asking again after a back-off");
            Err(Error::ProvisioningRetry { message, retry_in })
        }
    }
}

/// Why an ask may not be made now, as the error its caller reports: a refusal that stands, or
/// the back-off of its last failed ask.
fn held_error(hold: Hold) -> Error {
    match hold {
        Hold::Refused(r) => Error::ProvisioningRefused(r),
        Hold::BackingOff {
            remaining, message, ..
        } => Error::ProvisioningRetry {
            message,
            retry_in: remaining,
        },
    }
}

/// Manager's answers to CreateNode that no retry changes, as the code's CamelCase word: the
/// request is wrong for this pool (an instance type or zone it does not offer, a fixed pool, an
/// unknown pool).
fn refused_for_good(e: &ClientError) -> Option<&'static str> {
    match e {
        ClientError::InvalidArgument(_) => Some("InvalidArgument"),
        ClientError::FailedPrecondition(_) => Some("FailedPrecondition"),
        ClientError::NotFound(_) => Some("NotFound"),
        _ => None,
    }
}

/// Manager's own words of a refusal, without the client's prefix.
fn refusal_message(e: &ClientError) -> String {
    match e {
        ClientError::InvalidArgument(m)
        | ClientError::FailedPrecondition(m)
        | ClientError::NotFound(m) => m.clone(),
        other => other.to_string(),
    }
}

/// Whether Manager may have carried out a call that failed: it was not refused, only not
/// answered. (Keeping a key that did make nothing costs nothing: its repeat makes the node.)
fn outcome_unknown(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Timeout(_) | ClientError::Unavailable(_) | ClientError::Rpc { .. }
    )
}

/// Whether a node asked for the replica (or migration target) tagged `tag` is still on its way to it: starting, or
/// started and still empty (the engine may not have seen it yet). A started node that another
/// bundle's job took in the meantime is not: the replica must ask again, or it would wait forever.
pub fn provision_in_flight(m: &manager_client::MirrorState, tag: &str) -> bool {
    m.nodes.values().any(|n| {
        if n.tags.get(mapping::PROVISIONED_FOR_TAG).map(String::as_str) != Some(tag) {
            return false;
        }
        match proto::NodeState::try_from(n.state) {
            Ok(proto::NodeState::Starting) => true,
            Ok(proto::NodeState::Started) => !m.jobs.values().any(|j| {
                j.instances.iter().any(|i| {
                    i.node_id == n.node_id
                        && matches!(
                            proto::JobState::try_from(i.state),
                            Ok(proto::JobState::Starting
                                | proto::JobState::Running
                                | proto::JobState::Stopping)
                        )
                })
            }),
            _ => false,
        }
    })
}
