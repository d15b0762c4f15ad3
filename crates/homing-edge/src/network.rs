//! `ActorNetwork`: an IP network (CIDR) the router may forward to. An actor
//! id is whatever `host:port` a host registered with its DC; the router
//! dials it only if its address lies in one of the configured networks, so
//! a host certificate cannot aim the router at an arbitrary address
//! (a metadata service, an admin port, another tenant's network).

use std::net::IpAddr;
use std::str::FromStr;

use thiserror::Error;

/// The networks actors may live in when none are configured: loopback only
/// (a devnet, tests). A deployment lists its actor networks.
pub const ACTOR_NETWORKS_DEFAULT: [&str; 2] = ["127.0.0.0/8", "::1/128"];

/// An IP network: an address and a prefix length, e.g. `10.0.0.0/8`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ActorNetwork {
    addr: IpAddr,
    prefix_len: u8,
}

/// Why a string is not an [`ActorNetwork`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ActorNetworkError {
    /// Not `ADDR/LEN`.
    #[error("{0:?} is not ADDR/LEN (e.g. 10.0.0.0/8, fd00::/8)")]
    Form(String),
    /// The address part is not an IP address.
    #[error("{0:?}: the address is not an IP address")]
    Addr(String),
    /// The prefix length is not 0–32 (IPv4) or 0–128 (IPv6).
    #[error("{0:?}: the prefix length must be 0-32 for IPv4, 0-128 for IPv6")]
    PrefixLen(String),
    /// Bits are set past the prefix length (`10.1.0.0/8`): a typo, most likely.
    #[error("{0:?}: address bits are set past the prefix length")]
    HostBits(String),
}

impl ActorNetwork {
    /// Whether `addr` lies in this network. An IPv4-mapped IPv6 address
    /// (`::ffff:10.0.0.1`) is taken as the IPv4 address it maps.
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.addr, addr.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(a)) => prefix_eq(
                u32::from(net).into(),
                u32::from(a).into(),
                32,
                self.prefix_len,
            ),
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                prefix_eq(u128::from(net), u128::from(a), 128, self.prefix_len)
            }
            _ => false,
        }
    }

    /// The default networks ([`ACTOR_NETWORKS_DEFAULT`]).
    pub fn defaults() -> Vec<ActorNetwork> {
        ACTOR_NETWORKS_DEFAULT
            .iter()
            .map(|n| n.parse().expect("the default networks parse"))
            .collect()
    }
}

/// Whether the first `prefix_len` of `width` bits of `a` and `b` agree.
fn prefix_eq(a: u128, b: u128, width: u8, prefix_len: u8) -> bool {
    let host_bits = u32::from(width - prefix_len);
    a.checked_shr(host_bits).unwrap_or(0) == b.checked_shr(host_bits).unwrap_or(0)
}

impl FromStr for ActorNetwork {
    type Err = ActorNetworkError;

    fn from_str(text: &str) -> Result<ActorNetwork, ActorNetworkError> {
        let (addr, len) = text
            .split_once('/')
            .ok_or_else(|| ActorNetworkError::Form(text.to_string()))?;
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| ActorNetworkError::Addr(text.to_string()))?;
        let width = if addr.is_ipv4() { 32 } else { 128 };
        let prefix_len = len
            .parse::<u8>()
            .ok()
            .filter(|&l| l <= width)
            .ok_or_else(|| ActorNetworkError::PrefixLen(text.to_string()))?;
        let bits = match addr {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        };
        let host_bits = u32::from(width - prefix_len);
        let host_mask = 1u128.checked_shl(host_bits).map_or(u128::MAX, |m| m - 1);
        if bits & host_mask != 0 {
            return Err(ActorNetworkError::HostBits(text.to_string()));
        }
        Ok(ActorNetwork { addr, prefix_len })
    }
}

impl std::fmt::Display for ActorNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(text: &str) -> ActorNetwork {
        text.parse().expect("a valid network")
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("a valid address")
    }

    #[test]
    fn network_contains_exactly_its_prefix() {
        let ten = net("10.0.0.0/8");
        assert!(ten.contains(ip("10.255.1.2")));
        assert!(!ten.contains(ip("11.0.0.1")));
        assert!(!ten.contains(ip("fd00::1")));
        assert!(ten.contains(ip("::ffff:10.0.0.1")), "v4-mapped is v4");
        let host = net("192.168.1.7/32");
        assert!(host.contains(ip("192.168.1.7")));
        assert!(!host.contains(ip("192.168.1.8")));
        let v6 = net("fd00:1::/32");
        assert!(v6.contains(ip("fd00:1:ffff::9")));
        assert!(!v6.contains(ip("fd00:2::9")));
        assert!(net("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(net("::/0").contains(ip("2001:db8::1")));
    }

    #[test]
    fn network_parse_refuses_what_is_not_addr_slash_len() {
        for (text, expected) in [
            ("10.0.0.0", ActorNetworkError::Form("10.0.0.0".into())),
            ("ten/8", ActorNetworkError::Addr("ten/8".into())),
            (
                "10.0.0.0/33",
                ActorNetworkError::PrefixLen("10.0.0.0/33".into()),
            ),
            ("::/129", ActorNetworkError::PrefixLen("::/129".into())),
            (
                "10.1.0.0/8",
                ActorNetworkError::HostBits("10.1.0.0/8".into()),
            ),
        ] {
            assert_eq!(text.parse::<ActorNetwork>(), Err(expected), "{text}");
        }
        assert_eq!(net("fd00::/8").to_string(), "fd00::/8");
    }

    #[test]
    fn defaults_are_loopback_only() {
        let defaults = ActorNetwork::defaults();
        let allowed = |a: &str| defaults.iter().any(|n| n.contains(ip(a)));
        assert!(allowed("127.0.0.1") && allowed("127.9.9.9") && allowed("::1"));
        assert!(!allowed("10.0.0.1") && !allowed("169.254.169.254") && !allowed("::2"));
    }
}
