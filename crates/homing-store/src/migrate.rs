//! Migration: copying a deployment's state — the global entries, and each
//! DC's records, lifecycle event log and allocator — from one set of stores
//! to another of any backend (the embedded redb of a single-node start to
//! etcd or FoundationDB when a deployment grows), then verifying the copy.
//!
//! A copy is idempotent and resumable: every write is an import that leaves
//! an equal item alone, so a run stopped anywhere is finished by running it
//! again. It never overwrites what differs: a write-once global entry, a
//! record or an event that the target holds with other contents is a
//! [`Conflict`], reported with both values and left as it is.
//!
//! Migration is **offline**: every homingd of the deployment must be
//! stopped. A live daemon changes records while they are copied (renewals
//! bump versions, the reaper releases, each change appends an event), so the
//! copy would mix two moments and the verification would fail; worse, a
//! reservation allocated at the source after the target's allocator was
//! raised could later be handed out again by the target.
//!
//! Order, per DC: raise the target's allocator above the source's floor
//! first, so the target never hands out a reservation ID the source used,
//! even when the copy stops half way; then records; then events in `seq`
//! order, so an interrupted copy leaves a gap-free prefix of the log. Global
//! entries come last, in the order a reserve writes them (record first,
//! then entry): an entry in the target has its record there. They are held
//! back (judged, not written) when a DC's records or events conflicted: a
//! written entry can never be taken back.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use homing_core::{DcId, DcRecord, Event, EventSeq, Key, NamespaceScope, ReservationId};
use tokio::task::JoinHandle;

use crate::dc::{
    DcStore, EVENTS_LIMIT_MAX, Import, SCAN_LIMIT_MAX, ScanCursor, judge_event_import, judge_import,
};
use crate::error::StoreError;
use crate::global::{GET_MANY_KEYS_MAX, GlobalStore, SetIfAbsent};

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

/// What a migration is doing, for a progress display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Counting the source (totals for the other steps).
    Count,
    /// Copying one DC's records.
    Records(DcId),
    /// Copying one DC's events.
    Events(DcId),
    /// Copying the global entries.
    Global,
    /// Reading the target to verify it.
    Verify,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Count => f.write_str("counting source"),
            Step::Records(dc) => write!(f, "{dc} records"),
            Step::Events(dc) => write!(f, "{dc} events"),
            Step::Global => f.write_str("global entries"),
            Step::Verify => f.write_str("verifying"),
        }
    }
}

/// Progress of one step, reported after every page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    /// The step.
    pub step: Step,
    /// Items done in this step.
    pub done: u64,
    /// Items the step will do, when known (not while counting).
    pub total: Option<u64>,
}

/// What happened to the items of one kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Written to the target (in a dry run: would be).
    pub copied: u64,
    /// Already in the target, equal: skipped.
    pub present: u64,
    /// In the target with other contents: left alone, listed in the report.
    pub conflicts: u64,
}

impl Tally {
    fn add<T>(&mut self, import: &Import<T>) {
        match import {
            Import::Written => self.copied += 1,
            Import::Present => self.present += 1,
            Import::Conflict { .. } => self.conflicts += 1,
        }
    }
}

/// What the migration did to one DC's allocator.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocatorReport {
    /// What the target was raised above: the source's floor, or its highest
    /// record unique if that is higher.
    pub floor: u64,
    /// The target's floor before.
    pub target_before: u64,
    /// The target's floor after (before, in a dry run).
    pub target_after: u64,
}

/// What the migration did for one DC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcReport {
    /// The DC.
    pub dc: DcId,
    /// Its allocator.
    pub allocator: AllocatorReport,
    /// Its records.
    pub records: Tally,
    /// Its events.
    pub events: Tally,
}

/// An item the target holds with other contents than the source: never
/// overwritten.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Conflict {
    /// A global entry (write-once) names another reservation.
    Global {
        /// The key.
        key: Key,
        /// The source's entry.
        source: ReservationId,
        /// The target's entry.
        target: ReservationId,
    },
    /// A record of the same reservation with a newer or equal version (or
    /// another key) and other contents.
    Record {
        /// The DC.
        dc: DcId,
        /// The source's record.
        source: Box<DcRecord>,
        /// The target's record.
        target: Box<DcRecord>,
    },
    /// Another event at the same `seq`.
    Event {
        /// The DC.
        dc: DcId,
        /// The source's event.
        source: Box<Event>,
        /// The target's event.
        target: Box<Event>,
    },
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Conflict::Global {
                key,
                source,
                target,
            } => write!(
                f,
                "global entry {key}: source {source}, target {target} (write-once: left as is)"
            ),
            Conflict::Record { dc, source, target } => write!(
                f,
                "{dc} record {}: source version {}, target version {}, differing in {}",
                source.id,
                source.version,
                target.version,
                record_diff(source, target).join(", ")
            ),
            Conflict::Event { dc, source, target } => write!(
                f,
                "{dc} event {}: source {} token {}, target {} token {}, differing in {}",
                source.seq,
                source.reservation,
                source.token,
                target.reservation,
                target.token,
                event_diff(source, target).join(", ")
            ),
        }
    }
}

/// What a source and a target count of one kind found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counted {
    /// In the source.
    pub source: u64,
    /// In the target.
    pub target: u64,
}

/// One DC's verification counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DcVerification {
    /// The DC.
    pub dc: DcId,
    /// Records: equal counts expected.
    pub records: Counted,
    /// Kept events: equal counts expected.
    pub events: Counted,
    /// Last event ever appended: target ≥ source expected (watchers resume
    /// from cursors the source handed out).
    pub event_head: Counted,
    /// Allocator floor (source: raised to its highest record unique if that
    /// is higher): target ≥ source expected.
    pub allocator_floor: Counted,
}

/// How the target differs from the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mismatch {
    /// Different numbers of items of one kind.
    Count {
        /// `global entries`, `records` or `events`.
        what: &'static str,
        /// The DC, for records and events.
        dc: Option<DcId>,
        /// The counts.
        counted: Counted,
    },
    /// The target could hand out a unique the source used.
    AllocatorBelow {
        /// The DC.
        dc: DcId,
        /// The floors.
        floor: Counted,
    },
    /// The target's event log would reuse seqs watchers have seen.
    EventHeadBelow {
        /// The DC.
        dc: DcId,
        /// The heads.
        head: Counted,
    },
    /// A sampled record is not in the target.
    RecordMissing {
        /// The DC.
        dc: DcId,
        /// The record.
        id: ReservationId,
    },
    /// A sampled record differs.
    RecordDiffers {
        /// The DC.
        dc: DcId,
        /// The record.
        id: ReservationId,
        /// The fields that differ.
        fields: Vec<&'static str>,
    },
    /// A sampled global entry (or a sampled record's key's) differs.
    EntryDiffers {
        /// The key.
        key: Key,
        /// The source's entry.
        source: Option<ReservationId>,
        /// The target's entry.
        target: Option<ReservationId>,
    },
    /// A sampled event differs or is missing.
    EventDiffers {
        /// The DC.
        dc: DcId,
        /// Its seq.
        seq: EventSeq,
        /// The fields that differ (`missing` when absent).
        fields: Vec<&'static str>,
    },
}

fn or_none(id: &Option<ReservationId>) -> String {
    id.as_ref()
        .map_or_else(|| "none".to_string(), |id| id.to_string())
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Count { what, dc, counted } => {
                if let Some(dc) = dc {
                    write!(f, "{dc} ")?;
                }
                write!(
                    f,
                    "{what}: {} in the source, {} in the target",
                    counted.source, counted.target
                )
            }
            Mismatch::AllocatorBelow { dc, floor } => write!(
                f,
                "{dc} allocator: target floor {} is below the source's {}: it could reuse reservation IDs",
                floor.target, floor.source
            ),
            Mismatch::EventHeadBelow { dc, head } => write!(
                f,
                "{dc} events: target head {} is below the source's {}: watchers would miss events",
                head.target, head.source
            ),
            Mismatch::RecordMissing { dc, id } => write!(f, "{dc} record {id}: not in the target"),
            Mismatch::RecordDiffers { dc, id, fields } => {
                write!(f, "{dc} record {id}: differs in {}", fields.join(", "))
            }
            Mismatch::EntryDiffers {
                key,
                source,
                target,
            } => write!(
                f,
                "global entry {key}: source {}, target {}",
                or_none(source),
                or_none(target)
            ),
            Mismatch::EventDiffers { dc, seq, fields } => {
                write!(f, "{dc} event {seq}: {}", fields.join(", "))
            }
        }
    }
}

/// The outcome of [`verify`]: counts per kind and what differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// Global entries.
    pub global: Counted,
    /// Per DC.
    pub dcs: Vec<DcVerification>,
    /// Items compared field by field: records, global entries, events.
    pub sampled: u64,
    /// The first [`MISMATCHES_LISTED_MAX`] mismatches.
    pub mismatches: Vec<Mismatch>,
    /// Every mismatch found.
    pub mismatches_total: u64,
}

impl Verification {
    /// Whether the target matches: counts equal, floors and heads not below,
    /// every sampled item equal.
    pub fn ok(&self) -> bool {
        self.mismatches_total == 0
    }
}

impl fmt::Display for Verification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mark = |ok: bool| if ok { "✓" } else { "✗" };
        let equal =
            |c: Counted| format!("{} → {} {}", c.source, c.target, mark(c.source == c.target));
        let at_least =
            |c: Counted| format!("{} → {} {}", c.source, c.target, mark(c.target >= c.source));
        writeln!(f, "verification (source → target):")?;
        writeln!(f, "  {:<24} {}", "global entries", equal(self.global))?;
        for dc in &self.dcs {
            let row = |what: &str| format!("{} {what}", dc.dc);
            writeln!(f, "  {:<24} {}", row("records"), equal(dc.records))?;
            writeln!(
                f,
                "  {:<24} {}   head {}",
                row("events"),
                equal(dc.events),
                at_least(dc.event_head)
            )?;
            writeln!(
                f,
                "  {:<24} {}",
                row("allocator floor"),
                at_least(dc.allocator_floor)
            )?;
        }
        writeln!(
            f,
            "  {} sampled items compared field by field",
            self.sampled
        )?;
        for m in &self.mismatches {
            writeln!(f, "  mismatch: {m}")?;
        }
        let unlisted = self.mismatches_total - self.mismatches.len() as u64;
        if unlisted > 0 {
            writeln!(f, "  … and {unlisted} more mismatches")?;
        }
        if self.ok() {
            write!(f, "verification: OK")
        } else {
            write!(
                f,
                "verification: MISMATCH ({} found)",
                self.mismatches_total
            )
        }
    }
}

/// What [`migrate`] did (in a dry run: would do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Nothing was written.
    pub dry_run: bool,
    /// Global entries (judged only, not written, when `global_held_back`).
    pub global: Tally,
    /// The global entries were not written because a DC's records or events
    /// conflicted: an entry can never be taken back, and it would name a
    /// reservation whose record at the target is another one.
    pub global_held_back: bool,
    /// Per DC, in the order given.
    pub dcs: Vec<DcReport>,
    /// The first [`CONFLICTS_LISTED_MAX`] conflicts.
    pub conflicts: Vec<Conflict>,
    /// DCs that global entries name but whose DC store was not in the set
    /// (up to [`REFERENCED_DCS_MAX`]), with how many entries name each: their
    /// records were not copied.
    pub unmigrated_dcs: Vec<(DcId, u64)>,
    /// The verification pass (not in a dry run).
    pub verification: Option<Verification>,
}

impl MigrateReport {
    /// Conflicts of every kind.
    pub fn conflicts_total(&self) -> u64 {
        self.global.conflicts
            + self
                .dcs
                .iter()
                .map(|d| d.records.conflicts + d.events.conflicts)
                .sum::<u64>()
    }

    /// No conflict, and the verification (if any) passed.
    pub fn ok(&self) -> bool {
        self.conflicts_total() == 0 && self.verification.as_ref().is_none_or(Verification::ok)
    }
}

fn tally_line(f: &mut fmt::Formatter<'_>, what: &str, t: &Tally, dry_run: bool) -> fmt::Result {
    writeln!(
        f,
        "  {what:<24} {} {:>8}   present {:>8}   conflicts {:>4}",
        if dry_run { "would copy" } else { "copied" },
        t.copied,
        t.present,
        t.conflicts
    )
}

impl fmt::Display for MigrateReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.dry_run {
            writeln!(f, "migration (dry run: nothing written)")?;
        } else {
            writeln!(f, "migration")?;
        }
        for dc in &self.dcs {
            let a = dc.allocator;
            let verb = match (self.dry_run, a.target_before >= a.floor) {
                (_, true) => "already at or above",
                (true, false) => "would be raised above",
                (false, false) => "raised above",
            };
            let floors = if self.dry_run {
                format!("target floor {}", a.target_before)
            } else {
                format!("target floor {} → {}", a.target_before, a.target_after)
            };
            writeln!(
                f,
                "  {:<24} {verb} {} ({floors})",
                format!("{} allocator", dc.dc),
                a.floor,
            )?;
            tally_line(f, &format!("{} records", dc.dc), &dc.records, self.dry_run)?;
            tally_line(f, &format!("{} events", dc.dc), &dc.events, self.dry_run)?;
        }
        tally_line(
            f,
            "global entries",
            &self.global,
            self.dry_run || self.global_held_back,
        )?;
        if self.global_held_back {
            writeln!(
                f,
                "  global entries held back: DC conflicts first (an entry can never be taken back)"
            )?;
        }
        for (dc, entries) in &self.unmigrated_dcs {
            writeln!(
                f,
                "  warning: {entries} global entries name DC {dc}, whose DC store was not migrated"
            )?;
        }
        let total = self.conflicts_total();
        if total > 0 {
            writeln!(f, "conflicts (never overwritten):")?;
            for c in &self.conflicts {
                writeln!(f, "  {c}")?;
            }
            if total > self.conflicts.len() as u64 {
                writeln!(f, "  … and {} more", total - self.conflicts.len() as u64)?;
            }
        }
        if let Some(v) = &self.verification {
            writeln!(f, "{v}")?;
        }
        match (total, &self.verification) {
            (0, Some(v)) if !v.ok() => write!(f, "result: MISMATCH"),
            (0, _) => write!(f, "result: OK"),
            (n, _) => write!(f, "result: {n} CONFLICTS"),
        }
    }
}

/// Copies `source` into `target`: for each DC (in order) the allocator, the
/// records and the events, then the global entries (held back, only
/// judged, if a record or event conflicted); then verifies the
/// target (see [`verify`]) unless `options.dry_run`. `progress` is called
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
    for (i, ((dc, from), (_, to))) in source.dcs.iter().zip(&target.dcs).enumerate() {
        let dc_counts = &counts.dcs[i];
        let allocator = walk.allocator(to.as_ref(), dc_counts).await?;
        let records = walk.records(i, dc, from, to, dc_counts.records).await?;
        let events = walk
            .events(i, dc, from.as_ref(), to.as_ref(), dc_counts)
            .await?;
        report.dcs.push(DcReport {
            dc: dc.clone(),
            allocator,
            records,
            events,
        });
    }
    if report.conflicts_total() > 0 && walk.mode == Mode::Copy {
        walk.mode = Mode::DryRun;
        report.global_held_back = true;
    }
    report.global = walk
        .global(source.global.as_ref(), &target.global, counts.global)
        .await?;
    let Walk {
        conflicts, samples, ..
    } = walk;
    report.conflicts = conflicts;
    if !options.dry_run {
        report.verification = Some(check(source, target, &counts, &samples, progress).await?);
    }
    Ok(report)
}

/// Verifies that `target` holds what `source` holds, reading both and
/// writing nothing: equal counts of global entries and of each DC's records
/// and kept events, each target allocator floor and event head at or above
/// the source's, and `sample` records and events per DC and `sample` global
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

/// What one store set holds, counted.
#[derive(Debug, Default)]
struct Counts {
    global: u64,
    referenced_dcs: BTreeMap<DcId, u64>,
    dcs: Vec<DcCounts>,
}

#[derive(Debug, Default, Clone, Copy)]
struct DcCounts {
    records: u64,
    events: u64,
    event_head: EventSeq,
    /// The store's allocator floor.
    floor: u64,
    /// The highest unique of the DC's own records.
    unique_max: u64,
}

impl DcCounts {
    /// What a target's allocator must be raised to: above it, it can hand
    /// out no ID the source used (a record above the source's own floor,
    /// restored from elsewhere, included).
    fn raise_to(&self) -> u64 {
        self.floor.max(self.unique_max)
    }
}

/// Counts `set`, reporting `Step::Count` progress (or `Step::Verify` with
/// `expected` items when counting a target).
async fn count(
    set: &StoreSet,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<Counts, StoreError> {
    count_as(set, Step::Count, None, progress).await
}

async fn count_as(
    set: &StoreSet,
    step: Step,
    expected: Option<u64>,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<Counts, StoreError> {
    let mut counts = Counts::default();
    let mut done = 0;
    let mut report = |n: usize, progress: &mut (dyn FnMut(&Progress) + Send)| {
        done += n as u64;
        progress(&Progress {
            step: step.clone(),
            done,
            total: expected,
        });
    };
    for (dc, store) in &set.dcs {
        let mut c = DcCounts {
            floor: store.allocator_floor().await?,
            ..DcCounts::default()
        };
        let mut after: Option<ScanCursor> = None;
        loop {
            let page = scan_page(store.as_ref(), after.as_ref()).await?;
            c.records += page.len() as u64;
            for r in page.iter().filter(|r| r.id.dc() == dc) {
                c.unique_max = c.unique_max.max(r.id.unique());
            }
            report(page.len(), progress);
            after = page.last().map(ScanCursor::after);
            if page.len() < SCAN_LIMIT_MAX {
                break;
            }
        }
        let mut seq = 0;
        loop {
            let page = store.events(seq, EVENTS_LIMIT_MAX).await?;
            c.events += page.events.len() as u64;
            c.event_head = page.head;
            report(page.events.len(), progress);
            match page.events.last() {
                Some(last) if page.events.len() == EVENTS_LIMIT_MAX => seq = last.seq,
                _ => break,
            }
        }
        counts.dcs.push(c);
    }
    let mut after: Option<Key> = None;
    loop {
        let page = set.global.scan(after.as_ref(), GET_MANY_KEYS_MAX).await?;
        counts.global += page.len() as u64;
        for (_, id) in &page {
            let known = counts.referenced_dcs.len() < REFERENCED_DCS_MAX;
            if let Some(n) = counts.referenced_dcs.get_mut(id.dc()) {
                *n += 1;
            } else if known {
                counts.referenced_dcs.insert(id.dc().clone(), 1);
            }
        }
        report(page.len(), progress);
        after = page.last().map(|(k, _)| k.clone());
        if page.len() < GET_MANY_KEYS_MAX {
            break;
        }
    }
    Ok(counts)
}

async fn scan_page(
    store: &dyn DcStore,
    after: Option<&ScanCursor>,
) -> Result<Vec<DcRecord>, StoreError> {
    store
        .scan(&NamespaceScope::everything(), "", after, SCAN_LIMIT_MAX)
        .await
}

/// What a walk over the source does with each page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Import into the target.
    Copy,
    /// Read the target and judge as an import would.
    DryRun,
    /// Only pick samples.
    Sample,
}

/// Items picked for verification while walking the source.
#[derive(Debug, Default)]
struct Samples {
    /// (DC index, record).
    records: Vec<(usize, DcRecord)>,
    /// (DC index, event).
    events: Vec<(usize, Event)>,
    entries: Vec<(Key, ReservationId)>,
}

/// Picks `n` of `total` items in walk order, evenly spread: the items at
/// `k * total / n` for `k` in `0..n` (all of them when `n ≥ total`).
#[derive(Debug)]
struct Picker {
    total: u64,
    n: u64,
    k: u64,
    index: u64,
}

impl Picker {
    fn new(total: u64, n: usize) -> Picker {
        Picker {
            total,
            n: (n.min(SAMPLE_MAX) as u64).min(total),
            k: 0,
            index: 0,
        }
    }

    /// Whether the next item is picked.
    fn pick(&mut self) -> bool {
        let index = self.index;
        self.index += 1;
        // n ≤ total, so the picked indices strictly increase with k.
        let next = (u128::from(self.k) * u128::from(self.total) / u128::from(self.n.max(1))) as u64;
        if self.k < self.n && index == next {
            self.k += 1;
            return true;
        }
        false
    }
}

/// One pass over the source, page by page.
struct Walk<'p> {
    mode: Mode,
    sample: usize,
    conflicts: Vec<Conflict>,
    samples: Samples,
    progress: &'p mut (dyn FnMut(&Progress) + Send),
}

/// Awaits a spawned store call; a panic in it is re-raised here.
async fn joined<T>(handle: JoinHandle<Result<T, StoreError>>) -> Result<T, StoreError> {
    match handle.await {
        Ok(result) => result,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(StoreError::Backend {
            backend: "migrate",
            reason: e.to_string(),
        }),
    }
}

impl<'p> Walk<'p> {
    fn new(mode: Mode, sample: usize, progress: &'p mut (dyn FnMut(&Progress) + Send)) -> Walk<'p> {
        Walk {
            mode,
            sample,
            conflicts: Vec::new(),
            samples: Samples::default(),
            progress,
        }
    }

    fn conflict(&mut self, conflict: Conflict) {
        if self.conflicts.len() < CONFLICTS_LISTED_MAX {
            self.conflicts.push(conflict);
        }
    }

    fn progress(&mut self, step: Step, done: u64, total: u64) {
        (self.progress)(&Progress {
            step,
            done,
            total: Some(total),
        });
    }

    /// Raises the target's allocator above the source's floor (in a dry run,
    /// only reads it).
    async fn allocator(
        &mut self,
        to: &dyn DcStore,
        counts: &DcCounts,
    ) -> Result<AllocatorReport, StoreError> {
        let target_before = to.allocator_floor().await?;
        let mut target_after = target_before;
        if self.mode == Mode::Copy {
            // Always, also when the target's floor looks high enough: a floor
            // bounds what was handed out, not what a reserved block will hand out.
            to.raise_allocator(counts.raise_to()).await?;
            target_after = to.allocator_floor().await?;
            assert!(
                target_after >= counts.raise_to(),
                "raise_allocator left the floor below what it was asked for"
            );
        }
        Ok(AllocatorReport {
            floor: counts.raise_to(),
            target_before,
            target_after,
        })
    }

    /// Imports one DC's records, a page at a time (a page's imports run
    /// concurrently: they touch distinct records).
    async fn records(
        &mut self,
        dc_index: usize,
        dc: &DcId,
        from: &Arc<dyn DcStore>,
        to: &Arc<dyn DcStore>,
        total: u64,
    ) -> Result<Tally, StoreError> {
        let mut tally = Tally::default();
        let mut picker = Picker::new(total, self.sample);
        let mut after: Option<ScanCursor> = None;
        let mut done = 0;
        loop {
            let page = scan_page(from.as_ref(), after.as_ref()).await?;
            for record in &page {
                if picker.pick() {
                    self.samples.records.push((dc_index, record.clone()));
                }
            }
            for (record, import) in page.iter().zip(self.import_records(to, &page).await?) {
                tally.add(&import);
                if let Import::Conflict { current } = import {
                    self.conflict(Conflict::Record {
                        dc: dc.clone(),
                        source: Box::new(record.clone()),
                        target: Box::new(current),
                    });
                }
            }
            done += page.len() as u64;
            if self.mode != Mode::Sample {
                self.progress(Step::Records(dc.clone()), done, total);
            }
            after = page.last().map(ScanCursor::after);
            if page.len() < SCAN_LIMIT_MAX {
                return Ok(tally);
            }
        }
    }

    /// What importing `page` into `to` did (in a dry run: would do).
    async fn import_records(
        &self,
        to: &Arc<dyn DcStore>,
        page: &[DcRecord],
    ) -> Result<Vec<Import<DcRecord>>, StoreError> {
        let spawn = |record: &DcRecord| {
            let (to, record, mode) = (to.clone(), record.clone(), self.mode);
            tokio::spawn(async move {
                if mode == Mode::Copy {
                    return to.import(&record).await;
                }
                let current = to.get(&record.id).await?;
                Ok(judge_import(&record, current).unwrap_or(Import::Written))
            })
        };
        if self.mode == Mode::Sample {
            return Ok(Vec::new());
        }
        let handles: Vec<_> = page.iter().map(spawn).collect();
        let mut out = Vec::with_capacity(handles.len());
        for handle in handles {
            out.push(joined(handle).await?);
        }
        Ok(out)
    }

    /// Imports one DC's kept events one at a time, in seq order.
    async fn events(
        &mut self,
        dc_index: usize,
        dc: &DcId,
        from: &dyn DcStore,
        to: &dyn DcStore,
        counts: &DcCounts,
    ) -> Result<Tally, StoreError> {
        let mut tally = Tally::default();
        let mut picker = Picker::new(counts.events, self.sample);
        let (mut seq, mut done) = (0, 0);
        loop {
            let page = from.events(seq, EVENTS_LIMIT_MAX).await?.events;
            for event in &page {
                if picker.pick() {
                    self.samples.events.push((dc_index, event.clone()));
                }
            }
            let mut held = match (self.mode, page.first(), page.last()) {
                (Mode::DryRun, Some(first), Some(last)) => {
                    events_between(to, first.seq, last.seq).await?
                }
                _ => BTreeMap::new(),
            };
            for event in &page {
                let import = match self.mode {
                    Mode::Copy => to.import_event(event).await?,
                    Mode::DryRun => judge_event_import(event, held.remove(&event.seq))
                        .unwrap_or(Import::Written),
                    Mode::Sample => continue,
                };
                tally.add(&import);
                if let Import::Conflict { current } = import {
                    self.conflict(Conflict::Event {
                        dc: dc.clone(),
                        source: Box::new(event.clone()),
                        target: Box::new(current),
                    });
                }
            }
            done += page.len() as u64;
            if self.mode != Mode::Sample {
                self.progress(Step::Events(dc.clone()), done, counts.events);
            }
            match page.last() {
                Some(last) if page.len() == EVENTS_LIMIT_MAX => seq = last.seq,
                _ => return Ok(tally),
            }
        }
    }

    /// Copies the global entries with `set_if_absent`, a page at a time.
    async fn global(
        &mut self,
        from: &dyn GlobalStore,
        to: &Arc<dyn GlobalStore>,
        total: u64,
    ) -> Result<Tally, StoreError> {
        let mut tally = Tally::default();
        let mut picker = Picker::new(total, self.sample);
        let mut after: Option<Key> = None;
        let mut done = 0;
        loop {
            let page = from.scan(after.as_ref(), GET_MANY_KEYS_MAX).await?;
            for entry in &page {
                if picker.pick() {
                    self.samples.entries.push(entry.clone());
                }
            }
            let found = match self.mode {
                Mode::Copy => set_all(to, &page).await?,
                Mode::DryRun => {
                    let keys: Vec<Key> = page.iter().map(|(k, _)| k.clone()).collect();
                    to.get_many(&keys).await?
                }
                Mode::Sample => Vec::new(),
            };
            for ((key, id), found) in page.iter().zip(found) {
                match found {
                    None => tally.copied += 1,
                    Some(existing) if &existing == id => tally.present += 1,
                    Some(existing) => {
                        tally.conflicts += 1;
                        self.conflict(Conflict::Global {
                            key: key.clone(),
                            source: id.clone(),
                            target: existing,
                        });
                    }
                }
            }
            done += page.len() as u64;
            if self.mode != Mode::Sample {
                self.progress(Step::Global, done, total);
            }
            after = page.last().map(|(k, _)| k.clone());
            if page.len() < GET_MANY_KEYS_MAX {
                return Ok(tally);
            }
        }
    }
}

/// `set_if_absent` of every entry of `page`, concurrently: `None` where it
/// was inserted, the entry found otherwise.
async fn set_all(
    to: &Arc<dyn GlobalStore>,
    page: &[(Key, ReservationId)],
) -> Result<Vec<Option<ReservationId>>, StoreError> {
    let handles: Vec<_> = page
        .iter()
        .map(|(key, id)| {
            let (to, key, id) = (to.clone(), key.clone(), id.clone());
            tokio::spawn(async move { to.set_if_absent(&key, &id).await })
        })
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(match joined(handle).await? {
            SetIfAbsent::Inserted => None,
            SetIfAbsent::Exists(existing) => Some(existing),
        });
    }
    Ok(out)
}

/// The target's events with `first ≤ seq ≤ last`.
async fn events_between(
    to: &dyn DcStore,
    first: EventSeq,
    last: EventSeq,
) -> Result<BTreeMap<EventSeq, Event>, StoreError> {
    let mut held = BTreeMap::new();
    let mut seq = first.saturating_sub(1);
    loop {
        let page = to.events(seq, EVENTS_LIMIT_MAX).await?.events;
        let full = page.len() == EVENTS_LIMIT_MAX;
        for event in page {
            if event.seq > last {
                return Ok(held);
            }
            seq = event.seq;
            held.insert(event.seq, event);
        }
        if !full {
            return Ok(held);
        }
    }
}

/// Counts the target and compares it with the source's `counts` and `samples`.
async fn check(
    source: &StoreSet,
    target: &StoreSet,
    counts: &Counts,
    samples: &Samples,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<Verification, StoreError> {
    let expected = counts.global + counts.dcs.iter().map(|c| c.records + c.events).sum::<u64>();
    let found = count_as(target, Step::Verify, Some(expected), progress).await?;
    let mut mismatches = Mismatches::default();
    let global = Counted {
        source: counts.global,
        target: found.global,
    };
    mismatches.count("global entries", None, global);
    let mut dcs = Vec::with_capacity(source.dcs.len());
    for (((dc, _), s), t) in source.dcs.iter().zip(&counts.dcs).zip(&found.dcs) {
        let v = DcVerification {
            dc: dc.clone(),
            records: Counted {
                source: s.records,
                target: t.records,
            },
            events: Counted {
                source: s.events,
                target: t.events,
            },
            event_head: Counted {
                source: s.event_head,
                target: t.event_head,
            },
            allocator_floor: Counted {
                source: s.raise_to(),
                target: t.floor,
            },
        };
        mismatches.count("records", Some(dc), v.records);
        mismatches.count("events", Some(dc), v.events);
        if v.event_head.target < v.event_head.source {
            mismatches.push(Mismatch::EventHeadBelow {
                dc: dc.clone(),
                head: v.event_head,
            });
        }
        if v.allocator_floor.target < v.allocator_floor.source {
            mismatches.push(Mismatch::AllocatorBelow {
                dc: dc.clone(),
                floor: v.allocator_floor,
            });
        }
        dcs.push(v);
    }
    let sampled = compare_samples(source, target, samples, &mut mismatches).await?;
    Ok(Verification {
        global,
        dcs,
        sampled,
        mismatches: mismatches.listed,
        mismatches_total: mismatches.total,
    })
}

#[derive(Default)]
struct Mismatches {
    listed: Vec<Mismatch>,
    total: u64,
}

impl Mismatches {
    fn push(&mut self, m: Mismatch) {
        self.total += 1;
        if self.listed.len() < MISMATCHES_LISTED_MAX {
            self.listed.push(m);
        }
    }

    fn count(&mut self, what: &'static str, dc: Option<&DcId>, counted: Counted) {
        if counted.source != counted.target {
            self.push(Mismatch::Count {
                what,
                dc: dc.cloned(),
                counted,
            });
        }
    }
}

/// Compares every sampled item with the target; returns how many were compared.
async fn compare_samples(
    source: &StoreSet,
    target: &StoreSet,
    samples: &Samples,
    mismatches: &mut Mismatches,
) -> Result<u64, StoreError> {
    for (i, record) in &samples.records {
        let (dc, store) = &target.dcs[*i];
        match store.get(&record.id).await? {
            None => mismatches.push(Mismatch::RecordMissing {
                dc: dc.clone(),
                id: record.id.clone(),
            }),
            Some(found) if &found != record => mismatches.push(Mismatch::RecordDiffers {
                dc: dc.clone(),
                id: record.id.clone(),
                fields: record_diff(record, &found),
            }),
            Some(_) => {}
        }
    }
    for (i, event) in &samples.events {
        let (dc, store) = &target.dcs[*i];
        let page = store.events(event.seq.saturating_sub(1), 1).await?;
        let fields = match page.events.first() {
            Some(found) if found.seq == event.seq => event_diff(event, found),
            _ => vec!["missing"],
        };
        if !fields.is_empty() {
            mismatches.push(Mismatch::EventDiffers {
                dc: dc.clone(),
                seq: event.seq,
                fields,
            });
        }
    }
    // The sampled entries, and the entries of the sampled records' keys.
    let mut keys: BTreeSet<&Key> = samples.entries.iter().map(|(k, _)| k).collect();
    keys.extend(samples.records.iter().map(|(_, r)| &r.key));
    let keys: Vec<Key> = keys.into_iter().cloned().collect();
    for chunk in keys.chunks(GET_MANY_KEYS_MAX) {
        let want = source.global.get_many(chunk).await?;
        let found = target.global.get_many(chunk).await?;
        for ((key, want), found) in chunk.iter().zip(want).zip(found) {
            if want != found {
                mismatches.push(Mismatch::EntryDiffers {
                    key: key.clone(),
                    source: want,
                    target: found,
                });
            }
        }
    }
    Ok((samples.records.len() + samples.events.len() + keys.len()) as u64)
}

/// The names of the fields in which two records differ.
fn record_diff(a: &DcRecord, b: &DcRecord) -> Vec<&'static str> {
    let DcRecord {
        id,
        key,
        tag,
        token,
        allow_renew,
        predecessor,
        state,
        version,
    } = a;
    [
        ("id", id == &b.id),
        ("key", key == &b.key),
        ("tag", tag == &b.tag),
        ("token", token == &b.token),
        ("allow_renew", allow_renew == &b.allow_renew),
        ("predecessor", predecessor == &b.predecessor),
        ("state", state == &b.state),
        ("version", version == &b.version),
    ]
    .into_iter()
    .filter(|(_, same)| !same)
    .map(|(name, _)| name)
    .collect()
}

/// The names of the fields in which two events differ.
fn event_diff(a: &Event, b: &Event) -> Vec<&'static str> {
    let Event {
        seq,
        reservation,
        key,
        token,
        kind,
    } = a;
    [
        ("seq", seq == &b.seq),
        ("reservation", reservation == &b.reservation),
        ("key", key == &b.key),
        ("token", token == &b.token),
        ("kind", kind == &b.kind),
    ]
    .into_iter()
    .filter(|(_, same)| !same)
    .map(|(name, _)| name)
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dc::Cas;
    use crate::memory::{MemoryDcStore, MemoryGlobalStore};
    use homing_core::{
        ActorId, FencingToken, HostTime, KeyName, LeasePolicy, Namespace, RunOutcome, StoreTime,
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
                    ActorId::new("10.0.0.1:9000").unwrap(),
                    HostTime::from_ms(0),
                    now,
                    &POLICY,
                );
                write(store.as_ref(), None, &r).await;
                set.global.set_if_absent(&r.key, &r.id).await.unwrap();
                let released = r.release(r.token, RunOutcome::Ok, now).next;
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
                            Some(r.id.clone()),
                            ActorId::new("10.0.0.2:9000").unwrap(),
                            HostTime::from_ms(0),
                            now,
                            &POLICY,
                        );
                        write(store.as_ref(), None, &r2).await;
                        let linked = released.link(&next, released.token, now, &POLICY).next;
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
        let text = report.to_string();
        assert!(text.contains("differing in allow_renew"), "{text}");
        assert!(text.contains("global entries held back"), "{text}");
        assert!(text.ends_with("result: 2 CONFLICTS"), "{text}");
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
