//! A UDP relay that adds latency, drops packets and partitions on command,
//! for devnets and tests (`tc netem` is not available). Point a peer table
//! entry at [`Relay::addr`] instead of the real node and every QUIC packet
//! between them crosses the relay.
//!
//! Packets keep their order: each direction of each client is one FIFO delay
//! line, as on a real link, where a fixed delay does not reorder. (A task per
//! packet, each sleeping the delay, reorders most packets that arrive within
//! one timer tick of each other; QUIC declares a packet lost once three later
//! ones are acknowledged, so that reordering looked like heavy loss and kept
//! the sender's congestion window at its minimum.)
//!
//! Bounded: at most [`RELAY_CLIENTS_MAX`] client addresses, datagrams of at
//! most [`DATAGRAM_BYTES_MAX`] bytes, at most [`RELAY_QUEUE_PACKETS_MAX`]
//! packets waiting per direction and client (more are dropped, like a full
//! router queue). Loss is drawn from a seeded generator so a test run is
//! repeatable in what it drops (not in when packets arrive).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::sync::{Mutex, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Most distinct client addresses one relay forwards for.
pub const RELAY_CLIENTS_MAX: usize = 64;
/// Largest datagram relayed, in bytes.
pub const DATAGRAM_BYTES_MAX: usize = 65_535;
/// Most packets waiting out their delay per direction and client; a packet
/// arriving at a full line is dropped. Far above what a devnet sends within
/// one delay (the resolve-cold bench peaks near 10 k packets/s per direction:
/// ~100 waiting at 10 ms), and small enough that a flood costs megabytes,
/// not gigabytes.
pub const RELAY_QUEUE_PACKETS_MAX: usize = 4_096;

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
    /// Applies to packets arriving from now on; packets never overtake each
    /// other, so after a cut the new delay starts once the queued ones are out.
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
    let upstreams: Mutex<HashMap<SocketAddr, (mpsc::Sender<Delayed>, AbortOnDrop)>> =
        Mutex::new(HashMap::new());
    let mut buf = vec![0u8; DATAGRAM_BYTES_MAX];
    loop {
        let Ok((n, client)) = shared.front.recv_from(&mut buf).await else {
            tokio::time::sleep(Duration::from_millis(ERROR_PAUSE_MS)).await;
            continue;
        };
        let to_target = {
            let mut map = upstreams.lock().await;
            if let Some((line, _)) = map.get(&client) {
                line.clone()
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
                let line = delay_line(Out::Target(socket.clone()));
                let back = tokio::spawn(forward_to_client(shared.clone(), socket, client));
                map.insert(client, (line.clone(), AbortOnDrop(back)));
                line
            }
        };
        if shared.impairment.to_target_blocked.load(Ordering::Relaxed) || shared.lost() {
            continue;
        }
        enqueue(&to_target, &buf[..n], shared.delay());
    }
}

async fn forward_to_client(shared: Arc<Shared>, upstream: Arc<UdpSocket>, client: SocketAddr) {
    let to_client = delay_line(Out::Client(shared.clone(), client));
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
        enqueue(&to_client, &buf[..n], shared.delay());
    }
}

/// A packet and when it is due out.
struct Delayed {
    due: Instant,
    packet: Vec<u8>,
}

/// Where a delay line sends.
enum Out {
    /// To the target, from the client's own upstream socket.
    Target(Arc<UdpSocket>),
    /// Back to the client, from the relay's front socket.
    Client(Arc<Shared>, SocketAddr),
}

/// Starts a delay line to `out`: packets leave in the order they were
/// queued, each once its due time has passed. The line ends when every
/// sender is dropped and it has sent what it holds.
fn delay_line(out: Out) -> mpsc::Sender<Delayed> {
    let (line, mut queue) = mpsc::channel::<Delayed>(RELAY_QUEUE_PACKETS_MAX);
    tokio::spawn(async move {
        while let Some(Delayed { due, packet }) = queue.recv().await {
            // First in, first out: with one delay for every packet, due
            // times only grow, so waiting for the oldest holds back none.
            if due > Instant::now() {
                tokio::time::sleep_until(due).await;
            }
            let _ = match &out {
                Out::Target(socket) => socket.send(&packet).await,
                Out::Client(shared, client) => shared.front.send_to(&packet, *client).await,
            };
        }
    });
    line
}

/// Queues `packet` on `line`, due `delay` from now; drops it if the line is full.
fn enqueue(line: &mpsc::Sender<Delayed>, packet: &[u8], delay: Duration) {
    let delayed = Delayed {
        due: Instant::now() + delay,
        packet: packet.to_vec(),
    };
    if line.try_send(delayed).is_err() {
        tracing::debug!("relay: delay line full, dropping packet");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst of datagrams arrives in the order it was sent, both ways,
    /// after the delay: a fixed-delay link does not reorder (a reordering
    /// relay made QUIC see losses that never happened). The kernel may drop
    /// some of a burst (full socket buffers); those that arrive must be in
    /// order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn relay_keeps_packet_order_in_both_directions() {
        const PACKETS: u32 = 200;
        let target = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let relay = Relay::start(
            "127.0.0.1:0".parse().unwrap(),
            target.local_addr().unwrap(),
            1,
        )
        .await
        .unwrap();
        relay.impairment().set_one_way_delay_ms(5);
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.connect(relay.addr()).await.unwrap();
        for seq in 0..PACKETS {
            client.send(&seq.to_be_bytes()).await.unwrap();
        }
        // Each side's arrivals, in arrival order; the target answers each at
        // once, and the way back is a delay line of its own.
        let mut buf = [0u8; 16];
        let mut there = Vec::new();
        while let Ok(got) =
            tokio::time::timeout(Duration::from_millis(500), target.recv_from(&mut buf)).await
        {
            let (n, sender) = got.unwrap();
            there.push(u32::from_be_bytes(buf[..n].try_into().unwrap()));
            target.send_to(&buf[..n], sender).await.unwrap();
        }
        let mut back = Vec::new();
        while let Ok(got) =
            tokio::time::timeout(Duration::from_millis(500), client.recv(&mut buf)).await
        {
            let n = got.unwrap();
            back.push(u32::from_be_bytes(buf[..n].try_into().unwrap()));
        }
        for (way, seqs) in [("to the target", &there), ("back", &back)] {
            assert!(
                seqs.len() >= PACKETS as usize / 2,
                "{way}: only {} arrived",
                seqs.len()
            );
            assert!(
                seqs.windows(2).all(|w| w[0] < w[1]),
                "{way}: reordered: {seqs:?}"
            );
        }
    }
}
