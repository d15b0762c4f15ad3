//! Migration: copying a deployment's state — the global entries, every
//! DC's successions and lease entry (terms, marks, retirement) and the
//! settings, and each DC's host sessions' rows, records, lifecycle event
//! log and allocator —
//! from one set of stores to another of any
//! backend (the embedded redb of a single-node start to etcd or
//! FoundationDB when a deployment grows), then verifying the copy.
//!
//! A copy is idempotent and resumable: every write is an import that leaves
//! an equal item alone, so a run stopped anywhere is finished by running it
//! again. It never overwrites what differs: a write-once global entry or
//! succession, a setting, a record or an event that the target holds with
//! other contents is a [`Conflict`], reported with both values and left as
//! it is.
//!
//! Migration is **offline**: every homingd of the deployment must be
//! stopped. A live daemon changes records while they are copied (renewals
//! bump versions, the reaper releases, each change appends an event), so the
//! copy would mix two moments and the verification would fail; worse, a
//! reservation allocated at the source after the target's allocator was
//! raised could later be handed out again by the target.
//!
//! The target is marked while it is copied into: every target DC store's
//! [`DcStore::set_migrating`] mark is set before the first item is copied
//! and cleared only once the copy verified, so homingd refuses to start on a
//! half-copied store (re-run the migration to finish it). The other way
//! round, a store a homingd holds cannot be migrated into where the backend
//! locks it (redb: the file is open; `homing migrate` fails to open it).
//!
//! Order, per DC: raise the target's allocator above the source's floor
//! first, so the target never hands out a reservation (or session) ID the
//! source used, even when the copy stops half way; then the host sessions'
//! rows ([`DcStore::import_session`], found by [`DcStore::sessions`]),
//! before the records held under them (a key joins a session only while
//! its row exists; the records' session indexes are derived again by each
//! import); then records; then events in `seq`
//! order, so an interrupted copy leaves a gap-free prefix of the log. Then
//! the settings (each a swap from never set), which no conflict holds back:
//! a setting can be changed again by compare-and-set. Then every DC's
//! successions ([`GlobalStore::import_succession`], found by
//! [`GlobalStore::scan_successions`], so a DC the store keeps no lease of
//! is not missed), after the records as a mover writes its record before it
//! confirms its move. Then every DC's lease entry, after the successions:
//! see [`migrate`] for why that order keeps any takeover at the target from
//! forking a chain, and why the marks must be copied at all. Global entries
//! come last, in the order a reserve writes them (record first, then
//! entry): an entry in the target has its record there. Successions, DC
//! leases and entries are held back (judged, not written) when a DC's
//! records or events conflicted: none can ever be taken back.
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::sync::Arc;

use homing_core::{
    DcId, DcLeaseState, DcRecord, DcRenewal, DcTerms, Event, EventSeq, Key, Link, NamespaceScope,
    ReservationId, SessionId, SessionRecord, SessionState, Succession, SuccessionCause,
};
use tokio::task::JoinHandle;

use crate::dc::SESSION_PAGE_MAX;
use crate::dc::{
    DcStore, EVENTS_LIMIT_MAX, Import, SCAN_LIMIT_MAX, ScanCursor, judge_event_import,
    judge_import, judge_session_import,
};
use crate::error::StoreError;
use crate::global::{DCS_MAX, GET_MANY_KEYS_MAX, GlobalStore, SetIfAbsent, SuccessionPages};
use crate::setting::Setting;

mod copy;
mod report;
mod verify;

use copy::{Counts, Mode, Samples, Walk, count, count_as};
pub use report::*;
use verify::{check, event_diff, lease_diff, record_diff};

/// Records, entries and events compared per DC (entries: in all) when
/// [`MigrateOptions::sample`] is not set otherwise.
pub const SAMPLE_DEFAULT: usize = 64;
/// Most items of each kind a verification samples (they are held in memory).
pub const SAMPLE_MAX: usize = 10_000;
/// Most conflicts a report lists; the rest are counted.
pub const CONFLICTS_LISTED_MAX: usize = 100;
/// Most mismatches a verification lists; the rest are counted.
pub const MISMATCHES_LISTED_MAX: usize = 100;
/// Most distinct DCs noted from the global entries' reservation IDs.
pub const REFERENCED_DCS_MAX: usize = 1_024;

/// One deployment's stores: the global store and the DC stores to copy.
#[derive(Clone)]
pub struct StoreSet {
    /// The global store.
    pub global: Arc<dyn GlobalStore>,
    /// Each DC's store, by DC.
    pub dcs: Vec<(DcId, Arc<dyn DcStore>)>,
}

impl StoreSet {
    fn dc_ids(&self) -> Vec<&DcId> {
        self.dcs.iter().map(|(dc, _)| dc).collect()
    }
}

/// How to migrate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrateOptions {
    /// Read only: report what would be copied, present or conflicting, and
    /// write nothing (no verification: the target is not meant to match).
    pub dry_run: bool,
    /// How many records (and events) per DC, and global entries, the
    /// verification compares field by field, spread evenly over the key
    /// space; capped at [`SAMPLE_MAX`]. 0 compares counts only.
    pub sample: usize,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            dry_run: false,
            sample: SAMPLE_DEFAULT,
        }
    }
}
/// Copies `source` into `target`: for each DC (in order) the allocator, the
/// host sessions' rows, the records and the events, then the settings, then every DC's successions,
/// then every DC's lease entry, then the global entries (successions,
/// leases and entries held back, only judged, if a record or event
/// conflicted); then verifies the target (see [`verify`]) unless
/// `options.dry_run`. `progress` is called
/// after every page. Conflicts are reported, never overwritten; a run that
/// fails part way (a store error) is resumed by running it again.
///
/// Offline only: every daemon using either set must be stopped (see the
/// module docs).
///
/// # Panics
/// If `source` and `target` do not list the same DCs in the same order (a
/// caller bug).
pub async fn migrate(
    source: &StoreSet,
    target: &StoreSet,
    options: &MigrateOptions,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<MigrateReport, StoreError> {
    assert_eq!(
        source.dc_ids(),
        target.dc_ids(),
        "source and target must list the same DCs"
    );
    let counts = count(source, progress).await?;
    let mode = if options.dry_run {
        Mode::DryRun
    } else {
        Mode::Copy
    };
    let mut walk = Walk::new(mode, options.sample, progress);
    let mut report = MigrateReport {
        dry_run: options.dry_run,
        settings: Tally::default(),
        successions: Tally::default(),
        dc_leases: Tally::default(),
        global: Tally::default(),
        global_held_back: false,
        dcs: Vec::with_capacity(source.dcs.len()),
        conflicts: Vec::new(),
        unmigrated_dcs: counts
            .referenced_dcs
            .iter()
            .filter(|(dc, _)| !source.dcs.iter().any(|(d, _)| &d == dc))
            .map(|(dc, n)| (dc.clone(), *n))
            .collect(),
        verification: None,
    };
    if walk.mode == Mode::Copy {
        // Before anything is copied: a homingd must not start on a half-copied store.
        for (_, to) in &target.dcs {
            to.set_migrating(true).await?;
        }
    }
    for (i, ((dc, from), (_, to))) in source.dcs.iter().zip(&target.dcs).enumerate() {
        let dc_counts = &counts.dcs[i];
        let allocator = walk.allocator(to.as_ref(), dc_counts).await?;
        // Before the records: a key held under a session is held only
        // while its row says so, so its row is in first.
        let sessions = walk.sessions(dc, from, to, dc_counts.sessions).await?;
        let records = walk.records(i, dc, from, to, dc_counts.records).await?;
        let events = walk
            .events(i, dc, from.as_ref(), to.as_ref(), dc_counts)
            .await?;
        report.dcs.push(DcReport {
            dc: dc.clone(),
            allocator,
            sessions,
            records,
            events,
        });
    }
    report.settings = walk
        .settings(target.global.as_ref(), &counts.settings)
        .await?;
    if report.dc_conflicts() > 0 && walk.mode == Mode::Copy {
        walk.mode = Mode::DryRun;
        report.global_held_back = true;
    }
    // Every succession is in the target before anything could take over
    // there: a takeover of a reservation whose move is not copied yet would
    // fork the key's chain (two holders). The target takes over only a DC
    // whose lease it judges expired, and never one it has no lease entry of
    // (`Unknown`): so the successions come before the DC leases, and until
    // the leases are in, nothing at the target can be taken over, even if
    // the copy stops in between. After the records, which a mover writes
    // before it confirms its move.
    report.successions = walk
        .successions(source.global.as_ref(), &target.global, counts.successions)
        .await?;
    // The DC leases' marks must reach the target: a DC restarted there
    // publishes only what it wants now (a token bound of its headroom, not
    // its highest token), and a takeover's token is the token bound the
    // store keeps + 1 — below tokens the DC granted before, without the
    // copied bound. Each lease counts as renewed at the copy (as a store
    // that restarts counts every DC it knows), so the target never calls a
    // DC expired sooner than the source would; a retired DC stays retired.
    report.dc_leases = walk
        .dc_leases(target.global.as_ref(), &counts.dc_leases)
        .await?;
    report.global = walk
        .global(source.global.as_ref(), &target.global, counts.global)
        .await?;
    let Walk {
        conflicts, samples, ..
    } = walk;
    report.conflicts = conflicts;
    if !options.dry_run {
        report.verification = Some(check(source, target, &counts, &samples, progress).await?);
        // Only a copy that verified frees the target for homingd.
        if report.ok() {
            for (_, to) in &target.dcs {
                to.set_migrating(false).await?;
            }
        }
    }
    Ok(report)
}

/// Verifies that `target` holds what `source` holds, reading both and
/// writing nothing: equal counts of global entries and of each DC's records
/// and kept events, every setting and every succession equal and every
/// DC's lease entry kept (whatever `sample`), each target allocator floor and
/// event head at or above the source's, and `sample` records and events per DC and `sample` global
/// entries (spread evenly over the key space, the same ones every run)
/// equal field by field, with the global entries of the sampled records'
/// keys.
///
/// # Panics
/// If `source` and `target` do not list the same DCs in the same order (a
/// caller bug).
pub async fn verify(
    source: &StoreSet,
    target: &StoreSet,
    sample: usize,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<Verification, StoreError> {
    assert_eq!(
        source.dc_ids(),
        target.dc_ids(),
        "source and target must list the same DCs"
    );
    let counts = count(source, progress).await?;
    let mut walk = Walk::new(Mode::Sample, sample, progress);
    for (i, ((dc, from), (_, to))) in source.dcs.iter().zip(&target.dcs).enumerate() {
        walk.records(i, dc, from, to, counts.dcs[i].records).await?;
        walk.events(i, dc, from.as_ref(), to.as_ref(), &counts.dcs[i])
            .await?;
    }
    walk.global(source.global.as_ref(), &target.global, counts.global)
        .await?;
    let samples = walk.samples;
    check(source, target, &counts, &samples, progress).await
}
#[cfg(test)]
mod tests {
    use super::copy::{LeaseCopy, Picker, lease_copy, scan_page};
    use super::*;
    use crate::dc::Cas;
    use crate::dc::SESSION_PAGE_MAX;
    use crate::memory::{MemoryDcStore, MemoryGlobalStore};
    use homing_core::{
        ActorId, DcMarks, FencingToken, HostTime, KeyName, LeasePolicy, Namespace, RunOutcome,
        SessionId, SessionRecord, StoreTime,
    };

    const POLICY: LeasePolicy = LeasePolicy::DEFAULT;

    fn memory_set(dcs: &[&str]) -> StoreSet {
        StoreSet {
            global: Arc::new(MemoryGlobalStore::new()),
            dcs: dcs
                .iter()
                .map(|dc| {
                    let store: Arc<dyn DcStore> = Arc::new(MemoryDcStore::new());
                    (DcId::new(*dc).unwrap(), store)
                })
                .collect(),
        }
    }

    async fn write(store: &dyn DcStore, expected: Option<u64>, record: &DcRecord) {
        assert_eq!(
            store.compare_and_set(expected, record).await.unwrap(),
            Cas::Written
        );
    }

    /// `per_dc` keys per DC over three namespaces, each reserved; then kept
    /// active, released, recreated (released, linked to a new reservation)
    /// or abandoned, in turn. Every key gets its global entry.
    async fn populate(set: &StoreSet, per_dc: u64) {
        for (dc, store) in &set.dcs {
            for i in 0..per_dc {
                let ns = ["", "a", "a/b"][(i % 3) as usize];
                let key = Key::in_namespace(
                    Namespace::new(ns).unwrap(),
                    KeyName::new(format!("{dc}-{i}")).unwrap(),
                );
                let id = ReservationId::new(dc.clone(), store.allocate().await.unwrap());
                let now = StoreTime::from_ms(i);
                let (r, _) = DcRecord::reserve(
                    id,
                    key,
                    None,
                    FencingToken::FIRST,
                    None,
                    &homing_core::Holding {
                        actor: ActorId::new("10.0.0.1:9000").unwrap(),
                        lease: crate::conformance::lease(),
                        host_time: HostTime::from_ms(0),
                        session: None,
                    },
                    now,
                    &POLICY,
                );
                write(store.as_ref(), None, &r).await;
                set.global.set_if_absent(&r.key, &r.id).await.unwrap();
                let released = r
                    .release(r.token, &crate::conformance::lease(), RunOutcome::Ok, now)
                    .next;
                match i % 4 {
                    0 => {}
                    1 => write(store.as_ref(), Some(1), &released.unwrap()).await,
                    2 => {
                        let released = released.unwrap();
                        write(store.as_ref(), Some(1), &released).await;
                        let next = ReservationId::new(dc.clone(), store.allocate().await.unwrap());
                        let (r2, _) = DcRecord::reserve(
                            next.clone(),
                            r.key.clone(),
                            None,
                            r.token.next(),
                            (Some(r.id.clone())).map(|reservation| homing_core::PreviousRun {
                                reservation,
                                token: homing_core::FencingToken::FIRST,
                                ended: homing_core::ReleaseCause::Expired,
                            }),
                            &homing_core::Holding {
                                actor: ActorId::new("10.0.0.2:9000").unwrap(),
                                lease: crate::conformance::lease(),
                                host_time: HostTime::from_ms(0),
                                session: None,
                            },
                            now,
                            &POLICY,
                        );
                        write(store.as_ref(), None, &r2).await;
                        let linked = released
                            .link(&released.key, &next, released.token, now, &POLICY, None)
                            .next;
                        write(store.as_ref(), Some(2), &linked.unwrap()).await;
                    }
                    _ => write(store.as_ref(), Some(1), &r.abandon().unwrap()).await,
                }
            }
        }
    }

    async fn run(source: &StoreSet, target: &StoreSet, dry_run: bool) -> MigrateReport {
        let options = MigrateOptions {
            dry_run,
            sample: SAMPLE_MAX,
        };
        migrate(source, target, &options, &mut |_| {})
            .await
            .unwrap()
    }

    async fn all_records(store: &dyn DcStore) -> Vec<DcRecord> {
        let mut out = Vec::new();
        let mut after = None;
        loop {
            let page = scan_page(store, after.as_ref()).await.unwrap();
            after = page.last().map(ScanCursor::after);
            let last = page.len() < SCAN_LIMIT_MAX;
            out.extend(page);
            if last {
                return out;
            }
        }
    }

    async fn all_events(store: &dyn DcStore) -> Vec<Event> {
        let mut out = Vec::new();
        loop {
            let after = out.last().map_or(0, |e: &Event| e.seq);
            let page = store.events(after, EVENTS_LIMIT_MAX).await.unwrap();
            let last = page.events.len() < EVENTS_LIMIT_MAX;
            out.extend(page.events);
            if last {
                return out;
            }
        }
    }

    async fn all_entries(store: &dyn GlobalStore) -> Vec<(Key, ReservationId)> {
        let mut out: Vec<(Key, ReservationId)> = Vec::new();
        loop {
            let after = out.last().map(|(k, _)| k.clone());
            let page = store.scan(after.as_ref(), GET_MANY_KEYS_MAX).await.unwrap();
            let last = page.len() < GET_MANY_KEYS_MAX;
            out.extend(page);
            if last {
                return out;
            }
        }
    }

    #[tokio::test]
    async fn copy_moves_every_entry_record_and_event_and_raises_the_allocator() {
        let (source, target) = (memory_set(&["iad", "fra"]), memory_set(&["iad", "fra"]));
        populate(&source, 300).await;
        let mut steps = Vec::new();
        let report = migrate(&source, &target, &MigrateOptions::default(), &mut |p| {
            steps.push(p.step.clone())
        })
        .await
        .unwrap();
        assert!(report.ok(), "{report}");
        assert_eq!(report.global.copied, 600);
        assert_eq!(report.dcs[0].records.copied, 375, "300 keys + 75 recreated");
        assert!(report.dcs[0].events.copied > 375);
        assert_eq!(report.conflicts_total(), 0);
        assert!(report.verification.as_ref().unwrap().sampled > 0);
        assert_eq!(
            all_entries(target.global.as_ref()).await,
            all_entries(source.global.as_ref()).await
        );
        for ((_, from), (_, to)) in source.dcs.iter().zip(&target.dcs) {
            assert_eq!(
                all_records(to.as_ref()).await,
                all_records(from.as_ref()).await
            );
            assert_eq!(
                all_events(to.as_ref()).await,
                all_events(from.as_ref()).await
            );
            let floor = from.allocator_floor().await.unwrap();
            assert!(
                to.allocate().await.unwrap() > floor,
                "target allocates above the source"
            );
        }
        assert!(steps.contains(&Step::Records(DcId::new("fra").unwrap())));
        assert!(steps.contains(&Step::Global) && steps.contains(&Step::Verify));
        assert!(report.to_string().ends_with("result: OK"), "{report}");
    }

    #[tokio::test]
    async fn a_second_run_finds_everything_present_and_copies_nothing() {
        let (source, target) = (memory_set(&["iad"]), memory_set(&["iad"]));
        populate(&source, 150).await;
        let first = run(&source, &target, false).await;
        let second = run(&source, &target, false).await;
        assert!(second.ok(), "{second}");
        assert_eq!(second.global.copied, 0);
        assert_eq!(second.global.present, first.global.copied);
        let (a, b) = (&first.dcs[0], &second.dcs[0]);
        assert_eq!((b.records.copied, b.records.present), (0, a.records.copied));
        assert_eq!((b.events.copied, b.events.present), (0, a.events.copied));
    }

    #[tokio::test]
    async fn an_interrupted_copy_is_finished_by_running_it_again() {
        let (source, target) = (memory_set(&["iad"]), memory_set(&["iad"]));
        populate(&source, 40).await;
        // Half the records and the first events made it before the stop.
        let records = all_records(source.dcs[0].1.as_ref()).await;
        for r in &records[..records.len() / 2] {
            target.dcs[0].1.import(r).await.unwrap();
        }
        for e in &all_events(source.dcs[0].1.as_ref()).await[..10] {
            target.dcs[0].1.import_event(e).await.unwrap();
        }
        let report = run(&source, &target, false).await;
        assert!(report.ok(), "{report}");
        assert_eq!(report.dcs[0].records.present, (records.len() / 2) as u64);
        assert_eq!(report.dcs[0].events.present, 10);
    }

    async fn marked(set: &StoreSet) -> bool {
        set.dcs[0].1.migrating().await.unwrap()
    }

    #[tokio::test]
    async fn the_target_stays_marked_until_a_copy_verifies() {
        let (source, target) = (memory_set(&["iad"]), memory_set(&["iad"]));
        populate(&source, 20).await;
        run(&source, &target, true).await;
        assert!(!marked(&target).await, "a dry run marks nothing");
        // A copy that ends in a conflict leaves the target marked: homingd
        // must not start on it.
        let mut record = all_records(source.dcs[0].1.as_ref()).await.remove(3);
        record.allow_renew = !record.allow_renew;
        target.dcs[0].1.import(&record).await.unwrap();
        assert!(!run(&source, &target, false).await.ok());
        assert!(marked(&target).await, "an unfinished copy leaves its mark");
        assert!(!marked(&source).await, "the source is never marked");
        // A copy that verifies frees it.
        let fresh = memory_set(&["iad"]);
        assert!(run(&source, &fresh, false).await.ok());
        assert!(!marked(&fresh).await, "a verified copy clears its mark");
    }

    #[tokio::test]
    async fn conflicts_are_reported_with_both_values_and_never_overwritten() {
        let (source, target) = (memory_set(&["iad"]), memory_set(&["iad"]));
        populate(&source, 20).await;
        let (key, id) = all_entries(source.global.as_ref()).await.remove(0);
        let other: ReservationId = "fra.99".parse().unwrap();
        target.global.set_if_absent(&key, &other).await.unwrap();
        let mut record = all_records(source.dcs[0].1.as_ref()).await.remove(3);
        record.allow_renew = !record.allow_renew;
        target.dcs[0].1.import(&record).await.unwrap();
        let moved = succeed(&source, 1).await.remove(0);
        let iad = DcId::new("iad").unwrap();
        let kept = marks(1_025, 9, 0);
        source
            .global
            .renew_dc_lease(&iad, &TERMS, &kept)
            .await
            .unwrap();

        let report = run(&source, &target, false).await;
        assert!(!report.ok());
        assert_eq!(report.conflicts_total(), 2);
        assert!(report.conflicts.contains(&Conflict::Global {
            key: key.clone(),
            source: id,
            target: other.clone()
        }));
        assert!(report.conflicts.iter().any(|c| matches!(
            c,
            Conflict::Record { target, .. } if **target == record
        )));
        assert_eq!(target.global.get(&key).await.unwrap(), Some(other));
        assert_eq!(target.dcs[0].1.get(&record.id).await.unwrap(), Some(record));
        // The record conflict held the global entries back: none was written.
        assert!(report.global_held_back);
        assert_eq!(report.global.copied, 19, "judged as would-be copies");
        assert_eq!(all_entries(target.global.as_ref()).await.len(), 1);
        // ... and the successions, write-once too.
        assert_eq!(report.successions.copied, 1, "judged as a would-be copy");
        let held = target.global.successor(&moved.link.from).await.unwrap();
        assert_eq!(held, None);
        // ... and the DC leases, which would let the target take over.
        assert_eq!(report.dc_leases.copied, 1, "judged as a would-be copy");
        assert!(target.global.dc_leases().await.unwrap().is_empty());
        let text = report.to_string();
        assert!(text.contains("differing in allow_renew"), "{text}");
        assert!(
            text.contains("successions, dc leases and global entries held back"),
            "{text}"
        );
        assert!(text.ends_with("result: 2 CONFLICTS"), "{text}");
    }

    /// `n` successions in `set`'s global store of reservations of iad, fra
    /// and lax (a DC with no store in the set that never renewed a lease),
    /// in turn, each a move or a takeover; in store order. Moves are
    /// confirmed as a mover does; takeovers are imported (this store's
    /// lease judgement is not what these tests are about).
    async fn succeed(set: &StoreSet, n: u64) -> Vec<Succession> {
        let mut made = Vec::new();
        for i in 0..n {
            let from = ReservationId::new(
                DcId::new(["iad", "fra", "lax"][i as usize % 3]).unwrap(),
                1_000 + i,
            );
            let to = ReservationId::new(DcId::new("sea").unwrap(), i);
            let written = if i % 2 == 0 {
                let s = Succession::moved(from, to, FencingToken::new(i + 1));
                (set.global.set_successor(&s).await.unwrap(), s)
            } else {
                let s = Succession::taken_over(from, to, 1 << 20);
                (set.global.import_succession(&s).await.unwrap(), s)
            };
            assert_eq!(written.0, None);
            made.push(written.1);
        }
        made.sort_by(|a, b| a.link.from.cmp(&b.link.from));
        made
    }

    async fn all_successions(store: &dyn GlobalStore) -> Vec<Succession> {
        let mut pages = SuccessionPages::every();
        let mut out = Vec::new();
        while let Some(page) = pages.next(store).await.unwrap() {
            out.extend(page);
        }
        out
    }

    /// Every DC's successions are copied (more than a page; of a DC with no
    /// store in the set and no lease too) and found present by a second
    /// run; one the target holds with another successor is a conflict left
    /// as is, which holds nothing back; verify compares every succession
    /// (also with no sample) and catches one missing in the target and one
    /// only there.
    #[tokio::test]
    async fn successions_are_copied_never_overwritten_and_verified() {
        let (source, target) = (memory_set(&["iad", "fra"]), memory_set(&["iad", "fra"]));
        populate(&source, 10).await;
        let made = succeed(&source, 300).await;
        assert!(source.global.dc_leases().await.unwrap().is_empty());

        let dry = run(&source, &target, true).await;
        assert_eq!(dry.successions.copied, 300);
        assert!(all_successions(target.global.as_ref()).await.is_empty());
        let first = run(&source, &target, false).await;
        assert!(first.ok(), "{first}");
        assert_eq!(
            (first.successions.copied, first.successions.present),
            (300, 0)
        );
        assert_eq!(all_successions(target.global.as_ref()).await, made);
        let counted = Counted {
            source: 300,
            target: 300,
        };
        assert_eq!(first.verification.as_ref().unwrap().successions, counted);
        let text = first.to_string();
        assert!(
            text.contains("successions              300 → 300 ✓"),
            "{text}"
        );
        let second = run(&source, &target, false).await;
        assert_eq!(
            (second.successions.copied, second.successions.present),
            (0, 300)
        );

        let other = memory_set(&["iad", "fra"]);
        let ours = made
            .iter()
            .find(|s| s.link.from == "fra.1001".parse().unwrap())
            .unwrap()
            .clone();
        let theirs = Succession::moved(
            ours.link.from.clone(),
            "ord.1".parse().unwrap(),
            FencingToken::new(5),
        );
        other.global.import_succession(&theirs).await.unwrap();
        let report = run(&source, &other, false).await;
        assert!(!report.ok() && !report.global_held_back, "{report}");
        let tally = report.successions;
        assert_eq!((tally.copied, tally.conflicts), (299, 1));
        let held_back = report.global.copied;
        assert_eq!(held_back, 20, "a succession conflict holds nothing back");
        let conflict = Conflict::Succession {
            source: ours,
            target: theirs.clone(),
        };
        assert!(report.conflicts.contains(&conflict), "{report}");
        let held = other.global.successor(&theirs.link.from).await.unwrap();
        assert_eq!(held, Some(theirs));
        let line = format!(
            "succession of fra.1001: source taken over by sea.1 (token {}), target moved to ord.1 (token 5) (write-once: left as is)",
            (1_u64 << 20) + 1
        );
        assert!(report.to_string().contains(&line), "{report}");

        let only_in_target = Succession::moved(
            "ord.9".parse().unwrap(),
            "sea.9".parse().unwrap(),
            FencingToken::new(2),
        );
        target
            .global
            .import_succession(&only_in_target)
            .await
            .unwrap();
        let only_in_source =
            Succession::taken_over("zrh.1".parse().unwrap(), "sea.1".parse().unwrap(), 8);
        source
            .global
            .import_succession(&only_in_source)
            .await
            .unwrap();
        let v = verify(&source, &target, 0, &mut |_| {}).await.unwrap();
        let want = vec![
            Mismatch::SuccessionDiffers {
                from: only_in_target.link.from.clone(),
                source: None,
                target: Some(only_in_target),
            },
            Mismatch::SuccessionDiffers {
                from: only_in_source.link.from.clone(),
                source: Some(only_in_source),
                target: None,
            },
        ];
        assert_eq!(v.mismatches, want, "{v}");
        let text = v.to_string();
        assert!(
            text.contains("succession of zrh.1: source taken over by sea.1 (token 9), target none"),
            "{text}"
        );
    }

    const TERMS: DcTerms = DcTerms {
        ttl_ms: 20_000,
        host_lease_ttl_max_ms: 10_000,
        grace_ms: 1_000,
    };

    fn marks(allocator_floor: u64, token_bound: u64, event_head: u64) -> DcMarks {
        DcMarks {
            allocator_floor,
            token_bound,
            event_head,
        }
    }

    #[test]
    fn a_lease_is_copied_by_a_renewal_then_a_retirement_or_is_a_conflict() {
        let iad = DcId::new("iad").unwrap();
        let unknown = DcLeaseState::unknown(iad.clone());
        let kept = DcLeaseState {
            terms: Some(TERMS),
            marks: marks(10, 20, 30),
            ..unknown.clone()
        };
        let retired = |s: &DcLeaseState| DcLeaseState {
            retired: true,
            ..s.clone()
        };
        let (renew, retire) = (true, true);
        let longer = DcTerms {
            grace_ms: 5_000,
            ..TERMS
        };
        let above = DcLeaseState {
            terms: Some(longer),
            marks: marks(11, 21, 31),
            ..kept.clone()
        };
        let lower_bound = DcLeaseState {
            marks: marks(10, 19, 30),
            ..kept.clone()
        };
        let cases = [
            (&kept, &kept, LeaseCopy::Present),
            (&kept, &above, LeaseCopy::Present),
            (
                &above,
                &kept,
                LeaseCopy::Write {
                    renew,
                    retire: false,
                },
            ),
            (
                &kept,
                &unknown,
                LeaseCopy::Write {
                    renew,
                    retire: false,
                },
            ),
            (
                &kept,
                &lower_bound,
                LeaseCopy::Write {
                    renew,
                    retire: false,
                },
            ),
            (
                &retired(&kept),
                &kept,
                LeaseCopy::Write {
                    renew: false,
                    retire,
                },
            ),
            (
                &retired(&kept),
                &unknown,
                LeaseCopy::Write { renew, retire },
            ),
            (
                &retired(&unknown),
                &unknown,
                LeaseCopy::Write {
                    renew: false,
                    retire,
                },
            ),
            // The target retired it, for good: not undone, no renewal.
            (&kept, &retired(&kept), LeaseCopy::Conflict),
            (&retired(&kept), &retired(&unknown), LeaseCopy::Conflict),
        ];
        for (n, (source, target, want)) in cases.into_iter().enumerate() {
            assert_eq!(lease_copy(source, target), want, "case {n}");
        }
        let all = [
            "terms",
            "allocator_floor",
            "token_bound",
            "event_head",
            "retired",
        ];
        assert_eq!(lease_diff(&retired(&kept), &unknown), all);
        assert_eq!(lease_diff(&kept, &lower_bound), ["token_bound"]);
    }

    /// Every DC's lease entry is copied (a lost DC's with no store in the
    /// set, and one retired that never renewed, too) and found present by a
    /// second run; a DC the target retired and the source did not is a
    /// conflict left as is; verify compares every DC's and catches a token
    /// bound below the source's.
    #[tokio::test]
    async fn dc_leases_are_copied_with_their_marks_and_retirement_and_verified() {
        let (source, target) = (memory_set(&["iad"]), memory_set(&["iad"]));
        populate(&source, 10).await;
        let (iad, lax, ord) = (
            DcId::new("iad").unwrap(),
            DcId::new("lax").unwrap(),
            DcId::new("ord").unwrap(),
        );
        let renew = |dc: &DcId, marks: DcMarks| {
            let (global, dc) = (source.global.clone(), dc.clone());
            async move { global.renew_dc_lease(&dc, &TERMS, &marks).await.unwrap() }
        };
        renew(&iad, marks(1_025, 5 << 20, 3)).await;
        renew(&lax, marks(7, 9, 0)).await;
        source.global.retire_dc(&lax).await.unwrap();
        source.global.retire_dc(&ord).await.unwrap();
        let kept = |s: DcLeaseState| (s.dc, s.terms, s.marks, s.retired);
        let want: Vec<_> = source.global.dc_leases().await.unwrap();
        let want: Vec<_> = want.into_iter().map(kept).collect();

        let dry = run(&source, &target, true).await;
        assert_eq!(dry.dc_leases.copied, 3);
        assert!(target.global.dc_leases().await.unwrap().is_empty());
        let first = run(&source, &target, false).await;
        assert!(first.ok(), "{first}");
        assert_eq!((first.dc_leases.copied, first.dc_leases.present), (3, 0));
        let got = target.global.dc_leases().await.unwrap();
        assert_eq!(got.into_iter().map(kept).collect::<Vec<_>>(), want);
        let counted = Counted {
            source: 3,
            target: 3,
        };
        assert_eq!(first.verification.as_ref().unwrap().dc_leases, counted);
        let second = run(&source, &target, false).await;
        assert_eq!((second.dc_leases.copied, second.dc_leases.present), (0, 3));

        let other = memory_set(&["iad"]);
        other.global.retire_dc(&iad).await.unwrap();
        let report = run(&source, &other, false).await;
        assert!(!report.ok() && !report.global_held_back, "{report}");
        assert_eq!(
            (report.dc_leases.copied, report.dc_leases.conflicts),
            (2, 1)
        );
        let line = "dc lease iad: the target's differs from the source's in terms, allocator_floor, token_bound, event_head, retired, and the target retired the dc for good (left as is)";
        assert!(report.to_string().contains(line), "{report}");
        assert!(other.global.dc_lease(&iad).await.unwrap().terms.is_none());

        renew(&iad, marks(1_025, 6 << 20, 3)).await;
        let v = verify(&source, &target, 0, &mut |_| {}).await.unwrap();
        let below = Mismatch::DcLeaseDiffers {
            dc: iad,
            fields: vec!["token_bound"],
        };
        assert_eq!(v.mismatches, vec![below], "{v}");
        let text = v.to_string();
        assert!(
            text.contains("dc lease iad: the target's differs from the source's in token_bound"),
            "{text}"
        );
    }

    /// `n` session rows in `store`, from its allocator (every third ended),
    /// and under the first two keys: one held, one frozen (its notice
    /// numbered on the row). The rows as stored, in name order.
    async fn open_sessions(dc: &DcId, store: &dyn DcStore, n: u64) -> Vec<SessionRecord> {
        let mut rows = Vec::new();
        for i in 0..n {
            let id = SessionId::new(dc.clone(), store.allocate().await.unwrap());
            let now = StoreTime::from_ms(i);
            let (row, _) = SessionRecord::open(
                id,
                crate::conformance::lease(),
                HostTime::from_ms(0),
                now,
                &POLICY,
            );
            let cas = store.compare_and_set_session(None, &row).await.unwrap();
            assert_eq!(cas, crate::SessionCas::Written);
            let row = match i % 3 {
                2 => {
                    let closed = row.close(&crate::conformance::lease(), now).unwrap();
                    store
                        .compare_and_set_session(Some(1), &closed)
                        .await
                        .unwrap();
                    closed
                }
                _ => row,
            };
            rows.push(row);
        }
        let mut first = rows[0].clone();
        for name in ["held", "frozen"] {
            let key = Key::new(KeyName::new(format!("{dc}-session-{name}")).unwrap());
            let id = ReservationId::new(dc.clone(), store.allocate().await.unwrap());
            let mut record = crate::conformance::record(&id, &key);
            if let homing_core::RecordState::Active { expiry, .. } = &mut record.state {
                *expiry = homing_core::Expiry::Session(first.id.clone());
            }
            let joins = crate::SessionGuard {
                id: first.id.clone(),
                version: first.version,
                next: None,
            };
            let joined = store.compare_and_set_in_session(None, &record, &joins);
            assert_eq!(joined.await.unwrap(), crate::GuardedCas::Written);
            if name == "frozen" {
                let frozen = record.drain(Some(&first)).unwrap();
                let (next, _) = first.noticed();
                let freeze = crate::SessionGuard {
                    next: Some(next.clone()),
                    ..joins
                };
                let written = store.compare_and_set_in_session(Some(1), &frozen, &freeze);
                assert_eq!(written.await.unwrap(), crate::GuardedCas::Written);
                first = next;
            }
        }
        rows[0] = first;
        rows.sort_by_key(|r| crate::session::session_bytes(&r.id));
        rows
    }

    async fn all_sessions(store: &dyn DcStore) -> Vec<SessionRecord> {
        let mut out: Vec<SessionRecord> = Vec::new();
        loop {
            let after = out.last().map(|r| r.id.clone());
            let page = store
                .sessions(after.as_ref(), SESSION_PAGE_MAX)
                .await
                .unwrap();
            let last = page.len() < SESSION_PAGE_MAX;
            out.extend(page);
            if last {
                return out;
            }
        }
    }

    /// Every session row is copied (more than a page), with the derived
    /// indexes rebuilt at the target: its keys, its notices, the sessions
    /// due.
    #[tokio::test]
    async fn session_rows_are_copied_with_their_indexes() {
        let (source, target) = (memory_set(&["iad"]), memory_set(&["iad"]));
        populate(&source, 10).await;
        let (dc, from) = &source.dcs[0];
        let rows = open_sessions(dc, from.as_ref(), SESSION_PAGE_MAX as u64 + 30).await;
        let report = run(&source, &target, false).await;
        assert!(report.ok(), "{report}");
        let to = target.dcs[0].1.as_ref();
        assert_eq!(all_sessions(to).await, rows);
        let first = rows.iter().find(|r| r.notice_seq == 1).unwrap();
        let keys = to.session_keys(&first.id, None, SESSION_PAGE_MAX).await;
        let want = from.session_keys(&first.id, None, SESSION_PAGE_MAX).await;
        assert_eq!(keys.unwrap(), want.unwrap());
        let notices = to.session_notices(&first.id, 0, SESSION_PAGE_MAX).await;
        assert_eq!(notices.unwrap().len(), 1);
        let until = StoreTime::from_ms(u64::MAX / 2);
        let due = to.due_sessions(until, None, SESSION_PAGE_MAX).await;
        let want = from.due_sessions(until, None, SESSION_PAGE_MAX).await;
        assert_eq!(due.unwrap(), want.unwrap());
    }

    /// A second run finds every row present; a row the target holds at
    /// another version is a conflict left as is (holding the global entries
    /// back, as a record conflict does); verify compares every row, also
    /// with no sample, and catches one missing in the target, one
    /// different there and one only there, showing no secret.
    #[tokio::test]
    async fn session_rows_are_never_overwritten_and_every_one_is_verified() {
        let (source, target) = (memory_set(&["iad"]), memory_set(&["iad"]));
        populate(&source, 10).await;
        let (dc, from) = &source.dcs[0];
        let rows = open_sessions(dc, from.as_ref(), 20).await;
        let first = run(&source, &target, false).await;
        assert_eq!(
            (first.dcs[0].sessions.copied, first.dcs[0].sessions.present),
            (20, 0)
        );
        let counted = Counted {
            source: 20,
            target: 20,
        };
        let verification = first.verification.as_ref().unwrap();
        assert_eq!(verification.dcs[0].sessions, counted);
        assert!(first.to_string().contains("iad sessions"), "{first}");
        let second = run(&source, &target, false).await;
        assert_eq!(
            (
                second.dcs[0].sessions.copied,
                second.dcs[0].sessions.present
            ),
            (0, 20)
        );

        let other = memory_set(&["iad"]);
        let live = rows.iter().find(|r| r.version == 1).unwrap();
        let renewed = live
            .renew(
                &crate::conformance::lease(),
                HostTime::from_ms(5),
                StoreTime::from_ms(5),
                &POLICY,
            )
            .next
            .unwrap();
        other.dcs[0].1.import_session(&renewed).await.unwrap();
        let report = run(&source, &other, false).await;
        assert!(!report.ok() && report.global_held_back, "{report}");
        assert_eq!(report.dcs[0].sessions.conflicts, 1);
        let conflict = Conflict::Session {
            dc: dc.clone(),
            source: Box::new(live.clone()),
            target: Box::new(renewed.clone()),
        };
        assert!(report.conflicts.contains(&conflict), "{report}");
        let held = other.dcs[0].1.session(&live.id).await.unwrap();
        assert_eq!(held, Some(renewed.clone()), "never overwritten");

        let to = target.dcs[0].1.as_ref();
        let gone = rows
            .iter()
            .find(|r| r.version == 2 && r.notice_seq == 0)
            .unwrap();
        assert!(to.delete_session(&gone.id, gone.version).await.unwrap());
        let changed = live.renew(
            &crate::conformance::lease(),
            HostTime::from_ms(7),
            StoreTime::from_ms(7),
            &POLICY,
        );
        let changed = changed.next.unwrap();
        let cas = to.compare_and_set_session(Some(1), &changed).await.unwrap();
        assert_eq!(cas, crate::SessionCas::Written);
        let only_there = SessionRecord::open(
            "iad~9999".parse().unwrap(),
            crate::conformance::lease(),
            HostTime::from_ms(0),
            StoreTime::from_ms(0),
            &POLICY,
        )
        .0;
        to.import_session(&only_there).await.unwrap();
        let v = verify(&source, &target, 0, &mut |_| {}).await.unwrap();
        let differs =
            |id: &SessionId, source: Option<&SessionRecord>, target: Option<SessionRecord>| {
                Mismatch::SessionDiffers {
                    dc: dc.clone(),
                    id: id.clone(),
                    source: source.cloned().map(Box::new),
                    target: target.map(Box::new),
                }
            };
        for want in [
            differs(&gone.id, Some(gone), None),
            differs(&live.id, Some(live), Some(changed.clone())),
            differs(&only_there.id, None, Some(only_there.clone())),
        ] {
            assert!(v.mismatches.contains(&want), "{want:?} not in {v}");
        }
        let text = v.to_string();
        let line = format!("iad session {}: source live until", live.id);
        assert!(text.contains(&line), "{text}");
        assert!(text.contains("target none"), "{text}");
        assert!(
            !text.contains("secret") && !text.contains("LeaseKey"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_global_conflict_alone_leaves_that_entry_and_copies_the_others() {
        let (source, target) = (memory_set(&["iad"]), memory_set(&["iad"]));
        populate(&source, 20).await;
        let (key, _) = all_entries(source.global.as_ref()).await.remove(0);
        let other: ReservationId = "fra.99".parse().unwrap();
        target.global.set_if_absent(&key, &other).await.unwrap();
        let report = run(&source, &target, false).await;
        assert!(!report.ok() && !report.global_held_back, "{report}");
        assert_eq!((report.global.copied, report.global.conflicts), (19, 1));
        assert_eq!(target.global.get(&key).await.unwrap(), Some(other));
        assert_eq!(all_entries(target.global.as_ref()).await.len(), 20);
    }

    #[tokio::test]
    async fn a_dry_run_reports_what_it_would_do_and_writes_nothing() {
        let (source, target) = (memory_set(&["iad"]), memory_set(&["iad"]));
        populate(&source, 30).await;
        let (key, _) = all_entries(source.global.as_ref()).await.remove(0);
        target
            .global
            .set_if_absent(&key, &"fra.1".parse().unwrap())
            .await
            .unwrap();
        let first_event = all_events(source.dcs[0].1.as_ref()).await.remove(0);
        target.dcs[0].1.import_event(&first_event).await.unwrap();

        let report = run(&source, &target, true).await;
        assert!(report.dry_run && report.verification.is_none());
        assert_eq!(report.global.copied, 29);
        assert_eq!(report.global.conflicts, 1);
        assert_eq!(report.dcs[0].events.present, 1);
        assert!(report.dcs[0].records.copied > 30);
        assert_eq!(all_entries(target.global.as_ref()).await.len(), 1);
        assert!(all_records(target.dcs[0].1.as_ref()).await.is_empty());
        assert_eq!(
            all_events(target.dcs[0].1.as_ref()).await,
            vec![first_event]
        );
        assert_eq!(target.dcs[0].1.allocator_floor().await.unwrap(), 0);
        assert!(report.to_string().contains("would copy"), "{report}");
    }

    #[tokio::test]
    async fn verify_catches_a_changed_record_a_missing_event_and_an_extra_entry() {
        let (source, target) = (memory_set(&["iad"]), memory_set(&["iad"]));
        populate(&source, 30).await;
        assert!(run(&source, &target, false).await.ok());
        let (_, to) = &target.dcs[0];
        let mut changed = all_records(to.as_ref()).await.remove(5);
        changed.version += 1;
        changed.token = changed.token.next();
        to.import(&changed).await.unwrap();
        let extra = Key::new(KeyName::new("not-in-source").unwrap());
        target
            .global
            .set_if_absent(&extra, &"iad.999".parse().unwrap())
            .await
            .unwrap();
        let clean = verify(&source, &source, SAMPLE_MAX, &mut |_| {})
            .await
            .unwrap();
        assert!(clean.ok(), "{clean}");

        let v = verify(&source, &target, SAMPLE_MAX, &mut |_| {})
            .await
            .unwrap();
        assert!(!v.ok());
        assert!(
            v.mismatches.iter().any(|m| matches!(
                m,
                Mismatch::RecordDiffers { id, fields, .. }
                    if id == &changed.id && fields == &vec!["token", "version"]
            )),
            "{v}"
        );
        assert!(
            v.mismatches.contains(&Mismatch::Count {
                what: "global entries",
                dc: None,
                counted: Counted {
                    source: 30,
                    target: 31
                },
            }),
            "{v}"
        );
        assert!(
            v.to_string().ends_with("verification: MISMATCH (2 found)"),
            "{v}"
        );

        // An empty target: every count differs, every sample is missing.
        let empty = memory_set(&["iad"]);
        let v = verify(&source, &empty, 8, &mut |_| {}).await.unwrap();
        assert!(
            v.mismatches
                .iter()
                .any(|m| matches!(m, Mismatch::RecordMissing { .. }))
        );
        assert!(
            v.mismatches
                .iter()
                .any(|m| matches!(m, Mismatch::AllocatorBelow { .. }))
        );
        assert!(
            v.mismatches
                .iter()
                .any(|m| matches!(m, Mismatch::EventHeadBelow { .. }))
        );
        assert!(v.mismatches.iter().any(
            |m| matches!(m, Mismatch::EventDiffers { fields, .. } if fields == &vec!["missing"])
        ));
    }

    async fn swap(set: &StoreSet, name: Setting, expected: Option<&[u8]>, value: &[u8]) {
        let swapped = set.global.swap_setting(name, expected, value).await;
        assert_eq!(swapped.unwrap(), Ok(()), "{name}");
    }

    /// Settings are copied with the rest and found present by a second run;
    /// one the target holds with another value is a conflict left as is,
    /// which holds no global entry back; verify compares every setting
    /// (also with no sample) and catches one changed after the copy.
    #[tokio::test]
    async fn settings_are_copied_never_overwritten_and_verified() {
        let (directory, version) = (Setting::Directory, Setting::DeploymentVersion);
        let (source, target) = (memory_set(&["iad"]), memory_set(&["iad"]));
        populate(&source, 10).await;
        swap(&source, directory, None, b"iad=10.0.1.1:7400").await;
        swap(&source, version, None, b"7").await;

        let dry = run(&source, &target, true).await;
        assert_eq!(dry.settings.copied, 2);
        assert_eq!(target.global.setting(directory).await.unwrap(), None);
        let first = run(&source, &target, false).await;
        assert!(first.ok(), "{first}");
        assert_eq!((first.settings.copied, first.settings.present), (2, 0));
        for name in Setting::ALL {
            let want = source.global.setting(name).await.unwrap();
            assert_eq!(target.global.setting(name).await.unwrap(), want);
        }
        let counted = Counted {
            source: 2,
            target: 2,
        };
        assert_eq!(first.verification.as_ref().unwrap().settings, counted);
        let text = first.to_string();
        assert!(text.contains("settings                 2 → 2 ✓"), "{text}");
        let second = run(&source, &target, false).await;
        assert_eq!((second.settings.copied, second.settings.present), (0, 2));

        let other = memory_set(&["iad"]);
        swap(&other, version, None, b"6").await;
        let report = run(&source, &other, false).await;
        assert!(!report.ok() && !report.global_held_back, "{report}");
        assert_eq!((report.settings.copied, report.settings.conflicts), (1, 1));
        assert_eq!(report.global.copied, 10);
        let conflict = Conflict::Setting {
            setting: version,
            source: b"7".to_vec(),
            target: b"6".to_vec(),
        };
        assert!(report.conflicts.contains(&conflict), "{report}");
        assert_eq!(
            other.global.setting(version).await.unwrap(),
            Some(b"6".to_vec())
        );
        let text = report.to_string();
        let line = "setting deployment-version: source 1 byte \"7\", target 1 byte \"6\"";
        assert!(text.contains(line), "{text}");

        swap(
            &target,
            directory,
            Some(b"iad=10.0.1.1:7400"),
            b"iad=10.0.1.9:7400",
        )
        .await;
        let v = verify(&source, &target, 0, &mut |_| {}).await.unwrap();
        let changed = Mismatch::SettingDiffers {
            setting: directory,
            source: Some(b"iad=10.0.1.1:7400".to_vec()),
            target: Some(b"iad=10.0.1.9:7400".to_vec()),
        };
        assert_eq!(v.mismatches, vec![changed], "{v}");
        let v = verify(&source, &memory_set(&["iad"]), 0, &mut |_| {})
            .await
            .unwrap();
        let unset = Mismatch::SettingDiffers {
            setting: version,
            source: Some(b"7".to_vec()),
            target: None,
        };
        assert!(v.mismatches.contains(&unset), "{v}");
        assert!(
            v.to_string().contains("source 1 byte \"7\", target unset"),
            "{v}"
        );
    }

    #[test]
    fn a_long_setting_value_is_shown_by_its_length_and_escaped_head() {
        let conflict = Conflict::Setting {
            setting: Setting::Directory,
            source: [&b"\x00\xff\n"[..], &[b'a'; 100]].concat(),
            target: Vec::new(),
        };
        let shown = conflict.to_string();
        let head = format!("{}…", "a".repeat(SETTING_SHOWN_BYTES_MAX - 3));
        assert!(
            shown.contains(&format!("source 103 bytes \"\\x00\\xff\\n{head}\"")),
            "{shown}"
        );
        assert!(shown.contains("target 0 bytes \"\""), "{shown}");
    }

    /// A memory DC store that logs the kind of every write.
    #[derive(Default)]
    struct Logged {
        inner: MemoryDcStore,
        writes: std::sync::Mutex<Vec<&'static str>>,
    }

    impl Logged {
        fn log(&self, what: &'static str) {
            self.writes.lock().unwrap().push(what);
        }
    }

    #[async_trait::async_trait]
    impl DcStore for Logged {
        async fn get(&self, id: &ReservationId) -> Result<Option<DcRecord>, StoreError> {
            self.inner.get(id).await
        }
        async fn compare_and_set(&self, e: Option<u64>, r: &DcRecord) -> Result<Cas, StoreError> {
            self.log("compare_and_set");
            self.inner.compare_and_set(e, r).await
        }
        async fn scan(
            &self,
            scope: &NamespaceScope,
            prefix: &str,
            after: Option<&ScanCursor>,
            limit: usize,
        ) -> Result<Vec<DcRecord>, StoreError> {
            self.inner.scan(scope, prefix, after, limit).await
        }
        async fn due(
            &self,
            kind: homing_core::DueKind,
            until: homing_core::StoreTime,
            after: Option<&homing_core::DueCursor>,
            limit: usize,
        ) -> Result<homing_core::DuePage, StoreError> {
            self.inner.due(kind, until, after, limit).await
        }
        async fn settle(&self, id: &ReservationId, version: u64) -> Result<bool, StoreError> {
            self.log("settle");
            self.inner.settle(id, version).await
        }
        async fn allocate(&self) -> Result<u64, StoreError> {
            self.log("allocate");
            self.inner.allocate().await
        }
        async fn events(
            &self,
            after: EventSeq,
            limit: usize,
        ) -> Result<crate::EventPage, StoreError> {
            self.inner.events(after, limit).await
        }
        async fn trim_events(&self, before: EventSeq) -> Result<(), StoreError> {
            self.log("trim_events");
            self.inner.trim_events(before).await
        }
        async fn import(&self, r: &DcRecord) -> Result<Import<DcRecord>, StoreError> {
            self.log("import");
            self.inner.import(r).await
        }
        async fn import_event(&self, e: &Event) -> Result<Import<Event>, StoreError> {
            self.log("import_event");
            self.inner.import_event(e).await
        }
        async fn allocator_floor(&self) -> Result<u64, StoreError> {
            self.inner.allocator_floor().await
        }
        async fn raise_allocator(&self, floor: u64) -> Result<(), StoreError> {
            self.log("raise_allocator");
            self.inner.raise_allocator(floor).await
        }
        async fn migrating(&self) -> Result<bool, StoreError> {
            self.inner.migrating().await
        }
        async fn set_migrating(&self, on: bool) -> Result<(), StoreError> {
            self.inner.set_migrating(on).await
        }
        async fn session(
            &self,
            id: &homing_core::SessionId,
        ) -> Result<Option<homing_core::SessionRecord>, StoreError> {
            self.inner.session(id).await
        }
        async fn compare_and_set_session(
            &self,
            e: Option<u64>,
            row: &homing_core::SessionRecord,
        ) -> Result<crate::SessionCas, StoreError> {
            self.log("compare_and_set_session");
            self.inner.compare_and_set_session(e, row).await
        }
        async fn delete_session(
            &self,
            id: &homing_core::SessionId,
            version: u64,
        ) -> Result<bool, StoreError> {
            self.log("delete_session");
            self.inner.delete_session(id, version).await
        }
        async fn compare_and_set_in_session(
            &self,
            e: Option<u64>,
            r: &DcRecord,
            guard: &crate::SessionGuard,
        ) -> Result<crate::GuardedCas, StoreError> {
            self.log("compare_and_set_in_session");
            self.inner.compare_and_set_in_session(e, r, guard).await
        }
        async fn session_keys(
            &self,
            id: &homing_core::SessionId,
            after: Option<&ReservationId>,
            limit: usize,
        ) -> Result<Vec<DcRecord>, StoreError> {
            self.inner.session_keys(id, after, limit).await
        }
        async fn session_notices(
            &self,
            id: &homing_core::SessionId,
            after: u64,
            limit: usize,
        ) -> Result<Vec<DcRecord>, StoreError> {
            self.inner.session_notices(id, after, limit).await
        }
        async fn due_sessions(
            &self,
            until: homing_core::StoreTime,
            after: Option<&crate::SessionCursor>,
            limit: usize,
        ) -> Result<Vec<homing_core::SessionRecord>, StoreError> {
            self.inner.due_sessions(until, after, limit).await
        }
        async fn sessions(
            &self,
            after: Option<&homing_core::SessionId>,
            limit: usize,
        ) -> Result<Vec<homing_core::SessionRecord>, StoreError> {
            self.inner.sessions(after, limit).await
        }
        async fn import_session(
            &self,
            row: &homing_core::SessionRecord,
        ) -> Result<Import<homing_core::SessionRecord>, StoreError> {
            self.log("import_session");
            self.inner.import_session(row).await
        }
    }

    #[tokio::test]
    async fn the_allocator_is_raised_before_anything_else_and_past_every_record() {
        let source = memory_set(&["iad"]);
        let logged = Arc::new(Logged::default());
        let target = StoreSet {
            global: Arc::new(MemoryGlobalStore::new()),
            dcs: vec![(DcId::new("iad").unwrap(), logged.clone())],
        };
        populate(&source, 10).await;
        // A record above the allocator's floor (restored from elsewhere):
        // the target must still never hand out its unique.
        let mut stray = all_records(source.dcs[0].1.as_ref()).await.remove(0);
        stray.id = ReservationId::new(DcId::new("iad").unwrap(), 5_000);
        source.dcs[0].1.import(&stray).await.unwrap();
        let report = run(&source, &target, false).await;
        assert!(report.ok(), "{report}");
        assert_eq!(report.dcs[0].allocator.floor, 5_000);
        let writes = logged.writes.lock().unwrap().clone();
        assert_eq!(writes[0], "raise_allocator", "{writes:?}");
        let first_event = writes.iter().position(|w| *w == "import_event").unwrap();
        assert!(writes[..first_event].iter().skip(1).all(|w| *w == "import"));
        assert!(writes[first_event..].iter().all(|w| *w == "import_event"));
        assert!(target.dcs[0].1.allocate().await.unwrap() > 5_000);
    }

    #[test]
    fn the_picker_spreads_its_picks_evenly_and_always_the_same() {
        let picked = |total: u64, n: usize| {
            let mut p = Picker::new(total, n);
            (0..total).filter(|_| p.pick()).collect::<Vec<_>>()
        };
        assert_eq!(picked(10, 5), vec![0, 2, 4, 6, 8]);
        assert_eq!(picked(10, 3), vec![0, 3, 6]);
        assert_eq!(picked(3, 10), vec![0, 1, 2]);
        assert!(picked(10, 0).is_empty());
        assert_eq!(picked(1_000, 7), picked(1_000, 7));
        assert_eq!(picked(1_000_000, 100).len(), 100);
    }
}
