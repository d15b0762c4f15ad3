//! `homing`: the operator's and developer's command line.

mod bench;
mod devnet;
mod hold;
mod migrate;
mod reach;
mod scope;
mod show;

use homing_core::{AcquireReply, Grant, Holder};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use homing_core::{
    ActorId, DcId, FailureReason, FencingToken, HostTime, Key, KeyConfig, KeyName, Namespace,
    Reply, Request, ReservationId, RunOutcome, Tag,
};

use crate::reach::Reach;

/// homing — which datacenter hosts the actor for a key, right now.
///
/// Commands that talk to a deployment need its certificates (--certs, as
/// written by `homing certs`) and its DCs (--dc NAME=ADDR, nearest first).
/// `homing devnet --serve` starts a local deployment and prints both.
#[derive(Debug, Parser)]
#[command(name = "homing", version, about, long_about)]
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
            Namespace::new(self.namespace.as_str()).context("--namespace")?,
            KeyName::new(self.key.as_str()).context("key")?,
        ))
    }
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
    /// Write a development CA and node, host, router and admin certificates.
    Certs {
        /// Directory to write into (created if missing).
        #[arg(long, default_value = "homing-certs")]
        out: PathBuf,
        /// DC ids to issue node and host certificates for, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "iad,fra,sin")]
        dcs: Vec<String>,
    },
    /// Where the key's actor lives now: DC, reservation, actor, token.
    Resolve(KeyArgs),
    /// The key's reservation chain, hop by hop, with where each answer came from.
    Chain(KeyArgs),
    /// Reserve the key for an actor in a DC (connect semantics: an existing
    /// live actor is returned instead).
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
    },
    /// Release a reservation held with the given fencing token, recording
    /// how the run ended for the next holder.
    Release {
        /// The reservation, `<dc>.<unique>`.
        reservation: String,
        /// The holder's fencing token.
        #[arg(long)]
        token: u64,
        /// The run failed, for this reason (default: it finished cleanly).
        #[arg(long, value_name = "REASON")]
        failed: Option<String>,
        #[command(flatten)]
        reach: Reach,
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
    /// Copy a deployment's stores (global entries, DC records, events,
    /// allocators) to another backend, e.g. redb to etcd, with homingd
    /// stopped; resumable, never overwriting, then verified.
    #[command(after_long_help = migrate::LONG_HELP)]
    Migrate(migrate::MigrateArgs),
    Hold(hold::HoldArgs),
}

/// This machine's clock as a host clock reading (the CLI acts as a host
/// when it reserves): the one clock homing-client's HostAgent reads too.
pub(crate) fn host_now() -> HostTime {
    use homing_client::HostClock;
    homing_client::SystemClock.now()
}

fn print_reply(reply: Reply) -> anyhow::Result<()> {
    match reply {
        Reply::Error(e) => bail!("{e}"),
        Reply::Acquire(AcquireReply::Acquired(Grant {
            key,
            reservation,
            token,
            previous,
            ..
        })) => {
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
        }
        Reply::Acquire(AcquireReply::HeldElsewhere(Holder {
            key,
            reservation,
            actor,
            token,
        })) => {
            println!("{key} is held: reservation {reservation}, actor {actor}, token {token}")
        }
        Reply::Acquire(AcquireReply::TagMismatch { existing }) => {
            bail!("a live actor holds the key under tag {existing:?}")
        }
        Reply::Release(homing_core::ReleaseReply::Released) => println!("released"),
        Reply::Drained => {
            println!("drained: renewals are refused, the host stops by its deadlines")
        }
        other => println!("{other:?}"),
    }
    Ok(())
}

async fn run(cli: Cli) -> anyhow::Result<bool> {
    match cli.command {
        Command::Devnet(args) => return devnet::run(args).await,
        Command::Bench(args) => return bench::run(args).await,
        Command::Certs { out, dcs } => {
            let dcs = dcs
                .iter()
                .map(|d| DcId::new(d.as_str()))
                .collect::<Result<Vec<_>, _>>()
                .context("--dcs")?;
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
        Command::Resolve(args) => {
            let key = args.key()?;
            let resolver = args.reach.resolver()?;
            println!("{}", show::resolution(&resolver.resolve(&key).await?));
        }
        Command::Chain(args) => {
            let key = args.key()?;
            let resolver = args.reach.resolver()?;
            println!("{}", show::chain(&resolver.trace(&key).await?, ""));
        }
        Command::Reserve {
            key,
            actor,
            at,
            tag,
            wait_ms,
        } => {
            if wait_ms > homing_core::wire::WAIT_MS_MAX {
                bail!(
                    "--wait-ms {wait_ms} is over the limit of {} ms",
                    homing_core::wire::WAIT_MS_MAX
                );
            }
            let reach = &key.reach;
            let peer = match at {
                Some(dc) => reach.peer(&DcId::new(dc).context("--at")?)?,
                None => reach.nearest()?,
            };
            let client = reach.client()?;
            let key = key.key()?;
            let config = KeyConfig {
                name: Some(key.name),
                namespace: key.namespace,
                tag: tag.map(Tag::new).transpose().context("--tag")?,
            };
            let request = Request::Acquire {
                config,
                actor: ActorId::new(actor).context("--actor")?,
                host_time: host_now(),
                wait_ms,
            };
            print_reply(client.request(&peer, &request).await?)?;
        }
        Command::Release {
            reservation,
            token,
            failed,
            reach,
        } => {
            let reservation: ReservationId = reservation.parse().context("reservation")?;
            let outcome = match failed {
                Some(reason) => RunOutcome::Failed {
                    reason: FailureReason::new(reason).context("--failed")?,
                },
                None => RunOutcome::Ok,
            };
            let peer = reach.peer(reservation.dc())?;
            let request = Request::Release {
                reservation,
                token: FencingToken::new(token),
                outcome,
            };
            print_reply(reach.client()?.request(&peer, &request).await?)?;
        }
        Command::Drain { key, scope, reach } => match key {
            Some(name) => {
                if scope.include_children {
                    bail!("--include-children drains a namespace: give no KEY");
                }
                let key = KeyArgs {
                    key: name,
                    namespace: scope.namespace,
                    reach,
                };
                let request = Request::Drain { key: key.key()? };
                let peer = key.reach.nearest()?;
                print_reply(key.reach.client()?.request(&peer, &request).await?)?;
            }
            None => return scope::drain(scope::ScopeCommand { scope, reach }).await,
        },
        Command::Watch(args) => return scope::watch(args).await,
        Command::Inspect(args) => return scope::inspect(args).await,
        Command::Migrate(args) => return migrate::run(args).await,
        // Exit codes of its own (COMMAND's status among them).
        Command::Hold(args) => {
            let code = hold::run(args).await;
            reach::close_clients().await;
            std::process::exit(code)
        }
    }
    Ok(true)
}

#[tokio::main]
async fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOMING_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let outcome = run(Cli::parse()).await;
    // Before exiting, whatever the outcome: the DCs free our connections now.
    reach::close_clients().await;
    match outcome {
        Ok(true) => {}
        Ok(false) => std::process::exit(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}
