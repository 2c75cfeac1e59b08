//! Seeded chaos schedules against the real stack (`automanager_e2e::chaos`): each seed draws a
//! wave of Bundles and a fault schedule (node and zone kills, stream cuts, job crashes, sim
//! restarts kept and wiped, operator kill -9, leader pauses, apiserver pauses and restarts,
//! spec churn, Migrations, drains, cordons, pool edits, reclaim notices alone and during held
//! moves, a pool deleted before one of its nodes dies, and a foreign client's work in the same
//! Manager), runs it on one shared stack reset before every seed, and checks the invariants
//! throughout and once settled, with every touch of the foreign work and every job a notice's
//! deadline caught on its node counted.
//!
//! Run with `make test-chaos` (not part of `make test`): `CHAOS_SEEDS=n` seeds from
//! `CHAOS_SEED_FROM` (default 1), or `CHAOS_SEED=s` to replay one; docs/reliability.md.

use automanager_e2e::chaos::run::{RunConfig, run};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos() {
    let config = match RunConfig::from_env() {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let outcomes = match run(&config).await {
        Ok(o) => o,
        Err(e) => panic!("the chaos stack could not be set up: {e}"),
    };
    let failed: Vec<u64> = outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| o.seed)
        .collect();
    assert!(
        failed.is_empty(),
        "seeds {failed:?} failed; each prints its schedule above, and CHAOS_SEED=<seed> replays it"
    );
}
