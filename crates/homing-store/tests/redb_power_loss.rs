//! Acknowledged writes of the redb stores survive a power cut, not only a
//! killed process. A SIGKILL (`redb_crash.rs`) leaves the kernel's page
//! cache in place, so it would pass even if commits never reached the disk
//! (`Durability::None`); this test models the disk instead: every write lands
//! in a volatile image, and only `sync_data` (the fsync) copies it to the
//! durable image. Cutting the power keeps the durable image alone; the stores
//! reopened on it must hold every write acknowledged before the cut.

use std::sync::{Arc, Mutex};

use homing_core::{
    ActorId, DcId, DcRecord, FencingToken, HostTime, Key, KeyName, LeasePolicy, ReservationId,
    StoreTime,
};
use homing_store::{
    Cas, DcStore, EVENTS_LIMIT_MAX, GlobalStore, RedbDcStore, RedbGlobalStore, RedbOptions,
    SetIfAbsent, Setting,
};
use redb::{ReadableDatabase, StorageBackend, TableDefinition};

/// Writes acknowledged before the cut.
const WRITES: u64 = 40;

/// A disk: what the drive's cache holds, and what reached the platter.
#[derive(Debug, Default)]
struct Disk {
    volatile: Mutex<Vec<u8>>,
    durable: Mutex<Vec<u8>>,
}

impl Disk {
    /// The disk as found after a power cut now: only what was synced.
    fn after_power_cut(&self) -> Arc<Disk> {
        let durable = self.durable.lock().unwrap().clone();
        Arc::new(Disk {
            volatile: Mutex::new(durable.clone()),
            durable: Mutex::new(durable),
        })
    }
}

/// A redb storage backend on a [`Disk`].
#[derive(Debug)]
struct OnDisk(Arc<Disk>);

fn out_of_range() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, "out of range")
}

impl StorageBackend for OnDisk {
    fn len(&self) -> Result<u64, std::io::Error> {
        Ok(self.0.volatile.lock().unwrap().len() as u64)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        let image = self.0.volatile.lock().unwrap();
        let start = usize::try_from(offset).map_err(|_| out_of_range())?;
        let bytes = image
            .get(start..start + out.len())
            .ok_or_else(out_of_range)?;
        out.copy_from_slice(bytes);
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        let len = usize::try_from(len).map_err(|_| out_of_range())?;
        self.0.volatile.lock().unwrap().resize(len, 0);
        Ok(())
    }

    fn sync_data(&self) -> Result<(), std::io::Error> {
        let image = self.0.volatile.lock().unwrap().clone();
        *self.0.durable.lock().unwrap() = image;
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        let mut image = self.0.volatile.lock().unwrap();
        let start = usize::try_from(offset).map_err(|_| out_of_range())?;
        image
            .get_mut(start..start + data.len())
            .ok_or_else(out_of_range)?
            .copy_from_slice(data);
        Ok(())
    }
}

/// Opens storage on `disk` (again, when a store reopens it: the volatile
/// image, as a reopened file reads the kernel's page cache).
fn on(disk: &Arc<Disk>) -> impl Fn() -> Result<OnDisk, std::io::Error> + Send + Sync + 'static {
    let disk = disk.clone();
    move || Ok(OnDisk(disk.clone()))
}

fn key_of(i: u64) -> Key {
    Key::new(KeyName::new(format!("power-{i}")).unwrap())
}

fn record(unique: u64) -> DcRecord {
    DcRecord::reserve(
        ReservationId::new(DcId::new("iad").unwrap(), unique),
        key_of(unique),
        None,
        FencingToken::FIRST,
        None,
        &homing_core::Holding {
            actor: ActorId::new("10.0.0.1:9000").unwrap(),
            lease: lease(),
            host_time: HostTime::from_ms(0),
            session: None,
        },
        StoreTime::from_ms(0),
        &LeasePolicy::DEFAULT,
    )
    .0
}

#[test]
fn power_loss_the_disk_model_loses_what_was_not_synced() {
    // The control: without the fsync, the model must lose the write, or the
    // test below could not fail.
    const T: TableDefinition<u64, u64> = TableDefinition::new("t");
    let disk = Arc::new(Disk::default());
    let db = redb::Database::builder()
        .create_with_backend(OnDisk(disk.clone()))
        .unwrap();
    let mut txn = db.begin_write().unwrap();
    txn.set_durability(redb::Durability::None).unwrap();
    txn.open_table(T).unwrap().insert(1, 1).unwrap();
    txn.commit().unwrap();
    let after = disk.after_power_cut();
    drop(db);
    let db = redb::Database::builder()
        .create_with_backend(OnDisk(after))
        .unwrap();
    let txn = db.begin_read().unwrap();
    let found = match txn.open_table(T) {
        Ok(table) => table.get(1).unwrap().map(|v| v.value()),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(found, None, "an unsynced commit survived the cut");
}

#[tokio::test]
async fn power_loss_every_acknowledged_write_survives_a_power_cut() {
    let dc_disk = Arc::new(Disk::default());
    let global_disk = Arc::new(Disk::default());
    let dc = RedbDcStore::on_storage(on(&dc_disk), RedbOptions::default()).unwrap();
    let global = RedbGlobalStore::on_storage(on(&global_disk), RedbOptions::default()).unwrap();
    let mut uniques = Vec::new();
    for _ in 0..WRITES {
        let unique = dc.allocate().await.unwrap();
        let r = record(unique);
        assert_eq!(dc.compare_and_set(None, &r).await.unwrap(), Cas::Written);
        assert_eq!(
            global.set_if_absent(&r.key, &r.id).await.unwrap(),
            SetIfAbsent::Inserted
        );
        uniques.push(unique);
    }
    let head = dc.events(0, 0).await.unwrap().head;
    assert!(head >= WRITES, "every create appended an event");
    // Settings change: the last acknowledged swap of each must survive.
    for setting in Setting::ALL {
        let mut held: Option<Vec<u8>> = None;
        for n in 0..WRITES {
            let value = format!("{setting} {n}").into_bytes();
            let swapped = global.swap_setting(setting, held.as_deref(), &value);
            assert_eq!(swapped.await.unwrap(), Ok(()));
            held = Some(value);
        }
    }

    // The cut, with the stores still open: nothing gets a clean close.
    let (dc_after, global_after) = (dc_disk.after_power_cut(), global_disk.after_power_cut());
    drop((dc, global));
    let dc = RedbDcStore::on_storage(on(&dc_after), RedbOptions::default()).unwrap();
    let global = RedbGlobalStore::on_storage(on(&global_after), RedbOptions::default()).unwrap();
    for &unique in &uniques {
        let r = record(unique);
        assert_eq!(
            dc.get(&r.id).await.unwrap(),
            Some(r.clone()),
            "acknowledged record {} lost in the power cut",
            r.id
        );
        assert_eq!(global.get(&r.key).await.unwrap(), Some(r.id));
    }
    for setting in Setting::ALL {
        let last = format!("{setting} {}", WRITES - 1).into_bytes();
        assert_eq!(
            global.setting(setting).await.unwrap(),
            Some(last),
            "the last acknowledged swap of {setting} lost in the power cut"
        );
    }
    let page = dc.events(0, EVENTS_LIMIT_MAX).await.unwrap();
    assert_eq!(page.head, head, "acknowledged events lost in the power cut");
    let next = dc.allocate().await.unwrap();
    assert!(
        uniques.iter().all(|&u| next > u),
        "the allocator handed out {next} again after the cut"
    );
}

/// The lease key of every holder here.
fn lease() -> homing_core::LeaseKey {
    homing_core::LeaseKey::from_bytes([1; 16]).expect("not all zeros")
}
