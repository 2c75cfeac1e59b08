//! `SimAdmin.CallCounts`: the sim counts every Manager RPC it serves, and says
//! how many asked Manager to change something, so a test can prove a client
//! (the operator after a restart, say) changed nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use manager_proto::manager_client::ManagerClient;
use manager_proto::sim_admin_client::SimAdminClient;
use manager_proto::{
    CallCountsRequest, KillNodeRequest, ListNodesRequest, ListPoolsRequest, TerminateNodeRequest,
};
use manager_sim::{Sim, SimConfig};

#[tokio::test]
async fn manager_calls_are_counted_per_rpc_and_only_state_changes_are_mutating() {
    let sim = Sim::start(SimConfig::demo()).await.unwrap();
    let mut manager = ManagerClient::connect(sim.endpoint()).await.unwrap();
    let mut admin = SimAdminClient::connect(sim.endpoint()).await.unwrap();

    let fresh = admin
        .call_counts(CallCountsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(fresh.calls.is_empty(), "{fresh:?}");
    assert_eq!(fresh.mutating, 0);

    manager.list_pools(ListPoolsRequest {}).await.unwrap();
    manager
        .list_nodes(ListNodesRequest::default())
        .await
        .unwrap();
    // A refused call was still served: it counts.
    let refused = manager
        .terminate_node(TerminateNodeRequest {
            node_id: "no-such-node".into(),
        })
        .await;
    assert!(refused.is_err());
    manager
        .terminate_node(TerminateNodeRequest {
            node_id: "onprem-a1".into(),
        })
        .await
        .unwrap();
    // Fault injection is not a Manager call.
    admin
        .kill_node(KillNodeRequest {
            node_id: "onprem-a2".into(),
        })
        .await
        .unwrap();

    let counts = admin
        .call_counts(CallCountsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(counts.calls.get("ListPools"), Some(&1));
    assert_eq!(counts.calls.get("ListNodes"), Some(&1));
    assert_eq!(counts.calls.get("TerminateNode"), Some(&2));
    assert_eq!(counts.calls.len(), 3, "{counts:?}");
    assert_eq!(counts.mutating, 2, "reads are not mutating");
    assert_eq!(sim.call_counts(), counts, "the handle reports the same");
}
