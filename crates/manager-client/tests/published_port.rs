//! The operator's port over Manager's published API ([`PublishedPort`]) against manager-sim's
//! published service, seen through the same [`ManagerClient`] and mirror the operator uses:
//! nodes made under our ids and tags, a bundle as stored jobs, a start and a stop under roles,
//! a reconnect that changes nothing, a job of another client never seen, and a bundle deleted;
//! without our extension what needs it answers UNIMPLEMENTED, and with it warm nodes, reclaim
//! notices and migrations reach the mirror as they do over our first API.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use manager_client::published::{
    CatalogPool, PoolCatalog, PublishedClient, PublishedConfig, PublishedPort, tags,
};
use manager_client::{ClientConfig, ClientError, ManagerClient, MirrorChange, MirrorState};
use manager_proto::api::common::JobId;
use manager_proto::api::manager::Job as StoredJob;
use manager_proto::sim_admin_client::SimAdminClient;
use manager_proto::{
    Bundle, BundleJob, CreateNodeRequest, JobRequirements, JobRole, JobState, MigrationPhase,
    MigrationStrategy, NodeState, NoticeNodeRequest,
};
use manager_sim::{Sim, SimConfig};

const WAIT: Duration = Duration::from_secs(30);
const OWNER: &str = "test-install";

fn catalog_of(config: &SimConfig) -> PoolCatalog {
    let catalog = PoolCatalog::new();
    for p in &config.pools {
        catalog.upsert(CatalogPool {
            pool: p.to_proto(0, 0),
            ..Default::default()
        });
    }
    catalog
}

/// manager-sim (with our extension or without it), the published client, and the operator's
/// client over the port, after the first snapshot.
async fn over_the_port(
    config: &SimConfig,
    extension: bool,
) -> (manager_sim::SimHandle, Arc<PublishedClient>, ManagerClient) {
    let sim = if extension {
        Sim::start(config.clone()).await
    } else {
        Sim::start_without_extension(config.clone()).await
    }
    .expect("sim");
    let published =
        Arc::new(PublishedClient::connect(PublishedConfig::new(sim.endpoint())).expect("connect"));
    let port = PublishedPort::new(Arc::clone(&published), catalog_of(config), OWNER);
    let client = ManagerClient::over(Arc::new(port), &ClientConfig::new(sim.endpoint()))
        .expect("client over the port");
    client.wait_ready(WAIT).await.expect("first snapshot");
    (sim, published, client)
}

async fn until(client: &ManagerClient, what: &str, test: impl Fn(&MirrorState) -> bool) {
    client.wait_until(WAIT, test).await.unwrap_or_else(|e| {
        panic!(
            "waited for {what}: {e}; connection {:?}, jobs {:?}",
            client.connection_state(),
            client.mirror().read(|m| m.jobs.clone())
        )
    });
}

#[tokio::test]
async fn the_operator_s_client_runs_over_the_published_api() {
    let config = SimConfig::demo();
    // The published API alone: standard mode.
    let (sim, published, client) = over_the_port(&config, false).await;
    assert_eq!(client.features(), manager_client::ManagerFeatures::STANDARD);

    // The demo's physical nodes are the fixed pool's, with the capacity they declare.
    let onprem = client.mirror().read(|m| {
        m.nodes
            .values()
            .filter(|n| n.pool == "onprem")
            .map(|n| {
                let inv = n.inventory.clone().unwrap_or_default();
                (n.node_id.clone(), n.zone.clone(), inv.capacity, inv.cores)
            })
            .collect::<Vec<_>>()
    });
    assert_eq!(onprem.len(), 4, "{onprem:?}");
    assert!(onprem.contains(&("onprem-b2".to_owned(), "rack-b".to_owned(), 50.0, 16)));

    // A node in an elastic pool: CreateAwsNode under the request's key, in a zone of the pool.
    let node = client
        .create_node(CreateNodeRequest {
            pool: "aws-east".to_owned(),
            instance_type: "m5.2xlarge".to_owned(),
            request_id: "automanager-key-1".to_owned(),
            ..Default::default()
        })
        .await
        .expect("create node");
    assert_eq!(node.node_id, "automanager-key-1");
    assert!(["eu-west-1a", "eu-west-1b"].contains(&node.zone.as_str()));
    until(&client, "the node started with its inventory", |m| {
        m.nodes.get("automanager-key-1").is_some_and(|n| {
            n.state == NodeState::Started as i32
                && n.inventory.as_ref().is_some_and(|i| i.capacity == 200.0)
        })
    })
    .await;
    // Asking again with the same key makes nothing new.
    let again = client
        .create_node(CreateNodeRequest {
            pool: "aws-east".to_owned(),
            instance_type: "m5.2xlarge".to_owned(),
            request_id: "automanager-key-1".to_owned(),
            ..Default::default()
        })
        .await
        .expect("repeat");
    assert_eq!(again.node_id, "automanager-key-1");
    let ours = published.with_mirror(|m| {
        m.nodes
            .values()
            .filter(|n| tags::owned_by(&n.tags, OWNER))
            .count()
    });
    assert_eq!(ours, 1);

    // Another client's job in the same Manager, under an id that looks like ours.
    published
        .create_job(StoredJob {
            job_id: Some(JobId {
                job_id: "news/1/encode".to_owned(),
            }),
            tags: BTreeMap::from([(tags::OWNER.to_owned(), "someone-else".to_owned())]),
            ..Default::default()
        })
        .await
        .expect("a foreign job");

    // A bundle becomes stored jobs; the model rebuilds it from their tags.
    let bundle = Bundle {
        bundle_id: "news".to_owned(),
        replicas: 1,
        jobs: vec![BundleJob {
            job_name: "encode".to_owned(),
            requirements: Some(JobRequirements {
                required_capacity: 40.0,
                required_cores: 8,
                required_capabilities: vec!["gpu".to_owned()],
                priority_band: "gold".to_owned(),
            }),
            config: br#"{"bitrate":6000}"#.to_vec(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let registered = client.register_bundle(bundle).await.expect("register");
    assert_eq!(registered.job_ids, ["news/0/encode"]);
    until(&client, "the bundle and its job", |m| {
        m.bundles.get("news").is_some_and(|b| {
            b.replicas == 1
                && b.jobs[0].requirements.as_ref().is_some_and(|r| {
                    r.required_capacity == 40.0
                        && r.required_capabilities == ["gpu"]
                        && r.priority_band == "gold"
                })
        }) && m.jobs.contains_key("news/0/encode")
    })
    .await;
    let foreign_seen = client
        .mirror()
        .read(|m| m.jobs.contains_key("news/1/encode"));
    assert!(!foreign_seen, "another client's job is not in the model");

    // Start on the physical GPU node, then stop.
    let job = client
        .start_job("news/0/encode", "onprem-a2", JobRole::Normal)
        .await
        .expect("start");
    assert_eq!(job.job_id, "news/0/encode");
    until(&client, "the job running on onprem-a2", |m| {
        m.jobs
            .get("news/0/encode")
            .is_some_and(|j| j.state == JobState::Running as i32 && j.node_id == "onprem-a2")
    })
    .await;

    // A reconnect of the published stream: a whole new snapshot, and nothing changes.
    let mut changes = client.subscribe();
    assert_eq!(sim.cut_published_streams(), 1);
    let resynced = tokio::time::timeout(WAIT, async {
        let mut seen = Vec::new();
        loop {
            match changes.recv().await {
                Ok(MirrorChange::Resynced { .. }) => return seen,
                Ok(other) => seen.push(other),
                Err(e) => panic!("change feed: {e}"),
            }
        }
    })
    .await
    .expect("a resync after the cut");
    assert!(
        resynced.is_empty(),
        "a reconnect that changed nothing reports nothing: {resynced:?}"
    );

    client
        .stop_job("news/0/encode", JobRole::Normal)
        .await
        .expect("stop");
    until(&client, "the job stopped", |m| {
        m.jobs
            .get("news/0/encode")
            .is_some_and(|j| j.state == JobState::Stopped as i32)
    })
    .await;

    // What needs our extension says so.
    let warm = client.stop_node("automanager-key-1").await;
    assert!(
        matches!(&warm, Err(ClientError::Rpc { code: tonic::Code::Unimplemented, message }) if message.contains("extension")),
        "{warm:?}"
    );
    let migrate = client
        .migration_get_state("m1", "news/0/encode", MigrationStrategy::Overlap)
        .await;
    assert!(
        matches!(
            &migrate,
            Err(ClientError::Rpc {
                code: tonic::Code::Unimplemented,
                ..
            })
        ),
        "{migrate:?}"
    );

    // Deleting the bundle deletes its stored jobs, and only those.
    let removed = client.delete_bundle("news").await.expect("delete");
    assert_eq!(removed, ["news/0/encode"]);
    until(&client, "the bundle gone", |m| {
        !m.bundles.contains_key("news") && !m.jobs.contains_key("news/0/encode")
    })
    .await;
    let left = published.with_mirror(|m| m.jobs.keys().cloned().collect::<Vec<_>>());
    assert_eq!(left, ["news/1/encode"], "the foreign job is untouched");

    // Another client's instance on a node we made: the terminate is refused, naming it, and
    // neither the node nor that instance is touched.
    published
        .start_job("news/1/encode", "primary", "automanager-key-1")
        .await
        .expect("the other client's start");
    let foreign_live = || {
        published.with_mirror(|m| {
            m.jobs
                .get("news/1/encode")
                .is_some_and(|v| v.live_instances().any(|i| i.node_id == "automanager-key-1"))
        })
    };
    tokio::time::timeout(WAIT, async {
        while !foreign_live() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the other client's instance in the mirror");
    let refused = client.terminate_node("automanager-key-1").await;
    assert!(
        matches!(&refused, Err(ClientError::FailedPrecondition(m))
            if m.contains(manager_client::OTHER_CLIENTS_JOBS) && m.ends_with("runs news/1/encode")),
        "{refused:?}"
    );
    assert!(foreign_live(), "the other client's instance still runs");
    assert!(
        client.mirror().read(|m| m
            .nodes
            .get("automanager-key-1")
            .is_some_and(|n| n.state == NodeState::Started as i32)),
        "the node is still up"
    );
    published
        .stop_job("news/1/encode", "primary", "automanager-key-1")
        .await
        .expect("the other client's stop");
    tokio::time::timeout(WAIT, async {
        while foreign_live() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the other client's instance gone");

    client
        .terminate_node("automanager-key-1")
        .await
        .expect("terminate");
    let terminated = |m: &MirrorState| {
        m.nodes
            .get("automanager-key-1")
            .is_some_and(|n| n.state == NodeState::Terminated as i32)
    };
    until(&client, "the node terminated", terminated).await;
    // Manager's published API forgets a terminated node; the next snapshot still shows it
    // terminated, as our first API does, so the operator keeps its object for its retention.
    let mut changes = client.subscribe();
    assert_eq!(sim.cut_published_streams(), 1);
    tokio::time::timeout(WAIT, async {
        loop {
            match changes.recv().await {
                Ok(MirrorChange::Resynced { .. }) => return,
                Ok(_) => {}
                Err(e) => panic!("change feed: {e}"),
            }
        }
    })
    .await
    .expect("a resync after the cut");
    assert!(
        client.mirror().read(|m| terminated(m)),
        "the terminated node is still there after a resync: {:?}",
        client
            .mirror()
            .read(|m| m.nodes.get("automanager-key-1").cloned())
    );
    client.close().await;
    published.close().await;
}

/// The demo with warm stops and starts that take a tenth of a second, not a cloud's tens.
fn quick_power() -> SimConfig {
    let mut config = SimConfig::demo();
    config.timing.stop_delay_ms = Some(100);
    config.timing.start_delay_ms = Some(200);
    config
}

async fn started(client: &ManagerClient, key: &str) {
    client
        .create_node(CreateNodeRequest {
            pool: "aws-east".to_owned(),
            instance_type: "m5.xlarge".to_owned(),
            request_id: key.to_owned(),
            ..Default::default()
        })
        .await
        .expect("create node");
    let id = key.to_owned();
    until(client, "the node started", move |m| {
        m.nodes
            .get(&id)
            .is_some_and(|n| n.state == NodeState::Started as i32)
    })
    .await;
}

#[tokio::test]
async fn warm_nodes_notices_and_migrations_go_through_our_extension() {
    let config = quick_power();
    let (sim, published, client) = over_the_port(&config, true).await;
    assert_eq!(
        client.features(),
        manager_client::ManagerFeatures::ALL,
        "Describe named both features"
    );

    // A warm spare: powered off, kept under its id, started again.
    started(&client, "warm-1").await;
    let node = client.stop_node("warm-1").await.expect("stop");
    assert!(
        [NodeState::PoweringOff as i32, NodeState::PoweredOff as i32].contains(&node.state),
        "{node:?}"
    );
    until(&client, "the node powered off, not gone", |m| {
        m.nodes.get("warm-1").is_some_and(|n| {
            n.state == NodeState::PoweredOff as i32 && n.pool == "aws-east" && n.inventory.is_none()
        })
    })
    .await;
    // A reconnect of both streams: the warm node is still off, and nothing changes.
    let mut changes = client.subscribe();
    assert_eq!(sim.cut_published_streams(), 2, "both streams were open");
    let resynced = tokio::time::timeout(WAIT, async {
        let mut seen = Vec::new();
        loop {
            match changes.recv().await {
                Ok(MirrorChange::Resynced { .. }) => return seen,
                Ok(other) => seen.push(other),
                Err(e) => panic!("change feed: {e}"),
            }
        }
    })
    .await
    .expect("a resync after the cut");
    assert!(resynced.is_empty(), "{resynced:?}");
    client.start_node("warm-1").await.expect("start");
    until(&client, "the warm node running again", |m| {
        m.nodes.get("warm-1").is_some_and(|n| {
            n.state == NodeState::Started as i32
                && n.inventory.as_ref().is_some_and(|i| i.capacity == 100.0)
        })
    })
    .await;

    // A migration with strategy overlap moves the job between two of our nodes.
    started(&client, "warm-2").await;
    let bundle = Bundle {
        bundle_id: "news".to_owned(),
        replicas: 1,
        jobs: vec![BundleJob {
            job_name: "encode".to_owned(),
            requirements: Some(JobRequirements {
                required_capacity: 10.0,
                required_cores: 2,
                ..Default::default()
            }),
            config: Vec::new(),
            ..Default::default()
        }],
        ..Default::default()
    };
    client.register_bundle(bundle).await.expect("register");
    until(&client, "the job", |m| m.jobs.contains_key("news/0/encode")).await;
    client
        .start_job("news/0/encode", "warm-1", JobRole::Normal)
        .await
        .expect("start");
    until(&client, "the job running on warm-1", |m| {
        m.jobs
            .get("news/0/encode")
            .is_some_and(|j| j.state == JobState::Running as i32 && j.node_id == "warm-1")
    })
    .await;
    let m = client
        .migration_get_state("move-1", "news/0/encode", MigrationStrategy::Overlap)
        .await
        .expect("propose");
    assert_eq!(m.phase, MigrationPhase::StateReceived as i32);
    assert_eq!(m.source_node_id, "warm-1");
    let m = client
        .migration_prepare_target("move-1", "warm-2", Vec::new())
        .await
        .expect("prepare");
    assert_eq!(m.phase, MigrationPhase::TargetReady as i32);
    until(
        &client,
        "the target instance, marked with its migration",
        |m| {
            m.jobs.get("news/0/encode").is_some_and(|j| {
                j.instances.iter().any(|i| {
                    i.role == JobRole::MigrationTarget as i32
                        && i.node_id == "warm-2"
                        && i.migration_id == "move-1"
                })
            })
        },
    )
    .await;
    client
        .migration_cutover("move-1", Vec::new())
        .await
        .expect("cutover");
    until(&client, "the job moved and the migration completed", |m| {
        m.migrations
            .get("move-1")
            .is_some_and(|x| x.phase == MigrationPhase::Completed as i32)
            && m.jobs.get("news/0/encode").is_some_and(|j| {
                j.node_id == "warm-2"
                    && j.state == JobState::Running as i32
                    && j.instances.len() == 1
            })
    })
    .await;
    // A contradictory call is refused with Manager's reason.
    let again = client
        .migration_cutover("move-1", Vec::new())
        .await
        .expect_err("completed already");
    assert!(
        matches!(again, ClientError::FailedPrecondition(_)),
        "{again:?}"
    );
    // A migration aborted before its cutover leaves the job where it was.
    client
        .migration_get_state("move-2", "news/0/encode", MigrationStrategy::Overlap)
        .await
        .expect("propose again");
    let aborted = client
        .migration_abort("move-2", "changed my mind")
        .await
        .expect("abort");
    assert_eq!(aborted.phase, MigrationPhase::Aborted as i32);
    until(&client, "the abort in the mirror, the job unmoved", |m| {
        m.migrations.get("move-2").is_some_and(|x| {
            x.phase == MigrationPhase::Aborted as i32 && x.abort_reason == "changed my mind"
        }) && m
            .jobs
            .get("news/0/encode")
            .is_some_and(|j| j.node_id == "warm-2" && j.state == JobState::Running as i32)
    })
    .await;

    // A reclaim notice reaches the node, and at its deadline the node is gone.
    let mut admin = SimAdminClient::connect(sim.endpoint())
        .await
        .expect("admin");
    admin
        .notice_node(NoticeNodeRequest {
            node_id: "warm-2".to_owned(),
            in_ms: 1_500,
            reason: "maintenance".to_owned(),
        })
        .await
        .expect("notice");
    until(&client, "the notice on the node", |m| {
        m.nodes
            .get("warm-2")
            .is_some_and(|n| n.reclaim_at_ms > 0 && n.reclaim_reason == "maintenance")
    })
    .await;
    until(&client, "the node reclaimed", |m| {
        m.nodes
            .get("warm-2")
            .is_none_or(|n| n.state == NodeState::Terminated as i32)
    })
    .await;
    client.close().await;
    published.close().await;
}

/// A bundle job's template (what Manager runs) becomes the stored job's definition with our id,
/// tags and configuration stamped in; registering the same again updates nothing, and a changed
/// template is one UpdateJob.
#[tokio::test]
async fn a_job_template_is_stored_as_manager_s_job_and_only_a_change_updates_it() {
    use manager_proto::api::common::service::{Container, ServiceRestart};
    use manager_proto::api::manager::job_history_entry::HistoryEntry;

    let (_sim, published, client) = over_the_port(&SimConfig::demo(), false).await;

    // What automanager_mapping::job_template makes of a Bundle's template.
    let template = |image: &str| -> Vec<u8> {
        use manager_proto::api::common::{ContainerUrl, DockerContainer, Service};
        use prost::Message;
        StoredJob {
            services: vec![Service {
                name: "norsk".to_owned(),
                container: Some(Container::Docker(DockerContainer {
                    container_url: Some(ContainerUrl {
                        url: image.to_owned(),
                    }),
                })),
                restart: ServiceRestart::OnFailure as i32,
                ..Default::default()
            }],
            volumes: vec!["media".to_owned()],
            ..Default::default()
        }
        .encode_to_vec()
    };
    let bundle = |image: &str| Bundle {
        bundle_id: "tmpl".to_owned(),
        replicas: 1,
        jobs: vec![BundleJob {
            job_name: "encode".to_owned(),
            requirements: Some(JobRequirements {
                required_capacity: 10.0,
                required_cores: 1,
                priority_band: "silver".to_owned(),
                ..Default::default()
            }),
            config: br#"{"bitrate":1}"#.to_vec(),
            template: template(image),
        }],
        ..Default::default()
    };
    let stored = |published: &PublishedClient| {
        published.with_mirror(|m| {
            m.jobs.get("tmpl/0/encode").map(|v| {
                let updates = v
                    .history
                    .iter()
                    .filter(|e| matches!(e.history_entry, Some(HistoryEntry::JobUpdated(_))))
                    .count();
                (v.job.clone(), updates)
            })
        })
    };

    client
        .register_bundle(bundle("norsk/media:1"))
        .await
        .expect("register");
    until(&client, "the bundle with its template", |m| {
        m.bundles
            .get("tmpl")
            .is_some_and(|b| b.jobs[0].template == template("norsk/media:1"))
    })
    .await;
    let (job, updates) = stored(&published).expect("the stored job");
    assert_eq!(updates, 0);
    assert_eq!(job.services.len(), 1);
    assert_eq!(job.services[0].name, "norsk");
    assert_eq!(job.services[0].restart, ServiceRestart::OnFailure as i32);
    let Some(Container::Docker(d)) = &job.services[0].container else {
        panic!("a docker service: {:?}", job.services[0]);
    };
    assert_eq!(
        d.container_url.as_ref().map(|u| u.url.as_str()),
        Some("norsk/media:1")
    );
    assert_eq!(job.volumes, ["media"]);
    // What the port stamps is the port's, whatever the template says.
    assert_eq!(job.manager_configuration, r#"{"bitrate":1}"#);
    assert!(tags::owned_by(&job.tags, OWNER));

    // The same again: nothing to update.
    client
        .register_bundle(bundle("norsk/media:1"))
        .await
        .expect("register again");
    assert_eq!(stored(&published).map(|(_, u)| u), Some(0));

    // A new image: one UpdateJob, and the model's bundle follows.
    client
        .register_bundle(bundle("norsk/media:2"))
        .await
        .expect("register a change");
    until(&client, "the bundle with its new template", |m| {
        m.bundles
            .get("tmpl")
            .is_some_and(|b| b.jobs[0].template == template("norsk/media:2"))
    })
    .await;
    let (job, updates) = stored(&published).expect("the stored job");
    assert_eq!(updates, 1);
    let Some(Container::Docker(d)) = &job.services[0].container else {
        panic!("a docker service: {:?}", job.services[0]);
    };
    assert_eq!(
        d.container_url.as_ref().map(|u| u.url.as_str()),
        Some("norsk/media:2")
    );

    // A template that is not a job definition is refused with a reason.
    let mut bad = bundle("x");
    bad.jobs[0].template = vec![0xff, 0xff, 0xff];
    let e = client.register_bundle(bad).await.expect_err("refused");
    assert!(e.to_string().contains("template"), "{e}");
}
