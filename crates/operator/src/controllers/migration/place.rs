//! Where a migration's target goes: `spec.targetNode`, or the placement engine for the job (with
//! the members of its co-location group on the same node, [`co_location`], so the node has
//! room for the group) with the source node as another replica's position and inter-replica
//! `differentNode: hard` (so the source is never chosen), requiring `norsk.io/job-socket` for a
//! handover only; an elastic pool is asked for a node when none has room.

use std::collections::BTreeMap;

use automanager_api::Bundle;
use automanager_placement as pl;
use automanager_policy::co_location;
use automanager_policy::migration::{self as plan, MigrationEvent};
use kube::api::Api;
use kube::runtime::events::EventType;

use super::Run;
use crate::controllers::{Error, now_ms};
use crate::mapping;
use crate::state::Moving;

/// Where the target goes, as far as placement can say now.
enum TargetChoice {
    Node(String),
    /// The chosen node is starting (or was just asked for).
    Wait,
    Fail(String),
}

impl Run<'_> {
    /// The target node: `spec.targetNode` (checked at admission) or the placement engine's
    /// choice, as the machine's event; `None` while a node for it is on its way (the phase's
    /// timeout bounds the wait).
    pub(super) async fn place_target(&self) -> Result<Option<MigrationEvent>, Error> {
        if let Some(node) = &self.mig.spec.target_node {
            // A node named by the user (or by the job a follower follows) holds the job's room
            // as a node the engine chose does, so no placement takes it before the job starts.
            (self.ctx.manager.mirror()).read(|m| {
                (self.ctx.state).hold_migration_target(m, &self.migration_id, &self.job_id, node)
            });
            return Ok(Some(MigrationEvent::TargetPlaced { node: node.clone() }));
        }
        Ok(match self.choose_target().await? {
            TargetChoice::Node(node) => Some(MigrationEvent::TargetPlaced { node }),
            TargetChoice::Wait => None,
            TargetChoice::Fail(reason) => Some(MigrationEvent::PlacementFailed { reason }),
        })
    }

    /// A migration under way whose target was chosen holds the job's room there until the
    /// mirror shows the job on it, also when this process did not choose it (a restart, a
    /// leader's hand-over).
    pub(super) fn keep_target_held(&self) {
        let Some(target) = self.machine.target_node() else {
            return;
        };
        let held = self.ctx.state.migration_target_held(&self.migration_id);
        if self.machine.is_ended() || self.job_id.is_empty() || held.as_deref() == Some(target) {
            return;
        }
        (self.ctx.manager.mirror()).read(|m| {
            (self.ctx.state).hold_migration_target(m, &self.migration_id, &self.job_id, target)
        });
    }

    /// The placement engine's choice of a node other than the source: an existing node, a node
    /// to wait for (starting, or provisioned now in an elastic pool), or why there is none.
    async fn choose_target(&self) -> Result<TargetChoice, Error> {
        let request = match self.target_request().await? {
            Ok(request) => request,
            Err(why) => return Ok(TargetChoice::Fail(why)),
        };
        // A pool whose object exists but is not loaded yet (operator start-up) is no reason to
        // abort, as for a Bundle: wait for it. A pool that does not exist still aborts.
        let unknown = self.ctx.state.pools_unknown(&request.pools);
        if crate::controllers::pool_not_loaded_yet(self.ctx, &unknown).await? {
            tracing::debug!(pools = ?unknown, "a pool of the job is not loaded yet; the target waits");
            return Ok(TargetChoice::Wait);
        }
        let now = now_ms(self.ctx.clock.now());
        // Chosen and held at once: a stop-then-start target starts only at the cutover, and
        // until the mirror shows it there nothing else keeps another placement off its room.
        let moving = Moving {
            migration_id: &self.migration_id,
            job_id: &self.job_id,
            job_name: &self.mig.spec.job.job_name,
            source: self.machine.source_node().unwrap_or_default(),
        };
        let decision = (self.ctx.manager.mirror())
            .read(|m| (self.ctx.state).place_migration_target(m, &request, now, moving));
        self.target_from(decision).await
    }

    /// The placement request for the one job: the source node as another replica's position
    /// with inter-replica `differentNode: hard` (so the source is never chosen), and the job's
    /// capability the strategy needs. `Err` when the Bundle or its job is gone.
    async fn target_request(&self) -> Result<Result<pl::PlacementRequest, String>, Error> {
        let job = &self.mig.spec.job;
        let bundles: Api<Bundle> = Api::namespaced(self.ctx.client.clone(), &self.ns);
        let Some(bundle) = bundles.get_opt(&job.bundle).await? else {
            return Ok(Err(format!("Bundle {} no longer exists", job.bundle)));
        };
        let Some(spec_job) = bundle.spec.jobs.iter().find(|j| j.job_name == job.job_name) else {
            return Ok(Err(format!(
                "the bundle no longer has job {}",
                job.job_name
            )));
        };
        let bundle_id = mapping::bundle_id(&self.ns, &job.bundle);
        let engine_bundle = mapping::bundle(&bundle_id, &bundle.spec);
        let replica = u32::try_from(job.replica).unwrap_or(0);
        let (other_replicas, mut placed_siblings) = self.positions(&bundle_id, replica);
        // The job moves with the members of its co-location group that share its node: the
        // target is a node with room for all of them, pinned to the members elsewhere.
        let source = self.machine.source_node().unwrap_or_default();
        let running: BTreeMap<String, String> = placed_siblings
            .iter()
            .map(|s| (s.job_name.clone(), s.node.clone()))
            .chain([(spec_job.job_name.clone(), source.to_owned())])
            .collect();
        let (mut jobs, _) = co_location::move_request(
            &engine_bundle.jobs,
            &engine_bundle.intra_replica_placement,
            &spec_job.job_name,
            source,
            &running,
        );
        if jobs.is_empty() {
            jobs.push(mapping::job(spec_job));
        }
        plan::require_target_capability(
            self.machine.strategy(),
            &mut jobs[0].requirements.required_capabilities,
        );
        placed_siblings.retain(|s| !jobs.iter().any(|j| j.job_name == s.job_name));
        let mut inter = engine_bundle.inter_replica_placement;
        inter.different_node = Some(pl::Strength::Hard);
        Ok(Ok(pl::PlacementRequest {
            bundle_id,
            replica_index: replica,
            jobs,
            pools: engine_bundle.pools_for_replica(replica).to_vec(),
            kind: pl::PlacementKind::First,
            intra_replica: engine_bundle.intra_replica_placement,
            inter_replica: inter,
            other_replicas,
            placed_siblings,
        }))
    }

    /// Where the bundle's other jobs run: the source and the other replicas' jobs as positions,
    /// the replica's other jobs as siblings.
    fn positions(
        &self,
        bundle_id: &str,
        replica: u32,
    ) -> (Vec<pl::Position>, Vec<pl::SiblingPosition>) {
        let source = self.machine.source_node().unwrap_or_default().to_owned();
        self.ctx.manager.mirror().read(|m| {
            let zone_of = |node: &str| m.nodes.get(node).map(|n| n.zone().to_owned());
            let mut others = vec![pl::Position {
                node: source.clone(),
                zone: zone_of(&source),
            }];
            let mut siblings = Vec::new();
            for j in m.jobs.values().filter(|j| j.bundle_id == bundle_id) {
                if j.job_id == self.job_id || j.node_id.is_empty() || !j.state().holds_capacity() {
                    continue;
                }
                let zone = zone_of(&j.node_id);
                if j.replica == replica {
                    siblings.push(pl::SiblingPosition {
                        job_name: j.job_name.clone(),
                        node: j.node_id.clone(),
                        zone,
                    });
                } else {
                    others.push(pl::Position {
                        node: j.node_id.clone(),
                        zone,
                    });
                }
            }
            (others, siblings)
        })
    }

    /// The engine's decision as a target: a node up now other than the source, a node to wait
    /// for (provisioned now when the engine asks for one), or why there is none.
    async fn target_from(&self, decision: pl::Decision) -> Result<TargetChoice, Error> {
        let source = self.machine.source_node().unwrap_or_default();
        let summary = decision.summary();
        Ok(match decision.outcome {
            pl::Outcome::Placed { assignments, .. } => {
                let job = &self.mig.spec.job.job_name;
                match assignments
                    .into_iter()
                    .find(|a| a.job_name == *job && a.node != source)
                {
                    Some(a) if !a.node_pending => TargetChoice::Node(a.node),
                    Some(_) => TargetChoice::Wait,
                    None => {
                        TargetChoice::Fail("placement chose no node other than the source".into())
                    }
                }
            }
            pl::Outcome::Provision {
                pool,
                instance_type,
                zone,
            } => {
                self.provision_target(&pool, &instance_type, zone.as_deref())
                    .await?
            }
            pl::Outcome::Unplaceable { .. } => TargetChoice::Fail(format!(
                "no node can take the job: {}",
                serde_json::to_string(&summary).unwrap_or_default()
            )),
        })
    }

    /// Asks Manager for a node for the target (once per migration: a node tagged for it that is
    /// on its way is not asked for again). A node Manager refuses for good fails the placement
    /// with Manager's message; a failed ask is waited out (the phase's timeout bounds it).
    async fn provision_target(
        &self,
        pool: &str,
        instance_type: &str,
        zone: Option<&str>,
    ) -> Result<TargetChoice, Error> {
        let tag = format!("migration.{}", self.migration_id);
        let node = match crate::controllers::request_node(self.ctx, pool, instance_type, zone, tag)
            .await
        {
            Ok(Some(node)) => node,
            Ok(None) => return Ok(TargetChoice::Wait),
            Err(Error::ProvisioningRefused(refusal)) => {
                return Ok(TargetChoice::Fail(refusal.describe()));
            }
            Err(e @ (Error::ProvisioningRetry { .. } | Error::ProvisioningPaused(_))) => {
                tracing::info!(migration = %self.migration_id, error = %e, "no target node yet");
                return Ok(TargetChoice::Wait);
            }
            Err(e) => return Err(e),
        };
        self.ctx
            .event(
                self.mig,
                EventType::Normal,
                "ProvisioningTarget",
                "Provision",
                format!(
                    "no existing node can take {}: asked for a {instance_type} node in pool {pool} ({})",
                    self.job_id, node.node_id
                ),
            )
            .await;
        Ok(TargetChoice::Wait)
    }
}
