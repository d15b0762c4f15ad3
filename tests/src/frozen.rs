//! A process frozen with SIGSTOP for as long as a [`Frozen`] lives: it
//! still holds its sockets (peers' packets queue up, nothing answers), as
//! when a partition cuts it off. Dropping it sends SIGCONT, so a failing
//! test never leaves a process frozen.

use rustix::process::{Pid, Signal};

/// Sends SIGCONT on drop (or [`Frozen::thaw`]).
#[derive(Debug)]
pub struct Frozen(Pid);

impl Frozen {
    /// Sends SIGSTOP to `pid` and waits until every one of its threads is
    /// stopped (`kill` returns before a thread running on another core has
    /// stopped: on a loaded machine it could still answer a request sent
    /// after this call). Panics if the signal cannot be sent (the process is
    /// not the test's) or the threads do not all stop within 10 s.
    pub fn freeze(pid: u32) -> Frozen {
        let raw = i32::try_from(pid).expect("a pid fits in i32");
        let target = Pid::from_raw(raw).expect("a process pid is positive");
        rustix::process::kill_process(target, Signal::STOP).expect("SIGSTOP to a child");
        let frozen = Frozen(target);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !all_threads_stopped(pid) {
            assert!(
                std::time::Instant::now() < deadline,
                "process {pid} did not stop within 10 s of SIGSTOP"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        frozen
    }

    /// Sends SIGCONT now.
    pub fn thaw(self) {}
}

/// Whether every thread of `pid` is in the stopped state (`T` in
/// `/proc/<pid>/task/<tid>/stat`). A process that is gone counts as stopped.
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        // `pid (comm) S …`: the state follows the last `)` (comm may hold spaces).
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        matches!(state, Some('T') | Some('t') | None)
    })
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // Gone already: nothing to resume.
        let _ = rustix::process::kill_process(self.0, Signal::CONT);
    }
}
