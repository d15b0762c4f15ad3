//! How a certificate names its holder: one SAN URI `homing://<role>/<dc>`
//! (node, host) or `homing://<role>` (router, admin), parsed back into a
//! [`homing_core::Identity`]. Node certificates also carry the DNS SAN
//! `<dc>.node.homing`, the server name clients verify.

use homing_core::{DcId, Identity, Role};
use thiserror::Error;
use x509_parser::extensions::GeneralName;

/// Scheme and separator that start an identity URI.
pub const IDENTITY_URI_PREFIX: &str = "homing://";
/// DNS suffix of a node's server name: `<dc>` + this.
pub const NODE_DNS_SUFFIX: &str = ".node.homing";
/// Longest identity URI accepted, in bytes (role + `/` + longest DC id, with room).
const IDENTITY_URI_BYTES_MAX: usize = 64;

/// A certificate whose identity claims cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CertIdentityError {
    /// The bytes are not an X.509 certificate.
    #[error("unparsable certificate: {0}")]
    Unparsable(String),
    /// No `homing://` SAN URI.
    #[error("no homing:// uri in the certificate's subject alternative names")]
    Missing,
    /// More than one `homing://` SAN URI.
    #[error("more than one homing:// uri in the certificate")]
    Ambiguous,
    /// The URI does not name a valid role and DC.
    #[error("invalid identity uri {uri:?}: {reason}")]
    Invalid {
        /// The URI (cut to a bounded length).
        uri: String,
        /// The rule it broke.
        reason: String,
    },
}

/// The SAN URI that encodes `identity`.
pub fn identity_uri(identity: &Identity) -> String {
    match identity.dc() {
        Some(dc) => format!("{IDENTITY_URI_PREFIX}{}/{}", identity.role(), dc),
        None => format!("{IDENTITY_URI_PREFIX}{}", identity.role()),
    }
}

/// The server name a client verifies when it connects to the node of `dc`.
pub fn node_server_name(dc: &DcId) -> String {
    format!("{dc}{NODE_DNS_SUFFIX}")
}

/// Parses an identity URI; the inverse of [`identity_uri`].
pub fn parse_identity_uri(uri: &str) -> Result<Identity, CertIdentityError> {
    let invalid = |reason: String| CertIdentityError::Invalid {
        uri: uri.chars().take(IDENTITY_URI_BYTES_MAX).collect(),
        reason,
    };
    if uri.len() > IDENTITY_URI_BYTES_MAX {
        return Err(invalid(format!(
            "longer than {IDENTITY_URI_BYTES_MAX} bytes"
        )));
    }
    let rest = uri
        .strip_prefix(IDENTITY_URI_PREFIX)
        .ok_or_else(|| invalid(format!("does not start with {IDENTITY_URI_PREFIX}")))?;
    let (role, dc) = match rest.split_once('/') {
        Some((role, dc)) => (role, Some(dc)),
        None => (rest, None),
    };
    let role: Role = role
        .parse()
        .map_err(|e: homing_core::access::IdentityError| invalid(e.to_string()))?;
    let dc = dc
        .map(DcId::new)
        .transpose()
        .map_err(|e| invalid(e.to_string()))?;
    Identity::new(role, dc).map_err(|e| invalid(e.to_string()))
}

/// The identity named by a DER certificate's `homing://` SAN URI.
pub fn identity_from_cert(der: &[u8]) -> Result<Identity, CertIdentityError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| CertIdentityError::Unparsable(e.to_string()))?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| CertIdentityError::Unparsable(e.to_string()))?
        .ok_or(CertIdentityError::Missing)?;
    let mut uris = san
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) if uri.starts_with(IDENTITY_URI_PREFIX) => Some(*uri),
            _ => None,
        });
    let uri = uris.next().ok_or(CertIdentityError::Missing)?;
    if uris.next().is_some() {
        return Err(CertIdentityError::Ambiguous);
    }
    parse_identity_uri(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dc(text: &str) -> DcId {
        DcId::new(text).unwrap()
    }

    #[test]
    fn identity_uris_round_trip_for_every_role() {
        let identities = [
            Identity::new(Role::Node, Some(dc("iad"))).unwrap(),
            Identity::new(Role::Host, Some(dc("fra-1"))).unwrap(),
            Identity::new(Role::Router, None).unwrap(),
            Identity::new(Role::Admin, None).unwrap(),
        ];
        for identity in identities {
            let uri = identity_uri(&identity);
            assert_eq!(parse_identity_uri(&uri).unwrap(), identity, "{uri}");
        }
        assert_eq!(identity_uri(&identities_node()), "homing://node/iad");
        assert_eq!(node_server_name(&dc("iad")), "iad.node.homing");
    }

    fn identities_node() -> Identity {
        Identity::new(Role::Node, Some(dc("iad"))).unwrap()
    }

    #[test]
    fn bad_identity_uris_are_refused_by_rule() {
        for bad in [
            "https://node/iad",
            "homing://node",
            "homing://root",
            "homing://node/IAD",
            "homing://node/ia.d",
            "homing://host/",
        ] {
            assert!(
                matches!(
                    parse_identity_uri(bad),
                    Err(CertIdentityError::Invalid { .. })
                ),
                "{bad}"
            );
        }
        let long = format!("homing://node/{}", "a".repeat(100));
        assert!(parse_identity_uri(&long).is_err());
        assert!(matches!(
            identity_from_cert(b"not a cert"),
            Err(CertIdentityError::Unparsable(_))
        ));
    }
}
