//! The etcd backend (cargo feature `etcd`): both stores as keys under one
//! configurable prefix (e.g. `/homing/<deployment>/global/`, or
//! `/homing/<deployment>/dc/<dc>/` for one DC's store).
//!
//! Layout under the prefix: `g/<key bytes>` → reservation ID (global
//! entries); `dcs/<dc>` → the DC's lease terms, marks and retired flag, and
//! `dcl/<dc>` → empty, on an etcd lease: it exists while the DC lease has
//! not expired (`dc_lease`); `succ/<dc, 0x00, unique 8 bytes big-endian>`
//! → the reservation's succession, written once, a takeover guarded by the
//! DC's lease keys in the same transaction (`succession`);
//! `setting/<setting name>` → a deployment setting's value, changed by a
//! transaction comparing the value (`setting`); `r/<id>` → postcard
//! record; `k/<(key, id) bytes>` → id (scan index); `events/<seq, 8 bytes
//! big-endian>` → postcard event; `events-head` → the last event seq ever appended (decimal; outside the
//! `events/` range, so trimming keeps it); `alloc` → the allocator's
//! high-water mark (decimal); `d/<kind, time, id>` → id (expiry index,
//! written in the transaction of every record write; `due-index` → `1`
//! once a store from before the index was indexed on connect); `migrating`
//! → `1` while an unfinished `homing migrate` copies into the store;
//! `s/<session name>` → a host session's row, `sk/`, `sn/` and `sd/` → its
//! keys', notices' and due-time index entries (`session`).
//!
//! The two stores live in `global` ([`EtcdGlobalStore`]) and `dc`
//! ([`EtcdDcStore`]); this module holds what both are built on: the
//! members and the prefix (`Space`), the error mapping, the timeouts, and
//! the guards and decoders the stores and their helpers share.
//!
//! - members (`members`): one connection per member; each attempt of a hot
//!   operation has a deadline, a miss sends it to another member, and a
//!   member that missed one is avoided until it answers a probe. An attempt
//!   abandoned at its deadline may land later: every write is guarded, and
//!   the retry's re-read recognises a write that landed (`global`, `dc`).

use std::sync::Arc;

use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOpResponse};

pub use self::dc_lease::{DC_LEASE_ATTEMPTS_MAX, DC_READS_IN_FLIGHT_MAX};
pub use self::members::{
    ATTEMPTS_MAX, BULK_DEADLINE_MS, HOT_DEADLINE_MS, KEEP_ALIVE_INTERVAL_MS, KEEP_ALIVE_TIMEOUT_MS,
    PROBE_DEADLINE_MS, PROBE_INTERVAL_MS, RETRY_PAUSE_MS,
};
use self::members::{Members, Op};
pub use self::record_cache::{RECORD_CACHE_BYTES_MAX, RECORD_CACHE_ENTRIES_MAX};
pub use self::succession::TAKE_OVER_ATTEMPTS_MAX;
use crate::error::StoreError;

pub mod compaction;
mod dc;
mod dc_lease;
mod global;
mod log;
#[cfg(test)]
mod lost_answer;
mod members;
mod record_cache;
mod session;
mod setting;
mod succession;
#[cfg(test)]
mod tests;

pub use self::dc::{ALLOCATE_ATTEMPTS_MAX, EtcdDcOptions, EtcdDcStore};
pub use self::global::{EtcdGlobalOptions, EtcdGlobalStore};

/// The section of the event log: `events/<seq, 8 bytes big-endian>`.
const EVENTS: &[u8] = b"events/";
/// The key of the event head: outside [`EVENTS`], so trimming keeps it.
const EVENT_HEAD: &[u8] = b"events-head";

/// Most attempts of one compare-and-set (or import) whose record is
/// unchanged but whose guard failed because the event head moved under it.
pub const CAS_ATTEMPTS_MAX: usize = 64;
/// Connect timeout, in milliseconds.
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Per-request timeout, in milliseconds: the outer bound of one attempt;
/// hot operations give up on a member much sooner ([`HOT_DEADLINE_MS`]).
pub const REQUEST_TIMEOUT_MS: u64 = 10_000;

fn map_err(e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    match e {
        // Transport trouble and gRPC statuses (leader loss, timeouts, no quorum) are worth a retry.
        E::TransportError(_) | E::GRpcStatus(_) | E::IoError(_) => StoreError::Unavailable {
            backend: "etcd",
            reason: e.to_string(),
        },
        e => StoreError::Backend {
            backend: "etcd",
            reason: e.to_string(),
        },
    }
}

fn protocol(reason: &str) -> StoreError {
    StoreError::Backend {
        backend: "etcd",
        reason: reason.into(),
    }
}

/// The members and the prefix every key lives under.
#[derive(Clone)]
struct Space {
    members: Arc<Members>,
    prefix: Vec<u8>,
}

/// A transaction's outcome.
struct Txned {
    /// Its guards held (or it had none).
    succeeded: bool,
    /// The store's revision after it: for a transaction that wrote, the
    /// `mod_revision` of every key it put. (etcd always sends a header;
    /// without one, 0 matches no stored key, so a guard built on it fails
    /// safe.)
    revision: i64,
    responses: Vec<TxnOpResponse>,
    /// An earlier attempt may have landed (see `members::Answer::ambiguous`).
    ambiguous: bool,
}

impl Space {
    async fn connect(endpoints: &[String], prefix: &str) -> Result<Space, StoreError> {
        Ok(Space {
            members: Members::connect(endpoints).await?,
            prefix: prefix.as_bytes().to_vec(),
        })
    }

    fn key(&self, section: &[u8], rest: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.prefix.len() + section.len() + rest.len());
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(section);
        out.extend_from_slice(rest);
        out
    }

    async fn get(
        &self,
        op: Op,
        key: Vec<u8>,
        options: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse, StoreError> {
        let answer = self
            .members
            .run(op, |mut kv| {
                let (key, options) = (key.clone(), options.clone());
                async move { kv.get(key, options).await }
            })
            .await?;
        if let Some(header) = answer.value.header() {
            self.members.note_revision(header.revision());
        }
        Ok(answer.value)
    }

    async fn txn(&self, op: Op, txn: Txn) -> Result<(bool, Vec<TxnOpResponse>), StoreError> {
        let txned = self.txn_at(op, txn).await?;
        Ok((txned.succeeded, txned.responses))
    }

    /// [`Space::txn`] with the revision after it and whether it is ambiguous.
    async fn txn_at(&self, op: Op, txn: Txn) -> Result<Txned, StoreError> {
        let answer = self
            .members
            .run(op, |mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await?;
        let response = answer.value;
        let revision = response.header().map_or(0, |h| h.revision());
        self.members.note_revision(revision);
        Ok(Txned {
            succeeded: response.succeeded(),
            revision,
            responses: response.op_responses(),
            ambiguous: answer.ambiguous,
        })
    }
}

/// The first key-value of a transaction's get response, if any.
fn first_kv(response: Option<&TxnOpResponse>) -> Result<Option<KeyValue>, StoreError> {
    match response {
        Some(TxnOpResponse::Get(get)) => Ok(get.kvs().first().cloned()),
        _ => Err(protocol(
            "transaction answered without the get it asked for",
        )),
    }
}

/// The first kv of each of `expected` get responses.
fn every_first_kv(
    responses: &[TxnOpResponse],
    expected: usize,
) -> Result<Vec<Option<KeyValue>>, StoreError> {
    if responses.len() != expected {
        return Err(protocol("transaction answered a different number of gets"));
    }
    responses.iter().map(|r| first_kv(Some(r))).collect()
}

/// The guard that `key` is as it was read (`kv`), or still absent.
fn unchanged(key: &[u8], kv: Option<&KeyValue>) -> Compare {
    unchanged_at(key, kv.map(KeyValue::mod_revision))
}

/// The guard that `key` still has `mod_revision` (`None`: still absent).
fn unchanged_at(key: &[u8], mod_revision: Option<i64>) -> Compare {
    match mod_revision {
        Some(revision) => Compare::mod_revision(key, CompareOp::Equal, revision),
        None => Compare::create_revision(key, CompareOp::Equal, 0),
    }
}

/// A decimal counter kv (the event head, the allocator's mark); absent is 0.
fn decode_counter(what: &'static str, kv: Option<&KeyValue>) -> Result<u64, StoreError> {
    let Some(kv) = kv else { return Ok(0) };
    let text = std::str::from_utf8(kv.value()).map_err(|e| StoreError::corrupt(what, e))?;
    text.parse::<u64>()
        .map_err(|e| StoreError::corrupt(what, e))
}
