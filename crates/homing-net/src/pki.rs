//! A development PKI made with rcgen: one CA, and role certificates issued
//! from it that carry the identity URI (and, for nodes, the server name) of
//! [`crate::identity`]. Production deployments bring their own CA and load
//! PEM files through [`crate::TlsIdentity::load_pem`].

use std::path::{Path, PathBuf};

use homing_core::{DcId, Identity, Role};
use rcgen::{
    BasicConstraints, CertificateParams, CertificateRevocationListParams, DnType,
    ExtendedKeyUsagePurpose, IsCa, Issuer, KeyIdMethod, KeyPair, KeyUsagePurpose, RevocationReason,
    RevokedCertParams, SanType, SerialNumber,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer};
use thiserror::Error;

use crate::error::NetError;
use crate::identity::{identity_uri, node_server_name};
use crate::tls::{TlsFiles, TlsIdentity};

/// Common name of a generated CA.
pub const DEV_CA_COMMON_NAME: &str = "homing dev ca";
/// File stem of the CA certificate and key written by [`generate_dev_pki`].
pub const CA_FILE_STEM: &str = "ca";
/// The dev PKI's certificate revocation list, written by [`revoke_dev_certs`].
pub const CRL_FILE: &str = "crl.pem";
/// How long a revocation list of the dev PKI is valid, days (rustls does not
/// refuse an expired list by default; this is for other readers).
pub const CRL_VALID_DAYS: i64 = 365;

/// Why a certificate could not be generated or written.
#[derive(Debug, Error)]
pub enum PkiError {
    /// rcgen refused the parameters or key.
    #[error("certificate generation: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be written.
    #[error("write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file could not be read or is not what it should be.
    #[error("read {path}: {reason}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// A CA that can issue role certificates.
pub struct DevCa {
    cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for DevCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevCa").finish_non_exhaustive()
    }
}

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct IssuedCert {
    /// The certificate.
    pub cert_pem: String,
    /// The private key (PKCS#8).
    pub key_pem: String,
}

impl DevCa {
    /// A new self-signed CA with a fresh ECDSA P-256 key.
    pub fn generate(common_name: &str) -> Result<DevCa, PkiError> {
        let mut params = CertificateParams::new(Vec::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "homing");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(DevCa {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA from its PEM certificate and PEM private key (as written by
    /// [`generate_dev_pki`]), to issue more certificates later.
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<DevCa, PkiError> {
        let key = KeyPair::from_pem(key_pem)?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)?;
        Ok(DevCa {
            cert_pem: cert_pem.to_string(),
            issuer,
        })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA private key, PEM. Keep it secret.
    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    /// Issues a certificate for `identity`: SAN URI `homing://<role>[/<dc>]`,
    /// and for nodes the DNS names `<dc>.node.homing` and `localhost`. Every
    /// certificate is valid for both client and server authentication.
    pub fn issue(&self, identity: &Identity) -> Result<IssuedCert, PkiError> {
        let mut params = CertificateParams::new(Vec::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, cert_name(identity));
        params
            .distinguished_name
            .push(DnType::OrganizationName, "homing");
        params
            .subject_alt_names
            .push(SanType::URI(identity_uri(identity).try_into()?));
        if let (Role::Node, Some(dc)) = (identity.role(), identity.dc()) {
            params
                .subject_alt_names
                .push(SanType::DnsName(node_server_name(dc).try_into()?));
            params
                .subject_alt_names
                .push(SanType::DnsName("localhost".try_into()?));
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.use_authority_key_identifier_extension = true;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(IssuedCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A certificate revocation list signed by this CA listing the
    /// certificates with `serials` (revoked at `now_unix_s`), numbered
    /// `now_unix_s` (so a later list has a higher number), PEM.
    pub fn crl(&self, serials: &[Vec<u8>], now_unix_s: i64) -> Result<String, PkiError> {
        let at = |s: i64| {
            time::OffsetDateTime::from_unix_timestamp(s)
                .map_err(|_| rcgen::Error::InvalidCrlNextUpdate)
        };
        let now = at(now_unix_s)?;
        let params = CertificateRevocationListParams {
            this_update: now,
            next_update: at(now_unix_s + CRL_VALID_DAYS * 86_400)?,
            crl_number: SerialNumber::from(now_unix_s.max(0) as u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|serial| RevokedCertParams {
                    serial_number: SerialNumber::from_slice(serial),
                    revocation_time: now,
                    reason_code: Some(RevocationReason::Unspecified),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: KeyIdMethod::Sha256,
        };
        Ok(params.signed_by(&self.issuer)?.pem()?)
    }

    /// Issues a certificate for `identity` and returns it as a ready
    /// [`TlsIdentity`] trusting this CA.
    pub fn tls_identity(&self, identity: &Identity) -> Result<TlsIdentity, NetError> {
        let issued = self
            .issue(identity)
            .map_err(|e| NetError::Tls(e.to_string()))?;
        TlsIdentity::from_pem_strings(&self.cert_pem, &issued.cert_pem, &issued.key_pem)
    }
}

/// The file stem of `identity`'s certificate: `node-<dc>`, `host-<dc>`,
/// `router`, `admin` (`<role>-<dc>` for a router or admin that names a DC).
pub fn cert_name(identity: &Identity) -> String {
    match identity.dc() {
        Some(dc) => format!("{}-{}", identity.role(), dc),
        None => identity.role().to_string(),
    }
}

/// Loads `identity`'s certificate and key, and the CA, from a directory laid
/// out as [`generate_dev_pki`] writes it (`ca.pem`, `<cert_name>.pem|.key`).
pub fn load_identity(dir: &Path, identity: &Identity) -> Result<TlsIdentity, NetError> {
    identity_files(dir, identity, None).load()
}

/// Where `identity`'s certificate, key and CA are in a directory laid out
/// as [`generate_dev_pki`] writes it, with revocation list `crl` if given.
pub fn identity_files(dir: &Path, identity: &Identity, crl: Option<PathBuf>) -> TlsFiles {
    let name = cert_name(identity);
    TlsFiles {
        ca: dir.join(format!("{CA_FILE_STEM}.pem")),
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}.key")),
        crl,
    }
}

/// Revokes the dev PKI's certificates `names` (file stems in `dir`, as
/// [`cert_name`] makes them): writes `dir/crl.pem`, signed by the CA in
/// `dir`, listing them and every certificate the list there already lists.
/// Processes that load it (homingd's `crl` setting) refuse those
/// certificates at their next handshake once they reload it. Returns the
/// list's path and how many certificates it lists.
pub fn revoke_dev_certs(
    dir: &Path,
    names: &[String],
    now_unix_s: i64,
) -> Result<(PathBuf, usize), PkiError> {
    let read = |path: &Path| {
        std::fs::read_to_string(path).map_err(|e| PkiError::Read {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    };
    let ca_cert = read(&dir.join(format!("{CA_FILE_STEM}.pem")))?;
    let ca = DevCa::from_pem(&ca_cert, &read(&dir.join(format!("{CA_FILE_STEM}.key")))?)?;
    let crl_path = dir.join(CRL_FILE);
    let mut serials = match crl_path.exists() {
        true => crl_serials(&crl_path, &read(&crl_path)?)?,
        false => Vec::new(),
    };
    for name in names {
        let path = dir.join(format!("{name}.pem"));
        let serial = cert_serial(&path, &read(&path)?)?;
        if !serials.contains(&serial) {
            serials.push(serial);
        }
    }
    let crl = ca.crl(&serials, now_unix_s)?;
    // Written beside it and renamed over it: a process reloading it never
    // reads half a list.
    let staged = dir.join(format!("{CRL_FILE}.new"));
    write_file(&staged, &crl, false)?;
    std::fs::rename(&staged, &crl_path).map_err(|source| PkiError::Write {
        path: crl_path.clone(),
        source,
    })?;
    Ok((crl_path, serials.len()))
}

/// The serial number of the first certificate in `pem` (read from `path`).
fn cert_serial(path: &Path, pem: &str) -> Result<Vec<u8>, PkiError> {
    let bad = |reason: String| PkiError::Read {
        path: path.to_path_buf(),
        reason,
    };
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| bad(e.to_string()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|e| bad(e.to_string()))?;
    Ok(cert.raw_serial().to_vec())
}

/// The serial numbers a PEM revocation list (read from `path`) lists.
fn crl_serials(path: &Path, pem: &str) -> Result<Vec<Vec<u8>>, PkiError> {
    let bad = |reason: String| PkiError::Read {
        path: path.to_path_buf(),
        reason,
    };
    let der = CertificateRevocationListDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| bad(e.to_string()))?;
    let (_, crl) = x509_parser::parse_x509_crl(&der).map_err(|e| bad(e.to_string()))?;
    Ok(crl
        .iter_revoked_certificates()
        .map(|revoked| revoked.raw_serial().to_vec())
        .collect())
}

/// The files [`generate_dev_pki`] wrote.
#[derive(Debug, Clone)]
pub struct DevPkiFiles {
    /// `ca.pem`.
    pub ca_cert: PathBuf,
    /// `ca.key`.
    pub ca_key: PathBuf,
    /// For each identity, its `<name>.pem` and `<name>.key`.
    pub certs: Vec<(Identity, PathBuf, PathBuf)>,
}

/// Writes a new CA (`ca.pem`, `ca.key`) and, issued from it, `node-<dc>` and
/// `host-<dc>` for every DC plus `router` and `admin` (`<name>.pem`,
/// `<name>.key`) into `dir`, creating it. Key files get mode 0600.
pub fn generate_dev_pki(dir: &Path, dcs: &[DcId]) -> Result<DevPkiFiles, PkiError> {
    std::fs::create_dir_all(dir).map_err(|source| PkiError::Write {
        path: dir.to_path_buf(),
        source,
    })?;
    let ca = DevCa::generate(DEV_CA_COMMON_NAME)?;
    let ca_cert = dir.join(format!("{CA_FILE_STEM}.pem"));
    let ca_key = dir.join(format!("{CA_FILE_STEM}.key"));
    write_file(&ca_cert, ca.cert_pem(), false)?;
    write_file(&ca_key, &ca.key_pem(), true)?;
    let mut identities = Vec::with_capacity(dcs.len() * 2 + 2);
    for dc in dcs {
        // Unwrap: node and host identities are valid whenever they name a DC.
        identities.push(Identity::new(Role::Node, Some(dc.clone())).expect("node names its dc"));
        identities.push(Identity::new(Role::Host, Some(dc.clone())).expect("host names its dc"));
    }
    identities.push(Identity::new(Role::Router, None).expect("router needs no dc"));
    identities.push(Identity::new(Role::Admin, None).expect("admin needs no dc"));
    let mut certs = Vec::with_capacity(identities.len());
    for identity in identities {
        let issued = ca.issue(&identity)?;
        let name = cert_name(&identity);
        let cert_path = dir.join(format!("{name}.pem"));
        let key_path = dir.join(format!("{name}.key"));
        write_file(&cert_path, &issued.cert_pem, false)?;
        write_file(&key_path, &issued.key_pem, true)?;
        certs.push((identity, cert_path, key_path));
    }
    Ok(DevPkiFiles {
        ca_cert,
        ca_key,
        certs,
    })
}

fn write_file(path: &Path, contents: &str, secret: bool) -> Result<(), PkiError> {
    use std::io::Write;
    let error = |source| PkiError::Write {
        path: path.to_path_buf(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(if secret { 0o600 } else { 0o644 });
    }
    #[cfg(not(unix))]
    let _ = secret;
    let mut file = options.open(path).map_err(error)?;
    file.write_all(contents.as_bytes()).map_err(error)?;
    // `mode` applies only when the file is created; tighten an existing key file too.
    #[cfg(unix)]
    if secret {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(error)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::identity_from_cert;
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;

    #[test]
    fn dev_pki_writes_every_role_with_private_keys() {
        let dir = tempfile::tempdir().unwrap();
        let dcs = [DcId::new("iad").unwrap(), DcId::new("fra").unwrap()];
        let files = generate_dev_pki(dir.path(), &dcs).unwrap();
        assert_eq!(files.certs.len(), 6);
        for name in [
            "ca", "node-iad", "host-iad", "node-fra", "host-fra", "router", "admin",
        ] {
            assert!(dir.path().join(format!("{name}.pem")).exists(), "{name}");
            let key = dir.path().join(format!("{name}.key"));
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                assert_eq!(
                    std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
                    0o600,
                    "{name}"
                );
            }
        }
        for (identity, cert, key) in &files.certs {
            let tls = TlsIdentity::load_pem(&files.ca_cert, cert, key).unwrap();
            assert_eq!(&tls.identity().unwrap(), identity);
        }
    }

    #[test]
    fn a_ca_reloaded_from_pem_issues_certificates_with_identities() {
        let ca = DevCa::generate("test ca").unwrap();
        let again = DevCa::from_pem(ca.cert_pem(), &ca.key_pem()).unwrap();
        let node = Identity::new(Role::Node, Some(DcId::new("iad").unwrap())).unwrap();
        let issued = again.issue(&node).unwrap();
        let der = CertificateDer::from_pem_slice(issued.cert_pem.as_bytes()).unwrap();
        assert_eq!(identity_from_cert(&der).unwrap(), node);
        assert!(
            TlsIdentity::from_pem_strings(ca.cert_pem(), &issued.cert_pem, &issued.key_pem).is_ok()
        );
    }
}
