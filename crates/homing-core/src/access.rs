//! Who may ask what (DESIGN.md §6). The caller's role and DC come from its
//! mTLS certificate, never from the message; this module only decides.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::dc::DcId;
use crate::wire::Request;

/// What a certificate says its holder is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Role {
    /// A DC daemon.
    Node,
    /// A host agent, bound to one DC.
    Host,
    /// An edge router: read-only.
    Router,
    /// An operator or the CLI.
    Admin,
}

impl Role {
    /// The name used in certificates and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Host => "host",
            Role::Router => "router",
            Role::Admin => "admin",
        }
    }

    /// Whether certificates of this role must name a DC.
    pub fn needs_dc(self) -> bool {
        matches!(self, Role::Node | Role::Host)
    }
}

impl std::str::FromStr for Role {
    type Err = IdentityError;
    fn from_str(text: &str) -> Result<Role, IdentityError> {
        match text {
            "node" => Ok(Role::Node),
            "host" => Ok(Role::Host),
            "router" => Ok(Role::Router),
            "admin" => Ok(Role::Admin),
            _ => Err(IdentityError::UnknownRole(text.chars().take(32).collect())),
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Identity {
    role: Role,
    dc: Option<DcId>,
}

/// A certificate's identity claims do not make sense.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IdentityError {
    /// Not one of node, host, router, admin.
    #[error("unknown role {0:?} (expected node, host, router or admin)")]
    UnknownRole(String),
    /// A node or host certificate without a DC.
    #[error("a {0} identity must name its dc")]
    MissingDc(Role),
}

impl Identity {
    /// An identity; node and host identities must name their DC.
    pub fn new(role: Role, dc: Option<DcId>) -> Result<Identity, IdentityError> {
        if role.needs_dc() && dc.is_none() {
            return Err(IdentityError::MissingDc(role));
        }
        Ok(Identity { role, dc })
    }

    /// The caller's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The caller's DC, for nodes and hosts (and others whose certificate names one).
    pub fn dc(&self) -> Option<&DcId> {
        self.dc.as_ref()
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.dc {
            Some(dc) => write!(f, "{}@{}", self.role, dc),
            None => write!(f, "{}", self.role),
        }
    }
}

/// A request refused by role.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{caller} may not send {request} to dc {local_dc}")]
pub struct Denied {
    /// Who asked.
    pub caller: Identity,
    /// The request kind.
    pub request: &'static str,
    /// The DC asked.
    pub local_dc: DcId,
}

/// Whether `caller` may send `request` to the DC `local_dc`.
pub fn authorize(caller: &Identity, request: &Request, local_dc: &DcId) -> Result<(), Denied> {
    let own_dc_host = caller.role == Role::Host && caller.dc.as_ref() == Some(local_dc);
    let allowed = match request {
        Request::Resolve { .. }
        | Request::ResolveReservation { .. }
        | Request::Successor { .. }
        | Request::Directory => {
            matches!(caller.role, Role::Router | Role::Node | Role::Admin)
        }
        Request::Acquire { .. } | Request::Release { .. } | Request::Cancel { .. } => {
            own_dc_host || caller.role == Role::Admin
        }
        Request::Renew { .. }
        | Request::OpenSession { .. }
        | Request::RenewSession { .. }
        | Request::CloseSession { .. }
        | Request::SessionKeys { .. }
        | Request::AcquireInSession { .. } => own_dc_host,
        // Without the lease key: an operator's act, never a host's.
        Request::ForceRelease { .. } => caller.role == Role::Admin,
        Request::Link { .. } | Request::Shortcut { .. } => caller.role == Role::Node,
        // An operator's view, or a peer's status page showing this DC.
        Request::DcReport => matches!(caller.role, Role::Admin | Role::Node),
        // A node forwards an operator's drain to the DC that owns the tail.
        Request::Drain { .. } => matches!(caller.role, Role::Admin | Role::Node),
        Request::Inspect { .. } | Request::Scan { .. } | Request::DrainScope { .. } => {
            caller.role == Role::Admin
        }
        // A DC registers its waiting acquirer at the tail's DC.
        Request::Await { .. } => caller.role == Role::Node,
        // Events carry what resolves do (keys, actors): the resolving roles may watch.
        Request::Watch { .. } => matches!(caller.role, Role::Router | Role::Node | Role::Admin),
    };
    if allowed {
        Ok(())
    } else {
        Err(Denied {
            caller: caller.clone(),
            request: request.kind(),
            local_dc: local_dc.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fencing::FencingToken;
    use crate::key::{Key, KeyName};

    fn dc(text: &str) -> DcId {
        DcId::new(text).unwrap()
    }

    fn who(role: Role, at: Option<&str>) -> Identity {
        Identity::new(role, at.map(dc)).unwrap()
    }

    #[test]
    fn the_table_of_who_may_ask_what() {
        let key = Key::new(KeyName::new("k").unwrap());
        let id: crate::ReservationId = "iad.1".parse().unwrap();
        let resolve = Request::Resolve { key: key.clone() };
        let renew = Request::Renew {
            reservation: id.clone(),
            token: FencingToken::FIRST,
            lease: crate::LeaseKey::from_bytes([1; 16]).unwrap(),
            host_time: crate::HostTime::from_ms(0),
        };
        let link = Request::Link {
            key: key.clone(),
            from: id.clone(),
            to: "fra.1".parse().unwrap(),
            expected_token: FencingToken::FIRST,
        };
        let shortcut = Request::Shortcut {
            key: key.clone(),
            entry: id.clone(),
            shortcut: crate::link::Shortcut {
                to: "fra.1".parse().unwrap(),
                token: FencingToken::new(2),
            },
        };
        let drain = Request::Drain { key };
        let iad = dc("iad");
        let router = who(Role::Router, None);
        let host_here = who(Role::Host, Some("iad"));
        let host_there = who(Role::Host, Some("fra"));
        let node = who(Role::Node, Some("fra"));
        let admin = who(Role::Admin, None);

        assert!(authorize(&router, &resolve, &iad).is_ok());
        assert!(authorize(&router, &link, &iad).is_err());
        assert!(authorize(&router, &renew, &iad).is_err());
        assert!(authorize(&host_here, &renew, &iad).is_ok());
        assert!(authorize(&host_there, &renew, &iad).is_err());
        assert!(authorize(&host_here, &resolve, &iad).is_err());
        assert!(authorize(&node, &link, &iad).is_ok());
        assert!(authorize(&node, &shortcut, &iad).is_ok());
        assert!(authorize(&router, &shortcut, &iad).is_err());
        assert!(authorize(&host_here, &shortcut, &iad).is_err());
        assert!(authorize(&admin, &shortcut, &iad).is_err());
        assert!(
            authorize(&node, &drain, &iad).is_ok(),
            "nodes forward drains"
        );
        assert!(authorize(&host_here, &drain, &iad).is_err());
        assert!(authorize(&admin, &drain, &iad).is_ok());
        let watch = Request::Watch {
            scope: crate::NamespaceScope::everything(),
            after: 0,
            wait_ms: 0,
        };
        let wait = Request::Await {
            reservation: id.clone(),
            wait_ms: 10,
        };
        assert!(authorize(&router, &watch, &iad).is_ok());
        assert!(authorize(&host_here, &watch, &iad).is_err());
        assert!(authorize(&node, &wait, &iad).is_ok());
        assert!(
            authorize(&host_here, &wait, &iad).is_err(),
            "hosts wait via acquire"
        );
        let scan = Request::Scan {
            scope: crate::NamespaceScope::everything(),
            after: None,
        };
        assert!(authorize(&admin, &scan, &iad).is_ok());
        let force = Request::ForceRelease {
            reservation: id.clone(),
            token: FencingToken::FIRST,
        };
        assert!(authorize(&admin, &force, &iad).is_ok());
        assert!(
            authorize(&host_here, &force, &iad).is_err(),
            "a host releases with its lease key"
        );
        let cancel = Request::Cancel {
            key: Key::new(KeyName::new("k").unwrap()),
            lease: crate::LeaseKey::from_bytes([1; 16]).unwrap(),
        };
        assert!(authorize(&host_here, &cancel, &iad).is_ok());
        assert!(authorize(&host_there, &cancel, &iad).is_err());
        assert!(authorize(&router, &scan, &iad).is_err());
        let denied = authorize(&router, &link, &iad).unwrap_err().to_string();
        assert_eq!(denied, "router may not send link to dc iad");
    }

    #[test]
    fn node_and_host_identities_must_name_a_dc() {
        assert_eq!(
            Identity::new(Role::Host, None),
            Err(IdentityError::MissingDc(Role::Host))
        );
        assert!("root".parse::<Role>().is_err());
        assert_eq!("router".parse::<Role>(), Ok(Role::Router));
    }
}
