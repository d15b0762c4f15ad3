//! The etcd backend (cargo feature `etcd`): both stores as keys under one
//! configurable prefix (e.g. `/homing/<deployment>/global/`, or
//! `/homing/<deployment>/dc/<dc>/` for one DC's store).
//!
//! Layout under the prefix: `g/<key bytes>` → reservation ID (global
//! entries); `r/<id>` → postcard record; `k/<(key, id) bytes>` → id (scan
//! index); `events/<seq, 8 bytes big-endian>` → postcard event;
//! `events-head` → the last event seq ever appended (decimal; outside the
//! `events/` range, so trimming keeps it); `alloc` → the allocator's
//! high-water mark (decimal).
//!
//! - `set_if_absent`: one transaction, `create_revision(g/k) == 0` ? put : get.
//! - compare-and-set: read the record, judge the CAS and derive its event
//!   locally, then write guarded by the record's `mod_revision` as read
//!   (absent: `create_revision == 0`). Without an event (a renewal) that is
//!   one transaction. With one, the write goes through the DC store's event
//!   appender (`log`), which puts the record, the event at `head + 1` and the
//!   new head in one transaction, grouping concurrent appends so that they do
//!   not fail each other's guard on the head. If the guard fails because the
//!   record moved, the CAS reads and judges again (bounded by
//!   [`CAS_ATTEMPTS_MAX`]): the caller sees `Cas::Conflict` only when the
//!   record itself differs from `expected`. (Records are compared by
//!   `mod_revision`, not by etcd's per-key `version`, because an imported
//!   record keeps its own version.)
//! - allocator: hi-lo blocks; the high-water mark is raised by a transaction
//!   on the counter key's `mod_revision`, retried a bounded number of times.

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, KvClient, Txn, TxnOp,
    TxnOpResponse,
};
use homing_core::{DcRecord, Event, EventSeq, Key, NamespaceScope, ReservationId};
use tokio::sync::Mutex;

use self::log::{Append, Appended, Appender};
use crate::allocator::Blocks;
use crate::dc::{
    Cas, DcStore, EventPage, Import, ScanCursor, check_cas, check_events_limit, check_scan,
    judge_cas, judge_event_import, judge_import,
};
use crate::error::StoreError;
use crate::global::{GlobalStore, SetIfAbsent, check_batch};
use crate::keyspace;

mod log;

/// The section of the event log: `events/<seq, 8 bytes big-endian>`.
const EVENTS: &[u8] = b"events/";
/// The key of the event head: outside [`EVENTS`], so trimming keeps it.
const EVENT_HEAD: &[u8] = b"events-head";

/// Most attempts to raise the allocator's high-water mark against concurrent raisers.
pub const ALLOCATE_ATTEMPTS_MAX: usize = 16;
/// Most attempts of one compare-and-set (or import) whose record is
/// unchanged but whose guard failed because the event head moved under it.
pub const CAS_ATTEMPTS_MAX: usize = 64;
/// Connect timeout, in milliseconds.
pub const CONNECT_TIMEOUT_MS: u64 = 5_000;
/// Per-request timeout, in milliseconds.
pub const REQUEST_TIMEOUT_MS: u64 = 10_000;
/// Attempts of one request when the member it went to does not answer (the
/// client then reaches another member).
pub const TRANSPORT_ATTEMPTS_MAX: usize = 3;
/// Pause between such attempts, in milliseconds.
pub const TRANSPORT_RETRY_PAUSE_MS: u64 = 100;

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

/// A connection and the prefix every key lives under.
#[derive(Clone)]
struct Space {
    kv: KvClient,
    prefix: Vec<u8>,
}

impl Space {
    async fn connect(endpoints: &[String], prefix: &str) -> Result<Space, StoreError> {
        let options = etcd_client::ConnectOptions::new()
            .with_connect_timeout(std::time::Duration::from_millis(CONNECT_TIMEOUT_MS))
            .with_timeout(std::time::Duration::from_millis(REQUEST_TIMEOUT_MS));
        let client = Client::connect(endpoints, Some(options))
            .await
            .map_err(map_err)?;
        Ok(Space {
            kv: client.kv_client(),
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

    /// Runs `request` again (bounded) while it fails for want of a member.
    /// A retried write may have landed the first time: `set_if_absent` then
    /// sees its own entry and a CAS sees its own record, which callers treat
    /// as success (see `Cas::landed`).
    async fn retrying<T, F, Fut>(&self, request: F) -> Result<T, StoreError>
    where
        F: Fn(KvClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut attempt = 1;
        loop {
            match request(self.kv.clone()).await.map_err(map_err) {
                Err(StoreError::Unavailable { .. }) if attempt < TRANSPORT_ATTEMPTS_MAX => {
                    attempt += 1;
                    tokio::time::sleep(std::time::Duration::from_millis(TRANSPORT_RETRY_PAUSE_MS))
                        .await;
                }
                other => return other,
            }
        }
    }

    async fn get(
        &self,
        key: Vec<u8>,
        options: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse, StoreError> {
        self.retrying(|mut kv| {
            let (key, options) = (key.clone(), options.clone());
            async move { kv.get(key, options).await }
        })
        .await
    }

    async fn txn(&self, txn: Txn) -> Result<(bool, Vec<TxnOpResponse>), StoreError> {
        let response = self
            .retrying(|mut kv| {
                let txn = txn.clone();
                async move { kv.txn(txn).await }
            })
            .await?;
        Ok((response.succeeded(), response.op_responses()))
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

/// A [`GlobalStore`] in etcd.
#[derive(Clone)]
pub struct EtcdGlobalStore {
    space: Space,
}

impl EtcdGlobalStore {
    /// Connects to the cluster at `endpoints` (`http://host:port`); keys live under `prefix`.
    pub async fn connect(
        endpoints: &[String],
        prefix: &str,
    ) -> Result<EtcdGlobalStore, StoreError> {
        Ok(EtcdGlobalStore {
            space: Space::connect(endpoints, prefix).await?,
        })
    }

    fn entry_key(&self, key: &Key) -> Vec<u8> {
        self.space.key(b"g/", &keyspace::key_bytes(key))
    }
}

#[async_trait]
impl GlobalStore for EtcdGlobalStore {
    async fn get(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        let response = self.space.get(self.entry_key(key), None).await?;
        response
            .kvs()
            .first()
            .map(|kv| keyspace::decode_id(kv.value()))
            .transpose()
    }

    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<ReservationId>>, StoreError> {
        check_batch(keys.len())?;
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let gets: Vec<TxnOp> = keys
            .iter()
            .map(|k| TxnOp::get(self.entry_key(k), None))
            .collect();
        let (_, responses) = self.space.txn(Txn::new().and_then(gets)).await?;
        if responses.len() != keys.len() {
            return Err(protocol("transaction answered a different number of gets"));
        }
        responses
            .iter()
            .map(|r| {
                first_kv(Some(r))?
                    .map(|kv| keyspace::decode_id(kv.value()))
                    .transpose()
            })
            .collect()
    }

    async fn set_if_absent(
        &self,
        key: &Key,
        id: &ReservationId,
    ) -> Result<SetIfAbsent, StoreError> {
        let k = self.entry_key(key);
        let txn = Txn::new()
            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(k.clone(), keyspace::id_bytes(id), None)])
            .or_else([TxnOp::get(k, None)]);
        let (inserted, responses) = self.space.txn(txn).await?;
        if inserted {
            return Ok(SetIfAbsent::Inserted);
        }
        let kv = first_kv(responses.first())?
            .ok_or_else(|| protocol("entry vanished (entries are never deleted)"))?;
        Ok(SetIfAbsent::Exists(keyspace::decode_id(kv.value())?))
    }

    async fn scan(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<(Key, ReservationId)>, StoreError> {
        check_batch(limit)?;
        if limit == 0 {
            // etcd reads limit 0 as "no limit".
            return Ok(Vec::new());
        }
        let section = self.space.key(b"g/", b"");
        // Invariant: the section ends in `/`, so it has an end.
        let end = keyspace::prefix_end(&section).expect("a section ending in '/' has an end");
        // Byte order is key order; the successor of `after`'s bytes is the
        // smallest key bytes strictly after it.
        let start = match after {
            Some(k) => self
                .space
                .key(b"g/", &keyspace::successor(&keyspace::key_bytes(k))),
            None => section.clone(),
        };
        let options = GetOptions::new().with_range(end).with_limit(limit as i64);
        let response = self.space.get(start, Some(options)).await?;
        response
            .kvs()
            .iter()
            .map(|kv| {
                let key = kv
                    .key()
                    .strip_prefix(section.as_slice())
                    .ok_or_else(|| protocol("range answered a key outside its section"))?;
                Ok((keyspace::decode_key(key)?, keyspace::decode_id(kv.value())?))
            })
            .collect()
    }
}

/// A [`DcStore`] in etcd.
pub struct EtcdDcStore {
    space: Space,
    blocks: Mutex<Blocks>,
    appender: Appender,
}

impl EtcdDcStore {
    /// Connects to the cluster at `endpoints`; this DC's keys live under
    /// `prefix`. Spawns the store's event appender on the current tokio
    /// runtime (it ends when the store is dropped).
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<EtcdDcStore, StoreError> {
        let space = Space::connect(endpoints, prefix).await?;
        Ok(EtcdDcStore {
            appender: Appender::start(space.clone()),
            space,
            // The first allocation reads the persisted mark before serving.
            blocks: Mutex::new(Blocks::resume(0)),
        })
    }

    fn record_key(&self, id: &ReservationId) -> Vec<u8> {
        self.space.key(b"r/", &keyspace::id_bytes(id))
    }

    fn index_key(&self, record: &DcRecord) -> Vec<u8> {
        self.space
            .key(b"k/", &keyspace::record_scan_bytes(&record.key, &record.id))
    }

    fn event_key(&self, seq: EventSeq) -> Vec<u8> {
        self.space.key(EVENTS, &keyspace::event_seq_bytes(seq))
    }

    fn head_key(&self) -> Vec<u8> {
        self.space.key(EVENT_HEAD, b"")
    }

    fn counter_key(&self) -> Vec<u8> {
        self.space.key(b"alloc", b"")
    }

    /// Reads `keys` in one transaction (one revision): the first kv of each.
    async fn read_together(&self, keys: &[&[u8]]) -> Result<Vec<Option<KeyValue>>, StoreError> {
        let gets: Vec<TxnOp> = keys.iter().map(|k| TxnOp::get(*k, None)).collect();
        let (_, responses) = self.space.txn(Txn::new().and_then(gets)).await?;
        every_first_kv(&responses, keys.len())
    }

    /// Runs `txn` guarded by `guards`; on failure, the first kv of each of
    /// `reread` as they are now (`None` when the transaction succeeded).
    async fn guarded(
        &self,
        guards: Vec<Compare>,
        ops: Vec<TxnOp>,
        reread: &[&[u8]],
    ) -> Result<Option<Vec<Option<KeyValue>>>, StoreError> {
        let gets: Vec<TxnOp> = reread.iter().map(|k| TxnOp::get(*k, None)).collect();
        let txn = Txn::new().when(guards).and_then(ops).or_else(gets);
        let (written, responses) = self.space.txn(txn).await?;
        if written {
            return Ok(None);
        }
        Ok(Some(every_first_kv(&responses, reread.len())?))
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
    match kv {
        Some(kv) => Compare::mod_revision(key, CompareOp::Equal, kv.mod_revision()),
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

fn decode_record_kv(kv: Option<&KeyValue>) -> Result<Option<DcRecord>, StoreError> {
    kv.map(|kv| keyspace::decode_record(kv.value())).transpose()
}

fn contended(what: &str) -> StoreError {
    StoreError::Unavailable {
        backend: "etcd",
        reason: format!("{what}: contended for {CAS_ATTEMPTS_MAX} attempts"),
    }
}

#[async_trait]
impl DcStore for EtcdDcStore {
    async fn get(&self, id: &ReservationId) -> Result<Option<DcRecord>, StoreError> {
        let response = self.space.get(self.record_key(id), None).await?;
        decode_record_kv(response.kvs().first())
    }

    async fn compare_and_set(
        &self,
        expected: Option<u64>,
        record: &DcRecord,
    ) -> Result<Cas, StoreError> {
        check_cas(expected, record)?;
        let value = keyspace::encode_record(record)?;
        let rk = self.record_key(&record.id);
        let mut puts = vec![(rk.clone(), value)];
        if expected.is_none() {
            puts.push((self.index_key(record), keyspace::id_bytes(&record.id)));
        }
        for _ in 0..CAS_ATTEMPTS_MAX {
            let response = self.space.get(rk.clone(), None).await?;
            let kv = response.kvs().first();
            let current = decode_record_kv(kv)?;
            let event = homing_core::event::derive(current.as_ref(), record);
            // A retried write that had landed finds its own record here and
            // answers `Conflict` with it (see `Cas::landed`).
            if let Some(conflict) = judge_cas(expected, record, current)? {
                return Ok(conflict);
            }
            let read_revision = kv.map(KeyValue::mod_revision);
            let appended = match event {
                Some(event) => {
                    let append = Append {
                        record_key: rk.clone(),
                        read_revision,
                        puts: puts.clone(),
                        event,
                    };
                    self.appender.submit(append).await?
                }
                None => {
                    let txn = Txn::new().when([unchanged(&rk, kv)]).and_then(
                        puts.iter()
                            .map(|(k, v)| TxnOp::put(k.clone(), v.clone(), None))
                            .collect::<Vec<_>>(),
                    );
                    match self.space.txn(txn).await?.0 {
                        true => Appended::Written,
                        false => Appended::Moved,
                    }
                }
            };
            match appended {
                Appended::Written => return Ok(Cas::Written),
                // The record moved since it was read: judge again.
                Appended::Moved => {}
            }
        }
        Err(StoreError::Unavailable {
            backend: "etcd",
            reason: format!("compare-and-set: record moved for {CAS_ATTEMPTS_MAX} attempts"),
        })
    }

    async fn scan(
        &self,
        scope: &NamespaceScope,
        name_prefix: &str,
        after: Option<&ScanCursor>,
        limit: usize,
    ) -> Result<Vec<DcRecord>, StoreError> {
        check_scan(scope, name_prefix, limit)?;
        if limit == 0 {
            // etcd reads limit 0 as "no limit".
            return Ok(Vec::new());
        }
        let ranges =
            keyspace::prefixed_scan_ranges(&self.space.key(b"k/", b""), scope, name_prefix, after);
        // Every range in one read (one revision), each up to the whole page;
        // the ranges are in byte order, so the page is their concatenation.
        let gets: Vec<TxnOp> = ranges
            .into_iter()
            .map(|(start, end)| {
                let options = GetOptions::new().with_range(end).with_limit(limit as i64);
                TxnOp::get(start, Some(options))
            })
            .collect();
        let (_, responses) = self.space.txn(Txn::new().and_then(gets)).await?;
        let mut ids = Vec::with_capacity(limit);
        for response in &responses {
            let TxnOpResponse::Get(get) = response else {
                return Err(protocol(
                    "transaction answered without the get it asked for",
                ));
            };
            ids.extend(get.kvs().iter().map(|kv| kv.value().to_vec()));
        }
        ids.truncate(limit);
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let gets: Vec<TxnOp> = ids
            .iter()
            .map(|id| TxnOp::get(self.space.key(b"r/", id), None))
            .collect();
        let (_, responses) = self.space.txn(Txn::new().and_then(gets)).await?;
        every_first_kv(&responses, ids.len())?
            .into_iter()
            .map(|kv| {
                let kv =
                    kv.ok_or_else(|| StoreError::corrupt("scan index", "entry without a record"))?;
                keyspace::decode_record(kv.value())
            })
            .collect()
    }

    async fn allocate(&self) -> Result<u64, StoreError> {
        let mut blocks = self.blocks.lock().await;
        if let Some(unique) = blocks.take() {
            return Ok(unique);
        }
        let counter = self.counter_key();
        for _ in 0..ALLOCATE_ATTEMPTS_MAX {
            let response = self.space.get(counter.clone(), None).await?;
            let kv = response.kvs().first();
            let persisted = decode_counter("allocator", kv)?;
            let guard = unchanged(&counter, kv);
            blocks.jump_to(persisted);
            let high_water = blocks.next_high_water()?;
            let txn = Txn::new().when([guard]).and_then([TxnOp::put(
                counter.clone(),
                high_water.to_string(),
                None,
            )]);
            if self.space.txn(txn).await?.0 {
                blocks.granted(high_water);
                // Invariant: a fresh block of ALLOCATOR_BLOCK_IDS ≥ 1 has a first unique.
                return Ok(blocks.take().expect("a granted block is not empty"));
            }
        }
        Err(StoreError::Unavailable {
            backend: "etcd",
            reason: format!("allocator counter contended for {ALLOCATE_ATTEMPTS_MAX} attempts"),
        })
    }

    async fn events(&self, after: EventSeq, limit: usize) -> Result<EventPage, StoreError> {
        check_events_limit(limit)?;
        let section = self.space.key(EVENTS, b"");
        // Invariant: the section ends in `/`, so it has an end.
        let end = keyspace::prefix_end(&section).expect("a section ending in '/' has an end");
        let first = GetOptions::new().with_range(end.clone()).with_limit(1);
        let mut gets = vec![
            TxnOp::get(self.head_key(), None),
            TxnOp::get(section, Some(first)),
        ];
        // etcd reads limit 0 as "no limit"; past the last seq nothing follows.
        let start = after.checked_add(1).filter(|_| limit > 0);
        if let Some(start) = start {
            let page = GetOptions::new().with_range(end).with_limit(limit as i64);
            gets.push(TxnOp::get(self.event_key(start), Some(page)));
        }
        let (_, responses) = self.space.txn(Txn::new().and_then(gets)).await?;
        let head = decode_counter("event head", first_kv(responses.first())?.as_ref())?;
        let oldest = match first_kv(responses.get(1))? {
            Some(kv) => keyspace::decode_event(kv.value())?.seq,
            None => head + 1,
        };
        let events = match responses.get(2) {
            Some(TxnOpResponse::Get(get)) => get
                .kvs()
                .iter()
                .map(|kv| keyspace::decode_event(kv.value()))
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(protocol(
                    "transaction answered without the get it asked for",
                ));
            }
            None => Vec::new(),
        };
        Ok(EventPage {
            events,
            oldest,
            head,
        })
    }

    async fn trim_events(&self, before: EventSeq) -> Result<(), StoreError> {
        if before == 0 {
            // Nothing is below seq 0 (and etcd reads an empty range oddly).
            return Ok(());
        }
        let options = DeleteOptions::new().with_range(self.event_key(before));
        let delete = TxnOp::delete(self.event_key(0), Some(options));
        self.space.txn(Txn::new().and_then([delete])).await?;
        Ok(())
    }

    async fn import(&self, record: &DcRecord) -> Result<Import<DcRecord>, StoreError> {
        let value = keyspace::encode_record(record)?;
        let rk = self.record_key(&record.id);
        let mut read = self.read_together(&[&rk]).await?;
        for _ in 0..CAS_ATTEMPTS_MAX {
            let kv = read[0].take();
            if let Some(judged) = judge_import(record, decode_record_kv(kv.as_ref())?) {
                return Ok(judged);
            }
            // An older version has the same key (judge_import checks it),
            // so the index entry is the same either way.
            let ops = vec![
                TxnOp::put(rk.clone(), value.clone(), None),
                TxnOp::put(self.index_key(record), keyspace::id_bytes(&record.id), None),
            ];
            match self
                .guarded(vec![unchanged(&rk, kv.as_ref())], ops, &[&rk])
                .await?
            {
                None => return Ok(Import::Written),
                Some(now) => read = now,
            }
        }
        Err(contended("import"))
    }

    async fn import_event(&self, event: &Event) -> Result<Import<Event>, StoreError> {
        let value = keyspace::encode_event(event)?;
        let (ek, hk) = (self.event_key(event.seq), self.head_key());
        let mut read = self.read_together(&[&ek, &hk]).await?;
        for _ in 0..CAS_ATTEMPTS_MAX {
            let (event_kv, head_kv) = (read[0].take(), read[1].take());
            let current = event_kv
                .as_ref()
                .map(|kv| keyspace::decode_event(kv.value()))
                .transpose()?;
            if let Some(judged) = judge_event_import(event, current) {
                return Ok(judged);
            }
            let head = decode_counter("event head", head_kv.as_ref())?;
            let guards = vec![unchanged(&ek, None), unchanged(&hk, head_kv.as_ref())];
            let mut ops = vec![TxnOp::put(ek.clone(), value.clone(), None)];
            if event.seq > head {
                ops.push(TxnOp::put(hk.clone(), event.seq.to_string(), None));
            }
            match self.guarded(guards, ops, &[&ek, &hk]).await? {
                None => return Ok(Import::Written),
                Some(now) => read = now,
            }
        }
        Err(contended("event import"))
    }

    async fn allocator_floor(&self) -> Result<u64, StoreError> {
        // The persisted mark is exclusive: every unique handed out is below it.
        let response = self.space.get(self.counter_key(), None).await?;
        decode_counter("allocator", response.kvs().first())
    }

    async fn raise_allocator(&self, floor: u64) -> Result<(), StoreError> {
        // Held across the write so no allocation of this store interleaves.
        let mut blocks = self.blocks.lock().await;
        let past = floor.checked_add(1).ok_or(StoreError::AllocatorExhausted)?;
        let counter = self.counter_key();
        for _ in 0..ALLOCATE_ATTEMPTS_MAX {
            let response = self.space.get(counter.clone(), None).await?;
            let kv = response.kvs().first();
            if decode_counter("allocator", kv)? >= past {
                blocks.jump_to(past);
                return Ok(());
            }
            let txn = Txn::new()
                .when([unchanged(&counter, kv)])
                .and_then([TxnOp::put(counter.clone(), past.to_string(), None)]);
            if self.space.txn(txn).await?.0 {
                blocks.jump_to(past);
                return Ok(());
            }
        }
        Err(StoreError::Unavailable {
            backend: "etcd",
            reason: format!("allocator counter contended for {ALLOCATE_ATTEMPTS_MAX} attempts"),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    use async_trait::async_trait;

    use super::*;
    use crate::conformance::{self, Backend};
    use crate::etcd_cluster::{ClusterError, LocalEtcdCluster};

    struct EtcdBackend {
        endpoints: Vec<String>,
        run: u64,
    }

    static RUNS: AtomicU64 = AtomicU64::new(0);

    impl EtcdBackend {
        fn prefix(&self, kind: &str, place: &str) -> String {
            format!("/homing-test/{}/{kind}/{place}/", self.run)
        }
    }

    #[async_trait]
    impl Backend for EtcdBackend {
        async fn global_store(&self, place: &str) -> Arc<dyn GlobalStore> {
            let prefix = self.prefix("global", place);
            Arc::new(
                EtcdGlobalStore::connect(&self.endpoints, &prefix)
                    .await
                    .expect("connect"),
            )
        }
        async fn dc_store(&self, place: &str) -> Arc<dyn DcStore> {
            let prefix = self.prefix("dc", place);
            Arc::new(
                EtcdDcStore::connect(&self.endpoints, &prefix)
                    .await
                    .expect("connect"),
            )
        }
        fn durable(&self) -> bool {
            true
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn etcd_three_member_cluster_passes_the_conformance_suite() {
        let cluster = match LocalEtcdCluster::start().await {
            Ok(cluster) => cluster,
            Err(ClusterError::NoBinary) => {
                println!(
                    "SKIP etcd conformance: no `etcd` binary on PATH (apt-get install etcd-server)"
                );
                return;
            }
            Err(e) => panic!("{e}"),
        };
        let backend = EtcdBackend {
            endpoints: cluster.endpoints().to_vec(),
            run: RUNS.fetch_add(1, Ordering::Relaxed),
        };
        conformance::run_all(&backend).await;
        println!("etcd: two_stores_on_one_prefix_share_one_contiguous_log");
        two_stores_on_one_prefix_share_one_contiguous_log(&backend).await;
        drop(cluster);
    }

    /// Writers per store in the two-store race.
    const WRITERS_PER_STORE: usize = 8;
    /// Records each writer creates and releases.
    const RECORDS_PER_WRITER: usize = 4;

    /// Two stores on one prefix (two daemons of one DC, or a daemon and a
    /// migration) append through two appenders: their transactions contend
    /// on the head key, and the log must still be 1..n, each change once.
    async fn two_stores_on_one_prefix_share_one_contiguous_log(backend: &EtcdBackend) {
        let prefix = backend.prefix("dc", "two_stores");
        let mut stores = Vec::new();
        for _ in 0..2 {
            let store = EtcdDcStore::connect(&backend.endpoints, &prefix)
                .await
                .expect("connect");
            stores.push(Arc::new(store));
        }
        let started = std::time::Instant::now();
        let mut tasks = Vec::new();
        for (s, store) in stores.iter().enumerate() {
            for w in 0..WRITERS_PER_STORE {
                let store = store.clone();
                tasks.push(tokio::spawn(async move {
                    for r in 0..RECORDS_PER_WRITER {
                        let unique = ((s * WRITERS_PER_STORE + w) * RECORDS_PER_WRITER + r) as u64;
                        let id =
                            ReservationId::new(homing_core::DcId::new("iad").unwrap(), unique + 1);
                        let key =
                            Key::new(homing_core::KeyName::new(format!("k{unique}")).unwrap());
                        let created = conformance::record(&id, &key);
                        let cas = store.compare_and_set(None, &created).await.unwrap();
                        assert_eq!(cas, Cas::Written);
                        let released = created
                            .release(
                                created.token,
                                homing_core::RunOutcome::Ok,
                                homing_core::StoreTime::from_ms(1),
                            )
                            .next
                            .unwrap();
                        let cas = store.compare_and_set(Some(1), &released).await.unwrap();
                        assert_eq!(cas, Cas::Written);
                    }
                }));
            }
        }
        for t in tasks {
            t.await.unwrap();
        }
        let writes = 2 * 2 * WRITERS_PER_STORE * RECORDS_PER_WRITER;
        println!(
            "etcd: {writes} event-appending writes from two stores in {} ms",
            started.elapsed().as_millis()
        );
        let page = stores[0].events(0, crate::EVENTS_LIMIT_MAX).await.unwrap();
        let seqs: Vec<EventSeq> = page.events.iter().map(|e| e.seq).collect();
        let want: Vec<EventSeq> = (1..=writes as u64).collect();
        assert_eq!(seqs, want);
        assert_eq!(page.head, writes as u64);
        let mut changes: Vec<_> = page
            .events
            .iter()
            .map(|e| (e.reservation.clone(), e.kind.name()))
            .collect();
        changes.sort();
        changes.dedup();
        assert_eq!(changes.len(), writes, "each change once");
    }
}
