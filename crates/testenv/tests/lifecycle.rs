//! Start/stop against the real Go-built binaries: what a test gets, and that nothing is left
//! behind — after a normal drop, a panic, or a failed start.
//!
//! Without the binaries these tests FAIL with the "run `make control-plane`" message, unless
//! `AUTOMANAGER_SKIP_CONTROL_PLANE=1` is set (then they print why they skip).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};
use testenv::process::{Signal, is_running, send_signal};
use testenv::{Error, TestEnv};

fn port_of(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb / 1024)
}

/// What must be gone once an env is dropped.
struct Footprint {
    pids: [u32; 2],
    ports: [u16; 2],
    dir: PathBuf,
}

impl Footprint {
    fn of(env: &TestEnv) -> Self {
        Footprint {
            pids: [env.etcd_pid(), env.apiserver_pid()],
            ports: [port_of(env.etcd_url()), port_of(env.server_url())],
            dir: env.dir().to_path_buf(),
        }
    }

    fn assert_gone(&self) {
        for pid in self.pids {
            assert!(!is_running(pid), "pid {pid} still running");
        }
        for port in self.ports {
            assert!(
                TcpStream::connect(("127.0.0.1", port)).is_err(),
                "port {port} still accepts connections"
            );
        }
        assert!(!self.dir.exists(), "{} still exists", self.dir.display());
    }
}

/// Local addresses (`hex-ip:hex-port` as in /proc/net/tcp*) of the sockets `pid` listens on.
fn listening_addresses(pid: u32) -> Vec<String> {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let t = target.to_string_lossy().into_owned();
            t.strip_prefix("socket:[")?
                .strip_suffix(']')
                .map(str::to_owned)
        })
        .collect();
    let mut found = Vec::new();
    for table in [
        "/proc/net/tcp",
        "/proc/net/tcp6",
        "/proc/net/udp",
        "/proc/net/udp6",
    ] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state), Some(inode)) = (f.get(1), f.get(3), f.get(9)) else {
                continue;
            };
            let listening = *state == "0A" || table.contains("udp");
            if listening && inodes.iter().any(|i| i == inode) {
                found.push(format!("{table} {local}"));
            }
        }
    }
    found
}

fn no_process_mentions(path: &Path) -> bool {
    let needle = path.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().all(|e| {
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        !String::from_utf8_lossy(&cmdline).contains(&needle)
    })
}

#[tokio::test]
async fn a_started_env_serves_the_client_and_kubectl_and_leaves_nothing_behind() {
    if !support::control_plane_available() {
        return;
    }
    let env = TestEnv::start().await.unwrap();
    let footprint = Footprint::of(&env);
    assert!(env.server_url().starts_with("https://127.0.0.1:"));
    assert!(env.kubeconfig_path().starts_with(env.dir()));

    // Through the kube client.
    let configmaps: Api<ConfigMap> = Api::default_namespaced(env.client());
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("via-client".into()),
            ..Default::default()
        },
        data: Some([("greeting".to_owned(), "hello".to_owned())].into()),
        ..Default::default()
    };
    configmaps
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();

    // Through kubectl, which reads what the client wrote and writes what the client reads.
    let got = env
        .run_kubectl([
            "get",
            "configmap",
            "via-client",
            "-o",
            "jsonpath={.data.greeting}",
        ])
        .await
        .unwrap();
    assert!(got.success(), "{}", got.stderr);
    assert_eq!(got.stdout, "hello");
    let created = env
        .run_kubectl([
            "create",
            "configmap",
            "via-kubectl",
            "--from-literal=answer=42",
        ])
        .await
        .unwrap();
    assert!(created.success(), "{}", created.stderr);
    let back = configmaps.get("via-kubectl").await.unwrap();
    assert_eq!(
        back.data.unwrap().get("answer").map(String::as_str),
        Some("42")
    );

    // Applying YAML, and a rejection reported on stderr with a failing status.
    let applied = env
        .apply_yaml(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: via-apply\ndata:\n  k: v\n",
        )
        .await
        .unwrap();
    assert!(applied.success(), "{}", applied.stderr);
    assert!(
        applied.stdout.contains("configmap/via-apply created"),
        "{}",
        applied.stdout
    );
    let rejected = env
        .apply_yaml("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n")
        .await
        .unwrap();
    assert!(!rejected.success());
    assert!(rejected.stderr.contains("name"), "{}", rejected.stderr);

    // Client and server are the same release.
    let version = env.run_kubectl(["version", "-o", "json"]).await.unwrap();
    assert!(version.success(), "{}", version.stderr);
    assert_eq!(
        version
            .stdout
            .matches("\"gitVersion\": \"v1.35.4\"")
            .count(),
        2,
        "{}",
        version.stdout
    );

    // The EC service-account key works both ways: tokens are issued and verified.
    let sa = env
        .run_kubectl(["create", "serviceaccount", "robot"])
        .await
        .unwrap();
    assert!(sa.success(), "{}", sa.stderr);
    let token = env.run_kubectl(["create", "token", "robot"]).await.unwrap();
    assert!(token.success(), "{}", token.stderr);
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.stdout.trim().to_owned()),
            ..Default::default()
        },
        ..Default::default()
    };
    let reviewed = Api::<TokenReview>::all(env.client())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let status = reviewed.status.unwrap();
    assert_eq!(status.authenticated, Some(true), "{:?}", status.error);
    assert_eq!(
        status.user.and_then(|u| u.username).as_deref(),
        Some("system:serviceaccount:default:robot")
    );

    // Both listen, and only on 127.0.0.1 (0100007F in /proc/net/tcp), never IPv6 or UDP.
    for pid in [env.etcd_pid(), env.apiserver_pid()] {
        let addresses = listening_addresses(pid);
        assert!(!addresses.is_empty(), "pid {pid} listens nowhere");
        for a in &addresses {
            assert!(
                a.starts_with("/proc/net/tcp 0100007F:"),
                "pid {pid} listens beyond loopback: {a}"
            );
        }
    }

    env.check_processes().unwrap();
    eprintln!(
        "testenv figures: startup {:.2}s, RSS kube-apiserver {} MiB, etcd {} MiB",
        env.startup_time().as_secs_f64(),
        rss_mib(env.apiserver_pid()),
        rss_mib(env.etcd_pid())
    );
    let stopping = Instant::now();
    drop(env);
    eprintln!(
        "testenv figures: shutdown {:.2}s",
        stopping.elapsed().as_secs_f64()
    );
    footprint.assert_gone();
}

#[tokio::test]
async fn a_panicking_test_still_stops_everything() {
    if !support::control_plane_available() {
        return;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let env = TestEnv::start().await.unwrap();
        let _ = tx.send(Footprint::of(&env));
        panic!("deliberate panic while holding a TestEnv");
    });
    let err = task.await.unwrap_err();
    assert!(err.is_panic());
    rx.await.unwrap().assert_gone();
}

#[tokio::test]
async fn a_rejected_apiserver_flag_fails_with_its_log_and_leaves_nothing() {
    if !support::control_plane_available() {
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let err = TestEnv::builder()
        .data_dir(parent.path())
        .apiserver_arg("--no-such-flag=1")
        .start()
        .await
        .unwrap_err();
    match &err {
        Error::ExitedEarly {
            process, log_tail, ..
        } => {
            assert_eq!(*process, "kube-apiserver");
            assert!(
                log_tail.contains("unknown flag: --no-such-flag"),
                "{log_tail}"
            );
        }
        other => panic!("unexpected error: {other}"),
    }
    assert_eq!(
        std::fs::read_dir(parent.path()).unwrap().count(),
        0,
        "directory left behind"
    );
    assert!(
        no_process_mentions(parent.path()),
        "a process of the failed start is still running"
    );
}

#[tokio::test]
async fn a_start_that_times_out_reports_both_logs_and_leaves_nothing() {
    if !support::control_plane_available() {
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let err = TestEnv::builder()
        .data_dir(parent.path())
        .startup_timeout(Duration::from_millis(1))
        .start()
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::NotReady { .. }), "{msg}");
    assert!(msg.contains("did not become ready"), "{msg}");
    assert!(
        msg.contains("last lines of the kube-apiserver log"),
        "{msg}"
    );
    assert!(msg.contains("last lines of the etcd log"), "{msg}");
    assert_eq!(
        std::fs::read_dir(parent.path()).unwrap().count(),
        0,
        "directory left behind"
    );
    assert!(no_process_mentions(parent.path()));
}

#[tokio::test]
async fn a_control_plane_process_that_dies_is_reported() {
    if !support::control_plane_available() {
        return;
    }
    let env = TestEnv::builder()
        .shutdown_grace(Duration::from_secs(2))
        .start()
        .await
        .unwrap();
    let footprint = Footprint::of(&env);
    send_signal(env.etcd_pid(), Signal::Kill).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        match env.check_processes() {
            Err(e) => break e,
            Ok(()) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Ok(()) => panic!("etcd's death was not noticed"),
        }
    };
    assert!(
        matches!(
            err,
            Error::ProcessDied {
                process: "etcd",
                ..
            }
        ),
        "{err}"
    );
    env.stop().unwrap();
    footprint.assert_gone();
}

/// Reads `name` within 10 s. A client's pooled connection may have been cut by the pause or
/// the kill; a client retries such a transport error, so the test does too, and names every
/// error it saw if none of the tries answered.
async fn get_within(maps: &Api<ConfigMap>, name: &str, when: &str) {
    let mut errors = Vec::new();
    for _ in 0..20 {
        match maps.get(name).await {
            Ok(_) => return,
            Err(e) => errors.push(e.to_string()),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("{name} could not be read {when}: {errors:?}");
}

/// Waits until every thread of `pid` is in the stopped state (`T`) in `/proc`.
async fn wait_until_stopped(pid: u32) {
    let tasks = format!("/proc/{pid}/task");
    for _ in 0..600 {
        let all_stopped = std::fs::read_dir(&tasks)
            .map(|dir| {
                dir.flatten().all(|task| {
                    std::fs::read_to_string(task.path().join("stat"))
                        .ok()
                        .and_then(|stat| {
                            // The state follows the command name, which is in parentheses.
                            stat.rsplit_once(')')
                                .map(|(_, rest)| rest.trim_start().starts_with('T'))
                        })
                        .unwrap_or(false)
                })
            })
            .unwrap_or(false);
        if all_stopped {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("kube-apiserver (pid {pid}) did not stop after SIGSTOP within 30 s");
}

#[tokio::test]
async fn a_paused_apiserver_answers_after_resume_and_a_restarted_one_keeps_etcds_data() {
    if !support::control_plane_available() {
        return;
    }
    let env = TestEnv::start().await.unwrap();
    let maps: Api<ConfigMap> = Api::namespaced(env.client(), "default");
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("kept".into()),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    };
    maps.create(&PostParams::default(), &cm).await.unwrap();

    env.pause_apiserver().unwrap();
    // SIGSTOP takes effect thread by thread; wait until the kernel reports every thread
    // stopped, so what follows does not hinge on how fast that happens under load.
    wait_until_stopped(env.apiserver_pid()).await;
    // A stopped process cannot answer. The request may time out or fail (a pooled connection
    // cut, say); either is fine, an answer is not. The timeout only bounds the test.
    let paused = tokio::time::timeout(Duration::from_secs(2), maps.get("kept")).await;
    assert!(!matches!(paused, Ok(Ok(_))), "a paused apiserver answered");
    env.resume_apiserver().unwrap();
    get_within(&maps, "kept", "after the resume").await;

    let old_pid = env.apiserver_pid();
    let etcd_pid = env.etcd_pid();
    env.restart_apiserver(Duration::from_secs(120))
        .await
        .unwrap();
    assert_ne!(env.apiserver_pid(), old_pid);
    assert!(!is_running(old_pid), "the old apiserver still runs");
    assert_eq!(env.etcd_pid(), etcd_pid, "etcd was kept");
    // Same port, same credentials, same data; the previous run's log is kept.
    get_within(&maps, "kept", "after the restart").await;
    assert!(env.dir().join("kube-apiserver.1.log").exists());
    env.check_processes().unwrap();
}

#[tokio::test]
async fn crds_are_waited_for_until_established_and_served() {
    if !support::control_plane_available() {
        return;
    }
    let env = TestEnv::start().await.unwrap();
    let crd = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.testenv.io
spec:
  group: example.testenv.io
  names: {kind: Widget, plural: widgets, singular: widget, listKind: WidgetList}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, properties: {size: {type: integer}}}
"#;
    let applied = env.apply_yaml(crd).await.unwrap();
    assert!(applied.success(), "{}", applied.stderr);
    env.wait_for_crds_established(["widgets.example.testenv.io"], Duration::from_secs(30))
        .await
        .unwrap();
    // Right after, a custom resource applies without a discovery retry.
    let widget = env
        .apply_yaml("apiVersion: example.testenv.io/v1\nkind: Widget\nmetadata: {name: w}\nspec: {size: 3}\n")
        .await
        .unwrap();
    assert!(widget.success(), "{}", widget.stderr);

    let err = env
        .wait_for_crds_established(["gadgets.example.testenv.io"], Duration::from_millis(300))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::CrdsNotEstablished { ref pending, .. } if pending == &["gadgets.example.testenv.io"]),
        "{err}"
    );
}
