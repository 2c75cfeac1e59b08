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
fn the_librarys_bare_host_port_manager_url_renders_as_given() {
    let helm = Helm::offline().unwrap();
    let (_, config, _) = rendered_config(&helm, &["--set", "manager.url=manager.example.com:6789"]);
    assert_eq!(config["manager"]["url"], "manager.example.com:6789");
    // Not a scheme the operator knows, nor a port-less host: still refused.
    for bad in ["manager.example.com", "grpc://manager.example.com:6789"] {
        let err = helm
            .template(&chart_dir(), &["--set", &format!("manager.url={bad}")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("/manager/url"), "{bad}: {err}");
    }
}

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
            "a duration that is not one, said in words",
            &["--set", "config.pendingWindow=forever"],
            "at '/config/pendingWindow': value must be 'a duration: a number and a unit, e.g. 60s",
        ),
        (
            "a Manager timeout that is not a duration, said in words",
            &["--set", "manager.connectTimeout=5parsecs"],
            "at '/manager/connectTimeout': value must be 'a duration: numbers with the units",
        ),
        (
            "a probe that never waits",
            &["--set", "livenessProbe.periodSeconds=0"],
            "/livenessProbe/periodSeconds",
        ),
        (
            "a grace period of none",
            &["--set", "terminationGracePeriodSeconds=0"],
            "/terminationGracePeriodSeconds",
        ),
        (
            "an architecture that does not exist",
            &["--set", "image.architectures[0]=x86"],
            "/image/architectures/0",
        ),
        (
            "a namespace override that is not a namespace",
            &["--set", "namespaceOverride=Ops_NS"],
            "/namespaceOverride",
        ),
        (
            "an extra object that is neither an object nor a string",
            &["--set", "extraObjects[0]=3"],
            "/extraObjects/0",
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
        // A CA with plain http: the reason, not a pattern.
        (
            &[
                IMAGE_VALUES[0],
                IMAGE_VALUES[1],
                "--set",
                "manager.url=http://manager:6789",
            ],
            "manager.url is a plain http:// address (http://manager:6789) but manager.tls.secretName is set (automanager-manager-tls): TLS to Manager needs an https:// URL",
        ),
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
        vec!["clusterrole", "am-automanager-aggregate-to-view"],
        vec!["clusterrole", "am-automanager-aggregate-to-edit"],
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
        vec!["clusterrole", "am-automanager-aggregate-to-view"],
        vec!["clusterrole", "am-automanager-aggregate-to-edit"],
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

/// The rendered chart's documents with `args`, each with its source text.
fn rendered(helm: &Helm, args: &[&str]) -> (String, Vec<Value>) {
    let text = helm.template(&chart_dir(), args).unwrap();
    let docs = documents(&text).unwrap();
    (text, docs)
}

/// Every Pod spec the chart renders: the Deployments' templates and the `helm test` Pod.
fn pod_specs(docs: &[Value]) -> Vec<(String, &Value)> {
    docs.iter()
        .filter_map(|d| {
            let name = d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            match d["kind"].as_str() {
                Some("Deployment") => Some((name, &d["spec"]["template"]["spec"])),
                Some("Pod") => Some((name, &d["spec"])),
                _ => None,
            }
        })
        .collect()
}

/// The keys of the YAML block that follows `header` (a line of its own) in `text`, one per line
/// at the block's indentation, as written (so a key written twice is there twice).
fn block_keys(text: &str, header: &str) -> Vec<String> {
    let mut lines = text.lines().skip_while(|l| *l != header).skip(1);
    let indent = |l: &str| l.len() - l.trim_start().len();
    let Some(first) = lines.next() else {
        return Vec::new();
    };
    let level = indent(first);
    std::iter::once(first)
        .chain(lines)
        .take_while(|l| indent(l) >= level && !l.trim().is_empty())
        .filter(|l| indent(l) == level && !l.trim_start().starts_with('#'))
        .map(|l| l.trim().split(':').next().unwrap().to_owned())
        .collect()
}

/// A `podLabels` key that repeats a selector label used to be written twice into the Pod
/// template, which the apiserver refuses to parse. Now each key is written once; a selector
/// label keeps the chart's value (the selector cannot change after install), and `podLabels`
/// wins over `commonLabels`.
#[test]
fn pod_labels_merge_with_the_selector_and_common_labels_never_repeating_a_key() {
    let helm = Helm::offline().unwrap();
    let (text, docs) = rendered(
        &helm,
        &[
            "--set",
            "podLabels.app\\.kubernetes\\.io/name=automanager",
            "--set",
            "podLabels.app\\.kubernetes\\.io/component=something-else",
            "--set",
            "podLabels.team=news",
            "--set",
            "commonLabels.team=video",
            "--set",
            "commonLabels.cost-centre=c42",
        ],
    );
    let keys = block_keys(
        text.split("# Source: automanager/templates/deployment.yaml")
            .nth(1)
            .unwrap(),
        "      labels:",
    );
    let mut unique = keys.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        keys.len(),
        unique.len(),
        "a Pod label written twice: {keys:?}"
    );
    let d = find(&docs, "Deployment", Some(FULLNAME)).unwrap();
    let labels = &d["spec"]["template"]["metadata"]["labels"];
    for (k, v) in d["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &labels[k], v,
            "the Pods no longer match the selector on {k}"
        );
    }
    assert_eq!(labels["app.kubernetes.io/component"], "operator");
    assert_eq!(labels["team"], "news", "podLabels win over commonLabels");
    assert_eq!(labels["cost-centre"], "c42");
}

/// Memory is requested as much as its limit in every container the chart runs.
#[test]
fn every_container_requests_the_memory_it_may_use() {
    let helm = Helm::offline().unwrap();
    for extra in [&[][..], ALL_ON] {
        let (_, docs) = rendered(&helm, extra);
        let specs = pod_specs(&docs);
        assert!(specs.len() >= 2, "{extra:?}: {} pod specs", specs.len());
        for (name, spec) in specs {
            for c in spec["containers"].as_array().unwrap() {
                let r = &c["resources"];
                assert!(r["limits"]["memory"].is_string(), "{name}: no memory limit");
                assert_eq!(
                    r["requests"]["memory"], r["limits"]["memory"],
                    "{name}/{}: memory request and limit differ",
                    c["name"]
                );
            }
        }
    }
}

/// The probes' timing and the grace period come from the values; the paths stay the chart's.
#[test]
fn probes_and_grace_period_are_values() {
    let helm = Helm::offline().unwrap();
    let (_, docs) = rendered(
        &helm,
        &[
            "--set",
            "livenessProbe.periodSeconds=20",
            "--set",
            "livenessProbe.timeoutSeconds=4",
            "--set",
            "livenessProbe.failureThreshold=6",
            "--set",
            "readinessProbe.periodSeconds=7",
            "--set",
            "readinessProbe.timeoutSeconds=3",
            "--set",
            "readinessProbe.failureThreshold=2",
            "--set",
            "startupProbe.timeoutSeconds=5",
            "--set",
            "terminationGracePeriodSeconds=45",
        ],
    );
    let spec = &find(&docs, "Deployment", Some(FULLNAME)).unwrap()["spec"]["template"]["spec"];
    assert_eq!(spec["terminationGracePeriodSeconds"], 45);
    let c = &spec["containers"][0];
    let want = [
        ("livenessProbe", "/healthz", [20, 4, 6]),
        ("readinessProbe", "/readyz", [7, 3, 2]),
    ];
    for (probe, path, [period, timeout, failures]) in want {
        let p = &c[probe];
        assert_eq!(p["httpGet"]["path"], path, "{probe}");
        assert_eq!(p["periodSeconds"], period, "{probe}");
        assert_eq!(p["timeoutSeconds"], timeout, "{probe}");
        assert_eq!(p["failureThreshold"], failures, "{probe}");
    }
    assert_eq!(c["startupProbe"]["timeoutSeconds"], 5);
    // The defaults are those the chart always had.
    let (_, docs) = rendered(&helm, &[]);
    let spec = &find(&docs, "Deployment", Some(FULLNAME)).unwrap()["spec"]["template"]["spec"];
    assert_eq!(spec["terminationGracePeriodSeconds"], 30);
    assert_eq!(spec["containers"][0]["livenessProbe"]["periodSeconds"], 10);
    assert_eq!(spec["containers"][0]["readinessProbe"]["periodSeconds"], 5);
}

/// The image is built for amd64 only: by default every Pod of it needs an amd64 node, ANDed into
/// each of the user's own node selector terms; `image.architectures=[]` lifts it.
#[test]
fn pods_of_the_image_keep_to_its_architectures() {
    let helm = Helm::offline().unwrap();
    let arch_of = |term: &Value| -> Option<Value> {
        term["matchExpressions"]
            .as_array()?
            .iter()
            .find(|e| e["key"] == "kubernetes.io/arch")
            .map(|e| {
                assert_eq!(e["operator"], "In");
                e["values"].clone()
            })
    };
    let terms = |spec: &Value| -> Vec<Value> {
        spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    };
    // Every Pod, with every feature on (the simulator and the test Pod run the image too).
    let (_, docs) = rendered(&helm, ALL_ON);
    for (name, spec) in pod_specs(&docs) {
        let t = terms(spec);
        assert_eq!(t.len(), 1, "{name}: {t:?}");
        assert_eq!(arch_of(&t[0]), Some(serde_json::json!(["amd64"])), "{name}");
    }
    // The operator still prefers spreading its replicas.
    let d = find(&docs, "Deployment", Some(FULLNAME)).unwrap();
    assert!(d["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"].is_object());
    // The user's terms keep their own expressions and fields, each with the architecture added.
    let (_, docs) = rendered(
        &helm,
        &[
            "--set-json",
            r#"affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"pool","operator":"In","values":["ops"]}]},{"matchFields":[{"key":"metadata.name","operator":"In","values":["n1"]}]}]}}}"#,
        ],
    );
    let spec = &find(&docs, "Deployment", Some(FULLNAME)).unwrap()["spec"]["template"]["spec"];
    let t = terms(spec);
    assert_eq!(t.len(), 2, "{t:?}");
    assert_eq!(t[0]["matchExpressions"][0]["key"], "pool");
    assert_eq!(t[1]["matchFields"][0]["key"], "metadata.name");
    for term in &t {
        assert_eq!(arch_of(term), Some(serde_json::json!(["amd64"])), "{term}");
    }
    // Lifted.
    let (_, docs) = rendered(&helm, &["--set-json", "image.architectures=[]"]);
    for (name, spec) in pod_specs(&docs) {
        assert!(terms(spec).is_empty(), "{name}: {}", spec["affinity"]);
    }
}

/// `extraObjects`, maps or strings, go through `tpl`.
#[test]
fn extra_objects_are_rendered_with_tpl() {
    let helm = Helm::offline().unwrap();
    let (_, docs) = rendered(
        &helm,
        &[
            "--set-json",
            r#"extraObjects=[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"{{ include \"automanager.fullname\" . }}-extra","namespace":"{{ include \"automanager.namespace\" . }}"},"data":{"release":"{{ .Release.Name }}"}},"apiVersion: v1\nkind: Secret\nmetadata:\n  name: {{ .Release.Name }}-token\nstringData:\n  token: t\n"]"#,
        ],
    );
    let cm = find(&docs, "ConfigMap", Some("am-automanager-extra")).unwrap();
    assert_eq!(cm["metadata"]["namespace"], RELEASE_NAMESPACE);
    assert_eq!(cm["data"]["release"], RELEASE);
    find(&docs, "Secret", Some("am-token")).unwrap();
}

/// `namespaceOverride` moves every namespaced object of the release, and everything that names
/// the release's namespace (the Lease, the simulator's address, the test's URLs, the bindings'
/// subjects); the Roles in the watched namespaces and in `default` stay where they must be.
#[test]
fn namespace_override_moves_every_namespaced_object() {
    let helm = Helm::offline().unwrap();
    let mut args = ALL_ON.to_vec();
    args.extend_from_slice(&["--set", "namespaceOverride=ops"]);
    let (text, docs) = rendered(&helm, &args);
    assert!(
        !text.contains(RELEASE_NAMESPACE),
        "the release namespace is still named:\n{}",
        text.lines()
            .filter(|l| l.contains(RELEASE_NAMESPACE))
            .collect::<Vec<_>>()
            .join("\n")
    );
    for d in &docs {
        let Some(ns) = d["metadata"]["namespace"].as_str() else {
            continue;
        };
        let role_elsewhere = matches!(d["kind"].as_str(), Some("Role" | "RoleBinding"))
            && (ns == "video" || ns == "default");
        assert!(
            ns == "ops" || role_elsewhere,
            "{} {} is in {ns}",
            d["kind"],
            d["metadata"]["name"]
        );
    }
    let cm = find(&docs, "ConfigMap", Some(FULLNAME)).unwrap();
    let config: Value =
        serde_saphyr::from_str(cm["data"]["operator.yaml"].as_str().unwrap()).unwrap();
    assert_eq!(config["leaderElection"]["leaseNamespace"], "ops");
    assert_eq!(
        config["manager"]["url"],
        "http://am-automanager-manager-sim.ops.svc:6789"
    );
}

/// The chart's ClusterRoles never take the name of a role of deploy/rbac/user-roles.yaml,
/// whatever the release is called: the aggregated ones have names no user role has, and a
/// release whose full name is a user role's (the operator's own ClusterRole is named after it)
/// is refused, naming the clash.
#[test]
fn the_charts_cluster_roles_never_take_a_user_roles_name() {
    let helm = Helm::offline().unwrap();
    let loose: Vec<String> = documents(
        &std::fs::read_to_string(repo_root().join("deploy/rbac/user-roles.yaml")).unwrap(),
    )
    .unwrap()
    .iter()
    .map(|r| r["metadata"]["name"].as_str().unwrap().to_owned())
    .collect();
    for release in [
        "automanager",
        "am",
        "automanager-fleet",
        "automanager-views",
    ] {
        let out = helm
            .run([
                "template",
                release,
                chart_dir().to_str().unwrap(),
                IMAGE_VALUES[0],
                IMAGE_VALUES[1],
            ])
            .unwrap();
        assert!(out.success(), "{}", out.stderr);
        let docs = documents(&out.stdout).unwrap();
        let roles: Vec<&str> = docs
            .iter()
            .filter(|d| d["kind"] == "ClusterRole")
            .filter_map(|d| d["metadata"]["name"].as_str())
            .collect();
        assert!(
            roles.iter().any(|r| r.ends_with("-aggregate-to-view")),
            "{release}: {roles:?}"
        );
        for r in &roles {
            assert!(
                !loose.iter().any(|l| l == r),
                "release {release}: the chart's ClusterRole {r} is a user role's name"
            );
        }
    }
    for release in &loose {
        let out = helm
            .run([
                "template",
                release,
                chart_dir().to_str().unwrap(),
                IMAGE_VALUES[0],
                IMAGE_VALUES[1],
            ])
            .unwrap();
        assert!(!out.success(), "release {release} was rendered");
        assert!(
            out.stderr.contains(&format!(
                "the operator's ClusterRole would be named {release}, like a user role of deploy/rbac/user-roles.yaml"
            )),
            "{release}: {}",
            out.stderr
        );
    }
}

/// As docs/user-rbac.md and docs/install.md say, with the documented release name: the user
/// roles applied first, then `helm install`; applied again after it; `helm uninstall` leaves
/// every one of them (and the chart's aggregated roles go with the release).
#[tokio::test]
async fn the_user_roles_applied_before_or_after_the_install_survive_the_uninstall() {
    let env = TestEnv::start().await.unwrap();
    let helm = Helm::on(&env).unwrap();
    let chart = chart_dir();
    let user_roles = repo_root().join("deploy/rbac/user-roles.yaml");
    let loose: Vec<String> = documents(&std::fs::read_to_string(&user_roles).unwrap())
        .unwrap()
        .iter()
        .map(|r| r["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(loose.len(), 5, "{loose:?}");
    let out = env.apply_file(&user_roles).await.unwrap();
    assert!(out.success(), "{}", out.stderr);
    let out = helm
        .run([
            "install",
            "automanager",
            chart.to_str().unwrap(),
            "--namespace",
            RELEASE_NAMESPACE,
            "--create-namespace",
            IMAGE_VALUES[0],
            IMAGE_VALUES[1],
        ])
        .unwrap();
    assert!(
        out.success(),
        "helm install after the user roles: {}",
        out.stderr
    );
    for r in [
        "automanager-aggregate-to-view",
        "automanager-aggregate-to-edit",
    ] {
        assert!(exists(&env, &["clusterrole", r]).await, "{r} not installed");
    }
    // The user's roles are still the user's: helm did not adopt them.
    for r in &loose {
        let role = get_json(&env, &["clusterrole", r]).await;
        assert!(
            role["metadata"]["annotations"]["meta.helm.sh/release-name"].is_null(),
            "{r} belongs to the release: {role:#}"
        );
    }
    // Applied again after the install (the other documented order) changes nothing.
    let out = env.apply_file(&user_roles).await.unwrap();
    assert!(out.success(), "{}", out.stderr);
    let out = helm
        .run(["uninstall", "automanager", "--namespace", RELEASE_NAMESPACE])
        .unwrap();
    assert!(out.success(), "helm uninstall: {}", out.stderr);
    for r in &loose {
        assert!(
            exists(&env, &["clusterrole", r]).await,
            "helm uninstall deleted the user role {r}"
        );
    }
    for r in [
        "automanager-aggregate-to-view",
        "automanager-aggregate-to-edit",
    ] {
        assert!(
            !exists(&env, &["clusterrole", r]).await,
            "{r} survived the uninstall"
        );
    }
    println!("doc_order_install=pass roles_survive_uninstall=yes");
}

/// `kubectl auth can-i` with a TokenRequest token of the operator's ServiceAccount (`ARGS`).
async fn operator_can(kubeconfig: &Path, env: &TestEnv, args: &[&str]) -> bool {
    let mut cmd = env.kubectl();
    cmd.arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["auth", "can-i"])
        .args(args);
    let out = run(cmd, None).unwrap();
    match out.stdout.trim() {
        "yes" => true,
        "no" => false,
        other => panic!("kubectl auth can-i {args:?}: {other} {}", out.stderr),
    }
}

/// The operator's rights on Bundles, Migrations and Events, asked with its ServiceAccount's own
/// token: granted in every watched namespace by a Role there, for one, two or three watched
/// namespaces; anywhere else nothing (no read, no patch, no status, no Migration, no Event but in
/// `default`, for the cluster-scoped kinds), and nothing across all namespaces. Prints
/// `namespaces_rbac=exact/watched`: the watched namespaces whose rights were exactly these.
#[tokio::test]
async fn the_operator_has_its_namespaced_rights_where_it_watches() {
    // The CRDs, so that kubectl knows the kinds it asks about.
    let env = automanager_e2e::env_with_crds().await.unwrap();
    let helm = Helm::on(&env).unwrap();
    let chart = chart_dir();
    let dir = tempfile::tempdir().unwrap();
    for ns in ["news", "sports", "weather"] {
        kubectl_ok(&env, &["create", "namespace", ns]).await;
    }
    // (release, its namespace, the watched namespaces)
    let releases: &[(&str, &str, &[&str])] = &[
        ("one", "op-one", &["news"]),
        ("two", "op-two", &["news", "sports"]),
        ("three", "op-three", &["news", "sports", "weather"]),
    ];
    let bundles = "bundles.automanager.norsk.io";
    let migrations = "migrations.automanager.norsk.io";
    let mut wrong = Vec::new();
    let mut exact = 0;
    for (release, release_ns, watched) in releases {
        let mut args = vec![
            "install".to_owned(),
            (*release).to_owned(),
            chart.to_str().unwrap().to_owned(),
            "--namespace".into(),
            (*release_ns).to_owned(),
            "--create-namespace".into(),
            "--set".into(),
            "crds.install=false".into(),
            IMAGE_VALUES[0].into(),
            IMAGE_VALUES[1].into(),
        ];
        for (i, ns) in watched.iter().enumerate() {
            args.push("--set".into());
            args.push(format!("config.watchNamespaces[{i}]={ns}"));
        }
        let out = helm.run(&args).unwrap();
        assert!(out.success(), "helm install {release}: {}", out.stderr);
        let sa = format!("{release}-automanager");
        let kubeconfig =
            automanager_e2e::install::service_account_kubeconfig(&env, release_ns, &sa, dir.path())
                .await
                .unwrap();
        let wrong_before = wrong.len();
        for ns in ["news", "sports", "weather", "default"] {
            let in_watched = watched.contains(&ns);
            // Reading and writing: only where it watches (one watch per namespace).
            let reads = in_watched;
            let checks = [
                ("list", bundles, reads),
                ("watch", bundles, reads),
                ("list", migrations, reads),
                ("patch", bundles, in_watched),
                ("create", migrations, in_watched),
                ("patch", migrations, in_watched),
            ];
            for (verb, what, want) in checks {
                if operator_can(&kubeconfig, &env, &[verb, what, "-n", ns]).await != want {
                    wrong.push(format!("{release}: {verb} {what} -n {ns}: want {want}"));
                }
            }
            for what in [bundles, migrations] {
                let args = ["patch", what, "--subresource=status", "-n", ns];
                if operator_can(&kubeconfig, &env, &args).await != in_watched {
                    wrong.push(format!(
                        "{release}: patch {what}/status -n {ns}: want {in_watched}"
                    ));
                }
            }
            let events = in_watched || ns == "default";
            if operator_can(
                &kubeconfig,
                &env,
                &["create", "events.events.k8s.io", "-n", ns],
            )
            .await
                != events
            {
                wrong.push(format!("{release}: create events -n {ns}: want {events}"));
            }
            // Never: reading Events, deleting Bundles, Secrets.
            for (verb, what) in [
                ("list", "events.events.k8s.io"),
                ("delete", bundles),
                ("get", "secrets"),
            ] {
                if operator_can(&kubeconfig, &env, &[verb, what, "-n", ns]).await {
                    wrong.push(format!("{release}: {verb} {what} -n {ns}: want false"));
                }
            }
        }
        for (verb, what) in [
            ("list", bundles),
            ("watch", bundles),
            ("list", migrations),
            ("watch", migrations),
            ("patch", bundles),
            ("create", migrations),
            ("create", "events.events.k8s.io"),
        ] {
            if operator_can(&kubeconfig, &env, &[verb, what, "-A"]).await {
                wrong.push(format!("{release}: {verb} {what} -A: want false"));
            }
        }
        // A release's namespaces count as exact only if nothing about it was wrong.
        if wrong.len() == wrong_before {
            exact += watched.len();
        }
    }
    let watched: usize = releases.iter().map(|(_, _, w)| w.len()).sum();
    println!("namespaces_rbac={exact}/{watched}");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The kube-score checks the chart does not meet, each with why (docs/install.md lists them).
const KUBE_SCORE_IGNORED: &[(&str, &str)] = &[
    (
        "container-image-pull-policy",
        "the image is pinned by digest (image.digest), which never changes: IfNotPresent pulls it once, and Always would make every Pod start depend on the registry",
    ),
    (
        "container-ephemeral-storage-request-and-limit",
        "the root filesystem is read-only and no container writes files; their only ephemeral storage is their log, which the kubelet's log rotation bounds, and a limit would evict a replica for logging more than usual",
    ),
    (
        "pod-networkpolicy",
        "the NetworkPolicy is opt-in (networkPolicy.enabled: it needs your scrapers and, for egress, your Manager's address) and covers the operator's Pods; the helm test Pod and the simulator are not production workloads",
    ),
    (
        "pod-probes-identical",
        "manager-sim serves gRPC only, so both its probes are a TCP connect; the operator's differ (/healthz and /readyz)",
    ),
    (
        "deployment-replicas",
        "manager-sim runs one replica: it keeps its simulated fleet in memory, and two would be two different fleets",
    ),
];

/// kube-score (built from its Go module) on the rendered chart, with the defaults and with
/// every feature on: no critical finding and no warning but the ignored ones, and memory
/// requested as much as its limit (an optional check, turned on).
#[test]
fn kube_score_finds_nothing_unexplained() {
    let helm = Helm::offline().unwrap();
    let kube_score = automanager_e2e::install::tool("kube-score").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let digest = format!("image.digest=sha256:{}", "a".repeat(64));
    let mut unexplained = Vec::new();
    // Every feature on, with the chart's user and group (ALL_ON clears them, as under
    // OpenShift, where the platform assigns a UID that kube-score cannot see).
    let all_on: Vec<&str> = ALL_ON
        .chunks(2)
        .filter(|flag| !flag[1].starts_with("podSecurityContext.runAs"))
        .flatten()
        .copied()
        .collect();
    for (name, extra) in [("defaults", &[][..]), ("all-on", &all_on[..])] {
        let mut args = vec!["--set", digest.as_str()];
        args.extend_from_slice(extra);
        let rendered = helm.template(&chart_dir(), &args).unwrap();
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, rendered).unwrap();
        let mut cmd = std::process::Command::new(&kube_score);
        cmd.args([
            "score",
            "--kubernetes-version",
            "v1.35",
            "--output-format",
            "json",
            "--enable-optional-test",
            "container-memory-requests-equal-limits",
        ]);
        for (check, _) in KUBE_SCORE_IGNORED {
            cmd.args(["--ignore-test", check]);
        }
        cmd.arg(&file);
        let out = run(cmd, None).unwrap();
        let objects: Vec<Value> = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("kube-score {name}: {e}: {}{}", out.stdout, out.stderr));
        // It scores the workloads, Services, budgets and policies.
        assert!(objects.len() >= 4, "{name}: {} objects", objects.len());
        let mut memory_checked = 0;
        for o in &objects {
            for c in o["checks"].as_array().unwrap() {
                let id = c["check"]["id"].as_str().unwrap();
                if c["skipped"] == true {
                    continue;
                }
                if id == "container-memory-requests-equal-limits" {
                    memory_checked += 1;
                }
                // kube-score's grades: 1 critical, 5 warning, 7 almost OK, 10 OK.
                if c["grade"].as_i64().unwrap() <= 5 {
                    let comments: Vec<String> = c["comments"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|m| format!("{} {}", m["summary"], m["description"]))
                        .collect();
                    unexplained.push(format!(
                        "{name}: {} {id}: {}",
                        o["object_name"],
                        comments.join("; ")
                    ));
                }
            }
        }
        assert!(
            memory_checked >= 2,
            "{name}: the memory check ran on {memory_checked} Pods"
        );
    }
    println!("kube_score_unexplained={}", unexplained.len());
    assert!(unexplained.is_empty(), "{}", unexplained.join("\n"));
    // Each ignored check is explained where users read it.
    let doc = std::fs::read_to_string(repo_root().join("docs/install.md")).unwrap();
    for (check, _) in KUBE_SCORE_IGNORED {
        assert!(
            doc.contains(&format!("`{check}`")),
            "docs/install.md does not explain why {check} is ignored"
        );
    }
}

/// A schema node made ready for kubeconform: `additionalProperties: false` on every object that
/// lists its properties (what makes kubeconform's `-strict` schemas strict; not where unknown
/// fields are kept on purpose), int-or-string as either, and every `$ref` collected.
fn strict_schema(node: &mut Value, refs: &mut std::collections::BTreeSet<String>) {
    match node {
        Value::Object(map) => {
            let int_or_string = map.get("format").and_then(Value::as_str) == Some("int-or-string")
                || map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
            if int_or_string {
                map.remove("type");
                map.remove("format");
                map.insert(
                    "oneOf".into(),
                    serde_json::json!([{"type": "string"}, {"type": "integer"}]),
                );
            }
            if let Some(r) = map.get("$ref").and_then(Value::as_str) {
                refs.insert(r.trim_start_matches("#/definitions/").to_owned());
            }
            let keeps_unknown =
                map.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
            if map.contains_key("properties")
                && !map.contains_key("additionalProperties")
                && !keeps_unknown
            {
                map.insert("additionalProperties".into(), Value::Bool(false));
            }
            for (k, v) in map.iter_mut() {
                // `properties` maps names to schemas: walk the schemas, not the map as one.
                if k == "properties" || k == "definitions" {
                    for s in v.as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
                        strict_schema(s, refs);
                    }
                } else {
                    strict_schema(v, refs);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|v| strict_schema(v, refs)),
        _ => {}
    }
}

/// kubeconform's schemas, one file per kind the apiserver serves, written from its OpenAPI v2
/// document (so no schema is downloaded, and they are exactly the served ones, the CRDs'
/// included): `<dir>/<group or v1>/<version>/<kind>.json`, each with the definitions it refers
/// to. Returns how many were written.
fn kubeconform_schemas(openapi: &Value, dir: &Path) -> usize {
    let defs = openapi["definitions"].as_object().unwrap();
    let mut written = 0;
    for (name, def) in defs {
        let Some(gvks) = def["x-kubernetes-group-version-kind"].as_array() else {
            continue;
        };
        // The definition and everything it refers to, made strict.
        let mut out = serde_json::Map::new();
        let mut todo = vec![name.clone()];
        while let Some(n) = todo.pop() {
            if out.contains_key(&n) {
                continue;
            }
            let mut d = defs[&n].clone();
            if n == "io.k8s.apimachinery.pkg.api.resource.Quantity" {
                d = serde_json::json!({"oneOf": [{"type": "string"}, {"type": "number"}]});
            }
            let mut refs = std::collections::BTreeSet::new();
            strict_schema(&mut d, &mut refs);
            out.insert(n, d);
            todo.extend(refs);
        }
        let schema = serde_json::json!({
            "definitions": out,
            "$ref": format!("#/definitions/{name}"),
        });
        for gvk in gvks {
            let group = gvk["group"].as_str().unwrap_or_default();
            let version = gvk["version"].as_str().unwrap();
            let kind = gvk["kind"].as_str().unwrap().to_lowercase();
            let group_dir = if group.is_empty() { version } else { group };
            let path = dir
                .join(group_dir)
                .join(version)
                .join(format!("{kind}.json"));
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, schema.to_string()).unwrap();
            written += 1;
        }
    }
    written
}

/// kubeconform, strict (no field the schema does not know, no key written twice), on the chart
/// rendered with every values variant the suites use, on the user roles and on every example
/// (examples/, the deploy/gitops kustomization and the Argo CD health checks' ConfigMap), against
/// the schemas of the apiserver they are applied to (1.35.4, with the CRDs installed). The
/// Flux and Argo CD objects of deploy/gitops are not: neither tool's CRDs are here (the
/// gitops suite checks their fields).
#[tokio::test]
async fn kubeconform_strict_finds_no_error_in_any_variant_or_example() {
    let env = automanager_e2e::env_with_crds().await.unwrap();
    for fixture in ["servicemonitor-crd.yaml", "prometheusrule-crd.yaml"] {
        let out = env
            .apply_file(repo_root().join("tests/e2e/fixtures").join(fixture))
            .await
            .unwrap();
        assert!(out.success(), "{}", out.stderr);
    }
    env.wait_for_crds_established(
        [
            "servicemonitors.monitoring.coreos.com",
            "prometheusrules.monitoring.coreos.com",
        ],
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    // The CRDs' schemas reach /openapi/v2 a moment after they are established.
    let mut openapi = Value::Null;
    for _ in 0..60 {
        openapi = serde_json::from_str(&kubectl_ok(&env, &["get", "--raw", "/openapi/v2"]).await)
            .unwrap();
        let defs = openapi["definitions"].as_object().unwrap();
        if defs.keys().any(|k| k.ends_with(".v1alpha1.Bundle"))
            && defs.keys().any(|k| k.ends_with(".v1.ServiceMonitor"))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let dir = tempfile::tempdir().unwrap();
    let schemas = dir.path().join("schemas");
    let written = kubeconform_schemas(&openapi, &schemas);
    assert!(written > 50, "{written} schemas");
    assert!(
        schemas
            .join("automanager.norsk.io/v1alpha1/bundle.json")
            .is_file()
    );

    // What is validated: every values variant, the user roles, every example.
    let helm = Helm::offline().unwrap();
    let digest = format!("image.digest=sha256:{}", "a".repeat(64));
    let variants: Vec<(&str, Vec<&str>)> = vec![
        ("defaults", vec![]),
        ("all-on", ALL_ON.to_vec()),
        ("digest", vec!["--set", &digest]),
        (
            "details",
            vec![
                "--set",
                "namespaceOverride=ops",
                "--set",
                "podLabels.app\\.kubernetes\\.io/name=automanager",
                "--set",
                "podLabels.team=news",
                "--set",
                "commonLabels.team=video",
                "--set",
                "config.watchNamespaces[0]=news",
                "--set",
                "config.watchNamespaces[1]=sports",
                "--set-json",
                "image.architectures=[]",
                "--set",
                "startupProbe.enabled=false",
                "--set-json",
                r#"extraObjects=[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"extra"},"data":{"a":"b"}}]"#,
                "--set-json",
                r#"affinity={"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"pool","operator":"In","values":["ops"]}]}]}}}"#,
            ],
        ),
        (
            "one-replica",
            vec![
                "--set",
                "replicaCount=1",
                "--set",
                "config.leaderElection.enabled=false",
                "--set",
                "podDisruptionBudget.maxUnavailable=50%",
                "--set",
                "rbac.aggregateToDefaultRoles=false",
                "--set",
                "crds.install=false",
            ],
        ),
    ];
    let mut files = Vec::new();
    for (name, args) in &variants {
        let path = dir.path().join(format!("chart-{name}.yaml"));
        std::fs::write(&path, helm.template(&chart_dir(), args).unwrap()).unwrap();
        files.push(path);
    }
    files.push(repo_root().join("deploy/rbac/user-roles.yaml"));
    for entry in std::fs::read_dir(repo_root().join("examples")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "yaml") {
            files.push(p);
        }
    }
    for (name, kustomization) in [
        ("gitops", "deploy/gitops"),
        ("argocd-cm", "deploy/gitops/argocd/resource_customizations"),
    ] {
        let built = kubectl_ok(
            &env,
            &[
                "kustomize",
                repo_root().join(kustomization).to_str().unwrap(),
            ],
        )
        .await;
        let path = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&path, built).unwrap();
        files.push(path);
    }

    let mut cmd =
        std::process::Command::new(automanager_e2e::install::tool("kubeconform").unwrap());
    cmd.arg("-strict")
        .arg("-summary")
        .args(["-output", "json"])
        .arg("-schema-location")
        .arg(format!(
            "{}/{{{{ .Group }}}}/{{{{ .ResourceAPIVersion }}}}/{{{{ .ResourceKind }}}}.json",
            schemas.display()
        ))
        .args(&files);
    let out = run(cmd, None).unwrap();
    let report: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("kubeconform: {e}: {}{}", out.stdout, out.stderr));
    let summary = &report["summary"];
    let problems: Vec<String> = report["resources"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["status"] != "statusValid")
        .map(|r| {
            format!(
                "{} {} {}: {} {}",
                r["filename"], r["kind"], r["name"], r["status"], r["msg"]
            )
        })
        .collect();
    let errors =
        summary["invalid"].as_i64().unwrap_or(-1) + summary["errors"].as_i64().unwrap_or(-1);
    println!(
        "kubeconform_errors={errors} valid={} skipped={}",
        summary["valid"], summary["skipped"]
    );
    assert!(
        problems.is_empty() && errors == 0,
        "{summary}\n{}",
        problems.join("\n")
    );
    assert!(summary["valid"].as_i64().unwrap() >= 100, "{summary}");
    assert_eq!(summary["skipped"], 0, "{summary}");

    // The check is real: a field no schema knows (in a built-in kind and in ours), a wrong type,
    // and a label written twice (what podLabels repeating a selector label used to render) are
    // each refused.
    // (name, document, what the refusal names)
    let bad = [
        (
            "unknown-field",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\nspec:\n  replicass: 2\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec: {containers: [{name: c, image: x}]}\n",
            "'replicass' not allowed",
        ),
        (
            "unknown-bundle-field",
            "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {name: b}\nspec: {replicas: 1, pools: [p], jobs: [], colour: red}\n",
            "'colour' not allowed",
        ),
        (
            "wrong-type",
            "apiVersion: v1\nkind: Service\nmetadata: {name: s}\nspec: {ports: [{port: http}]}\n",
            "/spec/ports/0/port",
        ),
        (
            "duplicate-label",
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  labels:\n    app.kubernetes.io/name: automanager\n    app.kubernetes.io/name: other\n",
            "app.kubernetes.io/name",
        ),
    ];
    for (name, yaml, names) in bad {
        let path = dir.path().join(format!("bad-{name}.yaml"));
        std::fs::write(&path, yaml).unwrap();
        let mut cmd =
            std::process::Command::new(automanager_e2e::install::tool("kubeconform").unwrap());
        cmd.arg("-strict")
            .arg("-schema-location")
            .arg(format!(
                "{}/{{{{ .Group }}}}/{{{{ .ResourceAPIVersion }}}}/{{{{ .ResourceKind }}}}.json",
                schemas.display()
            ))
            .arg(&path);
        let out = run(cmd, None).unwrap();
        assert!(
            !out.success(),
            "{name} passed kubeconform: {}{}",
            out.stdout,
            out.stderr
        );
        assert!(
            out.stdout.contains(names) || out.stderr.contains(names),
            "{name}: the refusal does not name {names}: {}{}",
            out.stdout,
            out.stderr
        );
    }
}

/// The operator itself, authenticated with a token of the chart's ServiceAccount, watching
/// `watched` (of news, sports, weather): it places the Bundles of the watched namespaces, writes
/// their Events there, leaves the Bundles of the others alone, and is never refused (no 403 in
/// its log): the Roles per watched namespace are all it needs. The same token is then asked
/// (`kubectl auth can-i`) what it may read: Bundles and Migrations in each watched namespace,
/// in no other and not across all namespaces; prints `namespaces_rbac=exact/watched`.
async fn operator_with_the_charts_rights_over(watched: &[&str]) {
    let env = TestEnv::start().await.unwrap();
    // The release under test (`AUTOMANAGER_K8S_BIN` picks it; `make test-install` runs this
    // against each Kubernetes minor of docs/install.md#supported-kubernetes).
    let version: Value =
        serde_json::from_str(&kubectl_ok(&env, &["version", "-o", "json"]).await).unwrap();
    println!(
        "k8s_server={}",
        version["serverVersion"]["gitVersion"]
            .as_str()
            .unwrap_or("unknown")
    );
    let helm = Helm::on(&env).unwrap();
    let all = ["news", "sports", "weather"];
    for ns in all {
        kubectl_ok(&env, &["create", "namespace", ns]).await;
    }
    let mut args: Vec<String> = [
        "install",
        RELEASE,
        chart_dir().to_str().unwrap(),
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        IMAGE_VALUES[0],
        IMAGE_VALUES[1],
    ]
    .iter()
    .map(|a| (*a).to_owned())
    .collect();
    for (i, ns) in watched.iter().enumerate() {
        args.push("--set".into());
        args.push(format!("config.watchNamespaces[{i}]={ns}"));
    }
    let out = helm.run(&args).unwrap();
    assert!(out.success(), "helm install: {}", out.stderr);
    env.wait_for_crds_established(crd_names(), Duration::from_secs(60))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = automanager_e2e::install::service_account_kubeconfig(
        &env,
        RELEASE_NAMESPACE,
        FULLNAME,
        dir.path(),
    )
    .await
    .unwrap();
    let sim_config = stack::patient_sim_config(dir.path()).unwrap();
    let namespaces = serde_json::json!(watched);
    let token = kubeconfig.clone();
    let stack = stack::Stack::start_on(env, &sim_config, &[], Some(kubeconfig), |c| {
        c.insert(
            "leaderElection".into(),
            serde_json::json!(
                {"enabled": true, "leaseName": FULLNAME, "leaseNamespace": RELEASE_NAMESPACE}
            ),
        );
        c.insert("watchNamespaces".into(), namespaces);
    })
    .await
    .unwrap();
    let out = stack
        .env
        .apply_file(repo_root().join("examples/pools.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    for ns in all {
        let out = stack
            .env
            .apply_yaml(&format!(
                "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: channel, namespace: {ns}}}\nspec:\n  replicas: 1\n  pools: [aws-east]\n  jobs:\n    - jobName: enc\n      requirements: {{requiredCapacity: 10, requiredCores: 1, priorityBand: gold}}\n"
            ))
            .await
            .unwrap();
        assert!(out.success(), "{}", out.stderr);
    }
    for ns in watched {
        stack
            .wait_bundle_phase(ns, "channel", "Ready", Duration::from_secs(120))
            .await
            .unwrap();
    }
    // Its Events, in the watched namespaces (they are published off the reconcile path).
    stack
        .wait_for(
            "Placed Events in the watched namespaces",
            Duration::from_secs(30),
            || async {
                let events = stack.get_json(&["events.events.k8s.io", "-A"]).await?;
                let placed = |ns: &&str| {
                    events["items"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|e| e["metadata"]["namespace"] == *ns && e["reason"] == "Placed")
                };
                Ok(watched.iter().all(placed).then_some(()))
            },
        )
        .await
        .unwrap();
    for ns in all.iter().filter(|ns| !watched.contains(ns)) {
        let other = stack
            .get_json(&["bundle", "channel", "-n", ns])
            .await
            .unwrap();
        assert!(
            other["status"].is_null() && other["metadata"]["finalizers"].is_null(),
            "the operator touched a Bundle of unwatched {ns}: {other:#}"
        );
    }
    let bundles = "bundles.automanager.norsk.io";
    let migrations = "migrations.automanager.norsk.io";
    let mut wrong = Vec::new();
    let mut granted = 0;
    for ns in all.iter().chain(&["default"]) {
        let want = watched.contains(ns);
        let mut as_wanted = true;
        for (verb, what) in [
            ("list", bundles),
            ("watch", bundles),
            ("list", migrations),
            ("watch", migrations),
        ] {
            if operator_can(&token, &stack.env, &[verb, what, "-n", ns]).await != want {
                as_wanted = false;
                wrong.push(format!("{verb} {what} -n {ns}: want {want}"));
            }
        }
        if want && as_wanted {
            granted += 1;
        }
    }
    for (verb, what) in [
        ("list", bundles),
        ("watch", bundles),
        ("list", migrations),
        ("watch", migrations),
    ] {
        if operator_can(&token, &stack.env, &[verb, what, "--all-namespaces"]).await {
            wrong.push(format!("{verb} {what} --all-namespaces: want false"));
        }
    }
    // Exact: granted in every watched namespace, and refused everywhere else.
    let exact = if wrong.iter().any(|w| w.ends_with("want false")) {
        0
    } else {
        granted
    };
    println!("namespaces_rbac={exact}/{}", watched.len());
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    let log = stack.operator.log_text();
    for refused in ["forbidden", "Forbidden", " 403"] {
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(refused))
            .take(10)
            .collect();
        assert!(
            lines.is_empty(),
            "the ServiceAccount was refused something:\n{}",
            lines.join("\n")
        );
    }
}

#[tokio::test]
async fn the_operator_works_with_the_charts_rights_over_one_watched_namespace() {
    operator_with_the_charts_rights_over(&["news"]).await;
}

#[tokio::test]
async fn the_operator_works_with_the_charts_rights_over_two_watched_namespaces() {
    operator_with_the_charts_rights_over(&["news", "sports"]).await;
}

/// The PrometheusRule's rules: alert name → the rule as rendered.
fn rendered_alerts(helm: &Helm, args: &[&str]) -> std::collections::BTreeMap<String, Value> {
    let mut all = vec!["--set", "metrics.prometheusRule.enabled=true"];
    all.extend_from_slice(args);
    let (_, docs) = rendered(helm, &all);
    let rule = find(&docs, "PrometheusRule", Some(FULLNAME)).unwrap();
    alerts_of(&rule["spec"]["groups"])
}

fn alerts_of(groups: &Value) -> std::collections::BTreeMap<String, Value> {
    groups
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .map(|r| (r["alert"].as_str().unwrap().to_owned(), r))
        .collect()
}

/// Alerts can be left out one by one and given labels from values: every alert, then each
/// alert by name, over the labels of deploy/prometheus/rules.yaml; everything else about a
/// rule is as written there. A name the chart has no alert of, or a label name Prometheus
/// would refuse, fails the render and says which.
#[test]
fn alerts_are_turned_off_and_labelled_from_values() {
    let helm = Helm::offline().unwrap();
    let source: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(repo_root().join("deploy/prometheus/rules.yaml")).unwrap(),
    )
    .unwrap();
    let source = alerts_of(&source["groups"]);
    assert_eq!(
        rendered_alerts(&helm, &[]),
        source,
        "with no settings the rules are deploy/prometheus/rules.yaml's"
    );

    let alerts = rendered_alerts(
        &helm,
        &[
            "--set",
            "metrics.prometheusRule.alerts.AutoManagerOrphansRemoved.enabled=false",
            "--set",
            "metrics.prometheusRule.alerts.AutoManagerPoolSaturated.labels.severity=critical",
            "--set",
            "metrics.prometheusRule.alerts.AutoManagerPoolSaturated.labels.pager=storage",
            "--set",
            "metrics.prometheusRule.alerts.AutoManagerNoLeader.enabled=true",
            "--set",
            "metrics.prometheusRule.additionalAlertLabels.team=video",
            "--set",
            "metrics.prometheusRule.additionalAlertLabels.pager=oncall",
        ],
    );
    let expected: Vec<&String> = source
        .keys()
        .filter(|n| *n != "AutoManagerOrphansRemoved")
        .collect();
    assert_eq!(alerts.keys().collect::<Vec<_>>(), expected);
    for (name, rule) in &alerts {
        let own = &source[name];
        let labels = rule["labels"].as_object().unwrap();
        assert_eq!(labels["team"], "video", "{name}: {labels:?}");
        if name == "AutoManagerPoolSaturated" {
            assert_eq!(labels["severity"], "critical", "the alert's labels win");
            assert_eq!(labels["pager"], "storage", "over additionalAlertLabels");
        } else {
            assert_eq!(labels["severity"], own["labels"]["severity"], "{name}");
            assert_eq!(labels["pager"], "oncall", "{name}");
        }
        let mut without_labels = rule.clone();
        let mut own_without_labels = own.clone();
        without_labels.as_object_mut().unwrap().remove("labels");
        own_without_labels.as_object_mut().unwrap().remove("labels");
        assert_eq!(without_labels, own_without_labels, "{name}");
    }

    for (set, says) in [
        (
            "metrics.prometheusRule.alerts.AutoManagerOrphanRemoved.enabled=false",
            "metrics.prometheusRule.alerts.AutoManagerOrphanRemoved: the chart has no alert of that name",
        ),
        (
            "metrics.prometheusRule.additionalAlertLabels.on-call=yes",
            "metrics.prometheusRule.additionalAlertLabels: \"on-call\" is not a Prometheus label name",
        ),
        (
            "metrics.prometheusRule.alerts.AutoManagerNoLeader.labels.9=x",
            "metrics.prometheusRule.alerts.AutoManagerNoLeader.labels: \"9\" is not a Prometheus label name",
        ),
    ] {
        let err = helm
            .template(
                &chart_dir(),
                &["--set", "metrics.prometheusRule.enabled=true", "--set", set],
            )
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "--set {set}: {err}");
    }
}
