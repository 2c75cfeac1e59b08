//! Another client's work in the same Manager is not ours: a drain, whatever its mode, never
//! terminates a node while a job that is not of a Bundle of ours runs there.

use automanager_api::{Drain, DrainMode, ManagerNodeSpec};
use manager_client::proto;

use super::Tier;

/// Another team's bundle `their-team`, one job started on `node` through Manager's API; its
/// job id.
async fn their_job_on(t: &Tier, node: &str) -> String {
    let answer = t
        .ctx
        .manager
        .register_bundle(proto::Bundle {
            bundle_id: "their-team".into(),
            replicas: 1,
            jobs: vec![proto::BundleJob {
                job_name: "enc".into(),
                requirements: Some(proto::JobRequirements {
                    required_capacity: 2.0,
                    required_cores: 1,
                    priority_band: "silver".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect("their bundle");
    let job = answer.job_ids[0].clone();
    t.ctx
        .manager
        .start_job(&job, node, proto::JobRole::Normal)
        .await
        .expect("their job starts");
    t.until_mirror("their job runs", |m| {
        m.jobs.get(&job).is_some_and(|j| {
            (j.instances.iter())
                .any(|i| i.node_id == node && i.state == proto::JobState::Running as i32)
        })
    })
    .await;
    t.api.clear_calls();
    t.manager.clear_calls();
    job
}

fn drain(mode: DrainMode) -> ManagerNodeSpec {
    ManagerNodeSpec {
        cordoned: false,
        drain: Some(Drain {
            mode,
            when_held: None,
        }),
    }
}

/// Their job leaves the node (their own StopJob), and the mirror shows it.
async fn they_stop(t: &Tier, job: &str, node: &str) {
    t.ctx
        .manager
        .stop_job(job, proto::JobRole::Normal)
        .await
        .expect("their stop");
    t.until_mirror("their job left the node", |m| {
        m.jobs
            .get(job)
            .is_none_or(|j| (j.instances.iter()).all(|i| i.node_id != node || !i.holds_capacity()))
    })
    .await;
    t.manager.clear_calls();
}

#[tokio::test]
async fn a_migrate_drain_moves_nothing_of_another_client_and_terminates_the_node_only_once_they_left()
 {
    let (t, _sync) = Tier::start(|_| {}).await.with_node_objects().await;
    let node = "onprem-b1";
    let theirs = their_job_on(&t, node).await;
    t.set_node_spec(node, drain(DrainMode::Migrate));

    t.node_pass(node).await.expect("the step");

    assert_eq!(
        t.manager.calls(),
        Vec::<String>::new(),
        "their job neither stopped nor its node terminated"
    );
    assert_eq!(
        t.api.writes(),
        Vec::<String>::new(),
        "no Migration of theirs"
    );
    let events = t.events().await;
    let (_, note) = (events.iter())
        .find(|(r, _)| r == "DrainWaitsForOtherClients")
        .expect("the wait is said");
    assert!(note.contains(&theirs), "{note}");

    they_stop(&t, &theirs, node).await;
    t.node_pass(node).await.expect("the step after they left");

    assert_eq!(t.manager.calls(), [format!("TerminateNode {node}")]);
}

#[tokio::test]
async fn a_terminate_drain_waits_while_another_clients_job_runs_on_the_node() {
    let (t, _sync) = Tier::start(|_| {})
        .await
        .with_example_pools()
        .await
        .with_node_objects()
        .await;
    let node = t.running_bundle("news", 1).await.remove(0);
    let theirs = their_job_on(&t, &node).await;
    t.set_node_spec(&node, drain(DrainMode::Terminate));

    t.node_pass(&node).await.expect("the step");

    assert!(
        t.manager.calls_named("TerminateNode").is_empty(),
        "{:?}",
        t.manager.calls()
    );
    assert!(t.manager.calls_named("StopJob").is_empty());
    assert_eq!(t.events_with("DrainWaitsForOtherClients").await, 1);

    they_stop(&t, &theirs, &node).await;
    t.node_pass(&node).await.expect("the step after they left");

    assert_eq!(t.manager.calls(), [format!("TerminateNode {node}")]);
}
