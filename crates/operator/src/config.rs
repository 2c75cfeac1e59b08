//! The operator's settings file (YAML): the seed's `AutoSettings`, validated at start-up.
//!
//! Like the seed's `AutoManager.run` (which throws `AutoSettingsValidationError` with the whole
//! list), loading reports *every* problem at once, each with its path
//! (`bands.gold.maxRestartsPerHour`) and a message a person can act on; an unknown key comes with
//! a "did you mean" suggestion from the keys known at that level. The file is walked as a YAML
//! tree by hand rather than through `serde(deny_unknown_fields)`, because serde stops at the
//! first error.
//!
//! Three stages, each collecting errors: structure (types, unknown keys, duration syntax),
//! overrides from flags/environment ([`ConfigOverrides`]), then semantics on the typed value
//! ([`OperatorConfig::validate`]: ranges, URL shape, files that must exist, contradictions).
//! Overrides are validated exactly like the file.
//!
//! Durations accept whole seconds (the seed's style, `pendingWindow: 60`), decimal seconds
//! (`0.5`), or strings with units: `"500ms"`, `"60s"`, `"5m"`, `"1h"`, `"1d"`, and sums such as
//! `"1m30s"`. Relative file paths are resolved against the operator's working directory.
//! The full reference is `docs/operator-config.md`.

use std::collections::BTreeSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use automanager_api::{BandOverrides, BandPolicy, OnFailure, PriorityBand, RestartPlacement};
use serde_yaml::{Mapping, Value};

/// Largest settings file accepted.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// Longest string value accepted (paths, names); `manager.url` is held to 2048.
const MAX_STRING_LEN: usize = 4096;
const MAX_URL_LEN: usize = 2048;
/// Most namespaces `watchNamespaces` may list.
const MAX_WATCH_NAMESPACES: usize = 1000;

/// One problem in the settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Where: a dotted path (`bands.gold.maxRestartsPerHour`, `watchNamespaces[2]`), a flag
    /// (`--pending-window`), or empty for the document as a whole.
    pub path: String,
    /// What is wrong and what is allowed.
    pub message: String,
    /// A likely intended spelling (for unknown keys and enum values).
    pub suggestion: Option<String>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() {
            "<document>"
        } else {
            &self.path
        };
        write!(f, "{path}: {}", self.message)?;
        if let Some(s) = &self.suggestion {
            write!(f, "; did you mean `{s}`?")?;
        }
        Ok(())
    }
}

/// Every problem found in the settings; `Display` writes one per line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", render(.errors))]
pub struct ConfigErrors {
    /// The problems, in document order (structure first, then semantics).
    pub errors: Vec<ConfigError>,
}

fn render(errors: &[ConfigError]) -> String {
    let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
    lines.join("\n")
}

impl ConfigErrors {
    fn one(path: &str, message: impl Into<String>) -> Self {
        ConfigErrors {
            errors: vec![ConfigError {
                path: path.to_owned(),
                message: message.into(),
                suggestion: None,
            }],
        }
    }

    /// Whether some problem is reported at `path`.
    pub fn has(&self, path: &str) -> bool {
        self.errors.iter().any(|e| e.path == path)
    }
}

/// TLS towards Manager (PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// CA certificate(s) that sign Manager's certificate. Required: no system roots are built in.
    pub ca_file: PathBuf,
    /// Client certificate for mutual TLS (with `key_file`).
    pub cert_file: Option<PathBuf>,
    /// Client key for mutual TLS (with `cert_file`).
    pub key_file: Option<PathBuf>,
    /// Name to verify in Manager's certificate (default: the URL's host).
    pub domain: Option<String>,
}

/// How to reach Manager.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManagerConfig {
    /// `http://host:port` or `https://host:port`. Required.
    pub url: String,
    /// A file holding the bearer token (surrounding whitespace is trimmed).
    pub token_file: Option<PathBuf>,
    /// TLS; required with `https://`, refused with `http://`.
    pub tls: Option<TlsConfig>,
    /// Connect timeout (default 5 s).
    pub connect_timeout: Duration,
    /// Deadline of each call (default 10 s).
    pub request_timeout: Duration,
}

/// One band's failure policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BandConfig {
    /// `restart` or `drop`.
    pub on_failure: OnFailure,
    /// `preferHotSpare` or `any` (ignored with `drop`).
    pub restart_placement: RestartPlacement,
    /// More restarts of one replica than this within a sliding hour marks the bundle Broken.
    pub max_restarts_per_hour: u32,
}

/// The band defaults (a bundle's `spec.bands` overrides them per field).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BandsConfig {
    /// Default: restart, preferHotSpare, 6.
    pub gold: BandConfig,
    /// Default: restart, any, 6.
    pub silver: BandConfig,
    /// Default: drop (any, 6).
    pub bronze: BandConfig,
}

impl Default for BandsConfig {
    fn default() -> Self {
        BandsConfig {
            gold: BandConfig {
                on_failure: OnFailure::Restart,
                restart_placement: RestartPlacement::PreferHotSpare,
                max_restarts_per_hour: 6,
            },
            silver: BandConfig {
                on_failure: OnFailure::Restart,
                restart_placement: RestartPlacement::Any,
                max_restarts_per_hour: 6,
            },
            bronze: BandConfig {
                on_failure: OnFailure::Drop,
                restart_placement: RestartPlacement::Any,
                max_restarts_per_hour: 6,
            },
        }
    }
}

impl BandsConfig {
    /// The configured defaults of `band`.
    pub fn get(&self, band: PriorityBand) -> BandConfig {
        match band {
            PriorityBand::Gold => self.gold,
            PriorityBand::Silver => self.silver,
            PriorityBand::Bronze => self.bronze,
        }
    }

    /// The policy for `band` in a bundle: its `spec.bands` fields where set, the defaults
    /// otherwise. An out-of-range `maxRestartsPerHour` (the CRD schema bounds it to 1..=1000)
    /// is clamped into range.
    pub fn effective(&self, band: PriorityBand, overrides: Option<&BandOverrides>) -> BandConfig {
        let base = self.get(band);
        let policy: Option<&BandPolicy> = overrides.and_then(|o| match band {
            PriorityBand::Gold => o.gold.as_ref(),
            PriorityBand::Silver => o.silver.as_ref(),
            PriorityBand::Bronze => o.bronze.as_ref(),
        });
        let Some(p) = policy else {
            return base;
        };
        BandConfig {
            on_failure: p.on_failure.unwrap_or(base.on_failure),
            restart_placement: p.restart_placement.unwrap_or(base.restart_placement),
            max_restarts_per_hour: p
                .max_restarts_per_hour
                .map_or(base.max_restarts_per_hour, |m| {
                    m.clamp(1, 1000).unsigned_abs()
                }),
        }
    }
}

/// When a node counts as Unhealthy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeHealthConfig {
    /// Rejections within `rejection_window` that mark the node Unhealthy (default 5).
    pub rejection_threshold: u32,
    /// The sliding window for rejections (default 60 s).
    pub rejection_window: Duration,
}

/// Leader election on a `coordination.k8s.io/v1` Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderElectionConfig {
    /// Off: this replica always acts (run one replica only). Default on.
    pub enabled: bool,
    /// The Lease's name (default `automanager-operator`).
    pub lease_name: String,
    /// The Lease's namespace (default `default`).
    pub lease_namespace: String,
    /// How long a holder's claim lasts without renewal; whole seconds (default 15 s).
    pub lease_duration: Duration,
    /// How often the holder renews; whole seconds, less than `lease_duration`
    /// (default: two thirds of it).
    pub renew_every: Option<Duration>,
}

impl LeaderElectionConfig {
    /// The lease duration in whole seconds (at least 3).
    pub fn lease_duration_seconds(&self) -> u64 {
        self.lease_duration.as_secs().max(3)
    }

    /// Seconds before expiry at which the holder renews (kube-lease-manager's "grace"):
    /// `lease_duration - renew_every`, at least 2 and less than `lease_duration`.
    pub fn grace_seconds(&self) -> u64 {
        let duration = self.lease_duration_seconds();
        let renew = self
            .renew_every
            .map_or(duration * 2 / 3, |r| r.as_secs())
            .clamp(1, duration.saturating_sub(2).max(1));
        duration - renew
    }
}

/// The HTTP servers: `/healthz`, `/readyz`, `/metrics` on one address, the debugging API
/// (`/debug/trace`, `/v1/what-if`) on another, off unless set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HttpConfig {
    /// Listen address (default `127.0.0.1:8080`: loopback only; set `0.0.0.0:8080` in a Pod so
    /// probes and Prometheus can reach it).
    pub bind_address: SocketAddr,
    /// Listen address of the debugging API (default none: not served). Must differ from
    /// `bind_address`, so exposing probes and metrics never exposes the debugging API.
    pub debug_bind_address: Option<SocketAddr>,
}

/// Parallelism of the controllers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConcurrencyConfig {
    /// Bundles reconciled at once (default 8).
    pub bundles: u16,
}

/// Node drains and migrations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MigrationConfig {
    /// Jobs moved off a draining node at once (default 2).
    pub drain_parallelism: u16,
    /// Longest a migration phase may take before it is aborted (default 60 s).
    pub phase_timeout: Duration,
}

/// The operator's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatorConfig {
    /// How to reach Manager.
    pub manager: ManagerConfig,
    /// How long a started node may stay pending before it counts as failed (default 60 s).
    pub pending_window: Duration,
    /// How long a stopped node is kept before its ManagerNode is removed (default 3600 s).
    pub remove_stopped_nodes_after: Duration,
    /// Band failure policies.
    pub bands: BandsConfig,
    /// Node rejection-rate health.
    pub node_health: NodeHealthConfig,
    /// Namespaces whose Bundles are reconciled; empty = all.
    pub watch_namespaces: Vec<String>,
    /// Leader election.
    pub leader_election: LeaderElectionConfig,
    /// The HTTP server.
    pub http: HttpConfig,
    /// Controller parallelism.
    pub concurrency: ConcurrencyConfig,
    /// Status writes of one object within this window are coalesced into one (default 250 ms).
    pub status_write_interval: Duration,
    /// Drains and migrations.
    pub migration: MigrationConfig,
}

impl Default for OperatorConfig {
    /// Every default; `manager.url` is empty, which validation reports as missing.
    fn default() -> Self {
        OperatorConfig {
            manager: ManagerConfig {
                url: String::new(),
                token_file: None,
                tls: None,
                connect_timeout: Duration::from_secs(5),
                request_timeout: Duration::from_secs(10),
            },
            pending_window: Duration::from_secs(60),
            remove_stopped_nodes_after: Duration::from_secs(3600),
            bands: BandsConfig::default(),
            node_health: NodeHealthConfig {
                rejection_threshold: 5,
                rejection_window: Duration::from_secs(60),
            },
            watch_namespaces: Vec::new(),
            leader_election: LeaderElectionConfig {
                enabled: true,
                lease_name: "automanager-operator".to_owned(),
                lease_namespace: "default".to_owned(),
                lease_duration: Duration::from_secs(15),
                renew_every: None,
            },
            http: HttpConfig {
                bind_address: SocketAddr::from(([127, 0, 0, 1], 8080)),
                debug_bind_address: None,
            },
            concurrency: ConcurrencyConfig { bundles: 8 },
            status_write_interval: Duration::from_millis(250),
            migration: MigrationConfig {
                drain_parallelism: 2,
                phase_timeout: Duration::from_secs(60),
            },
        }
    }
}

/// Settings given on the command line or in the environment; they win over the file.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigOverrides {
    /// Manager's address, `http(s)://host:port` (overrides `manager.url`).
    #[arg(
        long = "manager-url",
        env = "AUTOMANAGER_MANAGER_URL",
        value_name = "URL"
    )]
    pub manager_url: Option<String>,
    /// File holding Manager's bearer token (overrides `manager.tokenFile`).
    #[arg(
        long = "manager-token-file",
        env = "AUTOMANAGER_MANAGER_TOKEN_FILE",
        value_name = "PATH"
    )]
    pub manager_token_file: Option<PathBuf>,
    /// Listen address of /healthz, /readyz, /metrics (overrides `http.bindAddress`).
    #[arg(
        long = "http-bind-address",
        env = "AUTOMANAGER_HTTP_BIND_ADDRESS",
        value_name = "ADDR"
    )]
    pub http_bind_address: Option<String>,
    /// Listen address of /debug/trace and /v1/what-if (overrides `http.debugBindAddress`).
    #[arg(
        long = "http-debug-bind-address",
        env = "AUTOMANAGER_HTTP_DEBUG_BIND_ADDRESS",
        value_name = "ADDR"
    )]
    pub http_debug_bind_address: Option<String>,
    /// `true` or `false` (overrides `leaderElection.enabled`).
    #[arg(
        long = "leader-election",
        env = "AUTOMANAGER_LEADER_ELECTION",
        value_name = "BOOL"
    )]
    pub leader_election: Option<bool>,
    /// Namespace of the leader-election Lease, e.g. the Pod's own (overrides
    /// `leaderElection.leaseNamespace`).
    #[arg(
        long = "lease-namespace",
        env = "AUTOMANAGER_LEASE_NAMESPACE",
        value_name = "NAMESPACE"
    )]
    pub lease_namespace: Option<String>,
    /// A namespace to watch; repeat, or comma-separate in the environment (replaces
    /// `watchNamespaces`).
    #[arg(
        long = "watch-namespace",
        env = "AUTOMANAGER_WATCH_NAMESPACES",
        value_name = "NAMESPACE",
        value_delimiter = ','
    )]
    pub watch_namespaces: Vec<String>,
    /// How long a started node may stay pending, e.g. `60` or `90s` (overrides `pendingWindow`).
    #[arg(
        long = "pending-window",
        env = "AUTOMANAGER_PENDING_WINDOW",
        value_name = "DURATION"
    )]
    pub pending_window: Option<String>,
}

impl OperatorConfig {
    /// Parses and validates a settings document.
    pub fn from_yaml_str(yaml: &str) -> Result<OperatorConfig, ConfigErrors> {
        Self::load_str(yaml, &ConfigOverrides::default())
    }

    /// Reads, parses and validates a settings file.
    pub fn from_file(path: &Path) -> Result<OperatorConfig, ConfigErrors> {
        Self::load(Some(path), &ConfigOverrides::default())
    }

    /// What `main` calls: the file (if any) with `overrides` applied on top, validated as a
    /// whole. Without a file every key takes its default, so the flags must at least give
    /// `--manager-url`.
    pub fn load(
        path: Option<&Path>,
        overrides: &ConfigOverrides,
    ) -> Result<OperatorConfig, ConfigErrors> {
        let Some(path) = path else {
            return Self::load_str("", overrides);
        };
        let text = read_limited(path)?;
        Self::load_str(&text, overrides)
    }

    /// [`OperatorConfig::load`] with the document given as a string.
    pub fn load_str(
        yaml: &str,
        overrides: &ConfigOverrides,
    ) -> Result<OperatorConfig, ConfigErrors> {
        if yaml.len() > MAX_CONFIG_BYTES {
            return Err(ConfigErrors::one(
                "",
                format!("the settings are larger than {MAX_CONFIG_BYTES} bytes"),
            ));
        }
        let value: Value = if yaml.trim().is_empty() {
            Value::Null
        } else {
            serde_yaml::from_str(yaml).map_err(|e| ConfigErrors::one("", yaml_error_message(&e)))?
        };
        let mut walker = Walker::default();
        let mut config = walker.root(&value);
        let mut errors = walker.errors;
        let sources = config.apply(overrides, &mut errors);
        errors.extend(config.validate_with_sources(&sources));
        if errors.is_empty() {
            Ok(config)
        } else {
            Err(ConfigErrors { errors })
        }
    }

    /// Applies flag/environment overrides, then validates the result as a whole.
    pub fn apply_overrides(&mut self, overrides: &ConfigOverrides) -> Result<(), ConfigErrors> {
        let mut errors = Vec::new();
        let sources = self.apply(overrides, &mut errors);
        errors.extend(self.validate_with_sources(&sources));
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigErrors { errors })
        }
    }

    /// Every semantic problem (ranges, URL shape, files, contradictions); empty when valid.
    pub fn validate(&self) -> Vec<ConfigError> {
        self.validate_with_sources(&[])
    }

    /// Applies what is set; returns (config path, flag) pairs so later errors can name the flag.
    fn apply(
        &mut self,
        o: &ConfigOverrides,
        errors: &mut Vec<ConfigError>,
    ) -> Vec<(&'static str, &'static str)> {
        let mut sources = Vec::new();
        if let Some(url) = &o.manager_url {
            self.manager.url = url.clone();
            sources.push(("manager.url", "--manager-url / AUTOMANAGER_MANAGER_URL"));
        }
        if let Some(token) = &o.manager_token_file {
            self.manager.token_file = Some(token.clone());
            sources.push((
                "manager.tokenFile",
                "--manager-token-file / AUTOMANAGER_MANAGER_TOKEN_FILE",
            ));
        }
        if let Some(addr) = &o.http_bind_address {
            match parse_socket_addr(addr) {
                Ok(a) => self.http.bind_address = a,
                Err(m) => errors.push(err("--http-bind-address", m)),
            }
        }
        if let Some(addr) = &o.http_debug_bind_address {
            match parse_socket_addr(addr) {
                Ok(a) => {
                    self.http.debug_bind_address = Some(a);
                    sources.push((
                        "http.debugBindAddress",
                        "--http-debug-bind-address / AUTOMANAGER_HTTP_DEBUG_BIND_ADDRESS",
                    ));
                }
                Err(m) => errors.push(err("--http-debug-bind-address", m)),
            }
        }
        if let Some(enabled) = o.leader_election {
            self.leader_election.enabled = enabled;
        }
        if let Some(ns) = &o.lease_namespace {
            self.leader_election.lease_namespace = ns.clone();
            sources.push((
                "leaderElection.leaseNamespace",
                "--lease-namespace / AUTOMANAGER_LEASE_NAMESPACE",
            ));
        }
        if !o.watch_namespaces.is_empty() {
            self.watch_namespaces = o
                .watch_namespaces
                .iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
            sources.push((
                "watchNamespaces",
                "--watch-namespace / AUTOMANAGER_WATCH_NAMESPACES",
            ));
        }
        if let Some(w) = &o.pending_window {
            match parse_duration_str(w) {
                Ok(d) => {
                    self.pending_window = d;
                    sources.push((
                        "pendingWindow",
                        "--pending-window / AUTOMANAGER_PENDING_WINDOW",
                    ));
                }
                Err(m) => errors.push(err("--pending-window", m)),
            }
        }
        sources
    }

    fn validate_with_sources(&self, sources: &[(&'static str, &'static str)]) -> Vec<ConfigError> {
        let mut errors = Vec::new();
        self.validate_manager(&mut errors);

        check_duration(
            &mut errors,
            "pendingWindow",
            self.pending_window,
            Duration::from_secs(1),
            Duration::from_secs(86_400),
        );
        check_duration(
            &mut errors,
            "removeStoppedNodesAfter",
            self.remove_stopped_nodes_after,
            Duration::from_secs(1),
            Duration::from_secs(30 * 86_400),
        );
        for (name, band) in [
            ("gold", &self.bands.gold),
            ("silver", &self.bands.silver),
            ("bronze", &self.bands.bronze),
        ] {
            check_range(
                &mut errors,
                &format!("bands.{name}.maxRestartsPerHour"),
                u64::from(band.max_restarts_per_hour),
                1,
                1000,
            );
        }
        check_range(
            &mut errors,
            "nodeHealth.rejectionThreshold",
            u64::from(self.node_health.rejection_threshold),
            1,
            10_000,
        );
        check_duration(
            &mut errors,
            "nodeHealth.rejectionWindow",
            self.node_health.rejection_window,
            Duration::from_secs(1),
            Duration::from_secs(86_400),
        );

        if self.watch_namespaces.len() > MAX_WATCH_NAMESPACES {
            errors.push(err(
                "watchNamespaces",
                format!("lists more than {MAX_WATCH_NAMESPACES} namespaces"),
            ));
        } else {
            let mut seen = BTreeSet::new();
            for (i, ns) in self.watch_namespaces.iter().enumerate() {
                let path = format!("watchNamespaces[{i}]");
                if let Err(m) = check_dns_label(ns) {
                    errors.push(err(&path, m));
                } else if !seen.insert(ns.as_str()) {
                    errors.push(err(&path, format!("`{ns}` is listed twice")));
                }
            }
        }

        let le = &self.leader_election;
        if let Err(m) = check_dns_subdomain(&le.lease_name) {
            errors.push(err("leaderElection.leaseName", m));
        }
        if let Err(m) = check_dns_label(&le.lease_namespace) {
            errors.push(err("leaderElection.leaseNamespace", m));
        }
        let duration_ok = check_whole_seconds(
            &mut errors,
            "leaderElection.leaseDuration",
            le.lease_duration,
            3,
            600,
        );
        if let Some(renew) = le.renew_every
            && check_whole_seconds(&mut errors, "leaderElection.renewEvery", renew, 1, 598)
            && duration_ok
            && renew.as_secs() + 2 > le.lease_duration.as_secs()
        {
            errors.push(err(
                "leaderElection.renewEvery",
                format!(
                    "must be at least 2s shorter than leaderElection.leaseDuration ({}s), so the holder renews before the lease lapses",
                    le.lease_duration.as_secs()
                ),
            ));
        }

        if let Some(debug) = self.http.debug_bind_address
            && same_listener(debug, self.http.bind_address)
        {
            errors.push(err(
                "http.debugBindAddress",
                format!(
                    "must use another port than http.bindAddress ({}): the debugging API has a port of its own, so exposing probes and metrics never exposes it",
                    self.http.bind_address
                ),
            ));
        }

        check_range(
            &mut errors,
            "concurrency.bundles",
            u64::from(self.concurrency.bundles),
            1,
            1024,
        );
        check_duration(
            &mut errors,
            "statusWriteInterval",
            self.status_write_interval,
            Duration::from_millis(1),
            Duration::from_secs(60),
        );
        check_range(
            &mut errors,
            "migration.drainParallelism",
            u64::from(self.migration.drain_parallelism),
            1,
            64,
        );
        check_duration(
            &mut errors,
            "migration.phaseTimeout",
            self.migration.phase_timeout,
            Duration::from_secs(1),
            Duration::from_secs(3600),
        );

        for e in &mut errors {
            if let Some((_, flag)) = sources
                .iter()
                .find(|(p, _)| e.path == *p || e.path.starts_with(&format!("{p}[")))
            {
                e.message.push_str(&format!(" (set by {flag})"));
            }
        }
        errors
    }

    fn validate_manager(&self, errors: &mut Vec<ConfigError>) {
        let m = &self.manager;
        let https = if m.url.is_empty() {
            errors.push(err(
                "manager.url",
                "is required: Manager's gRPC address, e.g. http://127.0.0.1:6789",
            ));
            None
        } else {
            match parse_manager_url(&m.url) {
                Ok(u) => Some(u.https),
                Err((message, suggestion)) => {
                    errors.push(ConfigError {
                        path: "manager.url".to_owned(),
                        message,
                        suggestion,
                    });
                    None
                }
            }
        };
        if let Some(token) = &m.token_file {
            check_file(errors, "manager.tokenFile", token);
        }
        match (&m.tls, https) {
            (Some(_), Some(false)) => errors.push(err(
                "manager.tls",
                "is set but manager.url uses http://; use https:// to connect with TLS",
            )),
            (None, Some(true)) => errors.push(err(
                "manager.tls.caFile",
                "is required with an https:// URL: the client trusts only this CA (no system roots are built in)",
            )),
            _ => {}
        }
        if let Some(tls) = &m.tls {
            check_file(errors, "manager.tls.caFile", &tls.ca_file);
            match (&tls.cert_file, &tls.key_file) {
                (Some(c), Some(k)) => {
                    check_file(errors, "manager.tls.certFile", c);
                    check_file(errors, "manager.tls.keyFile", k);
                }
                (Some(_), None) => errors.push(err(
                    "manager.tls.keyFile",
                    "is required with manager.tls.certFile (mutual TLS needs both)",
                )),
                (None, Some(_)) => errors.push(err(
                    "manager.tls.certFile",
                    "is required with manager.tls.keyFile (mutual TLS needs both)",
                )),
                (None, None) => {}
            }
            if let Some(d) = &tls.domain
                && let Err(m) = check_dns_subdomain(d)
            {
                errors.push(err("manager.tls.domain", m));
            }
        }
        check_duration(
            errors,
            "manager.connectTimeout",
            m.connect_timeout,
            Duration::from_millis(100),
            Duration::from_secs(300),
        );
        check_duration(
            errors,
            "manager.requestTimeout",
            m.request_timeout,
            Duration::from_millis(100),
            Duration::from_secs(600),
        );
    }
}

/// Why the Manager client settings could not be built from a valid config.
#[derive(Debug, thiserror::Error)]
pub enum ManagerConfigError {
    /// A token or TLS file could not be read.
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The token file is empty (after trimming whitespace).
    #[error("the token file {0} is empty")]
    EmptyToken(PathBuf),
}

impl ManagerConfig {
    /// The `manager-client` settings: reads the token and PEM files now.
    pub fn client_config(&self) -> Result<manager_client::ClientConfig, ManagerConfigError> {
        let read = |what: &'static str, path: &Path| {
            std::fs::read(path).map_err(|source| ManagerConfigError::Read {
                what,
                path: path.to_owned(),
                source,
            })
        };
        let mut config = manager_client::ClientConfig::new(self.url.trim_end_matches('/'));
        config.connect_timeout = self.connect_timeout;
        config.request_timeout = self.request_timeout;
        if let Some(path) = &self.token_file {
            let token = String::from_utf8_lossy(&read("token file", path)?)
                .trim()
                .to_owned();
            if token.is_empty() {
                return Err(ManagerConfigError::EmptyToken(path.clone()));
            }
            config = config.with_token(token);
        }
        if let Some(tls) = &self.tls {
            let identity = match (&tls.cert_file, &tls.key_file) {
                (Some(c), Some(k)) => {
                    Some((read("client certificate", c)?, read("client key", k)?))
                }
                _ => None,
            };
            config = config.with_tls(manager_client::TlsOptions {
                ca_pem: read("CA file", &tls.ca_file)?,
                domain: tls.domain.clone(),
                identity,
            });
        }
        Ok(config)
    }
}

fn err(path: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.to_owned(),
        message: message.into(),
        suggestion: None,
    }
}

fn read_limited(path: &Path) -> Result<String, ConfigErrors> {
    use std::io::Read;
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| {
        ConfigErrors::one("", format!("cannot read the settings file {shown}: {e}"))
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_CONFIG_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| {
            ConfigErrors::one("", format!("cannot read the settings file {shown}: {e}"))
        })?;
    if bytes.len() > MAX_CONFIG_BYTES {
        return Err(ConfigErrors::one(
            "",
            format!("the settings file {shown} is larger than {MAX_CONFIG_BYTES} bytes"),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|_| ConfigErrors::one("", format!("the settings file {shown} is not UTF-8 text")))
}

fn yaml_error_message(e: &serde_yaml::Error) -> String {
    match e.location() {
        Some(l) => format!(
            "malformed YAML at line {}, column {}: {e}",
            l.line(),
            l.column()
        ),
        None => format!("malformed YAML: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Structure: the YAML tree walked by hand so that every problem is collected.

const ROOT_KEYS: &[&str] = &[
    "manager",
    "pendingWindow",
    "removeStoppedNodesAfter",
    "bands",
    "nodeHealth",
    "watchNamespaces",
    "leaderElection",
    "http",
    "concurrency",
    "statusWriteInterval",
    "migration",
];
const MANAGER_KEYS: &[&str] = &[
    "url",
    "tokenFile",
    "tls",
    "connectTimeout",
    "requestTimeout",
];
const TLS_KEYS: &[&str] = &["caFile", "certFile", "keyFile", "domain"];
const BANDS_KEYS: &[&str] = &["gold", "silver", "bronze"];
const BAND_KEYS: &[&str] = &["onFailure", "restartPlacement", "maxRestartsPerHour"];
const NODE_HEALTH_KEYS: &[&str] = &["rejectionThreshold", "rejectionWindow"];
const LEADER_KEYS: &[&str] = &[
    "enabled",
    "leaseName",
    "leaseNamespace",
    "leaseDuration",
    "renewEvery",
];
const HTTP_KEYS: &[&str] = &["bindAddress", "debugBindAddress"];
const CONCURRENCY_KEYS: &[&str] = &["bundles"];
const MIGRATION_KEYS: &[&str] = &["drainParallelism", "phaseTimeout"];

#[derive(Default)]
struct Walker {
    errors: Vec<ConfigError>,
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

impl Walker {
    fn push(&mut self, path: &str, message: impl Into<String>) {
        self.errors.push(err(path, message));
    }

    /// The mapping at `path` (absent or null = empty), reporting non-string and unknown keys.
    fn mapping<'a>(
        &mut self,
        v: Option<&'a Value>,
        path: &str,
        known: &[&str],
    ) -> Option<&'a Mapping> {
        let v = v?;
        let map = match v {
            Value::Null => return None,
            Value::Mapping(m) => m,
            other => {
                self.push(
                    path,
                    format!("must be a mapping of keys to values, not {}", kind(other)),
                );
                return None;
            }
        };
        for key in map.keys() {
            match key.as_str() {
                Some(k) if known.contains(&k) => {}
                Some(k) => {
                    let shown: String = k.chars().take(64).collect();
                    self.errors.push(ConfigError {
                        path: join(path, &shown),
                        message: format!("unknown key (known here: {})", known.join(", ")),
                        suggestion: suggest(k, known).map(str::to_owned),
                    });
                }
                None => self.push(path, format!("keys must be strings, found {}", kind(key))),
            }
        }
        Some(map)
    }

    fn field<'a>(map: Option<&'a Mapping>, key: &str) -> Option<&'a Value> {
        match map?.get(key)? {
            Value::Null => None,
            v => Some(v),
        }
    }

    fn string(
        &mut self,
        map: Option<&Mapping>,
        key: &str,
        parent: &str,
        max: usize,
    ) -> Option<String> {
        let path = join(parent, key);
        let v = Self::field(map, key)?;
        match v {
            Value::String(s) if s.len() > max => {
                self.push(
                    &path,
                    format!("is too long ({} bytes; at most {max})", s.len()),
                );
                None
            }
            Value::String(s) => Some(s.clone()),
            other => {
                self.push(&path, format!("must be a string, not {}", kind(other)));
                None
            }
        }
    }

    fn path_value(&mut self, map: Option<&Mapping>, key: &str, parent: &str) -> Option<PathBuf> {
        let s = self.string(map, key, parent, MAX_STRING_LEN)?;
        if s.trim().is_empty() {
            self.push(&join(parent, key), "must not be empty");
            return None;
        }
        Some(PathBuf::from(s))
    }

    fn boolean(&mut self, map: Option<&Mapping>, key: &str, parent: &str, default: bool) -> bool {
        match Self::field(map, key) {
            None => default,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                self.push(
                    &join(parent, key),
                    format!("must be true or false, not {}", kind(other)),
                );
                default
            }
        }
    }

    /// A whole number that fits `T`; range checks come later, in `validate`.
    fn number<T: TryFrom<u64> + Copy>(
        &mut self,
        map: Option<&Mapping>,
        key: &str,
        parent: &str,
        default: T,
    ) -> T {
        let path = join(parent, key);
        let Some(v) = Self::field(map, key) else {
            return default;
        };
        let Value::Number(n) = v else {
            self.push(&path, format!("must be a whole number, not {}", kind(v)));
            return default;
        };
        if let Some(u) = n.as_u64() {
            if let Ok(t) = T::try_from(u) {
                return t;
            }
            self.push(&path, format!("{u} is too large"));
        } else if n.as_i64().is_some() {
            self.push(&path, "must not be negative");
        } else {
            self.push(&path, format!("must be a whole number, not {n}"));
        }
        default
    }

    fn duration(
        &mut self,
        map: Option<&Mapping>,
        key: &str,
        parent: &str,
        default: Duration,
    ) -> Duration {
        let path = join(parent, key);
        let Some(v) = Self::field(map, key) else {
            return default;
        };
        match parse_duration_value(v) {
            Ok(d) => d,
            Err(m) => {
                self.push(&path, m);
                default
            }
        }
    }

    fn enum_value<T: serde::de::DeserializeOwned>(
        &mut self,
        map: Option<&Mapping>,
        key: &str,
        parent: &str,
        allowed: &[&str],
        default: T,
    ) -> T {
        let path = join(parent, key);
        let Some(v) = Self::field(map, key) else {
            return default;
        };
        let candidate = match v {
            Value::String(s) if allowed.contains(&s.as_str()) => {
                serde_yaml::from_value::<T>(v.clone()).ok()
            }
            _ => None,
        };
        if let Some(t) = candidate {
            return t;
        }
        let suggestion = v
            .as_str()
            .and_then(|s| suggest(s, allowed))
            .map(str::to_owned);
        let shown = match v {
            Value::String(s) => format!("`{}`", s.chars().take(64).collect::<String>()),
            other => kind(other).to_owned(),
        };
        self.errors.push(ConfigError {
            path,
            message: format!("must be one of {}, not {shown}", allowed.join(", ")),
            suggestion,
        });
        default
    }

    fn root(&mut self, v: &Value) -> OperatorConfig {
        let mut c = OperatorConfig::default();
        let root = if v.is_null() {
            None
        } else {
            self.mapping(Some(v), "", ROOT_KEYS)
        };

        let m = self.mapping(Self::field(root, "manager"), "manager", MANAGER_KEYS);
        c.manager.url = self
            .string(m, "url", "manager", MAX_URL_LEN)
            .unwrap_or_default();
        c.manager.token_file = self.path_value(m, "tokenFile", "manager");
        if let Some(tv) = Self::field(m, "tls") {
            let t = self.mapping(Some(tv), "manager.tls", TLS_KEYS);
            let ca = self.path_value(t, "caFile", "manager.tls");
            let cert_file = self.path_value(t, "certFile", "manager.tls");
            let key_file = self.path_value(t, "keyFile", "manager.tls");
            let domain = self.string(t, "domain", "manager.tls", 253);
            match ca {
                Some(ca_file) => {
                    c.manager.tls = Some(TlsConfig {
                        ca_file,
                        cert_file,
                        key_file,
                        domain,
                    });
                }
                None if t.is_some() => self.push(
                    "manager.tls.caFile",
                    "is required: the CA that signs Manager's certificate",
                ),
                None => {}
            }
        }
        c.manager.connect_timeout =
            self.duration(m, "connectTimeout", "manager", c.manager.connect_timeout);
        c.manager.request_timeout =
            self.duration(m, "requestTimeout", "manager", c.manager.request_timeout);

        c.pending_window = self.duration(root, "pendingWindow", "", c.pending_window);
        c.remove_stopped_nodes_after = self.duration(
            root,
            "removeStoppedNodesAfter",
            "",
            c.remove_stopped_nodes_after,
        );

        let bands = self.mapping(Self::field(root, "bands"), "bands", BANDS_KEYS);
        for (name, band) in [
            ("gold", &mut c.bands.gold),
            ("silver", &mut c.bands.silver),
            ("bronze", &mut c.bands.bronze),
        ] {
            let path = join("bands", name);
            let b = self.mapping(Self::field(bands, name), &path, BAND_KEYS);
            band.on_failure =
                self.enum_value(b, "onFailure", &path, &["restart", "drop"], band.on_failure);
            band.restart_placement = self.enum_value(
                b,
                "restartPlacement",
                &path,
                &["preferHotSpare", "any"],
                band.restart_placement,
            );
            band.max_restarts_per_hour =
                self.number(b, "maxRestartsPerHour", &path, band.max_restarts_per_hour);
        }

        let nh = self.mapping(
            Self::field(root, "nodeHealth"),
            "nodeHealth",
            NODE_HEALTH_KEYS,
        );
        c.node_health.rejection_threshold = self.number(
            nh,
            "rejectionThreshold",
            "nodeHealth",
            c.node_health.rejection_threshold,
        );
        c.node_health.rejection_window = self.duration(
            nh,
            "rejectionWindow",
            "nodeHealth",
            c.node_health.rejection_window,
        );

        match Self::field(root, "watchNamespaces") {
            None => {}
            Some(Value::Sequence(items)) => {
                for (i, item) in items.iter().enumerate() {
                    match item {
                        Value::String(s) if s.len() <= MAX_STRING_LEN => {
                            c.watch_namespaces.push(s.clone())
                        }
                        Value::String(s) => self.push(
                            &format!("watchNamespaces[{i}]"),
                            format!("is too long ({} bytes)", s.len()),
                        ),
                        other => self.push(
                            &format!("watchNamespaces[{i}]"),
                            format!("must be a namespace name, not {}", kind(other)),
                        ),
                    }
                }
            }
            Some(other) => self.push(
                "watchNamespaces",
                format!(
                    "must be a list of namespace names (empty = all), not {}",
                    kind(other)
                ),
            ),
        }

        let le = self.mapping(
            Self::field(root, "leaderElection"),
            "leaderElection",
            LEADER_KEYS,
        );
        let d = &mut c.leader_election;
        d.enabled = self.boolean(le, "enabled", "leaderElection", d.enabled);
        if let Some(s) = self.string(le, "leaseName", "leaderElection", 253) {
            d.lease_name = s;
        }
        if let Some(s) = self.string(le, "leaseNamespace", "leaderElection", 63) {
            d.lease_namespace = s;
        }
        d.lease_duration = self.duration(le, "leaseDuration", "leaderElection", d.lease_duration);
        if Self::field(le, "renewEvery").is_some() {
            d.renew_every = Some(self.duration(le, "renewEvery", "leaderElection", Duration::ZERO));
        }

        let h = self.mapping(Self::field(root, "http"), "http", HTTP_KEYS);
        if let Some(s) = self.string(h, "bindAddress", "http", 256) {
            match parse_socket_addr(&s) {
                Ok(a) => c.http.bind_address = a,
                Err(m) => self.push("http.bindAddress", m),
            }
        }
        if let Some(s) = self.string(h, "debugBindAddress", "http", 256) {
            match parse_socket_addr(&s) {
                Ok(a) => c.http.debug_bind_address = Some(a),
                Err(m) => self.push("http.debugBindAddress", m),
            }
        }

        let cc = self.mapping(
            Self::field(root, "concurrency"),
            "concurrency",
            CONCURRENCY_KEYS,
        );
        c.concurrency.bundles = self.number(cc, "bundles", "concurrency", c.concurrency.bundles);

        c.status_write_interval =
            self.duration(root, "statusWriteInterval", "", c.status_write_interval);

        let mg = self.mapping(Self::field(root, "migration"), "migration", MIGRATION_KEYS);
        c.migration.drain_parallelism = self.number(
            mg,
            "drainParallelism",
            "migration",
            c.migration.drain_parallelism,
        );
        c.migration.phase_timeout =
            self.duration(mg, "phaseTimeout", "migration", c.migration.phase_timeout);
        c
    }
}

// ---------------------------------------------------------------------------------------------
// Values.

/// Largest duration accepted by the parser (ranges per key are checked later): 10 years.
const MAX_PARSED_MS: u64 = 10 * 365 * 86_400_000;

fn parse_duration_value(v: &Value) -> Result<Duration, String> {
    match v {
        Value::Number(n) => {
            if let Some(u) = n.as_u64() {
                u.checked_mul(1000)
                    .filter(|ms| *ms <= MAX_PARSED_MS)
                    .map(Duration::from_millis)
                    .ok_or_else(|| format!("{u} seconds is too long"))
            } else if n.as_i64().is_some() {
                Err("must not be negative".to_owned())
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                if !f.is_finite() {
                    Err(format!("must be a duration, not {n}"))
                } else if f < 0.0 {
                    Err("must not be negative".to_owned())
                } else if f * 1000.0 > MAX_PARSED_MS as f64 {
                    Err(format!("{n} seconds is too long"))
                } else {
                    Ok(Duration::from_millis((f * 1000.0).round() as u64))
                }
            }
        }
        Value::String(s) => parse_duration_str(s),
        other => Err(format!(
            "must be a duration (seconds, or a string like \"500ms\", \"60s\", \"5m\", \"1h\"), not {}",
            kind(other)
        )),
    }
}

/// `"60"`, `"500ms"`, `"60s"`, `"5m"`, `"1h"`, `"1d"`, or sums like `"1h30m"`.
pub fn parse_duration_str(s: &str) -> Result<Duration, String> {
    const HELP: &str =
        "must be a duration: seconds (60) or a number with a unit (500ms, 60s, 5m, 1h, 1d)";
    let t = s.trim();
    if t.is_empty() {
        return Err(format!("{HELP}, not an empty string"));
    }
    let shown: String = t.chars().take(32).collect();
    if t.starts_with('-') {
        return Err("must not be negative".to_owned());
    }
    if t.bytes().all(|b| b.is_ascii_digit()) {
        return t
            .parse::<u64>()
            .ok()
            .and_then(|n| n.checked_mul(1000))
            .filter(|ms| *ms <= MAX_PARSED_MS)
            .map(Duration::from_millis)
            .ok_or_else(|| format!("`{shown}` seconds is too long"));
    }
    let bytes = t.as_bytes();
    let mut i = 0;
    let mut total: u64 = 0;
    while i < bytes.len() {
        let start = i;
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(format!("{HELP}, not `{shown}`"));
        }
        let number: u64 = t[start..i]
            .parse()
            .map_err(|_| format!("`{shown}` is too long"))?;
        let unit_start = i;
        while i < bytes.len() && bytes[i].is_ascii_alphabetic() {
            i += 1;
        }
        let factor: u64 = match &t[unit_start..i] {
            "ms" => 1,
            "s" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(format!("{HELP}, not `{shown}`")),
        };
        total = number
            .checked_mul(factor)
            .and_then(|ms| total.checked_add(ms))
            .filter(|ms| *ms <= MAX_PARSED_MS)
            .ok_or_else(|| format!("`{shown}` is too long"))?;
    }
    Ok(Duration::from_millis(total))
}

fn parse_socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.trim().parse::<SocketAddr>().map_err(|_| {
        let shown: String = s.chars().take(64).collect();
        format!("must be an IP address and port, e.g. 127.0.0.1:8080 or [::]:8080, not `{shown}`")
    })
}

/// Whether two listen addresses would collide: the same port on the same address, or on any
/// address when either is unspecified (`0.0.0.0`, `[::]`).
fn same_listener(a: SocketAddr, b: SocketAddr) -> bool {
    // Port 0 asks for any free port, so it never collides.
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// A Manager URL taken apart.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ManagerUrl {
    https: bool,
    host: String,
    port: u16,
}

/// `http(s)://host:port` with an optional trailing `/`; host a DNS name, IPv4 or `[IPv6]`.
fn parse_manager_url(url: &str) -> Result<ManagerUrl, (String, Option<String>)> {
    let plain = |m: &str| (m.to_owned(), None);
    let (https, rest) = if let Some(r) = url.strip_prefix("https://") {
        (true, r)
    } else if let Some(r) = url.strip_prefix("http://") {
        (false, r)
    } else if url.contains("://") {
        return Err(plain("must use http:// or https://"));
    } else {
        return Err((
            "must start with http:// or https:// (Manager's gRPC address, e.g. http://127.0.0.1:6789)".to_owned(),
            Some(format!("http://{}", url.chars().take(200).collect::<String>())),
        ));
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') || rest.contains('?') || rest.contains('#') {
        return Err(plain(
            "must be just scheme, host and port (no path, query or fragment)",
        ));
    }
    if rest.contains('@') {
        return Err(plain("must not contain credentials; use manager.tokenFile"));
    }
    let (host, port) = if let Some(r) = rest.strip_prefix('[') {
        let Some((h, after)) = r.split_once(']') else {
            return Err(plain("has an unclosed `[` in the IPv6 host"));
        };
        if h.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(plain("has an invalid IPv6 address in `[...]`"));
        }
        (format!("[{h}]"), after.strip_prefix(':'))
    } else {
        match rest.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (rest.to_owned(), None),
        }
    };
    let Some(port) = port else {
        return Err(plain("must name a port, e.g. http://127.0.0.1:6789"));
    };
    let port: u16 = match port.parse() {
        Ok(p) if p > 0 => p,
        _ => return Err(plain("has an invalid port (1 to 65535)")),
    };
    if !host.starts_with('[')
        && host.parse::<std::net::Ipv4Addr>().is_err()
        && check_dns_subdomain(&host.to_ascii_lowercase()).is_err()
    {
        return Err(plain("has an invalid host name"));
    }
    Ok(ManagerUrl { https, host, port })
}

/// RFC 1123 label: 1 to 63 lowercase letters, digits or '-', not starting or ending with '-'.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn check_dns_label(s: &str) -> Result<(), String> {
    if is_dns_label(s) {
        return Ok(());
    }
    let shown: String = s.chars().take(64).collect();
    Err(format!(
        "`{shown}` is not a valid name: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit"
    ))
}

/// RFC 1123 subdomain: labels joined by '.', at most 253 characters.
fn check_dns_subdomain(s: &str) -> Result<(), String> {
    if s.len() <= 253 && s.split('.').all(is_dns_label) {
        return Ok(());
    }
    let shown: String = s.chars().take(64).collect();
    Err(format!(
        "`{shown}` is not a valid name: lowercase letters, digits, '-' and '.', at most 253 characters"
    ))
}

fn check_file(errors: &mut Vec<ConfigError>, path: &str, file: &Path) {
    match std::fs::metadata(file) {
        Ok(m) if m.is_file() => {}
        Ok(_) => errors.push(err(
            path,
            format!("{} is not a regular file", file.display()),
        )),
        Err(e) => errors.push(err(path, format!("cannot read {}: {e}", file.display()))),
    }
}

fn show(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

fn check_duration(
    errors: &mut Vec<ConfigError>,
    path: &str,
    d: Duration,
    min: Duration,
    max: Duration,
) {
    if d < min || d > max {
        errors.push(err(
            path,
            format!(
                "must be between {} and {} (got {})",
                show(min),
                show(max),
                show(d)
            ),
        ));
    }
}

/// For Lease fields, which Kubernetes stores in whole seconds. Returns whether `d` is valid.
fn check_whole_seconds(
    errors: &mut Vec<ConfigError>,
    path: &str,
    d: Duration,
    min: u64,
    max: u64,
) -> bool {
    if d.subsec_nanos() != 0 {
        errors.push(err(
            path,
            format!("must be whole seconds (got {})", show(d)),
        ));
        return false;
    }
    if d.as_secs() < min || d.as_secs() > max {
        errors.push(err(
            path,
            format!("must be between {min}s and {max}s (got {})", show(d)),
        ));
        return false;
    }
    true
}

fn check_range(errors: &mut Vec<ConfigError>, path: &str, v: u64, min: u64, max: u64) {
    if v < min || v > max {
        errors.push(err(
            path,
            format!("must be between {min} and {max} (got {v})"),
        ));
    }
}

// ---------------------------------------------------------------------------------------------
// Suggestions.

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.chars().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let substitute = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = substitute.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// The known word closest to `word`: the same word in another case or with `_`/`-` (snake or
/// kebab case), else the nearest by edit distance within a third of its length (at least 1).
fn suggest<'a>(word: &str, known: &[&'a str]) -> Option<&'a str> {
    if word.len() > 256 {
        return None;
    }
    let norm = |s: &str| -> String {
        s.chars()
            .filter(|c| *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect()
    };
    let w = norm(word);
    if let Some(k) = known.iter().find(|k| norm(k) == w) {
        return Some(k);
    }
    known
        .iter()
        .map(|k| (edit_distance(&w, &norm(k)), *k))
        .filter(|(d, k)| *d <= (k.len() / 3).max(1))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const URL: &str = "manager:\n  url: http://127.0.0.1:6789\n";

    fn load(yaml: &str) -> Result<OperatorConfig, ConfigErrors> {
        OperatorConfig::from_yaml_str(yaml)
    }

    fn errors(yaml: &str) -> ConfigErrors {
        match load(yaml) {
            Ok(c) => panic!("expected errors, got {c:?}"),
            Err(e) => e,
        }
    }

    fn ok(yaml: &str) -> OperatorConfig {
        load(yaml).unwrap_or_else(|e| panic!("expected valid settings, got:\n{e}"))
    }

    fn error_at<'a>(e: &'a ConfigErrors, path: &str) -> &'a ConfigError {
        e.errors
            .iter()
            .find(|x| x.path == path)
            .unwrap_or_else(|| panic!("no error at {path} in:\n{e}"))
    }

    #[test]
    fn a_minimal_file_takes_every_default() {
        let c = ok(URL);
        let d = Duration::from_secs;
        assert_eq!(c.manager.url, "http://127.0.0.1:6789");
        assert_eq!(c.manager.token_file, None);
        assert_eq!(c.manager.tls, None);
        assert_eq!(c.manager.connect_timeout, d(5));
        assert_eq!(c.manager.request_timeout, d(10));
        assert_eq!(c.pending_window, d(60));
        assert_eq!(c.remove_stopped_nodes_after, d(3600));
        assert_eq!(
            c.bands.gold,
            BandConfig {
                on_failure: OnFailure::Restart,
                restart_placement: RestartPlacement::PreferHotSpare,
                max_restarts_per_hour: 6
            }
        );
        assert_eq!(
            c.bands.silver,
            BandConfig {
                on_failure: OnFailure::Restart,
                restart_placement: RestartPlacement::Any,
                max_restarts_per_hour: 6
            }
        );
        assert_eq!(c.bands.bronze.on_failure, OnFailure::Drop);
        assert_eq!(
            c.node_health,
            NodeHealthConfig {
                rejection_threshold: 5,
                rejection_window: d(60)
            }
        );
        assert!(c.watch_namespaces.is_empty());
        assert_eq!(
            c.leader_election,
            LeaderElectionConfig {
                enabled: true,
                lease_name: "automanager-operator".into(),
                lease_namespace: "default".into(),
                lease_duration: d(15),
                renew_every: None,
            }
        );
        assert_eq!(
            c.http.bind_address,
            SocketAddr::from(([127, 0, 0, 1], 8080))
        );
        assert_eq!(c.concurrency.bundles, 8);
        assert_eq!(c.status_write_interval, Duration::from_millis(250));
        assert_eq!(
            c.migration,
            MigrationConfig {
                drain_parallelism: 2,
                phase_timeout: d(60)
            }
        );
    }

    #[test]
    fn every_key_can_be_set() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = |name: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, "x").unwrap_or_else(|e| panic!("{e}"));
            p.display().to_string()
        };
        let (token, ca, cert, key) = (file("token"), file("ca.pem"), file("c.pem"), file("k.pem"));
        let yaml = format!(
            r#"
manager:
  url: https://manager.example.com:6789/
  tokenFile: {token}
  tls: {{ caFile: {ca}, certFile: {cert}, keyFile: {key}, domain: manager.internal }}
  connectTimeout: 2s
  requestTimeout: 1m
pendingWindow: 90
removeStoppedNodesAfter: 2h
bands:
  gold: {{ onFailure: drop, restartPlacement: any, maxRestartsPerHour: 3 }}
  silver: {{ restartPlacement: preferHotSpare }}
  bronze: {{ onFailure: restart }}
nodeHealth: {{ rejectionThreshold: 9, rejectionWindow: 30s }}
watchNamespaces: [video, staging]
leaderElection: {{ enabled: false, leaseName: am.lock, leaseNamespace: ops, leaseDuration: 20, renewEvery: 5s }}
http: {{ bindAddress: "0.0.0.0:9090" }}
concurrency: {{ bundles: 32 }}
statusWriteInterval: 500ms
migration: {{ drainParallelism: 4, phaseTimeout: 2m }}
"#
        );
        let c = ok(&yaml);
        assert_eq!(c.manager.token_file, Some(PathBuf::from(&token)));
        let tls = c.manager.tls.clone().unwrap_or_else(|| panic!("tls"));
        assert_eq!(tls.domain.as_deref(), Some("manager.internal"));
        assert_eq!(tls.cert_file, Some(PathBuf::from(&cert)));
        assert_eq!(c.manager.request_timeout, Duration::from_secs(60));
        assert_eq!(c.pending_window, Duration::from_secs(90));
        assert_eq!(c.remove_stopped_nodes_after, Duration::from_secs(7200));
        assert_eq!(c.bands.gold.on_failure, OnFailure::Drop);
        assert_eq!(c.bands.gold.max_restarts_per_hour, 3);
        assert_eq!(
            c.bands.silver.restart_placement,
            RestartPlacement::PreferHotSpare
        );
        assert_eq!(c.bands.silver.on_failure, OnFailure::Restart);
        assert_eq!(c.bands.bronze.on_failure, OnFailure::Restart);
        assert_eq!(c.node_health.rejection_threshold, 9);
        assert_eq!(
            c.watch_namespaces,
            vec!["video".to_owned(), "staging".to_owned()]
        );
        assert!(!c.leader_election.enabled);
        assert_eq!(c.leader_election.lease_name, "am.lock");
        assert_eq!(c.leader_election.grace_seconds(), 15);
        assert_eq!(c.http.bind_address, SocketAddr::from(([0, 0, 0, 0], 9090)));
        assert_eq!(c.concurrency.bundles, 32);
        assert_eq!(c.status_write_interval, Duration::from_millis(500));
        assert_eq!(c.migration.drain_parallelism, 4);
        assert_eq!(c.migration.phase_timeout, Duration::from_secs(120));
    }

    #[test]
    fn the_demo_config_is_valid() {
        let text = include_str!("../../../config/demo-operator.yaml");
        let c = ok(text);
        assert_eq!(c.manager.url, "http://127.0.0.1:6789");
    }

    #[test]
    fn the_documented_example_is_valid_but_for_its_secret_files() {
        let doc = include_str!("../../../docs/operator-config.md");
        let example = doc
            .split("## A complete example")
            .nth(1)
            .and_then(|rest| rest.split("```yaml\n").nth(1))
            .and_then(|rest| rest.split("```").next())
            .unwrap_or_else(|| panic!("no example in docs/operator-config.md"));
        let e = errors(example);
        let paths: Vec<&str> = e.errors.iter().map(|x| x.path.as_str()).collect();
        assert_eq!(
            paths,
            vec!["manager.tokenFile", "manager.tls.caFile"],
            "{e}"
        );
    }

    #[test]
    fn the_documented_error_lines_are_what_the_loader_prints() {
        let doc = include_str!("../../../docs/operator-config.md");
        let e = errors(
            "manager: { url: manager.example.com:6789 }\npendingWindw: 60\nbands: { gold: { maxRestartsPerHour: 0 }, silver: { onFailure: restrat } }\nleaderElection: { renewEvery: 15 }\n",
        );
        for line in e.to_string().lines() {
            let shown = line.split(" (known here:").next().unwrap_or(line);
            assert!(doc.contains(shown), "docs do not show: {line}");
        }
    }

    #[test]
    fn durations_accept_seconds_decimals_and_units() {
        let cases = [
            ("60", 60_000),
            ("0.5", 500),
            ("\"60\"", 60_000),
            ("\"500ms\"", 500),
            ("\"60s\"", 60_000),
            ("\"50ms\"", 50),
            ("\"1m\"", 60_000),
            ("1m", 60_000),
            ("\"1s500ms\"", 1_500),
            ("\" 2s \"", 2_000),
        ];
        for (v, ms) in cases {
            let c = ok(&format!("{URL}statusWriteInterval: {v}\n"));
            assert_eq!(c.status_write_interval, Duration::from_millis(ms), "{v}");
        }
        assert_eq!(parse_duration_str("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration_str("1h"), Ok(Duration::from_secs(3_600)));
        assert_eq!(parse_duration_str("1h30m"), Ok(Duration::from_secs(5_400)));
        assert_eq!(parse_duration_str("5m"), Ok(Duration::from_secs(300)));
    }

    #[test]
    fn malformed_durations_are_reported_with_the_accepted_forms() {
        for v in [
            "\"60x\"", "\"s\"", "\"1.5s\"", "\"\"", "[1]", "true", "\"1 h\"",
        ] {
            let e = errors(&format!("{URL}pendingWindow: {v}\n"));
            assert!(
                error_at(&e, "pendingWindow").message.contains("duration"),
                "{v}: {e}"
            );
        }
    }

    #[test]
    fn negative_and_overflowing_numbers_are_rejected() {
        let e = errors(&format!("{URL}pendingWindow: -5\n"));
        assert_eq!(
            error_at(&e, "pendingWindow").message,
            "must not be negative"
        );
        let e = errors(&format!("{URL}pendingWindow: \"-5s\"\n"));
        assert_eq!(
            error_at(&e, "pendingWindow").message,
            "must not be negative"
        );
        let e = errors(&format!("{URL}pendingWindow: 18446744073709551615\n"));
        assert!(error_at(&e, "pendingWindow").message.contains("too long"));
        let e = errors(&format!(
            "{URL}pendingWindow: 999999999999999999999999999\n"
        ));
        // Beyond u64 serde_yaml itself refuses the number: one error naming the place.
        assert_eq!(e.errors.len(), 1);
        assert!(e.errors[0].message.contains("line 3, column 16"), "{e}");
        let e = errors(&format!(
            "{URL}pendingWindow: \"99999999999999999999999h\"\n"
        ));
        assert!(error_at(&e, "pendingWindow").message.contains("too long"));
        let e = errors(&format!("{URL}pendingWindow: .nan\n"));
        assert!(error_at(&e, "pendingWindow").message.contains("duration"));
        let e = errors(&format!(
            "{URL}bands: {{ gold: {{ maxRestartsPerHour: -1 }} }}\n"
        ));
        assert_eq!(
            error_at(&e, "bands.gold.maxRestartsPerHour").message,
            "must not be negative"
        );
        let e = errors(&format!(
            "{URL}bands: {{ gold: {{ maxRestartsPerHour: 4294967296 }} }}\n"
        ));
        assert!(
            error_at(&e, "bands.gold.maxRestartsPerHour")
                .message
                .contains("too large")
        );
        let e = errors(&format!("{URL}concurrency: {{ bundles: 70000 }}\n"));
        assert!(
            error_at(&e, "concurrency.bundles")
                .message
                .contains("too large")
        );
        let e = errors(&format!("{URL}concurrency: {{ bundles: 2.5 }}\n"));
        assert!(
            error_at(&e, "concurrency.bundles")
                .message
                .contains("whole number")
        );
    }

    #[test]
    fn durations_must_be_positive_and_bounded() {
        let e = errors(&format!(
            "{URL}pendingWindow: 0\nstatusWriteInterval: 0\nremoveStoppedNodesAfter: 365d\n"
        ));
        assert_eq!(
            error_at(&e, "pendingWindow").message,
            "must be between 1s and 86400s (got 0s)"
        );
        assert!(e.has("statusWriteInterval"));
        assert!(e.has("removeStoppedNodesAfter"));
        let e = errors(
            "manager: { url: http://h:1, connectTimeout: 10ms, requestTimeout: 1h }\nnodeHealth: { rejectionWindow: 2d }\nmigration: { phaseTimeout: 0 }\n",
        );
        for p in [
            "manager.connectTimeout",
            "manager.requestTimeout",
            "nodeHealth.rejectionWindow",
            "migration.phaseTimeout",
        ] {
            assert!(e.has(p), "{p}: {e}");
        }
    }

    #[test]
    fn max_restarts_per_hour_is_between_1_and_1000() {
        let e = errors(&format!(
            "{URL}bands: {{ gold: {{ maxRestartsPerHour: 0 }}, silver: {{ maxRestartsPerHour: 1001 }} }}\n"
        ));
        assert_eq!(
            error_at(&e, "bands.gold.maxRestartsPerHour").message,
            "must be between 1 and 1000 (got 0)"
        );
        assert!(e.has("bands.silver.maxRestartsPerHour"));
        assert_eq!(
            ok(&format!(
                "{URL}bands: {{ bronze: {{ maxRestartsPerHour: 1000 }} }}\n"
            ))
            .bands
            .bronze
            .max_restarts_per_hour,
            1000
        );
    }

    #[test]
    fn counts_must_be_in_range() {
        let e = errors(&format!(
            "{URL}nodeHealth: {{ rejectionThreshold: 0 }}\nconcurrency: {{ bundles: 0 }}\nmigration: {{ drainParallelism: 65 }}\n"
        ));
        assert!(e.has("nodeHealth.rejectionThreshold"));
        assert!(e.has("concurrency.bundles"));
        assert_eq!(
            error_at(&e, "migration.drainParallelism").message,
            "must be between 1 and 64 (got 65)"
        );
    }

    #[test]
    fn band_enums_are_checked_with_a_suggestion() {
        let e = errors(&format!(
            "{URL}bands: {{ gold: {{ onFailure: restrat, restartPlacement: hotSpare }}, silver: {{ onFailure: 3 }} }}\n"
        ));
        let g = error_at(&e, "bands.gold.onFailure");
        assert_eq!(g.message, "must be one of restart, drop, not `restrat`");
        assert_eq!(g.suggestion.as_deref(), Some("restart"));
        assert!(e.has("bands.gold.restartPlacement"));
        assert_eq!(error_at(&e, "bands.silver.onFailure").suggestion, None);
    }

    #[test]
    fn an_unknown_key_is_an_error_with_a_suggestion() {
        let e = errors(&format!("{URL}pendingWindw: 60\n"));
        let u = error_at(&e, "pendingWindw");
        assert!(u.message.starts_with("unknown key"));
        assert_eq!(u.suggestion.as_deref(), Some("pendingWindow"));
        assert_eq!(e.to_string().lines().count(), 1);
        assert!(
            e.to_string().contains("did you mean `pendingWindow`?"),
            "{e}"
        );
    }

    #[test]
    fn snake_case_and_nested_unknown_keys_get_suggestions_at_their_level() {
        let e = errors(&format!(
            "{URL}pending_window: 60\nbands: {{ gold: {{ max_restarts_per_hour: 3 }}, gld: {{}} }}\nleaderElection: {{ lease_name: x }}\n"
        ));
        assert_eq!(
            error_at(&e, "pending_window").suggestion.as_deref(),
            Some("pendingWindow")
        );
        assert_eq!(
            error_at(&e, "bands.gold.max_restarts_per_hour")
                .suggestion
                .as_deref(),
            Some("maxRestartsPerHour")
        );
        assert_eq!(
            error_at(&e, "bands.gld").suggestion.as_deref(),
            Some("gold")
        );
        assert_eq!(
            error_at(&e, "leaderElection.lease_name")
                .suggestion
                .as_deref(),
            Some("leaseName")
        );
    }

    #[test]
    fn an_unknown_key_far_from_any_known_one_gets_no_suggestion() {
        let e = errors(&format!("{URL}colour: blue\n"));
        assert_eq!(error_at(&e, "colour").suggestion, None);
    }

    #[test]
    fn several_errors_are_all_reported_one_per_line() {
        let e = errors(
            "manager: { url: localhost:6789 }\npendingWindow: -1\nbands: { gold: { maxRestartsPerHour: 0 } }\nfoo: 1\nleaderElection: { leaseName: Not_A_Name }\nmigration: { drainParallelism: 0 }\n",
        );
        for p in [
            "manager.url",
            "pendingWindow",
            "bands.gold.maxRestartsPerHour",
            "foo",
            "leaderElection.leaseName",
            "migration.drainParallelism",
        ] {
            assert!(e.has(p), "{p} missing from:\n{e}");
        }
        assert_eq!(e.to_string().lines().count(), e.errors.len());
        assert_eq!(e.errors.len(), 6);
    }

    #[test]
    fn malformed_yaml_is_one_error_with_line_and_column() {
        let e = errors("manager:\n  url: [unclosed\npendingWindow: 60\n");
        assert_eq!(e.errors.len(), 1);
        let m = &e.errors[0].message;
        assert!(m.starts_with("malformed YAML at line "), "{m}");
        assert!(m.contains("column"), "{m}");
        assert!(e.to_string().starts_with("<document>: malformed YAML"));
    }

    #[test]
    fn the_document_must_be_a_mapping() {
        let e = errors("- a\n- b\n");
        assert!(error_at(&e, "").message.contains("must be a mapping"));
        let e = errors(&format!("{URL}bands: 3\n"));
        assert!(error_at(&e, "bands").message.contains("must be a mapping"));
    }

    #[test]
    fn an_empty_document_reports_only_the_missing_manager_url() {
        let e = errors("");
        assert_eq!(e.errors.len(), 1);
        assert!(
            error_at(&e, "manager.url")
                .message
                .starts_with("is required")
        );
    }

    #[test]
    fn a_manager_url_without_scheme_suggests_one() {
        let e = errors("manager: { url: \"manager.example.com:6789\" }\n");
        let u = error_at(&e, "manager.url");
        assert!(u.message.contains("http://"));
        assert_eq!(
            u.suggestion.as_deref(),
            Some("http://manager.example.com:6789")
        );
    }

    #[test]
    fn manager_urls_must_be_scheme_host_and_port() {
        for good in [
            "http://127.0.0.1:6789",
            "http://manager:1/",
            "http://[::1]:6789",
            "http://a.b-c.example:65535",
        ] {
            assert!(parse_manager_url(good).is_ok(), "{good}");
        }
        for bad in [
            "ftp://h:1",
            "http://h",
            "http://h:0",
            "http://h:70000",
            "http://h:x",
            "http://h:1/path",
            "http://user@h:1",
            "http://[::1:6789",
            "http://[zz]:1",
            "http://bad_host:1",
            "http://:1",
        ] {
            assert!(parse_manager_url(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_manager_url("https://[::1]:443"),
            Ok(ManagerUrl {
                https: true,
                host: "[::1]".into(),
                port: 443
            })
        );
    }

    #[test]
    fn tls_must_match_the_scheme() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "x").unwrap_or_else(|e| panic!("{e}"));
        let e = errors(&format!(
            "manager: {{ url: \"http://h:1\", tls: {{ caFile: {} }} }}\n",
            ca.display()
        ));
        assert!(error_at(&e, "manager.tls").message.contains("https://"));
        let e = errors("manager: { url: \"https://h:1\" }\n");
        assert!(
            error_at(&e, "manager.tls.caFile")
                .message
                .contains("required")
        );
        let e = errors("manager: { url: \"https://h:1\", tls: { domain: x } }\n");
        assert!(e.has("manager.tls.caFile"));
        let e = errors(&format!(
            "manager: {{ url: \"https://h:1\", tls: {{ caFile: {}, certFile: {} }} }}\n",
            ca.display(),
            ca.display()
        ));
        assert!(
            error_at(&e, "manager.tls.keyFile")
                .message
                .contains("mutual TLS")
        );
    }

    #[test]
    fn files_that_do_not_exist_are_reported() {
        let e = errors(
            "manager: { url: \"https://h:1\", tokenFile: /nonexistent/token, tls: { caFile: /nonexistent/ca.pem } }\n",
        );
        assert!(
            error_at(&e, "manager.tokenFile")
                .message
                .contains("/nonexistent/token")
        );
        assert!(e.has("manager.tls.caFile"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let e = errors(&format!(
            "manager: {{ url: \"http://h:1\", tokenFile: {} }}\n",
            dir.path().display()
        ));
        assert!(
            error_at(&e, "manager.tokenFile")
                .message
                .contains("not a regular file")
        );
        let e = errors("manager: { url: \"http://h:1\", tokenFile: \"\" }\n");
        assert_eq!(
            error_at(&e, "manager.tokenFile").message,
            "must not be empty"
        );
    }

    #[test]
    fn lease_names_must_be_kubernetes_names() {
        let e = errors(&format!(
            "{URL}leaderElection: {{ leaseName: \"-bad\", leaseNamespace: \"a.b\" }}\n"
        ));
        assert!(e.has("leaderElection.leaseName"));
        assert!(e.has("leaderElection.leaseNamespace"));
        assert_eq!(
            ok(&format!("{URL}leaderElection: {{ leaseName: a.b-c }}\n"))
                .leader_election
                .lease_name,
            "a.b-c"
        );
    }

    #[test]
    fn lease_timing_is_whole_seconds_and_renewal_comes_before_expiry() {
        let e = errors(&format!(
            "{URL}leaderElection: {{ leaseDuration: 1500ms }}\n"
        ));
        assert!(
            error_at(&e, "leaderElection.leaseDuration")
                .message
                .contains("whole seconds")
        );
        let e = errors(&format!("{URL}leaderElection: {{ leaseDuration: 2 }}\n"));
        assert!(e.has("leaderElection.leaseDuration"));
        let e = errors(&format!(
            "{URL}leaderElection: {{ leaseDuration: 10, renewEvery: 10 }}\n"
        ));
        assert!(
            error_at(&e, "leaderElection.renewEvery")
                .message
                .contains("shorter")
        );
        let e = errors(&format!("{URL}leaderElection: {{ renewEvery: 0 }}\n"));
        assert!(e.has("leaderElection.renewEvery"), "{e}");
        let c = ok(&format!("{URL}leaderElection: {{ leaseDuration: 15 }}\n"));
        assert_eq!(
            (
                c.leader_election.lease_duration_seconds(),
                c.leader_election.grace_seconds()
            ),
            (15, 5)
        );
    }

    #[test]
    fn watch_namespaces_are_names_listed_once() {
        let e = errors(&format!("{URL}watchNamespaces: [video, Video, video, 3]\n"));
        assert!(e.has("watchNamespaces[1]"));
        assert!(error_at(&e, "watchNamespaces[2]").message.contains("twice"));
        assert!(e.has("watchNamespaces[3]"));
        let e = errors(&format!("{URL}watchNamespaces: video\n"));
        assert!(error_at(&e, "watchNamespaces").message.contains("list"));
    }

    #[test]
    fn bind_address_must_be_ip_and_port() {
        let e = errors(&format!(
            "{URL}http: {{ bindAddress: \"localhost:8080\" }}\n"
        ));
        assert!(
            error_at(&e, "http.bindAddress")
                .message
                .contains("IP address and port")
        );
        assert_eq!(
            ok(&format!("{URL}http: {{ bindAddress: \"[::]:81\" }}\n"))
                .http
                .bind_address
                .port(),
            81
        );
    }

    #[test]
    fn wrong_types_are_named() {
        let e = errors("manager: { url: 5 }\nleaderElection: { enabled: yes please }\n");
        assert_eq!(
            error_at(&e, "manager.url").message,
            "must be a string, not a number"
        );
        assert!(
            error_at(&e, "leaderElection.enabled")
                .message
                .contains("true or false")
        );
    }

    #[test]
    fn huge_strings_are_refused_without_echoing_them() {
        let long = "a".repeat(100_000);
        let e = errors(&format!(
            "manager: {{ url: \"http://{long}:1\" }}\nwatchNamespaces: [{long}]\nhttp: {{ bindAddress: \"{long}\" }}\n"
        ));
        assert!(error_at(&e, "manager.url").message.contains("too long"));
        assert!(e.has("watchNamespaces[0]"));
        assert!(e.has("http.bindAddress"));
        assert!(e.to_string().len() < 2_000, "{}", e.to_string().len());
        let e = errors(&" ".repeat(MAX_CONFIG_BYTES + 1));
        assert!(error_at(&e, "").message.contains("larger than"));
    }

    #[test]
    fn null_values_take_the_default() {
        let c = ok(&format!(
            "{URL}pendingWindow:\nbands:\n  gold:\nmigration: ~\n"
        ));
        assert_eq!(c.pending_window, Duration::from_secs(60));
        assert_eq!(c.bands, BandsConfig::default());
    }

    #[test]
    fn overrides_win_over_the_file_and_are_validated() {
        let mut c = ok(URL);
        let o = ConfigOverrides {
            manager_url: Some("http://10.0.0.1:7000".into()),
            http_bind_address: Some("0.0.0.0:9000".into()),
            leader_election: Some(false),
            lease_namespace: Some("ops".into()),
            watch_namespaces: vec!["a".into(), " b ".into(), String::new()],
            pending_window: Some("2m".into()),
            ..Default::default()
        };
        assert_eq!(c.apply_overrides(&o), Ok(()));
        assert_eq!(c.manager.url, "http://10.0.0.1:7000");
        assert_eq!(c.http.bind_address.port(), 9000);
        assert!(!c.leader_election.enabled);
        assert_eq!(c.leader_election.lease_namespace, "ops");
        assert_eq!(c.watch_namespaces, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(c.pending_window, Duration::from_secs(120));
    }

    #[test]
    fn bad_overrides_are_reported_with_the_flag() {
        let mut c = ok(URL);
        let o = ConfigOverrides {
            manager_url: Some("nope".into()),
            http_bind_address: Some("x".into()),
            pending_window: Some("soon".into()),
            manager_token_file: Some("/nonexistent/t".into()),
            watch_namespaces: vec!["Bad".into()],
            ..Default::default()
        };
        let e = c
            .apply_overrides(&o)
            .err()
            .unwrap_or_else(|| panic!("expected errors"));
        assert!(e.has("--http-bind-address"));
        assert!(e.has("--pending-window"));
        assert!(
            error_at(&e, "manager.url")
                .message
                .ends_with("(set by --manager-url / AUTOMANAGER_MANAGER_URL)")
        );
        assert!(
            error_at(&e, "manager.tokenFile")
                .message
                .contains("--manager-token-file")
        );
        assert!(
            error_at(&e, "watchNamespaces[0]")
                .message
                .contains("--watch-namespace")
        );
    }

    #[test]
    fn the_debugging_api_is_off_unless_given_a_port_of_its_own() {
        assert_eq!(ok(URL).http.debug_bind_address, None);
        let c = ok(&format!(
            "{URL}http: {{ bindAddress: 0.0.0.0:8080, debugBindAddress: 127.0.0.1:8082 }}\n"
        ));
        assert_eq!(
            c.http.debug_bind_address,
            Some(SocketAddr::from(([127, 0, 0, 1], 8082)))
        );
        // Port 0 (any free port) on both is fine; ports 0 never collide.
        ok(&format!(
            "{URL}http: {{ bindAddress: 127.0.0.1:0, debugBindAddress: 127.0.0.1:0 }}\n"
        ));
        for (main, debug) in [
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("0.0.0.0:8080", "127.0.0.1:8080"),
            ("127.0.0.1:8080", "[::]:8080"),
        ] {
            let e = errors(&format!(
                "{URL}http: {{ bindAddress: \"{main}\", debugBindAddress: \"{debug}\" }}\n"
            ));
            assert!(
                error_at(&e, "http.debugBindAddress")
                    .message
                    .contains("another port than http.bindAddress"),
                "{e}"
            );
        }
        let e = errors(&format!("{URL}http: {{ debugBindAddress: localhost }}\n"));
        assert!(
            error_at(&e, "http.debugBindAddress")
                .message
                .contains("IP address and port")
        );
        let e = errors(&format!("{URL}http: {{ debugBindAdress: 127.0.0.1:1 }}\n"));
        assert!(
            error_at(&e, "http.debugBindAdress")
                .message
                .contains("debugBindAddress")
        );
    }

    #[test]
    fn the_debug_address_flag_overrides_the_file_and_is_named_in_errors() {
        let mut c = ok(URL);
        let o = ConfigOverrides {
            http_debug_bind_address: Some("127.0.0.1:9091".into()),
            ..Default::default()
        };
        assert_eq!(c.apply_overrides(&o), Ok(()));
        assert_eq!(c.http.debug_bind_address.map(|a| a.port()), Some(9091));
        let mut c = ok(URL);
        let o = ConfigOverrides {
            http_debug_bind_address: Some("127.0.0.1:8080".into()),
            ..Default::default()
        };
        let e = c
            .apply_overrides(&o)
            .err()
            .unwrap_or_else(|| panic!("expected a collision with the default bindAddress"));
        assert!(
            error_at(&e, "http.debugBindAddress")
                .message
                .contains("--http-debug-bind-address")
        );
        let o = ConfigOverrides {
            http_debug_bind_address: Some("nope".into()),
            ..Default::default()
        };
        assert!(
            ok(URL)
                .apply_overrides(&o)
                .err()
                .is_some_and(|e| e.has("--http-debug-bind-address"))
        );
    }

    #[test]
    fn the_manager_url_may_come_from_the_flags_alone() {
        let o = ConfigOverrides {
            manager_url: Some("http://127.0.0.1:6789".into()),
            ..Default::default()
        };
        let c = OperatorConfig::load(None, &o).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.manager.url, "http://127.0.0.1:6789");
        let e = OperatorConfig::load(None, &ConfigOverrides::default()).err();
        assert!(e.is_some_and(|e| e.has("manager.url")));
    }

    #[test]
    fn overrides_parse_from_flags_and_environment_syntax() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            o: ConfigOverrides,
        }
        let cli = Cli::try_parse_from([
            "x",
            "--manager-url",
            "http://h:1",
            "--leader-election",
            "false",
            "--watch-namespace",
            "a",
            "--watch-namespace",
            "b,c",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cli.o.manager_url.as_deref(), Some("http://h:1"));
        assert_eq!(cli.o.leader_election, Some(false));
        assert_eq!(cli.o.watch_namespaces, vec!["a", "b", "c"]);
        assert!(Cli::try_parse_from(["x", "--leader-election", "maybe"]).is_err());
    }

    #[test]
    fn from_file_reads_and_reports_unreadable_files() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path().join("c.yaml");
        std::fs::write(&p, URL).unwrap_or_else(|e| panic!("{e}"));
        assert!(OperatorConfig::from_file(&p).is_ok());
        let e = OperatorConfig::from_file(&dir.path().join("missing.yaml")).err();
        assert!(e.is_some_and(|e| {
            e.errors[0]
                .message
                .contains("cannot read the settings file")
        }));
        std::fs::write(&p, [0xff, 0xfe, 0x00]).unwrap_or_else(|e| panic!("{e}"));
        let e = OperatorConfig::from_file(&p).err();
        assert!(e.is_some_and(|e| e.errors[0].message.contains("not UTF-8")));
    }

    #[test]
    fn client_config_reads_the_token_and_pem_files() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let token = dir.path().join("token");
        std::fs::write(&token, "  s3cret\n").unwrap_or_else(|e| panic!("{e}"));
        let mut c = ok(URL);
        c.manager.token_file = Some(token.clone());
        let cc = c.manager.client_config().unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cc.token.as_deref(), Some("s3cret"));
        assert_eq!(cc.endpoint, "http://127.0.0.1:6789");
        std::fs::write(&token, "\n").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(
            c.manager.client_config(),
            Err(ManagerConfigError::EmptyToken(_))
        ));
    }

    #[test]
    fn bundle_band_overrides_win_field_by_field() {
        let bands = BandsConfig::default();
        let o = BandOverrides {
            gold: Some(BandPolicy {
                max_restarts_per_hour: Some(4),
                ..Default::default()
            }),
            silver: Some(BandPolicy {
                max_restarts_per_hour: Some(-3),
                on_failure: Some(OnFailure::Drop),
                ..Default::default()
            }),
            bronze: None,
        };
        let g = bands.effective(PriorityBand::Gold, Some(&o));
        assert_eq!(
            (g.on_failure, g.restart_placement, g.max_restarts_per_hour),
            (OnFailure::Restart, RestartPlacement::PreferHotSpare, 4)
        );
        let s = bands.effective(PriorityBand::Silver, Some(&o));
        assert_eq!(
            (s.on_failure, s.max_restarts_per_hour),
            (OnFailure::Drop, 1)
        );
        assert_eq!(
            bands.effective(PriorityBand::Bronze, Some(&o)),
            bands.bronze
        );
        assert_eq!(bands.effective(PriorityBand::Gold, None), bands.gold);
    }

    #[test]
    fn edit_distance_counts_single_character_edits() {
        assert_eq!(edit_distance("", ""), 0);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("abc", ""), 3);
        assert_eq!(edit_distance("url", "uri"), 1);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// Whatever the document, loading answers (settings or errors), never panics, and
            /// every error renders on its own line.
            #[test]
            fn any_document_gets_an_answer(doc in "[ -~\n]{0,200}") {
                if let Err(e) = OperatorConfig::from_yaml_str(&doc) {
                    prop_assert!(!e.errors.is_empty());
                    prop_assert_eq!(e.to_string().lines().count() >= e.errors.len(), true);
                }
            }

            #[test]
            fn any_duration_string_parses_or_explains(s in "[0-9a-z.\\- ]{0,24}") {
                match parse_duration_str(&s) {
                    Ok(d) => prop_assert!(d.as_millis() <= u128::from(MAX_PARSED_MS)),
                    Err(m) => prop_assert!(!m.is_empty()),
                }
            }

            #[test]
            fn whole_seconds_round_trip_through_both_forms(n in 1u64..86_400) {
                let a = OperatorConfig::from_yaml_str(&format!("{URL}pendingWindow: {n}\n"));
                let b = OperatorConfig::from_yaml_str(&format!("{URL}pendingWindow: \"{n}s\"\n"));
                prop_assert_eq!(a.map(|c| c.pending_window), b.map(|c| c.pending_window));
            }
        }
    }
}
