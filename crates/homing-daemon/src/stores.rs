//! Where homingd's stores live and how they are opened. This module owns the
//! one layout homingd and `homing migrate` share — redb file names under a
//! data directory, key prefixes in etcd and FoundationDB — and
//! [`StoreSpec`], a deployment's stores named in one string on a command
//! line (`redb:/var/lib/homing`, `etcd:10.0.0.5:2379?prefix=/homing/prod`).

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use homing_core::DcId;
use homing_store::migrate::StoreSet;
use homing_store::{DcStore, GlobalStore, RedbDcStore, RedbGlobalStore, RedbOptions, StoreError};
use thiserror::Error;

use crate::{Config, ConfigError, DaemonError, StoreKind};

/// The key prefix of a deployment when none is configured.
pub const STORE_PREFIX_DEFAULT: &str = "/homing/default";

/// The redb global store's file in `data_dir`.
pub fn redb_global_path(data_dir: &Path) -> PathBuf {
    data_dir.join("global.redb")
}

/// DC `dc`'s redb store file in `data_dir`.
pub fn redb_dc_path(data_dir: &Path, dc: &DcId) -> PathBuf {
    data_dir.join(format!("dc-{dc}.redb"))
}

/// The global store's key prefix in etcd or FoundationDB under a
/// deployment's `store_prefix` (no trailing `/`).
pub fn global_prefix(store_prefix: &str) -> String {
    format!("{store_prefix}/global/")
}

/// DC `dc`'s key prefix in etcd or FoundationDB under `store_prefix`.
pub fn dc_prefix(store_prefix: &str, dc: &DcId) -> String {
    format!("{store_prefix}/dc/{dc}/")
}

/// A deployment prefix as configured, without trailing `/`s.
pub fn normalize_prefix(prefix: &str) -> String {
    prefix.trim_end_matches('/').to_string()
}

/// How redb files are laid out under a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RedbLayout {
    /// homingd's: `DIR/global.redb` and `DIR/dc-<dc>.redb`.
    #[default]
    Homingd,
    /// `homing devnet --data-dir DIR`'s: one data directory per DC,
    /// `DIR/<dc>/dc-<dc>.redb`, and the shared `DIR/global.redb`.
    Devnet,
}

impl RedbLayout {
    fn dc_path(self, dir: &Path, dc: &DcId) -> PathBuf {
        match self {
            RedbLayout::Homingd => redb_dc_path(dir, dc),
            RedbLayout::Devnet => redb_dc_path(&dir.join(dc.as_str()), dc),
        }
    }
}

/// A deployment's stores: one backend, the global store and every DC's
/// store laid out as homingd lays them out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// redb files under `dir`.
    Redb {
        /// The directory.
        dir: PathBuf,
        /// Which file names.
        layout: RedbLayout,
    },
    /// An etcd cluster.
    Etcd {
        /// Client URLs, `http://host:port`.
        endpoints: Vec<String>,
        /// The deployment's prefix, without trailing `/`.
        prefix: String,
    },
    /// A FoundationDB cluster.
    Fdb {
        /// Its cluster file (`None`: the platform's default).
        cluster_file: Option<PathBuf>,
        /// The deployment's prefix, without trailing `/`.
        prefix: String,
    },
}

const SPEC_FORMS: &str = "redb:DIR[?layout=devnet], etcd:HOST:PORT[,HOST:PORT…][?prefix=/homing/prod] \
     or fdb:[CLUSTER_FILE][?prefix=/homing/prod]";

/// A store spec that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SpecError {
    /// Malformed: the reason says which part.
    #[error("store spec {spec:?}: {reason} (expected {SPEC_FORMS})")]
    Invalid {
        /// The spec as given.
        spec: String,
        /// What is wrong.
        reason: String,
    },
    /// Names a backend this binary was built without.
    #[error(
        "store spec {spec:?}: this build has no {backend} backend (rebuild with `--features {backend}`)"
    )]
    NotBuilt {
        /// The spec as given.
        spec: String,
        /// `etcd` or `fdb`, also the cargo feature's name.
        backend: &'static str,
    },
}

/// A spec's `?key=value&…` options, keys checked against the allowed ones.
type SpecOptions<'a> = Vec<(&'static str, &'a str)>;

/// Splits `rest?query` and parses `k=v&k=v` against the allowed keys.
fn split_query<'a>(
    rest: &'a str,
    allowed: &[&'static str],
) -> Result<(&'a str, SpecOptions<'a>), String> {
    let Some((head, query)) = rest.split_once('?') else {
        return Ok((rest, Vec::new()));
    };
    let mut options: SpecOptions<'a> = Vec::new();
    for pair in query.split('&') {
        let (k, v) = pair
            .split_once('=')
            .ok_or_else(|| format!("option {pair:?} is not KEY=VALUE"))?;
        let known = allowed.iter().find(|a| **a == k).ok_or_else(|| {
            format!(
                "unknown option {k:?} (this backend takes: {})",
                allowed.join(", ")
            )
        })?;
        if options.iter().any(|(seen, _)| seen == known) {
            return Err(format!("option {k:?} given twice"));
        }
        options.push((known, v));
    }
    Ok((head, options))
}

fn prefix_option(options: &[(&'static str, &str)]) -> Result<String, String> {
    match options.iter().find(|(k, _)| *k == "prefix") {
        None => Ok(STORE_PREFIX_DEFAULT.to_string()),
        Some((_, "")) => Err("prefix is empty".to_string()),
        Some((_, p)) => Ok(normalize_prefix(p)),
    }
}

/// `HOST:PORT` or `http://HOST:PORT`, as `http://HOST:PORT`.
fn etcd_endpoint(text: &str) -> Result<String, String> {
    if text.starts_with("https://") {
        return Err(format!(
            "endpoint {text:?}: this build's etcd client has no TLS; use http://"
        ));
    }
    let bare = text.strip_prefix("http://").unwrap_or(text);
    let (host, port) = bare
        .rsplit_once(':')
        .ok_or_else(|| format!("endpoint {text:?} is not HOST:PORT"))?;
    if host.is_empty() || host.contains('/') {
        return Err(format!("endpoint {text:?} has no host"));
    }
    port.parse::<u16>()
        .map_err(|_| format!("endpoint {text:?}: port {port:?} is not a number below 65536"))?;
    Ok(format!("http://{bare}"))
}

impl FromStr for StoreSpec {
    type Err = SpecError;

    fn from_str(spec: &str) -> Result<StoreSpec, SpecError> {
        let invalid = |reason: String| SpecError::Invalid {
            spec: spec.to_string(),
            reason,
        };
        let not_built = |backend| SpecError::NotBuilt {
            spec: spec.to_string(),
            backend,
        };
        let (backend, rest) = spec
            .split_once(':')
            .ok_or_else(|| invalid("no backend".to_string()))?;
        match backend {
            "redb" => {
                let (dir, options) = split_query(rest, &["layout"]).map_err(invalid)?;
                if dir.is_empty() {
                    return Err(invalid("redb needs a directory".to_string()));
                }
                let layout = match options.first().map(|(_, v)| *v) {
                    None | Some("homingd") => RedbLayout::Homingd,
                    Some("devnet") => RedbLayout::Devnet,
                    Some(other) => {
                        return Err(invalid(format!(
                            "layout {other:?} is not homingd or devnet"
                        )));
                    }
                };
                Ok(StoreSpec::Redb {
                    dir: PathBuf::from(dir),
                    layout,
                })
            }
            "etcd" if !cfg!(feature = "etcd") => Err(not_built("etcd")),
            "etcd" => {
                let (list, options) = split_query(rest, &["prefix"]).map_err(invalid)?;
                if list.is_empty() {
                    return Err(invalid("etcd needs at least one HOST:PORT".to_string()));
                }
                let endpoints = list
                    .split(',')
                    .map(etcd_endpoint)
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(invalid)?;
                Ok(StoreSpec::Etcd {
                    endpoints,
                    prefix: prefix_option(&options).map_err(invalid)?,
                })
            }
            "fdb" if !cfg!(feature = "fdb") => Err(not_built("fdb")),
            "fdb" => {
                let (file, options) = split_query(rest, &["prefix"]).map_err(invalid)?;
                Ok(StoreSpec::Fdb {
                    cluster_file: (!file.is_empty()).then(|| PathBuf::from(file)),
                    prefix: prefix_option(&options).map_err(invalid)?,
                })
            }
            other => Err(invalid(format!("unknown backend {other:?}"))),
        }
    }
}

impl std::fmt::Display for StoreSpec {
    /// The spec in the form [`StoreSpec::from_str`] parses.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StoreSpec::Redb { dir, layout } => {
                write!(f, "redb:{}", dir.display())?;
                if *layout == RedbLayout::Devnet {
                    f.write_str("?layout=devnet")?;
                }
                Ok(())
            }
            StoreSpec::Etcd { endpoints, prefix } => {
                write!(f, "etcd:{}?prefix={prefix}", endpoints.join(","))
            }
            StoreSpec::Fdb {
                cluster_file,
                prefix,
            } => {
                let file = cluster_file.as_deref().unwrap_or(Path::new(""));
                write!(f, "fdb:{}?prefix={prefix}", file.display())
            }
        }
    }
}

impl StoreSpec {
    /// The spec of a configured backend: `kind` with the config's data
    /// directory, endpoints, cluster file and prefix.
    pub fn configured(kind: &StoreKind, config: &Config) -> StoreSpec {
        match kind {
            StoreKind::Redb => StoreSpec::Redb {
                dir: config.data_dir.clone(),
                layout: RedbLayout::Homingd,
            },
            StoreKind::Etcd => StoreSpec::Etcd {
                endpoints: config.etcd_endpoints.clone(),
                prefix: config.store_prefix.clone(),
            },
            StoreKind::Fdb => StoreSpec::Fdb {
                cluster_file: config.fdb_cluster_file.clone(),
                prefix: config.store_prefix.clone(),
            },
        }
    }
}

/// Whether opening a store may create it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Create what is missing (homingd, a migration's target).
    Create,
    /// A redb file must exist (a migration's source: a wrong path must not
    /// read as an empty store). etcd and FoundationDB cannot tell an empty
    /// prefix from a missing one.
    MustExist,
}

/// Why a store could not be opened.
#[derive(Debug, Error)]
pub enum OpenError {
    /// A redb source file is not there.
    #[error("no {which} store at {}: check the directory, its layout (?layout=devnet for `homing devnet --data-dir`) and the DC names", .path.display())]
    Missing {
        /// `global` or `dc`.
        which: &'static str,
        /// The file looked for.
        path: PathBuf,
    },
    /// The backend refused.
    #[error("opening the {which} store{}: {source}", .dc.as_ref().map(|dc| format!(" of {dc}")).unwrap_or_default())]
    Store {
        /// `global`, `dc` or `fdb network`.
        which: &'static str,
        /// The DC, for a DC store.
        dc: Option<DcId>,
        /// The cause.
        source: StoreError,
    },
    /// The backend is not compiled in.
    #[error("this build has no {backend} backend (rebuild with `--features {backend}`)")]
    NotBuilt {
        /// `etcd` or `fdb`, also the cargo feature's name.
        backend: &'static str,
    },
    /// A directory could not be created.
    #[error("creating {}: {source}", .path.display())]
    Io {
        /// The directory.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// Opens stores and keeps alive what they share: the FoundationDB client
/// network, which may start once per process. Keep the opener at least as
/// long as the stores it opened.
#[derive(Default)]
pub struct StoreOpener {
    /// How redb files are opened.
    redb: RedbOptions,
    #[cfg(feature = "fdb")]
    fdb: Option<homing_store::fdb::FdbNetwork>,
}

fn redb_file(path: PathBuf, which: &'static str, mode: OpenMode) -> Result<PathBuf, OpenError> {
    if mode == OpenMode::MustExist && !path.is_file() {
        return Err(OpenError::Missing { which, path });
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| OpenError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    Ok(path)
}

impl StoreOpener {
    /// An opener that has opened nothing yet.
    pub fn new() -> StoreOpener {
        StoreOpener::default()
    }

    /// Opens redb files with a page cache of at most `bytes` each.
    pub fn with_redb_cache(mut self, bytes: usize) -> StoreOpener {
        self.redb.cache_bytes = bytes;
        self
    }

    /// The global store `spec` names.
    pub async fn global(
        &mut self,
        spec: &StoreSpec,
        mode: OpenMode,
    ) -> Result<Arc<dyn GlobalStore>, OpenError> {
        let failed = |source| OpenError::Store {
            which: "global",
            dc: None,
            source,
        };
        match spec {
            StoreSpec::Redb { dir, .. } => {
                let path = redb_file(redb_global_path(dir), "global", mode)?;
                let store = RedbGlobalStore::open(path, self.redb).map_err(failed)?;
                Ok(Arc::new(store))
            }
            #[cfg(feature = "etcd")]
            StoreSpec::Etcd { endpoints, prefix } => Ok(Arc::new(
                homing_store::etcd::EtcdGlobalStore::connect(endpoints, &global_prefix(prefix))
                    .await
                    .map_err(failed)?,
            )),
            #[cfg(feature = "fdb")]
            StoreSpec::Fdb {
                cluster_file,
                prefix,
            } => {
                let db = self
                    .fdb_network()?
                    .open(cluster_file.as_deref())
                    .map_err(fdb_database_failed)?;
                let prefix = global_prefix(prefix);
                Ok(Arc::new(homing_store::fdb::FdbGlobalStore::new(
                    db,
                    prefix.as_bytes(),
                )))
            }
            #[allow(unreachable_patterns)] // reachable when built without a backend feature
            other => Err(OpenError::NotBuilt {
                backend: backend_name(other),
            }),
        }
    }

    /// DC `dc`'s store in `spec`.
    pub async fn dc(
        &mut self,
        spec: &StoreSpec,
        dc: &DcId,
        mode: OpenMode,
    ) -> Result<Arc<dyn DcStore>, OpenError> {
        let failed = |source| OpenError::Store {
            which: "dc",
            dc: Some(dc.clone()),
            source,
        };
        match spec {
            StoreSpec::Redb { dir, layout } => {
                let path = redb_file(layout.dc_path(dir, dc), "dc", mode)?;
                let store = RedbDcStore::open(path, self.redb).map_err(failed)?;
                Ok(Arc::new(store))
            }
            #[cfg(feature = "etcd")]
            StoreSpec::Etcd { endpoints, prefix } => Ok(Arc::new(
                homing_store::etcd::EtcdDcStore::connect(endpoints, &dc_prefix(prefix, dc))
                    .await
                    .map_err(failed)?,
            )),
            #[cfg(feature = "fdb")]
            StoreSpec::Fdb {
                cluster_file,
                prefix,
            } => {
                let db = self
                    .fdb_network()?
                    .open(cluster_file.as_deref())
                    .map_err(fdb_database_failed)?;
                let prefix = dc_prefix(prefix, dc);
                Ok(Arc::new(homing_store::fdb::FdbDcStore::new(
                    db,
                    prefix.as_bytes(),
                )))
            }
            #[allow(unreachable_patterns)]
            other => Err(OpenError::NotBuilt {
                backend: backend_name(other),
            }),
        }
    }

    /// The global store and the stores of `dcs` in `spec`, for a migration.
    pub async fn set(
        &mut self,
        spec: &StoreSpec,
        dcs: &[DcId],
        mode: OpenMode,
    ) -> Result<StoreSet, OpenError> {
        let global = self.global(spec, mode).await?;
        let mut opened = Vec::with_capacity(dcs.len());
        for dc in dcs {
            opened.push((dc.clone(), self.dc(spec, dc, mode).await?));
        }
        Ok(StoreSet {
            global,
            dcs: opened,
        })
    }

    /// The FoundationDB network, started on first use.
    #[cfg(feature = "fdb")]
    fn fdb_network(&mut self) -> Result<&homing_store::fdb::FdbNetwork, OpenError> {
        if self.fdb.is_none() {
            let network =
                homing_store::fdb::FdbNetwork::start().map_err(|source| OpenError::Store {
                    which: "fdb network",
                    dc: None,
                    source,
                })?;
            self.fdb = Some(network);
        }
        Ok(self
            .fdb
            .as_ref()
            .expect("the fdb network was started above"))
    }
}

#[cfg(feature = "fdb")]
fn fdb_database_failed(source: StoreError) -> OpenError {
    OpenError::Store {
        which: "fdb database",
        dc: None,
        source,
    }
}

#[allow(dead_code)] // used only when a backend feature is off
fn backend_name(spec: &StoreSpec) -> &'static str {
    match spec {
        StoreSpec::Redb { .. } => "redb",
        StoreSpec::Etcd { .. } => "etcd",
        StoreSpec::Fdb { .. } => "fdb",
    }
}

/// The stores a daemon runs on, and what must outlive them.
pub struct Stores {
    /// The global store.
    pub global: Arc<dyn GlobalStore>,
    /// This DC's store.
    pub records: Arc<dyn DcStore>,
    /// Holds the FoundationDB network, when a store uses it; declared last
    /// so it is dropped after the stores.
    _opener: StoreOpener,
}

fn not_built(field: &'static str) -> DaemonError {
    DaemonError::Config(ConfigError::Invalid {
        field,
        reason: "this homingd was built without that backend's cargo feature".to_string(),
    })
}

fn daemon_error(field: &'static str, e: OpenError) -> DaemonError {
    match e {
        OpenError::Store { which, source, .. } => DaemonError::Store { which, source },
        OpenError::NotBuilt { .. } => not_built(field),
        OpenError::Io { source, .. } => DaemonError::Io(source),
        missing @ OpenError::Missing { .. } => DaemonError::Store {
            which: "redb",
            source: StoreError::Backend {
                backend: "redb",
                reason: missing.to_string(),
            },
        },
    }
}

/// Refuses a global store this process cannot share with its peers: a redb
/// global store is a file of this process alone, so with peers configured
/// every DC would keep its own and the same key would get token 1 in two
/// DCs. (The devnet shares one redb global store between the DCs of one
/// process and does not come here.)
pub fn check_global_store_shared(config: &Config) -> Result<(), ConfigError> {
    if config.global_store != StoreKind::Redb || config.peers.is_empty() {
        return Ok(());
    }
    let mut peers: Vec<&str> = config.peers.iter().map(|(dc, _)| dc.as_str()).collect();
    peers.dedup();
    Err(ConfigError::Invalid {
        field: "global_store",
        reason: format!(
            "redb (the default) is this process's own file, but peers are configured ({}): \
             every DC would keep its own global store and one key could be reserved in two \
             DCs; set global_store to etcd or fdb (shared by every DC), or remove the peers",
            peers.join(", ")
        ),
    })
}

/// Opens the DC store and the global store the config names, laid out as
/// [`redb_global_path`], [`redb_dc_path`], [`global_prefix`] and
/// [`dc_prefix`] say; refuses a global store the DCs cannot share
/// ([`check_global_store_shared`]).
pub async fn open_stores(config: &Config) -> Result<Stores, DaemonError> {
    check_global_store_shared(config)?;
    std::fs::create_dir_all(&config.data_dir)?;
    let mut opener = StoreOpener::new().with_redb_cache(config.redb_cache_bytes);
    let global = opener
        .global(
            &StoreSpec::configured(&config.global_store, config),
            OpenMode::Create,
        )
        .await
        .map_err(|e| daemon_error("global_store", e))?;
    let records = opener
        .dc(
            &StoreSpec::configured(&config.dc_store, config),
            &config.dc,
            OpenMode::Create,
        )
        .await
        .map_err(|e| daemon_error("dc_store", e))?;
    Ok(Stores {
        global,
        records,
        _opener: opener,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<StoreSpec, String> {
        text.parse::<StoreSpec>().map_err(|e| e.to_string())
    }

    #[test]
    fn redb_specs_name_a_directory_and_a_layout() {
        assert_eq!(
            parse("redb:/var/lib/homing").unwrap(),
            StoreSpec::Redb {
                dir: "/var/lib/homing".into(),
                layout: RedbLayout::Homingd
            }
        );
        let devnet = parse("redb:/tmp/d?layout=devnet").unwrap();
        assert_eq!(devnet.to_string(), "redb:/tmp/d?layout=devnet");
        let iad = DcId::new("iad").unwrap();
        assert_eq!(
            RedbLayout::Devnet.dc_path(Path::new("/tmp/d"), &iad),
            Path::new("/tmp/d/iad/dc-iad.redb")
        );
        assert_eq!(
            RedbLayout::Homingd.dc_path(Path::new("/tmp/d"), &iad),
            Path::new("/tmp/d/dc-iad.redb")
        );
        assert!(parse("redb:").unwrap_err().contains("needs a directory"));
        assert!(
            parse("redb:/x?layout=flat")
                .unwrap_err()
                .contains("\"flat\"")
        );
        assert!(
            parse("redb:/x?prefix=/p")
                .unwrap_err()
                .contains("unknown option \"prefix\"")
        );
    }

    #[test]
    fn bad_specs_say_what_is_wrong_and_what_is_expected() {
        let err = parse("/var/lib/homing").unwrap_err();
        assert!(
            err.contains("no backend") && err.contains("etcd:HOST:PORT"),
            "{err}"
        );
        assert!(
            parse("mysql:x")
                .unwrap_err()
                .contains("unknown backend \"mysql\"")
        );
    }

    #[cfg(feature = "etcd")]
    #[test]
    fn etcd_specs_take_endpoints_and_a_prefix() {
        let spec = parse("etcd:10.0.0.5:2379,http://10.0.0.6:2379?prefix=/homing/prod/").unwrap();
        assert_eq!(
            spec,
            StoreSpec::Etcd {
                endpoints: vec![
                    "http://10.0.0.5:2379".to_string(),
                    "http://10.0.0.6:2379".to_string()
                ],
                prefix: "/homing/prod".to_string(),
            }
        );
        assert_eq!(
            parse(&spec.to_string()).unwrap(),
            spec,
            "display parses back"
        );
        let default = parse("etcd:localhost:2379").unwrap();
        assert!(
            matches!(default, StoreSpec::Etcd { prefix, .. } if prefix == STORE_PREFIX_DEFAULT)
        );
        assert!(parse("etcd:").unwrap_err().contains("at least one"));
        assert!(parse("etcd:host").unwrap_err().contains("not HOST:PORT"));
        assert!(parse("etcd:host:99999").unwrap_err().contains("port"));
        assert!(parse("etcd:https://h:1").unwrap_err().contains("no TLS"));
        assert!(
            parse("etcd:h:1?prefix=")
                .unwrap_err()
                .contains("prefix is empty")
        );
        assert!(
            parse("etcd:h:1?prefix=/a&prefix=/b")
                .unwrap_err()
                .contains("twice")
        );
    }

    #[cfg(not(feature = "etcd"))]
    #[test]
    fn an_etcd_spec_without_the_feature_names_the_feature() {
        let err = parse("etcd:h:1").unwrap_err();
        assert!(err.contains("--features etcd"), "{err}");
    }

    #[cfg(not(feature = "fdb"))]
    #[test]
    fn an_fdb_spec_without_the_feature_names_the_feature() {
        let err = parse("fdb:").unwrap_err();
        assert!(err.contains("--features fdb"), "{err}");
    }

    #[test]
    fn the_layout_is_homingds() {
        let iad = DcId::new("iad").unwrap();
        assert_eq!(global_prefix("/homing/prod"), "/homing/prod/global/");
        assert_eq!(dc_prefix("/homing/prod", &iad), "/homing/prod/dc/iad/");
        assert_eq!(
            redb_global_path(Path::new("/d")),
            Path::new("/d/global.redb")
        );
    }

    #[tokio::test]
    async fn a_missing_redb_source_is_an_error_not_an_empty_store() {
        let dir = tempfile::tempdir().unwrap();
        let spec = StoreSpec::Redb {
            dir: dir.path().to_path_buf(),
            layout: RedbLayout::Homingd,
        };
        let iad = DcId::new("iad").unwrap();
        let mut opener = StoreOpener::new();
        let err = opener
            .set(&spec, std::slice::from_ref(&iad), OpenMode::MustExist)
            .await
            .err()
            .expect("nothing there yet");
        assert!(
            matches!(
                err,
                OpenError::Missing {
                    which: "global",
                    ..
                }
            ),
            "{err}"
        );
        let created = opener
            .set(&spec, std::slice::from_ref(&iad), OpenMode::Create)
            .await
            .unwrap();
        assert!(redb_dc_path(dir.path(), &iad).is_file());
        drop(created);
        opener
            .set(&spec, &[iad], OpenMode::MustExist)
            .await
            .unwrap();
    }

    fn config(global_store: Option<&str>, peers: &[(&str, &str)]) -> Config {
        let settings = crate::Settings {
            dc: Some("iad".into()),
            listen: Some("127.0.0.1:7400".parse().unwrap()),
            data_dir: Some("/nonexistent/homing".into()),
            ca_cert: Some("ca.pem".into()),
            cert: Some("node-iad.pem".into()),
            key: Some("node-iad.key".into()),
            global_store: global_store.map(str::to_string),
            peers: Some(
                peers
                    .iter()
                    .map(|(dc, addr)| (dc.to_string(), addr.parse().unwrap()))
                    .collect(),
            ),
            ..crate::Settings::default()
        };
        Config::from_settings(settings).unwrap()
    }

    #[tokio::test]
    async fn a_redb_global_store_with_peers_is_refused_naming_both_fields() {
        let peers = [("fra", "127.0.0.1:7401"), ("sin", "127.0.0.1:7402")];
        for global in [None, Some("redb")] {
            let err = open_stores(&config(global, &peers))
                .await
                .err()
                .expect("each DC would have its own global store")
                .to_string();
            assert!(
                err.starts_with("global_store:")
                    && err.contains("peers")
                    && err.contains("fra, sin"),
                "{err}"
            );
        }
        // Alone, a DC may keep its global store in its own redb file.
        assert!(check_global_store_shared(&config(None, &[])).is_ok());
    }

    #[tokio::test]
    async fn a_redb_target_that_a_homingd_holds_cannot_be_opened_for_a_migration() {
        let dir = tempfile::tempdir().unwrap();
        let iad = DcId::new("iad").unwrap();
        // What homingd keeps open while it serves.
        let served = RedbDcStore::open(redb_dc_path(dir.path(), &iad), RedbOptions::default());
        let _served = served.unwrap();
        let spec = parse(&format!("redb:{}", dir.path().display())).unwrap();
        let err = StoreOpener::new()
            .set(&spec, &[iad], OpenMode::Create)
            .await
            .err()
            .expect("the live store is refused")
            .to_string();
        assert!(err.contains("already open"), "{err}");
    }
}
