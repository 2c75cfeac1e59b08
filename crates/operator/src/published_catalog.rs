//! Against Manager's published API the pools are ours, not Manager's: this keeps the port's
//! [`PoolCatalog`] equal to the cluster's PlacementPools (provider, region, zones, instance
//! types with their capacity), so CreateNode asks for what a pool declares and a node's
//! capacity is its instance type's.

use automanager_api::{PlacementPool, PlacementPoolSpec, PoolKind, ScaleOut};
use futures::StreamExt;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use manager_client::proto::{InstanceType, Pool, ProviderKind, ScaleOut as ProtoScaleOut};
use manager_client::published::{CatalogPool, PoolCatalog};

/// The catalog entry of the PlacementPool `name`.
pub fn catalog_pool(name: &str, spec: &PlacementPoolSpec) -> CatalogPool {
    let kind = match spec.kind {
        PoolKind::Aws => ProviderKind::Aws,
        PoolKind::Oci => ProviderKind::Oci,
        PoolKind::Cluster => ProviderKind::Cluster,
    };
    let scale_out = match spec.scale_out {
        ScaleOut::Elastic => ProtoScaleOut::Elastic,
        ScaleOut::Fixed => ProtoScaleOut::Fixed,
    };
    CatalogPool {
        pool: Pool {
            name: name.to_owned(),
            kind: kind as i32,
            region: spec.region.clone(),
            zones: spec.zones.clone(),
            scale_out: scale_out as i32,
            instance_types: spec
                .candidate_instance_types
                .iter()
                .map(|t| InstanceType {
                    instance_type: t.instance_type.clone(),
                    // Capacities are whole units, far inside f64's exact range.
                    #[allow(clippy::cast_precision_loss)]
                    capacity: t.total_capacity as f64,
                    cores: t.total_cores,
                    capabilities: t.capabilities.clone(),
                })
                .collect(),
            can_stop: false,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Keeps `catalog` equal to the PlacementPools until the watch ends (the process stops).
pub async fn follow_pools(client: kube::Client, catalog: PoolCatalog) {
    let pools: Api<PlacementPool> = Api::all(client);
    let mut events = watcher(pools, watcher::Config::default()).boxed();
    let mut seen = std::collections::BTreeSet::new();
    let mut relisting = std::collections::BTreeSet::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => {
                let name = p.name_any();
                catalog.upsert(catalog_pool(&name, &p.spec));
                relisting.insert(name.clone());
                seen.insert(name);
            }
            Ok(watcher::Event::Delete(p)) => {
                let name = p.name_any();
                catalog.remove(&name);
                seen.remove(&name);
            }
            Ok(watcher::Event::Init) => relisting.clear(),
            Ok(watcher::Event::InitDone) => {
                // Pools deleted while the watch was down are gone from the relist.
                for gone in seen.difference(&relisting) {
                    catalog.remove(gone);
                }
                seen = std::mem::take(&mut relisting);
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching PlacementPools for the published API's pool catalog");
            }
        }
    }
}
