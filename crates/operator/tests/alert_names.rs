//! The alert rules (deploy/prometheus/rules.yaml) and the Grafana dashboard
//! (deploy/grafana/automanager.json) read the operator's metrics by name: every name they use is
//! one the operator exports (checked against the registry with every family holding a series);
//! every alert groups by `namespace` (one alert per Helm release), links a runbook section that
//! exists, and has a promtool unit test that makes it fire (rules.test.yaml).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use automanager_operator::metrics::{Metrics, TierFigures};
use serde_json::Value;

fn repo() -> PathBuf {
    package_dir().join("../..")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml(path: &str) -> Value {
    serde_saphyr::from_str(&read(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every family with a series, so each writes its `# TYPE` line.
fn exported() -> BTreeSet<String> {
    let m = Metrics::new();
    m.placement_attempted();
    m.placement_succeeded();
    m.placement_failed();
    m.job_rejected();
    m.bundle_broken();
    m.job_dropped();
    m.orphan_removed("bundle");
    m.disruption_blocked("drain");
    m.involuntary_disruption("nodeLost");
    m.set_migrations_queued(1);
    m.preempted("gold", 1);
    m.rebalance_started();
    m.set_bundle_broken("video", "news", true);
    m.zone_degraded("p", "z", true);
    m.consolidation_terminated("p");
    m.consolidation_abandoned("p");
    m.set_consolidation_planned("p", Some(1));
    m.set_pool("p", 1, Some(2), 0.5);
    m.observe_reconcile("bundle", true, 0.1);
    m.observe_migration("video", "m", "Pending", Some(1.0));
    m.set_spare_tier("t", "p", "hot", TierFigures::default());
    m.warm_spare_start("p", false);
    m.set_leader(true);
    let text = m.encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
            continue;
        };
        let suffixes: &[&str] = match kind {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            _ => &[""],
        };
        for s in suffixes {
            names.insert(format!("{name}{s}"));
        }
    }
    names
}

fn metric_names(expr: &str) -> Vec<String> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("automanager_"))
        .map(str::to_owned)
        .collect()
}

fn collect_exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr" | "definition", Value::String(s)) => out.push(s.clone()),
                    (_, Value::Object(q)) if k == "query" => {
                        if let Some(Value::String(s)) = q.get("query") {
                            out.push(s.clone());
                        }
                    }
                    _ => collect_exprs(v, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

fn alerts() -> Vec<Value> {
    let rules = yaml("deploy/prometheus/rules.yaml");
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .collect()
}

#[test]
fn the_rules_and_the_dashboard_use_only_exported_names() {
    let exported = exported();
    let mut exprs: Vec<String> = alerts()
        .iter()
        .map(|r| r["expr"].as_str().unwrap().to_owned())
        .collect();
    let dashboard: Value = serde_json::from_str(&read("deploy/grafana/automanager.json")).unwrap();
    collect_exprs(&dashboard, &mut exprs);
    let used: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    let missing: Vec<&String> = used.difference(&exported).collect();
    assert!(
        missing.is_empty(),
        "used but not exported: {missing:?}\nexported: {exported:?}"
    );
    // The machinery the on-call person needs to see is on the dashboard.
    for family in [
        "automanager_zone_degraded",
        "automanager_preemptions_total",
        "automanager_consolidation_nodes_abandoned_total",
        "automanager_disruptions_blocked_total",
        "automanager_migrations_queued",
        "automanager_orphans_removed_total",
        "automanager_broken_bundle_info",
        "automanager_pool_used_capacity_ratio",
        "automanager_pool_max_nodes",
        "automanager_spares",
        "automanager_warm_spare_starts_total",
    ] {
        assert!(used.contains(family), "nothing reads {family}");
    }
    // Both spare tiers have a panel of their own on the dashboard.
    let mut panel_titles = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        let mut es = Vec::new();
        collect_exprs(&panel["targets"], &mut es);
        for tier in ["hot", "warm"] {
            if es.iter().any(|e| {
                e.contains("automanager_spares{") && e.contains(&format!("tier=\"{tier}\""))
            }) {
                panel_titles.push((tier, panel["title"].as_str().unwrap_or_default().to_owned()));
            }
        }
    }
    for tier in ["hot", "warm"] {
        assert!(
            panel_titles.iter().any(|(t, _)| *t == tier),
            "no panel shows the {tier} spares: {panel_titles:?}"
        );
    }
    // One release at a time: every dashboard query is scoped to the chosen namespace.
    let mut panel_exprs = Vec::new();
    collect_exprs(&dashboard["panels"], &mut panel_exprs);
    for e in &panel_exprs {
        for name in metric_names(e) {
            let scoped = e.contains(&format!("{name}{{namespace=~\"$namespace\""));
            assert!(scoped, "{name} is not scoped to $namespace in {e}");
        }
    }
}

#[test]
fn every_alert_is_per_release_with_a_runbook_section_and_a_firing_test() {
    let runbook = read("docs/runbook.md");
    let anchors: BTreeSet<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| {
            h.to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-')
                .collect::<String>()
                .replace(' ', "-")
        })
        .collect();
    let tests = yaml("deploy/prometheus/rules.test.yaml");
    let firing: BTreeSet<String> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().cloned().unwrap_or_default())
        .filter(|a| a["exp_alerts"].as_array().is_some_and(|x| !x.is_empty()))
        .map(|a| a["alertname"].as_str().unwrap().to_owned())
        .collect();
    let all = alerts();
    assert!(all.len() >= 14, "{} alerts", all.len());
    for rule in &all {
        let name = rule["alert"].as_str().unwrap();
        let expr = rule["expr"].as_str().unwrap();
        let per_release = expr.contains("by (namespace")
            && !expr.contains("absent(")
            && !expr.contains("without (");
        assert!(per_release, "{name} does not group by namespace: {expr}");
        let url = rule["annotations"]["runbook_url"].as_str().unwrap();
        let anchor = url.rsplit('#').next().unwrap();
        assert!(
            anchors.contains(anchor),
            "{name}: no section #{anchor} in docs/runbook.md"
        );
        assert!(
            runbook.contains(&format!("`{name}`")),
            "{name} is not in the runbook's table"
        );
        assert!(
            firing.contains(name),
            "{name} has no promtool test that makes it fire"
        );
    }
}

/// This package's directory, as cargo tells the running test: a test executable cargo finds
/// fresh may have been built in another checkout that shares the target dir, and the path
/// compiled into it would read that checkout's files.
fn package_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), Into::into)
}
