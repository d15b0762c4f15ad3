//! The hi-lo reservation allocator: a DC store persists a high-water mark
//! (exclusive) before handing out any unique below it, then serves uniques
//! from memory until the block is used up. After a crash the unused rest of
//! the block is skipped, never reused: uniques are unique, not dense.

use crate::error::StoreError;

/// Uniques reserved per persisted high-water mark: one durable write per this many allocations.
pub const ALLOCATOR_BLOCK_IDS: u64 = 1024;

/// The in-memory side of the allocator: the next unique and the persisted bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blocks {
    next: u64,
    high_water: u64,
}

impl Blocks {
    /// Resumes from the persisted high-water mark (0 when none was ever
    /// persisted): everything below it may have been handed out before.
    pub fn resume(high_water: u64) -> Blocks {
        Blocks {
            next: high_water.max(1),
            high_water,
        }
    }

    /// The next unique, if the current block has one left.
    pub fn take(&mut self) -> Option<u64> {
        if self.next < self.high_water {
            let unique = self.next;
            self.next += 1;
            Some(unique)
        } else {
            None
        }
    }

    /// The high-water mark to persist for the next block.
    pub fn next_high_water(&self) -> Result<u64, StoreError> {
        self.next
            .checked_add(ALLOCATOR_BLOCK_IDS)
            .ok_or(StoreError::AllocatorExhausted)
    }

    /// Records that `high_water` is durable; uniques below it may now be served.
    pub fn granted(&mut self, high_water: u64) {
        assert!(
            high_water > self.high_water,
            "allocator high-water mark went down"
        );
        self.next = self.next.max(self.high_water).max(1);
        self.high_water = high_water;
    }

    /// Persisted high-water mark seen from another writer (etcd/FDB counter
    /// moved under us): continue from there.
    pub fn jump_to(&mut self, persisted: u64) {
        if persisted > self.next {
            self.next = persisted;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_serves_a_block_only_after_it_is_persisted() {
        let mut b = Blocks::resume(0);
        assert_eq!(b.take(), None);
        let hw = b.next_high_water().unwrap();
        b.granted(hw);
        assert_eq!(b.take(), Some(1));
        assert_eq!(b.take(), Some(2));
    }

    #[test]
    fn allocator_after_reopen_skips_the_rest_of_the_block() {
        let mut b = Blocks::resume(1025);
        assert_eq!(b.take(), None);
        let hw = b.next_high_water().unwrap();
        b.granted(hw);
        assert_eq!(b.take(), Some(1025));
    }
}
