//! The pools the operator provisions into through the published API. Manager 1.0.384 has no
//! pools: a node is created per cloud with a region and instance type (AWS) or availability
//! domain and shape (OCI), so what a pool is — its provider, region, zones, instance types
//! with their capacity, and what to launch in each zone — comes from the operator's
//! PlacementPools and is kept here, shared between the controllers that learn it and the port
//! that uses it.

use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};

use manager_proto::api::manager::AwsLaunchTemplate;
use manager_proto::{InstanceType, Pool, ProviderKind};
use tokio::sync::watch;

/// What a zone of a pool launches its nodes with.
#[derive(Debug, Clone, PartialEq)]
pub enum ZoneLaunch {
    /// AWS: the launch template whose subnet is in that zone.
    AwsTemplate(AwsLaunchTemplate),
    /// OCI: the subnet in that availability domain.
    OciSubnet(String),
}

/// One pool: Manager's old pool record (provider, region, zones, instance types) plus what
/// each zone launches with.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CatalogPool {
    /// The pool as the operator's placement reads it.
    pub pool: Pool,
    /// Per zone, how a node lands there; a zone without an entry uses the pool's default.
    pub zone_launch: BTreeMap<String, ZoneLaunch>,
    /// The launch used for a zone without its own entry (AWS: the pool's launch template).
    pub default_launch: Option<ZoneLaunch>,
}

impl CatalogPool {
    /// The instance type named `name`, or the pool's first when `name` is empty.
    pub fn instance_type(&self, name: &str) -> Option<&InstanceType> {
        if name.is_empty() {
            return self.pool.instance_types.first();
        }
        self.pool
            .instance_types
            .iter()
            .find(|t| t.instance_type == name)
    }

    /// How a node lands in `zone`.
    pub fn launch_in(&self, zone: &str) -> Option<&ZoneLaunch> {
        self.zone_launch.get(zone).or(self.default_launch.as_ref())
    }

    /// The pool's provider.
    pub fn kind(&self) -> ProviderKind {
        ProviderKind::try_from(self.pool.kind).unwrap_or(ProviderKind::Unspecified)
    }
}

/// The pools, shared (cheap to clone).
#[derive(Debug, Clone)]
pub struct PoolCatalog(
    Arc<RwLock<BTreeMap<String, CatalogPool>>>,
    Arc<watch::Sender<u64>>,
);

impl Default for PoolCatalog {
    fn default() -> Self {
        PoolCatalog(Arc::default(), Arc::new(watch::Sender::new(0)))
    }
}

impl PoolCatalog {
    /// An empty catalog.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds or replaces a pool.
    pub fn upsert(&self, pool: CatalogPool) {
        let mut pools = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if pools.get(&pool.pool.name) != Some(&pool) {
            pools.insert(pool.pool.name.clone(), pool);
            self.1.send_modify(|v| *v += 1);
        }
    }

    /// Forgets a pool.
    pub fn remove(&self, name: &str) {
        let mut pools = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if pools.remove(name).is_some() {
            self.1.send_modify(|v| *v += 1);
        }
    }

    /// Changes each time a pool is added, changed or removed.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.1.subscribe()
    }

    /// The pool named `name`.
    pub fn get(&self, name: &str) -> Option<CatalogPool> {
        let pools = self.0.read().unwrap_or_else(PoisonError::into_inner);
        pools.get(name).cloned()
    }

    /// Reads the pools.
    pub fn read<T>(&self, f: impl FnOnce(&BTreeMap<String, CatalogPool>) -> T) -> T {
        let pools = self.0.read().unwrap_or_else(PoisonError::into_inner);
        f(&pools)
    }

    /// Every pool's record, sorted by name.
    pub fn pools(&self) -> Vec<Pool> {
        self.read(|p| p.values().map(|c| c.pool.clone()).collect())
    }
}
