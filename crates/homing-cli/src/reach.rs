//! How the CLI reaches a deployment: a certificate directory (as written by
//! `homing certs`) and a table of DCs, nearest first.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, bail};
use clap::Args;
use homing_client::{Resolver, ResolverConfig};
use homing_core::{DcId, Identity, Role};
use homing_net::{Client, ClientLimits, Peer, TlsIdentity, pki::cert_name};

use crate::exit::{BadInput, Exit, fail};

/// Where the deployment is and who the CLI is.
#[derive(Debug, Clone, Args)]
pub struct Reach {
    /// Directory with ca.pem and role certificates, as written by `homing certs`.
    #[arg(
        long,
        env = "HOMING_CERTS",
        default_value = "homing-certs",
        global = true
    )]
    pub certs: PathBuf,
    /// The certificate to present: admin or router.
    #[arg(long = "as", env = "HOMING_AS", default_value = "admin")]
    pub role: String,
    /// A DC as NAME=ADDR, nearest first; repeatable (env: comma-separated).
    #[arg(long = "dc", env = "HOMING_DCS", value_delimiter = ',')]
    pub dcs: Vec<String>,
}

impl Reach {
    /// The DC table, parsed.
    pub fn dcs(&self) -> anyhow::Result<Vec<(DcId, SocketAddr)>> {
        parse_dc_table(&self.dcs)
    }

    /// The peer for `dc`.
    pub fn peer(&self, dc: &DcId) -> anyhow::Result<Peer> {
        let addr = self
            .dcs()?
            .into_iter()
            .find(|(name, _)| name == dc)
            .map(|(_, addr)| addr)
            .with_context(|| format!("dc {dc} is not in the --dc table"))
            .bad_input("--dc")?;
        Ok(Peer {
            addr,
            dc: dc.clone(),
        })
    }

    /// The nearest DC.
    pub fn nearest(&self) -> anyhow::Result<Peer> {
        let first = self.dcs()?.into_iter().next();
        let (dc, addr) = first.context("empty --dc table").bad_input("--dc")?;
        Ok(Peer { addr, dc })
    }

    /// A resolver over the DC table (checked first: it is the usual omission).
    pub fn resolver(&self) -> anyhow::Result<Resolver> {
        let dcs = self.dcs()?;
        Ok(Resolver::new(self.client()?, ResolverConfig::new(dcs)))
    }

    /// A QUIC client presenting the chosen role's certificate.
    pub fn client(&self) -> anyhow::Result<Client> {
        let role: Role = self.role.parse().bad_input("--as")?;
        if role.needs_dc() {
            return Err(fail(
                Exit::BadInput,
                format!("--as {role}: the CLI acts as admin or router"),
            ));
        }
        let identity = Identity::new(role, None).bad_input("--as")?;
        let tls = load_identity(&self.certs, &identity)?;
        Ok(closed_at_exit(Client::new(&tls, ClientLimits::default())?))
    }
}

/// The clients this process made, for [`close_clients`]: a client that is
/// only dropped when the process exits leaves its connections open at the
/// DCs until their idle timeout, and a script calling `homing` in a loop
/// would fill a DC's connection table.
static CLIENTS: Mutex<Vec<Client>> = Mutex::new(Vec::new());

/// `client`, remembered to be closed by [`close_clients`].
pub fn closed_at_exit(client: Client) -> Client {
    CLIENTS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .push(client.clone());
    client
}

/// Closes every client made through [`closed_at_exit`], each bounded by
/// homing-net's close wait. Called once, before the process exits.
pub async fn close_clients() {
    let clients = std::mem::take(
        &mut *CLIENTS
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    );
    for client in clients {
        client.close().await;
    }
}

/// A DC table given as `--dc NAME=ADDR` entries (or `HOMING_DCS`), nearest
/// first. Fails on an empty table, saying where to get one (bad input).
pub fn parse_dc_table(entries: &[String]) -> anyhow::Result<Vec<(DcId, SocketAddr)>> {
    parse_entries(entries).bad_input("the DC table")
}

fn parse_entries(entries: &[String]) -> anyhow::Result<Vec<(DcId, SocketAddr)>> {
    if entries.is_empty() {
        bail!(
            "no DCs given: pass --dc NAME=ADDR (nearest first) or set HOMING_DCS, e.g. `homing devnet --serve` prints them"
        );
    }
    entries
        .iter()
        .map(|entry| {
            let (dc, addr) = entry
                .split_once('=')
                .with_context(|| format!("--dc {entry:?} is not NAME=ADDR"))?;
            let dc = DcId::new(dc).with_context(|| format!("--dc {entry:?}"))?;
            let addr = addr
                .parse()
                .with_context(|| format!("--dc {entry:?}: address"))?;
            Ok((dc, addr))
        })
        .collect()
}

/// Loads `identity`'s certificate, key and the CA from `dir`, saying how to
/// make them when they are missing (bad input).
pub fn load_identity(dir: &Path, identity: &Identity) -> anyhow::Result<TlsIdentity> {
    load_files(
        &homing_net::pki::identity_files(dir, identity, None),
        dir,
        identity,
    )
}

/// [`load_identity`] from `files` (`identity`'s in `dir`, with a revocation list perhaps).
pub fn load_files(
    files: &homing_net::TlsFiles,
    dir: &Path,
    identity: &Identity,
) -> anyhow::Result<TlsIdentity> {
    files.load().bad_input(format!(
        "loading the {} certificate from {} (run `homing certs --out {}` first?)",
        cert_name(identity),
        dir.display(),
        dir.display()
    ))
}
