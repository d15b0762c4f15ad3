//! homingd, the per-DC daemon: serves resolve, acquire, renew, release, link,
//! drain and inspect over QUIC with mutual TLS, with every decision taken by
//! homing-core and every write a compare-and-set in the DC store.
//!
//! [`Daemon::start`] runs one DC from its parts (config, TLS identity,
//! stores); `homingd` builds those parts from a config file, and
//! `homing devnet` builds several in one process.

pub mod config;
pub mod devnet;
pub mod metrics;
pub mod node;
pub mod peers;
pub mod reaper;
pub mod waiters;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use homing_net::{Client, ClientLimits, Server, ServerLimits, TlsIdentity};
use homing_store::{DcStore, GlobalStore, RedbDcStore, RedbGlobalStore, RedbOptions};
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::{Config, ConfigError, Settings, StoreKind};
pub use devnet::{Devnet, DevnetDc, DevnetOptions};
pub use metrics::Metrics;
pub use node::Node;
pub use peers::Peers;

/// Why a daemon could not start.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A store could not be opened.
    #[error("opening the {which} store: {source}")]
    Store {
        /// `dc` or `global`.
        which: &'static str,
        /// The cause.
        source: homing_store::StoreError,
    },
    /// TLS material or the QUIC endpoint failed.
    #[error(transparent)]
    Net(#[from] homing_net::NetError),
    /// Dev certificates could not be generated.
    #[error(transparent)]
    Pki(#[from] homing_net::PkiError),
    /// An address could not be bound, a directory not created.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// The stores a daemon runs on, and what must outlive them.
pub struct Stores {
    /// The global store.
    pub global: Arc<dyn GlobalStore>,
    /// This DC's store.
    pub records: Arc<dyn DcStore>,
    /// The FoundationDB network, when a store uses it; declared last so it is
    /// dropped after the stores.
    #[cfg(feature = "fdb")]
    _fdb: Option<homing_store::fdb::FdbNetwork>,
}

fn not_built(field: &'static str) -> DaemonError {
    DaemonError::Config(ConfigError::Invalid {
        field,
        reason: "this homingd was built without that backend's cargo feature".to_string(),
    })
}

/// Opens the DC store and the global store the config names.
pub async fn open_stores(config: &Config) -> Result<Stores, DaemonError> {
    std::fs::create_dir_all(&config.data_dir)?;
    let store = |which| move |source| DaemonError::Store { which, source };
    #[cfg(feature = "fdb")]
    let fdb = if config.global_store == StoreKind::Fdb || config.dc_store == StoreKind::Fdb {
        let network = homing_store::fdb::FdbNetwork::start().map_err(store("fdb network"))?;
        let db = network
            .open(config.fdb_cluster_file.as_deref())
            .map_err(store("fdb database"))?;
        Some((network, db))
    } else {
        None
    };
    let global: Arc<dyn GlobalStore> = match config.global_store {
        StoreKind::Redb => Arc::new(
            RedbGlobalStore::open(config.data_dir.join("global.redb"), RedbOptions::default())
                .map_err(store("global"))?,
        ),
        #[cfg(feature = "etcd")]
        StoreKind::Etcd => Arc::new(
            homing_store::etcd::EtcdGlobalStore::connect(
                &config.etcd_endpoints,
                &format!("{}/global/", config.store_prefix),
            )
            .await
            .map_err(store("global"))?,
        ),
        #[cfg(feature = "fdb")]
        StoreKind::Fdb => {
            let (_, db) = fdb
                .as_ref()
                .expect("fdb network started above for an fdb store");
            let prefix = format!("{}/global/", config.store_prefix);
            Arc::new(homing_store::fdb::FdbGlobalStore::new(
                db.clone(),
                prefix.as_bytes(),
            ))
        }
        #[allow(unreachable_patterns)] // reachable when built without a backend feature
        _ => return Err(not_built("global_store")),
    };
    let records: Arc<dyn DcStore> = match config.dc_store {
        StoreKind::Redb => Arc::new(
            RedbDcStore::open(
                config.data_dir.join(format!("dc-{}.redb", config.dc)),
                RedbOptions::default(),
            )
            .map_err(store("dc"))?,
        ),
        #[cfg(feature = "etcd")]
        StoreKind::Etcd => Arc::new(
            homing_store::etcd::EtcdDcStore::connect(
                &config.etcd_endpoints,
                &format!("{}/dc/{}/", config.store_prefix, config.dc),
            )
            .await
            .map_err(store("dc"))?,
        ),
        #[cfg(feature = "fdb")]
        StoreKind::Fdb => {
            let (_, db) = fdb
                .as_ref()
                .expect("fdb network started above for an fdb store");
            let prefix = format!("{}/dc/{}/", config.store_prefix, config.dc);
            Arc::new(homing_store::fdb::FdbDcStore::new(
                db.clone(),
                prefix.as_bytes(),
            ))
        }
        #[allow(unreachable_patterns)]
        _ => return Err(not_built("dc_store")),
    };
    Ok(Stores {
        global,
        records,
        #[cfg(feature = "fdb")]
        _fdb: fdb.map(|(network, _)| network),
    })
}

/// A running DC daemon.
pub struct Daemon {
    node: Arc<Node>,
    server: Server,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    metrics_addr: Option<SocketAddr>,
}

impl Daemon {
    /// Starts serving `config.dc` with the given TLS identity and stores.
    pub async fn start(
        config: &Config,
        tls: &TlsIdentity,
        global: Arc<dyn GlobalStore>,
        records: Arc<dyn DcStore>,
    ) -> Result<Daemon, DaemonError> {
        let metrics = Arc::new(Metrics::default());
        let client = Client::new(tls, ClientLimits::default())?;
        let peers = Peers::new(
            config.peers.clone(),
            client,
            Duration::from_millis(config.peer_timeout_ms),
            metrics.clone(),
        );
        let node = Arc::new(Node::new(
            config.dc.clone(),
            global,
            records,
            peers,
            config.policy,
            config.hop_limit,
            config.global_cache_entries,
            config.waiting,
            metrics.clone(),
        ));
        let server = Server::bind(
            config.listen,
            tls,
            config.dc.clone(),
            ServerLimits::default(),
            node.clone(),
        )
        .await?;
        let (stop, stopped) = watch::channel(false);
        let mut tasks = vec![tokio::spawn(reaper::run(
            node.clone(),
            reaper::Upkeep {
                interval: Duration::from_millis(config.reaper_interval_ms),
                orphan_age_ms: config.orphan_age_ms,
                events_retained: config.events_retained,
            },
            stopped.clone(),
        ))];
        let mut metrics_addr = None;
        if let Some(addr) = config.metrics_listen {
            let listener = metrics::bind(addr).await?;
            metrics_addr = Some(listener.local_addr()?);
            tasks.push(tokio::spawn(metrics::serve(listener, metrics, stopped)));
        }
        tracing::info!(dc = %config.dc, listen = %server.local_addr(), peers = config.peers.len(), "homingd serving");
        Ok(Daemon {
            node,
            server,
            stop,
            tasks,
            metrics_addr,
        })
    }

    /// The QUIC address it serves on.
    pub fn local_addr(&self) -> SocketAddr {
        self.server.local_addr()
    }

    /// The metrics endpoint's address, if enabled.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.metrics_addr
    }

    /// The request handler (for in-process inspection and tests).
    pub fn node(&self) -> &Arc<Node> {
        &self.node
    }

    /// Stops accepting, lets in-flight requests finish, stops background
    /// tasks. Every acknowledged write was durable before it was acknowledged.
    pub async fn shutdown(self) {
        // Parked acquirers and watchers answer now instead of holding the drain.
        self.node.close();
        let drained = self.server.shutdown().await;
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
        tracing::info!(dc = %self.node.dc(), drained, "homingd stopped");
    }
}
