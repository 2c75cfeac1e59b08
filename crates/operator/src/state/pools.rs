//! The rules for a PlacementPool that span books: loading one into the placement model forgets
//! Manager's refusals for it when it changed, and forgetting one forgets its consolidation plan
//! and its refusals with it.

use automanager_placement as pl;
use manager_client::MirrorState;

use super::OperatorState;

impl OperatorState {
    /// Loads `spec` into the placement model; whether it changed. A changed spec may make what
    /// Manager refused acceptable: its refusals are forgotten, so the next ask is made.
    pub fn load_pool(
        &mut self,
        spec: pl::PoolSpec,
        mirror: &MirrorState,
    ) -> Result<bool, pl::InputError> {
        let name = spec.name.clone();
        let changed = self.model_mut().upsert_pool(spec, mirror)?;
        if changed {
            self.provisioning.pool_changed(&name);
        }
        Ok(changed)
    }

    /// Forgets every pool not in `existing` (its object is gone): from the model, its
    /// consolidation plan and its refusals. Returns the pools forgotten.
    pub fn prune_pools(&mut self, existing: &[String]) -> Vec<String> {
        let gone: Vec<String> = (self.model.pools().into_iter())
            .map(|p| p.name)
            .filter(|p| !existing.contains(p))
            .collect();
        for p in &gone {
            self.model_mut().remove_pool(p);
            self.disruptions.forget_consolidation(p);
            self.provisioning.pool_changed(p);
        }
        gone
    }
}
