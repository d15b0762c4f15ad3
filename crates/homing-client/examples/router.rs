//! Embedding the Resolver in an edge router: what a router does with each
//! request's key. It resolves the key (one round trip or a few when cold,
//! a cache read when warm) and turns the answer into a routing decision:
//! forward to the actor, answer 404 for a key never reserved, 503 for a key
//! with no live actor or a DC that does not answer.
//!
//! Against a running deployment, e.g. a devnet:
//!
//! ```sh
//! cargo run --bin homing -- devnet --serve          # prints HOMING_CERTS and HOMING_DCS
//! export HOMING_CERTS=… HOMING_DCS=…                 # as printed
//! homing reserve my-key --actor 10.0.0.1:8080 --at iad
//! cargo run -p homing-client --example router -- my-key other-key
//! ```
//!
//! It presents the router certificate of `$HOMING_CERTS` (as written by
//! `homing certs`) and asks the DCs of `$HOMING_DCS` (`NAME=ADDR,…`, nearest
//! first). crates/homing-edge is the full router: HTTP, upstream
//! connections, retries across a move, metrics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use homing_client::{ResolveError, Resolver, ResolverConfig};
use homing_core::{DcId, Identity, Key, KeyName, Namespace, Role};
use homing_net::{Client, ClientLimits, pki};

/// What the router does with a request for a key.
enum Route {
    /// Proxy the request to this actor (an address the host registered).
    Forward(String),
    /// Answer this HTTP status without proxying.
    Refuse(u16, String),
}

fn route(answer: Result<homing_client::Resolution, ResolveError>) -> Route {
    match answer {
        Ok(found) => Route::Forward(found.actor.to_string()),
        Err(e @ ResolveError::NotFound(_)) => Route::Refuse(404, e.to_string()),
        // No live actor, a DC that does not answer, a chain too long or an
        // answer that contradicts the chain: try again later.
        Err(e) => Route::Refuse(503, e.to_string()),
    }
}

fn dc_table(text: &str) -> Result<Vec<(DcId, SocketAddr)>, String> {
    text.split(',')
        .map(|entry| {
            let (dc, addr) = entry
                .split_once('=')
                .ok_or_else(|| format!("{entry:?} is not NAME=ADDR"))?;
            let dc = DcId::new(dc).map_err(|e| format!("{entry:?}: {e}"))?;
            let addr = addr.parse().map_err(|e| format!("{entry:?}: {e}"))?;
            Ok((dc, addr))
        })
        .collect()
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let keys: Vec<String> = std::env::args().skip(1).collect();
    let (Ok(certs), Ok(dcs)) = (std::env::var("HOMING_CERTS"), std::env::var("HOMING_DCS")) else {
        eprintln!(
            "set HOMING_CERTS and HOMING_DCS (`homing devnet --serve` prints both), then: router KEY..."
        );
        return ExitCode::from(2);
    };
    if keys.is_empty() {
        eprintln!("usage: router KEY... (keys in the empty namespace)");
        return ExitCode::from(2);
    }
    let dcs = match dc_table(&dcs) {
        Ok(dcs) => dcs,
        Err(e) => {
            eprintln!("HOMING_DCS: {e}");
            return ExitCode::from(2);
        }
    };
    let identity = Identity::new(Role::Router, None).expect("a router needs no DC");
    let tls = match pki::load_identity(&PathBuf::from(&certs), &identity) {
        Ok(tls) => tls,
        Err(e) => {
            eprintln!("loading the router certificate from {certs}: {e}");
            return ExitCode::from(2);
        }
    };
    let client = Client::new(&tls, ClientLimits::default()).expect("a QUIC client on loopback");
    // One Resolver per router process: its caches are what make a warm
    // request a hash lookup. Clone it into every request handler.
    let resolver = Resolver::new(client.clone(), ResolverConfig::new(dcs));

    for name in &keys {
        let key = match KeyName::new(name.as_str()) {
            Ok(name) => Key::in_namespace(Namespace::default(), name),
            Err(e) => {
                println!("{name}: 400 ({e})");
                continue;
            }
        };
        for attempt in ["cold", "warm"] {
            let started = Instant::now();
            let answer = resolver.resolve(&key).await;
            let took_us = started.elapsed().as_micros();
            let trips = answer.as_ref().map_or(0, |a| a.remote_round_trips);
            let from = answer.as_ref().map_or(String::new(), |a| {
                format!(" in {} (token {}, {trips} round trips)", a.dc, a.token)
            });
            match route(answer) {
                Route::Forward(actor) => {
                    println!("{name} [{attempt}, {took_us} µs]: forward to {actor}{from}")
                }
                Route::Refuse(status, why) => {
                    println!("{name} [{attempt}, {took_us} µs]: answer {status} ({why})")
                }
            }
        }
    }
    // Before exiting: the DCs free this router's connections at once.
    client.close().await;
    ExitCode::SUCCESS
}
