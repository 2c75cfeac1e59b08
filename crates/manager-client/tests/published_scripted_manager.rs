//! Our client of Manager's published API against a Manager written in Node from the package's
//! own service definition (`crates/manager-proto/reference/scripted-manager.cjs`, grpc-js with
//! `@norskvideo/norsk-api`'s `ManagerService`): the mirror from the snapshot, start and stop
//! through the calls and their events, JobSearch by tag, a reconnect to an unchanged Manager
//! (no change at all), a reconnect to a changed one (exactly the differences), and a stream that
//! went silent while calls still answered (found, reopened, reconciled).
//!
//! Node runs the package (`oracle.rs` says what happens without it).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::Duration;

use manager_client::published::{
    InstancePhase, PublishedChange, PublishedClient, PublishedConfig, PublishedMirror,
};
use manager_proto::api::common::{JobId, NodeId};
use manager_proto::api::manager::tag_filter::Comparison;
use manager_proto::api::manager::{
    CreateAwsNodeRequest, Job, JobFilter, JobSearchRequest, TagFilter, job_filter,
};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

const WAIT: Duration = Duration::from_secs(30);

#[path = "../../manager-proto/reference/oracle.rs"]
mod oracle;

use oracle::{reference_dir, unavailable};

/// The Node Manager, steered through its stdin.
struct Scripted {
    _child: Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    port: u16,
}

impl Scripted {
    async fn start() -> Scripted {
        let mut child = Command::new("node")
            .arg("scripted-manager.cjs")
            .current_dir(reference_dir())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn node");
        let stdin = child.stdin.take().expect("stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let first = tokio::time::timeout(WAIT, stdout.next_line())
            .await
            .expect("the Node Manager starts")
            .expect("read")
            .expect("a first line");
        let port: serde_json::Value = serde_json::from_str(&first).expect("JSON");
        let port = u16::try_from(port["port"].as_u64().expect("port")).expect("a port");
        Scripted {
            _child: child,
            stdin,
            stdout,
            port,
        }
    }

    async fn command(&mut self, cmd: serde_json::Value) {
        let line = format!("{cmd}\n");
        self.stdin.write_all(line.as_bytes()).await.expect("write");
        let answer = tokio::time::timeout(WAIT, self.stdout.next_line())
            .await
            .expect("an answer")
            .expect("read")
            .expect("a line");
        assert!(answer.contains("\"ok\""), "{cmd} -> {answer}");
    }
}

async fn until(client: &PublishedClient, what: &str, test: impl Fn(&PublishedMirror) -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !client.with_mirror(&test) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {WAIT:?} for {what}: {:?}",
            client.with_mirror(Clone::clone)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn snapshots_reach(client: &PublishedClient, n: u64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while client.counters().snapshots.load(Ordering::Acquire) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "snapshot {n} never came"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn owned(tags: &[(&str, &str)]) -> BTreeMap<String, String> {
    tags.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The changes received so far, without the `Resynced` marks that close each snapshot.
fn drain(rx: &mut tokio::sync::broadcast::Receiver<PublishedChange>) -> Vec<PublishedChange> {
    let mut out = Vec::new();
    while let Ok(c) = rx.try_recv() {
        if !matches!(c, PublishedChange::Resynced) {
            out.push(c);
        }
    }
    out
}

#[tokio::test]
async fn our_client_mirrors_and_drives_a_manager_built_from_the_package() {
    if unavailable().is_some() {
        return;
    }
    let mut manager = Scripted::start().await;
    let mut config = PublishedConfig::new(format!("http://127.0.0.1:{}", manager.port));
    config.echo_deadline = Duration::from_secs(2);
    config.connection.backoff_initial = Duration::from_millis(20);
    config.connection.backoff_max = Duration::from_millis(200);
    let client = PublishedClient::connect(config).expect("connect");
    client.wait_ready(WAIT).await.expect("the first snapshot");
    assert_eq!(client.with_mirror(Clone::clone), PublishedMirror::default());

    // A node under an id we choose, a stored job with tags, an instance of it under a role.
    client
        .create_aws_node(CreateAwsNodeRequest {
            node_id: Some(NodeId {
                node_id: "n1".to_owned(),
            }),
            tags: owned(&[("automanager.norsk.io/owner", "test")]),
            region: "eu-west-1".to_owned(),
            instance_type: "m5.xlarge".to_owned(),
            ..Default::default()
        })
        .await
        .expect("CreateAwsNode");
    until(&client, "n1 running", |m| {
        m.nodes
            .get("n1")
            .is_some_and(|n| n.state == manager_client::published::NodeState::Running)
    })
    .await;
    let job = |id: &str| Job {
        job_id: Some(JobId {
            job_id: id.to_owned(),
        }),
        tags: owned(&[("automanager.norsk.io/owner", "test"), ("bundle", "news")]),
        ..Default::default()
    };
    client.create_job(job("j1")).await.expect("CreateJob");
    client
        .start_job("j1", "primary", "n1")
        .await
        .expect("StartJob");
    until(&client, "j1 primary running on n1", |m| {
        m.jobs.get("j1").is_some_and(|j| {
            j.instances
                .get("primary")
                .is_some_and(|i| i.node_id == "n1" && i.phase == InstancePhase::Running)
        })
    })
    .await;

    // JobSearch by tag.
    let found = client
        .job_search(JobSearchRequest {
            job_filter: vec![JobFilter {
                job_filter: Some(job_filter::JobFilter::TagFilter(TagFilter {
                    tag_name: "bundle".to_owned(),
                    comparison: Some(Comparison::Eq("news".to_owned())),
                })),
            }],
        })
        .await
        .expect("JobSearch");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].instances.len(), 1);

    // A reconnect to an unchanged Manager changes nothing.
    let mut changes = client.subscribe();
    let held = client.with_mirror(Clone::clone);
    manager.command(serde_json::json!({"cmd": "drop"})).await;
    snapshots_reach(&client, 2).await;
    client.wait_ready(WAIT).await.expect("ready again");
    assert_eq!(drain(&mut changes), Vec::new());
    assert_eq!(client.with_mirror(Clone::clone), held);

    // A reconnect to a changed Manager reports exactly the differences.
    manager
        .command(serde_json::json!({"cmd": "offline", "deleteJob": "j1"}))
        .await;
    manager
        .command(serde_json::json!({"cmd": "offline", "addNode": "n2", "tags": {"pool": "b"}}))
        .await;
    manager.command(serde_json::json!({"cmd": "drop"})).await;
    snapshots_reach(&client, 3).await;
    let seen: Vec<String> = drain(&mut changes)
        .iter()
        .map(|c| match c {
            PublishedChange::NodeUpserted(n) => format!("node+ {}", n.node_id),
            PublishedChange::NodeRemoved(n) => format!("node- {}", n.node_id),
            PublishedChange::JobUpserted(j) => format!("job+ {}", j.job_id()),
            PublishedChange::JobRemoved(j) => format!("job- {}", j.job_id()),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(seen, vec!["node+ n2".to_owned(), "job- j1".to_owned()]);

    // A stream that goes silent while calls still answer: an accepted change with no event after
    // it gives the stream up; the next snapshot brings the change.
    manager
        .command(serde_json::json!({"cmd": "silent", "on": true}))
        .await;
    client.create_job(job("j2")).await.expect("CreateJob j2");
    until(&client, "j2 after the silent stream was reopened", |m| {
        m.jobs.contains_key("j2")
    })
    .await;
    assert_eq!(client.counters().silent_streams.load(Ordering::Relaxed), 1);
    manager
        .command(serde_json::json!({"cmd": "silent", "on": false}))
        .await;
    client.wait_ready(WAIT).await.expect("ready again");

    // Stop, then the instance reads stopped.
    client
        .start_job("j2", "backup", "n2")
        .await
        .expect("StartJob");
    until(&client, "j2 backup running", |m| {
        m.jobs["j2"]
            .instances
            .get("backup")
            .is_some_and(|i| i.phase == InstancePhase::Running)
    })
    .await;
    client
        .stop_job("j2", "backup", "n2")
        .await
        .expect("StopJob");
    until(&client, "j2 backup stopped", |m| {
        m.jobs["j2"]
            .instances
            .get("backup")
            .is_some_and(|i| i.phase == InstancePhase::Stopped)
    })
    .await;

    // A refusal reaches the caller as Manager's status.
    let err = client
        .start_job("nope", "primary", "n1")
        .await
        .expect_err("no such job");
    assert!(
        matches!(err, manager_client::ClientError::NotFound(_)),
        "{err}"
    );
    assert_eq!(
        client.counters().malformed_events.load(Ordering::Relaxed),
        0
    );
    client.close().await;
}
