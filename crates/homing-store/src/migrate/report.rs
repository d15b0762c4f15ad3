//! What a migration and a verification report: per-DC tallies, conflicts
//! with both values, mismatches, and how they print.

use super::*;

/// What a migration is doing, for a progress display.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Counting the source (totals for the other steps).
    Count,
    /// Copying one DC's host sessions' rows.
    Sessions(DcId),
    /// Copying one DC's records.
    Records(DcId),
    /// Copying one DC's events.
    Events(DcId),
    /// Copying the settings.
    Settings,
    /// Copying every DC's successions.
    Successions,
    /// Copying every DC's lease entry (terms, marks, retirement).
    DcLeases,
    /// Copying the global entries.
    Global,
    /// Reading the target to verify it.
    Verify,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Count => f.write_str("counting source"),
            Step::Sessions(dc) => write!(f, "{dc} sessions"),
            Step::Records(dc) => write!(f, "{dc} records"),
            Step::Events(dc) => write!(f, "{dc} events"),
            Step::Settings => f.write_str("settings"),
            Step::Successions => f.write_str("successions"),
            Step::DcLeases => f.write_str("dc leases"),
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
    /// Counts what a write-once copy of `source` found at the target:
    /// nothing (`None`: written, or would be), `source` itself (present), or
    /// another value, returned: a conflict, for the caller to list.
    pub(super) fn found<T: PartialEq>(&mut self, source: &T, found: Option<T>) -> Option<T> {
        match found {
            None => self.copied += 1,
            Some(held) if &held == source => self.present += 1,
            Some(held) => {
                self.conflicts += 1;
                return Some(held);
            }
        }
        None
    }

    pub(super) fn add<T>(&mut self, import: &Import<T>) {
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
    /// Its host sessions' rows.
    pub sessions: Tally,
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
    /// A host session's row with a newer or equal version and other
    /// contents.
    Session {
        /// The DC.
        dc: DcId,
        /// The source's row.
        source: Box<SessionRecord>,
        /// The target's row.
        target: Box<SessionRecord>,
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
    /// A setting the target holds with another value.
    Setting {
        /// The setting.
        setting: Setting,
        /// The source's value.
        source: Vec<u8>,
        /// The target's value.
        target: Vec<u8>,
    },
    /// A succession (write-once) of the same reservation with another
    /// successor, cause or token.
    Succession {
        /// The source's succession.
        source: Succession,
        /// The target's succession of the same reservation.
        target: Succession,
    },
    /// A DC's lease entry that the target keeps less of and cannot be
    /// given: the target retired the DC (for good), or the source has
    /// marks but no terms to renew them with.
    DcLease {
        /// The source's entry.
        source: Box<DcLeaseState>,
        /// The target's entry.
        target: Box<DcLeaseState>,
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
            Conflict::Session { dc, source, target } => write!(
                f,
                "{dc} session {}: source {}, target {}",
                source.id,
                shown_session(source),
                shown_session(target)
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
            Conflict::Setting {
                setting,
                source,
                target,
            } => write!(
                f,
                "setting {setting}: source {}, target {} (left as is)",
                shown(source),
                shown(target)
            ),
            Conflict::Succession { source, target } => write!(
                f,
                "succession of {}: source {}, target {} (write-once: left as is)",
                source.link.from,
                shown_succession(source),
                shown_succession(target)
            ),
            Conflict::DcLease { source, target } => write!(
                f,
                "dc lease {}: the target's differs from the source's in {}, and {} (left as is)",
                source.dc,
                lease_diff(source, target).join(", "),
                if target.retired {
                    "the target retired the dc for good"
                } else {
                    "the source has no terms to renew it with"
                }
            ),
        }
    }
}

/// A succession as a report shows it (its reservation is shown beside it).
fn shown_succession(succession: &Succession) -> String {
    let Link { to, token, .. } = &succession.link;
    match succession.cause {
        SuccessionCause::Moved => format!("moved to {to} (token {token})"),
        SuccessionCause::TakenOver => format!("taken over by {to} (token {token})"),
    }
}

/// [`shown_succession`], or `none`.
fn shown_succession_or_none(succession: &Option<Succession>) -> String {
    succession
        .as_ref()
        .map_or_else(|| "none".to_string(), shown_succession)
}

/// Most bytes of a setting's value a report shows; the length is always shown.
pub const SETTING_SHOWN_BYTES_MAX: usize = 32;

/// A setting's value as a report shows it: its length and its first
/// [`SETTING_SHOWN_BYTES_MAX`] bytes, escaped (values are opaque bytes).
fn shown(value: &[u8]) -> String {
    let head = &value[..value.len().min(SETTING_SHOWN_BYTES_MAX)];
    let more = if head.len() < value.len() { "…" } else { "" };
    let unit = if value.len() == 1 { "byte" } else { "bytes" };
    format!("{} {unit} \"{}{more}\"", value.len(), head.escape_ascii())
}

/// [`shown`], or `unset`.
fn shown_or_unset(value: &Option<Vec<u8>>) -> String {
    value.as_deref().map_or_else(|| "unset".to_string(), shown)
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
    /// Host sessions' rows: equal counts expected (each row is compared too).
    pub sessions: Counted,
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
    /// A DC's host session row differs, or is on one side only (missing in
    /// the target: its keys there are held by no live session).
    SessionDiffers {
        /// The DC.
        dc: DcId,
        /// The session.
        id: SessionId,
        /// The source's row.
        source: Option<Box<SessionRecord>>,
        /// The target's row.
        target: Option<Box<SessionRecord>>,
    },
    /// Different numbers of items of one kind.
    Count {
        /// `global entries`, `dc leases`, `records` or `events`.
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
    /// A setting differs, or is set on one side only.
    SettingDiffers {
        /// The setting.
        setting: Setting,
        /// The source's value.
        source: Option<Vec<u8>>,
        /// The target's value.
        target: Option<Vec<u8>>,
    },
    /// A DC's lease entry at the target keeps less than the source's.
    DcLeaseDiffers {
        /// The DC.
        dc: DcId,
        /// What the target lacks (`terms`, `allocator_floor`,
        /// `token_bound`, `event_head`, `retired`).
        fields: Vec<&'static str>,
    },
    /// A reservation's succession differs, or is on one side only (missing
    /// in the target: a takeover there could fork the key's chain).
    SuccessionDiffers {
        /// The reservation succeeded.
        from: ReservationId,
        /// The source's succession.
        source: Option<Succession>,
        /// The target's succession.
        target: Option<Succession>,
    },
}

/// A session row as a report shows it: never its secret.
fn shown_session(row: &SessionRecord) -> String {
    let state = match row.state {
        SessionState::Live { expires_at } => format!("live until {}", expires_at.as_ms()),
        SessionState::Ended { until, cause } => {
            format!("ended ({cause:?}) at {}", until.as_ms())
        }
    };
    format!(
        "{state}, notice {}, version {}",
        row.notice_seq, row.version
    )
}

/// [`shown_session`], or `none`.
fn shown_session_or_none(row: Option<&SessionRecord>) -> String {
    row.map_or_else(|| "none".to_string(), shown_session)
}

fn or_none(id: &Option<ReservationId>) -> String {
    id.as_ref()
        .map_or_else(|| "none".to_string(), |id| id.to_string())
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::SessionDiffers {
                dc,
                id,
                source,
                target,
            } => write!(
                f,
                "{dc} session {id}: source {}, target {}",
                shown_session_or_none(source.as_deref()),
                shown_session_or_none(target.as_deref())
            ),
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
            Mismatch::SettingDiffers {
                setting,
                source,
                target,
            } => write!(
                f,
                "setting {setting}: source {}, target {}",
                shown_or_unset(source),
                shown_or_unset(target)
            ),
            Mismatch::DcLeaseDiffers { dc, fields } => write!(
                f,
                "dc lease {dc}: the target's differs from the source's in {}",
                fields.join(", ")
            ),
            Mismatch::SuccessionDiffers {
                from,
                source,
                target,
            } => write!(
                f,
                "succession of {from}: source {}, target {}",
                shown_succession_or_none(source),
                shown_succession_or_none(target)
            ),
        }
    }
}

/// The outcome of [`verify`]: counts per kind and what differs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// Global entries.
    pub global: Counted,
    /// Settings set (each value is compared too).
    pub settings: Counted,
    /// Every DC's successions (each one is compared too).
    pub successions: Counted,
    /// DCs with a lease entry (each one is compared too).
    pub dc_leases: Counted,
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
        writeln!(f, "  {:<24} {}", "settings", equal(self.settings))?;
        writeln!(f, "  {:<24} {}", "successions", equal(self.successions))?;
        writeln!(f, "  {:<24} {}", "dc leases", equal(self.dc_leases))?;
        for dc in &self.dcs {
            let row = |what: &str| format!("{} {what}", dc.dc);
            writeln!(f, "  {:<24} {}", row("sessions"), equal(dc.sessions))?;
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
    /// Settings (copied whatever else conflicted: a setting can be changed
    /// again, unlike a global entry).
    pub settings: Tally,
    /// Every DC's successions (judged only, not written, when
    /// `global_held_back`).
    pub successions: Tally,
    /// Every DC's lease entry: terms, marks, retirement (judged only, not
    /// written, when `global_held_back`).
    pub dc_leases: Tally,
    /// Global entries (judged only, not written, when `global_held_back`).
    pub global: Tally,
    /// The successions, DC leases and global entries were not written
    /// because a DC's records or events conflicted: none can ever be taken
    /// back (marks only rise, a retirement is for good), successions and
    /// entries name reservations whose records at the target are other
    /// ones, and a DC lease copied without its successions would let the
    /// target take over what the source had moved.
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
            + self.settings.conflicts
            + self.successions.conflicts
            + self.dc_leases.conflicts
            + self.dc_conflicts()
    }

    /// Conflicts of the DCs' session rows, records and events: what holds the global
    /// entries back.
    pub(super) fn dc_conflicts(&self) -> u64 {
        self.dcs
            .iter()
            .map(|d| d.sessions.conflicts + d.records.conflicts + d.events.conflicts)
            .sum()
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
            tally_line(
                f,
                &format!("{} sessions", dc.dc),
                &dc.sessions,
                self.dry_run,
            )?;
            tally_line(f, &format!("{} records", dc.dc), &dc.records, self.dry_run)?;
            tally_line(f, &format!("{} events", dc.dc), &dc.events, self.dry_run)?;
        }
        tally_line(f, "settings", &self.settings, self.dry_run)?;
        let held_back = self.dry_run || self.global_held_back;
        tally_line(f, "successions", &self.successions, held_back)?;
        tally_line(f, "dc leases", &self.dc_leases, held_back)?;
        tally_line(f, "global entries", &self.global, held_back)?;
        if self.global_held_back {
            writeln!(
                f,
                "  successions, dc leases and global entries held back: DC conflicts first (none can ever be taken back)"
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
