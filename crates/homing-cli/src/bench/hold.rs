//! `homing bench session-hold`: many live leases held under host sessions
//! on one homingd, each session renewed by its own task on the host's own
//! schedule (at the `renew_at` its last grant gave). The keys are acquired
//! through homingd first (not timed); then the leases are held for the
//! hold time, and the run reports the renewals' latency, how many answers
//! came after the soft deadline the host held (each one a host that would
//! have stopped its actors), and what the leases cost in store bytes and
//! memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use homing_core::{Deadlines, HostTime, LeaseKey, Role, SessionId};

use super::renew::{acquire_under, open_session, renew_session};
use super::{Footprint, quantile, run_tag, thousands};
use crate::host_now;

/// Longest sleep of a session's task before it looks at its stop flag, ms.
const NAP_MS: u64 = 100;

/// The shape of one run.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// Host sessions.
    pub sessions: usize,
    /// Keys under each.
    pub keys_per_session: usize,
    /// How long the leases are held once every key is acquired.
    pub hold: Duration,
    /// homingd's `redb_cache_mb` (`None`: its default).
    pub redb_cache_mb: Option<u64>,
}

/// One renewal as its session's task saw it.
struct Renewal {
    sent: Instant,
    latency_us: u64,
    /// Answered after the soft deadline the host held when it sent it.
    missed: bool,
}

/// Keeps `session` alive on the host's schedule until `stop`: renews at
/// each grant's `renew_at`, and notes each renewal.
async fn keep(
    client: homing_net::Client,
    peer: homing_net::Peer,
    (session, secret): (SessionId, LeaseKey),
    stop: Arc<AtomicBool>,
) -> anyhow::Result<Vec<Renewal>> {
    let mut renewals = Vec::new();
    // The first renewal at once: it gives the schedule.
    let mut held: Option<Deadlines> = None;
    while !stop.load(Ordering::Relaxed) {
        if let Some(deadlines) = held {
            let left = deadlines
                .renew_at
                .as_ms()
                .saturating_sub(host_now().as_ms());
            if left > 0 {
                tokio::time::sleep(Duration::from_millis(left.min(NAP_MS))).await;
                continue;
            }
        }
        let sent = Instant::now();
        let deadlines = renew_session(&client, &peer, &session, secret).await?;
        let answered = host_now();
        let soft = held.map_or(HostTime::from_ms(u64::MAX), |d| d.soft_terminate_at);
        renewals.push(Renewal {
            sent,
            latency_us: sent.elapsed().as_micros() as u64,
            missed: answered > soft,
        });
        held = Some(deadlines);
    }
    Ok(renewals)
}

/// Runs one shape; prints its table.
pub async fn run(shape: Shape) -> anyhow::Result<bool> {
    let Shape {
        sessions,
        keys_per_session,
        hold,
        redb_cache_mb,
    } = shape;
    let leases = sessions * keys_per_session;
    let dc = homing_core::DcId::new("dc0")?;
    let net = homing_daemon::Devnet::start(homing_daemon::DevnetOptions {
        dcs: vec![dc.clone()],
        overrides: homing_daemon::Settings {
            redb_cache_mb,
            ..homing_daemon::Settings::default()
        },
        ..homing_daemon::DevnetOptions::default()
    })
    .await?;
    let client = net.client(Role::Host, Some(&dc))?;
    let peer = net.peer(&dc);
    let tag = run_tag();
    let empty = Footprint::of(&net, &dc);
    let stop = Arc::new(AtomicBool::new(false));
    println!(
        "session-hold: opening {sessions} host sessions, each renewed by its own task on its grants' schedule…"
    );
    let mut opened = Vec::with_capacity(sessions);
    let mut keepers = Vec::with_capacity(sessions);
    for _ in 0..sessions {
        let session = open_session(&client, &peer).await?;
        let (client, peer, stop) = (client.clone(), peer.clone(), stop.clone());
        keepers.push(tokio::spawn(keep(client, peer, session.clone(), stop)));
        opened.push(session);
    }
    println!(
        "session-hold: acquiring {keys_per_session} keys under each ({leases} in all, not timed)…"
    );
    let acquiring = Instant::now();
    let prefix = format!("hold-{tag}");
    acquire_under(&client, &peer, &Arc::new(opened), leases, &prefix).await?;
    let acquired_per_s = leases as f64 / acquiring.elapsed().as_secs_f64().max(1e-3);
    println!(
        "session-hold: {leases} leases held; holding them {:.0} s…",
        hold.as_secs_f64()
    );
    let held_from = Instant::now();
    tokio::time::sleep(hold).await;
    let full = Footprint::of(&net, &dc);
    stop.store(true, Ordering::Relaxed);
    let mut renewals = Vec::new();
    for keeper in keepers {
        renewals.extend(keeper.await??);
    }
    net.shutdown().await;

    let missed_before = (renewals.iter())
        .filter(|r| r.sent < held_from && r.missed)
        .count();
    let during: Vec<&Renewal> = (renewals.iter())
        .filter(|r| r.sent >= held_from && r.sent <= held_from + hold)
        .collect();
    let missed = during.iter().filter(|r| r.missed).count();
    let mut us: Vec<u64> = during.iter().map(|r| r.latency_us).collect();
    us.sort_unstable();
    let ms = |us: u64| us as f64 / 1000.0;
    let per_lease = full.per_lease(&empty, leases);
    let cache = redb_cache_mb.map_or_else(|| "default".to_string(), |mb| format!("{mb} MiB"));
    println!(
        "\nLeases held under host sessions on one homingd (1 DC, QUIC + mTLS, redb, ttl {} ms, redb cache {cache}), each session renewed on its own schedule; {:.0} s held after every key was acquired (acquired at {} keys/s, not timed)\n",
        homing_core::LeasePolicy::DEFAULT.ttl_ms(),
        hold.as_secs_f64(),
        thousands(acquired_per_s),
    );
    println!(
        "| sessions × keys | live leases | renewals held | renewals/s | p50 ms | p99 ms | max ms | missed soft deadlines | DC store B/lease | global store B/lease | process RSS B/lease |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} × {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {missed} ({missed_before} while acquiring) | {:.0} | {:.0} | {:.0} |",
        thousands(sessions as f64),
        thousands(keys_per_session as f64),
        thousands(leases as f64),
        us.len(),
        thousands(us.len() as f64 / hold.as_secs_f64().max(1e-3)),
        ms(quantile(&us, 0.5)),
        ms(quantile(&us, 0.99)),
        ms(us.last().copied().unwrap_or(0)),
        per_lease[0],
        per_lease[1],
        per_lease[2],
    );
    Ok(missed == 0)
}
