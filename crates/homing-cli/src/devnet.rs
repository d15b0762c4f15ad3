//! `homing devnet`: several DCs as real homingd instances in this process, on
//! loopback, with real QUIC and mutual TLS, redb DC stores and one shared
//! embedded global store; then the story of homing, each step checked.

use homing_core::{AcquireReply, Grant, Holder};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use homing_client::{Resolution, Resolver, ResolverConfig};
use homing_core::{
    ActorId, DcId, FailureReason, FencingToken, Key, KeyConfig, KeyName, LeaseKey, NamespaceScope,
    ReleaseCause, RenewReply, Reply, Request, ReservationId, Role, RunOutcome,
};
use homing_daemon::{Devnet, DevnetDc, DevnetOptions, Settings};
use homing_net::Client;

use crate::host_now;
use crate::show;

/// Options of `homing devnet`.
#[derive(Debug, Args)]
pub struct DevnetArgs {
    /// DC ids to start, comma-separated; the router is attached to the last.
    #[arg(long, value_delimiter = ',', default_value = "iad,fra,sin")]
    dcs: Vec<String>,
    /// Latency added between DCs (and from the router to other DCs), one-way, in milliseconds.
    #[arg(long, default_value_t = 0)]
    latency_ms: u64,
    /// Keep stores and certificates here instead of a temporary directory.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// After the story, keep the DCs running and print how to reach them.
    #[arg(long)]
    serve: bool,
    /// After the story, start an HTTP edge router (attached to the last DC)
    /// and one actor host per DC, and route a request to each.
    #[arg(long)]
    with_router: bool,
}

/// Prints checks and counts failures.
struct Story {
    failures: u32,
}

impl Story {
    fn step(&self, text: &str) {
        println!("\n{text}");
    }

    fn check(&mut self, ok: bool, what: impl AsRef<str>) {
        println!("   {} {}", if ok { "✓" } else { "✗" }, what.as_ref());
        if !ok {
            self.failures += 1;
        }
    }
}

/// Runs the devnet; returns whether every check passed.
pub async fn run(args: DevnetArgs) -> anyhow::Result<bool> {
    let ids = args
        .dcs
        .iter()
        .map(|d| DcId::new(d.as_str()).with_context(|| format!("--dcs {d:?}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if ids.len() < 3 {
        bail!("--dcs: the story needs at least 3 DCs, got {}", ids.len());
    }
    let net = Devnet::start(DevnetOptions {
        dcs: ids,
        latency_ms: args.latency_ms,
        data_dir: args.data_dir.clone(),
        overrides: Settings::default(),
    })
    .await?;
    let dcs = net.dcs();
    let certs = net.certs().to_path_buf();

    println!(
        "homing devnet: {} DCs on loopback, QUIC + mutual TLS, redb stores in {}",
        dcs.len(),
        net.dir().display()
    );
    for dc in dcs {
        let http = dc
            .daemon
            .metrics_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let relay = match args.latency_ms {
            0 => String::new(),
            ms => format!(", reached via relay {} (+{ms} ms each way)", dc.reached_at),
        };
        println!(
            "   {} serving on {}{relay} (status page http://{http}/, metrics http://{http}/metrics)",
            dc.id,
            dc.daemon.local_addr(),
        );
    }

    let mut failures = story(&net).await?;
    let edge = if args.with_router {
        let (edge, router_failures) = edge::start(&net, args.serve).await?;
        failures += router_failures;
        Some(edge)
    } else {
        None
    };
    // After every step, the router's included.
    if failures == 0 {
        println!("\nall checks passed");
    } else {
        println!("\n{failures} check(s) failed");
    }
    let ok = failures == 0;

    if args.serve {
        let table: Vec<String> = {
            let router_at = dcs.len() - 1;
            let mut order: Vec<&DevnetDc> = vec![&dcs[router_at]];
            order.extend(dcs.iter().take(router_at));
            order
                .iter()
                .map(|dc| format!("{}={}", dc.id, dc.daemon.local_addr()))
                .collect()
        };
        println!("\nserving until Ctrl-C. Try:");
        println!(
            "   export HOMING_CERTS={} HOMING_DCS={}",
            certs.display(),
            table.join(",")
        );
        println!(
            "   homing reserve my-key --actor 10.0.0.1:8080 --at {}",
            dcs[0].id
        );
        println!("   homing resolve my-key");
        println!("   homing chain my-key");
        if let Some(http) = dcs[0].daemon.metrics_addr() {
            println!("   open http://{http}/ in a browser: the status page of the whole devnet");
        }
        if let Some(edge) = &edge {
            edge.print_curl();
        }
        tokio::signal::ctrl_c().await?;
    }
    if let Some(edge) = edge {
        edge.stop().await;
    }
    net.shutdown().await;
    Ok(ok)
}

struct Actors {
    hosts: Vec<(DcId, Client)>,
    admin: Client,
    /// Each story actor's lease key (its host would hold it: HostAgent draws one per acquire).
    leases: std::sync::Mutex<std::collections::HashMap<String, LeaseKey>>,
}

impl Actors {
    /// The lease key the host of `actor` acquires, renews and releases with.
    fn lease(&self, actor: &str) -> anyhow::Result<LeaseKey> {
        let mut leases = self.leases.lock().expect("never poisoned");
        if let Some(lease) = leases.get(actor) {
            return Ok(*lease);
        }
        let lease = homing_client::new_lease_key()?;
        leases.insert(actor.to_string(), lease);
        Ok(lease)
    }

    fn host(&self, dc: &DcId) -> &Client {
        // Invariant: one host client per devnet DC, built below.
        &self
            .hosts
            .iter()
            .find(|(id, _)| id == dc)
            .expect("a host client per dc")
            .1
    }
}

/// How long the story's waiting host waits, in milliseconds.
const STORY_WAIT_MS: u32 = 10_000;

fn acquire_request(
    key: &Key,
    actor: &str,
    wait_ms: u32,
    lease: LeaseKey,
) -> anyhow::Result<Request> {
    Ok(Request::Acquire {
        config: KeyConfig {
            name: Some(key.name.clone()),
            namespace: key.namespace.clone(),
            tag: None,
        },
        actor: ActorId::new(actor)?,
        lease,
        host_time: host_now(),
        wait_ms,
    })
}

async fn acquire(
    actors: &Actors,
    net: &Devnet,
    at: &DcId,
    key: &Key,
    actor: &str,
) -> anyhow::Result<Reply> {
    let request = acquire_request(key, actor, 0, actors.lease(actor)?)?;
    Ok(actors.host(at).request(&net.peer(at), &request).await?)
}

fn describe(reply: &Reply) -> String {
    match reply {
        Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation,
            token,
            deadlines,
            ..
        })) => format!(
            "Acquired {reservation} token {token}; renew in {} ms, hard stop in {} ms",
            deadlines.renew_at.ms_since(host_now()),
            deadlines.hard_terminate_at.ms_since(host_now())
        ),
        Reply::Acquire(AcquireReply::HeldElsewhere(Holder {
            reservation, actor, ..
        })) => format!("HeldElsewhere: actor {actor} under {reservation}"),
        other => format!("{other:?}"),
    }
}

fn acquired(reply: &Reply) -> Option<(ReservationId, FencingToken)> {
    match reply {
        Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation, token, ..
        })) => Some((reservation.clone(), *token)),
        _ => None,
    }
}

/// Resolves `key`, prints the answer and its wall time, and checks it.
async fn resolve_and_check(
    s: &mut Story,
    router: &Resolver,
    key: &Key,
    what: &str,
    expect: impl Fn(&Resolution) -> bool,
) {
    let started = Instant::now();
    match router.resolve(key).await {
        Ok(r) => {
            println!(
                "   {}  [{} ms]",
                show::resolution(&r),
                started.elapsed().as_millis()
            );
            s.check(expect(&r), what);
        }
        Err(e) => s.check(false, format!("resolve: {e}")),
    }
}

/// The story's steps 1–8; returns how many checks failed.
async fn story(net: &Devnet) -> anyhow::Result<u32> {
    let mut s = Story { failures: 0 };
    let dcs = net.dcs();
    let (a, b, c) = (
        dcs[0].id.clone(),
        dcs[1].id.clone(),
        dcs[dcs.len() - 1].id.clone(),
    );
    let mut hosts = Vec::new();
    for dc in dcs {
        hosts.push((dc.id.clone(), net.client(Role::Host, Some(&dc.id))?));
    }
    let actors = Actors {
        hosts,
        admin: net.client(Role::Admin, None)?,
        leases: Default::default(),
    };
    // The router is attached to the last DC: nearest first, others through their relays.
    let table = net.router_table(&c);
    // A long tail TTL keeps the story deterministic at any --latency-ms: the
    // router drops its answer only when told routing failed (step 5).
    let config = ResolverConfig {
        tail_ttl_ms: 60_000,
        ..ResolverConfig::new(table)
    };
    let router = Resolver::new(net.client(Role::Router, None)?, config);

    let run = format!("{:04x}", host_now().as_ms() & 0xffff);
    let room = Key::new(KeyName::new(format!("room-{run}"))?);

    s.step(&format!("1. a host in {a} connects to key {room}"));
    let reply = acquire(&actors, net, &a, &room, &format!("{a}-host:9000")).await?;
    println!("   {}", describe(&reply));
    let Some((first, token)) = acquired(&reply) else {
        s.check(false, format!("{a} acquires the new key"));
        return Ok(s.failures);
    };
    s.check(
        first.dc() == &a && token == FencingToken::FIRST,
        format!("{a} wrote its record, then the global entry {room} → {first}"),
    );

    s.step(&format!("2. a router attached to {c} resolves it"));
    let expect = |r: &Resolution| r.reservation == first && r.remote_round_trips == 2;
    resolve_and_check(
        &mut s,
        &router,
        &room,
        &format!("global read at {c} + one round trip to {a}"),
        expect,
    )
    .await;
    let expect = |r: &Resolution| r.from_cache && r.remote_round_trips == 0;
    resolve_and_check(
        &mut s,
        &router,
        &room,
        "again: one cache lookup, no round trip",
        expect,
    )
    .await;

    s.step(&format!(
        "3. a host in {b} connects to {room} while {a}'s actor lives"
    ));
    let reply = acquire(&actors, net, &b, &room, &format!("{b}-host:9000")).await?;
    println!("   {}", describe(&reply));
    s.check(
        matches!(&reply, Reply::Acquire(AcquireReply::HeldElsewhere(Holder { reservation, .. })) if *reservation == first),
        "connect returns the live actor; no second one starts",
    );

    s.step(&format!(
        "4. a host in {b} connects again and waits; {a}'s actor stops, releasing with a failure"
    ));
    let waiting = {
        let actor = format!("{b}-host:9000");
        let request = acquire_request(&room, &actor, STORY_WAIT_MS, actors.lease(&actor)?)?;
        let (client, peer) = (actors.host(&b).clone(), net.peer(&b));
        tokio::spawn(async move { client.request(&peer, &request).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    s.check(
        !waiting.is_finished(),
        format!("{b} parks the acquire at {a}, which owns the live reservation"),
    );
    let reason = FailureReason::new("demo: the room's state was lost")?;
    let release = Request::Release {
        reservation: first.clone(),
        token,
        lease: actors.lease(&format!("{a}-host:9000"))?,
        outcome: RunOutcome::Failed { reason },
    };
    let released_at = Instant::now();
    let released = actors.host(&a).request(&net.peer(&a), &release).await?;
    s.check(
        matches!(
            released,
            Reply::Release(homing_core::ReleaseReply::Released)
        ),
        format!("{first} released (outcome: failed)"),
    );
    let reply = waiting.await??;
    println!(
        "   {}  [{} ms after the release]",
        describe(&reply),
        released_at.elapsed().as_millis()
    );
    let second = acquired(&reply);
    s.check(
        second.as_ref().is_some_and(|(id, t)| id.dc() == &b && *t == token.next()),
        format!("{a} woke the waiter: recreated in {b} with token + 1; {a} linked {first} → it (the global entry never changes)"),
    );
    s.check(
        matches!(&reply, Reply::Acquire(AcquireReply::Acquired(Grant { previous: Some(p), .. }))
            if p.reservation == first && matches!(p.ended, ReleaseCause::Released(RunOutcome::Failed { .. }))),
        "the new holder learns the previous run failed",
    );
    let Some((second, second_token)) = second else {
        // The story cannot go on without the second holder.
        return Ok(s.failures.max(1));
    };

    s.step(&format!(
        "5. routing to {a}'s old actor fails; the router reports it and resolves again"
    ));
    if let Ok(old) = router.resolve(&room).await {
        router.report_unreachable(&old).await;
    }
    let expect = |r: &Resolution| r.reservation == second && r.remote_round_trips == 2;
    let what = format!("entry from cache; {a} answers with the link, {b} with the actor");
    resolve_and_check(&mut s, &router, &room, &what, expect).await;
    match router.trace(&room).await {
        Ok(walked) => {
            println!(
                "   the chain, hop by hop:\n{}",
                show::chain(&walked, "     ")
            );
            s.check(
                walked.remote_round_trips == 1
                    && walked.jumps.iter().any(|j| j.taken && j.to == second),
                "entry and the chain's last member now cached: the walk starts at it, only its dc is asked",
            );
        }
        Err(e) => s.check(false, format!("trace: {e}")),
    }
    let expect = |r: &Resolution| r.from_cache && r.reservation == second;
    resolve_and_check(&mut s, &router, &room, "and again: from cache", expect).await;

    let lobby = Key::new(KeyName::new(format!("lobby-{run}"))?);
    s.step(&format!(
        "6. hosts in {a} and {c} race for a new key, {lobby}"
    ));
    let (actor_a, actor_c) = (format!("{a}-host:9001"), format!("{c}-host:9001"));
    let (x, y) = tokio::join!(
        acquire(&actors, net, &a, &lobby, &actor_a),
        acquire(&actors, net, &c, &lobby, &actor_c),
    );
    let (x, y) = (x?, y?);
    println!("   {a}: {}\n   {c}: {}", describe(&x), describe(&y));
    let winner = acquired(&x).or(acquired(&y)).map(|(id, _)| id);
    let loser_follows = [&x, &y].iter().any(|r| matches!(r, Reply::Acquire(AcquireReply::HeldElsewhere(Holder { reservation, .. })) if Some(reservation) == winner.as_ref()));
    s.check(
        winner.is_some() && loser_follows,
        "exactly one winner; the loser returns the winner's actor",
    );

    s.step(&format!(
        "7. an operator drains {room} (allow_renew = false) through {c}"
    ));
    let drained = actors
        .admin
        .request(&net.peer(&c), &Request::Drain { key: room.clone() })
        .await?;
    s.check(
        matches!(drained, Reply::Drained),
        format!("{c} forwarded the drain to {b}, which owns the tail"),
    );
    let renew = Request::Renew {
        reservation: second.clone(),
        token: second_token,
        lease: actors.lease(&format!("{b}-host:9000"))?,
        host_time: host_now(),
    };
    let renewed = actors.host(&b).request(&net.peer(&b), &renew).await?;
    let answer = match &renewed {
        Reply::Renew(RenewReply::Renewed(_)) => "renewed".to_string(),
        Reply::Renew(RenewReply::Draining) => "draining, no more renewals".to_string(),
        Reply::Renew(RenewReply::StaleToken { current }) => format!("stale token (now {current})"),
        Reply::Renew(RenewReply::Expired) => "expired".to_string(),
        Reply::Error(e) => format!("refused: {e}"),
        _ => "an answer of the wrong kind".to_string(),
    };
    println!("   {b}'s host renews: {answer}");
    s.check(
        matches!(renewed, Reply::Renew(RenewReply::Draining)),
        "renewal refused: the host stops by its deadlines",
    );

    s.step(&format!(
        "8. what {a} and {b} recorded: their lifecycle events for {room}"
    ));
    let mut kinds = Vec::new();
    for dc in [&a, &b] {
        let watch = Request::Watch {
            scope: NamespaceScope::exact(room.namespace.clone()),
            after: 0,
            wait_ms: 0,
        };
        match actors.admin.request(&net.peer(dc), &watch).await? {
            Reply::Events { events, .. } => {
                for event in events.iter().filter(|e| e.key == room) {
                    println!("   {}", crate::scope::event_line(dc, event));
                    kinds.push(event.kind.name());
                }
            }
            other => println!("   {dc}: {other:?}"),
        }
    }
    s.check(
        kinds == ["reserved", "released", "linked", "reserved", "drained"],
        "reserved, released (failed), linked in the old dc; reserved, drained in the new — durable, in order, resumable by `homing watch`",
    );

    Ok(s.failures)
}

/// `--with-router`: an HTTP edge router on a Resolver attached to the last
/// DC, and one actor host per DC, each holding its own key (`demo` in the
/// first DC, `demo-<dc>` in the others).
mod edge {
    use std::time::Duration;

    use homing_client::{Resolver, ResolverConfig};
    use homing_core::AcquireReply;
    use homing_core::{KeyConfig, KeyName, Role};
    use homing_edge::{ActorHost, ActorHostConfig, EdgeConfig, EdgeRouter, Serving};

    use homing_daemon::Devnet;

    use super::Story;

    /// Time in-flight requests get when the devnet stops, in milliseconds.
    const DRAIN_MS: u64 = 1_000;

    /// The running router and actor hosts.
    pub struct Edge {
        serving: Serving,
        hosts: Vec<ActorHost>,
        /// Where the router's /metrics, /healthz and /readyz are served.
        metrics_at: std::net::SocketAddr,
        stop_metrics: tokio::sync::watch::Sender<bool>,
        metrics: tokio::task::JoinHandle<()>,
    }

    fn key_of(dcs: &[homing_daemon::DevnetDc], i: usize) -> String {
        if i == 0 {
            "demo".to_string()
        } else {
            format!("demo-{}", dcs[i].id)
        }
    }

    /// Starts the router and the hosts; unless `serving`, routes one request
    /// to each key and checks it landed in the host's DC. Returns how many
    /// checks failed.
    pub async fn start(net: &Devnet, serving: bool) -> anyhow::Result<(Edge, u32)> {
        let mut s = Story { failures: 0 };
        let dcs = net.dcs();
        let last = dcs.len() - 1;
        s.step(&format!(
            "9. an HTTP edge router attached to {} routes to one actor host per DC",
            dcs[last].id
        ));
        let mut hosts = Vec::new();
        for (i, dc) in dcs.iter().enumerate() {
            let peer = net.peer(&dc.id);
            let key = KeyConfig::named(KeyName::new(key_of(dcs, i))?);
            let config = ActorHostConfig::new(peer, key, "127.0.0.1:0".parse()?);
            let client = net.client(Role::Host, Some(&dc.id))?;
            match ActorHost::start(client, config).await? {
                AcquireReply::Acquired(host) => {
                    println!(
                        "   actor host for {} in {} on {} ({}, token {})",
                        host.key(),
                        dc.id,
                        host.local_addr(),
                        host.reservation(),
                        host.token()
                    );
                    hosts.push(*host);
                }
                other => s.check(false, format!("{}: {other:?}", key_of(dcs, i))),
            }
        }
        let table = net.router_table(&dcs[last].id);
        let resolver = Resolver::new(net.client(Role::Router, None)?, ResolverConfig::new(table));
        let router = EdgeRouter::new(resolver, EdgeConfig::default());
        let serving_at = router.spawn(tokio::net::TcpListener::bind("127.0.0.1:0").await?)?;
        println!("   edge router on http://{}", serving_at.local_addr());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let metrics_at = listener.local_addr()?;
        let (stop_metrics, stopped) = tokio::sync::watch::channel(false);
        let connections = Some(serving_at.connections());
        let metrics = homing_edge::metrics::spawn(listener, router.clone(), connections, stopped);
        println!("   edge router metrics on http://{metrics_at}/metrics");
        let edge = Edge {
            serving: serving_at,
            hosts,
            metrics_at,
            stop_metrics,
            metrics,
        };
        if !serving {
            for host in &edge.hosts {
                let key = host.key().to_string();
                match homing_edge::probe::get(edge.serving.local_addr(), "/", Some(&key)).await {
                    Ok((status, body)) => {
                        let body = String::from_utf8_lossy(&body);
                        println!(
                            "   curl -H 'x-homing-key: {key}' → {status} {}",
                            body.trim()
                        );
                        let landed = format!("\"reservation\":\"{}\"", host.reservation());
                        s.check(
                            status.is_success() && body.contains(&landed),
                            format!("{key} routed to its actor in {}", host.reservation().dc()),
                        );
                    }
                    Err(e) => s.check(false, format!("{key}: {e}")),
                }
            }
        }
        Ok((edge, s.failures))
    }

    impl Edge {
        /// Prints curl lines that reach each actor through the router.
        pub fn print_curl(&self) {
            let at = self.serving.local_addr();
            for host in &self.hosts {
                println!("   curl -H 'x-homing-key: {}' http://{at}/", host.key());
            }
            if let Some(host) = self.hosts.first() {
                println!("   curl http://{at}/k/{}/any/path", host.key());
            }
            println!(
                "   curl http://{}/metrics   # the router's counters",
                self.metrics_at
            );
        }

        /// Stops the router, then releases every host's key.
        pub async fn stop(self) {
            self.serving.stop(Duration::from_millis(DRAIN_MS)).await;
            let _ = self.stop_metrics.send(true);
            let _ = self.metrics.await;
            for host in self.hosts {
                let key = host.key().to_string();
                if let Err(e) = host.stop().await {
                    eprintln!("actor host {key}: release failed: {e}");
                }
            }
        }
    }
}
