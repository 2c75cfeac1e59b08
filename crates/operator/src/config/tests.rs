use std::net::SocketAddr;

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
    assert_eq!(c.manager.sync_timeout, d(30));
    assert_eq!(c.manager.heartbeat_interval, d(5));
    assert_eq!(c.manager.idle_timeout, d(15));
    assert_eq!(c.manager.readiness_grace, d(30));
    assert_eq!(c.pending_window, d(60));
    assert_eq!(c.remove_stopped_nodes_after, d(3600));
    assert_eq!(
        c.bands.gold,
        BandConfig {
            on_failure: OnFailure::Restart,
            restart_placement: RestartPlacement::PreferHotSpare,
            max_restarts_per_hour: 6,
            restart_clear_after: d(600),
            clear_restarts_on: ClearRestartsOn::StableRunning,
            preempt: false,
            disruption_windows: Vec::new(),
        }
    );
    assert_eq!(
        c.bands.silver,
        BandConfig {
            on_failure: OnFailure::Restart,
            restart_placement: RestartPlacement::Any,
            max_restarts_per_hour: 6,
            restart_clear_after: d(600),
            clear_restarts_on: ClearRestartsOn::StableRunning,
            preempt: false,
            disruption_windows: Vec::new(),
        }
    );
    assert_eq!(c.bands.bronze.on_failure, OnFailure::Drop);
    assert_eq!(c.bands.bronze.restart_clear_after, d(600));
    assert!(!c.bands.bronze.preempt);
    assert_eq!(
        c.node_health,
        NodeHealthConfig {
            rejection_threshold: 5,
            rejection_window: d(60),
            flap_max_hold: d(1800),
            flap_memory: d(3600),
        }
    );
    assert_eq!(
        c.zone_brake,
        ZoneBrakeConfig {
            enabled: true,
            lost_percent: 50,
            window: d(300),
            min_lost_nodes: 3,
        }
    );
    assert_eq!(c.provisioning.per_pool_per_minute, 60);
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
            max_parallel: 5,
            max_parallel_per_node: 2,
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
  syncTimeout: 2m
  heartbeatInterval: 500ms
  idleTimeout: 4s
  readinessGrace: 0
pendingWindow: 90
removeStoppedNodesAfter: 2h
bands:
  gold: {{ onFailure: drop, restartPlacement: any, maxRestartsPerHour: 3, restartClearAfter: 30m }}
  silver: {{ restartPlacement: preferHotSpare, restartClearAfter: 45 }}
  bronze: {{ onFailure: restart }}
nodeHealth: {{ rejectionThreshold: 9, rejectionWindow: 30s }}
watchNamespaces: [video, staging]
leaderElection: {{ enabled: false, leaseName: am.lock, leaseNamespace: ops, leaseDuration: 20, renewEvery: 5s }}
http: {{ bindAddress: "0.0.0.0:9090" }}
concurrency: {{ bundles: 32 }}
statusWriteInterval: 500ms
migration: {{ drainParallelism: 4, maxParallel: 20, maxParallelPerNode: 3, phaseTimeout: 2m }}
"#
    );
    let c = ok(&yaml);
    assert_eq!(c.manager.token_file, Some(PathBuf::from(&token)));
    let tls = c.manager.tls.clone().unwrap_or_else(|| panic!("tls"));
    assert_eq!(tls.domain.as_deref(), Some("manager.internal"));
    assert_eq!(tls.cert_file, Some(PathBuf::from(&cert)));
    assert_eq!(c.manager.request_timeout, Duration::from_secs(60));
    assert_eq!(c.manager.sync_timeout, Duration::from_secs(120));
    assert_eq!(c.manager.heartbeat_interval, Duration::from_millis(500));
    assert_eq!(c.manager.idle_timeout, Duration::from_secs(4));
    assert_eq!(c.manager.readiness_grace, Duration::ZERO);
    let client = c.manager.client_config().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (
            client.sync_timeout,
            client.heartbeat_interval,
            client.idle_timeout
        ),
        (
            Duration::from_secs(120),
            Duration::from_millis(500),
            Duration::from_secs(4)
        )
    );
    assert_eq!(c.pending_window, Duration::from_secs(90));
    assert_eq!(c.remove_stopped_nodes_after, Duration::from_secs(7200));
    assert_eq!(c.bands.gold.on_failure, OnFailure::Drop);
    assert_eq!(c.bands.gold.max_restarts_per_hour, 3);
    assert_eq!(c.bands.gold.restart_clear_after, Duration::from_secs(1800));
    assert_eq!(c.bands.silver.restart_clear_after, Duration::from_secs(45));
    assert_eq!(c.bands.bronze.restart_clear_after, Duration::from_secs(600));
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
    assert_eq!(
        (c.migration.max_parallel, c.migration.max_parallel_per_node),
        (20, 3)
    );
    assert_eq!(c.migration.phase_timeout, Duration::from_secs(120));
    // What was read is written back and read again unchanged, and still valid.
    assert_eq!(c.validate(), Vec::new());
    let mut again = c.clone();
    assert_eq!(again.apply_overrides(&ConfigOverrides::default()), Ok(()));
    assert_eq!(again, c);
}

#[test]
fn the_demo_config_is_valid() {
    let text = include_str!("../../../../config/demo-operator.yaml");
    let c = ok(text);
    assert_eq!(c.manager.url, "http://127.0.0.1:6789");
}

#[test]
fn the_documented_example_is_valid_but_for_its_secret_files() {
    let doc = include_str!("../../../../docs/operator-config.md");
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
    let doc = include_str!("../../../../docs/operator-config.md");
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
        // humantime also reads decimals, spaces and long unit names.
        ("\"1.5s\"", 1_500),
        ("\"1 s\"", 1_000),
        ("\"30s 500ms\"", 30_500),
        ("2 seconds", 2_000),
    ];
    for (v, ms) in cases {
        let c = ok(&format!("{URL}statusWriteInterval: {v}\n"));
        assert_eq!(c.status_write_interval, Duration::from_millis(ms), "{v}");
    }
    let c = ok(&format!(
        "{URL}pendingWindow: 1d\nremoveStoppedNodesAfter: 1h30m\n"
    ));
    assert_eq!(c.pending_window, Duration::from_secs(86_400));
    assert_eq!(c.remove_stopped_nodes_after, Duration::from_secs(5_400));
}

#[test]
fn malformed_durations_are_reported_with_the_accepted_forms() {
    for v in [
        "\"60x\"", "\"s\"", "\"\"", "[1]", "true", "{a: 1}", ".nan", ".inf", "\"1h x\"",
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
    // Beyond u64 the YAML parser reads a float, still too long.
    let e = errors(&format!(
        "{URL}pendingWindow: 999999999999999999999999999\n"
    ));
    assert!(
        error_at(&e, "pendingWindow").message.contains("too long"),
        "{e}"
    );
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
    assert_eq!(
        error_at(&e, "bands.gold.maxRestartsPerHour").message,
        "must be between 1 and 1000 (got 4294967296)"
    );
    let e = errors(&format!("{URL}concurrency: {{ bundles: 70000 }}\n"));
    assert_eq!(
        error_at(&e, "concurrency.bundles").message,
        "must be between 1 and 1024 (got 70000)"
    );
    let e = errors(&format!("{URL}concurrency: {{ bundles: 2.5 }}\n"));
    assert_eq!(
        error_at(&e, "concurrency.bundles").message,
        "must be a whole number, not 2.5"
    );
    // 2.0 is the whole number 2.
    assert_eq!(
        ok(&format!("{URL}concurrency: {{ bundles: 2.0 }}\n"))
            .concurrency
            .bundles,
        2
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
fn watch_deadlines_are_bounded_and_the_idle_timeout_outlasts_the_heartbeat() {
    let e = errors(&format!(
        "{URL}  syncTimeout: 0\n  heartbeatInterval: 10ms\n  idleTimeout: 2d\n  readinessGrace: 2h\n"
    ));
    for p in [
        "manager.syncTimeout",
        "manager.heartbeatInterval",
        "manager.idleTimeout",
        "manager.readinessGrace",
    ] {
        assert!(e.has(p), "{p}: {e}");
    }
    let e = errors(&format!("{URL}  heartbeatInterval: 20s\n"));
    assert_eq!(
        error_at(&e, "manager.idleTimeout").message,
        "must be longer than manager.heartbeatInterval (20s), or every quiet Watch stream is cut"
    );
    ok(&format!(
        "{URL}  heartbeatInterval: 20s\n  idleTimeout: 1m\n"
    ));
}

#[test]
fn band_disruption_windows_read_as_a_bundles_and_default_to_none() {
    assert!(ok(URL).bands.gold.disruption_windows.is_empty());
    let c = ok(&format!(
        "{URL}bands:\n  silver:\n    disruptionWindows:\n      - {{ schedule: '0 2 * * SAT', duration: 5h30m, timeZone: Europe/Oslo, reasons: [consolidation, drain] }}\n      - {{ schedule: '@daily', duration: 1m }}\n"
    ));
    let w = &c.bands.silver.disruption_windows;
    assert_eq!(w.len(), 2);
    assert_eq!(
        w[0],
        BandWindow {
            schedule: "0 2 * * SAT".into(),
            duration: "5h30m".into(),
            time_zone: "Europe/Oslo".into(),
            reasons: vec![VoluntaryReason::Consolidation, VoluntaryReason::Drain],
        }
    );
    assert_eq!(w[1].time_zone, "UTC");
    let cal = band_calendar(w).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cal.windows().len(), 2);
    assert!(c.bands.gold.disruption_windows.is_empty());
    // The settings written back read the same (what `validate` and the flags go through).
    assert!(c.validate().is_empty(), "{:?}", c.validate());
}

#[test]
fn a_bad_band_window_is_refused_at_its_key_path() {
    let at = |window: &str| {
        errors(&format!(
            "{URL}bands: {{ gold: {{ disruptionWindows: [ {window} ] }} }}\n"
        ))
    };
    let cases: &[(&str, &str, &str)] = &[
        (
            "{ schedule: '0 2 * *', duration: 2h }",
            "bands.gold.disruptionWindows[0].schedule",
            "is not a five-field cron pattern",
        ),
        (
            "{ schedule: '0 0 31 2 *', duration: 2h }",
            "bands.gold.disruptionWindows[0].schedule",
            "never matches",
        ),
        (
            "{ schedule: '@daily', duration: 2h, timeZone: Europe/Olso }",
            "bands.gold.disruptionWindows[0].timeZone",
            "is not an IANA time zone name",
        ),
        (
            "{ schedule: '@daily', duration: 30s }",
            "bands.gold.disruptionWindows[0].duration",
            "shorter than the 1m minimum",
        ),
        (
            "{ schedule: '@daily', duration: 745h }",
            "bands.gold.disruptionWindows[0].duration",
            "longer than 31 days (744h)",
        ),
        (
            "{ schedule: '@daily', duration: 1d }",
            "bands.gold.disruptionWindows[0].duration",
            "a Go duration such as 2h",
        ),
        (
            "{ schedule: '@daily', duration: 2h, reasons: [drian] }",
            "bands.gold.disruptionWindows[0].reasons[0]",
            "must be one of drain, consolidation, rebalance, spareRotation, not `drian`",
        ),
        (
            "{ schedule: '@daily', duration: 2h, reasons: [drain, rebalance, drain] }",
            "bands.gold.disruptionWindows[0].reasons[2]",
            "`drain` is listed twice",
        ),
        (
            "{ duration: 2h }",
            "bands.gold.disruptionWindows[0].schedule",
            "is required",
        ),
        (
            "{ schedule: '@daily', duration: 2h, timezone: UTC }",
            "bands.gold.disruptionWindows[0].timezone",
            "unknown key",
        ),
    ];
    for (window, path, want) in cases {
        let e = at(window);
        let found = error_at(&e, path);
        assert!(
            found.message.contains(want),
            "{window}: {path}: {}",
            found.message
        );
    }
    assert_eq!(
        error_at(
            &at("{ schedule: '@daily', duration: 2h, reasons: [spareRotaton] }"),
            "bands.gold.disruptionWindows[0].reasons[0]"
        )
        .suggestion
        .as_deref(),
        Some("spareRotation")
    );
    assert_eq!(
        error_at(
            &at("{ schedule: '@daily', duration: 2h, timezone: UTC }"),
            "bands.gold.disruptionWindows[0].timezone"
        )
        .suggestion
        .as_deref(),
        Some("timeZone")
    );
    // A bad window does not hide the other problems of the file.
    let e = errors(&format!(
        "{URL}bands: {{ gold: {{ maxRestartsPerHour: 0, disruptionWindows: [ {{ schedule: nope, duration: 2h }} ] }}, bronze: {{ preempt: true }} }}\n"
    ));
    assert!(e.has("bands.gold.maxRestartsPerHour"), "{e}");
    assert!(e.has("bands.gold.disruptionWindows[0].schedule"), "{e}");
    assert!(e.has("bands.bronze.preempt"), "{e}");
    let many = (0..17)
        .map(|_| "{ schedule: '@daily', duration: 2h }")
        .collect::<Vec<_>>()
        .join(", ");
    assert!(at(&many).has("bands.gold.disruptionWindows"));
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
fn migration_queue_limits_are_bounded_and_per_node_fits_the_fleet() {
    let e = errors(&format!(
        "{URL}migration: {{ maxParallel: 0, maxParallelPerNode: 65 }}\n"
    ));
    assert_eq!(
        error_at(&e, "migration.maxParallel").message,
        "must be between 1 and 1000 (got 0)"
    );
    assert!(e.has("migration.maxParallelPerNode"));
    let e = errors(&format!(
        "{URL}migration: {{ maxParallel: 2, maxParallelPerNode: 3 }}\n"
    ));
    assert_eq!(
        error_at(&e, "migration.maxParallelPerNode").message,
        "must not exceed migration.maxParallel (2): no node can take part in more migrations than run in the whole fleet"
    );
    let e = errors(&format!("{URL}migration: {{ maxParallel: -1 }}\n"));
    assert!(e.has("migration.maxParallel"), "{e}");
    let e = errors(&format!("{URL}migration: {{ maxParallel: many }}\n"));
    assert!(e.has("migration.maxParallel"), "{e}");
    let c = ok(&format!(
        "{URL}migration: {{ maxParallel: 1, maxParallelPerNode: 1 }}\n"
    ));
    assert_eq!(c.migration.max_parallel, 1);
}

#[test]
fn the_zone_brake_and_provisioning_rate_are_bounded() {
    let e = errors(&format!(
        "{URL}zoneBrake: {{ lostPercent: 0, minLostNodes: 0, window: 0s }}\nprovisioning: {{ perPoolPerMinute: 0 }}\n"
    ));
    assert_eq!(
        error_at(&e, "zoneBrake.lostPercent").message,
        "must be between 1 and 100 (got 0)"
    );
    assert!(e.has("zoneBrake.minLostNodes"));
    assert!(e.has("zoneBrake.window"));
    assert!(e.has("provisioning.perPoolPerMinute"));
    let e = errors(&format!(
        "{URL}zoneBrake: {{ lostPercent: 101, enabld: true }}\n"
    ));
    assert!(e.has("zoneBrake.lostPercent"));
    assert_eq!(
        error_at(&e, "zoneBrake.enabld").suggestion.as_deref(),
        Some("enabled")
    );
    let c = ok(&format!(
        "{URL}zoneBrake: {{ enabled: false, lostPercent: 30, window: 90s, minLostNodes: 10 }}\nprovisioning: {{ perPoolPerMinute: 5 }}\n"
    ));
    let s = crate::settings::Settings::from_config(&c);
    assert_eq!(s.zone_brake, None, "off means no brake");
    assert_eq!(s.provision_per_minute, 5);
    let c = ok(&format!(
        "{URL}zoneBrake: {{ lostPercent: 30, window: 90s }}\n"
    ));
    let b = crate::settings::Settings::from_config(&c)
        .zone_brake
        .unwrap_or_else(|| panic!("on by default"));
    assert!((b.lost_fraction - 0.3).abs() < 1e-9);
    assert_eq!(b.window, chrono::TimeDelta::seconds(90));
}

#[test]
fn a_flap_hold_shorter_than_the_rejection_window_is_refused() {
    let e = errors(&format!(
        "{URL}nodeHealth: {{ rejectionWindow: 120s, flapMaxHold: 60s }}\n"
    ));
    assert_eq!(
        error_at(&e, "nodeHealth.flapMaxHold").message,
        "must be at least nodeHealth.rejectionWindow (120s): the first hold-out of an unhealthy node is the rejection window"
    );
    let c = ok(&format!(
        "{URL}nodeHealth: {{ rejectionWindow: 30s, flapMaxHold: 10m, flapMemory: 2h }}\n"
    ));
    let s = crate::settings::Settings::from_config(&c);
    assert_eq!(s.flap.max_hold, Duration::from_secs(600));
    assert_eq!(s.flap.memory, Duration::from_secs(7200));
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
        "manager: { url: \"localhost:6789/v1\" }\npendingWindow: -1\nbands: { gold: { maxRestartsPerHour: 0 } }\nfoo: 1\nleaderElection: { leaseName: Not_A_Name }\nmigration: { drainParallelism: 0 }\n",
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
    assert!(
        error_at(&e, "http.bindAddress")
            .message
            .contains("(set by --http-bind-address / AUTOMANAGER_HTTP_BIND_ADDRESS)"),
        "{e}"
    );
    assert!(
        error_at(&e, "pendingWindow")
            .message
            .contains("--pending-window"),
        "{e}"
    );
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
        Err(ManagerConfigError::Token {
            problem: TokenProblem::Empty,
            ..
        })
    ));
}

#[test]
fn a_token_file_is_checked_as_the_operator_reads_it() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let token = dir.path().join("token");
    let config = format!(
        "manager: {{ url: \"http://h:1\", tokenFile: {} }}\n",
        token.display()
    );
    // (what the file holds, what the check says)
    let cases: [(&[u8], &str); 6] = [
        (&[b'a'; 5 * 1024 * 1024], "is over 16384 bytes"),
        (b"abc\r\ndef\n", "control character (CR)"),
        (b"abc\ndef", "control character (LF)"),
        (b"abc\0def", "control character (NUL)"),
        (&[0xff, 0xfe, b'a'], "is not UTF-8"),
        (b" \n\t\n", "is empty"),
    ];
    for (contents, says) in cases {
        std::fs::write(&token, contents).unwrap_or_else(|e| panic!("{e}"));
        let e = errors(&config);
        let message = &error_at(&e, "manager.tokenFile").message;
        assert!(message.contains(says), "{says}: {message}");
        // The operator refuses the same file the same way, and connects with nothing.
        let mut c = ok(URL);
        c.manager.token_file = Some(token.clone());
        let refused = c.manager.client_config().err().map(|e| e.to_string());
        assert!(
            refused.as_deref().is_some_and(|r| r.contains(says)),
            "{says}: {refused:?}"
        );
    }
    // Not visible ASCII: refused by position, and the token is never shown.
    let cases: [(&str, &str); 4] = [
        (
            "s3cr\u{e9}t-token\n",
            "has a non-ASCII character at character 5 of the token",
        ),
        ("s3cret token\n", "has a space at character 7 of the token"),
        (
            "\u{2003}s3cret\u{2003}\u{200b}x",
            "has a non-ASCII character at character 7",
        ),
        ("s3cret\u{7f}", "control character (U+007F) at character 7"),
    ];
    for (contents, says) in cases {
        std::fs::write(&token, contents).unwrap_or_else(|e| panic!("{e}"));
        let e = errors(&config);
        let message = &error_at(&e, "manager.tokenFile").message;
        assert!(message.contains(says), "{says}: {message}");
        assert!(message.contains("visible ASCII"), "{message}");
        assert!(
            !message.contains("s3cr"),
            "the secret is not echoed: {message}"
        );
        let mut c = ok(URL);
        c.manager.token_file = Some(token.clone());
        let refused = c.manager.client_config().err().map(|e| e.to_string());
        assert!(
            refused
                .as_deref()
                .is_some_and(|r| r.contains(says) && r.starts_with("manager.tokenFile ")),
            "{says}: {refused:?}"
        );
        assert!(!refused.unwrap_or_default().contains("s3cr"));
    }
    // A token and its trailing newline, as `kubectl create token > file` writes it, is fine.
    std::fs::write(&token, "eyJhbGciOi.payload.sig\n").unwrap_or_else(|e| panic!("{e}"));
    ok(&config);
}

#[test]
fn the_printed_error_list_is_bounded_and_counts_the_rest() {
    let mut yaml = String::from(URL);
    for i in 0..5_000 {
        yaml.push_str(&format!("unknownKey{i}: 1\n"));
    }
    let e = errors(&yaml);
    assert!(e.errors.len() > MAX_SHOWN_ERRORS, "{}", e.errors.len());
    let printed = e.to_string();
    let lines: Vec<&str> = printed.lines().collect();
    assert_eq!(lines.len(), MAX_SHOWN_ERRORS + 1, "{printed}");
    assert_eq!(
        lines[MAX_SHOWN_ERRORS],
        format!("... and {} more", e.errors.len() - MAX_SHOWN_ERRORS)
    );
    assert!(printed.len() < 64 * 1024, "{} bytes printed", printed.len());
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
    // No Bundle field overrides how long a restart must run to clear the count.
    assert_eq!(g.restart_clear_after, bands.gold.restart_clear_after);
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
fn restart_clear_after_is_per_band_bounded_and_reaches_the_settings() {
    let c = ok(&format!(
        "{URL}bands: {{ gold: {{ restartClearAfter: 2m }}, bronze: {{ restartClearAfter: 90 }} }}\n"
    ));
    assert_eq!(c.bands.gold.restart_clear_after, Duration::from_secs(120));
    assert_eq!(c.bands.silver.restart_clear_after, Duration::from_secs(600));
    assert_eq!(c.bands.bronze.restart_clear_after, Duration::from_secs(90));
    let settings = crate::settings::Settings::from_config(&c);
    assert_eq!(
        settings.band(PriorityBand::Gold, None).restart_clear_after,
        Duration::from_secs(120)
    );
    let e = errors(&format!(
        "{URL}bands: {{ silver: {{ restartClearAfter: 0 }}, gold: {{ restartClearAfter: 2d }} }}\n"
    ));
    assert_eq!(
        error_at(&e, "bands.silver.restartClearAfter").message,
        "must be between 1s and 86400s (got 0s)"
    );
    assert!(e.has("bands.gold.restartClearAfter"));
}

#[test]
fn clear_restarts_on_selects_the_librarys_rule_per_band_and_ours_is_the_default() {
    let c = ok(&format!(
        "{URL}bands: {{ silver: {{ clearRestartsOn: successfulRestart }} }}\n"
    ));
    assert_eq!(
        c.bands.silver.clear_restarts_on,
        ClearRestartsOn::SuccessfulRestart
    );
    assert_eq!(
        c.bands.gold.clear_restarts_on,
        ClearRestartsOn::StableRunning
    );
    let settings = crate::settings::Settings::from_config(&c);
    let o = BandOverrides {
        silver: Some(BandPolicy {
            max_restarts_per_hour: Some(2),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert_eq!(
        settings
            .band(PriorityBand::Silver, Some(&o))
            .clear_restarts_on,
        ClearRestartsOn::SuccessfulRestart,
        "a Bundle's overrides keep the band's rule"
    );
    let e = errors(&format!(
        "{URL}bands: {{ gold: {{ clearRestartsOn: onSuccess }} }}\n"
    ));
    let message = &error_at(&e, "bands.gold.clearRestartsOn").message;
    assert!(
        message.contains("stableRunning") && message.contains("successfulRestart"),
        "{message}"
    );
}

/// The TypeScript library's README writes `url: "manager.example.com:6789"`: a gRPC target
/// with no scheme. It is accepted; as for a gRPC client, the credentials decide TLS: plaintext
/// without `manager.tls`, TLS with it.
#[test]
fn the_librarys_bare_host_and_port_is_accepted_plaintext_unless_tls_is_set() {
    let c = ok("manager: { url: \"manager.example.com:6789\" }\n");
    assert_eq!(c.manager.endpoint(), "http://manager.example.com:6789");
    let cc = c.manager.client_config().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cc.endpoint, "http://manager.example.com:6789");

    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "pem").unwrap_or_else(|e| panic!("{e}"));
    let c = ok(&format!(
        "manager: {{ url: \"manager.example.com:6789\", tls: {{ caFile: {} }} }}\n",
        ca.display()
    ));
    assert_eq!(c.manager.endpoint(), "https://manager.example.com:6789");
    let cc = c.manager.client_config().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cc.endpoint, "https://manager.example.com:6789");

    // A URL with a scheme is taken as written.
    assert_eq!(ok(URL).manager.endpoint(), "http://127.0.0.1:6789");
    assert_eq!(
        ok("manager: { url: \"http://10.1.2.3:6789/\" }\n")
            .manager
            .endpoint(),
        "http://10.1.2.3:6789"
    );
    // Still a host and a port.
    let e = errors("manager: { url: \"manager.example.com\" }\n");
    assert!(error_at(&e, "manager.url").message.contains("port"), "{e}");
}

#[test]
fn named_files_may_go_unchecked() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let p = dir.path().join("c.yaml");
    let yaml = "manager: { url: \"https://h:1\", tokenFile: /nonexistent/t, tls: { caFile: /nonexistent/ca } }\n";
    std::fs::write(&p, yaml).unwrap_or_else(|e| panic!("{e}"));
    let e = OperatorConfig::from_file(&p).err();
    assert!(e.is_some_and(|e| e.has("manager.tokenFile") && e.has("manager.tls.caFile")));
    let c = OperatorConfig::load_with(Some(&p), &ConfigOverrides::default(), FileChecks::Skip)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.manager.token_file, Some(PathBuf::from("/nonexistent/t")));
    // Everything else is still checked.
    std::fs::write(&p, "manager: { url: \"https://h:1\" }\n").unwrap_or_else(|e| panic!("{e}"));
    let e =
        OperatorConfig::load_with(Some(&p), &ConfigOverrides::default(), FileChecks::Skip).err();
    assert!(e.is_some_and(|e| e.has("manager.tls.caFile")));
}

#[test]
fn settings_built_in_code_are_validated_like_a_file() {
    let mut c = OperatorConfig::default();
    assert!(c.validate().iter().any(|e| e.path == "manager.url"));
    c.manager.url = "http://h:1".into();
    assert_eq!(c.validate(), Vec::new());
    c.concurrency.bundles = 0;
    c.pending_window = Duration::ZERO;
    c.watch_namespaces = vec!["a".into(), "a".into()];
    let paths: Vec<String> = c.validate().into_iter().map(|e| e.path).collect();
    assert_eq!(
        paths
            .iter()
            .filter(
                |p| ["concurrency.bundles", "pendingWindow", "watchNamespaces[1]"]
                    .contains(&p.as_str())
            )
            .count(),
        3,
        "{paths:?}"
    );
}

#[test]
fn tagged_anchored_and_duplicated_yaml() {
    // Anchors and tags are YAML; a repeated key is an error with its place.
    let c = ok(&format!(
        "{URL}pendingWindow: &w 90\nremoveStoppedNodesAfter: *w\nstatusWriteInterval: !!str 1s\n"
    ));
    assert_eq!(c.remove_stopped_nodes_after, Duration::from_secs(90));
    let e = errors(&format!("{URL}pendingWindow: 1\npendingWindow: 2\n"));
    assert_eq!(e.errors.len(), 1);
    assert!(e.errors[0].message.contains("line 4, column 1"), "{e}");
    // `yes` is a string in YAML 1.2, so not a boolean here.
    let e = errors(&format!("{URL}leaderElection: {{ enabled: yes }}\n"));
    assert!(e.has("leaderElection.enabled"));
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

        /// Any settings in range pass the schema and the types alike, and are written back
        /// and read again unchanged.
        #[test]
        fn settings_in_range_round_trip(
            pending_ms in 1_000u64..=86_400_000,
            interval_ms in 1u64..=60_000,
            clear_s in 1u64..=86_400,
            restarts in 1u32..=1000,
            bundles in 1u16..=1024,
            lease in 3u64..=600,
            port in 1u16..,
            names in proptest::collection::btree_set("[a-z][a-z0-9-]{0,10}[a-z0-9]", 0..5),
        ) {
            let mut c = OperatorConfig::default();
            c.manager.url = format!("http://manager:{port}");
            c.pending_window = Duration::from_millis(pending_ms);
            c.status_write_interval = Duration::from_millis(interval_ms);
            c.bands.silver.restart_clear_after = Duration::from_secs(clear_s);
            c.bands.bronze.max_restarts_per_hour = restarts;
            c.concurrency.bundles = bundles;
            c.leader_election.lease_duration = Duration::from_secs(lease);
            c.watch_namespaces = names.into_iter().collect();
            prop_assert_eq!(c.validate(), Vec::new());
            let mut again = c.clone();
            prop_assert_eq!(again.apply_overrides(&ConfigOverrides::default()), Ok(()));
            prop_assert_eq!(again, c);
        }

        #[test]
        fn whole_seconds_round_trip_through_both_forms(n in 1u64..86_400) {
            let a = OperatorConfig::from_yaml_str(&format!("{URL}pendingWindow: {n}\n"));
            let b = OperatorConfig::from_yaml_str(&format!("{URL}pendingWindow: \"{n}s\"\n"));
            prop_assert_eq!(a.map(|c| c.pending_window), b.map(|c| c.pending_window));
        }
    }
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
}

#[test]
fn preemption_is_off_by_default_opt_in_per_band_and_never_for_bronze() {
    let c = ok(URL);
    assert!(!c.bands.gold.preempt && !c.bands.silver.preempt && !c.bands.bronze.preempt);
    let c = ok(&format!("{URL}bands: {{ gold: {{ preempt: true }} }}\n"));
    assert!(c.bands.gold.preempt);
    assert!(!c.bands.silver.preempt);
    let e = errors(&format!("{URL}bands: {{ bronze: {{ preempt: true }} }}\n"));
    assert!(
        error_at(&e, "bands.bronze.preempt")
            .message
            .contains("must be false"),
        "{e}"
    );
    let e = errors(&format!(
        "{URL}bands: {{ silver: {{ preempt: sometimes }} }}\n"
    ));
    assert!(e.has("bands.silver.preempt"), "{e}");
}

#[test]
fn the_rebalance_rate_is_bounded() {
    assert_eq!(ok(URL).rebalance.max_per_minute, 6);
    assert_eq!(
        ok(&format!("{URL}rebalance: {{ maxPerMinute: 30 }}\n"))
            .rebalance
            .max_per_minute,
        30
    );
    let e = errors(&format!("{URL}rebalance: {{ maxPerMinute: 0 }}\n"));
    assert_eq!(
        error_at(&e, "rebalance.maxPerMinute").message,
        "must be between 1 and 1000 (got 0)"
    );
    let e = errors(&format!("{URL}rebalance: {{ maxPerMinute: many }}\n"));
    assert!(e.has("rebalance.maxPerMinute"), "{e}");
    let e = errors(&format!("{URL}rebalance: {{ maxPerMinut: 3 }}\n"));
    assert!(e.has("rebalance.maxPerMinut"), "{e}");
}

#[test]
fn the_hold_bound_is_a_duration_between_a_second_and_a_week() {
    assert_eq!(
        ok(URL).disruption.hold_warn_after,
        Duration::from_secs(30 * 60)
    );
    assert_eq!(
        ok(&format!("{URL}disruption: {{ holdWarnAfter: 2h }}\n"))
            .disruption
            .hold_warn_after,
        Duration::from_secs(7200)
    );
    for (bad, says) in [
        ("0s", "must be between 1s and 604800s (got 0s)"),
        ("8d", "must be between 1s and 604800s (got 691200s)"),
    ] {
        let e = errors(&format!("{URL}disruption: {{ holdWarnAfter: {bad} }}\n"));
        assert_eq!(error_at(&e, "disruption.holdWarnAfter").message, says);
    }
    let e = errors(&format!("{URL}disruption: {{ holdWarnAfter: soon }}\n"));
    assert!(
        error_at(&e, "disruption.holdWarnAfter")
            .message
            .starts_with("must be a duration"),
        "{e}"
    );
    let e = errors(&format!("{URL}disruption: {{ holdWarnAftr: 1h }}\n"));
    assert_eq!(
        error_at(&e, "disruption.holdWarnAftr")
            .suggestion
            .as_deref(),
        Some("holdWarnAfter")
    );
}
