//! `Admission`: which authenticated connection may hold one of the server's
//! connection slots. The slot is taken after the TLS handshake, when the
//! caller's certificate is known, so the limit can be divided by who asks:
//! peers (node certificates) and hosts of this DC have reserved room that
//! routers, admins and handshakes cannot take, and no single certificate may
//! hold more than its share. Pure counting under a lock: no I/O, no clock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use homing_core::{DcId, Identity, Role};

use crate::limits::ConnectionShares;
use crate::lock;

/// The SHA-256 of a peer's leaf certificate: what "one certificate" means
/// for the per-identity share (all routers of a deployment may share the
/// identity `router`, yet each may hold its own certificate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct CertFingerprint(pub(crate) [u8; 32]);

impl CertFingerprint {
    /// The fingerprint of a DER-encoded certificate.
    pub(crate) fn of(der: &[u8]) -> CertFingerprint {
        let digest = ring::digest::digest(&ring::digest::SHA256, der);
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(digest.as_ref());
        CertFingerprint(bytes)
    }
}

/// Why an authenticated connection got no slot. Each names the share that
/// was full, so a refusal says what to raise or whom to look at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// This certificate already holds `identity_connections_max` connections.
    IdentityShare {
        /// The share, in connections.
        identity_connections_max: usize,
    },
    /// Every slot not reserved for other roles is taken.
    Unreserved {
        /// How many slots this role may use when the reserved ones are idle.
        room: usize,
    },
    /// A host certificate of another DC: it may send nothing here.
    ForeignHost,
}

impl Refusal {
    /// The label of this reason in metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::IdentityShare { .. } => "identity_share",
            Refusal::Unreserved { .. } => "unreserved_share",
            Refusal::ForeignHost => "foreign_host",
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::IdentityShare {
                identity_connections_max,
            } => write!(
                f,
                "this certificate's share is full ({identity_connections_max} connections per certificate)"
            ),
            Refusal::Unreserved { room } => write!(
                f,
                "the share not reserved for peers and hosts is full ({room} connections)"
            ),
            Refusal::ForeignHost => f.write_str("a host of another dc may send nothing here"),
        }
    }
}

/// The four roles, as indices into per-role counters.
pub(crate) const ROLES: [Role; 4] = [Role::Node, Role::Host, Role::Router, Role::Admin];

pub(crate) fn role_index(role: Role) -> usize {
    match role {
        Role::Node => 0,
        Role::Host => 1,
        Role::Router => 2,
        Role::Admin => 3,
    }
}

/// The server's slot accounting.
pub(crate) struct Admission {
    shares: ConnectionShares,
    local_dc: DcId,
    state: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    by_role: [usize; 4],
    by_cert: HashMap<CertFingerprint, usize>,
}

impl Open {
    fn total(&self) -> usize {
        self.by_role.iter().sum()
    }
}

/// One held slot; dropping it frees the slot.
pub(crate) struct Slot {
    admission: Arc<Admission>,
    role: Role,
    cert: CertFingerprint,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = lock(&self.admission.state);
        let role = &mut open.by_role[role_index(self.role)];
        assert!(*role > 0, "a slot was counted when it was taken");
        *role -= 1;
        if let Some(held) = open.by_cert.get_mut(&self.cert) {
            *held -= 1;
            if *held == 0 {
                open.by_cert.remove(&self.cert);
            }
        }
    }
}

impl Admission {
    pub(crate) fn new(shares: ConnectionShares, local_dc: DcId) -> Arc<Admission> {
        Arc::new(Admission {
            shares,
            local_dc,
            state: Mutex::new(Open::default()),
        })
    }

    /// Connections open now, by role (indexed as [`ROLES`]).
    pub(crate) fn open_by_role(&self) -> [usize; 4] {
        lock(&self.state).by_role
    }

    /// A slot for `caller` presenting certificate `cert`, or why not.
    pub(crate) fn admit(
        self: &Arc<Self>,
        caller: &Identity,
        cert: CertFingerprint,
    ) -> Result<Slot, Refusal> {
        let role = caller.role();
        if role == Role::Host && caller.dc() != Some(&self.local_dc) {
            return Err(Refusal::ForeignHost);
        }
        let shares = &self.shares;
        let mut open = lock(&self.state);
        let held = open.by_cert.get(&cert).copied().unwrap_or(0);
        if held >= shares.identity_connections_max {
            return Err(Refusal::IdentityShare {
                identity_connections_max: shares.identity_connections_max,
            });
        }
        // The slots other roles have reserved and do not use yet stay free
        // for them; everything else is first come, first served.
        let kept_for_others: usize = ROLES
            .iter()
            .filter(|other| **other != role)
            .map(|other| {
                shares
                    .reserved(*other)
                    .saturating_sub(open.by_role[role_index(*other)])
            })
            .sum();
        if open.total() + kept_for_others >= shares.connections_max {
            let reserved_for_others: usize = ROLES
                .iter()
                .filter(|other| **other != role)
                .map(|other| shares.reserved(*other))
                .sum();
            return Err(Refusal::Unreserved {
                room: shares.connections_max - reserved_for_others,
            });
        }
        open.by_role[role_index(role)] += 1;
        *open.by_cert.entry(cert).or_default() += 1;
        assert!(
            open.total() <= shares.connections_max,
            "admission keeps the limit"
        );
        Ok(Slot {
            admission: self.clone(),
            role,
            cert,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iad() -> DcId {
        DcId::new("iad").unwrap()
    }

    fn who(role: Role) -> Identity {
        Identity::new(role, role.needs_dc().then(iad)).unwrap()
    }

    fn cert(n: u8) -> CertFingerprint {
        CertFingerprint([n; 32])
    }

    fn shares() -> ConnectionShares {
        ConnectionShares {
            connections_max: 10,
            node_connections_reserved: 2,
            host_connections_reserved: 3,
            identity_connections_max: 4,
        }
    }

    #[test]
    fn routers_cannot_take_the_room_reserved_for_peers_and_hosts() {
        let admission = Admission::new(shares(), iad());
        let mut held = Vec::new();
        // Five routers, each with its own certificate, fill the unreserved room.
        for n in 0..5 {
            held.push(admission.admit(&who(Role::Router), cert(n)).unwrap());
        }
        let refused = admission.admit(&who(Role::Admin), cert(9)).err();
        assert_eq!(refused, Some(Refusal::Unreserved { room: 5 }));
        // Peers and hosts still get their reserved slots, and no more.
        for n in 0..2 {
            held.push(admission.admit(&who(Role::Node), cert(20 + n)).unwrap());
        }
        for n in 0..3 {
            held.push(admission.admit(&who(Role::Host), cert(30 + n)).unwrap());
        }
        assert!(admission.admit(&who(Role::Host), cert(40)).is_err());
        assert_eq!(admission.open_by_role(), [2, 3, 5, 0]);
        // A freed slot is taken again.
        held.truncate(4);
        assert!(admission.admit(&who(Role::Router), cert(7)).is_ok());
    }

    #[test]
    fn one_certificate_holds_at_most_its_share_and_foreign_hosts_none() {
        let admission = Admission::new(shares(), iad());
        let held: Vec<Slot> = (0..4)
            .map(|_| admission.admit(&who(Role::Router), cert(1)).unwrap())
            .collect();
        assert_eq!(
            admission.admit(&who(Role::Router), cert(1)).err(),
            Some(Refusal::IdentityShare {
                identity_connections_max: 4
            })
        );
        assert!(admission.admit(&who(Role::Router), cert(2)).is_ok());
        drop(held);
        assert_eq!(admission.open_by_role(), [0, 0, 0, 0]);
        let fra_host = Identity::new(Role::Host, Some(DcId::new("fra").unwrap())).unwrap();
        assert_eq!(
            admission.admit(&fra_host, cert(3)).err(),
            Some(Refusal::ForeignHost)
        );
    }

    #[test]
    fn peers_may_use_unreserved_room_beyond_their_reservation() {
        let admission = Admission::new(shares(), iad());
        let held: Vec<Slot> = (0..7)
            .map(|n| admission.admit(&who(Role::Node), cert(n)).unwrap())
            .collect();
        // 7 of 10: the 3 left are the hosts'.
        assert_eq!(
            admission.admit(&who(Role::Node), cert(50)).err(),
            Some(Refusal::Unreserved { room: 7 })
        );
        assert_eq!(held.len(), 7);
    }
}
