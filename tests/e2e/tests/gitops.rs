//! The GitOps files of deploy/gitops, checked without a cluster (part of `make test`):
//!
//! - the Argo CD health checks in Argo CD's own layout
//!   (`deploy/gitops/argocd/resource_customizations/<group>/<Kind>/health.lua`) pass their
//!   `health_test.yaml`, run as Argo CD runs them (tools/argo-health, gopher-lua);
//! - the Flux Kustomization's `healthCheckExprs` (CEL) read the same test objects as the Lua
//!   does (tools/flux-health, cel-go);
//! - the argocd-cm kustomization ships every script, the Argo CD Applications and Flux objects
//!   parse and point at what exists. (The slow install suite also builds the kustomizations
//!   with kubectl and dry-runs them against an apiserver.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use automanager_e2e::install::{chart_dir, documents, tool};
use automanager_e2e::repo_root;
use serde_json::Value;

const KINDS: [&str; 5] = [
    "Bundle",
    "PlacementPool",
    "HotSpareTarget",
    "Migration",
    "ManagerNode",
];

fn gitops() -> PathBuf {
    repo_root().join("deploy/gitops")
}

fn customizations() -> PathBuf {
    gitops().join("argocd/resource_customizations")
}

fn docs_of(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    documents(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs a tool and fails with everything it printed when it fails: its FAIL lines are the diff.
fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} exited {}:\n{}\n{}",
        out.status,
        stdout
            .lines()
            .filter(|l| !l.starts_with("ok "))
            .collect::<Vec<_>>()
            .join("\n"),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_argo_cd_health_checks_pass_their_health_tests() {
    let out = run_ok(
        Command::new(tool("argo-health").unwrap())
            .arg("test")
            .arg(customizations()),
    );
    // Every AutoManager kind has a script, and each was tested in more than one state.
    for kind in KINDS {
        let states: std::collections::BTreeSet<&str> = out
            .lines()
            .filter(|l| l.contains(&format!("automanager.norsk.io/{kind}/")))
            .filter_map(|l| l.split(": ").nth(1)?.split(' ').next())
            .collect();
        assert!(
            states.len() >= 2,
            "{kind} is tested only as {states:?}:\n{out}"
        );
    }
}

#[test]
fn the_flux_health_expressions_read_the_test_objects_as_argo_cd_does() {
    run_ok(
        Command::new(tool("flux-health").unwrap())
            .arg("--kustomization")
            .arg(gitops().join("flux/automanager.yaml"))
            .arg("--argo-tests")
            .arg(customizations()),
    );
}

/// The argocd-cm kustomization maps `resource.customizations.health.<group>_<Kind>` to the
/// script of exactly that directory, for every script there is.
#[test]
fn the_argocd_cm_kustomization_ships_every_health_script() {
    let k = &docs_of(&customizations().join("kustomization.yaml"))[0];
    let files: Vec<&str> = k["configMapGenerator"][0]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(k["configMapGenerator"][0]["name"], "argocd-cm");
    let mut scripts = Vec::new();
    for group in std::fs::read_dir(customizations()).unwrap() {
        let group = group.unwrap().path();
        if !group.is_dir() {
            continue;
        }
        for kind in std::fs::read_dir(&group).unwrap() {
            let kind = kind.unwrap().path();
            if kind.join("health.lua").is_file() {
                scripts.push(format!(
                    "resource.customizations.health.{}_{}={}/{}/health.lua",
                    group.file_name().unwrap().to_str().unwrap(),
                    kind.file_name().unwrap().to_str().unwrap(),
                    group.file_name().unwrap().to_str().unwrap(),
                    kind.file_name().unwrap().to_str().unwrap(),
                ));
            }
        }
    }
    let mut listed: Vec<String> = files.iter().map(|s| (*s).to_owned()).collect();
    listed.sort();
    scripts.sort();
    assert_eq!(listed, scripts);
    for kind in KINDS {
        assert!(
            scripts
                .iter()
                .any(|s| s.contains(&format!("automanager.norsk.io_{kind}="))),
            "no health check for {kind}"
        );
    }
    assert!(
        scripts
            .iter()
            .any(|s| s.contains("argoproj.io_Application=")),
        "the app of apps needs the Application health check"
    );
}

/// The app of apps: the parent syncs apps/, whose children are ordered by sync waves and
/// point at directories that exist.
#[test]
fn the_argo_cd_app_of_apps_points_at_what_exists() {
    let root = docs_of(&gitops().join("argocd/root.yaml"));
    assert_eq!(root.len(), 1);
    assert_eq!(root[0]["kind"], "Application");
    let apps_path = root[0]["spec"]["source"]["path"].as_str().unwrap();
    assert_eq!(apps_path, "deploy/gitops/argocd/apps");
    let mut children = Vec::new();
    for entry in std::fs::read_dir(repo_root().join(apps_path)).unwrap() {
        children.extend(docs_of(&entry.unwrap().path()));
    }
    let mut waves: Vec<(i64, String)> = children
        .iter()
        .map(|app| {
            assert_eq!(app["kind"], "Application");
            assert_eq!(app["metadata"]["namespace"], "argocd");
            let path = app["spec"]["source"]["path"].as_str().unwrap();
            assert!(repo_root().join(path).is_dir(), "{path}");
            let wave = app["metadata"]["annotations"]["argocd.argoproj.io/sync-wave"]
                .as_str()
                .unwrap_or_else(|| panic!("{} has no sync wave", app["metadata"]["name"]))
                .parse()
                .unwrap();
            (wave, path.to_owned())
        })
        .collect();
    waves.sort();
    assert_eq!(
        waves,
        vec![
            (0, "deploy/helm/automanager".to_owned()),
            (1, "deploy/gitops".to_owned())
        ]
    );
}

/// The Flux objects parse, are the kinds and API versions Flux serves, and point at the chart
/// and directories of this repository.
#[test]
fn the_flux_objects_point_at_the_chart_and_the_objects() {
    let flux = gitops().join("flux");
    let top = docs_of(&flux.join("automanager.yaml"));
    let operator: Vec<Value> = ["ocirepository.yaml", "helmrelease.yaml"]
        .iter()
        .flat_map(|f| docs_of(&flux.join("operator").join(f)))
        .collect();
    let all: Vec<&Value> = top.iter().chain(&operator).collect();
    let get = |kind: &str, name: &str| -> &Value {
        all.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    for d in &all {
        let want = match d["kind"].as_str().unwrap() {
            "GitRepository" | "OCIRepository" => "source.toolkit.fluxcd.io/v1",
            "Kustomization" => "kustomize.toolkit.fluxcd.io/v1",
            "HelmRelease" => "helm.toolkit.fluxcd.io/v2",
            other => panic!("unexpected kind {other}"),
        };
        assert_eq!(d["apiVersion"], want, "{}", d["metadata"]["name"]);
        assert_eq!(d["metadata"]["namespace"], "flux-system");
    }

    // The chart from an OCIRepository through `chartRef`, as Flux recommends for OCI charts: the
    // repository is the chart's (its last path element is the chart's name), at the chart's
    // version, its Helm chart layer copied as is.
    let repo = get("OCIRepository", "automanager");
    let chart: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml")).unwrap())
            .unwrap();
    let url = repo["spec"]["url"].as_str().unwrap();
    assert!(url.starts_with("oci://"), "{url}");
    assert_eq!(
        Some(url.rsplit('/').next().unwrap()),
        chart["name"].as_str()
    );
    assert_eq!(repo["spec"]["ref"]["tag"], chart["version"]);
    assert_eq!(
        repo["spec"]["layerSelector"]["mediaType"],
        "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
    );
    assert_eq!(repo["spec"]["layerSelector"]["operation"], "copy");
    let release = get("HelmRelease", "automanager");
    assert!(
        release["spec"]["chart"].is_null(),
        "the HelmRelease names its chart with chartRef only"
    );
    assert_eq!(release["spec"]["chartRef"]["kind"], "OCIRepository");
    assert_eq!(
        release["spec"]["chartRef"]["name"],
        repo["metadata"]["name"]
    );
    // The values are the chart's: every top-level key exists in its values.yaml.
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap())
            .unwrap();
    for key in release["spec"]["values"].as_object().unwrap().keys() {
        assert!(
            values.get(key).is_some(),
            "values.{key} is not a chart value"
        );
    }

    let operator_ks = get("Kustomization", "automanager-operator");
    let objects_ks = get("Kustomization", "automanager-objects");
    for ks in [operator_ks, objects_ks] {
        let path = ks["spec"]["path"].as_str().unwrap();
        assert!(repo_root().join(path).is_dir(), "{path}");
        assert_eq!(ks["spec"]["sourceRef"]["kind"], "GitRepository");
        assert_eq!(ks["spec"]["sourceRef"]["name"], "automanager");
    }
    // The operator's Kustomization applies exactly the two files above.
    let kustomization = docs_of(&flux.join("operator/kustomization.yaml"));
    assert_eq!(
        kustomization[0]["resources"],
        serde_json::json!(["ocirepository.yaml", "helmrelease.yaml"])
    );
    assert_eq!(
        operator_ks["spec"]["healthChecks"][0]["kind"],
        "HelmRelease"
    );
    assert_eq!(
        operator_ks["spec"]["healthChecks"][0]["name"],
        "automanager"
    );
    assert_eq!(
        objects_ks["spec"]["dependsOn"][0]["name"],
        operator_ks["metadata"]["name"]
    );
    assert_eq!(objects_ks["spec"]["wait"], true);
    let exprs: Vec<&str> = objects_ks["spec"]["healthCheckExprs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            assert_eq!(e["apiVersion"], "automanager.norsk.io/v1alpha1");
            e["kind"].as_str().unwrap()
        })
        .collect();
    assert_eq!(exprs, KINDS);
    // No expression reads status.conditions unguarded: each read follows a
    // `has(status.conditions) &&` in the same parenthesised term, so an object whose status has
    // no conditions yet evaluates (to false) instead of failing.
    for e in objects_ks["spec"]["healthCheckExprs"].as_array().unwrap() {
        for key in ["inProgress", "failed", "current"] {
            let expr = e[key].as_str().unwrap();
            let reads = expr.matches("status.conditions.").count();
            let guarded = expr
                .matches("has(status.conditions) && status.conditions.")
                .count();
            assert!(reads > 0, "{} {key}: {expr}", e["kind"]);
            assert_eq!(
                reads, guarded,
                "{} {key} reads status.conditions unguarded: {expr}",
                e["kind"]
            );
        }
    }
}
