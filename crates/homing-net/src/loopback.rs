//! Listen addresses for local deployments (the devnet, tests that start
//! `homingd` processes): a UDP port on 127.0.0.1 that is free now and that
//! nothing else will be handed before the daemon binds it.
//!
//! A port taken from a socket bound to port 0 and closed again is in the
//! kernel's ephemeral range: every QUIC client endpoint, relay or outgoing
//! connection started in the meantime may be given that same port, and the
//! daemon then fails with "address already in use" (seen in CI: a devnet
//! DC's own client endpoint took a peer DC's port). So the port comes from
//! below the ephemeral range (Linux's `ip_local_port_range`), which the
//! kernel never hands out for port 0, from a cursor that differs per
//! process and never repeats within one; each candidate is checked by
//! binding it. Where the range is unknown (not Linux) or leaves no room
//! below it, a port-0 pick is the fallback.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};

/// The lowest port handed out: below it sit well-known and registered
/// services a developer may run.
const LOWEST: u16 = 10_000;
/// Ports below the ephemeral range needed before it is worth using.
const ROOM_MIN: u16 = 1_000;

/// A UDP address on 127.0.0.1, free now, that no port-0 bind or outgoing
/// connection will be given (see the module doc); distinct from every
/// address this process had from it before.
pub fn loopback_listen_addr() -> io::Result<SocketAddr> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let Some((low, end)) = below_ephemeral_range() else {
        return UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?.local_addr();
    };
    let span = u32::from(end - low);
    // Concurrent processes start their walk at different places.
    let offset = std::process::id().wrapping_mul(7_919);
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = low + (offset.wrapping_add(n) % span) as u16;
        if let Ok(socket) = UdpSocket::bind((Ipv4Addr::LOCALHOST, port)) {
            return socket.local_addr();
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("no free UDP port on 127.0.0.1 in {low}..{end}"),
    ))
}

/// `LOWEST..start` of the kernel's ephemeral range, when known and roomy.
fn below_ephemeral_range() -> Option<(u16, u16)> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let start: u16 = range.split_whitespace().next()?.parse().ok()?;
    (start >= LOWEST.saturating_add(ROOM_MIN)).then_some((LOWEST, start))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_distinct_bindable_and_outside_the_ephemeral_range() {
        let addrs: Vec<SocketAddr> = (0..50).map(|_| loopback_listen_addr().unwrap()).collect();
        let mut ports: Vec<u16> = addrs.iter().map(SocketAddr::port).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), addrs.len(), "a port handed out twice");
        for addr in &addrs {
            UdpSocket::bind(addr).expect("free when handed out");
        }
        if let Some((low, end)) = below_ephemeral_range() {
            assert!(ports.iter().all(|p| (low..end).contains(p)), "{ports:?}");
            // A port-0 bind lands in the ephemeral range, so never on one of these.
            let ephemeral = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            assert!(ephemeral.local_addr().unwrap().port() >= end);
        }
    }
}
