//! `homing session hold`: a host that holds many keys under one host
//! session ([`SessionHost`]): one renewal a third of the ttl for all of
//! them. It runs no actors (each key's "actor" is this host's name or
//! `--actor`): it shows what a host with a session sees, and is what the
//! tests kill to see a session's keys taken over.
//!
//! ```text
//! open the session ─ refused (deployment version, not a host) ─► exit 77
//!    │               unreachable ─► exit 69
//!    ▼
//! acquire each key under it ─ held elsewhere ─► said, skipped
//!    ▼
//! "holding N keys under session S" ─► renew until SIGINT/SIGTERM ─► close, exit 0
//!    ├─ a key drained at the dc ─► "stopped KEY", released by its deadlines
//!    └─ the session lost ─► exit 124
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use homing_client::host_agent::AGENT_REQUEST_TIMEOUT_MS_DEFAULT;
use homing_client::{SessionActors, SessionHost, SessionHostConfig};
use homing_core::{
    AcquireReply, ActorId, Identity, KeyConfig, KeyName, Namespace, ReservationId, Role,
};
use homing_net::{Client, ClientLimits, Peer};
use tokio::sync::mpsc;

use crate::exit::{BadInput, Exit, fail};
use crate::reach;

/// Host sessions: many keys held by one heartbeat.
#[derive(Debug, clap::Subcommand)]
pub enum SessionCommand {
    Hold(SessionHoldArgs),
}

/// Hold KEYs under one host session until SIGINT or SIGTERM.
///
/// Opens a session at the host's own DC (the first --dc; certificate
/// host-<dc> from --certs), acquires every KEY (and --count generated
/// ones) under it, prints one line per key and then "holding N keys under
/// session S", and renews the session — one request for all the keys —
/// until SIGINT or SIGTERM, when it closes the session: every key is then
/// vacant at once (plus the DC's grace). Killed without closing (SIGKILL,
/// a crash), its keys are vacant once the session's expiry plus grace has
/// passed. A key drained at the DC is said ("stopped")
/// and released by its deadlines; the others go on. Sessions need the
/// deployment version raised to 9 (`homing dc version --raise`).
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct SessionHoldArgs {
    /// Keys to hold.
    keys: Vec<String>,
    /// Also hold this many keys named PREFIX0, PREFIX1, …
    #[arg(long, default_value_t = 0)]
    count: u32,
    /// The prefix of the --count keys.
    #[arg(long, default_value = "key-")]
    prefix: String,
    /// The keys' namespace.
    #[arg(long, default_value = "")]
    namespace: String,
    /// The actor id recorded for every key (default: this host's name).
    #[arg(long)]
    actor: Option<String>,
    /// If a live actor holds a key, wait up to this many milliseconds for it.
    #[arg(long, default_value_t = 0)]
    wait_ms: u32,
    /// How many acquires are sent at once.
    #[arg(long, default_value_t = 32)]
    parallel: usize,
    /// Print only the summary line, not one line per key.
    #[arg(long)]
    quiet: bool,
    #[arg(long, env = "HOMING_CERTS", default_value = "homing-certs")]
    certs: PathBuf,
    /// `dc=host:port`; the first is this host's DC.
    #[arg(long = "dc", env = "HOMING_DCS", value_delimiter = ',')]
    dcs: Vec<String>,
    /// Timeout of one request, in milliseconds.
    #[arg(long, default_value_t = AGENT_REQUEST_TIMEOUT_MS_DEFAULT)]
    request_timeout_ms: u64,
}

const AFTER_HELP: &str = "\
Exit codes:
  0    closed after SIGINT/SIGTERM
  2    bad flags, keys or certificates
  69   the DC could not be reached
  77   the DC refused the session (deployment version below 9, not a host of that DC)
  124  the session was lost (not renewed in time, or refused); every key stopped

Example:
  export HOMING_CERTS=/etc/homing/certs HOMING_DCS=iad=10.0.0.1:7400
  homing session hold --count 1000 --prefix room- --namespace games --quiet";

/// What the session's task tells this command.
#[derive(Debug)]
enum Told {
    Stopped(ReservationId),
    Lost,
}

struct Printer(mpsc::UnboundedSender<Told>);

impl SessionActors for Printer {
    fn on_soft_terminate(&self, _: &ReservationId) {}
    fn on_hard_terminate(&self, reservation: &ReservationId) {
        let _ = self.0.send(Told::Stopped(reservation.clone()));
    }
    fn on_soft_terminate_all(&self) {}
    fn on_hard_terminate_all(&self) {
        let _ = self.0.send(Told::Lost);
    }
}

/// The exit status when the session was lost.
pub const SESSION_LOST: i32 = 124;

/// Runs the command; its exit status (0, or [`SESSION_LOST`]).
pub async fn run(command: SessionCommand) -> anyhow::Result<i32> {
    match command {
        SessionCommand::Hold(args) => hold(args).await,
    }
}

async fn hold(args: SessionHoldArgs) -> anyhow::Result<i32> {
    let table = reach::parse_dc_table(&args.dcs)?;
    let (dc, addr) = table
        .first()
        .cloned()
        .context("empty --dc table")
        .bad_input("--dc")?;
    let namespace = Namespace::new(args.namespace.as_str()).bad_input("--namespace")?;
    let mut names = Vec::new();
    for key in &args.keys {
        names.push(KeyName::new(key.as_str()).bad_input("KEY")?);
    }
    for n in 0..args.count {
        let name = format!("{}{n}", args.prefix);
        names.push(KeyName::new(name.as_str()).bad_input("--prefix")?);
    }
    if names.is_empty() {
        return Err(fail(Exit::BadInput, "no keys: give KEYs or --count"));
    }
    let actor = match &args.actor {
        Some(actor) => ActorId::new(actor.as_str()).bad_input("--actor")?,
        None => {
            let name = rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned();
            ActorId::new(name).context("this host's name as the actor id")?
        }
    };
    let identity = Identity::new(Role::Host, Some(dc.clone()))?;
    let tls = reach::load_identity(&args.certs, &identity)?;
    let client = reach::closed_at_exit(Client::new(&tls, ClientLimits::default())?);
    let mut config = SessionHostConfig::new(Peer { addr, dc });
    config.request_timeout_ms = args.request_timeout_ms;
    config.alternates = (table[1..].iter())
        .filter(|(other, _)| *other == config.dc.dc)
        .map(|(_, addr)| *addr)
        .collect();
    let (told, mut hear) = mpsc::unbounded_channel();
    let session = match SessionHost::open(client, config, Arc::new(Printer(told))).await {
        Ok(session) => session,
        // The DC will not open one (deployment version, role): a refusal.
        Err(e @ homing_client::AgentError::Refused { .. }) => {
            return Err(fail(Exit::Refused, e.to_string()));
        }
        Err(e) => return Err(e.into()),
    };
    let session = Arc::new(session);
    let mut held = 0usize;
    let mut names_of = std::collections::HashMap::new();
    let mut names = names.into_iter();
    let mut running = tokio::task::JoinSet::new();
    loop {
        while running.len() < args.parallel.max(1) {
            let Some(name) = names.next() else { break };
            let (session, actor) = (session.clone(), actor.clone());
            let key = KeyConfig {
                name: Some(name),
                namespace: namespace.clone(),
                tag: None,
            };
            let wait_ms = args.wait_ms;
            running.spawn(async move { session.acquire(key, actor, wait_ms).await });
        }
        let Some(reply) = running.join_next().await else {
            break;
        };
        match reply.context("an acquire task")?? {
            AcquireReply::Acquired(lease) => {
                held += 1;
                if !args.quiet {
                    println!(
                        "held {} as {} token {}",
                        lease.key, lease.reservation, lease.token
                    );
                }
                names_of.insert(lease.reservation.clone(), lease.key.to_string());
            }
            AcquireReply::HeldElsewhere(holder) => println!(
                "{} is held elsewhere: reservation {}, actor {}, token {}",
                holder.key, holder.reservation, holder.actor, holder.token
            ),
            AcquireReply::TagMismatch { .. } => println!("a key is held under another tag"),
        }
    }
    println!("holding {held} keys under session {}", session.id());
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    loop {
        tokio::select! {
            told = hear.recv() => match told {
                Some(Told::Stopped(id)) => {
                    let key = names_of.get(&id).cloned().unwrap_or_default();
                    println!("stopped {key} ({id}): drained at the dc");
                }
                Some(Told::Lost) | None => {
                    println!("the session {} was lost: every key stopped", session.id());
                    return Ok(SESSION_LOST);
                }
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
        }
    }
    let session =
        Arc::try_unwrap(session).map_err(|_| anyhow::anyhow!("the session is still shared"))?;
    let id = session.id().clone();
    tokio::time::timeout(Duration::from_secs(10), session.close())
        .await
        .context("closing the session")??;
    println!("closed session {id}");
    Ok(0)
}
