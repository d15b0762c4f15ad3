//! The open redb database that a store's readers and its writer thread
//! share, and opening it again after an I/O error.
//!
//! redb latches a failed write, resize or fsync (a full disk, say): from
//! then on every write transaction of that `Database` fails with
//! `PreviousIo` ("Please close and re-open the database"), even once the
//! disk has room again. So the writer thread, when a group's commit fails
//! with a storage error ([`needs_reopen`]), answers that group's callers
//! with the error (nothing of the group was acknowledged), closes the file
//! ([`DbFile::close`]) and opens it again ([`DbFile::try_reopen`]), pausing
//! between attempts from [`REOPEN_PAUSE_MS_FIRST`] doubling up to
//! [`REOPEN_PAUSE_MS_MAX`], until it opens. It does not give up after a
//! number of attempts: a disk stays full as long as it stays full, and a
//! store that stopped trying would need the restart this exists to spare.
//! While the file is closed, reads, writes and [`DbFile::health`] fail at
//! once with `Unavailable`, naming the error that closed it.

use std::sync::{Arc, PoisonError, RwLock};

use redb::Database;

use crate::error::StoreError;

/// Pause after the first failed attempt to reopen, ms.
pub(crate) const REOPEN_PAUSE_MS_FIRST: u64 = 10;
/// Longest pause between two attempts to reopen, ms: once the disk has
/// room, the store serves again within about this long.
pub(crate) const REOPEN_PAUSE_MS_MAX: u64 = 1_000;

/// Opens the store's database (again).
pub(crate) type Open = Box<dyn Fn() -> Result<Database, redb::DatabaseError> + Send + Sync>;

/// The store's database while it is open, or why it is closed.
enum State {
    Open(Arc<Database>),
    Closed { cause: String },
}

/// A redb database that its writer can close and open again.
pub(crate) struct DbFile {
    open: Open,
    state: RwLock<State>,
}

impl DbFile {
    /// Opens the database with `open`, which [`DbFile::try_reopen`] calls again.
    pub(crate) fn new(open: Open) -> Result<DbFile, redb::DatabaseError> {
        let db = open()?;
        Ok(DbFile {
            open,
            state: RwLock::new(State::Open(Arc::new(db))),
        })
    }

    /// The database to read or write now; `Unavailable` while it is closed.
    pub(crate) fn database(&self) -> Result<Arc<Database>, StoreError> {
        // A panic while holding the lock leaves the state whole (every
        // write of it is one assignment).
        match &*self.state.read().unwrap_or_else(PoisonError::into_inner) {
            State::Open(db) => Ok(db.clone()),
            State::Closed { cause } => Err(closed(cause)),
        }
    }

    /// `Ok` while the database is open; else why not.
    pub(crate) fn health(&self) -> Result<(), StoreError> {
        self.database().map(drop)
    }

    /// Closes the database after `cause`, an I/O error: from now on every
    /// caller is answered `Unavailable` until [`DbFile::try_reopen`] opens
    /// it. The file itself closes when the last reader in flight drops its
    /// handle.
    pub(crate) fn close(&self, cause: String) {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        *state = State::Closed { cause };
    }

    /// One attempt to open the closed database again; the database, now
    /// open for every caller. It fails while a reader still holds the old
    /// handle (`DatabaseAlreadyOpen`) or while redb cannot repair the file
    /// (the disk still full).
    pub(crate) fn try_reopen(&self) -> Result<Arc<Database>, redb::DatabaseError> {
        let db = Arc::new((self.open)()?);
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        *state = State::Open(db.clone());
        Ok(db)
    }
}

/// Whether `e` leaves redb refusing every later operation until the
/// database is opened again: an I/O error, one latched before, or a
/// storage backend's own failure.
pub(crate) fn needs_reopen(e: &redb::Error) -> bool {
    matches!(
        e,
        redb::Error::Io(_) | redb::Error::PreviousIo | redb::Error::Backend(_)
    )
}

/// What a caller is answered while `cause` keeps the database closed.
pub(crate) fn closed(cause: &str) -> StoreError {
    StoreError::Unavailable {
        backend: "redb",
        reason: format!(
            "refusing reads and writes since an I/O error ({cause}); reopening the file"
        ),
    }
}
