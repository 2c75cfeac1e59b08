//! Helpers shared by the loopback tests: a sim config, a TCP proxy that can
//! drop the connection on demand, and waiting helpers.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use manager_client::{ClientConfig, ManagerClient, MirrorChange};
use manager_proto::{Bundle, BundleJob, JobRequirements};
use manager_sim::SimConfig;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, broadcast};

pub const WAIT: Duration = Duration::from_secs(10);

/// Fast timings, one elastic pool and one fixed pool.
pub fn config() -> SimConfig {
    SimConfig::from_yaml(
        r"
timing: {provisionDelayMs: 10, jobStartDelayMs: 5, jobStopDelayMs: 5, startDelayMs: 20, stopDelayMs: 10}
pools:
  - name: aws-east
    kind: aws
    region: eu-west-1
    zones: [a, b]
    scaleOut: elastic
    instanceTypes:
      - {instanceType: m5.xlarge, capacity: 100, cores: 16}
  - name: dc
    kind: cluster
    region: lon
    zones: [rack-a, rack-b]
    scaleOut: fixed
    nodes:
      - {id: dc-a1, zone: rack-a, capacity: 100, cores: 8}
      - {id: dc-a2, zone: rack-a, capacity: 100, cores: 8}
      - {id: dc-b1, zone: rack-b, capacity: 100, cores: 8}
",
    )
    .expect("test config")
}

pub fn bundle(id: &str, replicas: u32, capacity: f64, cores: i32) -> Bundle {
    Bundle {
        bundle_id: id.into(),
        replicas,
        jobs: vec![BundleJob {
            job_name: "encode".into(),
            requirements: Some(JobRequirements {
                required_capacity: capacity,
                required_cores: cores,
                required_capabilities: vec![],
                priority_band: "gold".into(),
            }),
            config: Vec::new(),
            template: Vec::new(),
        }],
        ..Default::default()
    }
}

pub fn fast(endpoint: String) -> ClientConfig {
    let mut c = ClientConfig::new(endpoint);
    c.backoff_initial = Duration::from_millis(20);
    c.backoff_max = Duration::from_millis(200);
    c
}

pub async fn connect(endpoint: String) -> ManagerClient {
    let c = ManagerClient::connect(fast(endpoint))
        .await
        .expect("connect");
    c.wait_ready(WAIT).await.expect("ready");
    c
}

/// Collects changes until `pred` matches one (returns all seen, inclusive).
pub async fn changes_until(
    rx: &mut broadcast::Receiver<MirrorChange>,
    pred: impl Fn(&MirrorChange) -> bool,
) -> Vec<MirrorChange> {
    let mut seen = Vec::new();
    tokio::time::timeout(WAIT, async {
        loop {
            let c = rx.recv().await.expect("change stream");
            let stop = pred(&c);
            seen.push(c);
            if stop {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out; saw {seen:#?}"));
    seen
}

/// A loopback TCP proxy whose link can be cut and restored.
pub struct Proxy {
    pub addr: SocketAddr,
    down: Arc<AtomicBool>,
    cut: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let cut = Arc::new(Notify::new());
        let (d, c) = (down.clone(), cut.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                if d.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let c = c.clone();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        () = c.notified() => {}
                    }
                });
            }
        });
        Proxy {
            addr,
            down,
            cut,
            task,
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Drops every open connection and refuses new ones.
    pub fn take_down(&self) {
        self.down.store(true, Ordering::SeqCst);
        self.cut.notify_waiters();
    }

    pub fn bring_up(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut.notify_waiters();
        self.task.abort();
    }
}
