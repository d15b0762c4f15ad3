//! How keys, reservation IDs and records become store bytes, shared by every
//! byte-keyed backend so that all of them order and page scans identically.
//!
//! A key is encoded as two tuple-style components, namespace then name: each
//! component is its bytes with `0x00` escaped as `0x00 0xFF`, then a `0x00`
//! terminator. So no namespace's encoding is a prefix of another's (no
//! collisions, whatever `/` or unicode they contain), byte order equals
//! `Key`'s order, and "namespace `ns`, name starting with `p`" is one byte prefix.
//! A record's scan key appends the reservation's DC as a component and its
//! unique as 8 big-endian bytes, so byte order is `(Key, ReservationId)` order.

use homing_core::{
    BadRecord, DcRecord, Due, DueCursor, DueKind, DuePage, Event, EventSeq, Key, KeyName,
    Namespace, NamespaceScope, RecordState, ReservationId, ScanCursor, StoreTime, wire,
};

use crate::error::StoreError;
use crate::setting::Setting;

/// Largest encoded record a backend accepts, in bytes: one wire frame, so a
/// record can always be shipped to a peer.
pub const RECORD_BYTES_MAX: usize = wire::FRAME_BYTES_MAX;

const ESCAPE: u8 = 0xFF;

fn push_escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(ESCAPE);
        }
    }
}

fn push_component(out: &mut Vec<u8>, bytes: &[u8]) {
    push_escaped(out, bytes);
    out.push(0);
}

/// The store key of a global entry (and the leading part of a record's scan key).
pub fn key_bytes(key: &Key) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.namespace.as_str().len() + key.name.as_str().len() + 2);
    push_component(&mut out, key.namespace.as_str().as_bytes());
    push_component(&mut out, key.name.as_str().as_bytes());
    out
}

/// Splits one escaped, terminated component off the front of `bytes`:
/// `(component, rest)`, or `None` when no terminator ends it.
fn split_component(bytes: &[u8]) -> Option<(Vec<u8>, &[u8])> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match (bytes[i], bytes.get(i + 1)) {
            (0, Some(&ESCAPE)) => {
                out.push(0);
                i += 2;
            }
            (0, _) => return Some((out, &bytes[i + 1..])),
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    None
}

/// Parses the store key of a global entry back into its [`Key`] (the inverse
/// of [`key_bytes`]); bytes that are not exactly one valid key are `Corrupt`.
pub fn decode_key(bytes: &[u8]) -> Result<Key, StoreError> {
    let corrupt = |reason: &str| StoreError::corrupt("key", reason);
    let (namespace, rest) = split_component(bytes).ok_or_else(|| corrupt("no namespace"))?;
    let (name, rest) = split_component(rest).ok_or_else(|| corrupt("no name"))?;
    if !rest.is_empty() {
        return Err(corrupt("bytes after the name"));
    }
    let text = |b: Vec<u8>| String::from_utf8(b).map_err(|e| StoreError::corrupt("key", e));
    let namespace = Namespace::new(text(namespace)?).map_err(|e| StoreError::corrupt("key", e))?;
    let name = KeyName::new(text(name)?).map_err(|e| StoreError::corrupt("key", e))?;
    Ok(Key::in_namespace(namespace, name))
}

/// The scan-index key of a record: its key, then its reservation ID.
pub fn record_scan_bytes(key: &Key, id: &ReservationId) -> Vec<u8> {
    let mut out = key_bytes(key);
    push_component(&mut out, id.dc().as_str().as_bytes());
    out.extend_from_slice(&id.unique().to_be_bytes());
    out
}

/// The byte prefixes whose records make up `scope` with names starting with
/// `name_prefix`, in byte order: `namespace` itself, then (with children)
/// every namespace under it — `ns/…` sorts after `ns` and its names, since the
/// terminator `0x00` sorts below `/`. The whole-tree scope is one empty prefix.
pub fn scope_prefixes(scope: &NamespaceScope, name_prefix: &str) -> Vec<Vec<u8>> {
    let namespace = scope.namespace.as_str().as_bytes();
    if scope.include_children && namespace.is_empty() {
        return vec![Vec::new()];
    }
    let mut exact = Vec::new();
    push_component(&mut exact, namespace);
    push_escaped(&mut exact, name_prefix.as_bytes());
    if !scope.include_children {
        return vec![exact];
    }
    let mut children = Vec::new();
    push_escaped(&mut children, namespace);
    children.push(b'/');
    vec![exact, children]
}

/// The smallest byte string greater than every string starting with
/// `prefix`, or `None` when no such bound exists (empty or all-`0xFF` prefix).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// The smallest byte string strictly greater than `bytes`.
pub fn successor(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 1);
    out.extend_from_slice(bytes);
    out.push(0);
    out
}

/// Where a global-entry scan strictly after `after` starts, before a
/// backend's section prefix: byte order is key order, so the successor of
/// `after`'s bytes is the smallest key strictly after it (empty: the start).
pub fn global_scan_start(after: Option<&Key>) -> Vec<u8> {
    after.map_or_else(Vec::new, |k| successor(&key_bytes(k)))
}

/// The stored form of a reservation ID: its canonical text.
pub fn id_bytes(id: &ReservationId) -> Vec<u8> {
    id.to_string().into_bytes()
}

/// Parses a stored reservation ID.
pub fn decode_id(bytes: &[u8]) -> Result<ReservationId, StoreError> {
    let text = std::str::from_utf8(bytes).map_err(|e| StoreError::corrupt("reservation id", e))?;
    text.parse()
        .map_err(|e| StoreError::corrupt("reservation id", e))
}

/// The first byte of a record stored since active leases carry their lease
/// key and previous run. A record stored before records carried a shortcut
/// starts with its reservation ID's length (at most 53, below 0x80), so the
/// formats never mix up.
const RECORD_FORMAT_LEASE_KEY: u8 = 0x83;
/// The first byte of a record stored with a shortcut but no lease key: read, never written.
const RECORD_FORMAT_SHORTCUT: u8 = 0x82;

/// A record's state as stored before lease keys: read, never written.
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
enum StateBeforeLeaseKey {
    Active {
        actor: homing_core::ActorId,
        expires_at: homing_core::StoreTime,
    },
    Released {
        at: homing_core::StoreTime,
        cause: homing_core::ReleaseCause,
    },
    Linked {
        to: homing_core::ReservationId,
    },
    Abandoned,
}

impl From<StateBeforeLeaseKey> for RecordState {
    /// A lease granted before lease keys has none: no host can present it,
    /// so it ends by expiry (or an operator's force release).
    fn from(state: StateBeforeLeaseKey) -> RecordState {
        match state {
            StateBeforeLeaseKey::Active { actor, expires_at } => RecordState::Active {
                actor,
                expiry: homing_core::Expiry::At(expires_at),
                lease: None,
                previous: None,
            },
            StateBeforeLeaseKey::Released { at, cause } => RecordState::Released { at, cause },
            StateBeforeLeaseKey::Linked { to } => RecordState::Linked { to },
            StateBeforeLeaseKey::Abandoned => RecordState::Abandoned,
        }
    }
}

/// A record as stored with a shortcut, before lease keys: read, never written.
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct RecordBeforeLeaseKey {
    id: homing_core::ReservationId,
    key: homing_core::Key,
    tag: Option<homing_core::Tag>,
    token: homing_core::FencingToken,
    allow_renew: bool,
    predecessor: Option<homing_core::ReservationId>,
    state: StateBeforeLeaseKey,
    shortcut: Option<Box<homing_core::Shortcut>>,
    version: u64,
}

/// A record as stored before the shortcut field: read, never written.
#[derive(serde::Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct RecordBeforeShortcut {
    id: homing_core::ReservationId,
    key: homing_core::Key,
    tag: Option<homing_core::Tag>,
    token: homing_core::FencingToken,
    allow_renew: bool,
    predecessor: Option<homing_core::ReservationId>,
    state: StateBeforeLeaseKey,
    version: u64,
}

impl From<RecordBeforeLeaseKey> for DcRecord {
    fn from(old: RecordBeforeLeaseKey) -> DcRecord {
        DcRecord {
            id: old.id,
            key: old.key,
            tag: old.tag,
            token: old.token,
            allow_renew: old.allow_renew,
            predecessor: old.predecessor,
            state: old.state.into(),
            shortcut: old.shortcut,
            version: old.version,
        }
    }
}

impl From<RecordBeforeShortcut> for DcRecord {
    fn from(old: RecordBeforeShortcut) -> DcRecord {
        DcRecord::from(RecordBeforeLeaseKey {
            id: old.id,
            key: old.key,
            tag: old.tag,
            token: old.token,
            allow_renew: old.allow_renew,
            predecessor: old.predecessor,
            state: old.state,
            shortcut: None,
            version: old.version,
        })
    }
}

/// The format byte of a stored DC entry (lease terms, marks, retired).
const DC_ENTRY_FORMAT: u8 = 0x01;

/// Encodes what a store keeps about one DC (a format byte, then postcard).
pub fn encode_dc_entry(entry: &crate::dc_lease::DcEntry) -> Vec<u8> {
    let bytes = wire::encode(entry).expect("a DC entry is a few dozen bytes");
    [&[DC_ENTRY_FORMAT][..], &bytes].concat()
}

/// Decodes a stored DC entry.
pub fn decode_dc_entry(bytes: &[u8]) -> Result<crate::dc_lease::DcEntry, StoreError> {
    match bytes.split_first() {
        Some((&DC_ENTRY_FORMAT, rest)) => {
            wire::decode(rest).map_err(|e| StoreError::corrupt("dc entry", e))
        }
        _ => Err(StoreError::corrupt(
            "dc entry",
            format!("unknown format byte {:?}", bytes.first()),
        )),
    }
}

/// The DC a key of a DC lease section names (`<section><dc id>`).
pub fn decode_dc_key(section: &[u8], key: &[u8]) -> Result<homing_core::DcId, StoreError> {
    let rest = key
        .strip_prefix(section)
        .ok_or_else(|| StoreError::corrupt("dc key", "key outside its section"))?;
    let name = std::str::from_utf8(rest).map_err(|e| StoreError::corrupt("dc key", e))?;
    homing_core::DcId::new(name).map_err(|e| StoreError::corrupt("dc key", e))
}

/// Ends a DC's id in a succession key: a byte no [`homing_core::DcId`]
/// holds (`[a-z0-9-]`) and below all of them, so one DC's successions are
/// one range and byte order across DCs is DC id order.
const SUCCESSION_DC_END: u8 = 0x00;

/// The store key of the succession of `from`: its DC's id, a `0x00`, then
/// its unique as 8 big-endian bytes. Byte order is `(dc, unique)` order.
pub fn succession_key(from: &ReservationId) -> Vec<u8> {
    let dc = from.dc().as_str().as_bytes();
    let mut out = Vec::with_capacity(dc.len() + 9);
    out.extend_from_slice(dc);
    out.push(SUCCESSION_DC_END);
    out.extend_from_slice(&from.unique().to_be_bytes());
    out
}

/// The reservation a succession key names (the inverse of
/// [`succession_key`]); other bytes are `Corrupt`.
pub fn decode_succession_key(bytes: &[u8]) -> Result<ReservationId, StoreError> {
    let corrupt = |reason: String| StoreError::corrupt("succession key", reason);
    let (head, unique) = bytes
        .split_last_chunk::<8>()
        .ok_or_else(|| corrupt("shorter than a unique".into()))?;
    let dc = match head.split_last() {
        Some((&SUCCESSION_DC_END, dc)) => dc,
        _ => return Err(corrupt("no end after the dc id".into())),
    };
    let dc = std::str::from_utf8(dc).map_err(|e| corrupt(e.to_string()))?;
    let dc = homing_core::DcId::new(dc).map_err(|e| corrupt(e.to_string()))?;
    Ok(ReservationId::new(dc, u64::from_be_bytes(*unique)))
}

/// A byte range `[start, end)`.
pub type KeyRange = (Vec<u8>, Vec<u8>);

/// Where a scan of every DC's successions strictly after `after`'s starts,
/// before a backend's section prefix: byte order is `(dc, unique)` order,
/// so the successor of `after`'s key is the smallest key strictly after it
/// (empty: the start).
pub fn successions_scan_start(after: Option<&ReservationId>) -> Vec<u8> {
    after.map_or_else(Vec::new, |id| successor(&succession_key(id)))
}

/// The key range `[start, end)` of `dc`'s successions strictly after
/// `after`; `None` when nothing can follow it (its unique is `u64::MAX`).
/// A cursor of another DC is the caller's bug: `InvalidArgument`.
pub fn successions_range(
    dc: &homing_core::DcId,
    after: Option<&ReservationId>,
) -> Result<Option<KeyRange>, StoreError> {
    let start = match after {
        Some(after) if after.dc() != dc => {
            return Err(StoreError::InvalidArgument(format!(
                "cursor {after} is not a reservation of dc {dc}"
            )));
        }
        Some(after) => match after.unique().checked_add(1) {
            Some(next) => next,
            None => return Ok(None),
        },
        None => 0,
    };
    let start = succession_key(&ReservationId::new(dc.clone(), start));
    let mut end = dc.as_str().as_bytes().to_vec();
    end.push(SUCCESSION_DC_END + 1);
    Ok(Some((start, end)))
}

/// The format byte of a stored succession.
const SUCCESSION_FORMAT: u8 = 0x01;

/// Encodes a succession (a format byte, then postcard).
pub fn encode_succession(succession: &homing_core::Succession) -> Vec<u8> {
    // Invariant: two reservation ids, a token and a cause: far below a frame.
    let bytes = wire::encode(succession).expect("a succession is under a hundred bytes");
    [&[SUCCESSION_FORMAT][..], &bytes].concat()
}

/// Decodes the succession stored under `from`'s key; one that does not
/// decode, or names another reservation, is `Corrupt`.
pub fn decode_succession(
    from: &ReservationId,
    bytes: &[u8],
) -> Result<homing_core::Succession, StoreError> {
    let succession: homing_core::Succession = match bytes.split_first() {
        Some((&SUCCESSION_FORMAT, rest)) => {
            wire::decode(rest).map_err(|e| StoreError::corrupt("succession", e))?
        }
        _ => {
            return Err(StoreError::corrupt(
                "succession",
                format!("unknown format byte {:?}", bytes.first()),
            ));
        }
    };
    if &succession.link.from != from {
        return Err(StoreError::corrupt(
            "succession",
            format!("stored under {from} but of {}", succession.link.from),
        ));
    }
    Ok(succession)
}

/// The store key of a deployment setting within a backend's settings
/// section (redb: its `settings` table): the setting's name. Its value is
/// stored as the caller gave it: the store reads no format into it.
pub fn setting_key(setting: Setting) -> &'static [u8] {
    setting.name().as_bytes()
}

/// Encodes a record (a format byte, then postcard), refusing one above
/// [`RECORD_BYTES_MAX`].
pub fn encode_record(record: &DcRecord) -> Result<Vec<u8>, StoreError> {
    match wire::encode(record) {
        Ok(bytes) => Ok([&[RECORD_FORMAT_LEASE_KEY][..], &bytes].concat()),
        Err(e) => Err(stored_frame_error("record", e)),
    }
}

/// [`encode_record`]'s refusal, if any, without the encoding (the memory
/// backend keeps records decoded, under the same size limit).
pub fn check_record(record: &DcRecord) -> Result<(), StoreError> {
    wire::encoded_len(record)
        .map(drop)
        .map_err(|e| stored_frame_error("record", e))
}

/// A value that cannot be stored: too large, or not encodable.
fn stored_frame_error(what: &'static str, e: wire::FrameError) -> StoreError {
    match e {
        wire::FrameError::TooLarge { len, max } => StoreError::TooLarge { bytes: len, max },
        e => StoreError::corrupt(what, e),
    }
}

/// Decodes a stored record, of any format.
pub fn decode_record(bytes: &[u8]) -> Result<DcRecord, StoreError> {
    let corrupt = |e| StoreError::corrupt("record", e);
    match bytes.split_first() {
        Some((&RECORD_FORMAT_LEASE_KEY, rest)) => wire::decode(rest).map_err(corrupt),
        Some((&RECORD_FORMAT_SHORTCUT, rest)) => wire::decode::<RecordBeforeLeaseKey>(rest)
            .map(DcRecord::from)
            .map_err(corrupt),
        _ => wire::decode::<RecordBeforeShortcut>(bytes)
            .map(DcRecord::from)
            .map_err(corrupt),
    }
}

/// The expiry-index key of `id`'s entry `due`: the kind's tag, the time as 8
/// big-endian bytes, then the id. Byte order is `(kind, at, id)` order, so
/// "kind `k`, due by `t`" is one byte range.
pub fn due_bytes(due: Due, id: &ReservationId) -> Vec<u8> {
    let id = id_bytes(id);
    let mut out = Vec::with_capacity(9 + id.len());
    out.push(due.kind.tag());
    out.extend_from_slice(&due.at.as_ms().to_be_bytes());
    out.extend_from_slice(&id);
    out
}

/// The expiry-index range `[start, end)` of entries of `kind` due by
/// `until` (inclusive), strictly after `after` if given.
pub fn due_range(kind: DueKind, until: StoreTime, after: Option<&DueCursor>) -> (Vec<u8>, Vec<u8>) {
    let start = match after {
        Some(after) => {
            let due = Due { kind, at: after.at };
            successor(&due_bytes(due, &after.id))
        }
        None => vec![kind.tag()],
    };
    (start, due_section_end(kind, until))
}

/// The expiry-index range `[start, end)` of entries of `kind` not due by
/// `until`: what [`homing_core::DuePage::pending`] counts.
pub fn due_pending_range(kind: DueKind, until: StoreTime) -> (Vec<u8>, Vec<u8>) {
    (due_section_end(kind, until), vec![kind.tag() + 1])
}

/// [`due_range`] and [`due_pending_range`] under a backend's section
/// `prefix` (etcd, FoundationDB): `[due, pending]`.
pub fn prefixed_due_ranges(
    prefix: &[u8],
    kind: DueKind,
    until: StoreTime,
    after: Option<&DueCursor>,
) -> [(Vec<u8>, Vec<u8>); 2] {
    let under =
        |(start, end): (Vec<u8>, Vec<u8>)| ([prefix, &start].concat(), [prefix, &end].concat());
    [
        under(due_range(kind, until, after)),
        under(due_pending_range(kind, until)),
    ]
}

/// The first key past the entries of `kind` due by `until`.
fn due_section_end(kind: DueKind, until: StoreTime) -> Vec<u8> {
    match until.as_ms().checked_add(1) {
        Some(next) => {
            let mut end = vec![kind.tag()];
            end.extend_from_slice(&next.to_be_bytes());
            end
        }
        None => vec![kind.tag() + 1],
    }
}

/// The cursor just past an expiry-index entry; an entry that is not one
/// `due_bytes` wrote is `Corrupt`.
pub fn decode_due(bytes: &[u8]) -> Result<DueCursor, StoreError> {
    let corrupt = |reason: &str| StoreError::corrupt("expiry index entry", reason);
    let (_, rest) = bytes.split_first().ok_or_else(|| corrupt("empty"))?;
    let (at, id) = rest
        .split_first_chunk::<8>()
        .ok_or_else(|| corrupt("no time"))?;
    Ok(DueCursor {
        at: StoreTime::from_ms(u64::from_be_bytes(*at)),
        id: decode_id(id)?,
    })
}

/// A page of the expiry index from the entries read (index key, the
/// record's stored bytes if any), `limit` entries at most were asked for:
/// undecodable or dangling entries become [`BadRecord`]s, so one bad record
/// never stops a pass. Entries of another kind or not due by the query's
/// bound are never passed in.
pub fn due_page(
    kind: DueKind,
    entries: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    limit: usize,
    pending: u64,
) -> Result<DuePage, StoreError> {
    let full = limit > 0 && entries.len() >= limit;
    let mut page = DuePage::default();
    for (entry, value) in entries {
        let cursor = decode_due(&entry)?;
        let judged = match value {
            None => Err("index entry without a record".to_string()),
            Some(value) => match decode_record(&value) {
                Err(e) => Err(e.to_string()),
                Ok(record) => {
                    let listed = Due {
                        kind,
                        at: cursor.at,
                    };
                    if Due::of(&record) == Some(listed) && record.id == cursor.id {
                        Ok(record)
                    } else {
                        Err(format!(
                            "index entry {kind:?} at {} does not match its record",
                            cursor.at
                        ))
                    }
                }
            },
        };
        match judged {
            Ok(record) => page.records.push(record),
            Err(reason) => page.bad.push(BadRecord {
                entry: cursor.id.to_string(),
                reason,
            }),
        }
        page.next = Some(cursor);
    }
    if full {
        debug_assert!(page.next.is_some());
    } else {
        page.next = None;
        page.pending = pending;
    }
    Ok(page)
}

/// The scan-index byte ranges `[start, end)` of a scan (`end` `None`:
/// unbounded), in byte order, each starting strictly after `after`; ranges
/// wholly before `after` are left out.
pub fn scan_ranges(
    scope: &NamespaceScope,
    name_prefix: &str,
    after: Option<&ScanCursor>,
) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
    let past = after.map(|c| successor(&record_scan_bytes(&c.key, &c.id)));
    scope_prefixes(scope, name_prefix)
        .into_iter()
        .filter_map(|prefix| {
            let end = prefix_end(&prefix);
            let start = match &past {
                Some(past) => past.clone().max(prefix),
                None => prefix,
            };
            match &end {
                Some(end) if &start >= end => None,
                _ => Some((start, end)),
            }
        })
        .collect()
}

/// [`scan_ranges`] for index keys stored under `index_prefix` (a backend's
/// subspace plus its index section), with open ends bounded by the end of
/// that prefix. Empty only if `index_prefix` is empty or all `0xFF`.
pub fn prefixed_scan_ranges(
    index_prefix: &[u8],
    scope: &NamespaceScope,
    name_prefix: &str,
    after: Option<&ScanCursor>,
) -> Vec<(Vec<u8>, Vec<u8>)> {
    let Some(section_end) = prefix_end(index_prefix) else {
        return Vec::new();
    };
    scan_ranges(scope, name_prefix, after)
        .into_iter()
        .map(|(start, end)| {
            let end = match end {
                Some(end) => [index_prefix, &end].concat(),
                None => section_end.clone(),
            };
            ([index_prefix, &start].concat(), end)
        })
        .collect()
}

/// The store key of event `seq` within a backend's event section: 8
/// big-endian bytes, so byte order is log order.
pub fn event_seq_bytes(seq: EventSeq) -> [u8; 8] {
    seq.to_be_bytes()
}

/// Encodes an event (postcard), refusing one above [`RECORD_BYTES_MAX`].
pub fn encode_event(event: &Event) -> Result<Vec<u8>, StoreError> {
    wire::encode(event).map_err(|e| stored_frame_error("event", e))
}

/// [`encode_event`]'s refusal, if any, without the encoding.
pub fn check_event(event: &Event) -> Result<(), StoreError> {
    wire::encoded_len(event)
        .map(drop)
        .map_err(|e| stored_frame_error("event", e))
}

/// Decodes a stored event.
pub fn decode_event(bytes: &[u8]) -> Result<Event, StoreError> {
    wire::decode(bytes).map_err(|e| StoreError::corrupt("event", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, name: &str) -> Key {
        Key::in_namespace(Namespace::new(ns).unwrap(), KeyName::new(name).unwrap())
    }

    /// Data written before records carried a shortcut, and before active
    /// leases carried a lease key, still reads: as records without them (a
    /// lease no host can present, which ends by expiry); records written
    /// now carry theirs.
    #[test]
    fn records_of_every_format_decode() {
        use homing_core::{
            ActorId, FencingToken, HostTime, LeaseKey, LeasePolicy, RecordState, Shortcut,
        };
        let (mut record, _) = DcRecord::reserve(
            "iad.1".parse().unwrap(),
            key("g", "room"),
            None,
            FencingToken::FIRST,
            None,
            &homing_core::Holding {
                actor: ActorId::new("a").unwrap(),
                lease: LeaseKey::from_bytes([1; 16]).unwrap(),
                host_time: HostTime::from_ms(0),
                session: None,
            },
            StoreTime::from_ms(0),
            &LeasePolicy::DEFAULT,
        );
        let old_state = || StateBeforeLeaseKey::Active {
            actor: ActorId::new("a").unwrap(),
            expires_at: StoreTime::from_ms(10_000),
        };
        let mut without_lease_key = record.clone();
        without_lease_key.state = RecordState::Active {
            actor: ActorId::new("a").unwrap(),
            expiry: homing_core::Expiry::At(StoreTime::from_ms(10_000)),
            lease: None,
            previous: None,
        };
        let before_shortcut = RecordBeforeShortcut {
            id: record.id.clone(),
            key: record.key.clone(),
            tag: record.tag.clone(),
            token: record.token,
            allow_renew: record.allow_renew,
            predecessor: record.predecessor.clone(),
            state: old_state(),
            version: record.version,
        };
        let old_bytes = wire::encode(&before_shortcut).unwrap();
        assert!(old_bytes[0] < 0x80);
        assert_eq!(decode_record(&old_bytes).unwrap(), without_lease_key);
        record.shortcut = Some(Box::new(Shortcut {
            to: "fra.9".parse().unwrap(),
            token: FencingToken::new(9),
        }));
        without_lease_key.shortcut = record.shortcut.clone();
        let before_lease_key = RecordBeforeLeaseKey {
            id: record.id.clone(),
            key: record.key.clone(),
            tag: record.tag.clone(),
            token: record.token,
            allow_renew: record.allow_renew,
            predecessor: record.predecessor.clone(),
            state: old_state(),
            shortcut: record.shortcut.clone(),
            version: record.version,
        };
        let old_bytes = [
            &[RECORD_FORMAT_SHORTCUT][..],
            &wire::encode(&before_lease_key).unwrap(),
        ]
        .concat();
        assert_eq!(decode_record(&old_bytes).unwrap(), without_lease_key);
        let bytes = encode_record(&record).unwrap();
        assert_eq!(bytes[0], RECORD_FORMAT_LEASE_KEY);
        assert_eq!(decode_record(&bytes).unwrap(), record);
        assert!(matches!(
            decode_record(&bytes).unwrap().state,
            RecordState::Active { lease: Some(_), .. }
        ));
    }

    #[test]
    fn namespaces_containing_separators_do_not_collide() {
        assert_ne!(key_bytes(&key("a/b", "c")), key_bytes(&key("a", "b/c")));
        assert_ne!(key_bytes(&key("", "ab")), key_bytes(&key("a", "b")));
        let scope = NamespaceScope::exact(Namespace::new("a").unwrap());
        let [p] = scope_prefixes(&scope, "").try_into().unwrap();
        assert!(!key_bytes(&key("ab", "x")).starts_with(&p));
        assert!(key_bytes(&key("a", "x")).starts_with(&p));
    }

    #[test]
    fn a_subtree_is_its_namespace_then_its_children_and_nothing_between() {
        let scope = NamespaceScope::subtree(Namespace::new("g/eu").unwrap());
        let prefixes = scope_prefixes(&scope, "");
        let inside = |k: &Key| prefixes.iter().any(|p| key_bytes(k).starts_with(p));
        assert!(inside(&key("g/eu", "x")));
        assert!(inside(&key("g/eu/lobbies", "x")));
        assert!(inside(&key("g/eu/a/b", "x")));
        assert!(!inside(&key("g/eu-west", "x")));
        assert!(!inside(&key("g/eu!", "x")), "sorts between the two ranges");
        assert!(!inside(&key("g", "eu")));
        assert!(prefixes[0] < prefixes[1]);
        let all = scope_prefixes(&NamespaceScope::everything(), "");
        assert_eq!(all, vec![Vec::<u8>::new()]);
        let default_only = NamespaceScope::exact(Namespace::default());
        let [p] = scope_prefixes(&default_only, "").try_into().unwrap();
        assert!(key_bytes(&key("", "x")).starts_with(&p));
        assert!(!key_bytes(&key("a", "x")).starts_with(&p));
    }

    #[test]
    fn a_cursor_in_the_children_range_skips_the_exact_one() {
        let scope = NamespaceScope::subtree(Namespace::new("g").unwrap());
        let cursor = ScanCursor {
            key: key("g/a", "x"),
            id: "iad.1".parse().unwrap(),
        };
        let ranges = scan_ranges(&scope, "", Some(&cursor));
        assert_eq!(ranges.len(), 1);
        assert!(ranges[0].0 > record_scan_bytes(&cursor.key, &cursor.id));
    }

    #[test]
    fn byte_order_is_key_order() {
        let mut keys = vec![
            key("", "b"),
            key("", "a"),
            key("a", "z"),
            key("", "ab"),
            key("b", "a"),
            key("ab", "a"),
            key("", "ключ"),
        ];
        let mut by_bytes = keys.clone();
        keys.sort();
        by_bytes.sort_by_key(key_bytes);
        assert_eq!(keys, by_bytes);
    }

    #[test]
    fn scan_order_puts_numeric_uniques_in_numeric_order() {
        let k = key("", "room");
        let id = |t: &str| t.parse::<ReservationId>().unwrap();
        assert!(record_scan_bytes(&k, &id("iad.9")) < record_scan_bytes(&k, &id("iad.10")));
        assert!(record_scan_bytes(&k, &id("fra.99")) < record_scan_bytes(&k, &id("iad.1")));
    }

    #[test]
    fn key_bytes_decode_back_to_the_key() {
        for k in [
            key("", "a"),
            key("a/b", "c/d"),
            key("ключ", "名前 x"),
            key("ÿ", "ÿÿ"),
        ] {
            assert_eq!(decode_key(&key_bytes(&k)).unwrap(), k);
        }
        assert!(decode_key(b"ns\0").is_err());
        assert!(decode_key(b"ns\0n\0x").is_err());
    }

    fn moved(from: &str, to: &str) -> homing_core::Succession {
        homing_core::Succession::moved(
            from.parse().unwrap(),
            to.parse().unwrap(),
            homing_core::FencingToken::new(3),
        )
    }

    #[test]
    fn succession_keys_order_by_dc_then_unique_and_one_dc_is_one_range() {
        let ids = [
            "iad.0",
            "iad.9",
            "iad.10",
            "iad.256",
            "iad.18446744073709551615",
            "iad-2.1",
            "iad2.1",
            "fra.5",
            "ia.7",
        ];
        let mut ids: Vec<ReservationId> = ids.iter().map(|t| t.parse().unwrap()).collect();
        let mut by_bytes = ids.clone();
        ids.sort_by(|a, b| (a.dc().as_str(), a.unique()).cmp(&(b.dc().as_str(), b.unique())));
        by_bytes.sort_by_key(succession_key);
        assert_eq!(ids, by_bytes);
        // The memory store keeps them in `ReservationId` order: the same.
        let mut by_ord = ids.clone();
        by_ord.sort();
        assert_eq!(by_ord, by_bytes);
        for id in &ids {
            assert_eq!(&decode_succession_key(&succession_key(id)).unwrap(), id);
        }
        let iad = homing_core::DcId::new("iad").unwrap();
        let (start, end) = successions_range(&iad, None).unwrap().unwrap();
        let inside: Vec<String> = ids
            .iter()
            .filter(|id| {
                let k = succession_key(id);
                k >= start && k < end
            })
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            inside,
            [
                "iad.0",
                "iad.9",
                "iad.10",
                "iad.256",
                "iad.18446744073709551615"
            ]
        );
        let after: ReservationId = "iad.10".parse().unwrap();
        let (start, _) = successions_range(&iad, Some(&after)).unwrap().unwrap();
        assert!(start > succession_key(&after));
        assert_eq!(start, succession_key(&"iad.11".parse().unwrap()));
        let last: ReservationId = "iad.18446744073709551615".parse().unwrap();
        assert_eq!(successions_range(&iad, Some(&last)).unwrap(), None);
        // A scan over every DC goes on past a DC's last unique to the next DC.
        assert_eq!(successions_scan_start(None), Vec::<u8>::new());
        let past_last = successions_scan_start(Some(&last));
        assert!(past_last > succession_key(&last));
        assert!(past_last < succession_key(&"iad-2.0".parse().unwrap()));
        assert!(matches!(
            successions_range(&iad, Some(&"fra.1".parse().unwrap())),
            Err(StoreError::InvalidArgument(_))
        ));
    }

    #[test]
    fn successions_round_trip_and_bad_bytes_are_corrupt() {
        let s = moved("iad.4", "fra.9");
        let from = s.link.from.clone();
        let bytes = encode_succession(&s);
        assert_eq!(decode_succession(&from, &bytes).unwrap(), s);
        let other: ReservationId = "iad.5".parse().unwrap();
        assert!(matches!(
            decode_succession(&other, &bytes),
            Err(StoreError::Corrupt { .. })
        ));
        for bad in [&b""[..], &[0x7f, 1, 2][..], &bytes[..bytes.len() - 1]] {
            assert!(matches!(
                decode_succession(&from, bad),
                Err(StoreError::Corrupt { .. })
            ));
        }
        for bad in [
            &b"iad"[..],
            &b"iad\x01\0\0\0\0\0\0\0\x01"[..],
            &[0xff, 0, 0, 0, 0, 0, 0, 0, 0, 1][..],
        ] {
            assert!(matches!(
                decode_succession_key(bad),
                Err(StoreError::Corrupt { .. })
            ));
        }
    }

    #[test]
    fn prefix_end_bounds_the_prefix() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[b'a', 0xFF]), Some(b"b".to_vec()));
        assert_eq!(prefix_end(&[0xFF]), None);
        assert_eq!(prefix_end(b""), None);
    }
}
