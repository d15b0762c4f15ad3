//! `homing hold KEY -- COMMAND`: any program as a homing actor. `hold`
//! acquires KEY from the host's own DC with a [`HostAgent`], starts COMMAND
//! only once the lease is held, renews while it runs, stops its whole
//! process group by the lease's deadlines, and releases the lease with how
//! the run ended.
//!
//! ```text
//! acquire ─ Unavailable 69 / Refused, TagMismatch 77 / HeldElsewhere 75 ─► exit, COMMAND never runs
//!    │ Acquired
//!    ▼
//! start the watchdog (`watchdog.rs`), spawn COMMAND (own process group, HOMING_* env) ─ fails ─► release failed, exit 126/127
//!    │
//!    ├─ soft deadline without a renewal ─────► --soft-signal to the group
//!    ├─ hard deadline - --kill-lead-ms ──────► SIGKILL to the group ┐ lease lost:
//!    ├─ renewal answered StaleToken/Expired ─► SIGKILL to the group ┘ exit 124 once the group is gone
//!    ├─ SIGINT/SIGTERM to hold ──────────────► forwarded; SIGKILL after --grace-ms or a second one
//!    ├─ hold itself dies (SIGKILL) ──────────► its watchdog SIGKILLs the group at once
//!    ▼
//! COMMAND exits ─► leftovers in its group killed, group reaped ─► release with the outcome ─► exit
//! ```

mod group;
mod lease;
mod signal;
mod watchdog;

use homing_core::AcquireReply;
use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use homing_client::host_agent::AGENT_REQUEST_TIMEOUT_MS_DEFAULT;
use homing_client::{
    Actor, AgentError, AgentState, HostAgent, HostAgentConfig, QuicTransport, SystemClock,
};
use homing_core::{
    ActorId, Deadlines, ErrorKind, FailureReason, Identity, KeyConfig, KeyName, Namespace, Role,
    RunOutcome, Tag,
};
use homing_net::{Client, ClientLimits, Peer};
use rustix::process::Signal;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use self::group::{ChildStatus, Group, GroupEvent};
use self::lease::{LeaseView, ObservedTransport};
pub use self::watchdog::SUBCOMMAND as WATCHDOG_SUBCOMMAND;
use self::watchdog::Watchdog;
use crate::reach;

/// Default of `--kill-lead-ms`: how long before the hard deadline the group
/// is sent SIGKILL, so it is dead by the deadline even when `hold` wakes
/// late or the kernel takes a while to tear the processes down.
pub const KILL_LEAD_MS_DEFAULT: u64 = 100;
/// Default of `--grace-ms`: how long COMMAND may take to exit after a
/// forwarded SIGINT/SIGTERM before its group is killed.
pub const GRACE_MS_DEFAULT: u64 = 10_000;

/// Run COMMAND as the actor of KEY, started only once this host holds the
/// key's lease and stopped by the lease's deadlines.
///
/// Acquires KEY from the host's own DC (the first --dc; certificate
/// host-<dc> from --certs), waiting up to --wait-ms if a live actor holds it.
/// Only then starts COMMAND, in a process group of its own, with HOMING_KEY,
/// HOMING_NAMESPACE, HOMING_RESERVATION, HOMING_TOKEN (put it on fenced
/// writes), HOMING_DC, HOMING_ACTOR and, after an earlier run,
/// HOMING_PREVIOUS_{RESERVATION,TOKEN,ENDED} in its environment.
///
/// While COMMAND runs the lease is renewed. Without a renewal by the soft
/// deadline the group gets --soft-signal; --kill-lead-ms before the hard
/// deadline, or at once when the DC answers that the token is stale or the
/// lease expired, it gets SIGKILL, and hold waits for the whole group before
/// it reports the lease lost (exit 124). When COMMAND exits, whatever it left
/// in its group is killed, the lease is released with the outcome (exit 0:
/// ok; anything else: failed, with the status) for the next holder, and hold
/// exits with COMMAND's status. SIGINT or SIGTERM to hold is forwarded to the
/// group; after --grace-ms (or a second signal) the group is killed; then
/// the lease is released. If hold itself dies (SIGKILL, the OOM killer), a
/// watchdog it started before COMMAND, in a process group of its own,
/// SIGKILLs COMMAND's group at once.
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct HoldArgs {
    /// The key to hold.
    key: String,
    /// The key's namespace (default: the empty namespace).
    #[arg(long, default_value = "")]
    namespace: String,
    /// Hold the key only under this tag (a live actor under another: exit 77).
    #[arg(long)]
    tag: Option<String>,
    /// The actor routers are sent to, e.g. the address COMMAND serves on
    /// (default: this host's name).
    #[arg(long)]
    actor: Option<String>,
    /// If a live actor holds the key, wait up to this many milliseconds for
    /// it to release or expire (max 300000); 0: exit 75 at once.
    #[arg(long, default_value_t = 0)]
    wait_ms: u32,
    /// Directory with ca.pem and host-<dc>.pem/.key, as written by `homing certs`.
    #[arg(long, env = "HOMING_CERTS", default_value = "homing-certs")]
    certs: PathBuf,
    /// PEM file of the CA's certificate revocation list (`homing certs --revoke`): a DC whose certificate it lists is not connected to.
    #[arg(long, env = "HOMING_CRL")]
    crl: Option<PathBuf>,
    /// How often the certificate, key, CA and revocation-list files are checked for changes, in milliseconds; changed files are used for new connections (open ones go on). 0: never.
    #[arg(long, env = "HOMING_TLS_RELOAD_MS", default_value_t = homing_net::reload::TLS_RELOAD_MS_DEFAULT)]
    tls_reload_ms: u64,
    /// The host's own DC as NAME=ADDR (the first, if repeated; env: HOMING_DCS). The same DC given again names its other homingd, tried in turn when one does not answer.
    #[arg(long = "dc", env = "HOMING_DCS", value_delimiter = ',')]
    dcs: Vec<String>,
    /// Signal sent to COMMAND's group at the soft deadline (TERM, INT, HUP, USR1, …).
    #[arg(long, default_value = "TERM", value_parser = signal::parse)]
    soft_signal: Signal,
    /// After forwarding SIGINT/SIGTERM, how long COMMAND may take to exit
    /// before its group is killed, in milliseconds (the hard deadline still wins).
    #[arg(long, default_value_t = GRACE_MS_DEFAULT)]
    grace_ms: u64,
    /// Send SIGKILL this many milliseconds before the hard deadline, so the
    /// group is dead by it even if this host is slow.
    #[arg(long, default_value_t = KILL_LEAD_MS_DEFAULT)]
    kill_lead_ms: u64,
    /// Timeout of one acquire, renewal or release, in milliseconds.
    #[arg(long, default_value_t = AGENT_REQUEST_TIMEOUT_MS_DEFAULT)]
    request_timeout_ms: u64,
    /// Print one JSON object per line on stdout: `holding` (key, reservation,
    /// token, deadlines) before COMMAND starts, then `started`, `renewed`,
    /// `soft_terminate`, `hard_terminate`, `lease_lost`, `released`, `exit`.
    #[arg(long)]
    json: bool,
    /// The program to run and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<OsString>,
}

const AFTER_HELP: &str = "\
Exit codes:
  0-255  COMMAND's status (on its own, or after a forwarded SIGINT/SIGTERM); signal N: 128+N
  2      bad flags, key or certificates
  69     the DC could not be reached; COMMAND never ran
  75     a live actor holds the key elsewhere (printed); COMMAND never ran
  77     the DC refused: tag mismatch, a limit, not a host of that DC; COMMAND never ran
  124    the lease was lost while COMMAND ran; its whole group was stopped and is gone
  126    COMMAND could not be executed (127: not found); the lease is released as failed
  130    SIGINT (143: SIGTERM) before the lease was held; COMMAND never ran

Example:
  export HOMING_CERTS=/etc/homing/certs HOMING_DCS=iad=10.0.0.1:7400
  homing hold room-42 --namespace games --actor 10.0.3.9:9000 --wait-ms 30000 -- \\
      ./room-server --listen 10.0.3.9:9000     # its writes carry $HOMING_TOKEN";

/// How a `hold` ended: its exit code and a word for supervisors (`cause`
/// in the `--json` exit line). Besides these, COMMAND's own status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Exit {
    code: i32,
    cause: &'static str,
}

impl Exit {
    /// Bad flags, key or certificates; nothing was acquired.
    const USAGE: Exit = Exit::new(2, "usage");
    /// The DC (or a DC it needed) could not be reached; COMMAND never ran.
    const UNAVAILABLE: Exit = Exit::new(69, "unavailable");
    /// A live actor holds the key (after `--wait-ms`); COMMAND never ran.
    const HELD_ELSEWHERE: Exit = Exit::new(75, "held_elsewhere");
    /// The DC refused (a limit, not a host of that DC); COMMAND never ran.
    const REFUSED: Exit = Exit::new(77, "refused");
    /// A live actor holds the key under another tag; COMMAND never ran.
    const TAG_MISMATCH: Exit = Exit::new(77, "tag_mismatch");
    /// The lease was lost while COMMAND ran; its whole group was stopped and is gone.
    const LEASE_LOST: Exit = Exit::new(124, "lease_lost");
    /// COMMAND could not be executed; the lease was released as failed.
    const CANNOT_EXECUTE: Exit = Exit::new(126, "cannot_execute");
    /// COMMAND was not found; the lease was released as failed.
    const NOT_FOUND: Exit = Exit::new(127, "not_found");

    const fn new(code: i32, cause: &'static str) -> Exit {
        Exit { code, cause }
    }

    /// COMMAND ended with `status`: `hold` exits with it.
    fn child(status: ChildStatus) -> Exit {
        Exit::new(status.shell_code(), "child")
    }

    /// `signal` came before the lease was held: the shell's 128 + N.
    fn interrupted(signal: Signal) -> Exit {
        Exit::new(128 + signal.as_raw(), "interrupted")
    }
}

/// Runs `homing hold`'s watchdog (`homing hold-watchdog`, which `hold`
/// starts); returns the process's exit code.
pub fn watchdog_main() -> i32 {
    watchdog::run()
}

/// Runs `homing hold`; returns the process's exit code.
pub async fn run(args: HoldArgs) -> i32 {
    let report = Report { json: args.json };
    let exit = match hold(args, &report).await {
        Ok(exit) => exit,
        Err(error) => {
            report.say(&format!("error: {error:#}"));
            report.event(json!({ "event": "error", "error": format!("{error:#}") }));
            Exit::USAGE
        }
    };
    report.event(json!({ "event": "exit", "code": exit.code, "cause": exit.cause }));
    exit.code
}

/// What the command line asks for, validated.
struct Plan {
    /// A QUIC client presenting the host certificate of the own DC.
    client: Client,
    config: HostAgentConfig,
    command: Vec<OsString>,
    soft_signal: Signal,
    grace: Duration,
    kill_lead: Duration,
}

impl Plan {
    fn new(args: HoldArgs) -> anyhow::Result<Plan> {
        if args.wait_ms > homing_core::wire::WAIT_MS_MAX {
            anyhow::bail!(
                "--wait-ms {} is over the limit of {} ms",
                args.wait_ms,
                homing_core::wire::WAIT_MS_MAX
            );
        }
        let table = reach::parse_dc_table(&args.dcs)?;
        let (dc, addr) = table.first().cloned().context("empty --dc table")?;
        // The same DC listed again: its other homingd.
        let alternates: Vec<std::net::SocketAddr> = table[1..]
            .iter()
            .filter(|(other, _)| *other == dc)
            .map(|(_, addr)| *addr)
            .collect();
        let key = KeyConfig {
            name: Some(KeyName::new(args.key.as_str()).context("key")?),
            namespace: Namespace::new(args.namespace.as_str()).context("--namespace")?,
            tag: args.tag.map(Tag::new).transpose().context("--tag")?,
        };
        let actor = match args.actor {
            Some(actor) => ActorId::new(actor).context("--actor")?,
            None => ActorId::new(host_name()).context("this host's name as the actor id")?,
        };
        let identity = Identity::new(Role::Host, Some(dc.clone()))?;
        let files = homing_net::pki::identity_files(&args.certs, &identity, args.crl.clone());
        let tls = reach::load_files(&files, &args.certs, &identity)?;
        let client = Client::new(&tls, ClientLimits::default())?;
        tokio::spawn(homing_net::reload::watch_files(
            files,
            Duration::from_millis(args.tls_reload_ms),
            vec![Box::new(client.clone())],
            std::future::pending(),
        ));
        let client = reach::closed_at_exit(client);
        let mut config = HostAgentConfig::new(Peer { addr, dc }, key, actor);
        config.alternates = alternates;
        config.wait_ms = args.wait_ms;
        config.request_timeout_ms = args.request_timeout_ms;
        Ok(Plan {
            client,
            config,
            command: args.command,
            soft_signal: args.soft_signal,
            grace: Duration::from_millis(args.grace_ms),
            kill_lead: Duration::from_millis(args.kill_lead_ms),
        })
    }
}

fn host_name() -> String {
    rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .into_owned()
}

/// Acquires, then runs COMMAND under the lease.
async fn hold(args: HoldArgs, report: &Report) -> anyhow::Result<Exit> {
    let plan = Plan::new(args)?;
    // Before anything runs: a signal now must reach `hold`, not kill it.
    let mut interrupts = Interrupts::new().context("installing signal handlers")?;
    group::become_subreaper().context("becoming the subreaper of COMMAND's group")?;
    let actor = plan.config.actor.clone();
    let quic = QuicTransport::new(plan.client, plan.config.dc.clone(), &plan.config.alternates);
    let (transport, lease) = ObservedTransport::new(quic);
    let (terminate, calls) = mpsc::unbounded_channel();
    let start = HostAgent::start_with(
        Arc::new(transport),
        Arc::new(SystemClock),
        plan.config,
        Arc::new(Terminator(terminate)),
    );
    let started = tokio::select! {
        started = start => started,
        signal = interrupts.next() => {
            report.say(&format!("{} before the lease was held: COMMAND not started", signal::name(signal.as_raw())));
            return Ok(Exit::interrupted(signal));
        }
    };
    let agent = match started {
        Ok(AcquireReply::Acquired(agent)) => agent,
        Ok(AcquireReply::HeldElsewhere(homing_core::Holder {
            key,
            reservation,
            actor,
            token,
        })) => {
            report.say(&format!(
                "{key} is held elsewhere: dc {}, reservation {reservation}, actor {actor}, token {token}",
                reservation.dc()
            ));
            report.event(json!({
                "event": "held_elsewhere", "key": key.name.as_str(),
                "namespace": key.namespace.as_str(), "dc": reservation.dc().as_str(),
                "reservation": reservation.to_string(), "actor": actor.as_str(), "token": token.get(),
            }));
            return Ok(Exit::HELD_ELSEWHERE);
        }
        Ok(AcquireReply::TagMismatch { existing }) => {
            let existing = existing.as_ref().map_or("no tag", |t| t.as_str());
            report.say(&format!(
                "refused: a live actor holds the key under {existing}"
            ));
            return Ok(Exit::TAG_MISMATCH);
        }
        Err(error) => {
            report.say(&format!("could not acquire: {error}"));
            return Ok(acquire_failed(&error));
        }
    };
    let holder = Holder {
        agent,
        actor,
        lease,
        calls,
        interrupts,
        report,
        soft_signal: plan.soft_signal,
        grace: plan.grace,
        kill_lead: plan.kill_lead,
    };
    Ok(holder.run(&plan.command).await)
}

/// The exit for an acquire that failed: unreachable, or refused.
fn acquire_failed(error: &AgentError) -> Exit {
    match error {
        AgentError::Unavailable { .. } | AgentError::Unexpected { .. } => Exit::UNAVAILABLE,
        AgentError::Refused { error, .. } => match error.kind {
            ErrorKind::Unavailable { .. } | ErrorKind::Internal | ErrorKind::Inconsistent => {
                Exit::UNAVAILABLE
            }
            _ => Exit::REFUSED,
        },
        AgentError::Config(_) => Exit::USAGE,
        AgentError::StaleToken { .. } | AgentError::NotHolder => Exit::REFUSED,
    }
}

/// Where `hold` says what happens: a line on stderr for people, and with
/// `--json` one JSON object per line on stdout for supervisors.
struct Report {
    json: bool,
}

impl Report {
    // Write errors are ignored, not panicked on as by `println!`: a reader
    // that went away must not take `hold` down while COMMAND runs.
    fn say(&self, text: &str) {
        let _ = writeln!(std::io::stderr(), "homing hold: {text}");
    }

    fn event(&self, event: Value) {
        if self.json {
            let _ = writeln!(std::io::stdout(), "{event}");
        }
    }
}

fn deadlines_json(deadlines: &Deadlines) -> Value {
    json!({
        "renew_at_ms": deadlines.renew_at.as_ms(),
        "soft_terminate_at_ms": deadlines.soft_terminate_at.as_ms(),
        "hard_terminate_at_ms": deadlines.hard_terminate_at.as_ms(),
    })
}

/// SIGINT and SIGTERM to `hold`, as a stream.
struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    /// Never read: installing a SIGCHLD handler undoes an ignored SIGCHLD
    /// inherited from whoever started `hold`, under which the kernel would
    /// reap COMMAND itself and its exit status would be lost.
    _child: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn new() -> std::io::Result<Interrupts> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Interrupts {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            _child: signal(SignalKind::child())?,
        })
    }

    async fn next(&mut self) -> Signal {
        tokio::select! {
            Some(()) = self.int.recv() => Signal::INT,
            Some(()) = self.term.recv() => Signal::TERM,
            else => std::future::pending().await,
        }
    }
}

/// What the agent tells the actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Terminate {
    Soft,
    Hard,
}

/// The [`Actor`] the agent calls: passes its calls to the supervising task.
/// Unbounded, yet at most two messages: the agent calls each at most once.
struct Terminator(mpsc::UnboundedSender<Terminate>);

impl Actor for Terminator {
    fn on_soft_terminate(&self) {
        let _ = self.0.send(Terminate::Soft);
    }

    fn on_hard_terminate(&self) {
        let _ = self.0.send(Terminate::Hard);
    }
}

/// How COMMAND's run ended.
struct Ended {
    status: ChildStatus,
    /// Why the lease was lost while it ran, if it was.
    lost: Option<String>,
}

/// The lease is held: runs COMMAND under it.
struct Holder<'a> {
    agent: HostAgent,
    /// The actor id the lease was acquired for.
    actor: ActorId,
    lease: watch::Receiver<Option<LeaseView>>,
    calls: mpsc::UnboundedReceiver<Terminate>,
    interrupts: Interrupts,
    report: &'a Report,
    soft_signal: Signal,
    grace: Duration,
    kill_lead: Duration,
}

impl Holder<'_> {
    async fn run(mut self, command: &[OsString]) -> Exit {
        let view = self.view();
        self.report_holding(&view.deadlines);
        if self.agent.state() != AgentState::Holding {
            let why = "the lease ended before COMMAND started".to_string();
            return self.finish(ChildStatus::Unknown, Some(why)).await;
        }
        // Before COMMAND: without a watchdog, COMMAND does not run.
        let watchdog = match Watchdog::start() {
            Ok(watchdog) => watchdog,
            Err(error) => {
                let error = std::io::Error::other(format!("the watchdog did not start: {error}"));
                return self.not_started(command, &error).await;
            }
        };
        let watchdog_pid = watchdog.pid();
        // The group's reaper stands the watchdog down once the group is killed.
        let group = match Group::spawn(command, &self.environment(), watchdog) {
            Ok(group) => group,
            Err(error) => return self.not_started(command, &error).await,
        };
        self.report
            .say(&format!("started {:?} as pid {}", command, group.pid()));
        self.report
            .event(json!({ "event": "started", "pid": group.pid(), "watchdog": watchdog_pid }));
        let ended = self.supervise(group).await;
        self.finish(ended.status, ended.lost).await
    }

    /// The lease as last granted. Invariant: the agent returned `Holding`
    /// only after the transport passed it an `Acquired`, which it noted.
    fn view(&self) -> LeaseView {
        self.lease
            .borrow()
            .clone()
            .expect("the acquire's grant was observed")
    }

    fn report_holding(&self, deadlines: &Deadlines) {
        let agent = &self.agent;
        let key = agent.key();
        let previous = agent.previous().map(|p| {
            json!({ "reservation": p.reservation.to_string(), "token": p.token.get(), "ended": p.ended.to_string() })
        });
        self.report.say(&format!(
            "holding {key}: reservation {}, token {}",
            agent.reservation(),
            agent.token()
        ));
        self.report.event(json!({
            "event": "holding", "key": key.name.as_str(), "namespace": key.namespace.as_str(),
            "dc": agent.reservation().dc().as_str(), "reservation": agent.reservation().to_string(),
            "token": agent.token().get(), "actor": self.actor.as_str(),
            "deadlines": deadlines_json(deadlines), "previous": previous,
        }));
    }

    /// COMMAND's environment: what it holds, and the run it follows.
    /// Variables of an earlier run are removed when there was none.
    fn environment(&self) -> Vec<(&'static str, Option<String>)> {
        let agent = &self.agent;
        let key = agent.key();
        let previous = agent.previous();
        vec![
            ("HOMING_KEY", Some(key.name.as_str().to_string())),
            ("HOMING_NAMESPACE", Some(key.namespace.as_str().to_string())),
            ("HOMING_RESERVATION", Some(agent.reservation().to_string())),
            ("HOMING_TOKEN", Some(agent.token().get().to_string())),
            ("HOMING_DC", Some(agent.reservation().dc().to_string())),
            ("HOMING_ACTOR", Some(self.actor.as_str().to_string())),
            (
                "HOMING_PREVIOUS_RESERVATION",
                previous.map(|p| p.reservation.to_string()),
            ),
            (
                "HOMING_PREVIOUS_TOKEN",
                previous.map(|p| p.token.get().to_string()),
            ),
            (
                "HOMING_PREVIOUS_ENDED",
                previous.map(|p| p.ended.to_string()),
            ),
        ]
    }
}

impl Holder<'_> {
    /// Waits until COMMAND's whole group is gone, signalling it on the
    /// lease's deadlines and on SIGINT/SIGTERM to `hold`.
    async fn supervise(&mut self, mut group: Group) -> Ended {
        let mut status = ChildStatus::Unknown;
        let mut lost: Option<String> = None;
        let mut killed = false;
        let mut grace_until: Option<Instant> = None;
        let mut news = News::default();
        if let Some(error) = group.unwatched() {
            // Nothing would stop the group if `hold` died: it was killed.
            killed = true;
            self.kill(&group, &format!("the watchdog is gone ({error})"));
        }
        loop {
            let kill_at = self.kill_at();
            tokio::select! {
                event = group.next() => match event {
                    Some(GroupEvent::LeaderExited(ended)) => {
                        status = ended;
                        self.report.event(json!({ "event": "child_exited", "status": ended.to_string() }));
                    }
                    Some(GroupEvent::Gone) | None => break,
                },
                Some(call) = self.calls.recv() => {
                    let view = self.view();
                    match call {
                        Terminate::Soft => {
                            let why = match view.draining {
                                true => "the key was drained: renewals are refused",
                                false => "no renewal by the soft deadline",
                            };
                            lost.get_or_insert_with(|| why.to_string());
                            group.signal(self.soft_signal);
                            let signal = signal::name(self.soft_signal.as_raw());
                            self.report.say(&format!("{why}: sent {signal} to COMMAND's group"));
                            self.report.event(json!({ "event": "soft_terminate", "signal": signal, "why": why }));
                        }
                        Terminate::Hard => {
                            let why = view.lost.unwrap_or_else(|| "no renewal by the hard deadline".into());
                            let why = lost.get_or_insert(why).clone();
                            if !std::mem::replace(&mut killed, true) {
                                self.kill(&group, &why);
                            }
                        }
                    }
                }
                () = tokio::time::sleep_until(kill_at), if !killed => {
                    killed = true;
                    let why = lost.get_or_insert_with(|| "no renewal by the hard deadline".into()).clone();
                    self.kill(&group, &why);
                }
                Ok(()) = self.lease.changed() => news.report(&self.view(), self.report),
                signal = self.interrupts.next() => {
                    let name = signal::name(signal.as_raw());
                    if grace_until.is_none() {
                        grace_until = Some(Instant::now() + self.grace);
                        group.signal(signal);
                        self.report.say(&format!("{name}: forwarded to COMMAND's group"));
                        self.report.event(json!({ "event": "signal", "signal": name }));
                    } else if !std::mem::replace(&mut killed, true) {
                        self.kill(&group, &format!("a second {name}"));
                    }
                }
                () = sleep_until_some(grace_until), if !killed => {
                    killed = true;
                    self.kill(&group, "COMMAND did not exit within --grace-ms");
                }
            }
        }
        Ended { status, lost }
    }

    /// When the group is killed without a renewal: the hard deadline less the lead.
    fn kill_at(&self) -> Instant {
        let hard_at = self.view().hard_at;
        hard_at.checked_sub(self.kill_lead).unwrap_or(hard_at)
    }

    fn kill(&self, group: &Group, why: &str) {
        group.signal(Signal::KILL);
        self.report
            .say(&format!("{why}: sent SIGKILL to COMMAND's group"));
        self.report
            .event(json!({ "event": "hard_terminate", "signal": "SIGKILL", "why": why }));
    }

    /// COMMAND's group is gone: report a lost lease, release with the
    /// outcome, and say how `hold` exits.
    async fn finish(self, status: ChildStatus, lost: Option<String>) -> Exit {
        let exit = match &lost {
            Some(why) => {
                let deadlines = self.view().deadlines;
                self.report.say(&format!(
                    "lease lost ({why}); COMMAND's group was stopped ({status}) and is gone"
                ));
                self.report.event(json!({
                    "event": "lease_lost", "why": why, "status": status.to_string(),
                    "deadlines": deadlines_json(&deadlines),
                }));
                Exit::LEASE_LOST
            }
            None => Exit::child(status),
        };
        let outcome = match (status.success(), &lost) {
            (true, _) => RunOutcome::Ok,
            (false, None) => failed(status.to_string()),
            (false, Some(why)) => failed(format!("{status}; stopped: {why}")),
        };
        self.release(outcome).await;
        exit
    }

    /// COMMAND could not be started: release as failed.
    async fn not_started(self, command: &[OsString], error: &std::io::Error) -> Exit {
        self.report
            .say(&format!("could not start {command:?}: {error}"));
        let exit = match error.kind() {
            std::io::ErrorKind::NotFound => Exit::NOT_FOUND,
            _ => Exit::CANNOT_EXECUTE,
        };
        self.release(failed(format!("could not start COMMAND: {error}")))
            .await;
        exit
    }

    /// Releases the lease with `outcome` for the next holder.
    async fn release(self, outcome: RunOutcome) {
        let text = match &outcome {
            RunOutcome::Ok => "ok".to_string(),
            RunOutcome::Failed { reason } => format!("failed: {reason}"),
        };
        match self.agent.stop_with(outcome).await {
            Ok(()) => {
                self.report.say(&format!("released ({text})"));
                self.report
                    .event(json!({ "event": "released", "outcome": text }));
            }
            Err(error) => {
                self.report.say(&format!(
                    "release failed: {error} (the lease expires at the dc on its own)"
                ));
                self.report.event(
                    json!({ "event": "release_failed", "outcome": text, "error": error.to_string() }),
                );
            }
        }
    }
}

/// A failed run's outcome. The reason is `hold`'s own text: cut to the
/// limit, so the release never fails on it.
fn failed(mut reason: String) -> RunOutcome {
    let mut cut = homing_core::record::FAILURE_REASON_BYTES_MAX.min(reason.len());
    while !reason.is_char_boundary(cut) {
        cut -= 1;
    }
    reason.truncate(cut);
    let reason = FailureReason::new(reason)
        .or_else(|_| FailureReason::new("failed"))
        .expect("\"failed\" is a valid failure reason");
    RunOutcome::Failed { reason }
}

/// What the supervisor last said about renewals, so each change is said once.
#[derive(Debug, Default)]
struct News {
    renewals: u64,
    draining: bool,
}

impl News {
    fn report(&mut self, view: &LeaseView, report: &Report) {
        if view.renewals > self.renewals {
            self.renewals = view.renewals;
            report
                .event(json!({ "event": "renewed", "deadlines": deadlines_json(&view.deadlines) }));
        }
        if view.draining && !self.draining {
            self.draining = true;
            report
                .say("the key was drained: no more renewals; COMMAND is stopped by the deadlines");
            report.event(json!({ "event": "draining" }));
        }
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
