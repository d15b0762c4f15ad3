//! The copy: counting the source, then one walk over it page by page that
//! imports into the target (or judges as an import would, or only picks
//! samples), keeping the order that makes an interrupted copy safe.

use super::*;

/// What one store set holds, counted.
#[derive(Debug, Default)]
pub(super) struct Counts {
    pub(super) global: u64,
    /// Every DC's successions.
    pub(super) successions: u64,
    /// Every DC the global store keeps a lease entry of, in id order.
    pub(super) dc_leases: Vec<DcLeaseState>,
    /// The settings that are set, with their values, in [`Setting::ALL`] order.
    pub(super) settings: Vec<(Setting, Vec<u8>)>,
    pub(super) referenced_dcs: BTreeMap<DcId, u64>,
    pub(super) dcs: Vec<DcCounts>,
}

impl Counts {
    /// The value of `name`, if it is set.
    pub(super) fn setting(&self, name: Setting) -> Option<&Vec<u8>> {
        self.settings
            .iter()
            .find(|(setting, _)| *setting == name)
            .map(|(_, value)| value)
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub(super) struct DcCounts {
    /// Host sessions' rows.
    pub(super) sessions: u64,
    pub(super) records: u64,
    pub(super) events: u64,
    pub(super) event_head: EventSeq,
    /// The store's allocator floor.
    pub(super) floor: u64,
    /// The highest unique of the DC's own records and sessions (one
    /// allocator hands out both).
    pub(super) unique_max: u64,
}

impl DcCounts {
    /// What a target's allocator must be raised to: above it, it can hand
    /// out no ID the source used (a record above the source's own floor,
    /// restored from elsewhere, included).
    pub(super) fn raise_to(&self) -> u64 {
        self.floor.max(self.unique_max)
    }
}

/// Counts `set`, reporting `Step::Count` progress (or `Step::Verify` with
/// `expected` items when counting a target).
pub(super) async fn count(
    set: &StoreSet,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<Counts, StoreError> {
    count_as(set, Step::Count, None, progress).await
}

pub(super) async fn count_as(
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
        let mut after: Option<SessionId> = None;
        loop {
            let page = store.sessions(after.as_ref(), SESSION_PAGE_MAX).await?;
            c.sessions += page.len() as u64;
            for row in page.iter().filter(|r| r.id.dc() == dc) {
                c.unique_max = c.unique_max.max(row.id.unique());
            }
            report(page.len(), progress);
            after = page.last().map(|r| r.id.clone());
            if page.len() < SESSION_PAGE_MAX {
                break;
            }
        }
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
    let mut pages = SuccessionPages::every();
    while let Some(page) = pages.next(set.global.as_ref()).await? {
        counts.successions += page.len() as u64;
        report(page.len(), progress);
    }
    counts.dc_leases = set.global.dc_leases().await?;
    if counts.dc_leases.len() >= DCS_MAX {
        // A DC past the listing would keep no marks at the target.
        return Err(StoreError::Backend {
            backend: "migrate",
            reason: format!(
                "the global store lists {} DCs, as many as dc_leases lists at most ({DCS_MAX}): any further DC's lease would not be copied",
                counts.dc_leases.len()
            ),
        });
    }
    report(counts.dc_leases.len(), progress);
    for name in Setting::ALL {
        if let Some(value) = set.global.setting(name).await? {
            counts.settings.push((name, value));
        }
    }
    report(counts.settings.len(), progress);
    Ok(counts)
}

pub(super) async fn scan_page(
    store: &dyn DcStore,
    after: Option<&ScanCursor>,
) -> Result<Vec<DcRecord>, StoreError> {
    store
        .scan(&NamespaceScope::everything(), "", after, SCAN_LIMIT_MAX)
        .await
}
/// What a walk over the source does with each page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Import into the target.
    Copy,
    /// Read the target and judge as an import would.
    DryRun,
    /// Only pick samples.
    Sample,
}

/// Items picked for verification while walking the source.
#[derive(Debug, Default)]
pub(super) struct Samples {
    /// (DC index, record).
    pub(super) records: Vec<(usize, DcRecord)>,
    /// (DC index, event).
    pub(super) events: Vec<(usize, Event)>,
    pub(super) entries: Vec<(Key, ReservationId)>,
}

/// Picks `n` of `total` items in walk order, evenly spread: the items at
/// `k * total / n` for `k` in `0..n` (all of them when `n ≥ total`).
#[derive(Debug)]
pub(super) struct Picker {
    pub(super) total: u64,
    pub(super) n: u64,
    pub(super) k: u64,
    pub(super) index: u64,
}

impl Picker {
    pub(super) fn new(total: u64, n: usize) -> Picker {
        Picker {
            total,
            n: (n.min(SAMPLE_MAX) as u64).min(total),
            k: 0,
            index: 0,
        }
    }

    /// Whether the next item is picked.
    pub(super) fn pick(&mut self) -> bool {
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
pub(super) struct Walk<'p> {
    pub(super) mode: Mode,
    pub(super) sample: usize,
    pub(super) conflicts: Vec<Conflict>,
    pub(super) samples: Samples,
    pub(super) progress: &'p mut (dyn FnMut(&Progress) + Send),
}

/// Awaits a spawned store call; a panic in it is re-raised here.
pub(super) async fn joined<T>(handle: JoinHandle<Result<T, StoreError>>) -> Result<T, StoreError> {
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
    pub(super) fn new(
        mode: Mode,
        sample: usize,
        progress: &'p mut (dyn FnMut(&Progress) + Send),
    ) -> Walk<'p> {
        Walk {
            mode,
            sample,
            conflicts: Vec::new(),
            samples: Samples::default(),
            progress,
        }
    }

    pub(super) fn conflict(&mut self, conflict: Conflict) {
        if self.conflicts.len() < CONFLICTS_LISTED_MAX {
            self.conflicts.push(conflict);
        }
    }

    pub(super) fn progress(&mut self, step: Step, done: u64, total: u64) {
        (self.progress)(&Progress {
            step,
            done,
            total: Some(total),
        });
    }

    /// Raises the target's allocator above the source's floor (in a dry run,
    /// only reads it).
    pub(super) async fn allocator(
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

    /// Imports one DC's host sessions' rows with `import_session`, a page
    /// at a time (in a dry run: judges each against the target's row). A
    /// row the target holds newer or different is a conflict, never
    /// overwritten. Not sampled: the verification compares every row.
    pub(super) async fn sessions(
        &mut self,
        dc: &DcId,
        from: &Arc<dyn DcStore>,
        to: &Arc<dyn DcStore>,
        total: u64,
    ) -> Result<Tally, StoreError> {
        let mut tally = Tally::default();
        if self.mode == Mode::Sample {
            return Ok(tally);
        }
        let (mut after, mut done): (Option<SessionId>, u64) = (None, 0);
        loop {
            let page = from.sessions(after.as_ref(), SESSION_PAGE_MAX).await?;
            for row in &page {
                let import = match self.mode {
                    Mode::Copy => to.import_session(row).await?,
                    _ => judge_session_import(row, to.session(&row.id).await?)
                        .unwrap_or(Import::Written),
                };
                tally.add(&import);
                if let Import::Conflict { current } = import {
                    self.conflict(Conflict::Session {
                        dc: dc.clone(),
                        source: Box::new(row.clone()),
                        target: Box::new(current),
                    });
                }
            }
            done += page.len() as u64;
            self.progress(Step::Sessions(dc.clone()), done, total);
            after = page.last().map(|r| r.id.clone());
            if page.len() < SESSION_PAGE_MAX {
                return Ok(tally);
            }
        }
    }

    /// Imports one DC's records, a page at a time (a page's imports run
    /// concurrently: they touch distinct records).
    pub(super) async fn records(
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
    pub(super) async fn import_records(
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
    pub(super) async fn events(
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

    /// Copies the source's `settings` (as counted) with a swap from never
    /// set: a setting the target holds with another value is a conflict,
    /// never overwritten.
    pub(super) async fn settings(
        &mut self,
        to: &dyn GlobalStore,
        settings: &[(Setting, Vec<u8>)],
    ) -> Result<Tally, StoreError> {
        let mut tally = Tally::default();
        for (name, value) in settings {
            let held = match self.mode {
                Mode::Copy => match to.swap_setting(*name, None, value).await? {
                    Ok(()) => None,
                    Err(held) => held,
                },
                Mode::DryRun => to.setting(*name).await?,
                Mode::Sample => continue,
            };
            if let Some(held) = tally.found(value, held) {
                self.conflict(Conflict::Setting {
                    setting: *name,
                    source: value.clone(),
                    target: held,
                });
            }
        }
        if self.mode != Mode::Sample {
            let total = settings.len() as u64;
            self.progress(Step::Settings, total, total);
        }
        Ok(tally)
    }

    /// Copies every DC's successions with `import_succession` (which judges
    /// no DC lease: each was judged where it was first written), a page at
    /// a time; in a dry run, reads the target's. One the target holds with
    /// another successor is a conflict, never overwritten.
    pub(super) async fn successions(
        &mut self,
        from: &dyn GlobalStore,
        to: &Arc<dyn GlobalStore>,
        total: u64,
    ) -> Result<Tally, StoreError> {
        let mut tally = Tally::default();
        if self.mode == Mode::Sample {
            // Verification compares every succession, not samples.
            return Ok(tally);
        }
        let mut pages = SuccessionPages::every();
        let mut done = 0;
        while let Some(page) = pages.next(from).await? {
            let found = import_successions(to, &page, self.mode).await?;
            for (succession, found) in page.iter().zip(found) {
                if let Some(held) = tally.found(succession, found) {
                    self.conflict(Conflict::Succession {
                        source: succession.clone(),
                        target: held,
                    });
                }
            }
            done += page.len() as u64;
            self.progress(Step::Successions, done, total);
        }
        Ok(tally)
    }

    /// Copies every DC's lease entry the target lacks (see [`lease_copy`]):
    /// a renewal under the source's terms publishes its marks, then a
    /// retired DC is retired (in a dry run, only judged).
    pub(super) async fn dc_leases(
        &mut self,
        to: &dyn GlobalStore,
        leases: &[DcLeaseState],
    ) -> Result<Tally, StoreError> {
        let mut tally = Tally::default();
        if self.mode == Mode::Sample {
            // Verification compares every DC's lease, not samples.
            return Ok(tally);
        }
        for source in leases {
            let target = to.dc_lease(&source.dc).await?;
            match lease_copy(source, &target) {
                LeaseCopy::Present => tally.present += 1,
                LeaseCopy::Conflict => {
                    tally.conflicts += 1;
                    self.conflict(Conflict::DcLease {
                        source: Box::new(source.clone()),
                        target: Box::new(target),
                    });
                }
                LeaseCopy::Write { renew, retire } => {
                    tally.copied += 1;
                    if self.mode == Mode::Copy {
                        write_lease(to, source, renew, retire).await?;
                    }
                }
            }
        }
        let total = leases.len() as u64;
        self.progress(Step::DcLeases, total, total);
        Ok(tally)
    }

    /// Copies the global entries with `set_if_absent`, a page at a time.
    pub(super) async fn global(
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
                if let Some(existing) = tally.found(id, found) {
                    self.conflict(Conflict::Global {
                        key: key.clone(),
                        source: id.clone(),
                        target: existing,
                    });
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
pub(super) async fn set_all(
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

/// What copying one DC's lease entry to a target takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LeaseCopy {
    /// The target keeps at least what the source does ([`lease_diff`]).
    Present,
    /// A renewal under the source's terms and marks (`renew`), then
    /// retiring the DC (`retire`).
    Write {
        /// Publish the source's terms and marks.
        renew: bool,
        /// Retire the DC.
        retire: bool,
    },
    /// The target lacks something it can never be given: it retired the
    /// DC (for good; a retired DC's renewals are refused), or the source
    /// has marks but no terms to renew with.
    Conflict,
}

/// How `target`'s entry of a DC becomes at least `source`'s: marks only
/// rise and a retirement is for good, so the one write that publishes
/// marks is a renewal (under the source's terms), before the retirement.
pub(super) fn lease_copy(source: &DcLeaseState, target: &DcLeaseState) -> LeaseCopy {
    let lacking = lease_diff(source, target);
    if lacking.is_empty() {
        return LeaseCopy::Present;
    }
    let renew = lacking.iter().any(|field| *field != "retired");
    let retire = source.retired && !target.retired;
    let impossible = (target.retired && !source.retired)
        || (renew && (target.retired || source.terms.is_none()));
    match impossible {
        true => LeaseCopy::Conflict,
        false => LeaseCopy::Write { renew, retire },
    }
}

/// Performs a [`LeaseCopy::Write`] of `source` at `to`.
async fn write_lease(
    to: &dyn GlobalStore,
    source: &DcLeaseState,
    renew: bool,
    retire: bool,
) -> Result<(), StoreError> {
    if let Some(terms) = source.terms.filter(|_| renew) {
        // Counted as renewed now, as a store that restarts counts every DC
        // it knows: never expired sooner than the source would call it.
        let renewal = to.renew_dc_lease(&source.dc, &terms, &source.marks).await?;
        // lease_copy renews only a DC the target had not retired.
        if renewal == DcRenewal::Retired {
            return Err(StoreError::Backend {
                backend: "migrate",
                reason: format!(
                    "dc {} was retired at the target while its lease was copied: stop every homing process using the target and run again",
                    source.dc
                ),
            });
        }
    }
    if retire {
        to.retire_dc(&source.dc).await?;
    }
    Ok(())
}

/// `import_succession` of every succession of `page`, concurrently (in a
/// dry run: `successor`): `None` where it was (would be) written, the
/// target's succession of that reservation otherwise.
pub(super) async fn import_successions(
    to: &Arc<dyn GlobalStore>,
    page: &[Succession],
    mode: Mode,
) -> Result<Vec<Option<Succession>>, StoreError> {
    let handles: Vec<_> = page
        .iter()
        .map(|succession| {
            let (to, succession) = (to.clone(), succession.clone());
            tokio::spawn(async move {
                match mode {
                    Mode::Copy => to.import_succession(&succession).await,
                    Mode::DryRun | Mode::Sample => to.successor(&succession.link.from).await,
                }
            })
        })
        .collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(joined(handle).await?);
    }
    Ok(out)
}

/// The target's events with `first ≤ seq ≤ last`.
pub(super) async fn events_between(
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
