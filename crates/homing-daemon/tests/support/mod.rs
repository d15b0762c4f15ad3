//! What several of homingd's integration tests share: a host's clock, the
//! grant in an acquire reply, one DC started in this process on stores the
//! test hands in, and a global store the test can make misbehave.

// Each test file uses its own part of this module.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use homing_core::{
    AcquireReply, DcId, DcLeaseState, DcMarks, DcRenewal, DcTerms, FencingToken, Grant, HostTime,
    Identity, Key, Reply, ReservationId, Role, Succession, TakeOverReply, TakeoverPolicy,
};
use homing_daemon::{Config, Daemon, DaemonError, Settings};
use homing_net::DevCa;
use homing_store::{DcStore, GlobalStore, MemoryGlobalStore, SetIfAbsent, Setting, StoreError};

/// This machine's wall clock as a host clock reading.
pub fn now() -> HostTime {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    HostTime::from_ms(since_epoch.as_millis() as u64)
}

/// The reservation and token an `Acquired` reply grants; panics on any other.
pub fn held(reply: &Reply) -> (ReservationId, FencingToken) {
    match reply {
        Reply::Acquire(AcquireReply::Acquired(Grant {
            reservation, token, ..
        })) => (reservation.clone(), *token),
        other => panic!("expected Acquired, got {other:?}"),
    }
}

/// DC `iad` of `ca` on `global` and `records`, on loopback (the metrics
/// endpoint too, when `metrics`). The directory holds its (unused) data dir.
pub async fn start_iad(
    ca: &DevCa,
    global: Arc<dyn GlobalStore>,
    records: Arc<dyn DcStore>,
    metrics: bool,
) -> (Result<Daemon, DaemonError>, tempfile::TempDir) {
    start_iad_with(ca, global, records, metrics, Settings::default()).await
}

/// [`start_iad`] with `more` settings on top.
pub async fn start_iad_with(
    ca: &DevCa,
    global: Arc<dyn GlobalStore>,
    records: Arc<dyn DcStore>,
    metrics: bool,
    more: Settings,
) -> (Result<Daemon, DaemonError>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let base = Settings {
        dc: Some("iad".into()),
        listen: Some("127.0.0.1:0".parse().unwrap()),
        metrics_listen: metrics.then(|| "127.0.0.1:0".parse().unwrap()),
        data_dir: Some(dir.path().to_path_buf()),
        ca_cert: Some(dir.path().join("unused")),
        cert: Some(dir.path().join("unused")),
        key: Some(dir.path().join("unused")),
        ..Settings::default()
    };
    let config = Config::from_settings(base.overlay(more)).unwrap();
    let iad = DcId::new("iad").unwrap();
    let tls = ca
        .tls_identity(&Identity::new(Role::Node, Some(iad)).unwrap())
        .unwrap();
    (Daemon::start(&config, &tls, global, records).await, dir)
}

/// A global store in memory that a test can make misbehave: switched off
/// (every call fails as an unreachable backend does), a nearest replica that
/// never saw any write, slow linearizable reads; it counts those reads.
#[derive(Default)]
pub struct TestGlobal {
    /// The store itself.
    pub inner: MemoryGlobalStore,
    /// Switched off: every call fails `Unavailable`.
    pub down: AtomicBool,
    /// `get_nearest` answers "absent" whatever is stored.
    pub nearest_never_caught_up: bool,
    /// How long each `get` takes.
    pub get_delay: Duration,
    /// `get` calls so far.
    pub gets: AtomicU64,
    /// When set, each `set_if_absent` takes a permit first (none: it waits).
    pub set_gate: Option<Arc<tokio::sync::Semaphore>>,
    /// `set_if_absent` calls so far.
    pub sets: AtomicU64,
    /// Notified as each `set_if_absent` call starts.
    pub set_started: tokio::sync::Notify,
    /// When set, the next `successions_of` asking for a page after a cursor
    /// (not the first page) fails `Unavailable`, once.
    pub fail_a_next_page: AtomicBool,
    /// The cursor of each `successions_of` call, in order.
    pub pages_asked: std::sync::Mutex<Vec<Option<ReservationId>>>,
}

impl TestGlobal {
    fn check(&self) -> Result<(), StoreError> {
        match self.down.load(Ordering::SeqCst) {
            true => Err(StoreError::Unavailable {
                backend: "test",
                reason: "switched off".into(),
            }),
            false => Ok(()),
        }
    }
}

#[async_trait]
impl GlobalStore for TestGlobal {
    async fn get(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        tokio::time::sleep(self.get_delay).await;
        self.check()?;
        self.inner.get(key).await
    }
    async fn get_nearest(&self, key: &Key) -> Result<Option<ReservationId>, StoreError> {
        self.check()?;
        match self.nearest_never_caught_up {
            true => Ok(None),
            false => self.inner.get_nearest(key).await,
        }
    }
    async fn get_many(&self, keys: &[Key]) -> Result<Vec<Option<ReservationId>>, StoreError> {
        self.check()?;
        self.inner.get_many(keys).await
    }
    async fn set_if_absent(
        &self,
        key: &Key,
        id: &ReservationId,
    ) -> Result<SetIfAbsent, StoreError> {
        self.sets.fetch_add(1, Ordering::SeqCst);
        self.set_started.notify_one();
        if let Some(gate) = &self.set_gate {
            gate.acquire()
                .await
                .expect("the gate is never closed")
                .forget();
        }
        self.check()?;
        self.inner.set_if_absent(key, id).await
    }
    async fn scan(
        &self,
        after: Option<&Key>,
        limit: usize,
    ) -> Result<Vec<(Key, ReservationId)>, StoreError> {
        self.check()?;
        self.inner.scan(after, limit).await
    }
    async fn renew_dc_lease(
        &self,
        dc: &DcId,
        terms: &DcTerms,
        marks: &DcMarks,
    ) -> Result<DcRenewal, StoreError> {
        self.check()?;
        self.inner.renew_dc_lease(dc, terms, marks).await
    }
    async fn dc_lease(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        self.check()?;
        self.inner.dc_lease(dc).await
    }
    async fn dc_leases(&self) -> Result<Vec<DcLeaseState>, StoreError> {
        self.check()?;
        self.inner.dc_leases().await
    }
    async fn retire_dc(&self, dc: &DcId) -> Result<DcLeaseState, StoreError> {
        self.check()?;
        self.inner.retire_dc(dc).await
    }
    async fn successor(&self, from: &ReservationId) -> Result<Option<Succession>, StoreError> {
        self.check()?;
        self.inner.successor(from).await
    }
    async fn set_successor(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError> {
        self.check()?;
        self.inner.set_successor(succession).await
    }
    async fn import_succession(
        &self,
        succession: &Succession,
    ) -> Result<Option<Succession>, StoreError> {
        self.check()?;
        self.inner.import_succession(succession).await
    }
    async fn take_over(
        &self,
        succession: &Succession,
        policy: TakeoverPolicy,
    ) -> Result<TakeOverReply, StoreError> {
        self.check()?;
        self.inner.take_over(succession, policy).await
    }
    async fn successions_of(
        &self,
        dc: &DcId,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        self.check()?;
        self.pages_asked.lock().unwrap().push(after.cloned());
        if after.is_some() && self.fail_a_next_page.swap(false, Ordering::SeqCst) {
            return Err(StoreError::Unavailable {
                backend: "test",
                reason: "this page fails".into(),
            });
        }
        self.inner.successions_of(dc, after, limit).await
    }
    async fn scan_successions(
        &self,
        after: Option<&ReservationId>,
        limit: usize,
    ) -> Result<Vec<Succession>, StoreError> {
        self.check()?;
        self.inner.scan_successions(after, limit).await
    }
    async fn setting(&self, name: Setting) -> Result<Option<Vec<u8>>, StoreError> {
        self.check()?;
        self.inner.setting(name).await
    }
    async fn swap_setting(
        &self,
        name: Setting,
        expected: Option<&[u8]>,
        value: &[u8],
    ) -> Result<Result<(), Option<Vec<u8>>>, StoreError> {
        self.check()?;
        self.inner.swap_setting(name, expected, value).await
    }
}

/// The lease key the host of `actor` uses in these tests: one per actor,
/// as each HostAgent draws its own.
#[allow(dead_code)] // each test binary takes the parts it needs
pub fn lease_of(actor: &str) -> homing_core::LeaseKey {
    let mut bytes = [0x5A; 16];
    for (i, b) in actor.bytes().enumerate() {
        bytes[i % 16] ^= b.rotate_left((i / 16) as u32);
    }
    homing_core::LeaseKey::from_bytes(bytes).expect("not all zeros")
}
