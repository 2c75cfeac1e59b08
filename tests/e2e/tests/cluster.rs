//! `make test-cluster`: the chart's Pods on a real node, from a registry (tests/e2e/src/cluster.rs,
//! docs/node.md). Not part of `make test`: it needs root and `make image`.
//!
//! 1. `helm install` from `oci://` with two replicas and the simulator, into a namespace that
//!    enforces the restricted Pod Security Standard: both Pods Ready through their own probes,
//!    the Lease held by one of them (a Pod name); the commands NOTES.txt prints reach the
//!    leader's debugging API.
//! 2. `kubectl apply -f examples/`: every Bundle Ready.
//! 3. The leader's Pod killed (its processes SIGKILLed, the Pod force-deleted): another replica
//!    takes the Lease over, and a node kill in the simulator still restarts the gold job
//!    elsewhere.
//! 4. `helm upgrade` changing `config.leaderElection.leaseDuration`: the Pods roll and the new
//!    leader holds the Lease for the new duration.
//! 5. `helm test` passes.
//! 6. A second release in its own namespace (`crds.install=false`, `clusterScope: false`, one
//!    watched namespace, the first release's simulator as its Manager through a Service name,
//!    an arbitrary UID): its Bundle Ready; the apiserver's audit log shows neither release wrote
//!    an object of the other's namespaces, only the first wrote cluster-scoped objects, and no
//!    request of either was refused.
//! 7. The aggregated ClusterRoles: `view` and `edit` in a namespace grant Bundles there.
//! 8. `helm uninstall` of both: what is left is what docs/install.md lists.
//!
//! Prints `cluster install_to_ready_s=… takeover_s=… upgrade_roll_s=… pods_restarted_unexpectedly=0`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use automanager_e2e::cluster::{Cluster, http_get};
use automanager_e2e::{condition, examples_dir};
use serde_json::Value;

const NS: &str = "automanager-system";
const RELEASE: &str = "am";
const FULLNAME: &str = "am-automanager";
const OPERATOR: &str = "app.kubernetes.io/component=operator";
const NS_B: &str = "team-b-system";
const RELEASE_B: &str = "am-team-b";
const FULLNAME_B: &str = "am-team-b-automanager";
const WATCHED_B: &str = "team-b";
const WAIT: Duration = Duration::from_secs(300);

/// Restart counts per Pod uid, sampled at checkpoints: a Pod replaced by a rollout keeps the
/// count it had when last seen.
#[derive(Default)]
struct Restarts(BTreeMap<String, (String, i64)>);

impl Restarts {
    async fn sample(&mut self, c: &Cluster, ns: &str) {
        for p in &c.pods(ns, "").await.unwrap() {
            let uid = p["metadata"]["uid"].as_str().unwrap().to_owned();
            let name = p["metadata"]["name"].as_str().unwrap().to_owned();
            let n: i64 = p["status"]["containerStatuses"]
                .as_array()
                .map(|cs| cs.iter().filter_map(|c| c["restartCount"].as_i64()).sum())
                .unwrap_or(0);
            let e = self.0.entry(uid).or_insert((name, 0));
            e.1 = e.1.max(n);
        }
    }

    /// Restarts of every Pod seen but `killed` (the one the test killed on purpose).
    fn unexpected(&self, killed: &str) -> i64 {
        self.0
            .values()
            .filter(|(n, _)| n != killed)
            .map(|(_, c)| *c)
            .sum()
    }
}

async fn restricted_namespace(c: &Cluster, ns: &str) {
    c.kubectl_ok(&["create", "namespace", ns]).await.unwrap();
    c.kubectl_ok(&[
        "label",
        "namespace",
        ns,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    ])
    .await
    .unwrap();
}

fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

async fn operator_pods(c: &Cluster, ns: &str, release: &str) -> Vec<Value> {
    c.pods(
        ns,
        &format!("{OPERATOR},app.kubernetes.io/instance={release}"),
    )
    .await
    .unwrap()
}

fn name(o: &Value) -> String {
    o["metadata"]["name"].as_str().unwrap().to_owned()
}

fn ready(p: &Value) -> bool {
    p["metadata"]["deletionTimestamp"].is_null()
        && condition(p, "Ready")["status"] == "True"
        && p["status"]["phase"] == "Running"
}

async fn wait_bundle_ready(c: &Cluster, ns: &str, bundle: &str) -> Value {
    c.wait_for(&format!("bundle {ns}/{bundle} Ready"), WAIT, || async {
        let b = c.get_json(&["bundle", bundle, "-n", ns]).await?;
        Ok((b["status"]["phase"] == "Ready"
            && b["status"]["observedGeneration"] == b["metadata"]["generation"])
            .then_some(b))
    })
    .await
    .unwrap()
}

/// The `--set` flags of the first release.
const RELEASE_A: &[&str] = &[
    "--set",
    "managerSim.enabled=true",
    "--set",
    "config.watchNamespaces={default}",
    "--set",
    "debug.enabled=true",
];

#[tokio::test]
async fn the_chart_on_a_real_node_from_a_registry() {
    let c = Cluster::builder().audit(true).start().await.unwrap();
    let mut restarts = Restarts::default();

    // 1. Install.
    restricted_namespace(&c, NS).await;
    let t0 = Instant::now();
    let out = c.install(RELEASE, NS, RELEASE_A).unwrap();
    assert!(out.success(), "helm install: {}", out.stderr);
    let pods = c
        .wait_for("two operator Pods Ready", WAIT, || async {
            let pods = operator_pods(&c, NS, RELEASE).await;
            Ok((pods.len() == 2 && pods.iter().all(ready)).then_some(pods))
        })
        .await
        .unwrap();
    let install_to_ready = t0.elapsed();
    c.wait_rollout(NS, &format!("{FULLNAME}-manager-sim"))
        .await
        .unwrap();
    let names: Vec<String> = pods.iter().map(name).collect();
    for p in &pods {
        // The image came from the registry, by digest, and runs as the image's user.
        let status = &p["status"]["containerStatuses"][0];
        assert!(
            status["imageID"]
                .as_str()
                .unwrap()
                .ends_with(&c.dist.image_digest),
            "{status:#}"
        );
        assert_eq!(
            p["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
            true
        );
    }
    let leader = c
        .wait_for("a Pod to hold the Lease", WAIT, || async {
            Ok(c.lease_holder(NS, FULLNAME)
                .await
                .ok()
                .filter(|h| names.contains(h)))
        })
        .await
        .unwrap();
    restarts.sample(&c, NS).await;

    // NOTES.txt: its command names the leader, and the leader's debugging API answers there.
    let notes = &out.stdout;
    let lease_cmd = notes
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("LEADER=$(")
                .and_then(|r| r.strip_suffix(')'))
        })
        .unwrap_or_else(|| panic!("NOTES.txt names no leader command:\n{notes}"));
    let words: Vec<String> = lease_cmd
        .split_whitespace()
        .skip(1)
        .map(|w| w.replace('\'', ""))
        .collect();
    let words: Vec<&str> = words.iter().map(String::as_str).collect();
    let from_notes = c.kubectl_ok(&words).await.unwrap();
    assert_eq!(from_notes.trim(), leader, "{notes}");
    assert!(
        notes.contains("port-forward \"pod/$LEADER\" 8082"),
        "{notes}"
    );

    // 2. The examples.
    let out = c
        .kubectl(&["apply", "-f", examples_dir().to_str().unwrap()])
        .await
        .unwrap();
    assert!(out.success(), "kubectl apply -f examples/: {}", out.stderr);
    let bundles = c.get_json(&["bundles", "-n", "default"]).await.unwrap();
    let bundle_names: Vec<String> = bundles["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(name)
        .collect();
    assert!(bundle_names.len() >= 4, "{bundle_names:?}");
    for b in &bundle_names {
        wait_bundle_ready(&c, "default", b).await;
    }
    let pf = c
        .port_forward(NS, &format!("pod/{leader}"), 8082)
        .await
        .unwrap();
    let (status, body) = http_get(&format!("{}/debug/trace/default/news-gold", pf.url()))
        .await
        .unwrap();
    assert_eq!(status, 200, "the leader's trace: {body}");
    drop(pf);

    // 3. The leader's Pod is killed: another replica takes over, and a node kill still
    // restarts gold jobs.
    restarts.sample(&c, NS).await;
    let t_kill = Instant::now();
    c.kill_pod(NS, &leader).await.unwrap();
    // Another replica takes the Lease over once the dead leader's claim lapses: the standby, or
    // the Pod the ReplicaSet made in the killed one's place, whichever claims it first.
    let new_leader = c
        .wait_for("another Pod to take the Lease over", WAIT, || async {
            let holder = c.lease_holder(NS, FULLNAME).await.ok();
            let live: Vec<String> = operator_pods(&c, NS, RELEASE)
                .await
                .iter()
                .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                .map(name)
                .collect();
            Ok(holder.filter(|h| *h != leader && live.contains(h)))
        })
        .await
        .unwrap();
    let takeover = t_kill.elapsed();
    let gold = c
        .get_json(&["bundle", "news-gold", "-n", "default"])
        .await
        .unwrap();
    let killed = gold["status"]["replicas"][0]["jobs"][0]["nodeId"]
        .as_str()
        .unwrap()
        .to_owned();
    let out = c
        .kubectl(&[
            "exec",
            "-n",
            NS,
            &format!("deploy/{FULLNAME}-manager-sim"),
            "--",
            "/manager-sim",
            "chaos",
            "--addr",
            "http://127.0.0.1:6789",
            "kill-node",
            &killed,
        ])
        .await
        .unwrap();
    assert!(out.success(), "chaos kill-node {killed}: {}", out.stderr);
    c.wait_for(
        "the gold job restarted off the killed node",
        WAIT,
        || async {
            let b = c
                .get_json(&["bundle", "news-gold", "-n", "default"])
                .await?;
            let j = &b["status"]["replicas"][0]["jobs"][0];
            Ok((b["status"]["phase"] == "Ready"
                && j["state"] == "running"
                && j["nodeId"] != killed.as_str())
            .then_some(()))
        },
    )
    .await
    .unwrap();
    // The ReplicaSet replaced the killed Pod; the new one stands by.
    let replaced = c
        .wait_for("a replacement Pod Ready", WAIT, || async {
            let pods = operator_pods(&c, NS, RELEASE).await;
            Ok((pods.len() == 2
                && pods.iter().all(ready)
                && !pods.iter().any(|p| name(p) == leader))
            .then_some(pods))
        })
        .await
        .unwrap();
    assert_eq!(c.lease_holder(NS, FULLNAME).await.unwrap(), new_leader);
    let names: Vec<String> = replaced.iter().map(name).collect();
    restarts.sample(&c, NS).await;

    // 4. A changed config key rolls the Pods, and the new value is in effect.
    restarts.sample(&c, NS).await;
    let t_up = Instant::now();
    let out = c
        .upgrade(
            RELEASE,
            NS,
            &["--set", "config.leaderElection.leaseDuration=20s"],
        )
        .unwrap();
    assert!(out.success(), "helm upgrade: {}", out.stderr);
    c.wait_rollout(NS, FULLNAME).await.unwrap();
    // The rollout is over when the old Pods are gone too.
    let new_names: Vec<String> = c
        .wait_for("the old Pods to go", WAIT, || async {
            let pods = operator_pods(&c, NS, RELEASE).await;
            let now: Vec<String> = pods.iter().map(name).collect();
            Ok(
                (now.len() == 2
                    && now.iter().all(|n| !names.contains(n))
                    && pods.iter().all(ready))
                .then_some(now),
            )
        })
        .await
        .unwrap();
    let upgrade_roll = t_up.elapsed();
    c.wait_for("a new Pod to hold the Lease for 20 s", WAIT, || async {
        let lease = c.get_json(&["lease", FULLNAME, "-n", NS]).await?;
        let holder = lease["spec"]["holderIdentity"].as_str().unwrap_or_default();
        Ok(
            (new_names.iter().any(|n| n == holder) && lease["spec"]["leaseDurationSeconds"] == 20)
                .then_some(()),
        )
    })
    .await
    .unwrap();
    for b in &bundle_names {
        wait_bundle_ready(&c, "default", b).await;
    }
    restarts.sample(&c, NS).await;

    // 5. helm test.
    let out = c
        .helm()
        .run([
            "test",
            RELEASE,
            "--namespace",
            NS,
            "--logs",
            "--timeout",
            "5m",
        ])
        .unwrap();
    assert!(out.success(), "helm test: {}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("Succeeded"), "{}", out.stdout);

    // 6. A second release beside the first.
    restricted_namespace(&c, NS_B).await;
    c.kubectl_ok(&["create", "namespace", WATCHED_B])
        .await
        .unwrap();
    let sim = format!("http://{FULLNAME}-manager-sim.{NS}.svc:6789");
    let out = c
        .install(
            RELEASE_B,
            NS_B,
            &[
                "--set",
                "crds.install=false",
                "--set",
                "config.clusterScope=false",
                "--set",
                &format!("config.watchNamespaces={{{WATCHED_B}}}"),
                "--set",
                &format!("manager.url={sim}"),
                "--set",
                "manager.tls.secretName=",
                "--set",
                "manager.token.required=false",
                "--set",
                "manager.token.secretName=",
                "--set",
                "replicaCount=1",
                // An arbitrary UID, as OpenShift's restricted SCC assigns one.
                "--set",
                "podSecurityContext.runAsUser=1000770000",
                "--set",
                "podSecurityContext.runAsGroup=1000770000",
                "--set",
                "rbac.aggregateToDefaultRoles=false",
            ],
        )
        .unwrap();
    assert!(out.success(), "helm install {RELEASE_B}: {}", out.stderr);
    c.wait_rollout(NS_B, FULLNAME_B).await.unwrap();
    let b_pod = operator_pods(&c, NS_B, RELEASE_B).await;
    assert_eq!(b_pod[0]["spec"]["securityContext"]["runAsUser"], 1000770000);
    let bundle_b = format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: team-b-news, namespace: {WATCHED_B}}}\nspec:\n  replicas: 1\n  pools: [aws-east]\n  jobs:\n    - jobName: encode\n      requirements: {{requiredCapacity: 5, requiredCores: 1, priorityBand: silver}}\n"
    );
    let out = c.env.apply_yaml(&bundle_b).await.unwrap();
    assert!(out.success(), "{}", out.stderr);
    wait_bundle_ready(&c, WATCHED_B, "team-b-news").await;
    restarts.sample(&c, NS_B).await;

    // Who wrote what, from the apiserver's audit log.
    let sa_a = format!("system:serviceaccount:{NS}:{FULLNAME}");
    let sa_b = format!("system:serviceaccount:{NS_B}:{FULLNAME_B}");
    let audit = c.audit_events().unwrap();
    let mut by: BTreeMap<(&str, String, &str), usize> = BTreeMap::new();
    let mut refused = Vec::new();
    for e in &audit {
        let user = e["user"]["username"].as_str().unwrap_or_default();
        if user != sa_a && user != sa_b {
            continue;
        }
        let who = if user == sa_a { "a" } else { "b" };
        let resource = match (
            e["objectRef"]["resource"].as_str(),
            e["objectRef"]["subresource"].as_str(),
        ) {
            (Some(r), Some(s)) => format!("{r}/{s}"),
            (Some(r), None) => r.to_owned(),
            _ => String::new(),
        };
        let namespace = e["objectRef"]["namespace"].as_str().unwrap_or("<cluster>");
        if e["responseStatus"]["code"] == 403 {
            refused.push(format!("{who}: {} {resource} in {namespace}", e["verb"]));
        }
        *by.entry((who, resource, namespace)).or_default() += 1;
    }
    assert!(refused.is_empty(), "refused: {refused:#?}");
    for ((who, resource, namespace), n) in &by {
        let ok = match (*who, resource.as_str()) {
            ("a", "leases") => *namespace == NS,
            ("b", "leases") => *namespace == NS_B,
            ("a", "bundles" | "bundles/status" | "migrations" | "migrations/status") => {
                *namespace == "default"
            }
            ("b", "bundles" | "bundles/status" | "migrations" | "migrations/status") => {
                *namespace == WATCHED_B
            }
            ("a", "events") => *namespace == "default",
            ("b", "events") => *namespace == WATCHED_B || *namespace == "default",
            // The cluster-scoped work is the first release's alone.
            ("a", _) => *namespace == "<cluster>",
            ("b", _) => false,
            _ => false,
        };
        assert!(
            ok,
            "release {who} wrote {n} × {resource} in {namespace}: {by:#?}"
        );
    }
    for (who, resource, namespace) in [
        ("a", "managernodes", "<cluster>"),
        ("a", "bundles/status", "default"),
        ("b", "bundles/status", WATCHED_B),
    ] {
        assert!(
            by.contains_key(&(who, resource.to_owned(), namespace)),
            "release {who} never wrote {resource} in {namespace}: {by:#?}"
        );
    }

    // 7. The aggregated ClusterRoles (kube-controller-manager aggregates them).
    c.kubectl_ok(&[
        "create",
        "rolebinding",
        "viewer",
        "--clusterrole=view",
        "--user=vera",
        "-n",
        "default",
    ])
    .await
    .unwrap();
    c.kubectl_ok(&[
        "create",
        "rolebinding",
        "editor",
        "--clusterrole=edit",
        "--user=ed",
        "-n",
        "default",
    ])
    .await
    .unwrap();
    for (user, verb, want) in [
        ("vera", "list", "yes"),
        ("vera", "create", "no"),
        ("ed", "create", "yes"),
        ("ed", "delete", "yes"),
    ] {
        c.wait_for(
            &format!("{user} {verb} bundles: {want}"),
            Duration::from_secs(120),
            || async {
                let out = c
                    .kubectl(&[
                        "auth",
                        "can-i",
                        verb,
                        "bundles.automanager.norsk.io",
                        "-n",
                        "default",
                        &format!("--as={user}"),
                    ])
                    .await?;
                Ok((out.stdout.trim() == want).then_some(()))
            },
        )
        .await
        .unwrap();
    }

    // 8. Uninstall both: what remains is what docs/install.md says remains.
    restarts.sample(&c, NS).await;
    restarts.sample(&c, NS_B).await;
    for (release, ns) in [(RELEASE_B, NS_B), (RELEASE, NS)] {
        let out = c
            .helm()
            .run(["uninstall", release, "--namespace", ns, "--wait"])
            .unwrap();
        assert!(out.success(), "helm uninstall {release}: {}", out.stderr);
    }
    for (ns, fullname) in [(NS, FULLNAME), (NS_B, FULLNAME_B)] {
        // Every namespace's own (kube-controller-manager's), and the Lease the operator wrote.
        let mut want = vec![
            "configmap/kube-root-ca.crt".to_owned(),
            format!("lease.coordination.k8s.io/{fullname}"),
            "serviceaccount/default".to_owned(),
        ];
        want.sort_unstable();
        let listed = || async {
            let left = c
                .kubectl_ok(&[
                    "get",
                    "all,configmaps,secrets,serviceaccounts,roles,rolebindings,leases,poddisruptionbudgets,networkpolicies",
                    "-n",
                    ns,
                    "-o",
                    "name",
                ])
                .await?;
            let mut left: Vec<String> = left.lines().map(str::to_owned).collect();
            left.sort_unstable();
            Ok::<_, automanager_e2e::SetupError>(left)
        };
        let settled = c
            .wait_for(
                &format!("only what docs/install.md lists left in {ns}"),
                WAIT,
                || async { Ok((listed().await? == want).then_some(())) },
            )
            .await;
        if settled.is_err() {
            assert_eq!(
                listed().await.unwrap(),
                want,
                "left in {ns} after helm uninstall"
            );
        }
    }
    let roles = c
        .kubectl_ok(&["get", "clusterroles,clusterrolebindings", "-o", "name"])
        .await
        .unwrap();
    assert!(
        !roles.contains(FULLNAME) && !roles.contains(FULLNAME_B),
        "cluster roles left after helm uninstall:\n{roles}"
    );
    for crd in automanager_e2e::crd_names() {
        c.kubectl_ok(&["get", "crd", &crd]).await.unwrap();
    }
    c.kubectl_ok(&["get", "bundle", "news-gold", "-n", "default"])
        .await
        .unwrap();
    c.kubectl_ok(&["get", "bundle", "team-b-news", "-n", WATCHED_B])
        .await
        .unwrap();

    let unexpected = restarts.unexpected(&leader);
    let line = format!(
        "cluster install_to_ready_s={} takeover_s={} upgrade_roll_s={} pods_restarted_unexpectedly={unexpected}",
        secs(install_to_ready),
        secs(takeover),
        secs(upgrade_roll),
    );
    println!("{line}");
    assert_eq!(unexpected, 0, "{line}");
}
