//! An operator's `Scan` (and `DrainScope`) pages through a DC's records in
//! `(key, id)` order: how many records a page carries and where the next
//! page starts, decided once for homingd and the simulator.

use homing_core::{DcRecord, ScanCursor};

/// Records per `Scan` page (and per `Inspect` answer): a record encodes to
/// at most about 1 KiB, so this keeps the reply inside one 64 KiB frame.
pub const SCAN_PAGE_RECORDS: usize = 48;

/// Where the page after `records` (read with `limit`) starts: after its
/// last record if the page is full, `None` when it was the last.
pub fn next_cursor(records: &[DcRecord], limit: usize) -> Option<ScanCursor> {
    if records.len() == limit {
        records.last().map(ScanCursor::after)
    } else {
        None
    }
}
