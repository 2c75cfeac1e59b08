//! The client over the Manager port in this process: the sim's service called directly, with no
//! listener and no socket. The same mirror, fence and error mapping as over gRPC.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{WAIT, bundle, config, fast};
use manager_client::{ClientError, ConnectionState, InProcess, ManagerClient};
use manager_proto::{CreateNodeRequest, JobRole, JobState, NodeState};
use manager_sim::Sim;

async fn in_process() -> (manager_sim::SimHandle, ManagerClient) {
    let sim = Sim::start_in_process(config()).await.unwrap();
    assert_eq!(sim.addr(), None, "nothing is bound");
    let client = ManagerClient::over(InProcess::shared(sim.service()), &fast(sim.endpoint()))
        .expect("a valid config");
    client.wait_ready(WAIT).await.expect("synced in process");
    (sim, client)
}

#[tokio::test]
async fn commands_and_the_watch_work_in_process_and_the_mirror_equals_the_sim() {
    let (sim, client) = in_process().await;
    assert_eq!(client.connection_state(), ConnectionState::Ready);
    assert_eq!(
        client.mirror().nodes().len(),
        3,
        "the declared cluster nodes"
    );

    let node = client
        .create_node(CreateNodeRequest {
            pool: "aws-east".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(node.state(), NodeState::Starting);
    let reg = client
        .register_bundle(bundle("ch1", 1, 10.0, 2))
        .await
        .unwrap();
    client
        .start_job(&reg.job_ids[0], "dc-a1", JobRole::Normal)
        .await
        .unwrap();
    client
        .wait_until(WAIT, |m| {
            m.jobs
                .get("ch1/0/encode")
                .is_some_and(|j| j.state() == JobState::Running)
        })
        .await
        .unwrap();
    let want = sim.snapshot().revision;
    client
        .wait_until(WAIT, |m| m.revision >= want)
        .await
        .unwrap();
    let m = client.mirror().state();
    let snap = sim.snapshot();
    assert_eq!(m.nodes.values().cloned().collect::<Vec<_>>(), snap.nodes);
    assert_eq!(m.jobs.values().cloned().collect::<Vec<_>>(), snap.jobs);
    assert_eq!(sim.call_counts().calls.get("StartJob"), Some(&1));
    client.close().await;
}

#[tokio::test]
async fn a_refusal_in_process_is_the_same_typed_error_as_over_grpc() {
    let (_sim, client) = in_process().await;
    let err = client
        .create_node(CreateNodeRequest {
            pool: "no-such-pool".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            ClientError::NotFound(_) | ClientError::InvalidArgument(_)
        ),
        "{err:?}"
    );
    let err = client
        .start_job("no-such-job", "dc-a1", JobRole::Normal)
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::NotFound(_)), "{err:?}");
    client.fence_writes(std::sync::Arc::new(|| false));
    let err = client.delete_bundle("ch1").await.unwrap_err();
    assert!(matches!(err, ClientError::Fenced(_)), "{err:?}");
}
