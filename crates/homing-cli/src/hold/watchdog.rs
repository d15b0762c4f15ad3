//! The watchdog that COMMAND's group cannot outlive `hold` by: a second
//! `homing` process (`homing hold-watchdog`, hidden) that `hold` starts
//! before COMMAND and tells COMMAND's group id as soon as COMMAND runs. It
//! holds the read end of a pipe (its stdin) whose only write end is
//! `hold`'s (close-on-exec, so COMMAND does not inherit it). However `hold`
//! dies — SIGKILL included, and whichever of its threads — the kernel closes
//! that end, the watchdog reads end of file and sends SIGKILL to COMMAND's
//! whole group at once, which is always at or before the lease's hard
//! deadline, then exits.
//!
//! The watchdog runs in a process group of its own, so a `kill -9` of
//! `hold`'s group (a supervisor, a terminal) does not reach it, nor do the
//! signals `hold` sends COMMAND's group. The kernel's parent-death signal
//! would not do: it reaches only the direct child (COMMAND's leader, not
//! its group), fires when the parent *thread* ends (a tokio worker), and
//! needs code between fork and exec.
//!
//! The group's reaper stands the watchdog down ([`Watchdog::stand_down`]:
//! kills and reaps it, no zombie) once the leader has exited and the group
//! was killed, and before it reaps the leader: until then the leader's
//! zombie holds the group id, so the watchdog's SIGKILL can never reach a
//! group that reused the id. One window is left: `hold` killed while
//! COMMAND starts, after the fork and before the one write that tells the
//! watchdog its group ([`Watchdog::watch`], right after `exec` succeeded);
//! COMMAND then runs unwatched. A watchdog killed by someone else leaves
//! COMMAND unwatched too; `hold` goes on without one.

use std::io::{self, BufRead, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};

use rustix::process::{Pid, Signal};

/// The hidden subcommand the watchdog runs as, dispatched before anything
/// else starts (no runtime, no logging): `homing hold-watchdog`.
pub const SUBCOMMAND: &str = "hold-watchdog";

/// A started watchdog: `hold`'s end of its pipe, and the process to reap.
pub struct Watchdog {
    child: Child,
    /// `hold`'s end of the pipe. Dropped (or `hold` gone), the watchdog
    /// kills the group it watches: so a `hold` that unwinds or returns
    /// early without [`Watchdog::stand_down`] leaves nothing running.
    pipe: ChildStdin,
}

impl Watchdog {
    /// Starts the watchdog (this program again, in a process group of its
    /// own), watching nothing yet. Fails as `Command::spawn` does.
    pub fn start() -> io::Result<Watchdog> {
        let mut child = Command::new(this_program()?)
            .arg(SUBCOMMAND)
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()?;
        let pipe = child.stdin.take().expect("stdin was piped");
        Ok(Watchdog { child, pipe })
    }

    /// The watchdog's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Tells the watchdog the group to kill when `hold` dies: COMMAND's
    /// group, led by `leader`. One write of a few bytes (atomic on a pipe).
    /// Fails when the watchdog is gone (`BrokenPipe`).
    pub fn watch(&mut self, leader: Pid) -> io::Result<()> {
        writeln!(self.pipe, "{}", leader.as_raw_nonzero())?;
        self.pipe.flush()
    }

    /// The group is killed and no longer needs watching: kills the
    /// watchdog before it can see the pipe close, and reaps it. Blocks
    /// until it is reaped (it dies of SIGKILL; nothing it does delays that).
    pub fn stand_down(mut self) {
        // The pipe is still open here: the watchdog is blocked reading it.
        // Not yet reaped, its pid is still its own: the kill reaches it.
        let _ = self.child.kill();
        let _ = self.child.wait();
        drop(self.pipe);
    }
}

/// This program, to run again as the watchdog. On Linux the running
/// executable itself, so a binary replaced or deleted by an upgrade since
/// `hold` started still runs.
fn this_program() -> io::Result<PathBuf> {
    if cfg!(target_os = "linux") {
        return Ok(PathBuf::from("/proc/self/exe"));
    }
    std::env::current_exe()
}

/// The watchdog's body (`homing hold-watchdog`): reads the group to watch
/// from stdin, then reads stdin to its end, then kills the group. Returns
/// the process's exit code: 0, or 2 for a group id it refuses.
pub fn run() -> i32 {
    let mut stdin = io::stdin().lock();
    let mut line = String::new();
    match stdin.read_line(&mut line) {
        // `hold` went before COMMAND ran: nothing to kill.
        Ok(0) | Err(_) => return 0,
        Ok(_) => {}
    }
    // Group 1 would be kill(-1): every process this user may signal.
    let Some(group) = line
        .trim()
        .parse::<i32>()
        .ok()
        .filter(|g| *g > 1)
        .and_then(Pid::from_raw)
    else {
        let _ = writeln!(
            io::stderr(),
            "homing hold-watchdog: not a group id: {line:?}"
        );
        return 2;
    };
    let mut sink = [0u8; 64];
    loop {
        match stdin.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    // ESRCH: the group is already gone.
    let _ = rustix::process::kill_process_group(group, Signal::KILL);
    let _ = writeln!(
        io::stderr(),
        "homing hold-watchdog: homing hold is gone; sent SIGKILL to COMMAND's group {}",
        group.as_raw_nonzero()
    );
    0
}
