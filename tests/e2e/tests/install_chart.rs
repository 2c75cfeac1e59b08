//! The Helm chart (deploy/helm/automanager) with the real helm (tools/helm) against the real
//! apiserver: lint, render and server-side dry run, the restricted Pod Security Standard, the
//! rendered config against the operator's own validation, the values schema, and install →
//! upgrade (a CRD gains a field) → uninstall. Also the GitOps kustomizations.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use automanager_e2e::install::{
    FULLNAME, Helm, IMAGE_VALUES, RELEASE, RELEASE_NAMESPACE, chart_dir, documents, find, run,
};
use automanager_e2e::{TestEnv, crd_names, repo_root, stack};
use serde_json::Value;

/// Every optional feature on.
const ALL_ON: &[&str] = &[
    "--set",
    "managerSim.enabled=true",
    "--set",
    "debug.enabled=true",
    "--set",
    "metrics.serviceMonitor.enabled=true",
    "--set",
    "networkPolicy.enabled=true",
    "--set",
    "networkPolicy.debugFrom[0].podSelector.matchLabels.role=debugger",
    "--set",
    "debug.address=0.0.0.0",
    "--set",
    "config.watchNamespaces[0]=video",
    "--set",
    "metrics.prometheusRule.enabled=true",
    "--set",
    "metrics.grafanaDashboard.enabled=true",
    "--set",
    "commonLabels.team=video",
    "--set",
    "extraArgs[0]=--manager-token-file=/var/run/secrets/vault/token",
    "--set",
    "extraEnv[0].name=HTTPS_PROXY",
    "--set",
    "extraEnv[0].value=http://proxy.example.com:3128",
    "--set",
    "envFrom[0].secretRef.name=automanager-proxy",
    "--set",
    "extraVolumes[0].name=private-ca",
    "--set",
    "extraVolumes[0].configMap.name=private-ca",
    "--set",
    "extraVolumeMounts[0].name=private-ca",
    "--set",
    "extraVolumeMounts[0].mountPath=/etc/ssl/private-ca",
    "--set",
    "extraVolumeMounts[0].readOnly=true",
    "--set",
    "podSecurityContext.runAsUser=null",
    "--set",
    "podSecurityContext.runAsGroup=null",
];

#[test]
fn helm_lint_is_clean_with_the_defaults_and_with_every_feature_on() {
    let helm = Helm::offline().unwrap();
    let chart = chart_dir();
    for extra in [&[][..], ALL_ON] {
        let mut args = vec!["lint", "--strict", chart.to_str().unwrap()];
        args.extend_from_slice(IMAGE_VALUES);
        args.extend_from_slice(extra);
        let out = helm.run(&args).unwrap();
        assert!(
            out.success(),
            "helm lint {extra:?}:\n{}{}",
            out.stdout,
            out.stderr
        );
        assert!(
            !out.stdout.contains("[WARNING]") && !out.stdout.contains("[ERROR]"),
            "{}",
            out.stdout
        );
        assert!(out.stdout.contains("0 chart(s) failed"), "{}", out.stdout);
    }
}

/// `kubectl apply --dry-run=server -f -` of `yaml`; returns kubectl's output.
fn dry_run(env: &TestEnv, yaml: &str) -> automanager_e2e::CommandOutput {
    let mut cmd = env.kubectl();
    cmd.args(["apply", "--dry-run=server", "-f", "-"]);
    run(cmd, Some(yaml.as_bytes())).unwrap()
}

async fn kubectl_ok(env: &TestEnv, args: &[&str]) -> String {
    let out = env.run_kubectl(args).await.unwrap();
    assert!(out.success(), "kubectl {args:?}: {}", out.stderr);
    out.stdout
}

/// The release namespace, enforcing (and warning about) the restricted Pod Security Standard.
async fn restricted_namespace(env: &TestEnv, name: &str) {
    kubectl_ok(env, &["create", "namespace", name]).await;
    kubectl_ok(
        env,
        &[
            "label",
            "namespace",
            name,
            "pod-security.kubernetes.io/enforce=restricted",
            "pod-security.kubernetes.io/warn=restricted",
            "pod-security.kubernetes.io/audit=restricted",
        ],
    )
    .await;
}

#[tokio::test]
async fn the_rendered_chart_is_accepted_by_the_apiserver_under_the_restricted_pod_security_standard()
 {
    let env = TestEnv::start().await.unwrap();
    restricted_namespace(&env, RELEASE_NAMESPACE).await;
    kubectl_ok(&env, &["create", "namespace", "video"]).await;
    // The Prometheus Operator's ServiceMonitor kind, so the optional ServiceMonitor can be
    // checked too (a minimal definition of it: the test is about our object's shape).
    let out = env
        .apply_file(repo_root().join("tests/e2e/fixtures/servicemonitor-crd.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let out = env
        .apply_file(repo_root().join("tests/e2e/fixtures/prometheusrule-crd.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    env.wait_for_crds_established(
        [
            "servicemonitors.monitoring.coreos.com",
            "prometheusrules.monitoring.coreos.com",
        ],
        Duration::from_secs(60),
    )
    .await
    .unwrap();

    let helm = Helm::offline().unwrap();
    for extra in [&[][..], ALL_ON] {
        let rendered = helm.template(&chart_dir(), extra).unwrap();
        let out = dry_run(&env, &rendered);
        assert!(out.success(), "{extra:?}: {}", out.stderr);
        assert!(
            !out.stderr.contains("PodSecurity"),
            "{extra:?}: the workloads violate the restricted standard:\n{}",
            out.stderr
        );
        // The pods themselves, as the Deployments would create them, under enforcement.
        let docs = documents(&rendered).unwrap();
        for d in docs.iter().filter(|d| d["kind"] == "Deployment") {
            let pod = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "pss-check", "namespace": RELEASE_NAMESPACE},
                "spec": d["spec"]["template"]["spec"],
            });
            let out = dry_run(&env, &pod.to_string());
            assert!(
                out.success(),
                "{}: refused under the restricted standard: {}",
                d["metadata"]["name"],
                out.stderr
            );
        }
    }
    // The enforcement is real: a pod that may run as root is refused in that namespace.
    let rootable = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "rootable", "namespace": RELEASE_NAMESPACE},
        "spec": {"containers": [{"name": "c", "image": "x"}]},
    });
    let out = dry_run(&env, &rootable.to_string());
    assert!(
        !out.success(),
        "the namespace does not enforce the standard"
    );
    assert!(out.stderr.contains("restricted"), "{}", out.stderr);
}

/// A duration's range is the operator's to check (the schema says only that it is a duration):
/// the rendered ConfigMap is refused by `automanager-operator config check`, naming the key.
#[test]
fn a_duration_out_of_range_is_refused_by_the_operators_check_of_the_rendered_config() {
    let bins = stack::binaries().unwrap();
    let helm = Helm::offline().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let docs = documents(
        &helm
            .template(
                &chart_dir(),
                &["--set", "config.leaderElection.leaseDuration=1s"],
            )
            .unwrap(),
    )
    .unwrap();
    let cm = find(&docs, "ConfigMap", Some(FULLNAME)).unwrap();
    let path = dir.path().join("operator.yaml");
    std::fs::write(&path, cm["data"]["operator.yaml"].as_str().unwrap()).unwrap();
    let mut cmd = std::process::Command::new(&bins.operator);
    cmd.args(["config", "check", "--no-file-checks"]).arg(&path);
    let out = run(cmd, None).unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(
        out.stderr.contains("leaderElection.leaseDuration"),
        "{}",
        out.stderr
    );
}

#[test]
fn the_rendered_config_passes_the_operators_own_validation() {
    let bins = stack::binaries().unwrap();
    let helm = Helm::offline().unwrap();
    let dir = tempfile::tempdir().unwrap();
    for extra in [&[][..], ALL_ON] {
        let docs = documents(&helm.template(&chart_dir(), extra).unwrap()).unwrap();
        let cm = find(&docs, "ConfigMap", Some(FULLNAME)).unwrap();
        let config = cm["data"]["operator.yaml"].as_str().unwrap();
        let path = dir.path().join("operator.yaml");
        std::fs::write(&path, config).unwrap();
        let mut cmd = std::process::Command::new(&bins.operator);
        cmd.arg("--config").arg(&path).arg("--check-config");
        let out = run(cmd, None).unwrap();
        // The Deployment mounts the Manager token and CA from Secrets; outside a pod those
        // files do not exist, so those (and only those) are reported.
        let deployment = find(&docs, "Deployment", Some(FULLNAME)).unwrap();
        let mounts: Vec<&str> =
            deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|m| m["mountPath"].as_str())
                .collect();
        let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        assert!(
            args.contains("--config=/etc/automanager/operator.yaml"),
            "{args}"
        );
        assert!(mounts.contains(&"/etc/automanager"), "{mounts:?}");
        if out.success() {
            assert!(out.stdout.contains("configuration is valid"));
            continue;
        }
        let problems: Vec<&str> = out
            .stderr
            .lines()
            .skip(1)
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert!(!problems.is_empty(), "{}", out.stderr);
        for p in problems {
            let missing_mounted_file = (p.starts_with("manager.tokenFile:")
                || p.starts_with("manager.tls.caFile:"))
                && mounts
                    .iter()
                    .any(|m| m.starts_with("/var/run/secrets/automanager/") && p.contains(*m));
            assert!(
                missing_mounted_file,
                "{extra:?}: the rendered config has a problem other than a Secret file only a pod has: {p}\n{config}"
            );
        }
    }
}

/// The keys of `config` the chart writes itself, from other values: where Manager is, the
/// listeners, and the Lease's name and namespace (the release's).
const CHART_OWNED: &[&str] = &[
    "manager",
    "http",
    "leaderElection.leaseName",
    "leaderElection.leaseNamespace",
];

/// Settings the operator allows only one value of (preempting is never allowed for bronze,
/// which has no band below it): rendered as values.yaml says, not varied.
const ONLY_ONE_VALUE: &[&str] = &["bands.bronze.preempt"];

/// The rendered `operator.yaml` (as text and parsed) and the Deployment's config checksum.
fn rendered_config(helm: &Helm, args: &[&str]) -> (String, Value, String) {
    let docs = documents(&helm.template(&chart_dir(), args).unwrap()).unwrap();
    let cm = find(&docs, "ConfigMap", Some(FULLNAME)).unwrap();
    let text = cm["data"]["operator.yaml"].as_str().unwrap().to_owned();
    let config: Value = serde_saphyr::from_str(&text).unwrap();
    let deployment = find(&docs, "Deployment", Some(FULLNAME)).unwrap();
    let checksum = deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
        .as_str()
        .unwrap()
        .to_owned();
    (text, config, checksum)
}

/// `#/$defs/X` (or `#/definitions/X`) resolved against the schema's root.
fn resolve<'a>(root: &'a Value, node: &'a Value) -> &'a Value {
    match node["$ref"].as_str() {
        Some(r) => {
            let path = r.trim_start_matches("#/");
            let target = path.split('/').fold(root, |v, k| &v[k]);
            resolve(root, target)
        }
        None => match node["allOf"].as_array() {
            Some(all) if all.len() == 1 => resolve(root, &all[0]),
            _ => node,
        },
    }
}

/// Every leaf of the operator's settings schema: its dotted path and its schema.
fn leaves<'a>(root: &'a Value, node: &'a Value, path: &str, out: &mut Vec<(String, &'a Value)>) {
    let node = resolve(root, node);
    match node["properties"].as_object() {
        Some(props) => {
            for (k, v) in props {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                leaves(root, v, &p, out);
            }
        }
        None => out.push((path.to_owned(), node)),
    }
}

/// The values a leaf's schema allows by name: `enum`, or `const`s under `oneOf`/`anyOf`.
fn named_values(root: &Value, leaf: &Value) -> Vec<Value> {
    if let Some(e) = leaf["enum"].as_array() {
        return e.iter().filter(|v| !v.is_null()).cloned().collect();
    }
    let mut out = Vec::new();
    for key in ["oneOf", "anyOf"] {
        for alt in leaf[key].as_array().into_iter().flatten() {
            let alt = resolve(root, alt);
            if !alt["const"].is_null() {
                out.push(alt["const"].clone());
            }
            out.extend(named_values(root, alt));
        }
    }
    out
}

/// A valid value other than `current` for a leaf: another named value, the other boolean, the
/// next integer in range, a duration one unit longer, a namespace list, a disruption window.
fn another_value(root: &Value, leaf: &Value, current: &Value) -> Option<Value> {
    let named = named_values(root, leaf);
    if !named.is_empty() {
        return named.into_iter().find(|v| v != current);
    }
    match current {
        Value::Bool(b) => Some(Value::Bool(!b)),
        Value::Number(n) => {
            let n = n.as_i64()?;
            let max = leaf["maximum"].as_i64().unwrap_or(i64::MAX);
            Some(Value::from(if n < max { n + 1 } else { n - 1 }))
        }
        Value::String(s) => {
            let digits: String = s.chars().take_while(char::is_ascii_digit).collect();
            let unit = &s[digits.len()..];
            let n: u64 = digits.parse().ok()?;
            Some(Value::from(format!("{}{unit}", n + 1)))
        }
        // A list of disruption windows, or of namespaces.
        Value::Array(_) if leaf["items"]["properties"]["schedule"].is_object() => Some(
            serde_json::json!([{"schedule": "0 2 * * *", "duration": "3h", "timeZone": "Europe/Oslo"}]),
        ),
        Value::Array(_) => Some(serde_json::json!(["video"])),
        _ => None,
    }
}

/// The operator's own settings schema, walked leaf by leaf: each setting is rendered into the
/// ConfigMap as set in `config`, a changed value still passes `automanager-operator config
/// check`, and it changes the Pods' checksum (so they roll). The chart owns only the Manager
/// connection, the listeners and the Lease's name and namespace.
#[test]
fn every_config_value_reaches_the_operator_and_rolls_the_pods() {
    let bins = stack::binaries().unwrap();
    let helm = Helm::offline().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = std::process::Command::new(&bins.operator);
    cmd.args(["config", "schema"]);
    let out = run(cmd, None).unwrap();
    assert!(out.success(), "{}", out.stderr);
    let schema: Value = serde_json::from_str(&out.stdout).unwrap();
    let mut all = Vec::new();
    leaves(&schema, &schema, "", &mut all);
    let (_, defaults, checksum) = rendered_config(&helm, &[]);
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap())
            .unwrap();
    let at = |v: &'_ Value, path: &str| -> Value { path.split('.').fold(v, |v, k| &v[k]).clone() };

    for owned in CHART_OWNED {
        assert!(!at(&defaults, owned).is_null(), "the chart writes {owned}");
    }
    let mut problems = Vec::new();
    let mut checked = 0;
    for (path, leaf) in &all {
        if CHART_OWNED
            .iter()
            .any(|o| path == o || path.starts_with(&format!("{o}.")))
        {
            // The chart's own (some only with other values: TLS, the debug listener).
            continue;
        }
        // What values.yaml sets is rendered as written.
        let given = at(&values["config"], path);
        let current = if given.is_null() {
            leaf["default"].clone()
        } else {
            if at(&defaults, path) != given {
                problems.push(format!(
                    "config.{path}: values.yaml says {given}, rendered {}",
                    at(&defaults, path)
                ));
            }
            given
        };
        if ONLY_ONE_VALUE.contains(&path.as_str()) {
            continue;
        }
        // A setting values.yaml leaves out and the schema gives no default: its least value.
        let current = if current.is_null() {
            leaf["x-duration"]["min"].clone()
        } else {
            current
        };
        let Some(changed) = another_value(&schema, leaf, &current) else {
            problems.push(format!(
                "config.{path}: no other value to try (current {current}, schema {leaf})"
            ));
            continue;
        };
        let set = format!("config.{path}={changed}");
        // One replica, so that `leaderElection.enabled: false` is a valid change too (the
        // replica count is not part of the config's checksum).
        let (text, rendered, changed_checksum) =
            rendered_config(&helm, &["--set", "replicaCount=1", "--set-json", &set]);
        if at(&rendered, path) != changed {
            problems.push(format!(
                "--set-json {set}: rendered {}",
                at(&rendered, path)
            ));
        }
        if changed_checksum == checksum {
            problems.push(format!(
                "--set-json {set}: the Pods' checksum did not change"
            ));
        }
        let file = dir.path().join("operator.yaml");
        std::fs::write(&file, &text).unwrap();
        let mut cmd = std::process::Command::new(&bins.operator);
        cmd.args(["config", "check", "--no-file-checks"]).arg(&file);
        let out = run(cmd, None).unwrap();
        if !out.success() {
            problems.push(format!(
                "--set-json {set}: config check refused it: {}",
                out.stderr
            ));
        }
        checked += 1;
    }
    assert!(
        problems.is_empty(),
        "settings that do not reach the operator as set:\n{}",
        problems.join("\n")
    );
    // The settings the chart once dropped are among those walked.
    for key in [
        "clusterScope",
        "zoneBrake.enabled",
        "provisioning.perPoolPerMinute",
        "rebalance.maxPerMinute",
    ] {
        assert!(
            all.iter().any(|(p, _)| p == key),
            "{key} is not in the schema"
        );
    }
    assert!(checked >= 30, "only {checked} settings walked");
    assert_eq!(defaults["leaderElection"]["leaseName"], FULLNAME);
}

#[test]
fn the_values_schema_refuses_bad_values_naming_them() {
    let helm = Helm::offline().unwrap();
    let chart = chart_dir();
    // (what is wrong, the flags, what the message must name)
    let cases: &[(&str, &[&str], &str)] = &[
        (
            "negative replicas",
            &["--set", "replicaCount=-1"],
            "/replicaCount",
        ),
        (
            "a string for a number",
            &["--set-string", "replicaCount=two"],
            "/replicaCount",
        ),
        (
            "an unknown key",
            &["--set", "replicas=3"],
            "'replicas' not allowed",
        ),
        (
            "an unknown band",
            &["--set", "config.bands.platinum.onFailure=drop"],
            "'platinum' not allowed",
        ),
        (
            "a band action that does not exist",
            &["--set", "config.bands.gold.onFailure=retry"],
            "/config/bands/gold/onFailure",
        ),
        (
            "a restart ceiling out of range",
            &["--set", "config.bands.gold.maxRestartsPerHour=0"],
            "/config/bands/gold/maxRestartsPerHour",
        ),
        (
            "a band window for a reason that does not exist",
            &[
                "--set-json",
                r#"config.bands.gold.disruptionWindows=[{"schedule":"0 2 * * *","duration":"2h","reasons":["recovery"]}]"#,
            ],
            "/config/bands/gold/disruptionWindows/0/reasons/0",
        ),
        (
            "a band window without a schedule",
            &[
                "--set-json",
                r#"config.bands.silver.disruptionWindows=[{"duration":"2h"}]"#,
            ],
            "/config/bands/silver/disruptionWindows/0",
        ),
        (
            "a URL that is not Manager's",
            &["--set", "manager.url=ftp://manager"],
            "/manager/url",
        ),
        (
            "a URL without a port",
            &["--set", "manager.url=https://manager"],
            "/manager/url",
        ),
        (
            "https without a CA",
            &["--set", "manager.tls.secretName="],
            "/manager/tls/secretName",
        ),
        (
            "a CA with plain http",
            &["--set", "manager.url=http://manager:6789"],
            "/manager/url",
        ),
        (
            "no token secret when TLS is off and a token is required",
            &[
                "--set",
                "manager.url=http://manager:6789",
                "--set",
                "manager.tls.secretName=",
                "--set",
                "manager.token.secretName=",
            ],
            "/manager/token/secretName",
        ),
        (
            "no Manager at all",
            &["--set", "manager.url="],
            "/manager/url",
        ),
        (
            "two replicas without leader election",
            &["--set", "config.leaderElection.enabled=false"],
            "/replicaCount",
        ),
        (
            "a duration that is not one",
            &["--set", "config.pendingWindow=soon"],
            "/config/pendingWindow",
        ),
        (
            "a namespace name that is not one",
            &["--set", "config.watchNamespaces[0]=Video_1"],
            "/config/watchNamespaces/0",
        ),
        (
            "a namespace listed twice",
            &[
                "--set",
                "config.watchNamespaces[0]=video",
                "--set",
                "config.watchNamespaces[1]=video",
            ],
            "/config/watchNamespaces",
        ),
        (
            "an unknown pull policy",
            &["--set", "image.pullPolicy=Sometimes"],
            "/image/pullPolicy",
        ),
        (
            "a digest that is not one",
            &["--set", "image.digest=latest"],
            "/image/digest",
        ),
        (
            "a port out of range",
            &["--set", "metrics.port=70000"],
            "/metrics/port",
        ),
        (
            "a log format that does not exist",
            &["--set", "logFormat=xml"],
            "/logFormat",
        ),
        (
            "a ServiceMonitor with no Service",
            &[
                "--set",
                "metrics.serviceMonitor.enabled=true",
                "--set",
                "metrics.service.enabled=false",
            ],
            "/metrics/service/enabled",
        ),
        (
            "a debug address that is not an IP",
            &["--set", "debug.address=localhost"],
            "/debug/address",
        ),
        (
            "a PDB that allows no disruption (blocks every drain)",
            &["--set", "podDisruptionBudget.maxUnavailable=0"],
            "/podDisruptionBudget/maxUnavailable",
        ),
        (
            "a PDB percentage of 0%",
            &["--set", "podDisruptionBudget.maxUnavailable=0%"],
            "/podDisruptionBudget/maxUnavailable",
        ),
        (
            "the old minAvailable",
            &["--set", "podDisruptionBudget.minAvailable=1"],
            "'minAvailable' not allowed",
        ),
        (
            "a pod running as root",
            &["--set", "podSecurityContext.runAsUser=0"],
            "/podSecurityContext/runAsUser",
        ),
        (
            "a container running as root",
            &["--set", "securityContext.runAsUser=0"],
            "/securityContext/runAsUser",
        ),
        (
            "a securityContext that is not an object",
            &["--set", "securityContext=none"],
            "/securityContext",
        ),
        (
            "an extra argument that is not a flag",
            &["--set", "extraArgs[0]=verbose"],
            "/extraArgs/0",
        ),
        (
            "an extra argument replacing the chart's config file",
            &["--set", "extraArgs[0]=--config=/tmp/x.yaml"],
            "/extraArgs/0",
        ),
        (
            "an extra variable replacing the Lease identity",
            &[
                "--set",
                "extraEnv[0].name=POD_NAME",
                "--set",
                "extraEnv[0].value=x",
            ],
            "/extraEnv/0/name",
        ),
        (
            "an extra variable without a name",
            &["--set", "extraEnv[0].value=x"],
            "/extraEnv/0",
        ),
        (
            "an envFrom source of an unknown kind",
            &["--set", "envFrom[0].vaultRef.name=x"],
            "/envFrom/0",
        ),
        (
            "an extra volume named like the chart's",
            &[
                "--set",
                "extraVolumes[0].name=config",
                "--set",
                "extraVolumes[0].emptyDir.medium=Memory",
            ],
            "/extraVolumes/0/name",
        ),
        (
            "an extra mount over the operator's config",
            &[
                "--set",
                "extraVolumes[0].name=ca",
                "--set",
                "extraVolumes[0].configMap.name=ca",
                "--set",
                "extraVolumeMounts[0].name=ca",
                "--set",
                "extraVolumeMounts[0].mountPath=/etc/automanager",
            ],
            "/extraVolumeMounts/0/mountPath",
        ),
        (
            "a negative revision history",
            &["--set", "revisionHistoryLimit=-1"],
            "/revisionHistoryLimit",
        ),
        (
            "a common label the chart sets itself",
            &["--set", "commonLabels.app\\.kubernetes\\.io/name=x"],
            "/commonLabels/app.kubernetes.io~1name",
        ),
        (
            "a common label that is not a label",
            &["--set", "commonLabels.bad_key!=x"],
            "'bad_key!' not allowed",
        ),
        (
            "a startup probe that never waits",
            &["--set", "startupProbe.periodSeconds=0"],
            "/startupProbe/periodSeconds",
        ),
        (
            "a startup probe with no tries",
            &["--set", "startupProbe.failureThreshold=0"],
            "/startupProbe/failureThreshold",
        ),
        (
            "a PrometheusRule flag that is not a boolean",
            &["--set-string", "metrics.prometheusRule.enabled=yes"],
            "/metrics/prometheusRule/enabled",
        ),
        (
            "a dashboard namespace that is not one",
            &["--set", "metrics.grafanaDashboard.namespace=Grafana_NS"],
            "/metrics/grafanaDashboard/namespace",
        ),
        (
            "aggregated roles flag that is not a boolean",
            &["--set-string", "rbac.aggregateToDefaultRoles=maybe"],
            "/rbac/aggregateToDefaultRoles",
        ),
        (
            "a helm test with nothing to ask",
            &[
                "--set",
                "metrics.service.enabled=false",
                "--set",
                "config.leaderElection.enabled=false",
                "--set",
                "replicaCount=1",
            ],
            "/tests/enabled",
        ),
        (
            "an image repository that is not one",
            &["--set", "image.repository=Registry.Example.com/AM"],
            "/image/repository",
        ),
    ];
    assert!(cases.len() >= 40);
    for (what, flags, names) in cases {
        let mut args = vec!["template", RELEASE, chart.to_str().unwrap()];
        args.extend_from_slice(IMAGE_VALUES);
        args.extend_from_slice(flags);
        let out = helm.run(&args).unwrap();
        assert!(!out.success(), "{what}: accepted");
        assert!(
            out.stderr
                .contains("values don't meet the specifications of the schema"),
            "{what}: not refused by the schema: {}",
            out.stderr
        );
        assert!(
            out.stderr.contains(names),
            "{what}: the message does not name {names}: {}",
            out.stderr
        );
    }
    // What the schema cannot say (two values that must agree, a value that must be given) the
    // templates say, naming the value.
    let template_cases: &[(&[&str], &str)] = &[
        (
            &[IMAGE_VALUES[0], IMAGE_VALUES[1], "--set", "debug.port=8080"],
            "debug.port (8080) must differ from metrics.port",
        ),
        (&[], "image.repository is required"),
        (
            &[
                IMAGE_VALUES[0],
                IMAGE_VALUES[1],
                "--set",
                "extraVolumeMounts[0].name=ca",
                "--set",
                "extraVolumeMounts[0].mountPath=/etc/ssl/private-ca",
            ],
            "extraVolumeMounts[0].name: \"ca\" is not the name of one of extraVolumes",
        ),
    ];
    for (flags, names) in template_cases {
        let mut args = vec!["template", RELEASE, chart.to_str().unwrap()];
        args.extend_from_slice(flags);
        let out = helm.run(&args).unwrap();
        assert!(!out.success(), "{flags:?}: accepted");
        assert!(out.stderr.contains(names), "{flags:?}: {}", out.stderr);
    }
}

/// A copy of the chart whose PlacementPool CRD gained `spec.description`, as version 0.1.1.
fn chart_with_a_new_crd_field(into: &Path) -> std::path::PathBuf {
    let chart = into.join("automanager");
    copy_dir(&chart_dir(), &chart);
    let crd_path = chart.join("files/crds/placementpools.yaml");
    let mut crd: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&crd_path).unwrap()).unwrap();
    let props = &mut crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
        ["properties"];
    assert!(props.is_object(), "the CRD's spec has no properties");
    props["description"] = serde_json::json!(
        {"type": "string", "maxLength": 256, "description": "What the pool is for."}
    );
    std::fs::write(&crd_path, serde_saphyr::to_string(&crd).unwrap()).unwrap();
    let chart_yaml = chart.join("Chart.yaml");
    let text = std::fs::read_to_string(&chart_yaml).unwrap();
    std::fs::write(
        &chart_yaml,
        text.replace("\nversion: 0.1.0\n", "\nversion: 0.1.1\n"),
    )
    .unwrap();
    chart
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

async fn get_json(env: &TestEnv, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&kubectl_ok(env, &all).await).unwrap()
}

async fn exists(env: &TestEnv, args: &[&str]) -> bool {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    let out = env.run_kubectl(&all).await.unwrap();
    if !out.success() {
        assert!(out.stderr.contains("NotFound"), "{}", out.stderr);
    }
    out.success()
}

#[tokio::test]
async fn install_upgrade_and_uninstall_keep_the_crds_and_the_users_objects() {
    let env = TestEnv::start().await.unwrap();
    let helm = Helm::on(&env).unwrap();
    let chart = chart_dir();
    let sim = [
        "--set",
        "managerSim.enabled=true",
        IMAGE_VALUES[0],
        IMAGE_VALUES[1],
    ];

    // Install: every object appears, the CRDs are established.
    let mut args = vec![
        "install",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
    ];
    args.extend_from_slice(&sim);
    let out = helm.run(&args).unwrap();
    assert!(out.success(), "helm install: {}", out.stderr);
    assert!(out.stdout.contains("STATUS: deployed"), "{}", out.stdout);
    env.wait_for_crds_established(crd_names(), Duration::from_secs(60))
        .await
        .unwrap();
    for what in [
        vec!["deployment", FULLNAME, "-n", RELEASE_NAMESPACE],
        vec![
            "deployment",
            "am-automanager-manager-sim",
            "-n",
            RELEASE_NAMESPACE,
        ],
        vec!["serviceaccount", FULLNAME, "-n", RELEASE_NAMESPACE],
        vec!["configmap", FULLNAME, "-n", RELEASE_NAMESPACE],
        vec!["service", "am-automanager-metrics", "-n", RELEASE_NAMESPACE],
        vec!["poddisruptionbudget", FULLNAME, "-n", RELEASE_NAMESPACE],
        vec![
            "role",
            "am-automanager-leader-election",
            "-n",
            RELEASE_NAMESPACE,
        ],
        vec!["clusterrole", FULLNAME],
        vec!["clusterrolebinding", FULLNAME],
        vec!["clusterrole", "am-automanager-view"],
        vec!["clusterrole", "am-automanager-edit"],
    ] {
        assert!(exists(&env, &what).await, "{what:?} was not installed");
    }
    let d = get_json(&env, &["deployment", FULLNAME, "-n", RELEASE_NAMESPACE]).await;
    assert_eq!(d["spec"]["replicas"], 2);

    // The user's objects.
    let out = env
        .apply_file(repo_root().join("examples/pools.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let out = env
        .apply_file(repo_root().join("examples/cross-cloud-dr.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);

    // Before the upgrade the field is unknown: the apiserver prunes it.
    let with_description = "apiVersion: automanager.norsk.io/v1alpha1\nkind: PlacementPool\nmetadata: {name: described}\nspec: {kind: cluster, region: r, scaleOut: fixed, description: edge sites}\n";
    let mut cmd = env.kubectl();
    cmd.args([
        "create",
        "--validate=false",
        "--dry-run=server",
        "-o",
        "json",
        "-f",
        "-",
    ]);
    let before = run(cmd, Some(with_description.as_bytes())).unwrap();
    assert!(before.success(), "{}", before.stderr);
    let before: Value = serde_json::from_str(&before.stdout).unwrap();
    assert!(before["spec"]["description"].is_null(), "{before:#}");

    // Upgrade to a chart whose CRD gained a field, as docs/install.md says to upgrade: the
    // new chart's defaults, then the release's own values (managerSim.enabled here). The CRD is
    // updated and the values are kept.
    let tmp = tempfile::tempdir().unwrap();
    let upgraded = chart_with_a_new_crd_field(tmp.path());
    let out = helm
        .run([
            "upgrade",
            RELEASE,
            upgraded.to_str().unwrap(),
            "--namespace",
            RELEASE_NAMESPACE,
            "--reset-then-reuse-values",
        ])
        .unwrap();
    assert!(out.success(), "helm upgrade: {}", out.stderr);
    assert!(
        exists(
            &env,
            &[
                "deployment",
                "am-automanager-manager-sim",
                "-n",
                RELEASE_NAMESPACE
            ]
        )
        .await,
        "--reset-then-reuse-values lost managerSim.enabled"
    );
    let crd = get_json(&env, &["crd", "placementpools.automanager.norsk.io"]).await;
    assert_eq!(
        crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
            ["description"]["type"],
        "string",
        "the upgrade did not apply the CRD change"
    );
    assert_eq!(
        crd["metadata"]["labels"]["helm.sh/chart"],
        "automanager-0.1.1"
    );
    let out = env.apply_yaml(with_description).await.unwrap();
    assert!(out.success(), "{}", out.stderr);
    let pool = get_json(&env, &["placementpool", "described"]).await;
    assert_eq!(pool["spec"]["description"], "edge sites", "{pool:#}");

    // Uninstall: the release's objects go, the CRDs and every user object stay.
    let out = helm
        .run(["uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE])
        .unwrap();
    assert!(out.success(), "helm uninstall: {}", out.stderr);
    assert!(
        out.stdout.contains("kept due to the resource policy")
            || out.stderr.contains("kept due to the resource policy"),
        "helm did not say it kept the CRDs:\n{}{}",
        out.stdout,
        out.stderr
    );
    for what in [
        vec!["deployment", FULLNAME, "-n", RELEASE_NAMESPACE],
        vec!["serviceaccount", FULLNAME, "-n", RELEASE_NAMESPACE],
        vec!["clusterrole", FULLNAME],
        vec!["clusterrolebinding", FULLNAME],
        vec!["clusterrole", "am-automanager-view"],
        vec!["clusterrole", "am-automanager-edit"],
    ] {
        assert!(
            !exists(&env, &what).await,
            "{what:?} survived the uninstall"
        );
    }
    for crd in crd_names() {
        assert!(exists(&env, &["crd", &crd]).await, "CRD {crd} was deleted");
    }
    assert!(exists(&env, &["placementpool", "aws-east"]).await);
    assert!(exists(&env, &["placementpool", "described"]).await);
    assert!(exists(&env, &["bundle", "my-channel-1", "-n", "default"]).await);
}

#[tokio::test]
async fn the_gitops_kustomizations_are_accepted_by_the_apiserver() {
    let env = automanager_e2e::env_with_crds().await.unwrap();
    for (dir, namespace) in [
        ("deploy/gitops", None),
        (
            "deploy/gitops/argocd/resource_customizations",
            Some("argocd"),
        ),
    ] {
        if let Some(ns) = namespace {
            kubectl_ok(&env, &["create", "namespace", ns]).await;
        }
        let built = kubectl_ok(
            &env,
            &["kustomize", repo_root().join(dir).to_str().unwrap()],
        )
        .await;
        let out = dry_run(&env, &built);
        assert!(out.success(), "{dir}: {}", out.stderr);
        assert!(
            !documents(&built).unwrap().is_empty(),
            "{dir} builds nothing"
        );
    }
    // Everything in examples/ reaches Git through deploy/gitops.
    let built = documents(
        &kubectl_ok(
            &env,
            &[
                "kustomize",
                repo_root().join("deploy/gitops").to_str().unwrap(),
            ],
        )
        .await,
    )
    .unwrap();
    let mut in_examples = 0;
    for entry in std::fs::read_dir(repo_root().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            for d in documents(&std::fs::read_to_string(&path).unwrap()).unwrap() {
                in_examples += 1;
                assert!(
                    built.iter().any(|b| b["kind"] == d["kind"]
                        && b["metadata"]["name"] == d["metadata"]["name"]),
                    "{} {} from {} is not in deploy/gitops",
                    d["kind"],
                    d["metadata"]["name"],
                    path.display()
                );
            }
        }
    }
    assert_eq!(built.len(), in_examples);
    // The Argo CD Applications and the Flux objects are checked without a cluster in
    // tests/gitops.rs (`make test`).
}
