//! Request/response throughput and latency of homing-net (Client → Server
//! with a trivial handler) against a bare quinn echo over the same TLS
//! settings (mTLS, TLS 1.3, ring, same certificates), the ceiling.
//!
//! Run: `cargo run --release -p homing-net --example net_bench`

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use homing_core::wire::{self, FRAME_BYTES_MAX};
use homing_core::{DcId, Identity, Key, KeyName, Reply, Request, Role};
use homing_net::{Client, ClientLimits, DevCa, Handler, Peer, Server, ServerLimits, TlsIdentity};
use quinn::VarInt;
use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};

/// Length of one measured run.
const RUN_MS: u64 = 1_500;
/// Warm-up before the measured runs of each case.
const WARMUP_MS: u64 = 300;
/// Measured runs per case; the table shows their medians.
const REPETITIONS: usize = 5;
/// In-flight request counts measured.
const CONCURRENCY: [usize; 2] = [1, 64];

type Call = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

struct Trivial;

#[async_trait]
impl Handler for Trivial {
    async fn handle(&self, _caller: &Identity, _request: Request) -> Reply {
        Reply::Resolved {
            entry: None,
            segment: None,
        }
    }
}

#[derive(Clone, Copy)]
struct Sample {
    requests_per_s: f64,
    p50_us: u64,
    p99_us: u64,
}

async fn run(call: &Call, concurrency: usize, run_ms: u64) -> Sample {
    let deadline = Instant::now() + Duration::from_millis(run_ms);
    let started = Instant::now();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let call = call.clone();
        workers.spawn(async move {
            let mut latencies_us = Vec::with_capacity(64 * 1024);
            while Instant::now() < deadline {
                let sent = Instant::now();
                call().await;
                latencies_us.push(sent.elapsed().as_micros() as u64);
            }
            latencies_us
        });
    }
    let mut all = Vec::new();
    while let Some(latencies) = workers.join_next().await {
        all.extend(latencies.expect("worker panicked"));
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    all.sort_unstable();
    let at = |q: f64| all[((all.len() as f64 * q) as usize).min(all.len() - 1)];
    Sample {
        requests_per_s: all.len() as f64 / elapsed_s,
        p50_us: at(0.50),
        p99_us: at(0.99),
    }
}

fn median<T: Copy + PartialOrd>(mut values: Vec<T>) -> T {
    values.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    values[values.len() / 2]
}

/// Measures `a` and `b` alternately (so load drift on a shared machine hits
/// both alike) and returns the medians of each.
async fn measure_pair(a: &Call, b: &Call, concurrency: usize) -> (Sample, Sample) {
    run(a, concurrency, WARMUP_MS).await;
    run(b, concurrency, WARMUP_MS).await;
    let (mut samples_a, mut samples_b) = (Vec::new(), Vec::new());
    for _ in 0..REPETITIONS {
        samples_a.push(run(a, concurrency, RUN_MS).await);
        samples_b.push(run(b, concurrency, RUN_MS).await);
    }
    (medians(&samples_a), medians(&samples_b))
}

fn medians(samples: &[Sample]) -> Sample {
    Sample {
        requests_per_s: median(samples.iter().map(|s| s.requests_per_s).collect()),
        p50_us: median(samples.iter().map(|s| s.p50_us).collect()),
        p99_us: median(samples.iter().map(|s| s.p99_us).collect()),
    }
}

/// homing-net: a pooled Client against a Server with a trivial handler.
async fn homing_net_call(node: &TlsIdentity, router: &TlsIdentity, dc: &DcId) -> (Call, Server) {
    let server = Server::bind(
        "127.0.0.1:0".parse().unwrap(),
        node,
        dc.clone(),
        ServerLimits::default(),
        Arc::new(Trivial),
    )
    .await
    .unwrap();
    let client = Client::new(router, ClientLimits::default()).unwrap();
    let peer = Peer {
        addr: server.local_addr(),
        dc: dc.clone(),
    };
    let request = Request::Resolve {
        key: Key::new(KeyName::new("room-42").unwrap()),
    };
    // One Arc per call, as the bare side's (connection, frame) pair: the
    // harness clones no peer or request.
    let target = Arc::new((client, peer, request));
    let call: Call = Arc::new(move || {
        let target = target.clone();
        Box::pin(async move {
            let (client, peer, request) = &*target;
            let reply = client
                .request(peer, request)
                .await
                .expect("homing-net request");
            assert!(matches!(reply, Reply::Resolved { .. }));
        })
    });
    (call, server)
}

/// Bare quinn: one stream per request, echo of the same request bytes, same TLS.
async fn bare_quinn_call(
    node: &TlsIdentity,
    router: &TlsIdentity,
    dc: &DcId,
) -> (Call, quinn::Endpoint) {
    let crypto = QuicServerConfig::try_from(node.rustls_server_config().unwrap()).unwrap();
    let mut transport = quinn::TransportConfig::default();
    transport.max_concurrent_bidi_streams(VarInt::from_u32(1024));
    let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
    config.transport_config(Arc::new(transport));
    let server = quinn::Endpoint::server(config, "127.0.0.1:0".parse().unwrap()).unwrap();
    let accept = server.clone();
    tokio::spawn(async move {
        while let Some(incoming) = accept.accept().await {
            tokio::spawn(async move {
                let Ok(connection) = incoming.await else {
                    return;
                };
                while let Ok((mut send, mut recv)) = connection.accept_bi().await {
                    tokio::spawn(async move {
                        let Ok(bytes) = recv.read_to_end(FRAME_BYTES_MAX).await else {
                            return;
                        };
                        let _ = send.write_all(&bytes).await;
                        let _ = send.finish();
                    });
                }
            });
        }
    });
    let crypto = QuicClientConfig::try_from(router.rustls_client_config().unwrap()).unwrap();
    let mut client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    client.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    let connection = client
        .connect(
            server.local_addr().unwrap(),
            &homing_net::node_server_name(dc),
        )
        .unwrap()
        .await
        .unwrap();
    let frame: Arc<[u8]> = wire::encode(&Request::Resolve {
        key: Key::new(KeyName::new("room-42").unwrap()),
    })
    .unwrap()
    .into();
    let call: Call = Arc::new(move || {
        let (connection, frame) = (connection.clone(), frame.clone());
        Box::pin(async move {
            let (mut send, mut recv) = connection.open_bi().await.expect("open stream");
            send.write_all(&frame).await.expect("write");
            send.finish().expect("finish");
            let reply = recv.read_to_end(FRAME_BYTES_MAX).await.expect("read");
            assert_eq!(reply.len(), frame.len());
        })
    });
    (call, server)
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dc = DcId::new("iad").unwrap();
        let ca = DevCa::generate("bench ca").unwrap();
        let node = ca.tls_identity(&Identity::new(Role::Node, Some(dc.clone())).unwrap()).unwrap();
        let router = ca.tls_identity(&Identity::new(Role::Router, None).unwrap()).unwrap();
        let (homing, server) = homing_net_call(&node, &router, &dc).await;
        let (bare, bare_server) = bare_quinn_call(&node, &router, &dc).await;
        println!(
            "request/response, one connection, {} alternating runs of {RUN_MS} ms per case (medians), 2 tokio workers, 127.0.0.1",
            REPETITIONS
        );
        println!("{:<12} {:>11} {:>12} {:>9} {:>9}", "impl", "in-flight", "requests/s", "p50 µs", "p99 µs");
        let mut ratios = Vec::new();
        for concurrency in CONCURRENCY {
            let (a, b) = measure_pair(&homing, &bare, concurrency).await;
            for (name, s) in [("homing-net", a), ("bare quinn", b)] {
                println!("{name:<12} {concurrency:>11} {:>12.0} {:>9} {:>9}", s.requests_per_s, s.p50_us, s.p99_us);
            }
            ratios.push((concurrency, a.requests_per_s / b.requests_per_s));
        }
        for (concurrency, ratio) in ratios {
            println!("ratio homing-net / bare quinn at {concurrency} in flight: {ratio:.2}");
        }
        server.shutdown().await;
        bare_server.close(VarInt::from_u32(0), b"done");
    });
}
