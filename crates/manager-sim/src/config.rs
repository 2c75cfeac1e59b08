//! The sim's YAML configuration: pools (elastic or fixed), timings, listen
//! address, optional token and TLS. See `docs/manager-sim.md` and
//! `examples/demo.yaml`.
//!
//! Unknown keys are errors (a typo must not silently change behaviour) and
//! [`SimConfig::validate`] lists every problem at once.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;

use manager_proto::{InstanceType, Pool, ProviderKind, ScaleOut};
use serde::{Deserialize, Serialize};

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// Not YAML of the right shape (unknown key, wrong type, ...).
    #[error("invalid sim config: {0}")]
    Parse(String),
    /// Well-formed but contradictory values; every problem is listed.
    #[error("invalid sim config:\n  - {}", .0.join("\n  - "))]
    Invalid(Vec<String>),
}

/// Provider of a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolKind {
    /// Amazon.
    Aws,
    /// Oracle.
    Oci,
    /// On-premises.
    Cluster,
}

impl PoolKind {
    /// How long a stopped node of this provider takes to start when the configuration says
    /// nothing: about what EC2 warm pools and OCI stopped instances take (tens of seconds).
    pub fn default_start_delay_ms(self) -> u64 {
        match self {
            PoolKind::Aws => 30_000,
            PoolKind::Oci => 40_000,
            PoolKind::Cluster => 0,
        }
    }

    /// How long stopping a node takes when the configuration says nothing.
    pub fn default_stop_delay_ms(self) -> u64 {
        match self {
            PoolKind::Aws => 10_000,
            PoolKind::Oci => 15_000,
            PoolKind::Cluster => 0,
        }
    }

    /// Whether nodes of this provider can be stopped and started (declared hardware cannot).
    pub fn can_stop(self) -> bool {
        !matches!(self, PoolKind::Cluster)
    }

    /// The proto enum.
    pub fn to_proto(self) -> ProviderKind {
        match self {
            PoolKind::Aws => ProviderKind::Aws,
            PoolKind::Oci => ProviderKind::Oci,
            PoolKind::Cluster => ProviderKind::Cluster,
        }
    }
}

/// Elastic or fixed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScaleOutConfig {
    /// CreateNode provisions nodes.
    Elastic,
    /// Nodes are declared.
    Fixed,
}

/// A machine shape of an elastic pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceTypeConfig {
    /// Provider name, e.g. `m5.xlarge`.
    pub instance_type: String,
    /// Capacity score.
    pub capacity: f64,
    /// Cores.
    pub cores: i32,
    /// Capabilities.
    #[serde(default)]
    pub capabilities: Vec<String>,
}

/// A declared node of a fixed pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeclaredNode {
    /// Node id.
    pub id: String,
    /// Zone (one of the pool's zones).
    pub zone: String,
    /// Capacity score.
    pub capacity: f64,
    /// Cores.
    pub cores: i32,
    /// Capabilities.
    #[serde(default)]
    pub capabilities: Vec<String>,
}

fn yes() -> bool {
    true
}

/// One pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PoolConfig {
    /// Pool name.
    pub name: String,
    /// Provider.
    pub kind: PoolKind,
    /// Region.
    pub region: String,
    /// Zones.
    pub zones: Vec<String>,
    /// Elastic or fixed.
    pub scale_out: ScaleOutConfig,
    /// Override of `timing.provisionDelayMs` for this pool.
    #[serde(default)]
    pub provision_delay_ms: Option<u64>,
    /// Override of `timing.startDelayMs` for this pool: how long a stopped node takes to start.
    #[serde(default)]
    pub start_delay_ms: Option<u64>,
    /// Override of `timing.stopDelayMs` for this pool: how long StopNode takes.
    #[serde(default)]
    pub stop_delay_ms: Option<u64>,
    /// Whether nodes advertise `norsk.io/job-socket` (default true).
    #[serde(default = "yes")]
    pub job_socket: bool,
    /// Elastic pools: what CreateNode can provision (first = default).
    #[serde(default)]
    pub instance_types: Vec<InstanceTypeConfig>,
    /// Fixed pools: the nodes.
    #[serde(default)]
    pub nodes: Vec<DeclaredNode>,
}

impl PoolConfig {
    /// The proto view.
    pub fn to_proto(&self, provision_delay_ms: u64, start_delay_ms: u64) -> Pool {
        Pool {
            name: self.name.clone(),
            kind: self.kind.to_proto() as i32,
            region: self.region.clone(),
            zones: self.zones.clone(),
            scale_out: match self.scale_out {
                ScaleOutConfig::Elastic => ScaleOut::Elastic,
                ScaleOutConfig::Fixed => ScaleOut::Fixed,
            } as i32,
            instance_types: self
                .instance_types
                .iter()
                .map(|t| InstanceType {
                    instance_type: t.instance_type.clone(),
                    capacity: t.capacity,
                    cores: t.cores,
                    capabilities: t.capabilities.clone(),
                })
                .collect(),
            provision_delay_ms,
            start_delay_ms,
            can_stop: self.kind.can_stop(),
        }
    }
}

/// Delays of the simulated machinery.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TimingConfig {
    /// Elastic provisioning delay (default 200 ms; "realistic" is seconds).
    pub provision_delay_ms: u64,
    /// STARTING → RUNNING (default 20 ms).
    pub job_start_delay_ms: u64,
    /// STOPPING → STOPPED (default 20 ms).
    pub job_stop_delay_ms: u64,
    /// POWERED_OFF → STARTED after StartNode; absent: the provider's default (30 s for aws,
    /// 40 s for oci).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_delay_ms: Option<u64>,
    /// POWERING_OFF → POWERED_OFF after StopNode; absent: the provider's default (10 s for
    /// aws, 15 s for oci).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_delay_ms: Option<u64>,
}

impl TimingConfig {
    /// Seconds-scale delays for a demo that looks like a real cloud.
    pub fn realistic() -> Self {
        TimingConfig {
            provision_delay_ms: 5000,
            job_start_delay_ms: 1000,
            job_stop_delay_ms: 500,
            start_delay_ms: None,
            stop_delay_ms: None,
        }
    }
}

impl Default for TimingConfig {
    fn default() -> Self {
        TimingConfig {
            provision_delay_ms: 200,
            job_start_delay_ms: 20,
            job_stop_delay_ms: 20,
            start_delay_ms: None,
            stop_delay_ms: None,
        }
    }
}

/// Server-side TLS: PEM files.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsFiles {
    /// Certificate chain (PEM).
    pub cert_file: PathBuf,
    /// Private key (PEM).
    pub key_file: PathBuf,
}

/// Limits protecting the server.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest request message (default 4 MiB).
    pub max_request_bytes: usize,
    /// Event batches buffered per watcher before it is cut (default 4096).
    pub watch_buffer: usize,
    /// Events retained for resume (default 100,000).
    pub event_log_capacity: usize,
    /// Objects per snapshot chunk (default 1000).
    pub snapshot_chunk: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_request_bytes: 4 * 1024 * 1024,
            watch_buffer: 4096,
            event_log_capacity: 100_000,
            snapshot_chunk: 1000,
        }
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SimConfig {
    /// Address to bind (default `127.0.0.1:0`: any free port).
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Bearer token required on every call when set.
    #[serde(default)]
    pub token: Option<String>,
    /// TLS when set.
    #[serde(default)]
    pub tls: Option<TlsFiles>,
    /// Directory for the persisted world; memory only when unset.
    #[serde(default)]
    pub state_dir: Option<PathBuf>,
    /// Delays.
    #[serde(default)]
    pub timing: TimingConfig,
    /// Limits.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Pools.
    pub pools: Vec<PoolConfig>,
}

impl SimConfig {
    /// Parses YAML and validates.
    pub fn from_yaml(text: &str) -> Result<SimConfig, ConfigError> {
        let cfg: SimConfig =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads, parses and validates a file.
    pub fn from_file(path: &std::path::Path) -> Result<SimConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        SimConfig::from_yaml(&text)
    }

    /// The configuration of `examples/demo.yaml` (an elastic aws pool, an
    /// elastic oci pool and a fixed cluster pool of four nodes in two zones).
    pub fn demo() -> SimConfig {
        // The example file is parsed by a test, so this cannot fail in a
        // released build; fall back to an empty sim rather than panic.
        SimConfig::from_yaml(include_str!("../examples/demo.yaml")).unwrap_or_else(|_| SimConfig {
            listen: default_listen(),
            token: None,
            tls: None,
            state_dir: None,
            timing: TimingConfig::default(),
            limits: LimitsConfig::default(),
            pools: Vec::new(),
        })
    }

    /// Every problem with the values, at once.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut errs = Vec::new();
        let mut pool_names = BTreeSet::new();
        let mut node_ids = BTreeSet::new();
        if self.token.as_ref().is_some_and(String::is_empty) {
            errs.push("token must not be empty when set".to_owned());
        }
        if self.limits.watch_buffer == 0 {
            errs.push("limits.watchBuffer must be at least 1".to_owned());
        }
        if self.limits.snapshot_chunk == 0 {
            errs.push("limits.snapshotChunk must be at least 1".to_owned());
        }
        if self.limits.event_log_capacity == 0 {
            errs.push("limits.eventLogCapacity must be at least 1".to_owned());
        }
        if self.limits.max_request_bytes < 1024 {
            errs.push("limits.maxRequestBytes must be at least 1024".to_owned());
        }
        let ok_name = |s: &str| {
            !s.is_empty()
                && s.len() <= 63
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        };
        for (i, p) in self.pools.iter().enumerate() {
            let at = format!("pools[{i}] ({})", p.name);
            if !ok_name(&p.name) {
                errs.push(format!("{at}: name must be 1-63 of [A-Za-z0-9._-]"));
            }
            if !pool_names.insert(p.name.clone()) {
                errs.push(format!("{at}: duplicate pool name"));
            }
            if p.zones.is_empty() {
                errs.push(format!("{at}: at least one zone is required"));
            }
            match (p.kind, p.scale_out) {
                (PoolKind::Cluster, ScaleOutConfig::Elastic) => {
                    errs.push(format!("{at}: a cluster pool must be scaleOut: fixed"));
                }
                (PoolKind::Aws | PoolKind::Oci, ScaleOutConfig::Fixed) => {
                    errs.push(format!("{at}: aws and oci pools must be scaleOut: elastic"));
                }
                _ => {}
            }
            match p.scale_out {
                ScaleOutConfig::Elastic => {
                    if p.instance_types.is_empty() {
                        errs.push(format!("{at}: an elastic pool needs instanceTypes"));
                    }
                    if !p.nodes.is_empty() {
                        errs.push(format!("{at}: an elastic pool cannot declare nodes"));
                    }
                }
                ScaleOutConfig::Fixed => {
                    if p.nodes.is_empty() {
                        errs.push(format!("{at}: a fixed pool needs nodes"));
                    }
                    if !p.instance_types.is_empty() {
                        errs.push(format!("{at}: a fixed pool cannot have instanceTypes"));
                    }
                }
            }
            for t in &p.instance_types {
                if t.instance_type.is_empty() {
                    errs.push(format!("{at}: an instance type has an empty name"));
                }
                if !t.capacity.is_finite() || t.capacity < 0.0 {
                    errs.push(format!(
                        "{at}: instance type {}: capacity must be >= 0",
                        t.instance_type
                    ));
                }
                if t.cores < 0 {
                    errs.push(format!(
                        "{at}: instance type {}: cores must be >= 0",
                        t.instance_type
                    ));
                }
            }
            for n in &p.nodes {
                if !ok_name(&n.id) {
                    errs.push(format!(
                        "{at}: node id {:?} must be 1-63 of [A-Za-z0-9._-]",
                        n.id
                    ));
                }
                if !node_ids.insert(n.id.clone()) {
                    errs.push(format!("{at}: duplicate node id {}", n.id));
                }
                if !p.zones.contains(&n.zone) {
                    errs.push(format!(
                        "{at}: node {} zone {:?} is not one of the pool's zones",
                        n.id, n.zone
                    ));
                }
                if !n.capacity.is_finite() || n.capacity < 0.0 {
                    errs.push(format!("{at}: node {}: capacity must be >= 0", n.id));
                }
                if n.cores < 0 {
                    errs.push(format!("{at}: node {}: cores must be >= 0", n.id));
                }
            }
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(errs))
        }
    }
}

/// A whole config file: the [`SimConfig`] plus the optional `jobSocket:`
/// section (kept out of [`SimConfig`] so its struct literal, used by other
/// crates, stays as it was).
#[derive(Debug, Clone, PartialEq)]
pub struct SimSetup {
    /// Everything but `jobSocket:`.
    pub sim: SimConfig,
    /// The `jobSocket:` section (defaults when absent).
    pub job_socket: crate::behaviour::JobSocketConfig,
}

impl SimSetup {
    /// Parses YAML and validates both parts, listing every problem.
    pub fn from_yaml(text: &str) -> Result<SimSetup, ConfigError> {
        let mut doc: serde_json::Value =
            serde_saphyr::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let section = doc.as_object_mut().and_then(|m| m.remove("jobSocket"));
        let Some(section) = section else {
            return Ok(SimSetup {
                sim: SimConfig::from_yaml(text)?,
                job_socket: crate::behaviour::JobSocketConfig::default(),
            });
        };
        let job_socket: crate::behaviour::JobSocketConfig = serde_json::from_value(section)
            .map_err(|e| ConfigError::Parse(format!("jobSocket: {e}")))?;
        let sim: SimConfig =
            serde_json::from_value(doc).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let mut errs = match sim.validate() {
            Ok(()) => Vec::new(),
            Err(ConfigError::Invalid(errs)) => errs,
            Err(other) => return Err(other),
        };
        errs.extend(job_socket.problems());
        if errs.is_empty() {
            Ok(SimSetup { sim, job_socket })
        } else {
            Err(ConfigError::Invalid(errs))
        }
    }

    /// Reads, parses and validates a file.
    pub fn from_file(path: &std::path::Path) -> Result<SimSetup, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        SimSetup::from_yaml(&text)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use crate::behaviour::AbortAt;

    #[test]
    fn the_job_socket_section_is_read_beside_the_sim_config() {
        let yaml = r"
jobSocket:
  answerTimeoutMs: 500
  behaviours:
    - {job: 'flaky/*', abortAt: cutover-ready}
pools:
  - {name: dc, kind: cluster, region: r, zones: [a], scaleOut: fixed, nodes: [{id: n1, zone: a, capacity: 1, cores: 1}]}
";
        let setup = SimSetup::from_yaml(yaml).expect("valid");
        assert_eq!(setup.sim.pools.len(), 1);
        assert_eq!(setup.job_socket.answer_timeout_ms, 500);
        assert_eq!(
            setup.job_socket.behaviours.first().and_then(|r| r.abort_at),
            Some(AbortAt::CutoverReady)
        );
        let plain = SimSetup::from_yaml("pools: []\n").expect("no section");
        assert_eq!(
            plain.job_socket,
            crate::behaviour::JobSocketConfig::default()
        );
    }

    #[test]
    fn the_handover_example_parses_with_its_behaviours_and_a_pool_without_sockets() {
        let setup = SimSetup::from_yaml(include_str!("../examples/handover.yaml")).expect("valid");
        assert_eq!(setup.job_socket.behaviours.len(), 5);
        assert!(setup.sim.pools.iter().any(|p| !p.job_socket));
        assert!(setup.sim.pools.iter().any(|p| p.job_socket));
    }

    #[test]
    fn job_socket_problems_are_listed_with_the_sim_config_ones() {
        let yaml = r"
jobSocket: {answerTimeoutMs: 0, behaviours: [{job: x, cutoverDelayMs: 999999999}]}
token: ''
pools: []
";
        let Err(ConfigError::Invalid(errs)) = SimSetup::from_yaml(yaml) else {
            panic!("expected Invalid");
        };
        let all = errs.join("\n");
        assert!(all.contains("token must not be empty"), "{all}");
        assert!(all.contains("answerTimeoutMs"), "{all}");
        assert!(all.contains("cutoverDelayMs"), "{all}");
        assert!(SimSetup::from_yaml("jobSocket: {bogus: 1}\npools: []\n").is_err());
        assert!(SimSetup::from_yaml("jobSocket: {}\npools: []\nnope: 1\n").is_err());
        assert!(SimSetup::from_yaml("[1, 2]").is_err());
    }

    use super::*;

    #[test]
    fn the_demo_example_parses_and_has_the_three_pools() {
        let cfg = SimConfig::from_yaml(include_str!("../examples/demo.yaml")).expect("demo.yaml");
        let kinds: Vec<_> = cfg.pools.iter().map(|p| (p.kind, p.scale_out)).collect();
        assert!(kinds.contains(&(PoolKind::Aws, ScaleOutConfig::Elastic)));
        assert!(kinds.contains(&(PoolKind::Oci, ScaleOutConfig::Elastic)));
        let cluster = cfg
            .pools
            .iter()
            .find(|p| p.kind == PoolKind::Cluster)
            .expect("cluster");
        assert!(cluster.nodes.len() >= 3);
        let zones: BTreeSet<_> = cluster.nodes.iter().map(|n| n.zone.clone()).collect();
        assert!(zones.len() >= 2);
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = SimConfig::from_yaml("pools: []\nlisten_addr: 1.2.3.4:5\n").unwrap_err();
        assert!(err.to_string().contains("listen_addr"), "{err}");
    }

    #[test]
    fn every_problem_is_listed() {
        let yaml = r"
pools:
  - name: a
    kind: cluster
    region: r
    zones: [z1]
    scaleOut: elastic
  - name: a
    kind: aws
    region: r
    zones: []
    scaleOut: elastic
    instanceTypes: [{instanceType: t, capacity: -1, cores: -2}]
";
        let Err(ConfigError::Invalid(errs)) = SimConfig::from_yaml(yaml) else {
            panic!("expected Invalid");
        };
        let all = errs.join("\n");
        for needle in [
            "must be scaleOut: fixed",
            "duplicate pool name",
            "at least one zone",
            "capacity must be >= 0",
            "cores must be >= 0",
        ] {
            assert!(all.contains(needle), "missing {needle:?} in {all}");
        }
    }

    #[test]
    fn declared_nodes_must_sit_in_a_pool_zone() {
        let yaml = r"
pools:
  - name: dc
    kind: cluster
    region: r
    zones: [a]
    scaleOut: fixed
    nodes: [{id: n1, zone: b, capacity: 1, cores: 1}]
";
        let err = SimConfig::from_yaml(yaml).unwrap_err();
        assert!(
            err.to_string().contains("not one of the pool's zones"),
            "{err}"
        );
    }
}
