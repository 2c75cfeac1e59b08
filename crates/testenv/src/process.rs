//! Child processes that cannot outlive the process that started them, and small Linux
//! process helpers for the CLI and tests.
//!
//! Children are spawned with `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills them when we
//! die, even by SIGKILL where no destructor runs. The kernel ties that signal to the *thread*
//! that forked the child, not the process, so every child is spawned from one dedicated
//! thread that lives as long as the process; spawning from a tokio worker or blocking-pool
//! thread would kill the child when that thread is retired.
//!
//! This is the one module with `unsafe`: `pre_exec` hooks and `kill(2)`, each with the
//! reason it is sound beside it.
#![allow(unsafe_code)]

use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus};
use std::sync::OnceLock;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Signals the CLI and tests send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Ask to stop.
    Term,
    /// Stop now.
    Kill,
    /// Interrupt (Ctrl-C).
    Int,
    /// Pause (cannot be caught): the process stays, frozen.
    Stop,
    /// Resume a paused process.
    Cont,
}

impl Signal {
    fn raw(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
            Signal::Int => libc::SIGINT,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

/// Sends `signal` to `pid`. A pid that does not fit a `pid_t` is refused, never wrapped
/// (a wrapped value could be -1, which would signal every process we may signal).
pub fn send_signal(pid: u32, signal: Signal) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    // SAFETY: kill(2) has no memory-safety preconditions; pid is a positive, single pid.
    let rc = unsafe { libc::kill(pid, signal.raw()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// True while `pid` names a process that has not exited. Zombies count as exited: once a
/// process has been reparented, a container's init may never reap it.
pub fn is_running(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state letter follows the parenthesised command name, which may itself hold ')'.
        Ok(stat) => match stat.rfind(')').and_then(|i| stat.get(i + 1..)) {
            Some(rest) => !matches!(rest.trim_start().chars().next(), Some('Z' | 'X') | None),
            None => true,
        },
        Err(_) => false,
    }
}

/// Makes `cmd`'s process the leader of a new session, detached from our terminal, so it
/// outlives the shell or `make` that started it (used by `testenv up --detach`).
pub fn new_session(cmd: &mut Command) {
    // SAFETY: the hook runs between fork and exec and only calls setsid(2), which is
    // async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

struct SpawnRequest {
    cmd: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();

fn spawner() -> &'static mpsc::Sender<SpawnRequest> {
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        // If the thread cannot start, `rx` is dropped and every spawn reports the failure.
        let _ = std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for req in rx {
                    let mut cmd = req.cmd;
                    let _ = req.reply.send(cmd.spawn());
                }
            });
        tx
    })
}

/// Spawns `cmd` so that it is killed when this process dies, in its own process group so a
/// terminal's Ctrl-C reaches only us (we then stop it in order).
pub(crate) fn spawn_tied(mut cmd: Command) -> io::Result<Child> {
    let parent = libc::pid_t::try_from(std::process::id())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "own pid out of range"))?;
    cmd.process_group(0);
    // SAFETY: the hook runs between fork and exec and only calls prctl(2) and getppid(2),
    // both async-signal-safe; it allocates nothing and touches no shared state.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) == -1
            {
                return Err(io::Error::last_os_error());
            }
            // We may have died between fork and prctl; then nobody would send the signal.
            if libc::getppid() != parent {
                return Err(io::Error::other("parent exited during spawn"));
            }
            Ok(())
        });
    }
    let (reply, answer) = mpsc::channel();
    let gone = || io::Error::other("testenv spawner thread is not running");
    spawner()
        .send(SpawnRequest { cmd, reply })
        .map_err(|_| gone())?;
    answer.recv().map_err(|_| gone())?
}

/// A running control-plane process.
#[derive(Debug)]
pub(crate) struct Supervised {
    pub(crate) name: &'static str,
    child: Child,
    status: Option<ExitStatus>,
}

impl Supervised {
    pub(crate) fn new(name: &'static str, child: Child) -> Self {
        Supervised {
            name,
            child,
            status: None,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The exit status if the process has exited (and is now reaped).
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// SIGKILL at once (also when paused), and reaps the process.
    pub(crate) fn kill(&mut self) -> io::Result<ExitStatus> {
        if let Some(status) = self.exited() {
            return Ok(status);
        }
        self.child.kill()?;
        let status = self.child.wait()?;
        self.status = Some(status);
        Ok(status)
    }

    /// SIGTERM, then SIGKILL once `grace` has passed; always reaps the process.
    pub(crate) fn stop(&mut self, grace: Duration) -> io::Result<ExitStatus> {
        if let Some(status) = self.exited() {
            return Ok(status);
        }
        // ESRCH here means it exited in between; the wait below collects it.
        let _ = send_signal(self.pid(), Signal::Term);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = self.exited() {
                return Ok(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        tracing::warn!(
            process = self.name,
            pid = self.pid(),
            ?grace,
            "did not stop after SIGTERM; sending SIGKILL"
        );
        let _ = self.child.kill();
        let status = self.child.wait()?;
        self.status = Some(status);
        Ok(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tied_child_runs_and_is_stopped_by_sigterm() {
        let mut cmd = Command::new("sleep");
        cmd.arg("30");
        let mut child = Supervised::new("sleep", spawn_tied(cmd).unwrap());
        let pid = child.pid();
        assert!(is_running(pid));
        let status = child.stop(Duration::from_secs(5)).unwrap();
        assert!(!status.success());
        assert!(!is_running(pid));
    }

    #[test]
    fn a_child_that_ignores_sigterm_is_killed_after_the_grace_period() {
        let mut cmd = Command::new("sh");
        // An ignored signal stays ignored across exec, so `sleep` itself ignores SIGTERM.
        cmd.args(["-c", "trap '' TERM; exec sleep 30"]);
        let mut child = Supervised::new("stubborn", spawn_tied(cmd).unwrap());
        std::thread::sleep(Duration::from_millis(200));
        let pid = child.pid();
        child.stop(Duration::from_millis(300)).unwrap();
        assert!(!is_running(pid));
    }

    #[test]
    fn spawning_a_missing_program_is_an_error_not_a_panic() {
        assert!(spawn_tied(Command::new("/nonexistent/testenv-binary")).is_err());
    }

    #[test]
    fn our_own_process_is_running_and_pid_zero_is_not() {
        assert!(is_running(std::process::id()));
        assert!(!is_running(0));
        assert!(!is_running(u32::MAX));
    }

    #[test]
    fn out_of_range_pids_are_refused_not_wrapped() {
        assert!(send_signal(u32::MAX, Signal::Term).is_err());
        assert!(send_signal(0, Signal::Term).is_err());
    }
}
