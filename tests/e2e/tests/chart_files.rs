//! The Helm chart's files that must agree with the rest of the repository (no cluster, no
//! helm: these run with `make test`; the chart itself is exercised by `make test-install`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use automanager_e2e::install::chart_dir;
use automanager_e2e::repo_root;
use serde_json::Value;

fn yaml(path: &std::path::Path) -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn the_charts_app_version_is_the_operators_version() {
    let chart = yaml(&chart_dir().join("Chart.yaml"));
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
}

#[test]
fn the_charts_simulator_config_is_the_demos() {
    let chart = std::fs::read_to_string(chart_dir().join("files/manager-sim.yaml")).unwrap();
    let demo = std::fs::read_to_string(repo_root().join("deploy/demo/manager-sim.yaml")).unwrap();
    assert_eq!(
        chart, demo,
        "copy deploy/demo/manager-sim.yaml to deploy/helm/automanager/files/"
    );
}

/// Every key of values.yaml has a schema entry and every schema entry a value, so nothing is
/// unchecked and nothing checked is undocumented. A setting whose default follows another
/// value (`renewEvery`: two thirds of `leaseDuration`) has no value to write down: values.yaml
/// shows it as a documented, commented-out line instead.
#[test]
fn values_and_their_schema_name_the_same_keys() {
    fn commented_out(key: &str) -> bool {
        let text = std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap();
        text.lines()
            .any(|l| l.trim_start().starts_with(&format!("# {key}: ")))
    }
    fn walk(path: &str, values: &Value, schema: &Value, problems: &mut Vec<String>) {
        let Some(props) = schema["properties"].as_object() else {
            return;
        };
        if let Some(map) = values.as_object() {
            for (k, v) in map {
                let p = format!("{path}.{k}");
                match props.get(k) {
                    Some(s) => walk(&p, v, s, problems),
                    None => problems.push(format!("{p} has no schema")),
                }
            }
            for k in props
                .keys()
                .filter(|k| !map.contains_key(*k) && *k != "global" && !commented_out(k))
            {
                problems.push(format!(
                    "{path}.{k} is in the schema but not in values.yaml"
                ));
            }
        }
    }
    let values = yaml(&chart_dir().join("values.yaml"));
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let mut problems = Vec::new();
    walk("", &values, &schema, &mut problems);
    assert!(problems.is_empty(), "{problems:#?}");
}

/// values.yaml is documented key by key: every key has a comment line right above it, or is
/// part of a block (resources, bands) whose key has one.
#[test]
fn every_value_is_documented() {
    let text = std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let is_key = |l: &str| {
        let t = l.trim_start();
        !t.is_empty() && !t.starts_with('#') && !t.starts_with('-') && t.contains(':')
    };
    let commented = |i: usize| i > 0 && lines[i - 1].trim_start().starts_with('#');
    let mut undocumented = Vec::new();
    for (i, line) in lines.iter().enumerate().filter(|(_, l)| is_key(l)) {
        let nested = lines[i + 1..]
            .iter()
            .find(|n| is_key(n))
            .is_some_and(|n| indent(n) > indent(line));
        if nested {
            continue; // a group: its keys are checked one by one
        }
        // The key, or one of the blocks it sits in, has a comment right above it.
        let mut documented = commented(i);
        let mut level = indent(line);
        for j in (0..i).rev() {
            if documented || level == 0 {
                break;
            }
            if is_key(lines[j]) && indent(lines[j]) < level {
                level = indent(lines[j]);
                documented = commented(j);
            }
        }
        if !documented {
            undocumented.push(format!("line {}: {}", i + 1, line.trim()));
        }
    }
    assert!(
        undocumented.is_empty(),
        "values without a comment: {undocumented:#?}"
    );
}

/// The alerts, the dashboard and the user roles have one source each; the other place holds a
/// copy written by `make chart-files`. The alerts and the dashboard are written in deploy/ and
/// copied into the chart (a chart can read only its own files); the user roles are the chart's
/// (its aggregated roles are rendered from them) and copied out to deploy/rbac/ for
/// `kubectl apply`.
#[test]
fn the_charts_alerts_dashboard_and_user_roles_are_those_of_deploy() {
    for (in_chart, in_deploy) in [
        (
            "files/prometheus/rules.yaml",
            "deploy/prometheus/rules.yaml",
        ),
        (
            "files/grafana/automanager.json",
            "deploy/grafana/automanager.json",
        ),
        ("files/user-roles.yaml", "deploy/rbac/user-roles.yaml"),
    ] {
        let chart_text = std::fs::read_to_string(chart_dir().join(in_chart)).unwrap();
        let deploy_text = std::fs::read_to_string(repo_root().join(in_deploy)).unwrap();
        assert!(
            chart_text == deploy_text,
            "{in_chart} differs from {in_deploy}: run `make chart-files`"
        );
    }
}

/// JSON Schema has no messages of its own, so the schema says what a duration is in the one
/// message helm prints as written (a one-value `enum`). Every duration of the operator's
/// settings (`x-duration` in the generated `config` part) is listed in the hand-written
/// `allOf` entry that does so, at the same path, and every Manager timeout refers to the same
/// kind of check.
#[test]
fn every_duration_of_the_values_is_explained_when_it_is_not_one() {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
    )
    .unwrap();
    fn durations(node: &Value, path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
        if node.get("x-duration").is_some() {
            out.push(path.clone());
        }
        for (k, v) in node["properties"].as_object().into_iter().flatten() {
            path.push(k.clone());
            durations(v, path, out);
            path.pop();
        }
    }
    let mut found = Vec::new();
    durations(&schema["properties"]["config"], &mut Vec::new(), &mut found);
    assert!(found.len() >= 10, "{found:?}");
    let entry = schema["allOf"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["properties"]["config"].is_object())
        .expect("no allOf entry explains the config's durations");
    let mut missing = Vec::new();
    for path in &found {
        let at = path
            .iter()
            .fold(&entry["properties"]["config"], |n, k| &n["properties"][k]);
        if at["$ref"] != "#/definitions/duration" {
            missing.push(path.join("."));
        }
    }
    assert!(
        missing.is_empty(),
        "durations without the explanation (add them to the allOf entry of values.schema.json): {missing:?}"
    );
    for def in ["duration", "managerDuration"] {
        let reason = &schema["definitions"][def]["then"]["enum"][0];
        assert!(
            reason
                .as_str()
                .is_some_and(|r| r.starts_with("a duration: ")),
            "{def}: {reason}"
        );
    }
    for (k, v) in schema["properties"]["manager"]["properties"]
        .as_object()
        .unwrap()
    {
        if v["description"]
            .as_str()
            .is_some_and(|d| d.contains(" to "))
            && v["type"].is_array()
        {
            assert_eq!(v["$ref"], "#/definitions/managerDuration", "manager.{k}");
        }
    }
}

/// The chart's README.md is what helm-docs makes of values.yaml's comments and
/// README.md.gotmpl (`make chart-readme`).
#[test]
fn the_charts_readme_is_generated_from_its_values() {
    let tool = automanager_e2e::install::tool("helm-docs").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let chart = dir.path().join("automanager");
    std::fs::create_dir_all(&chart).unwrap();
    for f in ["Chart.yaml", "values.yaml", "README.md.gotmpl"] {
        std::fs::copy(chart_dir().join(f), chart.join(f)).unwrap();
    }
    let out = std::process::Command::new(&tool)
        .arg("--chart-search-root")
        .arg(&chart)
        .args([
            "--template-files",
            "README.md.gotmpl",
            "--skip-version-footer",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "helm-docs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let generated = std::fs::read_to_string(chart.join("README.md")).unwrap();
    let committed = std::fs::read_to_string(chart_dir().join("README.md")).unwrap_or_default();
    assert!(
        generated == committed,
        "deploy/helm/automanager/README.md is out of date: run `make chart-readme`"
    );
    // Every value is in it.
    let values: Value = yaml(&chart_dir().join("values.yaml"));
    for key in values.as_object().unwrap().keys() {
        assert!(
            generated.contains(&format!("| {key}")),
            "{key} is not in the README"
        );
    }
}
