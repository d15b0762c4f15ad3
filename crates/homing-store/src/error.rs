//! `StoreError`: every way a store operation fails, split by what the caller
//! does about it (retry later, fix its own bug, page an operator).

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The backend cannot be reached or is shutting down; the operation may or
    /// may not have been applied. Retry later (operations are idempotent on retry:
    /// `set_if_absent` returns `Exists(own id)`, CAS returns `Conflict` with the
    /// record as written).
    #[error("{backend} store unavailable: {reason}")]
    Unavailable {
        /// Which backend.
        backend: &'static str,
        /// What the backend said.
        reason: String,
    },
    /// The backend failed in a way a retry will not fix (I/O error, refused request).
    #[error("{backend} store failed: {reason}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// What the backend said.
        reason: String,
    },
    /// Stored bytes do not decode: the store was written by something else or damaged.
    #[error("corrupt {what} in store: {reason}")]
    Corrupt {
        /// What was being decoded.
        what: &'static str,
        /// Why it failed.
        reason: String,
    },
    /// Caller bug: a compare-and-set whose new version is not `expected + 1`
    /// (or 1 for a create). Nothing was written.
    #[error("record version {got} does not follow expected version {expected:?}")]
    InvalidVersion {
        /// The version the caller expected to replace.
        expected: Option<u64>,
        /// The version of the record it tried to write.
        got: u64,
    },
    /// Caller bug: a compare-and-set that changes a record's key. Nothing was written.
    #[error("record {id} may not change its key")]
    KeyChanged {
        /// The reservation.
        id: homing_core::ReservationId,
    },
    /// A record encodes to more bytes than a store value may hold.
    #[error("encoded record is {bytes} bytes, more than the {max} allowed")]
    TooLarge {
        /// Encoded length.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// Caller bug: a setting value above [`crate::SETTING_BYTES_MAX`].
    /// Nothing was written.
    #[error("a value of setting {setting} is {bytes} bytes, more than the {max} allowed")]
    SettingTooLarge {
        /// The setting.
        setting: crate::Setting,
        /// The value's length.
        bytes: usize,
        /// The limit.
        max: usize,
    },
    /// A batch (`get_many` keys, `scan` limit) is larger than the store's bound.
    #[error("batch of {len} exceeds the maximum of {max}")]
    BatchTooLarge {
        /// Requested size.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Caller bug: a scan that cannot be served as asked. Nothing was read.
    #[error("invalid scan: {reason}")]
    InvalidScan {
        /// What was wrong.
        reason: String,
    },
    /// Caller bug: a request that cannot be served as asked (a succession
    /// written through the wrong call, a cursor of another DC). Nothing
    /// was read or written.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// Caller bug: a record joining a host session (or freezing in one)
    /// was written without checking its session row
    /// ([`crate::DcStore::compare_and_set_in_session`]). Nothing was written.
    #[error("record {id} joins or freezes in session {session}: write it with its session's guard")]
    SessionGuardMissing {
        /// The record.
        id: homing_core::ReservationId,
        /// Its session.
        session: homing_core::SessionId,
    },
    /// The allocator ran out of `u64` uniques (never expected in practice).
    #[error("reservation allocator exhausted")]
    AllocatorExhausted,
}

impl StoreError {
    /// `Corrupt` for bytes of `what` that failed to decode.
    pub(crate) fn corrupt(what: &'static str, reason: impl std::fmt::Display) -> StoreError {
        StoreError::Corrupt {
            what,
            reason: reason.to_string(),
        }
    }

    /// Whether the backend could not be reached (retry later), not refused.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, StoreError::Unavailable { .. })
    }

    /// A copy of this error for each caller of a failed group or batch of
    /// `backend`: a retryable error stays retryable, any other becomes
    /// `Backend` with its message.
    #[cfg(any(feature = "etcd", feature = "fdb", test))]
    pub(crate) fn for_each_caller(&self, backend: &'static str) -> StoreError {
        match self {
            StoreError::Unavailable { backend, reason } => StoreError::Unavailable {
                backend,
                reason: reason.clone(),
            },
            e => StoreError::Backend {
                backend,
                reason: e.to_string(),
            },
        }
    }
}
