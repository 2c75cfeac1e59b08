//! The GitOps files of deploy/gitops, checked without a cluster (part of `make test`):
//!
//! - the Argo CD health checks in Argo CD's own layout
//!   (`deploy/gitops/argocd/resource_customizations/<group>/<Kind>/health.lua`) pass their
//!   `health_test.yaml`, run as Argo CD runs them (tools/argo-health, gopher-lua);
//! - the real kstatus library (tools/kstatus, cli-utils), which is how Flux reads our objects
//!   (the Flux Kustomization has no `healthCheckExprs`), reads the same test objects as the Lua
//!   does, and never calls a state the operator reaches by design (jobs a band dropped, a
//!   Manager outage) Failed; the fixtures of those states carry the conditions the policy
//!   writes;
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

/// Every test object of our kinds, with the Argo CD health its test expects, by its path.
fn argo_test_objects() -> Vec<(String, Value, String)> {
    let mut out = Vec::new();
    let group = customizations().join("automanager.norsk.io");
    for kind in KINDS {
        let dir = group.join(kind);
        for t in docs_of(&dir.join("health_test.yaml"))[0]["tests"]
            .as_array()
            .unwrap()
        {
            let input = t["inputPath"].as_str().unwrap();
            let obj = docs_of(&dir.join(input)).remove(0);
            let health = t["healthStatus"]["status"].as_str().unwrap().to_owned();
            out.push((format!("{kind}/{input}"), obj, health));
        }
    }
    out
}

/// Whether the object is in a state the operator reaches by design, not by a fault: jobs a band
/// dropped on purpose (a `Degraded` condition, reason `JobsDropped`), or Manager unreachable.
fn by_design(obj: &Value) -> Option<&'static str> {
    let conditions = obj["status"]["conditions"].as_array()?;
    if conditions
        .iter()
        .any(|c| c["type"] == "Degraded" && c["status"] == "True" && c["reason"] == "JobsDropped")
    {
        return Some("jobs dropped by their band");
    }
    conditions
        .iter()
        .any(|c| c["reason"] == "ManagerUnavailable")
        .then_some("Manager unreachable")
}

/// The figures the summary line asks for, from kstatus' verdicts on by-design states:
/// how many read Failed (must be 0), and whether a Flux `wait: true` would ride out a Manager
/// outage (no object in one reads Failed: Flux waits on InProgress and fails on Failed).
fn by_design_figures(judged: &[(&Value, &str)]) -> (usize, bool) {
    let failed = judged
        .iter()
        .filter(|(o, k)| by_design(o).is_some() && *k == "Failed")
        .count();
    let blip_green = judged
        .iter()
        .filter(|(o, _)| by_design(o) == Some("Manager unreachable"))
        .all(|(_, k)| *k != "Failed");
    (failed, blip_green)
}

/// Flux with `wait: true` and no `healthCheckExprs` reads custom resources with kstatus (its
/// poller's generic reader is cli-utils' `status.Compute`), so tools/kstatus gives Flux's
/// verdict, and `kubectl wait --for=condition=Ready` reads the same Ready condition. On every
/// Argo CD test object it agrees with the health the test expects (Healthy and Suspended are
/// Current, Progressing is InProgress, Degraded is Failed), but where kstatus' generic rules
/// say something else, as docs/gitops.md's table shows: an object with no status yet is
/// Current, one being deleted Terminating.
#[test]
fn kstatus_and_so_flux_read_every_test_object_as_argo_cd_does() {
    let objects = argo_test_objects();
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("objects.json");
    let items: Vec<&Value> = objects.iter().map(|(_, o, _)| o).collect();
    std::fs::write(
        &list,
        serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
    )
    .unwrap();
    let out = run_ok(Command::new(tool("kstatus").unwrap()).arg(&list));
    let verdicts: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(verdicts.len(), objects.len(), "{out}");
    let mut wrong = Vec::new();
    let mut judged = Vec::new();
    for ((path, obj, argo), k) in objects.iter().zip(&verdicts) {
        let got = k["status"].as_str().unwrap();
        let want = if obj["metadata"]["deletionTimestamp"].is_string() {
            "Terminating"
        } else if obj.get("status").is_none() {
            "Current"
        } else {
            match argo.as_str() {
                "Healthy" | "Suspended" => "Current",
                "Progressing" => "InProgress",
                "Degraded" => "Failed",
                other => panic!("{path}: Argo CD health {other}"),
            }
        };
        if got != want {
            wrong.push(format!(
                "{path}: kstatus {got} ({}), want {want} (Argo CD {argo})",
                k["message"]
            ));
        }
        judged.push((obj, got));
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let by_design_states = judged
        .iter()
        .filter(|(o, _)| by_design(o).is_some())
        .count();
    assert!(
        by_design_states >= 4,
        "the drop and the outage fixtures were not found"
    );
    let (failed, blip_green) = by_design_figures(&judged);
    println!(
        "kstatus_failed_by_design={failed} flux_wait_blip={} ({by_design_states} by-design test objects)",
        if blip_green { "green" } else { "red" }
    );
    assert_eq!(failed, 0);
    assert!(blip_green);
}

/// The fixtures of the by-design states hold the conditions the operator writes for them today:
/// rebuilt here with the policy's verdicts and the api's condition writers, compared by type,
/// status, reason and message.
#[test]
fn the_by_design_fixtures_carry_the_conditions_the_policy_writes() {
    use automanager_api::{self as api, JobState};
    use automanager_policy::bundle::{DEGRADED, dropped_jobs, verdict};
    use automanager_policy::pass_failure::FailureKind;
    use automanager_policy::spares::Stall;

    let dir = customizations().join("automanager.norsk.io");
    let fixture = |p: &str| docs_of(&dir.join(p)).remove(0);
    let shown = |cs: &[api::Condition]| -> Vec<(String, String, String, String)> {
        cs.iter()
            .filter(|c| ["Ready", "Reconciling", "Stalled", DEGRADED].contains(&c.type_.as_str()))
            .map(|c| {
                let v = serde_json::to_value(c).unwrap();
                (
                    c.type_.clone(),
                    v["status"].as_str().unwrap().to_owned(),
                    c.reason.clone(),
                    c.message.clone(),
                )
            })
            .collect()
    };
    let written = |o: &Value| -> Vec<api::Condition> {
        serde_json::from_value(o["status"]["conditions"].clone()).unwrap()
    };
    let now = chrono::Utc::now();

    // Jobs their band dropped: the verdict over the fixture's job states, and the Degraded
    // condition over its dropped jobs.
    let dropped = fixture("Bundle/testdata/jobs-dropped.yaml");
    let mut states = Vec::new();
    let mut names = Vec::new();
    for r in dropped["status"]["replicas"].as_array().unwrap() {
        let mut replica = Vec::new();
        for j in r["jobs"].as_array().unwrap() {
            let state: JobState = serde_json::from_value(j["state"].clone()).unwrap();
            if state == JobState::Dropped {
                names.push(format!(
                    "replica {} job {}",
                    r["replica"],
                    j["jobName"].as_str().unwrap()
                ));
            }
            replica.push(state);
        }
        states.push(replica);
    }
    let v = verdict(&states, &[], None);
    assert_eq!(
        serde_json::to_value(v.phase).unwrap(),
        dropped["status"]["phase"]
    );
    let mut want = Vec::new();
    api::set_standing(&mut want, v.standing, v.reason, v.message, Some(1), now);
    let (on, reason, message) = dropped_jobs(&names);
    let on = if on {
        api::ConditionStatus::True
    } else {
        api::ConditionStatus::False
    };
    api::set_condition(
        &mut want,
        api::Condition::new(DEGRADED, on, reason, message, Some(1), now),
    );
    assert_eq!(shown(&written(&dropped)), shown(&want));

    // A Manager outage: the standing a failed pass and a spare target's stall take, with the
    // fixture's own message (the operator's error).
    let (standing, reason) = FailureKind::Unavailable.standing().unwrap();
    for path in [
        "Bundle/testdata/manager-unavailable.yaml",
        "Bundle/testdata/deleting.yaml",
        "Migration/testdata/manager-unavailable.yaml",
        "HotSpareTarget/testdata/manager-unavailable.yaml",
    ] {
        let o = fixture(path);
        let mut have = written(&o);
        let message = api::find_condition(&have, "Reconciling")
            .map(|c| c.message.clone())
            .unwrap_or_default();
        let stall = Stall::ManagerUnavailable(message.clone()).verdict();
        assert_eq!((stall.standing, stall.reason), (standing, reason));
        let mut want = have.clone();
        api::set_standing(&mut want, standing, reason, message, Some(1), now);
        have.retain(|c| c.type_ != DEGRADED);
        want.retain(|c| c.type_ != DEGRADED);
        assert_eq!(shown(&have), shown(&want), "{path}");
    }
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
    // kstatus' own rules read our conditions as docs/gitops.md says: no CEL to keep in step.
    assert!(
        objects_ks["spec"]["healthCheckExprs"].is_null(),
        "Flux reads AutoManager's objects with kstatus; no healthCheckExprs are needed"
    );
}
