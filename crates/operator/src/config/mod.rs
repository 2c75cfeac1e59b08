//! The operator's settings file (YAML): the TypeScript library's (`@norskvideo/norsk-auto-manager`)
//! `AutoSettings`, validated at start-up.
//!
//! The types below are the settings: their serde attributes are the file's keys and defaults,
//! their doc comments and schemars attributes its JSON Schema ([`schema()`]), which also
//! generates the reference tables in `docs/operator-config.md` ([`reference`]).
//!
//! Like the TypeScript library's `AutoManager.run` (which throws `AutoSettingsValidationError`
//! with the whole list), loading reports *every* problem at once, each with its path
//! (`bands.gold.maxRestartsPerHour`) and a message a person can act on, in three stages:
//! 1. the YAML is parsed into a value (malformed YAML is one error with line and column), null
//!    values are dropped (they mean "the default"), and flags/environment ([`ConfigOverrides`])
//!    are written into it, so they are validated exactly like the file;
//! 2. the value is validated against the schema: types, unknown keys (with a "did you mean"),
//!    enum values, ranges, durations, names and addresses;
//! 3. what the schema found is dropped, the rest is read into the types, and the checks a schema
//!    cannot express run on them: Manager's URL is given, TLS matches its scheme, files exist,
//!    the lease is renewed before it lapses.

pub(crate) mod checks;
mod duration;
pub mod reference;
mod schema;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use automanager_api::{BandOverrides, BandPolicy, OnFailure, PriorityBand, RestartPlacement};
use automanager_policy::calendar::{Calendar, Window, WindowError};
use automanager_policy::vocab::{ClearRestartsOn, VoluntaryReason};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use duration::parse_duration_str;
pub use schema::{chart_values_schema, schema, splice_chart_values_schema};

/// Largest settings file accepted.
pub const MAX_CONFIG_BYTES: usize = 1024 * 1024;

/// One problem in the settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Where: a dotted path (`bands.gold.maxRestartsPerHour`, `watchNamespaces[2]`), or empty
    /// for the document as a whole.
    pub path: String,
    /// What is wrong and what is allowed; a value set by a flag names the flag.
    pub message: String,
    /// A likely intended spelling (for unknown keys, enum values and Manager's URL).
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
    /// The problems: those the schema finds, then those of the typed checks.
    pub errors: Vec<ConfigError>,
}

/// At most this many problems are printed; the rest are counted ("and N more"), so a file of
/// 45,000 unknown keys gives a screenful, not megabytes.
pub const MAX_SHOWN_ERRORS: usize = 50;

fn render(errors: &[ConfigError]) -> String {
    let mut lines: Vec<String> = errors
        .iter()
        .take(MAX_SHOWN_ERRORS)
        .map(ToString::to_string)
        .collect();
    if errors.len() > MAX_SHOWN_ERRORS {
        lines.push(format!("... and {} more", errors.len() - MAX_SHOWN_ERRORS));
    }
    lines.join("\n")
}

impl ConfigErrors {
    fn one(path: &str, message: impl Into<String>) -> Self {
        ConfigErrors {
            errors: vec![err(path, message)],
        }
    }

    /// Whether some problem is reported at `path`.
    pub fn has(&self, path: &str) -> bool {
        self.errors.iter().any(|e| e.path == path)
    }
}

fn err(path: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        path: path.to_owned(),
        message: message.into(),
        suggestion: None,
    }
}

/// Whether the files the settings name (token, TLS) must exist: yes for the operator; `config
/// check --no-file-checks` skips it for settings checked away from the Pod that mounts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FileChecks {
    /// Each named file must be a readable regular file.
    #[default]
    Check,
    /// Named files are not looked at.
    Skip,
}

// ---------------------------------------------------------------------------------------------
// The settings.

/// TLS towards Manager (PEM files).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM CA certificate(s) that sign Manager's certificate. Required with `https://`: no
    /// system roots are built in.
    #[schemars(length(max = 4096), extend("format" = "file-path"))]
    pub ca_file: PathBuf,
    /// Client certificate for mutual TLS; with `keyFile`, both or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096), extend("format" = "file-path"))]
    pub cert_file: Option<PathBuf>,
    /// Client key for mutual TLS; with `certFile`, both or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096), extend("format" = "file-path"))]
    pub key_file: Option<PathBuf>,
    /// The name to verify in Manager's certificate (default: the URL's host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253), extend("format" = "dns-subdomain"))]
    pub domain: Option<String>,
}

/// Which of Manager's APIs the operator speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum ManagerApi {
    /// Our own first API (`norsk.manager.v1`), which only manager-sim serves; kept while the
    /// move to the published API ends.
    V1,
    /// Manager's published API (`norsk.api.manager` 1.0.384): nodes and jobs under our tags,
    /// pools from the PlacementPools; warm spares and the migration handshake where Manager
    /// also serves our extension, standard mode where it does not.
    #[default]
    Published,
}

/// How to reach Manager.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ManagerConfig {
    /// Which API to speak: `v1` (ours) or `published` (Manager's own).
    pub api: ManagerApi,
    /// With `published`: the value of the `automanager.norsk.io/owner` tag on every node and
    /// job this installation creates. Only objects with it are ever stopped, deleted or counted
    /// as ours, so installations sharing one Manager must each have their own.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
    )]
    pub owner: String,
    /// Manager's gRPC address, `http://host:port` or `https://host:port` (a trailing `/` is
    /// allowed; no path), or a bare `host:port` as the TypeScript library takes it: TLS when
    /// `tls` is set, plaintext otherwise. Required, here or with `--manager-url`.
    #[serde(skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 2048), extend("format" = "manager-url"))]
    pub url: String,
    /// A file holding the bearer token sent on every call (surrounding whitespace is trimmed),
    /// read at start-up.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096), extend("format" = "file-path"))]
    pub token_file: Option<PathBuf>,
    /// TLS towards Manager: required with an `https://` URL, refused with `http://`; with a
    /// bare `host:port`, setting it is what turns TLS on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsConfig>,
    /// Connect timeout.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "100ms", "max": "5m"}))]
    pub connect_timeout: Duration,
    /// Deadline of each call.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "100ms", "max": "10m"}))]
    pub request_timeout: Duration,
    /// How long a Watch may take from the call to its `Synced` (the snapshot, or the catch-up
    /// after a resume). Past it the stream counts as failed (`transientFailure`) and is retried
    /// with backoff: a Manager that accepts the stream and never answers is not "connecting"
    /// forever.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "1h"}))]
    pub sync_timeout: Duration,
    /// How often Manager is asked to send a heartbeat on a quiet Watch stream.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "100ms", "max": "1h"}))]
    pub heartbeat_interval: Duration,
    /// The longest silence accepted on an open Watch stream (no event, no heartbeat) before it
    /// counts as stalled and is reopened, resuming from the last revision. Longer than
    /// `heartbeatInterval`; against a Manager that sends no heartbeats, set it long.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "1d"}))]
    pub idle_timeout: Duration,
    /// How long Manager may be unreachable (the connection out of `ready`) before `/readyz`
    /// answers 503, on the leader and the standby alike; short reconnects stay within it. A
    /// replica that has never synced with Manager is not ready at all.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "0s", "max": "1h"}))]
    pub readiness_grace: Duration,
}

impl Default for ManagerConfig {
    /// `url` is empty, which validation reports as missing.
    fn default() -> Self {
        ManagerConfig {
            api: ManagerApi::Published,
            owner: "automanager".to_owned(),
            url: String::new(),
            token_file: None,
            tls: None,
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(10),
            sync_timeout: Duration::from_secs(30),
            heartbeat_interval: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(15),
            readiness_grace: Duration::from_secs(30),
        }
    }
}

/// A band's disruption window: when voluntary moves of the band's jobs may happen, written as
/// a Bundle's `spec.disruption.windows[]` is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BandWindow {
    /// A five-field cron pattern (minute hour day-of-month month day-of-week, e.g.
    /// `0 2 * * SAT`) or `@daily`, `@weekly`, ...; each match opens the window.
    #[schemars(length(min = 1, max = 128), extend("format" = "cron-schedule"))]
    pub schedule: String,
    /// How long each window lasts: elapsed time, a Go duration such as `2h` or `5h30m`, 1m to
    /// 744h.
    #[schemars(length(min = 1, max = 32), extend("format" = "window-duration"))]
    pub duration: String,
    /// The IANA time zone the pattern is read in, e.g. `Europe/Oslo`.
    #[serde(default = "utc_zone")]
    #[schemars(length(min = 1, max = 64), extend("format" = "time-zone"))]
    pub time_zone: String,
    /// The voluntary reasons this window admits (`drain`, `consolidation`, `rebalance`,
    /// `spareRotation`), each once; none listed: all of them. A reason no window names is not
    /// held.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4), extend("uniqueItems" = true))]
    pub reasons: Vec<VoluntaryReason>,
}

fn utc_zone() -> String {
    "UTC".to_owned()
}

impl BandWindow {
    /// The window as the calendar reads it.
    pub fn to_policy(&self) -> Result<Window, WindowError> {
        Window::parse(
            &self.schedule,
            &self.duration,
            &self.time_zone,
            &self.reasons,
        )
    }
}

/// The calendar of a band's windows; the first that cannot be read is the error.
pub fn band_calendar(windows: &[BandWindow]) -> Result<Calendar, WindowError> {
    windows
        .iter()
        .map(BandWindow::to_policy)
        .collect::<Result<Vec<_>, _>>()
        .map(Calendar::new)
}

/// One band's failure policy and disruption windows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BandConfig {
    /// `restart` or `drop`.
    pub on_failure: OnFailure,
    /// `preferHotSpare` or `any` (ignored with `drop`).
    pub restart_placement: RestartPlacement,
    /// More restarts of one replica than this within a sliding hour marks the bundle Broken.
    pub max_restarts_per_hour: u32,
    /// How long a restarted replica must stay Running before its restart count is cleared (the
    /// TypeScript library's "a successful restart clears the count").
    #[serde(with = "duration")]
    pub restart_clear_after: Duration,
    /// When a restarted replica's count is cleared: after `restart_clear_after` of stable
    /// running (ours, the default), or at a successful restart (the library's).
    pub clear_restarts_on: ClearRestartsOn,
    /// Whether a recovery of this band that finds no capacity and no spare may stop bronze jobs
    /// on one node to make room (preemption). Never true for bronze.
    pub preempt: bool,
    /// When voluntary moves of the band's jobs may happen (empty: at any time, as far as the
    /// band is concerned); a Bundle's own windows apply as well.
    pub disruption_windows: Vec<BandWindow>,
}

/// One band in the file; a key left out takes that band's default.
#[derive(Default, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BandFile {
    /// `restart`: place the job again. `drop`: do not restart it; an Event and
    /// `automanager_jobs_dropped_total` record the drop. A Bundle's `spec.bands` may override it.
    on_failure: Option<OnFailure>,
    /// `preferHotSpare`: a hot spare (one dedicated to the band first), then any node that
    /// fits. `any`: any node that fits. Ignored with `drop`. A Bundle's `spec.bands` may
    /// override it.
    restart_placement: Option<RestartPlacement>,
    /// More restarts of one replica than this within a sliding hour marks the bundle Broken
    /// (the restart that would exceed it is not made). A Bundle's `spec.bands` may override it.
    #[schemars(range(min = 1, max = 1000))]
    max_restarts_per_hour: Option<u32>,
    /// A restart succeeded once every job of the restarted replica has been Running for this
    /// long without interruption; the replica's restart count is then cleared. A job that
    /// fails sooner keeps its count, so a crash loop still reaches `maxRestartsPerHour`.
    /// Not overridden by a Bundle.
    #[serde(default, with = "duration::option")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "1d"}))]
    restart_clear_after: Option<Duration>,
    /// Which rule clears a replica's restart count. `stableRunning` (this project's rule):
    /// once every job of the restarted replica has been Running for `restartClearAfter`, so a
    /// crash loop still reaches `maxRestartsPerHour`. `successfulRestart` (the TypeScript
    /// library's "a successful restart clears the count"): as soon as every job of the
    /// restarted replica is Running again, so a job that crashes some time after each start
    /// may never reach it. Not overridden by a Bundle.
    clear_restarts_on: Option<ClearRestartsOn>,
    /// A recovery of this band that finds no capacity and no hot spare may stop bronze jobs
    /// (the fewest, then the newest, on one node) to make room; they are dropped as a bronze job
    /// whose node failed would be. Off by default in every band: stopping someone else's output
    /// must be a decision the fleet's owner makes. Bronze cannot preempt. Not overridden by a
    /// Bundle.
    preempt: Option<bool>,
    /// When voluntary moves (drains, consolidation, rebalance, spare rotation) of this band's
    /// jobs may happen, written as a Bundle's `spec.disruption.windows`: each a `schedule`
    /// (cron), a `duration` (1m to 744h), a `timeZone` (default `UTC`) and the `reasons` it
    /// admits (none: all). Empty: at any time. A move is made only when both the band's
    /// windows and its Bundle's own admit it; recovery from a failure and moves ahead of a
    /// reclaim notice are never held. Not overridden by a Bundle.
    #[schemars(length(max = 16))]
    disruption_windows: Option<Vec<BandWindow>>,
}

impl BandFile {
    fn over(self, base: BandConfig) -> BandConfig {
        BandConfig {
            on_failure: self.on_failure.unwrap_or(base.on_failure),
            restart_placement: self.restart_placement.unwrap_or(base.restart_placement),
            max_restarts_per_hour: self
                .max_restarts_per_hour
                .unwrap_or(base.max_restarts_per_hour),
            restart_clear_after: self.restart_clear_after.unwrap_or(base.restart_clear_after),
            clear_restarts_on: self.clear_restarts_on.unwrap_or(base.clear_restarts_on),
            preempt: self.preempt.unwrap_or(base.preempt),
            disruption_windows: self.disruption_windows.unwrap_or(base.disruption_windows),
        }
    }
}

/// What each band does when a job fails or loses its node. Each key falls back to its band's
/// default; a Bundle's own `spec.bands` overrides `onFailure`, `restartPlacement` and
/// `maxRestartsPerHour` per field.
#[derive(Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
struct BandsFile {
    /// Gold jobs.
    gold: BandFile,
    /// Silver jobs.
    silver: BandFile,
    /// Bronze jobs.
    bronze: BandFile,
}

impl From<BandsFile> for BandsConfig {
    fn from(f: BandsFile) -> Self {
        let d = BandsConfig::default();
        BandsConfig {
            gold: f.gold.over(d.gold),
            silver: f.silver.over(d.silver),
            bronze: f.bronze.over(d.bronze),
        }
    }
}

/// The band defaults (a bundle's `spec.bands` overrides them per field).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "BandsFile")]
pub struct BandsConfig {
    /// Default: restart, preferHotSpare, 6, 10 minutes.
    pub gold: BandConfig,
    /// Default: restart, any, 6, 10 minutes.
    pub silver: BandConfig,
    /// Default: drop (any, 6, 10 minutes).
    pub bronze: BandConfig,
}

/// The file's shape, not the resolved one: a band lists only what it changes.
impl JsonSchema for BandsConfig {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "BandsConfig".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        BandsFile::json_schema(generator)
    }
}

/// How long a restarted replica must run before its count is cleared, in every band.
const RESTART_CLEAR_AFTER: Duration = Duration::from_secs(600);

impl Default for BandsConfig {
    fn default() -> Self {
        let band = |on_failure, restart_placement| BandConfig {
            on_failure,
            restart_placement,
            max_restarts_per_hour: 6,
            restart_clear_after: RESTART_CLEAR_AFTER,
            clear_restarts_on: ClearRestartsOn::StableRunning,
            preempt: false,
            disruption_windows: Vec::new(),
        };
        BandsConfig {
            gold: band(OnFailure::Restart, RestartPlacement::PreferHotSpare),
            silver: band(OnFailure::Restart, RestartPlacement::Any),
            bronze: band(OnFailure::Drop, RestartPlacement::Any),
        }
    }
}

impl BandsConfig {
    /// The configured defaults of `band`.
    pub fn get(&self, band: PriorityBand) -> &BandConfig {
        match band {
            PriorityBand::Gold => &self.gold,
            PriorityBand::Silver => &self.silver,
            PriorityBand::Bronze => &self.bronze,
        }
    }

    /// The policy for `band` in a bundle: its `spec.bands` fields where set, the defaults
    /// otherwise (`restartClearAfter` and `clearRestartsOn` have no bundle field). An out-of-range
    /// `maxRestartsPerHour` (the CRD schema bounds it to 1..=1000) is clamped into range.
    pub fn effective(&self, band: PriorityBand, overrides: Option<&BandOverrides>) -> BandConfig {
        let base = self.get(band);
        let policy: Option<&BandPolicy> = overrides.and_then(|o| match band {
            PriorityBand::Gold => o.gold.as_ref(),
            PriorityBand::Silver => o.silver.as_ref(),
            PriorityBand::Bronze => o.bronze.as_ref(),
        });
        let Some(p) = policy else {
            return base.clone();
        };
        BandConfig {
            on_failure: p.on_failure.unwrap_or(base.on_failure),
            restart_placement: p.restart_placement.unwrap_or(base.restart_placement),
            max_restarts_per_hour: p
                .max_restarts_per_hour
                .map_or(base.max_restarts_per_hour, |m| {
                    m.clamp(1, 1000).unsigned_abs()
                }),
            restart_clear_after: base.restart_clear_after,
            clear_restarts_on: base.clear_restarts_on,
            preempt: base.preempt,
            disruption_windows: base.disruption_windows.clone(),
        }
    }
}

/// When a node counts as Unhealthy (placement then avoids it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeHealthConfig {
    /// Job rejections within `rejectionWindow` that mark a node Unhealthy.
    #[schemars(range(min = 1, max = 10_000))]
    pub rejection_threshold: u32,
    /// The sliding window for rejections.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "1d"}))]
    pub rejection_window: Duration,
    /// A flapping node (unhealthy again soon after it recovered) is kept out longer each time:
    /// the rejection window the first time, doubled for every further episode within
    /// `flapMemory`, up to this. At least `rejectionWindow`.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "1d"}))]
    pub flap_max_hold: Duration,
    /// An unhealthy episode beginning within this of the previous one counts as a flap; a node
    /// quiet for longer starts again from one.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "7d"}))]
    pub flap_memory: Duration,
}

impl Default for NodeHealthConfig {
    fn default() -> Self {
        NodeHealthConfig {
            rejection_threshold: 5,
            rejection_window: Duration::from_secs(60),
            flap_max_hold: Duration::from_secs(30 * 60),
            flap_memory: Duration::from_secs(60 * 60),
        }
    }
}

/// Leader election on a `coordination.k8s.io/v1` Lease, so that of two replicas only one acts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LeaderElectionConfig {
    /// Elect a leader. Turn off only when exactly one operator runs (as in the demo).
    pub enabled: bool,
    /// The Lease's name (a Kubernetes object name).
    #[schemars(length(max = 253), extend("format" = "dns-subdomain"))]
    pub lease_name: String,
    /// The Lease's namespace; in a cluster, usually the operator's own (see
    /// `--lease-namespace`).
    #[schemars(length(max = 63), extend("format" = "dns-label"))]
    pub lease_namespace: String,
    /// How long the holder's claim lasts without renewal: after a crash, the standby takes
    /// over within this time.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "3s", "max": "600s", "wholeSeconds": true}))]
    pub lease_duration: Duration,
    /// How often the holder renews; at least 2 s shorter than `leaseDuration` (default: two
    /// thirds of it).
    #[serde(with = "duration::option", skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "598s", "wholeSeconds": true}))]
    pub renew_every: Option<Duration>,
}

impl Default for LeaderElectionConfig {
    fn default() -> Self {
        LeaderElectionConfig {
            enabled: true,
            lease_name: "automanager-operator".to_owned(),
            lease_namespace: "default".to_owned(),
            lease_duration: Duration::from_secs(15),
            renew_every: None,
        }
    }
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Listen address (an IP address and port). The default is loopback only, so a developer's
    /// operator exposes nothing; in a Pod set `0.0.0.0:8080` so probes and Prometheus can
    /// reach it.
    #[schemars(length(max = 256), extend("format" = "ip-and-port"))]
    pub bind_address: SocketAddr,
    /// Listen address of the debugging API (`/debug/trace`, `/v1/what-if`); unset, it is not
    /// served. Must use another port than `bindAddress`, so exposing probes and metrics never
    /// exposes the debugging API.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256), extend("format" = "ip-and-port"))]
    pub debug_bind_address: Option<SocketAddr>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            bind_address: SocketAddr::from(([127, 0, 0, 1], 8080)),
            debug_bind_address: None,
        }
    }
}

/// Parallelism of the controllers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConcurrencyConfig {
    /// Bundles reconciled at once.
    #[schemars(range(min = 1, max = 1024))]
    pub bundles: u16,
}

impl Default for ConcurrencyConfig {
    fn default() -> Self {
        ConcurrencyConfig { bundles: 8 }
    }
}

/// Node drains and migrations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MigrationConfig {
    /// Jobs moved off a draining node at once.
    #[schemars(range(min = 1, max = 64))]
    pub drain_parallelism: u16,
    /// Migrations running at once in the whole fleet; more wait in `Pending`, queued by
    /// priority (drains and Migrations a person created, then rebalancing, then
    /// consolidation), then age.
    #[schemars(range(min = 1, max = 1000))]
    pub max_parallel: u16,
    /// Migrations one node takes part in at once (as source or target); at most `maxParallel`.
    #[schemars(range(min = 1, max = 64))]
    pub max_parallel_per_node: u16,
    /// Longest a migration phase may take before it is aborted.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "1h"}))]
    pub phase_timeout: Duration,
}

impl Default for MigrationConfig {
    fn default() -> Self {
        MigrationConfig {
            drain_parallelism: 2,
            max_parallel: 5,
            max_parallel_per_node: 2,
            phase_timeout: Duration::from_secs(60),
        }
    }
}

/// The orphan sweep: Manager bundles and nodes whose custom resource is gone (after a restore,
/// a finalizer removed by hand) are removed once they have been orphaned for `grace`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OrphanSweepConfig {
    /// Sweep at all. Off, orphans are left to a person (`kubectl automanager` shows them).
    pub enabled: bool,
    /// How often the sweep looks.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "1h"}))]
    pub interval: Duration,
    /// How long something must stay orphaned, in every sweep, before it is removed.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "7d"}))]
    pub grace: Duration,
}

impl Default for OrphanSweepConfig {
    fn default() -> Self {
        OrphanSweepConfig {
            enabled: true,
            interval: Duration::from_secs(60),
            grace: Duration::from_secs(300),
        }
    }
}

/// The zone brake: a zone of a pool that loses more than `lostPercent` of its nodes within
/// `window` (at least `minLostNodes` of them) is `ZoneDegraded`: no node is provisioned into it
/// until `window` passes with no further loss; recovery goes on in the pool's other zones and
/// in other pools. See docs/fleet-safety-brakes.md.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ZoneBrakeConfig {
    /// Apply the brake. Off, a failing zone is asked for nodes like any other.
    pub enabled: bool,
    /// More than this percentage of the zone's nodes (those lost in the window and those still
    /// up) lost within `window` degrades it.
    #[schemars(range(min = 1, max = 100))]
    pub lost_percent: u8,
    /// The sliding window for losses, and how long a degraded zone must stay quiet to clear.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "1h"}))]
    pub window: Duration,
    /// Fewer losses than this within the window never degrade a zone (a node failure is not an
    /// outage).
    #[schemars(range(min = 1, max = 10_000))]
    pub min_lost_nodes: u32,
}

impl Default for ZoneBrakeConfig {
    fn default() -> Self {
        ZoneBrakeConfig {
            enabled: true,
            lost_percent: 50,
            window: Duration::from_secs(300),
            min_lost_nodes: 3,
        }
    }
}

/// The provisioning brake: how fast nodes may be asked for (each pool's `maxNodes` bounds how
/// many).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ProvisioningConfig {
    /// CreateNode requests per pool in any sliding minute (spares, replicas and migration
    /// targets together), so a crash-looping job or a bad instance type cannot run up a bill.
    #[schemars(range(min = 1, max = 10_000))]
    pub per_pool_per_minute: u32,
}

impl Default for ProvisioningConfig {
    fn default() -> Self {
        ProvisioningConfig {
            per_pool_per_minute: 60,
        }
    }
}

/// The rebalancer (Bundles with `spec.rebalance: true`): how many Migrations it may create.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RebalanceConfig {
    /// Rebalancing Migrations created in the whole fleet in any sliding minute, so a zone
    /// coming back does not move everything at once (each Migration still waits for the
    /// migration queue and its bundle's disruption budget).
    #[schemars(range(min = 1, max = 1000))]
    pub max_per_minute: u32,
}

impl Default for RebalanceConfig {
    fn default() -> Self {
        RebalanceConfig { max_per_minute: 6 }
    }
}

/// Voluntary moves held back: how long a drain or a Migration may wait for a Broken bundle, a
/// disruption budget or a closed disruption window before the wait is escalated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DisruptionConfig {
    /// A drain or Migration held this long gets a Warning Event, counts in
    /// `automanager_held_moves` (the `AutoManagerMoveHeldTooLong` alert), and a `terminate`
    /// drain with `whenHeld: Proceed` terminates its node. The default, 30m, is longer than a
    /// replica's restart normally takes to settle and shorter than a maintenance slot.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "7d"}))]
    pub hold_warn_after: Duration,
}

impl Default for DisruptionConfig {
    fn default() -> Self {
        DisruptionConfig {
            hold_warn_after: Duration::from_secs(30 * 60),
        }
    }
}

/// The AutoManager operator's settings (`automanager-operator --config FILE`). Every key is
/// optional except `manager.url` (which a flag may give instead); a key left out, or set to
/// null, takes its default.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
#[schemars(title = "AutoManager operator settings")]
pub struct OperatorConfig {
    // A section's field has no doc comment: its type's is its description in the schema.
    pub manager: ManagerConfig,
    /// How long a node may stay starting before it counts as failed (the TypeScript library's
    /// `pendingWindow`).
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "1d"}))]
    pub pending_window: Duration,
    /// How long the `ManagerNode` of a node Manager reports terminated or unreachable is kept
    /// before it is removed. A node Manager has powered off (a warm spare) keeps its object.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1s", "max": "30d"}))]
    pub remove_stopped_nodes_after: Duration,
    pub bands: BandsConfig,
    pub node_health: NodeHealthConfig,
    /// Namespaces whose Bundles are reconciled; empty means all. Each a namespace name,
    /// listed once.
    #[schemars(schema_with = "schema::namespace_list")]
    pub watch_namespaces: Vec<String>,
    /// Whether this operator does the cluster-scoped work: PlacementPool status and finalizers,
    /// HotSpareTargets and their spares, ManagerNode objects with their cordon Events and drains,
    /// and the sweep of spare nodes. Exactly one operator per Manager should; others still read
    /// pools and cordons to place their Bundles: when several operators share a Manager, each
    /// watching its own namespaces, set this to false on all but one.
    pub cluster_scope: bool,
    pub leader_election: LeaderElectionConfig,
    pub http: HttpConfig,
    pub concurrency: ConcurrencyConfig,
    /// Status writes for one object within this window are coalesced into one, so a wave of
    /// events does not become a write per event.
    #[serde(with = "duration")]
    #[schemars(schema_with = "duration::schema", extend("x-duration" = {"min": "1ms", "max": "60s"}))]
    pub status_write_interval: Duration,
    pub migration: MigrationConfig,
    pub orphan_sweep: OrphanSweepConfig,
    pub zone_brake: ZoneBrakeConfig,
    pub provisioning: ProvisioningConfig,
    pub rebalance: RebalanceConfig,
    pub disruption: DisruptionConfig,
}

impl Default for OperatorConfig {
    /// Every default; `manager.url` is empty, which validation reports as missing.
    fn default() -> Self {
        OperatorConfig {
            manager: ManagerConfig::default(),
            pending_window: Duration::from_secs(60),
            remove_stopped_nodes_after: Duration::from_secs(3600),
            bands: BandsConfig::default(),
            node_health: NodeHealthConfig::default(),
            watch_namespaces: Vec::new(),
            cluster_scope: true,
            leader_election: LeaderElectionConfig::default(),
            http: HttpConfig::default(),
            concurrency: ConcurrencyConfig::default(),
            status_write_interval: Duration::from_millis(250),
            migration: MigrationConfig::default(),
            orphan_sweep: OrphanSweepConfig::default(),
            zone_brake: ZoneBrakeConfig::default(),
            provisioning: ProvisioningConfig::default(),
            rebalance: RebalanceConfig::default(),
            disruption: DisruptionConfig::default(),
        }
    }
}

/// Settings given on the command line or in the environment; they win over the file.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfigOverrides {
    /// Manager's address, `http(s)://host:port` or `host:port` (overrides `manager.url`).
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

impl ConfigOverrides {
    /// Writes what is set into the settings document, so it is validated like the file.
    /// Returns (path, `--flag / VARIABLE`) pairs, so that an error there can name the flag.
    fn write_into(&self, doc: &mut Value) -> Vec<(&'static str, String)> {
        // (settings path, clap argument id, value)
        let mut set: Vec<(&'static str, &'static str, Value)> = Vec::new();
        if let Some(url) = &self.manager_url {
            set.push(("manager.url", "manager_url", url.as_str().into()));
        }
        if let Some(token) = &self.manager_token_file {
            let token = token.to_string_lossy().into_owned();
            set.push(("manager.tokenFile", "manager_token_file", token.into()));
        }
        if let Some(addr) = &self.http_bind_address {
            set.push(("http.bindAddress", "http_bind_address", addr.trim().into()));
        }
        if let Some(addr) = &self.http_debug_bind_address {
            set.push((
                "http.debugBindAddress",
                "http_debug_bind_address",
                addr.trim().into(),
            ));
        }
        if let Some(enabled) = self.leader_election {
            set.push(("leaderElection.enabled", "leader_election", enabled.into()));
        }
        if let Some(ns) = &self.lease_namespace {
            set.push((
                "leaderElection.leaseNamespace",
                "lease_namespace",
                ns.as_str().into(),
            ));
        }
        if !self.watch_namespaces.is_empty() {
            let names: Vec<Value> = self
                .watch_namespaces
                .iter()
                .map(|s| s.trim())
                .filter(|s| !s.is_empty())
                .map(Value::from)
                .collect();
            set.push(("watchNamespaces", "watch_namespaces", names.into()));
        }
        if let Some(w) = &self.pending_window {
            set.push(("pendingWindow", "pending_window", w.as_str().into()));
        }
        set.into_iter()
            .filter_map(|(path, id, value)| put(doc, path, value).then(|| (path, flag(id))))
            .collect()
    }
}

/// `--manager-url / AUTOMANAGER_MANAGER_URL`: how a [`ConfigOverrides`] field is given, read
/// from its clap attributes.
fn flag(id: &str) -> String {
    let command = <ConfigOverrides as clap::Args>::augment_args(clap::Command::new("operator"));
    let Some(arg) = command.get_arguments().find(|a| a.get_id() == id) else {
        return id.to_owned();
    };
    let long = arg.get_long().map(|l| format!("--{l}")).unwrap_or_default();
    match arg.get_env() {
        Some(env) => format!("{long} / {}", env.to_string_lossy()),
        None => long,
    }
}

/// Sets the dotted `path` in `doc`, making the mappings on the way; false when something
/// else is in the way (a problem the schema reports).
fn put(doc: &mut Value, path: &str, value: Value) -> bool {
    let mut keys: Vec<&str> = path.split('.').collect();
    let Some(last) = keys.pop() else {
        return false;
    };
    let mut here = doc;
    for k in keys {
        let Value::Object(m) = here else {
            return false;
        };
        here = m.entry(k).or_insert_with(|| Value::Object(Map::new()));
    }
    let Value::Object(m) = here else {
        return false;
    };
    m.insert(last.to_owned(), value);
    true
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
        Self::load_with(path, overrides, FileChecks::Check)
    }

    /// [`OperatorConfig::load`], saying whether named files must exist.
    pub fn load_with(
        path: Option<&Path>,
        overrides: &ConfigOverrides,
        files: FileChecks,
    ) -> Result<OperatorConfig, ConfigErrors> {
        let text = match path {
            Some(path) => read_limited(path)?,
            None => String::new(),
        };
        Self::load_str_with(&text, overrides, files)
    }

    /// [`OperatorConfig::load`] with the document given as a string.
    pub fn load_str(
        yaml: &str,
        overrides: &ConfigOverrides,
    ) -> Result<OperatorConfig, ConfigErrors> {
        Self::load_str_with(yaml, overrides, FileChecks::Check)
    }

    fn load_str_with(
        yaml: &str,
        overrides: &ConfigOverrides,
        files: FileChecks,
    ) -> Result<OperatorConfig, ConfigErrors> {
        if yaml.len() > MAX_CONFIG_BYTES {
            return Err(ConfigErrors::one(
                "",
                format!("the settings are larger than {MAX_CONFIG_BYTES} bytes"),
            ));
        }
        Self::from_document(parse_yaml(yaml)?, overrides, files)
    }

    /// Applies flag/environment overrides, then validates the result as a whole.
    pub fn apply_overrides(&mut self, overrides: &ConfigOverrides) -> Result<(), ConfigErrors> {
        *self = Self::from_document(self.to_document(), overrides, FileChecks::Check)?;
        Ok(())
    }

    /// Every problem of these settings (ranges, URL shape, files, contradictions); empty when
    /// valid.
    pub fn validate(&self) -> Vec<ConfigError> {
        Self::from_document(
            self.to_document(),
            &ConfigOverrides::default(),
            FileChecks::Check,
        )
        .err()
        .map(|e| e.errors)
        .unwrap_or_default()
    }

    fn to_document(&self) -> Value {
        // Cannot fail: every field serialises to a string, number, bool, list or mapping.
        serde_json::to_value(self).unwrap_or_else(|_| Value::Object(Map::new()))
    }

    /// The three stages of the module documentation.
    fn from_document(
        mut doc: Value,
        overrides: &ConfigOverrides,
        files: FileChecks,
    ) -> Result<OperatorConfig, ConfigErrors> {
        schema::normalise(&mut doc);
        if doc.is_null() {
            doc = Value::Object(Map::new());
        }
        let sources = overrides.write_into(&mut doc);
        let found = schema::validate(&doc);
        for f in &found {
            schema::drop_at(&mut doc, &f.at);
        }
        let mut errors: Vec<ConfigError> = found.into_iter().map(|f| f.error).collect();
        match serde_json::from_value::<OperatorConfig>(doc) {
            Ok(config) => {
                let reported: Vec<String> = errors.iter().map(|e| e.path.clone()).collect();
                let covered = |path: &str| {
                    reported.iter().any(|r| {
                        r.is_empty()
                            || path == r
                            || path
                                .strip_prefix(r.as_str())
                                .is_some_and(|rest| rest.starts_with(['.', '[']))
                    })
                };
                errors.extend(
                    checks::typed(&config, files)
                        .into_iter()
                        .filter(|e| !covered(&e.path)),
                );
                if errors.is_empty() {
                    return Ok(config);
                }
            }
            // The schema let through what the types refuse: a mismatch between the two, which
            // the tests guard against; still an answer rather than a panic.
            Err(e) if errors.is_empty() => errors.push(err("", e.to_string())),
            Err(_) => {}
        }
        for e in &mut errors {
            let flag = sources.iter().find(|(p, _)| {
                e.path
                    .strip_prefix(p)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
            });
            if let Some((_, flag)) = flag {
                e.message.push_str(&format!(" (set by {flag})"));
            }
        }
        Err(ConfigErrors { errors })
    }
}

fn parse_yaml(yaml: &str) -> Result<Value, ConfigErrors> {
    let options = serde_saphyr::options! {
        // YAML 1.2: `yes` and `on` are strings, as in Kubernetes manifests.
        strict_booleans: true,
        // `.nan` and `.inf` reach the schema as text, which then says what is expected there.
        non_finite_float_policy: serde_saphyr::NonFiniteFloatPolicy::AsString,
        // One line per error.
        with_snippet: false,
    };
    serde_saphyr::from_str_with_options::<Value>(yaml, options).map_err(|e| {
        let text = e.to_string();
        let message = match e.location() {
            Some(l) => {
                let at = format!("line {}, column {}", l.line(), l.column());
                let what = text.strip_suffix(&format!(" at {at}")).unwrap_or(&text);
                format!("malformed YAML at {at}: {what}")
            }
            None => format!("malformed YAML: {text}"),
        };
        ConfigErrors::one("", message)
    })
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
    /// The token file does not hold one bearer token.
    #[error("manager.tokenFile {path}: {problem}")]
    Token {
        path: PathBuf,
        problem: TokenProblem,
    },
}

/// The longest token file read: a Kubernetes service account token is 1 to 2 KiB, an OIDC
/// JWT rarely over 8 KiB; anything larger is the wrong file.
pub const MAX_TOKEN_BYTES: u64 = 16 * 1024;

/// Why a token file does not hold a usable bearer token.
#[derive(Debug, thiserror::Error)]
pub enum TokenProblem {
    #[error("cannot read it: {0}")]
    Read(#[source] std::io::Error),
    #[error("is over {MAX_TOKEN_BYTES} bytes; a bearer token is one short line")]
    TooLarge,
    #[error("is not UTF-8 text")]
    NotText,
    #[error("is empty (after trimming surrounding whitespace)")]
    Empty,
    /// CR, LF, NUL or another control character inside the token: not a valid HTTP header
    /// value, so every call would fail.
    #[error(
        "has a control character ({what}) at character {position} of the token; it must be one line of visible ASCII"
    )]
    ControlCharacter { what: String, position: usize },
    /// A character that is not visible ASCII (a space, or anything past `~`): the token rides
    /// in gRPC metadata, which carries only visible ASCII, so Manager would never see it as
    /// written and the operator would never authenticate. Only the position is told: the
    /// token is a secret.
    #[error(
        "has {what} at character {position} of the token; a token must be visible ASCII (`!` to `~`), as gRPC metadata carries it"
    )]
    NotVisibleAscii { what: String, position: usize },
}

/// Reads the bearer token at `path` as the Manager client sends it: one line, surrounding
/// whitespace (a trailing newline) trimmed. `config check` and the operator read it alike.
pub fn read_token(path: &Path) -> Result<String, TokenProblem> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TOKEN_BYTES + 1).read_to_end(&mut bytes))
        .map_err(TokenProblem::Read)?;
    if bytes.len() as u64 > MAX_TOKEN_BYTES {
        return Err(TokenProblem::TooLarge);
    }
    let text = String::from_utf8(bytes).map_err(|_| TokenProblem::NotText)?;
    let token = text.trim();
    if token.is_empty() {
        return Err(TokenProblem::Empty);
    }
    check_token(token)?;
    Ok(token.to_owned())
}

/// Refuses a token gRPC metadata cannot carry: the first offending character, by its
/// 1-based position and kind, never the token itself.
pub fn check_token(token: &str) -> Result<(), TokenProblem> {
    let Some((i, c)) = token
        .chars()
        .enumerate()
        .find(|(_, c)| !c.is_ascii_graphic())
    else {
        return Ok(());
    };
    let position = i + 1;
    if c.is_control() {
        let what = match c {
            '\r' => "CR".to_owned(),
            '\n' => "LF".to_owned(),
            '\0' => "NUL".to_owned(),
            other => format!("U+{:04X}", u32::from(other)),
        };
        return Err(TokenProblem::ControlCharacter { what, position });
    }
    // Which non-ASCII character is not told: it would be a piece of the secret.
    let what = if c == ' ' {
        "a space"
    } else {
        "a non-ASCII character"
    }
    .to_owned();
    Err(TokenProblem::NotVisibleAscii { what, position })
}

impl ManagerConfig {
    /// The URL the client connects to. A bare `host:port` (the TypeScript library's form) is
    /// a gRPC target: the address carries no scheme, and a gRPC client's credentials decide
    /// TLS. Here those are `tls`: set, `https://host:port`; not set, `http://host:port`
    /// (plaintext, as a client given no credentials connects).
    pub fn endpoint(&self) -> String {
        let url = self.url.trim().trim_end_matches('/');
        if url.contains("://") {
            url.to_owned()
        } else if self.tls.is_some() {
            format!("https://{url}")
        } else {
            format!("http://{url}")
        }
    }

    /// The `manager-client` settings: reads the token and PEM files now.
    pub fn client_config(&self) -> Result<manager_client::ClientConfig, ManagerConfigError> {
        let read = |what: &'static str, path: &Path| {
            std::fs::read(path).map_err(|source| ManagerConfigError::Read {
                what,
                path: path.to_owned(),
                source,
            })
        };
        let mut config = manager_client::ClientConfig::new(self.endpoint());
        config.connect_timeout = self.connect_timeout;
        config.request_timeout = self.request_timeout;
        config.sync_timeout = self.sync_timeout;
        config.heartbeat_interval = self.heartbeat_interval;
        config.idle_timeout = self.idle_timeout;
        if let Some(path) = &self.token_file {
            let token = read_token(path).map_err(|problem| ManagerConfigError::Token {
                path: path.clone(),
                problem,
            })?;
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

#[cfg(test)]
mod tests;
