//! homingd, the per-DC daemon: serves resolve, acquire, renew, release, link,
//! drain and inspect over QUIC with mutual TLS, with every decision taken by
//! homing-node and homing-core and every write a compare-and-set in the DC
//! store.
//!
//! [`Daemon::start`] runs one DC from its parts (config, TLS identity,
//! stores); `homingd` builds those parts from a config file, and
//! `homing devnet` builds several in one process.

pub mod config;
pub mod dc_lease;
pub mod devnet;
pub mod directory;
pub mod follow;
pub mod metrics;
pub mod node;
pub mod notices;
pub mod peers;
pub mod quota;
pub mod status;
pub mod stores;
pub mod upkeep;
pub mod waiters;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use homing_net::{Client, ClientLimits, Server, TlsIdentity};
use homing_store::{DcStore, GlobalStore};
use thiserror::Error;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use config::{Config, ConfigError, REDB_CACHE_MB_DEFAULT, Settings, StoreKind};
pub use devnet::{Devnet, DevnetDc, DevnetOptions};
pub use metrics::Metrics;
pub use node::{Node, NodeCaches};
pub use peers::Peers;
pub use stores::{OpenMode, StoreOpener, StoreSpec, Stores, open_stores};

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
    /// The DC store is the target of an unfinished `homing migrate`.
    #[error(
        "the dc store of {dc} is the target of an unfinished `homing migrate` (its records and allocator are still being copied in): run the same migration again to finish it, then start homingd"
    )]
    Migrating {
        /// The DC.
        dc: homing_core::DcId,
    },
    /// The global store's record of this DC forbids serving it.
    #[error(transparent)]
    Refused(#[from] dc_lease::Refusal),
    /// The deployment version was raised past what this release speaks.
    #[error(
        "the deployment version is {deployment}, and this homingd speaks protocol versions up to {speaks}: start this release's successor (the deployment was upgraded past it), or lower the deployment version with `homing dc version --lower` if nothing was written in its form"
    )]
    Outdated {
        /// The deployment version.
        deployment: u16,
        /// The newest version this build speaks.
        speaks: u16,
    },
}

/// Starts compacting etcd's history when a store is on etcd and
/// `etcd_compact_interval_ms` is not 0 (docs/OPERATIONS.md, "etcd: history,
/// compaction and defragmentation").
#[cfg(feature = "etcd")]
async fn start_compactor(
    config: &Config,
    metrics: &Arc<Metrics>,
) -> Result<Option<homing_store::etcd::compaction::Compactor>, DaemonError> {
    use homing_store::etcd::compaction::{CompactionPolicy, Compactor};
    let etcd = config::StoreKind::Etcd;
    let on_etcd = config.dc_store == etcd || config.global_store == etcd;
    if !on_etcd || config.etcd_compact_interval_ms == 0 {
        return Ok(None);
    }
    let policy = CompactionPolicy {
        interval_ms: config.etcd_compact_interval_ms,
        retain_revisions: config.etcd_compact_retain_revisions,
    };
    let compactor = Compactor::connect(&config.etcd_endpoints, policy).await;
    let compactor = compactor.map_err(|source| DaemonError::Store {
        which: "etcd compactor",
        source,
    })?;
    let stats = compactor.stats();
    let read = move || metrics::Compaction {
        compactions: stats.compactions(),
        failures: stats.failures(),
        revision: stats.revision(),
    };
    metrics.watch_compaction(metrics::CompactionSource(Box::new(read)));
    Ok(Some(compactor))
}

/// Refuses to serve a deployment whose version was raised past what this
/// build speaks. A global store that does not answer is not a refusal
/// (the DC lease decides whether the DC grants): logged, and started.
async fn refuse_if_outdated(global: &dyn GlobalStore) -> Result<(), DaemonError> {
    let speaks = homing_core::wire::PROTOCOL_VERSION;
    match homing_store::deployment::read(global).await {
        Ok(d) if d.version > speaks => Err(DaemonError::Outdated {
            deployment: d.version,
            speaks,
        }),
        Ok(_) => Ok(()),
        Err(e) => {
            tracing::warn!(error = %e, "the deployment version could not be read at start; starting without checking it");
            Ok(())
        }
    }
}

/// A running DC daemon.
pub struct Daemon {
    node: Arc<Node>,
    server: Server,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    metrics_addr: Option<SocketAddr>,
    /// Compacts etcd's history while the daemon runs (a store on etcd).
    #[cfg(feature = "etcd")]
    _compactor: Option<homing_store::etcd::compaction::Compactor>,
}

impl Daemon {
    /// Starts serving `config.dc` with the given TLS identity and stores.
    pub async fn start(
        config: &Config,
        tls: &TlsIdentity,
        global: Arc<dyn GlobalStore>,
        records: Arc<dyn DcStore>,
    ) -> Result<Daemon, DaemonError> {
        let migrating = records.migrating().await;
        let migrating = migrating.map_err(|source| DaemonError::Store {
            which: "dc",
            source,
        })?;
        if migrating {
            return Err(DaemonError::Migrating {
                dc: config.dc.clone(),
            });
        }
        refuse_if_outdated(global.as_ref()).await?;
        let lease = dc_lease::open(
            &config.dc,
            global.as_ref(),
            records.as_ref(),
            config.dc_terms(),
            config.dc_lease_renew_ms,
            config.start_above_floor,
        )
        .await?;
        let lease = Arc::new(lease);
        let metrics = Arc::new(Metrics::default());
        for (role, failover) in [("global", global.failover()), ("dc", records.failover())] {
            if let Some(failover) = failover {
                metrics.watch_failover(role, failover);
            }
        }
        #[cfg(feature = "etcd")]
        let compactor = start_compactor(config, &metrics).await?;
        let client = Client::new(tls, ClientLimits::default())?;
        let status_client = client.clone();
        let peers = Peers::new(
            &config.peers,
            client.clone(),
            Duration::from_millis(config.peer_timeout_ms),
            metrics.clone(),
        );
        let node = Arc::new(
            Node::new(
                config.dc.clone(),
                global,
                records,
                peers,
                config.policy,
                config.hop_limit,
                node::NodeCaches {
                    entries: config.global_cache_entries,
                    absent_ttl_ms: config.absent_ttl_ms,
                },
                config.waiting,
                config.watches_parked_max,
                config.keys_per_namespace_max,
                lease.clone(),
                metrics.clone(),
            )
            .with_takeover(config.takeover),
        );
        // The first renewal before serving: a DC whose global store answers
        // grants from its first request.
        let renewer = node.renewer();
        let period = Duration::from_millis(config.dc_lease_renew_ms);
        renewer
            .renew_if_due(period.max(dc_lease::RENEW_TIMEOUT_MIN))
            .await;
        // And the takeovers of its tails applied, if the global store answers.
        if let Some(number) = node.reconciliation_owed()
            && let Err(e) = node.reconcile(number).await
        {
            tracing::warn!(error = %e, "reconciling takeovers at start failed; the dc grants nothing until it succeeds");
        }
        let server = Server::bind(
            config.listen,
            tls,
            config.dc.clone(),
            config.server_limits.clone(),
            node.clone(),
        )
        .await?;
        metrics.attach_connections(server.stats());
        let (stop, stopped) = watch::channel(false);
        let mut tasks = vec![tokio::spawn(renewer.run(period, stopped.clone()))];
        tasks.push(tokio::spawn(reconcile_takeovers(
            node.clone(),
            lease.answered(),
            stopped.clone(),
        )));
        tasks.push(tokio::spawn(upkeep::run(
            node.clone(),
            upkeep::UpkeepConfig {
                interval: Duration::from_millis(config.reaper_interval_ms),
                orphan_age_ms: config.orphan_age_ms,
                events_retained: config.events_retained,
            },
            stopped.clone(),
        )));
        tasks.push(tokio::spawn(follow::run(
            node.clone(),
            Duration::from_millis(config.log_follow_ms),
            stopped.clone(),
        )));
        if config.directory_refresh_ms > 0 {
            let bound = server.local_addr();
            let advertise = config
                .advertise
                .or((!bound.ip().is_unspecified()).then_some(bound));
            if advertise.is_none() {
                tracing::warn!(listen = %bound, "not listed in the dc directory: the listen address is a wildcard and no advertise address is set; peers and routers reach this homingd only if configured with its address");
            }
            tasks.push(tokio::spawn(directory::run(
                node.clone(),
                advertise,
                Duration::from_millis(config.directory_refresh_ms),
                stopped.clone(),
            )));
        }
        if config.tls_reload_ms > 0 {
            let mut stopped = stopped.clone();
            tasks.push(tokio::spawn(homing_net::reload::watch_files(
                config.tls_files(),
                Duration::from_millis(config.tls_reload_ms),
                vec![Box::new(server.reloader()), Box::new(client)],
                async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                },
            )));
        }
        let mut metrics_addr = None;
        if let Some(addr) = config.metrics_listen {
            let listener = metrics::bind(addr).await?;
            metrics_addr = Some(listener.local_addr()?);
            let ready = {
                let node = node.clone();
                Arc::new(move || node.readiness()) as metrics::Readiness
            };
            let health = metrics::Health {
                global: node.global().clone(),
                records: node.records().clone(),
                ready,
            };
            let page = status::Status::new(node.clone(), status_client, server.local_addr());
            let app = metrics::routes(metrics, health)
                .merge(status::routes(page))
                .fallback(metrics::not_found);
            tasks.push(tokio::spawn(metrics::listen(listener, app, stopped)));
        }
        tracing::info!(dc = %config.dc, listen = %server.local_addr(), peers = config.peers.len(), "homingd serving");
        Ok(Daemon {
            node,
            server,
            stop,
            tasks,
            metrics_addr,
            #[cfg(feature = "etcd")]
            _compactor: compactor,
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

/// Applies the takeovers of this DC's tails each time its DC lease is
/// regained (DESIGN.md §7.5), retrying a failed pass; until a pass succeeds
/// the DC grants and renews nothing.
async fn reconcile_takeovers(
    node: Arc<Node>,
    mut answered: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        if let Some(number) = node.reconciliation_owed() {
            match node.reconcile(number).await {
                Ok(changed) => tracing::info!(
                    dc = %node.dc(),
                    changed,
                    "takeovers of this dc's tails reconciled: host leases may be granted"
                ),
                Err(e) => {
                    tracing::warn!(dc = %node.dc(), error = %e, "reconciling takeovers failed; trying again");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(homing_node::dc::dc_lease::RENEW_RETRY_MS)) => continue,
                        _ = stop.changed() => return,
                    }
                }
            }
        }
        tokio::select! {
            changed = answered.changed() => if changed.is_err() { return },
            _ = stop.changed() => return,
        }
    }
}
