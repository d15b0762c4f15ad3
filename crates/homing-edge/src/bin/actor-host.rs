//! `actor-host`: a tiny HTTP actor that holds a key's lease from its own DC
//! and answers every request with where it landed. Ctrl-C releases the key.
//! Its stdout says when it serves (`actor-host serving …`) and, if the
//! lease is lost, when it stopped (`actor-host stopped serving …`, printed
//! once no request is answered any more; it then exits with status 2).

use homing_core::{AcquireReply, Holder};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Parser;
use homing_core::{DcId, Identity, KeyConfig, KeyName, Namespace, Role};
use homing_edge::{ActorHost, ActorHostConfig};
use homing_net::{Client, ClientLimits, Peer};

/// A tiny actor host running under a homing HostAgent.
#[derive(Debug, Parser)]
#[command(name = "actor-host", version)]
struct Args {
    /// The key to hold.
    key: String,
    /// The key's namespace.
    #[arg(long, default_value = "")]
    namespace: String,
    /// The host's own DC as NAME=ADDR.
    #[arg(long)]
    dc: String,
    /// Address to serve on; its bound address is the actor id.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Directory with ca.pem and `host-<dc>.pem`/`.key`, as written by `homing certs`.
    #[arg(long, env = "HOMING_CERTS", default_value = "homing-certs")]
    certs: PathBuf,
    /// PEM file of the CA's certificate revocation list (`homing certs --revoke`): a DC whose certificate it lists is not connected to.
    #[arg(long, env = "HOMING_CRL")]
    crl: Option<PathBuf>,
    /// How often the certificate, key, CA and revocation-list files are checked for changes, in milliseconds; changed files are used for new connections to the DC (open ones go on). 0: never.
    #[arg(long, env = "HOMING_TLS_RELOAD_MS", default_value_t = homing_net::reload::TLS_RELOAD_MS_DEFAULT)]
    tls_reload_ms: u64,
}

async fn run(args: Args) -> anyhow::Result<()> {
    let (dc, addr) = args
        .dc
        .split_once('=')
        .with_context(|| format!("--dc {:?} is not NAME=ADDR", args.dc))?;
    let dc = DcId::new(dc).context("--dc")?;
    let addr: SocketAddr = addr.parse().context("--dc: address")?;
    let identity = Identity::new(Role::Host, Some(dc.clone()))?;
    let files = homing_net::pki::identity_files(&args.certs, &identity, args.crl.clone());
    let tls = files
        .load()
        .with_context(|| format!("loading the host certificate from {}", args.certs.display()))?;
    let key = KeyConfig {
        namespace: Namespace::new(args.namespace.as_str()).context("--namespace")?,
        ..KeyConfig::named(KeyName::new(args.key.as_str()).context("key")?)
    };
    let config = ActorHostConfig::new(Peer { addr, dc }, key, args.listen);
    let client = Client::new(&tls, ClientLimits::default())?;
    if args.tls_reload_ms > 0 {
        tokio::spawn(homing_net::reload::watch_files(
            files,
            std::time::Duration::from_millis(args.tls_reload_ms),
            vec![Box::new(client.clone())],
            std::future::pending(),
        ));
    }
    let served = run_host(client.clone(), config).await;
    // However it ended: the DC frees this host's connection now.
    client.close().await;
    served
}

/// Serves the actor until Ctrl-C or the lease is lost.
async fn run_host(client: Client, config: ActorHostConfig) -> anyhow::Result<()> {
    let mut host = match ActorHost::start(client, config).await? {
        AcquireReply::Acquired(host) => *host,
        AcquireReply::HeldElsewhere(Holder {
            reservation, actor, ..
        }) => {
            bail!("the key is live elsewhere: actor {actor} under {reservation}")
        }
        AcquireReply::TagMismatch { existing } => bail!("the key is held under tag {existing:?}"),
    };
    println!(
        "actor-host serving {} on http://{} under {} (token {})",
        host.key(),
        host.local_addr(),
        host.reservation(),
        host.token()
    );
    tokio::select! {
        signal = tokio::signal::ctrl_c() => {
            signal?;
            host.stop().await?;
            println!("released");
        }
        () = host.terminated() => {
            // Said as soon as nothing is served any more (before the client
            // closes, which may take a while with the DC unreachable), so
            // whoever watches the host learns when its actor stopped.
            println!("actor-host stopped serving: the lease was lost");
            bail!("the lease was lost: stopped serving")
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOMING_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    if let Err(e) = run(Args::parse()).await {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
