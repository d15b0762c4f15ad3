//! `homing hold KEY -- COMMAND` end to end: the real `homing` binary against
//! a real `homingd` (one DC, redb, no etcd). COMMANDs are `sh` scripts that
//! report through a FIFO (a [`Probe`]): their lines, and end of file once
//! every process holding the FIFO — the command and any grandchild — is dead.
//! Times are this host's wall clock, the clock `hold`'s deadlines are in.
//! Each test waits on events (a JSON line of `hold --json`, a probe line, a
//! gauge of the DC), each bounded; none sleeps a fixed time.

#![cfg(feature = "etcd")]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use homing_core::{
    AcquireReply, ActorId, Grant, Key, KeyConfig, KeyName, LeasePolicy, ReleaseCause, ReleaseReply,
    Reply, Request, ReservationId, Role, RunOutcome,
};
use homing_e2e::cluster::{free_udp_addr, host_now};
use homing_e2e::homing_binary;
use homing_e2e::lone_dc::LoneDc;
use rustix::process::{Pid, Signal};
use serde_json::Value;
use tokio::sync::mpsc;

/// Upper bound on any one scenario, so a hang fails instead of stalling CI.
const SCENARIO_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for any one event a test expects.
const EVENT_WAIT: Duration = Duration::from_secs(10);

/// The lease of the tests that lose it: 2 s, renewed every 500 ms; without a
/// renewal the soft deadline comes 1 s and the hard deadline 1.5 s after the
/// last grant.
fn lease() -> LeasePolicy {
    LeasePolicy::new(2_000, 250, 1_000, 500, 500).expect("an ordered policy")
}

/// The lease of the tests that must keep it: the daemon's default (10 s),
/// so a slow renewal on a loaded machine never stops a command early.
fn steady_lease() -> LeasePolicy {
    LeasePolicy::DEFAULT
}

async fn bounded<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(SCENARIO_TIMEOUT, f)
        .await
        .expect("scenario finished within its time bound");
}

/// This host's wall clock in microseconds.
fn wall_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn key(name: &str) -> Key {
    Key::new(KeyName::new(name).expect("a valid key name"))
}

/// A host's `Acquire` of `name` for `actor`, sent now, not waiting.
fn acquire(name: &str, actor: &str) -> Request {
    Request::Acquire {
        lease: homing_e2e::cluster::lease_of(actor),
        config: KeyConfig::named(KeyName::new(name).expect("a valid key name")),
        actor: ActorId::new(actor).expect("a valid actor id"),
        host_time: host_now(),
        wait_ms: 0,
    }
}

// ---------------------------------------------------------------------------
// Harness: a `homing hold` process and a probe FIFO
// ---------------------------------------------------------------------------

/// A running `homing hold --json` (leading a process group of its own):
/// its JSON lines as they come, each with the wall time it was read.
/// Dropped while running, it is SIGKILLed along with its COMMAND's group.
struct Hold {
    process: Child,
    lines: mpsc::UnboundedReceiver<(Value, u64)>,
    /// Every event read so far, in order.
    seen: Vec<Value>,
    /// COMMAND's pid (= its process group), once `started`.
    command_pid: Option<i32>,
    /// The pid of hold's watchdog, once `started`.
    watchdog_pid: Option<Pid>,
    stderr: PathBuf,
}

impl Hold {
    /// `homing hold KEY --json [flags] -- sh -c SCRIPT` against `dc`, with
    /// `env` added to its (and so COMMAND's) environment.
    fn spawn(dc: &LoneDc, key: &str, flags: &[&str], script: &str, env: &[(&str, &Path)]) -> Hold {
        Hold::spawn_at(dc, dc.addr(), key, flags, script, env)
    }

    /// Like [`Hold::spawn`], with the DC reached at `addr`.
    fn spawn_at(
        dc: &LoneDc,
        addr: SocketAddr,
        key: &str,
        flags: &[&str],
        script: &str,
        env: &[(&str, &Path)],
    ) -> Hold {
        let stderr = dc.dir().join(format!("hold-{key}-{}.log", wall_us()));
        let log = std::fs::File::create(&stderr).expect("a log file");
        let mut process = Command::new(homing_binary())
            .args(["hold", key, "--json"])
            .arg("--certs")
            .arg(dc.certs_dir())
            .arg("--dc")
            .arg(format!("{}={addr}", dc.dc()))
            .args(flags)
            .args(["--", "sh", "-c", script])
            .envs(env.iter().copied())
            .env("HOMING_LOG", "info")
            // Its own process group, as under a supervisor: a test may kill
            // the group without killing itself.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .expect("homing hold starts");
        let stdout = process.stdout.take().expect("stdout is piped");
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let at = wall_us();
                // COMMAND's own stdout is hold's too; the scripts keep quiet.
                let Ok(value) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if tx.send((value, at)).is_err() {
                    break;
                }
            }
        });
        Hold {
            process,
            lines,
            seen: Vec::new(),
            command_pid: None,
            watchdog_pid: None,
            stderr,
        }
    }

    /// The next event named `name` (skipping others), with when it was read.
    async fn event(&mut self, name: &str) -> (Value, u64) {
        loop {
            let next = tokio::time::timeout(EVENT_WAIT, self.lines.recv()).await;
            let Ok(Some((value, at))) = next else {
                panic!(
                    "no `{name}` event from hold (saw {:?}); its log:\n{}",
                    self.seen,
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                );
            };
            self.seen.push(value.clone());
            if value["event"] == "started" {
                self.command_pid = value["pid"].as_i64().map(|p| p as i32);
                self.watchdog_pid = value["watchdog"]
                    .as_i64()
                    .and_then(|p| Pid::from_raw(p as i32));
                assert!(self.watchdog_pid.is_some(), "no watchdog pid in {value}");
            }
            if value["event"] == name {
                return (value, at);
            }
        }
    }

    /// Waits for its `exit` event and the process; returns the exit code,
    /// which must equal the event's. Once COMMAND had started, hold must
    /// have stood its watchdog down and reaped it: no process, no zombie.
    async fn exit_code(&mut self) -> i32 {
        let (exit, _) = self.event("exit").await;
        // It exits right after printing `exit`.
        let status = tokio::task::block_in_place(|| self.process.wait()).expect("hold is waited");
        let code = status.code().expect("hold exits, not killed by a signal");
        assert_eq!(exit["code"].as_i64(), Some(i64::from(code)), "{exit}");
        if let Some(watchdog) = self.watchdog_pid {
            assert_eq!(
                rustix::process::test_kill_process(watchdog),
                Err(rustix::io::Errno::SRCH),
                "hold exited leaving its watchdog (pid {watchdog:?}) running or unreaped"
            );
        }
        code
    }

    /// The deadlines of the last grant it reported (`holding` or `renewed`).
    fn last_deadlines(&self) -> Value {
        self.seen
            .iter()
            .rev()
            .find(|e| e["event"] == "holding" || e["event"] == "renewed")
            .map(|e| e["deadlines"].clone())
            .expect("a grant was reported")
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.process.id() as i32).expect("a pid is positive")
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        // Still running: the test failed. Once hold exited, its COMMAND's
        // group is gone (hold waits for it), and its pid may be reused.
        if matches!(self.process.try_wait(), Ok(None)) {
            // `started` may be among the lines no test step read.
            while let Ok((value, _)) = self.lines.try_recv() {
                if value["event"] == "started" {
                    self.command_pid = value["pid"].as_i64().map(|p| p as i32);
                }
            }
            if let Some(group) = self.command_pid.and_then(Pid::from_raw) {
                let _ = rustix::process::kill_process_group(group, Signal::KILL);
            }
            let _ = self.process.kill();
            let _ = self.process.wait();
        }
    }
}

/// What a [`Probe`] reads.
enum ProbeEvent {
    Line(String, u64),
    Eof(u64),
}

/// A FIFO a COMMAND opens as fd 3 (`exec 3>"$PROBE"`): its lines, and end of
/// file when every process holding it has exited.
struct Probe {
    path: PathBuf,
    events: mpsc::UnboundedReceiver<ProbeEvent>,
    /// Every line read so far, with when.
    lines: Vec<(String, u64)>,
}

impl Probe {
    fn new(dir: &Path, name: &str) -> Probe {
        let path = dir.join(name);
        let made = Command::new("mkfifo")
            .arg(&path)
            .status()
            .expect("mkfifo runs");
        assert!(made.success(), "mkfifo {}", path.display());
        let (tx, events) = mpsc::unbounded_channel();
        let reading = path.clone();
        // Opening blocks until COMMAND opens the write end; a COMMAND that
        // never runs leaves this thread blocked, harmlessly, until the test
        // process exits.
        std::thread::spawn(move || {
            let Ok(fifo) = std::fs::File::open(&reading) else {
                return;
            };
            for line in BufReader::new(fifo).lines().map_while(Result::ok) {
                let _ = tx.send(ProbeEvent::Line(line, wall_us()));
            }
            let _ = tx.send(ProbeEvent::Eof(wall_us()));
        });
        Probe {
            path,
            events,
            lines: Vec::new(),
        }
    }

    async fn next(&mut self, what: &str) -> ProbeEvent {
        match tokio::time::timeout(EVENT_WAIT, self.events.recv()).await {
            Ok(Some(event)) => event,
            _ => panic!(
                "probe {}: no {what} (lines so far: {:?})",
                self.path.display(),
                self.lines
            ),
        }
    }

    /// The next line starting with `prefix`, with when it was read.
    async fn line(&mut self, prefix: &str) -> (String, u64) {
        loop {
            match self.next(prefix).await {
                ProbeEvent::Line(line, at) => {
                    self.lines.push((line.clone(), at));
                    if line.starts_with(prefix) {
                        return (line, at);
                    }
                }
                ProbeEvent::Eof(_) => {
                    panic!("probe ended before a line {prefix:?}: {:?}", self.lines)
                }
            }
        }
    }

    /// When every writer was gone (reading the lines before it).
    async fn eof(&mut self) -> u64 {
        loop {
            match self.next("end of file").await {
                ProbeEvent::Line(line, at) => self.lines.push((line, at)),
                ProbeEvent::Eof(at) => return at,
            }
        }
    }

    fn saw(&self, prefix: &str) -> Option<u64> {
        self.lines
            .iter()
            .find(|(line, _)| line.starts_with(prefix))
            .map(|(_, at)| *at)
    }
}

/// A process's death as an event: a pidfd, readable once the process has
/// exited (a zombie counts: it is dead, and its parent, pid 1 once `hold` is
/// gone, may be slow to reap it, or never). Opened while the pid is surely
/// the process's own, it cannot mistake a process that reused the pid.
#[cfg(target_os = "linux")]
struct Death {
    what: String,
    pidfd: std::os::fd::OwnedFd,
}

#[cfg(target_os = "linux")]
impl Death {
    fn of(what: &str, pid: Pid) -> Death {
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .unwrap_or_else(|e| panic!("pidfd of {what} (pid {pid:?}): {e}"));
        Death {
            what: what.to_string(),
            pidfd,
        }
    }

    /// Waits, within [`EVENT_WAIT`], until the process is dead.
    fn wait(&self) {
        use rustix::event::{PollFd, PollFlags, Timespec};
        let deadline = std::time::Instant::now() + EVENT_WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let timeout = Timespec::try_from(left).expect("EVENT_WAIT fits a timespec");
            let mut fds = [PollFd::new(&self.pidfd, PollFlags::IN)];
            match tokio::task::block_in_place(|| rustix::event::poll(&mut fds, Some(&timeout))) {
                Ok(0) => panic!("{} still runs after {EVENT_WAIT:?}", self.what),
                Ok(_) => return,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => panic!("polling the pidfd of {}: {e}", self.what),
            }
        }
    }
}

/// SIGKILLs a process group when dropped, unless disarmed: what a failed
/// test leaves.
#[cfg(target_os = "linux")]
struct KillGroupOnDrop(Option<Pid>);

#[cfg(target_os = "linux")]
impl KillGroupOnDrop {
    /// The group is gone: its id may be reused, so it is no longer signalled.
    fn disarm(&mut self) {
        self.0 = None;
    }
}

#[cfg(target_os = "linux")]
impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(group) = self.0 {
            let _ = rustix::process::kill_process_group(group, Signal::KILL);
        }
    }
}

fn ms(value: &Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {value}"))
}

/// Asserts the probe's end (every process of COMMAND's group dead) came by
/// the hard deadline of `deadlines`, on this host's clock; returns the margin.
fn assert_dead_by_hard_deadline(test: &str, deadlines: &Value, dead_at_us: u64) -> f64 {
    let hard_us = ms(deadlines, "hard_terminate_at_ms") * 1_000;
    let margin_ms = (hard_us as f64 - dead_at_us as f64) / 1_000.0;
    let side = if margin_ms >= 0.0 { "before" } else { "after" };
    eprintln!(
        "{test}: the command's group was dead {:.1} ms {side} the hard deadline",
        margin_ms.abs()
    );
    assert!(
        dead_at_us <= hard_us,
        "{test}: the command's group outlived the hard deadline by {:.1} ms",
        -margin_ms
    );
    margin_ms
}

// ---------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_starts_the_command_only_once_the_lease_is_granted_with_the_lease_in_its_env() {
    let dc = LoneDc::start(steady_lease(), &[]).await;
    bounded(async {
        let marker = dc.dir().join("ran");
        let touch = r#"touch "$MARKER""#;
        // Held by another host: exit 75, say where, never run.
        let host = dc.client(Role::Host);
        let Reply::Acquire(AcquireReply::Acquired(Grant { reservation, .. })) = dc.ask(&host, &acquire("busy", "10.9.9.9:1")).await
        else {
            panic!("the other host acquires");
        };
        let mut held = Hold::spawn(&dc, "busy", &[], touch, &[("MARKER", &marker)]);
        let (elsewhere, _) = held.event("held_elsewhere").await;
        assert_eq!(elsewhere["reservation"], reservation.to_string());
        assert_eq!(elsewhere["actor"], "10.9.9.9:1");
        assert_eq!(held.exit_code().await, 75);
        assert!(!marker.exists(), "the command ran without the lease");

        // The DC does not answer: exit 69, never run.
        let mut unreachable = Hold::spawn_at(&dc, free_udp_addr(), "free", &[], touch, &[("MARKER", &marker)]);
        assert_eq!(unreachable.exit_code().await, 69);
        assert!(!marker.exists(), "the command ran without the lease");

        // Granted: the lease is announced, then the command runs with it.
        let mut probe = Probe::new(dc.dir(), "env");
        let script = r#"exec 3>"$PROBE"; echo "env $HOMING_KEY|$HOMING_NAMESPACE|$HOMING_RESERVATION|$HOMING_TOKEN|$HOMING_DC|$HOMING_ACTOR" >&3"#;
        let flags = ["--namespace", "games", "--actor", "10.0.3.9:9000"];
        let mut granted = Hold::spawn(&dc, "free", &flags, script, &[("PROBE", &probe.path)]);
        let (holding, _) = granted.event("holding").await;
        assert_eq!(holding["actor"], "10.0.3.9:9000");
        let (env, _) = probe.line("env").await;
        let expected = format!(
            "env free|games|{}|{}|iad|10.0.3.9:9000",
            holding["reservation"].as_str().unwrap(),
            holding["token"]
        );
        assert_eq!(env, expected);
        assert_eq!(granted.exit_code().await, 0);
        let position = |name: &str| granted.seen.iter().position(|e| e["event"] == name);
        assert!(position("holding") < position("started"), "{:?}", granted.seen);
        assert!(position("started") < position("released"), "{:?}", granted.seen);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_kill_9_of_the_dc_sends_the_soft_signal_and_the_command_is_dead_by_the_hard_deadline()
{
    let mut dc = LoneDc::start(lease(), &[]).await;
    bounded(async {
        let mut probe = Probe::new(dc.dir(), "kill9");
        // Notes the soft signal and keeps running: only SIGKILL stops it.
        let script = r#"exec 3>"$PROBE"; trap 'echo term >&3' TERM; echo started >&3; while :; do sleep 1; done"#;
        let mut hold = Hold::spawn(&dc, "kill9", &[], script, &[("PROBE", &probe.path)]);
        probe.line("started").await;
        hold.event("renewed").await;
        dc.daemon().kill();

        let (_, term_us) = probe.line("term").await;
        let dead_us = probe.eof().await;
        let (lost, _) = hold.event("lease_lost").await;
        let deadlines = &lost["deadlines"];
        assert_eq!(*deadlines, hold.last_deadlines(), "the deadlines of the last grant");
        assert!(
            term_us >= ms(deadlines, "soft_terminate_at_ms") * 1_000,
            "the soft signal came before the soft deadline"
        );
        assert!(term_us < dead_us, "the soft signal came before the kill");
        assert_dead_by_hard_deadline("kill9", deadlines, dead_us);
        // Reported only once the command was dead and reaped.
        let command = hold.command_pid.and_then(Pid::from_raw).expect("started");
        assert_eq!(
            rustix::process::test_kill_process(command),
            Err(rustix::io::Errno::SRCH),
            "hold reported the lease lost while the command still existed"
        );
        assert_eq!(hold.exit_code().await, 124);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_a_renewal_answered_stale_token_kills_the_command_at_once() {
    let dc = LoneDc::start(lease(), &[]).await;
    bounded(async {
        let mut probe = Probe::new(dc.dir(), "stale");
        let script = r#"exec 3>"$PROBE"; trap 'echo term >&3' TERM; echo started >&3; while :; do sleep 1; done"#;
        let mut hold = Hold::spawn(&dc, "stale", &[], script, &[("PROBE", &probe.path)]);
        let (holding, _) = hold.event("holding").await;
        probe.line("started").await;

        // An operator releases the lease and another host takes the key:
        // the holder's next renewal meets a higher token.
        let reservation: ReservationId = holding["reservation"].as_str().unwrap().parse().unwrap();
        let token = homing_core::FencingToken::new(holding["token"].as_u64().unwrap());
        let release = Request::ForceRelease { reservation, token };
        let admin = dc.client(Role::Admin);
        assert_eq!(dc.ask(&admin, &release).await, Reply::Release(ReleaseReply::Released));
        let host = dc.client(Role::Host);
        let Reply::Acquire(AcquireReply::Acquired(Grant { token: taken, .. })) = dc.ask(&host, &acquire("stale", "10.9.9.9:2")).await
        else {
            panic!("the other host acquires");
        };
        assert_eq!(taken, token.next());

        let dead_us = probe.eof().await;
        let (lost, _) = hold.event("lease_lost").await;
        assert!(lost["why"].as_str().unwrap().contains("stale"), "{lost}");
        let soft_us = ms(&lost["deadlines"], "soft_terminate_at_ms") * 1_000;
        assert_eq!(probe.saw("term"), None, "killed at once, without the soft signal first");
        assert!(
            dead_us < soft_us,
            "dead {} ms after the soft deadline: not at once",
            (dead_us - soft_us) / 1_000
        );
        eprintln!("stale: dead {} ms before the soft deadline", (soft_us - dead_us) / 1_000);
        assert_eq!(hold.exit_code().await, 124);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_a_second_hold_waits_and_starts_only_after_the_first_command_exited_and_released() {
    let dc = LoneDc::start(steady_lease(), &[]).await;
    bounded(async {
        let order = dc.dir().join("order");
        let go = dc.dir().join("go");
        let made = Command::new("mkfifo").arg(&go).status().expect("mkfifo runs");
        assert!(made.success());
        let mut first_probe = Probe::new(dc.dir(), "first");
        let first_script = r#"echo "first start" >> "$ORDER"; exec 3>"$PROBE"; echo started >&3; read line < "$GO"; echo "first exit" >> "$ORDER""#;
        let env = [("ORDER", order.as_path()), ("GO", go.as_path()), ("PROBE", first_probe.path.as_path())];
        let mut first = Hold::spawn(&dc, "shared", &[], first_script, &env);
        let (first_holding, _) = first.event("holding").await;
        first_probe.line("started").await;

        let mut second_probe = Probe::new(dc.dir(), "second");
        let second_script = r#"echo "second start after $HOMING_PREVIOUS_ENDED" >> "$ORDER"; exec 3>"$PROBE"; echo started >&3"#;
        let env = [("ORDER", order.as_path()), ("PROBE", second_probe.path.as_path())];
        let mut second = Hold::spawn(&dc, "shared", &["--wait-ms", "20000"], second_script, &env);
        // The second acquire is parked at the DC while the first holds the key.
        let parked_by = tokio::time::Instant::now() + EVENT_WAIT;
        while dc.waiters().await == 0 {
            assert!(
                tokio::time::Instant::now() < parked_by,
                "the second hold never waited at the dc (did it start while the first command ran?)"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // Let the first command finish.
        tokio::task::spawn_blocking(move || std::fs::write(&go, "go\n"))
            .await
            .unwrap()
            .expect("the first command reads go");
        second_probe.line("started").await;
        assert_eq!(first.exit_code().await, 0);
        let (second_holding, _) = second.event("holding").await;
        assert_eq!(second.exit_code().await, 0);

        let lines = std::fs::read_to_string(&order).unwrap();
        assert_eq!(
            lines.lines().collect::<Vec<_>>(),
            ["first start", "first exit", "second start after released ok"],
            "the second command started only after the first exited and released"
        );
        assert_eq!(second_holding["previous"]["reservation"], first_holding["reservation"]);
        assert_eq!(second_holding["previous"]["token"], first_holding["token"]);
        assert_eq!(second_holding["previous"]["ended"], "released ok");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_a_failing_commands_outcome_is_seen_by_the_next_holder() {
    let dc = LoneDc::start(steady_lease(), &[]).await;
    bounded(async {
        let mut failing = Hold::spawn(&dc, "flaky", &[], "exit 3", &[]);
        let (holding, _) = failing.event("holding").await;
        let (released, _) = failing.event("released").await;
        assert_eq!(failing.exit_code().await, 3, "hold exits with the command's status");

        let mut probe = Probe::new(dc.dir(), "next");
        let script = r#"exec 3>"$PROBE"; echo "previous $HOMING_PREVIOUS_RESERVATION|$HOMING_PREVIOUS_TOKEN|$HOMING_PREVIOUS_ENDED" >&3"#;
        let mut next = Hold::spawn(&dc, "flaky", &[], script, &[("PROBE", &probe.path)]);
        let (line, _) = probe.line("previous").await;
        let expected = format!(
            "previous {}|{}|released failed: exit status 3",
            holding["reservation"].as_str().unwrap(),
            holding["token"]
        );
        assert_eq!(line, expected);
        let (next_holding, _) = next.event("holding").await;
        assert_eq!(next_holding["previous"]["ended"], "released failed: exit status 3");
        assert_eq!(next.exit_code().await, 0);
        assert_eq!(released["outcome"], "failed: exit status 3");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_sigint_is_forwarded_and_the_key_released() {
    let dc = LoneDc::start(steady_lease(), &[]).await;
    bounded(async {
        let mut probe = Probe::new(dc.dir(), "sigint");
        let script = r#"exec 3>"$PROBE"; echo started >&3; exec sleep 600"#;
        let mut hold = Hold::spawn(&dc, "interrupted", &[], script, &[("PROBE", &probe.path)]);
        let (holding, _) = hold.event("holding").await;
        probe.line("started").await;

        rustix::process::kill_process(hold.pid(), Signal::INT).expect("SIGINT to hold");
        probe.eof().await;
        let (released, _) = hold.event("released").await;
        assert_eq!(released["outcome"], "failed: killed by SIGINT");
        assert_eq!(
            hold.exit_code().await,
            130,
            "the command's status: killed by SIGINT"
        );

        // Released, not left to expire: another host takes the key at once
        // and learns how the run ended.
        let host = dc.client(Role::Host);
        match dc.ask(&host, &acquire("interrupted", "10.9.9.9:3")).await {
            Reply::Acquire(AcquireReply::Acquired(Grant {
                previous: Some(previous),
                ..
            })) => {
                assert_eq!(previous.reservation.to_string(), holding["reservation"]);
                assert!(
                    matches!(
                        previous.ended,
                        ReleaseCause::Released(RunOutcome::Failed { .. })
                    ),
                    "{}",
                    previous.ended
                );
            }
            other => panic!("the key is still held after SIGINT: {other:?}"),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_sigterm_to_hold_a_command_ignoring_it_is_killed_after_the_grace_then_released() {
    let dc = LoneDc::start(steady_lease(), &[]).await;
    bounded(async {
        let mut probe = Probe::new(dc.dir(), "graceless");
        let script = r#"exec 3>"$PROBE"; trap '' TERM; echo started >&3; exec sleep 600"#;
        let flags = ["--grace-ms", "300"];
        let mut hold = Hold::spawn(&dc, "graceless", &flags, script, &[("PROBE", &probe.path)]);
        hold.event("holding").await;
        probe.line("started").await;

        let signalled_us = wall_us();
        rustix::process::kill_process(hold.pid(), Signal::TERM).expect("SIGTERM to hold");
        let (forwarded, _) = hold.event("signal").await;
        assert_eq!(forwarded["signal"], "SIGTERM");
        let dead_us = probe.eof().await;
        let waited_ms = (dead_us - signalled_us) / 1_000;
        assert!(
            waited_ms >= 300,
            "killed {waited_ms} ms after SIGTERM, before the grace ran out"
        );
        // Well before the lease's own deadlines would have stopped it: the
        // lease was renewed all along.
        assert!(waited_ms < 1_000, "killed {waited_ms} ms after SIGTERM");
        let (killed, _) = hold.event("hard_terminate").await;
        assert!(
            killed["why"].as_str().unwrap().contains("grace"),
            "{killed}"
        );
        let (released, _) = hold.event("released").await;
        assert_eq!(released["outcome"], "failed: killed by SIGKILL");
        assert_eq!(hold.exit_code().await, 137);
        eprintln!("grace: killed {waited_ms} ms after SIGTERM (--grace-ms 300)");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_a_command_that_ignores_sigterm_is_dead_by_the_hard_deadline() {
    let dc = LoneDc::start(lease(), &[]).await;
    bounded(async {
        let mut probe = Probe::new(dc.dir(), "stubborn");
        let script = r#"exec 3>"$PROBE"; trap '' TERM; echo started >&3; exec sleep 600"#;
        let mut hold = Hold::spawn(&dc, "stubborn", &[], script, &[("PROBE", &probe.path)]);
        hold.event("holding").await;
        probe.line("started").await;

        // Drained: renewals are refused; the deadlines run out.
        let admin = dc.client(Role::Admin);
        let drain = Request::Drain {
            key: key("stubborn"),
        };
        assert_eq!(dc.ask(&admin, &drain).await, Reply::Drained);
        let (soft, _) = hold.event("soft_terminate").await;
        assert_eq!(soft["signal"], "SIGTERM");
        let dead_us = probe.eof().await;
        let (lost, _) = hold.event("lease_lost").await;
        assert_eq!(lost["deadlines"], hold.last_deadlines());
        assert_eq!(lost["status"], "killed by SIGKILL");
        assert_dead_by_hard_deadline("ignores_sigterm", &lost["deadlines"], dead_us);
        assert_eq!(hold.exit_code().await, 124);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_a_command_that_forks_grandchildren_the_whole_group_is_gone_by_the_hard_deadline() {
    let dc = LoneDc::start(lease(), &[]).await;
    bounded(async {
        let mut probe = Probe::new(dc.dir(), "forks");
        // Two grandchildren, all ignoring SIGTERM, all holding the probe.
        let script = r#"exec 3>"$PROBE"; trap '' TERM; sleep 600 & echo "pid $!" >&3; sleep 600 & echo "pid $!" >&3; echo started >&3; wait"#;
        let mut hold = Hold::spawn(&dc, "forks", &[], script, &[("PROBE", &probe.path)]);
        hold.event("holding").await;
        probe.line("started").await;
        let grandchildren: Vec<Pid> = probe
            .lines
            .iter()
            .filter_map(|(line, _)| line.strip_prefix("pid ")?.parse().ok())
            .filter_map(Pid::from_raw)
            .collect();
        assert_eq!(grandchildren.len(), 2, "{:?}", probe.lines);

        let admin = dc.client(Role::Admin);
        let drain = Request::Drain { key: key("forks") };
        assert_eq!(dc.ask(&admin, &drain).await, Reply::Drained);
        let dead_us = probe.eof().await;
        let (lost, _) = hold.event("lease_lost").await;
        // By the time hold says the lease is lost, every grandchild is gone
        // (reaped, not a zombie).
        for pid in &grandchildren {
            assert_eq!(
                rustix::process::test_kill_process(*pid),
                Err(rustix::io::Errno::SRCH),
                "grandchild {pid:?} outlived the lease"
            );
        }
        assert_dead_by_hard_deadline("grandchildren", &lost["deadlines"], dead_us);
        assert_eq!(hold.exit_code().await, 124);
    })
    .await;
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hold_killed_by_sigkill_its_watchdog_kills_the_command_group_at_once() {
    // A 10 s lease: the hard deadline is far, so what kills the command is
    // the watchdog, not the deadline.
    let dc = LoneDc::start(steady_lease(), &[]).await;
    bounded(async {
        let mut probe = Probe::new(dc.dir(), "orphaned");
        // The command and a grandchild, both holding the probe.
        let script = r#"exec 3>"$PROBE"; echo "pid $$" >&3; sleep 600 & echo "pid $!" >&3; echo started >&3; wait"#;
        let mut hold = Hold::spawn(&dc, "orphaned", &[], script, &[("PROBE", &probe.path)]);
        hold.event("holding").await;
        hold.event("started").await;
        probe.line("started").await;
        let command: Vec<Pid> = probe
            .lines
            .iter()
            .filter_map(|(line, _)| line.strip_prefix("pid ")?.parse().ok())
            .filter_map(Pid::from_raw)
            .collect();
        assert_eq!(command.len(), 2, "{:?}", probe.lines);
        let mut cleanup = KillGroupOnDrop(Some(command[0]));
        let watchdog = hold.watchdog_pid.expect("`started` names the watchdog");
        // While hold lives, these pids are its children's and grandchild's.
        let deaths = [
            Death::of("the command", command[0]),
            Death::of("the command's child", command[1]),
            Death::of("the watchdog", watchdog),
        ];
        let deadlines = hold.last_deadlines();

        // hold's whole process group, as a supervisor kills it: the watchdog
        // is in a group of its own and survives to act.
        let killed_us = wall_us();
        rustix::process::kill_process_group(hold.pid(), Signal::KILL)
            .expect("SIGKILL to hold's group");
        let status = tokio::task::block_in_place(|| hold.process.wait()).expect("hold is waited");
        assert_eq!(status.code(), None, "hold was killed, it did not exit: {status}");
        let dead_us = probe.eof().await;
        for death in &deaths {
            // The watchdog's work is done once the group is: it exits too.
            death.wait();
        }
        cleanup.disarm();
        let hard_us = ms(&deadlines, "hard_terminate_at_ms") * 1_000;
        assert!(
            dead_us < hard_us,
            "the command's group was killed by its deadline, not at once"
        );
        eprintln!(
            "watchdog: the command's group was dead {:.1} ms after hold was killed ({:.1} ms before its hard deadline)",
            (dead_us - killed_us) as f64 / 1_000.0,
            (hard_us - dead_us) as f64 / 1_000.0
        );
    })
    .await;
}
