//! `Pool`: at most one connection per peer address. Concurrent callers for a
//! peer without a live connection share one handshake (the slot's connect
//! lock); a closed connection is replaced on next use; a failed connect puts
//! the peer in bounded exponential backoff, during which callers fail fast
//! instead of hammering it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use homing_core::DcId;
use quinn::Connection;

use crate::error::NetError;
use crate::lock;

/// Largest backoff exponent: `base << 16` already exceeds any sane maximum.
const BACKOFF_SHIFT_MAX: u32 = 16;

/// A peer DC daemon: where it listens and which DC it serves. The server
/// name verified in its certificate is derived from the DC.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Peer {
    /// The peer's UDP address.
    pub addr: SocketAddr,
    /// The DC it serves.
    pub dc: DcId,
}

/// A pooled connection and the protocol version its handshake settled on.
#[derive(Clone)]
pub(crate) struct Pooled {
    /// The connection.
    pub(crate) connection: Connection,
    /// Its protocol version.
    pub(crate) version: u16,
}

/// The pooled connections of one client.
pub(crate) struct Pool {
    slots: Mutex<HashMap<SocketAddr, Arc<Slot>>>,
    peers_max: usize,
    backoff_base_ms: u64,
    backoff_max_ms: u64,
}

/// One peer's connection and its connect state.
struct Slot {
    dc: DcId,
    live: Mutex<Option<Pooled>>,
    /// Held while connecting: the single flight. Guards the backoff state.
    connecting: tokio::sync::Mutex<Backoff>,
}

#[derive(Default)]
struct Backoff {
    failures: u32,
    retry_at: Option<Instant>,
}

impl Slot {
    fn live(&self) -> Option<Pooled> {
        match &*lock(&self.live) {
            Some(pooled) if pooled.connection.close_reason().is_none() => Some(pooled.clone()),
            _ => None,
        }
    }
}

impl Pool {
    pub(crate) fn new(peers_max: usize, backoff_base_ms: u64, backoff_max_ms: u64) -> Pool {
        assert!(
            peers_max > 0 && backoff_base_ms <= backoff_max_ms,
            "limits were validated"
        );
        Pool {
            slots: Mutex::new(HashMap::new()),
            peers_max,
            backoff_base_ms,
            backoff_max_ms,
        }
    }

    /// The live connection to `peer`, made with `connect` if there is none
    /// and the peer is not in backoff.
    pub(crate) async fn connection<F, Fut>(
        &self,
        peer: &Peer,
        connect: F,
    ) -> Result<Pooled, NetError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Pooled, NetError>>,
    {
        let slot = self.slot(peer)?;
        if let Some(connection) = slot.live() {
            return Ok(connection);
        }
        let mut backoff = slot.connecting.lock().await;
        // Whoever held the lock before us may have connected.
        if let Some(connection) = slot.live() {
            return Ok(connection);
        }
        if let Some(retry_at) = backoff.retry_at {
            let now = Instant::now();
            if retry_at > now {
                let retry_in_ms = u64::try_from((retry_at - now).as_millis())
                    .unwrap_or(u64::MAX)
                    .max(1);
                return Err(NetError::Backoff {
                    peer: peer.addr,
                    retry_in_ms,
                });
            }
        }
        match connect().await {
            Ok(connection) => {
                *lock(&slot.live) = Some(connection.clone());
                *backoff = Backoff::default();
                Ok(connection)
            }
            Err(error) => {
                backoff.failures = backoff.failures.saturating_add(1);
                backoff.retry_at = Some(Instant::now() + self.backoff_delay(backoff.failures));
                Err(error)
            }
        }
    }

    /// The pooled connections that are still open.
    pub(crate) fn live_connections(&self) -> Vec<Connection> {
        let slots: Vec<Arc<Slot>> = lock(&self.slots).values().cloned().collect();
        slots
            .iter()
            .filter_map(|slot| slot.live().map(|pooled| pooled.connection))
            .collect()
    }

    /// Connects to every peer in backoff at its next request: what a
    /// connect meets changed (the client reloaded its certificates). A
    /// peer being connected to now keeps its state.
    pub(crate) fn forget_backoffs(&self) {
        for slot in lock(&self.slots).values() {
            if let Ok(mut backoff) = slot.connecting.try_lock() {
                *backoff = Backoff::default();
            }
        }
    }

    /// Forgets `connection` as `peer`'s pooled connection (if it still is),
    /// so the next request connects afresh. Requests already using it go on.
    pub(crate) fn evict(&self, peer: &Peer, connection: &Connection) {
        let slot = lock(&self.slots).get(&peer.addr).cloned();
        if let Some(slot) = slot {
            let mut live = lock(&slot.live);
            let pooled = live.as_ref().map(|pooled| pooled.connection.stable_id());
            if pooled == Some(connection.stable_id()) {
                *live = None;
            }
        }
    }

    /// The wait after `failures` consecutive failed connects: base, 2×base, …, max.
    fn backoff_delay(&self, failures: u32) -> Duration {
        let shift = failures.saturating_sub(1).min(BACKOFF_SHIFT_MAX);
        Duration::from_millis(
            self.backoff_base_ms
                .saturating_mul(1 << shift)
                .min(self.backoff_max_ms),
        )
    }

    fn slot(&self, peer: &Peer) -> Result<Arc<Slot>, NetError> {
        let mut slots = lock(&self.slots);
        if let Some(slot) = slots.get(&peer.addr)
            && slot.dc == peer.dc
        {
            return Ok(slot.clone());
        }
        if slots.len() >= self.peers_max && !slots.contains_key(&peer.addr) {
            slots.retain(|_, slot| slot.live().is_some());
            if slots.len() >= self.peers_max {
                return Err(NetError::PoolFull {
                    peers_max: self.peers_max,
                });
            }
        }
        // A new peer, or the address now serves another DC: start afresh.
        let slot = Arc::new(Slot {
            dc: peer.dc.clone(),
            live: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(Backoff::default()),
        });
        slots.insert(peer.addr, slot.clone());
        Ok(slot)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_maximum() {
        let pool = Pool::new(1, 100, 1_000);
        let delays: Vec<u64> = (1..=6)
            .map(|n| pool.backoff_delay(n).as_millis() as u64)
            .collect();
        assert_eq!(delays, [100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(pool.backoff_delay(u32::MAX).as_millis(), 1_000);
    }
}
