//! The process group `homing hold` runs COMMAND in: spawned as the leader of
//! a group of its own, signalled as a group, and reaped as a group.
//!
//! A reaper thread waits for the leader without reaping it (`WNOWAIT`), so
//! the leader's zombie keeps its pid, and with it the group id, from being
//! reused while `hold` may still signal the group. Once the leader has
//! exited, the reaper kills whatever the leader left in its group and reaps
//! every member. `hold` is the group's subreaper (Linux), so a member
//! orphaned by its parent is reparented to `hold` and waited for, not lost to
//! init: [`GroupEvent::Gone`] means no member of the group is left. A member
//! that moves itself into another group or session (`setsid`) leaves this
//! one and is not tracked; systemd's cgroup kill catches those.
//!
//! A [`Watchdog`] kills the group if `hold` dies: it is told the group right
//! after COMMAND's `exec`, and the reaper stands it down after killing the
//! group and before reaping the leader, while the group id is still the
//! group's.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError};

use rustix::io::Errno;
use rustix::process::{Pid, Signal, WaitId, WaitIdOptions, WaitOptions};
use tokio::sync::mpsc;

use super::watchdog::Watchdog;

/// How the group's leader ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildStatus {
    /// It exited with this code.
    Exited(i32),
    /// A signal of this number killed it.
    Signaled(i32),
    /// It could not be waited for (someone else reaped it).
    Unknown,
}

impl ChildStatus {
    /// The exit code a shell would report: the code, or 128 + the signal.
    pub fn shell_code(self) -> i32 {
        match self {
            ChildStatus::Exited(code) => code,
            ChildStatus::Signaled(signal) => 128 + signal,
            ChildStatus::Unknown => 1,
        }
    }

    /// Whether the run counts as a success: exit code 0 and nothing else.
    pub fn success(self) -> bool {
        self == ChildStatus::Exited(0)
    }
}

impl std::fmt::Display for ChildStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChildStatus::Exited(code) => write!(f, "exit status {code}"),
            ChildStatus::Signaled(signal) => {
                write!(f, "killed by {}", super::signal::name(*signal))
            }
            ChildStatus::Unknown => f.write_str("status unknown"),
        }
    }
}

/// What the reaper reports, in this order, once each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupEvent {
    /// The leader exited; its leftovers in the group have been sent SIGKILL.
    LeaderExited(ChildStatus),
    /// Every member of the group is dead and reaped.
    Gone,
}

/// A running command and its process group.
pub struct Group {
    leader: Pid,
    /// `true` once the leader's exit was seen and its group killed: from
    /// then on the group id may be reused and must not be signalled. The
    /// reaper sets it; [`Group::signal`] reads it under the same lock.
    done: Arc<Mutex<bool>>,
    events: mpsc::Receiver<GroupEvent>,
    /// Why the watchdog could not be told the group, if it could not: the
    /// group was sent SIGKILL at once, since nothing would stop it if
    /// `hold` died.
    unwatched: Option<io::Error>,
}

/// Makes this process the subreaper of its descendants (Linux), so members
/// of a command's group whose parent died are reparented here and waited
/// for. Elsewhere a no-op: orphans go to init and are not waited for.
pub fn become_subreaper() -> io::Result<()> {
    #[cfg(target_os = "linux")]
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))?;
    Ok(())
}

impl Group {
    /// Starts `command` (program and arguments) as the leader of a new
    /// process group, with this process's environment changed by `env`
    /// (`Some`: set, `None`: removed), tells `watchdog` the group, and
    /// starts the reaper thread, which stands the watchdog down. Fails as
    /// `Command::spawn` does (`NotFound`, `PermissionDenied`, …), the
    /// watchdog stood down.
    pub fn spawn(
        command: &[OsString],
        env: &[(&str, Option<String>)],
        mut watchdog: Watchdog,
    ) -> io::Result<Group> {
        let Some((program, args)) = command.split_first() else {
            watchdog.stand_down();
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "no command given",
            ));
        };
        let mut child = Command::new(program);
        child.args(args).process_group(0);
        for (name, value) in env {
            match value {
                Some(value) => child.env(name, value),
                None => child.env_remove(name),
            };
        }
        let child = match child.spawn() {
            Ok(child) => child,
            Err(error) => {
                watchdog.stand_down();
                return Err(error);
            }
        };
        let leader = Pid::from_child(&child);
        // Dropping `child` neither waits nor kills: the reaper owns it now.
        drop(child);
        // At once: until this write, `hold` dying would leave COMMAND running.
        let unwatched = watchdog.watch(leader).err();
        if unwatched.is_some() {
            // Not reaped yet, the leader holds the group id.
            let _ = rustix::process::kill_process_group(leader, Signal::KILL);
        }
        let done = Arc::new(Mutex::new(false));
        // Two events, each sent once: the channel never fills.
        let (tx, events) = mpsc::channel(2);
        let reaper_done = done.clone();
        std::thread::Builder::new()
            .name("hold-reaper".into())
            .spawn(move || reap(leader, &reaper_done, &tx, watchdog))?;
        Ok(Group {
            leader,
            done,
            events,
            unwatched,
        })
    }

    /// Why the watchdog could not be told the group (it was gone), if it
    /// could not; the group was killed then.
    pub fn unwatched(&self) -> Option<&io::Error> {
        self.unwatched.as_ref()
    }

    /// The leader's process id (also the group id).
    pub fn pid(&self) -> i32 {
        self.leader.as_raw_nonzero().get()
    }

    /// Sends `signal` to every member of the group; nothing once the group
    /// is done (its id may belong to someone else by then).
    pub fn signal(&self, signal: Signal) {
        let done = self.done.lock().unwrap_or_else(PoisonError::into_inner);
        if !*done {
            // ESRCH: every member already exited; the reaper reports it.
            let _ = rustix::process::kill_process_group(self.leader, signal);
        }
    }

    /// The next event of the group; `None` after [`GroupEvent::Gone`].
    pub async fn next(&mut self) -> Option<GroupEvent> {
        self.events.recv().await
    }
}

/// The reaper thread: the leader's exit (left a zombie), the group killed,
/// the watchdog stood down, every member reaped.
fn reap(leader: Pid, done: &Mutex<bool>, events: &mpsc::Sender<GroupEvent>, watchdog: Watchdog) {
    let status = leader_exit(leader);
    {
        let mut done = done.lock().unwrap_or_else(PoisonError::into_inner);
        // The leader's zombie still holds the group id: this cannot reach
        // another group. What the leader left behind must not outlive the
        // run: the lease is released next, and the next holder may start.
        let _ = rustix::process::kill_process_group(leader, Signal::KILL);
        *done = true;
    }
    // The group is killed; the watchdog has nothing left to do. Before the
    // leader is reaped: until then its SIGKILL could reach only this group.
    watchdog.stand_down();
    let _ = events.blocking_send(GroupEvent::LeaderExited(status));
    // Until ECHILD: no child of ours is left in the group.
    while let Ok(_) | Err(Errno::INTR) = rustix::process::waitpgid(leader, WaitOptions::empty()) {}
    let _ = events.blocking_send(GroupEvent::Gone);
}

/// Waits for the leader to exit without reaping it.
fn leader_exit(leader: Pid) -> ChildStatus {
    loop {
        let options = WaitIdOptions::EXITED | WaitIdOptions::NOWAIT;
        match rustix::process::waitid(WaitId::Pid(leader), options) {
            Ok(Some(status)) => {
                if let Some(code) = status.exit_status() {
                    return ChildStatus::Exited(code);
                }
                if let Some(signal) = status.terminating_signal() {
                    return ChildStatus::Signaled(signal);
                }
                // Neither exited nor killed: cannot be with WEXITED alone.
                return ChildStatus::Unknown;
            }
            Ok(None) | Err(Errno::INTR) => continue,
            Err(_) => return ChildStatus::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_shell_codes_and_read_like_a_shell() {
        assert_eq!(ChildStatus::Exited(3).shell_code(), 3);
        assert_eq!(ChildStatus::Signaled(9).shell_code(), 137);
        assert_eq!(ChildStatus::Signaled(9).to_string(), "killed by SIGKILL");
        assert!(ChildStatus::Exited(0).success());
        assert!(!ChildStatus::Signaled(15).success());
    }
}
