//! A redb store after an I/O error, here a full disk (a `FillableFile`):
//! the writes that fail are answered with an error, never as written; the
//! store reports itself unhealthy while it refuses writes; and once the
//! disk has room again it has reopened its file by itself, so writes
//! succeed without a restart and every acknowledged write is there. redb
//! alone refuses every operation after an I/O error ("Previous I/O error
//! occurred. Please close and re-open the database") until the file is
//! closed and opened again.

use std::time::Duration;

use homing_core::{
    ActorId, DcId, DcRecord, FencingToken, HostTime, Key, KeyName, LeasePolicy, ReservationId,
    StoreTime,
};
use homing_store::redb::{FillableFile, FullDisk};
use homing_store::{
    Cas, DcStore, GlobalStore, RedbDcStore, RedbGlobalStore, RedbOptions, SetIfAbsent,
};

/// Longest the stores may take to be writable again once the disk has room.
const RECOVERY_MS_MAX: u64 = 20_000;

fn key_of(i: u64) -> Key {
    Key::new(KeyName::new(format!("disk-{i}")).unwrap())
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
            lease: homing_core::LeaseKey::from_bytes([1; 16]).expect("not all zeros"),
            host_time: HostTime::from_ms(0),
            session: None,
        },
        StoreTime::from_ms(0),
        &LeasePolicy::DEFAULT,
    )
    .0
}

/// Opens `name` in `dir` on `disk`, every time the store asks.
fn file_on(
    dir: &tempfile::TempDir,
    name: &str,
    disk: &FullDisk,
) -> impl Fn() -> Result<FillableFile, std::io::Error> + Send + Sync + 'static {
    let (path, disk) = (dir.path().join(name), disk.clone());
    move || FillableFile::open(&path, &disk)
}

/// Waits until both stores are healthy, within [`RECOVERY_MS_MAX`].
async fn until_healthy(dc: &RedbDcStore, global: &RedbGlobalStore) {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(RECOVERY_MS_MAX);
    loop {
        let (dc_health, global_health) = (dc.health().await, global.health().await);
        if dc_health.is_ok() && global_health.is_ok() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the stores still refuse {RECOVERY_MS_MAX} ms after the disk has room: \
             dc {dc_health:?}, global {global_health:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn redb_io_error_a_full_disk_fails_writes_then_the_stores_reopen_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let disk = FullDisk::default();
    let options = RedbOptions::default();
    let dc = RedbDcStore::on_storage(file_on(&dir, "dc.redb", &disk), options).unwrap();
    let global = RedbGlobalStore::on_storage(file_on(&dir, "global.redb", &disk), options).unwrap();
    let acknowledged = record(1);
    assert_eq!(
        dc.compare_and_set(None, &acknowledged).await.unwrap(),
        Cas::Written
    );
    let entry = global.set_if_absent(&acknowledged.key, &acknowledged.id);
    assert_eq!(entry.await.unwrap(), SetIfAbsent::Inserted);

    disk.fill();
    // Each write on the full disk, the first and every later one, is an
    // error: none is answered as written.
    for unique in [2, 3] {
        let refused = record(unique);
        let cas = dc.compare_and_set(None, &refused).await;
        assert!(cas.is_err(), "a write on a full disk answered {cas:?}");
        let set = global.set_if_absent(&refused.key, &refused.id).await;
        assert!(set.is_err(), "a write on a full disk answered {set:?}");
    }
    let dc_health = dc.health().await;
    assert!(dc_health.is_err(), "healthy while refusing writes");
    assert!(
        global.health().await.is_err(),
        "healthy while refusing writes"
    );

    disk.free();
    until_healthy(&dc, &global).await;
    let after = record(4);
    assert_eq!(
        dc.compare_and_set(None, &after).await.unwrap(),
        Cas::Written
    );
    let entry = global.set_if_absent(&after.key, &after.id);
    assert_eq!(entry.await.unwrap(), SetIfAbsent::Inserted);
    for written in [&acknowledged, &after] {
        assert_eq!(dc.get(&written.id).await.unwrap().as_ref(), Some(written));
        let found = global.get(&written.key).await.unwrap();
        assert_eq!(found, Some(written.id.clone()));
    }
    for unique in [2, 3] {
        let refused = record(unique);
        assert_eq!(
            dc.get(&refused.id).await.unwrap(),
            None,
            "a refused write landed"
        );
    }
}
