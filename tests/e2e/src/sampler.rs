//! A sampler of one count over Manager's state, evaluated on every change of it (the Watch
//! mirror's revisions), keeping the largest value seen: for example the replicas of a bundle
//! that have no running instance, to show a voluntary action never took more down than its
//! disruption budget allows.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use manager_client::proto as pb;
use manager_client::{ManagerClient, MirrorState};

use crate::SetupError;

/// Evaluates a count over Manager's state on every change of it and keeps the largest seen.
pub struct MaxSampler {
    worst: Arc<Mutex<usize>>,
    samples: Arc<Mutex<u64>>,
    task: tokio::task::JoinHandle<()>,
    client: ManagerClient,
}

impl MaxSampler {
    pub async fn start(
        endpoint: &str,
        count: impl Fn(&MirrorState) -> usize + Send + Sync + 'static,
    ) -> Result<Self, SetupError> {
        // In the API the stacks of this process speak.
        let client =
            crate::stack::manager_view(endpoint, crate::stack::ManagerApi::from_env()).await?;
        client
            .wait_ready(Duration::from_secs(30))
            .await
            .map_err(|e| SetupError(format!("the sim's Watch stream: {e}")))?;
        let worst = Arc::new(Mutex::new(0));
        let samples = Arc::new(Mutex::new(0));
        let mirror = client.mirror().clone();
        let mut revisions = mirror.revisions();
        let (w, s) = (worst.clone(), samples.clone());
        let task = tokio::spawn(async move {
            loop {
                let n = mirror.read(&count);
                if let Ok(mut w) = w.lock() {
                    *w = (*w).max(n);
                }
                if let Ok(mut k) = s.lock() {
                    *k += 1;
                }
                if revisions.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(MaxSampler {
            worst,
            samples,
            task,
            client,
        })
    }

    /// Replicas of `bundle_id` with a job that has no running normal instance.
    pub async fn replicas_down(
        endpoint: &str,
        bundle_id: &str,
        replicas: u32,
        job: &str,
    ) -> Result<Self, SetupError> {
        let (bundle_id, job) = (bundle_id.to_owned(), job.to_owned());
        Self::start(endpoint, move |m| {
            (0..replicas)
                .filter(|r| {
                    !m.job_of(&bundle_id, *r, &job).is_some_and(|j| {
                        j.instances
                            .iter()
                            .any(|i| i.is_normal() && i.state() == pb::JobState::Running)
                    })
                })
                .count()
        })
        .await
    }

    /// Migrations Manager holds that have not ended.
    pub async fn migrations_running(endpoint: &str) -> Result<Self, SetupError> {
        Self::start(endpoint, |m| {
            m.migrations.values().filter(|x| !x.is_final()).count()
        })
        .await
    }

    pub async fn stop(self) -> (usize, u64) {
        self.task.abort();
        self.client.close().await;
        let worst = self.worst.lock().map(|w| *w).unwrap_or_default();
        let samples = self.samples.lock().map(|n| *n).unwrap_or_default();
        (worst, samples)
    }
}
