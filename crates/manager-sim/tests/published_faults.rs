//! SimAdmin's faults reach the published world over gRPC as they reach our first API's: a job
//! or node id only the published world knows is its own, its calls are counted under the
//! published package's name, and with `--state-dir` a restarted sim's EventStream snapshot
//! shows the same world.

use std::collections::BTreeMap;
use std::time::Duration;

use manager_proto::api::common::{JobId, NodeId};
use manager_proto::api::manager::event_stream_event::Event;
use manager_proto::api::manager::job_history_entry::HistoryEntry;
use manager_proto::api::manager::manager_client::ManagerClient;
use manager_proto::api::manager::{
    CreateAwsNodeRequest, EventStreamEvent, EventStreamRequest, Job, StartJobRequest,
};
use manager_proto::sim_admin_client::SimAdminClient;
use manager_proto::{
    CallCountsRequest, FailJobRequest, JobHistoryRequest, JobRole, KillZoneRequest,
    RejectNextRequest,
};
use manager_sim::{FAIL_JOB_ROLE_HEADER, Sim, SimConfig};
use tonic::Streaming;
use tonic::transport::Channel;

const WAIT: Duration = Duration::from_secs(10);
const JOB: &str = "ns.b/0/enc";

fn aws_node(id: &str) -> CreateAwsNodeRequest {
    CreateAwsNodeRequest {
        node_id: Some(NodeId {
            node_id: id.to_owned(),
        }),
        tags: BTreeMap::from([(
            "automanager.norsk.io/zone".to_owned(),
            "eu-west-1a".to_owned(),
        )]),
        region: "eu-west-1".to_owned(),
        instance_type: "m5.xlarge".to_owned(),
        ..Default::default()
    }
}

fn start(job: &str, role: &str, node: &str) -> StartJobRequest {
    StartJobRequest {
        job_id: Some(JobId {
            job_id: job.to_owned(),
        }),
        role: role.to_owned(),
        node_id: Some(NodeId {
            node_id: node.to_owned(),
        }),
    }
}

/// The next event of `stream` that `pick` accepts.
async fn until<T>(
    stream: &mut Streaming<EventStreamEvent>,
    what: &str,
    pick: impl Fn(&Event) -> Option<T>,
) -> T {
    tokio::time::timeout(WAIT, async {
        loop {
            let e = stream
                .message()
                .await
                .expect("the stream answers")
                .expect("the stream goes on");
            if let Some(t) = e.event.as_ref().and_then(&pick) {
                return t;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("waited for {what}"))
}

/// Opens an EventStream and reads its snapshot (up to and with `InitialDataComplete`).
async fn snapshot(
    manager: &mut ManagerClient<Channel>,
) -> (Vec<EventStreamEvent>, Streaming<EventStreamEvent>) {
    let mut stream = manager
        .event_stream(EventStreamRequest {
            pending_window_s: 60,
        })
        .await
        .expect("stream")
        .into_inner();
    let mut out = Vec::new();
    tokio::time::timeout(WAIT, async {
        loop {
            let e = stream.message().await.expect("answers").expect("goes on");
            let done = matches!(e.event, Some(Event::InitialDataComplete(_)));
            out.push(e);
            if done {
                return;
            }
        }
    })
    .await
    .expect("a whole snapshot");
    (out, stream)
}

/// The reason of the job's last `JobHistoryJobStopping` under `role`, if the event is that
/// job's update.
fn last_stop(e: &Event, role: &str) -> Option<i32> {
    let Event::JobUpdated(u) = e else {
        return None;
    };
    let h = u.job_with_history.as_ref()?;
    h.history_entry
        .iter()
        .rev()
        .find_map(|x| match &x.history_entry {
            Some(HistoryEntry::JobStopping(s)) if s.role == role => Some(s.reason),
            _ => None,
        })
}

/// A running node `n1` in eu-west-1a and job `JOB` stored, seen on `stream`.
async fn node_and_job(
    manager: &mut ManagerClient<Channel>,
    stream: &mut Streaming<EventStreamEvent>,
) {
    manager.create_aws_node(aws_node("n1")).await.expect("node");
    until(stream, "n1 started", |e| {
        matches!(e, Event::NodeStarted(s)
            if s.node_metadata.as_ref().and_then(|m| m.node_id.as_ref()).is_some_and(|n| n.node_id == "n1"))
        .then_some(())
    })
    .await;
    manager
        .create_job(Job {
            job_id: Some(JobId {
                job_id: JOB.to_owned(),
            }),
            tags: BTreeMap::from([("bundle".to_owned(), "ns.b".to_owned())]),
            ..Default::default()
        })
        .await
        .expect("job");
}

#[tokio::test]
async fn faults_reach_the_published_world_by_its_ids_and_its_calls_are_counted() {
    let sim = Sim::start(SimConfig::demo()).await.expect("sim");
    let mut manager = ManagerClient::connect(sim.endpoint())
        .await
        .expect("connect");
    let mut admin = SimAdminClient::connect(sim.endpoint())
        .await
        .expect("connect");
    let (_, mut stream) = snapshot(&mut manager).await;
    node_and_job(&mut manager, &mut stream).await;
    manager
        .start_job(start(JOB, "primary", "n1"))
        .await
        .expect("primary");
    manager
        .start_job(start(JOB, "backup", "onprem-a1"))
        .await
        .expect("backup");

    // fail-job --role: only that instance fails, as a job failure.
    let mut fail = tonic::Request::new(FailJobRequest {
        job_id: JOB.to_owned(),
        message: "encoder crashed".to_owned(),
    });
    fail.metadata_mut()
        .insert(FAIL_JOB_ROLE_HEADER, "primary".parse().expect("ascii"));
    let said = admin.fail_job(fail).await.expect("failed").into_inner();
    assert!(said.summary.contains("(primary)"), "{said:?}");
    let reason = until(&mut stream, "primary stopped", |e| last_stop(e, "primary")).await;
    assert_eq!(reason, 4, "JOB_STOPPED_JOB_FAILED");

    // reject-next: the call is answered, the instance stops as failed without running.
    admin
        .reject_next(RejectNextRequest { count: 1 })
        .await
        .expect("armed");
    manager
        .start_job(start(JOB, "primary", "n1"))
        .await
        .expect("a refused start is still answered");
    let refused = until(&mut stream, "the refusal", |e| match e {
        Event::JobInfo(i) => Some(i.clone()),
        _ => None,
    })
    .await;
    assert_eq!(refused.job_key.expect("key").role, "primary");

    // job-history: the starts the sim saw (the refused one is not one).
    let h = admin
        .job_history(JobHistoryRequest {
            job_id: JOB.to_owned(),
        })
        .await
        .expect("history")
        .into_inner();
    let nodes: Vec<(&str, i32)> = h
        .starts
        .iter()
        .map(|s| (s.node_id.as_str(), s.role))
        .collect();
    assert_eq!(
        nodes,
        [
            ("n1", JobRole::Normal as i32),
            ("onprem-a1", JobRole::Normal as i32)
        ]
    );
    assert_eq!(h.running, 1);

    // kill-zone: the published node in the zone dies with it.
    let killed = admin
        .kill_zone(KillZoneRequest {
            zone: "eu-west-1a".to_owned(),
            revive: false,
        })
        .await
        .expect("killed")
        .into_inner();
    assert_eq!(killed.node_ids, ["n1"]);

    // An id neither world knows is NOT_FOUND.
    let err = admin
        .fail_job(FailJobRequest {
            job_id: "ns.nobody/0/enc".to_owned(),
            message: String::new(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(err.code(), tonic::Code::NotFound);

    let counts = admin
        .call_counts(CallCountsRequest {})
        .await
        .expect("counts")
        .into_inner();
    let n = |rpc: &str| {
        counts
            .calls
            .get(&format!("norsk.api.manager/{rpc}"))
            .copied()
    };
    assert_eq!(n("StartJob"), Some(3));
    assert_eq!(n("CreateAwsNode"), Some(1));
    assert_eq!(n("CreateJob"), Some(1));
    assert_eq!(n("EventStream"), Some(1));
    assert_eq!(
        counts.mutating, 5,
        "faults and streams change nothing: {counts:?}"
    );
}

#[tokio::test]
async fn a_restarted_sim_s_event_stream_shows_the_same_published_world() {
    let dir = tempfile::tempdir().expect("dir");
    let mut config = SimConfig::demo();
    config.state_dir = Some(dir.path().to_owned());

    let sim = Sim::start(config.clone()).await.expect("sim");
    let mut manager = ManagerClient::connect(sim.endpoint())
        .await
        .expect("connect");
    let (_, mut stream) = snapshot(&mut manager).await;
    node_and_job(&mut manager, &mut stream).await;
    manager
        .start_job(start(JOB, "primary", "n1"))
        .await
        .expect("started");
    // The snapshot to compare is taken once the job runs (after the sim's job start delay).
    let runs = |events: &[EventStreamEvent]| {
        events.iter().any(|e| match &e.event {
            Some(Event::JobActive(a)) => a.job_with_history.as_ref().is_some_and(|j| {
                j.history_entry
                    .iter()
                    .any(|h| matches!(h.history_entry, Some(HistoryEntry::JobRunning(_))))
            }),
            _ => false,
        })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let before = loop {
        let (events, _) = snapshot(&mut manager).await;
        if runs(&events) {
            break events;
        }
        assert!(tokio::time::Instant::now() < deadline, "the job never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop((stream, manager));
    sim.shutdown().await;

    let again = Sim::start(config).await.expect("restarted");
    let mut manager = ManagerClient::connect(again.endpoint())
        .await
        .expect("connect");
    let (after, _) = snapshot(&mut manager).await;
    assert_eq!(after, before);
    assert!(
        after.iter().any(|e| matches!(&e.event,
            Some(Event::NodeRunning(n)) if n.instances.len() == 1)),
        "n1 runs the job's instance: {after:?}"
    );
}
