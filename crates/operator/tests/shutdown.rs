//! SIGTERM is heard at every stage of the operator's start: while it waits for the apiserver
//! and the Lease, while it waits for Manager, and while its controllers wait for their first
//! sync. The binary runs as a process with peers that accept connections and never answer
//! (a hung apiserver, a hung Manager), and the test checks what the process did after the
//! signal (exit 0, no controllers started), not how fast: the bound on the wait only keeps a
//! broken build from hanging the suite.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use manager_sim::{Sim, SimConfig};

/// Bounds each wait; generous because the machine is shared.
const BOUND: Duration = Duration::from_secs(120);

/// A TCP peer that accepts every connection and never writes a byte.
struct HungPeer {
    listener: TcpListener,
    held: Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl HungPeer {
    fn start() -> HungPeer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let held = Arc::new(Mutex::new(Vec::new()));
        let accept = listener.try_clone().unwrap();
        let keep = held.clone();
        std::thread::spawn(move || {
            for stream in accept.incoming().flatten() {
                keep.lock().unwrap().push(stream);
            }
        });
        HungPeer { listener, held }
    }

    fn port(&self) -> u16 {
        self.listener.local_addr().unwrap().port()
    }

    /// Waits until someone has connected (`who` names the caller in the failure).
    fn wait_for_a_connection(&self, who: &str) {
        let deadline = Instant::now() + BOUND;
        while self.held.lock().unwrap().is_empty() {
            assert!(Instant::now() < deadline, "{who} never called this peer");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn write_kubeconfig(dir: &Path, apiserver_port: u16) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: hung\n  cluster:\n    server: https://127.0.0.1:{apiserver_port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context: {{cluster: hung, user: u}}\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    path
}

/// The operator process and every line it wrote to stderr so far.
struct Operator {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    new_line: mpsc::Receiver<()>,
    _dir: tempfile::TempDir,
}

impl Operator {
    fn start(manager_url: &str, leader_election: bool, apiserver_port: u16) -> Operator {
        Self::start_over("published", manager_url, leader_election, apiserver_port)
    }

    /// [`Operator::start`] speaking Manager's API `api` (`manager.api`).
    fn start_over(
        api: &str,
        manager_url: &str,
        leader_election: bool,
        apiserver_port: u16,
    ) -> Operator {
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = write_kubeconfig(dir.path(), apiserver_port);
        let config = dir.path().join("config.yaml");
        std::fs::write(
            &config,
            format!(
                "manager:\n  api: {api}\n  url: {manager_url}\n  connectTimeout: 1s\nleaderElection:\n  enabled: {leader_election}\nhttp:\n  bindAddress: 127.0.0.1:0\n"
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_automanager-operator"))
            .arg("--config")
            .arg(&config)
            .env("KUBECONFIG", &kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let (tx, new_line) = mpsc::channel();
        let keep = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                keep.lock().unwrap().push(line);
                let _ = tx.send(());
            }
        });
        Operator {
            child,
            lines,
            new_line,
            _dir: dir,
        }
    }

    fn log(&self) -> String {
        self.lines.lock().unwrap().join("\n")
    }

    /// Waits until a line containing `text` was logged.
    fn wait_for_line(&self, text: &str) {
        let deadline = Instant::now() + BOUND;
        while !self.lines.lock().unwrap().iter().any(|l| l.contains(text)) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "the operator never logged {text:?}:\n{}",
                self.log()
            );
            let _ = self
                .new_line
                .recv_timeout(left.min(Duration::from_millis(200)));
        }
    }

    fn sigterm(&self) {
        testenv::process::send_signal(self.child.id(), testenv::process::Signal::Term).unwrap();
    }

    /// The exit code once the process has exited.
    fn wait_for_exit(&mut self) -> Option<i32> {
        let deadline = Instant::now() + BOUND;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!(
                    "the operator still ran {BOUND:?} after SIGTERM:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The lines logged after the first `shutdown requested`.
    fn after_shutdown(&self) -> Vec<String> {
        let lines = self.lines.lock().unwrap();
        let at = lines
            .iter()
            .position(|l| l.contains("shutdown requested"))
            .unwrap_or_else(|| panic!("no `shutdown requested` in:\n{}", lines.join("\n")));
        lines[at..].to_vec()
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn assert_stopped_cleanly(operator: &mut Operator) {
    let code = operator.wait_for_exit();
    assert_eq!(
        code,
        Some(0),
        "the operator did not stop cleanly after SIGTERM:\n{}",
        operator.log()
    );
    let after = operator.after_shutdown();
    assert!(
        !after
            .iter()
            .any(|l| l.contains("starting controllers") || l.contains("Manager is not reachable")),
        "the operator went on starting after SIGTERM:\n{}",
        after.join("\n")
    );
}

#[test]
fn sigterm_while_waiting_for_the_apiserver_and_the_lease_stops_the_operator() {
    let apiserver = HungPeer::start();
    let manager = HungPeer::start();
    let mut operator = Operator::start(
        &format!("http://127.0.0.1:{}", manager.port()),
        true,
        apiserver.port(),
    );
    operator.wait_for_line("waiting for leadership");
    // The election is asking the apiserver, which holds the request unanswered.
    apiserver.wait_for_a_connection("the election");
    operator.sigterm();
    assert_stopped_cleanly(&mut operator);
}

#[test]
fn sigterm_while_waiting_for_manager_stops_the_operator_before_its_controllers_start() {
    let apiserver = HungPeer::start();
    let manager = HungPeer::start();
    let mut operator = Operator::start(
        &format!("http://127.0.0.1:{}", manager.port()),
        false,
        apiserver.port(),
    );
    // Leader at once (election off), then up to 30 s waiting for a Manager that never answers.
    operator.wait_for_line("leading: starting controllers");
    operator.sigterm();
    assert_stopped_cleanly(&mut operator);
    assert!(
        operator.log().contains("controllers not started"),
        "{}",
        operator.log()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_while_the_controllers_wait_for_their_first_sync_stops_the_operator() {
    let sim = Sim::start(SimConfig::demo()).await.unwrap();
    let apiserver = HungPeer::start();
    let url = sim.endpoint();
    let operator = tokio::task::spawn_blocking(move || {
        // Over our first API the controllers are the first to ask the apiserver anything.
        // Over the published API the operator reads the PlacementPools (the pools Manager's
        // nodes are matched against) before them, so a connection to the hung apiserver would
        // not show that the controllers started.
        let operator = Operator::start_over("v1", &url, false, apiserver.port());
        // Manager answers, so the controllers start; their watches wait on the hung
        // apiserver for a first list that never comes.
        operator.wait_for_line("leading: starting controllers");
        apiserver.wait_for_a_connection("the controllers");
        (operator, apiserver)
    })
    .await
    .unwrap();
    operator.0.sigterm();
    // The controllers' watches never got their first list, so no reconcile is in flight and
    // their graceful stop ends at once rather than at the shutdown deadline (exit 3).
    let operator = tokio::task::spawn_blocking(move || {
        let mut operator = operator;
        assert_stopped_cleanly(&mut operator.0);
        assert!(
            operator
                .0
                .after_shutdown()
                .iter()
                .any(|l| l.contains("first list never came back")),
            "{}",
            operator.0.log()
        );
        operator
    })
    .await
    .unwrap();
    drop(operator);
    drop(sim);
}
