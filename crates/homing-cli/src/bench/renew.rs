//! `homing bench renew`: how many renewals per second one homingd sustains
//! for 10 000 live leases, renewed by 64 concurrent tasks cycling over them.

use homing_core::{AcquireReply, Grant};
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use homing_core::{FencingToken, RenewReply, Reply, Request, ReservationId};

use super::{OneDc, acquire_request, key, median_cell, run_cell, run_tag, thousands};
use crate::host_now;

const LEASES: usize = 10_000;
const TASKS: usize = 64;
const CELL: Duration = Duration::from_secs(3);
const REPETITIONS: usize = 3;

/// Runs the suite; always `true` (nothing here has a target to enforce).
pub async fn run() -> anyhow::Result<bool> {
    let OneDc {
        net, client, peer, ..
    } = OneDc::start().await?;
    let tag = run_tag();

    println!("renew: acquiring {LEASES} leases ({TASKS} at a time, not timed)…");
    let mut leases: Vec<(ReservationId, FencingToken)> = Vec::with_capacity(LEASES);
    let mut next = 0usize;
    while next < LEASES {
        let batch: Vec<_> = (next..(next + TASKS).min(LEASES))
            .map(|i| {
                let (client, peer, name) =
                    (client.clone(), peer.clone(), format!("lease-{tag}-{i}"));
                tokio::spawn(async move {
                    let request = acquire_request(&key(name)?)?;
                    match client.request(&peer, &request).await? {
                        Reply::Acquire(AcquireReply::Acquired(Grant {
                            reservation,
                            token,
                            ..
                        })) => Ok((reservation, token)),
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
    let leases = Arc::new(leases);

    let mut cells = Vec::new();
    for _ in 0..REPETITIONS {
        let (client, peer, leases) = (client.clone(), peer.clone(), leases.clone());
        cells.push(
            run_cell(TASKS, CELL, move |n| {
                let (client, peer) = (client.clone(), peer.clone());
                let (reservation, token) = leases[n as usize % leases.len()].clone();
                async move {
                    let request = Request::Renew {
                        reservation,
                        token,
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
    net.shutdown().await;
    let c = median_cell(&cells);

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
    Ok(true)
}
