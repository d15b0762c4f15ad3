//! A multi-DC deployment inside one process: one [`Daemon`] per DC on
//! loopback, real QUIC with mutual TLS from a generated dev PKI, a redb DC
//! store each and one shared redb global store, and optionally a relay adding
//! latency in front of every DC. `homing devnet`, the edge router's tests and
//! its load test all start their DCs here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use homing_core::{DcId, Identity, Role};
use homing_net::pki::load_identity;
use homing_net::{
    Client, ClientLimits, Peer, Relay, TlsIdentity, generate_dev_pki, loopback_listen_addr,
};
use homing_store::{GlobalStore, RedbDcStore, RedbGlobalStore, RedbOptions};

use crate::{Config, Daemon, DaemonError, Settings};

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct DevnetOptions {
    /// The DCs, in start order.
    pub dcs: Vec<DcId>,
    /// Latency a relay adds in front of each DC, one way, in milliseconds;
    /// 0 starts no relays.
    pub latency_ms: u64,
    /// Where stores and certificates live; a temporary directory if `None`.
    pub data_dir: Option<PathBuf>,
    /// Settings every daemon gets on top of the devnet's own (lease policy,
    /// reaper interval, …); identity, addresses and paths are the devnet's.
    pub overrides: Settings,
}

/// One running DC of a devnet.
pub struct DevnetDc {
    /// The DC.
    pub id: DcId,
    /// Its daemon.
    pub daemon: Daemon,
    /// Where other DCs reach it: its relay when latency is injected.
    pub reached_at: SocketAddr,
    _relay: Option<Relay>,
}

/// A running devnet. Stop it with [`Devnet::shutdown`].
pub struct Devnet {
    dcs: Vec<DevnetDc>,
    dir: PathBuf,
    certs: PathBuf,
    _temp: Option<tempfile::TempDir>,
}

impl Devnet {
    /// Generates the PKI and starts every DC, each peering with all others.
    pub async fn start(options: DevnetOptions) -> Result<Devnet, DaemonError> {
        let (temp, dir) = match options.data_dir {
            Some(dir) => (None, dir),
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("homing-devnet-")
                    .tempdir()?;
                let dir = temp.path().to_path_buf();
                (Some(temp), dir)
            }
        };
        let certs = dir.join("certs");
        generate_dev_pki(&certs, &options.dcs)?;
        let redb = RedbOptions {
            cache_bytes: match options.overrides.redb_cache_mb {
                Some(mb) => crate::config::redb_cache_bytes(mb)?,
                None => homing_store::redb::CACHE_BYTES_DEFAULT,
            },
            ..RedbOptions::default()
        };
        // One embedded global store shared by every DC of this process.
        let global: Arc<dyn GlobalStore> = Arc::new(
            RedbGlobalStore::open(crate::stores::redb_global_path(&dir), redb).map_err(
                |source| DaemonError::Store {
                    which: "global",
                    source,
                },
            )?,
        );
        // Every homingd of a devnet is this release: its deployment version
        // is the newest this release speaks (host sessions need it).
        raise_to_newest(global.as_ref()).await?;
        let listen = options
            .dcs
            .iter()
            .map(|_| loopback_listen_addr())
            .collect::<std::io::Result<Vec<_>>>()?;
        let mut relays = Vec::new();
        for (i, addr) in listen.iter().enumerate() {
            let relay = if options.latency_ms > 0 {
                let relay =
                    Relay::start(SocketAddr::from(([127, 0, 0, 1], 0)), *addr, i as u64 + 1)
                        .await?;
                relay.impairment().set_one_way_delay_ms(options.latency_ms);
                Some(relay)
            } else {
                None
            };
            relays.push(relay);
        }
        let reached: Vec<SocketAddr> = relays
            .iter()
            .zip(&listen)
            .map(|(relay, addr)| relay.as_ref().map_or(*addr, Relay::addr))
            .collect();

        let mut dcs = Vec::new();
        for ((i, id), relay) in options.dcs.iter().enumerate().zip(relays) {
            let peers = options
                .dcs
                .iter()
                .zip(&reached)
                .filter(|(other, _)| *other != id)
                .map(|(other, addr)| (other.to_string(), *addr))
                .collect();
            let own = Settings {
                dc: Some(id.to_string()),
                listen: Some(listen[i]),
                metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
                peers: Some(peers),
                data_dir: Some(dir.join(id.as_str())),
                ca_cert: Some(certs.join("ca.pem")),
                cert: Some(certs.join(format!("node-{id}.pem"))),
                key: Some(certs.join(format!("node-{id}.key"))),
                ..Settings::default()
            };
            let config = Config::from_settings(options.overrides.clone().overlay(own))?;
            let tls = load_identity(
                &certs,
                &Identity::new(Role::Node, Some(id.clone())).map_err(invalid_dc)?,
            )?;
            std::fs::create_dir_all(&config.data_dir)?;
            let records = Arc::new(
                RedbDcStore::open(crate::stores::redb_dc_path(&config.data_dir, id), {
                    RedbOptions {
                        cache_bytes: config.redb_cache_bytes,
                        ..redb
                    }
                })
                .map_err(|source| DaemonError::Store {
                    which: "dc",
                    source,
                })?,
            );
            let daemon = Daemon::start(&config, &tls, global.clone(), records).await?;
            dcs.push(DevnetDc {
                id: id.clone(),
                daemon,
                reached_at: reached[i],
                _relay: relay,
            });
        }
        Ok(Devnet {
            dcs,
            dir,
            certs,
            _temp: temp,
        })
    }

    /// The relay in front of `dc` (what other DCs reach it through), when
    /// latency is injected: a test cuts or delays the DC's peers with it.
    ///
    /// # Panics
    /// If `dc` is not one of the devnet's DCs: a caller bug.
    pub fn relay(&self, dc: &DcId) -> Option<&Relay> {
        let found = self.dcs.iter().find(|d| &d.id == dc);
        found.expect("a dc of this devnet")._relay.as_ref()
    }

    /// The running DCs, in start order.
    pub fn dcs(&self) -> &[DevnetDc] {
        &self.dcs
    }

    /// Where stores and certificates live.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The dev PKI directory (`homing --certs`).
    pub fn certs(&self) -> &Path {
        &self.certs
    }

    /// `dc`'s daemon, addressed directly (no relay).
    ///
    /// # Panics
    /// If `dc` is not one of the devnet's DCs: a caller bug.
    pub fn peer(&self, dc: &DcId) -> Peer {
        let found = self
            .dcs
            .iter()
            .find(|d| &d.id == dc)
            .expect("a dc of this devnet");
        Peer {
            addr: found.daemon.local_addr(),
            dc: dc.clone(),
        }
    }

    /// The TLS identity of `role` (and `dc`, for nodes and hosts).
    pub fn tls(&self, role: Role, dc: Option<&DcId>) -> Result<TlsIdentity, DaemonError> {
        let identity = Identity::new(role, dc.cloned()).map_err(invalid_dc)?;
        Ok(load_identity(&self.certs, &identity)?)
    }

    /// A QUIC client presenting `role`'s certificate.
    pub fn client(&self, role: Role, dc: Option<&DcId>) -> Result<Client, DaemonError> {
        Ok(Client::new(&self.tls(role, dc)?, ClientLimits::default())?)
    }

    /// The DC table of a router attached to `attached`: that DC directly and
    /// first, every other through its relay.
    pub fn router_table(&self, attached: &DcId) -> Vec<(DcId, SocketAddr)> {
        let mut table = vec![(attached.clone(), self.peer(attached).addr)];
        table.extend(
            self.dcs
                .iter()
                .filter(|d| &d.id != attached)
                .map(|d| (d.id.clone(), d.reached_at)),
        );
        table
    }

    /// Stops every daemon (in-flight requests finish first).
    pub async fn shutdown(self) {
        for dc in self.dcs {
            dc.daemon.shutdown().await;
        }
    }
}

fn invalid_dc(e: homing_core::access::IdentityError) -> DaemonError {
    DaemonError::Config(crate::ConfigError::Invalid {
        field: "dcs",
        reason: e.to_string(),
    })
}

/// Raises the deployment version one step at a time to the newest this
/// release speaks (nothing to do when it is there already).
async fn raise_to_newest(global: &dyn GlobalStore) -> Result<(), DaemonError> {
    use homing_store::deployment::{VersionChangeError, raise};
    loop {
        match raise(global).await {
            Ok(_) => {}
            Err(VersionChangeError::AtNewest(_)) => return Ok(()),
            Err(VersionChangeError::Store(source)) => {
                return Err(DaemonError::Store {
                    which: "global",
                    source,
                });
            }
            Err(other) => {
                return Err(DaemonError::Store {
                    which: "global",
                    source: homing_store::StoreError::Backend {
                        backend: "redb",
                        reason: other.to_string(),
                    },
                });
            }
        }
    }
}
