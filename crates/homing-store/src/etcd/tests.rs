//! The etcd backend's tests. One three-member cluster runs the conformance
//! suite (without the record cache, then with it) and then the cases only
//! etcd has (the shared appender, the record cache, lost answers, a frozen
//! member), so the cluster starts once; the compaction storms run on
//! one-member clusters of their own.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use homing_core::{
    DcId, DcRecord, DcTerms, EventSeq, Key, ReservationId, SessionRecord, Succession,
    TakeOverReply, TakeoverPolicy,
};

use super::compaction::CompactionPolicy;
use super::lost_answer::AnswerRelay;
use super::*;
use crate::conformance::{self, Backend};
use crate::dc::{Cas, DcStore, Import};
use crate::etcd_cluster::{ClusterError, LocalEtcdCluster};
use crate::failover::FailoverEvent;
use crate::global::{GlobalStore, SetIfAbsent};
use crate::keyspace;
use crate::session::{GuardedCas, SessionCas, SessionGuard};

struct EtcdBackend {
    endpoints: Vec<String>,
    run: u64,
    options: EtcdDcOptions,
}

static RUNS: AtomicU64 = AtomicU64::new(0);

impl EtcdBackend {
    fn prefix(&self, kind: &str, place: &str) -> String {
        format!("/homing-test/{}/{kind}/{place}/", self.run)
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    async fn global_store(&self, place: &str) -> Arc<dyn GlobalStore> {
        let prefix = self.prefix("global", place);
        Arc::new(
            EtcdGlobalStore::connect(&self.endpoints, &prefix)
                .await
                .expect("connect"),
        )
    }
    async fn dc_store(&self, place: &str) -> Arc<dyn DcStore> {
        let prefix = self.prefix("dc", place);
        Arc::new(
            EtcdDcStore::connect_with(&self.endpoints, &prefix, self.options)
                .await
                .expect("connect"),
        )
    }
    fn durable(&self) -> bool {
        true
    }
    async fn global_store_losing_next_answer(
        &self,
        place: &str,
    ) -> Option<conformance::AnswerLost> {
        let relay = AnswerRelay::start(&self.endpoints[0]).await;
        let endpoints = [relay.endpoint(), self.endpoints[1].clone()];
        let store = EtcdGlobalStore::connect(&endpoints, &self.prefix("global", place))
            .await
            .expect("connect");
        warm_round_robin(&store.space).await;
        relay.lose_answers();
        Some(conformance::AnswerLost {
            store: Arc::new(store),
            lost: Box::new(move || relay.lost_any()),
        })
    }
}

/// Two reads on a fresh two-member store: the first (round-robin) opens
/// the connection to member 0, the second goes to member 1, so the next
/// operation goes to member 0 again.
async fn warm_round_robin(space: &Space) {
    for _ in 0..2 {
        space
            .get(Op::HotRead, space.key(b"warm", b""), None)
            .await
            .expect("warm read");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_three_member_cluster_passes_the_conformance_suite() {
    let cluster = match LocalEtcdCluster::start().await {
        Ok(cluster) => cluster,
        Err(ClusterError::NoBinary) => {
            println!(
                "SKIP etcd conformance: no `etcd` binary on PATH (apt-get install etcd-server)"
            );
            return;
        }
        Err(e) => panic!("{e}"),
    };
    // The suite once without the record cache (every compare-and-set
    // reads first), then with it, as deployed.
    let uncached = EtcdBackend {
        endpoints: cluster.endpoints().to_vec(),
        run: RUNS.fetch_add(1, Ordering::Relaxed),
        options: EtcdDcOptions {
            record_cache_entries_max: 0,
        },
    };
    conformance::run_all(&uncached).await;
    let backend = EtcdBackend {
        endpoints: cluster.endpoints().to_vec(),
        run: RUNS.fetch_add(1, Ordering::Relaxed),
        options: EtcdDcOptions::default(),
    };
    conformance::run_all(&backend).await;
    println!("etcd: two_stores_on_one_prefix_share_one_contiguous_log");
    two_stores_on_one_prefix_share_one_contiguous_log(&backend).await;
    println!("etcd: a_write_caches_the_revision_etcd_stored_it_at");
    a_write_caches_the_revision_etcd_stored_it_at(&backend).await;
    println!("etcd: a_stale_cache_never_changes_an_answer");
    a_stale_cache_never_changes_an_answer(&backend).await;
    println!("etcd: import_forgets_the_cached_record");
    import_forgets_the_cached_record(&backend).await;
    println!("etcd: concurrent_write_once_calls_each_get_their_own_outcome");
    concurrent_write_once_calls_each_get_their_own_outcome(&backend).await;
    println!("etcd: concurrent_nearest_reads_share_transactions_and_each_get_their_own_entry");
    concurrent_nearest_reads_share_transactions_and_each_get_their_own_entry(&backend).await;
    println!("etcd: a_cas_whose_answer_was_lost_is_written_once");
    a_cas_whose_answer_was_lost_is_written_once(&backend).await;
    println!("etcd: a_session_renewal_whose_answer_was_lost_is_written_once");
    a_session_renewal_whose_answer_was_lost_is_written_once(&backend).await;
    println!("etcd: a_freeze_whose_answer_was_lost_is_written_once_with_its_row");
    a_freeze_whose_answer_was_lost_is_written_once_with_its_row(&backend).await;
    println!("etcd: a_guarded_append_whose_session_row_moved_after_it_was_read_writes_nothing");
    a_guarded_append_whose_session_row_moved_after_it_was_read_writes_nothing(&backend).await;
    println!("etcd: joins_racing_a_freeze_each_land_before_it_or_see_the_session_moved");
    joins_racing_a_freeze_each_land_before_it_or_see_the_session_moved(&backend).await;
    println!("etcd: dc_lease_reads_racing_renewals_never_see_a_replaced_lease_as_expired");
    dc_lease_reads_racing_renewals_never_see_a_replaced_lease_as_expired(&backend).await;
    println!("etcd: a_dc_lease_renewal_whose_answer_was_lost_is_recognised_as_ours");
    a_dc_lease_renewal_whose_answer_was_lost_is_recognised_as_ours(&backend).await;
    println!("etcd: a_renewal_between_a_takeovers_judgement_and_its_write_fails_its_guard");
    a_renewal_between_a_takeovers_judgement_and_its_write_fails_its_guard(&backend).await;
    println!("etcd: a_takeover_whose_answer_was_lost_is_recognised_as_ours");
    a_takeover_whose_answer_was_lost_is_recognised_as_ours(&backend).await;
    println!("etcd: a_frozen_member_costs_one_deadline_then_is_avoided_until_it_answers");
    a_frozen_member_costs_one_deadline_then_is_avoided_until_it_answers(&backend, &cluster).await;
    drop(cluster);
}

/// Writers per store in the two-store race.
const WRITERS_PER_STORE: usize = 8;
/// Records each writer creates and releases.
const RECORDS_PER_WRITER: usize = 4;

/// Two stores on one prefix (two daemons of one DC, or a daemon and a
/// migration) append through two appenders: their transactions contend
/// on the head key, and the log must still be 1..n, each change once.
async fn two_stores_on_one_prefix_share_one_contiguous_log(backend: &EtcdBackend) {
    let prefix = backend.prefix("dc", "two_stores");
    let mut stores = Vec::new();
    for _ in 0..2 {
        let store = EtcdDcStore::connect(&backend.endpoints, &prefix)
            .await
            .expect("connect");
        stores.push(Arc::new(store));
    }
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for (s, store) in stores.iter().enumerate() {
        for w in 0..WRITERS_PER_STORE {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                for r in 0..RECORDS_PER_WRITER {
                    let unique = ((s * WRITERS_PER_STORE + w) * RECORDS_PER_WRITER + r) as u64;
                    let id = ReservationId::new(homing_core::DcId::new("iad").unwrap(), unique + 1);
                    let key = Key::new(homing_core::KeyName::new(format!("k{unique}")).unwrap());
                    let created = conformance::record(&id, &key);
                    let cas = store.compare_and_set(None, &created).await.unwrap();
                    assert_eq!(cas, Cas::Written);
                    let released = created
                        .release(
                            created.token,
                            &conformance::lease(),
                            homing_core::RunOutcome::Ok,
                            homing_core::StoreTime::from_ms(1),
                        )
                        .next
                        .unwrap();
                    let cas = store.compare_and_set(Some(1), &released).await.unwrap();
                    assert_eq!(cas, Cas::Written);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let writes = 2 * 2 * WRITERS_PER_STORE * RECORDS_PER_WRITER;
    println!(
        "etcd: {writes} event-appending writes from two stores in {} ms",
        started.elapsed().as_millis()
    );
    let page = stores[0].events(0, crate::EVENTS_LIMIT_MAX).await.unwrap();
    let seqs: Vec<EventSeq> = page.events.iter().map(|e| e.seq).collect();
    let want: Vec<EventSeq> = (1..=writes as u64).collect();
    assert_eq!(seqs, want);
    assert_eq!(page.head, writes as u64);
    let mut changes: Vec<_> = page
        .events
        .iter()
        .map(|e| (e.reservation.clone(), e.kind.name()))
        .collect();
    changes.sort();
    changes.dedup();
    assert_eq!(changes.len(), writes, "each change once");
}

/// etcd's backend quota in the storm tests: 32 MiB (without compaction
/// it is full after about 21 MiB of record versions).
const STORM_QUOTA_BYTES: usize = 32 * 1024 * 1024;
/// Record bytes the storm writes: twice the quota, so etcd must reuse
/// the space of compacted revisions to take them all.
const STORM_BYTES: usize = 2 * STORM_QUOTA_BYTES;
/// Records renewed concurrently, one task each.
const STORM_TASKS: usize = 64;

/// A renewal storm on a one-member etcd with a small quota: every task
/// renews its own largest-size record until the storm has written
/// [`STORM_BYTES`]; returns the first write error, if any, and how many
/// renewals landed.
async fn renewal_storm(compaction: Option<CompactionPolicy>) -> Option<(Option<String>, u64)> {
    let quota = format!("--quota-backend-bytes={STORM_QUOTA_BYTES}");
    let cluster = match LocalEtcdCluster::start_with(1, &[quota.as_str()]).await {
        Ok(cluster) => cluster,
        Err(ClusterError::NoBinary) => {
            println!("skipped: no etcd binary on PATH");
            return None;
        }
        Err(e) => panic!("{e}"),
    };
    let store = Arc::new(
        EtcdDcStore::connect(cluster.endpoints(), "/storm/dc/iad/")
            .await
            .unwrap(),
    );
    let compactor = compaction.map(|policy| store.compactor(policy));
    let big = conformance::max_length_record();
    let record_bytes = keyspace::encode_record(&big).unwrap().len();
    let renewals_max = (STORM_BYTES / record_bytes / STORM_TASKS) as u64;
    let started = std::time::Instant::now();
    let mut tasks = Vec::new();
    for t in 0..STORM_TASKS as u64 {
        let store = store.clone();
        let mut record = big.clone();
        record.id = ReservationId::new(big.id.dc().clone(), t + 1);
        tasks.push(tokio::spawn(async move {
            store.compare_and_set(None, &record).await.unwrap();
            for n in 0..renewals_max {
                let next = renewed(&record);
                match store.compare_and_set(Some(record.version), &next).await {
                    Ok(Cas::Written) => record = next,
                    Ok(other) => return (Some(format!("{other:?}")), n),
                    Err(e) => return (Some(e.to_string()), n),
                }
            }
            (None, renewals_max)
        }));
    }
    let (mut first_error, mut landed) = (None, 0);
    for task in tasks {
        let (error, n) = task.await.unwrap();
        landed += n;
        first_error = first_error.or(error);
    }
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let status = client.status().await.unwrap();
    println!(
        "storm (compaction {}): {landed} renewals of {record_bytes}-byte records ({} MiB) in {} ms; \
         etcd db {} MiB of a {} MiB quota; compactions {}; first error: {first_error:?}",
        if compaction.is_some() { "on" } else { "off" },
        landed * record_bytes as u64 / (1024 * 1024),
        started.elapsed().as_millis(),
        status.db_size() / (1024 * 1024),
        STORM_QUOTA_BYTES / (1024 * 1024),
        compactor.as_ref().map_or(0, |c| c.stats().compactions()),
    );
    Some((first_error, landed))
}

/// The weeks on etcd, compressed: renewals write twice etcd's
/// quota in record versions; with the compactor keeping only
/// recent revisions, etcd reuses the freed space and every renewal lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_renewal_storm_on_a_small_quota_runs_on_with_compaction() {
    let policy = CompactionPolicy {
        interval_ms: 200,
        retain_revisions: 100,
    };
    let Some((error, landed)) = renewal_storm(Some(policy)).await else {
        return;
    };
    assert_eq!(error, None, "a renewal failed after {landed}");
}

/// The control: the same storm without compaction fills the quota and
/// etcd refuses writes (NOSPACE), so the test above measures compaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_compaction_the_storm_fills_the_quota_and_etcd_refuses_writes() {
    let Some((error, _)) = renewal_storm(None).await else {
        return;
    };
    let error = error.expect("the storm fit in the quota: it is too small to test compaction");
    assert!(error.contains("space exceeded"), "{error}");
}

fn test_record(unique: u64) -> DcRecord {
    let id = ReservationId::new(homing_core::DcId::new("iad").unwrap(), unique);
    let key = Key::new(homing_core::KeyName::new(format!("k{unique}")).unwrap());
    conformance::record(&id, &key)
}

fn renewed(r: &DcRecord) -> DcRecord {
    let (host, now) = (
        homing_core::HostTime::from_ms(1),
        homing_core::StoreTime::from_ms(1),
    );
    r.renew(
        r.token,
        &conformance::lease(),
        host,
        now,
        &homing_core::LeasePolicy::DEFAULT,
    )
    .next
    .unwrap()
}

fn released(r: &DcRecord) -> DcRecord {
    let now = homing_core::StoreTime::from_ms(2);
    r.release(
        r.token,
        &conformance::lease(),
        homing_core::RunOutcome::Ok,
        now,
    )
    .next
    .unwrap()
}

async fn stored_revision(store: &EtcdDcStore, id: &ReservationId) -> i64 {
    let response = store
        .space
        .get(Op::HotRead, store.record_key(id), None)
        .await
        .unwrap();
    response.kvs()[0].mod_revision()
}

/// A write with an event (a create) and one without (a renewal) both
/// cache the revision etcd gave the record, so the next
/// compare-and-set of that record needs no read.
async fn a_write_caches_the_revision_etcd_stored_it_at(backend: &EtcdBackend) {
    let prefix = backend.prefix("dc", "cache_revision");
    let store = EtcdDcStore::connect(&backend.endpoints, &prefix)
        .await
        .unwrap();
    let created = test_record(1);
    let id = created.id.clone();
    assert_eq!(
        store.compare_and_set(None, &created).await.unwrap(),
        Cas::Written
    );
    let cached = store.cache.get(&id).unwrap();
    assert_eq!(cached.revision, stored_revision(&store, &id).await);
    let next = renewed(&created);
    assert_eq!(
        store.compare_and_set(Some(1), &next).await.unwrap(),
        Cas::Written
    );
    let cached = store.cache.get(&id).unwrap();
    assert_eq!(cached.revision, stored_revision(&store, &id).await);
    assert_eq!(keyspace::decode_record(&cached.value).unwrap(), next);
}

/// Store `a` caches a record that store `b` (another daemon on the same
/// prefix) then changes: `a`'s compare-and-set on its stale copy gets the
/// conflict with `b`'s record and appends no event; a store that never
/// saw the record and assumes a create is absent gets the conflict too.
async fn a_stale_cache_never_changes_an_answer(backend: &EtcdBackend) {
    let prefix = backend.prefix("dc", "stale_cache");
    let mut stores = Vec::new();
    for _ in 0..3 {
        let store = EtcdDcStore::connect(&backend.endpoints, &prefix);
        stores.push(store.await.unwrap());
    }
    let (a, b, c) = (&stores[0], &stores[1], &stores[2]);
    let created = test_record(1);
    assert_eq!(
        a.compare_and_set(None, &created).await.unwrap(),
        Cas::Written
    );
    let by_b = renewed(&b.get(&created.id).await.unwrap().unwrap());
    assert_eq!(
        b.compare_and_set(Some(1), &by_b).await.unwrap(),
        Cas::Written
    );
    let conflict = Cas::Conflict {
        current: Some(by_b.clone()),
    };
    // `a` still caches version 1: the release is judged against `b`'s record.
    assert_eq!(
        a.compare_and_set(Some(1), &released(&created))
            .await
            .unwrap(),
        conflict
    );
    assert_eq!(c.compare_and_set(None, &created).await.unwrap(), conflict);
    // The conflict refreshed `a`'s cache: the release at version 2 lands.
    let ended = released(&by_b);
    assert_eq!(
        a.compare_and_set(Some(2), &ended).await.unwrap(),
        Cas::Written
    );
    assert_eq!(b.get(&created.id).await.unwrap(), Some(ended));
    assert_eq!(event_kinds(a).await, ["reserved", "released"]);
}

/// The kinds of the first events of `store`'s log, in order.
async fn event_kinds(store: &EtcdDcStore) -> Vec<&'static str> {
    let page = store.events(0, 16).await.unwrap();
    page.events.iter().map(|e| e.kind.name()).collect()
}

/// An import writes around the cache, so it forgets the record.
async fn import_forgets_the_cached_record(backend: &EtcdBackend) {
    let prefix = backend.prefix("dc", "import_cache");
    let store = EtcdDcStore::connect(&backend.endpoints, &prefix)
        .await
        .unwrap();
    let created = test_record(1);
    assert_eq!(
        store.compare_and_set(None, &created).await.unwrap(),
        Cas::Written
    );
    assert!(store.cache.get(&created.id).is_some());
    let mut copied = renewed(&created);
    copied.version = 10;
    assert_eq!(store.import(&copied).await.unwrap(), Import::Written);
    assert!(store.cache.get(&created.id).is_none());
    let next = renewed(&copied);
    assert_eq!(
        store.compare_and_set(Some(10), &next).await.unwrap(),
        Cas::Written
    );
}

/// A renewal (a compare-and-set) whose transaction landed but whose
/// answer was lost is retried on another member; the retry's guard fails
/// (the record moved: to our own bytes), the re-read shows our record,
/// and the caller is told Written, once: no second write, no event.
async fn a_cas_whose_answer_was_lost_is_written_once(backend: &EtcdBackend) {
    let relay = AnswerRelay::start(&backend.endpoints[0]).await;
    let endpoints = [relay.endpoint(), backend.endpoints[1].clone()];
    let prefix = backend.prefix("dc", "lost_cas");
    let store = EtcdDcStore::connect(&endpoints, &prefix).await.unwrap();
    // The create reads the head (member 0), then writes (member 1);
    // the renewal, cached, is one write: to member 0, through the relay.
    let created = test_record(1);
    assert_eq!(
        store.compare_and_set(None, &created).await.unwrap(),
        Cas::Written
    );
    relay.lose_answers();
    let next = renewed(&created);
    assert_eq!(
        store.compare_and_set(Some(1), &next).await.unwrap(),
        Cas::Written
    );
    assert!(relay.lost_any(), "the renewal's answer was not lost");
    assert_eq!(store.get(&created.id).await.unwrap(), Some(next.clone()));
    let failover = store.failover().unwrap();
    assert_eq!(failover.total(FailoverEvent::AmbiguousResolved), 1);
    // The next write is judged against version 2: it lands once.
    let ended = released(&next);
    assert_eq!(
        store.compare_and_set(Some(2), &ended).await.unwrap(),
        Cas::Written
    );
    assert_eq!(event_kinds(&store).await, ["reserved", "released"]);
}

/// DC lease terms that outlive any test.
const DC_TERMS: homing_core::DcTerms = homing_core::DcTerms {
    ttl_ms: 60_000,
    host_lease_ttl_max_ms: 10_000,
    grace_ms: 1_000,
};

const DC_MARKS: homing_core::DcMarks = homing_core::DcMarks {
    allocator_floor: 64,
    token_bound: 8,
    event_head: 3,
};

/// Renewals that each move the DC's key to a fresh etcd lease and revoke
/// the one before, while two other stores read the DC: a read that saw
/// the key on a lease revoked before it asked that lease's ttl reads
/// again, so none ever answers `Expired` (or anything but `Live`).
async fn dc_lease_reads_racing_renewals_never_see_a_replaced_lease_as_expired(
    backend: &EtcdBackend,
) {
    const RENEWALS: usize = 60;
    const READERS: usize = 2;
    let prefix = backend.prefix("global", "dc_lease_race");
    let renewer = EtcdGlobalStore::connect(&backend.endpoints, &prefix)
        .await
        .unwrap();
    let iad = homing_core::DcId::new("iad").unwrap();
    renewer
        .renew_dc_lease(&iad, &DC_TERMS, &DC_MARKS)
        .await
        .unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let reader = EtcdGlobalStore::connect(&backend.endpoints, &prefix)
            .await
            .unwrap();
        let (done, iad) = (done.clone(), iad.clone());
        readers.push(tokio::spawn(async move {
            let mut wrong = Vec::new();
            let mut reads = 0;
            while !done.load(Ordering::SeqCst) {
                let state = reader.dc_lease(&iad).await.unwrap();
                if !matches!(state.standing, homing_core::DcStanding::Live { .. }) {
                    wrong.push(state.standing);
                }
                reads += 1;
            }
            (reads, wrong)
        }));
    }
    for _ in 0..RENEWALS {
        let renewed = renewer.renew_dc_lease(&iad, &DC_TERMS, &DC_MARKS).await;
        assert_eq!(renewed.unwrap(), homing_core::DcRenewal::Renewed(DC_MARKS));
    }
    done.store(true, Ordering::SeqCst);
    for reader in readers {
        let (reads, wrong) = reader.await.unwrap();
        println!("etcd: {reads} dc lease reads during {RENEWALS} renewals");
        assert!(reads > 0, "the reader never read");
        assert!(wrong.is_empty(), "a live lease read as {wrong:?}");
    }
}

/// A renewal whose transaction landed on a member that then lost its
/// answer is retried on another member; the retry's guard fails (the
/// keys moved: to our own write), the read-back shows the DC's key on
/// the lease this call granted, and the call answers `Renewed` — it
/// neither revokes its own lease (which would delete the key) nor
/// writes again.
async fn a_dc_lease_renewal_whose_answer_was_lost_is_recognised_as_ours(backend: &EtcdBackend) {
    let relay = AnswerRelay::start(&backend.endpoints[0]).await;
    // Round-robin over three: the renewal's read goes to member 1, its
    // lease grant to member 2, its transaction through the relay.
    let endpoints = [
        backend.endpoints[1].clone(),
        backend.endpoints[2].clone(),
        relay.endpoint(),
    ];
    let prefix = backend.prefix("global", "dc_lease_lost");
    let store = EtcdGlobalStore::connect(&endpoints, &prefix).await.unwrap();
    for _ in 0..endpoints.len() {
        store
            .space
            .get(Op::HotRead, store.space.key(b"warm", b""), None)
            .await
            .expect("warm read");
    }
    relay.lose_answers();
    let iad = homing_core::DcId::new("iad").unwrap();
    let renewed = store.renew_dc_lease(&iad, &DC_TERMS, &DC_MARKS).await;
    assert_eq!(renewed.unwrap(), homing_core::DcRenewal::Renewed(DC_MARKS));
    assert!(relay.lost_any(), "the renewal's answer was not lost");
    let failover = store.failover().unwrap();
    assert_eq!(failover.total(FailoverEvent::AmbiguousResolved), 1);
    let state = store.dc_lease(&iad).await.unwrap();
    assert!(
        matches!(state.standing, homing_core::DcStanding::Live { .. }),
        "{state:?}"
    );
}

/// Terms whose etcd lease runs out after 2 s.
const SHORT_DC_TERMS: DcTerms = DcTerms {
    ttl_ms: 1_000,
    host_lease_ttl_max_ms: 1_000,
    grace_ms: 0,
};

/// Renews `dc` under [`SHORT_DC_TERMS`] and waits (at most 30 s) until
/// the store calls it expired.
async fn expired(store: &EtcdGlobalStore, dc: &DcId) {
    store
        .renew_dc_lease(dc, &SHORT_DC_TERMS, &DC_MARKS)
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let state = store.dc_lease(dc).await.unwrap();
        if state.standing == homing_core::DcStanding::Expired {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "{state:?}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The takeover guard, step by step: the DC is judged expired, then it
/// renews (same terms and marks: only its live key comes back), then
/// the takeover writes against what it judged. The live key's guard
/// fails the write; the takeover judges again and is refused.
async fn a_renewal_between_a_takeovers_judgement_and_its_write_fails_its_guard(
    backend: &EtcdBackend,
) {
    let prefix = backend.prefix("global", "takeover_guard");
    let store = EtcdGlobalStore::connect(&backend.endpoints, &prefix)
        .await
        .unwrap();
    let iad = DcId::new("iad").unwrap();
    expired(&store, &iad).await;
    let from: ReservationId = "iad.1".parse().unwrap();
    let s = Succession::taken_over(from.clone(), "fra.1".parse().unwrap(), 41);
    let found = store.successions.read(&from).await.unwrap();
    let (state, held) = store.dcs.judged(&iad, found.held).await.unwrap();
    assert_eq!(state.standing, homing_core::DcStanding::Expired);
    assert!(TakeoverPolicy::Automatic.allows(&state));
    store
        .renew_dc_lease(&iad, &SHORT_DC_TERMS, &DC_MARKS)
        .await
        .unwrap();
    let attempt = store.successions.write_guarded(&s, &held).await.unwrap();
    assert!(
        attempt.failed.is_some(),
        "a takeover landed after its DC renewed"
    );
    assert_eq!(store.successor(&from).await.unwrap(), None);
    let reply = store.take_over(&s, TakeoverPolicy::Automatic).await;
    assert!(
        matches!(&reply, Ok(TakeOverReply::Refused(state)) if state.standing != homing_core::DcStanding::Expired),
        "{reply:?}"
    );
}

/// A takeover whose guarded write landed on a member that then lost its
/// answer is retried on another member; the retry's guard fails on the
/// succession the first attempt wrote, which is the caller's own: the
/// call answers `Taken`, once.
async fn a_takeover_whose_answer_was_lost_is_recognised_as_ours(backend: &EtcdBackend) {
    let prefix = backend.prefix("global", "takeover_lost");
    let plain = EtcdGlobalStore::connect(&backend.endpoints, &prefix)
        .await
        .unwrap();
    let iad = DcId::new("iad").unwrap();
    expired(&plain, &iad).await;
    let relay = AnswerRelay::start(&backend.endpoints[0]).await;
    // Round-robin over two: the takeover's read goes to member 1, its
    // write through the relay.
    let endpoints = [backend.endpoints[1].clone(), relay.endpoint()];
    let store = EtcdGlobalStore::connect(&endpoints, &prefix).await.unwrap();
    warm_round_robin(&store.space).await;
    relay.lose_answers();
    let from: ReservationId = "iad.1".parse().unwrap();
    let s = Succession::taken_over(from.clone(), "fra.1".parse().unwrap(), 41);
    let reply = store.take_over(&s, TakeoverPolicy::Automatic).await;
    assert_eq!(reply.unwrap(), TakeOverReply::Taken);
    assert!(relay.lost_any(), "the takeover's answer was not lost");
    let failover = store.failover().unwrap();
    assert_eq!(failover.total(FailoverEvent::AmbiguousResolved), 1);
    assert_eq!(plain.successor(&from).await.unwrap(), Some(s));
}

/// Writes in sequence while member 0 is frozen (SIGSTOP): the first that
/// goes to it misses its deadline and is retried elsewhere; after that
/// the member is avoided, so writes stop paying the deadline. Once
/// resumed it answers a probe and is healthy again.
async fn a_frozen_member_costs_one_deadline_then_is_avoided_until_it_answers(
    backend: &EtcdBackend,
    cluster: &LocalEtcdCluster,
) {
    const WRITES: usize = 30;
    let store = EtcdGlobalStore::connect(&backend.endpoints, &backend.prefix("global", "frozen"))
        .await
        .unwrap();
    let failover = store.failover().unwrap();
    assert!(cluster.freeze_member(0));
    let iad = homing_core::DcId::new("iad").unwrap();
    for n in 0..WRITES {
        let key = Key::new(homing_core::KeyName::new(format!("f{n}")).unwrap());
        let id = ReservationId::new(iad.clone(), n as u64 + 1);
        let written = store.set_if_absent(&key, &id).await;
        if written.is_err() {
            cluster.thaw_member(0);
        }
        assert_eq!(written.unwrap(), SetIfAbsent::Inserted);
    }
    let missed = failover.total(FailoverEvent::DeadlineMissed);
    let healthy_while_frozen = failover.endpoints()[0].healthy();
    assert!(cluster.thaw_member(0));
    // A frozen leader also stalls the others until one is elected: a
    // few misses there, never one per write that went round to member 0
    // (without avoiding it: 12 in 30).
    assert!(
        (1..=5).contains(&missed),
        "{missed} deadlines missed in {WRITES} writes"
    );
    assert!(!healthy_while_frozen, "the frozen member was not avoided");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !failover.endpoints()[0].healthy() {
        assert!(
            std::time::Instant::now() < deadline,
            "the resumed member did not answer a probe within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Calls at once on fresh keys and on keys already taken, several per
/// key: grouped into nested transactions, each call is answered what its
/// own key holds — one `Inserted` per fresh key, every other call the
/// winner's id.
async fn concurrent_write_once_calls_each_get_their_own_outcome(backend: &EtcdBackend) {
    const KEYS: usize = 96;
    const CALLS_PER_KEY: usize = 3;
    let store = Arc::new(
        EtcdGlobalStore::connect(&backend.endpoints, &backend.prefix("global", "batched"))
            .await
            .unwrap(),
    );
    let iad = homing_core::DcId::new("iad").unwrap();
    let key = |k: usize| Key::new(homing_core::KeyName::new(format!("b{k}")).unwrap());
    let id = |k: usize, call: usize| ReservationId::new(iad.clone(), (k * 10 + call + 1) as u64);
    // Every other key is taken before the race, by call 9.
    for k in (0..KEYS).step_by(2) {
        assert_eq!(
            store.set_if_absent(&key(k), &id(k, 9)).await.unwrap(),
            SetIfAbsent::Inserted
        );
    }
    let mut tasks = Vec::new();
    for call in 0..CALLS_PER_KEY {
        for k in 0..KEYS {
            let (store, key, id) = (store.clone(), key(k), id(k, call));
            tasks.push(tokio::spawn(async move {
                (k, id.clone(), store.set_if_absent(&key, &id).await.unwrap())
            }));
        }
    }
    let mut winners = std::collections::BTreeMap::new();
    let mut answers = Vec::new();
    for task in tasks {
        let (k, id, outcome) = task.await.unwrap();
        if outcome == SetIfAbsent::Inserted {
            assert!(winners.insert(k, id).is_none(), "two calls inserted b{k}");
        } else {
            answers.push((k, outcome));
        }
    }
    for k in 0..KEYS {
        let winner = match winners.get(&k) {
            Some(winner) => {
                assert!(k % 2 == 1, "b{k} was taken before the race");
                winner.clone()
            }
            None => {
                assert!(k % 2 == 0, "no call inserted fresh b{k}");
                id(k, 9)
            }
        };
        assert_eq!(store.get(&key(k)).await.unwrap(), Some(winner));
    }
    for (k, outcome) in answers {
        let stored = store.get(&key(k)).await.unwrap().unwrap();
        assert_eq!(outcome, SetIfAbsent::Exists(stored), "b{k}");
    }
}

/// KV requests (ranges and transactions) the members at `endpoints`
/// have started, from their Prometheus metrics.
async fn kv_requests(endpoints: &[String]) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut total = 0;
    for endpoint in endpoints {
        let addr = endpoint
            .strip_prefix("http://")
            .expect("an http:// endpoint");
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: etcd\r\n\r\n")
            .await
            .expect("send");
        let mut body = String::new();
        stream.read_to_string(&mut body).await.expect("metrics");
        total += body
            .lines()
            .filter(|l| l.starts_with("grpc_server_started_total{"))
            .filter(|l| l.contains("grpc_service=\"etcdserverpb.KV\""))
            .filter(|l| l.contains("grpc_method=\"Range\"") || l.contains("grpc_method=\"Txn\""))
            .map(|l| {
                let count = l.rsplit(' ').next().expect("a sample value");
                count.parse::<f64>().expect("a number") as u64
            })
            .sum::<u64>();
    }
    total
}

async fn concurrent_nearest_reads_share_transactions_and_each_get_their_own_entry(
    backend: &EtcdBackend,
) {
    const KEYS: usize = 128;
    const CALLS_PER_KEY: usize = 2;
    let store = Arc::new(
        EtcdGlobalStore::connect(&backend.endpoints, &backend.prefix("global", "nearest"))
            .await
            .unwrap(),
    );
    let iad = homing_core::DcId::new("iad").unwrap();
    let key = |k: usize| Key::new(homing_core::KeyName::new(format!("n{k}")).unwrap());
    let id = |k: usize| ReservationId::new(iad.clone(), k as u64 + 1);
    // Every other key has an entry.
    for k in (0..KEYS).step_by(2) {
        store.set_if_absent(&key(k), &id(k)).await.unwrap();
    }
    // A linearizable read on each member (round-robin): each has
    // applied the writes, so its serializable answers include them.
    for _ in 0..backend.endpoints.len() {
        store.get(&key(0)).await.unwrap();
    }
    let before = kv_requests(&backend.endpoints).await;
    let mut tasks = Vec::new();
    for _ in 0..CALLS_PER_KEY {
        for k in 0..KEYS {
            let (store, key) = (store.clone(), key(k));
            tasks.push(tokio::spawn(async move {
                (k, store.get_nearest(&key).await.unwrap())
            }));
        }
    }
    for task in tasks {
        let (k, entry) = task.await.unwrap();
        let expected = (k % 2 == 0).then(|| id(k));
        assert_eq!(entry, expected, "n{k}");
    }
    let requests = kv_requests(&backend.endpoints).await - before;
    let calls = (KEYS * CALLS_PER_KEY) as u64;
    assert!(
        requests <= calls / 4,
        "{calls} concurrent nearest reads took {requests} etcd requests: not grouped"
    );
}

/// A session row opened at store time 0 (ttl 10 s).
fn opened_session(name: &str) -> SessionRecord {
    SessionRecord::open(
        name.parse().unwrap(),
        conformance::lease(),
        homing_core::HostTime::from_ms(0),
        homing_core::StoreTime::from_ms(0),
        &homing_core::LeasePolicy::DEFAULT,
    )
    .0
}

/// `row` renewed at store time `at_ms`.
fn renewed_session(row: &SessionRecord, at_ms: u64) -> SessionRecord {
    row.renew(
        &conformance::lease(),
        homing_core::HostTime::from_ms(at_ms),
        homing_core::StoreTime::from_ms(at_ms),
        &homing_core::LeasePolicy::DEFAULT,
    )
    .next
    .unwrap()
}

/// A fresh record held under session `row`.
fn session_record(unique: u64, row: &SessionRecord) -> DcRecord {
    let mut record = test_record(unique);
    if let homing_core::RecordState::Active { expiry, .. } = &mut record.state {
        *expiry = homing_core::Expiry::Session(row.id.clone());
    }
    record
}

/// A guard that only checks `row`'s version.
fn joins(row: &SessionRecord) -> SessionGuard {
    SessionGuard {
        id: row.id.clone(),
        version: row.version,
        next: None,
    }
}

/// A session renewal whose transaction landed but whose answer was lost
/// is retried on another member; the retry's guard fails on the row it
/// wrote itself, and the caller is told Written, once: the row is at the
/// next version, not two past it, and a renewal judged on the old
/// version still conflicts.
async fn a_session_renewal_whose_answer_was_lost_is_written_once(backend: &EtcdBackend) {
    let relay = AnswerRelay::start(&backend.endpoints[0]).await;
    let endpoints = [relay.endpoint(), backend.endpoints[1].clone()];
    let prefix = backend.prefix("dc", "lost_session_cas");
    let store = EtcdDcStore::connect(&endpoints, &prefix).await.unwrap();
    // Round-robin from member 0: the create reads (0) and writes (1); one
    // read (0); the renewal then reads on member 1 and writes on member 0,
    // through the relay.
    let row = opened_session("iad~1");
    let created = store.compare_and_set_session(None, &row).await.unwrap();
    assert_eq!(created, SessionCas::Written);
    assert_eq!(store.session(&row.id).await.unwrap(), Some(row.clone()));
    relay.lose_answers();
    let next = renewed_session(&row, 1_000);
    let renewal = store.compare_and_set_session(Some(1), &next).await;
    assert_eq!(renewal.unwrap(), SessionCas::Written);
    assert!(relay.lost_any(), "the renewal's answer was not lost");
    let failover = store.failover().unwrap();
    assert_eq!(failover.total(FailoverEvent::AmbiguousResolved), 1);
    assert_eq!(store.session(&row.id).await.unwrap(), Some(next.clone()));
    let stale = renewed_session(&row, 2_000);
    assert_eq!(
        store
            .compare_and_set_session(Some(1), &stale)
            .await
            .unwrap(),
        SessionCas::Conflict {
            current: Some(next.clone())
        }
    );
    let due = store.due_sessions(homing_core::StoreTime::from_ms(99_000), None, 128);
    assert_eq!(due.await.unwrap(), vec![next], "one sessions-due entry");
}

/// A freeze (a guarded write that also writes the session row) whose
/// transaction landed but whose answer was lost: the retry's guards fail
/// on its own record and row, the read-back recognises the record, and
/// the caller is told Written, once: one notice numbered, one event.
async fn a_freeze_whose_answer_was_lost_is_written_once_with_its_row(backend: &EtcdBackend) {
    let relay = AnswerRelay::start(&backend.endpoints[0]).await;
    let endpoints = [relay.endpoint(), backend.endpoints[1].clone()];
    let prefix = backend.prefix("dc", "lost_freeze");
    let store = EtcdDcStore::connect(&endpoints, &prefix).await.unwrap();
    // Round-robin from member 0: the row's read (0) and write (1); the
    // first join's row read (0), head read (1) and write (0); the second
    // join's row read (1) and write (0); the freeze's row read (1) and
    // write (0), through the relay.
    let row = opened_session("iad~1");
    store.compare_and_set_session(None, &row).await.unwrap();
    for unique in [1, 2] {
        let (record, guard) = (session_record(unique, &row), joins(&row));
        let joined = store.compare_and_set_in_session(None, &record, &guard);
        assert_eq!(joined.await.unwrap(), GuardedCas::Written);
    }
    let held = store.get(&test_record(2).id).await.unwrap().unwrap();
    // The get went to member 1: the freeze's row read goes to member 0.
    // One more read puts the freeze's write on member 0.
    store.session(&row.id).await.unwrap();
    relay.lose_answers();
    let frozen = held.drain(Some(&row)).expect("a held key drains");
    let (next, notice) = row.noticed();
    let freeze = SessionGuard {
        id: row.id.clone(),
        version: row.version,
        next: Some(next.clone()),
    };
    let written = store
        .compare_and_set_in_session(Some(1), &frozen, &freeze)
        .await;
    assert_eq!(written.unwrap(), GuardedCas::Written);
    assert!(relay.lost_any(), "the freeze's answer was not lost");
    let failover = store.failover().unwrap();
    assert_eq!(failover.total(FailoverEvent::AmbiguousResolved), 1);
    assert_eq!(store.session(&row.id).await.unwrap(), Some(next.clone()));
    assert_eq!(store.get(&frozen.id).await.unwrap(), Some(frozen.clone()));
    let notices = store.session_notices(&row.id, 0, 128).await.unwrap();
    assert_eq!((notices, notice), (vec![frozen.clone()], 1));
    // The same freeze judged again on the old row is refused: the row moved.
    let again = store
        .compare_and_set_in_session(Some(1), &frozen, &freeze)
        .await;
    assert_eq!(
        again.unwrap(),
        GuardedCas::SessionMoved {
            current: Some(next)
        }
    );
    let kinds = event_kinds(&store).await;
    let frozen_events = kinds.iter().filter(|k| **k != "reserved").count();
    assert!(frozen_events <= 1, "{kinds:?}");
    assert_eq!(kinds.iter().filter(|k| **k == "reserved").count(), 2);
}

/// Many joins and a freeze of one session queued at once (the appender
/// groups them): each join lands before the freeze or is told the session
/// moved, and the session-keys index lists exactly the keys that landed.
async fn joins_racing_a_freeze_each_land_before_it_or_see_the_session_moved(backend: &EtcdBackend) {
    const JOINS: u64 = 40;
    let prefix = backend.prefix("dc", "freeze_and_joins");
    let store = Arc::new(
        EtcdDcStore::connect(&backend.endpoints, &prefix)
            .await
            .unwrap(),
    );
    let row = opened_session("iad~1");
    store.compare_and_set_session(None, &row).await.unwrap();
    let first = session_record(1, &row);
    let guard = joins(&row);
    let joined = store.compare_and_set_in_session(None, &first, &guard);
    assert_eq!(joined.await.unwrap(), GuardedCas::Written);
    let frozen = first.drain(Some(&row)).unwrap();
    let (next, _) = row.noticed();
    let freeze = SessionGuard {
        id: row.id.clone(),
        version: row.version,
        next: Some(next.clone()),
    };
    let mut racers = Vec::new();
    for unique in 2..2 + JOINS {
        let (joiner, record, guard) = (store.clone(), session_record(unique, &row), joins(&row));
        racers.push(tokio::spawn(async move {
            joiner
                .compare_and_set_in_session(None, &record, &guard)
                .await
        }));
        if unique == 2 + JOINS / 2 {
            let (freezer, frozen, freeze) = (store.clone(), frozen.clone(), freeze.clone());
            racers.push(tokio::spawn(async move {
                freezer
                    .compare_and_set_in_session(Some(1), &frozen, &freeze)
                    .await
            }));
        }
    }
    let mut landed = 0;
    for racer in racers {
        match racer.await.unwrap().unwrap() {
            GuardedCas::Written => landed += 1,
            GuardedCas::SessionMoved { current } => assert_eq!(current, Some(next.clone())),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        store.session(&row.id).await.unwrap(),
        Some(next),
        "the freeze landed"
    );
    let keys = store.session_keys(&row.id, None, 128).await.unwrap();
    // Every key that landed is in the index (the first, and the freeze
    // counted among `landed` is the first's record again).
    assert_eq!(keys.len(), landed);
}

/// The race the session row's compare closes: a join judged on the row as
/// read (version 1) reaches the appender after a renewal moved the row.
/// Its transaction compares the row's revision as read, so nothing is
/// written and the caller gets the row as it is now, to judge again.
async fn a_guarded_append_whose_session_row_moved_after_it_was_read_writes_nothing(
    backend: &EtcdBackend,
) {
    let prefix = backend.prefix("dc", "guard_race");
    let store = EtcdDcStore::connect(&backend.endpoints, &prefix)
        .await
        .unwrap();
    let row = opened_session("iad~1");
    store.compare_and_set_session(None, &row).await.unwrap();
    let row_key = store.session_key(&row.id);
    let read = store.space.get(Op::HotRead, row_key.clone(), None).await;
    let read_revision = read.unwrap().kvs()[0].mod_revision();
    let next = renewed_session(&row, 1_000);
    store.compare_and_set_session(Some(1), &next).await.unwrap();
    let record = session_record(1, &row);
    let append = super::log::Append {
        record_key: store.record_key(&record.id),
        read_revision: None,
        puts: vec![(
            store.record_key(&record.id),
            keyspace::encode_record(&record).unwrap(),
        )],
        deletes: Vec::new(),
        guard: Some(super::log::SessionGuardRead {
            key: row_key,
            read_revision: Some(read_revision),
        }),
        event: None,
    };
    match store.appender.submit(append).await.unwrap() {
        super::log::Appended::Moved { now, session, .. } => {
            assert!(now.is_none(), "the record was not written");
            let session = session.expect("the row is read back");
            let current = crate::session::decode_session(session.value()).unwrap();
            assert_eq!(current, next);
        }
        written => panic!("a join landed on a moved session row: {written:?}"),
    }
    assert_eq!(store.get(&record.id).await.unwrap(), None);
}
