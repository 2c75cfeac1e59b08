//! Leader election against a real apiserver: two electors on one Lease.

use std::time::Duration;

use automanager_operator::config::LeaderElectionConfig;
use automanager_operator::leader::{LeaderElection, run_leader_election};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::{oneshot, watch};

/// Upper bound for any wait here; generous because the machine is shared.
const BOUND: Duration = Duration::from_secs(60);

fn settings(enabled: bool) -> LeaderElectionConfig {
    LeaderElectionConfig {
        enabled,
        lease_name: "automanager-operator-test".into(),
        lease_namespace: "default".into(),
        lease_duration: Duration::from_secs(4),
        renew_every: Some(Duration::from_secs(2)),
    }
}

async fn start(
    client: kube::Client,
    enabled: bool,
    identity: &str,
) -> (LeaderElection, oneshot::Sender<()>) {
    let (tx, rx) = oneshot::channel::<()>();
    let election = run_leader_election(
        client,
        &settings(enabled),
        identity.to_owned(),
        automanager_operator::clock::SystemClock::shared(),
        async {
            let _ = rx.await;
        },
    )
    .await;
    (election, tx)
}

async fn wait_for(rx: &mut watch::Receiver<bool>, want: bool) {
    tokio::time::timeout(BOUND, rx.wait_for(|v| *v == want))
        .await
        .unwrap_or_else(|_| panic!("leadership did not become {want} in time"))
        .unwrap_or_else(|e| panic!("election ended: {e}"));
}

async fn holder(client: &kube::Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    leases
        .get_opt("automanager-operator-test")
        .await
        .ok()
        .flatten()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

/// Someone else writes itself into the Lease (as a partitioned-then-replaced leader sees it).
async fn take_over(client: &kube::Client) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    );
    let patch = serde_json::json!({
        "spec": { "holderIdentity": "intruder", "renewTime": now, "acquireTime": now, "leaseDurationSeconds": 600 }
    });
    leases
        .patch(
            "automanager-operator-test",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A fresh control plane, or `None` when the binaries are missing and the run asked to skip.
async fn control_plane() -> Option<testenv::TestEnv> {
    match testenv::control_plane_available() {
        Ok(true) => Some(
            testenv::TestEnv::start()
                .await
                .unwrap_or_else(|e| panic!("{e}")),
        ),
        Ok(false) => None,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn exactly_one_elector_leads_and_the_other_takes_over_after_shutdown() {
    let Some(env) = control_plane().await else {
        return;
    };
    let client = env.client();

    let (mut a, stop_a) = start(client.clone(), true, "replica-a").await;
    let (mut b, stop_b) = start(client.clone(), true, "replica-b").await;

    // Someone leads.
    tokio::time::timeout(BOUND, async {
        loop {
            if *a.is_leader.borrow() || *b.is_leader.borrow() {
                return;
            }
            tokio::select! {
                _ = a.is_leader.changed() => {}
                _ = b.is_leader.changed() => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("nobody became leader"));

    // And only one, for several renewals.
    for _ in 0..20 {
        let (la, lb) = (*a.is_leader.borrow(), *b.is_leader.borrow());
        assert!(la != lb, "exactly one leader expected, got a={la} b={lb}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let (leader_stop, mut leader, mut standby, standby_id, other_stop) = if *a.is_leader.borrow() {
        (stop_a, a, b, "replica-b", stop_b)
    } else {
        (stop_b, b, a, "replica-a", stop_a)
    };

    // The leader shuts down: it stops leading, releases the lease, and its task ends.
    let _ = leader_stop.send(());
    wait_for(&mut leader.is_leader, false).await;
    tokio::time::timeout(BOUND, &mut leader.task)
        .await
        .unwrap_or_else(|_| panic!("leader's election did not stop"))
        .unwrap_or_else(|e| panic!("{e}"));

    // The standby takes over, and the Lease names it.
    wait_for(&mut standby.is_leader, true).await;
    assert_eq!(holder(&client).await.as_deref(), Some(standby_id));

    let _ = other_stop.send(());
    wait_for(&mut standby.is_leader, false).await;
    tokio::time::timeout(BOUND, standby.task)
        .await
        .unwrap_or_else(|_| panic!("standby's election did not stop"))
        .unwrap_or_else(|e| panic!("{e}"));
    // Released on shutdown: nobody holds the lease any more.
    assert_eq!(holder(&client).await, None);
}

#[tokio::test]
async fn with_election_disabled_this_replica_always_leads_until_shutdown() {
    // No apiserver is contacted when election is disabled: a client for a closed port will do.
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap_or_default());
    let client = kube::Client::try_from(config).unwrap_or_else(|e| panic!("{e}"));
    let (mut e, stop) = start(client, false, "solo").await;
    assert!(*e.is_leader.borrow());
    let _ = stop.send(());
    wait_for(&mut e.is_leader, false).await;
    tokio::time::timeout(BOUND, e.task)
        .await
        .unwrap_or_else(|_| panic!("did not stop"))
        .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn an_unreachable_apiserver_means_not_leader_and_shutdown_still_works() {
    let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap_or_default());
    let client = kube::Client::try_from(config).unwrap_or_else(|e| panic!("{e}"));
    let (e, stop) = start(client, true, "lonely").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!*e.is_leader.borrow());
    let _ = stop.send(());
    tokio::time::timeout(BOUND, e.task)
        .await
        .unwrap_or_else(|_| panic!("did not stop"))
        .unwrap_or_else(|e| panic!("{e}"));
}

#[tokio::test]
async fn a_leader_whose_lease_is_taken_over_stops_leading() {
    let Some(env) = control_plane().await else {
        return;
    };
    let client = env.client();
    let (mut a, stop_a) = start(client.clone(), true, "replica-a").await;
    wait_for(&mut a.is_leader, true).await;

    take_over(&client).await;

    wait_for(&mut a.is_leader, false).await;
    let _ = stop_a.send(());
    tokio::time::timeout(BOUND, a.task)
        .await
        .unwrap_or_else(|_| panic!("did not stop"))
        .unwrap_or_else(|e| panic!("{e}"));
    // Its release did not clear someone else's lease.
    assert_eq!(holder(&client).await.as_deref(), Some("intruder"));
}

/// The fence: a client layered with the election's fence writes while this replica leads and
/// is refused, before the request leaves the process, once the lease is someone else's; reads
/// go on.
#[tokio::test]
async fn a_deposed_leader_cannot_write_through_its_fenced_client() {
    use k8s_openapi::api::core::v1::ConfigMap;
    let Some(env) = control_plane().await else {
        return;
    };
    let client = env.client();
    let (mut a, stop_a) = start(client.clone(), true, "replica-a").await;
    let fenced = kube::client::ClientBuilder::try_from(env.kube_config())
        .unwrap_or_else(|e| panic!("{e}"))
        .with_layer(&a.fence.layer())
        .build();
    let maps: Api<ConfigMap> = Api::namespaced(fenced, "default");
    let cm = |name: &str| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let fenced_error = |e: kube::Error| {
        let text = format!("{e:?}");
        assert!(
            text.contains("Fenced"),
            "expected the fence to refuse, got {text}"
        );
    };
    // Not leading yet (or not confirmed): refused. Once leading: written.
    if !*a.is_leader.borrow() {
        let early = maps.create(&Default::default(), &cm("early")).await;
        if let Err(e) = early {
            fenced_error(e);
        }
    }
    wait_for(&mut a.is_leader, true).await;
    maps.create(&Default::default(), &cm("while-leading"))
        .await
        .unwrap_or_else(|e| panic!("the leader's write was refused: {e}"));

    // Another replica takes the lease over.
    take_over(&client).await;
    wait_for(&mut a.is_leader, false).await;
    assert!(!a.fence.allows_writes());
    fenced_error(
        maps.create(&Default::default(), &cm("after-takeover"))
            .await
            .expect_err("a deposed leader wrote"),
    );
    // Nothing reached the apiserver; reads still work.
    assert!(
        maps.get_opt("after-takeover")
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_none()
    );
    assert!(
        maps.get_opt("while-leading")
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .is_some()
    );
    let _ = stop_a.send(());
    tokio::time::timeout(BOUND, a.task)
        .await
        .unwrap_or_else(|_| panic!("did not stop"))
        .unwrap_or_else(|e| panic!("{e}"));
}
