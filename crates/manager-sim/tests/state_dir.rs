//! `--state-dir`: a world restored from a periodic state write takes a new epoch (watchers may
//! have seen revisions after that write, which the restored world would number again with other
//! events), and one restored from a clean shutdown's write keeps its epoch.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use manager_sim::{Sim, SimConfig};

fn config(dir: &Path) -> SimConfig {
    let mut c = SimConfig::demo();
    c.state_dir = Some(dir.to_owned());
    c
}

/// The state file's epoch and whether a clean shutdown wrote it.
fn saved(dir: &Path) -> (String, bool) {
    let text = std::fs::read(dir.join("manager-sim-state.json")).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    (
        v["epoch"].as_str().unwrap().to_owned(),
        v["cleanShutdown"].as_bool().unwrap_or(false),
    )
}

#[tokio::test]
async fn a_world_restored_from_a_periodic_write_takes_a_new_epoch_and_a_clean_one_keeps_it() {
    let running = tempfile::tempdir().unwrap();
    let sim = Sim::start(config(running.path())).await.unwrap();
    let epoch = sim.snapshot().epoch;
    tokio::time::sleep(Duration::from_millis(600)).await;
    // What a `kill -9` leaves: the last periodic write, copied while the sim still runs.
    let crashed = tempfile::tempdir().unwrap();
    std::fs::copy(
        running.path().join("manager-sim-state.json"),
        crashed.path().join("manager-sim-state.json"),
    )
    .unwrap();
    let (periodic_epoch, clean) = saved(crashed.path());
    assert_eq!(periodic_epoch, epoch);
    assert!(!clean, "a periodic write is not marked clean");
    sim.shutdown().await;
    assert_eq!(saved(running.path()), (epoch.clone(), true));

    let after_crash = Sim::start(config(crashed.path())).await.unwrap();
    let new_epoch = after_crash.snapshot().epoch;
    assert_ne!(
        new_epoch, epoch,
        "restored from a periodic write: new epoch"
    );
    after_crash.shutdown().await;

    let after_clean = Sim::start(config(running.path())).await.unwrap();
    assert_eq!(
        after_clean.snapshot().epoch,
        epoch,
        "restored from a clean shutdown: same epoch"
    );
    after_clean.shutdown().await;
}
