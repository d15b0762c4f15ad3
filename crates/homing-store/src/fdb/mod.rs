//! The FoundationDB backend (cargo feature `fdb`), the production global
//! store.
//!
//! **Verified by compilation on CI, not against a running cluster.** The
//! conformance suite runs against it whenever `FDB_CLUSTER_FILE` points at a
//! cluster (and `libfdb_c` is installed); without it the test prints a skip
//! line and passes:
//!
//! ```text
//! FDB_CLUSTER_FILE=/etc/foundationdb/fdb.cluster cargo test -p homing-store --features fdb
//! ```
//!
//! Keys live under a subspace prefix scoped by deployment/tenant, with the
//! same layout as the etcd backend: `g/<key bytes>` → reservation ID,
//! `r/<id>` → postcard record, `k/<(key, id) bytes>` → id,
//! `events/<seq, 8 bytes big-endian>` → postcard event, `events-head` → the
//! last event seq ever appended and `alloc` → the allocator's high-water
//! mark (both 8 bytes big-endian), `d/<kind, time, id>` → id (the expiry
//! index, kept by every record write; a store from before it is indexed on
//! its first expiry query, `due-index` marking that done), `dcs/<dc>` → a
//! DC's lease terms, marks and retired flag and `dcv/<dc>` → the
//! versionstamp of its last renewal (`dc_lease`: judged by FDB's versions
//! and this process's clock), `succ/<dc, 0x00, unique 8 bytes big-endian>`
//! → a reservation's succession, written once; a takeover judges the DC and
//! writes in one transaction (`succession`); `setting/<setting name>` → a
//! deployment setting's value, read, compared and set in one transaction
//! (`setting`); `s/<session name>` → a host session's row, `sk/<session,
//! 0x00, id>` and `sn/<session, 0x00, notice>` → reservation id (its keys
//! and its frozen keys' notices), `sd/<due time, session name>` → session
//! name (the sessions due), each index entry moved in the transaction of
//! the write it follows (`session`). Every operation is one serializable FDB transaction
//! (reads add conflict ranges, so a racing set_if_absent or CAS retries
//! and then sees the winner), retried at most
//! `TRANSACTION_ATTEMPTS_MAX` times through FDB's `on_error` backoff. A
//! compare-and-set that derives an event reads the head and writes the
//! record, the event at `head + 1` and the new head in that one
//! transaction; such appends of one process take turns (a renewal, which
//! derives none, does not wait for them), so they only conflict with other
//! processes' appends. Concurrent `set_if_absent` calls share one
//! transaction (`batch`): each key read and set when absent, a conflict
//! on any key retrying the batch.
//!
//! The two stores live in `global` ([`FdbGlobalStore`]) and `dc`
//! ([`FdbDcStore`]); this module holds what both are built on: the client
//! network, the subspace (`Space`), the error mapping and the `transact!`
//! retry loop.
//!
//! The FDB client network must run before any database is opened:
//! [`FdbNetwork::start`] starts it (at most once per process) and
//! [`FdbNetwork::open`] opens a database; keep the network until every store
//! built on it is dropped.

use foundationdb::options::{DatabaseOption, StreamingMode};
use foundationdb::{Database, FdbError, RangeOption};

pub use self::dc::FdbDcStore;
pub use self::dc_lease::SIGHTINGS_MAX;
pub use self::global::FdbGlobalStore;
use crate::error::StoreError;

/// Most attempts of one transaction (conflicts, recoverable FDB errors).
pub const TRANSACTION_ATTEMPTS_MAX: usize = 16;

/// Bound on one transaction, in milliseconds, retries included.
pub const TRANSACTION_TIMEOUT_MS: i32 = 5_000;
/// Bound on FDB's own retries of one transaction.
const TRANSACTION_RETRY_LIMIT: i32 = 100;

/// Whether this process already started the FDB network (it may only once).
static NETWORK_STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The FDB client network of this process; stops it when dropped.
pub struct FdbNetwork {
    _guard: foundationdb::api::NetworkAutoStop,
}

impl FdbNetwork {
    /// Starts the network. Fails if this process already started it once.
    pub fn start() -> Result<FdbNetwork, StoreError> {
        if NETWORK_STARTED.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return Err(StoreError::Backend {
                backend: "fdb",
                reason: "the fdb network can only be started once per process".to_string(),
            });
        }
        #[allow(unsafe_code)]
        // SAFETY: `boot` may run at most once per process, which the flag above
        // guarantees; its guard is owned by the returned `FdbNetwork`, whose
        // documented contract is to outlive every database opened from it.
        let guard = unsafe { foundationdb::boot() };
        Ok(FdbNetwork { _guard: guard })
    }

    /// Opens the database of `cluster_file` (the platform default if `None`).
    pub fn open(
        &self,
        cluster_file: Option<&std::path::Path>,
    ) -> Result<std::sync::Arc<Database>, StoreError> {
        let db = match cluster_file {
            Some(path) => {
                let path = path.to_str().ok_or_else(|| StoreError::Backend {
                    backend: "fdb",
                    reason: format!("cluster file path {} is not UTF-8", path.display()),
                })?;
                Database::from_path(path)
            }
            None => Database::default(),
        };
        let db = db.map_err(fdb_err)?;
        // FDB retries a transaction forever by default; bound it so an
        // unreachable cluster fails requests instead of hanging them.
        db.set_option(DatabaseOption::TransactionTimeout(TRANSACTION_TIMEOUT_MS))
            .map_err(fdb_err)?;
        db.set_option(DatabaseOption::TransactionRetryLimit(
            TRANSACTION_RETRY_LIMIT,
        ))
        .map_err(fdb_err)?;
        Ok(std::sync::Arc::new(db))
    }
}

fn fdb_err(e: FdbError) -> StoreError {
    if e.is_retryable() {
        StoreError::Unavailable {
            backend: "fdb",
            reason: e.to_string(),
        }
    } else {
        StoreError::Backend {
            backend: "fdb",
            reason: e.to_string(),
        }
    }
}

/// An operation's outcome, or the FDB error that aborts the attempt.
enum Step<T> {
    Done(T),
    Fdb(FdbError),
}

/// A database handle and the subspace prefix.
#[derive(Clone)]
struct Space {
    db: std::sync::Arc<Database>,
    prefix: Vec<u8>,
}

impl Space {
    fn key(&self, section: &[u8], rest: &[u8]) -> Vec<u8> {
        [self.prefix.as_slice(), section, rest].concat()
    }
}

/// Runs `$body` (an expression over the transaction `$trx` yielding
/// `Result<Step<T>, StoreError>`) then commits, retrying through `on_error` at
/// most [`TRANSACTION_ATTEMPTS_MAX`] times; `$body`'s own errors end the loop.
/// A macro rather than a generic function: async closures borrowing the
/// transaction are not provably `Send` for `async_trait` yet. The four-argument
/// form also sets the caller's `bool` `$unknown` once a commit failed in a way
/// that may have committed (`commit_unknown_result`), so `$body`, run again,
/// can recognise its own earlier write.
macro_rules! transact {
    ($space:expr, $trx:ident, $body:expr) => {{
        let mut unknown_outcome = false;
        let out = transact!($space, $trx, unknown_outcome, $body);
        let _ = unknown_outcome;
        out
    }};
    ($space:expr, $trx:ident, $unknown:ident, $body:expr) => {{
        let mut $trx = $space.db.create_trx().map_err(fdb_err)?;
        let mut attempts = 0;
        loop {
            if attempts == TRANSACTION_ATTEMPTS_MAX {
                break Err(StoreError::Unavailable {
                    backend: "fdb",
                    reason: format!(
                        "transaction did not commit in {TRANSACTION_ATTEMPTS_MAX} attempts"
                    ),
                });
            }
            attempts += 1;
            let step: Result<Step<_>, StoreError> = async { $body }.await;
            match step? {
                Step::Done(value) => match $trx.commit().await {
                    Ok(_) => break Ok(value),
                    Err(e) => {
                        $unknown |= e.is_maybe_committed();
                        $trx = e.on_error().await.map_err(fdb_err)?
                    }
                },
                Step::Fdb(e) => $trx = $trx.on_error(e).await.map_err(fdb_err)?,
            }
        }
    }};
}

macro_rules! step {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => return Ok(Step::Fdb(e)),
        }
    };
}

// Declared after the macros above: `macro_rules!` scope is textual.
mod dc;
mod dc_lease;
mod global;
mod session;
mod setting;
mod succession;

/// `limit` rows of `[begin, end)` in one go: the default `Iterator` mode's
/// first batch is a few KiB, so a page would come back short while more rows
/// exist, and callers read a short page as the end. `Exact` delivers `limit`
/// rows, or every row left in the range. `limit` must be above 0 (FDB reads
/// 0 as "no limit").
fn exact_range<'a>(begin: Vec<u8>, end: Vec<u8>, limit: usize) -> RangeOption<'a> {
    debug_assert!(limit > 0);
    let mut range = RangeOption::from((begin, end));
    range.limit = Some(limit);
    range.mode = StreamingMode::Exact;
    range
}

/// The conformance suite against a real cluster, run only when
/// `FDB_CLUSTER_FILE` names one (`FDB_CLUSTER_FILE=/etc/foundationdb/fdb.cluster
/// cargo test -p homing-store --features fdb`); otherwise it prints why it
/// skipped and passes. Each run writes under a fresh random prefix and clears
/// it at the end, also when a case fails.
#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::Arc;

    use async_trait::async_trait;

    use super::*;
    use crate::conformance::{self, Backend};
    use crate::dc::DcStore;
    use crate::global::GlobalStore;
    use crate::keyspace;

    const CLUSTER_FILE_ENV: &str = "FDB_CLUSTER_FILE";

    /// A prefix no other run shares: `RandomState` is seeded from the OS.
    fn run_prefix() -> Vec<u8> {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        let run = h.finish();
        format!("homing-test/{run:016x}/").into_bytes()
    }

    struct FdbBackend {
        db: Arc<Database>,
        prefix: Vec<u8>,
    }

    impl FdbBackend {
        fn place(&self, kind: &str, place: &str) -> Vec<u8> {
            [
                self.prefix.as_slice(),
                format!("{kind}/{place}/").as_bytes(),
            ]
            .concat()
        }

        /// Removes everything this run wrote.
        async fn clear(&self) -> Result<(), foundationdb::FdbBindingError> {
            let begin = self.prefix.clone();
            // Invariant: the prefix ends in `/`, so it has an end.
            let end = keyspace::prefix_end(&begin).expect("a prefix ending in '/' has an end");
            self.db
                .run(|trx, _| {
                    let (begin, end) = (begin.clone(), end.clone());
                    async move {
                        trx.clear_range(&begin, &end);
                        Ok(())
                    }
                })
                .await
        }
    }

    #[async_trait]
    impl Backend for FdbBackend {
        async fn global_store(&self, place: &str) -> Arc<dyn GlobalStore> {
            Arc::new(FdbGlobalStore::new(
                self.db.clone(),
                &self.place("global", place),
            ))
        }
        async fn dc_store(&self, place: &str) -> Arc<dyn DcStore> {
            Arc::new(FdbDcStore::new(self.db.clone(), &self.place("dc", place)))
        }
        fn durable(&self) -> bool {
            true
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn fdb_cluster_passes_the_conformance_suite() {
        let Some(cluster_file) = std::env::var_os(CLUSTER_FILE_ENV) else {
            println!("skipping fdb conformance: {CLUSTER_FILE_ENV} is not set");
            return;
        };
        let cluster_file = cluster_file
            .into_string()
            .expect("FDB_CLUSTER_FILE is valid UTF-8");
        // Declared first so it is dropped last, after every `Database`.
        let network = FdbNetwork::start().expect("start the FDB network");
        let db = network
            .open(Some(std::path::Path::new(&cluster_file)))
            .expect("open the FDB database");
        let backend = Arc::new(FdbBackend {
            db,
            prefix: run_prefix(),
        });
        println!(
            "fdb conformance: cluster file {cluster_file}, prefix {}",
            String::from_utf8_lossy(&backend.prefix)
        );
        // In a task, so a failing case still reaches the clean-up below.
        let suite = tokio::spawn({
            let backend = backend.clone();
            async move { conformance::run_all(backend.as_ref()).await }
        });
        let outcome = suite.await;
        let cleared = backend.clear().await;
        if let Err(failed) = outcome {
            std::panic::resume_unwind(failed.into_panic());
        }
        cleared.expect("clear this run's prefix");
    }
}
