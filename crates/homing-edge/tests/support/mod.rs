//! A 3-DC homing deployment in this process, for the e2e test and the load
//! example: `homing_daemon::Devnet` (what `homing devnet` starts), with
//! index-based helpers.

#![allow(dead_code)]

use homing_client::{Resolver, ResolverConfig};
use homing_core::{AcquireReply, DcId, KeyConfig, KeyName, Role};
use homing_daemon::{Devnet, DevnetOptions, Settings};
use homing_edge::{ActorHost, ActorHostConfig};
use homing_net::{Client, Peer};

/// Running DCs and the certificates to reach them.
pub struct Net {
    devnet: Devnet,
}

impl Net {
    /// Starts one daemon per name, each peering with all others.
    pub async fn start(names: &[&str]) -> anyhow::Result<Net> {
        Net::start_with(names, None).await
    }

    /// Like [`Net::start`], with leases of `lease_ttl_ms` (default margins).
    pub async fn start_with_lease_ttl(names: &[&str], lease_ttl_ms: u64) -> anyhow::Result<Net> {
        let overrides = Settings {
            lease_ttl_ms: Some(lease_ttl_ms),
            ..Settings::default()
        };
        Net::start_settings(names, overrides).await
    }

    /// Like [`Net::start`], with leases of `short_lease` =
    /// `(ttl_ms, soft_margin_ms, hard_margin_ms, grace_ms)` if given.
    pub async fn start_with(
        names: &[&str],
        short_lease: Option<(u64, u64, u64, u64)>,
    ) -> anyhow::Result<Net> {
        let overrides = Settings {
            lease_ttl_ms: short_lease.map(|l| l.0),
            soft_margin_ms: short_lease.map(|l| l.1),
            hard_margin_ms: short_lease.map(|l| l.2),
            grace_ms: short_lease.map(|l| l.3),
            ..Settings::default()
        };
        Net::start_settings(names, overrides).await
    }

    async fn start_settings(names: &[&str], overrides: Settings) -> anyhow::Result<Net> {
        let dcs = names
            .iter()
            .map(|n| DcId::new(*n))
            .collect::<Result<Vec<_>, _>>()?;
        let options = DevnetOptions {
            dcs,
            overrides,
            ..DevnetOptions::default()
        };
        Ok(Net {
            devnet: Devnet::start(options).await?,
        })
    }

    /// The DCs' ids and QUIC addresses, in start order.
    pub fn dcs(&self) -> Vec<(DcId, std::net::SocketAddr)> {
        self.devnet
            .dcs()
            .iter()
            .map(|d| (d.id.clone(), d.daemon.local_addr()))
            .collect()
    }

    /// The dev PKI directory.
    pub fn certs(&self) -> &std::path::Path {
        self.devnet.certs()
    }

    fn id(&self, i: usize) -> DcId {
        self.devnet.dcs()[i].id.clone()
    }

    /// The peer of DC number `i`.
    pub fn peer(&self, i: usize) -> Peer {
        self.devnet.peer(&self.id(i))
    }

    /// A QUIC client with the host certificate of DC number `i`.
    pub fn host_client(&self, i: usize) -> anyhow::Result<Client> {
        Ok(self.devnet.client(Role::Host, Some(&self.id(i)))?)
    }

    /// A QUIC client with the admin certificate.
    pub fn admin_client(&self) -> anyhow::Result<Client> {
        Ok(self.devnet.client(Role::Admin, None)?)
    }

    /// A QUIC client with the router certificate.
    pub fn router_client(&self) -> anyhow::Result<Client> {
        Ok(self.devnet.client(Role::Router, None)?)
    }

    /// A resolver with the router certificate, attached to DC number
    /// `nearest` (asked first), with the given tail TTL.
    pub fn resolver(&self, nearest: usize, tail_ttl_ms: u64) -> anyhow::Result<Resolver> {
        let table = self.devnet.router_table(&self.id(nearest));
        let config = ResolverConfig {
            tail_ttl_ms,
            ..ResolverConfig::new(table)
        };
        Ok(Resolver::new(self.router_client()?, config))
    }

    /// An actor host holding `key` in DC number `dc`, on a loopback port.
    pub async fn start_host(&self, dc: usize, key: &str) -> anyhow::Result<ActorHost> {
        let config = ActorHostConfig::new(
            self.peer(dc),
            KeyConfig::named(KeyName::new(key)?),
            "127.0.0.1:0".parse()?,
        );
        match ActorHost::start(self.host_client(dc)?, config).await? {
            AcquireReply::Acquired(host) => Ok(*host),
            other => anyhow::bail!("host in dc {dc} did not get {key}: {other:?}"),
        }
    }

    /// Stops every daemon.
    pub async fn shutdown(self) {
        self.devnet.shutdown().await;
    }
}
