//! A 3-DC homing deployment in this process, for the e2e test and the load
//! example: real homingd daemons on loopback QUIC with mutual TLS, redb DC
//! stores and one shared redb global store (as `homing devnet` starts them).

#![allow(dead_code)]

use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;

use homing_client::{Resolver, ResolverConfig};
use homing_core::{DcId, Identity, Role};
use homing_daemon::{Config, Daemon, Settings};
use homing_net::{Client, ClientLimits, Peer, TlsIdentity, generate_dev_pki, pki::cert_name};
use homing_store::{GlobalStore, RedbDcStore, RedbGlobalStore, RedbOptions};

/// Running DCs and the certificates to reach them.
pub struct Net {
    /// Every DC, in start order.
    pub dcs: Vec<(DcId, Daemon)>,
    /// The dev PKI directory.
    pub certs: PathBuf,
    _dir: tempfile::TempDir,
}

fn free_udp_port() -> std::io::Result<SocketAddr> {
    // Bound and released at once: the daemon binds it right after.
    UdpSocket::bind("127.0.0.1:0")?.local_addr()
}

fn identity(certs: &std::path::Path, identity: &Identity) -> anyhow::Result<TlsIdentity> {
    let name = cert_name(identity);
    Ok(TlsIdentity::load_pem(
        &certs.join("ca.pem"),
        &certs.join(format!("{name}.pem")),
        &certs.join(format!("{name}.key")),
    )?)
}

impl Net {
    /// Starts one daemon per name, each peering with all others.
    pub async fn start(names: &[&str]) -> anyhow::Result<Net> {
        Net::start_with(names, None).await
    }

    /// Like [`Net::start`], with leases of `short_lease` =
    /// `(ttl_ms, soft_margin_ms, hard_margin_ms, grace_ms)` if given.
    pub async fn start_with(
        names: &[&str],
        short_lease: Option<(u64, u64, u64, u64)>,
    ) -> anyhow::Result<Net> {
        let ids = names
            .iter()
            .map(|n| DcId::new(*n))
            .collect::<Result<Vec<_>, _>>()?;
        let dir = tempfile::Builder::new().prefix("homing-edge-").tempdir()?;
        let certs = dir.path().join("certs");
        generate_dev_pki(&certs, &ids)?;
        let global: Arc<dyn GlobalStore> = Arc::new(RedbGlobalStore::open(
            dir.path().join("global.redb"),
            RedbOptions::default(),
        )?);
        let listen = ids
            .iter()
            .map(|_| free_udp_port())
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut dcs = Vec::new();
        for (i, id) in ids.iter().enumerate() {
            let peers = ids
                .iter()
                .zip(&listen)
                .filter(|(other, _)| *other != id)
                .map(|(other, addr)| (other.to_string(), *addr))
                .collect();
            let settings = Settings {
                dc: Some(id.to_string()),
                listen: Some(listen[i]),
                peers: Some(peers),
                data_dir: Some(dir.path().join(id.as_str())),
                ca_cert: Some(certs.join("ca.pem")),
                cert: Some(certs.join(format!("node-{id}.pem"))),
                key: Some(certs.join(format!("node-{id}.key"))),
                lease_ttl_ms: short_lease.map(|l| l.0),
                soft_margin_ms: short_lease.map(|l| l.1),
                hard_margin_ms: short_lease.map(|l| l.2),
                grace_ms: short_lease.map(|l| l.3),
                ..Settings::default()
            };
            let config = Config::from_settings(settings)?;
            let tls = identity(&certs, &Identity::new(Role::Node, Some(id.clone()))?)?;
            std::fs::create_dir_all(&config.data_dir)?;
            let records = Arc::new(RedbDcStore::open(
                config.data_dir.join(format!("dc-{id}.redb")),
                RedbOptions::default(),
            )?);
            let daemon = Daemon::start(&config, &tls, global.clone(), records).await?;
            dcs.push((id.clone(), daemon));
        }
        Ok(Net {
            dcs,
            certs,
            _dir: dir,
        })
    }

    /// The peer of DC number `i`.
    pub fn peer(&self, i: usize) -> Peer {
        Peer {
            addr: self.dcs[i].1.local_addr(),
            dc: self.dcs[i].0.clone(),
        }
    }

    /// A QUIC client with the host certificate of DC number `i`.
    pub fn host_client(&self, i: usize) -> anyhow::Result<Client> {
        let tls = identity(
            &self.certs,
            &Identity::new(Role::Host, Some(self.dcs[i].0.clone()))?,
        )?;
        Ok(Client::new(&tls, ClientLimits::default())?)
    }

    /// A QUIC client with the admin certificate.
    pub fn admin_client(&self) -> anyhow::Result<Client> {
        let tls = identity(&self.certs, &Identity::new(Role::Admin, None)?)?;
        Ok(Client::new(&tls, ClientLimits::default())?)
    }

    /// A QUIC client with the router certificate.
    pub fn router_client(&self) -> anyhow::Result<Client> {
        let tls = identity(&self.certs, &Identity::new(Role::Router, None)?)?;
        Ok(Client::new(&tls, ClientLimits::default())?)
    }

    /// A resolver with the router certificate, attached to DC number
    /// `nearest` (asked first), with the given tail TTL.
    pub fn resolver(&self, nearest: usize, tail_ttl_ms: u64) -> anyhow::Result<Resolver> {
        let tls = identity(&self.certs, &Identity::new(Role::Router, None)?)?;
        let mut table = vec![(
            self.dcs[nearest].0.clone(),
            self.dcs[nearest].1.local_addr(),
        )];
        table.extend(
            self.dcs
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != nearest)
                .map(|(_, (id, d))| (id.clone(), d.local_addr())),
        );
        let config = ResolverConfig {
            tail_ttl_ms,
            ..ResolverConfig::new(table)
        };
        Ok(Resolver::new(
            Client::new(&tls, ClientLimits::default())?,
            config,
        ))
    }

    /// Stops every daemon.
    pub async fn shutdown(self) {
        for (_, daemon) in self.dcs {
            daemon.shutdown().await;
        }
    }
}
