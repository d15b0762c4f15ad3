//! `edge-router`: the homing edge router as a process. Resolves the key of
//! each HTTP request through the DCs given with `--dc` (nearest first) and
//! forwards it to the actor.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use homing_client::{Resolver, ResolverConfig};
use homing_core::{Identity, Namespace, Role};
use homing_edge::{ActorNetwork, EdgeConfig, EdgeRouter, ServeLimits, metrics};
use homing_net::{Client, ClientLimits};
use hyper::header::HeaderName;

/// Time in-flight requests get after Ctrl-C, in milliseconds.
const DRAIN_MS: u64 = 5_000;

/// An HTTP edge router on the homing Resolver.
#[derive(Debug, Parser)]
#[command(name = "edge-router", version)]
struct Args {
    /// Address to accept HTTP/1.1 and HTTP/2 (prior knowledge) on.
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Address to serve /metrics (OpenMetrics text), /healthz and /readyz on (docs/EDGE-ROUTER.md, "Metrics and health"); unset: not served.
    #[arg(long, env = "HOMING_EDGE_METRICS_LISTEN")]
    metrics_listen: Option<SocketAddr>,
    /// Directory with ca.pem and router.pem/router.key, as written by `homing certs`.
    #[arg(long, env = "HOMING_CERTS", default_value = "homing-certs")]
    certs: PathBuf,
    /// PEM file of the CA's certificate revocation list (`homing certs --revoke`): a DC whose certificate it lists is not connected to.
    #[arg(long, env = "HOMING_CRL")]
    crl: Option<PathBuf>,
    /// How often the certificate, key, CA and revocation-list files are checked for changes, in milliseconds; changed files are used for new connections to DCs (open ones go on). 0: never.
    #[arg(long, env = "HOMING_TLS_RELOAD_MS", default_value_t = homing_net::reload::TLS_RELOAD_MS_DEFAULT)]
    tls_reload_ms: u64,
    /// A DC as NAME=ADDR, nearest first; repeatable (env: comma-separated). A DC served by several homingd is given once per address (iad=10.0.1.1:7400,iad=10.0.1.2:7400): requests go to the next when one does not answer. One DC is enough to start: DCs not given here are learned from the DC directory (--directory-refresh-ms) and tried after these; a DC given here is reached only at the addresses given.
    #[arg(
        long = "dc",
        env = "HOMING_DCS",
        value_delimiter = ',',
        required = true
    )]
    dcs: Vec<String>,
    /// Header carrying the key name.
    #[arg(long, default_value = homing_edge::config::KEY_HEADER_DEFAULT)]
    key_header: String,
    /// Do not route `/k/<key>/…` paths (the header only).
    #[arg(long)]
    no_path_prefix: bool,
    /// Namespace of the keys routed.
    #[arg(long, default_value = "")]
    namespace: String,
    /// How long a resolved answer is served from cache, in milliseconds.
    #[arg(long, default_value_t = homing_client::resolver::TAIL_TTL_MS_DEFAULT)]
    tail_ttl_ms: u64,
    /// Timeout of one request to one DC, in milliseconds; a DC that lets it
    /// run out is suspect (answered for at once) until a probe gets an answer.
    #[arg(long, default_value_t = homing_client::resolver::HOP_TIMEOUT_MS_DEFAULT)]
    hop_timeout_ms: u64,
    /// Timeout of one probe of a suspect DC, in milliseconds.
    #[arg(long, default_value_t = homing_client::resolver::PROBE_TIMEOUT_MS_DEFAULT)]
    probe_timeout_ms: u64,
    /// First wait before probing a suspect DC (then doubling), in milliseconds.
    #[arg(long, default_value_t = homing_client::resolver::PROBE_INTERVAL_MS_DEFAULT)]
    probe_interval_ms: u64,
    /// Longest wait between probes of a suspect DC, in milliseconds.
    #[arg(long, default_value_t = homing_client::resolver::PROBE_INTERVAL_MAX_MS_DEFAULT)]
    probe_interval_max_ms: u64,
    /// How often to ask the DCs for the DC directory and add DCs (and homingd) not in --dc, in milliseconds: a DC added to the deployment is routed to without restarting the router. 0: never; the DC table is --dc only.
    #[arg(long, env = "HOMING_DIRECTORY_REFRESH_MS", default_value_t = homing_client::resolver::DIRECTORY_REFRESH_MS_DEFAULT)]
    directory_refresh_ms: u64,
    /// Capacity of each resolver cache, in entries.
    #[arg(long, default_value_t = homing_client::resolver::CACHE_ENTRIES_DEFAULT)]
    cache_entries: u64,
    /// Wait for an actor's response headers, in milliseconds.
    #[arg(long, default_value_t = homing_edge::config::UPSTREAM_TIMEOUT_MS_DEFAULT)]
    upstream_timeout_ms: u64,
    /// Largest request body, in bytes.
    #[arg(long, default_value_t = homing_edge::config::REQUEST_BODY_BYTES_MAX_DEFAULT)]
    request_body_bytes_max: usize,
    /// Most request body bytes buffered at once over all requests; a body
    /// that would pass it is answered 503 overloaded.
    #[arg(long, default_value_t = homing_edge::config::REQUEST_BODIES_BYTES_MAX_DEFAULT)]
    request_bodies_bytes_max: usize,
    /// Time a request's whole body has to arrive, in milliseconds; then 408 body_timeout.
    #[arg(long, default_value_t = homing_edge::config::BODY_READ_TIMEOUT_MS_DEFAULT)]
    body_read_timeout_ms: u64,
    /// Wait while a key's actor moves (vacant tail) before 503, in milliseconds.
    #[arg(long, default_value_t = homing_edge::config::MOVE_WAIT_MS_DEFAULT)]
    move_wait_ms: u64,
    /// Serve remembered answers, marked stale, while a DC is unavailable.
    #[arg(long)]
    stale_answers: bool,
    /// A network (CIDR) actor addresses may lie in; repeatable (env:
    /// comma-separated). A resolved actor outside every one is answered 502
    /// actor_not_allowed and never dialled. Default: loopback only; list
    /// your actor hosts' networks (e.g. 10.0.0.0/8), or 0.0.0.0/0 and ::/0
    /// to allow any address.
    #[arg(
        long = "actor-network",
        env = "HOMING_ACTOR_NETWORKS",
        value_delimiter = ',',
        default_values = homing_edge::network::ACTOR_NETWORKS_DEFAULT
    )]
    actor_networks: Vec<ActorNetwork>,
    /// Threads serving requests; 1 runs everything on one thread (no
    /// cross-thread wake-ups, like one nginx worker). Default: one per CPU.
    #[arg(long)]
    threads: Option<usize>,
    #[command(flatten)]
    serve: ServeArgs,
}

/// Bounds on each client connection (EDGE-ROUTER.md, "Bounds").
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Client connection bounds")]
struct ServeArgs {
    /// Most client connections at once. At the cap a new connection takes
    /// the place of the oldest one that has not sent a request yet; if every
    /// one has, the new one is closed on accept.
    #[arg(long, default_value_t = homing_edge::config::CONNECTIONS_MAX_DEFAULT)]
    connections_max: usize,
    /// Time a new connection has to send its first bytes (HTTP/2 preface
    /// or an HTTP/1 request line), in milliseconds; a silent one is closed.
    #[arg(long, default_value_t = homing_edge::config::DETECT_TIMEOUT_MS_DEFAULT)]
    detect_timeout_ms: u64,
    /// Time an HTTP/1 client has to send a request's headers, counted from
    /// the end of the previous response (so also its keep-alive idle limit), in milliseconds.
    #[arg(long, default_value_t = homing_edge::config::HEADER_READ_TIMEOUT_MS_DEFAULT)]
    header_read_timeout_ms: u64,
    /// Time a connection may stay open with no request in flight, in
    /// milliseconds; then it is closed (HTTP/2: GOAWAY).
    #[arg(long, default_value_t = homing_edge::config::IDLE_TIMEOUT_MS_DEFAULT)]
    idle_timeout_ms: u64,
    /// Time a write to a client may make no progress (it stopped reading),
    /// in milliseconds; then its connection is dropped.
    #[arg(long, default_value_t = homing_edge::config::WRITE_TIMEOUT_MS_DEFAULT)]
    write_timeout_ms: u64,
    /// Most concurrent streams per HTTP/2 connection.
    #[arg(long, default_value_t = homing_edge::config::H2_STREAMS_MAX_DEFAULT)]
    h2_streams_max: u32,
    /// HTTP/2 per-stream flow-control window (unread request body per stream), in bytes.
    #[arg(long, default_value_t = homing_edge::config::H2_STREAM_WINDOW_BYTES_DEFAULT)]
    h2_stream_window_bytes: u32,
    /// HTTP/2 per-connection flow-control window (unread request body over all streams), in bytes.
    #[arg(long, default_value_t = homing_edge::config::H2_CONNECTION_WINDOW_BYTES_DEFAULT)]
    h2_connection_window_bytes: u32,
    /// Largest HTTP/2 header list of one request, in bytes.
    #[arg(long, default_value_t = homing_edge::config::H2_HEADER_LIST_BYTES_MAX_DEFAULT)]
    h2_header_list_bytes_max: u32,
    /// Most response bytes queued per HTTP/2 stream toward a slow client, in bytes.
    #[arg(long, default_value_t = homing_edge::config::H2_SEND_BUFFER_BYTES_MAX_DEFAULT)]
    h2_send_buffer_bytes_max: usize,
}

impl ServeArgs {
    fn limits(&self) -> ServeLimits {
        ServeLimits {
            connections_max: self.connections_max,
            detect_timeout_ms: self.detect_timeout_ms,
            header_read_timeout_ms: self.header_read_timeout_ms,
            idle_timeout_ms: self.idle_timeout_ms,
            write_timeout_ms: self.write_timeout_ms,
            h2_streams_max: self.h2_streams_max,
            h2_stream_window_bytes: self.h2_stream_window_bytes,
            h2_connection_window_bytes: self.h2_connection_window_bytes,
            h2_header_list_bytes_max: self.h2_header_list_bytes_max,
            h2_send_buffer_bytes_max: self.h2_send_buffer_bytes_max,
        }
    }
}

fn dc_table(entries: &[String]) -> anyhow::Result<Vec<(homing_core::DcId, SocketAddr)>> {
    entries
        .iter()
        .map(|entry| {
            let (dc, addr) = entry
                .split_once('=')
                .with_context(|| format!("--dc {entry:?} is not NAME=ADDR"))?;
            let dc = homing_core::DcId::new(dc).with_context(|| format!("--dc {entry:?}"))?;
            let addr = addr
                .parse()
                .with_context(|| format!("--dc {entry:?}: address"))?;
            Ok((dc, addr))
        })
        .collect()
}

async fn run(args: Args) -> anyhow::Result<()> {
    let dcs = dc_table(&args.dcs)?;
    let identity = Identity::new(Role::Router, None)?;
    let files = homing_net::pki::identity_files(&args.certs, &identity, args.crl.clone());
    let tls = files.load().with_context(|| {
        format!(
            "loading the router certificate from {}",
            args.certs.display()
        )
    })?;
    let resolver_config = ResolverConfig {
        tail_ttl_ms: args.tail_ttl_ms,
        cache_entries: args.cache_entries,
        hop_timeout_ms: args.hop_timeout_ms,
        probe_timeout_ms: args.probe_timeout_ms,
        probe_interval_ms: args.probe_interval_ms,
        probe_interval_max_ms: args.probe_interval_max_ms,
        directory_refresh_ms: args.directory_refresh_ms,
        ..ResolverConfig::new(dcs)
    };
    let client = Client::new(&tls, ClientLimits::default())?;
    tokio::spawn(homing_net::reload::watch_files(
        files,
        std::time::Duration::from_millis(args.tls_reload_ms),
        vec![Box::new(client.clone())],
        std::future::pending(),
    ));
    let resolver = Resolver::new(client.clone(), resolver_config);
    let config = EdgeConfig {
        key_header: HeaderName::try_from(args.key_header.as_str()).context("--key-header")?,
        path_prefix: !args.no_path_prefix,
        namespace: Namespace::new(args.namespace.as_str()).context("--namespace")?,
        upstream_timeout_ms: args.upstream_timeout_ms,
        request_body_bytes_max: args.request_body_bytes_max,
        request_bodies_bytes_max: args.request_bodies_bytes_max,
        body_read_timeout_ms: args.body_read_timeout_ms,
        actor_networks: args.actor_networks.clone(),
        serve: args.serve.limits(),
        move_wait_ms: args.move_wait_ms,
        stale_answers: args.stale_answers,
        ..EdgeConfig::default()
    };
    let router = EdgeRouter::new(resolver, config);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("--listen {}", args.listen))?;
    let serving = router.spawn(listener)?;
    println!("edge-router listening on http://{}", serving.local_addr());
    let (stop_metrics, metrics_stopped) = tokio::sync::watch::channel(false);
    let metrics = match args.metrics_listen {
        None => None,
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--metrics-listen {addr}"))?;
            println!(
                "edge-router metrics on http://{}/metrics",
                listener.local_addr()?
            );
            let connections = Some(serving.connections());
            let task = metrics::spawn(listener, router.clone(), connections, metrics_stopped);
            Some(task)
        }
    };
    if let Err(e) = tokio::signal::ctrl_c().await {
        eprintln!("waiting for Ctrl-C: {e}; stopping");
    }
    serving.stop(Duration::from_millis(DRAIN_MS)).await;
    let _ = stop_metrics.send(true);
    if let Some(task) = metrics {
        let _ = task.await;
    }
    // The DCs free the router's connections now, not at their idle timeout.
    client.close().await;
    println!("edge-router stopped: {:?}", router.stats());
    Ok(())
}

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("HOMING_LOG").unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new("warn,homing_client::resolver=info")
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    let ran = homing_edge::runtime(threads)
        .context("starting the runtime")
        .and_then(|runtime| runtime.block_on(run(args)));
    if let Err(e) = ran {
        eprintln!("error: {e:#}");
        std::process::exit(2);
    }
}
