//! The client against the real sim over loopback TCP.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{Proxy, WAIT, bundle, changes_until, config, connect, fast};
use manager_client::{ClientConfig, ClientError, ConnectionState, ManagerClient, MirrorChange};
use manager_proto::manager_client::ManagerClient as RawClient;
use manager_proto::sim_admin_client::SimAdminClient;
use manager_proto::{
    CreateNodeRequest, JobRole, JobState, KillNodeRequest, MigrationPhase, MigrationStrategy,
    NodeState, NoticeNodeRequest, RejectionReason, SnapshotReason, StopReason, WatchRequest,
    watch_response,
};
use manager_sim::Sim;

fn mirror_matches_sim(client: &ManagerClient, sim: &manager_sim::SimHandle) {
    let snap = sim.snapshot();
    let m = client.mirror().state();
    assert_eq!(m.revision, snap.revision);
    assert_eq!(m.epoch, snap.epoch);
    assert_eq!(m.nodes.values().cloned().collect::<Vec<_>>(), snap.nodes);
    assert_eq!(m.jobs.values().cloned().collect::<Vec<_>>(), snap.jobs);
    assert_eq!(
        m.bundles.values().cloned().collect::<Vec<_>>(),
        snap.bundles
    );
    assert_eq!(
        m.migrations.values().cloned().collect::<Vec<_>>(),
        snap.migrations
    );
}

async fn wait_synced_with(client: &ManagerClient, sim: &manager_sim::SimHandle) {
    let want = sim.snapshot().revision;
    client
        .wait_until(WAIT, |m| m.revision >= want)
        .await
        .expect("mirror catches up");
}

#[tokio::test]
async fn snapshot_then_deltas_keep_the_mirror_equal_to_the_sim() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    // the snapshot has the declared cluster nodes with inventories
    assert_eq!(client.mirror().nodes().len(), 3);
    assert!(client.mirror().inventory("dc-a1").is_some());
    assert_eq!(client.connection_state(), ConnectionState::Ready);

    let mut rx = client.subscribe();
    let node = client
        .create_node(CreateNodeRequest {
            pool: "aws-east".into(),
            tags: [("spare".to_owned(), "true".to_owned())].into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(node.state(), NodeState::Starting);
    let reg = client
        .register_bundle(bundle("ch1", 2, 10.0, 2))
        .await
        .unwrap();
    assert_eq!(
        reg.job_ids,
        vec!["ch1/0/encode".to_owned(), "ch1/1/encode".to_owned()]
    );
    client
        .start_job("ch1/0/encode", "dc-a1", JobRole::Normal)
        .await
        .unwrap();
    let id = node.node_id.clone();
    changes_until(
        &mut rx,
        |c| matches!(c, MirrorChange::InventoryUpdated(i) if i.node_id == id),
    )
    .await;
    client
        .wait_until(WAIT, |m| {
            m.jobs
                .get("ch1/0/encode")
                .is_some_and(|j| j.state() == JobState::Running)
        })
        .await
        .unwrap();
    wait_synced_with(&client, &sim).await;
    mirror_matches_sim(&client, &sim);
    assert_eq!(
        client
            .mirror()
            .node(&node.node_id)
            .unwrap()
            .tags
            .get("spare")
            .map(String::as_str),
        Some("true")
    );
    client.close().await;
}

#[tokio::test]
async fn a_disconnect_mid_stream_resumes_without_missing_or_duplicating_events() {
    let sim = Sim::start(config()).await.unwrap();
    let proxy = Proxy::start(sim.addr().expect("served")).await;
    let client = connect(proxy.endpoint()).await;
    client
        .register_bundle(bundle("ch", 3, 10.0, 1))
        .await
        .unwrap();
    wait_synced_with(&client, &sim).await;
    let mut rx = client.subscribe();

    proxy.take_down();
    client
        .state()
        .wait_for(|s| *s == ConnectionState::TransientFailure)
        .await
        .unwrap();
    // While disconnected: three refusals (transient events) and a state change.
    sim.with_world(|w, now| {
        w.reject_next(3);
        for r in 0..3 {
            let _ = w.start_job(
                &format!("ch/{r}/encode"),
                "dc-a1",
                JobRole::Normal as i32,
                now,
            );
        }
        w.start_job("ch/0/encode", "dc-b1", JobRole::Normal as i32, now)
            .unwrap();
    });
    proxy.bring_up();
    client.wait_ready(WAIT).await.unwrap();
    wait_synced_with(&client, &sim).await;

    let mut seen = Vec::new();
    while let Ok(c) = rx.try_recv() {
        seen.push(c);
    }
    let rejections: Vec<_> = seen
        .iter()
        .filter_map(|c| match c {
            MirrorChange::JobRejected(r) => Some(r.job_id.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        rejections,
        vec!["ch/0/encode", "ch/1/encode", "ch/2/encode"],
        "each missed event exactly once"
    );
    assert!(
        !seen
            .iter()
            .any(|c| matches!(c, MirrorChange::Resynced { .. })),
        "resumed, not resynced: {seen:#?}"
    );
    mirror_matches_sim(&client, &sim);
}

#[tokio::test]
async fn a_revision_older_than_the_log_resyncs_and_emits_the_differences() {
    let mut cfg = config();
    cfg.limits.event_log_capacity = 4;
    let sim = Sim::start(cfg).await.unwrap();
    let proxy = Proxy::start(sim.addr().expect("served")).await;
    let client = connect(proxy.endpoint()).await;
    client
        .register_bundle(bundle("gone", 1, 1.0, 0))
        .await
        .unwrap();
    client
        .register_bundle(bundle("kept", 1, 1.0, 0))
        .await
        .unwrap();
    wait_synced_with(&client, &sim).await;
    let mut rx = client.subscribe();

    proxy.take_down();
    client
        .state()
        .wait_for(|s| *s == ConnectionState::TransientFailure)
        .await
        .unwrap();
    sim.with_world(|w, now| {
        w.delete_bundle("gone", now).unwrap();
        w.kill_node("dc-b1", now).unwrap();
        for i in 0..10 {
            w.update_job_config("kept/0/encode", format!("{{\"v\":{i}}}").as_bytes(), now)
                .unwrap();
        }
    });
    proxy.bring_up();
    let seen = changes_until(&mut rx, |c| matches!(c, MirrorChange::Resynced { .. })).await;
    assert!(matches!(
        seen.last(),
        Some(MirrorChange::Resynced {
            reason: SnapshotReason::RevisionTooOld,
            ..
        })
    ));
    let kinds: Vec<String> = seen
        .iter()
        .map(|c| match c {
            MirrorChange::NodeUpserted(n) => format!("node {}", n.node_id),
            MirrorChange::BundleRemoved { bundle_id } => format!("bundle- {bundle_id}"),
            MirrorChange::JobRemoved { job_id } => format!("job- {job_id}"),
            MirrorChange::JobUpserted(j) => format!("job {}", j.job_id),
            MirrorChange::Resynced { .. } => "resynced".to_owned(),
            other => format!("{other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            "node dc-b1",
            "bundle- gone",
            "job- gone/0/encode",
            "job kept/0/encode",
            "resynced"
        ]
    );
    client.wait_ready(WAIT).await.unwrap();
    mirror_matches_sim(&client, &sim);
}

#[tokio::test]
async fn the_world_survives_a_sim_restart_with_a_state_dir() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config();
    cfg.state_dir = Some(dir.path().to_owned());
    let sim = Sim::start(cfg.clone()).await.unwrap();
    let addr = sim.addr().expect("served");
    let client = connect(sim.endpoint()).await;
    client
        .register_bundle(bundle("ch", 1, 10.0, 1))
        .await
        .unwrap();
    client
        .start_job("ch/0/encode", "dc-a2", JobRole::Normal)
        .await
        .unwrap();
    client
        .wait_until(WAIT, |m| {
            m.jobs
                .get("ch/0/encode")
                .is_some_and(|j| j.state() == JobState::Running)
        })
        .await
        .unwrap();
    let before = sim.snapshot();
    sim.shutdown().await;
    client
        .state()
        .wait_for(|s| *s != ConnectionState::Ready)
        .await
        .unwrap();

    cfg.listen = addr;
    let sim = Sim::start(cfg).await.unwrap();
    assert_eq!(
        sim.snapshot(),
        before,
        "restored world equals the one that stopped"
    );
    client.wait_ready(WAIT).await.unwrap();
    mirror_matches_sim(&client, &sim);
    // and it keeps working
    client
        .stop_job("ch/0/encode", JobRole::Normal)
        .await
        .unwrap();
    client
        .wait_until(WAIT, |m| {
            m.jobs
                .get("ch/0/encode")
                .is_some_and(|j| j.state() == JobState::Stopped)
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn a_start_over_capacity_is_rejected_with_a_typed_reason() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    let mut rx = client.subscribe();
    client
        .register_bundle(bundle("big", 2, 60.0, 1))
        .await
        .unwrap();
    client
        .start_job("big/0/encode", "dc-a1", JobRole::Normal)
        .await
        .unwrap();
    let err = client
        .start_job("big/1/encode", "dc-a1", JobRole::Normal)
        .await
        .unwrap_err();
    let ClientError::Rejected {
        reason, message, ..
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(*reason, RejectionReason::InsufficientCapacity);
    assert!(message.contains("40"), "{message}");
    let seen = changes_until(&mut rx, |c| matches!(c, MirrorChange::JobRejected(_))).await;
    let Some(MirrorChange::JobRejected(r)) = seen.last() else {
        unreachable!()
    };
    assert_eq!(
        (r.job_id.as_str(), r.node_id.as_str(), r.reason()),
        (
            "big/1/encode",
            "dc-a1",
            RejectionReason::InsufficientCapacity
        )
    );

    client
        .register_bundle(bundle("cores", 1, 1.0, 9))
        .await
        .unwrap();
    let err = client
        .start_job("cores/0/encode", "dc-b1", JobRole::Normal)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Rejected {
                reason: RejectionReason::InsufficientCores,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn killing_a_node_emits_stopping_for_every_job_it_hosts() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    client
        .register_bundle(bundle("k", 3, 10.0, 1))
        .await
        .unwrap();
    for r in 0..3 {
        client
            .start_job(&format!("k/{r}/encode"), "dc-a1", JobRole::Normal)
            .await
            .unwrap();
    }
    let mut rx = client.subscribe();
    let channel = tonic::transport::Endpoint::from_shared(sim.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    SimAdminClient::new(channel)
        .kill_node(KillNodeRequest {
            node_id: "dc-a1".into(),
        })
        .await
        .unwrap();
    let seen = changes_until(
        &mut rx,
        |c| matches!(c, MirrorChange::NodeUpserted(n) if n.state() == NodeState::Terminated),
    )
    .await;
    let mut stopping: Vec<_> = seen
        .iter()
        .filter_map(|c| match c {
            MirrorChange::JobStopping(s) => Some((s.job_id.clone(), s.reason())),
            _ => None,
        })
        .collect();
    stopping.sort();
    assert_eq!(
        stopping,
        (0..3)
            .map(|r| (format!("k/{r}/encode"), StopReason::NodeLost))
            .collect::<Vec<_>>()
    );
    for r in 0..3 {
        assert_eq!(
            client
                .mirror()
                .job(&format!("k/{r}/encode"))
                .unwrap()
                .state(),
            JobState::Failed
        );
    }
    // a terminated node refuses starts
    let err = client
        .start_job("k/0/encode", "dc-a1", JobRole::Normal)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Rejected {
                reason: RejectionReason::NodeNotReady,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_stopped_node_and_a_reclaim_notice_reach_the_mirror() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    let node = client
        .create_node(CreateNodeRequest {
            pool: "aws-east".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let id = node.node_id.clone();
    client
        .wait_until(WAIT, |m| {
            m.nodes
                .get(&id)
                .is_some_and(|n| n.state() == NodeState::Started)
        })
        .await
        .expect("the node starts");
    let stopping = client.stop_node(&id).await.unwrap();
    assert_eq!(stopping.state(), NodeState::PoweringOff);
    client
        .wait_until(WAIT, |m| {
            m.nodes
                .get(&id)
                .is_some_and(|n| n.state() == NodeState::PoweredOff)
        })
        .await
        .expect("the mirror shows the node powered off");
    assert_eq!(
        client.start_node(&id).await.unwrap().state(),
        NodeState::Starting
    );
    client
        .wait_until(WAIT, |m| {
            m.nodes
                .get(&id)
                .is_some_and(|n| n.state() == NodeState::Started && n.inventory.is_some())
        })
        .await
        .expect("the node starts again with its inventory");
    // A cluster pool cannot stop.
    let err = client.stop_node("dc-a1").await.unwrap_err();
    assert!(
        matches!(&err, ClientError::FailedPrecondition(m) if m.contains("cluster pool")),
        "{err}"
    );
    let channel = tonic::transport::Endpoint::from_shared(sim.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    SimAdminClient::new(channel)
        .notice_node(NoticeNodeRequest {
            node_id: id.clone(),
            in_ms: 60_000,
            reason: "maintenance".into(),
        })
        .await
        .unwrap();
    client
        .wait_until(WAIT, |m| m.noticed_nodes().any(|n| n.node_id == id))
        .await
        .expect("the mirror shows the notice");
    let noticed = client.mirror().node(&id).unwrap();
    assert_eq!(noticed.reclaim_reason, "maintenance");
    assert!(noticed.reclaim_at_ms > 0);
    wait_synced_with(&client, &sim).await;
    mirror_matches_sim(&client, &sim);
}

#[tokio::test]
async fn terminating_a_node_stops_its_jobs_first() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    client
        .register_bundle(bundle("t", 2, 10.0, 1))
        .await
        .unwrap();
    client
        .start_job("t/0/encode", "dc-b1", JobRole::Normal)
        .await
        .unwrap();
    client
        .start_job("t/1/encode", "dc-b1", JobRole::Normal)
        .await
        .unwrap();
    let mut rx = client.subscribe();
    client.terminate_node("dc-b1").await.unwrap();
    let seen = changes_until(
        &mut rx,
        |c| matches!(c, MirrorChange::NodeUpserted(n) if n.state() == NodeState::Terminated),
    )
    .await;
    let n = seen.iter().filter(|c| matches!(c, MirrorChange::JobStopping(s) if s.reason() == StopReason::NodeTerminated)).count();
    assert_eq!(n, 2);
    assert_eq!(
        client.mirror().job("t/0/encode").unwrap().state(),
        JobState::Stopped
    );
}

#[tokio::test]
async fn a_client_without_the_token_is_refused() {
    let mut cfg = config();
    cfg.token = Some("s3cret".into());
    let sim = Sim::start(cfg).await.unwrap();
    let anon = ManagerClient::connect(fast(sim.endpoint())).await.unwrap();
    let err = anon.list_pools().await.unwrap_err();
    assert!(matches!(err, ClientError::Unauthenticated(_)), "{err}");
    anon.state()
        .wait_for(|s| *s == ConnectionState::TransientFailure)
        .await
        .unwrap();
    assert!(
        anon.last_error()
            .unwrap_or_default()
            .contains("Unauthenticated")
    );
    let wrong = ManagerClient::connect(fast(sim.endpoint()).with_token("s3cres"))
        .await
        .unwrap();
    assert!(matches!(
        wrong.list_pools().await.unwrap_err(),
        ClientError::Unauthenticated(_)
    ));
    let good = ManagerClient::connect(fast(sim.endpoint()).with_token("s3cret"))
        .await
        .unwrap();
    good.wait_ready(WAIT).await.unwrap();
    assert_eq!(good.list_pools().await.unwrap().len(), 2);
    anon.close().await;
}

#[tokio::test]
async fn malformed_requests_get_invalid_argument_with_a_message() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    let huge = "x".repeat(100_000);
    let cases: Vec<(&str, ClientError)> = vec![
        (
            "empty node id",
            client.terminate_node("").await.unwrap_err(),
        ),
        (
            "empty job id",
            client
                .start_job("", "dc-a1", JobRole::Normal)
                .await
                .unwrap_err(),
        ),
        (
            "unknown pool",
            client
                .create_node(CreateNodeRequest {
                    pool: "nope".into(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
        ),
        (
            "negative capacity",
            client
                .register_bundle(bundle("neg", 1, -5.0, 1))
                .await
                .unwrap_err(),
        ),
        (
            "negative cores",
            client
                .register_bundle(bundle("neg", 1, 5.0, -1))
                .await
                .unwrap_err(),
        ),
        ("huge id", client.terminate_node(&huge).await.unwrap_err()),
        (
            "huge bundle id",
            client
                .register_bundle(bundle(&huge, 1, 1.0, 1))
                .await
                .unwrap_err(),
        ),
        (
            "zero replicas",
            client
                .register_bundle(bundle("z", 0, 1.0, 1))
                .await
                .unwrap_err(),
        ),
        (
            "bad json",
            client
                .update_job_config("x", b"{".to_vec())
                .await
                .unwrap_err(),
        ),
        (
            "bad zone",
            client
                .create_node(CreateNodeRequest {
                    pool: "aws-east".into(),
                    zone: "mars".into(),
                    ..Default::default()
                })
                .await
                .unwrap_err(),
        ),
    ];
    for (what, err) in cases {
        let ClientError::InvalidArgument(msg) = &err else {
            panic!("{what}: expected InvalidArgument, got {err}")
        };
        assert!(!msg.is_empty() && msg.len() < 300, "{what}: {msg}");
    }
    // A request over the size cap is refused by the transport, and the sim lives on.
    let big = "y".repeat(5 * 1024 * 1024);
    let err = client.terminate_node(&big).await.unwrap_err();
    assert!(!matches!(err, ClientError::NotFound(_)), "{err}");
    assert_eq!(client.list_pools().await.unwrap().len(), 2);
    // Fixed pools cannot be scaled.
    let err = client
        .create_node(CreateNodeRequest {
            pool: "dc".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::FailedPrecondition(_)), "{err}");
}

#[tokio::test]
async fn a_watcher_that_stops_reading_is_cut_with_resource_exhausted() {
    let mut cfg = config();
    cfg.limits.watch_buffer = 2;
    let sim = Sim::start(cfg).await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(sim.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut stream = RawClient::new(channel)
        .watch(WatchRequest::default())
        .await
        .unwrap()
        .into_inner();
    // read the snapshot and Synced, then stop reading
    loop {
        let m = stream.message().await.unwrap().unwrap();
        if matches!(m.kind, Some(watch_response::Kind::Synced(_))) {
            break;
        }
    }
    sim.with_world(|w, now| w.register_bundle(&bundle("b", 1, 1.0, 0), now))
        .unwrap();
    let big = format!("{{\"pad\":\"{}\"}}", "p".repeat(60_000));
    for _ in 0..400 {
        sim.with_world(|w, now| w.update_job_config("b/0/encode", big.as_bytes(), now))
            .unwrap();
        tokio::task::yield_now().await;
    }
    assert_eq!(sim.watchers(), 0, "the slow watcher was dropped");
    let status = tokio::time::timeout(WAIT, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("stream ended without a status"),
                Err(s) => return s,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("too slow"));
}

#[tokio::test]
async fn a_migration_runs_its_phases_and_moves_the_job() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    client
        .register_bundle(bundle("m", 1, 10.0, 1))
        .await
        .unwrap();
    client
        .start_job("m/0/encode", "dc-a1", JobRole::Normal)
        .await
        .unwrap();
    client
        .wait_until(WAIT, |m| {
            m.jobs
                .get("m/0/encode")
                .is_some_and(|j| j.state() == JobState::Running)
        })
        .await
        .unwrap();

    let m = client
        .migration_get_state("mig-1", "m/0/encode", MigrationStrategy::Handover)
        .await
        .unwrap();
    assert_eq!(m.phase(), MigrationPhase::Proposed);
    let again = client
        .migration_get_state("mig-2", "m/0/encode", MigrationStrategy::Handover)
        .await
        .unwrap_err();
    assert!(
        matches!(again, ClientError::FailedPrecondition(_)),
        "one migration at a time: {again}"
    );
    client
        .wait_until(WAIT, |s| {
            s.migrations
                .get("mig-1")
                .is_some_and(|m| m.phase() == MigrationPhase::StateReceived)
        })
        .await
        .unwrap();
    let state = client.mirror().migration("mig-1").unwrap().source_state;
    assert_eq!(state, b"null");
    client
        .migration_prepare_target("mig-1", "dc-b1", state)
        .await
        .unwrap();
    client
        .wait_until(WAIT, |s| {
            s.migrations
                .get("mig-1")
                .is_some_and(|m| m.phase() == MigrationPhase::TargetReady)
        })
        .await
        .unwrap();
    let job = client.mirror().job("m/0/encode").unwrap();
    assert_eq!(job.instances.len(), 2);
    client
        .migration_cutover("mig-1", b"{}".to_vec())
        .await
        .unwrap();
    client
        .wait_until(WAIT, |s| {
            s.migrations
                .get("mig-1")
                .is_some_and(|m| m.phase() == MigrationPhase::Completed)
        })
        .await
        .unwrap();
    let job = client.mirror().job("m/0/encode").unwrap();
    assert_eq!(job.node_id, "dc-b1");
    assert_eq!(job.instances.len(), 1);
    assert_eq!(job.instances[0].role(), JobRole::Normal);
    // aborting a completed migration is refused
    assert!(matches!(
        client.migration_abort("mig-1", "late").await.unwrap_err(),
        ClientError::FailedPrecondition(_)
    ));
}

#[tokio::test]
async fn an_aborted_migration_stops_its_target() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    client
        .register_bundle(bundle("a", 1, 10.0, 1))
        .await
        .unwrap();
    client
        .start_job("a/0/encode", "dc-a1", JobRole::Normal)
        .await
        .unwrap();
    client
        .wait_until(WAIT, |m| {
            m.jobs
                .get("a/0/encode")
                .is_some_and(|j| j.state() == JobState::Running)
        })
        .await
        .unwrap();
    client
        .migration_get_state("mig", "a/0/encode", MigrationStrategy::Handover)
        .await
        .unwrap();
    client
        .wait_until(WAIT, |s| {
            s.migrations
                .get("mig")
                .is_some_and(|m| m.phase() == MigrationPhase::StateReceived)
        })
        .await
        .unwrap();
    // a target without room is refused, and the migration waits for another
    client
        .register_bundle(bundle("fill", 1, 95.0, 1))
        .await
        .unwrap();
    client
        .start_job("fill/0/encode", "dc-a2", JobRole::Normal)
        .await
        .unwrap();
    let err = client
        .migration_prepare_target("mig", "dc-a2", b"null".to_vec())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::Rejected {
                reason: RejectionReason::InsufficientCapacity,
                ..
            }
        ),
        "{err}"
    );
    client
        .migration_prepare_target("mig", "dc-b1", b"null".to_vec())
        .await
        .unwrap();
    client
        .wait_until(WAIT, |s| {
            s.migrations
                .get("mig")
                .is_some_and(|m| m.phase() == MigrationPhase::TargetReady)
        })
        .await
        .unwrap();
    let m = client
        .migration_abort("mig", "operator changed mind")
        .await
        .unwrap();
    assert_eq!(m.phase(), MigrationPhase::Aborted);
    assert_eq!(m.abort_reason, "operator changed mind");
    client
        .wait_until(WAIT, |s| {
            s.jobs.get("a/0/encode").is_some_and(|j| {
                j.node_id == "dc-a1"
                    && j.state() == JobState::Running
                    && j.instances.iter().any(|i| {
                        i.role() == JobRole::MigrationTarget && i.state() == JobState::Stopped
                    })
            })
        })
        .await
        .unwrap();
}

#[tokio::test]
async fn elastic_nodes_start_after_the_provisioning_delay_with_their_inventory() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    let n = client
        .create_node(CreateNodeRequest {
            pool: "aws-east".into(),
            instance_type: "m5.xlarge".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    client
        .wait_until(WAIT, |m| {
            m.nodes
                .get(&n.node_id)
                .is_some_and(|x| x.state() == NodeState::Started)
        })
        .await
        .unwrap();
    let inv = client.mirror().inventory(&n.node_id).unwrap();
    assert_eq!((inv.capacity, inv.cores), (100.0, 16));
    assert!(
        inv.capabilities
            .contains(&manager_proto::JOB_SOCKET_CAPABILITY.to_owned())
    );
    let _ = Duration::ZERO;
}

#[tokio::test]
async fn client_config_is_validated() {
    let mut c = ClientConfig::new("http://127.0.0.1:1");
    c.backoff_initial = Duration::ZERO;
    assert!(matches!(
        ManagerClient::connect(c).await.unwrap_err(),
        ClientError::Config(_)
    ));
    let c = ClientConfig::new("http://127.0.0.1:1").with_token("bad\ntoken");
    assert!(matches!(
        ManagerClient::connect(c).await.unwrap_err(),
        ClientError::Config(_)
    ));
}

#[tokio::test]
async fn a_command_with_thousands_of_events_reaches_the_mirror_in_bounded_batches() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    let mut big = bundle("wide", 64, 0.0, 0);
    big.jobs = (0..64)
        .map(|j| manager_proto::BundleJob {
            job_name: format!("j{j}"),
            requirements: Some(Default::default()),
            config: Vec::new(),
            template: Vec::new(),
        })
        .collect();
    client.register_bundle(big).await.unwrap();
    client
        .wait_until(WAIT, |m| m.jobs.len() == 4096)
        .await
        .unwrap();
    client.delete_bundle("wide").await.unwrap();
    client
        .wait_until(WAIT, |m| m.jobs.is_empty() && m.bundles.is_empty())
        .await
        .unwrap();
    mirror_matches_sim(&client, &sim);
}

#[tokio::test]
async fn a_job_that_refuses_its_state_ends_the_migration_with_no_target() {
    use manager_sim::world::{JobAsk, JobReply, default_reply};
    let agent = manager_sim::FnAgent(|ask: &JobAsk| match ask {
        JobAsk::GetState { .. } => JobReply::StateRefused("mid-ad-break".into()),
        other => default_reply(other),
    });
    let sim = Sim::start_with_agent(config(), std::sync::Arc::new(agent))
        .await
        .unwrap();
    let client = connect(sim.endpoint()).await;
    client
        .register_bundle(bundle("r", 1, 10.0, 1))
        .await
        .unwrap();
    client
        .start_job("r/0/encode", "dc-a1", JobRole::Normal)
        .await
        .unwrap();
    client
        .wait_until(WAIT, |m| {
            m.jobs
                .get("r/0/encode")
                .is_some_and(|j| j.state() == JobState::Running)
        })
        .await
        .unwrap();
    client
        .migration_get_state("mig", "r/0/encode", MigrationStrategy::Handover)
        .await
        .unwrap();
    client
        .wait_until(WAIT, |s| {
            s.migrations
                .get("mig")
                .is_some_and(|m| m.phase() == MigrationPhase::Aborted)
        })
        .await
        .unwrap();
    let m = client.mirror().migration("mig").unwrap();
    assert_eq!(
        (
            m.aborted_by(),
            m.abort_reason.as_str(),
            m.target_node_id.as_str()
        ),
        (manager_proto::MigrationParty::Source, "mid-ad-break", "")
    );
    assert_eq!(
        client.mirror().job("r/0/encode").unwrap().instances.len(),
        1
    );
}

#[tokio::test]
async fn a_create_node_repeated_with_its_request_id_answers_with_the_same_node() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    let ask = |zone: &str| CreateNodeRequest {
        pool: "aws-east".into(),
        zone: zone.into(),
        request_id: "retry-me".into(),
        ..Default::default()
    };
    let first = client.create_node(ask("")).await.unwrap();
    let again = client.create_node(ask("")).await.unwrap();
    assert_eq!(again.node_id, first.node_id);
    assert_eq!(again.request_id, "retry-me");
    wait_synced_with(&client, &sim).await;
    let made = sim
        .snapshot()
        .nodes
        .into_iter()
        .filter(|n| n.pool == "aws-east")
        .count();
    assert_eq!(made, 1);
    // The mirror shows which request made the node.
    assert_eq!(
        client
            .mirror()
            .read(|m| m.nodes.get(&first.node_id).map(|n| n.request_id.clone())),
        Some("retry-me".to_owned())
    );
    // The same key for another zone (the pool's zones are a and b) is refused, making nothing.
    let elsewhere = if first.zone == "a" { "b" } else { "a" };
    match client.create_node(ask(elsewhere)).await {
        Err(ClientError::AlreadyExists(m)) => assert!(m.contains("retry-me"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(sim.snapshot().nodes.len(), 4, "3 declared and the one made");
}

#[tokio::test]
async fn a_fenced_client_changes_nothing_in_manager_but_still_reads() {
    let sim = Sim::start(config()).await.unwrap();
    let client = connect(sim.endpoint()).await;
    let allowed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let fence = allowed.clone();
    client.fence_writes(std::sync::Arc::new(move || {
        fence.load(std::sync::atomic::Ordering::SeqCst)
    }));
    let before = sim.snapshot();
    let req = CreateNodeRequest {
        pool: "aws-east".into(),
        ..Default::default()
    };
    let err = client.create_node(req.clone()).await.unwrap_err();
    assert!(matches!(err, ClientError::Fenced(_)), "{err:?}");
    let err = client.delete_bundle("ns.b").await.unwrap_err();
    assert!(matches!(err, ClientError::Fenced(_)), "{err:?}");
    // Nothing reached Manager; reads still work.
    assert_eq!(sim.snapshot().nodes, before.nodes);
    assert_eq!(client.list_nodes(None).await.unwrap().len(), 3);
    // Leading again, commands go through.
    allowed.store(true, std::sync::atomic::Ordering::SeqCst);
    client.create_node(req).await.unwrap();
    assert_eq!(sim.snapshot().nodes.len(), before.nodes.len() + 1);
}
