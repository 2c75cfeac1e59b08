//! `testenv`: start, inspect and stop a local Kubernetes control plane (etcd + kube-apiserver
//! on loopback) for people, demos and scripts.
//!
//! ```text
//! testenv up   [--dir DIR] [--detach]   start; print `export ...` lines; run until SIGINT/SIGTERM
//! testenv env  [--dir DIR]              print the export lines of the running one
//! testenv down [--dir DIR]              stop the running one and wait for it to exit
//! ```
//!
//! `DIR` (default `.tmp/testenv`) holds `state.json`, `kubeconfig`, the control plane's own
//! directory and, with `--detach`, `testenv.log`. Export lines go to stdout (so
//! `eval "$(testenv up --detach)"` works), everything else to stderr.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use testenv::process::{Signal, is_running, new_session, send_signal};
use testenv::{
    BIN_DIR_ENV, Error, K8S_RELEASE, State, TestEnv, check_bin_dir, default_bin_dir, export_lines,
};

const STATE_FILE: &str = "state.json";
const KUBECONFIG_FILE: &str = "kubeconfig";
const LOG_FILE: &str = "testenv.log";

#[derive(Debug, Parser)]
#[command(
    name = "testenv",
    version,
    about = "A local Kubernetes control plane (etcd + kube-apiserver on 127.0.0.1)"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Start a control plane, print the export lines, and run until SIGINT/SIGTERM.
    Up {
        /// Directory for the state file, kubeconfig and data.
        #[arg(long, default_value = ".tmp/testenv")]
        dir: PathBuf,
        /// Run in the background; return once it is ready (its log goes to DIR/testenv.log).
        #[arg(long)]
        detach: bool,
        /// Directory holding etcd, kube-apiserver and kubectl.
        #[arg(long, env = BIN_DIR_ENV)]
        bin_dir: Option<PathBuf>,
        /// Extra kube-apiserver flag (repeatable), e.g. --apiserver-arg=--v=2.
        #[arg(
            long = "apiserver-arg",
            allow_hyphen_values = true,
            value_name = "FLAG"
        )]
        apiserver_args: Vec<String>,
        /// Seconds to wait for the apiserver to become ready.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
        timeout: u64,
    },
    /// Print `export KUBECONFIG=...` and `export PATH=...` for the running control plane.
    Env {
        /// Directory given to `testenv up`.
        #[arg(long, default_value = ".tmp/testenv")]
        dir: PathBuf,
    },
    /// Stop the running control plane and wait until it has exited.
    Down {
        /// Directory given to `testenv up`.
        #[arg(long, default_value = ".tmp/testenv")]
        dir: PathBuf,
        /// Seconds to wait after SIGTERM before SIGKILL.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
        timeout: u64,
    },
}

/// A CLI failure: the message is printed after `testenv: `.
#[derive(Debug)]
struct Failure(String);

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("testenv: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Cmd::Up {
                dir,
                detach,
                bin_dir,
                apiserver_args,
                timeout,
            } => up(&absolute(&dir)?, detach, bin_dir, apiserver_args, timeout).await,
            Cmd::Env { dir } => env(&absolute(&dir)?),
            Cmd::Down { dir, timeout } => down(&absolute(&dir)?, Duration::from_secs(timeout)),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(msg)) => {
            eprintln!("testenv: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn absolute(dir: &Path) -> Result<PathBuf, Failure> {
    std::path::absolute(dir).map_err(|e| Failure(format!("cannot resolve {}: {e}", dir.display())))
}

/// True when `pid` is alive and is a `testenv` process (a recycled pid must not be signalled).
fn is_testenv(pid: u32) -> bool {
    is_running(pid)
        && std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|comm| comm.trim() == "testenv")
}

async fn up(
    dir: &Path,
    detach: bool,
    bin_dir: Option<PathBuf>,
    apiserver_args: Vec<String>,
    timeout: u64,
) -> Result<(), Failure> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure(format!("cannot create {}: {e}", dir.display())))?;
    let state_path = dir.join(STATE_FILE);
    match State::read(&state_path) {
        Ok(Some(state)) if is_testenv(state.pid) => {
            return Err(Failure(format!(
                "a control plane is already running from {} (pid {}, {}); stop it with `testenv down --dir {}`",
                dir.display(),
                state.pid,
                state.server_url,
                dir.display()
            )));
        }
        // Stale or unreadable: whoever wrote it is gone.
        Ok(Some(_)) | Err(_) => remove_files(dir),
        Ok(None) => {}
    }
    let bin_dir = resolve_bin_dir(bin_dir)?;
    if detach {
        return up_detached(dir, &bin_dir, &apiserver_args, timeout);
    }

    eprintln!(
        "testenv: starting etcd and kube-apiserver {K8S_RELEASE} from {}",
        bin_dir.display()
    );
    let env = TestEnv::builder()
        .bin_dir(&bin_dir)
        .data_dir(dir)
        .apiserver_args(apiserver_args)
        .startup_timeout(Duration::from_secs(timeout))
        .start()
        .await?;
    let kubeconfig = dir.join(KUBECONFIG_FILE);
    let text = std::fs::read_to_string(env.kubeconfig_path())
        .map_err(|e| Failure(format!("reading {}: {e}", env.kubeconfig_path().display())))?;
    write_private(&kubeconfig, &text)?;
    State {
        pid: std::process::id(),
        server_url: env.server_url().to_owned(),
        kubeconfig: kubeconfig.clone(),
        bin_dir: bin_dir.clone(),
        data_dir: env.dir().to_path_buf(),
        etcd_pid: env.etcd_pid(),
        apiserver_pid: env.apiserver_pid(),
    }
    .write(&state_path)?;
    print!("{}", export_lines(&kubeconfig, &bin_dir));
    let _ = std::io::stdout().flush();
    eprintln!(
        "testenv: control plane ready at {} in {:.1}s (etcd pid {}, kube-apiserver pid {}); \
         stop with Ctrl-C or `testenv down --dir {}`",
        env.server_url(),
        env.startup_time().as_secs_f64(),
        env.etcd_pid(),
        env.apiserver_pid(),
        dir.display()
    );

    let died = wait_for_stop_signal(&env).await?;
    remove_files(dir);
    let stopping = Instant::now();
    env.stop()?;
    eprintln!(
        "testenv: stopped in {:.1}s",
        stopping.elapsed().as_secs_f64()
    );
    died.map_or(Ok(()), |e| Err(Failure(e.to_string())))
}

/// Waits for SIGINT or SIGTERM; returns the error instead if etcd or the apiserver dies first.
async fn wait_for_stop_signal(env: &TestEnv) -> Result<Option<Error>, Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let install = |kind| signal(kind).map_err(|e| Failure(format!("cannot handle signals: {e}")));
    let mut int = install(SignalKind::interrupt())?;
    let mut term = install(SignalKind::terminate())?;
    let mut hup = install(SignalKind::hangup())?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = int.recv() => return Ok(None),
            _ = term.recv() => return Ok(None),
            _ = hup.recv() => return Ok(None),
            _ = tick.tick() => {
                if let Err(e) = env.check_processes() {
                    return Ok(Some(e));
                }
            }
        }
    }
}

/// Re-runs `testenv up` in a new session with its output in DIR/testenv.log, and returns
/// once it has written its state file (ready) or exited (failed).
fn up_detached(
    dir: &Path,
    bin_dir: &Path,
    apiserver_args: &[String],
    timeout: u64,
) -> Result<(), Failure> {
    let exe =
        std::env::current_exe().map_err(|e| Failure(format!("cannot find own executable: {e}")))?;
    let log_path = dir.join(LOG_FILE);
    let log = std::fs::File::create(&log_path)
        .map_err(|e| Failure(format!("cannot create {}: {e}", log_path.display())))?;
    let log_err = log
        .try_clone()
        .map_err(|e| Failure(format!("cannot open {}: {e}", log_path.display())))?;
    let mut cmd = Command::new(exe);
    cmd.arg("up")
        .arg("--dir")
        .arg(dir)
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--timeout")
        .arg(timeout.to_string());
    for flag in apiserver_args {
        cmd.arg(format!("--apiserver-arg={flag}"));
    }
    cmd.stdin(Stdio::null()).stdout(log).stderr(log_err);
    new_session(&mut cmd);
    let mut child = cmd
        .spawn()
        .map_err(|e| Failure(format!("cannot start testenv in the background: {e}")))?;
    eprintln!(
        "testenv: starting in the background (log: {})",
        log_path.display()
    );
    let deadline = Instant::now() + Duration::from_secs(timeout) + Duration::from_secs(30);
    let state_path = dir.join(STATE_FILE);
    loop {
        if let Ok(Some(state)) = State::read(&state_path)
            && state.pid == child.id()
        {
            print!("{}", export_lines(&state.kubeconfig, &state.bin_dir));
            let _ = std::io::stdout().flush();
            eprintln!(
                "testenv: control plane ready at {} (pid {}); stop it with `testenv down --dir {}`",
                state.server_url,
                state.pid,
                dir.display()
            );
            return Ok(());
        }
        if let Ok(Some(status)) = child.try_wait() {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            return Err(Failure(format!(
                "background testenv exited ({status}):\n{}",
                log.trim_end()
            )));
        }
        if Instant::now() >= deadline {
            let _ = send_signal(child.id(), Signal::Term);
            return Err(Failure(format!(
                "background testenv did not become ready in time; see {}",
                log_path.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn env(dir: &Path) -> Result<(), Failure> {
    match State::read(&dir.join(STATE_FILE))? {
        Some(state) if is_testenv(state.pid) => {
            print!("{}", export_lines(&state.kubeconfig, &state.bin_dir));
            Ok(())
        }
        Some(state) => Err(Failure(format!(
            "the control plane recorded in {} (pid {}) is not running; start one with `testenv up --dir {}`",
            dir.display(),
            state.pid,
            dir.display()
        ))),
        None => Err(Failure(format!(
            "no control plane is running from {}; start one with `testenv up --dir {}` (or `make cluster-up`)",
            dir.display(),
            dir.display()
        ))),
    }
}

fn down(dir: &Path, timeout: Duration) -> Result<(), Failure> {
    let state = match State::read(&dir.join(STATE_FILE)) {
        Ok(Some(state)) => state,
        Ok(None) => {
            eprintln!(
                "testenv: no control plane recorded in {}; nothing to stop",
                dir.display()
            );
            return Ok(());
        }
        Err(e) => {
            eprintln!("testenv: {e}; removing it");
            remove_files(dir);
            return Ok(());
        }
    };
    if !is_testenv(state.pid) {
        eprintln!(
            "testenv: the control plane recorded in {} (pid {}) is not running; removing what it left",
            dir.display(),
            state.pid
        );
        remove_leftovers(dir, &state);
        return Ok(());
    }
    let started = Instant::now();
    send_signal(state.pid, Signal::Term)
        .map_err(|e| Failure(format!("cannot signal pid {}: {e}", state.pid)))?;
    while is_running(state.pid) && started.elapsed() < timeout {
        std::thread::sleep(Duration::from_millis(50));
    }
    if is_running(state.pid) {
        eprintln!(
            "testenv: pid {} did not stop within {timeout:?}; killing it",
            state.pid
        );
        // Its etcd and apiserver die with it (parent-death signal).
        let _ = send_signal(state.pid, Signal::Kill);
        let killed = Instant::now();
        while is_running(state.pid) && killed.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    remove_leftovers(dir, &state);
    eprintln!(
        "testenv: stopped in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Removes the state file and kubeconfig in `dir`.
fn remove_files(dir: &Path) {
    for name in [STATE_FILE, KUBECONFIG_FILE] {
        let _ = std::fs::remove_file(dir.join(name));
    }
}

/// Removes what a killed `testenv up` could not: its files and its data directory — the
/// latter only if it really is a testenv directory inside `dir`, whatever the state file says.
fn remove_leftovers(dir: &Path, state: &State) {
    remove_files(dir);
    let data = &state.data_dir;
    let ours = data.parent() == Some(dir)
        && data
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("testenv-"));
    if ours && data.is_dir() {
        let _ = std::fs::remove_dir_all(data);
    }
}

fn write_private(path: &Path, text: &str) -> Result<(), Failure> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| Failure(format!("writing {}: {e}", path.display())))
}

/// The bin dir from `--bin-dir`/`AUTOMANAGER_K8S_BIN` or the cache. When the cache is empty
/// and we run inside the repository, build the binaries (minutes, once) instead of failing.
fn resolve_bin_dir(given: Option<PathBuf>) -> Result<PathBuf, Failure> {
    let explicit = given.is_some();
    let dir = match given {
        Some(dir) => dir,
        None => default_bin_dir()?,
    };
    match check_bin_dir(&dir) {
        Ok(()) => Ok(dir),
        Err(e) if explicit => Err(e.into()),
        Err(e) => {
            let Some(script) = find_build_script() else {
                return Err(e.into());
            };
            eprintln!(
                "testenv: building control plane binaries (~4 min cold) with {}",
                script.display()
            );
            let out = Command::new(&script)
                .stdin(Stdio::null())
                .stderr(Stdio::inherit())
                .output()
                .map_err(|e| Failure(format!("running {}: {e}", script.display())))?;
            if !out.status.success() {
                return Err(Failure(format!(
                    "{} failed ({})",
                    script.display(),
                    out.status
                )));
            }
            let stdout = String::from_utf8_lossy(&out.stdout);
            let built = stdout
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| PathBuf::from(l.trim()))
                .ok_or_else(|| Failure(format!("{} printed no bin directory", script.display())))?;
            check_bin_dir(&built)?;
            Ok(built)
        }
    }
}

/// `tools/control-plane/build.sh` in the current directory or any parent (the repository root).
fn find_build_script() -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    cwd.ancestors()
        .map(|d| d.join("tools/control-plane/build.sh"))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_use_the_repo_local_dir() {
        let cli = Cli::try_parse_from(["testenv", "down"]).map_err(|e| e.to_string());
        assert!(
            matches!(cli, Ok(Cli { command: Cmd::Down { ref dir, timeout: 30 } }) if dir == Path::new(".tmp/testenv"))
        );
    }

    #[test]
    fn apiserver_flags_pass_through_with_their_dashes() {
        let cli = Cli::try_parse_from([
            "testenv",
            "up",
            "--apiserver-arg",
            "--v=2",
            "--apiserver-arg=--profiling",
        ]);
        match cli {
            Ok(Cli {
                command: Cmd::Up { apiserver_args, .. },
            }) => assert_eq!(apiserver_args, ["--v=2", "--profiling"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn out_of_range_and_malformed_timeouts_are_rejected() {
        for bad in ["0", "3601", "-1", "soon", ""] {
            assert!(
                Cli::try_parse_from(["testenv", "up", "--timeout", bad]).is_err(),
                "{bad}"
            );
            assert!(
                Cli::try_parse_from(["testenv", "down", "--timeout", bad]).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn unknown_subcommands_and_flags_are_rejected() {
        assert!(Cli::try_parse_from(["testenv", "start"]).is_err());
        assert!(Cli::try_parse_from(["testenv", "env", "--force"]).is_err());
        assert!(Cli::try_parse_from(["testenv"]).is_err());
    }

    #[test]
    fn leftovers_outside_the_dir_are_never_removed() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let elsewhere = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let victim = elsewhere.path().join("testenv-1-x");
        std::fs::create_dir(&victim).unwrap_or_else(|e| panic!("{e}"));
        let inside = dir.path().join("testenv-1-y");
        std::fs::create_dir(&inside).unwrap_or_else(|e| panic!("{e}"));
        let state = |data_dir: PathBuf| State {
            pid: 1,
            server_url: String::new(),
            kubeconfig: PathBuf::new(),
            bin_dir: PathBuf::new(),
            data_dir,
            etcd_pid: 2,
            apiserver_pid: 3,
        };
        remove_leftovers(dir.path(), &state(victim.clone()));
        assert!(victim.exists());
        remove_leftovers(dir.path(), &state(dir.path().to_path_buf()));
        assert!(dir.path().exists());
        remove_leftovers(dir.path(), &state(inside.clone()));
        assert!(!inside.exists());
    }
}
