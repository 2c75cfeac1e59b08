//! What the operator's port over the published API ([`PublishedPort`], seen through the same
//! [`ManagerClient`] and mirror the operator uses) makes of the published world's faults: a
//! start refused by `reject-next` — answered `Empty` by the published API, its outcome a stop
//! for failure before the instance ever ran — is the refusal our first API answers, and an
//! instance `fail-job` crashes is a failed job.

use std::sync::Arc;
use std::time::Duration;

use manager_client::published::{
    CatalogPool, PoolCatalog, PublishedClient, PublishedConfig, PublishedPort,
};
use manager_client::{ClientConfig, ClientError, ManagerClient, MirrorState};
use manager_proto::sim_admin_client::SimAdminClient;
use manager_proto::{Bundle, BundleJob, FailJobRequest, JobRole, JobState, RejectNextRequest};
use manager_sim::{Sim, SimConfig};

const WAIT: Duration = Duration::from_secs(30);

async fn until(client: &ManagerClient, what: &str, test: impl Fn(&MirrorState) -> bool) {
    client.wait_until(WAIT, test).await.unwrap_or_else(|e| {
        panic!(
            "waited for {what}: {e}; jobs {:?}",
            client.mirror().read(|m| m.jobs.clone())
        )
    });
}

fn state_of(m: &MirrorState, job: &str) -> Option<JobState> {
    m.jobs
        .get(job)
        .and_then(|j| JobState::try_from(j.state).ok())
}

#[tokio::test]
async fn a_refused_start_is_a_refusal_and_a_crash_a_failed_job() {
    let config = SimConfig::demo();
    let sim = Sim::start(config.clone()).await.expect("sim");
    let catalog = PoolCatalog::new();
    for p in &config.pools {
        catalog.upsert(CatalogPool {
            pool: p.to_proto(0, 0),
            ..Default::default()
        });
    }
    let published =
        Arc::new(PublishedClient::connect(PublishedConfig::new(sim.endpoint())).expect("connect"));
    let port = PublishedPort::new(Arc::clone(&published), catalog, "test-install");
    let client = ManagerClient::over(Arc::new(port), &ClientConfig::new(sim.endpoint()))
        .expect("client over the port");
    client.wait_ready(WAIT).await.expect("first snapshot");
    let mut admin = SimAdminClient::connect(sim.endpoint())
        .await
        .expect("admin");

    let registered = client
        .register_bundle(Bundle {
            bundle_id: "news".to_owned(),
            replicas: 1,
            jobs: vec![BundleJob {
                job_name: "encode".to_owned(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .expect("register");
    let job = registered.job_ids[0].clone();
    until(&client, "the job stored", |m| m.jobs.contains_key(&job)).await;

    admin
        .reject_next(RejectNextRequest { count: 1 })
        .await
        .expect("armed");
    let refused = client
        .start_job(&job, "onprem-a1", JobRole::Normal)
        .await
        .expect_err("refused");
    assert!(
        matches!(&refused, ClientError::Rejected { node_id, message, .. }
            if node_id == "onprem-a1" && message.contains("before it ever ran")),
        "{refused:?}"
    );
    let history = admin
        .job_history(manager_proto::JobHistoryRequest {
            job_id: job.clone(),
        })
        .await;
    assert_eq!(
        history.expect_err("never started").code(),
        tonic::Code::NotFound,
        "a refused start is not an instance start"
    );

    // The next start runs; a crash of it fails the job again.
    client
        .start_job(&job, "onprem-a1", JobRole::Normal)
        .await
        .expect("start");
    until(&client, "the job running", |m| {
        state_of(m, &job) == Some(JobState::Running)
    })
    .await;
    admin
        .fail_job(FailJobRequest {
            job_id: job.clone(),
            message: "encoder crashed".to_owned(),
        })
        .await
        .expect("crashed");
    until(&client, "the crashed job failed", |m| {
        state_of(m, &job) == Some(JobState::Failed)
    })
    .await;
}
