//! Our extension service (`automanager.manager.extension.v1`) served by manager-sim beside the
//! published API, over gRPC: Describe names its features, its Watch opens with a snapshot closed
//! by `SnapshotComplete` and then carries changes, a malformed call is refused with a reason, and
//! a sim started without the extension answers `UNIMPLEMENTED`.

use std::collections::BTreeMap;
use std::time::Duration;

use manager_proto::api::common::NodeId;
use manager_proto::api::manager::CreateAwsNodeRequest;
use manager_proto::api::manager::manager_client::ManagerClient;
use manager_proto::extension::manager_extension_client::ManagerExtensionClient;
use manager_proto::extension::watch_event::Event;
use manager_proto::extension::{
    DescribeRequest, MigrationGetStateRequest, PowerState, StopNodeRequest, WatchRequest, feature,
};
use manager_proto::{CallCountsRequest, sim_admin_client::SimAdminClient};
use manager_sim::{Sim, SimConfig};

const WAIT: Duration = Duration::from_secs(10);

fn id(node: &str) -> Option<NodeId> {
    Some(NodeId {
        node_id: node.to_owned(),
    })
}

#[tokio::test]
async fn describe_names_every_feature_and_watch_reports_a_warm_stop() {
    let sim = Sim::start(SimConfig::demo()).await.expect("sim");
    let mut ext = ManagerExtensionClient::connect(sim.endpoint())
        .await
        .expect("connect");
    let described = ext
        .describe(DescribeRequest {})
        .await
        .expect("describe")
        .into_inner();
    for f in [
        feature::WARM_NODES,
        feature::MIGRATION_HANDSHAKE,
        feature::RECLAIM_NOTICES,
    ] {
        assert!(described.features.iter().any(|x| x == f), "{f}");
    }

    let mut watch = ext
        .watch(WatchRequest {})
        .await
        .expect("watch")
        .into_inner();
    let first = tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("in time")
        .expect("a message")
        .expect("not the end");
    assert!(
        matches!(first.event, Some(Event::SnapshotComplete(_))),
        "an empty snapshot is its marker alone: {first:?}"
    );

    let mut manager = ManagerClient::connect(sim.endpoint())
        .await
        .expect("connect");
    manager
        .create_aws_node(CreateAwsNodeRequest {
            node_id: id("warm-1"),
            tags: BTreeMap::new(),
            region: "eu-west-1".to_owned(),
            instance_type: "m5.xlarge".to_owned(),
            ..Default::default()
        })
        .await
        .expect("created");
    // The demo's aws pool runs a node after 200 ms; until then a warm stop is refused.
    let stopped = tokio::time::timeout(WAIT, async {
        loop {
            match ext
                .stop_node(StopNodeRequest {
                    node_id: id("warm-1"),
                })
                .await
            {
                Ok(r) => return r.into_inner(),
                Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(s) => panic!("{s}"),
            }
        }
    })
    .await
    .expect("stopped in time");
    assert_eq!(
        stopped.node.map(|n| n.state),
        Some(PowerState::PoweringOff as i32)
    );
    let next = tokio::time::timeout(WAIT, watch.message())
        .await
        .expect("in time")
        .expect("a message")
        .expect("not the end");
    assert!(
        matches!(&next.event, Some(Event::NodePower(p)) if p.state == PowerState::PoweringOff as i32
            && p.metadata.as_ref().is_some_and(|m| m.node_id == id("warm-1"))),
        "{next:?}"
    );

    let bad = ext
        .migration_get_state(MigrationGetStateRequest {
            migration_id: "no/slashes".to_owned(),
            ..Default::default()
        })
        .await
        .expect_err("refused");
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad}");
    assert!(bad.message().contains("migration_id"), "{bad}");

    let counts = SimAdminClient::connect(sim.endpoint())
        .await
        .expect("connect")
        .call_counts(CallCountsRequest {})
        .await
        .expect("counts")
        .into_inner();
    assert_eq!(
        counts
            .calls
            .get("automanager.manager.extension.v1/Describe"),
        Some(&1)
    );
    assert!(
        counts
            .calls
            .get("automanager.manager.extension.v1/StopNode")
            .is_some_and(|n| *n >= 1)
    );
}

#[tokio::test]
async fn without_the_extension_every_call_of_it_is_unimplemented() {
    let sim = Sim::start_without_extension(SimConfig::demo())
        .await
        .expect("sim");
    let mut ext = ManagerExtensionClient::connect(sim.endpoint())
        .await
        .expect("connect");
    let describe = ext.describe(DescribeRequest {}).await.expect_err("absent");
    assert_eq!(describe.code(), tonic::Code::Unimplemented);
    let stop = ext
        .stop_node(StopNodeRequest {
            node_id: id("onprem-a1"),
        })
        .await
        .expect_err("absent");
    assert_eq!(stop.code(), tonic::Code::Unimplemented);
    // The published API is served all the same.
    let mut manager = ManagerClient::connect(sim.endpoint())
        .await
        .expect("connect");
    manager
        .event_stream(manager_proto::api::manager::EventStreamRequest {
            pending_window_s: 60,
        })
        .await
        .expect("the published stream");
}
