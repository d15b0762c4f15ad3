//! The verification: counts, allocator floors and event heads compared,
//! every setting, succession and DC lease entry compared, and the sampled
//! records, events and entries compared field by field.

use super::*;

/// Counts the target and compares it with the source's `counts` and `samples`.
pub(super) async fn check(
    source: &StoreSet,
    target: &StoreSet,
    counts: &Counts,
    samples: &Samples,
    progress: &mut (dyn FnMut(&Progress) + Send),
) -> Result<Verification, StoreError> {
    let expected = counts.global
        + counts.successions
        + counts.dc_leases.len() as u64
        + counts.settings.len() as u64
        + counts
            .dcs
            .iter()
            .map(|c| c.sessions + c.records + c.events)
            .sum::<u64>();
    let found = count_as(target, Step::Verify, Some(expected), progress).await?;
    let mut mismatches = Mismatches::default();
    let global = Counted {
        source: counts.global,
        target: found.global,
    };
    mismatches.count("global entries", None, global);
    let settings = Counted {
        source: counts.settings.len() as u64,
        target: found.settings.len() as u64,
    };
    for setting in Setting::ALL {
        let (source, target) = (counts.setting(setting), found.setting(setting));
        if source != target {
            mismatches.push(Mismatch::SettingDiffers {
                setting,
                source: source.cloned(),
                target: target.cloned(),
            });
        }
    }
    let successions = Counted {
        source: counts.successions,
        target: found.successions,
    };
    compare_successions(
        source.global.as_ref(),
        target.global.as_ref(),
        &mut mismatches,
    )
    .await?;
    let dc_leases = Counted {
        source: counts.dc_leases.len() as u64,
        target: found.dc_leases.len() as u64,
    };
    mismatches.count("dc leases", None, dc_leases);
    for source in &counts.dc_leases {
        let target = found.dc_leases.iter().find(|t| t.dc == source.dc);
        let target = target
            .cloned()
            .unwrap_or_else(|| DcLeaseState::unknown(source.dc.clone()));
        let fields = lease_diff(source, &target);
        if !fields.is_empty() {
            mismatches.push(Mismatch::DcLeaseDiffers {
                dc: source.dc.clone(),
                fields,
            });
        }
    }
    let mut dcs = Vec::with_capacity(source.dcs.len());
    for (((dc, from), s), (t, (_, to))) in source
        .dcs
        .iter()
        .zip(&counts.dcs)
        .zip(found.dcs.iter().zip(&target.dcs))
    {
        compare_sessions(dc, from.as_ref(), to.as_ref(), &mut mismatches).await?;
        let v = DcVerification {
            dc: dc.clone(),
            sessions: Counted {
                source: s.sessions,
                target: t.sessions,
            },
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
        settings,
        successions,
        dc_leases,
        dcs,
        sampled,
        mismatches: mismatches.listed,
        mismatches_total: mismatches.total,
    })
}

#[derive(Default)]
pub(super) struct Mismatches {
    pub(super) listed: Vec<Mismatch>,
    pub(super) total: u64,
}

impl Mismatches {
    pub(super) fn push(&mut self, m: Mismatch) {
        self.total += 1;
        if self.listed.len() < MISMATCHES_LISTED_MAX {
            self.listed.push(m);
        }
    }

    pub(super) fn count(&mut self, what: &'static str, dc: Option<&DcId>, counted: Counted) {
        if counted.source != counted.target {
            self.push(Mismatch::Count {
                what,
                dc: dc.cloned(),
                counted,
            });
        }
    }
}

/// Compares every succession of `source` with `target`'s, in one merge of
/// both in store order (each read once, a page at a time): one missing in
/// the target, different there, or there only is a mismatch. Every one, not
/// a sample: a missing succession lets a takeover in the target fork its
/// key's chain.
pub(super) async fn compare_successions(
    source: &dyn GlobalStore,
    target: &dyn GlobalStore,
    mismatches: &mut Mismatches,
) -> Result<(), StoreError> {
    let (mut source, mut target) = (ReadAhead::new(source), ReadAhead::new(target));
    loop {
        let s = source.peek().await?.cloned();
        let t = target.peek().await?.cloned();
        // Both sides come in reservation order: the smaller one is alone.
        let (s, t) = match (s, t) {
            (None, None) => return Ok(()),
            (Some(s), Some(t)) if s.link.from == t.link.from => (Some(s), Some(t)),
            (Some(s), t) if t.as_ref().is_none_or(|t| s.link.from < t.link.from) => (Some(s), None),
            (_, t) => (None, t),
        };
        if s.is_some() {
            source.pop();
        }
        if t.is_some() {
            target.pop();
        }
        if s != t {
            let from = s.as_ref().or(t.as_ref()).map(|x| x.link.from.clone());
            mismatches.push(Mismatch::SuccessionDiffers {
                from: from.expect("one side holds a succession"),
                source: s,
                target: t,
            });
        }
    }
}

/// Compares every host session row of `dc` in `source` with `target`'s,
/// in one merge of both in stored-name order, a page at a time: a row
/// missing in the target, different there, or there only is a mismatch.
/// Every row, not a sample: a session's keys are held only while its row
/// says so.
pub(super) async fn compare_sessions(
    dc: &DcId,
    source: &dyn DcStore,
    target: &dyn DcStore,
    mismatches: &mut Mismatches,
) -> Result<(), StoreError> {
    let (mut source, mut target) = (SessionsAhead::new(source), SessionsAhead::new(target));
    loop {
        let s = source.peek().await?.cloned();
        let t = target.peek().await?.cloned();
        let name = |r: &SessionRecord| crate::session::session_bytes(&r.id);
        // Both sides come in stored-name order: the smaller one is alone.
        let (s, t) = match (s, t) {
            (None, None) => return Ok(()),
            (Some(s), Some(t)) if s.id == t.id => (Some(s), Some(t)),
            (Some(s), t) if t.as_ref().is_none_or(|t| name(&s) < name(t)) => (Some(s), None),
            (_, t) => (None, t),
        };
        if s.is_some() {
            source.pop();
        }
        if t.is_some() {
            target.pop();
        }
        if s != t {
            let id = s.as_ref().or(t.as_ref()).map(|r| r.id.clone());
            mismatches.push(Mismatch::SessionDiffers {
                dc: dc.clone(),
                id: id.expect("one side holds a row"),
                source: s.map(Box::new),
                target: t.map(Box::new),
            });
        }
    }
}

/// One DC store's session rows read a page ahead, in stored-name order.
struct SessionsAhead<'s> {
    store: &'s dyn DcStore,
    /// The last row read (`None`: none yet), and whether the last page was
    /// the end.
    after: Option<SessionId>,
    done: bool,
    ahead: VecDeque<SessionRecord>,
}

impl<'s> SessionsAhead<'s> {
    fn new(store: &'s dyn DcStore) -> SessionsAhead<'s> {
        SessionsAhead {
            store,
            after: None,
            done: false,
            ahead: VecDeque::new(),
        }
    }

    /// The next row, left in place; `None` after the last.
    async fn peek(&mut self) -> Result<Option<&SessionRecord>, StoreError> {
        if self.ahead.is_empty() && !self.done {
            let page = self
                .store
                .sessions(self.after.as_ref(), SESSION_PAGE_MAX)
                .await?;
            self.done = page.len() < SESSION_PAGE_MAX;
            self.after = page.last().map(|r| r.id.clone());
            self.ahead.extend(page);
        }
        Ok(self.ahead.front())
    }

    fn pop(&mut self) {
        self.ahead.pop_front();
    }
}

/// One store's successions read a page ahead, in store order.
struct ReadAhead<'g> {
    global: &'g dyn GlobalStore,
    pages: SuccessionPages,
    ahead: VecDeque<Succession>,
}

impl<'g> ReadAhead<'g> {
    fn new(global: &'g dyn GlobalStore) -> ReadAhead<'g> {
        ReadAhead {
            global,
            pages: SuccessionPages::every(),
            ahead: VecDeque::new(),
        }
    }

    /// The next succession, left in place; `None` after the last.
    async fn peek(&mut self) -> Result<Option<&Succession>, StoreError> {
        while self.ahead.is_empty() {
            match self.pages.next(self.global).await? {
                Some(page) => self.ahead.extend(page),
                None => return Ok(None),
            }
        }
        Ok(self.ahead.front())
    }

    /// Takes the succession [`ReadAhead::peek`] showed.
    fn pop(&mut self) {
        self.ahead.pop_front();
    }
}

/// Compares every sampled item with the target; returns how many were compared.
pub(super) async fn compare_samples(
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
pub(super) fn record_diff(a: &DcRecord, b: &DcRecord) -> Vec<&'static str> {
    let DcRecord {
        id,
        key,
        tag,
        token,
        allow_renew,
        predecessor,
        state,
        shortcut,
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
        ("shortcut", shortcut == &b.shortcut),
        ("version", version == &b.version),
    ]
    .into_iter()
    .filter(|(_, same)| !same)
    .map(|(name, _)| name)
    .collect()
}

/// What `target`'s lease entry of a DC lacks of `source`'s, by field:
/// `terms` (none, or a shorter ttl, host lease or grace: it could call the
/// DC expired sooner), a mark below the source's (`allocator_floor`,
/// `token_bound`: a takeover's token must be above every token the DC
/// granted; `event_head`), `retired` differing. Empty: the target keeps at
/// least what the source does. Standings are not compared: each store
/// judges them by its own clock.
pub(super) fn lease_diff(source: &DcLeaseState, target: &DcLeaseState) -> Vec<&'static str> {
    let covers = |s: &DcTerms, t: &DcTerms| {
        t.ttl_ms >= s.ttl_ms
            && t.host_lease_ttl_max_ms >= s.host_lease_ttl_max_ms
            && t.grace_ms >= s.grace_ms
    };
    let terms = match (&source.terms, &target.terms) {
        (None, _) => true,
        (Some(s), Some(t)) => covers(s, t),
        (Some(_), None) => false,
    };
    let (s, t) = (&source.marks, &target.marks);
    [
        ("terms", terms),
        ("allocator_floor", t.allocator_floor >= s.allocator_floor),
        ("token_bound", t.token_bound >= s.token_bound),
        ("event_head", t.event_head >= s.event_head),
        ("retired", target.retired == source.retired),
    ]
    .into_iter()
    .filter(|(_, kept)| !kept)
    .map(|(name, _)| name)
    .collect()
}

/// The names of the fields in which two events differ.
pub(super) fn event_diff(a: &Event, b: &Event) -> Vec<&'static str> {
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
