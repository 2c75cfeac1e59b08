//! Shared by the integration tests.

/// True when the control-plane binaries are present; false (with a note) when they are missing
/// and skipping was asked for; panics with the "run `make control-plane`" message otherwise.
pub fn control_plane_available() -> bool {
    let run = testenv::control_plane_available().unwrap_or_else(|e| panic!("{e}"));
    if !run {
        eprintln!(
            "SKIPPED: control-plane binaries missing and {}=1",
            testenv::SKIP_ENV
        );
    }
    run
}
