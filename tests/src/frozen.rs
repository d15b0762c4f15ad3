//! A process frozen with SIGSTOP for as long as a [`Frozen`] lives: it
//! still holds its sockets (peers' packets queue up, nothing answers), as
//! when a partition cuts it off. Dropping it sends SIGCONT, so a failing
//! test never leaves a process frozen.

use rustix::process::{Pid, Signal};

/// Sends SIGCONT on drop (or [`Frozen::thaw`]).
#[derive(Debug)]
pub struct Frozen(Pid);

impl Frozen {
    /// Sends SIGSTOP to `pid`. Panics if the signal cannot be sent (the
    /// process is not the test's).
    pub fn freeze(pid: u32) -> Frozen {
        let raw = i32::try_from(pid).expect("a pid fits in i32");
        let pid = Pid::from_raw(raw).expect("a process pid is positive");
        rustix::process::kill_process(pid, Signal::STOP).expect("SIGSTOP to a child");
        Frozen(pid)
    }

    /// Sends SIGCONT now.
    pub fn thaw(self) {}
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // Gone already: nothing to resume.
        let _ = rustix::process::kill_process(self.0, Signal::CONT);
    }
}
