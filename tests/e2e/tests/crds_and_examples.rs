//! Foundation scenarios: AutoManager's CRDs on a real kube-apiserver, applied and explained with
//! the kubectl of the same release, as a user would.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use automanager_e2e::{crds_dir, env_with_crds, examples_dir, expected_error};

#[tokio::test]
async fn every_crd_is_established_and_the_examples_apply_cleanly() {
    let env = env_with_crds().await.expect("control plane with CRDs");

    // Pools and spare targets are cluster-scoped and referenced by name only, so one apply of the
    // directory works in any order.
    let out = env.apply_file(examples_dir()).await.unwrap();
    assert!(
        out.success(),
        "examples/ must apply cleanly:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    for name in [
        "bundle.automanager.norsk.io/my-channel-1",
        "placementpool.automanager.norsk.io/aws-east",
    ] {
        assert!(
            out.stdout.contains(name),
            "{name} missing from apply output:\n{}",
            out.stdout
        );
    }

    // The cross-cloud DR bundle keeps its replica override and gets the inter-replica defaults.
    let out = env
        .run_kubectl([
            "get",
            "bundle",
            "my-channel-1",
            "-n",
            "default",
            "-o",
            "json",
        ])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let bundle: automanager_api::Bundle = serde_json::from_str(&out.stdout).unwrap();
    let first_override = bundle.spec.replica_overrides.first();
    assert_eq!(first_override.map(|o| o.replica), Some(1));
    assert_eq!(
        first_override
            .and_then(|o| o.pools.first())
            .map(String::as_str),
        Some("oci-fra")
    );
    let bronze = env
        .run_kubectl([
            "get",
            "bundle",
            "preview-bronze",
            "-n",
            "default",
            "-o",
            "json",
        ])
        .await
        .unwrap();
    // Read as JSON, not as a Bundle: decoding a Bundle fills in the same defaults client-side,
    // and this checks that the apiserver applied them.
    let bronze: serde_json::Value = serde_json::from_str(&bronze.stdout).unwrap();
    assert_eq!(
        bronze["spec"]["interReplicaPlacement"]["node"]["relation"], "different",
        "default applied"
    );
    assert_eq!(
        bronze["spec"]["interReplicaPlacement"]["node"]["enforcement"],
        "hard"
    );
    assert_eq!(
        bronze["spec"]["interReplicaPlacement"]["zone"]["relation"],
        "same"
    );
    assert_eq!(
        bronze["spec"]["interReplicaPlacement"]["zone"]["enforcement"],
        "soft"
    );

    // `kubectl get automanager` lists every kind through the category.
    let out = env.run_kubectl(["get", "automanager", "-A"]).await.unwrap();
    assert!(out.success(), "{}", out.stderr);
    for kind in [
        "bundle.automanager.norsk.io",
        "placementpool.automanager.norsk.io",
        "hotsparetarget.automanager.norsk.io",
    ] {
        assert!(
            out.stdout.contains(kind),
            "`kubectl get automanager` lacks {kind}:\n{}",
            out.stdout
        );
    }
    assert!(
        out.stdout.contains("REPLICAS") && out.stdout.contains("PHASE"),
        "printer columns:\n{}",
        out.stdout
    );
    // Short names resolve.
    for short in ["bdl", "ppool", "hst", "amig", "mnode"] {
        let out = env.run_kubectl(["get", short, "-A"]).await.unwrap();
        assert!(out.success(), "short name {short}: {}", out.stderr);
    }
}

#[tokio::test]
async fn every_invalid_example_is_rejected_with_its_message() {
    let env = env_with_crds().await.expect("control plane with CRDs");
    let dir = examples_dir().join("invalid");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 15,
        "at least 15 invalid cases, found {}",
        files.len()
    );

    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let Some(expect) = expected_error(&text) else {
            failures.push(format!("{}: no `# expect:` header", file.display()));
            continue;
        };
        let out = env.apply_file(file).await.unwrap();
        let said = format!("{}{}", out.stdout, out.stderr);
        if out.success() {
            failures.push(format!(
                "{}: accepted, but should fail with {expect:?}",
                file.display()
            ));
        } else if !said.contains(expect) {
            failures.push(format!(
                "{}: expected {expect:?}, got: {said}",
                file.display()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} invalid examples misbehaved:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );

    // Nothing of them was stored.
    let out = env
        .run_kubectl(["get", "automanager", "-A", "-o", "name"])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(out.stdout.trim(), "", "rejected objects must not exist");
}

#[tokio::test]
async fn unsafe_updates_are_refused_by_transition_rules() {
    let env = env_with_crds().await.expect("control plane with CRDs");
    let out = env.apply_file(examples_dir()).await.unwrap();
    assert!(out.success(), "{}", out.stderr);

    // Renaming a job in place would lose track of its running instances.
    let bands = std::fs::read_to_string(examples_dir().join("bands.yaml")).unwrap();
    let renamed = bands.replace("jobName: thumbnails", "jobName: thumbs");
    let out = env.apply_yaml(&renamed).await.unwrap();
    assert!(!out.success());
    assert!(
        out.stderr.contains("a job cannot be renamed in place"),
        "{}",
        out.stderr
    );

    // Adding a job (without removing one) is fine, and so is removing one afterwards.
    let added = bands.replace(
        "      requirements: { requiredCapacity: 3, requiredCores: 1, priorityBand: bronze }\n",
        "      requirements: { requiredCapacity: 3, requiredCores: 1, priorityBand: bronze }\n    - jobName: thumbs\n      requirements: { requiredCapacity: 3, requiredCores: 1, priorityBand: bronze }\n",
    );
    let out = env.apply_yaml(&added).await.unwrap();
    assert!(out.success(), "adding a job: {}", out.stderr);

    // A pool's kind and region are immutable.
    let out = env
        .run_kubectl([
            "patch",
            "placementpool",
            "onprem",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"kind":"aws"}}"#,
        ])
        .await
        .unwrap();
    assert!(!out.success());
    assert!(out.stderr.contains("kind is immutable"), "{}", out.stderr);

    // A migration's job cannot be retargeted, and an abort cannot be withdrawn.
    let migration = r#"
apiVersion: automanager.norsk.io/v1alpha1
kind: Migration
metadata: { name: move-encode, namespace: default }
spec:
  job: { bundle: my-channel-1, replica: 0, jobName: encode }
  abort: { reason: changed my mind }
"#;
    let out = env.apply_yaml(migration).await.unwrap();
    assert!(out.success(), "{}", out.stderr);
    let out = env
        .apply_yaml(&migration.replace("replica: 0", "replica: 1"))
        .await
        .unwrap();
    assert!(out.stderr.contains("job is immutable"), "{}", out.stderr);
    let out = env
        .run_kubectl([
            "patch",
            "migration",
            "move-encode",
            "-n",
            "default",
            "--type",
            "json",
            "-p",
            r#"[{"op":"remove","path":"/spec/abort"}]"#,
        ])
        .await
        .unwrap();
    assert!(
        out.stderr.contains("an abort cannot be withdrawn"),
        "{}",
        out.stderr
    );
}

#[tokio::test]
async fn kubectl_explain_shows_the_field_descriptions() {
    let env = env_with_crds().await.expect("control plane with CRDs");
    // The apiserver publishes a new CRD's OpenAPI a moment after it is Established.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let out = loop {
        let out = env
            .run_kubectl(["explain", "bundle.spec.jobs.requirements"])
            .await
            .unwrap();
        if out.success() || std::time::Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    };
    assert!(out.success(), "{}", out.stderr);
    for needle in [
        "requiredCapacity",
        "benchmarked reference-workload units",
        "priorityBand",
        "gold, silver, bronze",
    ] {
        assert!(
            out.stdout.contains(needle),
            "explain lacks {needle:?}:\n{}",
            out.stdout
        );
    }
    let out = env
        .run_kubectl(["explain", "bundle.spec.replicaOverrides"])
        .await
        .unwrap();
    assert!(
        out.stdout.contains("list keyed by `replica`"),
        "{}",
        out.stdout
    );
    let out = env
        .run_kubectl(["explain", "placementpool.spec.candidateInstanceTypes"])
        .await
        .unwrap();
    assert!(out.stdout.contains("totalCapacity"), "{}", out.stdout);
}

/// The apiserver refuses windows and spare schedules that can never open in the plain forms
/// its CEL can judge (no listed day in any listed month), naming the field and saying it never
/// opens; everything else it accepts: patterns that open (29 February does, in leap years), and
/// ranges and steps, which only the operator's calendar reads (it reports one that never opens
/// as Stalled InvalidSpec). The rule must also pass the apiserver's cost estimate, which
/// installing the CRDs at all proves.
#[tokio::test]
async fn windows_that_never_open_are_refused_at_admission() {
    let env = env_with_crds().await.expect("control plane with CRDs");
    let bundle = |name: &str, schedule: &str| {
        format!(
            r#"
apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: {{ name: {name}, namespace: default }}
spec:
  replicas: 1
  pools: [aws-east]
  jobs:
    - jobName: encode
      requirements: {{ requiredCapacity: 8, requiredCores: 4, priorityBand: gold }}
  disruption:
    windows:
      - {{ schedule: '0 2 * * SAT', duration: 2h }}
      - {{ schedule: '{schedule}', duration: 2h, timeZone: Europe/Oslo }}
"#
        )
    };
    let spares = |name: &str, schedule: &str| {
        format!(
            r#"
apiVersion: automanager.norsk.io/v1alpha1
kind: HotSpareTarget
metadata: {{ name: {name} }}
spec:
  pool: aws-east
  spec: {{ instanceType: m5.xlarge, region: eu-west-1 }}
  schedules:
    - {{ schedule: '{schedule}', duration: 5h30m, hot: {{ count: 2 }} }}
"#
        )
    };
    let refused = [
        "0 0 31 2 *",
        "0 0 30,31 2 *",
        "0 0 31 4,6,9,11 *",
        "15 3 31 feb ?",
        "0 0 31 APR,Jun,sep,NOV *",
        "0 0 30 02 *",
    ];
    let accepted = [
        "0 0 29 2 *",
        "0 0 31 1-12 *",
        "*/5 * * * *",
        // A day of the week named: cron opens on either, so this opens every Monday.
        "0 0 31 2 MON",
        "0 0 31 1,2 *",
        // Ranges and steps: the operator's calendar judges these.
        "0 0 30-31 2 *",
        "0 0 31 4-6/2 *",
        "@monthly",
    ];
    let mut failures = Vec::new();
    for (i, s) in refused.iter().enumerate() {
        for (kind, yaml, field) in [
            (
                "Bundle",
                bundle(&format!("never-{i}"), s),
                "spec.disruption.windows[1].schedule",
            ),
            (
                "HotSpareTarget",
                spares(&format!("never-{i}"), s),
                "spec.schedules[0].schedule",
            ),
        ] {
            let out = env.apply_yaml(&yaml).await.unwrap();
            let said = format!("{}{}", out.stdout, out.stderr);
            if out.success() {
                failures.push(format!("{kind} with {s:?}: accepted"));
            } else if !said.contains(field) || !said.contains("schedule never opens") {
                failures.push(format!("{kind} with {s:?}: refused, but said: {said}"));
            }
        }
    }
    for (i, s) in accepted.iter().enumerate() {
        for (kind, yaml) in [
            ("Bundle", bundle(&format!("opens-{i}"), s)),
            ("HotSpareTarget", spares(&format!("opens-{i}"), s)),
        ] {
            let out = env.apply_yaml(&yaml).await.unwrap();
            if !out.success() {
                failures.push(format!("{kind} with {s:?}: refused: {}", out.stderr));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Only the accepted ones were stored.
    let out = env
        .run_kubectl(["get", "bundles,hotsparetargets", "-A", "-o", "name"])
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    assert_eq!(
        out.stdout.lines().count(),
        accepted.len() * 2,
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains("never-"), "{}", out.stdout);
    println!("reliability4-figure never_open_window=refused");
}

/// A Bundle stored with a window that never opens before the apiserver had the rule (an
/// upgrade) stays editable: the apiserver checks only the fields an update changes (CRD
/// validation ratcheting), so the operator can still write its `Stalled` status and a person can
/// change other fields, while a new window that never opens is refused.
#[tokio::test]
async fn a_window_stored_before_the_rule_stays_editable_and_is_not_made_worse() {
    let env = env_with_crds().await.expect("control plane with CRDs");
    let crd = std::fs::read_to_string(crds_dir().join("bundles.yaml")).unwrap();
    let lines: Vec<&str> = crd.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("schedule never opens"))
        .expect("the rule in crds/bundles.yaml");
    // The rule is one list entry of two lines (its message and its rule).
    let without: Vec<&str> = lines
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != at && *i != at + 1)
        .map(|(_, l)| *l)
        .collect();
    assert!(!without.join("\n").contains("!self.matches('^[ "));
    let out = env.apply_yaml(&without.join("\n")).await.unwrap();
    assert!(out.success(), "{}", out.stderr);

    let bundle = r#"
apiVersion: automanager.norsk.io/v1alpha1
kind: Bundle
metadata: { name: old-window, namespace: default }
spec:
  replicas: 1
  pools: [aws-east]
  jobs:
    - jobName: encode
      requirements: { requiredCapacity: 8, requiredCores: 4, priorityBand: gold }
  disruption:
    windows:
      - { schedule: '0 0 31 2 *', duration: 2h }
"#;
    // The apiserver takes a moment to serve the CRD it was just given.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = env.apply_yaml(bundle).await.unwrap();
        if out.success() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "stored without the rule: {}",
            out.stderr
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    // The rule back: a new Bundle with the same window is refused.
    let out = env
        .apply_file(crds_dir().join("bundles.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    let fresh = bundle.replace("old-window", "new-window");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let out = env.apply_yaml(&fresh).await.unwrap();
        if !out.success() {
            assert!(
                out.stderr.contains("schedule never opens"),
                "{}",
                out.stderr
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still accepted with the rule"
        );
        let out = env
            .run_kubectl(["delete", "bundle", "new-window", "-n", "default"])
            .await
            .unwrap();
        assert!(out.success(), "{}", out.stderr);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    let patch = |args: [&'static str; 2]| {
        let env = &env;
        async move {
            let mut a = vec!["patch", "bundle", "old-window", "-n", "default"];
            a.extend(["--type", "merge"]);
            a.extend(args);
            env.run_kubectl(a).await.unwrap()
        }
    };
    // The operator's status write, and a person's change to another field, go through.
    let out = patch([
        "--subresource=status",
        r#"-p={"status":{"observedGeneration":1,"conditions":[{"type":"Stalled","status":"True","reason":"InvalidSpec","message":"held","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
    ])
    .await;
    assert!(out.success(), "status: {}", out.stderr);
    let out = patch(["-p", r#"{"spec":{"replicas":2}}"#]).await;
    assert!(out.success(), "another field: {}", out.stderr);
    // Changing the window to another that never opens is refused; to one that opens, accepted.
    let out = patch([
        "-p",
        r#"{"spec":{"disruption":{"windows":[{"schedule":"0 0 30 2 *","duration":"2h"}]}}}"#,
    ])
    .await;
    assert!(
        !out.success() && out.stderr.contains("schedule never opens"),
        "{}",
        out.stderr
    );
    let out = patch([
        "-p",
        r#"{"spec":{"disruption":{"windows":[{"schedule":"0 0 29 2 *","duration":"2h"}]}}}"#,
    ])
    .await;
    assert!(out.success(), "a window that opens: {}", out.stderr);
}
