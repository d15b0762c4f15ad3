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

use homing_core::{DcRecord, Key, Namespace, ReservationId, wire};

use crate::dc::ScanCursor;
use crate::error::StoreError;

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

/// The scan-index key of a record: its key, then its reservation ID.
pub fn record_scan_bytes(key: &Key, id: &ReservationId) -> Vec<u8> {
    let mut out = key_bytes(key);
    push_component(&mut out, id.dc().as_str().as_bytes());
    out.extend_from_slice(&id.unique().to_be_bytes());
    out
}

/// The byte prefix of every record whose key is in `namespace` and whose name
/// starts with `name_prefix`; empty (everything) for the empty namespace and
/// the empty prefix, as [`crate::DcStore::scan`] specifies.
pub fn scan_prefix(namespace: &Namespace, name_prefix: &str) -> Vec<u8> {
    if namespace.as_str().is_empty() && name_prefix.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    push_component(&mut out, namespace.as_str().as_bytes());
    push_escaped(&mut out, name_prefix.as_bytes());
    out
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

/// Encodes a record (postcard), refusing one above [`RECORD_BYTES_MAX`].
pub fn encode_record(record: &DcRecord) -> Result<Vec<u8>, StoreError> {
    match wire::encode(record) {
        Ok(bytes) => Ok(bytes),
        Err(wire::FrameError::TooLarge { len, max }) => {
            Err(StoreError::TooLarge { bytes: len, max })
        }
        Err(e) => Err(StoreError::corrupt("record", e)),
    }
}

/// Decodes a stored record.
pub fn decode_record(bytes: &[u8]) -> Result<DcRecord, StoreError> {
    wire::decode(bytes).map_err(|e| StoreError::corrupt("record", e))
}

/// The scan-index byte range `[start, end)` of a scan (`end` `None`: unbounded).
pub fn scan_range(
    namespace: &Namespace,
    name_prefix: &str,
    after: Option<&ScanCursor>,
) -> (Vec<u8>, Option<Vec<u8>>) {
    let prefix = scan_prefix(namespace, name_prefix);
    let end = prefix_end(&prefix);
    let start = match after {
        Some(c) => {
            let past = successor(&record_scan_bytes(&c.key, &c.id));
            past.max(prefix)
        }
        None => prefix,
    };
    (start, end)
}

/// [`scan_range`] for index keys stored under `index_prefix` (a backend's
/// subspace plus its index section), with the open end bounded by the end of
/// that prefix. `None` only if `index_prefix` is empty or all `0xFF`.
pub fn prefixed_scan_range(
    index_prefix: &[u8],
    namespace: &Namespace,
    name_prefix: &str,
    after: Option<&ScanCursor>,
) -> Option<(Vec<u8>, Vec<u8>)> {
    let (start, end) = scan_range(namespace, name_prefix, after);
    let end = match end {
        Some(end) => [index_prefix, &end].concat(),
        None => prefix_end(index_prefix)?,
    };
    Some(([index_prefix, &start].concat(), end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use homing_core::KeyName;

    fn key(ns: &str, name: &str) -> Key {
        Key::in_namespace(Namespace::new(ns).unwrap(), KeyName::new(name).unwrap())
    }

    #[test]
    fn namespaces_containing_separators_do_not_collide() {
        assert_ne!(key_bytes(&key("a/b", "c")), key_bytes(&key("a", "b/c")));
        assert_ne!(key_bytes(&key("", "ab")), key_bytes(&key("a", "b")));
        let p = scan_prefix(&Namespace::new("a").unwrap(), "");
        assert!(!key_bytes(&key("ab", "x")).starts_with(&p));
        assert!(key_bytes(&key("a", "x")).starts_with(&p));
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
    fn prefix_end_bounds_the_prefix() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[b'a', 0xFF]), Some(b"b".to_vec()));
        assert_eq!(prefix_end(&[0xFF]), None);
        assert_eq!(prefix_end(b""), None);
    }
}
