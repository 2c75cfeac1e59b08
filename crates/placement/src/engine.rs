//! The engine's state: interned nodes and pools with incremental indexes.
//!
//! Every ready, healthy, uncordoned node of a known pool sits in exactly one *bucket* of its
//! pool, keyed by (capability set, zone, class). A bucket is a `BTreeSet` ordered by the pool's
//! packing key (free capacity, free cores, node id), so "the fullest node that fits" is a range
//! query and "the emptiest" is the last element. Nodes still starting sit in a small per-pool
//! `pending` set instead, because whether they count depends on `now`. Every mutation is
//! unindex → change → reindex: O(log n).

use std::cmp::Ordering;
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::decision::{Decision, Outcome};
use crate::model::{ClusterSnapshot, NodeSpec, PackingStrategy, PoolSpec, PriorityBand, ScaleOut};

pub(crate) type NodeIdx = u32;
pub(crate) type PoolIdx = u32;
pub(crate) type ZoneId = u32;
pub(crate) type CapSetId = u32;

/// The node a `Provision` simulation adds; never a real slab index.
pub(crate) const VIRTUAL: NodeIdx = u32::MAX;
/// The id the provision simulation gives its node (sorts after every realistic id).
pub(crate) const VIRTUAL_NAME: &str = "~new-node";

/// Largest capacity figure accepted anywhere (units of the reference workload).
pub const MAX_CAPACITY: f64 = 1.0e9;
/// Largest core count accepted anywhere.
pub const MAX_CORES: u32 = 1 << 20;

/// Capacity is held in thousandths of a unit so that keys are integers (total order, exact
/// arithmetic) and NaN cannot reach the indexes.
pub(crate) const MILLI: f64 = 1000.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NumberProblem {
    NotFinite,
    Negative,
    TooLarge,
    Zero,
}

impl fmt::Display for NumberProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NumberProblem::NotFinite => write!(f, "not a finite number"),
            NumberProblem::Negative => write!(f, "negative"),
            NumberProblem::TooLarge => write!(f, "larger than {MAX_CAPACITY}"),
            NumberProblem::Zero => write!(f, "zero"),
        }
    }
}

/// Capacity units → thousandths. Demands round up and supplies round down, so rounding never
/// lets a job onto a node it does not fit.
pub(crate) fn to_milli(v: f64, round_up: bool) -> Result<u64, NumberProblem> {
    if !v.is_finite() {
        return Err(NumberProblem::NotFinite);
    }
    if v < 0.0 {
        return Err(NumberProblem::Negative);
    }
    if v > MAX_CAPACITY {
        return Err(NumberProblem::TooLarge);
    }
    let m = v * MILLI;
    // In range by the checks above; `as` saturates anyway.
    Ok(if round_up {
        m.ceil() as u64
    } else {
        m.floor() as u64
    })
}

pub(crate) fn check_cores(c: u32) -> Result<u32, NumberProblem> {
    if c > MAX_CORES {
        Err(NumberProblem::TooLarge)
    } else {
        Ok(c)
    }
}

pub(crate) fn from_milli(m: u64) -> f64 {
    m as f64 / MILLI
}

/// A malformed pool, node or reservation.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum InputError {
    #[error("{what} has an empty id")]
    EmptyId { what: String },
    #[error("{what} {id:?} is listed twice")]
    Duplicate { what: String, id: String },
    #[error("{what} {id:?}: {field} is {problem}")]
    InvalidNumber {
        what: String,
        id: String,
        field: String,
        problem: NumberProblem,
    },
    #[error("pool {pool:?}: instance type {instance_type:?}: {detail}")]
    InvalidInstanceType {
        pool: String,
        instance_type: String,
        detail: String,
    },
    #[error("node {id:?} is not known")]
    UnknownNode { id: String },
}

/// Every problem found loading a snapshot strictly.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("snapshot has {} invalid entries; first: {}", errors.len(), errors.first().map(ToString::to_string).unwrap_or_default())]
pub struct SnapshotError {
    pub errors: Vec<InputError>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommitError {
    #[error("only a Placed decision can be committed")]
    NotPlaced,
    #[error(transparent)]
    Input(#[from] InputError),
}

/// Identifies a committed job so it can be released.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobKey {
    pub bundle_id: String,
    pub replica_index: u32,
    pub job_name: String,
}

/// A read-only view of one node, for tools, tests and status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub id: String,
    pub pool: String,
    pub zone: Option<String>,
    pub total_capacity: f64,
    pub used_capacity: f64,
    pub free_capacity: f64,
    pub total_cores: u32,
    pub used_cores: u32,
    pub spare: bool,
    pub spare_band: Option<PriorityBand>,
    pub cordoned: bool,
    pub healthy: bool,
    pub pending: bool,
}

/// Per-pool figures for PlacementPool status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolUsage {
    pub node_count: u32,
    pub live_spares: u32,
    pub used_capacity_fraction: f64,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Interner {
    map: HashMap<String, u32>,
    names: Vec<String>,
}

impl Interner {
    pub(crate) fn intern(&mut self, s: &str) -> u32 {
        if let Some(&id) = self.map.get(s) {
            return id;
        }
        let id = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        self.map.insert(s.to_owned(), id);
        self.names.push(s.to_owned());
        id
    }

    pub(crate) fn get(&self, s: &str) -> Option<u32> {
        self.map.get(s).copied()
    }

    pub(crate) fn name(&self, id: u32) -> Option<&str> {
        self.names.get(id as usize).map(String::as_str)
    }
}

/// `req ⊆ have` over bitsets of capability ids.
pub(crate) fn is_subset(req: &[u64], have: &[u64]) -> bool {
    req.iter()
        .enumerate()
        .all(|(i, w)| *w == 0 || have.get(i).is_some_and(|h| w & h == *w))
}

pub(crate) fn set_bit(bits: &mut Vec<u64>, id: u32) {
    let word = (id / 64) as usize;
    if bits.len() <= word {
        bits.resize(word + 1, 0);
    }
    if let Some(w) = bits.get_mut(word) {
        *w |= 1u64 << (id % 64);
    }
}

/// A node's class decides which placements may use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Class {
    Regular,
    Spare(Option<PriorityBand>),
}

impl Class {
    pub(crate) fn code(self) -> u8 {
        match self {
            Class::Regular => 0,
            Class::Spare(None) => 1,
            Class::Spare(Some(PriorityBand::Gold)) => 2,
            Class::Spare(Some(PriorityBand::Silver)) => 3,
            Class::Spare(Some(PriorityBand::Bronze)) => 4,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct NodeState {
    pub id: Arc<str>,
    /// Distinguishes this node from a later one reusing the slab slot.
    pub generation: u64,
    pub pool: Option<PoolIdx>,
    pub pool_name: Arc<str>,
    pub zone: Option<ZoneId>,
    pub capset: CapSetId,
    pub total_cap: u64,
    pub used_cap: u64,
    pub total_cores: u32,
    pub used_cores: u32,
    pub cordoned: bool,
    pub healthy: bool,
    pub spare: bool,
    pub spare_band: Option<PriorityBand>,
    pub pending_since: Option<u64>,
}

impl NodeState {
    pub(crate) fn free_cap(&self) -> u64 {
        self.total_cap.saturating_sub(self.used_cap)
    }

    pub(crate) fn free_cores(&self) -> u32 {
        self.total_cores.saturating_sub(self.used_cores)
    }

    pub(crate) fn class(&self) -> Class {
        if self.spare {
            Class::Spare(self.spare_band)
        } else {
            Class::Regular
        }
    }

    /// Indexed in a bucket (ready) rather than in the pending set or nowhere.
    pub(crate) fn bucketed(&self) -> bool {
        !self.cordoned && self.healthy && self.pending_since.is_none()
    }
}

/// A bucket entry. Ordered by the pool's packing key; with `rev` (spread pools) the node id
/// compares reversed so that the *last* entry is the emptiest node with the smallest id.
#[derive(Debug, Clone)]
pub(crate) struct Key {
    pub free: u64,
    pub cores: u32,
    pub name: Arc<str>,
    pub rev: bool,
    pub idx: NodeIdx,
}

impl Ord for Key {
    fn cmp(&self, o: &Self) -> Ordering {
        self.free
            .cmp(&o.free)
            .then(self.cores.cmp(&o.cores))
            .then_with(|| {
                if self.rev {
                    o.name.cmp(&self.name)
                } else {
                    self.name.cmp(&o.name)
                }
            })
            .then(self.idx.cmp(&o.idx))
    }
}

impl PartialOrd for Key {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl PartialEq for Key {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}

impl Eq for Key {}

/// Free-core classes: 0, 1, 2–3, 4–7, … up to [`MAX_CORES`].
pub(crate) const CORE_CLASSES: usize = 22;

/// The class of a free-core count: 0 for none, else 1 + ⌊log2⌋.
pub(crate) fn core_class(cores: u32) -> usize {
    if cores == 0 {
        0
    } else {
        (32 - cores.leading_zeros()) as usize
    }
    .min(CORE_CLASSES - 1)
}

/// The nodes of one (capability set, zone, class) in a pool. Each is further split by its
/// free-core class, so a search for `c` cores skips every node with fewer cores wholesale
/// (except those sharing `c`'s class) instead of stepping over them one by one when cores,
/// not capacity, run out first.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    pub capset: CapSetId,
    pub zone: Option<ZoneId>,
    pub class: Class,
    pub sets: Vec<BTreeSet<Key>>,
}

#[derive(Debug, Clone)]
pub(crate) struct TypeState {
    pub name: String,
    pub cap: u64,
    pub cores: u32,
    pub capset: CapSetId,
}

#[derive(Debug, Clone)]
pub(crate) struct PoolState {
    pub spec: PoolSpec,
    pub strategy: PackingStrategy,
    pub elastic: bool,
    /// Candidate types, smallest first: (capacity, cores, name).
    pub types: Vec<TypeState>,
    /// Zones a new node may be asked for, in preference order; `[None]` when the pool names none.
    pub provision_zones: Vec<Option<ZoneId>>,
    pub buckets: Vec<Bucket>,
    pub bucket_of: HashMap<(CapSetId, Option<ZoneId>, u8), usize>,
    pub members: BTreeSet<NodeIdx>,
    pub pending: BTreeSet<NodeIdx>,
    /// Cordoned or unhealthy members: in no bucket and not pending.
    pub unbucketed: BTreeSet<NodeIdx>,
}

#[derive(Debug, Clone)]
struct Reservation {
    node: NodeIdx,
    generation: u64,
    cap: u64,
    cores: u32,
}

/// The placement engine: cluster state plus indexes. See the crate docs for the semantics.
#[derive(Debug, Clone)]
pub struct Engine {
    pub(crate) pending_window: u64,
    pub(crate) caps: Interner,
    pub(crate) capsets: Vec<Vec<u64>>,
    capset_of: HashMap<Vec<u64>, CapSetId>,
    pub(crate) zones: Interner,
    pub(crate) pools: Vec<Option<PoolState>>,
    pub(crate) pool_by_name: HashMap<String, PoolIdx>,
    pub(crate) nodes: Vec<Option<NodeState>>,
    pub(crate) node_by_id: HashMap<Arc<str>, NodeIdx>,
    free_slots: Vec<NodeIdx>,
    next_generation: u64,
    /// Persistent (structure-sharing) so that cloning the engine, which every what-if dry run
    /// and every published snapshot does, costs O(1) here rather than a copy of every job.
    reservations: imbl::HashMap<JobKey, Reservation>,
    pub(crate) probe_name: Arc<str>,
    /// Degraded zones, by pool name (the operator's zone brake): never provisioned into, their
    /// nodes used only as a last resort.
    pub(crate) paused_zones: HashMap<String, BTreeSet<String>>,
}

impl Default for Engine {
    fn default() -> Self {
        Engine::empty(crate::model::DEFAULT_PENDING_WINDOW_MS)
    }
}

impl Engine {
    /// An engine with no pools and no nodes.
    pub fn empty(pending_window_ms: u64) -> Self {
        let mut e = Engine {
            pending_window: pending_window_ms,
            caps: Interner::default(),
            capsets: Vec::new(),
            capset_of: HashMap::new(),
            zones: Interner::default(),
            pools: Vec::new(),
            pool_by_name: HashMap::new(),
            nodes: Vec::new(),
            node_by_id: HashMap::new(),
            free_slots: Vec::new(),
            next_generation: 0,
            reservations: imbl::HashMap::new(),
            probe_name: Arc::from(""),
            paused_zones: HashMap::new(),
        };
        // Capability set 0 is the empty set.
        e.capset_id(Vec::new());
        e
    }

    /// Loads a snapshot; any invalid pool or node fails the whole load with every problem listed.
    pub fn new(snapshot: ClusterSnapshot) -> Result<Self, SnapshotError> {
        let (engine, errors) = Engine::new_lenient(snapshot);
        if errors.is_empty() {
            Ok(engine)
        } else {
            Err(SnapshotError { errors })
        }
    }

    /// Loads a snapshot, skipping (and returning) invalid pools and nodes; for a running
    /// operator, where one bad node must not stop every placement.
    pub fn new_lenient(snapshot: ClusterSnapshot) -> (Self, Vec<InputError>) {
        let mut engine = Engine::empty(snapshot.pending_window_ms);
        let mut errors = Vec::new();
        let mut seen_pools = std::collections::HashSet::new();
        for pool in snapshot.pools {
            if !seen_pools.insert(pool.name.clone()) {
                errors.push(InputError::Duplicate {
                    what: "pool".into(),
                    id: pool.name,
                });
                continue;
            }
            if let Err(e) = engine.upsert_pool(pool) {
                errors.push(e);
            }
        }
        for node in snapshot.nodes {
            if engine.node_by_id.contains_key(node.id.as_str()) {
                errors.push(InputError::Duplicate {
                    what: "node".into(),
                    id: node.id,
                });
                continue;
            }
            if let Err(e) = engine.upsert_node(node) {
                errors.push(e);
            }
        }
        (engine, errors)
    }

    pub fn pending_window_ms(&self) -> u64 {
        self.pending_window
    }

    pub fn set_pending_window_ms(&mut self, ms: u64) {
        self.pending_window = ms;
    }

    fn capset_id(&mut self, mut bits: Vec<u64>) -> CapSetId {
        while bits.last() == Some(&0) {
            bits.pop();
        }
        if let Some(&id) = self.capset_of.get(&bits) {
            return id;
        }
        let id = u32::try_from(self.capsets.len()).unwrap_or(u32::MAX);
        self.capsets.push(bits.clone());
        self.capset_of.insert(bits, id);
        id
    }

    fn intern_caps(&mut self, caps: &[String]) -> CapSetId {
        let mut bits = Vec::new();
        for c in caps {
            let id = self.caps.intern(c);
            set_bit(&mut bits, id);
        }
        self.capset_id(bits)
    }

    pub(crate) fn capset_bits(&self, id: CapSetId) -> &[u64] {
        self.capsets
            .get(id as usize)
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    pub(crate) fn pool(&self, p: PoolIdx) -> Option<&PoolState> {
        self.pools.get(p as usize).and_then(Option::as_ref)
    }

    pub(crate) fn node(&self, n: NodeIdx) -> Option<&NodeState> {
        self.nodes.get(n as usize).and_then(Option::as_ref)
    }

    pub(crate) fn zone_name(&self, z: Option<ZoneId>) -> Option<String> {
        z.and_then(|z| self.zones.name(z)).map(str::to_owned)
    }

    /// Marks `zone` of `pool` degraded (the operator's zone brake), or clears it: no node is
    /// provisioned there, and its nodes are the last resort: a replica goes to them only when no
    /// other zone or pool (a new node included) can take it, and its trace says so
    /// (`lastResort`). Kept across pool updates.
    pub fn set_provisioning_paused(&mut self, pool: &str, zone: &str, paused: bool) {
        if paused {
            self.paused_zones
                .entry(pool.to_owned())
                .or_default()
                .insert(zone.to_owned());
        } else if let Some(set) = self.paused_zones.get_mut(pool) {
            set.remove(zone);
            if set.is_empty() {
                self.paused_zones.remove(pool);
            }
        }
    }

    /// Whether provisioning into `zone` of `pool` is paused.
    pub fn provisioning_paused(&self, pool: &str, zone: &str) -> bool {
        self.paused_zones
            .get(pool)
            .is_some_and(|set| set.contains(zone))
    }

    /// Adds or replaces a pool. Its nodes are re-indexed (O(pool size); pools change rarely).
    pub fn upsert_pool(&mut self, spec: PoolSpec) -> Result<(), InputError> {
        if spec.name.is_empty() {
            return Err(InputError::EmptyId {
                what: "pool".into(),
            });
        }
        let mut types = Vec::with_capacity(spec.candidate_instance_types.len());
        for t in &spec.candidate_instance_types {
            let bad = |detail: String| InputError::InvalidInstanceType {
                pool: spec.name.clone(),
                instance_type: t.instance_type.clone(),
                detail,
            };
            if t.instance_type.is_empty() {
                return Err(bad("empty instanceType".into()));
            }
            if types.iter().any(|x: &TypeState| x.name == t.instance_type) {
                return Err(bad("listed twice".into()));
            }
            let cap = to_milli(t.total_capacity, false)
                .map_err(|p| bad(format!("totalCapacity is {p}")))?;
            if cap == 0 {
                return Err(bad("totalCapacity is zero".into()));
            }
            let cores =
                check_cores(t.total_cores).map_err(|p| bad(format!("totalCores is {p}")))?;
            let capset = self.intern_caps(&t.capabilities);
            types.push(TypeState {
                name: t.instance_type.clone(),
                cap,
                cores,
                capset,
            });
        }
        types.sort_by(|a, b| {
            a.cap
                .cmp(&b.cap)
                .then(a.cores.cmp(&b.cores))
                .then_with(|| a.name.cmp(&b.name))
        });
        let mut provision_zones: Vec<Option<ZoneId>> = Vec::new();
        for z in &spec.zones {
            let id = Some(self.zones.intern(z));
            if !provision_zones.contains(&id) {
                provision_zones.push(id);
            }
        }
        if provision_zones.is_empty() {
            provision_zones.push(None);
        }
        let existing = self.pool_by_name.get(&spec.name).copied();
        let members: Vec<NodeIdx> = match existing.and_then(|p| self.pool(p)) {
            Some(p) => p.members.iter().copied().collect(),
            None => self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(i, n)| {
                    n.as_ref()
                        .filter(|n| *n.pool_name == *spec.name)
                        .map(|_| i as NodeIdx)
                })
                .collect(),
        };
        for &m in &members {
            self.unindex(m);
        }
        let state = PoolState {
            strategy: spec.packing_strategy,
            elastic: spec.scale_out == ScaleOut::Elastic,
            types,
            provision_zones,
            buckets: Vec::new(),
            bucket_of: HashMap::new(),
            members: BTreeSet::new(),
            pending: BTreeSet::new(),
            unbucketed: BTreeSet::new(),
            spec,
        };
        let pidx = match existing {
            Some(p) => {
                if let Some(slot) = self.pools.get_mut(p as usize) {
                    *slot = Some(state);
                }
                p
            }
            None => {
                let p = u32::try_from(self.pools.len()).unwrap_or(u32::MAX);
                self.pool_by_name.insert(state.spec.name.clone(), p);
                self.pools.push(Some(state));
                p
            }
        };
        for &m in &members {
            if let Some(n) = self.nodes.get_mut(m as usize).and_then(Option::as_mut) {
                n.pool = Some(pidx);
            }
            self.index(m);
        }
        tracing::debug!(
            pool = pidx,
            nodes = members.len(),
            "placement pool upserted"
        );
        Ok(())
    }

    /// Removes a pool; its nodes stay known but are no longer candidates.
    pub fn remove_pool(&mut self, name: &str) -> bool {
        let Some(p) = self.pool_by_name.remove(name) else {
            return false;
        };
        let members: Vec<NodeIdx> = self
            .pool(p)
            .map(|s| s.members.iter().copied().collect())
            .unwrap_or_default();
        for &m in &members {
            self.unindex(m);
            if let Some(n) = self.nodes.get_mut(m as usize).and_then(Option::as_mut) {
                n.pool = None;
            }
        }
        if let Some(slot) = self.pools.get_mut(p as usize) {
            *slot = None;
        }
        true
    }

    /// Adds or replaces a node (as the Manager mirror reports it). `usedCapacity`/`usedCores`
    /// replace what the engine had, reservations included: the mirror is the truth.
    pub fn upsert_node(&mut self, spec: NodeSpec) -> Result<(), InputError> {
        if spec.id.is_empty() {
            return Err(InputError::EmptyId {
                what: "node".into(),
            });
        }
        let bad = |field: &str, problem| InputError::InvalidNumber {
            what: "node".into(),
            id: spec.id.clone(),
            field: field.into(),
            problem,
        };
        let total_cap =
            to_milli(spec.total_capacity, false).map_err(|p| bad("totalCapacity", p))?;
        let used_cap = to_milli(spec.used_capacity, true).map_err(|p| bad("usedCapacity", p))?;
        let total_cores = check_cores(spec.total_cores).map_err(|p| bad("totalCores", p))?;
        let used_cores = check_cores(spec.used_cores).map_err(|p| bad("usedCores", p))?;
        let capset = self.intern_caps(&spec.capabilities);
        let zone = spec.zone.as_deref().map(|z| self.zones.intern(z));
        let pool = self.pool_by_name.get(&spec.pool).copied();
        let existing = self.node_by_id.get(spec.id.as_str()).copied();
        let (idx, id, generation) = match existing {
            Some(i) => {
                self.unindex(i);
                let (id, generation) = match self.node(i) {
                    Some(n) => (n.id.clone(), n.generation),
                    None => (Arc::from(spec.id.as_str()), self.bump_generation()),
                };
                (i, id, generation)
            }
            None => {
                let id: Arc<str> = Arc::from(spec.id.as_str());
                let generation = self.bump_generation();
                let i = match self.free_slots.pop() {
                    Some(i) => i,
                    None => {
                        self.nodes.push(None);
                        u32::try_from(self.nodes.len() - 1).unwrap_or(u32::MAX)
                    }
                };
                self.node_by_id.insert(id.clone(), i);
                (i, id, generation)
            }
        };
        let state = NodeState {
            id,
            generation,
            pool,
            pool_name: Arc::from(spec.pool),
            zone,
            capset,
            total_cap,
            used_cap,
            total_cores,
            used_cores,
            cordoned: spec.cordoned,
            healthy: spec.healthy,
            spare: spec.spare,
            spare_band: if spec.spare { spec.spare_band } else { None },
            pending_since: spec.pending_since_ms,
        };
        if let Some(slot) = self.nodes.get_mut(idx as usize) {
            *slot = Some(state);
        }
        self.index(idx);
        Ok(())
    }

    fn bump_generation(&mut self) -> u64 {
        self.next_generation = self.next_generation.wrapping_add(1);
        self.next_generation
    }

    /// Forgets a node (terminated). Reservations on it are dropped lazily.
    pub fn remove_node(&mut self, id: &str) -> bool {
        let Some(idx) = self.node_by_id.remove(id) else {
            return false;
        };
        self.unindex(idx);
        if let Some(slot) = self.nodes.get_mut(idx as usize) {
            *slot = None;
        }
        self.free_slots.push(idx);
        true
    }

    /// Marks a node cordoned or not (no new placements while cordoned).
    pub fn set_cordoned(&mut self, id: &str, cordoned: bool) -> Result<(), InputError> {
        self.modify(id, |n| n.cordoned = cordoned)
    }

    pub fn set_healthy(&mut self, id: &str, healthy: bool) -> Result<(), InputError> {
        self.modify(id, |n| n.healthy = healthy)
    }

    /// A starting node became ready.
    pub fn mark_started(&mut self, id: &str) -> Result<(), InputError> {
        self.modify(id, |n| n.pending_since = None)
    }

    fn modify(&mut self, id: &str, f: impl FnOnce(&mut NodeState)) -> Result<(), InputError> {
        let Some(&idx) = self.node_by_id.get(id) else {
            return Err(InputError::UnknownNode { id: id.to_owned() });
        };
        self.unindex(idx);
        if let Some(n) = self.nodes.get_mut(idx as usize).and_then(Option::as_mut) {
            f(n);
        }
        self.index(idx);
        Ok(())
    }

    /// Reserves capacity for a job on a node (a job started there). A spare that takes a job
    /// stops being a spare. Re-reserving a key moves the job.
    pub fn reserve(
        &mut self,
        job: JobKey,
        node: &str,
        capacity: f64,
        cores: u32,
    ) -> Result<(), InputError> {
        let bad = |field: &str, problem| InputError::InvalidNumber {
            what: "job".into(),
            id: job.job_name.clone(),
            field: field.into(),
            problem,
        };
        let cap = to_milli(capacity, true).map_err(|p| bad("requiredCapacity", p))?;
        let cores = check_cores(cores).map_err(|p| bad("requiredCores", p))?;
        let Some(&idx) = self.node_by_id.get(node) else {
            return Err(InputError::UnknownNode {
                id: node.to_owned(),
            });
        };
        self.release_job(&job);
        self.unindex(idx);
        let mut generation = 0;
        if let Some(n) = self.nodes.get_mut(idx as usize).and_then(Option::as_mut) {
            n.used_cap = n.used_cap.saturating_add(cap);
            n.used_cores = n.used_cores.saturating_add(cores);
            n.spare = false;
            n.spare_band = None;
            generation = n.generation;
        }
        self.index(idx);
        self.reservations.insert(
            job,
            Reservation {
                node: idx,
                generation,
                cap,
                cores,
            },
        );
        Ok(())
    }

    /// Gives back what a job reserved (it stopped). False when the engine holds no reservation
    /// for it.
    pub fn release_job(&mut self, job: &JobKey) -> bool {
        let Some(r) = self.reservations.remove(job) else {
            return false;
        };
        if self
            .node(r.node)
            .is_some_and(|n| n.generation == r.generation)
        {
            self.unindex(r.node);
            if let Some(n) = self.nodes.get_mut(r.node as usize).and_then(Option::as_mut) {
                n.used_cap = n.used_cap.saturating_sub(r.cap);
                n.used_cores = n.used_cores.saturating_sub(r.cores);
            }
            self.index(r.node);
        }
        true
    }

    /// Reserves every assignment of a `Placed` decision, all or none.
    pub fn commit(&mut self, decision: &Decision) -> Result<(), CommitError> {
        let Outcome::Placed { assignments, .. } = &decision.outcome else {
            return Err(CommitError::NotPlaced);
        };
        for a in assignments {
            if !self.node_by_id.contains_key(a.node.as_str()) {
                return Err(InputError::UnknownNode { id: a.node.clone() }.into());
            }
            to_milli(a.capacity, true).map_err(|problem| InputError::InvalidNumber {
                what: "job".into(),
                id: a.job_name.clone(),
                field: "requiredCapacity".into(),
                problem,
            })?;
            check_cores(a.cores).map_err(|problem| InputError::InvalidNumber {
                what: "job".into(),
                id: a.job_name.clone(),
                field: "requiredCores".into(),
                problem,
            })?;
        }
        for a in assignments {
            let key = JobKey {
                bundle_id: decision.bundle_id.clone(),
                replica_index: decision.replica_index,
                job_name: a.job_name.clone(),
            };
            self.reserve(key, &a.node, a.capacity, a.cores)?;
        }
        Ok(())
    }

    pub fn node_view(&self, id: &str) -> Option<NodeView> {
        let n = self.node(*self.node_by_id.get(id)?)?;
        Some(NodeView {
            id: n.id.to_string(),
            pool: n.pool_name.to_string(),
            zone: self.zone_name(n.zone),
            total_capacity: from_milli(n.total_cap),
            used_capacity: from_milli(n.used_cap),
            free_capacity: from_milli(n.free_cap()),
            total_cores: n.total_cores,
            used_cores: n.used_cores,
            spare: n.spare,
            spare_band: n.spare_band,
            cordoned: n.cordoned,
            healthy: n.healthy,
            pending: n.pending_since.is_some(),
        })
    }

    /// Every node, ordered by id.
    pub fn node_views(&self) -> Vec<NodeView> {
        let mut ids: Vec<&Arc<str>> = self.node_by_id.keys().collect();
        ids.sort();
        ids.into_iter()
            .filter_map(|id| self.node_view(id))
            .collect()
    }

    pub fn node_count(&self) -> usize {
        self.node_by_id.len()
    }

    pub fn pool_spec(&self, name: &str) -> Option<&PoolSpec> {
        self.pool(*self.pool_by_name.get(name)?).map(|p| &p.spec)
    }

    pub fn pool_specs(&self) -> Vec<&PoolSpec> {
        let mut v: Vec<&PoolSpec> = self.pools.iter().flatten().map(|p| &p.spec).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn pool_usage(&self, name: &str) -> Option<PoolUsage> {
        let p = self.pool(*self.pool_by_name.get(name)?)?;
        let (mut total, mut used, mut spares) = (0u64, 0u64, 0u32);
        for n in p.members.iter().filter_map(|&m| self.node(m)) {
            total = total.saturating_add(n.total_cap);
            used = used.saturating_add(n.used_cap.min(n.total_cap));
            if n.spare && !n.cordoned && n.healthy {
                spares = spares.saturating_add(1);
            }
        }
        Some(PoolUsage {
            node_count: u32::try_from(p.members.len()).unwrap_or(u32::MAX),
            live_spares: spares,
            used_capacity_fraction: if total == 0 {
                0.0
            } else {
                used as f64 / total as f64
            },
        })
    }

    pub(crate) fn key_of(&self, n: &NodeState, idx: NodeIdx, strategy: PackingStrategy) -> Key {
        Key {
            free: n.free_cap(),
            cores: n.free_cores(),
            name: n.id.clone(),
            rev: strategy == PackingStrategy::Spread,
            idx,
        }
    }

    fn index(&mut self, idx: NodeIdx) {
        let Some(n) = self.node(idx) else { return };
        let Some(p) = n.pool else { return };
        let Some(pool) = self.pool(p) else { return };
        let bucketed = n.bucketed();
        let pending = !n.cordoned && n.healthy && n.pending_since.is_some();
        let bucket_key = (n.capset, n.zone, n.class().code());
        let (capset, zone, class) = (n.capset, n.zone, n.class());
        let key = self.key_of(n, idx, pool.strategy);
        let Some(pool) = self.pools.get_mut(p as usize).and_then(Option::as_mut) else {
            return;
        };
        pool.members.insert(idx);
        if !pending && !bucketed {
            pool.unbucketed.insert(idx);
        }
        if pending {
            pool.pending.insert(idx);
        }
        if bucketed {
            let b = match pool.bucket_of.get(&bucket_key) {
                Some(&b) => b,
                None => {
                    pool.buckets.push(Bucket {
                        capset,
                        zone,
                        class,
                        sets: vec![BTreeSet::new(); CORE_CLASSES],
                    });
                    let b = pool.buckets.len() - 1;
                    pool.bucket_of.insert(bucket_key, b);
                    b
                }
            };
            if let Some(set) = pool
                .buckets
                .get_mut(b)
                .and_then(|bk| bk.sets.get_mut(core_class(key.cores)))
            {
                set.insert(key);
            }
        }
    }

    fn unindex(&mut self, idx: NodeIdx) {
        let Some(n) = self.node(idx) else { return };
        let Some(p) = n.pool else { return };
        let Some(pool) = self.pool(p) else { return };
        let bucket_key = (n.capset, n.zone, n.class().code());
        let key = self.key_of(n, idx, pool.strategy);
        let Some(pool) = self.pools.get_mut(p as usize).and_then(Option::as_mut) else {
            return;
        };
        pool.members.remove(&idx);
        pool.pending.remove(&idx);
        pool.unbucketed.remove(&idx);
        if let Some(&b) = pool.bucket_of.get(&bucket_key)
            && let Some(set) = pool
                .buckets
                .get_mut(b)
                .and_then(|bk| bk.sets.get_mut(core_class(key.cores)))
        {
            set.remove(&key);
        }
    }
}
