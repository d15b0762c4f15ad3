//! `TlsIdentity`: the deployment CA plus this process's certificate and key,
//! and the CA's certificate revocation lists if any, loaded from PEM, and
//! the rustls configurations built from it: TLS 1.3 only, ring provider,
//! mutual authentication, every peer's certificate checked against the
//! revocation lists, ALPN `homing/<version>` for every protocol version it
//! speaks (newest first, so a handshake settles on the newest both sides
//! speak).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use homing_core::Identity;
use homing_core::wire::{self, PROTOCOL_VERSION, PROTOCOL_VERSION_OLDEST};
use rustls::RootCertStore;
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::error::NetError;
use crate::identity::{CertIdentityError, identity_from_cert};

/// The CA every peer must chain to, this process's certificate chain and
/// its key, and the CA's revocation lists (a peer whose certificate one of
/// them lists is refused at the handshake).
#[derive(Debug)]
pub struct TlsIdentity {
    ca: CertificateDer<'static>,
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    crls: Vec<CertificateRevocationListDer<'static>>,
    /// The protocol versions it offers (oldest, newest).
    versions: (u16, u16),
}

impl Clone for TlsIdentity {
    fn clone(&self) -> TlsIdentity {
        TlsIdentity {
            ca: self.ca.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            crls: self.crls.clone(),
            versions: self.versions,
        }
    }
}

impl TlsIdentity {
    /// Loads the CA certificate, this process's certificate chain (leaf
    /// first) and its private key from PEM files.
    pub fn load_pem(
        ca_path: &Path,
        cert_path: &Path,
        key_path: &Path,
    ) -> Result<TlsIdentity, NetError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| NetError::Pem {
                what: path.display().to_string(),
                reason: e.to_string(),
            })
        };
        TlsIdentity::from_pem_bytes(
            (&ca_path.display().to_string(), &read(ca_path)?),
            (&cert_path.display().to_string(), &read(cert_path)?),
            (&key_path.display().to_string(), &read(key_path)?),
        )
    }

    /// Builds an identity from PEM text: the CA certificate, this process's
    /// certificate chain (leaf first) and its private key.
    pub fn from_pem_strings(
        ca_pem: &str,
        cert_pem: &str,
        key_pem: &str,
    ) -> Result<TlsIdentity, NetError> {
        TlsIdentity::from_pem_bytes(
            ("ca", ca_pem.as_bytes()),
            ("cert", cert_pem.as_bytes()),
            ("key", key_pem.as_bytes()),
        )
    }

    fn from_pem_bytes(
        ca: (&str, &[u8]),
        cert: (&str, &[u8]),
        key: (&str, &[u8]),
    ) -> Result<TlsIdentity, NetError> {
        let pem_error = |what: &str, reason: String| NetError::Pem {
            what: what.to_string(),
            reason,
        };
        let certs = |(what, bytes): (&str, &[u8])| {
            let certs = CertificateDer::pem_slice_iter(bytes)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| pem_error(what, e.to_string()))?;
            if certs.is_empty() {
                return Err(pem_error(what, "no certificate".to_string()));
            }
            Ok(certs)
        };
        let mut ca_certs = certs(ca)?;
        if ca_certs.len() != 1 {
            return Err(pem_error(
                ca.0,
                "expected exactly one ca certificate".to_string(),
            ));
        }
        let chain = certs(cert)?;
        let key_der =
            PrivateKeyDer::from_pem_slice(key.1).map_err(|e| pem_error(key.0, e.to_string()))?;
        let identity = TlsIdentity {
            ca: ca_certs.remove(0),
            chain,
            key: key_der,
            crls: Vec::new(),
            versions: (PROTOCOL_VERSION_OLDEST, PROTOCOL_VERSION),
        };
        identity.identity()?;
        Ok(identity)
    }

    /// This identity, also refusing every peer certificate that the
    /// revocation lists in `pem` (PEM `X509 CRL` blocks, named `what` in
    /// errors) list. Each list must be signed by the CA: one that is not
    /// refuses every peer, so a wrong file is seen at once.
    pub fn with_crl_pem(mut self, what: &str, pem: &[u8]) -> Result<TlsIdentity, NetError> {
        let crls = CertificateRevocationListDer::pem_slice_iter(pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| NetError::Pem {
                what: what.to_string(),
                reason: e.to_string(),
            })?;
        if crls.is_empty() {
            return Err(NetError::Pem {
                what: what.to_string(),
                reason: "no certificate revocation list".to_string(),
            });
        }
        self.crls = crls;
        // Built once here so that a list rustls cannot use is refused now,
        // not at the first handshake.
        self.rustls_server_config()?;
        Ok(self)
    }

    /// This identity offering only protocol versions `oldest..=newest`
    /// (by default every version this build speaks): a test's stand-in for
    /// a process of another release.
    ///
    /// # Panics
    /// If the range is empty or reaches outside what this build speaks.
    pub fn speaking(mut self, oldest: u16, newest: u16) -> TlsIdentity {
        assert!(
            PROTOCOL_VERSION_OLDEST <= oldest && oldest <= newest && newest <= PROTOCOL_VERSION,
            "versions {oldest}..={newest} outside what this build speaks"
        );
        self.versions = (oldest, newest);
        self
    }

    /// The protocol versions it offers, oldest and newest.
    pub fn versions(&self) -> (u16, u16) {
        self.versions
    }

    fn alpn_protocols(&self) -> Vec<Vec<u8>> {
        wire::alpn_offer(self.versions.0..=self.versions.1)
    }

    /// How many revocation lists it checks peers against.
    pub fn crls(&self) -> usize {
        self.crls.len()
    }

    /// The homing identity this process's certificate names.
    pub fn identity(&self) -> Result<Identity, CertIdentityError> {
        let leaf = self.chain.first().ok_or(CertIdentityError::Missing)?;
        identity_from_cert(leaf)
    }

    /// The keys a server's QUIC endpoint signs stateless resets with and
    /// validates its connection IDs with, derived from its private key: a
    /// restarted process holding the same identity recognises its
    /// predecessor's connection IDs and sends resets its peers accept.
    pub fn endpoint_keys(&self) -> (ring::hmac::Key, u64) {
        let secret = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, self.key.secret_der());
        let derive = |label: &[u8]| ring::hmac::sign(&secret, label);
        let reset = derive(b"homing quic stateless reset key v1");
        let cid = derive(b"homing quic connection id key v1");
        let mut cid_key = [0u8; 8];
        cid_key.copy_from_slice(&cid.as_ref()[..8]);
        (
            ring::hmac::Key::new(ring::hmac::HMAC_SHA256, reset.as_ref()),
            u64::from_le_bytes(cid_key),
        )
    }

    /// A rustls server configuration: TLS 1.3, ring, clients must present a
    /// certificate from the CA that no revocation list lists, ALPN of every
    /// version it speaks.
    pub fn rustls_server_config(&self) -> Result<rustls::ServerConfig, NetError> {
        let provider = provider();
        let mut verifier =
            WebPkiClientVerifier::builder_with_provider(self.roots()?, provider.clone());
        if !self.crls.is_empty() {
            // The CA issues the leaves itself: only they can be revoked.
            verifier = verifier
                .with_crls(self.crls.clone())
                .only_check_end_entity_revocation();
        }
        let verifier = verifier.build().map_err(|e| NetError::Tls(e.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| NetError::Tls(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| NetError::Tls(e.to_string()))?;
        config.alpn_protocols = self.alpn_protocols();
        Ok(config)
    }

    /// A rustls client configuration: TLS 1.3, ring, servers must present a
    /// certificate from the CA that no revocation list lists, this
    /// process's certificate as client certificate, ALPN of every version
    /// it speaks.
    pub fn rustls_client_config(&self) -> Result<rustls::ClientConfig, NetError> {
        let provider = provider();
        let mut verifier =
            WebPkiServerVerifier::builder_with_provider(self.roots()?, provider.clone());
        if !self.crls.is_empty() {
            verifier = verifier
                .with_crls(self.crls.clone())
                .only_check_end_entity_revocation();
        }
        let verifier = verifier.build().map_err(|e| NetError::Tls(e.to_string()))?;
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| NetError::Tls(e.to_string()))?
            .with_webpki_verifier(verifier)
            .with_client_auth_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| NetError::Tls(e.to_string()))?;
        config.alpn_protocols = self.alpn_protocols();
        Ok(config)
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, NetError> {
        let mut roots = RootCertStore::empty();
        roots
            .add(self.ca.clone())
            .map_err(|e| NetError::Tls(e.to_string()))?;
        Ok(Arc::new(roots))
    }
}

/// Where a process's TLS identity lives on disk, so that it can be loaded
/// again when the files change (certificate rotation, a new revocation
/// list) without a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate (PEM).
    pub ca: PathBuf,
    /// This process's certificate chain, leaf first (PEM).
    pub cert: PathBuf,
    /// This process's private key (PEM).
    pub key: PathBuf,
    /// The CA's certificate revocation list (PEM), if revocation is used.
    pub crl: Option<PathBuf>,
}

/// What the files looked like when last looked at: each one's size,
/// modification time and (on unix) inode, so that a file replaced by a
/// rename shows as changed even within the same second.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilesStamp(Vec<Option<(u64, Option<std::time::SystemTime>, u64)>>);

impl TlsFiles {
    /// The identity the files hold now.
    pub fn load(&self) -> Result<TlsIdentity, NetError> {
        let identity = TlsIdentity::load_pem(&self.ca, &self.cert, &self.key)?;
        match &self.crl {
            None => Ok(identity),
            Some(path) => {
                let pem = std::fs::read(path).map_err(|e| NetError::Pem {
                    what: path.display().to_string(),
                    reason: e.to_string(),
                })?;
                identity.with_crl_pem(&path.display().to_string(), &pem)
            }
        }
    }

    /// How the files look now (a file that cannot be read stamps as `None`).
    pub fn stamp(&self) -> FilesStamp {
        let paths = [
            Some(&self.ca),
            Some(&self.cert),
            Some(&self.key),
            self.crl.as_ref(),
        ];
        FilesStamp(
            paths
                .into_iter()
                .flatten()
                .map(|path| {
                    let meta = std::fs::metadata(path).ok()?;
                    #[cfg(unix)]
                    let inode = std::os::unix::fs::MetadataExt::ino(&meta);
                    #[cfg(not(unix))]
                    let inode = 0;
                    Some((meta.len(), meta.modified().ok(), inode))
                })
                .collect(),
        )
    }
}

/// The ring crypto provider; never aws-lc-rs.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
