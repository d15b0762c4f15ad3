//! A UDP relay that adds latency, drops packets and partitions on command,
//! for devnets and tests (`tc netem` is not available). Point a peer table
//! entry at [`Relay::addr`] instead of the real node and every QUIC packet
//! between them crosses the relay.
//!
//! Bounded: at most [`RELAY_CLIENTS_MAX`] client addresses, datagrams of at
//! most [`DATAGRAM_BYTES_MAX`] bytes. Loss is drawn from a seeded generator so
//! a test run is repeatable in what it drops (not in when packets arrive).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// Most distinct client addresses one relay forwards for.
pub const RELAY_CLIENTS_MAX: usize = 64;
/// Largest datagram relayed, in bytes.
pub const DATAGRAM_BYTES_MAX: usize = 65_535;

/// How the relay treats packets; changeable while it runs.
#[derive(Debug, Default)]
pub struct Impairment {
    one_way_delay_ms: AtomicU64,
    loss_permille: AtomicU16,
    to_target_blocked: AtomicBool,
    to_client_blocked: AtomicBool,
}

impl Impairment {
    /// Delay added to each packet in each direction, in milliseconds (RTT = 2×).
    pub fn set_one_way_delay_ms(&self, ms: u64) {
        self.one_way_delay_ms.store(ms, Ordering::Relaxed);
    }

    /// Fraction of packets dropped, in thousandths (both directions).
    pub fn set_loss_permille(&self, permille: u16) {
        self.loss_permille
            .store(permille.min(1000), Ordering::Relaxed);
    }

    /// Drops everything from clients to the target (a one-way partition).
    pub fn block_to_target(&self, blocked: bool) {
        self.to_target_blocked.store(blocked, Ordering::Relaxed);
    }

    /// Drops everything from the target back to clients (a one-way partition).
    pub fn block_to_client(&self, blocked: bool) {
        self.to_client_blocked.store(blocked, Ordering::Relaxed);
    }

    /// Both directions: a full partition (or its healing).
    pub fn partition(&self, blocked: bool) {
        self.block_to_target(blocked);
        self.block_to_client(blocked);
    }
}

/// A running relay; stops when dropped.
pub struct Relay {
    addr: SocketAddr,
    impairment: Arc<Impairment>,
    task: JoinHandle<()>,
}

struct Shared {
    front: UdpSocket,
    target: SocketAddr,
    impairment: Arc<Impairment>,
    rng: AtomicU64,
}

impl Shared {
    /// xorshift64*, seeded: decides which packets are lost.
    fn lost(&self) -> bool {
        let permille = self.impairment.loss_permille.load(Ordering::Relaxed);
        if permille == 0 {
            return false;
        }
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) % 1000) < u64::from(permille)
    }

    fn delay(&self) -> Duration {
        Duration::from_millis(self.impairment.one_way_delay_ms.load(Ordering::Relaxed))
    }
}

impl Relay {
    /// Starts a relay on `listen` (e.g. `127.0.0.1:0`) forwarding to `target`.
    pub async fn start(
        listen: SocketAddr,
        target: SocketAddr,
        seed: u64,
    ) -> std::io::Result<Relay> {
        let front = UdpSocket::bind(listen).await?;
        let addr = front.local_addr()?;
        let impairment = Arc::new(Impairment::default());
        let shared = Arc::new(Shared {
            front,
            target,
            impairment: impairment.clone(),
            rng: AtomicU64::new(seed | 1),
        });
        let task = tokio::spawn(forward_from_clients(shared));
        Ok(Relay {
            addr,
            impairment,
            task,
        })
    }

    /// Where clients send.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The knobs: delay, loss, partitions.
    pub fn impairment(&self) -> &Arc<Impairment> {
        &self.impairment
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A task that is aborted when its handle is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Pause after a socket error so a broken socket cannot spin a core.
const ERROR_PAUSE_MS: u64 = 1;

async fn forward_from_clients(shared: Arc<Shared>) {
    let upstreams: Mutex<HashMap<SocketAddr, (Arc<UdpSocket>, AbortOnDrop)>> =
        Mutex::new(HashMap::new());
    let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
    loop {
        let Ok((n, client)) = shared.front.recv_from(&mut buf).await else {
            tokio::time::sleep(Duration::from_millis(ERROR_PAUSE_MS)).await;
            continue;
        };
        let upstream = {
            let mut map = upstreams.lock().await;
            if let Some((socket, _)) = map.get(&client) {
                socket.clone()
            } else {
                if map.len() >= RELAY_CLIENTS_MAX {
                    tracing::warn!(%client, "relay: client limit reached, dropping packet");
                    continue;
                }
                let Ok(socket) = UdpSocket::bind(("127.0.0.1", 0)).await else {
                    continue;
                };
                if socket.connect(shared.target).await.is_err() {
                    continue;
                }
                let socket = Arc::new(socket);
                let back = tokio::spawn(forward_to_client(shared.clone(), socket.clone(), client));
                map.insert(client, (socket.clone(), AbortOnDrop(back)));
                socket
            }
        };
        if shared.impairment.to_target_blocked.load(Ordering::Relaxed) || shared.lost() {
            continue;
        }
        let packet = buf[..n].to_vec();
        let delay = shared.delay();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = upstream.send(&packet).await;
        });
    }
}

async fn forward_to_client(shared: Arc<Shared>, upstream: Arc<UdpSocket>, client: SocketAddr) {
    let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
    loop {
        let Ok(n) = upstream.recv(&mut buf).await else {
            // A connected UDP socket reports the target's ICMP errors here.
            tokio::time::sleep(Duration::from_millis(ERROR_PAUSE_MS)).await;
            continue;
        };
        if shared.impairment.to_client_blocked.load(Ordering::Relaxed) || shared.lost() {
            continue;
        }
        let packet = buf[..n].to_vec();
        let delay = shared.delay();
        let shared = shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = shared.front.send_to(&packet, client).await;
        });
    }
}
