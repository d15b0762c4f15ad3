//! homing-store: where homing keeps its state.
//!
//! Two stores, two traits:
//!
//! - [`GlobalStore`]: `key → ReservationId`, written once and never changed or
//!   deleted, so readers may cache entries forever;
//!   [`GlobalStore::scan`] pages through every entry in key order (migration).
//!   Beside the entries it keeps the deployment's [`Setting`]s: a few small
//!   values that do change, each only by compare-and-set
//!   ([`GlobalStore::swap_setting`]).
//! - [`DcStore`]: one DC's own mutable [`homing_core::DcRecord`]s, changed by
//!   compare-and-set on the record's `version` and scanned by namespace scope
//!   (one namespace, or a namespace and everything under it); the DC's
//!   lifecycle event log, each event appended in the same transaction as the
//!   change it records (seqs 1, 2, … without gaps, trimmed by retention);
//!   and a durable allocator of reservation uniques. It also keeps the
//!   DC's host sessions ([`session`]): one row per session, changed by
//!   compare-and-set on its version, and three indexes every backend
//!   derives in the transaction of the write they follow (session keys,
//!   session notices, sessions due); a record joins or freezes in a session
//!   only by [`DcStore::compare_and_set_in_session`], its row compared in
//!   the same transaction. Migration copies session rows, records and
//!   events with [`DcStore::import_session`] / [`DcStore::import`] /
//!   [`DcStore::import_event`] (found by [`DcStore::sessions`],
//!   [`DcStore::scan`] and [`DcStore::events`]) and carries the allocator
//!   over with [`DcStore::allocator_floor`] / [`DcStore::raise_allocator`].
//!   Where each backend keeps each of them: docs/OPERATIONS.md, "Where a
//!   DC store keeps what".
//!
//! The global store also keeps each DC's lease and marks
//! ([`GlobalStore::renew_dc_lease`], DESIGN.md §7.5): a DC grants host leases
//! only while its DC lease lives, and a DC restarted on an empty store finds
//! its allocator below the floor it published. Whose clock judges expiry:
//! memory's and redb's own process; etcd's lease clock (`etcd::dc_lease`);
//! FoundationDB's versions, bounded by how long the reading process has
//! known the renewal (`fdb::dc_lease`: a recovery jumps versions ahead).
//!
//! Backends: [`memory`] (tests and the simulator), [`redb`] (embedded, the
//! default: zero set-up, group commit), `etcd` (cargo feature `etcd`) and
//! `fdb` (cargo feature `fdb`, FoundationDB). Every backend is tested by the
//! same [`conformance`] suite (cargo feature `conformance` exports it). The
//! FoundationDB backend is verified by compilation on CI, not against a
//! running cluster; the suite runs against it whenever `FDB_CLUSTER_FILE`
//! points at a cluster:
//! `FDB_CLUSTER_FILE=/etc/foundationdb/fdb.cluster cargo test -p homing-store --features fdb`.
//!
//! ```
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! use homing_store::{GlobalStore, MemoryGlobalStore, SetIfAbsent};
//! use homing_core::{Key, KeyName, ReservationId};
//! let global = MemoryGlobalStore::new();
//! let key = Key::new(KeyName::new("room-42")?);
//! let iad: ReservationId = "iad.1".parse()?;
//! let fra: ReservationId = "fra.1".parse()?;
//! assert_eq!(global.set_if_absent(&key, &iad).await?, SetIfAbsent::Inserted);
//! // The loser of the race learns the winner.
//! assert_eq!(global.set_if_absent(&key, &fra).await?, SetIfAbsent::Exists(iad));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! # }).unwrap();
//! ```

// The library forbids unsafe code. The one exception is starting the FDB
// client network (`fdb::FdbNetwork::start`, feature `fdb` only), which must
// call the unsafe `foundationdb::boot`: there the crate's `deny` applies and
// that one function allows it locally.
#![cfg_attr(not(feature = "fdb"), forbid(unsafe_code))]

pub mod allocator;
#[cfg(any(feature = "etcd", feature = "fdb", test))]
pub mod batch;
#[cfg(any(test, feature = "conformance"))]
pub mod conformance;
pub mod dc;
pub mod dc_lease;
pub mod deployment;
pub mod directory;
pub mod error;
#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub mod etcd_cluster;
pub mod failover;
#[cfg(feature = "fdb")]
pub mod fdb;
pub mod global;
pub mod keyspace;
pub mod memory;
pub mod migrate;
pub mod redb;
mod reopen;
pub mod session;
pub mod setting;
mod writer;

pub use dc::{
    Cas, DcStore, EVENTS_LIMIT_MAX, EventPage, Import, SCAN_LIMIT_MAX, SESSION_PAGE_MAX, ScanCursor,
};
pub use error::StoreError;
pub use failover::{EndpointHealth, Failover, FailoverEvent};
pub use global::{DCS_MAX, GET_MANY_KEYS_MAX, GlobalStore, SetIfAbsent, SuccessionPages};
pub use memory::{MemoryDcStore, MemoryGlobalStore};
pub use redb::{CommitMode, RedbDcStore, RedbGlobalStore, RedbOptions};
pub use session::{GuardedCas, SessionCas, SessionCounts, SessionCursor, SessionGuard};
pub use setting::{SETTING_BYTES_MAX, Setting};
