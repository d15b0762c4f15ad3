//! A redb file on a disk that a test can fill: while the disk is full,
//! every write, resize and fsync fails as a full disk's does
//! (`StorageFull`), and reads still work. Tests and drills open a store on
//! it (`RedbDcStore::on_storage`) to see what an I/O error does without
//! filling a real disk.

use std::fs::{File, OpenOptions};
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};

/// Whether the disk under [`FillableFile`]s is full; clones share it.
#[derive(Debug, Clone, Default)]
pub struct FullDisk(Arc<AtomicBool>);

impl FullDisk {
    /// From now on every write fails with `StorageFull`.
    pub fn fill(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Writes succeed again.
    pub fn free(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    /// Whether writes fail now.
    pub fn is_full(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    fn check(&self) -> Result<(), std::io::Error> {
        if self.is_full() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "no space left on device (a filled test disk)",
            ));
        }
        Ok(())
    }
}

/// A redb file whose writes fail while its [`FullDisk`] is full; locking
/// and reads are the file's own.
#[derive(Debug)]
pub struct FillableFile {
    file: FileBackend,
    disk: FullDisk,
}

impl FillableFile {
    /// Opens (creating if needed) the file at `path` on `disk`.
    pub fn open(path: &Path, disk: &FullDisk) -> Result<FillableFile, std::io::Error> {
        let file: File = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        let file = FileBackend::new(file).map_err(std::io::Error::other)?;
        Ok(FillableFile {
            file,
            disk: disk.clone(),
        })
    }
}

impl StorageBackend for FillableFile {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.file.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.disk.check()?;
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        self.disk.check()?;
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.disk.check()?;
        self.file.write(offset, data)
    }

    fn close(&self) -> Result<(), std::io::Error> {
        self.file.close()
    }

    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.file.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.file.query_lock_range(start, end)
    }
}
