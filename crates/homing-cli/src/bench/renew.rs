//! `homing bench renew`: how many renewals per second one homingd sustains
//! for 10 000 live leases, renewed by 64 concurrent tasks cycling over them,
//! beside the same daemon renewing 64 host sessions of 250 keys each (one
//! renewal carries all of a session's keys).

use homing_core::{AcquireReply, Grant};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use homing_core::{
    FencingToken, KeyConfig, LeaseKey, RenewReply, Reply, Request, ReservationId, SessionId,
    SessionRenewReply,
};

use super::{OneDc, acquire_request, key, median_cell, run_cell, run_tag, thousands};
use crate::host_now;

const LEASES: usize = 10_000;
const TASKS: usize = 64;
const CELL: Duration = Duration::from_secs(3);
const REPETITIONS: usize = 3;
/// Host sessions of the session lane, one per task.
const SESSIONS: usize = TASKS;
/// Keys held under each session.
const KEYS_PER_SESSION: usize = 250;

/// Runs the suite; always `true` (nothing here has a target to enforce).
pub async fn run() -> anyhow::Result<bool> {
    let OneDc {
        net, client, peer, ..
    } = OneDc::start().await?;
    let leases = acquire_leases(&client, &peer).await?;
    let sessions = open_sessions(&client, &peer).await?;
    let (mut cells, mut session_cells) = (Vec::new(), Vec::new());
    for _ in 0..REPETITIONS {
        cells.extend(renew_cells(&client, &peer, &leases, 1).await?);
        session_cells.push(session_cell(&client, &peer, &sessions).await?);
    }
    net.shutdown().await;
    let c = median_cell(&cells);
    let sc = median_cell(&session_cells);

    println!(
        "\nRenew through homingd (1 DC, QUIC + mTLS, redb DC store with group commit), \
         {TASKS} tasks cycling over {LEASES} leases, median of {REPETITIONS} × {} ms\n",
        CELL.as_millis()
    );
    println!("| leases | tasks | renewals/s | p50 ms | p99 ms | failed |");
    println!("|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {TASKS} | {} | {:.2} | {:.2} | {} |",
        thousands(LEASES as f64),
        thousands(c.rate),
        c.p50_us as f64 / 1000.0,
        c.p99_us as f64 / 1000.0,
        c.errors
    );
    let period_s = LEASES as f64 / c.rate.max(1e-9);
    println!(
        "\nat this rate one daemon renews all {LEASES} leases every {period_s:.2} s: \
         with renewal at a third of the lease, it carries {} leases of a 10 s ttl",
        thousands(c.rate * 10.0 / 3.0)
    );

    let held = SESSIONS * KEYS_PER_SESSION;
    println!(
        "\nThe same daemon, lanes alternating: per-key Renew over {LEASES} leases vs \
         RenewSession over {SESSIONS} host sessions of {KEYS_PER_SESSION} keys each \
         ({held} keys acquired under them, not timed), {TASKS} tasks\n"
    );
    println!(
        "| lane | live leases | renewals/s | p50 ms | p99 ms | failed | leases carried at a 10 s ttl |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (lane, leases, cell, per_renewal) in [
        ("per-key Renew", LEASES, &c, 1),
        ("RenewSession", held, &sc, KEYS_PER_SESSION),
    ] {
        println!(
            "| {lane} | {} | {} | {:.2} | {:.2} | {} | {} |",
            thousands(leases as f64),
            thousands(cell.rate),
            cell.p50_us as f64 / 1000.0,
            cell.p99_us as f64 / 1000.0,
            cell.errors,
            thousands(cell.rate * 10.0 / 3.0 * per_renewal as f64),
        );
    }
    println!(
        "\nsession / per-key renewals/s: {:.2}x; leases carried (renewals alone, \
         extrapolated from the renewal rate, not held): {:.0}x",
        sc.rate / c.rate.max(1e-9),
        sc.rate * KEYS_PER_SESSION as f64 / c.rate.max(1e-9)
    );
    Ok(true)
}

/// A host session the bench opened, with its secret; renewed by one task
/// at a time.
type BenchSession = (SessionId, LeaseKey, tokio::sync::Mutex<()>);

/// Opens [`SESSIONS`] host sessions and acquires [`KEYS_PER_SESSION`] keys
/// under each, [`TASKS`] at a time (not timed).
async fn open_sessions(
    client: &homing_net::Client,
    peer: &homing_net::Peer,
) -> anyhow::Result<Arc<Vec<BenchSession>>> {
    let tag = run_tag();
    println!(
        "renew: opening {SESSIONS} host sessions, {KEYS_PER_SESSION} keys under each \
         ({TASKS} at a time, not timed)…"
    );
    let mut sessions = Vec::with_capacity(SESSIONS);
    for _ in 0..SESSIONS {
        sessions.push(open_session(client, peer).await?);
    }
    let sessions = Arc::new(sessions);
    let prefix = format!("held-{tag}");
    acquire_under(
        client,
        peer,
        &sessions,
        SESSIONS * KEYS_PER_SESSION,
        &prefix,
    )
    .await?;
    let sessions = (sessions.iter())
        .map(|(id, secret)| (id.clone(), *secret, tokio::sync::Mutex::new(())))
        .collect();
    Ok(Arc::new(sessions))
}

/// Acquires `count` keys named `PREFIX-i`, key `i` under session `i` mod
/// the sessions, [`TASKS`] at a time (not timed).
pub(super) async fn acquire_under(
    client: &homing_net::Client,
    peer: &homing_net::Peer,
    sessions: &Arc<Vec<(SessionId, LeaseKey)>>,
    count: usize,
    prefix: &str,
) -> anyhow::Result<()> {
    let all: Vec<usize> = (0..count).collect();
    for batch in all.chunks(TASKS) {
        let handles: Vec<_> = (batch.iter())
            .map(|&i| {
                let (client, peer, sessions) = (client.clone(), peer.clone(), sessions.clone());
                let name = format!("{prefix}-{i}");
                tokio::spawn(async move {
                    let (session, secret) = &sessions[i % sessions.len()];
                    acquire_in_session(&client, &peer, name, session, *secret).await
                })
            })
            .collect();
        for handle in handles {
            handle.await??;
        }
    }
    Ok(())
}

/// Opens a host session at `peer` under a fresh secret.
pub(super) async fn open_session(
    client: &homing_net::Client,
    peer: &homing_net::Peer,
) -> anyhow::Result<(SessionId, LeaseKey)> {
    let secret = homing_client::new_lease_key()?;
    let open = Request::OpenSession {
        secret,
        host_time: host_now(),
    };
    match client.request(peer, &open).await? {
        Reply::SessionOpened { session, .. } => Ok((session, secret)),
        other => bail!("open session answered {other:?}"),
    }
}

/// Acquires key `name` under `session`, not waiting.
pub(super) async fn acquire_in_session(
    client: &homing_net::Client,
    peer: &homing_net::Peer,
    name: String,
    session: &SessionId,
    secret: LeaseKey,
) -> anyhow::Result<()> {
    let request = Request::AcquireInSession {
        config: KeyConfig::named(key(name)?.name),
        actor: homing_core::ActorId::new("bench-host:9000")?,
        lease: homing_client::new_lease_key()?,
        host_time: host_now(),
        wait_ms: 0,
        session: session.clone(),
        secret,
    };
    match client.request(peer, &request).await? {
        Reply::Acquire(AcquireReply::Acquired(_)) => Ok(()),
        other => bail!("acquire in session answered {other:?}"),
    }
}

/// Renews `session` once, acknowledging no notice: its new deadlines.
pub(super) async fn renew_session(
    client: &homing_net::Client,
    peer: &homing_net::Peer,
    session: &SessionId,
    secret: LeaseKey,
) -> anyhow::Result<homing_core::Deadlines> {
    let request = Request::RenewSession {
        session: session.clone(),
        secret,
        host_time: host_now(),
        ack: 0,
    };
    match client.request(peer, &request).await? {
        Reply::SessionRenewed(SessionRenewReply::Renewed { deadlines, .. }) => Ok(deadlines),
        other => bail!("renew session answered {other:?}"),
    }
}

/// One cell of [`TASKS`] tasks renewing the sessions in turn, each session
/// by one task at a time (its lock held across the renewal, counted in its
/// latency).
async fn session_cell(
    client: &homing_net::Client,
    peer: &homing_net::Peer,
    sessions: &Arc<Vec<BenchSession>>,
) -> anyhow::Result<super::Cell> {
    let (client, peer, sessions) = (client.clone(), peer.clone(), sessions.clone());
    run_cell(TASKS, CELL, move |n| {
        let (client, peer, sessions) = (client.clone(), peer.clone(), sessions.clone());
        async move {
            let (session, secret, turn) = &sessions[n as usize % sessions.len()];
            let _turn = turn.lock().await;
            renew_session(&client, &peer, session, *secret).await?;
            Ok(())
        }
    })
    .await
}

/// Acquires [`LEASES`] fresh leases from `peer`, [`TASKS`] at a time.
async fn acquire_leases(
    client: &homing_net::Client,
    peer: &homing_net::Peer,
) -> anyhow::Result<Arc<Vec<(ReservationId, FencingToken, LeaseKey)>>> {
    let tag = run_tag();
    println!("renew: acquiring {LEASES} leases ({TASKS} at a time, not timed)…");
    let mut leases: Vec<(ReservationId, FencingToken, LeaseKey)> = Vec::with_capacity(LEASES);
    let mut next = 0usize;
    while next < LEASES {
        let batch: Vec<_> = (next..(next + TASKS).min(LEASES))
            .map(|i| {
                let (client, peer, name) =
                    (client.clone(), peer.clone(), format!("lease-{tag}-{i}"));
                tokio::spawn(async move {
                    let lease = homing_client::new_lease_key()?;
                    let request = acquire_request(&key(name)?, lease)?;
                    match client.request(&peer, &request).await? {
                        Reply::Acquire(AcquireReply::Acquired(Grant {
                            reservation,
                            token,
                            ..
                        })) => Ok((reservation, token, lease)),
                        other => bail!("acquire answered {other:?}"),
                    }
                })
            })
            .collect();
        next += batch.len();
        for handle in batch {
            leases.push(handle.await??);
        }
    }
    Ok(Arc::new(leases))
}

/// `repetitions` cells of [`TASKS`] tasks renewing `leases` in turn.
async fn renew_cells(
    client: &homing_net::Client,
    peer: &homing_net::Peer,
    leases: &Arc<Vec<(ReservationId, FencingToken, LeaseKey)>>,
    repetitions: usize,
) -> anyhow::Result<Vec<super::Cell>> {
    let mut cells = Vec::new();
    for _ in 0..repetitions {
        let (client, peer, leases) = (client.clone(), peer.clone(), leases.clone());
        cells.push(
            run_cell(TASKS, CELL, move |n| {
                let (client, peer) = (client.clone(), peer.clone());
                let (reservation, token, lease) = leases[n as usize % leases.len()].clone();
                async move {
                    let request = Request::Renew {
                        reservation,
                        token,
                        lease,
                        host_time: host_now(),
                    };
                    match client.request(&peer, &request).await? {
                        Reply::Renew(RenewReply::Renewed(_)) => Ok(()),
                        other => bail!("renew answered {other:?}"),
                    }
                }
            })
            .await?,
        );
    }
    Ok(cells)
}

/// `homing bench renew-etcd`: the same renewals with the DC store (and the
/// global store) on a local 3-member etcd, next to etcd's own guarded put
/// (one txn per renewal: compare the key's `mod_revision`, put) of records of
/// the same size from the same number of tasks, in one run.
#[cfg(feature = "etcd")]
pub async fn run_etcd() -> anyhow::Result<bool> {
    use homing_store::etcd::{EtcdDcStore, EtcdGlobalStore};
    use homing_store::etcd_cluster::LocalEtcdCluster;

    let cluster = LocalEtcdCluster::start().await?;
    let tag = run_tag();
    let prefix = format!("/bench-{tag}");
    let global = Arc::new(
        EtcdGlobalStore::connect(cluster.endpoints(), &format!("{prefix}/global/")).await?,
    );
    let records =
        Arc::new(EtcdDcStore::connect(cluster.endpoints(), &format!("{prefix}/dc/dc0/")).await?);
    let one = super::OwnGlobalDc::start_with(global, Some(records)).await?;
    let leases = acquire_leases(&one.client, &one.peer).await?;
    let sample = one.daemon.node().records().get(&leases[0].0).await?;
    let record_bytes = sample
        .map(|r| homing_store::keyspace::encode_record(&r).map(|b| b.len()))
        .transpose()?
        .unwrap_or(0);
    let mut homing = Vec::new();
    let mut raw = Vec::new();
    let kv = etcd_client::Client::connect(cluster.endpoints(), None)
        .await?
        .kv_client();
    let raw_keys = Arc::new(raw_records(&kv, &prefix, record_bytes).await?);
    for _ in 0..REPETITIONS {
        homing.extend(renew_cells(&one.client, &one.peer, &leases, 1).await?);
        raw.push(raw_cell(&kv, &raw_keys, record_bytes).await?);
    }
    one.daemon.shutdown().await;
    drop(cluster);
    let (h, r) = (median_cell(&homing), median_cell(&raw));
    println!(
        "\nRenew through homingd (1 DC, QUIC + mTLS, DC store and global store on a 3-member \
         etcd on loopback), {TASKS} tasks cycling over {LEASES} leases, vs etcd's own guarded \
         put of a {record_bytes}-byte value (txn: compare mod_revision, put; one per renewal), \
         same tasks and keys; median of {REPETITIONS} × {} ms, lanes alternating\n",
        CELL.as_millis()
    );
    println!("| lane | renewals/s | p50 ms | p99 ms | failed |");
    println!("|---|---:|---:|---:|---:|");
    for (name, c) in [
        ("homing renew (etcd DC store)", &h),
        ("raw etcd guarded put", &r),
    ] {
        println!(
            "| {name} | {} | {:.2} | {:.2} | {} |",
            thousands(c.rate),
            c.p50_us as f64 / 1000.0,
            c.p99_us as f64 / 1000.0,
            c.errors
        );
    }
    println!("\nhoming / raw: {:.2}x", h.rate / r.rate.max(1e-9));
    Ok(true)
}

/// [`LEASES`] keys of `record_bytes` under `prefix/raw/`, with their
/// `mod_revision`s, for the raw lane.
#[cfg(feature = "etcd")]
async fn raw_records(
    kv: &etcd_client::KvClient,
    prefix: &str,
    record_bytes: usize,
) -> anyhow::Result<Vec<(String, std::sync::atomic::AtomicI64)>> {
    let mut kv = kv.clone();
    let mut keys = Vec::with_capacity(LEASES);
    for i in 0..LEASES {
        let k = format!("{prefix}/raw/{i}");
        let put = kv.put(k.clone(), vec![b'r'; record_bytes], None).await?;
        let revision = put.header().map_or(0, |h| h.revision());
        keys.push((k, std::sync::atomic::AtomicI64::new(revision)));
    }
    Ok(keys)
}

/// One cell of guarded puts: each op takes the next key, compares its
/// last known `mod_revision` and puts a new value (each key is one task's at
/// a time: the tasks cycle over more keys than there are tasks).
#[cfg(feature = "etcd")]
async fn raw_cell(
    kv: &etcd_client::KvClient,
    keys: &Arc<Vec<(String, std::sync::atomic::AtomicI64)>>,
    record_bytes: usize,
) -> anyhow::Result<super::Cell> {
    use etcd_client::{Compare, CompareOp, Txn, TxnOp};
    use std::sync::atomic::Ordering;
    let (kv, keys) = (kv.clone(), keys.clone());
    run_cell(TASKS, CELL, move |n| {
        let (mut kv, keys) = (kv.clone(), keys.clone());
        async move {
            let (k, revision) = &keys[n as usize % keys.len()];
            let read = revision.load(Ordering::Relaxed);
            let txn = Txn::new()
                .when([Compare::mod_revision(k.clone(), CompareOp::Equal, read)])
                .and_then([TxnOp::put(k.clone(), vec![b'n'; record_bytes], None)]);
            let done = kv.txn(txn).await?;
            if !done.succeeded() {
                bail!("raw guarded put: {k} moved");
            }
            let now = done.header().map_or(0, |h| h.revision());
            revision.store(now, Ordering::Relaxed);
            Ok(())
        }
    })
    .await
}

/// Host sessions that keep renewing while `session-reap`'s session is
/// reaped: their renewal latency before and during the reap.
const BYSTANDERS: usize = 8;
/// A bystander's pause between renewals, ms.
const BYSTANDER_PAUSE_MS: u64 = 20;
/// The lease of `session-reap`'s daemon: short, so the wait is short.
const REAP_TTL_MS: u64 = 2_000;
/// Its grace after expiry, ms.
const REAP_GRACE_MS: u64 = 500;
/// How often its reaper runs, ms.
const REAP_INTERVAL_MS: u64 = 100;

/// `homing bench session-reap`: one host session holding `keys` keys
/// stops renewing; how long after its expiry plus grace the DC's reaper
/// has every key `Released(Expired)` (counted from the DC's event log),
/// the reap rate, and the renewal latency of [`BYSTANDERS`] other
/// sessions before and during the reap.
pub async fn run_reap(keys: usize, redb_cache_mb: Option<u64>) -> anyhow::Result<bool> {
    use homing_core::event::EventKind;
    use homing_core::{Namespace, NamespaceScope, Role};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;

    let dc = homing_core::DcId::new("dc0")?;
    let net = homing_daemon::Devnet::start(homing_daemon::DevnetOptions {
        dcs: vec![dc.clone()],
        overrides: homing_daemon::Settings {
            lease_ttl_ms: Some(REAP_TTL_MS),
            renew_at_permille: Some(300),
            soft_margin_ms: Some(800),
            hard_margin_ms: Some(400),
            grace_ms: Some(REAP_GRACE_MS),
            reaper_interval_ms: Some(REAP_INTERVAL_MS),
            redb_cache_mb,
            ..homing_daemon::Settings::default()
        },
        ..homing_daemon::DevnetOptions::default()
    })
    .await?;
    let client = net.client(Role::Host, Some(&dc))?;
    let admin = net.client(Role::Admin, None)?;
    let peer = net.peer(&dc);
    let tag = run_tag();
    let (session, secret) = open_session(&client, &peer).await?;
    let stop = Arc::new(AtomicBool::new(false));
    let mut bystanders = Vec::with_capacity(BYSTANDERS);
    for _ in 0..BYSTANDERS {
        let (session, secret) = open_session(&client, &peer).await?;
        let (client, peer, stop) = (client.clone(), peer.clone(), stop.clone());
        bystanders.push(tokio::spawn(async move {
            // (when sent, latency µs) of each renewal.
            let mut samples: Vec<(Instant, u64)> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let sent = Instant::now();
                renew_session(&client, &peer, &session, secret).await?;
                samples.push((sent, sent.elapsed().as_micros() as u64));
                tokio::time::sleep(Duration::from_millis(BYSTANDER_PAUSE_MS)).await;
            }
            anyhow::Ok(samples)
        }));
    }
    println!(
        "session-reap: {keys} keys under session {session}, renewed while they are acquired (not timed); {BYSTANDERS} other sessions renewing every {BYSTANDER_PAUSE_MS} ms…"
    );
    let sizes = || super::Footprint::of(&net, &dc);
    let empty = sizes();
    let acquiring = Instant::now();
    let mut renewed_at = Instant::now();
    let all: Vec<usize> = (0..keys).collect();
    for batch in all.chunks(TASKS) {
        let handles: Vec<_> = (batch.iter())
            .map(|&i| {
                let (client, peer, session) = (client.clone(), peer.clone(), session.clone());
                let name = format!("reaped-{tag}-{i}");
                tokio::spawn(async move {
                    acquire_in_session(&client, &peer, name, &session, secret).await
                })
            })
            .collect();
        for handle in handles {
            handle.await??;
        }
        if renewed_at.elapsed() > Duration::from_millis(REAP_TTL_MS / 3) {
            renew_session(&client, &peer, &session, secret).await?;
            renewed_at = Instant::now();
        }
    }
    let acquired_per_s = keys as f64 / acquiring.elapsed().as_secs_f64().max(1e-3);
    let held = sizes();
    // The last renewal's expiry plus grace, in this machine's clock (the
    // DC's store clock is this machine's too here).
    let due = renewed_at + Duration::from_millis(REAP_TTL_MS + REAP_GRACE_MS);
    let scope = NamespaceScope {
        namespace: Namespace::new("")?,
        include_children: true,
    };
    let (mut after, mut reaped, mut first, mut last) = (0, 0usize, None, None);
    // Past the acquires' events before the session runs out, so the
    // watcher reads the reaps as they come.
    loop {
        let watch = Request::Watch {
            scope: scope.clone(),
            after,
            wait_ms: 0,
        };
        let Reply::Events { events, next } = admin.request(&peer, &watch).await? else {
            bail!("the watch was not answered with events");
        };
        after = next;
        if events.is_empty() || Instant::now() >= due {
            break;
        }
    }
    let bound = due + Duration::from_secs(600);
    while reaped < keys {
        if Instant::now() > bound {
            bail!(
                "only {reaped} of {keys} keys reaped 600 s after the session's expiry plus grace"
            );
        }
        let watch = Request::Watch {
            scope: scope.clone(),
            after,
            wait_ms: 1_000,
        };
        let Reply::Events { events, next } = admin.request(&peer, &watch).await? else {
            bail!("the watch was not answered with events");
        };
        after = next;
        for event in events {
            if matches!(event.kind, EventKind::Expired { .. }) {
                reaped += 1;
                first.get_or_insert_with(Instant::now);
                last = Some(Instant::now());
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut samples = Vec::new();
    for bystander in bystanders {
        samples.extend(bystander.await??);
    }
    net.shutdown().await;
    let (first, last) = (first.unwrap_or(due), last.unwrap_or(due));
    // Before: from the acquires' end to the session's expiry (nothing else
    // runs); during: from the first key reaped to the last.
    let before_from = renewed_at;
    let window = |from: Instant, to: Instant| {
        let mut us: Vec<u64> = (samples.iter())
            .filter(|(sent, _)| *sent >= from && *sent <= to)
            .map(|s| s.1)
            .collect();
        us.sort_unstable();
        us
    };
    let (before, during) = (window(before_from, due), window(first, last));
    let since = |t: Instant| t.saturating_duration_since(due).as_secs_f64() * 1000.0;
    let spread = last.saturating_duration_since(first).as_secs_f64();
    println!(
        "\nOne host session of {keys} keys stops renewing (1 DC, redb, ttl {REAP_TTL_MS} ms, grace {REAP_GRACE_MS} ms, reaper every {REAP_INTERVAL_MS} ms); times after its expiry plus grace, as the event log shows them to a watcher; keys were acquired at {} /s\n",
        thousands(acquired_per_s)
    );
    println!("| keys | first reaped ms | last reaped ms | reaped/s |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| {} | {:.0} | {:.0} | {} |",
        thousands(keys as f64),
        since(first),
        since(last),
        thousands(keys as f64 / spread.max(1e-3))
    );
    let per_key = held.per_lease(&empty, keys);
    let cache_mb = redb_cache_mb.unwrap_or(homing_daemon::REDB_CACHE_MB_DEFAULT);
    println!(
        "\nWhat the {keys} session keys cost, from before the first acquire to after the last (file sizes; one process holds homingd and the bench's clients, so its RSS is an upper bound on homingd's; redb cache {cache_mb} MiB per file)\n"
    );
    println!("| keys | DC store B/key | global store B/key | process RSS B/key |");
    println!("|---:|---:|---:|---:|");
    println!(
        "| {} | {:.0} | {:.0} | {:.0} |",
        thousands(keys as f64),
        per_key[0],
        per_key[1],
        per_key[2]
    );
    let ms = |us: u64| us as f64 / 1000.0;
    println!(
        "\nRenewals of {BYSTANDERS} other sessions (one every {BYSTANDER_PAUSE_MS} ms each)\n"
    );
    println!("| window | renewals | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|");
    for (name, us) in [("before the reap", &before), ("during the reap", &during)] {
        println!(
            "| {name} | {} | {:.1} | {:.1} | {:.1} |",
            us.len(),
            ms(super::quantile(us, 0.5)),
            ms(super::quantile(us, 0.99)),
            ms(us.last().copied().unwrap_or(0))
        );
    }
    Ok(true)
}
