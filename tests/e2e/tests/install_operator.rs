//! The operator as the Helm chart installs it, proven with real tools:
//!
//! - **RBAC is enough:** the chart is installed with helm (CRDs, ServiceAccount, roles), and the
//!   operator binary runs out of cluster with a kubeconfig holding a TokenRequest token of the
//!   chart's ServiceAccount, through the core scenario: apply, Ready, node kill and recovery,
//!   capacity and restart failures, spares, migrations, a drain, delete. It must never be
//!   refused (no 403 in its log) and its Events and Lease must appear.
//! - **and no more:** `kubectl auth can-i --as=system:serviceaccount:…` shows it cannot read
//!   Secrets, touch Pods or Nodes, or write anything outside its resources.
//! - **kstatus and Argo CD health:** the objects captured in every state the scenario reaches are
//!   judged by the real kstatus library (tools/kstatus) and by the real Lua VM running the
//!   chart's Argo CD health script (tools/argo-health), as docs/kstatus.md documents; a job
//!   dropped by its band and a Manager outage (the sim killed) never read Failed.
//! - **On call on a default install:** with no debugging port, a ServiceAccount holding only the
//!   user roles reads the placement history (`kubectl automanager trace`) and asks `what-if`,
//!   through the apiserver.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use automanager_e2e::install::{
    FULLNAME, Helm, IMAGE_VALUES, RELEASE, RELEASE_NAMESPACE, can_i, chart_dir,
};
use automanager_e2e::install::{run, service_account_kubeconfig, tool};
use automanager_e2e::stack::Stack;
use automanager_e2e::{TestEnv, apply, condition, crd_names, examples_dir, repo_root};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);

/// An object captured in a state, with the verdicts docs/kstatus.md promises for it.
struct Capture {
    what: String,
    object: Value,
    kstatus: &'static str,
    argo: &'static str,
}

struct Scenario {
    stack: Stack,
    captures: Vec<Capture>,
}

impl Scenario {
    async fn get(&self, args: &[&str]) -> Value {
        self.stack.get_json(args).await.unwrap()
    }

    /// Waits until `probe` holds for the object `args` names, and records it.
    async fn capture(
        &mut self,
        what: &str,
        args: &[&str],
        kstatus: &'static str,
        argo: &'static str,
        probe: impl Fn(&Value) -> bool,
    ) -> Value {
        let obj = self
            .stack
            .wait_for(what, WAIT, || async {
                let o = self.stack.get_json(args).await?;
                Ok(probe(&o).then_some(o))
            })
            .await
            .unwrap();
        self.captures.push(Capture {
            what: what.to_owned(),
            object: obj.clone(),
            kstatus,
            argo,
        });
        obj
    }

    async fn apply(&self, yaml: &str) {
        apply(&self.stack, yaml).await;
    }

    /// Applies a one-replica bundle and waits until it is Ready; returns it.
    async fn ready_bundle(&self, name: &str, yaml: &str) -> Value {
        self.apply(yaml).await;
        self.stack
            .wait_bundle_phase("default", name, "Ready", WAIT)
            .await
            .unwrap()
    }

    async fn kubectl(&self, args: &[&str]) {
        let out = self.stack.env.run_kubectl(args).await.unwrap();
        assert!(out.success(), "kubectl {args:?}: {}", out.stderr);
    }

    /// Waits until the ManagerNode `name` exists: the operator writes it a moment after
    /// Manager reports the node, which may be after a Bundle names it.
    async fn node_object(&self, name: &str) -> Value {
        self.stack
            .wait_for(&format!("managernode {name}"), WAIT, || async {
                Ok(self.stack.get_json(&["managernode", name]).await.ok())
            })
            .await
            .unwrap()
    }

    fn chaos(&self, args: &[&str]) {
        self.stack.chaos(args).unwrap();
    }
}

fn is(c: &Value, type_: &str, status: &str, reason: &str) -> bool {
    c["status"]["observedGeneration"] == c["metadata"]["generation"]
        && condition(c, type_)["status"] == status
        && condition(c, type_)["reason"] == reason
}

fn bundle(name: &str, pools: &str, capacity: u32, band: &str, extra: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  replicas: 1\n  pools: {pools}\n  jobs:\n    - jobName: enc\n      requirements: {{requiredCapacity: {capacity}, requiredCores: 1, priorityBand: {band}}}\n{extra}"
    )
}

fn migration(name: &str, bundle: &str, extra: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: Migration\nmetadata: {{name: {name}, namespace: default}}\nspec:\n  job: {{bundle: {bundle}, replica: 0, jobName: enc}}\n{extra}"
    )
}

fn spare_target(name: &str, pool: &str, count: u32, instance_type: &str, region: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.io/v1alpha1\nkind: HotSpareTarget\nmetadata: {{name: {name}}}\nspec:\n  pool: {pool}\n  targetCount: {count}\n  spec: {{instanceType: {instance_type}, region: {region}}}\n"
    )
}

fn job_node(b: &Value) -> String {
    b["status"]["replicas"][0]["jobs"][0]["nodeId"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The control plane with the chart installed by helm, and a kubeconfig of its ServiceAccount.
async fn installed() -> (TestEnv, std::path::PathBuf, tempfile::TempDir) {
    let env = TestEnv::start().await.unwrap();
    let helm = Helm::on(&env).unwrap();
    let out = helm
        .run([
            "install",
            RELEASE,
            chart_dir().to_str().unwrap(),
            "--namespace",
            RELEASE_NAMESPACE,
            "--create-namespace",
            "--set",
            "managerSim.enabled=true",
            IMAGE_VALUES[0],
            IMAGE_VALUES[1],
        ])
        .unwrap();
    assert!(out.success(), "helm install: {}", out.stderr);
    env.wait_for_crds_established(crd_names(), Duration::from_secs(60))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = service_account_kubeconfig(&env, RELEASE_NAMESPACE, FULLNAME, dir.path())
        .await
        .unwrap();
    (env, kubeconfig, dir)
}

#[tokio::test]
async fn the_chart_service_account_runs_the_core_scenario_and_every_state_reads_as_documented() {
    let (env, kubeconfig, dir) = installed().await;
    // Simulated jobs wait ten minutes for an answer, so a held cutover lasts as the test asks.
    let sim_config = automanager_e2e::stack::patient_sim_config(dir.path()).unwrap();
    let stack = Stack::start_on(env, &sim_config, &[], Some(kubeconfig), |c| {
        // The Lease the chart's Role lets it read and renew.
        c.insert(
            "leaderElection".into(),
            serde_json::json!(
                {"enabled": true, "leaseName": FULLNAME, "leaseNamespace": RELEASE_NAMESPACE}
            ),
        );
        // As the chart's defaults: no debugging port.
        if let Some(http) = c.get_mut("http").and_then(Value::as_object_mut) {
            http.remove("debugBindAddress");
        }
    })
    .await
    .unwrap();
    let mut s = Scenario {
        stack,
        captures: Vec::new(),
    };

    // Pools: valid, and one Manager does not know.
    let out = s
        .stack
        .env
        .apply_file(examples_dir().join("pools.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    s.capture(
        "pool ready",
        &["placementpool", "aws-east"],
        "Current",
        "Healthy",
        |p| is(p, "Ready", "True", "Valid"),
    )
    .await;
    s.apply("apiVersion: automanager.norsk.io/v1alpha1\nkind: PlacementPool\nmetadata: {name: ghost}\nspec:\n  kind: aws\n  region: nowhere-1\n  scaleOut: elastic\n  candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 100, totalCores: 16}]\n").await;
    if s.stack.api.lists_pools() {
        s.capture(
            "pool unknown to Manager",
            &["placementpool", "ghost"],
            "Failed",
            "Degraded",
            |p| is(p, "Stalled", "True", "UnknownToManager"),
        )
        .await;
    } else {
        // A Manager without pools of its own knows every pool the operator declares.
        s.capture(
            "pool Manager cannot call unknown",
            &["placementpool", "ghost"],
            "Current",
            "Healthy",
            |p| is(p, "Ready", "True", "Valid"),
        )
        .await;
    }

    // A bundle placing while its node is provisioned, then Ready; the node starting, then started.
    s.chaos(&["slow-provision", "6000"]);
    s.apply(&bundle("grow", "[aws-east]", 60, "gold", "")).await;
    s.capture(
        "bundle placing",
        &["bundle", "grow", "-n", "default"],
        "InProgress",
        "Progressing",
        |b| b["status"]["phase"] == "Placing" && is(b, "Reconciling", "True", "Provisioning"),
    )
    .await;
    // The node's ManagerNode is written a moment after Manager reports it: wait for it.
    let starting = s
        .stack
        .wait_for("a starting aws-east ManagerNode", WAIT, || async {
            let nodes = s.stack.get_json(&["managernodes"]).await?;
            Ok(nodes["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|n| n["status"]["pool"] == "aws-east" && n["status"]["state"] == "starting")
                .and_then(|n| n["metadata"]["name"].as_str())
                .map(str::to_owned))
        })
        .await
        .unwrap();
    s.capture(
        "node starting",
        &["managernode", &starting],
        "InProgress",
        "Progressing",
        |n| is(n, "Reconciling", "True", "Starting"),
    )
    .await;
    let b = s
        .capture(
            "bundle ready",
            &["bundle", "grow", "-n", "default"],
            "Current",
            "Healthy",
            |b| b["status"]["phase"] == "Ready" && is(b, "Ready", "True", "AllReplicasRunning"),
        )
        .await;
    s.capture(
        "node started",
        &["managernode", &starting],
        "Current",
        "Healthy",
        |n| is(n, "Ready", "True", "Started"),
    )
    .await;
    s.chaos(&["slow-provision", "200"]);

    // Node kill and recovery: the gold job restarts elsewhere.
    let killed = job_node(&b);
    s.chaos(&["kill-node", &killed]);
    s.stack
        .wait_for("grow restarted off the killed node", WAIT, || async {
            let b = s
                .stack
                .get_json(&["bundle", "grow", "-n", "default"])
                .await?;
            let j = &b["status"]["replicas"][0]["jobs"][0];
            Ok((b["status"]["phase"] == "Ready"
                && j["state"] == "running"
                && j["nodeId"] != killed.as_str()
                && b["status"]["replicas"][0]["restartsLastHour"] == 1)
                .then_some(()))
        })
        .await
        .unwrap();
    on_call_reads_trace_and_what_if(&s.stack, &killed, dir.path()).await;

    // No capacity: four replicas that must be on different nodes, three nodes in the fixed
    // pool. Stalled; deleted again so the rest has room.
    s.apply(&bundle("huge", "[onprem]", 150, "silver", "").replace("replicas: 1", "replicas: 4"))
        .await;
    s.capture(
        "bundle with no capacity",
        &["bundle", "huge", "-n", "default"],
        "Failed",
        "Degraded",
        |b| is(b, "Stalled", "True", "NoCapacity"),
    )
    .await;
    s.kubectl(&[
        "delete",
        "bundle",
        "huge",
        "-n",
        "default",
        "--wait=true",
        "--timeout=120s",
    ])
    .await;

    // Broken: more restarts than the band allows.
    s.ready_bundle(
        "flaky",
        &bundle(
            "flaky",
            "[onprem]",
            10,
            "gold",
            "  bands:\n    gold: {maxRestartsPerHour: 1}\n",
        ),
    )
    .await;
    s.chaos(&["fail-job", "default.flaky/0/enc"]);
    s.stack
        .wait_for("flaky restarted once", WAIT, || async {
            let b = s
                .stack
                .get_json(&["bundle", "flaky", "-n", "default"])
                .await?;
            Ok((b["status"]["replicas"][0]["restartsLastHour"] == 1
                && b["status"]["replicas"][0]["jobs"][0]["state"] == "running")
                .then_some(()))
        })
        .await
        .unwrap();
    s.chaos(&["fail-job", "default.flaky/0/enc"]);
    s.capture(
        "bundle broken",
        &["bundle", "flaky", "-n", "default"],
        "Failed",
        "Degraded",
        |b| b["status"]["phase"] == "Broken" && is(b, "Stalled", "True", "RestartCeilingExceeded"),
    )
    .await;

    // Degraded phase: a bronze job dropped after failing, as its band asks. The bundle runs what
    // its bands promise, so it is Ready (kstatus Current, Argo CD Healthy); its Degraded
    // condition names the dropped job.
    s.ready_bundle("cheap", &bundle("cheap", "[onprem]", 10, "bronze", ""))
        .await;
    s.chaos(&["fail-job", "default.cheap/0/enc"]);
    s.capture(
        "bundle with a dropped job",
        &["bundle", "cheap", "-n", "default"],
        "Current",
        "Healthy",
        |b| {
            b["status"]["phase"] == "Degraded"
                && is(b, "Ready", "True", "RunningWithDrops")
                && is(b, "Degraded", "True", "JobsDropped")
                && condition(b, "Degraded")["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("replica 0 job enc"))
        },
    )
    .await;
    // `kubectl wait` reads it as ready too.
    s.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "bundle/cheap",
        "-n",
        "default",
        "--timeout=30s",
    ])
    .await;

    // Spares: provisioning into an elastic pool, at target, and an underflow nothing can fix.
    s.chaos(&["slow-provision", "6000"]);
    s.apply(&spare_target(
        "east-spare",
        "aws-east",
        1,
        "m5.xlarge",
        "eu-west-1",
    ))
    .await;
    s.capture(
        "spares provisioning",
        &["hotsparetarget", "east-spare"],
        "InProgress",
        "Progressing",
        |t| {
            is(t, "Reconciling", "True", "Provisioning")
                && condition(t, "SpareUnderflow")["status"] == "True"
        },
    )
    .await;
    s.capture(
        "spares at target",
        &["hotsparetarget", "east-spare"],
        "Current",
        "Healthy",
        |t| is(t, "Ready", "True", "AtTarget") && t["status"]["liveSpares"] == 1,
    )
    .await;
    s.chaos(&["slow-provision", "200"]);
    s.apply(&spare_target(
        "onprem-spare",
        "onprem",
        2,
        "r740",
        "oslo-dc1",
    ))
    .await;
    s.capture(
        "spare underflow in a fixed pool",
        &["hotsparetarget", "onprem-spare"],
        "Failed",
        "Degraded",
        |t| is(t, "Stalled", "True", "SpareUnderflow"),
    )
    .await;

    // Migrations: one in flight (held in its cutover), then aborted by the user; one completed;
    // one rejected.
    s.ready_bundle(
        "talk",
        &bundle(
            "talk",
            "[onprem]",
            20,
            "silver",
            "      migration: {strategy: handover}\n",
        ),
    )
    .await;
    s.chaos(&[
        "migration-behaviour",
        "default.talk/0/enc",
        "slow-cutover",
        "300000",
    ]);
    s.apply(&migration("move-talk", "talk", "")).await;
    s.capture(
        "migration in flight",
        &["migration", "move-talk", "-n", "default"],
        "InProgress",
        "Progressing",
        |m| m["status"]["phase"] == "CutoverReady" && is(m, "Reconciling", "True", "InProgress"),
    )
    .await;
    s.kubectl(&[
        "patch",
        "migration",
        "move-talk",
        "-n",
        "default",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"abort":{"reason":"not now"}}}"#,
    ])
    .await;
    s.capture(
        "migration aborted by the user",
        &["migration", "move-talk", "-n", "default"],
        "Current",
        "Suspended",
        |m| {
            m["status"]["phase"] == "Aborted"
                && m["status"]["abort"]["by"] == "user"
                && is(m, "Ready", "True", "Aborted")
        },
    )
    .await;
    s.ready_bundle("walk", &bundle("walk", "[onprem]", 20, "silver", ""))
        .await;
    s.apply(&migration("move-walk", "walk", "")).await;
    s.capture(
        "migration completed",
        &["migration", "move-walk", "-n", "default"],
        "Current",
        "Healthy",
        |m| m["status"]["phase"] == "Completed" && is(m, "Ready", "True", "Completed"),
    )
    .await;
    s.apply(&migration(
        "move-walk-again",
        "walk",
        "  strategy: handover\n",
    ))
    .await;
    s.capture(
        "migration rejected",
        &["migration", "move-walk-again", "-n", "default"],
        "Failed",
        "Degraded",
        |m| m["status"]["phase"] == "Rejected" && is(m, "Stalled", "True", "StrategyRefused"),
    )
    .await;

    // A migrate drain of talk's node, held while talk's handover waits for its cutover.
    let b = s.get(&["bundle", "talk", "-n", "default"]).await;
    let drained = job_node(&b);
    s.node_object(&drained).await;
    s.chaos(&[
        "migration-behaviour",
        "default.talk/0/enc",
        "slow-cutover",
        "8000",
    ]);
    s.kubectl(&[
        "patch",
        "managernode",
        &drained,
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"drain":{"mode":"migrate"}}}"#,
    ])
    .await;
    s.capture(
        "node draining",
        &["managernode", &drained],
        "InProgress",
        "Progressing",
        |n| is(n, "Reconciling", "True", "Draining"),
    )
    .await;
    if s.stack.api.terminates_physical_nodes() {
        s.capture(
            "node drained and terminated",
            &["managernode", &drained],
            "Current",
            "Suspended",
            |n| {
                n["status"]["drain"]["completedAt"].is_string()
                    && (is(n, "Ready", "True", "Terminated") || is(n, "Ready", "True", "Stopped"))
            },
        )
        .await;
    } else {
        // The on-prem node is its owner's: the drain ends with it up and empty.
        s.capture(
            "node drained and left to its owner",
            &["managernode", &drained],
            "Current",
            "Healthy",
            |n| {
                n["status"]["drain"]["completedAt"].is_string() && is(n, "Ready", "True", "Drained")
            },
        )
        .await;
    }
    s.stack
        .wait_bundle_ready_off("default", "talk", &drained, WAIT)
        .await
        .expect("talk was not moved off the drained node");

    // Delete: the finalizer's cleanup runs and the object goes.
    s.kubectl(&[
        "delete",
        "bundle",
        "grow",
        "-n",
        "default",
        "--wait=true",
        "--timeout=120s",
    ])
    .await;

    // Manager goes away: what the operator looks at meanwhile is Reconciling (ManagerUnavailable),
    // never Stalled: kstatus InProgress, so Flux's `wait: true` waits instead of failing, and
    // Argo CD Progressing. A new bundle, a touched one (its dropped job still listed), a new
    // spare target and a new migration.
    manager_outage(&mut s).await;

    // A spec the operator has not seen yet reads as in progress (observedGeneration lags).
    let mut lagging = s
        .captures
        .iter()
        .find(|c| c.what == "bundle ready")
        .unwrap()
        .object
        .clone();
    let generation = lagging["metadata"]["generation"].as_i64().unwrap();
    lagging["metadata"]["generation"] = Value::from(generation + 1);
    s.captures.push(Capture {
        what: "bundle whose new spec is not observed yet".into(),
        object: lagging,
        kstatus: "InProgress",
        argo: "Progressing",
    });

    rbac_was_enough(&s.stack).await;
    rbac_is_no_more(&s.stack.env).await;
    verdicts_match(&s.stack.env, &s.captures, dir.path());
}

/// Kills the sim and captures each kind the operator looks at during the outage.
/// The person on call, as a ServiceAccount bound to the user roles only (automanager-view in
/// the namespace, automanager-fleet-view), runs the real plugin with no operator URL: `trace`
/// shows bundle grow's placement and its recovery off `killed` from its PlacementHistory, and
/// `what-if` answers from the pools and nodes. Nothing reaches the operator (it serves no
/// debugging port here).
async fn on_call_reads_trace_and_what_if(stack: &Stack, killed: &str, dir: &std::path::Path) {
    let env = &stack.env;
    let out = env
        .apply_file(repo_root().join("deploy/rbac/user-roles.yaml"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.stderr);
    for args in [
        &["create", "serviceaccount", "oncall", "-n", "default"][..],
        &[
            "create",
            "rolebinding",
            "oncall-view",
            "--clusterrole=automanager-view",
            "--serviceaccount=default:oncall",
            "-n",
            "default",
        ],
        &[
            "create",
            "clusterrolebinding",
            "oncall-fleet-view",
            "--clusterrole=automanager-fleet-view",
            "--serviceaccount=default:oncall",
        ],
    ] {
        let out = env.run_kubectl(args.iter().copied()).await.unwrap();
        assert!(out.success(), "kubectl {args:?}: {}", out.stderr);
    }
    let kubeconfig = service_account_kubeconfig(env, "default", "oncall", dir)
        .await
        .unwrap();
    let plugin = |args: &[&str]| {
        automanager_e2e::plugin::run_with(args, |cmd| {
            cmd.env("KUBECONFIG", &kubeconfig)
                .env_remove("AUTOMANAGER_OPERATOR_URL");
        })
    };
    let history = stack
        .wait_for("grow's recovery in its history", WAIT, || async {
            let out = plugin(&["trace", "grow", "-n", "default", "-o", "json"]);
            assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
            let v = out.json();
            let recovered = v["spec"]["replicas"][0]["decisions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|d| {
                    d["recovery"] == true && d["outcome"] == "placed" && d["nodes"][0] != killed
                });
            Ok(recovered.then_some(v))
        })
        .await
        .unwrap();
    let decisions = history["spec"]["replicas"][0]["decisions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        decisions
            .iter()
            .any(|d| d["recovery"] == false && d["nodes"][0] == killed),
        "the first placement, on the node killed since: {decisions:#?}"
    );
    let text = plugin(&["trace", "grow", "-n", "default"]);
    assert_eq!(text.code, 0, "{}", text.stderr);
    assert!(text.stdout.contains(killed), "{}", text.stdout);

    let file = dir.join("what-if.yaml");
    std::fs::write(&file, bundle("asked", "[onprem]", 10, "silver", "")).unwrap();
    let out = plugin(&["what-if", "-f", file.to_str().unwrap(), "-n", "default"]);
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(out.stdout.contains("fits"), "{}", out.stdout);
    println!("plugin_trace_default_install=yes");
}

async fn manager_outage(s: &mut Scenario) {
    s.stack.sim.kill9();
    s.stack
        .wait_for("the operator to see Manager gone", WAIT, || async {
            let (code, _) = s.stack.http_get("/readyz").await?;
            Ok((code != 200).then_some(()))
        })
        .await
        .unwrap();
    let waiting = |o: &Value| is(o, "Reconciling", "True", "ManagerUnavailable");
    s.apply(&bundle("late", "[onprem]", 10, "silver", "")).await;
    s.capture(
        "bundle applied while Manager is unreachable",
        &["bundle", "late", "-n", "default"],
        "InProgress",
        "Progressing",
        waiting,
    )
    .await;
    s.kubectl(&[
        "annotate",
        "bundle",
        "cheap",
        "-n",
        "default",
        "example.com/touched=outage",
    ])
    .await;
    s.capture(
        "bundle with a dropped job while Manager is unreachable",
        &["bundle", "cheap", "-n", "default"],
        "InProgress",
        "Progressing",
        |b| waiting(b) && condition(b, "Degraded")["reason"] == "JobsDropped",
    )
    .await;
    s.apply(&spare_target("late-spare", "onprem", 1, "r740", "oslo-dc1"))
        .await;
    s.capture(
        "spare target applied while Manager is unreachable",
        &["hotsparetarget", "late-spare"],
        "InProgress",
        "Progressing",
        waiting,
    )
    .await;
    s.apply(&migration("move-late", "walk", "")).await;
    s.capture(
        "migration applied while Manager is unreachable",
        &["migration", "move-late", "-n", "default"],
        "InProgress",
        "Progressing",
        waiting,
    )
    .await;
}

/// The operator was never refused, and what it needed RBAC for happened.
async fn rbac_was_enough(stack: &Stack) {
    let log = stack.operator.log_text();
    for refused in ["forbidden", "Forbidden", " 403"] {
        assert!(
            !log.contains(refused),
            "the ServiceAccount was refused something ({refused}):\n{}",
            log.lines()
                .filter(|l| l.contains(refused))
                .take(10)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    let lease = stack
        .get_json(&["lease", FULLNAME, "-n", RELEASE_NAMESPACE])
        .await
        .unwrap();
    assert!(
        lease["spec"]["holderIdentity"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "{lease:#}"
    );
    // Events are published off the reconcile path: the last ones may land a moment late.
    let wanted = [
        ("default", "Placed"),
        ("default", "BundleBroken"),
        ("default", "ProvisioningSpare"),
    ];
    let reasons = || async {
        let events = stack.get_json(&["events.events.k8s.io", "-A"]).await?;
        let reasons: Vec<(String, String)> = events["items"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|e| {
                (
                    e["metadata"]["namespace"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    e["reason"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        Ok::<_, automanager_e2e::SetupError>(reasons)
    };
    let all_there = stack
        .wait_for("the Events the RBAC allows", WAIT, || async {
            let seen = reasons().await?;
            Ok(wanted
                .iter()
                .all(|(ns, reason)| seen.iter().any(|(n, r)| n == ns && r == reason))
                .then_some(()))
        })
        .await;
    if all_there.is_err() {
        let seen = reasons().await.unwrap_or_default();
        for (ns, reason) in wanted {
            assert!(
                seen.iter().any(|(n, r)| n == ns && r == reason),
                "no {reason} Event in {ns}: {seen:?}"
            );
        }
    }
}

/// What the ServiceAccount may not do.
async fn rbac_is_no_more(env: &TestEnv) {
    let ns = RELEASE_NAMESPACE;
    let sa = FULLNAME;
    for denied in [
        &["get", "secrets", "-n", ns][..],
        &["list", "secrets", "-A"],
        &["get", "secrets/automanager-manager-token", "-n", ns],
        &["get", "pods", "-n", ns],
        &["list", "pods", "-A"],
        &["create", "pods", "-n", ns],
        &["delete", "pods", "-n", ns],
        &["get", "nodes"],
        &["patch", "nodes"],
        &["create", "deployments", "-n", ns],
        &["update", "deployments", "-n", ns],
        &["create", "configmaps", "-n", ns],
        &["update", "customresourcedefinitions.apiextensions.k8s.io"],
        &["create", "bundles.automanager.norsk.io", "-n", "default"],
        &["delete", "bundles.automanager.norsk.io", "-n", "default"],
        &["update", "bundles.automanager.norsk.io", "-n", "default"],
        &["create", "placementpools.automanager.norsk.io"],
        &["create", "hotsparetargets.automanager.norsk.io"],
        &["delete", "migrations.automanager.norsk.io", "-n", "default"],
        &["patch", "managernodes.automanager.norsk.io"],
        &["create", "leases.coordination.k8s.io", "-n", "default"],
        &["get", "leases.coordination.k8s.io/someone-elses", "-n", ns],
        &["list", "events.events.k8s.io", "-A"],
        &["get", "events.events.k8s.io", "-n", "default"],
        &["create", "clusterrolebindings.rbac.authorization.k8s.io"],
        &["impersonate", "serviceaccounts"],
    ] {
        assert!(
            !can_i(env, ns, sa, denied).await.unwrap(),
            "the ServiceAccount may {denied:?}"
        );
    }
    // The rights it has (so the denials above are answers, not a broken check).
    for allowed in [
        &["list", "bundles.automanager.norsk.io", "-A"][..],
        &[
            "patch",
            "bundles.automanager.norsk.io",
            "--subresource=status",
            "-n",
            "default",
        ],
        &["create", "migrations.automanager.norsk.io", "-n", "default"],
        &["patch", "placementpools.automanager.norsk.io"],
        &["patch", "hotsparetargets.automanager.norsk.io"],
        &["create", "events.events.k8s.io", "-n", "default"],
        &[
            "patch",
            "leases.coordination.k8s.io/am-automanager",
            "-n",
            ns,
        ],
    ] {
        assert!(
            can_i(env, ns, sa, allowed).await.unwrap(),
            "the ServiceAccount may not {allowed:?}"
        );
    }
}

/// Each capture's kstatus (tools/kstatus) and Argo CD health (tools/argo-health running the
/// argocd-cm built from deploy/gitops/argocd/resource_customizations) are what docs/kstatus.md
/// and docs/gitops.md say.
fn verdicts_match(env: &TestEnv, captures: &[Capture], dir: &std::path::Path) {
    let objects = dir.join("captured.json");
    let list = serde_json::json!({
        "apiVersion": "v1",
        "kind": "List",
        "items": captures.iter().map(|c| c.object.clone()).collect::<Vec<_>>(),
    });
    std::fs::write(&objects, list.to_string()).unwrap();

    let kstatus = run_tool(std::process::Command::new(tool("kstatus").unwrap()).arg(&objects));
    let mut kubectl = env.kubectl();
    kubectl.args([
        "kustomize",
        repo_root()
            .join("deploy/gitops/argocd/resource_customizations")
            .to_str()
            .unwrap(),
    ]);
    let cm = run(kubectl, None).unwrap();
    assert!(cm.success(), "{}", cm.stderr);
    let cm_path = dir.join("argocd-cm.yaml");
    std::fs::write(&cm_path, &cm.stdout).unwrap();
    let argo = run_tool(
        std::process::Command::new(tool("argo-health").unwrap())
            .arg("--argocd-cm")
            .arg(&cm_path)
            .arg(&objects),
    );
    assert_eq!(kstatus.len(), captures.len());
    assert_eq!(argo.len(), captures.len());
    let mut wrong = Vec::new();
    for ((c, k), a) in captures.iter().zip(&kstatus).zip(&argo) {
        if k["status"] != c.kstatus || a["status"] != c.argo {
            wrong.push(format!(
                "{}: kstatus {} ({}), Argo CD {} ({}); documented {} / {}",
                c.what, k["status"], k["message"], a["status"], a["message"], c.kstatus, c.argo
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "verdicts differ from docs/kstatus.md and docs/gitops.md:\n{}",
        wrong.join("\n")
    );
    // The states reached by design, as kstatus (and so Flux's `wait: true`) read them live.
    let by_design = |o: &Value| {
        let drop = condition(o, "Degraded")["status"] == "True";
        let outage = condition(o, "Reconciling")["reason"] == "ManagerUnavailable";
        (drop || outage, outage)
    };
    let failed_by_design = captures
        .iter()
        .zip(&kstatus)
        .filter(|(c, k)| by_design(&c.object).0 && k["status"] == "Failed")
        .count();
    let outage: Vec<&Value> = captures
        .iter()
        .zip(&kstatus)
        .filter(|(c, _)| by_design(&c.object).1)
        .map(|(_, k)| k)
        .collect();
    let blip_green = !outage.is_empty() && outage.iter().all(|k| k["status"] != "Failed");
    println!(
        "kstatus_failed_by_design={failed_by_design} flux_wait_blip={} ({} captures during a Manager outage)",
        if blip_green { "green" } else { "red" },
        outage.len()
    );
    assert_eq!(failed_by_design, 0);
    assert!(blip_green);
    // Every kind was judged in more than one state.
    for kind in [
        "Bundle",
        "PlacementPool",
        "HotSpareTarget",
        "Migration",
        "ManagerNode",
    ] {
        let states: std::collections::BTreeSet<&str> = captures
            .iter()
            .zip(&kstatus)
            .filter(|(c, _)| c.object["kind"] == kind)
            .map(|(_, k)| k["status"].as_str().unwrap_or_default())
            .collect();
        assert!(states.len() >= 2, "{kind} was seen only as {states:?}");
    }
}

fn run_tool(cmd: &mut std::process::Command) -> Vec<Value> {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
