//! The trace of a run: one compact record per processed event, hashed with
//! FNV-1a into the run's fingerprint (same seed ⇒ same hash), kept in a
//! bounded ring for the short per-key trace a violation prints, and printed
//! in full by `replay`.

use std::collections::VecDeque;

/// Records kept for violation reports.
pub const TRACE_RING_MAX: usize = 1 << 16;

/// No key involved.
pub const NO_KEY: u32 = u32::MAX;

/// One processed event, compactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRecord {
    /// Index of the event in the run.
    pub index: u64,
    /// True time, µs.
    pub at_us: u64,
    /// What happened.
    pub what: &'static str,
    /// The node it happened at (`dc:iad`-style index encoding, see `node_label`).
    pub node: u32,
    /// The key concerned, or [`NO_KEY`].
    pub key: u32,
    /// A detail: RPC id, task id, token…
    pub detail: u64,
}

/// The FNV-1a offset basis.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The running hash and the ring of recent records.
#[derive(Debug)]
pub struct Trace {
    hash: u64,
    ring: VecDeque<TraceRecord>,
}

impl Default for Trace {
    fn default() -> Trace {
        Trace {
            hash: FNV_OFFSET,
            ring: VecDeque::with_capacity(TRACE_RING_MAX),
        }
    }
}

fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    hash
}

impl Trace {
    /// Adds a record to the hash and the ring.
    pub fn push(&mut self, record: TraceRecord) {
        let mut h = self.hash;
        h = fnv(h, &record.index.to_le_bytes());
        h = fnv(h, &record.at_us.to_le_bytes());
        h = fnv(h, record.what.as_bytes());
        h = fnv(h, &record.node.to_le_bytes());
        h = fnv(h, &record.key.to_le_bytes());
        h = fnv(h, &record.detail.to_le_bytes());
        self.hash = h;
        if self.ring.len() == TRACE_RING_MAX {
            self.ring.pop_front();
        }
        self.ring.push_back(record);
    }

    /// The hash of every record pushed so far.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The last `n` records concerning `key` (all records if `key` is [`NO_KEY`]).
    pub fn last_for_key(&self, key: u32, n: usize) -> Vec<TraceRecord> {
        let mut out: Vec<TraceRecord> = self
            .ring
            .iter()
            .rev()
            .filter(|r| key == NO_KEY || r.key == key)
            .take(n)
            .copied()
            .collect();
        out.reverse();
        out
    }
}
