//! Our client of the published API against manager-sim's published service: the mirror from its
//! snapshot (the demo's physical nodes), a node under our id, a stored job started under a role,
//! JobSearch by tag, and the instance stopped, each seen through the mirror.

use std::collections::BTreeMap;
use std::time::Duration;

use manager_client::published::{InstancePhase, NodeState, PublishedClient, PublishedConfig};
use manager_proto::api::common::{JobId, NodeId};
use manager_proto::api::manager::tag_filter::Comparison;
use manager_proto::api::manager::{
    CreateAwsNodeRequest, Job, JobFilter, JobSearchRequest, TagFilter, job_filter,
};
use manager_sim::{Sim, SimConfig};

const WAIT: Duration = Duration::from_secs(30);

async fn until(
    client: &PublishedClient,
    what: &str,
    test: impl Fn(&manager_client::published::PublishedMirror) -> bool,
) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !client.with_mirror(&test) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "waited {WAIT:?} for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn our_published_client_mirrors_and_drives_manager_sim() {
    let sim = Sim::start(SimConfig::demo()).await.expect("sim");
    let client = PublishedClient::connect(PublishedConfig::new(sim.endpoint())).expect("connect");
    client.wait_ready(WAIT).await.expect("the first snapshot");
    let physical: Vec<String> = client.with_mirror(|m| {
        m.nodes
            .values()
            .filter(|n| n.physical)
            .map(|n| n.node_id.clone())
            .collect()
    });
    assert_eq!(
        physical,
        ["onprem-a1", "onprem-a2", "onprem-b1", "onprem-b2"]
    );
    assert!(client.with_mirror(|m| !m.health.is_empty()));

    let tags = BTreeMap::from([("automanager.norsk.io/owner".to_owned(), "it".to_owned())]);
    client
        .create_aws_node(CreateAwsNodeRequest {
            node_id: Some(NodeId {
                node_id: "ours-1".to_owned(),
            }),
            tags: tags.clone(),
            region: "eu-west-1".to_owned(),
            instance_type: "m5.xlarge".to_owned(),
            ..Default::default()
        })
        .await
        .expect("CreateAwsNode");
    until(&client, "ours-1 running, with its tags", |m| {
        m.nodes
            .get("ours-1")
            .is_some_and(|n| n.state == NodeState::Running && n.tags == tags)
    })
    .await;
    client
        .create_job(Job {
            job_id: Some(JobId {
                job_id: "news/0/enc".to_owned(),
            }),
            tags: tags.clone(),
            ..Default::default()
        })
        .await
        .expect("CreateJob");
    client
        .start_job("news/0/enc", "primary", "ours-1")
        .await
        .expect("StartJob");
    until(&client, "the instance running on ours-1", |m| {
        m.instances_on("ours-1").len() == 1
            && m.jobs["news/0/enc"].instances["primary"].phase == InstancePhase::Running
    })
    .await;
    let found = client
        .job_search(JobSearchRequest {
            job_filter: vec![JobFilter {
                job_filter: Some(job_filter::JobFilter::TagFilter(TagFilter {
                    tag_name: "automanager.norsk.io/owner".to_owned(),
                    comparison: Some(Comparison::Eq("it".to_owned())),
                })),
            }],
        })
        .await
        .expect("JobSearch");
    assert_eq!(found.len(), 1);
    client
        .stop_job("news/0/enc", "primary", "ours-1")
        .await
        .expect("StopJob");
    until(&client, "the instance stopped", |m| {
        m.instances_on("ours-1").is_empty()
    })
    .await;
    client.close().await;
}
