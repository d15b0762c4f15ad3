//! `homing`: the operator's and developer's command line.

mod bench;
mod dc;
mod devnet;
mod exit;
mod hold;
mod migrate;
mod reach;
mod scope;
mod session;
mod show;

use homing_core::{AcquireReply, Grant, Holder};
use std::path::PathBuf;

use clap::{Parser, Subcommand};
use homing_core::{
    ActorId, DcId, FencingToken, HostTime, Key, KeyConfig, KeyName, Namespace, ReleaseReply, Reply,
    Request, ReservationId, Tag,
};

use crate::exit::{BadInput, EXIT_CODES_HELP, Exit, fail};
use crate::reach::Reach;

/// homing — which datacenter hosts the actor for a key, right now.
///
/// Commands that talk to a deployment need its certificates (--certs, as
/// written by `homing certs`) and its DCs (--dc NAME=ADDR, nearest first).
/// `homing devnet --serve` starts a local deployment and prints both.
#[derive(Debug, Parser)]
#[command(name = "homing", version, about, long_about, after_help = EXIT_CODES_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// A key on the command line, and how to reach the deployment.
#[derive(Debug, clap::Args)]
struct KeyArgs {
    /// The key name.
    key: String,
    /// The key's namespace (default: the empty namespace).
    #[arg(long, default_value = "")]
    namespace: String,
    #[command(flatten)]
    reach: Reach,
}

impl KeyArgs {
    fn key(&self) -> anyhow::Result<Key> {
        Ok(Key::in_namespace(
            Namespace::new(self.namespace.as_str()).bad_input("--namespace")?,
            KeyName::new(self.key.as_str()).bad_input("key")?,
        ))
    }
}

/// `--json`: one JSON object on stdout instead of sentences.
#[derive(Debug, Clone, Copy, clap::Args)]
struct JsonArg {
    /// Print one JSON object on stdout (also on failure: `outcome`, `error`).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a local multi-DC deployment in this process and tell homing's story:
    /// reserve, resolve, wait for a busy key, recreate elsewhere, follow the
    /// chain, race, drain, read the event logs.
    Devnet(devnet::DevnetArgs),
    /// Run an end-to-end benchmark suite against real homingd instances in
    /// this process and print homing next to its model or baseline.
    Bench(bench::BenchArgs),
    /// Write a development CA and node, host, router and admin certificates;
    /// or, with --revoke, its certificate revocation list.
    ///
    /// `homing certs --out DIR --revoke host-iad` writes DIR/crl.pem, signed
    /// by DIR's CA, listing host-iad.pem and every certificate the list
    /// already lists (`--revoke` alone writes a list of those only, or an
    /// empty one). A homingd started with `--crl DIR/crl.pem` refuses a
    /// listed certificate at its next connection, within its
    /// `tls_reload_ms`, without a restart.
    Certs {
        /// Directory to write into (created if missing).
        #[arg(long, default_value = "homing-certs")]
        out: PathBuf,
        /// DC ids to issue node and host certificates for, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "iad,fra,sin")]
        dcs: Vec<String>,
        /// Revoke these certificates (file stems in --out: node-iad,
        /// host-fra, router, admin, ...) instead of writing new ones.
        #[arg(long, value_delimiter = ',', num_args = 0..)]
        revoke: Option<Vec<String>>,
    },
    /// Where the key's actor lives now: DC, reservation, actor, token.
    #[command(after_help = EXIT_CODES_HELP)]
    Resolve {
        #[command(flatten)]
        key: KeyArgs,
        #[command(flatten)]
        json: JsonArg,
    },
    /// The key's reservation chain, hop by hop, with where each answer came from.
    Chain(KeyArgs),
    /// Reserve the key for an actor in a DC (connect semantics: an existing
    /// live actor is returned instead, and the command exits 75).
    #[command(after_help = EXIT_CODES_HELP)]
    Reserve {
        #[command(flatten)]
        key: KeyArgs,
        /// The actor to run (typically the address it answers on).
        #[arg(long)]
        actor: String,
        /// The DC to reserve in (default: the nearest in --dc).
        #[arg(long)]
        at: Option<String>,
        /// Only return an existing actor with this tag.
        #[arg(long)]
        tag: Option<String>,
        /// If a live actor holds the key, wait up to this many milliseconds
        /// for it to release or expire, then take it (max 300000).
        #[arg(long, default_value_t = 0)]
        wait_ms: u32,
        #[command(flatten)]
        json: JsonArg,
    },
    /// Force-release a reservation held with the given fencing token,
    /// without its holder: an operator's act, logged by the DC and evented
    /// as `force_released`; the next holder learns the previous run was
    /// force-released. The holder is not told and may run until its hard
    /// deadline (drain it first to stop it by its deadlines). A token that
    /// is not the holder's is refused: exit 77. Hosts release their own
    /// leases with their lease key (HostAgent, `homing hold`).
    #[command(after_help = EXIT_CODES_HELP)]
    Release {
        /// The reservation, `<dc>.<unique>`.
        reservation: String,
        /// The holder's fencing token.
        #[arg(long)]
        token: u64,
        #[command(flatten)]
        reach: Reach,
        #[command(flatten)]
        json: JsonArg,
    },
    /// Refuse further renewals: of one key's live lease (KEY), or of every
    /// live lease in a namespace in every DC (--namespace, --include-children).
    /// Their hosts stop by their deadlines.
    Drain {
        /// The key; omit it to drain the whole namespace.
        key: Option<String>,
        #[command(flatten)]
        scope: scope::ScopeArgs,
        #[command(flatten)]
        reach: Reach,
    },
    /// Follow lifecycle events (reserved, released with outcome, expired,
    /// linked, drained, abandoned) of every DC, resumable from printed cursors.
    #[command(after_help = "Examples:
  homing watch --namespace games --include-children
  homing watch --after iad=41,fra=7          # resume: the last cursor printed per DC
  homing watch --only iad --count 10         # ten events of iad, then exit")]
    Watch(scope::WatchArgs),
    /// List every record in a namespace (and its children) in every DC.
    Inspect(scope::ScopeCommand),
    /// Copy a deployment's stores (global entries, successions, DC leases and
    /// settings, DC session rows, records, events, allocators) to another backend, e.g.
    /// redb to etcd, with homingd stopped; resumable, never overwriting, then
    /// verified.
    #[command(after_long_help = migrate::LONG_HELP)]
    Migrate(migrate::MigrateArgs),
    Hold(hold::HoldArgs),
    /// Host sessions: hold many keys under one heartbeat (`homing session hold`).
    #[command(subcommand)]
    Session(session::SessionCommand),
    /// The DCs as the global store knows them: DC leases, marks, retirement
    /// (`homing dc status`, `homing dc retire`).
    #[command(subcommand, after_help = EXIT_CODES_HELP)]
    Dc(dc::DcCommand),
}

/// This machine's clock as a host clock reading (the CLI acts as a host
/// when it reserves): the one clock homing-client's HostAgent reads too.
pub(crate) fn host_now() -> HostTime {
    use homing_client::HostClock;
    homing_client::SystemClock.now()
}

/// Whether this run prints JSON (set once, from the command's `--json`).
static JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn json_mode() -> bool {
    JSON.load(std::sync::atomic::Ordering::Relaxed)
}

/// A reply that does not answer the request sent: a human sentence (never
/// Debug output), exit 1.
fn unexpected(request: &Request, reply: &Reply) -> anyhow::Error {
    match reply {
        Reply::Error(e) => anyhow::Error::new(e.clone()),
        other => fail(
            Exit::Failed,
            format!(
                "the DC answered a {} request with {}",
                request.kind(),
                show::reply_kind(other)
            ),
        ),
    }
}

/// Prints the answer to `homing reserve`; the exit it calls for.
fn reserved(request: &Request, reply: Reply) -> anyhow::Result<Exit> {
    let Reply::Acquire(acquire) = reply else {
        return Err(unexpected(request, &reply));
    };
    match acquire {
        AcquireReply::Acquired(Grant {
            key,
            reservation,
            token,
            previous,
            ..
        }) => {
            if json_mode() {
                let previous = previous.map(|p| {
                    serde_json::json!({
                        "reservation": p.reservation.to_string(),
                        "token": p.token.get(),
                        "ended": p.ended.to_string(),
                    })
                });
                print_json(serde_json::json!({
                    "outcome": "acquired",
                    "namespace": key.namespace.as_str(),
                    "key": key.name.as_str(),
                    "dc": reservation.dc().as_str(),
                    "reservation": reservation.to_string(),
                    "token": token.get(),
                    "previous": previous,
                }));
                return Ok(Exit::Ok);
            }
            println!("acquired {key}: reservation {reservation}, token {token}");
            if let Some(p) = previous {
                println!(
                    "previous run: reservation {} token {}, {}",
                    p.reservation, p.token, p.ended
                );
            }
            println!(
                "(the lease is not renewed by this command: it lapses after the DC's lease ttl)"
            );
            Ok(Exit::Ok)
        }
        AcquireReply::HeldElsewhere(Holder {
            key,
            reservation,
            actor,
            token,
        }) => {
            if json_mode() {
                print_json(serde_json::json!({
                    "outcome": Exit::HeldElsewhere.word(),
                    "namespace": key.namespace.as_str(),
                    "key": key.name.as_str(),
                    "dc": reservation.dc().as_str(),
                    "reservation": reservation.to_string(),
                    "actor": actor.as_str(),
                    "token": token.get(),
                }));
            } else {
                println!(
                    "{key} is held by actor {actor} in dc {}: reservation {reservation}, token {token}; nothing was reserved",
                    reservation.dc()
                );
            }
            Ok(Exit::HeldElsewhere)
        }
        AcquireReply::TagMismatch { existing } => {
            let tag = existing.map_or("no tag".to_string(), |t| format!("tag {t}"));
            Err(fail(
                Exit::Refused,
                format!("refused: a live actor holds the key under {tag}"),
            ))
        }
    }
}

/// Prints the answer to `homing release`; the exit it calls for.
fn released(request: &Request, reply: Reply) -> anyhow::Result<Exit> {
    let Request::ForceRelease { reservation, token } = request else {
        unreachable!("released() answers a ForceRelease request");
    };
    match reply {
        Reply::Release(ReleaseReply::Released) => {
            if json_mode() {
                print_json(serde_json::json!({
                    "outcome": "released",
                    "reservation": reservation.to_string(),
                    "token": token.get(),
                }));
            } else {
                println!("force-released {reservation} (token {token})");
            }
            Ok(Exit::Ok)
        }
        Reply::Release(ReleaseReply::StaleToken { current }) => Err(fail(
            Exit::Refused,
            format!(
                "refused: {reservation} is held under token {current}, not {token}: a newer holder took over, or the token is wrong; nothing was released"
            ),
        )),
        other => Err(unexpected(request, &other)),
    }
}

fn print_json(value: serde_json::Value) {
    println!("{value}");
}

/// `true` → ok, `false` → a check failed.
fn checked(ok: bool) -> Exit {
    if ok { Exit::Ok } else { Exit::Failed }
}

async fn run(cli: Cli) -> anyhow::Result<Exit> {
    match cli.command {
        Command::Devnet(args) => return devnet::run(args).await.map(checked),
        Command::Bench(args) => return bench::run(args).await.map(checked),
        Command::Certs {
            out,
            revoke: Some(names),
            ..
        } => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64);
            let (crl, listed) = homing_net::pki::revoke_dev_certs(&out, &names, now)
                .bad_input(format!("--revoke in {}", out.display()))?;
            println!(
                "wrote {}: it lists {listed} revoked certificate(s); a homingd started with --crl {} refuses them at their next connection",
                crl.display(),
                crl.display()
            );
        }
        Command::Certs {
            out,
            dcs,
            revoke: None,
        } => {
            let dcs = dcs
                .iter()
                .map(|d| DcId::new(d.as_str()))
                .collect::<Result<Vec<_>, _>>()
                .bad_input("--dcs")?;
            let files = homing_net::generate_dev_pki(&out, &dcs)?;
            println!(
                "wrote a dev CA and {} certificates to {}",
                files.certs.len(),
                out.display()
            );
            for (identity, cert, _) in &files.certs {
                println!("   {identity:<12} {}", cert.display());
            }
        }
        Command::Resolve { key: args, json } => {
            JSON.store(json.json, std::sync::atomic::Ordering::Relaxed);
            let key = args.key()?;
            let resolver = args.reach.resolver()?;
            let resolution = resolver.resolve(&key).await;
            note_suspects(&resolver, &args.reach.dcs()?);
            let resolution = resolution?;
            if json.json {
                print_json(show::resolution_json(&resolution));
            } else {
                println!("{}", show::resolution(&resolution));
            }
        }
        Command::Chain(args) => {
            let key = args.key()?;
            let resolver = args.reach.resolver()?;
            let walked = resolver.trace(&key).await;
            note_suspects(&resolver, &args.reach.dcs()?);
            println!("{}", show::chain(&walked?, ""));
        }
        Command::Reserve {
            key,
            actor,
            at,
            tag,
            wait_ms,
            json,
        } => {
            JSON.store(json.json, std::sync::atomic::Ordering::Relaxed);
            if wait_ms > homing_core::wire::WAIT_MS_MAX {
                return Err(fail(
                    Exit::BadInput,
                    format!(
                        "--wait-ms {wait_ms} is over the limit of {} ms",
                        homing_core::wire::WAIT_MS_MAX
                    ),
                ));
            }
            let reach = &key.reach;
            let peer = match at {
                Some(dc) => reach.peer(&DcId::new(dc).bad_input("--at")?)?,
                None => reach.nearest()?,
            };
            let client = reach.client()?;
            let key = key.key()?;
            let config = KeyConfig {
                name: Some(key.name),
                namespace: key.namespace,
                tag: tag.map(Tag::new).transpose().bad_input("--tag")?,
            };
            let request = Request::Acquire {
                config,
                actor: ActorId::new(actor).bad_input("--actor")?,
                lease: homing_client::new_lease_key()?,
                host_time: host_now(),
                wait_ms,
            };
            return reserved(&request, client.request(&peer, &request).await?);
        }
        Command::Release {
            reservation,
            token,
            reach,
            json,
        } => {
            JSON.store(json.json, std::sync::atomic::Ordering::Relaxed);
            let reservation: ReservationId = reservation.parse().bad_input("reservation")?;
            let peer = reach.peer(reservation.dc())?;
            let request = Request::ForceRelease {
                reservation,
                token: FencingToken::new(token),
            };
            return released(&request, reach.client()?.request(&peer, &request).await?);
        }
        Command::Drain { key, scope, reach } => match key {
            Some(name) => {
                if scope.include_children {
                    return Err(fail(
                        Exit::BadInput,
                        "--include-children drains a namespace: give no KEY",
                    ));
                }
                let key = KeyArgs {
                    key: name,
                    namespace: scope.namespace,
                    reach,
                };
                let request = Request::Drain { key: key.key()? };
                let peer = key.reach.nearest()?;
                match key.reach.client()?.request(&peer, &request).await? {
                    Reply::Drained => {
                        println!("drained: renewals are refused, the host stops by its deadlines")
                    }
                    other => return Err(unexpected(&request, &other)),
                }
            }
            None => {
                return scope::drain(scope::ScopeCommand { scope, reach })
                    .await
                    .map(checked);
            }
        },
        Command::Watch(args) => return scope::watch(args).await.map(checked),
        Command::Inspect(args) => return scope::inspect(args).await.map(checked),
        Command::Migrate(args) => return migrate::run(args).await.map(checked),
        Command::Dc(command) => {
            dc::run(command).await?;
        }
        Command::Session(command) => {
            let code = session::run(command).await?;
            if code != 0 {
                reach::close_clients().await;
                std::process::exit(code)
            }
        }
        // Exit codes of its own (COMMAND's status among them).
        Command::Hold(args) => {
            let code = hold::run(args).await;
            reach::close_clients().await;
            std::process::exit(code)
        }
    }
    Ok(Exit::Ok)
}

fn main() {
    // `homing hold`'s watchdog (hidden; `hold` starts it) blocks on a pipe
    // and nothing else: no runtime, no worker threads, no logging.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|arg| arg == hold::WATCHDOG_SUBCOMMAND)
    {
        std::process::exit(hold::watchdog_main());
    }
    let cli = Cli::parse();
    let runtime = if cli.command.runs_servers_or_load() {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        // One request at a time: one thread is enough, starts sooner, and
        // lets `Client::close` see its closes sent without a draining wait.
        tokio::runtime::Builder::new_current_thread()
    }
    .enable_all()
    .build()
    .expect("the tokio runtime starts");
    runtime.block_on(cli_main(cli));
}

impl Command {
    /// Whether this command runs servers (devnet), load (bench) or
    /// long-lived leases (hold) and wants every core.
    fn runs_servers_or_load(&self) -> bool {
        matches!(
            self,
            Command::Devnet(_) | Command::Bench(_) | Command::Hold(_)
        )
    }
}

async fn cli_main(cli: Cli) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOMING_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let outcome = run(cli).await;
    // Before exiting, whatever the outcome: the DCs free our connections now.
    reach::close_clients().await;
    let exit = match outcome {
        Ok(exit) => exit,
        Err(e) => {
            let exit = exit::classify(&e);
            if json_mode() {
                print_json(
                    serde_json::json!({ "outcome": exit.word(), "error": format!("{e:#}") }),
                );
            }
            eprintln!("error: {e:#}");
            exit
        }
    };
    std::process::exit(exit.code());
}

/// Tells (on stderr) which DCs stopped answering during this command: each
/// was waited for once, then skipped as suspect rather than waited for again.
fn note_suspects(resolver: &homing_client::Resolver, dcs: &[(DcId, std::net::SocketAddr)]) {
    for (dc, addr) in dcs {
        if resolver.is_suspect(dc) {
            eprintln!("note: dc {dc} ({addr}) did not answer; skipped as suspect after that");
        }
    }
}
